"""sgljit-norm: RMSNorm, fused add + RMSNorm, their Gemma forms, and q/k norms. CUDA and SYCL
kernels; the ops are ``sgljit.ops.<name>``."""

MANIFEST = {
    "name": "norm",
    "version": "0.1.0",
    "requires_sgljit": ">=0.1,<0.2",
    "ops": {
        "rmsnorm": "sgljit_norm.ops:rmsnorm",
        "fused_add_rmsnorm": "sgljit_norm.ops:fused_add_rmsnorm",
        "gemma_rmsnorm": "sgljit_norm.ops:gemma_rmsnorm",
        "gemma_fused_add_rmsnorm": "sgljit_norm.ops:gemma_fused_add_rmsnorm",
        "qknorm": "sgljit_norm.ops:qknorm",
        "qknorm_across_heads": "sgljit_norm.ops:qknorm_across_heads",
    },
    "family": "sgljit_norm.ops:family",
}

"""sgljit-norm: RMSNorm, fused add + RMSNorm, their Gemma forms, q/k norms, RMSNorm -> fp8
(plain or after the fused add; static or per-token scale), LayerNorm and LayerNorm -> fp8. CUDA and SYCL kernels; the ops are
``sgljit.ops.<name>``."""

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
        "rmsnorm_quant_fp8": "sgljit_norm.ops:rmsnorm_quant_fp8",
        "fused_add_rmsnorm_quant_fp8": "sgljit_norm.ops:fused_add_rmsnorm_quant_fp8",
        "layernorm": "sgljit_norm.layernorm:layernorm",
        "layernorm_quant_fp8": "sgljit_norm.layernorm:layernorm_quant_fp8",
    },
    "family": "sgljit_norm.ops:family",
}

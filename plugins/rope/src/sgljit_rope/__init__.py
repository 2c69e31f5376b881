"""sgljit-rope: rotary position embedding (neox and gptj, partial rotary), with an optional fused
KV-cache store, and fused with a per-head RMSNorm of q and k. CUDA and SYCL kernels; the ops are
``sgljit.ops.apply_rope``, ``sgljit.ops.apply_rope_with_kv_cache`` and ``sgljit.ops.qknorm_rope``."""

MANIFEST = {
    "name": "rope",
    "version": "0.1.0",
    "requires_sgljit": ">=0.1,<0.2",
    "ops": {
        "apply_rope": "sgljit_rope.ops:apply_rope",
        "apply_rope_with_kv_cache": "sgljit_rope.ops:apply_rope_with_kv_cache",
        "qknorm_rope": "sgljit_rope.ops:qknorm_rope",
    },
    "family": "sgljit_rope.ops:family",
}

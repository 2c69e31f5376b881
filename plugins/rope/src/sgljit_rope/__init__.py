"""sgljit-rope: rotary position embedding (neox and gptj, partial rotary), with an optional fused
KV-cache store. CUDA and SYCL kernels; the ops are ``sgljit.ops.apply_rope`` and
``sgljit.ops.apply_rope_with_kv_cache``."""

MANIFEST = {
    "name": "rope",
    "version": "0.1.0",
    "requires_sgljit": ">=0.1,<0.2",
    "ops": {
        "apply_rope": "sgljit_rope.ops:apply_rope",
        "apply_rope_with_kv_cache": "sgljit_rope.ops:apply_rope_with_kv_cache",
    },
    "family": "sgljit_rope.ops:family",
}

"""sgljit-rope: rotary position embedding (neox and gptj, partial rotary), with an optional fused
KV-cache store, and fused with a per-head RMSNorm of q and k (cos/sin from a table, or computed in
the kernel from rope_theta, YaRN); rope -> fp8 quantize, optionally appended into a paged fp8 KV
cache, and the plain paged append. CUDA and SYCL kernels; the ops are ``sgljit.ops.apply_rope``,
``apply_rope_with_kv_cache``, ``qknorm_rope``, ``qknorm_rope_theta``, ``rope_quantize_fp8``,
``rope_quantize_fp8_append_paged_kv_cache``, ``append_paged_kv_cache`` and
``append_paged_mla_kv_cache``."""

MANIFEST = {
    "name": "rope",
    "version": "0.1.0",
    "requires_sgljit": ">=0.1,<0.2",
    "ops": {
        "apply_rope": "sgljit_rope.ops:apply_rope",
        "apply_rope_with_kv_cache": "sgljit_rope.ops:apply_rope_with_kv_cache",
        "qknorm_rope": "sgljit_rope.ops:qknorm_rope",
        "rope_quantize_fp8": "sgljit_rope.fp8_kv:rope_quantize_fp8",
        "rope_quantize_fp8_append_paged_kv_cache": "sgljit_rope.fp8_kv:rope_quantize_fp8_append_paged_kv_cache",
        "append_paged_kv_cache": "sgljit_rope.fp8_kv:append_paged_kv_cache",
        "append_paged_mla_kv_cache": "sgljit_rope.fp8_kv:append_paged_mla_kv_cache",
        "qknorm_rope_theta": "sgljit_rope.qknorm_rope_theta:qknorm_rope_theta",
    },
    "family": "sgljit_rope.ops:family",
}

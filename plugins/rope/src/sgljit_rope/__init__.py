"""sgljit-rope: rotary position embedding (neox and gptj, partial rotary), with an optional fused
KV-cache store, and fused with a per-head RMSNorm of q and k. CUDA and SYCL kernels; the ops are
``sgljit.ops.apply_rope``, ``sgljit.ops.apply_rope_with_kv_cache`` and ``sgljit.ops.qknorm_rope`` (cos/sin from a table) and ``sgljit.ops.qknorm_rope_theta`` (cos/sin
computed in the kernel from rope_theta, YaRN)."""

MANIFEST = {
    "name": "rope",
    "version": "0.1.0",
    "requires_sgljit": ">=0.1,<0.2",
    "ops": {
        "apply_rope": "sgljit_rope.ops:apply_rope",
        "apply_rope_with_kv_cache": "sgljit_rope.ops:apply_rope_with_kv_cache",
        "qknorm_rope": "sgljit_rope.ops:qknorm_rope",
        "qknorm_rope_theta": "sgljit_rope.qknorm_rope_theta:qknorm_rope_theta",
    },
    "family": "sgljit_rope.ops:family",
}

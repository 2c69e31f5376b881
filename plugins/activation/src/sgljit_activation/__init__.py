"""sgljit-activation: the gated activations of LLM MLPs (``silu_and_mul``, ``gelu_and_mul``,
``gelu_tanh_and_mul``) and SiLU-and-mul fused with per-token-group fp8 quantization
(``silu_and_mul_per_token_group_quant_fp8``). CUDA and SYCL kernels; the ops are
``sgljit.ops.<name>``.

This module is what sgljit reads to discover the plugin: keep it free of heavy imports (torch,
the kernels), so that discovery stays cheap; ``ops`` is imported on the first use of an op.
"""

from sgljit.plugins import Manifest

MANIFEST: Manifest = {
    "name": "activation",
    "version": "0.1.0",
    "requires_sgljit": ">=0.1,<0.2",
    "ops": {
        "silu_and_mul": "sgljit_activation.ops:silu_and_mul",
        "gelu_and_mul": "sgljit_activation.ops:gelu_and_mul",
        "gelu_tanh_and_mul": "sgljit_activation.ops:gelu_tanh_and_mul",
        "silu_and_mul_per_token_group_quant_fp8": (
            "sgljit_activation.ops:silu_and_mul_per_token_group_quant_fp8"
        ),
        "gated_act_filtered": "sgljit_activation.moe:gated_act_filtered",
    },
    # moe.py declares its ops on ops.py's family (importing it imports both)
    "family": "sgljit_activation.moe:family",
}

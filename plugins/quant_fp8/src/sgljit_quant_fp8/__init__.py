"""sgljit-quant-fp8: FP8 quantization (float8_e4m3fn, float8_e5m2) per tensor (static or dynamic
scale), per token and per token group, bit-identical to PyTorch's
``(x.float() / scale).clamp(...).to(fp8)``. CUDA and SYCL kernels; the ops are
``sgljit.ops.per_tensor_quant_fp8``, ``sgljit.ops.per_token_quant_fp8`` and
``sgljit.ops.per_token_group_quant_fp8``."""

MANIFEST = {
    "name": "quant_fp8",
    "version": "0.1.0",
    "requires_sgljit": ">=0.1,<0.2",
    "ops": {
        "per_tensor_quant_fp8": "sgljit_quant_fp8.ops:per_tensor_quant_fp8",
        "per_token_quant_fp8": "sgljit_quant_fp8.ops:per_token_quant_fp8",
        "per_token_group_quant_fp8": "sgljit_quant_fp8.ops:per_token_group_quant_fp8",
        "per_token_group_quant_int8": "sgljit_quant_fp8.moe:per_token_group_quant_int8",
        "per_token_group_quant_masked": "sgljit_quant_fp8.moe:per_token_group_quant_masked",
        "per_token_group_quant_sorted": "sgljit_quant_fp8.moe:per_token_group_quant_sorted",
    },
    # moe.py declares its ops on ops.py's family (importing it imports both)
    "family": "sgljit_quant_fp8.moe:family",
}

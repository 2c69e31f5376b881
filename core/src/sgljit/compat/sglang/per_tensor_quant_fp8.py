"""``sglang.jit_kernel.per_tensor_quant_fp8``'s call: quantize into the caller's buffers.

    >>> import torch
    >>> from sgljit.compat.sglang.per_tensor_quant_fp8 import per_tensor_quant_fp8
    >>> x = torch.tensor([[1.0, -448.0]])
    >>> q, s = torch.empty(1, 2, dtype=torch.float8_e4m3fn), torch.zeros(1)
    >>> per_tensor_quant_fp8(x, q, s)  # dynamic: s gets absmax / 448
    >>> s, q.float()
    (tensor([1.]), tensor([[   1., -448.]]))

The signature, the buffers written and the scale are sglang's; the fp8 codes are sgljit's
(``sgljit.ops.per_tensor_quant_fp8``): ``input.float() / scale`` correctly rounded, clamped, then
rounded to nearest even. sglang multiplies by the rounded reciprocal,
``input.float() * (1 / scale)``, whose code differs by one fp8 step where that product and the
quotient straddle a rounding midpoint: measured over random scales, never for bf16 inputs and for
about 2 in 10^7 fp16 or fp32 elements. No case of sglang's ``test_per_tensor_quant_fp8.py`` (fp16
and bf16 inputs, compared against the reciprocal formula) hits one.

Other differences (sglang's behavior in parentheses):

- Dynamic scale: ``max(absmax / 448, 2^-126)``, written over ``output_s`` (sglang: ``absmax / 448``
  combined by an atomic max with what ``output_s`` held, so the caller must zero it; an all-zero
  input gets the scale 0 and the code 448 everywhere, from 0 * inf).
- ``output_q`` may also be ``torch.float8_e5m2`` (its scale then divides by 57344); CPU and XPU
  tensors run too (sgljit's reference and SYCL kernels).
- Errors from the underlying call name sgljit's arguments: ``out`` is ``output_q``, ``scale`` is
  ``output_s``.
"""

from __future__ import annotations

import torch

from sgljit import ops

__all__ = ["per_tensor_quant_fp8"]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def per_tensor_quant_fp8(
    input: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    is_static: bool = False,
) -> None:
    """Per-tensor quantization of ``input`` (fp32/fp16/bf16, contiguous, any shape) to FP8.

    Args:
        input: the tensor to quantize.
        output_q: fp8 tensor with as many elements as ``input`` (contiguous), written.
        output_s: fp32 tensor of one element: the scale, read when ``is_static``, else written.
        is_static: use ``output_s`` as given instead of computing the scale from ``input``.
    """
    if output_q.dtype not in _FP8:
        raise TypeError(
            f"output_q: expected torch.float8_e4m3fn or torch.float8_e5m2, got {output_q.dtype}"
        )
    x, q, s = input.view(1, -1), output_q.view(1, -1), output_s.view(-1)
    if is_static:
        ops.per_tensor_quant_fp8(x, s, out=q, fp8_dtype=output_q.dtype)
    else:
        ops.per_tensor_quant_fp8(x, out=q, fp8_dtype=output_q.dtype, scale_out=s)

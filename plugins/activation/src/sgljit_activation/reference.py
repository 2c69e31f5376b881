"""PyTorch implementation of the activation family: the CPU path and the test oracle.

A gated activation of a row ``[gate | up]`` of width ``2 * d`` is ``act(gate) * up`` (width ``d``),
math in float32 and rounded once to the output's dtype, as the kernels do; given float64 tensors
(the conformance suite's oracle) the math stays in float64. The fp8 form quantizes that float32
product without rounding it to the input's dtype first: per group of ``group_size`` columns,
``scale = max(absmax / fp8_max, eps)`` (a true float32 division; with ``scale_ue8m0`` rounded up to
a power of two), ``code = (y / scale).clamp(-fp8_max, fp8_max).to(fp8)``: the formulas of
sgljit-quant-fp8's ``per_token_group_quant_fp8``, restated here so that this package needs no other
plugin.
"""

import torch
import torch.nn.functional as F

from sgljit import fp8

__all__ = ["ACTIVATIONS", "act_and_mul", "act_and_mul_into", "silu_and_mul_quant_fp8_into"]

ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,  # erf form
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def act_and_mul(kind: str, input: torch.Tensor) -> torch.Tensor:
    """``act(gate) * up`` of ``input`` ``[..., 2 * d]`` in float32 (float64 for float64 input),
    not rounded."""
    d = input.shape[-1] // 2
    x = input.to(torch.promote_types(input.dtype, torch.float32))
    return ACTIVATIONS[kind](x[..., :d]) * x[..., d:]


def act_and_mul_into(kind: str, input: torch.Tensor, out: torch.Tensor) -> None:
    """``out = act(gate) * up``, rounded once to out's dtype."""
    out.copy_(act_and_mul(kind, input))


def silu_and_mul_quant_fp8_into(
    input: torch.Tensor,
    out: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    eps: float,
    scale_ue8m0: bool,
) -> None:
    """``y = silu(gate) * up`` of ``input`` ``[T, 2 * d]`` as float32, then per group of
    ``group_size`` columns of ``y``: ``scales[t, g] = max(absmax / fp8_max, eps)`` (ue8m0: rounded
    up to a power of two) and ``out`` (fp8 ``[T, d]``) the group's codes. A NaN in a group gives a
    NaN scale and NaN codes; an inf an inf scale (NaN codes for the infs, +-0 for the rest)."""
    y = act_and_mul("silu", input).float()  # float64 oracle: y rounded to float32 once, here
    rows, d = y.shape
    groups = y.reshape(rows, d // group_size, group_size)
    fp8_max = fp8.fp8_max(out.dtype)
    amax = groups.abs().amax(dim=-1)
    # a divisor tensor: a Python scalar would let CUDA multiply by its reciprocal
    s = torch.maximum(amax / torch.full_like(amax, fp8_max), torch.full_like(amax, eps))
    if scale_ue8m0:
        s = fp8.pow2_ceil(s)
    scales.copy_(s)
    codes = (groups / s.unsqueeze(-1)).clamp(-fp8_max, fp8_max).to(out.dtype)
    out.copy_(codes.view(rows, d))

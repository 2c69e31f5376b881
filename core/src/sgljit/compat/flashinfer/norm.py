"""``flashinfer.norm``'s RMSNorm functions on sgljit's norm ops, with their signatures and results, so
a call site ports by changing the import::

    from sgljit.compat.flashinfer.norm import fused_add_rmsnorm, rmsnorm

``rmsnorm`` takes ``[T, H]`` and ``[T, heads, H]`` input (strided views, e.g. q of a fused qkv
buffer, as FlashInfer's QK-norm path does); the others ``[T, H]`` and more (any rank, a float32
weight, float32 rows). The fused adds normalize the float32 sum ``input + residual`` and store it
rounded in ``residual``, as FlashInfer's kernels do (``float_sum`` of sgljit's ops).
``rmsnorm_quant`` and ``fused_add_rmsnorm_quant`` write fp8 (e4m3 or e5m2, ``out``'s dtype) of the
float32 normalized value divided by the static ``scale`` (a float32 ``[1]`` or ``[]`` tensor; a
Python float is taken, as FlashInfer still does); ``fused_add_rmsnorm_fp8_block_quant`` the fused
add, the normalized row in ``normed_out`` and its 1x128-block fp8 quantization with column-major
block scales. ``enable_pdl`` is accepted and left to sgljit, which launches with programmatic
dependent launch where the GPU has it (``SGLJIT_PDL=0`` turns it off). ``layernorm`` returns a new
tensor like ``input`` and ``layernorm_quant`` writes ``out`` (fp8, its dtype the format) of
``((input - mean) * rsqrt(var + eps) * gemma + beta) / scale``, mean and biased variance in float32;
FlashInfer documents bfloat16 input with float32 ``gemma`` and ``beta``: sgljit also takes float16
and float32 input, and parameters of the input's dtype.

Where this differs on purpose:

- fp8 codes: ``y / scale`` correctly rounded (FlashInfer multiplies by the rounded reciprocal
  ``1 / scale``: a code one step apart where the two straddle a rounding boundary, rare); the same
  for ``layernorm_quant``, whose reciprocal FlashInfer takes approximately.
- ``fused_add_rmsnorm_quant`` normalizes the rounded sum ``residual`` stores (FlashInfer: the float32
  sum; the fp8 code moves only where that rounding crosses an fp8 rounding boundary).
- A Python float ``scale`` is taken without FlashInfer's deprecation warning.
"""

from __future__ import annotations

import torch

import sgljit

__all__ = [
    "fused_add_rmsnorm",
    "fused_add_rmsnorm_fp8_block_quant",
    "fused_add_rmsnorm_quant",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "layernorm",
    "layernorm_quant",
    "rmsnorm",
    "rmsnorm_quant",
]


def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """``out[i] = (input[i] / RMS(input[i])) * weight``; input ``[T, H]`` or ``[T, heads, H]``,
    weight ``[H]``. Returns ``out`` (allocated like ``input`` if not given)."""
    if out is None:
        out = torch.empty_like(input)
    return sgljit.ops.rmsnorm(input, weight, eps, out=out)


def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """In place: ``residual[i] += input[i]``, then ``input[i] = (residual[i] / RMS(residual[i]))
    * weight`` (of the float32 sum)."""
    sgljit.ops.fused_add_rmsnorm(input, residual, weight, eps, float_sum=True)


def gemma_rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """``out[i] = (input[i] / RMS(input[i])) * (weight + 1)``. Returns ``out`` (allocated like
    ``input`` if not given)."""
    if out is None:
        out = torch.empty_like(input)
    return sgljit.ops.gemma_rmsnorm(input, weight, eps, out=out)


def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """In place: ``residual[i] += input[i]``, then ``input[i] = (residual[i] / RMS(residual[i]))
    * (weight + 1)`` (of the float32 sum)."""
    sgljit.ops.gemma_fused_add_rmsnorm(input, residual, weight, eps, float_sum=True)


def rmsnorm_quant(
    out: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    scale: float | torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """``out[i] = fp8((input[i] / RMS(input[i])) * weight / scale)``, clamped to the format's
    range; input ``[T, H]``, out fp8 ``[T, H]``, scale float32 ``[1]``."""
    sgljit.ops.rmsnorm_quant_fp8(input, weight, _scale(scale, input), eps, out=out)


def fused_add_rmsnorm_quant(
    out: torch.Tensor,
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    scale: float | torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """``residual[i] += input[i]`` in place, then ``out[i]`` = :func:`rmsnorm_quant` of it
    (``input`` is only read)."""
    sgljit.ops.fused_add_rmsnorm_quant_fp8(
        input, residual, weight, _scale(scale, input), eps, out=out
    )


def fused_add_rmsnorm_fp8_block_quant(
    out: torch.Tensor,
    block_scale: torch.Tensor,
    normed_out: torch.Tensor,
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """``residual += input`` in place; ``normed_out = rmsnorm(residual) * weight`` (of the float32
    sum, rounded to its dtype); ``out`` (float8_e4m3fn) its quantization per 1x128 block, scale
    ``max(absmax, 1e-4) / 448`` into ``block_scale``, float32 ``[H / 128, round_up(T, 4)]``
    (column-major: the ``[T, H / 128]`` scales are ``block_scale.T[:T]``). ``input`` is only
    read."""
    if not isinstance(block_scale, torch.Tensor) or block_scale.dim() != 2:
        raise ValueError("block_scale: expected a float32 [H / 128, round_up(T, 4)] tensor")
    normed_out.copy_(input)
    sgljit.ops.fused_add_rmsnorm(normed_out, residual, weight, eps, float_sum=True)
    tokens = input.shape[0]
    sgljit.ops.per_token_group_quant_fp8(
        normed_out,
        128,
        eps=_MIN_BLOCK_AMAX / _E4M3_MAX,
        column_major_scales=True,
        out=out,
        scales=block_scale.transpose(0, 1)[:tokens],
    )


def layernorm(
    input: torch.Tensor,
    gemma: torch.Tensor,
    beta: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``out[i] = (input[i] - mean) / sqrt(var + eps) * gemma + beta`` (biased variance, float32),
    rounded once to input's dtype; input ``[T, H]``, gemma and beta ``[H]`` (float32, or input's
    dtype). Returns a new tensor."""
    return sgljit.ops.layernorm(input, gemma, beta, eps)


def layernorm_quant(
    out: torch.Tensor,
    input: torch.Tensor,
    gemma: torch.Tensor,
    beta: torch.Tensor,
    scale: float | torch.Tensor,
    eps: float = 1e-6,
) -> None:
    """``out[i] = fp8(layernorm(input[i]) / scale)`` of the float32 LayerNorm (not rounded to the
    input's dtype first), clamped to the format's range; out fp8 ``[T, H]`` (float8_e4m3fn or
    float8_e5m2), scale float32 ``[1]`` or ``[]`` (a Python float is taken)."""
    sgljit.ops.layernorm_quant_fp8(input, gemma, beta, _scale(scale, input), eps, out=out)


_E4M3_MAX = 448.0
_MIN_BLOCK_AMAX = 1e-4  # FlashInfer's floor of a block's absmax


def _scale(scale, input) -> torch.Tensor:
    """FlashInfer's scale argument as a float32 ``[1]`` tensor on input's device."""
    if not isinstance(scale, torch.Tensor):
        return torch.tensor([float(scale)], dtype=torch.float32, device=input.device)
    if scale.numel() != 1:
        raise ValueError(f"scale: expected one value (shape [1] or []), got {tuple(scale.shape)}")
    return scale.to(input.device, torch.float32).reshape(1)

"""PyTorch implementation of the RMSNorm family: the CPU path and the test oracle.

Math in float32, cast once: ``y = x * rsqrt(mean(x^2) + eps) * w`` (Gemma: ``* (1 + w)``); the weight
has the input's dtype or float32. ``round_before_weight`` (Hugging Face's LlamaRMSNorm) rounds
``x * rsqrt(...)`` to the input's dtype before the weight multiply. The fused add rounds
``input + residual`` to the dtype first and normalizes that rounded sum; with
``round_before_weight`` (sglang's ``cast_x_before_out_mul``) or ``float_sum`` (FlashInfer's) it
normalizes the float32 sum. Rows are
``[T, H]`` or ``[B, S, H]``.

RMSNorm -> fp8: the float32 normalized value ``y`` (not rounded to the input dtype) is quantized as
``(y / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)`` (true float32 division); a dynamic scale per
row is ``max(absmax(y of the row) / fp8_max, 2^-126)``.
"""

import torch

from sgljit import fp8

__all__ = [
    "FP8_DTYPES",
    "MIN_SCALE",
    "fused_add_rmsnorm_",
    "fused_add_rmsnorm_quant_fp8_per_token_",
    "fused_add_rmsnorm_quant_fp8_static_",
    "qknorm_",
    "qknorm_across_heads_",
    "quantize_fp8",
    "rms_norm",
    "rmsnorm_into",
    "rmsnorm_quant_fp8_per_token_into",
    "rmsnorm_quant_fp8_static_into",
    "token_scales",
]

FP8_DTYPES = fp8.FP8_DTYPES
MIN_SCALE = 2.0**-126  # the smallest normal float32: the least dynamic scale


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    gemma: bool = False,
    round_to: torch.dtype | None = None,
) -> torch.Tensor:
    """RMSNorm over the last dimension, in float32 (returns float32); ``round_to``: the dtype
    ``x * rsqrt(...)`` is rounded to before the weight multiply."""
    xf = x.float()
    wf = weight.float()
    if gemma:
        wf = wf + 1.0
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if round_to is not None:
        y = y.to(round_to).float()
    return y * wf


def rmsnorm_into(
    input: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    round_before_weight: bool = False,
    gemma: bool = False,
) -> None:
    out.copy_(rms_norm(input, weight, eps, gemma, input.dtype if round_before_weight else None))


def fused_add_rmsnorm_(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    float_sum: bool = False,
    round_before_weight: bool = False,
    gemma: bool = False,
) -> None:
    """``residual <- input + residual`` (rounded to the dtype); ``input <- rmsnorm(residual)``
    (``round_before_weight``, ``float_sum``: of the float32 sum)."""
    total = input.float() + residual.float()
    rounded = total.to(residual.dtype)
    residual.copy_(rounded)
    if round_before_weight:
        input.copy_(rms_norm(total, weight, eps, gemma, input.dtype))
    else:
        input.copy_(rms_norm(total if float_sum else rounded, weight, eps, gemma))


def qknorm_(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float
) -> None:
    """In place: each head of q ``[T, Hq, D]`` and k ``[T, Hk, D]`` normalized over D."""
    q.copy_(rms_norm(q, q_weight, eps))
    k.copy_(rms_norm(k, k_weight, eps))


def qknorm_across_heads_(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float
) -> None:
    """In place: each row of q ``[T, Hq*D]`` and k ``[T, Hk*D]`` normalized over the whole row."""
    q.copy_(rms_norm(q, q_weight, eps))
    k.copy_(rms_norm(k, k_weight, eps))


# ------------------------------------------------------------------------------------------------
# RMSNorm -> fp8


def quantize_fp8(y: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """``(y / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)`` in float32; ``scale`` broadcasts."""
    m = fp8.fp8_max(fp8_dtype)
    return (y.float() / scale.float()).clamp(-m, m).to(fp8_dtype)


def token_scales(y: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """float32 ``[T, 1]``: ``max(absmax(y[t]) / fp8_max, 2^-126)`` per row (NaN if the row has one)."""
    if y.shape[-1] == 0:
        return torch.full((y.shape[0], 1), MIN_SCALE, dtype=torch.float32, device=y.device)
    amax = y.float().abs().amax(-1, keepdim=True)
    # a tensor divisor: torch divides (a Python float would make CUDA multiply by its reciprocal)
    fp8_max = torch.full_like(amax, fp8.fp8_max(fp8_dtype))
    return (amax / fp8_max).clamp_min(MIN_SCALE)


def _quantize_rows(y, out, scale=None, scales=None) -> None:
    if scales is not None:
        s = token_scales(y, out.dtype)
        scales.copy_(s.view(scales.shape))
        out.copy_(quantize_fp8(y, s, out.dtype))
    else:
        out.copy_(quantize_fp8(y, scale, out.dtype))


def rmsnorm_quant_fp8_static_into(
    input: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, eps: float
) -> None:
    """``out = quantize(rmsnorm(input, weight, eps) / scale)`` (scale: float32 ``[1]``)."""
    _quantize_rows(rms_norm(input, weight, eps), out, scale=scale)


def rmsnorm_quant_fp8_per_token_into(
    input: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, scales: torch.Tensor, eps: float
) -> None:
    """Per row t of ``y = rmsnorm(input, weight, eps)``: ``scales[t] = max(absmax(y[t]) / fp8_max,
    2^-126)``, ``out[t] = quantize(y[t] / scales[t])``."""
    _quantize_rows(rms_norm(input, weight, eps), out, scales=scales)


def _fused_sum(input: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    total = (input.float() + residual.float()).to(residual.dtype)
    residual.copy_(total)
    return total


def fused_add_rmsnorm_quant_fp8_static_(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    out: torch.Tensor,
    eps: float,
) -> None:
    """``residual <- input + residual`` (rounded to the dtype); ``out = quantize(rmsnorm(residual)
    / scale)``. ``input`` is only read."""
    _quantize_rows(rms_norm(_fused_sum(input, residual), weight, eps), out, scale=scale)


def fused_add_rmsnorm_quant_fp8_per_token_(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    scales: torch.Tensor,
    eps: float,
) -> None:
    """``residual <- input + residual`` (rounded to the dtype); ``out`` and ``scales`` as
    :func:`rmsnorm_quant_fp8_per_token_into` of the new residual. ``input`` is only read."""
    _quantize_rows(rms_norm(_fused_sum(input, residual), weight, eps), out, scales=scales)

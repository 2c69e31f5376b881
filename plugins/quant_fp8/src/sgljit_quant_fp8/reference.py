"""PyTorch reference of the FP8 quantization ops: the CPU path and the test oracle.

Quantized values are exactly ``(x.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)`` (true
division by an fp32 scale tensor; clamp, then round to nearest even). Dynamic scales are
``max(absmax / fp8_max, 2^-126)`` in fp32, the division again a true fp32 division: an all-zero
input gets the finite scale 2^-126 (its output is all zeros), a NaN anywhere gives a NaN scale.
Per-token-group scales are ``max(absmax(group) / fp8_max, eps)`` (eps rounded to fp32), optionally
rounded up to a power of two (ue8m0), with the same NaN and inf behaviour as torch's ops.
"""

import torch

from sgljit import fp8

__all__ = [
    "FP8_DTYPES",
    "MIN_SCALE",
    "fp8_max",
    "per_tensor_dynamic_into",
    "per_tensor_quant_fp8",
    "per_tensor_scale",
    "per_tensor_static_into",
    "per_token_group_into",
    "per_token_group_quant_fp8",
    "per_token_group_scales",
    "per_token_into",
    "per_token_quant_fp8",
    "per_token_scales",
    "pow2_ceil",
    "quantize",
    "quantize_into",
]

FP8_DTYPES = fp8.FP8_DTYPES
MIN_SCALE = 2.0**-126  # the smallest normal fp32 number


fp8_max = fp8.fp8_max


def _div(num: torch.Tensor, den: float) -> torch.Tensor:
    # A tensor divisor on num's device: torch divides (a CPU scalar would make CUDA multiply by
    # the reciprocal, which can differ in the last bit).
    return num / torch.full_like(num, den)


def quantize(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """``(x.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)``; ``scale`` broadcasts."""
    m = fp8_max(fp8_dtype)
    return (x.float() / scale.float()).clamp(-m, m).to(fp8_dtype)


def quantize_into(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(quantize(x, scale, out.dtype).view(out.shape))


def per_tensor_static_into(input: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
    """``out = (input.float() / scale).clamp(-fp8_max, fp8_max).to(out.dtype)`` (scale: fp32
    ``[1]``)."""
    quantize_into(input, scale, out)


def per_tensor_dynamic_into(
    input: torch.Tensor, out: torch.Tensor, scale: torch.Tensor, workspace: torch.Tensor, algo: int
) -> None:
    """``scale[0] = max(absmax(input) / fp8_max, 2^-126)``, then ``out`` as
    :func:`per_tensor_static_into` with it. ``workspace`` (the kernels' partial maxima) and
    ``algo`` (the CUDA algorithm) do not change the result."""
    scale.copy_(per_tensor_scale(input, out.dtype).view(scale.shape))
    quantize_into(input, scale, out)


def per_token_into(input: torch.Tensor, out: torch.Tensor, scales: torch.Tensor) -> None:
    """Per row of ``input`` ``[T, H]``: ``scales[t] = max(absmax(input[t]) / fp8_max, 2^-126)``
    (``scales`` ``[T, 1]``), ``out[t] = quantize(input[t] / scales[t])``."""
    scales.copy_(per_token_scales(input, out.dtype))
    quantize_into(input, scales, out)


def per_token_group_into(
    input: torch.Tensor,
    out: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    eps: float,
    scale_ue8m0: bool,
) -> None:
    """Per group of ``group_size`` consecutive elements of a row of ``input`` ``[T, H]``:
    ``scales[t, g]`` = :func:`per_token_group_scales`, ``out[t, g*gs:(g+1)*gs] =
    quantize(group / scales[t, g])``; ``scales`` ``[T, H / group_size]`` in any layout."""
    s = per_token_group_scales(input, group_size, out.dtype, eps, scale_ue8m0)
    scales.copy_(s)
    rows, hidden = input.shape
    groups = input.reshape(rows, hidden // group_size, group_size)
    out.copy_(quantize(groups, s.unsqueeze(-1), out.dtype).view(rows, hidden))


def per_token_group_scales(
    x: torch.Tensor,
    group_size: int,
    fp8_dtype: torch.dtype,
    eps: float = 1e-10,
    scale_ue8m0: bool = False,
) -> torch.Tensor:
    """fp32 ``[T, H / group_size]`` for x ``[T, H]``: ``max(absmax(group) / fp8_max, fp32(eps))``,
    then with ``scale_ue8m0`` :func:`pow2_ceil`. A NaN in a group gives a NaN scale (as
    ``torch.amax``), an inf an inf scale (its group's codes: NaN for the infs, +-0 for the rest)."""
    rows, hidden = x.shape
    amax = x.reshape(rows, hidden // group_size, group_size).abs().amax(dim=-1).float()
    s = torch.maximum(_div(amax, fp8_max(fp8_dtype)), torch.full_like(amax, eps))
    return pow2_ceil(s) if scale_ue8m0 else s


pow2_ceil = fp8.pow2_ceil


def per_tensor_scale(x: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """fp32 ``[1]``: ``max(absmax(x) / fp8_max, 2^-126)`` (NaN if x has a NaN)."""
    if x.numel() == 0:
        return torch.full((1,), MIN_SCALE, dtype=torch.float32, device=x.device)
    amax = x.abs().amax().float().reshape(1)
    return _div(amax, fp8_max(fp8_dtype)).clamp_min(MIN_SCALE)


def per_token_scales(x: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """fp32 ``[T, 1]`` for x ``[T, H]``: ``max(absmax(row) / fp8_max, 2^-126)`` per row."""
    if x.shape[-1] == 0:
        return torch.full((x.shape[0], 1), MIN_SCALE, dtype=torch.float32, device=x.device)
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    return _div(amax, fp8_max(fp8_dtype)).clamp_min(MIN_SCALE)


def per_tensor_quant_fp8(
    x: torch.Tensor, scale: torch.Tensor | None = None, fp8_dtype: torch.dtype = FP8_DTYPES[0]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, scale): static with a given scale, dynamic (per-tensor absmax) without."""
    if scale is None:
        scale = per_tensor_scale(x, fp8_dtype)
    return quantize(x, scale, fp8_dtype), scale


def per_token_quant_fp8(
    x: torch.Tensor, fp8_dtype: torch.dtype = FP8_DTYPES[0]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out ``[T, H]``, scales ``[T, 1]``) with one dynamic scale per row."""
    scales = per_token_scales(x, fp8_dtype)
    return quantize(x, scales, fp8_dtype), scales


def per_token_group_quant_fp8(
    x: torch.Tensor,
    group_size: int = 128,
    fp8_dtype: torch.dtype = FP8_DTYPES[0],
    eps: float = 1e-10,
    scale_ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out ``[T, H]``, scales ``[T, H / group_size]`` row-major) with one dynamic scale per
    group of ``group_size`` consecutive elements of a row."""
    scales = per_token_group_scales(x, group_size, fp8_dtype, eps, scale_ue8m0)
    rows, hidden = x.shape
    groups = x.reshape(rows, hidden // group_size, group_size)
    return quantize(groups, scales.unsqueeze(-1), fp8_dtype).view(rows, hidden), scales


# ------------------------------------------------------------------------------------------------
# Per-token-group over the MoE layouts and with int8 codes (sgljit_quant_fp8.moe).

INT8_MAX = 127.0  # symmetric int8: codes in [-127, 127], scale absmax / 127


def quantize_int8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(x.float() / scale).round().clamp(-127, 127)`` as int8 (round half to even; NaN gives 0)."""
    q = (x.float() / scale.float()).round().clamp(-INT8_MAX, INT8_MAX)
    return q.nan_to_num(0.0).to(torch.int8)


def group_codes(
    x: torch.Tensor, group_size: int, out_dtype: torch.dtype, eps: float, scale_ue8m0: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes ``[T, H]`` of ``out_dtype`` (an fp8 dtype or int8), fp32 scales ``[T, H / group_size]``)
    for x ``[T, H]``: scales ``max(absmax(group) / max code, fp32(eps))`` (ue8m0: rounded up to a
    power of two), codes as :func:`quantize` or :func:`quantize_int8`."""
    rows, hidden = x.shape
    top = INT8_MAX if out_dtype == torch.int8 else fp8_max(out_dtype)
    groups = x.reshape(rows, hidden // group_size, group_size)
    amax = groups.abs().amax(dim=-1).float()
    s = torch.maximum(_div(amax, top), torch.full_like(amax, eps))
    s = pow2_ceil(s) if scale_ue8m0 else s
    if out_dtype == torch.int8:
        codes = quantize_int8(groups, s.unsqueeze(-1))
    else:
        codes = quantize(groups, s.unsqueeze(-1), out_dtype)
    return codes.view(rows, hidden), s


def per_token_group_int8_into(
    input: torch.Tensor, out: torch.Tensor, scales: torch.Tensor, group_size: int, eps: float
) -> None:
    """:func:`per_token_group_into` with int8 codes (``out`` int8; scales ``absmax / 127``)."""
    codes, s = group_codes(input, group_size, torch.int8, eps, False)
    out.copy_(codes)
    scales.copy_(s)


def _write_rows(dst: torch.Tensor, src: torch.Tensor, live: torch.Tensor) -> None:
    """``dst[i] = src[i]`` where ``live[i]`` (leading dimensions), the rest untouched."""
    keep = live.reshape(*live.shape, *([1] * (dst.dim() - live.dim())))
    if dst.element_size() == 1:  # fp8 and int8 by their bytes (torch.where has no fp8 kernels)
        d, s = dst.view(torch.uint8), src.view(torch.uint8)
        d.copy_(torch.where(keep, s, d))
    else:
        dst.copy_(torch.where(keep, src.to(dst.dtype), dst))


def per_token_group_masked_into(
    input: torch.Tensor,
    out: torch.Tensor,
    scales: torch.Tensor,
    masked_m: torch.Tensor,
    group_size: int,
    eps: float,
    scale_ue8m0: bool,
    expected_m: int,
) -> None:
    """The masked layout: ``input`` ``[E, T_pad, H]``; rows ``t < masked_m[e]`` of expert ``e`` as
    :func:`group_codes` into ``out`` ``[E, T_pad, H]`` and ``scales`` ``[E, T_pad, H / group_size]``,
    the other rows untouched. ``expected_m`` (a hint for the kernels' grid) changes nothing."""
    experts, pad, hidden = input.shape
    codes, s = group_codes(
        input.reshape(experts * pad, hidden), group_size, out.dtype, eps, scale_ue8m0
    )
    counts = masked_m.to(torch.int64).clamp(0, pad).unsqueeze(1)
    live = torch.arange(pad, device=input.device).unsqueeze(0) < counts.to(input.device)
    _write_rows(out, codes.view(experts, pad, hidden), live)
    _write_rows(scales, s.view(experts, pad, hidden // group_size), live)


def per_token_group_sorted_into(
    input: torch.Tensor,
    out: torch.Tensor,
    scales: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    num_valid_tokens: int,
    group_size: int,
    eps: float,
    scale_ue8m0: bool,
) -> None:
    """The sorted MoE layout: row ``i`` of ``input`` ``[M, H]`` as :func:`group_codes` where ``i <
    num_tokens_post_padded[0]`` and ``0 <= sorted_token_ids[i] < num_valid_tokens``; the other rows
    of ``out`` and ``scales`` untouched."""
    rows = input.shape[0]
    codes, s = group_codes(input, group_size, out.dtype, eps, scale_ue8m0)
    ids = sorted_token_ids[:rows].to(torch.int64).to(input.device)
    index = torch.arange(rows, device=input.device)
    post = num_tokens_post_padded.reshape(-1)[0].to(input.device)
    live = (index < post) & (ids >= 0) & (ids < num_valid_tokens)
    _write_rows(out, codes, live)
    _write_rows(scales, s, live)

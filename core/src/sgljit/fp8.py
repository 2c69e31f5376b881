"""FP8 rules every family that writes fp8 shares: the formats, their range, the float32 scale
tensors in each layout a GEMM takes, and ue8m0 (power-of-two) scale rounding.

>>> group_scales(5, 4, "cpu", column_major=True).stride()
(1, 8)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "FP8_DTYPES",
    "check_fp8_dtype",
    "check_out_dtype",
    "check_scales_layout",
    "fp8_max",
    "group_outputs",
    "group_quant_function",
    "group_scales",
    "groups_of",
    "pow2_ceil",
    "spread_groups",
]

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# Column-major scales: each column (one group of every token) starts 16 bytes apart, as the TMA
# loads of DeepSeek-style FP8 GEMMs need, so the token stride is rounded up to 4 float32 values.
_TMA_FLOATS = 4


def fp8_max(fp8_dtype: torch.dtype) -> float:
    """The largest finite value of ``fp8_dtype`` (448 for e4m3fn, 57344 for e5m2)."""
    return float(torch.finfo(fp8_dtype).max)


def check_fp8_dtype(fp8_dtype: Any, name: str = "fp8_dtype") -> None:
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(
            f"{name}: expected torch.float8_e4m3fn or torch.float8_e5m2, got {fp8_dtype!r}"
        )


def check_out_dtype(out: Any, fp8_dtype: torch.dtype, name: str = "out") -> None:
    """A given ``out`` must have the fp8 dtype the call names (a mismatch is an error, not a cast)."""
    if isinstance(out, torch.Tensor) and out.dtype != fp8_dtype:
        raise TypeError(f"{name}: dtype must be {fp8_dtype} (fp8_dtype), got {out.dtype}")


def groups_of(width: int, group_size: Any) -> int:
    """Groups a row of ``width`` holds; 0 for a group size that is not a positive int (the op's
    checks then name it, before anything is written)."""
    valid = isinstance(group_size, int) and not isinstance(group_size, bool) and group_size > 0
    return width // group_size if valid else 0


def group_scales(rows: int, groups: int, device: Any, column_major: bool = False) -> torch.Tensor:
    """float32 ``[rows, groups]``: row-major, or column-major with 16-byte aligned columns
    (strides ``(1, rows rounded up to a multiple of 4)``)."""
    if column_major:
        aligned = -(-rows // _TMA_FLOATS) * _TMA_FLOATS
        return torch.empty(groups, aligned, dtype=torch.float32, device=device).t()[:rows]
    return torch.empty(rows, groups, dtype=torch.float32, device=device)


def check_scales_layout(scales: Any, column_major: bool) -> None:
    """A given ``[rows, groups]`` ``scales`` must be in the layout ``column_major_scales`` names."""
    if not isinstance(scales, torch.Tensor) or scales.dim() != 2:
        return  # the op's checks name it
    dim = 0 if column_major else 1
    if scales.stride(dim) != 1 and scales.shape[dim] > 1:
        raise ValueError(
            f"scales: column_major_scales={column_major} expects stride 1 along dimension {dim}, "
            f"got strides {tuple(scales.stride())}"
        )


def pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """``2^ceil(log2(s))`` of positive normal float32 ``s``, exactly (ue8m0 scales); inf and NaN
    unchanged."""
    bits = s.view(torch.int32)
    up = (bits | 0x7FFFFF) + 1
    return torch.where(((bits & 0x7FFFFF) != 0) & s.isfinite(), up, bits).view(torch.float32)


def group_outputs(
    input: Any, group_size: Any, fp8_dtype: Any, column_major: bool, out: Any, scales: Any,
    gated: bool = False
) -> tuple[Any, Any]:  # fmt: skip
    """``out`` (``fp8_dtype`` ``[T, H]``) and ``scales`` of a per-token-group quantization of the 2-D
    ``input`` ``[T, H]`` (``gated``: ``[T, 2 * H]``, gate and up halves; ``group_size`` None: one
    scale a token, ``[T, 1]``): given ones checked against ``fp8_dtype`` and the layout
    ``column_major`` names, the others allocated (``scales`` by :func:`group_scales`)."""
    check_fp8_dtype(fp8_dtype)
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    if input.dim() != 2:
        pattern = "[T, 2 * H]" if gated else "[T, H]"
        raise ValueError(f"input: expected a 2-D tensor {pattern}, got shape {list(input.shape)}")
    rows, width = input.shape[0], input.shape[1] // (2 if gated else 1)
    if out is None:
        out = torch.empty(rows, width, dtype=fp8_dtype, device=input.device)
    check_out_dtype(out, fp8_dtype)
    if scales is None:
        groups = 1 if group_size is None else groups_of(width, group_size)
        scales = group_scales(rows, groups, input.device, column_major)
    check_scales_layout(scales, column_major)
    return out, scales


def spread_groups(x: torch.Tensor, group_size: int, low: int = -6, high: int = 6) -> None:
    """Check-case data: scale each group of ``group_size`` columns of ``x`` ``[rows, width]`` (in
    place) by a power of two in ``[2^low, 2^high]``, the first group by 1e-12 (its scale is eps)
    and the last by 0 (all zero), as real activations spread over magnitudes."""
    rows, width = x.shape
    groups = x.view(rows, width // group_size, group_size)
    mags = torch.exp2(torch.randint(low, high + 1, (*groups.shape[:2], 1), device=x.device).float())
    mags.view(-1)[0] = 1e-12
    if mags.numel() > 1:
        mags.view(-1)[-1] = 0.0
    groups.copy_((groups.float() * mags).to(x.dtype))


def group_quant_function(op: Any, doc: str, gated: bool = False) -> Callable:
    """The public function of a per-token-group fp8 op declared with the arguments ``(input, out,
    scales, group_size, eps, scale_ue8m0)`` (``gated``: input ``[T, 2 * H]``): it allocates and
    checks ``out`` and ``scales`` (:func:`group_outputs`), calls the op and returns both."""

    def quantize(
        input: torch.Tensor,
        group_size: int = 128,
        *,
        eps: float = 1e-10,
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
        column_major_scales: bool = False,
        scale_ue8m0: bool = False,
        out: torch.Tensor | None = None,
        scales: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, scales = group_outputs(
            input, group_size, fp8_dtype, column_major_scales, out, scales, gated
        )
        op(input, out, scales, group_size, eps, scale_ue8m0)
        return out, scales

    quantize.__name__ = quantize.__qualname__ = op.name
    quantize.__doc__, quantize.__module__ = doc, op.family.module
    return quantize

"""``sglang.jit_kernel.norm`` (sglang 0.5.13) on sgljit's norm ops: its public functions with their
signatures and results, so a call site ports by changing the import::

    from sgljit.compat.sglang.norm import fused_add_rmsnorm, rmsnorm

What sglang accepts, these accept and compute alike (``cast_x_before_out_mul=True``: the float32
sum ``input + residual`` is normalized, rounded to the dtype, then multiplied by the weight, as
sglang's kernel does); they also accept more (any row width — sglang raises for widths its kernels
lack —, float32, strided rows, a float32 weight). The width predicates keep sglang's answers, since
call sites choose paths with them; ``can_use_fused_inplace_qknorm`` is true for every dtype
sgljit's qknorm has (sglang's: float16 and bfloat16). Without ``cast_x_before_out_mul`` the fused
add normalizes the sum rounded to the dtype (what it stores); sglang's kernel takes the sum of
squares of the float32 sum: the two differ within a rounding of the dtype.
"""

from __future__ import annotations

import logging

import torch

import sgljit

__all__ = [
    "can_use_fused_inplace_qknorm",
    "fused_add_rmsnorm",
    "fused_inplace_qknorm",
    "fused_inplace_qknorm_across_heads",
    "is_supported_jit_fused_add_rmsnorm_hidden_size",
    "rmsnorm",
]

logger = logging.getLogger(__name__)

_QKNORM_HEAD_DIMS = (64, 128, 256, 512, 1024)
_QKNORM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_RMSNORM_WARP_SIZES = frozenset({64, 128, 256})


def _is_supported_rmsnorm_hidden_size(d: int) -> bool:
    """sglang's widths for its rmsnorm kernels (sgljit's rmsnorm takes any width)."""
    return d in _RMSNORM_WARP_SIZES or (
        (d > 256 and d % 256 == 0 and d <= 8192) or (d >= 8192 and d % 512 == 0 and d <= 16384)
    )


def is_supported_jit_fused_add_rmsnorm_hidden_size(hidden_size: int) -> bool:
    """sglang's widths for its fused_add_rmsnorm kernel (sgljit's takes any width)."""
    return hidden_size > 0 and hidden_size % 16 == 0 and hidden_size <= 8192


@torch.compiler.assume_constant_result
def can_use_fused_inplace_qknorm(head_dim: int, dtype: torch.dtype) -> bool:
    """Whether :func:`fused_inplace_qknorm` runs for heads of ``head_dim`` elements of ``dtype``."""
    if head_dim not in _QKNORM_HEAD_DIMS:
        logger.warning(f"Unsupported head_dim={head_dim} for JIT QK-Norm kernel")
        return False
    return dtype in _QKNORM_DTYPES


def fused_inplace_qknorm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    head_dim: int = 0,
) -> None:
    """In place, per head: q ``[T, Hq, D]``, k ``[T, Hk, D]``, weights ``[D]`` (``head_dim``: D, or
    0 for q's last dimension)."""
    if head_dim and isinstance(q, torch.Tensor) and q.size(-1) != head_dim:
        raise ValueError(f"head_dim: {head_dim}, but q's last dimension is {q.size(-1)}")
    sgljit.ops.qknorm(q, k, q_weight, k_weight, eps)


def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> None:
    """``out = rmsnorm(input) * weight``; without ``out``, in place (into ``input``)."""
    sgljit.ops.rmsnorm(input, weight, eps, out=input if out is None else out)


def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    cast_x_before_out_mul: bool = False,
) -> None:
    """In place: ``residual <- input + residual``, ``input <- rmsnorm(residual) * weight``;
    ``cast_x_before_out_mul``: the normalized row is rounded to the dtype before the weight
    multiply (Hugging Face's LlamaRMSNorm)."""
    sgljit.ops.fused_add_rmsnorm(
        input, residual, weight, eps, round_before_weight=cast_x_before_out_mul
    )


def fused_inplace_qknorm_across_heads(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
) -> None:
    """In place, each row of q ``[T, Hq*D]`` and k ``[T, Hk*D]`` normalized over the whole row;
    q_weight ``[Hq*D]``, k_weight ``[Hk*D]``."""
    sgljit.ops.qknorm_across_heads(q, k, q_weight, k_weight, eps)

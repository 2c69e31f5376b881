"""``flashinfer.norm``'s RMSNorm functions on sgljit's norm ops, with their signatures and results, so
a call site ports by changing the import::

    from sgljit.compat.flashinfer.norm import fused_add_rmsnorm, rmsnorm

``rmsnorm`` takes ``[T, H]`` and ``[T, heads, H]`` input (strided views, e.g. q of a fused qkv
buffer, as FlashInfer's QK-norm path does); the others ``[T, H]`` and more (any rank, a float32
weight, float32 rows). ``enable_pdl`` is accepted and left to sgljit, which launches with
programmatic dependent launch where the GPU has it (``SGLJIT_PDL=0`` turns it off). Difference,
within a rounding of the dtype: the fused adds normalize the rounded ``input + residual`` (what they
store in ``residual``); FlashInfer's kernels normalize the float32 sum.
"""

from __future__ import annotations

import torch

import sgljit

__all__ = ["fused_add_rmsnorm", "gemma_fused_add_rmsnorm", "gemma_rmsnorm", "rmsnorm"]


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
    * weight``."""
    sgljit.ops.fused_add_rmsnorm(input, residual, weight, eps)


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
    * (weight + 1)``."""
    sgljit.ops.gemma_fused_add_rmsnorm(input, residual, weight, eps)

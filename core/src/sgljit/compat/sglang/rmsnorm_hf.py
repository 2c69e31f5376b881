"""``sglang.jit_kernel.rmsnorm_hf`` (sglang 0.5.13) on sgljit's rmsnorm: Hugging Face's LlamaRMSNorm,
``out = weight * cast_dtype(x * rsqrt(mean(x^2) + eps))`` (``round_before_weight=True``).

What sglang accepts, this accepts and computes alike; it also takes any row width (sglang raises for
widths its kernels lack), rows of more dimensions, float32 rows and a float32 weight (the result
stays in the input's dtype). ``is_supported_rmsnorm_hf_hidden_size`` keeps sglang's answers.
"""

from __future__ import annotations

import torch

import sgljit

__all__ = ["is_supported_rmsnorm_hf_hidden_size", "rmsnorm_hf"]

_CTA_BLOCK_SIZE = 512
_WARP_SIZE = 32


def is_supported_rmsnorm_hf_hidden_size(hidden_size: int) -> bool:
    """sglang's widths for its rmsnorm_hf kernels: multiples of 32 in [32, 512) and multiples of
    512 (sgljit's rmsnorm takes any width)."""
    if _WARP_SIZE <= hidden_size < _CTA_BLOCK_SIZE and hidden_size % _WARP_SIZE == 0:
        return True
    return hidden_size >= _CTA_BLOCK_SIZE and hidden_size % _CTA_BLOCK_SIZE == 0


def rmsnorm_hf(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out = weight * cast_dtype(rsqrt(mean(x^2) + eps) * x)``, returned (allocated if not
    given). input ``[T, H]``, weight ``[H]``."""
    if out is None:
        out = torch.empty_like(input)
    return sgljit.ops.rmsnorm(input, weight, eps, out=out, round_before_weight=True)

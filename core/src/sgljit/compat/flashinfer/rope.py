"""FlashInfer's ``flashinfer.rope`` cos/sin-cache functions on sgljit's rope op.

``from sgljit.compat.flashinfer.rope import apply_rope_with_cos_sin_cache_inplace`` where code
imports it from ``flashinfer.rope``. Same signatures and semantics (cos_sin_cache must be float32,
as FlashInfer requires). Beyond FlashInfer: a position outside the cache leaves its token unrotated
(see ``sgljit.ops.apply_rope``).
"""

from __future__ import annotations

import torch

from sgljit import ops

__all__ = ["apply_rope_with_cos_sin_cache", "apply_rope_with_cos_sin_cache_inplace"]


def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    """Rotary embedding of query ``[nnz, Hq * head_size]`` and key ``[nnz, Hk * head_size]`` (or
    ``[nnz, H, head_size]``), in place. positions ``[nnz]`` int32/int64, cos_sin_cache float32
    ``[max_seq_len, rotary_dim]`` (cos | sin): the first rotary_dim dims of each head rotate.
    ``is_neox``: pairs ``(i, i + rotary_dim/2)``, else interleaved pairs ``(2i, 2i + 1)``."""
    _require_float32(cos_sin_cache)
    ops.apply_rope(query, key, cos_sin_cache, positions, is_neox=is_neox, head_dim=head_size)


def apply_rope_with_cos_sin_cache(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_rope_with_cos_sin_cache_inplace` on copies of query and key: returns the
    rotated ``(query, key)``, new tensors of their shapes (the inputs are not modified)."""
    _require_float32(cos_sin_cache)
    query_out = query.clone(memory_format=torch.contiguous_format)
    key_out = key.clone(memory_format=torch.contiguous_format)
    ops.apply_rope(
        query_out, key_out, cos_sin_cache, positions, is_neox=is_neox, head_dim=head_size
    )
    return query_out, key_out


def _require_float32(cos_sin_cache) -> None:
    if isinstance(cos_sin_cache, torch.Tensor) and cos_sin_cache.dtype != torch.float32:
        raise ValueError(
            f"cos_sin_cache: FlashInfer's rope requires float32, got "
            f"{str(cos_sin_cache.dtype).removeprefix('torch.')} (sgljit.ops.apply_rope also takes "
            "a cache in q's dtype)"
        )

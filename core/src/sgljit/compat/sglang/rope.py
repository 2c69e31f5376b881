"""sglang's ``sglang.jit_kernel.rope`` on sgljit's rope ops.

``from sgljit.compat.sglang.rope import ...`` where sglang code imports the same names from
``sglang.jit_kernel.rope`` (sglang 0.5.13). Same signatures and semantics: everything works in
place; ``rotary_embedding`` returns ``(query, key)``. Beyond sglang: cos_sin_cache may be float32 or
q's dtype everywhere (sglang: float32 for the fused kernels, q's dtype for ``rotary_embedding``),
heads may be wider than the cache (the first rotary_dim dims rotate), positions and out_loc may be
int32 or int64 each, and out-of-range indices touch no memory: a position outside the cache leaves
its token unrotated, an out_loc outside the cache stores nothing (see ``sgljit.ops.apply_rope``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgljit import ops

from ..vllm._custom_ops import rotary_embedding as _vllm_rotary_embedding

__all__ = [
    "FusedSetKVBufferArg",
    "apply_rope_inplace",
    "apply_rope_inplace_with_kvcache",
    "apply_rope_with_cos_sin_cache_inplace",
    "rotary_embedding",
    "rotary_embedding_with_key",
    "rotary_embedding_without_key",
]


def rotary_embedding_with_key(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    """vLLM's rotary embedding (sglang's ``pos_enc.cuh``) of query and key, in place: positions
    ``[T]`` or ``[B, S]``, query/key ``[T, H * head_size]`` or ``[T, H, head_size]`` (or with
    ``[B, S]`` leading dimensions), cos_sin_cache ``[max_pos, rotary_dim]``."""
    _vllm_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


def rotary_embedding_without_key(
    positions: torch.Tensor,
    query: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    """:func:`rotary_embedding_with_key` of query alone."""
    _vllm_rotary_embedding(positions, query, None, head_size, cos_sin_cache, is_neox)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`rotary_embedding_with_key` (key None: query alone); returns ``(query, key)``, the
    tensors given, rotated."""
    _vllm_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
    return query, key


@dataclass
class FusedSetKVBufferArg:
    """The KV-cache store fused into :func:`apply_rope_with_cos_sin_cache_inplace`.

    value ``[nnz, num_v_heads * head_size]`` (or ``[nnz, num_v_heads, head_size]``); k_buffer and
    v_buffer ``[cache_size, num_kv_heads * head_size]``; cache_loc ``[nnz]``, the rows written.
    """

    value: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    cache_loc: torch.Tensor


def apply_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    is_neox: bool,
    rope_dim: int = 0,
) -> None:
    """Rotary embedding of q ``[T, Hq, D]`` and k ``[T, Hk, D]`` in place; cos_sin_cache
    ``[max_pos, rope_dim]`` (cos | sin), positions ``[T]``. ``rope_dim`` (0: the cache's width)
    must be the cache's width."""
    ops.apply_rope(q, k, cos_sin_cache, positions, is_neox=is_neox, rotary_dim=rope_dim or None)


def apply_rope_inplace_with_kvcache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    out_loc: torch.Tensor,
    *,
    is_neox: bool,
    rope_dim: int = 0,
) -> None:
    """Rope of q and k in place, the rotated k stored at ``k_cache[out_loc]`` and v at
    ``v_cache[out_loc]``: q ``[T, Hq, D]``, k ``[T, Hk, D]``, v of k's size (any shape), caches
    ``[cache_size, Hk * D]`` (or ``[cache_size, Hk, D]``)."""
    ops.apply_rope_with_kv_cache(
        q,
        k,
        v.view_as(k),
        k_cache,
        v_cache,
        cos_sin_cache,
        positions,
        out_loc,
        is_neox=is_neox,
        rotary_dim=rope_dim or None,
        rotate_k_inplace=True,
    )


def apply_rope_with_cos_sin_cache_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    is_neox: bool,
    rope_dim: int = 0,
    fused_args: FusedSetKVBufferArg | None = None,
) -> None:
    """:func:`apply_rope_inplace`, or with ``fused_args`` :func:`apply_rope_inplace_with_kvcache`
    (its value, k_buffer, v_buffer and cache_loc)."""
    if fused_args is None:
        apply_rope_inplace(q, k, cos_sin_cache, positions, is_neox=is_neox, rope_dim=rope_dim)
        return
    apply_rope_inplace_with_kvcache(
        q,
        k,
        fused_args.value,
        fused_args.k_buffer,
        fused_args.v_buffer,
        cos_sin_cache,
        positions,
        fused_args.cache_loc,
        is_neox=is_neox,
        rope_dim=rope_dim,
    )

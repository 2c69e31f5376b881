"""``flashinfer.page``'s paged-KV functions on sgljit's ops, with their signatures and results::

    from sgljit.compat.flashinfer.page import append_paged_kv_cache, get_batch_indices_positions

- ``get_seq_lens(kv_indptr, kv_last_page_len, page_size)``: each sequence's length.
- ``get_batch_indices_positions(append_indptr, seq_lens, nnz)``: int32 ``(batch_indices,
  positions)`` of the appended tokens (computed with torch ops, no host sync).
- ``append_paged_kv_cache`` and ``append_paged_mla_kv_cache``: the appended k/v (ckv/kpe) copied
  into the pages, NHD or HND, the cache's dtype (float16/bfloat16/float32/float8).

Where this differs on purpose: page-table contents (indptr, indices, last-page lengths, batch
indices, positions) are checked before anything is written where every page-table tensor is on the
CPU, or with ``SGLJIT_CHECK_INDICES=1`` (an error names the argument); unchecked, a token whose entry
does not resolve to a page of the cache is not stored (FlashInfer writes out of bounds).
"""

from __future__ import annotations

import torch

from sgljit import ops

__all__ = [
    "append_paged_kv_cache",
    "append_paged_mla_kv_cache",
    "get_batch_indices_positions",
    "get_seq_lens",
]


def get_seq_lens(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> torch.Tensor:
    """``max(pages - 1, 0) * page_size + kv_last_page_len`` per sequence."""
    from sgljit_rope.fp8_kv import get_seq_lens as impl

    return impl(kv_indptr, kv_last_page_len, page_size)


def get_batch_indices_positions(
    append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 ``(batch_indices, positions)`` ``[nnz]``: sequence b's appended rows
    ``append_indptr[b]:append_indptr[b + 1]`` take the last positions of its ``seq_lens[b]``."""
    from sgljit_rope.fp8_kv import get_batch_indices_positions as impl

    return impl(append_indptr, seq_lens, nnz)


def append_paged_kv_cache(
    append_key: torch.Tensor,
    append_value: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    kv_layout: str = "NHD",
) -> None:
    """Append ``append_key``/``append_value`` ``[nnz, Hk, D]`` into ``paged_kv_cache`` (a tuple
    ``(k_cache, v_cache)`` or one ``[P, 2, ...]`` tensor; NHD or HND)."""
    ops.append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                              kv_indices, kv_indptr, kv_last_page_len, kv_layout)  # fmt: skip


def append_paged_mla_kv_cache(
    append_ckv: torch.Tensor,
    append_kpe: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
) -> None:
    """Append MLA's ``append_ckv`` ``[nnz, N]`` and ``append_kpe`` ``[nnz, R]`` into
    ``ckv_cache`` ``[P, page_size, N]`` and ``kpe_cache`` ``[P, page_size, R]``."""
    ops.append_paged_mla_kv_cache(append_ckv, append_kpe, batch_indices, positions, ckv_cache,
                                  kpe_cache, kv_indices, kv_indptr, kv_last_page_len)  # fmt: skip

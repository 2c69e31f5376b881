"""PyTorch implementation of the fp8 KV ops (:mod:`sgljit_rope.fp8_kv`): the CPU path and the oracle
the kernels are tested against.

Rope math in float32 (float64 for float64 tensors: the oracle), then ``x * scale`` clamped to the
fp8 format's finite range and rounded to nearest even (NaN stays NaN): FlashInfer's saturating cast.
Out-of-range indices behave as in the kernels: a position outside ``[0, max_pos)`` leaves its token
unrotated (still quantized); a token whose page-table entry does not resolve to a page of the cache
(see :func:`page_slots`) stores nothing.
"""

from __future__ import annotations

import torch

from .reference import _gather_cos_sin, _math, _rotate

__all__ = [
    "append_paged_kv_cache_into",
    "page_slots",
    "quantize_fp8",
    "rope_quantize_fp8_append_paged_into",
    "rope_quantize_fp8_into",
]


def quantize_fp8(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``(x * scale)`` clamped to ``dtype``'s finite range, rounded to ``dtype`` (NaN stays NaN)."""
    bound = torch.finfo(dtype).max
    return (x * scale).clamp(-bound, bound).to(dtype)


def _rope_quant(x, cos, sin, valid, is_neox, scale, dtype) -> torch.Tensor:
    xm = _math(x)
    return quantize_fp8(torch.where(valid, _rotate(xm, cos, sin, is_neox), xm), scale, dtype)


def rope_quantize_fp8_into(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, positions, q_rope_out,
                           k_rope_out, q_nope_out, k_nope_out, scale_q, scale_k,
                           is_neox) -> None:  # fmt: skip
    """Rotated ``q_rope``/``k_rope`` and the unrotated ``q_nope``/``k_nope`` quantized to fp8 into
    the four outputs, with ``scale_q`` for q's parts and ``scale_k`` for k's."""
    cos, sin, valid = _gather_cos_sin(cos_sin_cache, positions)
    dtype = q_rope_out.dtype
    q_rope_out.copy_(_rope_quant(q_rope, cos, sin, valid, is_neox, scale_q, dtype))
    k_rope_out.copy_(_rope_quant(k_rope, cos, sin, valid, is_neox, scale_k, dtype))
    q_nope_out.copy_(quantize_fp8(_math(q_nope), scale_q, dtype))
    k_nope_out.copy_(quantize_fp8(_math(k_nope), scale_k, dtype))


def page_slots(kv_indices, kv_indptr, batch_indices, page_positions, num_pages: int,
               page_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(stored [T] bool, page [T], entry [T]) of each token: token t of sequence ``b =
    batch_indices[t]`` at position ``p = page_positions[t]`` goes to entry ``p % page_size`` of page
    ``kv_indices[kv_indptr[b] + p // page_size]``; it is stored only where ``0 <= b < batch``,
    ``p >= 0``, that index lies in ``[kv_indptr[b], kv_indptr[b + 1])`` and in ``kv_indices``, and
    the page in ``[0, num_pages)``."""
    batch = max(kv_indptr.shape[0] - 1, 0)
    b, pos = batch_indices.long(), page_positions.long()
    ok = (b >= 0) & (b < batch) & (pos >= 0) & (page_size > 0)
    if batch == 0 or page_size == 0:
        zeros = torch.zeros_like(b)
        return ok, zeros, zeros
    bc = b.clamp(0, batch - 1)
    indptr = kv_indptr.long()
    start, end = indptr[bc], indptr[bc + 1]
    it = start + pos.clamp(min=0).div(page_size, rounding_mode="floor")
    ok &= (it >= 0) & (it < end) & (it < kv_indices.shape[0])
    if kv_indices.shape[0] == 0:
        zeros = torch.zeros_like(b)
        return ok & False, zeros, zeros
    page = kv_indices.long()[it.clamp(0, kv_indices.shape[0] - 1)]
    ok &= (page >= 0) & (page < num_pages)
    return ok, page, pos.clamp(min=0).remainder(page_size)


def _store(cache: torch.Tensor, ok, page, entry, values: torch.Tensor) -> None:
    """``cache[page[t], entry[t]] = values[t]`` where ``ok[t]`` (cache ``[P, page, H, D]``)."""
    cache[page[ok], entry[ok]] = values[ok]


def rope_quantize_fp8_append_paged_into(q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache,
                                        positions, q_rope_out, q_nope_out, k_rope_cache,
                                        k_nope_cache, v_cache, kv_indices, kv_indptr,
                                        batch_indices, page_positions, scale_q, scale_k, scale_v,
                                        is_neox) -> None:  # fmt: skip
    """q's parts rotated (the rope part) and quantized into ``q_rope_out``/``q_nope_out``; k's parts
    likewise (``scale_k``) and v (``scale_v``) quantized into the paged caches ``[P, page, Hk, *]``
    at the entries :func:`page_slots` gives."""
    cos, sin, valid = _gather_cos_sin(cos_sin_cache, positions)
    dtype = q_rope_out.dtype
    q_rope_out.copy_(_rope_quant(q_rope, cos, sin, valid, is_neox, scale_q, dtype))
    q_nope_out.copy_(quantize_fp8(_math(q_nope), scale_q, dtype))
    ok, page, entry = page_slots(kv_indices, kv_indptr, batch_indices, page_positions,
                                 k_rope_cache.shape[0], k_rope_cache.shape[1])  # fmt: skip
    _store(
        k_rope_cache, ok, page, entry, _rope_quant(k_rope, cos, sin, valid, is_neox, scale_k, dtype)
    )
    _store(k_nope_cache, ok, page, entry, quantize_fp8(_math(k_nope), scale_k, dtype))
    _store(v_cache, ok, page, entry, quantize_fp8(_math(v), scale_v, dtype))


def append_paged_kv_cache_into(k, v, k_cache, v_cache, kv_indices, kv_indptr, batch_indices,
                               page_positions) -> None:  # fmt: skip
    """k ``[T, H, Dk]`` and v ``[T, H, Dv]`` copied (same dtype) into the paged caches
    ``[P, page, H, *]`` at the entries :func:`page_slots` gives."""
    ok, page, entry = page_slots(kv_indices, kv_indptr, batch_indices, page_positions,
                                 k_cache.shape[0], k_cache.shape[1])  # fmt: skip
    _store(k_cache, ok, page, entry, k.to(k_cache.dtype))
    _store(v_cache, ok, page, entry, v.to(v_cache.dtype))

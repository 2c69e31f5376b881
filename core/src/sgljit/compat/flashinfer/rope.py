"""``flashinfer.rope``'s rotary embedding functions on sgljit's rope op, with their signatures and
results, so a call site ports by changing the import::

    from sgljit.compat.flashinfer.rope import apply_rope_pos_ids_inplace

- ``apply_rope_with_cos_sin_cache{,_inplace}``: a ``[max_pos, rotary_dim]`` float32 cos/sin cache
  (cos | sin), as FlashInfer requires.
- ``apply_rope{,_inplace}`` (a ragged batch: ``indptr`` and per-sequence ``offsets``),
  ``apply_rope_pos_ids{,_inplace}`` (a position per token) and their Llama 3.1 forms
  ``apply_llama31_rope*`` (frequency smoothing between ``low_freq_factor`` and
  ``high_freq_factor`` wavelengths of ``old_context_len``): cos/sin computed from ``rope_theta``
  and ``rope_scale``, as FlashInfer's kernels compute them on the fly.

- ``rope_quantize_fp8`` / ``mla_rope_quantize_fp8`` (rope, then fp8) and
  ``rope_quantize_fp8_append_paged_kv_cache`` (rope, fp8, then the append into a paged cache): see
  ``sgljit.compat.flashinfer.page`` for the page table and its helpers.

The ``*_inplace`` functions rotate q and k in place and return None; the others return new
``(q_rope, k_rope)`` and leave q and k as they were. ``interleave=False`` rotates the pairs
``(i, i + rotary_dim/2)`` (neox), ``True`` the adjacent pairs ``(2i, 2i + 1)``; dims past
``rotary_dim`` are copied unrotated.

Where this differs on purpose:

- Computed cos/sin: the angle ``float32(position) * freq`` is formed in float32 as FlashInfer does,
  with ``freq`` rounded from float64 and cos/sin evaluated accurately (FlashInfer: ``__powf`` and
  ``__sincosf``, fast approximations); the table is one ``[nnz, rotary_dim]`` float32 row per token
  (an extra pass over ``nnz * rotary_dim * 4`` bytes before the rotation, no host sync).
- A position outside the cache (``*_cos_sin_cache``, ``rope_quantize_fp8*``) leaves its token
  unrotated (see ``sgljit.ops.apply_rope``); FlashInfer reads out of bounds.
- fp8 (taken from FlashInfer's documentation and kernels as we read them): the rotated value is
  multiplied by ``quant_scale_q`` / ``quant_scale_kv`` in float32 and rounded to nearest even with
  saturation to the format's finite range (its ``__nv_fp8_*`` conversions); a scale may also be a
  one-element tensor (read on the host). ``enable_pdl`` is accepted and ignored.
"""

from __future__ import annotations

import math

import torch

from sgljit import ops

__all__ = [
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "mla_rope_quantize_fp8",
    "rope_quantize_fp8",
    "rope_quantize_fp8_append_paged_kv_cache",
]


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


def apply_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """Rotary embedding of a ragged batch, in place: q ``[nnz, Hq, D]``, k ``[nnz, Hk, D]``;
    sequence ``i`` is rows ``indptr[i]:indptr[i + 1]``, its first token at position
    ``offsets[i]``. Frequencies ``rope_theta ** (-2j / rotary_dim) / rope_scale``."""
    _rotate(q, k, _ragged_positions(indptr, offsets, q), rotary_dim, interleave,
            _frequencies(q, rotary_dim, rope_scale, rope_theta))  # fmt: skip


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_rope_inplace` on copies: returns ``(q_rope, k_rope)``."""
    return _on_copies(
        apply_rope_inplace, q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta
    )


def apply_rope_pos_ids_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """Rotary embedding of q ``[nnz, Hq, D]`` and k ``[nnz, Hk, D]`` in place, token ``t`` at
    position ``pos_ids[t]`` (int32/int64 ``[nnz]``)."""
    _rotate(q, k, pos_ids, rotary_dim, interleave,
            _frequencies(q, rotary_dim, rope_scale, rope_theta))  # fmt: skip


def apply_rope_pos_ids(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_rope_pos_ids_inplace` on copies: returns ``(q_rope, k_rope)``."""
    return _on_copies(
        apply_rope_pos_ids_inplace, q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta
    )


def apply_llama31_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """:func:`apply_rope_inplace` with Llama 3.1's frequencies: wavelengths beyond
    ``old_context_len / low_freq_factor`` divided by ``rope_scale``, below
    ``old_context_len / high_freq_factor`` kept, smoothly blended between."""
    freqs = _frequencies(q, rotary_dim, rope_scale, rope_theta,
                         (low_freq_factor, high_freq_factor, old_context_len))  # fmt: skip
    _rotate(q, k, _ragged_positions(indptr, offsets, q), rotary_dim, interleave, freqs)


def apply_llama31_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_llama31_rope_inplace` on copies: returns ``(q_rope, k_rope)``."""
    return _on_copies(
        apply_llama31_rope_inplace,
        q,
        k,
        indptr,
        offsets,
        rotary_dim,
        interleave,
        rope_scale,
        rope_theta,
        low_freq_factor,
        high_freq_factor,
        old_context_len,
    )


def apply_llama31_rope_pos_ids_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """:func:`apply_rope_pos_ids_inplace` with Llama 3.1's frequencies (see
    :func:`apply_llama31_rope_inplace`)."""
    freqs = _frequencies(q, rotary_dim, rope_scale, rope_theta,
                         (low_freq_factor, high_freq_factor, old_context_len))  # fmt: skip
    _rotate(q, k, pos_ids, rotary_dim, interleave, freqs)


def apply_llama31_rope_pos_ids(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_llama31_rope_pos_ids_inplace` on copies: returns ``(q_rope, k_rope)``."""
    return _on_copies(
        apply_llama31_rope_pos_ids_inplace,
        q,
        k,
        pos_ids,
        rotary_dim,
        interleave,
        rope_scale,
        rope_theta,
        low_freq_factor,
        high_freq_factor,
        old_context_len,
    )


def rope_quantize_fp8(
    q_rope: torch.Tensor,
    k_rope: torch.Tensor,
    q_nope: torch.Tensor | None,
    k_nope: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    pos_ids: torch.Tensor,
    is_neox: bool = True,
    quantize_dtype: torch.dtype | None = None,
    quant_scale_q: float = 1.0,
    quant_scale_kv: float = 1.0,
    q_rope_out: torch.Tensor | None = None,
    k_rope_out: torch.Tensor | None = None,
    q_nope_out: torch.Tensor | None = None,
    k_nope_out: torch.Tensor | None = None,
    enable_pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rope on ``q_rope``/``k_rope``, then all four parts quantized to fp8 (``x * scale``, rounded
    to nearest even, saturating): returns ``(q_rope_out, k_rope_out, q_nope_out, k_nope_out)``.
    GQA/MHA k is ``[nnz, Hk, *]``, MLA k ``[nnz, *]``; ``q_nope``/``k_nope`` None: no non-rotary
    dims (zero-width outputs). ``enable_pdl`` is accepted and ignored (sgljit decides launches).
    See ``sgljit.ops.rope_quantize_fp8``."""
    return ops.rope_quantize_fp8(
        q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype,
        quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out, q_nope_out, k_nope_out,
    )  # fmt: skip


def mla_rope_quantize_fp8(
    q_rope: torch.Tensor,
    k_rope: torch.Tensor,
    q_nope: torch.Tensor | None,
    k_nope: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    pos_ids: torch.Tensor,
    is_neox: bool = True,
    quantize_dtype: torch.dtype | None = None,
    quant_scale_q: float = 1.0,
    quant_scale_kv: float = 1.0,
    q_rope_out: torch.Tensor | None = None,
    k_rope_out: torch.Tensor | None = None,
    q_nope_out: torch.Tensor | None = None,
    k_nope_out: torch.Tensor | None = None,
    enable_pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`rope_quantize_fp8` (FlashInfer's MLA name for the same function)."""
    return rope_quantize_fp8(
        q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype,
        quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out, q_nope_out, k_nope_out, enable_pdl,
    )  # fmt: skip


def rope_quantize_fp8_append_paged_kv_cache(
    q_rope: torch.Tensor,
    k_rope: torch.Tensor,
    q_nope: torch.Tensor | None,
    k_nope: torch.Tensor | None,
    v: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    pos_ids: torch.Tensor,
    paged_kv_cache: tuple[torch.Tensor, torch.Tensor],
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    is_neox: bool = True,
    quantize_dtype: torch.dtype | None = None,
    quant_scale_q: float = 1.0,
    quant_scale_kv: float = 1.0,
    page_size: int = 16,
    kv_layout: str = "NHD",
    q_rope_out: torch.Tensor | None = None,
    q_nope_out: torch.Tensor | None = None,
    enable_pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rope, fp8 quantize and append k (and v: GQA/MHA) or kpe/ckv (MLA, ``v`` None) into the
    paged fp8 cache ``paged_kv_cache`` in one launch; returns the quantized ``(q_rope_out,
    q_nope_out)``. k and v share ``quant_scale_kv``. See
    ``sgljit.ops.rope_quantize_fp8_append_paged_kv_cache`` (layouts, page-table checks)."""
    return ops.rope_quantize_fp8_append_paged_kv_cache(
        q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache, pos_ids, paged_kv_cache, kv_indices,
        kv_indptr, batch_indices, positions, is_neox, quantize_dtype, quant_scale_q,
        quant_scale_kv, page_size, kv_layout, q_rope_out, q_nope_out,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------


def _on_copies(inplace, q, k, *args) -> tuple[torch.Tensor, torch.Tensor]:
    """``inplace(q_rope, k_rope, *args)`` on copies of q and k; returns ``(q_rope, k_rope)``."""
    q_rope, k_rope = q.clone(), k.clone()
    inplace(q_rope, k_rope, *args)
    return q_rope, k_rope


def _frequencies(q, rotary_dim, rope_scale, rope_theta, llama31=None) -> torch.Tensor:
    """float32 ``[rotary_dim / 2]``: ``rope_theta ** (-2j / rotary_dim)``, divided by
    ``rope_scale`` (``llama31``: ``(low_freq_factor, high_freq_factor, old_context_len)``, blended
    by wavelength as FlashInfer's kernels do)."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q: expected a torch.Tensor, got {type(q).__name__}")
    rot = q.shape[-1] if rotary_dim is None else rotary_dim
    if not isinstance(rot, int) or rot <= 0 or rot % 2 or rot > q.shape[-1]:
        raise ValueError(
            f"rotary_dim: expected an even int in (0, head_dim {q.shape[-1]}], got {rotary_dim!r}"
        )
    freq = torch.arange(0, rot, 2, dtype=torch.float64, device=q.device).div(rot)
    freq = torch.pow(1.0 / rope_theta, freq)
    if llama31 is None:
        freq = freq / rope_scale
    else:
        low, high, old_context_len = llama31
        smooth = freq * (old_context_len / (2 * math.pi * (high - low))) - 1.0 / (high / low - 1.0)
        smooth = smooth.clamp(0.0, 1.0)
        freq = (1 - smooth) * (freq / rope_scale) + smooth * freq
    return freq.float()


def _ragged_positions(indptr, offsets, q) -> torch.Tensor:
    """Each token's position: ``offsets[i] + (t - indptr[i])`` for the rows ``t`` of sequence
    ``i`` (no host sync: the output size is q's rows)."""
    for name, t in (("indptr", indptr), ("offsets", offsets)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D index tensor")
    if indptr.shape[0] != offsets.shape[0] + 1:
        raise ValueError(
            f"indptr: expected batch_size + 1 = {offsets.shape[0] + 1} entries, got "
            f"{indptr.shape[0]}"
        )
    nnz = q.shape[0]
    starts = (indptr[:-1] - offsets).long()
    lengths = indptr.diff().long()
    rows = torch.arange(nnz, device=q.device)
    return rows - torch.repeat_interleave(starts, lengths, output_size=nnz)


def _rotate(q, k, positions, rotary_dim, interleave, freqs) -> None:
    """q, k rotated in place by a per-token cos/sin table (one row per token)."""
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"pos_ids: expected a torch.Tensor, got {type(positions).__name__}")
    angles = positions.to(torch.float32).unsqueeze(-1) * freqs
    table = torch.cat((angles.cos(), angles.sin()), dim=-1)
    rows = torch.arange(table.shape[0], device=table.device)
    ops.apply_rope(q, k, table, rows, is_neox=not interleave)


def _require_float32(cos_sin_cache) -> None:
    if isinstance(cos_sin_cache, torch.Tensor) and cos_sin_cache.dtype != torch.float32:
        raise ValueError(
            f"cos_sin_cache: FlashInfer's rope requires float32, got "
            f"{str(cos_sin_cache.dtype).removeprefix('torch.')} (sgljit.ops.apply_rope also takes "
            "a cache in q's dtype)"
        )

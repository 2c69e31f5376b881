"""Rotary position embedding: ``apply_rope``, ``apply_rope_with_kv_cache`` and ``qknorm_rope``
(per-head RMSNorm of q and k, then rope, in one pass).

Both work in place and return None. Layout: q ``[T, Hq, D]``, k/v ``[T, Hk, D]`` (or flattened
``[T, H * D]``), possibly strided views into a fused qkv buffer (the last dim must be contiguous);
``cos_sin_cache`` ``[max_pos, rotary_dim]``, float32 or q's dtype (as vLLM keeps it), with cos in
the first half of a row and sin in the second; ``positions`` int32/int64 ``[T]``. Math in float32.

Out-of-range indices never touch memory out of bounds: a position outside ``[0, max_pos)`` leaves
its token unrotated, an ``out_loc`` outside ``[0, num_slots)`` stores nothing for its token. With
``SGLJIT_CHECK_INDICES=1`` both are checked on the host first (a device sync; eager calls outside
CUDA-graph capture only) and an ``IndexError`` names the first bad index. The variable is read once,
when this module is imported: set it before the first use of a rope op.

The kernel ops (``torch.ops.sgljit.apply_rope``, ``...apply_rope_with_kv_cache`` and
``...qknorm_rope`` and ``...apply_rope_with_kv_cache_rotate_k``, which also rotates k in place)
take 3-D ``[T, H, D]`` tensors, contiguous ``positions``/``out_loc`` and ``is_neox``; the public
functions below unflatten ``[T, H * D]`` views, make the index tensors contiguous and pick the KV
op. CUDA modules are specialized by dtype, cache dtype, index dtypes, rotary_dim (and head_dim for
the KV variants and qknorm_rope) and style; CUDA modules choose 16-byte or 1-element vectors per
call in C++; SYCL keys carry the vector width the pointers and strides allow (:func:`_pick_vec`,
:func:`_qknorm_rope_vec`).
"""

import functools
import os
from collections.abc import Callable

import torch

from sgljit.op import Case, Cuda, Family, Scalar, Sycl, Tensor

from . import reference

__all__ = ["apply_rope", "apply_rope_with_kv_cache", "family", "qknorm_rope"]

family = Family("rope", __file__)
_INDEX_DTYPES = (torch.int32, torch.int64)
_CHECK_INDICES = os.environ.get("SGLJIT_CHECK_INDICES", "0") not in ("", "0")
# What `sgljit build` prebuilds: bf16/fp16, common (head_dim, rotary_dim), int64 indices, full
# 16-byte vectors; apply_rope both styles, the KV variant neox.
_FLEET_DTYPES = (torch.bfloat16, torch.float16)
_FLEET_HEADS = ((64, 64), (128, 128), (128, 64), (256, 256), (512, 64))


# ------------------------------------------------------------------------------------------------
# Specializations


def _pick_vec(
    tensors,
    cos_sin_cache,
    max_pos: int,
    rotary_dim: int,
    head_dim: int,
    cache_size: int = 4,
    aligned=(),
) -> int:
    """The vector width (elements) of a SYCL specialization (CUDA modules choose theirs in C++):
    the widest power of two, up to 16 bytes,
    that divides ``rotary_dim // 2``, ``head_dim``, every [T, H, D] tensor's data pointer (in
    elements) and its strides of T and H (where that size is > 1); cos/sin (``cache_size``-byte
    elements) are read up to 16 bytes at a time (``min(vec, 16 // cache_size)`` elements), so that
    many elements must divide the cache's pointer and (if it has rows > 1) its row stride. The
    tensors ``aligned`` (of the same dtype) are read that many elements at a time from their
    pointers: each pointer too.

    Pointers and strides are combined as bits in one pass; only when that finds less than 16 bytes
    are the sizes read (a stride of a size-1 dimension does not count).
    """
    size = tensors[0].element_size()
    counts = (rotary_dim >> 1) | head_dim
    pointers = 16
    for t in aligned:
        pointers |= t.data_ptr()
    for t in tensors:
        st, sh, _ = t.stride()
        counts |= st | sh
        pointers |= t.data_ptr()
    bits = (counts * size) | pointers
    vec = (bits & -bits) // size
    if vec < 16 // size:
        counts = (rotary_dim >> 1) | head_dim
        for t in tensors:
            (st, sh, _), (nt, nh, _) = t.stride(), t.shape
            counts |= (st if nt > 1 else 0) | (sh if nh > 1 else 0)
        bits = (counts * size) | pointers
        vec = max(1, (bits & -bits) // size)
    cache = cos_sin_cache.data_ptr() | 16  # in bytes
    if max_pos > 1:
        cache |= cos_sin_cache.stride()[0] * cache_size
    elements = (cache & -cache) // cache_size  # at most 16 bytes' worth
    return vec if elements * cache_size == 16 else max(1, min(vec, elements))


def _cache_shape(cos_sin_cache: torch.Tensor, head_dim: int | None = None) -> tuple[int, int]:
    """(max_pos, rotary_dim) of cos_sin_cache, whose width must be even, positive and at most
    ``head_dim`` (when given), and which must have rows: checked before a module is built (an odd
    width fails to compile), and on the backends whose kernels would read past a head (SYCL) or
    fail unnamed (reference). CUDA modules check the rows themselves."""
    max_pos, rot = cos_sin_cache.shape
    if max_pos == 0:
        raise ValueError(
            "cos_sin_cache: has no rows (expected [max_pos, rotary_dim] with max_pos >= 1)"
        )
    _check_width(rot, head_dim)
    return max_pos, rot


def _check_width(rot: int, head_dim: int | None = None) -> None:
    if rot <= 0 or rot % 2:
        problem = f"its width {rot} (rotary_dim) must be a positive even number"
    elif head_dim is not None and rot > head_dim:
        problem = f"its width {rot} (rotary_dim) exceeds head_dim {head_dim}"
    else:
        return
    raise ValueError(f"cos_sin_cache: {problem}")


# The CUDA keys (template parameters; the values' order names the module: prebuild entries are
# made by the same functions, test_rope checks they match). rotary_dim <= head_dim: apply_rope's
# run() checks it (the module does not depend on head_dim); the KV key, whose module does, here.


_ROPE_PARAMS = ("dtype", "cache_dtype", "idx_dtype", "rotary_dim", "is_neox", "round_products")
_KV_PARAMS = ("dtype", "cache_dtype", "idx_dtype", "loc_dtype", "head_dim", "rotary_dim", "is_neox")
_SIZE = {
    torch.float32: 4,
    torch.bfloat16: 2,
    torch.float16: 2,
}  # a cache of another dtype is refused


def _rope_key(q, k, cos_sin_cache, positions, is_neox, round_products) -> tuple:
    """The module's template parameters, read as cheaply as possible (every eager call): the
    width is checked once per new key (_rope_params), the rows and the vector width (pointers,
    strides) by the module per call."""
    return (q.dtype, cos_sin_cache.dtype, positions.dtype, cos_sin_cache.shape[1], is_neox,
            round_products)  # fmt: skip


def _rope_params(dtype, cache_dtype, idx_dtype, rotary_dim: int, is_neox: bool,
                 round_products: bool) -> dict:  # fmt: skip
    _check_width(rotary_dim)
    key = (dtype, cache_dtype, idx_dtype, rotary_dim, is_neox, round_products)
    return dict(zip(_ROPE_PARAMS, key, strict=True))


def _kv_key(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox) -> tuple:
    return (q.dtype, cos_sin_cache.dtype, positions.dtype, out_loc.dtype, q.shape[2],
            cos_sin_cache.shape[1], is_neox)  # fmt: skip


def _kv_params(dtype, cache_dtype, idx_dtype, loc_dtype, head_dim, rotary_dim, is_neox) -> dict:
    _check_width(rotary_dim, head_dim)
    key = (dtype, cache_dtype, idx_dtype, loc_dtype, head_dim, rotary_dim, is_neox)
    return dict(zip(_KV_PARAMS, key, strict=True))


def _fleet_key(key, dtype, head_dim: int, rot: int, is_neox: bool) -> dict:
    """What the fleet prebuilds: the template parameters (CUDA) or macros (SYCL) of a call with
    contiguous [2, 4, head_dim] tensors of ``dtype`` (16-byte aligned: 16-byte vectors), int64
    indices and a [4, rot] cache."""
    x = torch.empty(2, 4, head_dim, dtype=dtype)
    cache, index = torch.empty(4, rot), torch.zeros(2, dtype=torch.int64)
    if key in (_rope_key, _sycl_rope_key):
        found = key(x, x, cache, index, is_neox, False)
    else:
        found = key(x, x, x, x, x, cache, index, index, is_neox)
    names = {_rope_key: _ROPE_PARAMS, _kv_key: _KV_PARAMS}.get(key)
    return dict(zip(names, found, strict=True)) if names else found


def _sycl_key(dtype, cache_dtype, idx_dtype, loc_dtype, head_dim, rotary_dim, is_neox, vec,
              round_products=False) -> dict:  # fmt: skip
    """The -D macros of sycl/rope.hpp (one module serves every op; ROPE_ROUND_PRODUCTS only where
    set, so the other keys name the modules they always did)."""
    key = {"SGLJIT_T": dtype, "ROPE_CACHE_T": cache_dtype, "ROPE_IDX_T": idx_dtype,
           "ROPE_LOC_T": loc_dtype, "ROPE_HEAD_DIM": head_dim, "ROPE_ROT": rotary_dim,
           "ROPE_NEOX": int(is_neox), "ROPE_VEC": vec}  # fmt: skip
    if round_products:
        key["ROPE_ROUND_PRODUCTS"] = 1
    return key


def _sycl_rope_key(q, k, cos_sin_cache, positions, is_neox, round_products) -> dict:
    """apply_rope touches the first rotary_dim elements of a head: built with head_dim = rotary_dim."""
    max_pos, rot = _cache_shape(cos_sin_cache, q.shape[2])
    cache_dtype = cos_sin_cache.dtype
    vec = _pick_vec((q, k), cos_sin_cache, max_pos, rot, rot, _SIZE[cache_dtype])
    return _sycl_key(q.dtype, cache_dtype, positions.dtype, torch.int64, rot, rot, is_neox, vec,
                     round_products)  # fmt: skip


def _sycl_kv_key(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox) -> dict:
    head_dim = q.shape[2]
    max_pos, rot = _cache_shape(cos_sin_cache, head_dim)
    cache_dtype = cos_sin_cache.dtype
    vec = _pick_vec(
        (q, k, v, k_cache, v_cache), cos_sin_cache, max_pos, rot, head_dim, _SIZE[cache_dtype]
    )
    return _sycl_key(
        q.dtype, cache_dtype, positions.dtype, out_loc.dtype, head_dim, rot, is_neox, vec
    )


def _sycl_geometry(num_items: int, rot: int, vec: int) -> tuple[int, int]:
    lanes = rot // 2 // vec
    local = lanes * max(1, 128 // lanes)
    groups = local // lanes
    return -(-num_items // groups) * local, local


def _launch_rope(module, key, q, k, cos_sin_cache, positions, is_neox, round_products) -> None:
    T, Hq, Hk = q.shape[0], q.shape[1], k.shape[1]
    chunks_q, chunks_k = -(-Hq // 4), -(-Hk // 4)  # sycl/rope.hpp kHeads
    items = T * (chunks_q + chunks_k)
    if items == 0:
        return
    fn = module.get_function("rope_apply", ("ptr",) * 4 + ("i64",) * 11)
    g, loc = _sycl_geometry(items, key["ROPE_ROT"], key["ROPE_VEC"])
    fn(g, loc, q, k, cos_sin_cache, positions, items, chunks_q + chunks_k, chunks_q, Hq, Hk,
       q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
       cos_sin_cache.shape[0])  # fmt: skip


def _launch_kv(rotate_k: bool, module, key, q, k, v, k_cache, v_cache, cos_sin_cache, positions,
               out_loc, is_neox):  # fmt: skip
    T, Hq, Hk = q.shape[0], q.shape[1], k.shape[1]
    chunks_q, chunks_k = -(-Hq // 4), -(-Hk // 4)
    items = T * (chunks_q + 2 * chunks_k)
    if items == 0:
        return
    fn = module.get_function("rope_apply_kv", ("ptr",) * 8 + ("i64",) * 20)
    g, loc = _sycl_geometry(items, key["ROPE_ROT"], key["ROPE_VEC"])
    fn(g, loc, q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc,
       items, chunks_q + 2 * chunks_k, chunks_q, chunks_k, Hq, Hk,
       q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
       k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
       cos_sin_cache.stride(0), cos_sin_cache.shape[0], k_cache.shape[0], int(rotate_k))  # fmt: skip


# qknorm_rope: one module per (dtype, index dtype, head_dim, rotary_dim, style) (and, SYCL, vector
# width); its own header (csrc/qknorm_rope.cuh) and SYCL source (sycl/qknorm_rope.hpp).

_QKR_PARAMS = ("dtype", "idx_dtype", "head_dim", "rotary_dim", "is_neox")
# Heads wider than this would not fit a lane group's registers (32 lanes; csrc/qknorm_rope.cuh).
_QKR_MAX_HEAD_DIM = 1024


def _qknorm_rope_vec(q, k, q_weight, k_weight, cos_sin_cache, max_pos: int, rot: int) -> int:
    """The vector width (elements) of a SYCL qknorm_rope specialization (CUDA modules choose theirs
    in C++): :func:`_pick_vec` over q and k, whose vector pairs need it to divide ``head_dim / 2``
    (not ``head_dim``), and the two weights' pointers."""
    return _pick_vec(
        (q, k), cos_sin_cache, max_pos, rot, q.shape[2] // 2, aligned=(q_weight, k_weight)
    )


def _check_qknorm_rope_head(head_dim: int) -> None:
    """Every backend refuses the head sizes the CUDA kernel does not take (odd or too wide)."""
    if head_dim % 2 or head_dim > _QKR_MAX_HEAD_DIM:
        raise ValueError(
            f"q: head_dim {head_dim} is not supported by qknorm_rope; expected an even head size "
            f"of at most {_QKR_MAX_HEAD_DIM}"
        )


def _qknorm_rope_key(q, k, q_weight, k_weight, cos_sin_cache, positions, eps, is_neox) -> tuple:
    max_pos, rot = cos_sin_cache.shape
    if rot <= 0 or rot % 2 or not max_pos:
        _cache_shape(cos_sin_cache)
    return q.dtype, positions.dtype, q.shape[2], rot, is_neox


def _qknorm_rope_params(dtype, idx_dtype, head_dim, rot, is_neox) -> dict:
    """A new key's template parameters; refuses the head sizes and rotary widths the kernel does
    not take (checked once per key, not on every call)."""
    _check_qknorm_rope_head(head_dim)
    if rot > head_dim:
        raise ValueError(f"cos_sin_cache: its width {rot} (rotary_dim) exceeds head_dim {head_dim}")
    return dict(zip(_QKR_PARAMS, (dtype, idx_dtype, head_dim, rot, is_neox), strict=True))


def _qknorm_rope_lanes(head_dim: int, vec: int) -> int:
    """Threads of a head's lane group: the head's vector pairs, rounded up to a power of two, at
    most 32 (QKNormRopeConfig::kLanes)."""
    pairs = head_dim // (2 * vec)
    return min(32, 1 << (pairs - 1).bit_length())


def _sycl_qknorm_rope_key(q, k, q_weight, k_weight, cos_sin_cache, positions, eps, is_neox):
    """The -D macros of sycl/qknorm_rope.hpp."""
    head_dim = q.shape[2]
    max_pos, rot = _cache_shape(cos_sin_cache, head_dim)
    _check_qknorm_rope_head(head_dim)
    vec = _qknorm_rope_vec(q, k, q_weight, k_weight, cos_sin_cache, max_pos, rot)
    return {"SGLJIT_T": q.dtype, "QKR_IDX_T": positions.dtype, "QKR_HEAD_DIM": head_dim,
            "QKR_ROT": rot, "QKR_NEOX": int(is_neox), "QKR_VEC": vec,
            "QKR_LANES": _qknorm_rope_lanes(head_dim, vec)}  # fmt: skip


def _launch_qknorm_rope(module, key, q, k, q_weight, k_weight, cos_sin_cache, positions, eps,
                        is_neox) -> None:  # fmt: skip
    T, Hq, Hk = q.shape[0], q.shape[1], k.shape[1]
    heads = T * (Hq + Hk)
    if heads == 0:
        return
    fn = module.get_function("qknorm_rope", ("ptr",) * 6 + ("i64",) * 8 + ("f32",))
    lanes = key["QKR_LANES"]
    fn(heads * lanes, lanes, q, k, q_weight, k_weight, cos_sin_cache, positions, Hq, Hk,
       q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
       cos_sin_cache.shape[0], eps)  # fmt: skip


def _fleet_qknorm_rope(key, dtype, head_dim: int) -> dict:
    """What the fleet prebuilds for qknorm_rope: the template parameters (CUDA) or macros (SYCL) of
    a neox call with q, k views into one [2, 6, head_dim] buffer of ``dtype``, full rotary, int64
    positions."""
    qk = torch.empty(2, 6, head_dim, dtype=dtype)
    w = torch.empty(head_dim, dtype=dtype)
    args = (qk[:, :4], qk[:, 4:], w, w, torch.empty(4, head_dim), torch.zeros(2, dtype=torch.int64))
    found = key(*args, 1e-6, True)
    return _qknorm_rope_params(*found) if key is _qknorm_rope_key else found


def _reference_qknorm_rope(q, k, q_weight, k_weight, cos_sin_cache, positions, eps, is_neox):
    _cache_shape(cos_sin_cache, q.shape[2])
    _check_qknorm_rope_head(q.shape[2])
    reference.qknorm_rope_into(q, k, q_weight, k_weight, cos_sin_cache, positions, eps, is_neox)


def _reference_rope(q, k, cos_sin_cache, positions, is_neox, round_products) -> None:
    _cache_shape(cos_sin_cache, q.shape[2])
    reference.apply_rope_into(q, k, cos_sin_cache, positions, is_neox, round_products)


def _reference_kv(rotate_k: bool, q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc,
                  is_neox) -> None:  # fmt: skip
    _cache_shape(cos_sin_cache, q.shape[2])
    reference.apply_rope_with_kv_cache_into(
        q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox, rotate_k
    )


# ------------------------------------------------------------------------------------------------
# Check cases (float64 reference; tolerances per dtype)

# Math in fp32, rounded once: within half an ulp of the exact result (bf16 2^-8 relative, fp16 2^-11)
# plus fp32 rounding; the tolerances are about twice that.
_TOLERANCES = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5}
# round_products rounds cos, sin, both products and the result: up to half an ulp of each of
# |x1 cos| + |x2 sin| (up to about 4x the result's size here) and of the result; about twice that.
_ROUND_PRODUCTS_TOLERANCES = {torch.bfloat16: 2.5e-2, torch.float16: 3e-3, torch.float32: 1e-5}
_I32 = torch.int32


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _cos_sin_cache(max_pos: int, rot: int, device, dtype=torch.float32) -> torch.Tensor:
    angles = torch.rand(max_pos, rot // 2, dtype=torch.float64) * 6.3
    return torch.cat([angles.cos(), angles.sin()], -1).to(device, dtype)


def _heads_of(buffer: torch.Tensor, start: int, heads: int, head_dim: int) -> torch.Tensor:
    """Heads [start, start + heads) of each row of a [T, width] buffer, as a [T, heads, D] view."""
    return buffer[:, start * head_dim : (start + heads) * head_dim].unflatten(1, (heads, head_dim))


def _bad_indices(index: torch.Tensor, bound: int) -> torch.Tensor:
    """``index`` with a few entries out of [0, bound) (each behaviour is defined)."""
    index = index.clone()
    for i, bad in zip((1, 3, 5), (bound, -1, bound + 7), strict=False):
        if i < index.shape[0]:
            index[i] = bad
    return index


def _case_label(tokens, hq, hk, head_dim, rot, is_neox, dtype) -> str:
    """A check case's shape, style, partial rotary and dtype, e.g. ``7x(8+2)x128 neox bfloat16``."""
    style = "neox" if is_neox else "gptj"
    rotary = f" rotary {rot}" if rot != head_dim else ""
    return f"{tokens}x({hq}+{hk})x{head_dim} {style}{rotary} {_name(dtype)}"


def _cache_label(cache: torch.dtype, dtype: torch.dtype) -> str:
    return "" if cache == torch.float32 else f" {_name(cache)} cache"


def _rope_case(name, tokens, heads, head_dim, rot, dtype, is_neox=True, *, idx=torch.int64,
               qkv=False, bad_positions=False, cache=torch.float32,
               round_products=False) -> Case:  # fmt: skip
    hq, hk = heads
    max_pos = 64

    def make(device):
        if qkv:  # q and k as views into a fused qkv buffer with padded rows
            buffer = torch.randn(tokens, (hq + 2 * hk) * head_dim + 64, device=device, dtype=dtype)
            q, k = _heads_of(buffer, 0, hq, head_dim), _heads_of(buffer, hq, hk, head_dim)
        else:
            q = torch.randn(tokens, hq, head_dim, device=device, dtype=dtype)
            k = torch.randn(tokens, hk, head_dim, device=device, dtype=dtype)
        positions = torch.randint(0, max_pos, (tokens,), dtype=idx, device=device)
        if bad_positions:
            positions = _bad_indices(positions, max_pos)
        table = _cos_sin_cache(max_pos, rot, device, cache)
        return q, k, table, positions, is_neox, round_products

    label = _case_label(tokens, hq, hk, head_dim, rot, is_neox, dtype)
    label += _cache_label(cache, dtype)
    tolerance = (_ROUND_PRODUCTS_TOLERANCES if round_products else _TOLERANCES)[dtype]
    return Case(f"{label} {name}".strip(), make, tolerance)


def _kv_case(name, tokens, heads, head_dim, rot, dtype, is_neox=True, *, idx=torch.int64,
             loc=torch.int64, views=False, bad=False, cache=torch.float32) -> Case:  # fmt: skip
    hq, hk = heads
    max_pos, slots = 64, 2 * tokens + 3

    def make(device):
        if views:  # q, k, v views into a qkv buffer; the caches one layer of [slots, 3, 2, Hk, D]
            buffer = torch.randn(tokens, (hq + 2 * hk) * head_dim, device=device, dtype=dtype)
            q, k = _heads_of(buffer, 0, hq, head_dim), _heads_of(buffer, hq, hk, head_dim)
            v = _heads_of(buffer, hq + hk, hk, head_dim)
            layers = torch.full(
                (slots, 3, 2, hk, head_dim), float("nan"), device=device, dtype=dtype
            )
            k_cache, v_cache = layers[:, 1, 0], layers[:, 1, 1]
        else:
            q = torch.randn(tokens, hq, head_dim, device=device, dtype=dtype)
            k = torch.randn(tokens, hk, head_dim, device=device, dtype=dtype)
            v = torch.randn(tokens, hk, head_dim, device=device, dtype=dtype)
            # NaN: the slots no out_loc names must stay NaN (max_error compares NaN masks)
            k_cache = torch.full((slots, hk, head_dim), float("nan"), device=device, dtype=dtype)
            v_cache = torch.full_like(k_cache, float("nan"))
        positions = torch.randint(0, max_pos, (tokens,), dtype=idx, device=device)
        out_loc = torch.randperm(slots, device=device)[:tokens].to(loc)
        if bad:
            positions[0] = max_pos + 5  # k stored unrotated
            out_loc = _bad_indices(out_loc, slots)  # nothing stored
        table = _cos_sin_cache(max_pos, rot, device, cache)
        return q, k, v, k_cache, v_cache, table, positions, out_loc, is_neox

    label = _case_label(tokens, hq, hk, head_dim, rot, is_neox, dtype)
    label += _cache_label(cache, dtype)
    return Case(f"{label} {name}".strip(), make, _TOLERANCES[dtype])


_ROPE_CASES = [
    *(
        _rope_case("", 7, (8, 2), 128, rot, dtype, is_neox)
        for dtype in (torch.bfloat16, torch.float16, torch.float32)
        for is_neox, rot in ((True, 128), (False, 128), (True, 64))
    ),
    _rope_case("int32 positions", 5, (6, 3), 80, 80, torch.float16, False, idx=_I32),
    _rope_case("odd head_dim (1-element vectors)", 9, (4, 2), 65, 32, torch.float32, False),
    _rope_case("qkv views", 37, (8, 2), 128, 128, torch.bfloat16, qkv=True),
    _rope_case("3 positions out of range", 8, (3, 1), 64, 64, torch.float32, bad_positions=True),
    _rope_case("", 3, (4, 2), 512, 512, torch.bfloat16),
    # a cos/sin cache in q's dtype (vLLM's): 16-byte cache vectors hold 8 elements
    _rope_case("", 7, (8, 2), 128, 128, torch.bfloat16, cache=torch.bfloat16),
    _rope_case("", 6, (5, 3), 128, 64, torch.float16, False, idx=_I32, cache=torch.float16),
    _rope_case("q only (k with 0 heads)", 5, (6, 0), 64, 64, torch.bfloat16),
    # vLLM's rounding (sgljit.compat.vllm): each product rounded to the dtype
    *(
        _rope_case(
            "round_products", 7, (8, 2), 128, rot, dtype, is_neox, cache=dtype, round_products=True
        )
        for dtype, is_neox, rot in ((torch.bfloat16, True, 128), (torch.float16, False, 64))
    ),
    _rope_case("round_products", 5, (4, 2), 64, 64, torch.bfloat16, False, round_products=True),
]
_KV_CASES = [
    *(_kv_case("", 5, (8, 2), 128, 128, dtype) for dtype in _TOLERANCES),
    _kv_case("int32 indices", 7, (5, 3), 128, 64, torch.float16, False, idx=_I32, loc=_I32),
    _kv_case("int64/int32 indices", 4, (5, 3), 96, 96, torch.float32, loc=_I32),
    _kv_case("views, bad indices", 11, (4, 2), 128, 128, torch.bfloat16, views=True, bad=True),
    _kv_case("", 5, (8, 2), 128, 128, torch.bfloat16, cache=torch.bfloat16),
]
# k rotated in place too: bad indices rotate k (an out-of-range out_loc) or leave it (a position)
_KV_ROTATE_K_CASES = [
    _kv_case("", 5, (8, 2), 128, 128, torch.bfloat16),
    _kv_case("int32 indices", 7, (5, 3), 128, 64, torch.float16, False, idx=_I32, loc=_I32),
    _kv_case("", 4, (5, 3), 96, 96, torch.float32, cache=torch.float32),
    _kv_case("views, bad indices", 11, (4, 2), 128, 128, torch.bfloat16, views=True, bad=True),
    _kv_case("", 6, (4, 2), 64, 64, torch.float16, False, cache=torch.float16),
]


# qknorm_rope rounds twice (qknorm's output, then the rotation), where the float64 oracle rounds
# never: an element's error is up to half an ulp of each rotated input (|y1| + |y2|, up to about 4x
# the result's size here) plus half an ulp of the result; the tolerances are about twice what the
# cases reach.
_QKR_TOLERANCES = {torch.bfloat16: 2.5e-2, torch.float16: 3e-3, torch.float32: 1e-5}


def _qknorm_rope_case(name, tokens, heads, head_dim, rot, dtype, is_neox=True, *, idx=torch.int64,
                      shift=0, bad_positions=False) -> Case:  # fmt: skip
    """q and k as views into a fused qkv buffer (padded rows; ``shift`` elements in, for narrower
    vectors), weights around 1 as trained norms have them."""
    hq, hk = heads
    max_pos = 64

    def make(device):
        width = (hq + 2 * hk) * head_dim + 64
        buffer = torch.randn(tokens, width, device=device, dtype=dtype)[:, shift:]
        q, k = _heads_of(buffer, 0, hq, head_dim), _heads_of(buffer, hq, hk, head_dim)
        weights = (1 + 0.5 * torch.randn(2, head_dim, device=device)).to(dtype)
        positions = torch.randint(0, max_pos, (tokens,), dtype=idx, device=device)
        if bad_positions:
            positions = _bad_indices(positions, max_pos)
        cache = _cos_sin_cache(max_pos, rot, device)
        return q, k, weights[0], weights[1], cache, positions, 1e-6, is_neox

    label = _case_label(tokens, hq, hk, head_dim, rot, is_neox, dtype)
    return Case(f"{label} {name}".strip(), make, _QKR_TOLERANCES[dtype])


_QKR_CASES = [
    *(
        _qknorm_rope_case("", 7, (8, 2), 128, rot, dtype, is_neox)
        for dtype in (torch.bfloat16, torch.float16, torch.float32)
        for is_neox, rot in ((True, 128), (False, 128), (True, 64))
    ),
    _qknorm_rope_case("int32 positions", 5, (6, 3), 64, 64, torch.float16, False, idx=_I32),
    _qknorm_rope_case("", 3, (4, 2), 256, 256, torch.bfloat16),
    _qknorm_rope_case("gptj partial", 4, (3, 1), 256, 64, torch.bfloat16, False),
    _qknorm_rope_case("5 vector pairs (idle lanes)", 9, (5, 1), 80, 80, torch.float16),
    _qknorm_rope_case("8-byte aligned views", 13, (4, 2), 128, 128, torch.bfloat16, shift=4),
    _qknorm_rope_case("2 pairs a lane", 2, (2, 1), 512, 256, torch.float32),
    _qknorm_rope_case(
        "3 positions out of range", 8, (3, 1), 64, 64, torch.float32, bad_positions=True
    ),
]


# ------------------------------------------------------------------------------------------------
# The ops (destination passing)

_QK = {
    "q": Tensor("num_tokens", "q_heads", "head_dim", io="inout"),
    "k": Tensor("num_tokens", "k_heads", "head_dim", dtype="q", io="inout"),
}
_CACHE = Tensor("max_pos", "rotary_dim", dtype=("q", torch.float32))
_POSITIONS = Tensor("num_tokens", dtype=_INDEX_DTYPES, layout="contiguous")

_apply_rope = family.op(
    "apply_rope",
    args={
        **_QK,
        "cos_sin_cache": _CACHE,
        "positions": _POSITIONS,
        "is_neox": Scalar(bool),
        "round_products": Scalar(bool),
    },
    reference=_reference_rope,
    doc=reference.apply_rope_into.__doc__,
    cuda=Cuda(
        "csrc/rope.cuh",
        "sgljit_rope::RopeKernel<{dtype}, {cache_dtype}, {idx_dtype}, {rotary_dim}, {is_neox}, "
        "{round_products}>::run",
        key=_rope_key,
        params=_rope_params,
    ),
    sycl=Sycl("sycl/rope.hpp", key=_sycl_rope_key, launch=_launch_rope, module="rope"),
    prebuild={
        "cuda": [
            _fleet_key(_rope_key, dtype, rot, rot, is_neox)
            for dtype in _FLEET_DTYPES
            for rot in dict.fromkeys(rot for _, rot in _FLEET_HEADS)
            for is_neox in (True, False)
        ],
    },
    cases=_ROPE_CASES,
)


def _kv_op(name: str, rotate_k: bool, prebuild, cases):
    """The KV variant; with ``rotate_k`` k is rotated in place too (declared written)."""
    k_io = "inout" if rotate_k else "in"
    return family.op(
        name,
        args={
            "q": _QK["q"],
            "k": Tensor("num_tokens", "k_heads", "head_dim", dtype="q", io=k_io),
            "v": Tensor("num_tokens", "k_heads", "head_dim", dtype="q"),
            "k_cache": Tensor("num_slots", "k_heads", "head_dim", dtype="q", io="inout"),
            "v_cache": Tensor("num_slots", "k_heads", "head_dim", dtype="q", io="inout"),
            "cos_sin_cache": _CACHE,
            "positions": _POSITIONS,
            "out_loc": Tensor("num_tokens", dtype=_INDEX_DTYPES, layout="contiguous"),
            "is_neox": Scalar(bool),
        },
        reference=functools.partial(_reference_kv, rotate_k),
        doc=reference.apply_rope_with_kv_cache_into.__doc__,
        cuda=Cuda(
            "csrc/rope.cuh",
            "sgljit_rope::RopeKVKernel<{dtype}, {cache_dtype}, {idx_dtype}, {loc_dtype}, {head_dim}, "
            f"{{rotary_dim}}, {{is_neox}}, {str(rotate_k).lower()}>::run",
            key=_kv_key,
            params=_kv_params,
        ),
        sycl=Sycl(
            "sycl/rope.hpp",
            key=_sycl_kv_key,
            launch=functools.partial(_launch_kv, rotate_k),
            module="rope",
        ),
        prebuild=prebuild,
        cases=cases,
    )


_apply_rope_with_kv_cache = _kv_op(
    "apply_rope_with_kv_cache",
    rotate_k=False,
    prebuild={
        "cuda": [
            _fleet_key(_kv_key, dtype, head_dim, rot, True)
            for dtype in _FLEET_DTYPES
            for head_dim, rot in _FLEET_HEADS
        ],
        # One module (every kernel) per (head_dim, rotary_dim) and style; apply_rope uses those
        # with head_dim == rotary_dim.
        "sycl": [
            _fleet_key(_sycl_kv_key, dtype, head_dim, rot, is_neox)
            for dtype in _FLEET_DTYPES
            for head_dim, rot in _FLEET_HEADS
            for is_neox in (True, False)
        ],
    },
    cases=_KV_CASES,
)
# sglang's and FlashInfer's fused rope + store: built on first use (not part of the fleet)
_apply_rope_with_kv_cache_rotate_k = _kv_op(
    "apply_rope_with_kv_cache_rotate_k", rotate_k=True, prebuild=None, cases=_KV_ROTATE_K_CASES
)


_qknorm_rope = family.op(
    "qknorm_rope",
    args={
        **_QK,
        "q_weight": Tensor("head_dim", dtype="q", layout="contiguous"),
        "k_weight": Tensor("head_dim", dtype="q", layout="contiguous"),
        # float32 only: both kernels read the cache as float (apply_rope's also take q's dtype)
        "cos_sin_cache": Tensor("max_pos", "rotary_dim", dtype=(torch.float32,)),
        "positions": _POSITIONS,
        "eps": Scalar(float, min=0.0),
        "is_neox": Scalar(bool),
    },
    reference=_reference_qknorm_rope,
    doc=reference.qknorm_rope_into.__doc__,
    cuda=Cuda(
        "csrc/qknorm_rope.cuh",
        "sgljit_rope::QKNormRope<{dtype}, {idx_dtype}, {head_dim}, {rotary_dim}, {is_neox}>::run",
        key=_qknorm_rope_key,
        params=_qknorm_rope_params,
    ),
    sycl=Sycl("sycl/qknorm_rope.hpp", key=_sycl_qknorm_rope_key, launch=_launch_qknorm_rope),
    # Qwen3-class heads: neox, full rotary, 64/128/256 wide.
    prebuild={
        backend: [
            _fleet_qknorm_rope(key, dtype, head_dim)
            for dtype in _FLEET_DTYPES
            for head_dim in (64, 128, 256)
        ]
        for backend, key in (("cuda", _qknorm_rope_key), ("sycl", _sycl_qknorm_rope_key))
    },
    cases=_QKR_CASES,
)


# ------------------------------------------------------------------------------------------------
# Public functions: [T, H * D] views unflattened, index tensors made contiguous; the ops check
# the rest (shapes, dtypes, strides, devices, overlap, rotary_dim against head_dim).


def _require_tensors(**tensors) -> None:
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")


def _heads(x: torch.Tensor, name: str, head_dim: int) -> torch.Tensor:
    """``x`` as [T, H, head_dim]: as it is when 3-D, unflattened (a view) when [T, H * head_dim]."""
    if x.dim() == 3:
        if x.shape[2] != head_dim:
            raise ValueError(f"{name}: head size {x.shape[2]} does not match head_dim {head_dim}")
        return x
    if x.dim() == 2:
        if x.shape[1] % head_dim:
            raise ValueError(
                f"{name}: width {x.shape[1]} of a flattened [T, H * D] tensor is not a multiple "
                f"of head_dim {head_dim}"
            )
        return x.unflatten(1, (x.shape[1] // head_dim, head_dim))
    raise ValueError(f"{name}: expected [T, H, D] or [T, H * D], got shape {tuple(x.shape)}")


def _check_indices(op, args: tuple, *indices: tuple[str, int, Callable[[], int]]) -> None:
    """(SGLJIT_CHECK_INDICES=1) The op's argument checks, then IndexError naming the first index
    outside [0, bound()) of each (name, position in args, bound) given; not while capturing a CUDA
    graph. Synchronizes with the device."""
    op.check_arguments(args)
    for name, at, size in indices:
        index, bound = args[at], size()
        if index.is_meta or (index.is_cuda and torch.cuda.is_current_stream_capturing()):
            return
        bad = ((index < 0) | (index >= bound)).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            raise IndexError(
                f"{name}[{i}] = {int(index[i])} is out of range [0, {bound}) "
                f"({bad.shape[0]} bad index(es); found because SGLJIT_CHECK_INDICES=1)"
            )


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    is_neox: bool = True,
    rotary_dim: int | None = None,
    head_dim: int | None = None,
    round_products: bool = False,
) -> None:
    """Rotary embedding of q ``[T, Hq, D]`` and k ``[T, Hk, D]`` (or None: q alone), in place.

    ``cos_sin_cache`` ``[max_pos, rotary_dim]`` (cos | sin), float32 or q's dtype; ``positions``
    int32/int64 ``[T]``. ``is_neox``: pairs ``(i, i + r/2)``, else gptj pairs ``(2i, 2i + 1)``.
    Only the first ``rotary_dim`` dims of each head rotate; the rest are untouched. ``rotary_dim``
    defaults to the cache's width (if given, it must equal it); ``head_dim`` is needed when q and k
    are both flattened ``[T, H * D]`` (the head size cannot be read from them). q and k may be
    strided views (e.g. into a qkv buffer). Math in float32, rounded once; ``round_products``:
    vLLM's rounding instead (its kernel computes in the dtype): cos and sin rounded to the dtype,
    each product rounded, then ``x1*cos - x2*sin`` (less accurate; for drop-in equality only).
    """
    try:
        if k is None:  # k with no heads: the kernels' k work is empty
            q = q if head_dim is None and q.dim() == 3 else _qk_heads(q, None, head_dim)[0]
            k = q[:, :0]
        elif head_dim is not None or q.dim() != 3 or k.dim() != 3:
            q, k = _qk_heads(q, k, head_dim)
        if rotary_dim is not None:
            _check_rotary_dim(rotary_dim, cos_sin_cache)
        positions = positions.contiguous()
    except AttributeError:  # name the argument that is not a tensor
        _require_tensors(q=q, k=k, cos_sin_cache=cos_sin_cache, positions=positions)
        raise
    args = (q, k, cos_sin_cache, positions, is_neox, round_products)
    if _CHECK_INDICES and not torch.compiler.is_compiling():
        _check_indices(_apply_rope, args, ("positions", 3, lambda: cos_sin_cache.shape[0]))
    _apply_rope(*args)


def _check_rotary_dim(rotary_dim, cos_sin_cache: torch.Tensor) -> None:
    if not isinstance(rotary_dim, int) or isinstance(rotary_dim, bool):
        raise TypeError(f"rotary_dim: expected an int, got {type(rotary_dim).__name__}")
    if cos_sin_cache.dim() and rotary_dim != cos_sin_cache.shape[-1]:  # 0-d: the op names it
        raise ValueError(
            f"rotary_dim: {rotary_dim} does not match the width of cos_sin_cache "
            f"({cos_sin_cache.shape[-1]})"
        )


def _qk_heads(q, k, head_dim):
    """q and k (None: q alone) as [T, H, head_dim]."""
    tensors = (q,) if k is None else (q, k)
    if head_dim is None:
        shaped = [x.shape[-1] for x in tensors if x.dim() == 3]
        if not shaped:
            raise ValueError(
                "head_dim: q and k are flattened [T, heads * head_dim], so the head size cannot be "
                "read from them (with a cos_sin_cache of width r, heads of r and wider heads with "
                "partial rotary look alike); pass head_dim="
            )
        head_dim = shaped[0]
    elif not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0:
        raise ValueError(f"head_dim: expected a positive int, got {head_dim!r}")
    return _heads(q, "q", head_dim), None if k is None else _heads(k, "k", head_dim)


def apply_rope_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    out_loc: torch.Tensor,
    *,
    is_neox: bool = True,
    rotary_dim: int | None = None,
    rotate_k_inplace: bool = False,
) -> None:
    """Rotary embedding with the KV-cache store fused in.

    q ``[T, Hq, D]`` is rotated in place; the rotated k and v ``[T, Hk, D]`` are written to
    ``k_cache[out_loc[t]]`` and ``v_cache[out_loc[t]]`` (caches ``[num_slots, Hk, D]``, or
    ``[num_slots, Hk * D]``). **k and v are left as they were** unless ``rotate_k_inplace``: then
    k is rotated in place as well (every token's, stored or not), as sglang's and FlashInfer's
    fused rope + store do. ``rotary_dim`` is the width of ``cos_sin_cache`` (float32 or q's dtype;
    partial rotary when it is below D: the other dims of k are copied unrotated); if given, it must
    equal it. The head size D is read from q, else k_cache, else k (one of them must be 3-D).
    Duplicate ``out_loc`` values store in an unspecified order.
    """
    try:
        if q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or k_cache.dim() != 3 or v_cache.dim() != 3:
            q, k, v, k_cache, v_cache = _kv_heads(q, k, v, k_cache, v_cache)
        if rotary_dim is not None:
            _check_rotary_dim(rotary_dim, cos_sin_cache)
        positions, out_loc = positions.contiguous(), out_loc.contiguous()
    except AttributeError:  # name the argument that is not a tensor
        _require_tensors(q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache,
                         cos_sin_cache=cos_sin_cache, positions=positions, out_loc=out_loc)  # fmt: skip
        raise
    if rotate_k_inplace is False:
        op = _apply_rope_with_kv_cache
    elif rotate_k_inplace is True:
        op = _apply_rope_with_kv_cache_rotate_k
    else:
        raise TypeError(f"rotate_k_inplace: expected bool, got {type(rotate_k_inplace).__name__}")
    args = (q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox)
    if _CHECK_INDICES and not torch.compiler.is_compiling():
        _check_indices(
            op,
            args,
            ("positions", 6, lambda: cos_sin_cache.shape[0]),
            ("out_loc", 7, lambda: k_cache.shape[0]),
        )
    op(*args)


def _kv_heads(q, k, v, k_cache, v_cache):
    shaped = [x.shape[2] for x in (q, k_cache, k) if x.dim() == 3]
    if not shaped:
        raise ValueError(
            "q: q, k and k_cache are all flattened [T, heads * head_dim], so the head size cannot "
            "be read from them; pass one of them as [T, heads, head_dim]"
        )
    d = shaped[0]
    return (_heads(q, "q", d), _heads(k, "k", d), _heads(v, "v", d),
            _heads(k_cache, "k_cache", d), _heads(v_cache, "v_cache", d))  # fmt: skip


def qknorm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    eps: float = 1e-6,
    is_neox: bool = True,
) -> None:
    """Per-head RMSNorm of q ``[T, Hq, D]`` and k ``[T, Hk, D]`` then rotary embedding, in place, in
    one pass (Qwen3-class attention: ``q_norm``/``k_norm``, then rope).

    Each head ``x`` becomes ``y = x * rsqrt(mean(x^2) + eps) * weight`` (fp32 math; ``q_weight`` for
    q's heads, ``k_weight`` for k's, both ``[D]`` of q's dtype), rounded to the dtype, and then the
    first ``rotary_dim`` dims of ``y`` are rotated as :func:`apply_rope` rotates them (fp32 math,
    rounded again): the same rounding as ``qknorm`` followed by ``apply_rope``, so the fused op
    is a drop-in for that pair. Dims past ``rotary_dim`` (the width of ``cos_sin_cache``, float32
    ``[max_pos, rotary_dim]``, cos | sin) keep ``y``. ``positions`` int32/int64 ``[T]``; a position
    outside ``[0, max_pos)`` leaves its token normalized but unrotated (``SGLJIT_CHECK_INDICES=1``
    raises instead). ``is_neox``: pairs ``(i, i + r/2)``, else gptj pairs ``(2i, 2i + 1)``.

    q and k may be strided views (e.g. into a fused qkv buffer; last dim contiguous) or flattened
    ``[T, H * D]``; D is read from whichever of q and k is 3-D, else from ``q_weight``. D must be
    even and at most 1024. fp16/bf16/fp32.
    """
    try:
        if q.dim() != 3 or k.dim() != 3:
            q, k = _qknorm_rope_heads(q, k, q_weight)
        positions = positions.contiguous()
    except AttributeError:  # name the argument that is not a tensor
        _require_tensors(q=q, k=k, q_weight=q_weight, positions=positions)
        raise
    args = (q, k, q_weight, k_weight, cos_sin_cache, positions, eps, is_neox)
    if _CHECK_INDICES and not torch.compiler.is_compiling():
        _check_indices(_qknorm_rope, args, ("positions", 5, lambda: cos_sin_cache.shape[0]))
    _qknorm_rope(*args)


def _qknorm_rope_heads(q, k, q_weight):
    shaped = [x.shape[2] for x in (q, k) if x.dim() == 3]
    if shaped:
        head_dim = shaped[0]
    elif q_weight.dim() == 1 and q_weight.shape[0] > 0:
        head_dim = q_weight.shape[0]
    else:
        raise ValueError(
            f"q_weight: q and k are flattened [T, heads * head_dim], so the head size is read from "
            f"q_weight, which must be [head_dim]; got shape {tuple(q_weight.shape)}"
        )
    return _heads(q, "q", head_dim), _heads(k, "k", head_dim)


# Ops of this family declared in their own modules (imported here so that the family's spec names
# them): the fp8 KV-cache ops, and qknorm_rope's form with cos/sin computed in the kernel.
from . import fp8_kv as _fp8_kv  # noqa: E402, F401
from . import qknorm_rope_theta as _qknorm_rope_theta  # noqa: E402, F401

"""The fp8 KV-cache write: rope -> fp8 quantize (``rope_quantize_fp8``), rope -> fp8 -> append into
a paged KV cache (``rope_quantize_fp8_append_paged_kv_cache``), the plain paged append
(``append_paged_kv_cache``, ``append_paged_mla_kv_cache``) and the page-table helpers
(``get_seq_lens``, ``get_batch_indices_positions``), on FlashInfer's contracts.

Layouts. Rotary and non-rotary parts come as separate tensors: q ``[T, Hq, R]`` + ``[T, Hq, N]``,
k ``[T, Hk, R]`` + ``[T, Hk, N]`` (MLA: ``[T, R]`` + ``[T, N]``, one shared "head"); cos_sin_cache
float32 ``[max_pos, R]`` (cos | sin); positions int32/int64 ``[T]``. fp8 outputs are
``x_rotated * scale`` rounded to nearest even, saturated to the format's finite range (NaN stays
NaN): float8_e4m3fn or float8_e5m2. A position outside the table leaves its token unrotated.

Paged caches (FlashInfer's convention): ``kv_indptr`` int32 ``[batch + 1]``, ``kv_indices`` int32
(the pages of sequence b are ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``), ``kv_last_page_len``
int32 ``[batch]`` (1..page_size); token t of sequence ``batch_indices[t]`` at position
``positions[t]`` (both int32, from :func:`get_batch_indices_positions`) goes to entry ``p %
page_size`` of page ``kv_indices[kv_indptr[b] + p // page_size]``. NHD caches are ``[P, page_size,
H, D]``, HND ``[P, H, page_size, D]``; any page size.

Page-table contents are data the argument checks cannot read. Where every page-table tensor is on
the CPU (cheap: no device sync), the public functions check them first and raise an error naming
the argument before anything is written (indptr not monotone or past kv_indices, an index outside
the cache, a last-page length outside [1, page_size], a batch index or position outside its
sequence); elsewhere they are checked with ``SGLJIT_CHECK_INDICES=1`` (a device sync; not while
compiling or capturing a CUDA graph). Unchecked, the kernels never write out of bounds: a token
whose entry does not resolve to a page of the cache is not stored (csrc/fp8_kv.cuh says how).
"""

from __future__ import annotations

import os

import torch

from sgljit.op import Case, Cuda, Scalar, Sycl, Tensor

from . import fp8_kv_reference as reference
from .ops import family

# The ops (rope_fp8, rope_fp8_append_paged, paged_kv_append) are named apart from the public
# functions: those take FlashInfer's signatures, which the conformance suite's binding of a public
# function's parameters to its op's arguments does not fit.
__all__ = [
    "append_paged_kv_cache",
    "append_paged_mla_kv_cache",
    "check_page_table",
    "get_batch_indices_positions",
    "get_seq_lens",
    "rope_quantize_fp8",
    "rope_quantize_fp8_append_paged_kv_cache",
]

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_E4M3, _E5M2 = FP8_DTYPES
_ROPE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_APPEND_DTYPES = (torch.float16, torch.bfloat16, torch.float32, *FP8_DTYPES)
_INDEX_DTYPES = (torch.int32, torch.int64)
_I32 = (torch.int32,)
_CHECK_INDICES = os.environ.get("SGLJIT_CHECK_INDICES", "0") not in ("", "0")
_F32_MAX = 3.4028234663852886e38  # a scale is a finite float32: the kernels multiply in fp32
_LAYOUTS = ("NHD", "HND")


# ------------------------------------------------------------------------------------------------
# Specializations


def _check_rotary(cos_sin_cache: torch.Tensor) -> None:
    """What the kernels need of the table beyond its declared shape (CUDA checks it in C++)."""
    max_pos, rot = cos_sin_cache.shape
    if rot <= 0 or rot % 2:
        raise ValueError(
            f"cos_sin_cache: its width {rot} (rotary_dim) must be a positive even number"
        )
    if max_pos == 0:
        raise ValueError(
            "cos_sin_cache: has no rows (expected [max_pos, rotary_dim] with max_pos >= 1)"
        )


def _check_indptr(kv_indptr: torch.Tensor) -> None:
    if kv_indptr.shape[0] == 0:
        raise ValueError("kv_indptr: expected batch_size + 1 >= 1 entries, got 0")


_ROPE_PARAMS = ("dtype", "fp8_dtype", "idx_dtype", "is_neox")


def _rope_fp8_key(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, positions, q_rope_out, *rest):
    return q_rope.dtype, q_rope_out.dtype, positions.dtype, rest[-1]


def _paged_key(q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache, positions, q_rope_out, *rest):
    return q_rope.dtype, q_rope_out.dtype, positions.dtype, rest[-1]


def _sycl_rope_macros(dtype, fp8_dtype, idx_dtype, is_neox) -> dict:
    return {"SGLJIT_T": dtype, "FP8KV_Q": fp8_dtype, "FP8KV_IDX_T": idx_dtype,
            "FP8KV_NEOX": int(is_neox)}  # fmt: skip


def _sycl_rope_fp8_key(*args) -> dict:
    _check_rotary(args[4])
    return _sycl_rope_macros(*_rope_fp8_key(*args))


def _sycl_paged_key(*args) -> dict:
    _check_rotary(args[5])
    _check_indptr(args[13])
    return _sycl_rope_macros(*_paged_key(*args))


def _items_geometry(items: int) -> tuple[int, int]:
    lanes = 16  # sycl/fp8_kv.hpp kLanes
    local = 4 * lanes
    return -(-items * lanes // local) * local, local


_ROPE_SYCL_ARGS = ("ptr",) * 16 + ("i64",) * 37 + ("f32",) * 3


def _pages(cache: torch.Tensor) -> tuple[int, int]:
    """(num_pages, page_size) a kernel may store into: none where pages have no entries."""
    return (cache.shape[0], cache.shape[1]) if cache.shape[1] else (0, 1)


def _launch_rope_sycl(module, *, q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache, positions,
                      q_rope_out, q_nope_out, k_rope_out, k_nope_out, v_out, table, scales,
                      paged) -> None:  # fmt: skip
    """The rope_fp8 kernel: dense k outputs are [T, Hk, *] (a page per token), paged caches
    [P, page, Hk, *]; ``table``: (kv_indices, kv_indptr, batch_indices, page_positions)."""
    T, hq, hk = q_rope.shape[0], q_rope.shape[1], k_rope.shape[1]
    hv = v.shape[1] if paged else 0
    items = T * (hq + hk + hv)
    if items == 0:
        return
    fn = module.get_function("rope_fp8", _ROPE_SYCL_ARGS)
    g, loc = _items_geometry(items)

    def out_strides(x):  # (page, entry, head)
        return (x.stride(0), x.stride(1), x.stride(2)) if paged else (x.stride(0), 0, x.stride(1))

    kv_indices, kv_indptr, _, _ = table
    num_pages, page_size = _pages(k_rope_out) if paged else (T, 1)
    fn(g, loc, q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache, positions, q_rope_out, q_nope_out,
       k_rope_out, k_nope_out, v_out, *table,
       T, hq, hk, hv, q_rope.shape[2], q_nope.shape[2], v.shape[2] if paged else 0,
       q_rope.stride(0), q_rope.stride(1), k_rope.stride(0), k_rope.stride(1),
       q_nope.stride(0), q_nope.stride(1), k_nope.stride(0), k_nope.stride(1),
       v.stride(0), v.stride(1),
       q_rope_out.stride(0), q_rope_out.stride(1), q_nope_out.stride(0), q_nope_out.stride(1),
       *out_strides(k_rope_out), *out_strides(k_nope_out), *out_strides(v_out),
       cos_sin_cache.stride(0), cos_sin_cache.shape[0], int(paged), kv_indices.shape[0],
       max(kv_indptr.shape[0] - 1, 0), num_pages, page_size, *scales)  # fmt: skip


def _launch_rope_fp8(module, key, q_rope, k_rope, q_nope, k_nope, cos_sin_cache, positions,
                     q_rope_out, k_rope_out, q_nope_out, k_nope_out, scale_q, scale_k,
                     is_neox) -> None:  # fmt: skip
    _launch_rope_sycl(
        module, q_rope=q_rope, k_rope=k_rope, q_nope=q_nope, k_nope=k_nope, v=q_rope,
        cos_sin_cache=cos_sin_cache, positions=positions, q_rope_out=q_rope_out,
        q_nope_out=q_nope_out, k_rope_out=k_rope_out, k_nope_out=k_nope_out, v_out=k_rope_out,
        table=(positions,) * 4, scales=(scale_q, scale_k, 1.0), paged=False,
    )  # fmt: skip


def _launch_paged(module, key, q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache, positions,
                  q_rope_out, q_nope_out, k_rope_cache, k_nope_cache, v_cache, kv_indices,
                  kv_indptr, batch_indices, page_positions, scale_q, scale_k, scale_v,
                  is_neox) -> None:  # fmt: skip
    _launch_rope_sycl(
        module, q_rope=q_rope, k_rope=k_rope, q_nope=q_nope, k_nope=k_nope, v=v,
        cos_sin_cache=cos_sin_cache, positions=positions, q_rope_out=q_rope_out,
        q_nope_out=q_nope_out, k_rope_out=k_rope_cache, k_nope_out=k_nope_cache, v_out=v_cache,
        table=(kv_indices, kv_indptr, batch_indices, page_positions),
        scales=(scale_q, scale_k, scale_v), paged=True,
    )  # fmt: skip


# The plain append copies elements as unsigned integers of their size.
_ELEMENT = {1: "uint8_t", 2: "uint16_t", 4: "uint32_t"}


def _append_key(k, *rest) -> tuple:
    return (k.element_size(),)


def _sycl_append_key(k, v, k_cache, v_cache, kv_indices, kv_indptr, *rest) -> dict:
    _check_indptr(kv_indptr)
    return {"FP8KV_E": _ELEMENT[k.element_size()]}


def _launch_append(module, key, k, v, k_cache, v_cache, kv_indices, kv_indptr, batch_indices,
                   page_positions) -> None:  # fmt: skip
    T, heads = k.shape[0], k.shape[1]
    items = T * 2 * heads
    if items == 0:
        return
    fn = module.get_function("append_paged", ("ptr",) * 8 + ("i64",) * 18)
    g, loc = _items_geometry(items)
    fn(g, loc, k, v, k_cache, v_cache, kv_indices, kv_indptr, batch_indices, page_positions,
       T, heads, k.shape[2], v.shape[2], k.stride(0), k.stride(1), v.stride(0), v.stride(1),
       k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
       v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
       kv_indices.shape[0], kv_indptr.shape[0] - 1, *_pages(k_cache))  # fmt: skip


def _reference_rope_fp8(*args) -> None:
    _check_rotary(args[4])
    reference.rope_quantize_fp8_into(*args)


def _reference_paged(*args) -> None:
    _check_rotary(args[5])
    _check_indptr(args[13])
    reference.rope_quantize_fp8_append_paged_into(*args)


def _reference_append(k, v, k_cache, v_cache, kv_indices, kv_indptr, *rest) -> None:
    _check_indptr(kv_indptr)
    reference.append_paged_kv_cache_into(k, v, k_cache, v_cache, kv_indices, kv_indptr, *rest)


# ------------------------------------------------------------------------------------------------
# Check cases (float64 reference)

# One fp8 ulp where the fp32 kernel and the float64 oracle round a value to different sides of a
# rounding boundary: 2^-3 relative (e4m3), 2^-2 (e5m2); the tolerances are just above.
_TOLERANCES = {_E4M3: 0.13, _E5M2: 0.26}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _table(max_pos: int, rot: int, device) -> torch.Tensor:
    angles = torch.rand(max_pos, rot // 2, dtype=torch.float64) * 6.3
    return torch.cat([angles.cos(), angles.sin()], -1).to(device, torch.float32)


def _rope_fp8_case(tokens, heads, rot, nope, dtype, fp8, is_neox=True, *, idx=torch.int64,
                   scales=(0.7, 1.3), spread=1.0, views=False, label="") -> Case:  # fmt: skip
    hq, hk = heads

    def make(device):
        if views:  # q and k parts as views into one [T, H, R + N] buffer each (MLA's split)
            q = torch.randn(tokens, hq, rot + nope, device=device, dtype=dtype) * spread
            k = torch.randn(tokens, hk, rot + nope, device=device, dtype=dtype) * spread
            q_rope, q_nope, k_rope, k_nope = q[..., :rot], q[..., rot:], k[..., :rot], k[..., rot:]
        else:
            q_rope, k_rope = (torch.randn(tokens, h, rot, device=device, dtype=dtype) * spread
                              for h in (hq, hk))  # fmt: skip
            q_nope, k_nope = (torch.randn(tokens, h, nope, device=device, dtype=dtype) * spread
                              for h in (hq, hk))  # fmt: skip
        positions = torch.randint(0, 64, (tokens,), dtype=idx, device=device)
        if tokens > 2:
            positions[2] = 64 + 3  # out of the table: quantized unrotated
        outs = [
            torch.empty(x.shape, device=device, dtype=fp8) for x in (q_rope, k_rope, q_nope, k_nope)
        ]
        return (q_rope, k_rope, q_nope, k_nope, _table(64, rot, device), positions, *outs,
                *scales, is_neox)  # fmt: skip

    style = "neox" if is_neox else "gptj"
    name = f"{tokens}x({hq}+{hk})x({rot}+{nope}) {style} {_name(dtype)}->{_name(fp8)} {label}"
    return Case(name.strip(), make, _TOLERANCES[fp8])


def _page_table(seq_lens, append_lens, page_size, spare_pages, device):
    """(kv_indices, kv_indptr, batch_indices, page_positions, num_pages) of sequences of
    ``seq_lens`` tokens (after the append) on shuffled pages, the last ``append_lens`` of each
    appended."""
    pages = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages) + spare_pages
    kv_indices = torch.randperm(num_pages)[: sum(pages)].to(torch.int32)
    kv_indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    batch, pos = [], []
    for b, (n, a) in enumerate(zip(seq_lens, append_lens, strict=True)):
        batch += [b] * a
        pos += list(range(n - a, n))
    as_i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
    return (kv_indices.to(device), kv_indptr.to(device), as_i32(batch), as_i32(pos), num_pages)


def _spoil(kv_indices, batch_indices, page_positions, num_pages, batch) -> None:
    """Entries a kernel must not store through (the tokens they name store nothing)."""
    batch_indices[0] = batch  # no such sequence
    if batch_indices.shape[0] > 2:
        page_positions[2] = 1 << 20  # past the sequence's pages
    kv_indices[-1] = num_pages + 3  # past the cache


def _paged_case(seq_lens, append_lens, heads, rot, nope, v_dim, page_size, dtype, fp8, *,
                hnd=False, is_neox=True, idx=torch.int64, mla=False, bad=False, fused=True,
                label="") -> Case:  # fmt: skip
    """rope_quantize_fp8_append_paged (``fused``) or append_paged_kv_cache arguments: GQA (one k
    cache [P, page, Hk, R + N] whose rotary and other parts are views) or MLA (``mla``: kpe and ckv
    caches of one head, no v), NHD or HND (as NHD views)."""
    hq, hk = heads
    tokens = sum(append_lens)

    def caches(device, num_pages, cache_dtype):
        def one(width):
            if hnd:
                c = torch.full((num_pages, hk, page_size, width), float("nan"), device=device)
                return c.to(cache_dtype).transpose(1, 2)
            return torch.full((num_pages, page_size, hk, width), float("nan"), device=device).to(
                cache_dtype
            )

        if mla:
            return one(rot), one(nope), one(0)
        k_cache = one(rot + nope)
        return k_cache[..., :rot], k_cache[..., rot:], one(v_dim)

    def make(device):
        kv_indices, kv_indptr, batch_indices, page_positions, num_pages = _page_table(
            seq_lens, append_lens, page_size, 2, device
        )
        if bad:
            _spoil(kv_indices, batch_indices, page_positions, num_pages, len(seq_lens))
        table = (kv_indices, kv_indptr, batch_indices, page_positions)
        if not fused:  # plain append: k [T, Hk, Dk], v [T, Hk, Dv] of the cache's dtype
            k = torch.randn(tokens, hk, rot, device=device).to(dtype)
            v = torch.randn(tokens, hk, v_dim, device=device).to(dtype)
            k_cache, _, v_cache = caches(device, num_pages, dtype)
            return k, v, k_cache, v_cache, *table
        q_rope = torch.randn(tokens, hq, rot, device=device, dtype=dtype)
        q_nope = torch.randn(tokens, hq, nope, device=device, dtype=dtype)
        k_rope = torch.randn(tokens, hk, rot, device=device, dtype=dtype)
        k_nope = torch.randn(tokens, hk, nope, device=device, dtype=dtype)
        v = torch.randn(tokens, hk, 0 if mla else v_dim, device=device, dtype=dtype)
        positions = torch.randint(0, 64, (tokens,), dtype=idx, device=device)
        q_rope_out = torch.empty(q_rope.shape, device=device, dtype=fp8)
        q_nope_out = torch.empty(q_nope.shape, device=device, dtype=fp8)
        return (q_rope, k_rope, q_nope, k_nope, v, _table(64, rot, device), positions, q_rope_out,
                q_nope_out, *caches(device, num_pages, fp8), *table, 0.8, 1.5, 2.5, is_neox)  # fmt: skip

    kind = "MLA" if mla else f"({hq}+{hk})"
    layout = "HND" if hnd else "NHD"
    dims = f"({rot}+{nope})" + ("" if mla else f" v{v_dim}")
    target = f"->{_name(fp8)}" if fused else ""
    name = (f"{tokens} tokens {kind}x{dims} page {page_size} {layout} {_name(dtype)}{target}"
            f"{' bad table' if bad else ''} {label}")  # fmt: skip
    return Case(name.strip(), make, _TOLERANCES[fp8] if fused else 0.0)


_ROPE_FP8_CASES = [
    _rope_fp8_case(7, (8, 2), 64, 64, torch.bfloat16, _E4M3),
    _rope_fp8_case(5, (4, 2), 128, 0, torch.float16, _E5M2, False, idx=torch.int32),
    _rope_fp8_case(6, (16, 1), 64, 512, torch.bfloat16, _E4M3, views=True, label="MLA views"),
    _rope_fp8_case(
        4,
        (3, 1),
        32,
        16,
        torch.float32,
        _E4M3,
        False,
        scales=(150.0, 300.0),
        spread=3.0,
        label="saturating",
    ),
]
_PAGED_CASES = [
    _paged_case((5, 9, 1), (2, 3, 1), (8, 2), 64, 64, 128, 4, torch.bfloat16, _E4M3),
    _paged_case(
        (5, 17),
        (5, 2),
        (4, 2),
        128,
        0,
        128,
        16,
        torch.float16,
        _E5M2,
        hnd=True,
        is_neox=False,
        idx=torch.int32,
    ),
    _paged_case((3, 8, 2), (3, 1, 2), (16, 1), 64, 512, 0, 2, torch.bfloat16, _E4M3, mla=True),
    _paged_case(
        (9, 4, 6), (4, 4, 3), (4, 2), 32, 32, 64, 4, torch.bfloat16, _E4M3, hnd=True, bad=True
    ),
]
_APPEND_CASES = [
    _paged_case((5, 9, 1), (2, 3, 1), (8, 2), 128, 0, 128, 4, torch.bfloat16, _E4M3, fused=False),
    _paged_case((7, 3), (7, 1), (4, 3), 64, 0, 64, 16, torch.float16, _E4M3, hnd=True, fused=False),
    _paged_case((4, 5), (2, 5), (4, 1), 512, 0, 64, 8, _E4M3, _E4M3, fused=False, label="MLA"),
    _paged_case((6, 2), (3, 2), (4, 2), 64, 0, 32, 2, _E5M2, _E4M3, hnd=True, fused=False),
    _paged_case(
        (9, 4, 6), (4, 4, 3), (4, 2), 32, 0, 32, 4, torch.float32, _E4M3, bad=True, fused=False
    ),
]


# ------------------------------------------------------------------------------------------------
# The ops (destination passing)

_FP8_SCALE = Scalar(float, min=-_F32_MAX, max=_F32_MAX)
_Q_ROPE = Tensor("num_tokens", "q_heads", "rotary_dim", dtype=_ROPE_DTYPES)
_K_ROPE = Tensor("num_tokens", "k_heads", "rotary_dim", dtype="q_rope")
_Q_NOPE = Tensor("num_tokens", "q_heads", "nope_dim", dtype="q_rope")
_K_NOPE = Tensor("num_tokens", "k_heads", "nope_dim", dtype="q_rope")
_TABLE = Tensor("max_pos", "rotary_dim", dtype=(torch.float32,))
_POSITIONS = Tensor("num_tokens", dtype=_INDEX_DTYPES, layout="contiguous")
_PAGE_TABLE = {
    "kv_indices": Tensor("num_indices", dtype=_I32, layout="contiguous"),
    "kv_indptr": Tensor("batch_plus_1", dtype=_I32, layout="contiguous"),
    "batch_indices": Tensor("num_tokens", dtype=_I32, layout="contiguous"),
    "page_positions": Tensor("num_tokens", dtype=_I32, layout="contiguous"),
}


def _cuda(symbol: str, key) -> Cuda:
    return Cuda("csrc/fp8_kv.cuh", symbol, key=key, params=_ROPE_PARAMS)


_rope_quantize_fp8 = family.op(
    "rope_fp8",
    args={
        "q_rope": _Q_ROPE,
        "k_rope": _K_ROPE,
        "q_nope": _Q_NOPE,
        "k_nope": _K_NOPE,
        "cos_sin_cache": _TABLE,
        "positions": _POSITIONS,
        "q_rope_out": Tensor("num_tokens", "q_heads", "rotary_dim", dtype=FP8_DTYPES, io="out"),
        "k_rope_out": Tensor("num_tokens", "k_heads", "rotary_dim", dtype="q_rope_out", io="out"),
        "q_nope_out": Tensor("num_tokens", "q_heads", "nope_dim", dtype="q_rope_out", io="out"),
        "k_nope_out": Tensor("num_tokens", "k_heads", "nope_dim", dtype="q_rope_out", io="out"),
        "scale_q": _FP8_SCALE,
        "scale_k": _FP8_SCALE,
        "is_neox": Scalar(bool),
    },
    reference=_reference_rope_fp8,
    doc=reference.rope_quantize_fp8_into.__doc__,
    cuda=_cuda(
        "sgljit_rope_fp8::RopeQuantizeFp8<{dtype}, {fp8_dtype}, {idx_dtype}, {is_neox}>::run",
        _rope_fp8_key,
    ),
    sycl=Sycl(
        "sycl/fp8_kv.hpp", key=_sycl_rope_fp8_key, launch=_launch_rope_fp8, module="rope_fp8"
    ),
    prebuild={
        "cuda": [
            dict(zip(_ROPE_PARAMS, (dt, _E4M3, torch.int64, True), strict=True))
            for dt in (torch.bfloat16, torch.float16)
        ]
    },
    cases=_ROPE_FP8_CASES,
)

_rope_quantize_fp8_append_paged = family.op(
    "rope_fp8_append_paged",
    args={
        "q_rope": _Q_ROPE,
        "k_rope": _K_ROPE,
        "q_nope": _Q_NOPE,
        "k_nope": _K_NOPE,
        "v": Tensor("num_tokens", "k_heads", "v_dim", dtype="q_rope"),
        "cos_sin_cache": _TABLE,
        "positions": _POSITIONS,
        "q_rope_out": Tensor("num_tokens", "q_heads", "rotary_dim", dtype=FP8_DTYPES, io="out"),
        "q_nope_out": Tensor("num_tokens", "q_heads", "nope_dim", dtype="q_rope_out", io="out"),
        "k_rope_cache": Tensor(
            "num_pages", "page_size", "k_heads", "rotary_dim", dtype="q_rope_out", io="inout"
        ),
        "k_nope_cache": Tensor(
            "num_pages", "page_size", "k_heads", "nope_dim", dtype="q_rope_out", io="inout"
        ),
        "v_cache": Tensor(
            "num_pages", "page_size", "k_heads", "v_dim", dtype="q_rope_out", io="inout"
        ),
        **_PAGE_TABLE,
        "scale_q": _FP8_SCALE,
        "scale_k": _FP8_SCALE,
        "scale_v": _FP8_SCALE,
        "is_neox": Scalar(bool),
    },
    reference=_reference_paged,
    doc=reference.rope_quantize_fp8_append_paged_into.__doc__,
    cuda=_cuda(
        "sgljit_rope_fp8::RopeQuantizeFp8AppendPaged<{dtype}, {fp8_dtype}, {idx_dtype}, "
        "{is_neox}>::run",
        _paged_key,
    ),
    sycl=Sycl("sycl/fp8_kv.hpp", key=_sycl_paged_key, launch=_launch_paged, module="rope_fp8"),
    prebuild={
        "cuda": [
            dict(zip(_ROPE_PARAMS, (dt, _E4M3, torch.int64, True), strict=True))
            for dt in (torch.bfloat16, torch.float16)
        ]
    },
    cases=_PAGED_CASES,
)

_append_paged_kv_cache = family.op(
    "paged_kv_append",
    args={
        "k": Tensor("num_tokens", "k_heads", "k_dim", dtype=_APPEND_DTYPES),
        "v": Tensor("num_tokens", "k_heads", "v_dim", dtype="k"),
        "k_cache": Tensor("num_pages", "page_size", "k_heads", "k_dim", dtype="k", io="inout"),
        "v_cache": Tensor("num_pages", "page_size", "k_heads", "v_dim", dtype="k", io="inout"),
        **_PAGE_TABLE,
    },
    reference=_reference_append,
    doc=reference.append_paged_kv_cache_into.__doc__,
    cuda=Cuda(
        "csrc/fp8_kv.cuh",
        "sgljit_rope_fp8::AppendPagedKV<{bytes}>::run",
        key=_append_key,
        params=("bytes",),
    ),
    sycl=Sycl("sycl/paged_append.hpp", key=_sycl_append_key, launch=_launch_append),
    prebuild={"cuda": [{"bytes": n} for n in (1, 2)]},
    cases=_APPEND_CASES,
)


# ------------------------------------------------------------------------------------------------
# Public functions (FlashInfer's signatures, defaults and returns; sgljit.compat.flashinfer
# re-exports them). The ops check shapes, dtypes, strides, devices and overlap.


def _fp8_dtype(quantize_dtype, *tensors) -> torch.dtype:
    """The fp8 dtype: ``quantize_dtype``, else the first given tensor's, else float8_e4m3fn."""
    if quantize_dtype is None:
        quantize_dtype = next((t.dtype for t in tensors if t is not None), _E4M3)
    if quantize_dtype not in FP8_DTYPES:
        raise ValueError(
            f"quantize_dtype: expected torch.float8_e4m3fn or torch.float8_e5m2, got {quantize_dtype}"
        )
    return quantize_dtype


def _scale(value, name: str) -> float:
    """A per-tensor scale: a Python number or a one-element tensor (read on the host)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"{name}: expected a float or a one-element tensor, got shape {tuple(value.shape)}"
            )
        value = float(value.item())
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    return float(value)


def _nope(x, like: torch.Tensor, name: str) -> torch.Tensor:
    """The non-rotary part: ``x``, or a zero-width tensor of ``like``'s rows and heads."""
    if x is None:
        return like.new_empty((*like.shape[:-1], 0))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(x).__name__}")
    return x


def _heads3(x: torch.Tensor, name: str) -> torch.Tensor:
    """An MLA tensor ``[T, D]`` as ``[T, 1, D]`` (a view); ``[T, H, D]`` as it is."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x.unsqueeze(1) if x.dim() == 2 else x


def _out(given, like: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    if given is None:
        return torch.empty(like.shape, dtype=dtype, device=like.device)
    if not isinstance(given, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(given).__name__}")
    return given


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rope on the rotary parts of q and k, then every part quantized to fp8 (FlashInfer's
    ``rope_quantize_fp8``): ``out = fp8(x * scale)``, saturating, ``quant_scale_q`` for q's parts
    and ``quant_scale_kv`` for k's.

    q_rope ``[T, Hq, R]``, q_nope ``[T, Hq, N]`` (or None: N = 0); k_rope/k_nope ``[T, Hk, *]`` or
    MLA ``[T, *]``; float16/bfloat16 (float32 too). cos_sin_cache float32 ``[max_pos, R]`` (cos |
    sin); pos_ids int32/int64 ``[T]``. ``quantize_dtype``: float8_e4m3fn or float8_e5m2 (default: the
    given outputs', else e4m3). Returns ``(q_rope_out, k_rope_out, q_nope_out, k_nope_out)`` of the
    inputs' shapes (the given outputs, written)."""
    mla = isinstance(k_rope, torch.Tensor) and k_rope.dim() == 2
    q_nope = _nope(q_nope, q_rope, "q_nope")
    k_nope = _nope(k_nope, k_rope, "k_nope")
    dtype = _fp8_dtype(quantize_dtype, q_rope_out, k_rope_out, q_nope_out, k_nope_out)
    outs = [_out(o, x, dtype, n) for o, x, n in ((q_rope_out, q_rope, "q_rope_out"),
            (k_rope_out, k_rope, "k_rope_out"), (q_nope_out, q_nope, "q_nope_out"),
            (k_nope_out, k_nope, "k_nope_out"))]  # fmt: skip
    k3 = [_heads3(x, n) for x, n in ((k_rope, "k_rope"), (k_nope, "k_nope"))]
    k_outs = [_heads3(x, n) for x, n in ((outs[1], "k_rope_out"), (outs[3], "k_nope_out"))]
    if mla and k_nope.dim() != 2:
        raise ValueError(
            f"k_nope: k_rope is [T, R] (MLA), so k_nope must be [T, N]; got shape {tuple(k_nope.shape)}"
        )
    _rope_quantize_fp8(q_rope, k3[0], q_nope, k3[1], cos_sin_cache, pos_ids.contiguous(),
                       outs[0], k_outs[0], outs[2], k_outs[1], _scale(quant_scale_q, "quant_scale_q"),
                       _scale(quant_scale_kv, "quant_scale_kv"), is_neox)  # fmt: skip
    return outs[0], outs[1], outs[2], outs[3]


def _layout_views(cache: torch.Tensor, kv_layout: str, name: str) -> torch.Tensor:
    """A cache as ``[P, page, H, D]`` (NHD as it is; HND ``[P, H, page, D]`` as a transposed view);
    a 3-D MLA cache ``[P, page, D]`` as ``[P, page, 1, D]``."""
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(cache).__name__}")
    if cache.dim() == 3:
        return cache.unsqueeze(2)
    if cache.dim() != 4:
        raise ValueError(f"{name}: expected a 4-D paged cache, got shape {tuple(cache.shape)}")
    return cache.transpose(1, 2) if kv_layout == "HND" else cache


def _check_layout(kv_layout) -> None:
    if kv_layout not in _LAYOUTS:
        raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")


def check_page_table(kv_indices, kv_indptr, kv_last_page_len, batch_indices, positions,
                     num_pages: int, page_size: int) -> None:  # fmt: skip
    """Raise an error naming the first argument whose contents are wrong: ``kv_indptr`` not
    starting at >= 0, decreasing, or past ``kv_indices``; an index outside ``[0, num_pages)``; a
    ``kv_last_page_len`` (if given) outside ``[1, page_size]`` for a sequence with pages (0 for one
    without); a batch index outside the batch; a position negative or past its sequence (its pages,
    or its length where ``kv_last_page_len`` is given). Reads the tensors (a device sync)."""
    indptr = kv_indptr.long().cpu()
    batch = indptr.shape[0] - 1
    if batch < 0:
        raise ValueError("kv_indptr: expected batch_size + 1 >= 1 entries, got 0")
    if indptr[0] < 0 or bool((indptr.diff() < 0).any()) or indptr[-1] > kv_indices.shape[0]:
        raise ValueError(
            f"kv_indptr: expected non-decreasing offsets from >= 0 up to len(kv_indices) = "
            f"{kv_indices.shape[0]}, got {indptr.tolist()[:16]}"
        )
    indices = kv_indices.long().cpu()[int(indptr[0]) : int(indptr[-1])]
    if indices.numel() and (indices.min() < 0 or indices.max() >= num_pages):
        raise ValueError(
            f"kv_indices: expected pages in [0, {num_pages}), got one of {int(indices.min())}..{int(indices.max())}"
        )
    pages = indptr.diff()
    capacity = pages * page_size
    if kv_last_page_len is not None:
        last = kv_last_page_len.long().cpu()
        if last.shape != (batch,):
            raise ValueError(
                f"kv_last_page_len: expected shape ({batch},), got {tuple(last.shape)}"
            )
        bad = torch.where(pages > 0, (last < 1) | (last > page_size), last != 0)
        if bool(bad.any()):
            b = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"kv_last_page_len: expected a length in [1, page_size = {page_size}] for each "
                f"sequence with pages (0 without), got {int(last[b])} for sequence {b}"
            )
        capacity = (pages - 1).clamp(min=0) * page_size + last
    b = batch_indices.long().cpu()
    if b.numel() and (b.min() < 0 or b.max() >= batch):
        raise ValueError(
            f"batch_indices: expected sequences in [0, {batch}), got one of {int(b.min())}..{int(b.max())}"
        )
    pos = positions.long().cpu()
    bad = (pos < 0) | (pos >= capacity[b]) if b.numel() else pos < 0
    if bool(bad.any()):
        t = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"positions: token {t} of sequence {int(b[t])} at position {int(pos[t])} lies outside "
            f"its {int(capacity[b[t]])} cache entries"
        )


def _validate(kv_indices, kv_indptr, kv_last_page_len, batch_indices, positions, cache) -> None:
    """check_page_table where it is cheap (every page-table tensor on the CPU) or asked for
    (SGLJIT_CHECK_INDICES=1; not while compiling or capturing)."""
    tensors = [t for t in (kv_indices, kv_indptr, kv_last_page_len, batch_indices, positions)
               if t is not None]  # fmt: skip
    if not all(isinstance(t, torch.Tensor) for t in tensors) or not isinstance(cache, torch.Tensor):
        return  # the op names what is not a tensor
    if any(t.dim() != 1 for t in tensors) or cache.dim() != 4:
        return  # the op names the shape
    on_cpu = all(t.device.type == "cpu" for t in tensors)
    if not on_cpu:
        if not _CHECK_INDICES or torch.compiler.is_compiling():
            return
        if any(t.is_cuda for t in tensors) and torch.cuda.is_current_stream_capturing():
            return
    check_page_table(kv_indices, kv_indptr, kv_last_page_len, batch_indices, positions,
                     cache.shape[0], cache.shape[1])  # fmt: skip


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
    *,
    quant_scale_v: float | None = None,
    kv_last_page_len: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rope, fp8 quantize and append k (and v) into a paged fp8 cache in one launch (FlashInfer's
    ``rope_quantize_fp8_append_paged_kv_cache``); returns the quantized ``(q_rope_out, q_nope_out)``.

    GQA/MHA (``v`` given): ``paged_kv_cache = (k_cache, v_cache)``, NHD ``[P, page_size, Hk, R + N]``
    (k: rotary dims first) and ``[P, page_size, Hk, Dv]``, or HND ``[P, Hk, page_size, *]``. MLA
    (``v`` None, k_rope ``[T, R]``, k_nope ``[T, N]``): ``paged_kv_cache = (ckv_cache, kpe_cache)``,
    ``[P, page_size, N]`` and ``[P, page_size, R]``. The caches' dtype is the fp8 dtype
    (``quantize_dtype``, if given, must match it). ``pos_ids``: the rope positions; ``batch_indices``
    and ``positions`` (int32, :func:`get_batch_indices_positions`) place each token. k and v are
    scaled by ``quant_scale_kv`` (v by ``quant_scale_v`` where given: sgljit's addition).
    ``kv_last_page_len`` (sgljit's addition) lets the page-table check bound each position by its
    sequence's length."""
    _check_layout(kv_layout)
    if not isinstance(paged_kv_cache, (tuple, list)) or len(paged_kv_cache) != 2:
        raise ValueError(
            "paged_kv_cache: expected a tuple of two caches, (k_cache, v_cache) or (ckv_cache, kpe_cache)"
        )
    mla = v is None
    q_nope = _nope(q_nope, q_rope, "q_nope")
    k_nope = _nope(k_nope, k_rope, "k_nope")
    first, second = paged_kv_cache
    if mla:
        kpe = _layout_views(second, kv_layout, "paged_kv_cache[1]")
        ckv = _layout_views(first, kv_layout, "paged_kv_cache[0]")
        k_rope_cache, k_nope_cache = kpe, ckv
        v_cache = kpe[..., :0]
        k3, kn3 = _heads3(k_rope, "k_rope"), _heads3(k_nope, "k_nope")
        v = k3[..., :0]
    else:
        k_cache = _layout_views(first, kv_layout, "paged_kv_cache[0]")
        v_cache = _layout_views(second, kv_layout, "paged_kv_cache[1]")
        rot = q_rope.shape[-1]
        if k_cache.shape[-1] != rot + k_nope.shape[-1]:
            raise ValueError(
                f"paged_kv_cache[0]: head size {k_cache.shape[-1]} is not rotary + other dims "
                f"({rot} + {k_nope.shape[-1]})"
            )
        k_rope_cache, k_nope_cache = k_cache[..., :rot], k_cache[..., rot:]
        k3, kn3 = k_rope, k_nope
    if not isinstance(page_size, int) or k_rope_cache.shape[1] != page_size:
        raise ValueError(
            f"page_size: {page_size!r} does not match the caches' page size {k_rope_cache.shape[1]}"
        )
    dtype = k_rope_cache.dtype
    if dtype not in FP8_DTYPES:
        raise ValueError(
            f"paged_kv_cache: expected float8_e4m3fn or float8_e5m2 caches, got {dtype}"
        )
    if quantize_dtype is not None and _fp8_dtype(quantize_dtype) != dtype:
        raise ValueError(f"quantize_dtype: {quantize_dtype} differs from the caches' dtype {dtype}")
    q_rope_out = _out(q_rope_out, q_rope, dtype, "q_rope_out")
    q_nope_out = _out(q_nope_out, q_nope, dtype, "q_nope_out")
    scale_kv = _scale(quant_scale_kv, "quant_scale_kv")
    scale_v = scale_kv if quant_scale_v is None else _scale(quant_scale_v, "quant_scale_v")
    _validate(kv_indices, kv_indptr, kv_last_page_len, batch_indices, positions, k_rope_cache)
    _rope_quantize_fp8_append_paged(
        q_rope, k3, q_nope, kn3, v, cos_sin_cache, pos_ids.contiguous(), q_rope_out, q_nope_out,
        k_rope_cache, k_nope_cache, v_cache, kv_indices, kv_indptr, batch_indices, positions,
        _scale(quant_scale_q, "quant_scale_q"), scale_kv, scale_v, is_neox,
    )  # fmt: skip
    return q_rope_out, q_nope_out


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
    """Append k/v ``[nnz, Hk, D]`` into a paged cache (FlashInfer's ``append_paged_kv_cache``):
    ``paged_kv_cache`` is ``(k_cache, v_cache)``, each NHD ``[P, page_size, Hk, D]`` or HND
    ``[P, Hk, page_size, D]``, or one tensor ``[P, 2, page_size, Hk, D]`` (HND ``[P, 2, Hk,
    page_size, D]``). Same dtype as the cache: float16/bfloat16/float32/float8 (copied exactly)."""
    _check_layout(kv_layout)
    if isinstance(paged_kv_cache, torch.Tensor):
        if paged_kv_cache.dim() != 5 or paged_kv_cache.shape[1] != 2:
            raise ValueError(
                f"paged_kv_cache: expected (k_cache, v_cache) or one [P, 2, ...] tensor, got shape "
                f"{tuple(paged_kv_cache.shape)}"
            )
        paged_kv_cache = (paged_kv_cache[:, 0], paged_kv_cache[:, 1])
    if not isinstance(paged_kv_cache, (tuple, list)) or len(paged_kv_cache) != 2:
        raise ValueError("paged_kv_cache: expected (k_cache, v_cache) or one [P, 2, ...] tensor")
    k_cache = _layout_views(paged_kv_cache[0], kv_layout, "paged_kv_cache[0]")
    v_cache = _layout_views(paged_kv_cache[1], kv_layout, "paged_kv_cache[1]")
    _validate(kv_indices, kv_indptr, kv_last_page_len, batch_indices, positions, k_cache)
    _append_paged_kv_cache(append_key, append_value, k_cache, v_cache, kv_indices, kv_indptr,
                           batch_indices, positions)  # fmt: skip


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
    """Append MLA's compressed kv ``[nnz, N]`` and rotary key ``[nnz, R]`` into ``ckv_cache``
    ``[P, page_size, N]`` and ``kpe_cache`` ``[P, page_size, R]`` (FlashInfer's
    ``append_paged_mla_kv_cache``); same dtype as the caches."""
    ckv = _heads3(append_ckv, "append_ckv")
    kpe = _heads3(append_kpe, "append_kpe")
    ckv_c = _layout_views(ckv_cache, "NHD", "ckv_cache")
    kpe_c = _layout_views(kpe_cache, "NHD", "kpe_cache")
    _validate(kv_indices, kv_indptr, kv_last_page_len, batch_indices, positions, ckv_c)
    _append_paged_kv_cache(ckv, kpe, ckv_c, kpe_c, kv_indices, kv_indptr, batch_indices, positions)


def get_seq_lens(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> torch.Tensor:
    """Each sequence's length in the paged cache: ``max(pages - 1, 0) * page_size + last_page_len``
    (FlashInfer's ``get_seq_lens``; int64 as its arithmetic gives)."""
    return (kv_indptr[1:] - kv_indptr[:-1] - 1).clamp(min=0) * page_size + kv_last_page_len


def get_batch_indices_positions(append_indptr: torch.Tensor, seq_lens: torch.Tensor,
                                nnz: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(batch_indices, positions), int32 ``[nnz]``, of appended tokens (FlashInfer's
    ``get_batch_indices_positions``): sequence b appends rows ``append_indptr[b]:append_indptr[b +
    1]``, which take the last positions of its ``seq_lens[b]`` (its length after the append). No
    host sync: ``nnz`` sizes the outputs."""
    if not isinstance(nnz, int) or nnz < 0:
        raise ValueError(f"nnz: expected a non-negative int, got {nnz!r}")
    device = append_indptr.device
    lengths = append_indptr.diff().long()
    batch = torch.arange(lengths.shape[0], device=device)
    batch_indices = torch.repeat_interleave(batch, lengths, output_size=nnz)
    rows = torch.arange(nnz, device=device)
    start = append_indptr.long()[:-1][batch_indices]
    first = (seq_lens.long() - lengths)[batch_indices]
    return batch_indices.to(torch.int32), (rows - start + first).to(torch.int32)

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
        raise ValueError(f"cos_sin_cache: its width {rot} (rotary_dim) must be a positive even number")
    if max_pos == 0:
        raise ValueError("cos_sin_cache: has no rows (expected [max_pos, rotary_dim] with max_pos >= 1)")


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
    num_pages, page_size = (k_rope_out.shape[0], k_rope_out.shape[1]) if paged else (T, 1)
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
       kv_indices.shape[0], kv_indptr.shape[0] - 1, k_cache.shape[0], k_cache.shape[1])  # fmt: skip


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
        outs = [torch.empty(x.shape, device=device, dtype=fp8) for x in (q_rope, k_rope, q_nope, k_nope)]
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
            return torch.full((num_pages, page_size, hk, width), float("nan"), device=device).to(cache_dtype)

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
    _rope_fp8_case(4, (3, 1), 32, 16, torch.float32, _E4M3, False, scales=(150.0, 300.0),
                   spread=3.0, label="saturating"),  # fmt: skip
]
_PAGED_CASES = [
    _paged_case((5, 9, 1), (2, 3, 1), (8, 2), 64, 64, 128, 4, torch.bfloat16, _E4M3),
    _paged_case((5, 17), (5, 2), (4, 2), 128, 0, 128, 16, torch.float16, _E5M2, hnd=True,
                is_neox=False, idx=torch.int32),  # fmt: skip
    _paged_case((3, 8, 2), (3, 1, 2), (16, 1), 64, 512, 0, 2, torch.bfloat16, _E4M3, mla=True),
    _paged_case((9, 4, 6), (4, 4, 3), (4, 2), 32, 32, 64, 4, torch.bfloat16, _E4M3, hnd=True,
                bad=True),  # fmt: skip
]
_APPEND_CASES = [
    _paged_case((5, 9, 1), (2, 3, 1), (8, 2), 128, 0, 128, 4, torch.bfloat16, _E4M3, fused=False),
    _paged_case((7, 3), (7, 1), (4, 3), 64, 0, 64, 16, torch.float16, _E4M3, hnd=True, fused=False),
    _paged_case((4, 5), (2, 5), (4, 1), 512, 0, 64, 8, _E4M3, _E4M3, fused=False, label="MLA"),
    _paged_case((6, 2), (3, 2), (4, 2), 64, 0, 32, 2, _E5M2, _E4M3, hnd=True, fused=False),
    _paged_case((9, 4, 6), (4, 4, 3), (4, 2), 32, 0, 32, 4, torch.float32, _E4M3, bad=True,
                fused=False),  # fmt: skip
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
    "rope_quantize_fp8",
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
    sycl=Sycl("sycl/fp8_kv.hpp", key=_sycl_rope_fp8_key, launch=_launch_rope_fp8, module="rope_fp8"),
    prebuild={
        "cuda": [
            dict(zip(_ROPE_PARAMS, (dt, _E4M3, torch.int64, True), strict=True))
            for dt in (torch.bfloat16, torch.float16)
        ]
    },
    cases=_ROPE_FP8_CASES,
)

_rope_quantize_fp8_append_paged = family.op(
    "rope_quantize_fp8_append_paged",
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
        "k_rope_cache": Tensor("num_pages", "page_size", "k_heads", "rotary_dim",
                               dtype="q_rope_out", io="inout"),  # fmt: skip
        "k_nope_cache": Tensor("num_pages", "page_size", "k_heads", "nope_dim",
                               dtype="q_rope_out", io="inout"),  # fmt: skip
        "v_cache": Tensor("num_pages", "page_size", "k_heads", "v_dim", dtype="q_rope_out",
                          io="inout"),  # fmt: skip
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
    "append_paged_kv_cache",
    args={
        "k": Tensor("num_tokens", "k_heads", "k_dim", dtype=_APPEND_DTYPES),
        "v": Tensor("num_tokens", "k_heads", "v_dim", dtype="k"),
        "k_cache": Tensor("num_pages", "page_size", "k_heads", "k_dim", dtype="k", io="inout"),
        "v_cache": Tensor("num_pages", "page_size", "k_heads", "v_dim", dtype="k", io="inout"),
        **_PAGE_TABLE,
    },
    reference=_reference_append,
    doc=reference.append_paged_kv_cache_into.__doc__,
    cuda=Cuda("csrc/fp8_kv.cuh", "sgljit_rope_fp8::AppendPagedKV<{bytes}>::run", key=_append_key,
              params=("bytes",)),  # fmt: skip
    sycl=Sycl("sycl/paged_append.hpp", key=_sycl_append_key, launch=_launch_append),
    prebuild={"cuda": [{"bytes": n} for n in (1, 2)]},
    cases=_APPEND_CASES,
)

"""sgljit.compat.flashinfer's fp8 KV write (rope.rope_quantize_fp8, mla_rope_quantize_fp8,
rope_quantize_fp8_append_paged_kv_cache) and page helpers (page.get_seq_lens,
get_batch_indices_positions, append_paged_kv_cache, append_paged_mla_kv_cache) on every backend,
against an oracle written here from FlashInfer's documented semantics: rope in float64, then
``fp8(clamp(x * scale))``, then a copy into the pages the page table names."""

from __future__ import annotations

import contextlib

import pytest
import torch

import sgljit
from sgljit.compat.flashinfer import page as fi_page
from sgljit.compat.flashinfer import rope as fi_rope

from ..plugins.common import BACKENDS

pytest.importorskip("sgljit_rope")

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# One fp8 ulp (2^-3 e4m3, 2^-2 e5m2, relative) where float32 math and the float64 oracle round to
# different sides of a boundary; nearly every element must match exactly.
ULP = {E4M3: 0.13, E5M2: 0.26}


def device_of(backend: str) -> str:
    return "cuda" if backend == "cuda" else "cpu"


def using(backend: str):
    return sgljit.use_backend("sycl") if backend == "sycl" else contextlib.nullcontext()


def make_cache(max_pos: int, rot: int, device) -> torch.Tensor:
    inv = 1.0 / 10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat((ang.cos(), ang.sin()), dim=-1).to(device, torch.float32)


def rope64(x, cache, pos, neox):
    """float64 rope of x [T, H, R] (all R dims rotate)."""
    y = x.detach().double().cpu()
    half = cache.shape[1] // 2
    rows = cache.double().cpu()[pos.cpu().long()]
    c, s = rows[:, None, :half], rows[:, None, half:]
    i1 = torch.arange(half) if neox else torch.arange(0, 2 * half, 2)
    i2 = i1 + half if neox else i1 + 1
    out = y.clone()
    out[..., i1] = y[..., i1] * c - y[..., i2] * s
    out[..., i2] = y[..., i2] * c + y[..., i1] * s
    return out


def fp8_of(x64, scale, dtype):
    m = torch.finfo(dtype).max
    return (x64 * scale).clamp(-m, m).to(dtype)


def assert_fp8_close(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    a, e = actual.cpu().double(), expected.cpu().double()
    assert torch.equal(a.isnan(), e.isnan())
    a, e = a.nan_to_num(0.0), e.nan_to_num(0.0)
    if not a.numel():
        return
    err = (a - e).abs() / (1 + e.abs())
    assert float(err.max()) <= ULP[actual.dtype]
    assert float((a == e).double().mean()) >= 0.97


def page_table(seq_lens, append_lens, page_size, device, spare=3):
    """(kv_indices, kv_indptr, kv_last_page_len, append_indptr, num_pages): pages shuffled."""
    pages = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages) + spare
    kv_indices = torch.randperm(num_pages)[: sum(pages)].to(torch.int32)
    kv_indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(seq_lens, pages, strict=True)],
                        dtype=torch.int32)  # fmt: skip
    append_indptr = torch.tensor(
        [0, *torch.tensor(append_lens).cumsum(0).tolist()], dtype=torch.int32
    )
    return (kv_indices.to(device), kv_indptr.to(device), last.to(device), append_indptr.to(device),
            num_pages)  # fmt: skip


def expected_slots(kv_indices, kv_indptr, seq_lens, append_lens, page_size):
    """(page, entry) of each appended token, from the convention."""
    slots = []
    for b, (n, a) in enumerate(zip(seq_lens, append_lens, strict=True)):
        for p in range(n - a, n):
            slots.append((int(kv_indices[int(kv_indptr[b]) + p // page_size]), p % page_size))
    return slots


# ------------------------------------------------------------------------------------------------


def test_get_seq_lens_and_batch_indices_positions():
    """FlashInfer's documented example: append_indptr [0, 1, 5, 15], seq_lens [5, 5, 10]."""
    append_indptr = torch.tensor([0, 1, 5, 15], dtype=torch.int32)
    seq_lens = torch.tensor([5, 5, 10], dtype=torch.int32)
    b, p = fi_page.get_batch_indices_positions(append_indptr, seq_lens, 15)
    assert b.dtype == p.dtype == torch.int32
    assert b.tolist() == [0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]
    assert p.tolist() == [4, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    kv_indptr = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    last = torch.tensor([3, 0, 16], dtype=torch.int32)
    assert fi_page.get_seq_lens(kv_indptr, last, 16).tolist() == [19, 0, 48]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("dtype", "fp8", "neox", "idx", "nope", "mla"),
    [
        (torch.bfloat16, E4M3, True, torch.int64, 64, False),
        (torch.float16, E5M2, False, torch.int32, 0, False),
        (torch.bfloat16, E4M3, True, torch.int64, 512, True),
    ],
)
def test_rope_quantize_fp8(backend, dtype, fp8, neox, idx, nope, mla):
    torch.manual_seed(0)
    dev = device_of(backend)
    T, Hq, Hk, R = 9, 8, 1 if mla else 2, 64
    q_rope = torch.randn(T, Hq, R, device=dev, dtype=dtype) * 3
    q_nope = torch.randn(T, Hq, nope, device=dev, dtype=dtype) if nope else None
    k_shape = (T, R) if mla else (T, Hk, R)
    k_rope = torch.randn(*k_shape, device=dev, dtype=dtype) * 3
    k_nope = torch.randn(*k_shape[:-1], nope, device=dev, dtype=dtype) if nope else None
    cache = make_cache(128, R, dev)
    pos = torch.randint(0, 128, (T,), device=dev, dtype=idx)
    fn = fi_rope.mla_rope_quantize_fp8 if mla else fi_rope.rope_quantize_fp8
    with using(backend):
        outs = fn(q_rope, k_rope, q_nope, k_nope, cache, pos, is_neox=neox, quantize_dtype=fp8,
                  quant_scale_q=0.5, quant_scale_kv=40.0)  # fmt: skip
    q_r, k_r, q_n, k_n = outs
    assert q_r.shape == q_rope.shape and k_r.shape == k_rope.shape
    assert_fp8_close(q_r, fp8_of(rope64(q_rope, cache, pos, neox), 0.5, fp8))
    k3 = k_rope if not mla else k_rope.unsqueeze(1)
    want_k = fp8_of(rope64(k3, cache, pos, neox), 40.0, fp8)
    assert_fp8_close(k_r, want_k.squeeze(1) if mla else want_k)
    assert q_n.shape == (T, Hq, nope) and k_n.shape[-1] == nope
    if nope:
        assert_fp8_close(q_n, fp8_of(q_nope.double().cpu(), 0.5, fp8))
        assert_fp8_close(k_n, fp8_of(k_nope.double().cpu(), 40.0, fp8))


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_quantize_fp8_given_outputs_and_defaults(backend):
    """quantize_dtype from the given outputs; the outputs returned are the tensors given."""
    dev = device_of(backend)
    q = torch.randn(4, 2, 32, device=dev, dtype=torch.bfloat16)
    k = torch.randn(4, 1, 32, device=dev, dtype=torch.bfloat16)
    outs = [torch.empty(x.shape, device=dev, dtype=E5M2) for x in (q, k)]
    cache, pos = make_cache(16, 32, dev), torch.arange(4, device=dev)
    with using(backend):
        got = fi_rope.rope_quantize_fp8(
            q, k, None, None, cache, pos, q_rope_out=outs[0], k_rope_out=outs[1]
        )
    assert got[0] is outs[0] and got[1] is outs[1]
    assert_fp8_close(got[0], fp8_of(rope64(q, cache, pos, True), 1.0, E5M2))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("layout", "page_size", "fp8", "neox"),
    [("NHD", 16, E4M3, True), ("HND", 4, E5M2, False), ("NHD", 1, E4M3, False)],
)
def test_rope_quantize_fp8_append_paged_kv_cache(backend, layout, page_size, fp8, neox):
    torch.manual_seed(1)
    dev = device_of(backend)
    seq_lens, append_lens = [7, 20, 3], [2, 17, 1]
    T, Hq, Hk, R, N = sum(append_lens), 8, 2, 64, 64
    kv_indices, kv_indptr, last, append_indptr, P = page_table(
        seq_lens, append_lens, page_size, dev
    )
    seq = fi_page.get_seq_lens(kv_indptr, last, page_size)
    b, p = fi_page.get_batch_indices_positions(append_indptr, seq, T)
    q_rope, k_rope = (torch.randn(T, h, R, device=dev, dtype=torch.bfloat16) for h in (Hq, Hk))
    q_nope, k_nope = (torch.randn(T, h, N, device=dev, dtype=torch.bfloat16) for h in (Hq, Hk))
    v = torch.randn(T, Hk, R + N, device=dev, dtype=torch.bfloat16)
    shape = (P, page_size, Hk, R + N) if layout == "NHD" else (P, Hk, page_size, R + N)
    k_cache = torch.full(shape, float("nan"), device=dev).to(fp8)
    v_cache = k_cache.clone()
    cache, pos_ids = make_cache(64, R, dev), torch.randint(0, 64, (T,), device=dev)
    with using(backend):
        q_r, q_n = fi_rope.rope_quantize_fp8_append_paged_kv_cache(
            q_rope, k_rope, q_nope, k_nope, v, cache, pos_ids, (k_cache, v_cache), kv_indices,
            kv_indptr, b, p, is_neox=neox, quant_scale_q=0.25, quant_scale_kv=2.0,
            page_size=page_size, kv_layout=layout,
        )  # fmt: skip
    assert_fp8_close(q_r, fp8_of(rope64(q_rope, cache, pos_ids, neox), 0.25, fp8))
    assert_fp8_close(q_n, fp8_of(q_nope.double().cpu(), 0.25, fp8))
    want_k = torch.cat((fp8_of(rope64(k_rope, cache, pos_ids, neox), 2.0, fp8).double(),
                        fp8_of(k_nope.double().cpu(), 2.0, fp8).double()), -1).to(fp8)  # fmt: skip
    want_v = fp8_of(v.double().cpu(), 2.0, fp8)
    nhd = (lambda c: c) if layout == "NHD" else (lambda c: c.transpose(1, 2))
    expect_k = nhd(torch.full(shape, float("nan")).to(fp8))
    expect_v = expect_k.clone()
    for t, (page, entry) in enumerate(
        expected_slots(kv_indices.cpu(), kv_indptr.cpu(), seq_lens, append_lens, page_size)
    ):
        expect_k[page, entry] = want_k[t]
        expect_v[page, entry] = want_v[t]
    assert_fp8_close(nhd(k_cache), expect_k)
    assert_fp8_close(nhd(v_cache), expect_v)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_quantize_fp8_append_paged_mla(backend):
    torch.manual_seed(2)
    dev = device_of(backend)
    seq_lens, append_lens, page_size = [5, 9], [5, 1], 8
    T, Hq, R, N = sum(append_lens), 16, 64, 512
    kv_indices, kv_indptr, last, append_indptr, P = page_table(
        seq_lens, append_lens, page_size, dev
    )
    b, p = fi_page.get_batch_indices_positions(
        append_indptr, fi_page.get_seq_lens(kv_indptr, last, page_size), T
    )
    q_rope = torch.randn(T, Hq, R, device=dev, dtype=torch.bfloat16)
    q_nope = torch.randn(T, Hq, N, device=dev, dtype=torch.bfloat16)
    k_rope = torch.randn(T, R, device=dev, dtype=torch.bfloat16)
    k_nope = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
    ckv = torch.full((P, page_size, N), float("nan"), device=dev).to(E4M3)
    kpe = torch.full((P, page_size, R), float("nan"), device=dev).to(E4M3)
    cache, pos_ids = make_cache(32, R, dev), torch.randint(0, 32, (T,), device=dev)
    with using(backend):
        fi_rope.rope_quantize_fp8_append_paged_kv_cache(
            q_rope, k_rope, q_nope, k_nope, None, cache, pos_ids, (ckv, kpe), kv_indices,
            kv_indptr, b, p, quant_scale_kv=3.0, page_size=page_size,
        )  # fmt: skip
    want_kpe = fp8_of(rope64(k_rope.unsqueeze(1), cache, pos_ids, True), 3.0, E4M3).squeeze(1)
    want_ckv = fp8_of(k_nope.double().cpu(), 3.0, E4M3)
    exp_ckv, exp_kpe = (
        torch.full(ckv.shape, float("nan")).to(E4M3),
        torch.full(kpe.shape, float("nan")).to(E4M3),
    )
    for t, (page, entry) in enumerate(
        expected_slots(kv_indices.cpu(), kv_indptr.cpu(), seq_lens, append_lens, page_size)
    ):
        exp_ckv[page, entry], exp_kpe[page, entry] = want_ckv[t], want_kpe[t]
    assert_fp8_close(ckv, exp_ckv)
    assert_fp8_close(kpe, exp_kpe)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("dtype", "layout", "single"),
    [
        (torch.bfloat16, "NHD", False),
        (torch.float16, "HND", True),
        (E4M3, "NHD", True),
        (E5M2, "HND", False),
    ],
)
def test_append_paged_kv_cache(backend, dtype, layout, single):
    torch.manual_seed(3)
    dev = device_of(backend)
    seq_lens, append_lens, page_size, Hk, D = [6, 13, 1], [6, 4, 1], 4, 2, 128
    T = sum(append_lens)
    kv_indices, kv_indptr, last, append_indptr, P = page_table(
        seq_lens, append_lens, page_size, dev
    )
    b, p = fi_page.get_batch_indices_positions(
        append_indptr, fi_page.get_seq_lens(kv_indptr, last, page_size), T
    )
    k = torch.randn(T, Hk, D, device=dev).to(dtype)
    v = torch.randn(T, Hk, D, device=dev).to(dtype)
    one = (P, page_size, Hk, D) if layout == "NHD" else (P, Hk, page_size, D)
    both = torch.full((P, 2, *one[1:]), float("nan"), device=dev).to(dtype)
    paged = both if single else (both[:, 0], both[:, 1])
    with using(backend):
        fi_page.append_paged_kv_cache(
            k, v, b, p, paged, kv_indices, kv_indptr, last, kv_layout=layout
        )
    nhd = (lambda c: c) if layout == "NHD" else (lambda c: c.transpose(1, 2))
    expect = torch.full((P, 2, *one[1:]), float("nan")).to(dtype)
    for t, (page, entry) in enumerate(
        expected_slots(kv_indices.cpu(), kv_indptr.cpu(), seq_lens, append_lens, page_size)
    ):
        nhd(expect[:, 0])[page, entry] = k[t].cpu()
        nhd(expect[:, 1])[page, entry] = v[t].cpu()
    got, want = both.cpu().view(torch.uint8), expect.view(torch.uint8)  # bit for bit
    if dtype.itemsize > 1:
        got, want = both.cpu().float(), expect.float()
        assert torch.equal(got.isnan(), want.isnan())
        got, want = got.nan_to_num(0.0), want.nan_to_num(0.0)
    assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_append_paged_mla_kv_cache(backend):
    torch.manual_seed(4)
    dev = device_of(backend)
    seq_lens, append_lens, page_size = [3, 17], [2, 3], 16
    T = sum(append_lens)
    kv_indices, kv_indptr, last, append_indptr, P = page_table(
        seq_lens, append_lens, page_size, dev
    )
    b, p = fi_page.get_batch_indices_positions(
        append_indptr, fi_page.get_seq_lens(kv_indptr, last, page_size), T
    )
    ckv = torch.randn(T, 512, device=dev, dtype=torch.bfloat16)
    kpe = torch.randn(T, 64, device=dev, dtype=torch.bfloat16)
    ckv_cache = torch.zeros(P, page_size, 512, device=dev, dtype=torch.bfloat16)
    kpe_cache = torch.zeros(P, page_size, 64, device=dev, dtype=torch.bfloat16)
    with using(backend):
        fi_page.append_paged_mla_kv_cache(
            ckv, kpe, b, p, ckv_cache, kpe_cache, kv_indices, kv_indptr, last
        )
    exp_c, exp_k = (
        torch.zeros(ckv_cache.shape, dtype=torch.bfloat16),
        torch.zeros(kpe_cache.shape, dtype=torch.bfloat16),
    )
    for t, (page, entry) in enumerate(
        expected_slots(kv_indices.cpu(), kv_indptr.cpu(), seq_lens, append_lens, page_size)
    ):
        exp_c[page, entry], exp_k[page, entry] = ckv[t].cpu(), kpe[t].cpu()
    assert torch.equal(ckv_cache.cpu(), exp_c) and torch.equal(kpe_cache.cpu(), exp_k)


# ------------------------------------------------------------------------------------------------
# Bad input: an error naming the argument, nothing written.


def _paged_setup(dev):
    seq_lens, append_lens, page_size = [5, 9], [2, 3], 4
    kv_indices, kv_indptr, last, append_indptr, P = page_table(
        seq_lens, append_lens, page_size, dev, spare=0
    )
    b, p = fi_page.get_batch_indices_positions(
        append_indptr, fi_page.get_seq_lens(kv_indptr, last, page_size), 5
    )
    k = torch.randn(5, 2, 64, device=dev, dtype=torch.bfloat16)
    cache = torch.zeros(P, page_size, 2, 64, device=dev, dtype=torch.bfloat16)
    return dict(
        kv_indices=kv_indices, kv_indptr=kv_indptr, last=last, b=b, p=p, k=k, cache=cache, P=P
    )


def _spoiled(s, what):
    s = dict(s)
    if what == "kv_indptr":
        s["kv_indptr"] = s["kv_indptr"].flip(0).contiguous()  # not monotone
    elif what == "kv_indices":
        s["kv_indices"] = s["kv_indices"].clone()
        s["kv_indices"][0] = s["P"]  # past the cache
    elif what == "kv_last_page_len":
        s["last"] = s["last"].clone()
        s["last"][0] = 0
    elif what == "kv_last_page_len ":
        s["last"] = s["last"].clone()
        s["last"][1] = 5  # past page_size 4
    elif what == "batch_indices":
        s["b"] = s["b"].clone()
        s["b"][0] = 7
    elif what == "positions":
        s["p"] = s["p"].clone()
        s["p"][1] = 50
    return s


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "what",
    [
        "kv_indptr",
        "kv_indices",
        "kv_last_page_len",
        "kv_last_page_len ",
        "batch_indices",
        "positions",
    ],
)
def test_bad_page_table_raises_before_any_write(backend, what, monkeypatch):
    from sgljit_rope import fp8_kv

    monkeypatch.setattr(
        fp8_kv, "_CHECK_INDICES", True
    )  # device tables (CUDA) are read only when asked
    dev = device_of(backend)
    s = _spoiled(_paged_setup(dev), what)
    cache = s["cache"]
    with using(backend), pytest.raises(ValueError, match=r"^" + what.strip()):
        fi_page.append_paged_kv_cache(s["k"], s["k"], s["b"], s["p"], (cache, cache.clone()),
                                      s["kv_indices"], s["kv_indptr"], s["last"])  # fmt: skip
    assert not cache.any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_arguments_name_themselves(backend):
    dev = device_of(backend)
    s = _paged_setup(dev)
    cache = s["cache"]
    with using(backend), pytest.raises(ValueError, match=r"^kv_layout"):
        fi_page.append_paged_kv_cache(s["k"], s["k"], s["b"], s["p"], (cache, cache), s["kv_indices"],
                                      s["kv_indptr"], s["last"], kv_layout="NDH")  # fmt: skip
    q = torch.randn(5, 4, 64, device=dev, dtype=torch.bfloat16)
    table, pos = make_cache(16, 64, dev), torch.zeros(5, dtype=torch.int64, device=dev)
    with using(backend), pytest.raises(ValueError, match=r"^quantize_dtype"):
        fi_rope.rope_quantize_fp8(q, s["k"], None, None, table, pos, quantize_dtype=torch.int8)
    with using(backend), pytest.raises(ValueError, match=r"^quant_scale_q"):
        fi_rope.rope_quantize_fp8(q, s["k"], None, None, table, pos, quant_scale_q=torch.ones(2))
    fp8_cache = torch.zeros(s["P"], 4, 2, 64, device=dev, dtype=E4M3)
    with using(backend), pytest.raises(ValueError, match=r"^paged_kv_cache"):
        fi_rope.rope_quantize_fp8_append_paged_kv_cache(
            q,
            s["k"],
            None,
            None,
            s["k"],
            table,
            pos,
            (cache, cache),
            s["kv_indices"],
            s["kv_indptr"],
            s["b"],
            s["p"],
            page_size=4,
        )  # bf16 caches: not fp8
    with using(backend), pytest.raises(ValueError, match=r"^page_size"):
        fi_rope.rope_quantize_fp8_append_paged_kv_cache(
            q,
            s["k"],
            None,
            None,
            s["k"],
            table,
            pos,
            (fp8_cache, fp8_cache.clone()),
            s["kv_indices"],
            s["kv_indptr"],
            s["b"],
            s["p"],
        )  # default page_size 16, caches of 4
    with using(backend), pytest.raises(ValueError, match=r"^kv_layout"):
        fi_rope.rope_quantize_fp8_append_paged_kv_cache(
            q, s["k"], None, None, s["k"], table, pos, (fp8_cache, fp8_cache.clone()),
            s["kv_indices"], s["kv_indptr"], s["b"], s["p"], page_size=4, kv_layout="nhd",
        )  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch(backend):
    dev = device_of(backend)
    q = torch.randn(0, 4, 64, device=dev, dtype=torch.bfloat16)
    k = torch.randn(0, 2, 64, device=dev, dtype=torch.bfloat16)
    table, pos = make_cache(16, 64, dev), torch.zeros(0, dtype=torch.int64, device=dev)
    cache = torch.zeros(3, 4, 2, 64, device=dev, dtype=E4M3)
    empty = torch.zeros(0, dtype=torch.int32, device=dev)
    indptr = torch.zeros(1, dtype=torch.int32, device=dev)
    with using(backend):
        outs = fi_rope.rope_quantize_fp8(q, k, None, None, table, pos)
        q_r, _ = fi_rope.rope_quantize_fp8_append_paged_kv_cache(
            q, k, None, None, k, table, pos, (cache, cache.clone()), empty, indptr, empty, empty,
            page_size=4,
        )  # fmt: skip
    assert outs[0].shape == (0, 4, 64) and q_r.shape == (0, 4, 64) and not cache.float().any()

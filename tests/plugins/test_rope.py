"""sgljit-rope: apply_rope, apply_rope_with_kv_cache and qknorm_rope on every backend, beyond the
conformance suite (tests/plugins/test_conformance.py: the ops' declared cases, bad inputs generated
from their specs, torch.compile and CUDA graphs).

The oracle is written here from the formula in float64 (not from another library). Backends:
"reference" everywhere, "sycl" on the SYCL CPU device (CPU tensors), "cuda" on a GPU. Here: the
public functions (flattened [T, H * D] views, head_dim=, rotary_dim=, index checks), head counts
that are not a multiple of a work item's, many tokens, partial rotary leaving the other dims
bit-exact, out-of-range indices, caches as views into a bigger buffer, misaligned views (narrower
vectors), cos/sin caches in q's dtype, q without k, k rotated in place by the KV variant, and the
CUDA modules compiled for sm_90a.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import sgljit

from .common import BACKENDS, HAS_CUDA

ops = pytest.importorskip("sgljit_rope.ops")


def device_of(backend: str) -> str:
    return "cuda" if backend == "cuda" else "cpu"


def using(backend: str):
    return sgljit.use_backend("sycl") if backend == "sycl" else contextlib.nullcontext()


def tol(dtype: torch.dtype) -> dict:
    return {
        torch.float32: dict(atol=1e-5, rtol=1e-5),
        torch.float16: dict(atol=2e-3, rtol=2e-3),
        torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
    }[dtype]


def make_cache(
    max_pos: int, rot: int, device, base: float = 10000.0, dtype=torch.float32
) -> torch.Tensor:
    """A real rope cache (cos | sin of pos * theta_i), [max_pos, rot] (fp32 by default)."""
    inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat((ang.cos(), ang.sin()), dim=-1).to(device, dtype)


def oracle(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, neox: bool):
    """float64 rope of x [T, H, D] from the definition; out-of-range positions: unrotated."""
    xr = x.detach().double().cpu()
    rot, half = cache.shape[1], cache.shape[1] // 2
    pos = positions.detach().cpu().long()
    valid = (pos >= 0) & (pos < cache.shape[0])
    rows = cache.detach().double().cpu()[pos.clamp(0, cache.shape[0] - 1)]
    c, s = rows[:, None, :half], rows[:, None, half:]  # theta_i for pair i
    if neox:
        i1 = torch.arange(half)
        i2 = i1 + half
    else:
        i1 = torch.arange(0, rot, 2)
        i2 = i1 + 1
    x1, x2 = xr[..., i1], xr[..., i2]
    y = xr.clone()
    y[..., i1] = x1 * c - x2 * s
    y[..., i2] = x2 * c + x1 * s
    return torch.where(valid[:, None, None], y, xr)


def assert_close(actual, expected, dtype):
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), **tol(dtype))


# (dtype, head_dim, rotary_dim, is_neox, index dtype): CUDA compiles one module per combination.
ROPE_CASES = [
    (torch.bfloat16, 128, 128, True, torch.int64),
    (torch.bfloat16, 128, 128, False, torch.int64),
    (torch.float16, 128, 128, True, torch.int32),
    (torch.float32, 64, 64, False, torch.int64),
    (torch.bfloat16, 128, 64, True, torch.int64),  # partial rotary
    (torch.float16, 80, 80, False, torch.int32),
    (torch.bfloat16, 512, 512, True, torch.int64),
]
KV_CASES = [
    (torch.bfloat16, 128, 128, True, torch.int64, torch.int64),
    (torch.float16, 128, 64, False, torch.int32, torch.int32),  # partial rotary
    (torch.float32, 96, 96, True, torch.int64, torch.int32),
]


def case_id(c):
    return "-".join(str(v).removeprefix("torch.") for v in c)


def tokens_for(backend):
    return (1, 7, 4109) if backend == "cuda" else (1, 7, 33)


# --------------------------------------------------------------------------------------------
# apply_rope


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ROPE_CASES, ids=case_id)
def test_apply_rope_numerics(backend, case):
    dtype, D, rot, neox, idx = case
    dev = device_of(backend)
    torch.manual_seed(0)
    Hq, Hk, max_pos = 6, 3, 5000  # head counts not multiples of the chunk size
    cache = make_cache(max_pos, rot, dev)
    for T in tokens_for(backend):
        q = torch.randn(T, Hq, D, device=dev).to(dtype)
        k = torch.randn(T, Hk, D, device=dev).to(dtype)
        pos = torch.randint(0, max_pos, (T,), device=dev, dtype=idx)
        want_q, want_k = oracle(q, cache, pos, neox), oracle(k, cache, pos, neox)
        q0, k0 = q.clone(), k.clone()
        with using(backend):
            out = sgljit.ops.apply_rope(q, k, cache, pos, is_neox=neox)
        assert out is None
        assert_close(q, want_q, dtype)
        assert_close(k, want_k, dtype)
        # partial rotary: the rest is untouched, bit for bit
        assert torch.equal(q[..., rot:], q0[..., rot:]) and torch.equal(k[..., rot:], k0[..., rot:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_rope_strided_qkv_views(backend):
    """q and k as flattened and 3-D views into a padded qkv buffer; v and padding untouched."""
    dev = device_of(backend)
    torch.manual_seed(1)
    dtype, D, Hq, Hk, T, max_pos = torch.bfloat16, 128, 8, 2, 37, 300
    width = (Hq + 2 * Hk) * D + 64  # padded rows
    cache = make_cache(max_pos, D, dev)
    for flat in (True, False):
        qkv = torch.randn(T, width, device=dev).to(dtype)
        before = qkv.clone()
        q = qkv[:, : Hq * D]
        k = qkv[:, Hq * D : (Hq + Hk) * D]
        if not flat:
            q, k = q.view(T, Hq, D), k.view(T, Hk, D)
        pos = torch.randint(0, max_pos, (T,), device=dev)
        want_q = oracle(before[:, : Hq * D].view(T, Hq, D), cache, pos, True)
        want_k = oracle(before[:, Hq * D : (Hq + Hk) * D].view(T, Hk, D), cache, pos, True)
        with using(backend):
            sgljit.ops.apply_rope(q, k, cache, pos, head_dim=D if flat else None)
        assert_close(qkv[:, : Hq * D].view(T, Hq, D), want_q, dtype)
        assert_close(qkv[:, Hq * D : (Hq + Hk) * D].view(T, Hk, D), want_k, dtype)
        assert torch.equal(qkv[:, (Hq + Hk) * D :], before[:, (Hq + Hk) * D :])


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_rope_head_stride_and_flat_head_dim(backend):
    """Heads with a stride larger than D (q[:, :, :D] of a wider tensor); flattened input with
    head_dim != rotary_dim given explicitly."""
    dev = device_of(backend)
    torch.manual_seed(2)
    T, H, D, rot = 9, 4, 64, 32
    cache = make_cache(100, rot, dev)
    pos = torch.randint(0, 100, (T,), device=dev)
    big = torch.randn(T, H, D + 16, device=dev)
    q = big[:, :, :D]
    k = torch.randn(T, 2 * D, device=dev)  # flattened [T, 2 * 64]
    want_q = oracle(q, cache, pos, False)
    want_k = oracle(k.view(T, 2, D), cache, pos, False)
    with using(backend):
        sgljit.ops.apply_rope(q, k, cache, pos, is_neox=False, head_dim=D)
    assert_close(q, want_q, torch.float32)
    assert_close(k.view(T, 2, D), want_k, torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_positions_leave_tokens_unrotated(backend):
    dev = device_of(backend)
    torch.manual_seed(3)
    T, D, max_pos = 8, 64, 50
    cache = make_cache(max_pos, D, dev)
    q = torch.randn(T, 3, D, device=dev)
    k = torch.randn(T, 1, D, device=dev)
    pos = torch.randint(0, max_pos, (T,), device=dev)
    pos[1], pos[4], pos[6] = max_pos, -1, 1 << 40
    q0, k0 = q.clone(), k.clone()
    with using(backend):
        sgljit.ops.apply_rope(q, k, cache, pos)
    assert torch.equal(q[[1, 4, 6]], q0[[1, 4, 6]]) and torch.equal(k[[1, 4, 6]], k0[[1, 4, 6]])
    assert_close(q, oracle(q0, cache, pos, True), torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_indices_raises_naming_first_bad(backend, monkeypatch):
    dev = device_of(backend)
    cache = make_cache(10, 64, dev)
    q, k = torch.randn(5, 2, 64, device=dev), torch.randn(5, 1, 64, device=dev)
    pos = torch.tensor([0, 3, 12, -1, 2], device=dev)
    monkeypatch.setattr(ops, "_CHECK_INDICES", True)  # SGLJIT_CHECK_INDICES=1 at import
    with using(backend), pytest.raises(IndexError, match=r"positions\[2\] = 12"):
        sgljit.ops.apply_rope(q, k, cache, pos)
    v = torch.randn(5, 1, 64, device=dev)
    kc, vc = torch.zeros(4, 1, 64, device=dev), torch.zeros(4, 1, 64, device=dev)
    loc = torch.tensor([0, 1, 2, 3, 4], device=dev)
    with using(backend), pytest.raises(IndexError, match=r"out_loc\[4\] = 4"):
        sgljit.ops.apply_rope_with_kv_cache(q, k, v, kc, vc, cache, pos.clamp(0, 9), loc)
    # the arguments are checked first: an index check cannot hide what is wrong with them
    bad_arguments = [
        (r"^positions: expected 1-D", lambda: sgljit.ops.apply_rope(q, k, cache, pos.view(5, 1))),
        (r"^cos_sin_cache: expected 2-D", lambda: sgljit.ops.apply_rope(q, k, cache[0], pos)),
        (
            r"^positions: dtype expected one of \{int32, int64\}",
            lambda: sgljit.ops.apply_rope(q, k, cache, pos.clamp(0, 9).to(torch.uint8)),
        ),
        (
            r"^out_loc: dtype expected one of \{int32, int64\}",
            lambda: sgljit.ops.apply_rope_with_kv_cache(
                q, k, v, kc, vc, cache, pos.clamp(0, 9), loc.float()
            ),
        ),
    ]
    for message, call in bad_arguments:
        with using(backend), pytest.raises(ValueError, match=message):
            call()
    monkeypatch.setattr(ops, "_CHECK_INDICES", False)  # unchecked: the bad ones are skipped
    with using(backend):
        sgljit.ops.apply_rope(q, k, cache, pos)


def test_check_indices_is_read_at_import():
    from tests.conftest import run_python

    code = "from sgljit_rope import ops; print(ops._CHECK_INDICES)"
    for value, expected in (("1", "True"), ("0", "False"), ("", "False")):
        result = run_python(code, env={"SGLJIT_CHECK_INDICES": value})
        assert result.returncode == 0, result.stderr
        assert result.stdout.split()[-1] == expected


# --------------------------------------------------------------------------------------------
# apply_rope_with_kv_cache


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", KV_CASES, ids=case_id)
def test_apply_rope_with_kv_cache_numerics(backend, case):
    dtype, D, rot, neox, idx, loc_dtype = case
    dev = device_of(backend)
    torch.manual_seed(4)
    Hq, Hk, max_pos = 5, 3, 3000
    cache = make_cache(max_pos, rot, dev)
    for T in tokens_for(backend):
        slots = 2 * T + 3
        q = torch.randn(T, Hq, D, device=dev).to(dtype)
        k = torch.randn(T, Hk, D, device=dev).to(dtype)
        v = torch.randn(T, Hk, D, device=dev).to(dtype)
        pos = torch.randint(0, max_pos, (T,), device=dev, dtype=idx)
        loc = torch.randperm(slots, device=dev)[:T].to(loc_dtype)
        kc = torch.full((slots, Hk, D), float("nan"), device=dev, dtype=dtype)  # poisoned
        vc = torch.full_like(kc, float("nan"))
        k0, v0 = k.clone(), v.clone()
        want_q, want_k = oracle(q, cache, pos, neox), oracle(k, cache, pos, neox)
        with using(backend):
            sgljit.ops.apply_rope_with_kv_cache(q, k, v, kc, vc, cache, pos, loc, is_neox=neox)
        assert_close(q, want_q, dtype)
        lo = loc.long()
        assert_close(kc[lo], want_k, dtype)
        assert torch.equal(vc[lo], v0)
        assert torch.equal(k, k0) and torch.equal(v, v0)  # k and v are not modified
        untouched = torch.ones(slots, dtype=torch.bool, device=dev)
        untouched[lo] = False
        assert kc[untouched].isnan().all() and vc[untouched].isnan().all()
        assert not kc[lo].isnan().any() and not vc[lo].isnan().any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_out_of_range_and_strided(backend):
    """Caches as strided views (one layer of a [slots, layers, Hk, D] buffer); flattened q/k/v
    views into a qkv buffer; a bad out_loc stores nothing; a bad position stores k unrotated."""
    dev = device_of(backend)
    torch.manual_seed(5)
    dtype, T, Hq, Hk, D, slots, max_pos = torch.bfloat16, 11, 4, 2, 128, 40, 64
    cache = make_cache(max_pos, D, dev)
    qkv = torch.randn(T, (Hq + 2 * Hk) * D, device=dev).to(dtype)
    q = qkv[:, : Hq * D]
    k = qkv[:, Hq * D : (Hq + Hk) * D]
    v = qkv[:, (Hq + Hk) * D :]
    buf = torch.full((slots, 3, 2, Hk, D), float("nan"), device=dev, dtype=dtype)
    kc, vc = buf[:, 1, 0], buf[:, 1, 1]
    pos = torch.randint(0, max_pos, (T,), device=dev)
    loc = torch.randperm(slots, device=dev)[:T]
    pos[3] = max_pos + 5
    loc[5], loc[8] = slots, -2
    k3, v3 = k.view(T, Hk, D).clone(), v.view(T, Hk, D).clone()
    want_q = oracle(q.view(T, Hq, D), cache, pos, True)
    want_k = oracle(k3, cache, pos, True)
    with using(backend):
        sgljit.ops.apply_rope_with_kv_cache(q, k, v, kc, vc, cache, pos, loc)
    assert_close(q.view(T, Hq, D), want_q, dtype)
    ok = (loc >= 0) & (loc < slots)
    assert_close(kc[loc[ok]], want_k[ok.cpu()], dtype)
    assert torch.equal(kc[loc[3]], k3[3])  # bad position: stored unrotated
    assert torch.equal(vc[loc[ok]], v3[ok])
    written = torch.zeros(slots, dtype=torch.bool, device=dev)
    written[loc[ok]] = True
    assert buf[:, 1][~written].isnan().all()
    others = torch.ones(3, dtype=torch.bool)
    others[1] = False
    assert buf[:, others.to(dev)].isnan().all()  # other layers untouched


# --------------------------------------------------------------------------------------------
# The other libraries' semantics: a cos/sin cache in q's dtype (vLLM), q without k (vLLM's and
# sglang's rotary_embedding with key=None), k rotated in place by the KV variant (sglang's and
# FlashInfer's fused rope + store)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "case",
    [
        (torch.bfloat16, 128, 128, True, torch.int64),
        (torch.float16, 128, 64, False, torch.int32),  # partial rotary, whole pairs per vector
        (torch.bfloat16, 80, 80, True, torch.int64),  # 2-element cache vectors
    ],
    ids=case_id,
)
def test_cache_in_q_dtype(backend, case):
    dtype, D, rot, neox, idx = case
    dev = device_of(backend)
    torch.manual_seed(9)
    Hq, Hk, max_pos, T = 6, 3, 4000, 37
    cache = make_cache(max_pos, rot, dev, dtype=dtype)  # the oracle reads the same rounded values
    q = torch.randn(T, Hq, D, device=dev).to(dtype)
    k = torch.randn(T, Hk, D, device=dev).to(dtype)
    pos = torch.randint(0, max_pos, (T,), device=dev, dtype=idx)
    want_q, want_k = oracle(q, cache, pos, neox), oracle(k, cache, pos, neox)
    v = torch.randn(T, Hk, D, device=dev).to(dtype)
    kc = torch.full((T + 5, Hk, D), float("nan"), device=dev, dtype=dtype)
    vc = torch.full_like(kc, float("nan"))
    loc = torch.randperm(T + 5, device=dev)[:T]
    q2, k2 = q.clone(), k.clone()
    with using(backend):
        sgljit.ops.apply_rope(q, k, cache, pos, is_neox=neox)
        sgljit.ops.apply_rope_with_kv_cache(q2, k2, v, kc, vc, cache, pos, loc, is_neox=neox)
    assert_close(q, want_q, dtype)
    assert_close(k, want_k, dtype)
    assert_close(q2, want_q, dtype)
    assert_close(kc[loc], want_k, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cache_of_another_dtype_is_refused(backend):
    dev = device_of(backend)
    q, k = (
        torch.randn(4, 2, 64, device=dev).bfloat16(),
        torch.randn(4, 1, 64, device=dev).bfloat16(),
    )
    cache = make_cache(16, 64, dev, dtype=torch.float16)
    with (
        using(backend),
        pytest.raises(
            ValueError,
            match=r"^cos_sin_cache: dtype expected bfloat16 \(same as the tensors before it\) or "
            r"one of \{float32\}, got float16",
        ),
    ):
        sgljit.ops.apply_rope(q, k, cache, torch.arange(4, device=dev))


@pytest.mark.parametrize("backend", BACKENDS)
def test_q_without_k(backend):
    """k=None: q alone, 3-D or flattened (then head_dim is needed); partial rotary."""
    dev = device_of(backend)
    torch.manual_seed(10)
    T, H, D, rot, max_pos = 11, 5, 128, 64, 200
    cache = make_cache(max_pos, rot, dev)
    pos = torch.randint(0, max_pos, (T,), device=dev)
    for flat in (False, True):
        q = torch.randn(T, H, D, device=dev).bfloat16()
        want = oracle(q, cache, pos, False)
        with using(backend):
            if flat:
                sgljit.ops.apply_rope(q.view(T, H * D), None, cache, pos, is_neox=False, head_dim=D)
            else:
                sgljit.ops.apply_rope(q, None, cache, pos, is_neox=False)
        assert_close(q, want, torch.bfloat16)
    with using(backend), pytest.raises(ValueError, match="head_dim="):
        sgljit.ops.apply_rope(q.view(T, H * D), None, cache, pos)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", KV_CASES, ids=case_id)
def test_kv_cache_rotating_k_in_place(backend, case):
    """rotate_k_inplace=True: k rotated in place as well as stored; an out-of-range out_loc still
    rotates its k, an out-of-range position leaves it (and stores it unrotated)."""
    dtype, D, rot, neox, idx, loc_dtype = case
    dev = device_of(backend)
    torch.manual_seed(11)
    T, Hq, Hk, max_pos = 9, 5, 3, 3000
    slots = 2 * T + 3
    cache = make_cache(max_pos, rot, dev)
    qkv = torch.randn(T, (Hq + 2 * Hk) * D, device=dev).to(dtype)  # k and v as views
    q = qkv[:, : Hq * D].view(T, Hq, D)
    k = qkv[:, Hq * D : (Hq + Hk) * D].view(T, Hk, D)
    v = qkv[:, (Hq + Hk) * D :].view(T, Hk, D)
    pos = torch.randint(0, max_pos, (T,), device=dev, dtype=idx)
    loc = torch.randperm(slots, device=dev)[:T].to(loc_dtype)
    pos[2] = max_pos + 1
    loc[4] = slots
    kc = torch.full((slots, Hk, D), float("nan"), device=dev, dtype=dtype)
    vc = torch.full_like(kc, float("nan"))
    k0, v0 = k.clone(), v.clone()
    want_q, want_k = oracle(q, cache, pos, neox), oracle(k, cache, pos, neox)
    with using(backend):
        sgljit.ops.apply_rope_with_kv_cache(
            q, k, v, kc, vc, cache, pos, loc, is_neox=neox, rotate_k_inplace=True
        )
    assert_close(q, want_q, dtype)
    assert_close(k, want_k, dtype)
    assert torch.equal(k[2], k0[2]) and torch.equal(k[..., rot:], k0[..., rot:])
    assert torch.equal(v, v0)
    ok = torch.ones(T, dtype=torch.bool, device=dev)
    ok[4] = False
    lo = loc[ok].long()
    assert_close(kc[lo], want_k[ok.cpu()], dtype)
    assert torch.equal(vc[lo], v0[ok])
    untouched = torch.ones(slots, dtype=torch.bool, device=dev)
    untouched[lo] = False
    assert kc[untouched].isnan().all() and vc[untouched].isnan().all()
    with using(backend), pytest.raises(TypeError, match=r"^rotate_k_inplace: expected bool"):
        sgljit.ops.apply_rope_with_kv_cache(q, k, v, kc, vc, cache, pos, loc, rotate_k_inplace=1)


# --------------------------------------------------------------------------------------------
# Bad inputs the public functions and the ops' own rules add to what the conformance suite
# generates from the specs (shapes, dtypes, strides, devices, overlap, grad)


def _args(dev="cpu", T=4, D=64):
    return (
        torch.randn(T, 2, D, device=dev),
        torch.randn(T, 1, D, device=dev),
        make_cache(16, D, dev),
        torch.arange(T, device=dev),
    )


# cos_sin_cache shapes both apply_rope and qknorm_rope refuse (head_dim 64 in their _args)
_CACHE_SHAPE_ERRORS = [
    (
        lambda a: {**a, "cos_sin_cache": make_cache(16, 66, a["q"].device)},
        ValueError,
        r"^cos_sin_cache: its width 66 \(rotary_dim\) exceeds head_dim 64",
    ),
    (
        lambda a: {**a, "cos_sin_cache": torch.zeros(16, 63, device=a["q"].device)},
        ValueError,
        r"^cos_sin_cache: its width 63 \(rotary_dim\) must be a positive even number",
    ),
    (
        lambda a: {**a, "cos_sin_cache": a["cos_sin_cache"][:0]},
        ValueError,
        "^cos_sin_cache: has no rows",
    ),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda a: {**a, "rotary_dim": 63}, ValueError, "^rotary_dim: 63 does not match"),
        (lambda a: {**a, "rotary_dim": 32}, ValueError, "^rotary_dim: 32 does not match"),
        (lambda a: {**a, "rotary_dim": 64.0}, TypeError, "^rotary_dim: expected an int"),
        *_CACHE_SHAPE_ERRORS,
        (
            lambda a: {**a, "q": a["q"].flatten(1)[:, :100], "head_dim": 64},
            ValueError,
            "^q: width 100 of a flattened",
        ),
        (
            lambda a: {**a, "head_dim": 32},
            ValueError,
            "^q: head size 64 does not match head_dim 32",
        ),
        (lambda a: {**a, "head_dim": 0}, ValueError, "^head_dim: expected a positive int"),
        (lambda a: {**a, "q": a["q"][None]}, ValueError, r"^q: expected \[T, H, D\] or"),
        # flattened q and k: the head size cannot be read (with partial rotary, heads as wide as
        # the cache would be rotated: silently wrong)
        (lambda a: {**a, "q": a["q"].flatten(1), "k": a["k"].flatten(1)}, ValueError, "head_dim="),
        (lambda a: {**a, "q": [1, 2]}, TypeError, "^q: expected a torch.Tensor"),
        (lambda a: {**a, "positions": [0, 1, 2, 3]}, TypeError, "^positions: expected a torch"),
        (lambda a: {**a, "is_neox": 1}, TypeError, "^is_neox: expected bool"),
    ],
)
def test_bad_inputs_apply_rope(backend, mutate, exc, match):
    q, k, cache, pos = _args(device_of(backend))
    a = mutate({"q": q, "k": k, "cos_sin_cache": cache, "positions": pos})
    with using(backend), pytest.raises(exc, match=match):
        sgljit.ops.apply_rope(**a)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda a: {**a, "v": None}, TypeError, "^v: expected a torch.Tensor"),
        (lambda a: {**a, "out_loc": [0, 1, 2, 3]}, TypeError, "^out_loc: expected a torch"),
        (
            lambda a: {
                **a,
                "q": a["q"].flatten(1),
                "k": a["k"].flatten(1),
                "k_cache": a["k_cache"].flatten(1),
            },
            ValueError,
            "^q: q, k and k_cache are all flattened",
        ),
        (lambda a: {**a, "v": a["v"].flatten(1)[:, :48]}, ValueError, "^v: width 48 of a flat"),
        (
            lambda a: {**a, "cos_sin_cache": make_cache(16, 128, a["q"].device)},
            ValueError,
            r"^cos_sin_cache: its width 128 \(rotary_dim\) exceeds head_dim 64",
        ),
    ],
)
def test_bad_inputs_kv_cache(backend, mutate, exc, match):
    dev = device_of(backend)
    q, k, cache, pos = _args(dev)
    a = {
        "q": q,
        "k": k,
        "v": torch.randn_like(k),
        "k_cache": torch.zeros(8, 1, 64, device=dev),
        "v_cache": torch.zeros(8, 1, 64, device=dev),
        "cos_sin_cache": cache,
        "positions": pos,
        "out_loc": torch.arange(4, device=dev),
    }
    with using(backend), pytest.raises(exc, match=match):
        sgljit.ops.apply_rope_with_kv_cache(**mutate(a))


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_tokens_is_a_no_op(backend):
    dev = device_of(backend)
    q, k, cache, _ = _args(dev, T=0)
    pos = torch.zeros(0, dtype=torch.int64, device=dev)
    kc = torch.full((8, 1, 64), float("nan"), device=dev)
    with using(backend):
        sgljit.ops.apply_rope(q, k, cache, pos)
        sgljit.ops.apply_rope_with_kv_cache(q, k, k, kc, kc.clone(), cache, pos, pos)
    assert kc.isnan().all()


def test_custom_op_traces_on_cpu():
    """torch.compile(fullgraph=True) through the custom op (reference backend, no inductor)."""
    q, k, cache, pos = _args(T=5)
    want_q, want_k = oracle(q, cache, pos, True), oracle(k, cache, pos, True)

    def f(q, k):
        sgljit.ops.apply_rope(q, k, cache, pos)
        return q * 1, k * 1

    out_q, out_k = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k)
    assert_close(out_q, want_q, torch.float32)
    assert_close(out_k, want_k, torch.float32)


# --------------------------------------------------------------------------------------------
# CUDA: compile in CI (no GPU needed), then GPU-only behaviour


def _key_of(op_name: str, args: tuple) -> dict:
    """The CUDA module an argument list needs, as a ``family.prebuild`` entry (dtypes by name)."""
    cuda = ops.family.ops[op_name].cuda
    return {"op": op_name, **{k: _name(v) for k, v in cuda.params_of(cuda.key(*args)).items()}}


def _name(value):
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value


def _cuda_specs() -> list[dict]:
    """The main specializations of the bench and the GPU tests, one per module, each a distinct
    code path: bf16 neox and gptj (whole pairs per vector), fp16 with int32 positions at head size
    80, fp32 (4-element vectors), an odd head size (1-element vectors), caches in q's dtype (bf16
    neox, fp16 gptj), vLLM's rounding (round_products); the KV variant full and partial rotary,
    and rotating k in place with a bf16 cache."""

    def rope(dtype, D, rot, neox, idx, Hq=6, Hk=3, cache=torch.float32, round_products=False):
        q, k = torch.empty(3, Hq, D, dtype=dtype), torch.empty(3, Hk, D, dtype=dtype)
        table = make_cache(8, rot, "cpu", dtype=cache)
        args = (q, k, table, torch.zeros(3, dtype=idx), neox, round_products)
        return _key_of("apply_rope", args)

    def kv(dtype, D, rot, neox, idx, loc, op="apply_rope_with_kv_cache", cache=torch.float32):
        q, k = torch.empty(3, 5, D, dtype=dtype), torch.empty(3, 3, D, dtype=dtype)
        kc = torch.empty(16, 3, D, dtype=dtype)
        pos, out_loc = torch.zeros(3, dtype=idx), torch.zeros(3, dtype=loc)
        args = (q, k, k, kc, kc, make_cache(8, rot, "cpu", dtype=cache), pos, out_loc, neox)
        return _key_of(op, args)

    return [
        rope(torch.bfloat16, 128, 128, True, torch.int64),
        rope(torch.bfloat16, 128, 128, False, torch.int64),
        rope(torch.float16, 80, 80, False, torch.int32),
        rope(torch.float32, 64, 64, False, torch.int64),
        rope(torch.float32, 65, 32, False, torch.int64),
        rope(torch.bfloat16, 128, 128, True, torch.int64, cache=torch.bfloat16),
        rope(torch.float16, 128, 64, False, torch.int32, cache=torch.float16),
        rope(
            torch.bfloat16, 128, 128, True, torch.int64, cache=torch.bfloat16, round_products=True
        ),
        kv(torch.bfloat16, 128, 128, True, torch.int64, torch.int64),
        kv(torch.float16, 128, 64, False, torch.int32, torch.int32),
        kv(
            torch.bfloat16,
            128,
            128,
            True,
            torch.int64,
            torch.int64,
            op="apply_rope_with_kv_cache_rotate_k",
            cache=torch.bfloat16,
        ),
    ]


def test_cuda_specs_are_the_fast_paths():
    specs = _cuda_specs()
    assert [s["rotary_dim"] for s in specs] == [128, 128, 80, 64, 32, 128, 64, 128, 128, 64, 128]
    assert "vec" not in specs[0]  # chosen per call in C++: pointers are not part of the key
    assert specs[0] in ops.family.prebuild_specs("cuda")  # the bench's module is prebuilt


def test_cuda_compiles(tmp_path, monkeypatch):
    from sgljit.toolchain import find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    if HAS_CUDA:
        pytest.skip("the GPU tests build these modules for the GPU's own arch")
    monkeypatch.setenv("SGLJIT_CUDA_ARCH", "9.0a")
    monkeypatch.setenv("SGLJIT_CACHE_DIR", str(tmp_path / "cache"))
    sgljit.clear_module_cache()
    try:
        for spec in _cuda_specs():
            assert getattr(ops.family.prebuild("cuda", **spec), spec["op"]) is not None
    finally:
        sgljit.clear_module_cache()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_misaligned_views():
    """Views at 8- and 4-byte offsets take the module's 1-element vectors (16-byte ones elsewhere)."""
    torch.manual_seed(6)
    T, Hq, Hk, D = 33, 4, 2, 128
    cache = make_cache(500, D, "cuda")
    pos = torch.randint(0, 500, (T,), device="cuda")
    for shift in (4, 2):  # elements: 8-byte and 4-byte aligned starts
        buf = torch.randn(T, (Hq + Hk) * D + shift, device="cuda").to(torch.bfloat16)
        before = buf.clone()
        q = buf[:, shift : shift + Hq * D]
        k = buf[:, shift + Hq * D :]
        sgljit.ops.apply_rope(q, k, cache, pos, head_dim=D)
        assert_close(
            q.view(T, Hq, D),
            oracle(before[:, shift : shift + Hq * D].view(T, Hq, D), cache, pos, True),
            torch.bfloat16,
        )
        assert_close(
            k.view(T, Hk, D),
            oracle(before[:, shift + Hq * D :].view(T, Hk, D), cache, pos, True),
            torch.bfloat16,
        )
        assert torch.equal(buf[:, :shift], before[:, :shift])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_large_positions_and_many_tokens():
    """int32 and int64 positions near max_pos on the bench shape (32/8 heads x 128), 65537 tokens."""
    torch.manual_seed(7)
    T, max_pos = 65537, 131072
    cache = make_cache(max_pos, 128, "cuda")
    q = torch.randn(T, 32, 128, device="cuda").to(torch.bfloat16)
    k = torch.randn(T, 8, 128, device="cuda").to(torch.bfloat16)
    pos = torch.randint(max_pos - 1000, max_pos, (T,), device="cuda")
    want_q = ops.reference.rope_torch(q, k, cache, pos, True)
    sgljit.ops.apply_rope(q, k, cache, pos)
    # reference (fp32 math, one rounding) vs kernel: at most one bf16 ulp apart
    torch.testing.assert_close(q.float(), want_q[0].float(), atol=1.6e-2, rtol=1.6e-2)
    torch.testing.assert_close(k.float(), want_q[1].float(), atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_torch_compile_fullgraph():
    torch.manual_seed(8)
    T, Hq, Hk, D = 19, 8, 2, 128
    cache = make_cache(1000, D, "cuda")
    pos = torch.randint(0, 1000, (T,), device="cuda")
    qkv = torch.randn(T, (Hq + 2 * Hk) * D, device="cuda").to(torch.bfloat16)
    kc = torch.full((64, Hk, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    vc = kc.clone()
    loc = torch.randperm(64, device="cuda")[:T]

    def f(qkv, kc, vc):
        q = qkv[:, : Hq * D]
        k = qkv[:, Hq * D : (Hq + Hk) * D]
        v = qkv[:, (Hq + Hk) * D :]
        sgljit.ops.apply_rope(q, k, cache, pos, head_dim=D)
        q2 = q.view(T, Hq, D) * 2
        sgljit.ops.apply_rope_with_kv_cache(q2, k, v, kc, vc, cache, pos, loc)
        return q2 + 0

    eager = (qkv.clone(), kc.clone(), vc.clone())
    want = f(*eager)
    got_args = (qkv.clone(), kc.clone(), vc.clone())
    got = torch.compile(f, fullgraph=True)(*got_args)
    torch.testing.assert_close(got, want)
    for a, b in zip(got_args, eager, strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)


def test_prebuild_specs():
    """The fleet grid: bf16/fp16, int64 indices (SYCL: 16-byte vectors); apply_rope both styles at
    rotary_dim 64/128/256, the KV variant neox at (head_dim, rotary_dim) (64, 64), (128, 128),
    (128, 64), (256, 256), (512, 64); SYCL one module (both kernels) per (head_dim, rotary_dim) and
    style. Each entry is the key a call with aligned tensors of its shape computes: the same values
    in the same order (the order names the module)."""
    rope_ops = ("apply_rope", "apply_rope_with_kv_cache")  # qknorm_rope: test_qknorm_rope_prebuild
    cuda = [s for s in ops.family.prebuild_specs("cuda") if s["op"] in rope_ops]
    sycl = [s for s in ops.family.prebuild_specs("sycl") if s["op"] in rope_ops]
    assert (len(cuda), len(sycl)) == (2 * 3 * 2 + 2 * 5, 2 * 5 * 2)
    assert all(s["ROPE_VEC"] == 8 for s in sycl)
    as_items = [list(s.items()) for s in cuda + sycl]
    heads = ((64, 64), (128, 128), (128, 64), (256, 256), (512, 64))
    for dtype in (torch.bfloat16, torch.float16):
        for head_dim, rot in heads:
            qk = torch.randn(3, 6, head_dim, dtype=dtype)
            q, k = qk[:, :4], qk[:, 4:]  # views into one buffer
            cache, pos = make_cache(4, rot, "cpu"), torch.zeros(3, dtype=torch.int64)
            kv = (q, k, k, k.clone(), k.clone(), cache, pos, pos)
            assert list(_key_of("apply_rope_with_kv_cache", (*kv, True)).items()) in as_items
            for neox in (True, False):
                rope = (
                    q[..., :rot].contiguous(),
                    k[..., :rot].contiguous(),
                    cache,
                    pos,
                    neox,
                    False,
                )
                assert list(_key_of("apply_rope", rope).items()) in as_items
                key = ops.family.ops["apply_rope_with_kv_cache"].sycl.key(*kv, neox)
                named = {"op": "apply_rope_with_kv_cache", **{k: _name(v) for k, v in key.items()}}
                assert list(named.items()) in as_items
                if head_dim == rot:
                    assert ops.family.ops["apply_rope"].sycl.key(*rope) == key
    with pytest.raises(ValueError, match="has no 'rocm' kernel"):
        ops.family.prebuild("rocm", op="apply_rope")


def test_ops_resolve_through_sgljit():
    assert sgljit.ops.apply_rope is ops.apply_rope
    assert sgljit.ops.apply_rope_with_kv_cache is ops.apply_rope_with_kv_cache
    assert {"apply_rope", "apply_rope_with_kv_cache"} <= set(ops.family.ops)
    for name in ops.family.ops:
        assert hasattr(torch.ops.sgljit, name)


# --------------------------------------------------------------------------------------------
# qknorm_rope: per-head RMSNorm of q and k, rounded to the dtype, then rope (the unfused chain)

# Twice each dtype's unit roundoff, an ulp at most (fp32: what its sums and rsqrt leave): the scale of
# an element's error bound.
UNIT = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-16}
EPS = 1e-6
QKR_CASES = [
    (torch.bfloat16, 128, 128, True, torch.int64),
    (torch.bfloat16, 128, 128, False, torch.int64),
    (torch.float16, 128, 64, True, torch.int32),  # partial rotary
    (torch.float32, 64, 64, False, torch.int64),
    (torch.bfloat16, 256, 256, True, torch.int32),
    (torch.float16, 64, 32, False, torch.int64),  # partial rotary, gptj
]


def qkv_views(T, Hq, Hk, D, dtype, dev, shift=0):
    """(buffer, q, k): q and k as [T, H, D] views into a fused qkv buffer with padded rows,
    ``shift`` elements in."""
    buf = torch.randn(T, (Hq + 2 * Hk) * D + 64, device=dev).to(dtype)
    rows = buf[:, shift:]
    return buf, rows[:, : Hq * D].view(T, Hq, D), rows[:, Hq * D : (Hq + Hk) * D].view(T, Hk, D)


def norm_weights(D, dtype, dev):
    """q_weight, k_weight around 1, as trained norms have them."""
    return (1 + 0.5 * torch.randn(2, D, device=dev)).to(dtype).unbind(0)


def pair_scale(y, rot, neox, valid):
    """|y_i| + |y_j| for an element i of a rotated pair (i, j) of y [T, H, D], |y_i| elsewhere: how
    much a rounding of y's elements can move element i of the rotated result."""
    D, half = y.shape[-1], rot // 2
    partner = torch.arange(D, device=y.device)
    if neox:
        partner[:half] += half
        partner[half:rot] -= half
    else:
        partner[:rot] ^= 1
    rotated = valid.view(-1, 1, 1) & (torch.arange(D, device=y.device) < rot)
    return y.abs() + torch.where(rotated, y.abs()[..., partner], 0)


def qknorm_oracle(x, w, cache, positions, neox):
    """float64 qknorm then rope of x [T, H, D], with no rounding in between: (result, scale), an
    element's error bound being unit * (scale + |result|) (:func:`pair_scale`)."""
    xd = x.detach().double().cpu()
    y = xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + EPS) * w.detach().double().cpu()
    pos = positions.detach().cpu().long()
    valid = (pos >= 0) & (pos < cache.shape[0])
    return oracle(y, cache, positions, neox), pair_scale(y, cache.shape[1], neox, valid)


def assert_within(actual, expected, scale, dtype):
    err = (actual.detach().double().cpu() - expected).abs()
    bound = UNIT[dtype] * (scale + expected.abs()) + 1e-6
    worst = float((err / bound).max())
    assert worst <= 1.0, f"error {worst:.3g}x its bound (max |diff| {float(err.max()):.3g})"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", QKR_CASES, ids=case_id)
def test_qknorm_rope_numerics(backend, case):
    """q and k as views into a qkv buffer, head counts not multiples of a work item's; v and the
    rows' padding stay bit-exact."""
    dtype, D, rot, neox, idx = case
    dev = device_of(backend)
    torch.manual_seed(10)
    Hq, Hk, max_pos = 5, 3, 5000
    cache = make_cache(max_pos, rot, dev)
    qw, kw = norm_weights(D, dtype, dev)
    for T in tokens_for(backend):
        buf, q, k = qkv_views(T, Hq, Hk, D, dtype, dev)
        before = buf.clone()
        pos = torch.randint(0, max_pos, (T,), device=dev, dtype=idx)
        want_q = qknorm_oracle(q, qw, cache, pos, neox)
        want_k = qknorm_oracle(k, kw, cache, pos, neox)
        with using(backend):
            out = sgljit.ops.qknorm_rope(q, k, qw, kw, cache, pos, eps=EPS, is_neox=neox)
        assert out is None
        assert_within(q, *want_q, dtype)
        assert_within(k, *want_k, dtype)
        assert torch.equal(buf[:, (Hq + Hk) * D :], before[:, (Hq + Hk) * D :])  # v, padding


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
def test_qknorm_rope_rounds_as_qknorm_then_apply_rope(backend, neox):
    """The fused op is sgljit's qknorm then apply_rope on the same backend: bit for bit but for the
    rare element whose normalized value the two kernels' fp32 sums round apart (then by at most an
    ulp of it); on the reference, which composes the two, exactly. Rounding once, after the
    rotation, would change about a third of the elements."""
    pytest.importorskip("sgljit_norm")
    dev = device_of(backend)
    torch.manual_seed(11)
    dtype, T, Hq, Hk, D = torch.bfloat16, 4109 if backend == "cuda" else 33, 8, 2, 128
    cache = make_cache(5000, D, dev)
    qw, kw = norm_weights(D, dtype, dev)
    pos = torch.randint(0, 5000, (T,), device=dev)
    fused, q, k = qkv_views(T, Hq, Hk, D, dtype, dev)
    chain = fused.clone()
    q2 = chain[:, : Hq * D].view(T, Hq, D)
    k2 = chain[:, Hq * D : (Hq + Hk) * D].view(T, Hk, D)
    scales = [qknorm_oracle(x, w, cache, pos, neox)[1] for x, w in ((q, qw), (k, kw))]
    with using(backend):
        sgljit.ops.qknorm_rope(q, k, qw, kw, cache, pos, eps=EPS, is_neox=neox)
        sgljit.ops.qknorm(q2, k2, qw, kw, EPS)
        sgljit.ops.apply_rope(q2, k2, cache, pos, is_neox=neox)
    same = (fused == chain).double().mean().item()
    assert same == 1.0 if backend == "reference" else same > 0.99, same
    for a, b, scale in ((q, q2, scales[0]), (k, k2, scales[1])):
        assert_within(a, b.double().cpu(), scale, dtype)  # an ulp of a normalized value


@pytest.mark.parametrize("backend", BACKENDS)
def test_qknorm_rope_flattened_views(backend):
    """[T, H * D] views: D read from the 3-D one of q and k, else from q_weight."""
    dev = device_of(backend)
    torch.manual_seed(12)
    dtype, T, Hq, Hk, D = torch.float16, 9, 4, 2, 64
    cache = make_cache(100, D, dev)
    qw, kw = norm_weights(D, dtype, dev)
    pos = torch.randint(0, 100, (T,), device=dev)
    for flat_q, flat_k in ((True, True), (True, False), (False, True)):
        _, q, k = qkv_views(T, Hq, Hk, D, dtype, dev)
        want_q = qknorm_oracle(q, qw, cache, pos, True)
        want_k = qknorm_oracle(k, kw, cache, pos, True)
        with using(backend):
            sgljit.ops.qknorm_rope(
                q.flatten(1) if flat_q else q, k.flatten(1) if flat_k else k, qw, kw, cache, pos
            )
        assert_within(q, *want_q, dtype)
        assert_within(k, *want_k, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_qknorm_rope_out_of_range_positions_normalize_only(backend):
    dev = device_of(backend)
    torch.manual_seed(13)
    T, D, max_pos = 8, 64, 50
    cache = make_cache(max_pos, D, dev)
    qw, kw = norm_weights(D, torch.float32, dev)
    q, k = torch.randn(T, 3, D, device=dev), torch.randn(T, 1, D, device=dev)
    pos = torch.randint(0, max_pos, (T,), device=dev)
    pos[1], pos[4], pos[6] = max_pos, -1, 1 << 40
    want_q = qknorm_oracle(q, qw, cache, pos, True)
    want_k = qknorm_oracle(k, kw, cache, pos, True)
    with using(backend):
        sgljit.ops.qknorm_rope(q, k, qw, kw, cache, pos)
    assert_within(q, *want_q, torch.float32)  # the oracle leaves bad positions' tokens unrotated
    assert_within(k, *want_k, torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_qknorm_rope_check_indices(backend, monkeypatch):
    dev = device_of(backend)
    q, k, qw, kw, cache, _ = _qkr_args(dev)
    pos = torch.tensor([0, 3, 20, -1], device=dev)
    monkeypatch.setattr(ops, "_CHECK_INDICES", True)
    with using(backend), pytest.raises(IndexError, match=r"positions\[2\] = 20"):
        sgljit.ops.qknorm_rope(q, k, qw, kw, cache, pos)


def _qkr_args(dev="cpu", T=4, D=64):
    qw, kw = norm_weights(D, torch.float32, dev)
    return (
        torch.randn(T, 2, D, device=dev),
        torch.randn(T, 1, D, device=dev),
        qw,
        kw,
        make_cache(16, D, dev),
        torch.arange(T, device=dev),
    )


def _qkr_head(D):
    """Arguments of head size D (a cache of width 64)."""

    def mutate(a):
        dev = a["q"].device
        q, k, qw, kw, _, _ = _qkr_args(dev, D=D)
        return {**a, "q": q, "k": k, "q_weight": qw, "k_weight": kw}

    return mutate


def _qkr_in(dtype):
    """Every floating-point argument in ``dtype``, the cos/sin cache too."""
    return lambda a: {
        n: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        for n, t in a.items()
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (_qkr_head(65), ValueError, "^q: head_dim 65 is not supported"),
        # a cache in q's dtype (apply_rope takes one): the qknorm_rope kernels read float32
        (
            _qkr_in(torch.bfloat16),
            ValueError,
            r"^cos_sin_cache: dtype expected one of \{float32\}, got bfloat16",
        ),
        (_qkr_head(2048), ValueError, "^q: head_dim 2048 is not supported"),
        *_CACHE_SHAPE_ERRORS,
        (
            lambda a: {**a, "q": a["q"].flatten(1)[:, :100]},
            ValueError,
            "^q: width 100 of a flattened",
        ),
        (
            lambda a: {
                **a,
                "q": a["q"].flatten(1),
                "k": a["k"].flatten(1),
                "q_weight": a["q_weight"][None],
            },
            ValueError,
            "^q_weight: q and k are flattened",
        ),
        (
            lambda a: {**a, "q_weight": a["q_weight"][:32]},
            ValueError,
            "^q_weight: dimension 0 expected 64",
        ),
        (lambda a: {**a, "eps": -1.0}, ValueError, "^eps: expected a value >= 0"),
        (lambda a: {**a, "is_neox": 1}, TypeError, "^is_neox: expected bool"),
        (lambda a: {**a, "q": [1, 2]}, TypeError, "^q: expected a torch.Tensor"),
        (lambda a: {**a, "q_weight": [1.0]}, TypeError, "^q_weight: expected a torch.Tensor"),
        (lambda a: {**a, "positions": [0, 1, 2, 3]}, TypeError, "^positions: expected a torch"),
    ],
)
def test_bad_inputs_qknorm_rope(backend, mutate, exc, match):
    q, k, qw, kw, cache, pos = _qkr_args(device_of(backend))
    a = {"q": q, "k": k, "q_weight": qw, "k_weight": kw, "cos_sin_cache": cache, "positions": pos}
    with using(backend), pytest.raises(exc, match=match):
        sgljit.ops.qknorm_rope(**mutate(a))


def test_qknorm_rope_vector_width():
    """SYCL keys: 16-byte vectors for aligned qkv views; narrower where a view starts 8, 4 or 2
    bytes in, where a weight is misaligned or the cache's rows are 8-byte aligned. (CUDA modules
    choose 16-byte or 1-element vectors in C++: the key has no width.)"""
    dtype, D = torch.bfloat16, 128
    w = torch.empty(D, dtype=dtype)
    cache, pos = make_cache(4, D, "cpu"), torch.zeros(3, dtype=torch.int64)

    def vec(q, k, qw=w, c=cache):
        return ops._sycl_qknorm_rope_key(q, k, qw, w, c, pos, EPS, True)["QKR_VEC"]

    for shift, want in ((0, 8), (4, 4), (2, 2), (1, 1)):
        _, q, k = qkv_views(3, 4, 2, D, dtype, "cpu", shift=shift)
        assert vec(q, k) == want, shift
    _, q, k = qkv_views(3, 4, 2, D, dtype, "cpu")
    assert vec(q, k, qw=torch.empty(D + 1, dtype=dtype)[1:]) == 1
    assert vec(q, k, c=torch.empty(4, D + 2)[:, 2:]) == 2  # 2 floats: 2-element vectors
    assert vec(q[:1], k[:1]) == 8  # one token: its stride does not count
    assert "vec" not in _key_of("qknorm_rope", (q, k, w, w, cache, pos, EPS, True))


def test_qknorm_rope_prebuild():
    """bf16/fp16 x head_dim 64/128/256, neox, full rotary, int64 positions, 16-byte vectors, CUDA
    and SYCL: each entry is the key a call with qkv views of its shape computes."""
    cuda = [s for s in ops.family.prebuild_specs("cuda") if s["op"] == "qknorm_rope"]
    sycl = [s for s in ops.family.prebuild_specs("sycl") if s["op"] == "qknorm_rope"]
    assert len(cuda) == len(sycl) == 6
    for dtype in (torch.bfloat16, torch.float16):
        for D in (64, 128, 256):
            _, q, k = qkv_views(3, 32, 8, D, dtype, "cpu")
            qw, kw = norm_weights(D, dtype, "cpu")
            args = (q, k, qw, kw, make_cache(4, D, "cpu"), torch.zeros(3, dtype=torch.int64))
            assert _key_of("qknorm_rope", (*args, EPS, True)) in cuda
            key = ops.family.ops["qknorm_rope"].sycl.key(*args, EPS, True)
            assert {"op": "qknorm_rope", **{n: _name(v) for n, v in key.items()}} in sycl


def test_qknorm_rope_cuda_compiles(tmp_path, monkeypatch):
    """The kernel's layouts for sm_90a: 16-byte neox heads (the prebuilt module), gptj with idle
    lanes (5 vector pairs), fp32 with two pairs a lane and a partial rotary."""
    from sgljit.toolchain import find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    if HAS_CUDA:
        pytest.skip("the GPU tests build these modules for the GPU's own arch")
    monkeypatch.setenv("SGLJIT_CUDA_ARCH", "9.0a")
    monkeypatch.setenv("SGLJIT_CACHE_DIR", str(tmp_path / "cache"))
    specs = []
    for dtype, D, rot, neox, idx in (
        (torch.bfloat16, 128, 128, True, torch.int64),
        (torch.float16, 80, 80, False, torch.int32),
        (torch.float32, 512, 256, True, torch.int64),
    ):
        _, q, k = qkv_views(3, 4, 2, D, dtype, "cpu")
        qw, kw = norm_weights(D, dtype, "cpu")
        args = (q, k, qw, kw, make_cache(4, rot, "cpu"), torch.zeros(3, dtype=idx), EPS, neox)
        specs.append(_key_of("qknorm_rope", args))
    sgljit.clear_module_cache()
    try:
        for spec in specs:
            spec = dict(spec)
            assert getattr(ops.family.prebuild("cuda", **spec), spec.pop("op")) is not None
    finally:
        sgljit.clear_module_cache()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("idx", [torch.int32, torch.int64])
def test_cuda_qknorm_rope_many_tokens(idx):
    """The bench shape (32/8 heads x 128 in a qkv buffer), 65537 tokens at positions near max_pos
    (plain stores: the heads do not fit in L2), against the torch reference on the GPU (fp32 math,
    the same roundings)."""
    torch.manual_seed(14)
    T, Hq, Hk, D, max_pos = 65537, 32, 8, 128, 131072
    cache = make_cache(max_pos, D, "cuda")
    qw, kw = norm_weights(D, torch.bfloat16, "cuda")
    buf, q, k = qkv_views(T, Hq, Hk, D, torch.bfloat16, "cuda")
    before = buf.clone()
    pos = torch.randint(max_pos - 1000, max_pos, (T,), device="cuda", dtype=idx)
    want = ops.reference.qknorm_rope_torch(q, k, qw, kw, cache, pos, EPS, True)
    valid = torch.ones(T, dtype=torch.bool, device="cuda")
    scales = [
        pair_scale(ops.reference._rms_norm(x, w, EPS).float(), D, True, valid)
        for x, w in ((q, qw), (k, kw))
    ]
    sgljit.ops.qknorm_rope(q, k, qw, kw, cache, pos)
    for got, expected, scale in ((q, want[0], scales[0]), (k, want[1], scales[1])):
        err = (got.float() - expected.float()).abs()
        assert bool((err <= UNIT[torch.bfloat16] * (scale + expected.float().abs()) + 1e-6).all())
        assert (got == expected).float().mean().item() > 0.99
    assert torch.equal(buf[:, (Hq + Hk) * D :], before[:, (Hq + Hk) * D :])

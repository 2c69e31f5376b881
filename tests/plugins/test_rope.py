"""sgljit-rope: apply_rope and apply_rope_with_kv_cache on every backend, beyond the conformance
suite (tests/plugins/test_conformance.py: the ops' declared cases, bad inputs generated from their
specs, torch.compile and CUDA graphs).

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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda a: {**a, "rotary_dim": 63}, ValueError, "^rotary_dim: 63 does not match"),
        (lambda a: {**a, "rotary_dim": 32}, ValueError, "^rotary_dim: 32 does not match"),
        (lambda a: {**a, "rotary_dim": 64.0}, TypeError, "^rotary_dim: expected an int"),
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
    neox, fp16 gptj); the KV variant full and partial rotary, and rotating k in place with a bf16
    cache."""

    def rope(dtype, D, rot, neox, idx, Hq=6, Hk=3, cache=torch.float32):
        q, k = torch.empty(3, Hq, D, dtype=dtype), torch.empty(3, Hk, D, dtype=dtype)
        table = make_cache(8, rot, "cpu", dtype=cache)
        return _key_of("apply_rope", (q, k, table, torch.zeros(3, dtype=idx), neox))

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
    assert [s["vec"] for s in specs] == [8, 8, 8, 4, 1, 8, 8, 8, 8, 8]
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
def test_cuda_misaligned_views_use_narrower_vectors():
    torch.manual_seed(6)
    T, Hq, Hk, D = 33, 4, 2, 128
    cache = make_cache(500, D, "cuda")
    pos = torch.randint(0, 500, (T,), device="cuda")
    for shift in (4, 2):  # elements: 8-byte and 4-byte aligned starts
        buf = torch.randn(T, (Hq + Hk) * D + shift, device="cuda").to(torch.bfloat16)
        before = buf.clone()
        q = buf[:, shift : shift + Hq * D]
        k = buf[:, shift + Hq * D :]
        assert ops._pick_vec((q.view(T, Hq, D), k.view(T, Hk, D)), cache, 500, D, D) == shift
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
    """The fleet grid: bf16/fp16, int64 indices, 16-byte vectors; apply_rope both styles at
    rotary_dim 64/128/256, the KV variant neox at (head_dim, rotary_dim) (64, 64), (128, 128),
    (128, 64), (256, 256), (512, 64); SYCL one module (both kernels) per (head_dim, rotary_dim) and
    style. Each entry is the key a call with aligned tensors of its shape computes: the same values
    in the same order (the order names the module)."""
    cuda, sycl = ops.family.prebuild_specs("cuda"), ops.family.prebuild_specs("sycl")
    assert (len(cuda), len(sycl)) == (2 * 3 * 2 + 2 * 5, 2 * 5 * 2)
    assert all(s["vec"] == 8 for s in cuda) and all(s["ROPE_VEC"] == 8 for s in sycl)
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
                rope = (q[..., :rot].contiguous(), k[..., :rot].contiguous(), cache, pos, neox)
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

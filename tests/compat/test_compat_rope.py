"""sgljit.compat's rope modules (sglang.jit_kernel.rope, flashinfer.rope, vLLM's
rotary_embedding) on every backend, against a float64 oracle written here from the formula: the
call conventions each library has (flattened heads, [B, S] positions, key=None, rope_dim, fused
store arguments, rope_dim_offset, inverse, cache dtypes). sglang's own tests of the same functions
run in test_sglang_rope.py."""

from __future__ import annotations

import contextlib

import pytest
import torch

import sgljit
from sgljit.compat.flashinfer import rope as flashinfer_rope
from sgljit.compat.sglang import rope as sglang_rope
from sgljit.compat.vllm import _custom_ops as vllm_ops

from ..plugins.common import BACKENDS

pytest.importorskip("sgljit_rope")


def device_of(backend: str) -> str:
    return "cuda" if backend == "cuda" else "cpu"


def using(backend: str):
    return sgljit.use_backend("sycl") if backend == "sycl" else contextlib.nullcontext()


TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def make_cache(max_pos: int, rot: int, device, dtype=torch.float32) -> torch.Tensor:
    inv = 1.0 / 10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat((ang.cos(), ang.sin()), dim=-1).to(device, dtype)


def oracle(x, cache, positions, neox, offset=0, inverse=False):
    """float64 rope of x [T, H, D] over dims [offset, offset + rotary_dim) of each head."""
    y = x.detach().double().cpu().clone()
    rot, half = cache.shape[1], cache.shape[1] // 2
    rows = cache.detach().double().cpu()[positions.detach().cpu().long()]
    c, s = rows[:, None, :half], rows[:, None, half:] * (-1 if inverse else 1)
    i1 = torch.arange(half) if neox else torch.arange(0, rot, 2)
    i2 = i1 + half if neox else i1 + 1
    i1, i2 = i1 + offset, i2 + offset
    x1, x2 = y[..., i1].clone(), y[..., i2].clone()
    y[..., i1] = x1 * c - x2 * s
    y[..., i2] = x2 * c + x1 * s
    return y


def close(actual, expected, dtype):
    torch.testing.assert_close(
        actual.double().cpu(), expected.double().cpu(), atol=TOL[dtype], rtol=TOL[dtype]
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_sglang_apply_rope_and_the_fused_store(backend):
    dev = device_of(backend)
    torch.manual_seed(0)
    T, Hq, Hk, D, max_pos, slots = 13, 4, 2, 128, 500, 40
    cache = make_cache(max_pos, D, dev)
    pos = torch.randint(0, max_pos, (T,), device=dev, dtype=torch.int32)
    q = torch.randn(T, Hq, D, device=dev).bfloat16()
    k = torch.randn(T, Hk, D, device=dev).bfloat16()
    want_q, want_k = oracle(q, cache, pos, False), oracle(k, cache, pos, False)
    q1, k1 = q.clone(), k.clone()
    with using(backend):
        sglang_rope.apply_rope_inplace(q1, k1, cache, pos, is_neox=False, rope_dim=D)
    close(q1, want_q, torch.bfloat16)
    close(k1, want_k, torch.bfloat16)

    # apply_rope_with_cos_sin_cache_inplace with fused_args: k rotated in place and stored, v
    # (flattened) stored, caches [slots, Hk * D]
    v = torch.randn(T, Hk * D, device=dev).bfloat16()
    kc = torch.zeros(slots, Hk * D, device=dev, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    loc = torch.randperm(slots, device=dev)[:T].int()
    fused = sglang_rope.FusedSetKVBufferArg(value=v, k_buffer=kc, v_buffer=vc, cache_loc=loc)
    q2, k2 = q.clone(), k.clone()
    with using(backend):
        sglang_rope.apply_rope_with_cos_sin_cache_inplace(
            q2, k2, cache, pos, is_neox=False, fused_args=fused
        )
    close(q2, want_q, torch.bfloat16)
    close(k2, want_k, torch.bfloat16)
    close(kc[loc.long()].view(T, Hk, D), want_k, torch.bfloat16)
    assert torch.equal(vc[loc.long()], v)
    with using(backend), pytest.raises(ValueError, match=r"^rotary_dim: 64 does not match"):
        sglang_rope.apply_rope_inplace(q, k, cache, pos, is_neox=True, rope_dim=64)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("key_is_none", [False, True])
def test_sglang_rotary_embedding(backend, key_is_none):
    """[B, S] positions with [B, S, H * D] query and key, a cache in q's dtype, partial rotary;
    returns the tensors given."""
    dev = device_of(backend)
    torch.manual_seed(1)
    B, S, Hq, Hk, D, rot, max_pos = 3, 5, 4, 2, 64, 32, 100
    cache = make_cache(max_pos, rot, dev, torch.float16)
    pos = torch.randint(0, max_pos, (B, S), device=dev)
    query = torch.randn(B, S, Hq * D, device=dev).half()
    key = None if key_is_none else torch.randn(B, S, Hk * D, device=dev).half()
    want_q = oracle(query.view(B * S, Hq, D), cache, pos.flatten(), True)
    want_k = None if key is None else oracle(key.view(B * S, Hk, D), cache, pos.flatten(), True)
    with using(backend):
        q_out, k_out = sglang_rope.rotary_embedding(pos, query, key, D, cache, True)
    assert q_out is query and k_out is key
    close(query.view(B * S, Hq, D), want_q, torch.float16)
    if key is not None:
        close(key.view(B * S, Hk, D), want_k, torch.float16)
    q2 = torch.randn(B * S, Hq, D, device=dev).half()
    want2 = oracle(q2, cache, pos.flatten(), True)
    with using(backend):
        sglang_rope.rotary_embedding_without_key(pos.flatten(), q2, D, cache)
    close(q2, want2, torch.float16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_flashinfer_apply_rope_with_cos_sin_cache(backend):
    dev = device_of(backend)
    torch.manual_seed(2)
    T, Hq, Hk, D, rot, max_pos = 9, 8, 2, 128, 64, 300
    cache = make_cache(max_pos, rot, dev)
    pos = torch.randint(0, max_pos, (T,), device=dev)
    query = torch.randn(T, Hq * D, device=dev).bfloat16()
    key = torch.randn(T, Hk * D, device=dev).bfloat16()
    want_q = oracle(query.view(T, Hq, D), cache, pos, True)
    want_k = oracle(key.view(T, Hk, D), cache, pos, True)
    with using(backend):
        q_out, k_out = flashinfer_rope.apply_rope_with_cos_sin_cache(pos, query, key, D, cache)
    close(q_out.view(T, Hq, D), want_q, torch.bfloat16)
    close(k_out.view(T, Hk, D), want_k, torch.bfloat16)
    assert not torch.equal(q_out, query)  # the inputs are left as they were
    with using(backend):
        flashinfer_rope.apply_rope_with_cos_sin_cache_inplace(pos, query, key, D, cache, True)
    assert torch.equal(query, q_out) and torch.equal(key, k_out)
    with using(backend), pytest.raises(ValueError, match=r"^cos_sin_cache: FlashInfer's rope"):
        flashinfer_rope.apply_rope_with_cos_sin_cache_inplace(
            pos, query, key, D, cache.bfloat16(), True
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_vllm_rotary_embedding(backend):
    """vLLM's extras: rope_dim_offset (rotate dims [offset, offset + rotary_dim) of each head),
    inverse (rotate by -theta), a cache of a third dtype (converted), 3-D query and key."""
    dev = device_of(backend)
    torch.manual_seed(3)
    T, Hq, Hk, D, rot, max_pos = 7, 4, 2, 128, 64, 200
    pos = torch.randint(0, max_pos, (T,), device=dev)
    q = torch.randn(T, Hq, D, device=dev).bfloat16()
    k = torch.randn(T, Hk, D, device=dev).bfloat16()
    for offset, inverse, cache_dtype in ((0, False, torch.float32), (32, True, torch.float16)):
        cache = make_cache(max_pos, rot, dev, cache_dtype)
        want_q = oracle(q, cache, pos, True, offset, inverse)
        want_k = oracle(k, cache, pos, True, offset, inverse)
        q1, k1 = q.clone(), k.clone()
        with using(backend):
            vllm_ops.rotary_embedding(pos, q1, k1, D, cache, True, offset, inverse)
        close(q1, want_q, torch.bfloat16)
        close(k1, want_k, torch.bfloat16)
    # inverse undoes a rotation (to rounding)
    cache = make_cache(max_pos, rot, dev)
    q1 = q.float()
    with using(backend):
        vllm_ops.rotary_embedding(pos, q1, None, D, cache, False)
        vllm_ops.rotary_embedding(pos, q1, None, D, cache, False, 0, True)
    close(q1, q.float(), torch.float32)
    with using(backend), pytest.raises(ValueError, match=r"^rope_dim_offset: 96 plus"):
        vllm_ops.rotary_embedding(pos, q.clone(), None, D, cache, False, 96)
    with using(backend), pytest.raises(ValueError, match=r"^query: expected its leading"):
        vllm_ops.rotary_embedding(pos[:5], q.clone(), None, D, cache, False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vllm_norms(backend):
    dev = device_of(backend)
    torch.manual_seed(4)
    x = torch.randn(2, 5, 256, device=dev).bfloat16()
    w = torch.randn(256, device=dev).bfloat16()
    xd = x.double()
    rms = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)).cpu()
    out = torch.full_like(x, float("nan"))
    with using(backend):
        vllm_ops.rms_norm(out, x, w, 1e-6)
    close(out, rms * w.double().cpu(), torch.bfloat16)
    with using(backend):
        vllm_ops.rms_norm(out, x, None, 1e-6)
    close(out, rms, torch.bfloat16)
    residual = torch.randn_like(x)
    summed = (x + residual).double()
    want = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    xi, ri = x.clone(), residual.clone()
    with using(backend):
        vllm_ops.fused_add_rms_norm(xi, ri, w, 1e-5)
    close(ri, summed, torch.bfloat16)
    close(xi, want, torch.bfloat16)

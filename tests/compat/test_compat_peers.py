"""sgljit.compat's FlashInfer and vLLM call surface on every backend: the peers' signatures, what
is written in place and what is returned, dtypes, and the peers' rounding bit for bit (vLLM's rope
rounds each product to the dtype; FlashInfer's fused add normalizes the float32 sum)."""

from __future__ import annotations

import contextlib
import inspect
import math

import pytest
import torch

import sgljit
from sgljit.compat.flashinfer import norm as fi_norm
from sgljit.compat.flashinfer import rope as fi_rope
from sgljit.compat.vllm import _custom_ops as vllm_ops

from ..plugins.common import BACKENDS

BF16, FP16, E4M3 = torch.bfloat16, torch.float16, torch.float8_e4m3fn


@pytest.fixture
def ctx(request):
    backend = request.node.callspec.params["backend"]
    if backend == "cuda":
        return "cuda", contextlib.nullcontext
    return "cpu", lambda: sgljit.use_backend(backend)


def _names(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_signatures_are_the_peers():
    """FlashInfer 0.7.2's and vLLM 0.33.0's parameter names and order."""
    ragged = ["q", "k", "indptr", "offsets", "rotary_dim", "interleave", "rope_scale", "rope_theta"]
    by_pos = ["q", "k", "pos_ids", "rotary_dim", "interleave", "rope_scale", "rope_theta"]
    llama31 = ["low_freq_factor", "high_freq_factor", "old_context_len"]
    for fn in (fi_rope.apply_rope, fi_rope.apply_rope_inplace):
        assert _names(fn) == ragged
    for fn in (fi_rope.apply_rope_pos_ids, fi_rope.apply_rope_pos_ids_inplace):
        assert _names(fn) == by_pos
    for fn in (fi_rope.apply_llama31_rope, fi_rope.apply_llama31_rope_inplace):
        assert _names(fn) == ragged + llama31
    assert _names(fi_rope.apply_llama31_rope_pos_ids_inplace) == by_pos + llama31
    assert inspect.signature(fi_rope.apply_llama31_rope).parameters["rope_scale"].default == 8
    quant = ["out", "input", "weight", "scale", "eps", "enable_pdl"]
    assert _names(fi_norm.rmsnorm_quant) == quant
    assert _names(fi_norm.fused_add_rmsnorm_quant) == [*quant[:2], "residual", *quant[2:]]
    assert _names(vllm_ops.rms_norm_static_fp8_quant) == [
        "result", "input", "weight", "scale", "epsilon"
    ]  # fmt: skip
    assert _names(vllm_ops.fused_add_rms_norm_static_fp8_quant) == [
        "result", "input", "residual", "weight", "scale", "epsilon"
    ]  # fmt: skip
    assert _names(vllm_ops.static_scaled_fp8_quant) == ["result", "input", "scale", "group_shape"]
    assert _names(vllm_ops.dynamic_per_token_scaled_fp8_quant) == [
        "result", "input", "scale", "scale_ub"
    ]  # fmt: skip
    assert _names(vllm_ops.scaled_fp8_quant) == [
        "input", "scale", "num_token_padding", "scale_ub", "use_per_token_if_dynamic", "output",
        "group_shape",
    ]  # fmt: skip


def _llama31_freqs(dim, theta, scale=8, low=1, high=4, old=8192):
    """Meta's Llama 3.1 frequency scaling (float64)."""
    freqs = [1.0 / theta ** (i / dim) for i in range(0, dim, 2)]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / scale)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / scale + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def _rotated(x, pos, freqs, rot, interleave):
    """float64 rotation of the first ``rot`` dims of x [T, H, D] at positions ``pos``."""
    xd = x.double()
    ang = pos.to(xd.device, torch.float64)[:, None, None] * freqs.to(xd.device, torch.float64)
    c, s = ang.cos(), ang.sin()
    if interleave:
        a, b = xd[..., 0:rot:2], xd[..., 1:rot:2]
        r = torch.stack((a * c - b * s, b * c + a * s), -1).flatten(-2)
    else:
        a, b = xd[..., : rot // 2], xd[..., rot // 2 : rot]
        r = torch.cat((a * c - b * s, b * c + a * s), -1)
    return torch.cat((r, xd[..., rot:]), -1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("llama31", [False, True])
def test_flashinfer_rope_ragged_and_pos_ids(backend, ctx, llama31):
    device, on = ctx
    g = torch.Generator().manual_seed(3)
    lens, offsets, heads, d, rot = [3, 5], [15, 99], (4, 2), 64, 32
    nnz = sum(lens)
    qkv = torch.randn(nnz, (heads[0] + 2 * heads[1]) * d, generator=g).to(device, FP16)
    q = qkv[:, : heads[0] * d].view(nnz, heads[0], d)
    k = qkv[:, heads[0] * d : (heads[0] + heads[1]) * d].view(nnz, heads[1], d)
    indptr = torch.tensor([0, 3, 8], dtype=torch.int32, device=device)
    offs = torch.tensor(offsets, dtype=torch.int32, device=device)
    pos = torch.cat([torch.arange(o, o + n) for o, n in zip(offsets, lens, strict=True)]).to(device)
    theta = 5e5 if llama31 else 1e4
    freqs = (
        _llama31_freqs(rot, theta)
        if llama31
        else 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    )
    before = qkv.clone()
    with on():
        if llama31:
            q_r, k_r = fi_rope.apply_llama31_rope(q, k, indptr, offs, rot, True)
        else:
            q_r, k_r = fi_rope.apply_rope(q, k, indptr, offs, rot, True, 1, theta)
    assert torch.equal(qkv, before), "the out-of-place form left q and k as they were"
    for got, x in ((q_r, q), (k_r, k)):
        assert got.dtype == FP16 and got.shape == x.shape
        torch.testing.assert_close(got.double(), _rotated(x, pos, freqs, rot, True),
                                   atol=2e-3, rtol=2e-3)  # fmt: skip
    q2, k2 = q.clone(), k.clone()
    with on():
        fn = (
            fi_rope.apply_llama31_rope_pos_ids_inplace
            if llama31
            else fi_rope.apply_rope_pos_ids_inplace
        )
        assert fn(q2, k2, pos, rot, True, *(() if llama31 else (1, theta))) is None
    assert torch.equal(q2, q_r) and torch.equal(k2, k_r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_flashinfer_fused_adds_normalize_the_float32_sum(backend, ctx):
    device, on = ctx
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 512, generator=g).to(device, BF16)
    r = torch.randn(6, 512, generator=g).to(device, BF16)
    w = torch.randn(512, generator=g).to(device, BF16)
    total = x.float() + r.float()
    for fn, offset in ((fi_norm.fused_add_rmsnorm, 0.0), (fi_norm.gemma_fused_add_rmsnorm, 1.0)):
        xi, ri = x.clone(), r.clone()
        with on():
            assert fn(xi, ri, w, 1e-6) is None
        assert torch.equal(ri, total.to(BF16))
        want = (
            total * torch.rsqrt(total.square().mean(-1, keepdim=True) + 1e-6) * (w.float() + offset)
        )
        mismatches = (xi != want.to(BF16)).sum().item()
        assert mismatches <= 2, f"{fn.__name__}: {mismatches} elements differ from FlashInfer's"


@pytest.mark.parametrize("backend", BACKENDS)
def test_flashinfer_norm_quant_writes_out_and_residual(backend, ctx):
    device, on = ctx
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 256, generator=g).to(device, FP16)
    r = torch.randn(4, 256, generator=g).to(device, FP16)
    w = torch.randn(256, generator=g).to(device, FP16)
    out = torch.full((4, 256), float("nan"), device=device).to(E4M3)
    scale = torch.tensor(0.05, device=device)
    y = x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-6) * w.float()
    with on():
        assert fi_norm.rmsnorm_quant(out, x, w, scale) is None
    want = (y / 0.05).clamp(-448, 448).to(E4M3).float()
    assert (out.float() - want).abs().max() <= 32  # one e4m3 step at the top of the range
    ri, xi = r.clone(), x.clone()
    with on():
        fi_norm.fused_add_rmsnorm_quant(out, xi, ri, w, 0.05)
    assert torch.equal(xi, x), "input is only read"
    assert torch.equal(ri, (x.float() + r.float()).to(FP16))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_vllm_rotary_embedding_rounds_each_product(backend, ctx, dtype):
    """vLLM's forward_native formula (products in the dtype), element for element."""
    device, on = ctx
    g = torch.Generator().manual_seed(6)
    t, h, d = 9, 3, 64
    ang = torch.rand(32, d // 2, generator=g) * 6
    cache = torch.cat((ang.cos(), ang.sin()), -1).to(device, dtype)
    pos = torch.randint(0, 32, (t,), generator=g).to(device)
    q = torch.randn(t, h * d, generator=g).to(device, dtype)
    cos, sin = (c.unsqueeze(-2) for c in cache[pos].chunk(2, -1))
    x1, x2 = q.view(t, h, d).chunk(2, -1)
    want = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).view(t, h * d)
    with on():
        assert vllm_ops.rotary_embedding(pos, q, None, d, cache, True) is None
    assert torch.equal(q, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vllm_fused_norm_quant_equals_norm_then_quant(backend, ctx):
    device, on = ctx
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 768, generator=g).to(device, BF16) / 8
    r = torch.randn(5, 768, generator=g).to(device, BF16) / 8
    w = (1 + 0.1 * torch.randn(768, generator=g)).to(device, BF16)
    scale = torch.tensor(0.01, device=device)
    fused, unfused = (torch.empty(5, 768, device=device, dtype=E4M3) for _ in range(2))
    normed = torch.empty_like(x)
    r1, r2, x2 = r.clone(), r.clone(), x.clone()
    with on():
        vllm_ops.fused_add_rms_norm_static_fp8_quant(fused, x, r1, w, scale, 1e-6)
        vllm_ops.fused_add_rms_norm(x2, r2, w, 1e-6)
        vllm_ops.static_scaled_fp8_quant(unfused, x2, scale)
    assert torch.equal(fused.float(), unfused.float()) and torch.equal(r1, r2)
    with on():
        vllm_ops.rms_norm_static_fp8_quant(fused, x, w, scale, 1e-6)
        vllm_ops.rms_norm(normed, x, w, 1e-6)
        vllm_ops.static_scaled_fp8_quant(unfused, normed, scale)
        out, s = vllm_ops.scaled_fp8_quant(x, use_per_token_if_dynamic=True, num_token_padding=8)
    assert torch.equal(fused.float(), unfused.float())
    assert out.shape == (8, 768) and s.shape == (8, 1) and s.dtype == torch.float32
    with pytest.raises(ValueError, match=r"^scale_ub: "):
        vllm_ops.dynamic_per_token_scaled_fp8_quant(out[:5], x, s[:5], torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"^group_shape: "):
        vllm_ops.static_scaled_fp8_quant(unfused, x, scale, (1, 128))

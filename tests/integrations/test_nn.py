"""sgljit.nn: RMSNorm, GemmaRMSNorm and RotaryEmbedding against float64 formulas on every backend,
their autograd path (PyTorch, differentiable) and what makes them leave the kernel."""

from __future__ import annotations

import pytest
import torch

from sgljit import nn

from ..plugins.common import BACKENDS
from .conftest import called

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def rand(*shape, dtype=torch.float32, device="cpu", seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(device, dtype)


def rms_oracle(x, w, eps, gemma):
    x64 = x.double()
    w64 = w.double() + (1.0 if gemma else 0.0)
    return x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps) * w64


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cls", [nn.RMSNorm, nn.GemmaRMSNorm])
def test_norm_modules(backend, backend_env, op_calls, dtype, cls):
    device, ctx = backend_env
    gemma = cls is nn.GemmaRMSNorm
    norm = cls(96, eps=1e-5, device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(rand(96, seed=1, scale=0.5))
    x = rand(2, 5, 96, dtype=dtype, device=device, seed=2, scale=3.0)[:, ::2]  # strided rows
    with ctx(), torch.no_grad():
        y = norm(x)
    assert called(op_calls, "gemma_rmsnorm" if gemma else "rmsnorm") == 1
    assert y.shape == x.shape and y.dtype == dtype
    torch.testing.assert_close(
        y.double(), rms_oracle(x, norm.weight, 1e-5, gemma), rtol=TOL[dtype], atol=TOL[dtype]
    )


@pytest.mark.parametrize("cls", [nn.RMSNorm, nn.GemmaRMSNorm])
def test_norm_autograd_and_fallbacks(op_calls, cls):
    """Grad needed, a float32 weight on bf16 input, a non-unit last stride: the PyTorch formula."""
    formula = nn.gemma_rms_norm if cls is nn.GemmaRMSNorm else nn.llama_rms_norm
    norm = cls(32)
    with torch.no_grad():
        norm.weight.copy_(rand(32, seed=3))
    x = rand(4, 32, seed=4).requires_grad_()
    y = norm(x)
    y.square().sum().backward()
    assert y.grad_fn is not None and x.grad is not None and norm.weight.grad is not None
    assert torch.equal(y, formula(x, norm.weight, 1e-6))
    with torch.no_grad():
        xb = x.detach().bfloat16()
        assert torch.equal(norm(xb), formula(xb, norm.weight, 1e-6))  # fp32 weight, bf16 input
        xt = rand(32, 4, seed=5).t()
        assert torch.equal(norm(xt), formula(xt, norm.weight, 1e-6))
    assert not op_calls


def rope_oracle(positions, x, head_dim, rot, base, is_neox):
    """float64, from the definition: pairs rotated by position * base^(-2i/rot)."""
    heads = x.double().unflatten(-1, (-1, head_dim)) if x.dim() == 2 else x.double()
    inv_freq = base ** (-torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    angle = positions.double()[:, None, None] * inv_freq
    cos, sin = angle.cos(), angle.sin()
    out = heads.clone()
    if is_neox:
        i, j = slice(0, rot // 2), slice(rot // 2, rot)
    else:
        i, j = slice(0, rot, 2), slice(1, rot, 2)
    a, b = heads[..., i], heads[..., j]
    out[..., i], out[..., j] = a * cos - b * sin, b * cos + a * sin
    return out.reshape(x.shape)


ROPES = [  # (head_dim, rotary_dim, is_neox, flattened q/k)
    (64, 64, True, False),
    (64, 64, False, True),
    (128, 64, True, True),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rope_case", ROPES, ids=lambda r: "d{}-r{}-neox{}-flat{}".format(*r))
def test_rotary_embedding(backend, backend_env, op_calls, dtype, rope_case):
    device, ctx = backend_env
    head_dim, rot, is_neox, flat = rope_case
    rope = nn.RotaryEmbedding(head_dim, 512, 500000.0, rotary_dim=rot, is_neox=is_neox)
    positions = torch.tensor([0, 7, 511, 300, 3], device=device)
    q = rand(5, 4, head_dim, dtype=dtype, device=device, seed=6)
    k = rand(5, 2, head_dim, dtype=dtype, device=device, seed=7)
    if flat:
        q, k = q.flatten(1), k.flatten(1)
    q0, k0 = q.clone(), k.clone()
    with ctx(), torch.no_grad():
        q_out, k_out = rope(positions, q, k)
    assert called(op_calls, "apply_rope") == 1
    assert q_out is q and k_out is k  # in place on the kernel path
    for got, x in ((q_out, q0), (k_out, k0)):
        expected = rope_oracle(positions.cpu(), x.cpu(), head_dim, rot, 500000.0, is_neox)
        torch.testing.assert_close(got.cpu().double(), expected, rtol=TOL[dtype], atol=TOL[dtype])


def test_rotary_embedding_autograd(op_calls):
    """Under autograd: new tensors, the kernel's result, gradients flow; the table stays float32."""
    rope = nn.RotaryEmbedding(64, 64, rotary_dim=32, is_neox=False).to(torch.bfloat16)
    assert rope.cos_sin_cache.dtype == torch.float32 and rope.cos_sin_cache.shape == (64, 32)
    positions = torch.tensor([1, 63, 20])
    q = rand(3, 2 * 64, seed=8).requires_grad_()
    k = rand(3, 64, seed=9).requires_grad_()
    q_out, k_out = rope(positions, q, k)
    (q_out.sum() + k_out.square().sum()).backward()
    assert q.grad is not None and k.grad is not None and not op_calls
    with torch.no_grad():
        q_kernel, k_kernel = rope(positions, q.detach().clone(), k.detach().clone())
    torch.testing.assert_close(q_out, q_kernel, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_out, k_kernel, rtol=1e-6, atol=1e-6)


def test_rotary_embedding_after_a_call_on_meta_tensors():
    """A shape probe on meta tensors gives meta results and leaves the table where it was."""
    rope = nn.RotaryEmbedding(64, 128)
    meta = {"device": "meta"}
    q, k = rope(
        torch.arange(3, **meta), torch.empty(3, 4, 64, **meta), torch.empty(3, 2, 64, **meta)
    )
    assert q.is_meta and k.is_meta and rope.cos_sin_cache.device.type == "cpu"
    positions, q, k = torch.tensor([0, 5, 127]), rand(3, 4, 64, seed=3), rand(3, 2, 64, seed=4)
    with torch.no_grad():
        q_out, k_out = rope(positions, q.clone(), k.clone())
    for got, x in ((q_out, q), (k_out, k)):
        expected = rope_oracle(positions, x, 64, 64, 10000.0, True)
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_rotary_embedding_arguments():
    with pytest.raises(
        ValueError, match=r"rotary_dim: expected an even number in \[2, head_dim=64\]"
    ):
        nn.RotaryEmbedding(64, 16, rotary_dim=63)
    with pytest.raises(ValueError, match=r"inv_freq: expected shape \(32,\)"):
        nn.RotaryEmbedding(64, 16, inv_freq=torch.ones(31))
    scaled = nn.RotaryEmbedding(8, 4, inv_freq=torch.full((4,), 0.5), attention_scaling=2.0)
    angles = (torch.arange(4.0)[:, None] * 0.5).expand(4, 4)
    expected = 2 * torch.cat((angles.cos(), angles.sin()), dim=-1)
    torch.testing.assert_close(scaled.cos_sin_cache, expected)

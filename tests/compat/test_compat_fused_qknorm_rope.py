"""sgljit.compat.sglang.fused_qknorm_rope (sglang 0.5.23's ``fused_qk_norm_rope``) on every
backend, against a float64 oracle written here from sglang's documented semantics: q and k heads of
a fused qkv buffer RMS-normalized, their first rotary_dim dims rotated by ``position * f_j`` with
``f_j = base^(-2j / rotary_dim)`` (YaRN: interpolated by ``factor`` along a ramp from ``low`` to
``high`` over pair indices) times ``attention_factor``, v untouched. Positions reach 128k: the
tolerance carries the float32 angle's error there (see sgljit_rope.qknorm_rope_theta)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

import sgljit
from sgljit.compat.sglang.fused_qknorm_rope import fused_qk_norm_rope, fused_qk_norm_rope_out

from ..plugins.common import BACKENDS

pytest.importorskip("sgljit_rope")

EPS = 1e-6


def using(backend: str):
    return sgljit.use_backend("sycl") if backend == "sycl" else contextlib.nullcontext()


def oracle(qkv, nq, nk, head_dim, q_w, k_w, positions, base, is_neox, factor, low, high, af, rot):
    """sglang's semantics in float64, written out per pair (not sgljit's reference)."""
    x = qkv.double().cpu().unflatten(1, (-1, head_dim)).clone()
    half = rot // 2
    freq = [base ** (-2.0 * j / rot) for j in range(half)]
    if factor != 1.0:
        hi = high + 0.001 if abs(low - high) <= 1e-6 else high
        ramp = [min(max((j - low) / (hi - low), 0.0), 1.0) for j in range(half)]
        freq = [f / factor * r + f * (1 - r) for f, r in zip(freq, ramp, strict=True)]
    freq = torch.tensor(freq, dtype=torch.float64)
    angle = positions.double().cpu()[:, None] * freq  # [T, half]
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    for heads, w in ((slice(0, nq), q_w), (slice(nq, nq + nk), k_w)):
        h = x[:, heads]
        y = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + EPS) * w.double().cpu()
        if is_neox:
            a, b = y[..., :half], y[..., half:rot]
        else:
            a, b = y[..., 0:rot:2], y[..., 1:rot:2]
        ra, rb = (a * cos - b * sin) * af, (b * cos + a * sin) * af
        if is_neox:
            y[..., :half], y[..., half:rot] = ra, rb
        else:
            y[..., 0:rot:2], y[..., 1:rot:2] = ra, rb
        x[:, heads] = y
    return x.flatten(1)


ROUNDING = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-5}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "dtype,heads,head_dim,rot,is_neox,yarn,max_pos",
    [
        (torch.bfloat16, (32, 8, 8), 128, 128, True, None, 131072),  # Qwen3-8B
        (torch.bfloat16, (64, 4, 4), 128, 128, True, (4.0, 10.0, 40.0, 1.1386), 131072),
        (torch.float32, (16, 4, 4), 128, 64, False, (4.0, 4.0, 20.0, 1.0), 32768),
        (torch.float16, (8, 2, 2), 256, 256, False, None, 4096),
        (torch.float32, (4, 1, 1), 64, 64, True, (8.0, 5.0, 5.0, 1.2), 4096),  # low == high
    ],
)
def test_fused_qk_norm_rope(backend, dtype, heads, head_dim, rot, is_neox, yarn, max_pos):
    device = "cuda" if backend == "cuda" else "cpu"
    nq, nk, nv = heads
    torch.manual_seed(0)
    tokens = 5
    qkv = torch.randn(tokens, (nq + nk + nv) * head_dim, device=device).to(dtype)
    q_w = (1 + 0.5 * torch.randn(head_dim, device=device)).to(dtype)
    k_w = (1 + 0.5 * torch.randn(head_dim, device=device)).to(dtype)
    positions = torch.randint(0, max_pos, (tokens,), dtype=torch.int32, device=device)
    positions[0] = max_pos - 1
    factor, low, high, af = yarn or (1.0, 0.0, 0.0, 1.0)
    base = 1e6
    expected = oracle(qkv, nq, nk, head_dim, q_w, k_w, positions, base, is_neox, factor, low,
                      high, af, rot)  # fmt: skip
    v = qkv[:, (nq + nk) * head_dim :].clone()
    with using(backend):
        fused_qk_norm_rope(qkv, nq, nk, nv, head_dim, EPS, q_w, k_w, base, is_neox, positions,
                           factor, low, high, af, None if rot == head_dim else rot)  # fmt: skip
    assert torch.equal(qkv[:, (nq + nk) * head_dim :], v)  # v untouched
    # float32 angle: up to about max_pos * 2^-23 rad, on values up to ~3 (|w| < 2.5)
    tol = ROUNDING[dtype] + 3 * max_pos * 2.0**-23
    err = (qkv.double().cpu() - expected).abs() / (1 + expected.abs())
    assert err.max().item() <= tol, f"max error {err.max().item():.3g} > {tol:.3g}"
    assert math.isfinite(err.max().item())


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors_name_the_argument(backend):
    device = "cuda" if backend == "cuda" else "cpu"
    qkv = torch.randn(3, 6 * 64, device=device)
    w = torch.ones(64, device=device)
    pos = torch.zeros(3, dtype=torch.int32, device=device)
    before = qkv.clone()
    with using(backend):
        with pytest.raises(ValueError, match=r"^qkv: expected 448 columns"):
            fused_qk_norm_rope_out(qkv, w, w, pos, 4, 2, 1, 64, EPS, 1e4, True, 1.0, 0, 0, 1.0, 64)
        with pytest.raises(ValueError, match=r"^rotary_dim: expected an even number"):
            fused_qk_norm_rope_out(qkv, w, w, pos, 4, 1, 1, 64, EPS, 1e4, True, 1.0, 0, 0, 1.0, 65)
        with pytest.raises(ValueError, match=r"^rotary_dim: expected an even number"):
            fused_qk_norm_rope(qkv, 4, 1, 1, 64, EPS, w, w, 1e4, True, pos, 1.0, 0, 0, 1.0, 128)
    assert torch.equal(qkv, before)

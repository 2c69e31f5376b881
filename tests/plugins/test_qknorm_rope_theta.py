"""qknorm_rope_theta (cos/sin computed in the kernel from rope_theta) beyond its conformance cases:
the CUDA modules compile for sm_90a and sm_100a without a GPU, the frequencies are HF's rope and
YaRN's, it agrees with the table form where the two should agree, and bad arguments are refused
before any write on every backend."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

import sgljit

from .common import BACKENDS, HAS_CUDA

pytest.importorskip("sgljit_rope")

from sgljit_rope import ops, qknorm_rope_theta


def using(backend: str):
    return sgljit.use_backend("sycl") if backend == "sycl" else contextlib.nullcontext()


@pytest.mark.parametrize("arch", ["9.0a", "10.0a"])
def test_cuda_compiles(arch, tmp_path, monkeypatch):
    from sgljit.toolchain import find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    if HAS_CUDA:
        pytest.skip("the GPU tests build these modules for the GPU's own arch")
    monkeypatch.setenv("SGLJIT_CUDA_ARCH", arch)
    monkeypatch.setenv("SGLJIT_CACHE_DIR", str(tmp_path / "cache"))
    sgljit.clear_module_cache()
    try:
        for dtype, is_neox, yarn in ((torch.bfloat16, True, True), (torch.float32, False, False)):
            spec = dict(dtype=dtype, idx_dtype=torch.int64, is_neox=is_neox, yarn=yarn)
            module = ops.family.prebuild("cuda", op="qknorm_rope_theta", **spec)
            assert module.qknorm_rope_theta is not None
    finally:
        sgljit.clear_module_cache()


def test_frequencies_are_hf_rope_and_yarn():
    """Plain: HF's default inv_freq. YaRN: HF's ramp blend for the same low/high bounds."""
    rot, base = 128, 1e6
    hf = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    got = qknorm_rope_theta.frequencies(rot, base, 1.0, 0.0, 0.0, torch.float64)
    torch.testing.assert_close(got, hf, rtol=1e-12, atol=0)
    factor, low, high = 4.0, 10.0, 40.0
    # HF's _compute_yarn_parameters: inv_freq_extrapolation_factor = 1 - linear_ramp(low, high)
    ramp = ((torch.arange(rot // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    hf_yarn = hf / factor * (1 - extrapolation) + hf * extrapolation
    got = qknorm_rope_theta.frequencies(rot, base, factor, low, high, torch.float64)
    torch.testing.assert_close(got, hf_yarn, rtol=1e-12, atol=0)


def _hf_llama3(inv_freq, factor, low_freq_factor, high_freq_factor, old_context):
    """HF's _compute_llama3_parameters, as written there (float64 here)."""
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama3_is_hf_llama3(backend, dtype):
    """llama3_original_max_position: HF's Llama 3.1 frequencies (checked in float64), and the
    op's result that of qknorm_rope_theta_torch with them, to the float32 angle's error."""
    rot, base, factor, lff, hff, ctx = 128, 5e5, 8.0, 1.0, 4.0, 8192
    inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ramp_scale = ctx / (2 * math.pi)
    got = qknorm_rope_theta.frequencies(rot, base, factor, hff, lff, torch.float64, ramp_scale)
    torch.testing.assert_close(got, _hf_llama3(inv, factor, lff, hff, ctx), rtol=1e-12, atol=0)
    device = "cuda" if backend == "cuda" else "cpu"
    torch.manual_seed(4)
    q = torch.randn(5, 8, rot, device=device).to(dtype)
    k = torch.randn(5, 2, rot, device=device).to(dtype)
    w = (1 + 0.3 * torch.randn(rot, device=device)).to(dtype)
    positions = torch.tensor([0, 7, 900, 30000, 131071], device=device)
    expected = qknorm_rope_theta.qknorm_rope_theta_torch(
        q.double(), k.double(), w, w, positions, 1e-6, True, rot, base, factor, hff, lff, 1.0,
        ramp_scale,
    )  # fmt: skip
    with using(backend):
        sgljit.ops.qknorm_rope_theta(q, k, w, w, positions, base=base, factor=factor, low=lff,
                                     high=hff, llama3_original_max_position=ctx)  # fmt: skip
    tol = (1.6e-2 if dtype == torch.bfloat16 else 1e-5) + 3 * 131072 * 2.0**-23
    for got, exp in zip((q, k), expected, strict=True):
        torch.testing.assert_close(got.double(), exp, rtol=tol, atol=tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_agrees_with_the_table_form(backend):
    """float32, plain rope: the same result as qknorm_rope over a float64-built table (the table
    form rounds between norm and rope, which float32 makes invisible), to the angle's float32
    error at these positions."""
    device = "cuda" if backend == "cuda" else "cpu"
    torch.manual_seed(3)
    T, Hq, Hk, D, rot, base = 6, 8, 2, 128, 64, 1e4
    q = torch.randn(T, Hq, D, device=device)
    k = torch.randn(T, Hk, D, device=device)
    qw, kw = (1 + 0.3 * torch.randn(2, D, device=device)).unbind(0)
    positions = torch.randint(0, 2048, (T,), device=device)
    freq = qknorm_rope_theta.frequencies(rot, base, 1.0, 0.0, 0.0, torch.float64)
    angles = torch.arange(2048, dtype=torch.float64)[:, None] * freq
    table = torch.cat((angles.cos(), angles.sin()), -1).float().to(device)
    q1, k1, q2, k2 = q.clone(), k.clone(), q.clone(), k.clone()
    with using(backend):
        sgljit.ops.qknorm_rope(q1, k1, qw, kw, table, positions)
        sgljit.ops.qknorm_rope_theta(q2, k2, qw, kw, positions, base=base, rotary_dim=rot)
    tol = 3 * 2048 * 2.0**-23
    torch.testing.assert_close(q2, q1, rtol=tol, atol=tol)
    torch.testing.assert_close(k2, k1, rtol=tol, atol=tol)
    # the tail: normalized only in both forms (the sums of squares may differ in their order)
    torch.testing.assert_close(q2[..., rot:], q1[..., rot:], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"rotary_dim": 63}, ValueError, r"^rotary_dim: expected an even number in \[2, head_dim"),
        ({"rotary_dim": 130}, ValueError, r"^rotary_dim: expected an even number"),
        ({"rotary_dim": 0}, ValueError, r"^rotary_dim: expected a value >= 2"),
        ({"base": 0.0}, ValueError, r"^base: expected a value >="),
        ({"factor": -1.0}, ValueError, r"^factor: expected a value >="),
        ({"eps": -1.0}, ValueError, r"^eps: expected a value >= 0"),
    ],
)
def test_bad_arguments_write_nothing(backend, kwargs, error, match):
    device = "cuda" if backend == "cuda" else "cpu"
    q, k = torch.randn(3, 4, 128, device=device), torch.randn(3, 2, 128, device=device)
    w = torch.ones(128, device=device)
    positions = torch.zeros(3, dtype=torch.int64, device=device)
    q0, k0 = q.clone(), k.clone()
    call = {"base": 1e4, **kwargs}
    with using(backend), pytest.raises(error, match=match):
        sgljit.ops.qknorm_rope_theta(q, k, w, w, positions, **call)
    assert torch.equal(q, q0) and torch.equal(k, k0)

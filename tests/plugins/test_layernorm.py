"""sgljit-norm's LayerNorm: ``layernorm`` and ``layernorm_quant_fp8`` on every backend against
``torch.nn.functional.layer_norm`` and a float64 formula (outputs poisoned first): [B, S, H] rows,
in place, a mean far from zero (the two-pass variance), both fp8 formats, errors that name the
argument before anything is written; FlashInfer's ``layernorm`` / ``layernorm_quant`` through
``sgljit.compat``. Without a GPU the CUDA kernels are compiled for sm_90a and sm_100a (compile only).
"""

import contextlib
import inspect
import os

import pytest
import torch
import torch.nn.functional as F

import sgljit
from sgljit.compat.flashinfer import norm as fi
from sgljit_norm import layernorm as ln

from .common import BACKENDS, HAS_CUDA, needs_gpu

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
TOL = {FP32: 2e-5, FP16: 4e-3, BF16: 2e-2}


@pytest.fixture
def on(request, tmp_path_factory):
    """(device, context manager) of the test's backend; one module cache for the file's tests."""
    backend = request.node.callspec.params["backend"]
    path = os.environ.get("SGLJIT_CACHE_DIR") or str(tmp_path_factory.mktemp("layernorm-cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGLJIT_CACHE_DIR", path)
        if backend == "cuda":
            yield "cuda", contextlib.nullcontext
        else:
            yield "cpu", lambda: sgljit.use_backend(backend)


def _rand(shape, dtype, device, seed, mean=0.0, std=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * std + mean).to(device, dtype)


def _oracle(x, gamma, beta, eps):
    xd = x.double()
    c = xd - xd.mean(-1, keepdim=True)
    return c / torch.sqrt(c.square().mean(-1, keepdim=True) + eps) * gamma.double() + beta.double()


def _close(actual, expected, tol):
    assert not torch.isnan(actual).any(), "NaN left: an element was not written"
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype,param_dtype", [(BF16, FP32), (FP16, FP16), (FP32, FP32)])
def test_layernorm_matches_torch_layer_norm(backend, on, dtype, param_dtype):
    """[B, S, H] rows, float32 or input-dtype gamma/beta; out allocated, then given (poisoned)."""
    device, ctx = on
    x = _rand((2, 3, 1152), dtype, device, 1)
    gamma = _rand(1152, param_dtype, device, 2, mean=1.0, std=0.5)
    beta = _rand(1152, param_dtype, device, 3)
    with ctx():
        y = sgljit.ops.layernorm(x, gamma, beta, 1e-5)
        out = torch.full_like(x, float("nan"))
        assert sgljit.ops.layernorm(x, gamma, beta, 1e-5, out=out) is out
    want = F.layer_norm(x.float(), (1152,), gamma.float(), beta.float(), 1e-5)
    assert y.dtype == dtype and y.shape == x.shape
    _close(y, want, TOL[dtype])
    assert torch.equal(y, out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layernorm_in_place_and_a_large_mean(backend, on):
    """out=input; float32 rows of mean 1000 and spread 1: sum(x^2) / H - mean^2 would be off by
    about 2^-24 * 1000^2 = 0.06 of the variance (3% of y); the two passes keep y within 1e-3 (the
    float32 mean's own rounding, about 1e-4 here)."""
    device, ctx = on
    x = _rand((5, 1152), FP32, device, 4, mean=1000.0)
    gamma = _rand(1152, FP32, device, 5)
    beta = _rand(1152, FP32, device, 6)
    want = _oracle(x, gamma, beta, 1e-6)
    with ctx():
        assert sgljit.ops.layernorm(x, gamma, beta, out=x) is x
    _close(x, want, 1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fp8", [E4M3, E5M2])
def test_layernorm_quant_fp8(backend, on, fp8):
    """The float32 LayerNorm divided by the scale (a 0-d tensor here), clamped, to fp8: the float64
    formula's code or its neighbour (one step: a quotient by a boundary); fp8_dtype picks out."""
    device, ctx = on
    x = _rand((3, 4, 1152), BF16, device, 7)
    gamma = _rand(1152, FP32, device, 8, mean=1.0, std=0.5)
    beta = _rand(1152, FP32, device, 9)
    s = {E4M3: 0.006, E5M2: 5e-5}[fp8]  # |y| reaches about 5: some quotients past fp8_max
    scale = torch.tensor(s, device=device)
    with ctx():
        out = sgljit.ops.layernorm_quant_fp8(x, gamma, beta, scale, fp8_dtype=fp8)
    fp8_max = torch.finfo(fp8).max
    want = (_oracle(x, gamma, beta, 1e-6).float() / s).clamp(-fp8_max, fp8_max).to(fp8)
    assert out.dtype == fp8 and out.shape == x.shape
    step = {E4M3: 0.125, E5M2: 0.25}[fp8]
    err = (out.double() - want.double()).abs() / (1 + want.double().abs())
    assert err.max() <= step
    assert (out.float() == want.float()).double().mean() > 0.99
    assert out.float().abs().max() == fp8_max, "the scale saturates some values"


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors_name_the_argument_before_any_write(backend, on):
    device, ctx = on
    x = _rand((4, 1152), BF16, device, 10)
    gamma, beta = _rand(1152, FP32, device, 11), _rand(1152, FP32, device, 12)
    out = torch.full_like(x, float("nan"))
    q = torch.zeros(4, 1152, device=device, dtype=E4M3)
    scale = torch.tensor([0.1], device=device)
    bad = [
        ("gamma", lambda: sgljit.ops.layernorm(x, gamma[:-1], beta, out=out)),
        ("beta", lambda: sgljit.ops.layernorm(x, gamma, beta.to(BF16), out=out)),
        ("gamma", lambda: sgljit.ops.layernorm(x, gamma.to(FP16), beta.to(FP16), out=out)),
        ("out", lambda: sgljit.ops.layernorm(x, gamma, beta, out=out.float())),
        ("scale", lambda: sgljit.ops.layernorm_quant_fp8(x, gamma, beta, scale.expand(2), out=q)),
        ("scale", lambda: sgljit.ops.layernorm_quant_fp8(x, gamma, beta, scale.double(), out=q)),
        ("out", lambda: sgljit.ops.layernorm_quant_fp8(x, gamma, beta, scale, out=out)),
        (
            "fp8_dtype",
            lambda: sgljit.ops.layernorm_quant_fp8(x, gamma, beta, scale, fp8_dtype=BF16),
        ),
        (
            "out",
            lambda: sgljit.ops.layernorm_quant_fp8(x, gamma, beta, scale, fp8_dtype=E5M2, out=q),
        ),
    ]
    with ctx():
        for name, call in bad:
            with pytest.raises((TypeError, ValueError)) as err:
                call()
            assert str(err.value).startswith(f"{name}:"), str(err.value)
    assert out.isnan().all() and not q.float().any(), "nothing is written"


# Every CUDA kernel shape: (sub-)warp rows (bf16 64, fp32 12), multi-warp groups with idle threads
# (1152: 96 threads, some of 1 vector; 1280, 1408, 5120), powers of two, a 1024-thread group (16384),
# gamma and beta from L1 (32768), the generic kernel (100, 37, 1001).
CUDA_WIDTHS = [(BF16, 64), (FP32, 12), (BF16, 1152), (BF16, 1280), (BF16, 1408), (BF16, 2048)]
CUDA_WIDTHS += [(BF16, 3072), (FP16, 4096), (BF16, 5120), (BF16, 16384), (BF16, 32768)]
CUDA_WIDTHS += [(BF16, 100), (FP16, 37), (FP32, 1001)]


@needs_gpu
@pytest.mark.parametrize("tokens", [1, 7, 4109])
@pytest.mark.parametrize("dtype,hidden", CUDA_WIDTHS)
def test_cuda_widths_and_batches(dtype, hidden, tokens):
    """Each width with float32 params (16-bit rows) or the rows' dtype, plain and -> e4m3: every
    row of a batch that spans many blocks is written and right."""
    x = _rand((tokens, hidden), dtype, "cuda", 16, mean=0.5)
    params = FP32 if dtype != FP32 and hidden % 3 else dtype
    gamma = _rand(hidden, params, "cuda", 17, mean=1.0, std=0.5)
    beta = _rand(hidden, params, "cuda", 18)
    want = _oracle(x, gamma, beta, 1e-6)
    out = torch.full_like(x, float("nan"))
    sgljit.ops.layernorm(x, gamma, beta, out=out)
    _close(out, want, TOL[dtype])
    q = torch.full((tokens, hidden), float("nan"), device="cuda").to(E4M3)
    sgljit.ops.layernorm_quant_fp8(x, gamma, beta, torch.tensor([0.01], device="cuda"), out=q)
    codes = (want.float() / 0.01).clamp(-448, 448).to(E4M3)
    assert not q.float().isnan().any()
    assert ((q.double() - codes.double()).abs() / (1 + codes.double().abs())).max() <= 0.125
    assert (q.float() == codes.float()).double().mean() > 0.99


# ------------------------------------------------------------------------------------------------
# FlashInfer's call surface


def test_flashinfer_layernorm_signatures():
    """FlashInfer's documented parameters, order and defaults."""

    def params(fn):
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]

    empty = inspect.Parameter.empty
    tensors = [("input", empty), ("gemma", empty), ("beta", empty)]
    assert params(fi.layernorm) == [*tensors, ("eps", 1e-6)]
    assert params(fi.layernorm_quant) == [("out", empty), *tensors, ("scale", empty), ("eps", 1e-6)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_flashinfer_layernorm_and_layernorm_quant(backend, on):
    """layernorm returns a new bf16 tensor (float32 gemma, beta); layernorm_quant writes out and
    returns None, a Python float scale taken as FlashInfer still does."""
    device, ctx = on
    x = _rand((6, 1152), BF16, device, 13)
    gemma, beta = _rand(1152, FP32, device, 14, mean=1.0), _rand(1152, FP32, device, 15)
    out = torch.zeros(6, 1152, device=device, dtype=E4M3)
    with ctx():
        y = fi.layernorm(x, gemma, beta)
        assert fi.layernorm_quant(out, x, gemma, beta, 0.02) is None
    want = _oracle(x, gemma, beta, 1e-6)
    assert y.dtype == BF16 and y.data_ptr() != x.data_ptr()
    _close(y, want, TOL[BF16])
    codes = (want.float() / 0.02).clamp(-448, 448).to(E4M3)
    assert ((out.double() - codes.double()).abs() / (1 + codes.double().abs())).max() <= 0.125


# ------------------------------------------------------------------------------------------------
# CUDA without a GPU: the kernels compile for Hopper and Blackwell


@pytest.mark.skipif(HAS_CUDA, reason="GPU present: the GPU tests build and run these modules")
def test_cuda_kernels_compile_for_sm90a_and_sm100a(tmp_path, monkeypatch):
    """Each kernel shape: gamma/beta in registers (bf16 4096, float32 params), from L1 (bf16
    32768: 1024 threads of 4 vectors), the generic kernel (width 0), both fp8 formats."""
    from sgljit.toolchain import find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    monkeypatch.setenv("SGLJIT_CUDA_ARCH", "9.0a 10.0a")
    monkeypatch.setenv("SGLJIT_CACHE_DIR", str(tmp_path / "cache"))
    specs = [
        dict(op="layernorm", **ln._cuda_params(BF16, FP32, 4096)),
        dict(op="layernorm", **ln._cuda_params(BF16, BF16, 32768)),
        dict(op="layernorm", **ln._cuda_params(FP32, FP32, 1001)),
        dict(op="layernorm_quant_fp8", **ln._cuda_params(BF16, FP32, 4096, E4M3)),
        dict(op="layernorm_quant_fp8", **ln._cuda_params(FP16, FP16, 37, E5M2)),
    ]
    assert [s["width"] for s in specs] == [4096, 32768, 0, 4096, 0]
    for spec in specs:
        module = ln.family.prebuild("cuda", **spec)
        assert getattr(module, spec["op"]) is not None

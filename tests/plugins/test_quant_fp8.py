"""sgljit-quant-fp8: per-tensor (static, dynamic), per-token and per-token-group FP8 quantization.

Every backend must be bit-identical to PyTorch's ``(x.float() / scale).clamp(-m, m).to(fp8)`` for
the same scale (the reference backend IS that formula; it is checked against an independent
float64 oracle with its own fp8 encoder). CPU CI: reference, the CUDA compile, SYCL on the SYCL CPU
device (incl. the exhaustive conversion over all 65536 bf16 and fp16 bit patterns). On a GPU: the
same on CUDA plus every dynamic algorithm, large shapes, strided views, torch.compile of the public
functions and CUDA graphs of every algorithm. What every op must do (argument checks from the spec,
poisoned outputs against the float64 reference, torch.compile and graphs of the kernel ops) is the
conformance suite's (tests/plugins/test_conformance.py).
"""

import contextlib
import os
import re
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch

import sgljit
from sgljit_quant_fp8 import ops, reference

from .common import BACKENDS, HAS_CUDA, needs_gpu

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8 = (E4M3, E5M2)
# The CUDA dynamic per-tensor algorithms by name (auto, fused, two_kernels, three_kernels), as the op
# numbers them; FORCED: every one but auto.
DYNAMIC_MODES = ops._DYNAMIC_ALGOS
FORCED_MODES = {name: algo for name, algo in DYNAMIC_MODES.items() if name != "auto"}

# The (input dtype, fp8 dtype) specializations the tests run (and the CUDA compile test builds).
COMBOS = [
    (torch.bfloat16, E4M3),
    (torch.bfloat16, E5M2),
    (torch.float16, E5M2),
    (torch.float32, E4M3),
]
COMBO_IDS = ["bf16-e4m3", "bf16-e5m2", "fp16-e5m2", "fp32-e4m3"]


def _device(backend: str) -> str:
    return "cuda" if backend == "cuda" else "cpu"


def _ctx(backend: str):
    """The backend's context for CPU tensors (CUDA tensors pick CUDA by themselves)."""
    return contextlib.nullcontext() if backend == "cuda" else sgljit.use_backend(backend)


def _run(backend: str, fn, *args, **kwargs):
    """fn on ``backend`` (CPU tensors run the reference or, forced, the SYCL kernels)."""
    if backend == "cuda":
        return fn(*args, **kwargs)
    with sgljit.use_backend(backend):
        return fn(*args, **kwargs)


def _poisoned(shape, fp8_dtype, device) -> torch.Tensor:
    """An fp8 output buffer full of 0xFF (a NaN in both formats): unwritten bytes show."""
    return torch.full(shape, 0xFF, dtype=torch.uint8, device=device).view(fp8_dtype)


def _data(shape, dtype, device, seed=0, spread=True) -> torch.Tensor:
    """Random non-zero data over several magnitudes (and an outlier) in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if spread and x.numel() > 4:
        x = x * torch.exp2(torch.randint(-8, 8, shape, generator=g).double())
        x.view(-1)[x.numel() // 3] = 37.5
    return x.to(dtype).to(device)


def _every_16bit(dtype: torch.dtype) -> torch.Tensor:
    """All 65536 bit patterns of a 16-bit dtype (NaN, inf and subnormals included), on the CPU."""
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype in FP8 else t.view(torch.int32)


def assert_fp8_equal(got: torch.Tensor, want: torch.Tensor, *, exact_nan: bool) -> None:
    """Byte-identical; where ``want`` is NaN only NaN-ness is compared unless ``exact_nan``
    (PyTorch's CPU clamp does not preserve a NaN's sign bit consistently)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = _bits(got).cpu(), _bits(want).cpu()
    nan = want.float().isnan().cpu()
    if not exact_nan:
        assert torch.equal(got.float().isnan().cpu(), nan), "NaN positions differ"
        g, w = g[~nan], w[~nan]
    bad = (g != w).nonzero()
    if bad.numel():
        i = bad[0].tolist()
        raise AssertionError(
            f"{bad.shape[0]} of {g.numel()} bytes differ; first at {i}: got {g[tuple(i)]:#x}, "
            f"want {w[tuple(i)]:#x}"
        )


# ------------------------------------------------------------------------------------------------
# The independent oracle: float64 arithmetic and its own fp8 encoder


def _fp8_table(fp8_dtype):
    """(codes, values) of the finite non-negative fp8 values, ascending."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = codes.view(fp8_dtype).double()
    keep = (codes < 0x80) & vals.isfinite()
    return codes[keep].long(), vals[keep]


def oracle_encode(q: torch.Tensor, fp8_dtype) -> torch.Tensor:
    """fp8 bytes of float64 ``q`` (already clamped): nearest value, ties to the even code."""
    codes, vals = _fp8_table(fp8_dtype)
    a = q.abs().clamp(max=float(vals[-1]))
    hi = torch.searchsorted(vals, a).clamp(max=len(vals) - 1)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = (a - vals[lo]).abs(), (vals[hi] - a).abs()
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0))
    out = torch.where(pick_hi, codes[hi], codes[lo])
    out = out | (torch.signbit(q).long() << 7)
    out = torch.where(q.isnan(), torch.full_like(out, 0x7F), out)
    return out.to(torch.uint8)


def oracle_quantize(x: torch.Tensor, scale: torch.Tensor, fp8_dtype) -> torch.Tensor:
    # A float64 quotient of two floats rounded to float32 is the correctly rounded fp32 quotient
    # (53 >= 2 * 24 + 2), i.e. what the fp32 division of the spec gives.
    m = reference.fp8_max(fp8_dtype)
    q = (x.double().cpu() / scale.double().cpu()).float().double().clamp(-m, m)
    return oracle_encode(q, fp8_dtype).view(fp8_dtype)


def oracle_scale(x: torch.Tensor, fp8_dtype, dim=None) -> torch.Tensor:
    a = x.double().cpu().abs()
    amax = a.amax() if dim is None else a.amax(dim=dim, keepdim=True)
    return (
        (amax / reference.fp8_max(fp8_dtype))
        .float()
        .clamp_min(2.0**-126)
        .reshape((1,) if dim is None else amax.shape)
    )


# ------------------------------------------------------------------------------------------------
# Reference against the oracle


@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_reference_matches_oracle(dtype, fp8_dtype):
    x = _data((97, 61), dtype, "cpu", seed=1)
    out, scale = reference.per_tensor_quant_fp8(x, fp8_dtype=fp8_dtype)
    assert torch.equal(scale, oracle_scale(x, fp8_dtype))
    assert_fp8_equal(out, oracle_quantize(x, scale, fp8_dtype), exact_nan=True)
    s = torch.tensor([0.0137], dtype=torch.float32)
    out, _ = reference.per_tensor_quant_fp8(x, s, fp8_dtype)
    assert_fp8_equal(out, oracle_quantize(x, s, fp8_dtype), exact_nan=True)
    out, scales = reference.per_token_quant_fp8(x, fp8_dtype)
    assert scales.shape == (97, 1) and torch.equal(scales, oracle_scale(x, fp8_dtype, dim=-1))
    assert_fp8_equal(out, oracle_quantize(x, scales, fp8_dtype), exact_nan=True)


def test_reference_conversion_matches_oracle_on_every_bf16():
    x = _every_16bit(torch.bfloat16)
    x = x[x.float().isfinite()]
    for fp8_dtype in FP8:
        for s in (1.0, 0.37, 2.0**-20):
            scale = torch.tensor([s])
            got = reference.quantize(x, scale, fp8_dtype)
            assert_fp8_equal(got, oracle_quantize(x, scale, fp8_dtype), exact_nan=True)


# ------------------------------------------------------------------------------------------------
# The CUDA kernels divide 16-bit inputs by one Markstein step: exact emulation on the CPU

# Scale significands checked: every SCALE_STRIDE-th of the 2^23, from a random start. Stride 1 is
# the exhaustive check (numpy, one core: about 30 s for bf16, 6 min for fp16; both found nothing).
SCALE_STRIDE = 64


def _to_f32(a):
    return a.astype(np.float32).astype(np.float64)


def one_markstein_step(x, s):
    """The CUDA kernels' kOneStep, exactly, for float64 arrays holding fp32 values: y = rn(1/s),
    q0 = rn(x*y), r = fma(-q0, s, x), q1 = fma(r, y, q0) (scales in 2^-40..2^40)."""
    y = _to_f32(1.0 / s)  # float64, then float32: correctly rounded (53 >= 2 * 24 + 2)
    q0 = _to_f32(x * y)  # the product is exact in float64
    r = _to_f32(x - q0 * s)  # q0*s is exact (48 bits) and so is x - q0*s (within a factor 2 of x)
    t = r * y  # exact (48 bits)
    hi = q0 + t
    lo = (q0 - hi) + t  # q0 + t == hi + lo exactly (|q0| >= |t|)
    # hi rounded to odd by lo, then to fp32: the correctly rounded fma (53 >= 24 + 2)
    bits = hi.view(np.int64)
    bits = bits + ((lo != 0) & (bits % 2 == 0)) * np.sign(lo).astype(np.int64)
    return _to_f32(bits.view(np.float64))


def _significands(bits: int) -> np.ndarray:
    """Every value of [1, 2) with ``bits`` significant bits."""
    return np.arange(1 << (bits - 1), 1 << bits, dtype=np.float64) / 2.0 ** (bits - 1)


def test_one_step_emulation_is_exact_and_can_fail():
    # against exact rational arithmetic, including fp32 dividends (where one step is not enough)
    rng = np.random.default_rng(5)
    x = rng.integers(1 << 23, 1 << 24, 300) / 2.0**23 * 2.0 ** rng.integers(-2, 3, 300)
    s = rng.integers(1 << 23, 1 << 24, 300) / 2.0**23 * 2.0 ** rng.integers(-2, 3, 300)

    def rn(v: Fraction) -> Fraction:  # nearest-even float32 of a rational (normal range)
        if v < 0:
            return -rn(-v)
        if v == 0:
            return v
        e = v.numerator.bit_length() - v.denominator.bit_length()
        e += 1 if Fraction(2) ** e <= v else 0
        ulp = Fraction(2) ** (e - 24)
        n, rem = divmod(v / ulp, 1)
        return (n + (rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1))) * ulp

    got = one_markstein_step(x, s)
    for xi, si, gi in zip(x.tolist(), s.tolist(), got.tolist(), strict=True):
        X, S = Fraction(xi), Fraction(si)
        y = rn(1 / S)
        q0 = rn(X * y)
        r = rn(X - q0 * S)
        assert Fraction(gi) == rn(q0 + r * y)
    # it does tell a wrong quotient: the product alone (q0) is off for many bf16 dividends
    xb = _significands(8)[None, :]
    sb = (rng.integers(1 << 23, 1 << 24, 64) / 2.0**23)[:, None]
    assert (_to_f32(xb * _to_f32(1.0 / sb)) != _to_f32(xb / sb)).any()


@pytest.mark.parametrize("bits", [8, 11], ids=["bf16", "fp16"])
def test_one_markstein_step_is_the_correctly_rounded_quotient(bits):
    """For dividends of at most 11 significant bits (bf16, fp16) one step from the correctly rounded
    reciprocal gives the correctly rounded fp32 quotient, so the fp8 byte cannot differ from a true
    division. Significands suffice: for scales in 2^-40..2^40 the exponents scale every step exactly
    (no intermediate is subnormal where the quotient could round to a non-zero fp8 value)."""
    rng = np.random.default_rng(bits)
    x = _significands(bits)[None, :]
    start = (1 << 23) + int(rng.integers(SCALE_STRIDE))
    for first in range(start, 1 << 24, SCALE_STRIDE * 4096):
        s = (np.arange(first, min(first + SCALE_STRIDE * 4096, 1 << 24), SCALE_STRIDE) / 2.0**23)[
            :, None
        ]
        wrong = one_markstein_step(x, s) != _to_f32(x / s)
        assert not wrong.any(), f"x={x[0, wrong.any(0)][0]!r}"


# ------------------------------------------------------------------------------------------------
# Every backend against the reference (bit for bit)

SHAPES = [(1,), (7,), (4109,), (3, 5, 7), (129, 4096), (1000, 37)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype,fp8_dtype", COMBOS, ids=COMBO_IDS)
def test_per_tensor(backend, shape, dtype, fp8_dtype):
    dev = _device(backend)
    x = _data(shape, dtype, dev, seed=len(shape) + shape[-1])
    want, want_scale = reference.per_tensor_quant_fp8(x, fp8_dtype=fp8_dtype)
    out = _poisoned(shape, fp8_dtype, dev)
    got, scale = _run(backend, sgljit.ops.per_tensor_quant_fp8, x, out=out, fp8_dtype=fp8_dtype)
    assert got is out and scale.shape == (1,) and scale.dtype == torch.float32
    assert torch.equal(_bits(scale), _bits(want_scale)), (scale, want_scale)
    assert_fp8_equal(got, want, exact_nan=dev == "cuda")
    # static, with a scale that is not a power of two
    s = torch.tensor([0.0173], dtype=torch.float32, device=dev)
    out = _poisoned(shape, fp8_dtype, dev)
    got, scale = _run(backend, sgljit.ops.per_tensor_quant_fp8, x, s, out=out, fp8_dtype=fp8_dtype)
    assert scale is s
    assert_fp8_equal(got, reference.quantize(x, s, fp8_dtype), exact_nan=dev == "cuda")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "rows,hidden", [(1, 1), (1, 4096), (7, 37), (33, 4096), (5, 5120), (3, 40000)]
)
@pytest.mark.parametrize("dtype,fp8_dtype", COMBOS, ids=COMBO_IDS)
def test_per_token(backend, rows, hidden, dtype, fp8_dtype):
    dev = _device(backend)
    x = _data((rows, hidden), dtype, dev, seed=rows + hidden)
    if rows > 2:
        x[1] = 0  # an all-zero row: finite scale 2^-126, zeros out
    want, want_scales = reference.per_token_quant_fp8(x, fp8_dtype)
    out = _poisoned((rows, hidden), fp8_dtype, dev)
    got, scales = _run(backend, sgljit.ops.per_token_quant_fp8, x, out=out, fp8_dtype=fp8_dtype)
    assert scales.shape == (rows, 1) and scales.dtype == torch.float32
    assert torch.equal(_bits(scales), _bits(want_scales))
    assert_fp8_equal(got, want, exact_nan=dev == "cuda")
    if rows > 2:
        assert scales[1].item() == 2.0**-126 and not got[1].float().any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_token_strided_rows(backend):
    dev = _device(backend)
    buf = _data((37, 4096 + 64), torch.bfloat16, dev, seed=5)
    x = buf[:, 32 : 32 + 4096]  # rows 8320 elements apart, start offset 64 bytes
    obuf = _poisoned((37, 4096 + 48), E4M3, dev)
    out = obuf[:, 16 : 16 + 4096]
    got, scales = _run(backend, sgljit.ops.per_token_quant_fp8, x, out=out)
    want, want_scales = reference.per_token_quant_fp8(x.contiguous(), E4M3)
    assert torch.equal(scales, want_scales)
    assert_fp8_equal(got, want, exact_nan=dev == "cuda")
    # bytes around the view are untouched
    assert (obuf[:, :16].view(torch.uint8) == 0xFF).all()
    assert (obuf[:, 16 + 4096 :].view(torch.uint8) == 0xFF).all()
    # an odd offset and row stride (no 16-byte vectors possible)
    y = buf.view(-1)[1 : 1 + 37 * 4099].view(37, 4099)[:, :4097]
    got, scales = _run(backend, sgljit.ops.per_token_quant_fp8, y)
    want, want_scales = reference.per_token_quant_fp8(y.contiguous(), E4M3)
    assert torch.equal(scales, want_scales)
    assert_fp8_equal(got, want, exact_nan=dev == "cuda")


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_tensor_misaligned_and_special_values(backend):
    dev = _device(backend)
    x = _data((4109 * 3 + 1,), torch.bfloat16, dev, seed=9)[1:]  # contiguous, 2-byte aligned
    for scale in (None, torch.tensor([0.37], device=dev)):
        got, s = _run(backend, sgljit.ops.per_tensor_quant_fp8, x, scale)
        want, ws = reference.per_tensor_quant_fp8(x, scale)
        assert torch.equal(s, ws)
        assert_fp8_equal(got, want, exact_nan=dev == "cuda")
    # inf, -inf, NaN, -0.0, huge, subnormal, near-max values with a static scale; a NaN makes
    # the dynamic scale NaN (and every output NaN)
    special = torch.tensor(
        [float("inf"), -float("inf"), float("nan"), -0.0, 0.0, 3e38, -3e38, 1e-40, 448.0, 464.0]
        * 7,
        dtype=torch.float32,
    )
    for dtype, fp8_dtype in COMBOS:
        xs = special.to(dtype).to(dev)
        s = torch.tensor([1.0], device=dev)
        got, _ = _run(backend, sgljit.ops.per_tensor_quant_fp8, xs, s, fp8_dtype=fp8_dtype)
        assert_fp8_equal(got, reference.quantize(xs, s, fp8_dtype), exact_nan=dev == "cuda")
        got, s = _run(backend, sgljit.ops.per_tensor_quant_fp8, xs, fp8_dtype=fp8_dtype)
        assert s.isnan().all() and got.float().isnan().all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_input_gives_finite_scale(backend):
    dev = _device(backend)
    x = torch.zeros(5, 4096, dtype=torch.bfloat16, device=dev)
    got, s = _run(backend, sgljit.ops.per_tensor_quant_fp8, x)
    assert s.item() == 2.0**-126 and torch.isfinite(s).all()
    assert not got.float().any()
    got, s = _run(backend, sgljit.ops.per_token_quant_fp8, x)
    assert (s == 2.0**-126).all() and not got.float().any()
    # the caller never zeroes the scale: a garbage-filled scale buffer is not an input
    y = _data((3, 4096), torch.bfloat16, dev, seed=2)
    for _ in range(2):
        got, s = _run(backend, sgljit.ops.per_tensor_quant_fp8, y)
        assert torch.equal(s, reference.per_tensor_scale(y, E4M3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_scales_written_into_the_callers_tensors(backend):
    """``scale_out=`` (dynamic per-tensor) and ``scales=`` (per-token) are written, whatever they
    held, and returned as given."""
    dev = _device(backend)
    x = _data((7, 1000), torch.bfloat16, dev, seed=6)
    buf = torch.full((1,), float("nan"), device=dev)
    got, s = _run(backend, sgljit.ops.per_tensor_quant_fp8, x, scale_out=buf)
    want, ws = reference.per_tensor_quant_fp8(x)
    assert s is buf and torch.equal(s, ws)
    assert_fp8_equal(got, want, exact_nan=dev == "cuda")
    scalar = torch.tensor(float("nan"), device=dev)  # a 0-d scale_out, as a given scale may be
    got, s = _run(backend, sgljit.ops.per_tensor_quant_fp8, x, scale_out=scalar)
    assert s is scalar and s.dim() == 0 and torch.equal(s.view(1), ws)
    assert_fp8_equal(got, want, exact_nan=dev == "cuda")
    bufs = torch.full((7, 1), float("nan"), device=dev)
    got, s = _run(backend, sgljit.ops.per_token_quant_fp8, x, scales=bufs, fp8_dtype=E5M2)
    want, ws = reference.per_token_quant_fp8(x, E5M2)
    assert s is bufs and torch.equal(s, ws)
    assert_fp8_equal(got, want, exact_nan=dev == "cuda")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype,fp8_dtype", COMBOS[:3], ids=COMBO_IDS[:3])
def test_exhaustive_conversion(backend, dtype, fp8_dtype):
    """Every 16-bit pattern (incl. NaN, inf, subnormals) through the static path at several
    scales, and the finite ones through the dynamic path, against PyTorch."""
    dev = _device(backend)
    x = _every_16bit(dtype).to(dev)
    for s in (1.0, 0.37, 3.0, 1 / 448, 2.0**-20, 1e-30, 7.5e4, 3e38, 0.0, -2.0):
        scale = torch.tensor([s], dtype=torch.float32, device=dev)
        got, _ = _run(backend, sgljit.ops.per_tensor_quant_fp8, x, scale, fp8_dtype=fp8_dtype)
        assert_fp8_equal(got, reference.quantize(x, scale, fp8_dtype), exact_nan=dev == "cuda")
    finite = x[x.float().isfinite()]
    got, s = _run(backend, sgljit.ops.per_tensor_quant_fp8, finite, fp8_dtype=fp8_dtype)
    want, ws = reference.per_tensor_quant_fp8(finite, fp8_dtype=fp8_dtype)
    assert torch.equal(s, ws)
    assert_fp8_equal(got, want, exact_nan=True)
    rows = finite[: finite.numel() // 64 * 64].view(-1, 64)
    got, s = _run(backend, sgljit.ops.per_token_quant_fp8, rows, fp8_dtype=fp8_dtype)
    want, ws = reference.per_token_quant_fp8(rows, fp8_dtype)
    assert torch.equal(s, ws)
    assert_fp8_equal(got, want, exact_nan=True)


# ------------------------------------------------------------------------------------------------
# What the public functions check beyond the kernel ops' specs (those are the conformance suite's)


def test_public_function_errors_name_the_argument():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    f, g = sgljit.ops.per_tensor_quant_fp8, sgljit.ops.per_token_quant_fp8
    cases = [
        (TypeError, "input", lambda: f([1.0, 2.0])),
        (TypeError, "fp8_dtype", lambda: f(x, fp8_dtype=torch.float16)),
        # an fp8 out of the other format than fp8_dtype: the kernel op would accept it
        (TypeError, "out", lambda: f(x, out=torch.empty(4, 8, dtype=E5M2))),
        (TypeError, "out", lambda: f(x, out=torch.empty(4, 8, dtype=torch.bfloat16))),
        (TypeError, "scale", lambda: f(x, 0.5)),
        (ValueError, "scale", lambda: f(x, torch.ones(2))),
        (ValueError, "scale", lambda: f(x, torch.ones(1, 1))),
        (ValueError, "scale_out", lambda: f(x, torch.ones(1), scale_out=torch.empty(1))),
        (ValueError, "scale_out", lambda: f(x, scale_out=torch.empty(2))),
        (ValueError, "scale_out", lambda: f(x, scale_out=torch.empty(1, dtype=torch.float16))),
        # any shape is viewed as [1, numel]: out must have input's shape, both contiguous
        (ValueError, "out", lambda: f(torch.randn(2, 3, 4), out=torch.empty(6, 4, dtype=E4M3))),
        (ValueError, "out", lambda: f(torch.randn(24), out=torch.empty(24, 2, dtype=E4M3)[:, 0])),
        (ValueError, "input", lambda: f(torch.randn(2, 4, 3).transpose(1, 2))),
        (ValueError, "input", lambda: f(x.t())),
        (TypeError, "input", lambda: g([[1.0]])),
        (ValueError, "input", lambda: g(torch.randn(2, 4, 8))),
        (ValueError, "input", lambda: g(torch.tensor(1.0))),
        (TypeError, "fp8_dtype", lambda: g(x, fp8_dtype=torch.uint8)),
        (TypeError, "out", lambda: g(x, out=torch.empty(4, 8, dtype=E5M2))),
        (ValueError, "out", lambda: g(x, out=torch.empty(4, 7, dtype=E4M3))),
    ]
    for exc, name, call in cases:
        with pytest.raises(exc, match=rf"^{name}\b"):
            call()


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_tensor_0d_scale_and_any_input_shape(backend):
    dev = _device(backend)
    x = _data((2, 3, 5), torch.float16, dev, seed=4)
    s = torch.tensor(0.0173, device=dev)  # [] is as good as [1], and is returned as given
    got, scale = _run(backend, sgljit.ops.per_tensor_quant_fp8, x, s)
    assert scale is s and got.shape == x.shape and got.dtype == E4M3
    assert_fp8_equal(got, reference.quantize(x, s, E4M3), exact_nan=dev == "cuda")
    got, scale = _run(backend, sgljit.ops.per_tensor_quant_fp8, torch.tensor(3.0, device=dev))
    assert got.shape == () and scale.shape == (1,) and got.float().item() == 448.0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", [-1, 4])
def test_dynamic_algo_out_of_range_is_refused(backend, algo):
    # The private op's algorithm index (0..3) is checked before any launch, on every backend.
    dev = _device(backend)
    x = _data((1, 4096), torch.bfloat16, dev, seed=3)
    out = _poisoned(x.shape, E4M3, dev)
    scale = torch.full((1,), float("nan"), device=dev)
    workspace = torch.zeros(ops.WORKSPACE_SIZE, device=dev)
    bound = ">= 0" if algo < 0 else "<= 3"
    with (
        _ctx(backend),
        pytest.raises(ValueError, match=rf"^algo: expected a value {bound}, got {algo}"),
    ):
        ops._per_tensor_dynamic(x, out, scale, workspace, algo)
    assert torch.isnan(scale).all()  # nothing ran


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_workspace_has_its_declared_size(backend):
    # The workspace caps the absmax grid (one partial maximum per block): exactly WORKSPACE_SIZE
    # float32 elements, checked before any launch.
    dev = _device(backend)
    x = _data((1, 4096), torch.bfloat16, dev, seed=3)
    out = _poisoned(x.shape, E4M3, dev)
    scale = torch.full((1,), float("nan"), device=dev)
    for size in (0, 8, ops.WORKSPACE_SIZE + 1):
        workspace = torch.zeros(size, device=dev)
        with _ctx(backend), pytest.raises(ValueError, match=r"^workspace: dimension 0 expected"):
            ops._per_tensor_dynamic(x, out, scale, workspace, DYNAMIC_MODES["two_kernels"])
        assert torch.isnan(scale).all(), size  # nothing ran


# ------------------------------------------------------------------------------------------------
# CUDA compile in CI (no GPU needed)


@pytest.fixture(scope="module")
def cuda_build_env(tmp_path_factory):
    """SGLJIT_CUDA_ARCH=9.0a (unless set) and a module-wide private cache dir (one compile per
    specialization for the whole module)."""
    with pytest.MonkeyPatch.context() as mp:
        if not HAS_CUDA:
            mp.setenv("SGLJIT_CUDA_ARCH", os.environ.get("SGLJIT_CUDA_ARCH", "9.0a"))
            mp.setenv("SGLJIT_CACHE_DIR", str(tmp_path_factory.mktemp("quant_fp8_cache")))
        yield


def _has_nvcc() -> bool:
    from sgljit.toolchain import find_nvcc

    return find_nvcc() is not None


@pytest.mark.skipif(not _has_nvcc(), reason="nvcc not found")
def test_cuda_compiles(cuda_build_env):
    """Every (dtype, fp8 dtype) the tests use, two builds at a time (~10 s each): one module holds
    the three per-tensor and per-token ops' checked entry points; and the per-token-group module of
    each group size (bf16 -> e4m3) and of fp32 -> e5m2 (group size 32: 4-element vectors)."""
    from concurrent.futures import ThreadPoolExecutor

    def build(combo):
        return ops.family.prebuild(
            "cuda", "per_tensor_quant_fp8_static", dtype=combo[0], fp8_dtype=combo[1]
        )

    def build_group(spec):
        dtype, fp8_dtype, group_size = spec
        return ops.family.prebuild(
            "cuda",
            "per_token_group_quant_fp8",
            dtype=dtype,
            fp8_dtype=fp8_dtype,
            group_size=group_size,
        )

    shared = [op for op in ops.family.ops.values() if op.cuda.module == ops._MODULE]
    assert len(shared) == 3
    group_specs = [(torch.bfloat16, E4M3, g) for g in ops.GROUP_SIZES]
    group_specs.append((torch.float32, E5M2, 32))
    with ThreadPoolExecutor(2) as pool:
        mods = list(pool.map(build, COMBOS))
        group_mods = list(pool.map(build_group, group_specs))
    for mod in mods:
        for op in shared:
            assert callable(getattr(mod, op.name))
    for mod in group_mods:
        assert callable(mod.per_token_group_quant_fp8)


def test_prebuild_specs_cover_all_dtypes():
    specs = ops.family.prebuild_specs("cuda")  # called with the backend, as `sgljit build` does
    with pytest.raises(ValueError, match="backend"):
        ops.family.prebuild_specs("rocm")
    shared = [s for s in specs if not s["op"].startswith("per_token_group_quant")]
    assert len(shared) == 6
    assert {(s["op"], s["dtype"], s["fp8_dtype"]) for s in shared} == {
        ("per_tensor_quant_fp8_static", d, f)
        for d in ("bfloat16", "float16", "float32")
        for f in ("float8_e4m3fn", "float8_e5m2")
    }
    # per-token-group: its own modules, bf16 and fp16 at group size 128 (DeepSeek-style) and bf16
    # at 64
    assert {
        (s["dtype"], s["fp8_dtype"], s["group_size"])
        for s in specs
        if s["op"] == "per_token_group_quant_fp8"
    } == {
        ("bfloat16", "float8_e4m3fn", 128),
        ("float16", "float8_e4m3fn", 128),
        ("bfloat16", "float8_e4m3fn", 64),
    }
    # SYCL: the same six modules, by their -D macros
    assert {(s["SGLJIT_T"], s["QFP8_E5M2"]) for s in ops.family.prebuild_specs("sycl")} == {
        (d, e) for d in ("bfloat16", "float16", "float32") for e in (0, 1)
    }
    with pytest.raises(ValueError, match="rocm"):
        ops.family.prebuild("rocm", **specs[0])


# ------------------------------------------------------------------------------------------------
# GPU only: every dynamic code path, large shapes, torch.compile, CUDA graphs


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(DYNAMIC_MODES.values()), ids=list(DYNAMIC_MODES))
@pytest.mark.parametrize(
    # auto: one launch (the tensor as one row of the per-token kernel) up to 64 KB, two kernels above,
    # three beyond twice the L2 size (test_cuda_large)
    "numel",
    [0, 1, 7, 1023, 8 * 1024 + 3, 32768, 32769, 4109 * 4096 + 5, 19260817],
    ids=lambda n: f"n{n}",
)
def test_cuda_dynamic_modes(mode, numel):
    x = _data((numel,), torch.bfloat16, "cuda", seed=numel % 1000)
    if numel:
        x[numel // 2] = -97.25  # the max sits in the middle of some block's chunk
    _check_dynamic_mode(x, mode, E4M3)


def _check_dynamic_mode(x: torch.Tensor, mode: int, fp8_dtype: torch.dtype) -> None:
    """Runs the dynamic per-tensor op in ``mode`` on poisoned outputs; scale and values must be
    bit-identical to the reference."""
    out = _poisoned(x.shape, fp8_dtype, "cuda")
    scale = torch.full((1,), float("nan"), device="cuda")
    workspace = torch.full((ops.WORKSPACE_SIZE,), float("nan"), device="cuda")
    ops._per_tensor_dynamic(x.view(1, -1), out.view(1, -1), scale, workspace, mode)
    want, ws = reference.per_tensor_quant_fp8(x, fp8_dtype=fp8_dtype)
    assert torch.equal(scale, ws)
    assert_fp8_equal(out, want, exact_nan=True)


def _check_per_token(x: torch.Tensor, fp8_dtype: torch.dtype) -> None:
    """Runs the per-token op on ``x`` (on its device); scales and values must be bit-identical to
    the reference."""
    got, got_scales = sgljit.ops.per_token_quant_fp8(x, fp8_dtype=fp8_dtype)
    want, want_scales = reference.per_token_quant_fp8(x, fp8_dtype)
    assert torch.equal(got_scales, want_scales)
    assert_fp8_equal(got, want, exact_nan=True)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(FORCED_MODES.values()), ids=list(FORCED_MODES))
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "unaligned"])
def test_cuda_dynamic_modes_other_dtypes(mode, fp8_dtype, dtype, offset):
    # The fused and multi-kernel paths for the input types test_cuda_dynamic_modes (bf16) does not
    # cover; offset 1: the input starts one element into its storage (no 16-byte vectors: "fused"
    # then runs two kernels).
    numel = 4109 * 1024 + 5
    x = _data((numel + offset,), dtype, "cuda", seed=7 + offset)[offset:]
    x[numel // 3] = -1234.5
    _check_dynamic_mode(x, mode, fp8_dtype)


@needs_gpu
@pytest.mark.gpu
def test_cuda_module_refuses_dtypes_it_was_not_compiled_for():
    # Dispatch picks the module by dtypes; a direct call of another module's function is refused.
    mod = ops.family.cuda_module(ops._MODULE, {"dtype": torch.bfloat16, "fp8_dtype": E4M3})
    x = torch.randn(4, 8, device="cuda")
    out = torch.empty(4, 8, dtype=E4M3, device="cuda")
    scales = torch.empty(4, 1, device="cuda")
    with pytest.raises(ValueError, match=r"^input: this module was compiled for dtype bfloat16"):
        mod.per_token_quant_fp8(x, out, scales)
    with pytest.raises(ValueError, match=r"^out: this module was compiled for dtype float8_e4m3fn"):
        mod.per_tensor_quant_fp8_static(x.bfloat16(), torch.ones(1, device="cuda"), out.view(E5M2))


def _near_boundaries(scale: float, fp8_dtype, g: torch.Generator, reach: int = 6) -> torch.Tensor:
    """fp32 values x with x / scale within about ``reach`` ulps of every point where the fp8
    conversion changes its result (each finite non-zero value, each midpoint between neighbours),
    both signs, shuffled."""
    _, vals = _fp8_table(fp8_dtype)
    points = torch.cat([vals[1:], (vals[:-1] + vals[1:]) / 2])  # exact in fp32
    centre = (points * scale).float().view(torch.int32)
    x = (centre[:, None] + torch.arange(-reach, reach + 1, dtype=torch.int32)).view(torch.float32)
    x = torch.cat([x.flatten(), -x.flatten()])
    return x[torch.randperm(x.numel(), generator=g)]


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_cuda_quotients_near_fp8_boundaries(fp8_dtype):
    """The quotient's rounding decides the fp8 byte only near a rounding boundary: quotients a few
    ulps from every boundary, at scales over 2^-30..2^30, through the static, per-token and every
    dynamic per-tensor path; and every bf16 pattern at 16 random scales."""
    g = torch.Generator().manual_seed(11)
    scales = torch.exp2(torch.empty(48, dtype=torch.float64).uniform_(-30, 30, generator=g)).float()
    bf16_all = _every_16bit(torch.bfloat16).cuda()
    for s in scales[:16]:
        scale = s.reshape(1).cuda()
        for x in (_near_boundaries(float(s), fp8_dtype, g).cuda(), bf16_all):
            got, _ = sgljit.ops.per_tensor_quant_fp8(x, scale, fp8_dtype=fp8_dtype)
            assert_fp8_equal(got, reference.quantize(x, scale, fp8_dtype), exact_nan=True)
    # per-token: each row's own scale is within a few ulps of the scale its values were made for
    rows = torch.stack([_near_boundaries(float(s), fp8_dtype, g) for s in scales]).cuda()
    _check_per_token(rows, fp8_dtype)
    # dynamic per-tensor, every path: 4.6M elements (18 MB)
    x = _near_boundaries(float(scales[0]), fp8_dtype, g).repeat(700).cuda()
    for mode in DYNAMIC_MODES.values():
        _check_dynamic_mode(x, mode, fp8_dtype)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_cuda_static_every_16bit_value(dtype, fp8_dtype):
    """16-bit inputs are divided by one Markstein step (see test_one_markstein_step_is_the_
    correctly_rounded_quotient): every bit pattern (inf, NaN, subnormals included) at 160 scales:
    random significands over 2^-40..2^40 (the one-step range), its edges and just outside it."""
    g = torch.Generator().manual_seed(17)
    every = _every_16bit(dtype).cuda()
    edges = torch.tensor([2.0**-40, 2.0**40, 2.0**-41, 2.0**41, 1.0, 3.0, 1e-30, 1e30, 2.0**-126])
    edges = torch.cat(
        [edges, edges.nextafter(torch.tensor(0.0)), edges.nextafter(torch.tensor(1e38))]
    )
    scales = torch.cat([edges, torch.exp2(torch.empty(133).uniform_(-40, 40, generator=g))]).float()
    for s in scales:
        scale = s.reshape(1).cuda()
        got, _ = sgljit.ops.per_tensor_quant_fp8(every, scale, fp8_dtype=fp8_dtype)
        assert_fp8_equal(got, reference.quantize(every, scale, fp8_dtype), exact_nan=True)
    # per-token rows whose own scales fall over the same range
    reach = 24 if dtype == torch.bfloat16 else 3
    rows = _data((64, 480), torch.float64, "cpu", seed=17) * torch.exp2(
        torch.randint(-reach, reach, (64, 1), generator=g)
    )
    rows = rows.to(dtype).cuda()
    _check_per_token(rows, fp8_dtype)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_cuda_dynamic_bf16_every_value_at_its_scale(fp8_dtype):
    """Dynamic scales bound every quotient by fp8_max, so the one-step division there has no guard
    for huge quotients: every finite bf16 value up to the absmax, for 12 absmax values, through
    every path."""
    g = torch.Generator().manual_seed(13)
    every = _every_16bit(torch.bfloat16)
    every = every[every.float().isfinite()]
    for p in torch.randint(0x3000, 0x4F80, (12,), generator=g).tolist():
        absmax = torch.tensor([p], dtype=torch.int16).view(torch.bfloat16)
        x = every[every.float().abs() <= absmax.float()]
        x = x[torch.randperm(x.numel(), generator=g)].repeat(3).cuda()
        for mode in DYNAMIC_MODES.values():
            _check_dynamic_mode(x, mode, fp8_dtype)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "unaligned"])
@pytest.mark.parametrize(
    # static: chunks of 32 * N vectors with N = 1, 4 (4109 x 4096 + 5) and 16 (19260817), and tails
    "numel",
    [1, 7, 1023, 8 * 1024 + 3, 32769, 4109 * 4096 + 5, 19260817],
    ids=lambda n: f"n{n}",
)
def test_cuda_static_sizes(numel, offset):
    # offset 1: the input starts 2 bytes into its storage, so 16-byte vectors cannot be used
    x = _data((numel + offset,), torch.bfloat16, "cuda", seed=numel % 1000)[offset:]
    scale = torch.tensor([0.0371], device="cuda")
    out = _poisoned((numel,), E4M3, "cuda")
    got, s = sgljit.ops.per_tensor_quant_fp8(x, scale, out=out)
    assert got is out and s is scale
    assert_fp8_equal(out, reference.quantize(x, scale, E4M3), exact_nan=True)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((16384, 4096), torch.bfloat16),
        ((65536, 4096), torch.bfloat16),
        ((8192, 4096), torch.float32),
    ],
    ids=["16384x4096-bf16", "65536x4096-bf16", "8192x4096-fp32"],
)
def test_cuda_fused_large(shape, dtype):
    # The fused kernel where its ring and L2-kept chunks are used (the smaller sizes of
    # test_cuda_dynamic_modes fit in the blocks' shared memory or barely beyond).
    x = _data(shape, dtype, "cuda", seed=21)
    x.view(-1)[x.numel() * 2 // 3] = -777.0
    _check_dynamic_mode(x, 1, E4M3)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("shape", [(19260817, 1), (65536, 4096)], ids=["19260817x1", "65536x4096"])
def test_cuda_large(shape, fp8_dtype):
    x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    got, s = sgljit.ops.per_tensor_quant_fp8(x, fp8_dtype=fp8_dtype)
    want, ws = reference.per_tensor_quant_fp8(x, fp8_dtype=fp8_dtype)
    assert torch.equal(s, ws)
    assert_fp8_equal(got, want, exact_nan=True)
    del want
    got, s = sgljit.ops.per_tensor_quant_fp8(x, ws * 0.75, fp8_dtype=fp8_dtype)
    assert_fp8_equal(got, reference.quantize(x, ws * 0.75, fp8_dtype), exact_nan=True)
    del got
    _check_per_token(x, fp8_dtype)


@needs_gpu
@pytest.mark.gpu
def test_cuda_torch_compile_fullgraph():
    per_tensor, per_token = sgljit.ops.per_tensor_quant_fp8, sgljit.ops.per_token_quant_fp8

    def fn(x, s):
        a, sa = per_tensor(x)
        b, sb = per_token(x, fp8_dtype=E5M2)
        c, _ = per_tensor(x, s)
        return a, sa, b, sb, c

    compiled = torch.compile(fn, fullgraph=True)
    x = _data((300, 4096), torch.bfloat16, "cuda", seed=3)
    s = torch.tensor([0.05], device="cuda")
    for got, want in zip(compiled(x, s), fn(x, s), strict=True):
        assert torch.equal(_bits(got), _bits(want))
    want = reference.per_tensor_quant_fp8(x)
    a, sa, *_ = compiled(x, s)
    assert torch.equal(sa, want[1]) and torch.equal(_bits(a), _bits(want[0]))


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(DYNAMIC_MODES.values()), ids=list(DYNAMIC_MODES))
def test_cuda_graph_capture_and_replay(mode):
    x = _data((4109, 4096), torch.bfloat16, "cuda", seed=4)
    out = torch.empty(x.shape, dtype=E4M3, device="cuda")
    scale = torch.empty(1, device="cuda")
    workspace = torch.empty(ops.WORKSPACE_SIZE, device="cuda")
    tok_out = torch.empty(x.shape, dtype=E4M3, device="cuda")
    tok_scales = torch.empty(4109, 1, device="cuda")

    def step():
        ops._per_tensor_dynamic(x, out, scale, workspace, mode)
        ops._per_token(x, tok_out, tok_scales)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm up (builds, first-launch attributes) outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in (11, 12):
        x.copy_(_data(x.shape, torch.bfloat16, "cuda", seed=seed))
        out.view(torch.uint8).fill_(0xFF)
        tok_out.view(torch.uint8).fill_(0xFF)
        scale.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want, ws = reference.per_tensor_quant_fp8(x)
        assert torch.equal(scale, ws)
        assert_fp8_equal(out, want, exact_nan=True)
        want, ws = reference.per_token_quant_fp8(x, E4M3)
        assert torch.equal(tok_scales, ws)
        assert_fp8_equal(tok_out, want, exact_nan=True)


def test_dynamic_mode_env_is_read_once_at_import(monkeypatch):
    with pytest.raises(ValueError, match="SGLJIT_QUANT_FP8_DYNAMIC='fastest'"):
        ops._dynamic_algo("fastest")
    monkeypatch.setenv("SGLJIT_QUANT_FP8_DYNAMIC", "fastest")  # too late: read at import
    x = torch.randn(8)
    assert torch.equal(sgljit.ops.per_tensor_quant_fp8(x)[1], reference.per_tensor_scale(x, E4M3))
    # A fresh process: the value at import is the algorithm; a bad one fails the dynamic op only.
    script = (
        "import torch, sgljit\n"
        "from sgljit_quant_fp8 import ops\n"
        "print(ops._DYNAMIC_ALGO)\n"
        "sgljit.ops.per_tensor_quant_fp8(torch.randn(8), torch.ones(1))\n"
        "sgljit.ops.per_tensor_quant_fp8(torch.randn(8))\n"
    )
    for value, expect in (("three_kernels", "3\n"), ("fastest", "None\n")):
        env = {**os.environ, "SGLJIT_QUANT_FP8_DYNAMIC": value}
        run = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True
        )
        assert run.stdout == expect, run.stderr
        if value == "fastest":
            assert "ValueError: SGLJIT_QUANT_FP8_DYNAMIC='fastest'" in run.stderr
        else:
            assert run.returncode == 0, run.stderr


# ------------------------------------------------------------------------------------------------
# Per-token-group: the reference against the oracle, every backend against the reference (codes
# and scales bit for bit), the NaN/inf/eps policy, layouts, errors; on a GPU every launch shape.

GROUP_LAYOUTS = ["row", "col", "col-ue8m0"]


def oracle_group_scales(x, group_size, fp8_dtype, eps=1e-10, ue8m0=False) -> torch.Tensor:
    """float64 arithmetic: max(absmax / fp8_max rounded to fp32, fp32(eps)); ue8m0 through frexp."""
    rows, hidden = x.shape
    amax = x.double().cpu().reshape(rows, hidden // group_size, group_size).abs().amax(dim=-1)
    s = (amax / reference.fp8_max(fp8_dtype)).float().double()
    s = torch.maximum(s, torch.tensor(eps, dtype=torch.float32).double())
    if ue8m0:
        mant, exp = torch.frexp(s)  # s = mant * 2^exp, mant in [0.5, 1)
        s = torch.where((mant == 0.5) | ~s.isfinite(), s, torch.ldexp(torch.ones_like(s), exp))
    return s.float()


def oracle_group_quantize(x, scales, group_size, fp8_dtype) -> torch.Tensor:
    rows, hidden = x.shape
    per_element = scales.repeat_interleave(group_size, dim=1)
    return oracle_quantize(x.reshape(rows, hidden), per_element, fp8_dtype)


def _group_data(rows, hidden, group_size, dtype, device, seed=0) -> torch.Tensor:
    """Groups over magnitudes 2^-12..2^12, one tiny (scale eps) and one all zero."""
    g = torch.Generator().manual_seed(seed)
    per_row = hidden // group_size
    mags = torch.exp2(torch.randint(-12, 13, (rows, per_row, 1), generator=g).double())
    mags.view(-1)[0] = 1e-12
    if mags.numel() > 2:
        mags.view(-1)[mags.numel() // 2] = 0.0
    x = torch.randn(rows, per_row, group_size, generator=g, dtype=torch.float64) * mags
    return x.view(rows, hidden).to(dtype).to(device)


def _nan_scales(shape, device, column_major=False) -> torch.Tensor:
    s = ops._group_scales(shape[0], shape[1], device, column_major)
    s.fill_(float("nan"))
    return s


def _check_group(backend, x, group_size, fp8_dtype, *, column_major=False, ue8m0=False, eps=1e-10):
    """The public function on ``backend`` into poisoned outputs; scales and codes bit for bit as the
    reference's (NaN codes: NaN-ness on the CPU)."""
    dev = x.device.type
    rows, hidden = x.shape
    out = _poisoned((rows, hidden), fp8_dtype, dev)
    scales = _nan_scales((rows, hidden // group_size), dev, column_major)
    got, got_scales = _run(
        backend,
        sgljit.ops.per_token_group_quant_fp8,
        x,
        group_size,
        eps=eps,
        fp8_dtype=fp8_dtype,
        column_major_scales=column_major,
        scale_ue8m0=ue8m0,
        out=out,
        scales=scales,
    )
    assert got is out and got_scales is scales
    want, want_scales = reference.per_token_group_quant_fp8(x, group_size, fp8_dtype, eps, ue8m0)
    assert torch.equal(got_scales.isnan(), want_scales.isnan())
    assert torch.equal(_bits(got_scales.nan_to_num()), _bits(want_scales.nan_to_num()))
    assert_fp8_equal(got, want, exact_nan=dev == "cuda")
    return got, got_scales


@pytest.mark.parametrize("ue8m0", [False, True], ids=["fp32", "ue8m0"])
@pytest.mark.parametrize("group_size", ops.GROUP_SIZES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_group_reference_matches_oracle(dtype, fp8_dtype, group_size, ue8m0):
    x = _group_data(13, 512, group_size, dtype, "cpu", seed=group_size)
    out, scales = reference.per_token_group_quant_fp8(x, group_size, fp8_dtype, 1e-10, ue8m0)
    want_scales = oracle_group_scales(x, group_size, fp8_dtype, 1e-10, ue8m0)
    assert scales.shape == (13, 512 // group_size) and torch.equal(scales, want_scales)
    assert_fp8_equal(out, oracle_group_quantize(x, scales, group_size, fp8_dtype), exact_nan=True)
    assert scales[0, 0].item() == torch.tensor(1e-10).item() or ue8m0  # the tiny group: eps
    assert (scales[6, 512 // group_size // 2] > 0).item()  # the zero group: eps, not 0


def test_pow2_ceil_is_exact():
    f32 = torch.float32
    one_up = torch.tensor(1.0).nextafter(torch.tensor(2.0)).item()
    tiny = 2.0**-126
    cases = {
        1.0: 1.0,
        one_up: 2.0,
        3.0: 4.0,
        0.75: 1.0,
        tiny: tiny,
        torch.tensor(tiny, dtype=f32).nextafter(torch.tensor(1.0)).item(): 2.0**-125,
        2.0**127: 2.0**127,
        float(torch.finfo(f32).max): float("inf"),
        float("inf"): float("inf"),
        1e-10: 2.0**-33,
    }
    got = reference.pow2_ceil(torch.tensor(list(cases), dtype=f32))
    assert got.tolist() == list(cases.values())
    assert reference.pow2_ceil(torch.tensor([float("nan")])).isnan().all()
    # against log2 where log2 is exact enough: random normal fp32 values
    g = torch.Generator().manual_seed(3)
    s = torch.exp2(torch.empty(10000, dtype=torch.float64).uniform_(-120, 120, generator=g)).float()
    want = torch.exp2(torch.ceil(torch.log2(s.double())))
    assert torch.equal(reference.pow2_ceil(s).double(), want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", GROUP_LAYOUTS)
@pytest.mark.parametrize(
    "rows,hidden,group_size",
    [(1, 4096, 128), (7, 7168, 128), (33, 2048, 64), (5, 1024, 32)],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("dtype,fp8_dtype", COMBOS, ids=COMBO_IDS)
def test_per_token_group(backend, rows, hidden, group_size, layout, dtype, fp8_dtype):
    dev = _device(backend)
    x = _group_data(rows, hidden, group_size, dtype, dev, seed=rows + hidden + group_size)
    _, scales = _check_group(
        backend,
        x,
        group_size,
        fp8_dtype,
        column_major=layout != "row",
        ue8m0=layout == "col-ue8m0",
    )
    if layout == "col-ue8m0":
        mant, _ = torch.frexp(scales.double())
        assert (mant == 0.5).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_token_group_layouts(backend):
    dev = _device(backend)
    f = sgljit.ops.per_token_group_quant_fp8
    for rows in (1, 5, 8, 0):
        x = _group_data(max(rows, 1), 512, 128, torch.bfloat16, dev, seed=rows)[:rows]
        with _ctx(backend):
            out, s = f(x, column_major_scales=True)
            assert s.shape == (rows, 4) and (not rows or s.stride() == (1, -(-rows // 4) * 4))
            assert out.shape == (rows, 512) and out.dtype == E4M3
            out, s = f(x, 64, fp8_dtype=E5M2)
            assert s.shape == (rows, 8) and s.stride() == (8, 1) and out.dtype == E5M2
        if rows:
            assert torch.equal(s, reference.per_token_group_scales(x, 64, E5M2))
    # a given scales in any layout with distinct elements: a slice of a wider buffer, written
    # through its strides, the rest untouched
    x = _group_data(6, 1024, 64, torch.float16, dev, seed=9)
    buf = torch.full((20, 9), float("nan"), device=dev)
    scales = buf[2:18, 1:7].t()  # [6, 16], strides (1, 9)
    with _ctx(backend):
        _, s = f(x, 64, column_major_scales=True, scales=scales)
    assert s is scales and torch.equal(s, reference.per_token_group_scales(x, 64, E4M3))
    written = torch.zeros_like(buf, dtype=torch.bool)
    written[2:18, 1:7] = True
    assert buf[~written].isnan().all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_token_group_strided_and_misaligned(backend):
    dev = _device(backend)
    buf = _group_data(37, 4096 + 192, 64, torch.bfloat16, dev, seed=5)
    x = buf[:, 64 : 64 + 4096]  # rows 4288 elements apart, start offset 128 bytes
    obuf = _poisoned((37, 4096 + 48), E4M3, dev)
    out = obuf[:, 16 : 16 + 4096]
    for layout in GROUP_LAYOUTS:
        got, scales = _run(
            backend,
            sgljit.ops.per_token_group_quant_fp8,
            x,
            column_major_scales=layout != "row",
            scale_ue8m0=layout == "col-ue8m0",
            out=out,
        )
        want, want_scales = reference.per_token_group_quant_fp8(
            x.contiguous(), 128, E4M3, 1e-10, layout == "col-ue8m0"
        )
        assert torch.equal(scales, want_scales)
        assert_fp8_equal(got, want, exact_nan=dev == "cuda")
        assert (obuf[:, :16].view(torch.uint8) == 0xFF).all()
        assert (obuf[:, 16 + 4096 :].view(torch.uint8) == 0xFF).all()
    # odd offset and row stride (no 16-byte vectors), fp16 and fp32
    for dtype in (torch.float16, torch.float32):
        flat = _group_data(1, 41 * 1027 + 1, 1, dtype, dev, seed=7).view(-1)
        y = flat[1:].view(41, 1027)[:, :1024]
        _check_group(backend, y, 32, E5M2)
        _check_group(backend, y, 128, E4M3, column_major=True, ue8m0=True)


def _special_rows(dtype, device) -> torch.Tensor:
    """Groups of 32: [NaN among values], [+inf among values], [-inf], [all zero], [tiny], [normal]."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 32, generator=g, dtype=torch.float64)
    x[0, 5] = float("nan")
    x[1, 7] = float("inf")
    x[2, 9] = -float("inf")
    x[3] = 0.0
    x[3, 1::2] = -0.0
    x[4] *= 1e-30
    return x.reshape(1, 192).repeat(3, 1).to(dtype).to(device)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ue8m0", [False, True], ids=["fp32", "ue8m0"])
@pytest.mark.parametrize("dtype,fp8_dtype", COMBOS, ids=COMBO_IDS)
def test_per_token_group_nan_inf_eps_policy(backend, ue8m0, dtype, fp8_dtype):
    """A NaN in a group: NaN scale, every code NaN. An inf: inf scale, NaN codes for the infs,
    +-0 (x's sign) for the rest. All-zero and tiny groups: scale fp32(eps) (ue8m0: rounded up),
    codes of the zero group +-0 with x's sign. Other groups are unaffected."""
    dev = _device(backend)
    x = _special_rows(dtype, dev)
    eps = 1e-10
    got, s = _check_group(
        backend, x, 32, fp8_dtype, column_major=True, ue8m0=ue8m0, eps=eps
    )  # bit for bit as the reference; the policy itself:
    eps32 = torch.tensor(eps, dtype=torch.float32).item()
    eps_scale = 2.0**-33 if ue8m0 else eps32
    codes = got.view(torch.uint8).cpu().view(3, 6, 32)
    nan = got.float().isnan().cpu().view(3, 6, 32)
    s = s.cpu()
    assert s[:, 0].isnan().all() and nan[:, 0].all()
    for group, col in ((1, 7), (2, 9)):
        assert (s[:, group] == float("inf")).all()
        assert nan[:, group, col].all() and nan[:, group].sum() == 3
        others = torch.ones(32, dtype=torch.bool)
        others[col] = False
        signs = torch.signbit(x[0, group * 32 : group * 32 + 32].float().cpu())[others]
        assert torch.equal(codes[:, group, others], (signs.to(torch.uint8) << 7).expand(3, -1))
    assert (s[:, 3] == eps_scale).all() and (s[:, 4] == eps_scale).all()
    assert torch.equal(codes[:, 3, 1::2], torch.full((3, 16), 0x80, dtype=torch.uint8))
    assert not codes[:, 3, 0::2].any()
    assert (s[:, 5].isfinite() & (s[:, 5] > eps_scale)).all() and not nan[:, 5].any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_token_group_eps_decides_small_groups(backend):
    dev = _device(backend)
    x = _group_data(9, 1024, 128, torch.float32, dev, seed=4)
    for eps in (1e-3, 0.1, 2.0**-126, 3e38):
        _, s = _check_group(backend, x, 128, E4M3, eps=eps)
        eps32 = torch.tensor(eps, dtype=torch.float32)
        amax_scale = reference.per_token_group_scales(x, 128, E4M3, 2.0**-126)
        want = torch.maximum(amax_scale, eps32.to(amax_scale.device))
        assert torch.equal(s, want)
        assert (s >= eps32.item()).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_token_group_bad_arguments_name_the_argument(backend):
    """Checked before anything is written, on every backend (the spec's generated checks are the
    conformance suite's; here what the spec cannot say)."""
    dev = _device(backend)
    x = _group_data(3, 512, 128, torch.bfloat16, dev, seed=2)
    op = ops._per_token_group

    def args(**changes):
        a = {
            "input": x,
            "out": _poisoned((3, 512), E4M3, dev),
            "scales": torch.full((3, 4), float("nan"), device=dev),
            "group_size": 128,
            "eps": 1e-10,
            "scale_ue8m0": False,
        }
        a.update(changes)
        return a

    y = _group_data(3, 4000, 32, torch.bfloat16, dev, seed=2)
    cases = [
        ("group_size: expected one of 16, 32, 64, 128, 256, got 48", args(group_size=48)),
        ("group_size: expected a value >= 16", args(group_size=8)),
        ("group_size: expected a value <= 256", args(group_size=512)),
        (
            "group_size: must divide input's last dimension 4000, got 128",
            args(
                input=y,
                out=_poisoned((3, 4000), E4M3, dev),
                scales=torch.full((3, 31), float("nan"), device=dev),
            ),
        ),
        (
            "scales: dimension 1 expected 4 (input's last dimension / group_size), got 8",
            args(scales=torch.full((3, 8), float("nan"), device=dev)),
        ),
        (
            "scales: dimension 0 expected 3",
            args(scales=torch.full((4, 4), float("nan"), device=dev)),
        ),
        (
            "scales: dtype expected one of {float32}",
            args(scales=torch.full((3, 4), float("nan"), device=dev).half()),
        ),
        (
            "scales: sgljit writes it",
            args(scales=torch.full((3, 1), float("nan"), device=dev).expand(3, 4)),
        ),
        (
            "out: dtype expected one of",
            args(out=torch.full((3, 256), -1, dtype=torch.int16, device=dev).view(torch.uint8)),
        ),
        ("eps: expected a value >= ", args(eps=0.0)),
        ("eps: expected a value <= ", args(eps=float("inf"))),
        ("eps: expected a value >= ", args(eps=float("nan"))),
    ]
    for message, a in cases:
        with _ctx(backend), pytest.raises(ValueError, match="^" + re.escape(message)):
            op(**a)
        assert a["scales"].isnan().all(), message  # nothing ran
        assert (a["out"].view(torch.uint8) == 0xFF).all(), message


def test_per_token_group_public_function_errors():
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    f = sgljit.ops.per_token_group_quant_fp8
    row_major, col_major = torch.empty(4, 2), torch.empty(2, 4).t()
    cases = [
        (TypeError, "input", lambda: f([[1.0]])),
        (ValueError, "input", lambda: f(torch.randn(2, 4, 128))),
        (TypeError, "fp8_dtype", lambda: f(x, fp8_dtype=torch.float16)),
        (TypeError, "out", lambda: f(x, out=torch.empty(4, 256, dtype=E5M2))),
        (ValueError, "out", lambda: f(x, out=torch.empty(4, 128, dtype=E4M3))),
        (TypeError, "group_size", lambda: f(x, 128.0)),
        (TypeError, "group_size", lambda: f(x, True)),
        (ValueError, "group_size", lambda: f(x, 0)),
        (ValueError, "group_size", lambda: f(x, 96)),
        (TypeError, "eps", lambda: f(x, eps="1")),
        (TypeError, "scale_ue8m0", lambda: f(x, scale_ue8m0=1)),
        # the layout column_major_scales names, for a given scales
        (ValueError, "scales", lambda: f(x, column_major_scales=True, scales=row_major)),
        (ValueError, "scales", lambda: f(x, scales=col_major)),
        (ValueError, "scales", lambda: f(x, scales=torch.empty(4, 3))),
        (TypeError, "scales", lambda: f(x, scales=[1.0])),
    ]
    for exc, name, call in cases:
        with pytest.raises(exc, match=rf"^{name}\b"):
            call()
    # the layout given agrees with the flag: accepted
    assert f(x, scales=row_major)[1] is row_major
    assert f(x, column_major_scales=True, scales=col_major)[1] is col_major


@pytest.mark.parametrize(
    "backend",
    [
        "reference",
        pytest.param(
            "cuda",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")],
        ),
    ],
)
def test_per_token_group_torch_compile_fullgraph(backend):
    f = sgljit.ops.per_token_group_quant_fp8

    def fn(x):
        a, sa = f(x)
        b, sb = f(x, 64, fp8_dtype=E5M2, column_major_scales=True, scale_ue8m0=True)
        return a, sa, b, sb

    dev = _device(backend)
    x = _group_data(37, 1024, 64, torch.bfloat16, dev, seed=8)
    with _ctx(backend):
        eager = fn(x)
        compiled = torch.compile(fn, fullgraph=True)(x)
    for got, want in zip(compiled, eager, strict=True):
        assert got.stride() == want.stride()
        assert torch.equal(_bits(got), _bits(want))
    assert eager[3].stride() == (1, 40)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", GROUP_LAYOUTS)
@pytest.mark.parametrize(
    # bf16 g128 (8 lanes a group): 1, 2 and 4 groups per lane from about 16.9K and 33.8K groups on
    # 132 SMs; a partial last block; 65536 x 7168 (3.7M groups). Column-major scales of inputs
    # beyond the L2 (60 MiB) take tiles of tokens x group columns: rows of 35 groups (a partial last
    # column tile, 4 groups a lane), of 3 (2 a lane: tiles 2 columns wide, the last half out) and of
    # 1 (4 a lane, one column); odd row counts (a partial last tile row)
    "rows,hidden",
    [
        (1, 4096),
        (3, 7168),
        (600, 4096),
        (1100, 4096),
        (4097, 7168),
        (65536, 7168),
        (8447, 4480),
        (90001, 384),
        (250001, 128),
    ],
    ids=lambda v: str(v),
)
def test_cuda_group_launch_shapes(rows, hidden, layout):
    x = _group_data(rows, hidden, 128, torch.bfloat16, "cuda", seed=rows)
    _check_group("cuda", x, 128, E4M3, column_major=layout != "row", ue8m0=layout == "col-ue8m0")


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("group_size", ops.GROUP_SIZES)
@pytest.mark.parametrize("dtype,fp8_dtype", COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "unaligned"])
def test_cuda_group_sizes_and_dtypes(group_size, dtype, fp8_dtype, offset):
    # offset 1: one-element vectors (the kernel's other instantiation), at every group size
    rows, hidden = 2049, 2048
    x = _group_data(1, rows * hidden + offset, 1, dtype, "cuda", seed=group_size)
    x = x.view(-1)[offset:].view(rows, hidden)
    _check_group("cuda", x, group_size, fp8_dtype)
    _check_group("cuda", x[:5], group_size, fp8_dtype, column_major=True, ue8m0=True)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_cuda_group_every_bf16_value_at_its_scale(fp8_dtype):
    """A group's scale bounds its quotients by fp8_max, so the one-step division has no guard for
    huge quotients there: every finite bf16 value up to an absmax, in groups that each hold that
    absmax, for 12 absmax values (and the same near the fp8 rounding boundaries)."""
    g = torch.Generator().manual_seed(13)
    every = _every_16bit(torch.bfloat16)
    every = every[every.float().isfinite()]
    for p in torch.randint(0x3000, 0x4F80, (12,), generator=g).tolist():
        absmax = torch.tensor([p], dtype=torch.int16).view(torch.bfloat16)
        x = every[every.float().abs() <= absmax.float()]
        x = x[torch.randperm(x.numel(), generator=g)]
        x = x[: x.numel() // 127 * 127].view(-1, 127)
        x = torch.cat([x, absmax.expand(x.shape[0], 1)], dim=1)  # rows of one group
        _check_group("cuda", x.cuda(), 128, fp8_dtype)
    scale = 0.0173
    near = _near_boundaries(scale, fp8_dtype, g)
    near = near[: near.numel() // 127 * 127].view(-1, 127)
    top = torch.full((near.shape[0], 1), scale * reference.fp8_max(fp8_dtype))
    x = torch.cat([near, top], dim=1)
    _check_group("cuda", x.cuda(), 128, fp8_dtype)
    _check_group("cuda", x.cuda().bfloat16(), 128, fp8_dtype)


@needs_gpu
@pytest.mark.gpu
def test_cuda_group_graph_capture_and_replay():
    x = _group_data(4097, 7168, 128, torch.bfloat16, "cuda", seed=4)
    out = torch.empty(x.shape, dtype=E4M3, device="cuda")
    scales = ops._group_scales(4097, 56, "cuda", True)

    def step():
        ops._per_token_group(x, out, scales, 128, 1e-10, True)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in (11, 12):
        x.copy_(_group_data(4097, 7168, 128, torch.bfloat16, "cuda", seed=seed))
        out.view(torch.uint8).fill_(0xFF)
        scales.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want, ws = reference.per_token_group_quant_fp8(x, 128, E4M3, 1e-10, True)
        assert torch.equal(scales, ws)
        assert_fp8_equal(out, want, exact_nan=True)

"""sgljit-timestep-embedding: reference, SYCL (CPU device) and CUDA kernels against an fp64 oracle.

The oracle is written independently of the plugin (Python's fp64 division and ``math.exp`` rounded to
fp32 for the frequencies, torch fp32 products for the argument, torch fp64 sin/cos). No numpy: the
GPU machine may not have it. Accuracy contract: each fp32 output within
1e-6 of sin/cos (fp64) of the fp32 argument, for |arg| up to 1e5 (tested up to 1e6); fp16/bf16
outputs within that plus half an epsilon of the output type.
"""

import math
import os
import re
import struct
from fractions import Fraction
from pathlib import Path

import pytest
import torch

import sgljit
from sgljit_timestep_embedding import ops, reference

from .common import BACKENDS, HAS_CUDA, SYCL_MISSING

OUT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Every dim class of the CUDA kernels: 1 (zero column only), odd (flat kernel), half % 4 != 0
# (flat for fp32), half % 8 == 4 (rows for fp32, flat for 16-bit), rows for every dtype.
DIMS = [1, 2, 7, 8, 100, 264, 320, 1023, 1024]
PACKAGE = Path(ops.__file__).resolve().parent


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "cuda" and not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")
    if request.param == "sycl" and SYCL_MISSING:
        pytest.skip("SYCL runtime not installed")
    return request.param


def device_of(backend: str) -> str:
    return "cuda" if backend == "cuda" else "cpu"


# ------------------------------------------------------------------------------------------------
# Independent oracle
# ------------------------------------------------------------------------------------------------
def oracle(t, dim, flip_sin_to_cos=False, downscale_freq_shift=0.0, scale=1.0, max_period=10000):
    """(fp64 embedding [B, dim] of the fp32 argument, the fp32 argument [B, dim // 2]), on the CPU."""
    half = dim // 2

    def f32(x: float) -> float:  # round a Python float to the nearest fp32
        return struct.unpack("f", struct.pack("f", x))[0]

    c, d = f32(-math.log(max_period)), f32(half - downscale_freq_shift)
    # fp32 product c*j (exact in fp64, then rounded), fp32 quotient, exp rounded once to fp32
    freq = [f32(math.exp(f32(f32(c * j) / d))) for j in range(half)]
    tf = t.detach().cpu().to(torch.float64).to(torch.float32)
    arg = (tf[:, None] * torch.tensor(freq, dtype=torch.float32)[None, :]) * f32(scale)
    a = arg.double()
    parts = [a.cos(), a.sin()] if flip_sin_to_cos else [a.sin(), a.cos()]
    if dim % 2:
        parts.append(torch.zeros(len(tf), 1, dtype=torch.float64))
    return torch.cat(parts, dim=1), arg


def tolerance(dtype: torch.dtype) -> float:
    return 1e-6 if dtype == torch.float32 else 1e-6 + torch.finfo(dtype).eps / 2


def assert_embedding(
    out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str = ""
) -> None:
    assert out.dtype == dtype
    got = out.detach().cpu().to(torch.float64)
    expected = expected.cpu()
    assert got.shape == expected.shape
    bad = ~torch.isfinite(got)
    assert not bad.any(), f"{what}: {int(bad.sum())} unwritten/NaN elements"
    if got.numel() == 0:
        return
    err = (got - expected).abs()
    worst = divmod(int(err.argmax()), got.shape[1])
    assert err.max().item() <= tolerance(dtype), (
        f"{what}: max abs error {err.max().item():.3e} at {worst} (got {got[worst].item()!r}, "
        f"expected {expected[worst].item()!r}); tolerance {tolerance(dtype):.3e}"
    )


def poisoned(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def run(backend, t, dim, dtype=torch.float32, **kw) -> torch.Tensor:
    """The public op on `backend`, writing into a NaN-poisoned `out`."""
    t = t.to(device_of(backend))
    out = poisoned((t.shape[0], dim), dtype, t.device)
    with sgljit.use_backend(backend):
        res = sgljit.ops.timestep_embedding(t, dim, dtype=dtype, out=out, **kw)
    assert res is out
    if backend == "cuda":
        torch.cuda.synchronize()
    return res


def timesteps(n: int, high: float = 1000.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=g, dtype=torch.float64).mul(high).add(1e-3).float()


# ------------------------------------------------------------------------------------------------
# Reference (CPU)
# ------------------------------------------------------------------------------------------------
REFERENCE_KWARGS = [
    {},
    {"flip_sin_to_cos": True},
    {"downscale_freq_shift": 1.0},
    {"flip_sin_to_cos": True, "downscale_freq_shift": 1.0, "scale": 1000.0},
    {"max_period": 100, "scale": 0.5},
]


@pytest.mark.parametrize(
    ("dim", "kw"),
    # dim // 2 == downscale_freq_shift divides by zero: the op rejects it (tested with the bad inputs)
    [
        (d, kw)
        for d in DIMS
        for kw in REFERENCE_KWARGS
        if d // 2 != kw.get("downscale_freq_shift", 0.0)
    ],
)
def test_reference_matches_fp64_oracle(dim, kw):
    t = timesteps(33, seed=dim)
    expected, arg = oracle(t, dim, **kw)
    ref_arg = reference.timestep_arguments(
        t,
        dim,
        kw.get("downscale_freq_shift", 0.0),
        kw.get("scale", 1.0),
        kw.get("max_period", 10000),
    )
    assert torch.equal(ref_arg, arg), "fp32 arguments must be identical to the bit"
    got = reference.timestep_embedding_fp64(t, dim, **kw)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-15)


def _diffusers_get_timestep_embedding(
    timesteps,
    embedding_dim,
    flip_sin_to_cos=False,
    downscale_freq_shift=1,
    scale=1,
    max_period=10000,
):
    """diffusers.models.embeddings.get_timestep_embedding, verbatim (fp32 throughout)."""
    half_dim = embedding_dim // 2
    exponent = -math.log(max_period) * torch.arange(
        start=0, end=half_dim, dtype=torch.float32, device=timesteps.device
    )
    exponent = exponent / (half_dim - downscale_freq_shift)
    emb = torch.exp(exponent)
    emb = timesteps[:, None].float() * emb[None, :]
    emb = scale * emb
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half_dim:], emb[:, :half_dim]], dim=-1)
    if embedding_dim % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1, 0, 0))
    return emb


@pytest.mark.parametrize("dim", [7, 256, 320, 1023])
@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("shift", [0.0, 1.0])
def test_matches_diffusers_formula(dim, flip, shift):
    """Same semantics as diffusers (up to its fp32 exp/sin rounding: |arg| <= 1000 here)."""
    t = timesteps(64)
    want = _diffusers_get_timestep_embedding(t, dim, flip, shift)
    got = sgljit.ops.timestep_embedding(t, dim, flip_sin_to_cos=flip, downscale_freq_shift=shift)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-4)


def test_default_shift_is_zero_and_diffusers_default_is_one():
    """The op defaults to downscale_freq_shift=0 (serving kernels); diffusers' function to 1."""
    t = timesteps(16)
    default = sgljit.ops.timestep_embedding(t, 64)
    torch.testing.assert_close(
        default, sgljit.ops.timestep_embedding(t, 64, downscale_freq_shift=0.0)
    )
    diffusers_default = _diffusers_get_timestep_embedding(t, 64)  # shift 1
    torch.testing.assert_close(
        sgljit.ops.timestep_embedding(t, 64, downscale_freq_shift=1),
        diffusers_default,
        rtol=0,
        atol=2e-4,
    )
    assert (default - diffusers_default).abs().max() > 0.1  # the two defaults really differ


# ------------------------------------------------------------------------------------------------
# Every backend
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("dim", DIMS)
def test_numerics(backend, dtype, dim):
    kw = {"flip_sin_to_cos": dim % 3 == 0, "downscale_freq_shift": float(dim % 2)}
    t = timesteps(7, seed=dim)
    assert_embedding(
        run(backend, t, dim, dtype, **kw), oracle(t, dim, **kw)[0], dtype, f"dim={dim}"
    )


@pytest.mark.parametrize("dim", [256, 1023])
@pytest.mark.parametrize("scale", [100.0, 1000.0])
def test_accuracy_contract_large_arguments(backend, dim, scale):
    """t up to 1000 and scale up to 1000: |arg| up to 1e6, every output within 1e-6 (fp32)."""
    t = torch.cat([timesteps(61, seed=int(scale)), torch.tensor([999.0, 1000.0, 0.0, 1.0])])
    kw = {"scale": scale, "flip_sin_to_cos": True}
    expected, arg = oracle(t, dim, **kw)
    assert arg.abs().max().item() > scale * 999
    assert_embedding(
        run(backend, t, dim, torch.float32, **kw), expected, torch.float32, f"scale={scale}"
    )


@pytest.mark.parametrize("batch", [1, 7, 4109])
def test_odd_batch_sizes(backend, batch):
    t = timesteps(batch, seed=batch)
    for dim in (256, 7):
        assert_embedding(
            run(backend, t, dim), oracle(t, dim)[0], torch.float32, f"B={batch} dim={dim}"
        )


def test_empty_batch(backend):
    out = run(backend, torch.empty(0), 256)
    assert out.shape == (0, 256)


@pytest.mark.parametrize(
    "t_dtype",
    [torch.int64, torch.float16, torch.float64, torch.int8],
    ids=str,
)
def test_timestep_dtypes(backend, t_dtype):
    t = (timesteps(19, high=120.0) if t_dtype != torch.float16 else timesteps(19)).to(t_dtype)
    assert_embedding(
        run(backend, t, 256, torch.bfloat16), oracle(t, 256)[0], torch.bfloat16, str(t_dtype)
    )


@pytest.mark.gpu
@pytest.mark.parametrize(
    "t_dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8], ids=str
)
def test_timestep_dtypes_cuda(t_dtype):
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")
    t = timesteps(19, high=200.0).to(t_dtype)
    for dim in (256, 7):
        assert_embedding(
            run("cuda", t, dim), oracle(t, dim)[0], torch.float32, f"{t_dtype} dim={dim}"
        )


# ------------------------------------------------------------------------------------------------
# Errors: what the public function adds (argument combinations, conversions) and what the op checks
# beyond its argument specs. Shapes, dtypes, layouts, devices, scalar types and bounds come from the
# spec and are the conformance suite's (tests/plugins/test_conformance.py).
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "match"),
    [
        ((torch.zeros(()), 8), {}, ValueError, r"^t: expected a 1-D tensor of timesteps"),
        ((torch.zeros(2, 3), 8), {}, ValueError, r"^t: expected 1-D tensor"),
        ((torch.zeros(4, dtype=torch.complex64), 8), {}, TypeError, r"^t: expected a real"),
        ((torch.zeros(4, dtype=torch.bool), 8), {}, TypeError, r"^t: expected a real"),
        (([1.0, 2.0], 8), {}, TypeError, r"^t: expected a torch.Tensor"),
        ((torch.ones(4), 0), {}, ValueError, r"^dim: expected a positive"),
        ((torch.ones(4), -3), {}, ValueError, r"^dim: expected a positive"),
        ((torch.ones(4), 8.0), {}, TypeError, r"^dim: expected an int"),
        ((torch.ones(4), True), {}, TypeError, r"^dim: expected an int"),
        ((torch.ones(4), 2**30 + 1), {}, ValueError, r"^dim: must be at most 2\^30"),
        ((torch.ones(4), 8), {"max_period": 0}, ValueError, r"^max_period: expected a value >="),
        (
            (torch.ones(4), 8),
            {"max_period": -10.0},
            ValueError,
            r"^max_period: expected a value >=",
        ),
        (
            (torch.ones(4), 8),
            {"max_period": float("inf")},
            ValueError,
            r"^max_period: expected a value <=",
        ),
        ((torch.ones(4), 8), {"scale": float("nan")}, ValueError, r"^scale: expected a value"),
        (
            (torch.ones(4), 8),
            {"downscale_freq_shift": -float("inf")},
            ValueError,
            r"^downscale_freq_shift: expected a value >=",
        ),
        ((torch.ones(4), 8), {"scale": "2"}, TypeError, r"^scale: expected float"),
        ((torch.ones(4), 8), {"flip_sin_to_cos": 1}, TypeError, r"^flip_sin_to_cos: expected bool"),
        ((torch.ones(4), 8), {"dtype": torch.float64}, TypeError, r"^dtype: expected one of"),
        ((torch.ones(4), 8), {"out": [0.0] * 32}, TypeError, r"^out: expected a torch.Tensor"),
        ((torch.ones(4), 8), {"out": torch.empty(4, 9)}, ValueError, r"^out: expected shape"),
        ((torch.ones(4), 8), {"out": torch.empty(5, 8)}, ValueError, r"^out: expected shape"),
        (
            (torch.ones(4), 8),
            {"out": torch.empty(4, 8), "dtype": torch.bfloat16},
            ValueError,
            r"^out: dtype torch.float32 differs",
        ),
        (
            (torch.ones(4), 8),
            {"out": torch.empty(4, 8, dtype=torch.int32)},
            ValueError,
            r"^out: dtype expected one of",
        ),
    ],
)
def test_bad_inputs(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        sgljit.ops.timestep_embedding(*args, **kwargs)


def test_timesteps_of_other_dtypes_are_converted_and_dim_may_be_any_integral():
    t = torch.tensor([0, 3, 250], dtype=torch.uint8)
    got = sgljit.ops.timestep_embedding(t, torch.tensor(64).numpy()[()])  # a numpy integer dim
    torch.testing.assert_close(got, sgljit.ops.timestep_embedding(t.float(), 64), rtol=0, atol=0)


def _op_call(backend, out, **kw):
    """The op itself (destination passing), on `backend`."""
    op = ops.family.ops["timestep_embedding"]
    args = {"flip_sin_to_cos": False, "downscale_freq_shift": 0.0, "scale": 1.0, "max_period": 1e4}
    args.update(kw)
    t = torch.ones(out.shape[0], device=out.device)
    with sgljit.use_backend(backend):
        op(t, out, *args.values())


def test_shift_equal_to_half_dim_is_refused_by_the_op(backend):
    """dim // 2 - downscale_freq_shift is the exponent's divisor: every backend refuses 0."""
    out = torch.empty(4, 9, device=device_of(backend))
    with pytest.raises(
        (ValueError, RuntimeError), match=r"^downscale_freq_shift: must differ from dim // 2 = 4"
    ):
        _op_call(backend, out, downscale_freq_shift=4.0)
    _op_call(
        backend, torch.empty(4, 1, device=device_of(backend)), downscale_freq_shift=0.0
    )  # half 0


def test_an_empty_embedding_is_refused_by_the_op(backend):
    with pytest.raises(
        (ValueError, RuntimeError), match=r"^out: dim must be in \[1, 2\^30\], got 0"
    ):
        _op_call(backend, torch.empty(4, 0, device=device_of(backend)))


def test_the_kernels_refuse_a_misaligned_out(backend):
    """The kernels store 16-byte vectors; the reference writes anywhere."""
    buf = torch.empty(4 * 8 + 1, device=device_of(backend))
    out = buf[1:].view(4, 8)
    if backend == "reference":
        _op_call(backend, out)
        assert_embedding(out, oracle(torch.ones(4), 8)[0], torch.float32)
        return
    with pytest.raises(
        (ValueError, RuntimeError), match=r"^out: data pointer must be 16-byte aligned"
    ):
        _op_call(backend, out)


def test_the_function_fills_a_misaligned_out(backend):
    """What the kernels refuse, the public function does through an aligned temporary: the same
    result on every backend."""
    t = torch.tensor([0.0, 1.0, 250.0, 999.0], device=device_of(backend))
    buf = torch.full((4 * 10 + 1,), float("nan"), device=device_of(backend))
    out = buf[1:].view(4, 10)
    with sgljit.use_backend(backend):
        got = sgljit.ops.timestep_embedding(t, 10, flip_sin_to_cos=True, out=out)
    assert got is out and buf[0].isnan()
    assert_embedding(out, oracle(t.cpu(), 10, flip_sin_to_cos=True)[0], torch.float32)


def test_torch_compile_fullgraph_reference():
    """The public function (its allocation, conversion and checks) traces with fullgraph."""
    op = sgljit.ops.timestep_embedding

    def f(t, out):
        return op(t, 7, flip_sin_to_cos=True, scale=2.0, out=out).mul(3.0)

    def g(t):
        return op(t, 8, dtype=torch.bfloat16, downscale_freq_shift=1).float()

    t = timesteps(9)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(t, torch.empty(9, 7))
    torch.testing.assert_close(got, f(t, torch.empty(9, 7)), rtol=0, atol=0)
    got = torch.compile(g, fullgraph=True, backend="aot_eager")(t.to(torch.int16))
    torch.testing.assert_close(got, g(t.to(torch.int16)), rtol=0, atol=0)


def test_dim_one_and_odd_dims_write_a_zero_column():
    out = sgljit.ops.timestep_embedding(torch.tensor([3.0, 5.0]), 1)
    assert out.tolist() == [[0.0], [0.0]]
    assert (sgljit.ops.timestep_embedding(timesteps(5), 9)[:, -1] == 0).all()


# ------------------------------------------------------------------------------------------------
# The kernels' sin/cos: Cody-Waite reduction by 2*pi, emulated bit-exactly on the CPU
# ------------------------------------------------------------------------------------------------
def fma_f32(a: torch.Tensor, b: torch.Tensor | float, c: torch.Tensor) -> torch.Tensor:
    """fp32 fmaf(a, b, c), exact: a*b is exact in fp64, TwoSum gives the exact a*b + c as s + e,
    and rounding s to fp32 is correct unless s sits exactly on a tie, where e decides."""
    a64, b64, c64 = (torch.as_tensor(x, dtype=torch.float32).double() for x in (a, b, c))
    p = a64 * b64
    s = p + c64
    bb = s - p
    e = (p - (s - bb)) + (c64 - bb)
    r = s.float()
    r64 = r.double()
    inf = torch.tensor(math.inf, dtype=torch.float32)
    other = torch.where(s > r64, torch.nextafter(r, inf), torch.nextafter(r, -inf))
    tie = (s == (r64 + other.double()) / 2) & (e != 0)
    toward = torch.where(e > 0, torch.maximum(r, other), torch.minimum(r, other))
    return torch.where(tie, toward, r)


def kernel_constants(path: Path) -> dict[str, float]:
    text = path.read_text()
    found = dict(
        re.findall(r"constexpr float (k(?:Inv2Pi|TwoPi\w+)) = (-?0x[0-9a-fA-F.p+-]+)f;", text)
    )
    assert set(found) == {"kInv2Pi", "kTwoPiHi", "kTwoPiMid", "kTwoPiLo"}, found
    values = {k: float.fromhex(v) for k, v in found.items()}
    for k, v in values.items():
        assert torch.tensor(v, dtype=torch.float32).item() == v, f"{k} is not an fp32 value"
    return values


def reduce_two_pi(x: torch.Tensor, c: dict[str, float]) -> torch.Tensor:
    """The kernels' reduce_two_pi in fp32 (CUDA: __fmul_rn/rintf/fmaf/__fadd_rn; SYCL: the same).
    torch.round rounds half to even, as rintf."""
    k = torch.round(x * c["kInv2Pi"])
    r = fma_f32(-k, c["kTwoPiHi"], x)
    tail = fma_f32(-k, c["kTwoPiMid"], -k * c["kTwoPiLo"])
    return r + tail


def test_fma_emulation_is_exact():
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(400, generator=g, dtype=torch.float64) * 2e5 - 1e5).float()
    k = torch.round(x * (1 / (2 * math.pi)))
    inf = torch.tensor(math.inf)
    for b in (6.2831854820251465, -1.7484555314695172e-07):  # fp32 values
        got = fma_f32(-k, b, x)
        lo, hi = torch.nextafter(got, -inf), torch.nextafter(got, inf)
        for ki, xi, gi, li, hi_ in zip(
            k.tolist(), x.tolist(), got.tolist(), lo.tolist(), hi.tolist(), strict=True
        ):
            exact = -Fraction(ki) * Fraction(b) + Fraction(xi)
            d = abs(Fraction(gi) - exact)
            assert d <= abs(Fraction(li) - exact) and d <= abs(Fraction(hi_) - exact)


def test_cody_waite_reduction_error_bound():
    """Dense sweep of fp32 arguments: the reduced argument costs < 1.25e-7, so with the hardware
    sin/cos (|err| <= 2^-21.41 / 2^-21.19 on [-pi, pi], CUDA programming guide) the total stays
    below 6e-7 < 1e-6. The SYCL kernel uses the same constants and code."""
    c = kernel_constants(PACKAGE / "csrc" / "timestep_embedding.cuh")
    assert c == kernel_constants(PACKAGE / "sycl" / "timestep_embedding.hpp")
    two_pi = Fraction(c["kTwoPiHi"]) + Fraction(c["kTwoPiMid"]) + Fraction(c["kTwoPiLo"])
    assert abs(float(two_pi - Fraction(2 * math.pi))) < 1e-15  # the split sums to 2*pi

    g = torch.Generator().manual_seed(0)

    def uniform(n, lo, hi):
        return torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo

    k = torch.arange(-16000, 16001, dtype=torch.float64)
    near_multiples = (k * 2 * math.pi).float()
    sign = torch.where(torch.rand(200_000, generator=g) < 0.5, -1.0, 1.0).double()
    x = torch.cat(
        [
            torch.linspace(-1e5, 1e5, 600_001, dtype=torch.float64).float(),
            (10 ** uniform(200_000, -6, 5) * sign).float(),  # log-uniform magnitudes
            near_multiples,
            torch.nextafter(near_multiples, torch.tensor(math.inf)),
            (k * 2 * math.pi + math.pi).float(),  # r near +-pi: the largest |r|
            uniform(100_000, -1e6, 1e6).float(),
        ]
    )
    r = reduce_two_pi(x, c).double()
    x64 = x.double()
    err = torch.maximum((r.sin() - x64.sin()).abs(), (r.cos() - x64.cos()).abs()).max().item()
    assert err < 1.25e-7, err
    small = x64.abs() <= 1e5
    assert r[small].abs().max().item() < math.pi + 0.01  # inside the hardware sin/cos's range
    hardware = 2.0**-21.19  # __cosf's bound (the larger of the two)
    assert err + hardware < 6e-7


# ------------------------------------------------------------------------------------------------
# CUDA: compile check (runs in CI without a GPU), then GPU-only behaviour
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda_build_env(tmp_path_factory):
    from sgljit.toolchain import find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    with pytest.MonkeyPatch.context() as mp:
        if not HAS_CUDA:
            mp.setenv("SGLJIT_CUDA_ARCH", os.environ.get("SGLJIT_CUDA_ARCH") or "9.0a")
        if not HAS_CUDA or not os.environ.get("SGLJIT_CACHE_DIR"):
            mp.setenv("SGLJIT_CACHE_DIR", str(tmp_path_factory.mktemp("sgljit-cache")))
        yield


@pytest.mark.parametrize("spec", ops.family.prebuild_specs("cuda"), ids=lambda s: s["out_dtype"])
def test_cuda_compiles(cuda_build_env, spec):
    """Every CUDA specialization (one module per output dtype) builds for sm_90a."""
    sgljit.clear_module_cache()
    module = ops.family.prebuild("cuda", **spec)
    assert hasattr(module, "timestep_embedding")


def test_prebuild_specs():
    """One CUDA module per output dtype; SYCL per (timestep dtype, output dtype) for the fp32 and
    int64 timesteps of serving."""
    names = [str(d).removeprefix("torch.") for d in OUT_DTYPES]
    assert ops.family.prebuild_specs("cuda") == [
        {"op": "timestep_embedding", "out_dtype": d} for d in names
    ]
    assert ops.family.prebuild_specs("sycl") == [
        {"op": "timestep_embedding", "SGLJIT_TIN": t, "SGLJIT_T": o}
        for t in ("float32", "int64")
        for o in names
    ]


needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize(
    ("batch", "dim"), [(65536, 1024), (300, 4096), (5, 4800), (3, 16387), (4, 8192), (2, 256)]
)
def test_cuda_large_shapes(dtype, batch, dim):
    """The shapes of the benchmark, column chunks (> 256 vector groups), the flat kernel without
    a frequency table (odd dim > 16385) and the small-batch kernel (one column per thread, up to
    4 rows) with and without column chunks."""
    t = torch.rand(batch, device="cuda") * 1000
    kw = {"flip_sin_to_cos": True}
    got = run("cuda", t, dim, dtype, **kw)
    expected = reference.timestep_embedding_fp64(t, dim, **kw)  # fp64 on the GPU, same fp32 args
    err = (got.double() - expected).abs().max().item()
    assert err <= tolerance(dtype), err


@pytest.mark.gpu
@needs_gpu
def test_cuda_torch_compile_fullgraph():
    op = sgljit.ops.timestep_embedding

    def f(t):
        return op(t, 256, flip_sin_to_cos=True, scale=2.0).mul(3.0)

    t = torch.rand(37, device="cuda") * 1000
    got = torch.compile(f, fullgraph=True)(t)
    want = oracle(t, 256, True, scale=2.0)[0] * 3.0
    assert (got.cpu().double() - want).abs().max().item() <= 3e-6

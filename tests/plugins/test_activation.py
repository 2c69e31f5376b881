"""sgljit-activation: what the conformance suite (numerics against the float64 reference on the
declared cases, bad inputs from the spec, torch.compile, CUDA graphs) does not say.

- One rounding: each gated activation of 16-bit input is bit for bit the float32 op's output
  rounded to the dtype, on every backend.
- The fused op's contract, bit for bit on every backend: ``silu_and_mul_per_token_group_quant_fp8``
  equals sgljit-quant-fp8's ``per_token_group_quant_fp8`` of ``silu_and_mul`` computed in float32
  (no intermediate rounding), for every input dtype, fp8 format, group size, both scale layouts,
  ue8m0, strided and misaligned rows, NaN and inf.
- The formulas against PyTorch's own (F.silu, F.gelu) in float64; the public functions' shapes
  ([..., 2d], one token), ``out=``, their errors; the unfused pair differs from the fused op.
- CUDA: every module compiles for sm_90a without a GPU; on a GPU the large-grid, streaming and
  split-launch paths.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import sgljit
from sgljit_activation import ops

from .common import BACKENDS, HAS_CUDA, needs_gpu

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
ACTS = {
    "silu_and_mul": F.silu,
    "gelu_and_mul": F.gelu,
    "gelu_tanh_and_mul": lambda x: F.gelu(x, approximate="tanh"),
}
# fp32: PyTorch's own float32 GELU loses 1e-6 of |x| to cancellation in 1 + erf(x / sqrt(2)) near
# x = -3.5 (the kernels use its formula), times |up| up to 64 here
TOL = {BF16: 2e-2, FP16: 1e-2, FP32: 1e-4}


def _device(backend: str) -> str:
    return "cuda" if backend == "cuda" else "cpu"


def _ctx(backend: str):
    return contextlib.nullcontext() if backend == "cuda" else sgljit.use_backend(backend)


def _gate_up(rows, d, dtype, device, pad=0, offset=0, seed=0) -> torch.Tensor:
    """``[rows, 2d]`` over several magnitudes, columns ``[pad, pad + 2d)`` of a wider buffer,
    ``offset`` elements into its storage."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(offset + rows * (2 * d + pad), generator=g) * 4
    x = x * torch.exp2(torch.randint(-4, 5, x.shape, generator=g).float())
    return x.to(dtype)[offset:].view(rows, 2 * d + pad)[:, pad:].to(device)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


# ------------------------------------------------------------------------------------------------
# Numerics


@pytest.mark.parametrize("name", sorted(ACTS))
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=str)
@pytest.mark.parametrize("shape", [(37, 4096, 0, 0), (5, 1001, 0, 0), (3, 1408, 24, 1)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_rounding(backend, name, dtype, shape):
    """The 16-bit op's output is the float32 op's, rounded once: nothing rounds in between."""
    rows, d, pad, offset = shape
    x = _gate_up(rows, d, dtype, _device(backend), pad, offset)
    fn = getattr(sgljit.ops, name)
    with _ctx(backend):
        got = fn(x)
        wide = fn(x.float())
    assert wide.dtype == FP32 and got.dtype == dtype
    assert torch.equal(got, wide.to(dtype))


@pytest.mark.parametrize("name", sorted(ACTS))
@pytest.mark.parametrize("dtype", [BF16, FP16, FP32], ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_against_pytorchs_formulas(backend, name, dtype):
    """act(gate) * up of F.silu / F.gelu in float64, within one rounding of the dtype (inputs up to
    +-64: saturated and vanishing activations too), [B, S, 2d] and a single token [2d]."""
    x = _gate_up(2 * 9, 1000, dtype, _device(backend)).view(2, 9, 2000)
    with _ctx(backend):
        got = getattr(sgljit.ops, name)(x)
        one = getattr(sgljit.ops, name)(x[1, 3])
    xd = x.double().cpu()
    want = ACTS[name](xd[..., :1000]) * xd[..., 1000:]
    assert got.shape == (2, 9, 1000) and one.shape == (1000,)
    for result, expected in ((got, want), (one, want[1, 3])):
        err = ((result.double().cpu() - expected).abs() / (1 + expected.abs())).max()
        assert err <= TOL[dtype], err


def _fused_and_composed(backend, x, group_size, fp8_dtype, col_major, ue8m0):
    from sgljit_quant_fp8.ops import per_token_group_quant_fp8

    kw = {
        "eps": 1e-10,
        "fp8_dtype": fp8_dtype,
        "column_major_scales": col_major,
        "scale_ue8m0": ue8m0,
    }
    with _ctx(backend):
        fused = ops.silu_and_mul_per_token_group_quant_fp8(x, group_size, **kw)
        y = sgljit.ops.silu_and_mul(x.float())  # float32 out: the product, not rounded
        composed = per_token_group_quant_fp8(y, group_size, **kw)
    return fused, composed


FUSED_CONFIGS = [
    # (dtype, d, group size, fp8, column-major, ue8m0, pad, offset)
    (BF16, 2048, 128, E4M3, False, False, 0, 0),
    (BF16, 1408, 128, E4M3, True, True, 0, 0),
    (FP16, 1024, 64, E5M2, True, False, 64, 0),
    (FP32, 512, 32, E4M3, False, True, 0, 0),
    (BF16, 640, 128, E5M2, False, False, 6, 1),  # strided and misaligned: one element a vector
]


@pytest.mark.parametrize("config", FUSED_CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}-g{c[2]}-{c[3]}")
@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_is_group_quant_of_the_float32_product(backend, config, rows):
    """The docstring's contract, bit for bit: the fused op is per_token_group_quant_fp8 (sgljit-
    quant-fp8) of silu_and_mul's float32 output, on the same backend."""
    dtype, d, group_size, fp8_dtype, col_major, ue8m0, pad, offset = config
    x = _gate_up(rows, d, dtype, _device(backend), pad, offset, seed=rows)
    (q, s), (want_q, want_s) = _fused_and_composed(
        backend, x, group_size, fp8_dtype, col_major, ue8m0
    )
    assert q.dtype == fp8_dtype and q.shape == (rows, d)
    assert s.shape == (rows, d // group_size) and s.stride() == want_s.stride()
    assert torch.equal(_bytes(q), _bytes(want_q))
    assert torch.equal(s, want_s)
    if ue8m0:
        assert torch.equal(s, torch.exp2(torch.log2(s).round()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_nan_and_inf_as_the_composition(backend):
    """A NaN gate, an inf up and a zero group: per_token_group_quant_fp8's NaN and inf rules."""
    x = _gate_up(3, 512, BF16, _device(backend))
    x[0, 5] = float("nan")  # gate of group 0 of row 0
    x[1, 512 + 200] = float("inf")  # up of group 1 of row 1
    x[2, 512 + 256 : 512 + 384] = 0  # group 2 of row 2: y == 0
    (q, s), (want_q, want_s) = _fused_and_composed(backend, x, 128, E4M3, False, False)
    assert torch.equal(_bytes(q), _bytes(want_q))
    torch.testing.assert_close(s, want_s, rtol=0, atol=0, equal_nan=True)
    assert s[0, 0].isnan() and s[1, 1].isinf() and s[2, 2] == 1e-10
    assert (q[0, :128].view(torch.uint8) & 0x7F == 0x7F).all()  # NaN codes


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_unfused_pair_rounds_in_between(backend):
    """silu_and_mul in bf16 then quantize rounds y to bf16 first: some codes differ by one step
    from the fused op's, never more."""
    from sgljit_quant_fp8.ops import per_token_group_quant_fp8

    x = _gate_up(64, 2048, BF16, _device(backend), seed=3)
    with _ctx(backend):
        q, _ = ops.silu_and_mul_per_token_group_quant_fp8(x)
        unfused, _ = per_token_group_quant_fp8(sgljit.ops.silu_and_mul(x))
    a, b = q.float(), unfused.float()
    assert not torch.equal(a, b)
    step = torch.where(a.abs() > b.abs(), a, b).abs() * 2**-3  # e4m3: 3 mantissa bits
    assert ((a - b).abs() <= step.clamp_min(2**-9)).all()


# ------------------------------------------------------------------------------------------------
# Public functions: shapes, out=, errors


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_is_written_and_returned(backend):
    dev = _device(backend)
    x = _gate_up(4, 256, BF16, dev)
    out = torch.full((4, 300), float("nan"), dtype=BF16, device=dev)[:, 20:276]  # strided rows
    with _ctx(backend):
        got = sgljit.ops.gelu_tanh_and_mul(x, out=out)
        want = sgljit.ops.gelu_tanh_and_mul(x)
    assert got is out and torch.equal(out, want)
    q = torch.empty(4, 256, dtype=E4M3, device=dev)
    s = torch.empty(2, 4, device=dev).t()  # column-major
    with _ctx(backend):
        got_q, got_s = ops.silu_and_mul_per_token_group_quant_fp8(
            x, out=q, scales=s, column_major_scales=True
        )
    assert got_q is q and got_s is s


def test_column_major_scales_are_aligned_columns():
    x = torch.randn(5, 1024)
    _, s = ops.silu_and_mul_per_token_group_quant_fp8(x, column_major_scales=True)
    assert s.shape == (5, 4) and s.stride() == (1, 8)
    _, s = ops.silu_and_mul_per_token_group_quant_fp8(x)
    assert s.stride() == (4, 1)


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: sgljit.ops.silu_and_mul(torch.randn(3, 7)), ValueError, r"^input: last dim"),
        (
            lambda: sgljit.ops.gelu_and_mul(torch.randn(3, 8), out=torch.empty(3, 5)),
            ValueError,
            r"^out: dimension 1 expected 4 \(half of input's last dimension 8\), got 5",
        ),
        (
            lambda: sgljit.ops.silu_and_mul(torch.randn(3, 8), out=torch.empty(2, 4)),
            ValueError,
            r"^out: expected leading dimensions \[3\]",
        ),
        (lambda: sgljit.ops.silu_and_mul([1.0, 2.0]), TypeError, r"^input: expected a torch"),
        (lambda: sgljit.ops.silu_and_mul(torch.tensor(1.0)), TypeError, r"^input: .*0-d"),
        (
            lambda: ops.silu_and_mul_per_token_group_quant_fp8(torch.randn(2, 512), 96),
            ValueError,
            r"^group_size: expected one of 32, 64, 128, got 96",
        ),
        (
            lambda: ops.silu_and_mul_per_token_group_quant_fp8(torch.randn(2, 320), 128),
            ValueError,
            r"^group_size: must divide out's last dimension 160, got 128",
        ),
        (
            lambda: ops.silu_and_mul_per_token_group_quant_fp8(
                torch.randn(2, 512), scales=torch.empty(2, 3)
            ),
            ValueError,
            r"^scales: dimension 1 expected 2 \(out's last dimension / group_size\), got 3",
        ),
        (
            lambda: ops.silu_and_mul_per_token_group_quant_fp8(
                torch.randn(2, 512), column_major_scales=True, scales=torch.empty(2, 2)
            ),
            ValueError,
            r"^scales: column_major_scales=True expects stride 1 along dimension 0",
        ),
        (
            lambda: ops.silu_and_mul_per_token_group_quant_fp8(torch.randn(2, 2, 512)),
            ValueError,
            r"^input: expected a 2-D tensor",
        ),
        (
            lambda: ops.silu_and_mul_per_token_group_quant_fp8(
                torch.randn(2, 512), out=torch.empty(2, 256, dtype=E5M2)
            ),
            TypeError,
            r"^out: dtype must be torch.float8_e4m3fn",
        ),
        (
            lambda: ops.silu_and_mul_per_token_group_quant_fp8(
                torch.randn(2, 512), fp8_dtype=torch.int8
            ),
            TypeError,
            r"^fp8_dtype: expected",
        ),
    ],
)
@pytest.mark.parametrize("backend", ["reference", BACKENDS[1]])
def test_errors_name_the_argument(backend, call, exc, match):
    with sgljit.use_backend(backend), pytest.raises(exc, match=match):
        call()


# ------------------------------------------------------------------------------------------------
# CUDA: compile without a GPU; on a GPU, the paths small check cases do not reach


def _has_nvcc() -> bool:
    from sgljit.toolchain import find_nvcc

    return find_nvcc() is not None


# every kernel shape: each dtype's act module, and the fused module's vector widths (16-bit: 8
# elements, fp32: 4) at each group size and both fp8 formats
CUDA_SPECS = [
    *({"op": "silu_and_mul", "dtype": dt} for dt in (BF16, FP16, FP32)),
    {"op": ops._silu_and_mul_quant.name, "dtype": BF16, "fp8_dtype": E4M3, "group_size": 128},
    {"op": ops._silu_and_mul_quant.name, "dtype": FP16, "fp8_dtype": E5M2, "group_size": 64},
    {"op": ops._silu_and_mul_quant.name, "dtype": FP32, "fp8_dtype": E4M3, "group_size": 32},
]


@pytest.mark.skipif(HAS_CUDA, reason="GPU present: the GPU tests build and run these modules")
@pytest.mark.skipif(not _has_nvcc(), reason="nvcc not found")
def test_cuda_modules_compile_for_sm90a(tmp_path, monkeypatch):
    """Every CUDA kernel shape compiles for sm_90a (compile only), two builds at a time, and the
    module of each exports every op that shares it."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("SGLJIT_CUDA_ARCH", "9.0a")
    monkeypatch.setenv("SGLJIT_CACHE_DIR", str(tmp_path / "cache"))
    sgljit.clear_module_cache()
    try:
        with ThreadPoolExecutor(2) as pool:
            mods = list(pool.map(lambda s: ops.family.prebuild("cuda", **s), CUDA_SPECS))
        for spec, mod in zip(CUDA_SPECS, mods, strict=True):
            module = ops.family.ops[spec["op"]].cuda.module
            for op in ops.family.ops.values():
                if op.cuda.module == module:
                    assert callable(getattr(mod, op.name))
    finally:
        sgljit.clear_module_cache()


def test_prebuilds_are_the_serving_shapes():
    cuda = ops.family.prebuild_specs("cuda")
    assert {s["dtype"] for s in cuda if s["op"] == "silu_and_mul"} == {
        "bfloat16",
        "float16",
        "float32",
    }
    fused = {"dtype": "bfloat16", "fp8_dtype": "float8_e4m3fn", "group_size": 128}
    assert {"op": ops._silu_and_mul_quant.name, **fused} in cuda
    assert len(ops.family.prebuild_specs("sycl")) == 5


@needs_gpu
@pytest.mark.parametrize("name", sorted(ACTS))
def test_cuda_large_and_streaming(name):
    """Beyond the L2 (streaming loads and stores, the large-grid configuration) and one token of
    each real width (small grids spread over many blocks): the CUDA kernel against the reference
    backend, within one bf16 rounding."""
    fn = getattr(sgljit.ops, name)
    for rows, d in [(4096, 14336), (1, 768), (1, 28672), (16, 25600), (256, 1408)]:
        x = _gate_up(rows, d, BF16, "cuda", seed=d)
        got = fn(x)
        with sgljit.use_backend("reference"):
            want = fn(x.cpu())
        err = ((got.cpu().float() - want.float()).abs() / (1 + want.float().abs())).max()
        assert err <= 8e-3, (rows, d, err)


@needs_gpu
def test_cuda_fused_large_is_the_composition():
    """The rounds configuration and streaming of the fused kernel, bit for bit as the contract."""
    x = _gate_up(8192, 7168, BF16, "cuda", seed=11)
    (q, s), (want_q, want_s) = _fused_and_composed("cuda", x, 128, E4M3, True, False)
    assert torch.equal(_bytes(q), _bytes(want_q)) and torch.equal(s, want_s)


@needs_gpu
def test_cuda_split_launches(monkeypatch):
    """Inputs beyond 32-bit indices take several launches of whole rows: forced at 1000 items a
    launch by the build flag, both kernels match the single-launch modules bit for bit."""
    x = _gate_up(300, 1408, BF16, "cuda", seed=5)
    want = sgljit.ops.silu_and_mul(x)
    want_q, want_s = ops.silu_and_mul_per_token_group_quant_fp8(x, column_major_scales=True)
    monkeypatch.setenv("SGLJIT_EXTRA_CUDA_CFLAGS", "-DSGLJIT_ACTIVATION_MAX_ITEMS_PER_LAUNCH=1000")
    sgljit.clear_module_cache()
    try:
        got = sgljit.ops.silu_and_mul(x)
        q, s = ops.silu_and_mul_per_token_group_quant_fp8(x, column_major_scales=True)
    finally:
        monkeypatch.delenv("SGLJIT_EXTRA_CUDA_CFLAGS")
        sgljit.clear_module_cache()
    assert torch.equal(got, want)
    assert torch.equal(_bytes(q), _bytes(want_q)) and torch.equal(s, want_s)

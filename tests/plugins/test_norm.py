"""sgljit-norm: rmsnorm, fused_add_rmsnorm, gemma variants, qknorm, qknorm_across_heads, and
RMSNorm -> fp8 (rmsnorm_quant_fp8, fused_add_rmsnorm_quant_fp8; static or per-token scale); float32
weights of 16-bit rows, Hugging Face's rounding (round_before_weight), [B, S, H] slices of bigger
buffers.

Every backend (reference on CPU, SYCL on the SYCL CPU device, CUDA on a GPU) is checked against an
independent float64 formula on random data, with outputs poisoned (NaN) beforehand. Without a GPU, the
CUDA modules the GPU tests use are compiled for sm_90a (a compile-only check).
"""

import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys

import pytest
import torch

import sgljit
from sgljit_norm import ops, reference

from .common import BACKENDS, HAS_CUDA, SYCL_MISSING, run_wide_dir

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
TOL = {FP32: (1e-5, 1e-5), FP16: (4e-3, 4e-3), BF16: (2e-2, 2e-2)}  # (rtol, atol)

# Row widths per backend: (dtype, H). CUDA covers every kernel shape: a 1-lane group (bf16 8, fp32 12),
# a full warp (bf16 1024), multi-warp groups with idle threads (bf16 2056 = 257 vectors), the
# benchmark width, a 1024-thread group (bf16 16384), fp32 16384 (no prefetch, weight from L1), and
# widths that take the generic kernel (bf16 100, bf16 32776 > 4096 vectors, fp32 1001).
ROW_CASES = {
    "reference": [(BF16, 8), (FP16, 100), (FP32, 1024)],
    "sycl": [(BF16, 8), (BF16, 1024), (FP16, 100), (FP32, 2056)],
    "cuda": [
        (BF16, 8),
        (BF16, 1024),
        (BF16, 2056),
        (BF16, 4096),
        (BF16, 16384),
        (FP16, 5120),
        (FP32, 12),
        (FP32, 2048),
        (FP32, 16384),
        (BF16, 100),
        (BF16, 32776),
        (FP32, 1001),
    ],
}
TOKENS = {"reference": (1, 7, 33), "sycl": (1, 7, 33), "cuda": (1, 7, 4109)}
GEMMA_CASES = {
    "reference": [(BF16, 64)],
    "sycl": [(BF16, 1024), (FP32, 100)],
    "cuda": [(BF16, 4096), (FP16, 5120), (FP32, 1001)],
}
QK_CASES = {  # (dtype, head_dim)
    "reference": [(BF16, 128), (FP32, 64)],
    "sycl": [(BF16, 128), (FP32, 64)],
    "cuda": [(BF16, 64), (BF16, 128), (BF16, 256), (BF16, 512), (BF16, 1024), (FP16, 128)],
}
# RMSNorm -> fp8 (dtype, H, fp8 dtype). CUDA: a 1-lane group (bf16 8), a full warp (bf16 1024), the
# benchmark widths (4096, 5120: whole-warp groups, 8192), 16384 (fp32: the fused add reads the weight
# from L1), generic widths (bf16 100, bf16 32776 > 4096 vectors, fp32 1001).
QUANT_CASES = {
    "reference": [(BF16, 128, E4M3), (FP32, 37, E5M2)],
    "sycl": [(BF16, 1024, E4M3), (FP16, 1000, E5M2), (FP32, 37, E4M3)],
    "cuda": [
        (BF16, 8, E4M3),
        (BF16, 1024, E5M2),
        (BF16, 4096, E4M3),
        (BF16, 5120, E4M3),
        (FP16, 8192, E5M2),
        (FP32, 16384, E4M3),
        (BF16, 100, E5M2),
        (BF16, 32776, E4M3),
        (FP32, 1001, E4M3),
    ],
}
# RMSNorm -> fp8 with float32 weights: CUDA in registers (4096, 5120), from L1 (16384), generic (100).
MIXED_QUANT_CASES = {
    "reference": [(BF16, 128, E4M3)],
    "sycl": [(BF16, 1024, E4M3), (FP16, 1000, E5M2)],
    "cuda": [(BF16, 4096, E4M3), (BF16, 5120, E4M3), (FP16, 8192, E5M2), (BF16, 16384, E4M3),
             (BF16, 100, E5M2)],
}  # fmt: skip
ACROSS_CASES = {  # (dtype, q width, k width)
    "reference": [(BF16, 256, 128)],
    "sycl": [(BF16, 512, 128), (FP32, 1000, 200)],
    "cuda": [(BF16, 4096, 1024), (FP32, 1000, 202)],
}
# float32 weights of 16-bit rows. CUDA: the weight in registers (bf16 256: one vector per thread), from
# L1 after the reduction (bf16 4096, 16384; fp16 5120), the generic kernel (bf16 100).
MIXED_CASES = {
    "reference": [(BF16, 64)],
    "sycl": [(BF16, 1024), (FP16, 100)],
    "cuda": [(BF16, 256), (BF16, 4096), (FP16, 5120), (BF16, 16384), (BF16, 100)],
}
MIXED_QK_CASES = {  # (dtype, head_dim, q width, k width) with float32 weights
    "reference": [(BF16, 128, 256, 128)],
    "sycl": [(BF16, 128, 512, 128)],
    "cuda": [(BF16, 128, 4096, 1024), (FP16, 256, 1000, 202)],
}
ROUND_CASES = {  # round_before_weight
    "reference": [(BF16, 96)],
    "sycl": [(BF16, 1024), (FP16, 100)],
    "cuda": [(BF16, 4096), (FP16, 1024), (BF16, 100)],
}
# (rows, width) of bf16 rows past NormConfig::kManyRows in csrc/norm.cuh: widths on both sides of
# the rule that picks the many-rows row groups there (rows of 256, 320, 448 and 512 vectors).
MANY_ROWS_CASES = ((70001, 1024), (16390, 2048), (16385, 2560), (16411, 3584), (16411, 4096))
BATCHED_CASES = {  # [B, S, H] slices of bigger buffers
    "reference": [(BF16, 64)],
    "sycl": [(BF16, 1024), (FP16, 100)],
    "cuda": [(BF16, 4096), (FP16, 5120), (BF16, 100)],
}


# ------------------------------------------------------------------------------------------------
# Fixtures and helpers


@pytest.fixture(scope="session")
def norm_cache(tmp_path_factory):
    """One module cache for the whole run, shared by the xdist workers: modules compile once."""
    path = os.environ.get("SGLJIT_CACHE_DIR") or str(run_wide_dir(tmp_path_factory, "norm-cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGLJIT_CACHE_DIR", path)
        yield path


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _cuda_specs() -> list[dict]:
    """Every CUDA module the GPU tests use, as ``family.prebuild`` arguments (one per module)."""
    w = ops.compiled_width

    def rows(dt, h, weight=None, round=False, float_sum=False):
        return dict(op="rmsnorm", dtype=dt, weight=weight or dt, width=w(dt, h), round=round,
                    float_sum=float_sum)  # fmt: skip

    cases = ROW_CASES["cuda"] + GEMMA_CASES["cuda"] + BATCHED_CASES["cuda"]
    cases += [(BF16, width) for _, width in MANY_ROWS_CASES] + [(FP32, 1024)]
    specs = [rows(dt, h) for dt, h in cases]
    specs += [rows(dt, h, weight=FP32) for dt, h in MIXED_CASES["cuda"]]
    specs += [rows(dt, h, round=True) for dt, h in ROUND_CASES["cuda"]]
    specs += [rows(BF16, 4096, float_sum=True), rows(FP16, 1000, float_sum=True)]  # FlashInfer's
    specs += [dict(op="qknorm", dtype=dt, weight=dt, width=w(dt, d)) for dt, d in QK_CASES["cuda"]]
    for dt, wq, wk in ACROSS_CASES["cuda"]:
        specs.append(dict(op="qknorm_across_heads", **ops._across_params(dt, wq, wk)))
    for dt, h, f8 in QUANT_CASES["cuda"]:
        specs.append(dict(op="rmsnorm_quant_fp8_static", **ops._quant_params(dt, dt, f8, h)))
    for dt, h, f8 in MIXED_QUANT_CASES["cuda"]:
        specs.append(dict(op="rmsnorm_quant_fp8_static", **ops._quant_params(dt, FP32, f8, h)))
    for dt, d, wq, wk in MIXED_QK_CASES["cuda"]:
        specs.append(dict(op="qknorm", dtype=dt, weight=FP32, width=w(dt, d)))
        specs.append(dict(op="qknorm_across_heads", **ops._across_params(dt, wq, wk, FP32)))
    unique = {}
    for s in specs:
        s = {k: _name(v) if isinstance(v, torch.dtype) else v for k, v in s.items()}
        unique.setdefault(json.dumps(s, sort_keys=True), s)
    return list(unique.values())


_BUILD = (
    "import json, sys\nfrom sgljit_norm import ops\n"
    "for spec in json.loads(sys.argv[1]): ops.family.prebuild('cuda', **spec)"
)


def _build(specs: list[dict]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _BUILD, json.dumps(specs)], capture_output=True, text=True
    )
    assert proc.returncode == 0, f"building {specs} failed:\n{proc.stdout}\n{proc.stderr}"


def _prebuild_parallel(specs: list[dict]) -> None:
    """Compile modules in parallel processes (builds inside one process are serialized), each
    process a share of the list, so an interpreter starts (and imports torch) once a share, not
    once a module; the cache then serves them to this process without compiling. Under
    pytest-xdist every worker runs this over the run's one cache (norm_cache), whose locks build
    each module once, so the cores are shared out."""
    sharing = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    # Each worker starts at its own share of the list: workers that all started at the first spec
    # would wait on each other's locks, leaving the build as parallel as one worker's processes.
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    start = worker * len(specs) // max(1, sharing)
    specs = specs[start:] + specs[:start]
    workers = max(1, min(len(specs), (os.cpu_count() or 2) // sharing))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for fut in [pool.submit(_build, specs[i::workers]) for i in range(workers)]:
            fut.result()


def _has_nvcc() -> bool:
    from sgljit.toolchain import find_nvcc

    return find_nvcc() is not None


@pytest.fixture(scope="session")
def cuda_modules(norm_cache):
    """GPU tests: build every module they use up front, in parallel."""
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")
    _prebuild_parallel(_cuda_specs())


@pytest.fixture
def backend_env(request, norm_cache):
    """(device, context manager) for the backend given by the test's ``backend`` parameter."""
    backend = request.node.callspec.params["backend"]
    if backend == "cuda":
        if not HAS_CUDA:
            pytest.skip("needs a CUDA GPU")
        request.getfixturevalue("cuda_modules")
        return "cuda", contextlib.nullcontext
    if backend == "sycl":
        if SYCL_MISSING:
            pytest.skip("SYCL runtime not installed")
        return "cpu", lambda: sgljit.use_backend("sycl")
    return "cpu", lambda: sgljit.use_backend("reference")


def _gen(device: str, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _randn(shape, dtype, device, seed, scale=1.0):
    """Random normal data, never exactly zero (shifted away from 0)."""
    x = torch.randn(shape, generator=_gen(device, seed), device=device, dtype=torch.float32) * scale
    x = torch.where(x.abs() < 1e-3, torch.full_like(x, 1e-3), x)
    return x.to(dtype)


def _oracle(x: torch.Tensor, w: torch.Tensor, eps: float, gemma: bool = False) -> torch.Tensor:
    """Independent float64 formula: x / sqrt(mean(x^2) + eps) * w."""
    xd, wd = x.double(), w.double()
    if gemma:
        wd = 1.0 + wd
    return xd / torch.sqrt((xd * xd).sum(-1, keepdim=True) / x.shape[-1] + eps) * wd


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert not torch.isnan(actual).any(), f"{what}: NaN left in the output (unwritten elements?)"
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol, msg=what)


def _poison(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _id(case) -> str:
    return "-".join(str(c).removeprefix("torch.") for c in case)


def _backend_cases(table: dict, *extra):
    """[(backend, case, *extra)] over every backend's own case list, with the backend's marks."""
    out = []
    for b in BACKENDS:
        name = b if isinstance(b, str) else b.values[0]
        marks = () if isinstance(b, str) else b.marks
        for case in table[name]:
            ident = "-".join([name, _id(case), *map(str, extra)])
            out.append(pytest.param(name, case, *extra, marks=marks, id=ident))
    return out


# ------------------------------------------------------------------------------------------------
# Numerics


@pytest.mark.parametrize(
    ("backend", "case", "gemma"),
    _backend_cases(ROW_CASES, False) + _backend_cases(GEMMA_CASES, True),
)
def test_rmsnorm(backend, case, gemma, backend_env):
    device, ctx = backend_env
    dtype, h = case
    fn = ops.gemma_rmsnorm if gemma else ops.rmsnorm
    w = _randn((h,), dtype, device, 1, scale=0.5 if gemma else 1.0)
    for t in TOKENS[backend]:
        x = _randn((t, h), dtype, device, 100 + t, scale=2.0)
        out = _poison((t, h), dtype, device)
        with ctx():
            ret = fn(x, w, 1e-6, out=out)
        assert ret is out
        _close(out, _oracle(x, w, 1e-6, gemma), dtype, f"{fn.__name__} T={t} H={h} {dtype}")
        with ctx():
            fresh = fn(x, w, eps=1e-5)
        _close(fresh, _oracle(x, w, 1e-5, gemma), dtype, f"{fn.__name__} T={t} H={h} (allocated)")


@pytest.mark.parametrize(
    ("backend", "case", "gemma"),
    _backend_cases(ROW_CASES, False) + _backend_cases(GEMMA_CASES, True),
)
def test_fused_add_rmsnorm(backend, case, gemma, backend_env):
    _check_fused(backend, case, gemma, backend_env)


def _check_fused(backend, case, gemma, backend_env):
    device, ctx = backend_env
    dtype, h = case
    fn = ops.gemma_fused_add_rmsnorm if gemma else ops.fused_add_rmsnorm
    w = _randn((h,), dtype, device, 2, scale=0.5 if gemma else 1.0)
    for t in TOKENS[backend]:
        x = _randn((t, h), dtype, device, 200 + t)
        r = _randn((t, h), dtype, device, 300 + t, scale=3.0)
        total = (x.double() + r.double()).to(dtype)  # the residual, rounded to the dtype
        expected = _oracle(total, w, 1e-6, gemma)
        with ctx():
            assert fn(x, r, w, 1e-6) is None
        what = f"{fn.__name__} T={t} H={h} {dtype}"
        torch.testing.assert_close(
            r.double(), total.double(), rtol=0, atol=0, msg=what + " residual"
        )
        _close(x, expected, dtype, what + " output")


@pytest.mark.parametrize(("backend", "case"), _backend_cases(QK_CASES))
def test_qknorm_fused_qkv_views(backend, case, backend_env):
    """q and k are strided views into one qkv buffer; v and the padding stay untouched."""
    device, ctx = backend_env
    dtype, d = case
    heads = [(32, 8), (5, 1)] if backend == "cuda" and d <= 256 else [(4, 2), (3, 1)]
    qw = _randn((d,), dtype, device, 3)
    kw = _randn((d,), dtype, device, 4)
    for hq, hk in heads:
        for t in TOKENS[backend]:
            width = (hq + 2 * hk) * d + 8  # 8 elements of padding keep 16-byte row alignment
            qkv = _randn((t, width), dtype, device, 400 + t + hq)
            before = qkv.clone()
            q = qkv[:, : hq * d].view(t, hq, d)
            k = qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
            eq, ek = _oracle(q, qw, 1e-6), _oracle(k, kw, 1e-6)
            with ctx():
                assert ops.qknorm(q, k, qw, kw, 1e-6) is None
            what = f"qknorm T={t} Hq={hq} Hk={hk} D={d} {dtype}"
            _close(q, eq, dtype, what + " q")
            _close(k, ek, dtype, what + " k")
            assert torch.equal(qkv[:, (hq + hk) * d :], before[:, (hq + hk) * d :]), what + " v"


@pytest.mark.parametrize(("backend", "case"), _backend_cases(ACROSS_CASES))
def test_qknorm_across_heads(backend, case, backend_env):
    device, ctx = backend_env
    dtype, wq, wk = case
    qw = _randn((wq,), dtype, device, 5)
    kw = _randn((wk,), dtype, device, 6)
    for t in TOKENS[backend]:
        qkv = _randn((t, wq + 2 * wk + 8), dtype, device, 500 + t)
        before = qkv.clone()
        q, k = qkv[:, :wq], qkv[:, wq : wq + wk]
        eq, ek = _oracle(q, qw, 1e-6), _oracle(k, kw, 1e-6)
        with ctx():
            assert ops.qknorm_across_heads(q, k, qw, kw, 1e-6) is None
        what = f"qknorm_across_heads T={t} {wq}/{wk} {dtype}"
        _close(q, eq, dtype, what + " q")
        _close(k, ek, dtype, what + " k")
        assert torch.equal(qkv[:, wq + wk :], before[:, wq + wk :]), what + " v"


ROW_OPS = ("rmsnorm", "gemma_rmsnorm", "fused_add_rmsnorm", "gemma_fused_add_rmsnorm")


@pytest.mark.parametrize(("backend", "case"), _backend_cases(MIXED_CASES))
@pytest.mark.parametrize("name", ROW_OPS)
def test_float32_weight_of_16_bit_rows(backend, case, name, backend_env):
    device, ctx = backend_env
    dtype, h = case
    gemma, fn = name.startswith("gemma"), getattr(ops, name)
    w = _randn((h,), FP32, device, 60, scale=0.5 if gemma else 1.0)
    assert w.double().to(dtype).double().ne(w.double()).any(), "the weight must not fit the dtype"
    for t in TOKENS[backend]:
        x = _randn((t, h), dtype, device, 600 + t, scale=2.0)
        what = f"{name} T={t} H={h} {dtype}, float32 weight"
        if "fused" in name:
            r = _randn((t, h), dtype, device, 700 + t)
            total = (x.double() + r.double()).to(dtype)
            with ctx():
                fn(x, r, w, 1e-6)
            torch.testing.assert_close(r.double(), total.double(), rtol=0, atol=0, msg=what)
            _close(x, _oracle(total, w, 1e-6, gemma), dtype, what)
        else:
            out = _poison((t, h), dtype, device)
            with ctx():
                fn(x, w, 1e-6, out=out)
            _close(out, _oracle(x, w, 1e-6, gemma), dtype, what)


@pytest.mark.parametrize(("backend", "case"), _backend_cases(MIXED_QK_CASES))
def test_qk_norms_with_float32_weights(backend, case, backend_env):
    device, ctx = backend_env
    dtype, d, wq, wk = case
    qw, kw = _randn((d,), FP32, device, 61), _randn((d,), FP32, device, 62)
    for t in TOKENS[backend]:
        qkv = _randn((t, 6 * d), dtype, device, 800 + t)
        q, k = qkv[:, : 4 * d].view(t, 4, d), qkv[:, 4 * d : 6 * d].view(t, 2, d)
        eq, ek = _oracle(q, qw, 1e-6), _oracle(k, kw, 1e-6)
        with ctx():
            ops.qknorm(q, k, qw, kw, 1e-6)
        _close(q, eq, dtype, f"qknorm T={t} D={d} float32 weights, q")
        _close(k, ek, dtype, f"qknorm T={t} D={d} float32 weights, k")
    qw, kw = _randn((wq,), FP32, device, 63), _randn((wk,), FP32, device, 64)
    for t in TOKENS[backend]:
        q, k = _randn((t, wq), dtype, device, 900 + t), _randn((t, wk), dtype, device, 950 + t)
        eq, ek = _oracle(q, qw, 1e-6), _oracle(k, kw, 1e-6)
        with ctx():
            ops.qknorm_across_heads(q, k, qw, kw, 1e-6)
        _close(q, eq, dtype, f"qknorm_across_heads T={t} {wq}/{wk} float32 weights, q")
        _close(k, ek, dtype, f"qknorm_across_heads T={t} {wq}/{wk} float32 weights, k")
    with pytest.raises(ValueError, match=r"^k_weight: dtype expected float32 \(same as"):
        ops.qknorm(
            _randn((1, 4, d), dtype, device, 3),
            _randn((1, 2, d), dtype, device, 4),
            _randn((d,), FP32, device, 1),
            _randn((d,), dtype, device, 2),
        )


def _hf_rounded(x, w, eps: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(Hugging Face's LlamaRMSNorm, the same without the rounding before the weight multiply),
    both in float64 and rounded to ``dtype`` at the end."""
    xd = x.double()
    normed = xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + eps)
    hf = (normed.to(dtype).double() * w.double()).to(dtype)
    return hf, (normed * w.double()).to(dtype)


@pytest.mark.parametrize(("backend", "case"), _backend_cases(ROUND_CASES))
@pytest.mark.parametrize("fused", [False, True])
def test_round_before_weight_is_hugging_faces_rounding(backend, case, fused, backend_env):
    """Element by element the output is Hugging Face's (x * rsqrt(...) rounded to the dtype, then the
    weight multiply), not the single rounding at the end, which differs on these inputs."""
    device, ctx = backend_env
    dtype, h = case
    w = _randn((h,), dtype, device, 65, scale=3.0)
    t = 64
    x = _randn((t, h), dtype, device, 66, scale=2.0)
    if fused:  # the float32 sum is normalized (sglang's cast_x_before_out_mul)
        r = _randn((t, h), dtype, device, 67)
        total = (x.double() + r.double()).to(dtype)
        hf, plain = _hf_rounded(x.double() + r.double(), w, 1e-6, dtype)
        with ctx():
            ops.fused_add_rmsnorm(x, r, w, 1e-6, round_before_weight=True)
        torch.testing.assert_close(r.double(), total.double(), rtol=0, atol=0)
        out = x
    else:
        hf, plain = _hf_rounded(x, w, 1e-6, dtype)
        out = _poison((t, h), dtype, device)
        with ctx():
            ops.rmsnorm(x, w, 1e-6, out=out, round_before_weight=True)
    what = f"{'fused_add_rmsnorm' if fused else 'rmsnorm'} H={h} {dtype} round_before_weight"
    _close(out, hf, dtype, what)
    off_hf = out.ne(hf).double().mean().item()
    off_plain = out.ne(plain).double().mean().item()
    assert hf.ne(plain).double().mean().item() > 0.02, "the inputs must tell the roundings apart"
    assert off_hf < 1e-3 < 0.01 < off_plain, (
        f"{what}: {off_hf} differ from HF, {off_plain} from one rounding"
    )


@pytest.mark.parametrize(("backend", "case"), _backend_cases(BATCHED_CASES))
def test_batched_slices_of_bigger_buffers(backend, case, backend_env):
    """[B, S, H] views whose leading dimensions do not collapse into one row stride (rows 1..S of
    each batch of a bigger buffer) are normalized where they are; the rest of the buffers stays."""
    device, ctx = backend_env
    dtype, h = case
    b, s = 3, 5
    w = _randn((h,), dtype, device, 70)
    x = _randn((b, s + 2, h), dtype, device, 71)[:, 1:-1]
    out_buf = _poison((b, s + 3, h), dtype, device)
    out = out_buf[:, 2:-1]
    assert out.shape == x.shape == (b, s, h) and out.stride(0) != s * out.stride(1)
    for name, gemma in (("rmsnorm", False), ("gemma_rmsnorm", True)):
        out_buf.fill_(float("nan"))
        with ctx():
            assert getattr(ops, name)(x, w, out=out) is out
        _close(out, _oracle(x, w, 1e-6, gemma), dtype, f"{name} into a [B, S, H] slice")
        assert torch.isnan(out_buf[:, :2]).all() and torch.isnan(out_buf[:, -1]).all(), name
    out_buf.fill_(float("nan"))
    with ctx():  # [B*S, H] rows into the slice, float32 weight, rounding
        ops.rmsnorm(x.reshape(b * s, h), w.float(), out=out, round_before_weight=True)
    _close(out, _hf_rounded(x, w, 1e-6, dtype)[0], dtype, "rmsnorm of rows into a slice")
    assert torch.isnan(out_buf[:, :2]).all() and torch.isnan(out_buf[:, -1]).all()
    buf = _randn((b, s + 2, h), dtype, device, 72)
    before, inplace = buf.clone(), buf[:, 1:-1]
    expected = _oracle(inplace, w, 1e-6)
    with ctx():
        ops.rmsnorm(inplace, w, out=inplace)
    _close(inplace, expected, dtype, "rmsnorm in place on a slice")
    assert torch.equal(buf[:, 0], before[:, 0]) and torch.equal(buf[:, -1], before[:, -1])

    for name, gemma in (("fused_add_rmsnorm", False), ("gemma_fused_add_rmsnorm", True)):
        xb = _randn((b, s + 1, h), dtype, device, 73)
        rb = _randn((b, s + 2, h), dtype, device, 74)
        xb_before, rb_before = xb.clone(), rb.clone()
        xv, rv = xb[:, 1:], rb[:, :-2]
        total = (xv.double() + rv.double()).to(dtype)
        with ctx():
            getattr(ops, name)(xv, rv, w)
        torch.testing.assert_close(rv.double(), total.double(), rtol=0, atol=0, msg=name)
        _close(xv, _oracle(total, w, 1e-6, gemma), dtype, f"{name} on [B, S, H] slices")
        assert torch.equal(xb[:, 0], xb_before[:, 0]) and torch.equal(rb[:, -2:], rb_before[:, -2:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_and_nd_views(backend, backend_env):
    """Rows of a wider buffer (input, out), 3-D inputs, and an out view whose surroundings stay NaN."""
    device, ctx = backend_env
    dtype, h = (BF16, 1024)
    t = 4109 if backend == "cuda" else 33
    w = _randn((h,), dtype, device, 7)
    buf = _randn((t, h + 64), dtype, device, 8)
    x = buf[:, 32 : 32 + h]  # row stride h + 64, 16-byte aligned
    out_buf = _poison((t, 2 * h), dtype, device)
    out = out_buf[:, h:]
    with ctx():
        ops.rmsnorm(x, w, out=out)
    _close(out, _oracle(x, w, 1e-6), dtype, "strided rmsnorm")
    assert torch.isnan(out_buf[:, :h]).all(), "rmsnorm wrote outside its out view"

    x3 = _randn((3, 5, h), dtype, device, 9)
    with ctx():
        y3 = ops.rmsnorm(x3, w)
    assert y3.shape == x3.shape
    _close(y3, _oracle(x3, w, 1e-6), dtype, "3-D rmsnorm")
    # leading dimensions that do not collapse into one stride: the *_3d op reads them in place
    x_nc = _randn((5, 3, h), dtype, device, 10).transpose(0, 1)
    with ctx():
        y_nc = ops.rmsnorm(x_nc, w)
    _close(y_nc, _oracle(x_nc, w, 1e-6), dtype, "non-collapsible rmsnorm")

    # fused add on strided rows of two buffers
    xb = _randn((t, h + 16), dtype, device, 11)
    rb = _randn((t, 2 * h), dtype, device, 12)
    xv, rv = xb[:, 16:], rb[:, :h]
    total = (xv.double() + rv.double()).to(dtype)
    expected = _oracle(total, w, 1e-6)
    xb_before, rb_before = xb.clone(), rb.clone()
    with ctx():
        ops.fused_add_rmsnorm(xv, rv, w)
    torch.testing.assert_close(rv.double(), total.double(), rtol=0, atol=0)
    _close(xv, expected, dtype, "strided fused_add_rmsnorm")
    assert torch.equal(xb[:, :16], xb_before[:, :16]) and torch.equal(rb[:, h:], rb_before[:, h:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_misaligned_rows_take_the_generic_path(backend, backend_env):
    """Views starting 1 element into a buffer are not 16-byte aligned: still correct."""
    device, ctx = backend_env
    dtype, h = (FP16, 5120) if backend == "cuda" else (FP16, 100)
    t = 7
    w = _randn((h,), dtype, device, 13)
    buf = _randn((t, h + 3), dtype, device, 14)
    x = buf[:, 1 : 1 + h]
    with ctx():
        y = ops.rmsnorm(x, w)
    _close(y, _oracle(x, w, 1e-6), dtype, "misaligned rmsnorm")
    rbuf = _randn((t, h + 1), dtype, device, 15)
    xs, rs = x.clone(), rbuf[:, 1:]
    total = (xs.double() + rs.double()).to(dtype)
    with ctx():
        ops.fused_add_rmsnorm(xs, rs, w)
    torch.testing.assert_close(rs.double(), total.double(), rtol=0, atol=0)
    _close(xs, _oracle(total, w, 1e-6), dtype, "misaligned fused_add_rmsnorm")


def test_reference_matches_float64():
    """The reference itself (the CPU path) against the float64 formula, fp32 and bf16."""
    for dtype in (FP32, BF16):
        x = _randn((9, 96), dtype, "cpu", 16, scale=3.0)
        w = _randn((96,), dtype, "cpu", 17)
        out = _poison((9, 96), dtype, "cpu")
        reference.rmsnorm_into(x, w, out, 1e-6)
        _close(out, _oracle(x, w, 1e-6), dtype, f"reference {dtype}")
        reference.rmsnorm_into(x, w, out, 1e-6, gemma=True)
        _close(out, _oracle(x, w, 1e-6, True), dtype, f"reference gemma {dtype}")


# ------------------------------------------------------------------------------------------------
# RMSNorm -> fp8
#
# The definition: y = rmsnorm(x) in float32, out = fp8((y / scale).clamp(+-fp8_max)) with a correctly
# rounded float32 division; per token scale = max(absmax(y of the row) / fp8_max, 2^-126). The float32
# y of a backend differs from the float64 one in its last bits (rsqrt, summation order), so a quotient
# lying that close to a rounding boundary of fp8 may take the neighbouring code. With 16-bit inputs
# and a per-token scale that happens often enough to count: y_i / scale = fp8_max * y_i / max|y|, a
# ratio of products of 8- or 11-bit numbers, lands exactly on a midpoint between two codes for about
# one element in 10^4 (bf16), and which way it then rounds is decided by those last bits. So against
# the float64 oracle (rounded straight to fp8, ties to even) the codes must agree but for a small
# fraction, and there by one step. Where y is exact on every backend (rows of +-1, eps 0: y = +-w),
# codes and scales must be bit-exact.

# Codes that may differ from the float64 oracle, by one step: a fraction (measured on the reference:
# about 1e-4 with a per-token scale, 1e-6 with a static one) and a few for small samples.
QUANT_MISMATCH, QUANT_MISMATCH_SLACK = 1e-3, 8


def _fp8_max(fp8_dtype) -> float:
    return float(torch.finfo(fp8_dtype).max)


def _poison_fp8(shape, fp8_dtype, device) -> torch.Tensor:
    """0xFF in every byte: a NaN in both formats, so unwritten codes show."""
    return torch.full(shape, 0xFF, dtype=torch.uint8, device=device).view(fp8_dtype)


def _fp8_encode(q: torch.Tensor, fp8_dtype) -> torch.Tensor:
    """fp8 of float64 ``q`` (within +-fp8_max): the nearest value, ties to the even code."""
    codes = torch.arange(128, dtype=torch.uint8)
    vals = codes.view(fp8_dtype).double()
    finite = vals.isfinite()
    codes, vals = codes[finite].long(), vals[finite]
    a = q.abs()
    hi = torch.searchsorted(vals, a).clamp(max=len(vals) - 1)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = a - vals[lo], vals[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0))
    code = torch.where(pick_hi, codes[hi], codes[lo]) | (torch.signbit(q).long() << 7)
    code = torch.where(q.isnan(), torch.full_like(code, 0x7F), code)
    return code.to(torch.uint8).view(fp8_dtype)


def _oracle_codes(y64: torch.Tensor, scale: torch.Tensor, fp8_dtype) -> torch.Tensor:
    """fp8 of float64 y / scale, clamped (no float32 rounding in between)."""
    m = _fp8_max(fp8_dtype)
    return _fp8_encode((y64.double().cpu() / scale.double().cpu()).clamp(-m, m), fp8_dtype)


def _oracle_scales(y64: torch.Tensor, fp8_dtype) -> torch.Tensor:
    amax = y64.double().cpu().abs().amax(-1, keepdim=True)
    return (amax / _fp8_max(fp8_dtype)).float().clamp_min(2.0**-126)


def _assert_codes_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Equal codes but for at most a QUANT_MISMATCH fraction of them (plus QUANT_MISMATCH_SLACK),
    those one step apart (same sign, adjacent bit patterns); NaN exactly where want is."""
    g, w = got.cpu(), want.cpu()
    assert g.dtype == w.dtype and g.shape == w.shape, what
    assert torch.equal(g.float().isnan(), w.float().isnan()), f"{what}: NaN codes differ"
    gb, wb = g.view(torch.uint8).int(), w.view(torch.uint8).int()
    differ = gb != wb
    n = int(differ.sum())
    if n:
        step = (gb[differ] - wb[differ]).abs()
        same_sign = (gb[differ] & 0x80) == (wb[differ] & 0x80)
        assert bool((step == 1).all() and same_sign.all()), (
            f"{what}: codes differ by more than one step: got {gb[differ][:8].tolist()}, "
            f"want {wb[differ][:8].tolist()}"
        )
    bound = QUANT_MISMATCH * g.numel() + QUANT_MISMATCH_SLACK
    assert n <= bound, f"{what}: {n} of {g.numel()} codes differ"


def _quant_call(fused, x, r, w, scale, eps, **kw):
    if fused:
        return ops.fused_add_rmsnorm_quant_fp8(x, r, w, scale, eps, **kw)
    return ops.rmsnorm_quant_fp8(x, w, scale, eps, **kw)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "per_token"])
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused_add"])
@pytest.mark.parametrize(("backend", "case"), _backend_cases(QUANT_CASES))
def test_rmsnorm_quant_fp8(backend, case, fused, dynamic, backend_env):
    _check_quant(backend, *case, fused, dynamic, backend_env, weight_dtype=None)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "per_token"])
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused_add"])
@pytest.mark.parametrize(("backend", "case"), _backend_cases(MIXED_QUANT_CASES))
def test_rmsnorm_quant_fp8_float32_weights(backend, case, fused, dynamic, backend_env):
    _check_quant(backend, *case, fused, dynamic, backend_env, weight_dtype=FP32)


def _check_quant(backend, dtype, h, f8, fused, dynamic, backend_env, weight_dtype):
    device, ctx = backend_env
    w = _randn((h,), weight_dtype or dtype, device, 50)
    for t in TOKENS[backend]:
        # rows over three magnitudes
        x = _randn((t, h), dtype, device, 600 + t, scale=3.0)
        x = (x.float() * torch.exp2(torch.arange(t, device=device) % 3 - 1.0)[:, None]).to(dtype)
        r = _randn((t, h), dtype, device, 700 + t, scale=2.0) if fused else None
        x_before = x.clone()
        total = (x.double() + r.double()).to(dtype) if fused else x
        y64 = _oracle(total, w, 1e-6)
        # a static scale that saturates the largest values
        scale = None if dynamic else (y64.abs().amax().float() / _fp8_max(f8) * 0.8123).reshape(1)
        out = _poison_fp8((t, h), f8, device)
        scales = torch.full((t, 1), float("nan"), device=device) if dynamic else None
        with ctx():
            got, got_scale = _quant_call(fused, x, r, w, scale, 1e-6, out=out, scales=scales)
        what = f"{'fused_add_' if fused else ''}rmsnorm_quant_fp8 T={t} H={h} {dtype}->{f8}"
        what += f" weight {weight_dtype}" if weight_dtype else ""
        assert got is out and got_scale is (scales if dynamic else scale), what
        if dynamic:
            torch.testing.assert_close(
                scales.cpu(), _oracle_scales(y64, f8), rtol=1e-5, atol=0, msg=what + " scales"
            )
        _assert_codes_close(out, _oracle_codes(y64, scales if dynamic else scale, f8), what)
        if fused:
            torch.testing.assert_close(r.double(), total.double(), rtol=0, atol=0, msg=what)
        assert torch.equal(x, x_before), what + ": input was written"


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused_add"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rmsnorm_quant_fp8_is_exact_where_y_is(backend, fused, backend_env):
    """Rows of +-1 with eps 0 normalize to exactly +-w (mean 1, rsqrt(1) = 1 on every backend), so
    the codes and per-token scales must be bit-identical to the definition: the division by the
    scale, the clamp and the conversion exactly as (y / scale).clamp(...).to(fp8). The weights span
    many magnitudes (fp8 subnormals, saturation, rounding ties of the division)."""
    device, ctx = backend_env
    for dtype, h in ((BF16, 4096 if backend == "cuda" else 1024), (FP32, 1001)):
        g = _gen("cpu", 60 + h)
        mags = torch.exp2(torch.randint(-14, 10, (h,), generator=g).double())
        w = (torch.randn(h, generator=g, dtype=torch.float64) * mags).to(dtype).to(device)
        signs = torch.where(torch.rand(33, h, generator=g) < 0.5, -1.0, 1.0)
        y = (signs * w.cpu().float()).float()  # exact: +-w
        for f8 in (E4M3, E5M2):
            for scale in (torch.tensor([0.0371]), torch.tensor([1.0]), None):
                x = (signs * 0.5 if fused else signs).to(dtype).to(device)
                r = (signs * 0.5).to(dtype).to(device) if fused else None
                s = scale.to(device) if scale is not None else None
                with ctx():
                    out, got_scale = _quant_call(fused, x, r, w, s, 0.0, fp8_dtype=f8)
                want_scale = _oracle_scales(y, f8) if scale is None else scale
                what = f"exact rows {dtype} H={h} {f8} scale={scale}"
                if scale is None:
                    assert torch.equal(got_scale.cpu(), want_scale), what + " scales"
                m = _fp8_max(f8)
                want = (y / want_scale).clamp(-m, m).to(f8)
                assert torch.equal(out.cpu().view(torch.uint8), want.view(torch.uint8)), what


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused_add"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rmsnorm_quant_fp8_nan_inf_and_saturation(backend, fused, backend_env):
    """The NaN/inf policy: a NaN in a row makes every code of that row NaN (and its per-token scale);
    an inf makes the row's inv_rms 0, so its codes are 0 but NaN where the inf was (per token: that
    NaN makes the scale NaN, so the whole row); other rows are unaffected. A static scale too small
    saturates to +-fp8_max, a zero scale too (0 / 0 would be NaN), a NaN scale gives NaN codes."""
    device, ctx = backend_env
    dtype, h = (BF16, 4096) if backend == "cuda" else (BF16, 1024)
    w = _randn((h,), dtype, device, 70)
    x = _randn((4, h), dtype, device, 71)
    x[1, 5], x[2, 7], x[3, 9] = float("nan"), float("inf"), float("-inf")
    zeros = torch.zeros(4, h, dtype=dtype, device=device)
    for f8 in (E4M3, E5M2):
        for dynamic in (False, True):
            scale = None if dynamic else torch.tensor([0.01], device=device)
            xi, ri = (zeros.clone(), x.clone()) if fused else (x, None)
            with ctx():
                out, sc = _quant_call(fused, xi, ri, w, scale, 1e-6, fp8_dtype=f8)
            v = out.float().cpu()
            what = f"nan/inf {f8} {'per_token' if dynamic else 'static'}"
            assert not v[0].isnan().any(), what + ": a finite row got NaN codes"
            assert v[1].isnan().all(), what + ": the NaN row"
            for row, col in ((2, 7), (3, 9)):
                if dynamic:
                    assert v[row].isnan().all(), what + ": an inf row (per token)"
                else:
                    assert v[row, col].isnan(), what + ": the inf position"
                    rest = torch.cat([v[row, :col], v[row, col + 1 :]])
                    assert (rest == 0).all(), what + ": the rest of an inf row"
            if dynamic:
                s = sc.cpu().flatten()
                assert s[0].isfinite() and s[1:].isnan().all(), what + f" scales {s.tolist()}"
    y = _randn((3, h), dtype, device, 72)
    m = _fp8_max(E4M3)
    for value, expect in ((1e-20, "max"), (0.0, "max"), (float("nan"), "nan")):
        with ctx():
            out, _ = ops.rmsnorm_quant_fp8(y, w, torch.tensor([value], device=device))
        v = out.float().cpu()
        if expect == "nan":
            assert v.isnan().all(), f"scale {value}"
        else:
            want = torch.where(_oracle(y, w, 1e-6).cpu() < 0, -m, m).float()
            assert torch.equal(v, want), f"scale {value}: not saturated to +-{m}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_rmsnorm_quant_fp8_views_and_shapes(backend, backend_env):
    """Strided rows (input, residual and out are column slices; input and residual two halves of one
    buffer), 3-D inputs with [..., 1] or [T] scales, a 0-d static scale, out of another fp8 dtype."""
    device, ctx = backend_env
    dtype, h, t = BF16, 1024, 9
    w = _randn((h,), dtype, device, 80)
    buf = _randn((t, 2 * h + 64), dtype, device, 81)
    x, r = buf[:, 32 : 32 + h], buf[:, 32 + h : 32 + 2 * h]
    total = (x.double() + r.double()).to(dtype)
    x_before, pad_before = x.clone(), buf[:, :32].clone()
    obuf = _poison_fp8((t, h + 48), E5M2, device)
    out = obuf[:, 16 : 16 + h]
    with ctx():
        got, scales = ops.fused_add_rmsnorm_quant_fp8(x, r, w, out=out)
    assert got is out and scales.shape == (t, 1) and got.dtype == E5M2
    torch.testing.assert_close(r.double(), total.double(), rtol=0, atol=0)
    assert torch.equal(x, x_before) and torch.equal(buf[:, :32], pad_before)
    y64 = _oracle(total, w, 1e-6)
    _assert_codes_close(out, _oracle_codes(y64, scales, E5M2), "strided fused_add per token")
    assert obuf[:, :16].float().isnan().all() and obuf[:, 16 + h :].float().isnan().all()

    x3 = _randn((3, 5, h), dtype, device, 82)
    y3 = _oracle(x3, w, 1e-6)
    for scales in (None, torch.empty(15, device=device), torch.empty(3, 5, 1, device=device)):
        with ctx():
            out3, s3 = ops.rmsnorm_quant_fp8(x3, w, scales=scales)
        assert out3.shape == x3.shape and (scales is None or s3 is scales)
        assert s3.shape == ((3, 5, 1) if scales is None else scales.shape)
        s3v = s3.reshape(3, 5, 1)
        torch.testing.assert_close(s3v.cpu(), _oracle_scales(y3, E4M3), rtol=1e-5, atol=0)
        _assert_codes_close(out3, _oracle_codes(y3, s3v, E4M3), "3-D per token")
    s0 = torch.tensor(0.02, device=device)
    with ctx():
        out0, ret = ops.rmsnorm_quant_fp8(x3, w, s0)
    assert ret is s0
    _assert_codes_close(out0, _oracle_codes(y3, s0, E4M3), "3-D static, 0-d scale")


@pytest.mark.parametrize("backend", BACKENDS)
def test_rmsnorm_quant_fp8_refuses_outputs_that_share_memory(backend, backend_env):
    """A written tensor sharing memory with another argument is refused naming it, on every backend
    with the same message (the kernels read rows while others are written)."""
    device, ctx = backend_env
    h = 256
    w = _randn((h,), BF16, device, 90)
    x = _randn((4, h), BF16, device, 91)
    r = _randn((4, h), BF16, device, 92)
    in_x = x.view(torch.uint8)[:, :h].view(E4M3)  # out over input's bytes
    scales_in_out = torch.empty(4 * h, dtype=torch.uint8, device=device)
    cases = [
        (lambda: ops.rmsnorm_quant_fp8(x, w, out=in_x), "out: shares memory with input"),
        (
            lambda: ops.rmsnorm_quant_fp8(
                x,
                w,
                out=scales_in_out.view(E4M3).view(4, h),
                scales=scales_in_out[:16].view(torch.float32),
            ),
            "scales: shares memory with out",
        ),
        (lambda: ops.fused_add_rmsnorm_quant_fp8(x, x, w), "residual: shares memory with input"),
        (
            lambda: ops.fused_add_rmsnorm_quant_fp8(
                x,
                r,
                w,
                torch.tensor([1.0], device=device),
                out=r.view(torch.uint8)[:, :h].view(E4M3),
            ),
            "out: shares memory with residual",
        ),
        (
            lambda: ops.fused_add_rmsnorm_quant_fp8(x, r, r[0].clone().view(-1)[:h], out=None),
            None,  # a copy of a row: allowed
        ),
    ]
    for call, message in cases:
        if message is None:
            with ctx():
                call()
            continue
        with ctx(), pytest.raises(ValueError, match="^" + message):
            call()


def test_rmsnorm_quant_fp8_bad_arguments_name_themselves():
    x = torch.randn(3, 64, dtype=BF16)
    w = torch.randn(64, dtype=BF16)
    with pytest.raises(TypeError, match=r"^fp8_dtype: expected torch.float8_e4m3fn"):
        ops.rmsnorm_quant_fp8(x, w, fp8_dtype=torch.int8)
    with pytest.raises(TypeError, match=r"^out: dtype must be torch.float8_e5m2 \(fp8_dtype\)"):
        ops.rmsnorm_quant_fp8(x, w, out=torch.empty(3, 64, dtype=E4M3), fp8_dtype=E5M2)
    with pytest.raises(
        ValueError, match=r"^out: dtype expected one of \{float8_e4m3fn, float8_e5m2\}"
    ):
        ops.rmsnorm_quant_fp8(x, w, out=torch.empty(3, 64, dtype=BF16))
    with pytest.raises(ValueError, match=r"^scale: dimension 0 expected 1, got 2"):
        ops.rmsnorm_quant_fp8(x, w, torch.ones(2))
    with pytest.raises(
        ValueError, match=r"^scale: dtype expected one of \{float32\}, got bfloat16"
    ):
        ops.rmsnorm_quant_fp8(x, w, torch.ones(1, dtype=BF16))
    with pytest.raises(TypeError, match=r"^scale: expected a torch.Tensor, got float"):
        ops.fused_add_rmsnorm_quant_fp8(x, x.clone(), w, 0.5)
    with pytest.raises(ValueError, match=r"^scales: only with a dynamic scale"):
        ops.rmsnorm_quant_fp8(x, w, torch.ones(1), scales=torch.empty(3, 1))
    with pytest.raises(ValueError, match=r"^scales: dimension 0 expected 3 \(num_tokens\), got 4"):
        ops.rmsnorm_quant_fp8(x, w, scales=torch.empty(4, 1))
    with pytest.raises(ValueError, match=r"^scales: expected a contiguous tensor"):
        ops.rmsnorm_quant_fp8(x, w, scales=torch.empty(3, 2)[:, :1])
    with pytest.raises(ValueError, match=r"^out: sgljit writes it, but its elements may share"):
        ops.rmsnorm_quant_fp8(x, w, out=torch.empty(1, 64, dtype=E4M3).expand(3, 64))
    with pytest.raises(ValueError, match=r"^residual: dtype expected bfloat16"):
        ops.fused_add_rmsnorm_quant_fp8(x, x.half(), w)
    with pytest.raises(ValueError, match=r"^weight: dtype expected"):  # input's dtype or float32
        ops.rmsnorm_quant_fp8(x, w.half())
    with pytest.raises(TypeError, match=r"^input: expected a torch.Tensor"):
        ops.rmsnorm_quant_fp8([1.0], w)


# ------------------------------------------------------------------------------------------------
# CUDA only: many rows, torch.compile, CUDA graphs


@pytest.mark.gpu
def test_cuda_many_rows(backend_env_cuda):
    """Grid-stride loops: far more row groups than resident blocks."""
    w8 = _randn((8,), BF16, "cuda", 18)
    x = _randn((300007, 8), BF16, "cuda", 19)
    out = _poison(x.shape, BF16, "cuda")
    ops.rmsnorm(x, w8, out=out)
    _close(out, _oracle(x, w8, 1e-6), BF16, "rmsnorm 300007x8")
    for seed, (rows, width) in enumerate(MANY_ROWS_CASES, start=20):
        w = _randn((width,), BF16, "cuda", 3 * seed)
        a = _randn((rows, width), BF16, "cuda", 3 * seed + 1)
        r = _randn((rows, width), BF16, "cuda", 3 * seed + 2)
        out = _poison((rows, width), BF16, "cuda")
        ops.rmsnorm(a, w, out=out)
        _close(out, _oracle(a, w, 1e-6), BF16, f"rmsnorm {rows}x{width}")
        total = (a.double() + r.double()).to(BF16)
        ops.fused_add_rmsnorm(a, r, w)
        torch.testing.assert_close(r.double(), total.double(), rtol=0, atol=0)
        _close(a, _oracle(total, w, 1e-6), BF16, f"fused_add_rmsnorm {rows}x{width}")
    # float32 rows of 1024 and 2048 are 256 and 512 vectors: the same many-rows row groups.
    for seed, width in enumerate((1024, 2048), start=26):
        w = _randn((width,), FP32, "cuda", 2 * seed)
        a = _randn((16390, width), FP32, "cuda", 2 * seed + 1)
        out = _poison(a.shape, FP32, "cuda")
        ops.rmsnorm(a, w, out=out)
        _close(out, _oracle(a, w, 1e-6), FP32, f"rmsnorm 16390x{width} float32")


@pytest.mark.gpu
def test_cuda_row_regimes(backend_env_cuda):
    """Each side of the launch rules in csrc/norm.cuh: rmsnorm's few-rows row groups for rows of a
    power-of-two number of vectors (below NormConfig::kFewRows) and the regular ones at and above
    it or at other widths; qknorm's heads packed, unpacked, and packed to make a prefetching grid
    (on the H200, 16/8 heads x 128 at T=128)."""
    for rows, width in (
        (1, 4096),
        (4095, 4096),
        (4096, 4096),
        (3, 16384),
        (1023, 2048),
        (77, 5120),
    ):
        w = _randn((width,), BF16, "cuda", rows)
        a = _randn((rows, width), BF16, "cuda", rows + 1)
        out = _poison(a.shape, BF16, "cuda")
        ops.rmsnorm(a, w, out=out)
        _close(out, _oracle(a, w, 1e-6), BF16, f"rmsnorm {rows}x{width}")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for t, hq, hk, d in ((1, 16, 8, 128), (128, 16, 8, 128), (sms, 8, 4, 256), (2048, 16, 8, 128)):
        qw, kw = _randn((d,), BF16, "cuda", 5), _randn((d,), BF16, "cuda", 6)
        q = _randn((t, hq, d), BF16, "cuda", t + hq)
        k = _randn((t, hk, d), BF16, "cuda", t + hk + 1)
        eq, ek = _oracle(q, qw, 1e-6), _oracle(k, kw, 1e-6)
        ops.qknorm(q, k, qw, kw, 1e-6)
        _close(q, eq, BF16, f"qknorm T={t} {hq}/{hk}x{d} q")
        _close(k, ek, BF16, f"qknorm T={t} {hq}/{hk}x{d} k")


@pytest.fixture
def backend_env_cuda(cuda_modules):
    """GPU-only tests: the run's cache, every module they use built once (cuda_modules)."""


@pytest.mark.gpu
def test_cuda_torch_compile_fullgraph(backend_env_cuda):
    h, d = 4096, 128
    w = _randn((h,), BF16, "cuda", 23)
    qw, kw = _randn((d,), BF16, "cuda", 24), _randn((d,), BF16, "cuda", 25)

    def layer(x, residual, qkv):
        y = sgljit.ops.rmsnorm(x, w, 1e-6)
        sgljit.ops.fused_add_rmsnorm(x, residual, w, 1e-6)
        q = qkv[:, : 32 * d].view(-1, 32, d)
        k = qkv[:, 32 * d : 40 * d].view(-1, 8, d)
        sgljit.ops.qknorm(q, k, qw, kw, 1e-6)
        return y * 2, x + 1

    for name in ("rmsnorm", "fused_add_rmsnorm", "qknorm"):
        getattr(sgljit.ops, name)  # resolve the lazy namespace eagerly
    compiled = torch.compile(layer, fullgraph=True)
    for t in (7, 129):
        x = _randn((t, h), BF16, "cuda", 26 + t)
        r = _randn((t, h), BF16, "cuda", 27 + t)
        qkv = _randn((t, 48 * d), BF16, "cuda", 28 + t)
        xe, re, qkve = x.clone(), r.clone(), qkv.clone()
        y, x1 = compiled(x, r, qkv)
        with sgljit.use_backend("reference"):
            ye, x1e = layer(xe, re, qkve)
        _close(y, ye, BF16, "compiled rmsnorm")
        _close(x1, x1e, BF16, "compiled fused_add_rmsnorm (returned)")
        _close(x, xe, BF16, "compiled fused_add_rmsnorm input (mutated)")
        torch.testing.assert_close(r, re, rtol=0, atol=0)
        _close(qkv, qkve, BF16, "compiled qknorm")


@pytest.mark.gpu
def test_cuda_rmsnorm_quant_fp8_compiles_and_replays(backend_env_cuda):
    """The public functions in torch.compile(fullgraph=True) and in a CUDA graph give the eager
    bytes (the kernel ops' own compile and graph checks are the conformance suite's)."""
    h = 4096
    w = _randn((h,), BF16, "cuda", 45)
    scale = torch.tensor([0.02], device="cuda")

    def layer(x, residual):
        q, s = sgljit.ops.fused_add_rmsnorm_quant_fp8(x, residual, w)
        q2, _ = sgljit.ops.rmsnorm_quant_fp8(residual, w, scale)
        return q.view(torch.uint8), s, q2.view(torch.uint8)

    for name in ("fused_add_rmsnorm_quant_fp8", "rmsnorm_quant_fp8"):
        getattr(sgljit.ops, name)  # resolve the lazy namespace eagerly
    compiled = torch.compile(layer, fullgraph=True)
    for t in (7, 129):
        x = _randn((t, h), BF16, "cuda", 46 + t)
        r = _randn((t, h), BF16, "cuda", 47 + t)
        r_eager = r.clone()
        got, want = compiled(x, r), layer(x, r_eager)
        assert torch.equal(r, r_eager)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)

    x = _randn((33, h), BF16, "cuda", 48)
    out = _poison_fp8((33, h), E4M3, "cuda")
    scales = torch.empty(33, 1, device="cuda")
    ops.rmsnorm_quant_fp8(x, w, out=out, scales=scales)  # load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.rmsnorm_quant_fp8(x, w, out=out, scales=scales)
    x.copy_(_randn((33, h), BF16, "cuda", 49))
    graph.replay()
    want_out, want_scales = ops.rmsnorm_quant_fp8(x, w)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.uint8), want_out.view(torch.uint8))
    assert torch.equal(scales, want_scales)


@pytest.mark.gpu
def test_cuda_runs_on_the_current_stream(backend_env_cuda):
    h = 4096
    w = _randn((h,), BF16, "cuda", 40)
    x = _randn((513, h), BF16, "cuda", 41)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = ops.rmsnorm(x, w)
    stream.synchronize()
    _close(y, _oracle(x, w, 1e-6), BF16, "rmsnorm on a side stream")


# ------------------------------------------------------------------------------------------------
# Bad inputs beyond what the conformance suite generates from the specs


def test_bad_inputs_the_public_functions_add():
    q = torch.randn(3, 4, 96, dtype=BF16)
    w = torch.randn(96, dtype=BF16)
    with pytest.raises(ValueError, match=r"^q: head dim \(last dimension\) 96 is not supported"):
        ops.qknorm(q, q.clone(), w, w)
    x3 = torch.randn(3, 5, 64, dtype=FP16).transpose(0, 1)
    x4 = torch.randn(2, 3, 5, 64, dtype=FP16).transpose(0, 2)  # 4-D: no [rows, H] view
    with pytest.raises(ValueError, match=r"^input: written in place, so its leading dimensions"):
        ops.fused_add_rmsnorm(x4, x4.clone(), torch.randn(64, dtype=FP16))
    with pytest.raises(ValueError, match=r"^out: written in place"):
        ops.rmsnorm(x4.contiguous(), torch.randn(64, dtype=FP16), out=x4)
    with pytest.raises(ValueError, match=r"^residual: written in place, so it must be a view of"):
        r4 = torch.randn(5, 3, 64, dtype=FP16).transpose(0, 1).unsqueeze(2)  # [3, 5, 1, 64]
        ops.fused_add_rmsnorm(x3, r4, torch.randn(64, dtype=FP16))
    with pytest.raises(
        ValueError,
        match=r"^weight: dtype expected float16 \(same as the tensors before it\) or one of \{float32\}, got bfloat16",
    ):
        ops.rmsnorm(x3, torch.randn(64, dtype=BF16))
    with pytest.raises(TypeError, match=r"^round_before_weight: expected bool, got int"):
        ops.rmsnorm(x3, torch.randn(64, dtype=FP16), round_before_weight=1)
    with pytest.raises(
        ValueError, match=r"^input: expected 2-D tensor of shape \[num_tokens, hidden\], got 0-D"
    ):
        ops.rmsnorm(torch.tensor(1.0), torch.randn(1))
    with pytest.raises(TypeError, match=r"^residual: expected a torch.Tensor"):
        ops.fused_add_rmsnorm(x3.contiguous(), None, torch.randn(64, dtype=FP16))
    for op in (ops.rmsnorm, ops.gemma_rmsnorm):  # out allocated like input: named, not torch's
        with pytest.raises(TypeError, match=r"^input: expected a torch.Tensor, got list"):
            op([1.0], torch.randn(1))


def test_an_empty_batch_is_a_no_op():
    x = torch.randn(0, 64, dtype=BF16)
    assert ops.rmsnorm(x, torch.randn(64, dtype=BF16)).shape == (0, 64)


# ------------------------------------------------------------------------------------------------
# Plugin wiring, prebuild, and the CUDA compile check (no GPU needed)


def test_ops_resolve_through_sgljit():
    for name in (
        "rmsnorm",
        "fused_add_rmsnorm",
        "gemma_rmsnorm",
        "gemma_fused_add_rmsnorm",
        "qknorm",
        "qknorm_across_heads",
    ):
        assert getattr(sgljit.ops, name) is getattr(ops, name)
        assert hasattr(torch.ops.sgljit, name)
    for name in ("rmsnorm_quant_fp8", "fused_add_rmsnorm_quant_fp8"):
        assert getattr(sgljit.ops, name) is getattr(ops, name)
        # the kernel ops under it: static and per-token scale
        assert hasattr(torch.ops.sgljit, name + "_static")
        assert hasattr(torch.ops.sgljit, name + "_per_token")


def test_prebuild_specs_take_the_fast_path():
    for backend in ("cuda", "sycl"):
        specs = ops.family.prebuild_specs(backend)
        assert specs and all(s["op"] in ops.family.ops for s in specs)
    cuda = ops.family.prebuild_specs("cuda")
    rows = {
        "op": "rmsnorm",
        "dtype": "bfloat16",
        "weight": "bfloat16",
        "width": 4096,
        "round": False,
        "float_sum": False,
    }
    assert rows in cuda
    assert all(s.get("width") for s in cuda), "every prebuilt CUDA module is a fast-path width"
    assert any(s["op"] == "qknorm" for s in cuda)
    with pytest.raises(ValueError, match="backend"):
        ops.family.prebuild_specs("rocm")
    with pytest.raises(ValueError, match="unknown op"):
        ops.family.prebuild("cuda", op="no_such_op", dtype="bfloat16", width=4096)


def test_compiled_width():
    assert ops.compiled_width(BF16, 4096) == 4096
    assert ops.compiled_width(BF16, 16384) == 16384
    assert ops.compiled_width(BF16, 32768) == 32768
    assert ops.compiled_width(BF16, 32776) == 0
    assert ops.compiled_width(BF16, 100) == 0
    assert ops.compiled_width(FP32, 12) == 12
    assert ops.compiled_width(FP32, 16384) == 16384
    assert ops.compiled_width(FP32, 16388) == 0
    assert all(ops.compiled_width(BF16, h) == h for h in range(8, 16385, 8))


@pytest.mark.skipif(HAS_CUDA, reason="GPU present: the GPU tests build and run these modules")
def test_cuda_modules_compile_for_sm90a(tmp_path, monkeypatch):
    """Every CUDA specialization the GPU tests use compiles for sm_90a (compile only)."""
    if not _has_nvcc():
        pytest.skip("nvcc not found")
    monkeypatch.setenv("SGLJIT_CUDA_ARCH", "9.0a")
    monkeypatch.setenv("SGLJIT_CACHE_DIR", str(tmp_path / "cache"))
    _prebuild_parallel(_cuda_specs())
    for spec in _cuda_specs():  # now cached: loads without compiling
        mod = ops.family.prebuild("cuda", **spec)
        kernel = ops.family.ops[spec["op"]].cuda
        for op in ops.family.ops.values():  # every op of the module is exported
            if (op.cuda.module or op.name) == (kernel.module or spec["op"]):
                assert getattr(mod, op.name) is not None

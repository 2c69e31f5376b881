"""sglang's own tests of ``per_tensor_quant_fp8`` and ``timestep_embedding``, unmodified, pass on
``sgljit.compat.sglang``.

The test files are copied, byte for byte, out of the sglang 0.5.13 wheel (``jit_kernel/tests/``)
and run by ``sglang_suite`` (see there for where the wheel comes from and how the files run), with
the compat modules under the names they import (``MODULES``); ``sglang.srt.utils`` stays missing,
which the quant test reads as "not ROCm".

Backends (each a parameter, as in ``tests/plugins``): ``cuda`` runs the files as they are, on the
GPU, with their full ranges (1356 cases). ``reference`` and ``sycl`` run them without a GPU: the
harness turns the tests' ``device="cuda"`` into the CPU (a torch function mode; their code is
untouched), where sgljit runs its PyTorch reference or, with ``SGLJIT_BACKEND=sycl``, its SYCL
kernels on the SYCL CPU device. There ``SGLANG_IS_IN_CI=1`` picks the ranges sglang's own CI runs,
less the 18 timestep cases of 16384 x 8192 (134 M outputs each, half a minute and several GB on a
2-core machine): 162 cases.

Results: every case run passes on every backend, except ``test_timestep_embedding_perf``, which
skips itself ("Perf test disabled by default": it needs ``SGLANG_RUN_JIT_KERNEL_PERF_TESTS=1`` and
CUDA events). ``test_per_tensor_quant_fp8.py`` compares sgljit's correctly rounded ``x / scale``
against sglang's ``x * (1 / scale)`` with a tolerance below one fp8 step; its inputs are fp16 and
bf16, for which the two gave no different code when measured (see the compat module), so none of
its cases depends on sglang's formula.

Two tests of this file's own cover what sglang's do not: the quantizer writes the caller's buffers
(a garbage scale overwritten, a 0-d static scale read), and ``dtype`` converts integer timesteps.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest
import torch

import sgljit
from sgljit.compat.sglang.per_tensor_quant_fp8 import per_tensor_quant_fp8
from sgljit.compat.sglang.timestep_embedding import timestep_embedding
from sgljit_quant_fp8 import reference

from ..plugins.common import BACKENDS
from . import sglang_suite


class SglangFile(NamedTuple):
    family: str  # the sgljit plugin whose kernels the file exercises
    cpu_deselect: str | None  # -k expression of the cases left out on the CPU
    passed_cpu: int
    passed_cuda: int


TEST_FILES = {
    "test_per_tensor_quant_fp8.py": SglangFile("quant_fp8", None, 12, 12),
    # CPU: sglang's CI ranges (4 * 3 * 2 + 3 * 3 * 2 * 2 * 2 * 2 = 168) less the 18 of 16384 x 8192;
    # CUDA: the full ranges, 11 * 8 * 3 + 9 * 5 * 3 * 2 * 2 * 2
    "test_timestep_embedding.py": SglangFile(
        "timestep_embedding", "not (16384 and 8192)", 150, 1344
    ),
}
MODULES = {
    "sglang.jit_kernel.per_tensor_quant_fp8": "sgljit.compat.sglang.per_tensor_quant_fp8",
    "sglang.jit_kernel.timestep_embedding": "sgljit.compat.sglang.timestep_embedding",
}
# its perf test needs SGLANG_RUN_JIT_KERNEL_PERF_TESTS=1 and CUDA events
EXPECTED_SKIPS = {
    "test_timestep_embedding.py::test_timestep_embedding_perf": "Perf test disabled by default"
}


@pytest.fixture(scope="session")
def sglang_tests(request, tmp_path_factory) -> Path:
    """A folder holding copies of sglang's test files (TEST_FILES)."""
    return sglang_suite.sglang_files(
        request, tmp_path_factory, [f"tests/{name}" for name in TEST_FILES]
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("test_file", sorted(TEST_FILES))
def test_sglang_test_file_passes(sglang_tests, backend, test_file, tmp_path, cache_dir):
    spec = TEST_FILES[test_file]
    on_cpu = backend != "cuda"
    outcome = sglang_suite.run_suite(
        sglang_tests / test_file,
        backend,
        tmp_path,
        modules=MODULES,
        ci_ranges=on_cpu,
        keyword=spec.cpu_deselect if on_cpu else None,
        env={"SGLJIT_CACHE_DIR": str(cache_dir)},
    )
    sglang_suite.assert_passes(
        outcome, EXPECTED_SKIPS, spec.passed_cpu if on_cpu else spec.passed_cuda
    )
    # the cases reached sgljit's kernels of that backend, not a fallback (the cache started empty)
    built = sorted(p.name for p in cache_dir.glob(f"*/*/{spec.family}_*"))
    if backend == "reference":
        assert not built, built
    else:
        assert any(cache_dir.glob(f"{backend}/*/{spec.family}_*")), built


# ------------------------------------------------------------------------------------------------
# What sglang's tests do not exercise: the caller's buffers and the timestep dtype


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_tensor_quant_writes_the_callers_buffers(backend):
    dev = "cuda" if backend == "cuda" else "cpu"
    x = torch.randn(3, 5, 64, device=dev).to(torch.bfloat16)
    q = torch.full((3 * 5 * 64,), 0xFF, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
    s = torch.full((1,), 1e9, device=dev)  # sglang's callers zero it; ours overwrites it
    with sgljit.use_backend(backend):
        assert per_tensor_quant_fp8(x, q, s) is None
    want_q, want_s = reference.per_tensor_quant_fp8(x)
    assert torch.equal(s, want_s)
    assert torch.equal(q.view(torch.uint8), want_q.view(-1).view(torch.uint8))
    static = torch.tensor(0.0371, device=dev)  # a 0-d scale: one element, as sglang accepts
    with sgljit.use_backend(backend):
        per_tensor_quant_fp8(x, q, static, True)
    want_q = reference.quantize(x, static.view(1), torch.float8_e4m3fn)
    assert torch.equal(q.view(torch.uint8), want_q.view(-1).view(torch.uint8))
    assert static.item() == pytest.approx(0.0371)
    with pytest.raises(TypeError, match=r"^output_q:"):
        per_tensor_quant_fp8(x, q.view(torch.uint8), s)


@pytest.mark.parametrize("backend", BACKENDS)
def test_timestep_dtype_converts_other_timesteps_first(backend):
    dev = "cuda" if backend == "cuda" else "cpu"
    t = torch.tensor([2049, 7], device=dev)  # int64; 2049 is not an fp16 number
    with sgljit.use_backend(backend):
        got = timestep_embedding(t, 64, True, 0, 1, 10000, torch.float16)
        want = sgljit.ops.timestep_embedding(t.half(), 64, flip_sin_to_cos=True)
        wider = timestep_embedding(t, 64, flip_sin_to_cos=True)  # fp32 by default
    assert got.dtype == torch.float32 and got.shape == (2, 64)
    assert torch.equal(got, want)
    assert not torch.equal(wider[0], got[0]) and torch.equal(wider[1], got[1])

"""sglang's own tests of ``per_tensor_quant_fp8`` and ``timestep_embedding``, unmodified, pass on
``sgljit.compat.sglang``.

The test files are copied, byte for byte, out of the sglang 0.5.13 wheel (``jit_kernel/tests/``)
and run by pytest in a fresh interpreter with ``shim_quant_timestep`` loaded, which puts the compat
modules under the names they import (``sglang.jit_kernel.per_tensor_quant_fp8``, ...). The wheel
is, in this order: ``$SGLANG_WHEEL``; the tree ``benchmarks/fetch_sglang_jit.sh`` writes to
``.whl/sglang_jit`` (a GPU machine without a package index has it); the one an earlier run
downloaded into pytest's cache; or ``pip download sglang==0.5.13 --no-deps`` (12 MB). Without any
of them the tests skip, saying so.

Backends (each a parameter, as in ``tests/plugins``): ``cuda`` runs the files as they are, on the
GPU, with their full ranges (1356 cases). ``reference`` and ``sycl`` run them without a GPU: the
shim turns the tests' ``device="cuda"`` into the CPU (a torch function mode; their code is
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

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

import sgljit
from sgljit.compat.sglang.per_tensor_quant_fp8 import per_tensor_quant_fp8
from sgljit.compat.sglang.timestep_embedding import timestep_embedding
from sgljit_quant_fp8 import reference

from ..plugins.common import BACKENDS

ROOT = Path(__file__).resolve().parents[2]
SGLANG_VERSION = "0.5.13"
TESTS_IN_WHEEL = "sglang/jit_kernel/tests"


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
# what picks sglang's test ranges and its perf test: set here, never inherited
SGLANG_ENV = (
    "SGLANG_IS_IN_CI",
    "SGLANG_JIT_KERNEL_RUN_FULL_TESTS",
    "SGLANG_RUN_JIT_KERNEL_PERF_TESTS",
)
PERF_SKIP = ("test_timestep_embedding_perf", "Perf test disabled by default")


def _download(dest: Path) -> Path | None:
    """The sglang wheel in ``dest``, downloaded unless an earlier run left it there. Any one
    platform's wheel has the same tests: CPython 3.12 manylinux x86_64 is asked for, from any host."""
    found = sorted(dest.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if found:
        return found[0]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            "--platform",
            "manylinux_2_34_x86_64",
            "--dest",
            str(dest),
            f"sglang=={SGLANG_VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        pytest.skip(
            f"sglang=={SGLANG_VERSION} could not be downloaded (no package index reachable?); set "
            f"SGLANG_WHEEL to its wheel. pip said: {result.stderr.strip()[-500:]}"
        )
    return sorted(dest.glob(f"sglang-{SGLANG_VERSION}-*.whl"))[0]


@pytest.fixture(scope="session")
def sglang_tests(request, tmp_path_factory) -> Path:
    """A folder holding copies of sglang's test files (TEST_FILES)."""
    out = tmp_path_factory.mktemp("sglang_tests")
    fetched = ROOT / ".whl" / "sglang_jit"
    wheel = os.environ.get("SGLANG_WHEEL")
    if not wheel and f"sglang-{SGLANG_VERSION}-" in _read(fetched / "SOURCE.txt"):
        for name in TEST_FILES:
            shutil.copyfile(fetched / TESTS_IN_WHEEL / name, out / name)
        return out
    if not wheel:
        cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
        dest = (
            cache.mkdir(f"sglang-{SGLANG_VERSION}")
            if cache is not None
            else tmp_path_factory.mktemp("wheel")
        )
        wheel = _download(Path(dest))
    with zipfile.ZipFile(wheel) as whl:
        for name in TEST_FILES:
            (out / name).write_bytes(whl.read(f"{TESTS_IN_WHEEL}/{name}"))
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test id -> (passed | failed | error | skipped, message) from pytest's JUnit XML."""
    outcomes = {}
    for case in ET.parse(junit).iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = child.get("message", "")
        outcomes[case.get("name")] = (outcome, message)
    return outcomes


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("test_file", sorted(TEST_FILES))
def test_sglang_test_file_passes(sglang_tests, backend, test_file, tmp_path, cache_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["SGLJIT_CACHE_DIR"] = str(cache_dir)
    for name in ("SGLJIT_BACKEND", *SGLANG_ENV):
        env.pop(name, None)
    spec = TEST_FILES[test_file]
    options = ["--cuda-as", "cuda"]
    if backend != "cuda":
        env["SGLANG_IS_IN_CI"] = "1"
        options = ["--cuda-as", "cpu", *(["-k", spec.cpu_deselect] if spec.cpu_deselect else [])]
    if backend == "sycl":
        env["SGLJIT_BACKEND"] = "sycl"
    shutil.copyfile(sglang_tests / test_file, tmp_path / test_file)
    junit = tmp_path / "junit.xml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.compat.shim_quant_timestep",
            "-p",
            "no:cacheprovider",
            "-q",
            *options,
            f"--junitxml={junit}",
            test_file,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    log = (result.stdout + result.stderr)[-6000:]
    assert junit.exists(), log
    outcomes = _outcomes(junit)
    bad = {name: o for name, o in outcomes.items() if o[0] in ("failed", "error")}
    assert not bad, f"{len(bad)} of {len(outcomes)} failed: {sorted(bad)[:10]}\n{log}"
    skipped = {name: msg for name, (o, msg) in outcomes.items() if o == "skipped"}
    for name, message in skipped.items():
        assert name == PERF_SKIP[0] and PERF_SKIP[1] in message, (name, message)
    passed = sum(o == "passed" for o, _ in outcomes.values())
    assert passed == (spec.passed_cuda if backend == "cuda" else spec.passed_cpu), log
    assert result.returncode == 0, log
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

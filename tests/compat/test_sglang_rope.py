"""sglang's own rope tests, unmodified, run against ``sgljit.compat``.

sglang 0.5.13's ``jit_kernel/tests/test_rope.py`` and ``test_pos_enc.py`` are taken as they are
(their sha256 is checked) from the fetched jit_kernel tree (``$SGLANG_JIT_PATH``, else
``.whl/sglang_jit`` at the repository root: ``benchmarks/fetch_sglang_jit.sh``), else from the
sglang wheel, downloaded once (``pip download sglang==0.5.13 --no-deps``) into
``$XDG_CACHE_HOME/sgljit`` (``~/.cache/sgljit``); without either (offline) the test skips. Each
file runs in a fresh pytest process whose ``sys.path`` starts with a shim tree written to a
temporary folder, so their imports resolve to sgljit:

- ``sglang.jit_kernel.rope``: ``sgljit.compat.sglang.rope`` (the module under test);
- ``flashinfer.rope``: ``sgljit.compat.flashinfer.rope`` run on sgljit's PyTorch reference backend,
  test_rope.py's oracle (FlashInfer is what sglang compares its kernels with);
- ``sglang.jit_kernel.utils.get_ci_test_range`` and ``sglang.test.ci.ci_register``: as sglang's
  (parameter ranges: sglang's CI ranges, ``SGLANG_IS_IN_CI=true``, on the CPU; the full ranges on
  a GPU; ``SGLANG_JIT_KERNEL_RUN_FULL_TESTS=true`` forces the full ranges);
- ``triton`` (only where it cannot run: no GPU, or not installed): ``triton.testing.assert_close``
  with triton's test (numpy's allclose, computed with torch in float32: numpy takes seconds on the
  large cases), and ``triton.jit`` kernels that do nothing (test_pos_enc's "burn" kernel, which
  only keeps the GPU busy to test stream ordering).

Backends: ``cuda`` runs the files as written on a GPU. ``reference`` and ``sycl`` run them on the
CPU (sgljit's PyTorch reference, or its SYCL kernels on the SYCL CPU device): a conftest maps the
device ``"cuda"`` the files name to the CPU in every torch call (a ``TorchFunctionMode``) and makes
``torch.cuda``'s streams and ``synchronize`` no-ops (CPU work is synchronous). Stream ordering is
therefore only tested on a GPU, and on ``reference`` test_rope.py compares the reference with
itself (it still checks the compat module's argument handling).

What passes (every backend): every test of both files, except these skips, which are sglang's own
and expected: test_pos_enc.py's ``test_performance`` (it times sglang's AOT ``sgl_kernel``, which is
not installed: "SglKernelRotaryEmbedding is not available") and test_rope.py's
``test_partial_rope`` cases with head_dim < rope_dim ("Invalid config"). Any other skip, failure
or error fails this test.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

from ..plugins.common import BACKENDS

pytestmark = pytest.mark.slow

SGLANG_VERSION = "0.5.13"
# The files validated here, by sha256: another version's tests are another test.
FILES = {
    "test_rope.py": "9c326bbb353ea4ae959b0259e04df48467109c75f15bdcee77189cc22b5f794f",
    "test_pos_enc.py": "d04f013e036e7cd989635a0d7fc196377787ee6ed30ae229445fa06060a5a06e",
}
EXPECTED_SKIPS = (
    "SglKernelRotaryEmbedding is not available",
    "Invalid config: head_dim must be >= rope_dim",
)
ROOT = Path(__file__).resolve().parents[2]
WHEEL_DIR = "sglang/jit_kernel/tests/"


# -- the test files ------------------------------------------------------------------------------
def _verified(data: bytes, name: str) -> bool:
    return hashlib.sha256(data).hexdigest() == FILES[name]


def _from_fetched_tree() -> Path | None:
    """The tests folder of a fetched jit_kernel tree of this version, if there is one."""
    given = os.environ.get("SGLANG_JIT_PATH")
    tree = Path(given).expanduser() if given else ROOT / ".whl" / "sglang_jit"
    tests = tree / WHEEL_DIR
    if all((tests / n).is_file() and _verified((tests / n).read_bytes(), n) for n in FILES):
        return tests
    return None


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sgljit" / f"sglang-{SGLANG_VERSION}-jit_kernel-tests"


def _from_wheel() -> Path:
    """The test files from the sglang wheel (downloaded once into the cache), or skip."""
    cache = _cache_dir()
    if all((cache / n).is_file() and _verified((cache / n).read_bytes(), n) for n in FILES):
        return cache
    with tempfile.TemporaryDirectory() as tmp:
        # jit_kernel is the same in every platform's wheel: take one whatever this host is
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
             "--platform", "manylinux_2_34_x86_64", "-d", tmp, f"sglang=={SGLANG_VERSION}"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        wheels = list(Path(tmp).glob("sglang-*.whl"))
        if result.returncode != 0 or not wheels:
            pytest.skip(
                f"sglang {SGLANG_VERSION}'s tests are needed: no fetched jit_kernel tree "
                f"(benchmarks/fetch_sglang_jit.sh) and the wheel could not be downloaded "
                f"(offline?): {result.stderr.strip()[-300:]}"
            )
        cache.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as z:
            for name in FILES:
                data = z.read(WHEEL_DIR + name)
                if not _verified(data, name):
                    raise AssertionError(f"{name} of {wheels[0].name} is not the file validated")
                part = cache / f"{name}.{os.getpid()}.part"
                part.write_bytes(data)
                os.replace(part, cache / name)  # concurrent workers each write whole files
    return cache


@pytest.fixture(scope="module")
def sglang_tests() -> Path:
    return _from_fetched_tree() or _from_wheel()


# -- the shim tree -------------------------------------------------------------------------------
SHIMS = {
    "sglang/__init__.py": "",
    "sglang/jit_kernel/__init__.py": "",
    "sglang/jit_kernel/rope.py": """
        from sgljit.compat.sglang.rope import *  # noqa: F403
        from sgljit.compat.sglang.rope import __all__  # noqa: F401
    """,
    "sglang/jit_kernel/utils.py": """
        import os


        def is_in_ci():
            return os.getenv("SGLANG_IS_IN_CI", "false").lower() in ("true", "1", "yes", "y")


        def get_ci_test_range(full_range, ci_range):
            if os.getenv("SGLANG_JIT_KERNEL_RUN_FULL_TESTS", "false").lower() == "true":
                return full_range
            return ci_range if is_in_ci() else full_range
    """,
    "sglang/test/__init__.py": "",
    "sglang/test/ci/__init__.py": "",
    "sglang/test/ci/ci_register.py": """
        def register_cuda_ci(*args, **kwargs):
            pass
    """,
    "flashinfer/__init__.py": "",
    "flashinfer/rope.py": """
        import sgljit
        from sgljit.compat.flashinfer import rope as _rope


        def apply_rope_with_cos_sin_cache_inplace(*args, **kwargs):
            with sgljit.use_backend("reference"):
                _rope.apply_rope_with_cos_sin_cache_inplace(*args, **kwargs)
    """,
}
TRITON_SHIMS = {
    "triton/__init__.py": """
        from . import language, testing


        class _Kernel:
            def __init__(self, fn):
                self.fn = fn

            def __getitem__(self, grid):
                return lambda *args, **kwargs: None


        def jit(fn=None, **options):
            return _Kernel(fn) if fn is not None else _Kernel
    """,
    "triton/language.py": """
        class constexpr:
            pass


        def __getattr__(name):
            raise AttributeError(f"triton.language.{name} (a shim: kernels do not run)")
    """,
    "triton/testing.py": """
        import torch


        def assert_close(x, y, atol=None, rtol=None, err_msg=""):
            # triton.testing.assert_close's test (numpy's allclose: |x - y| <= atol + rtol * |y|,
            # NaNs equal; atol 1e-2, rtol 0 by default), computed with torch in float32
            x = x if isinstance(x, torch.Tensor) else torch.tensor(x)
            y = y if isinstance(y, torch.Tensor) else torch.tensor(y)
            atol = 1e-2 if atol is None else atol(x.dtype) if callable(atol) else atol
            rtol = 0.0 if rtol is None else rtol(x.dtype) if callable(rtol) else rtol
            x, y = x.detach().cpu().float(), y.detach().cpu().float()
            if x.shape != y.shape:
                raise AssertionError(f"{err_msg} shapes differ: {x.shape} and {y.shape}")
            close = torch.isclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
            if not close.all():
                worst = (x - y).abs().nan_to_num(float("inf")).max()
                raise AssertionError(
                    f"{err_msg} {int((~close).sum())} of {close.numel()} elements are not close "
                    f"(atol={atol}, rtol={rtol}; largest difference {float(worst)})"
                )
    """,
}
CUDA_ON_CPU = """
    # The files' "cuda" device is the CPU here: every torch call's device is mapped, streams do nothing.
    import contextlib
    import re

    import torch
    from torch.overrides import TorchFunctionMode

    _CUDA = re.compile(r"cuda(:\\d+)?")


    def _cpu(value):
        if isinstance(value, str) and _CUDA.fullmatch(value):
            return torch.device("cpu")
        if isinstance(value, torch.device) and value.type == "cuda":
            return torch.device("cpu")
        return value


    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = {k: _cpu(v) for k, v in (kwargs or {}).items()}
            return func(*(_cpu(a) for a in args), **kwargs)


    class _Stream:
        def synchronize(self):
            pass

        def wait_stream(self, other):
            pass


    torch.cuda.Stream = lambda *args, **kwargs: _Stream()
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
    torch.cuda.synchronize = lambda device=None: None
    CudaOnCpu().__enter__()
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())


def _triton_runs() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


# -- the run -------------------------------------------------------------------------------------
def _run(tests: Path, name: str, backend: str, tmp_path: Path) -> subprocess.CompletedProcess:
    shims = tmp_path / "shims"
    _write(shims, SHIMS)
    on_cpu = backend != "cuda"
    if on_cpu or not _triton_runs():
        _write(shims, TRITON_SHIMS)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / name).write_bytes((tests / name).read_bytes())
    (run_dir / "pytest.ini").write_text("[pytest]\n")  # not the repository's configuration
    if on_cpu:
        _write(run_dir, {"conftest.py": CUDA_ON_CPU})
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(shims), os.environ.get("PYTHONPATH", "")]),
    }
    if on_cpu:
        env["SGLANG_IS_IN_CI"] = "true"
        if backend == "sycl":
            env["SGLJIT_BACKEND"] = "sycl"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "--junitxml", str(tmp_path / "result.xml"), name],
        cwd=run_dir, env=env, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip


def _outcomes(report: Path) -> dict[str, list[tuple[str, str]]]:
    """(test id, message) of each test, by outcome, from a JUnit XML report."""
    found: dict[str, list[tuple[str, str]]] = {"passed": [], "failed": [], "skipped": []}
    for case in ET.parse(report).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        marks = {child.tag: child.get("message", "") for child in case}
        for tag, outcome in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
            if tag in marks:
                found[outcome].append((test, marks[tag]))
                break
        else:
            found["passed"].append((test, ""))
    return found


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(FILES))
def test_sglang_rope_tests_pass_on_sgljit_compat(sglang_tests, name, backend, tmp_path):
    result = _run(sglang_tests, name, backend, tmp_path)
    report = tmp_path / "result.xml"
    tail = (result.stdout + result.stderr)[-6000:]
    assert report.is_file(), f"pytest of {name} wrote no report (rc {result.returncode}):\n{tail}"
    found = _outcomes(report)
    unexpected = [(t, m) for t, m in found["skipped"] if not any(e in m for e in EXPECTED_SKIPS)]
    assert not found["failed"] and not unexpected, (
        f"{name} on {backend}: {len(found['failed'])} failed, unexpected skips {unexpected[:5]}:\n{tail}"
    )
    assert found["passed"], f"{name} on {backend}: nothing passed:\n{tail}"
    assert result.returncode == 0, tail

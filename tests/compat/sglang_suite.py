"""The one harness that runs sglang's own, unmodified jit_kernel tests against
:mod:`sgljit.compat.sglang` (used by ``tests/compat/test_sglang_*.py`` and ``test_compat_norm.py``).

Three roles:

- :func:`sglang_files` takes files of ``sglang/jit_kernel/`` (its tests, its modules) from the
  sglang wheel: the tree ``benchmarks/fetch_sglang_jit.sh`` extracts from it
  (``$SGLANG_JIT_PATH``, else the repository's git-ignored ``.whl/sglang_jit`` or, where that holds
  another release, ``.whl/sglang_jit-0.5.13``), the wheel file
  ``$SGLANG_WHEEL``, or the wheel pip downloads (``pip download sglang==<version> --no-deps``,
  kept in pytest's cache); without any of them the test skips, saying why;
- :func:`run_suite` runs one test file with pytest in a fresh interpreter with this module as a
  plugin, and reads each case's outcome from its JUnit report; :func:`assert_passes` is the verdict;
- as that plugin (``-p sglang_suite``): before the file is collected it makes what it imports
  resolve — ``sglang.jit_kernel.<module>`` to the ``sgljit.compat`` module the family names,
  ``sglang.jit_kernel.utils`` and ``sglang.test.ci.ci_register`` to the two helpers they use, the
  peers (``flashinfer``, ``sgl_kernel``) to the real packages where installed, else to stand-ins,
  and ``triton`` to the real one on a GPU where installed, else to a stand-in. Without a GPU
  (``SGLJIT_COMPAT_DEVICE=cpu``) a torch function mode gives every torch call asking for a CUDA
  device the CPU, and CUDA streams do nothing; ``SGLJIT_BACKEND`` picks the backend the ops run on
  (``sycl``: the SYCL CPU device).

The test files themselves are copied as they are; nothing in them is patched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.machinery
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import types
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

SGLANG_VERSION = "0.5.13"
JIT_KERNEL = "sglang/jit_kernel"
REPO = Path(__file__).resolve().parents[2]


class Unavailable(Exception):
    """sglang's files could not be obtained (the reason is the message)."""


# ------------------------------------------------------------------------------------------------
# Obtaining sglang's files


def _download_wheel(cache: Path) -> Path:
    found = sorted(cache.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if found:
        return found[0]
    # jit_kernel's files are the same in every platform's wheel: one pinned tag works from any host.
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.12", "--implementation", "cp",
            "--platform", "manylinux_2_34_x86_64", "-d", tmp, f"sglang=={SGLANG_VERSION}",
        ]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise Unavailable(f"pip download sglang=={SGLANG_VERSION} failed: {err}") from None
        got = sorted(Path(tmp).glob(f"sglang-{SGLANG_VERSION}-*.whl"))
        if done.returncode != 0 or not got:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise Unavailable(
                f"pip download sglang=={SGLANG_VERSION} failed (offline? set SGLANG_WHEEL to the "
                f"wheel): {' / '.join(tail)}"
            )
        os.replace(got[0], cache / got[0].name)  # concurrent workers each see a whole wheel
        return cache / got[0].name


def _fetched_tree(explicit: bool, src: Path) -> bool:
    """Whether ``src`` is a fetched tree of this version (its SOURCE.txt names the wheel)."""
    if not (src / JIT_KERNEL).is_dir():
        if explicit:
            raise Unavailable(f"{src / JIT_KERNEL} is not a folder")
        return False
    try:
        source = (src / "SOURCE.txt").read_text()
    except OSError:
        return True  # a tree without the fetch script's record: taken as given
    if f"sglang-{SGLANG_VERSION}-" in source:
        return True
    if explicit:
        raise Unavailable(f"{src} is not sglang {SGLANG_VERSION}'s (see its SOURCE.txt)")
    return False


def _trees() -> list[tuple[bool, Path]]:
    """The fetched trees to look in, each with whether it was named explicitly: ``$SGLANG_JIT_PATH``,
    else ``.whl/sglang_jit`` (the benchmark provider's, which may be a newer release) and
    ``.whl/sglang_jit-<version>`` (``SGLANG_VERSION=<version> fetch_sglang_jit.sh`` there)."""
    tree = os.environ.get("SGLANG_JIT_PATH")
    if tree:
        return [(True, Path(tree).expanduser())]
    whl = REPO / ".whl"
    return [(False, whl / "sglang_jit"), (False, whl / f"sglang_jit-{SGLANG_VERSION}")]


def _copy(names: list[str], cache: Path, dest: Path) -> None:
    wheel = os.environ.get("SGLANG_WHEEL")
    src = next(
        (
            path
            for explicit, path in _trees()
            if (explicit or not wheel) and _fetched_tree(explicit, path)
        ),
        None,
    )
    if src is not None:
        missing = [n for n in names if not (src / JIT_KERNEL / n).is_file()]
        if missing:
            raise Unavailable(f"{src / JIT_KERNEL} lacks {missing}")
        for n in names:
            shutil.copyfile(src / JIT_KERNEL / n, dest / Path(n).name)
        return
    path = Path(wheel) if wheel else _download_wheel(cache)
    with zipfile.ZipFile(path) as z:
        for n in names:
            try:
                data = z.read(f"{JIT_KERNEL}/{n}")
            except KeyError:
                raise Unavailable(f"{path.name} has no {JIT_KERNEL}/{n}") from None
            (dest / Path(n).name).write_bytes(data)


def sglang_files(request, tmp_path_factory, names: list[str]) -> Path:
    """A new folder holding copies of the files ``names`` of sglang's jit_kernel (paths under
    ``sglang/jit_kernel/``, e.g. ``tests/test_rmsnorm.py``), each under its base name; skips the
    test, saying why, when no source has them. A downloaded wheel is kept in pytest's cache (in a
    temporary folder under ``-p no:cacheprovider``)."""
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    where = f"sglang-{SGLANG_VERSION}"
    folder = Path(cache.mkdir(where)) if cache is not None else tmp_path_factory.mktemp(where)
    dest = tmp_path_factory.mktemp("sglang_files")
    try:
        _copy(names, folder, dest)
    except Unavailable as err:
        import pytest

        pytest.skip(f"sglang {SGLANG_VERSION}'s files are not available: {err}")
    return dest


# ------------------------------------------------------------------------------------------------
# Running one test file and reading its outcomes


@dataclasses.dataclass
class Outcome:
    label: str  # "<file> on <backend>"
    returncode: int
    cases: dict[
        str, tuple[str, str]
    ]  # "<file>::<test>[<params>]" -> (passed|failed|skipped, message)
    output: str

    def count(self, outcome: str) -> int:
        return sum(o == outcome for o, _ in self.cases.values())


def _cases(report: Path, file: str) -> dict[str, tuple[str, str]]:
    cases = {}
    if not report.exists():
        return cases
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "skipped" if child.tag == "skipped" else "failed"
                message = child.get("message", "")
        cases[f"{file}::{case.get('name')}"] = (outcome, message)
    return cases


def run_suite(
    file: Path,
    backend: str,
    workdir: Path,
    *,
    modules: dict[str, str],
    ci_ranges: bool,
    deselect: tuple[str, ...] = (),
    keyword: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 3600,
) -> Outcome:
    """pytest over a copy of ``file`` in ``workdir``, in a fresh interpreter with this module as a
    plugin and ``modules`` (``sglang.jit_kernel.<module>`` -> ``sgljit.compat...``) importable
    under sglang's names. ``backend`` "cuda" runs it as written; "reference" and "sycl" run it on
    the CPU. ``ci_ranges``: sglang's CI ranges of shapes (``SGLANG_IS_IN_CI``), else its full ranges;
    ``SGLANG_JIT_KERNEL_RUN_FULL_TESTS=true`` forces the full ranges. ``deselect``: node ids
    (``test_x.py::test_y``; those of other files are ignored); ``keyword``: a ``-k`` expression;
    ``env``: more environment. ``SGLJIT_COMPAT_PYTEST_ARGS`` adds pytest arguments (``-n 8``)."""
    local = Path(shutil.copyfile(file, workdir / file.name))
    ini = workdir / "pytest.ini"  # not the repository's configuration
    ini.write_text("[pytest]\nfilterwarnings = ignore::DeprecationWarning\n")
    report = workdir / "report.xml"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    for name in ("SGLJIT_BACKEND", "SGLANG_IS_IN_CI", "SGLANG_RUN_JIT_KERNEL_PERF_TESTS"):
        full_env.pop(name, None)
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), full_env.get("PYTHONPATH")]))
    full_env.update(
        PYTHONPATH=path,
        SGLJIT_COMPAT_DEVICE="cuda" if backend == "cuda" else "cpu",
        SGLJIT_COMPAT_MODULES=json.dumps(modules),
        **({"SGLANG_IS_IN_CI": "true"} if ci_ranges else {}),
        **({} if backend == "cuda" else {"SGLJIT_BACKEND": backend}),
        **(env or {}),
    )
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "sglang_suite", "-p", "no:cacheprovider",
        "-p", "no:randomly", "-c", str(ini), "--rootdir", str(workdir), "--junitxml", str(report),
        *shlex.split(os.environ.get("SGLJIT_COMPAT_PYTEST_ARGS", "")),
        *(f"--deselect={d}" for d in deselect if d.startswith(f"{file.name}::")),
        *(["-k", keyword] if keyword else []), local.name,
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=workdir, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    return Outcome(
        f"{file.name} on {backend}",
        done.returncode,
        _cases(report, file.name),
        done.stdout + done.stderr,
    )


def assert_passes(
    outcome: Outcome, expected_skips: dict[str, str] | None = None, passed: int | None = None
) -> None:
    """No case failed; every skip is expected (``expected_skips``: ``<file>::<test>`` -> a part
    of the skip message); some case passed (``passed`` of them, where given); pytest exited 0."""
    tail = outcome.output[-6000:]
    assert outcome.cases, f"{outcome.label}: no report (rc {outcome.returncode})\n{tail}"
    failed = [t for t, (o, _) in outcome.cases.items() if o == "failed"]
    unexpected = [
        (t, m)
        for t, (o, m) in outcome.cases.items()
        if o == "skipped"
        and not any(t.split("[")[0] == k and r in m for k, r in (expected_skips or {}).items())
    ]
    summary = (
        f"{outcome.label}: {outcome.count('passed')} passed, {len(failed)} failed, "
        f"{outcome.count('skipped')} skipped"
    )
    print(summary)
    assert not failed and not unexpected, (
        f"{summary}; failed {failed[:10]}, unexpected skips {unexpected[:5]}\n{tail}"
    )
    assert outcome.count("passed") > 0, f"{summary}: nothing passed\n{tail}"
    if passed is not None:
        assert outcome.count("passed") == passed, f"{summary}, {passed} expected\n{tail}"
    assert outcome.returncode == 0, f"{summary}\n{tail}"


# ------------------------------------------------------------------------------------------------
# The plugin side: what the test files import (installed when pytest loads this module with -p)


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    mod.__path__ = []
    mod.__dict__.update(attrs)
    return mod


def _install(name: str, mod: types.ModuleType) -> None:
    """sys.modules[name] = mod, with every parent package present and holding its child."""
    sys.modules[name] = mod
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:i])
        if parent not in sys.modules:
            sys.modules[parent] = _module(parent)
        setattr(sys.modules[parent], parts[i], sys.modules[".".join(parts[: i + 1])])


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def is_in_ci() -> bool:
    """sglang.jit_kernel.utils.is_in_ci."""
    return os.getenv("SGLANG_IS_IN_CI", "false").lower() in ("true", "1", "yes", "y")


def get_ci_test_range(full_range: list, ci_range: list) -> list:
    """sglang.jit_kernel.utils.get_ci_test_range: the full range with
    SGLANG_JIT_KERNEL_RUN_FULL_TESTS=true, else the CI range when SGLANG_IS_IN_CI is true."""
    if os.getenv("SGLANG_JIT_KERNEL_RUN_FULL_TESTS", "false").lower() == "true":
        return full_range
    return ci_range if is_in_ci() else full_range


def register_cuda_ci(*args, **kwargs) -> None:
    """sglang.test.ci.ci_register.register_cuda_ci: registers a file with sglang's CI suites."""


def _rms(x, weight, eps: float, offset: float = 0.0):
    import torch

    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * (weight.float() + offset)
    return y.to(x.dtype)


def _peer_norm_module(name: str) -> types.ModuleType:
    """FlashInfer's norm functions (flashinfer.norm, and sgl_kernel's of the same signatures) as
    float32 PyTorch formulas of their documented results; the fused adds normalize the float32
    sum, as FlashInfer's kernels do."""

    def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
        y = _rms(input, weight, eps)
        return y if out is None else out.copy_(y)

    def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
        y = _rms(input, weight, eps, 1.0)
        return y if out is None else out.copy_(y)

    def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None, offset=0.0):
        total = input.float() + residual.float()
        residual.copy_(total)
        xf = total * (total.square().mean(-1, keepdim=True) + eps).rsqrt()
        input.copy_(xf * (weight.float() + offset))

    def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
        fused_add_rmsnorm(input, residual, weight, eps, offset=1.0)

    return _module(
        name,
        rmsnorm=rmsnorm,
        gemma_rmsnorm=gemma_rmsnorm,
        fused_add_rmsnorm=fused_add_rmsnorm,
        gemma_fused_add_rmsnorm=gemma_fused_add_rmsnorm,
    )


def _peer_rope_module() -> types.ModuleType:
    """flashinfer.rope: sgljit.compat.flashinfer.rope on sgljit's PyTorch reference backend, the
    oracle test_rope.py compares with."""

    def apply_rope_with_cos_sin_cache_inplace(*args, **kwargs):
        import sgljit
        from sgljit.compat.flashinfer import rope

        with sgljit.use_backend("reference"):
            rope.apply_rope_with_cos_sin_cache_inplace(*args, **kwargs)

    return _module(
        "flashinfer.rope",
        apply_rope_with_cos_sin_cache_inplace=apply_rope_with_cos_sin_cache_inplace,
    )


def _triton_assert_close(x, y, atol=None, rtol=None, err_msg=""):
    """triton.testing.assert_close's test (numpy's allclose: |x - y| <= atol + rtol * |y|, NaNs
    equal; atol 1e-2, rtol 0 by default), computed with torch in float32 (numpy takes seconds on
    the large cases)."""
    import torch

    x, y = torch.as_tensor(x), torch.as_tensor(y)
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


class _NoOpKernel:
    """A @triton.jit kernel that does nothing when launched (test_pos_enc's "burn" kernel only
    keeps the GPU busy to test stream ordering)."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _triton_language_getattr(name):
    raise AttributeError(f"triton.language.{name} (a stand-in: kernels do not run)")


def _install_triton_standin(compiles: bool) -> None:
    if compiles:
        # torch takes any importable `triton` for Triton: a test file's module-level
        # @torch.compile() imports inductor, which would then use the stand-in. Have it look first.
        import torch._inductor.compile_fx  # noqa: F401
        from torch.utils._triton import has_triton, has_triton_package

        has_triton_package(), has_triton()  # cached: no Triton
    for name in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
        del sys.modules[name]
    _install(
        "triton.language",
        _module("triton.language", constexpr=type("constexpr", (), {})),
    )
    sys.modules["triton.language"].__getattr__ = _triton_language_getattr
    _install("triton.testing", _module("triton.testing", assert_close=_triton_assert_close))
    sys.modules["triton"].jit = lambda fn=None, **options: (
        _NoOpKernel(fn) if fn is not None else _NoOpKernel
    )


_CUDA = re.compile(r"cuda(:\d+)?")


def _on_cpu(value):
    """``value`` with the CPU in place of a CUDA device (anything else unchanged)."""
    import torch

    if isinstance(value, str) and _CUDA.fullmatch(value):
        return torch.device("cpu")
    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("cpu")
    return value


def _run_cuda_on_cpu() -> None:
    """The test files' "cuda" device is the CPU: every torch call's device argument is mapped,
    ``Tensor.cuda`` is the identity, streams and ``synchronize`` do nothing (CPU work is
    synchronous), for the rest of the process."""
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaAsCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.cuda:
                return args[0]
            kwargs = {k: _on_cpu(v) for k, v in (kwargs or {}).items()}
            return func(*(_on_cpu(a) for a in args), **kwargs)

    class Stream:
        def synchronize(self):
            pass

        def wait_stream(self, other):
            pass

    torch.cuda.Stream = lambda *args, **kwargs: Stream()
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
    torch.cuda.synchronize = lambda device=None: None
    CudaAsCpu().__enter__()


def install_shims(modules: dict[str, str], on_cpu: bool, compiles: bool) -> dict[str, str]:
    """Point the modules sglang's tests import at sgljit and the peers; returns what each peer
    resolved to (for the report)."""
    used = {}
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]
    for name, target in modules.items():
        _install(name, importlib.import_module(target))
    _install(
        "sglang.jit_kernel.utils",
        _module("sglang.jit_kernel.utils", get_ci_test_range=get_ci_test_range, is_in_ci=is_in_ci),
    )
    _install(
        "sglang.test.ci.ci_register",
        _module("sglang.test.ci.ci_register", register_cuda_ci=register_cuda_ci),
    )
    if _installed("flashinfer"):
        used["flashinfer"] = "installed"
    else:
        _install("flashinfer.norm", _peer_norm_module("flashinfer.norm"))
        _install("flashinfer.rope", _peer_rope_module())
        used["flashinfer"] = "stand-in"
    if _installed("sgl_kernel"):
        used["sgl_kernel"] = "installed"
    else:
        _install("sgl_kernel", _peer_norm_module("sgl_kernel"))
        used["sgl_kernel"] = "stand-in"
    if not on_cpu and _installed("triton"):
        used["triton"] = "installed"
    else:
        _install_triton_standin(compiles)
        used["triton"] = "stand-in"
    if on_cpu:
        _run_cuda_on_cpu()
    return used


def pytest_configure(config) -> None:
    files = [Path(a) for a in config.args if a.endswith(".py") and Path(a).is_file()]
    config._sgljit_peers = install_shims(
        json.loads(os.environ.get("SGLJIT_COMPAT_MODULES", "{}")),
        on_cpu=os.environ.get("SGLJIT_COMPAT_DEVICE", "cuda") == "cpu",
        compiles=any("torch.compile" in f.read_text() for f in files),
    )


def pytest_report_header(config) -> list[str]:
    peers = ", ".join(f"{k}: {v}" for k, v in config._sgljit_peers.items())
    return [
        f"sgljit compat: device {os.environ.get('SGLJIT_COMPAT_DEVICE', 'cuda')}, "
        f"backend {os.environ.get('SGLJIT_BACKEND') or 'by device'}; peers {peers}"
    ]

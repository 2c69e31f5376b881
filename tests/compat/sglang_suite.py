"""Running sglang's own, unmodified jit_kernel tests against :mod:`sgljit.compat.sglang`.

Two roles:

- for the harness tests (``tests/compat/test_sglang_*.py``): :func:`sglang_files` takes files of
  ``sglang/jit_kernel/`` (its tests, its modules) from the sglang wheel: the tree
  ``benchmarks/fetch_sglang_jit.sh`` extracts from it (``$SGLANG_JIT_PATH``, else the repository's
  git-ignored ``.whl/sglang_jit``), the wheel file ``$SGLANG_WHEEL``, or the wheel pip downloads
  (``pip download sglang==<version> --no-deps``, kept in pytest's cache); :func:`run_suite` runs
  test files with pytest in a fresh interpreter with this module as a plugin;
- as that plugin (``-p sglang_suite``): before the files are collected it makes the modules they
  import resolve to sgljit — ``sglang.jit_kernel.<family>`` to ``sgljit.compat.sglang.<family>``,
  ``sglang.jit_kernel.utils`` and ``sglang.test.ci.ci_register`` to the two helpers they use — and
  their peers (``flashinfer.norm``, ``sgl_kernel``, ``triton.testing``) to the real packages where
  installed, else to float32 PyTorch formulas of those libraries' documented results. Without a GPU
  (``SGLJIT_COMPAT_DEVICE=cpu``) each test module's ``DEVICE = "cuda"`` becomes ``"cpu"``, and
  ``SGLJIT_BACKEND`` picks the backend the ops run on (``sycl``: the SYCL CPU device).

The test files themselves are copied as they are; nothing in them is patched.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import types
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

SGLANG_VERSION = "0.5.13"
JIT_KERNEL = "sglang/jit_kernel"
REPO = Path(__file__).resolve().parents[2]


class Unavailable(Exception):
    """The sglang test files could not be obtained (the reason is the message)."""


# ------------------------------------------------------------------------------------------------
# Obtaining the test files


def _download_wheel(cache: Path) -> Path:
    found = sorted(cache.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if found:
        return found[0]
    # jit_kernel's tests are the same in every platform's wheel: one pinned tag works from any host.
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", "3.12", "--implementation", "cp",
        "--platform", "manylinux_2_34_x86_64", "-d", str(cache), f"sglang=={SGLANG_VERSION}",
    ]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise Unavailable(f"pip download sglang=={SGLANG_VERSION} failed: {err}") from None
    found = sorted(cache.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise Unavailable(f"pip download sglang=={SGLANG_VERSION} failed: {' / '.join(tail)}")
    return found[0]


def sglang_files(names: list[str], cache: Path, dest: Path) -> Path:
    """Copies of the files ``names`` of sglang's jit_kernel (paths under ``sglang/jit_kernel/``,
    e.g. ``tests/test_rmsnorm.py``), each in ``dest`` under its base name; returns ``dest``. Raises
    :class:`Unavailable` when no source has them."""
    dest.mkdir(parents=True, exist_ok=True)
    tree = os.environ.get("SGLANG_JIT_PATH")
    wheel = os.environ.get("SGLANG_WHEEL")
    src = Path(tree) if tree else REPO / ".whl" / "sglang_jit"
    if tree or (not wheel and (src / JIT_KERNEL).is_dir()):
        missing = [n for n in names if not (src / JIT_KERNEL / n).is_file()]
        if missing:
            raise Unavailable(f"{src / JIT_KERNEL} lacks {missing}")
        for n in names:
            shutil.copyfile(src / JIT_KERNEL / n, dest / Path(n).name)
        return dest
    path = Path(wheel) if wheel else _download_wheel(cache)
    with zipfile.ZipFile(path) as z:
        for n in names:
            try:
                data = z.read(f"{JIT_KERNEL}/{n}")
            except KeyError:
                raise Unavailable(f"{path.name} has no {JIT_KERNEL}/{n}") from None
            (dest / Path(n).name).write_bytes(data)
    return dest


# ------------------------------------------------------------------------------------------------
# Running them


@dataclasses.dataclass
class Outcome:
    returncode: int
    passed: int
    failed: int
    skipped: int
    output: str


def run_suite(
    files: list[Path],
    device: str,
    backend: str | None,
    workdir: Path,
    deselect: tuple[str, ...] = (),
    timeout: float = 3600,
) -> Outcome:
    """pytest over copies of ``files`` in ``workdir`` (so ``deselect`` reads
    ``test_x.py::test_y``), in a fresh interpreter with this module as a plugin, tensors on
    ``device`` ("cuda" or "cpu"), ops on ``backend`` (None: by device). sglang's CI ranges of
    shapes unless ``SGLANG_JIT_KERNEL_RUN_FULL_TESTS=true``; ``SGLJIT_COMPAT_PYTEST_ARGS`` adds
    pytest arguments (e.g. ``-n 8``)."""
    files = [Path(shutil.copyfile(f, workdir / Path(f).name)) for f in files]
    ini = workdir / "pytest.ini"
    ini.write_text("[pytest]\nfilterwarnings = ignore::DeprecationWarning\n")
    report = workdir / "report.xml"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    env["SGLJIT_COMPAT_DEVICE"] = device
    env.setdefault("SGLANG_IS_IN_CI", "true")  # sglang's CI ranges of shapes
    env.pop("SGLJIT_BACKEND", None)
    if backend is not None:
        env["SGLJIT_BACKEND"] = backend
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "sglang_suite", "-p", "no:cacheprovider",
        "-c", str(ini), "--rootdir", str(workdir), "--junitxml", str(report),
        *shlex.split(os.environ.get("SGLJIT_COMPAT_PYTEST_ARGS", "")),
        *(f"--deselect={f}" for f in deselect), *(f.name for f in files),
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout
    )
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if report.exists():
        for suite in ET.parse(report).getroot().iter("testsuite"):
            for k in counts:
                counts[k] += int(suite.get(k, 0))
    failed = counts["failures"] + counts["errors"]
    return Outcome(
        done.returncode,
        counts["tests"] - failed - counts["skipped"],
        failed,
        counts["skipped"],
        done.stdout + done.stderr,
    )


# ------------------------------------------------------------------------------------------------
# The plugin side: module shims (installed when pytest loads this module with -p sglang_suite)

# sglang.jit_kernel modules the compat package provides, by family.
COMPAT_MODULES = {
    "sglang.jit_kernel.norm": "sgljit.compat.sglang.norm",
    "sglang.jit_kernel.rmsnorm_hf": "sgljit.compat.sglang.rmsnorm_hf",
}


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


def get_ci_test_range(full_range: list, ci_range: list) -> list:
    """sglang.jit_kernel.utils.get_ci_test_range: the full range with
    SGLANG_JIT_KERNEL_RUN_FULL_TESTS=true, else the CI range when SGLANG_IS_IN_CI is true."""
    if os.getenv("SGLANG_JIT_KERNEL_RUN_FULL_TESTS", "false").lower() == "true":
        return full_range
    in_ci = os.getenv("SGLANG_IS_IN_CI", "false").lower() in ("true", "1", "yes", "y")
    return ci_range if in_ci else full_range


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


def _triton_assert_close(x, y, atol=None, rtol=None, err_msg=""):
    """triton.testing.assert_close: |x - y| <= atol + rtol * |y| elementwise (defaults 1e-2),
    bfloat16 compared in float32, NaNs equal."""
    import torch

    torch.testing.assert_close(
        torch.as_tensor(x).float(),
        torch.as_tensor(y).float(),
        atol=1e-2 if atol is None else atol,
        rtol=0.0 if rtol is None else rtol,
        equal_nan=True,
        check_device=False,
        msg=err_msg or None,
    )


def install_shims() -> dict[str, str]:
    """Point the modules sglang's tests import at sgljit and the peers; returns what each peer
    resolved to (for the report)."""
    used = {}
    for name in ("sglang", "sglang.jit_kernel", "sglang.test", "sglang.test.ci"):
        sys.modules.pop(name, None)
    for name, target in COMPAT_MODULES.items():
        _install(name, importlib.import_module(target))
    _install(
        "sglang.jit_kernel.utils",
        _module("sglang.jit_kernel.utils", get_ci_test_range=get_ci_test_range),
    )
    _install(
        "sglang.test.ci.ci_register",
        _module("sglang.test.ci.ci_register", register_cuda_ci=register_cuda_ci),
    )
    for name in ("flashinfer.norm", "sgl_kernel"):
        if _installed(name.split(".")[0]):
            used[name] = "installed"
        else:
            _install(name, _peer_norm_module(name))
            used[name] = "PyTorch formula"
    if _installed("triton"):
        used["triton.testing"] = "installed"
    else:
        # torch takes any importable `triton` for Triton: a test file's module-level
        # @torch.compile() imports inductor, which would then use the stand-in. Have it look first.
        import torch._inductor.compile_fx  # noqa: F401
        from torch.utils._triton import has_triton, has_triton_package

        has_triton_package(), has_triton()  # cached: no Triton
        _install("triton.testing", _module("triton.testing", assert_close=_triton_assert_close))
        used["triton.testing"] = "torch.testing"
    return used


def pytest_configure(config) -> None:
    config._sgljit_peers = install_shims()


def pytest_report_header(config) -> list[str]:
    peers = ", ".join(f"{k}: {v}" for k, v in config._sgljit_peers.items())
    return [
        f"sgljit compat: device {os.environ.get('SGLJIT_COMPAT_DEVICE', 'cuda')}, "
        f"backend {os.environ.get('SGLJIT_BACKEND') or 'by device'}; peers {peers}"
    ]


def pytest_collection_modifyitems(session, config, items) -> None:
    """Without a GPU, the tensors of each test module (its DEVICE) go to the CPU."""
    device = os.environ.get("SGLJIT_COMPAT_DEVICE", "cuda")
    if device == "cuda":
        return
    for module in {item.module for item in items if getattr(item, "module", None)}:
        if getattr(module, "DEVICE", None) == "cuda":
            module.DEVICE = device

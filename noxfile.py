"""Developer and CI sessions. `nox` runs the default ones: lint, tests-cpu, tests-xpu,
tests-latest, build.

Torch is pinned to the CPU wheel through constraints.txt (a bare `torch` requirement would pull a
multi-GB CUDA build); the packages themselves accept any recent torch.

Where no package registry is reachable (a GPU machine given pre-built wheels), set
SGLJIT_WHEELHOUSE to a folder of wheels: sessions then install from it only, and `tests-cuda`/`bench`
reuse the machine's own torch (the venv sees system site-packages).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))
PLUGINS = sorted(str(p) for p in (ROOT / "plugins").glob("*/pyproject.toml"))
PACKAGES = [str(ROOT / "core"), *(str(Path(p).parent) for p in PLUGINS)]
SYCL_RUNTIME = ("intel-sycl-rt==2026.1.2", "intel-opencl-rt==2026.1.2")
# transformers, diffusers and kernels (transformers' kernel mechanism): the integration tests run
# tiny models of both libraries on sgljit (not dependencies of the packages). Pinned here, so that
# a release cannot change the patched code under these sessions' feet; tests-latest takes the
# newest instead.
HF_PINNED = ("transformers==5.24.0", "diffusers==0.42.1", "kernels==0.18.3")
HF_LATEST = ("--upgrade", "transformers", "diffusers", "kernels")
TEST_DEPS = ("pytest", "numpy", "hatchling")

nox.options.sessions = ["lint", "tests-cpu", "tests-xpu", "tests-latest", "build"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True


def _install_project(session: nox.Session, *extra: str, hf: tuple[str, ...] = HF_PINNED) -> None:
    wheelhouse = os.environ.get("SGLJIT_WHEELHOUSE")
    if wheelhouse:  # a machine without a registry: every wheel given (the project's, tvm-ffi, ...)
        session.install(
            "--no-index", "--no-deps", *sorted(str(w) for w in Path(wheelhouse).glob("*.whl"))
        )
        return
    session.install(*CONSTRAINTS, "torch==2.13.0", *TEST_DEPS, *extra)
    session.install(*CONSTRAINTS, *hf)
    session.install(*CONSTRAINTS, *(arg for pkg in PACKAGES for arg in ("-e", pkg)))


def _sycl_env(session: nox.Session) -> dict[str, str]:
    """sgljit points the OpenCL loader at the runtime wheel's CPU driver itself; keep Debian's
    ICDs (pocl) out of the way here too, as the runtime notes advise."""
    return {"OCL_ICD_VENDORS": str(Path(session.create_tmp()) / "no-icds")}


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole repository."""
    session.install("ruff==0.17.6")  # formatting must not change under CI's feet
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(name="tests-cpu")
def tests_cpu(session: nox.Session) -> None:
    """Everything but the SYCL runtime tests: references, real C++ builds, CUDA compiles (nvcc)."""
    _install_project(session)
    session.run("pytest", "-m", "not sycl", "--ignore=tests/test_wheels.py", *session.posargs)


@nox.session(name="tests-xpu")
def tests_xpu(session: nox.Session) -> None:
    """Every SYCL test: on an Intel GPU when torch.xpu has one, otherwise on the SYCL CPU device."""
    _install_project(session, *SYCL_RUNTIME)
    session.run("pytest", "-m", "sycl", *session.posargs, env=_sycl_env(session))


@nox.session(name="tests-latest")
def tests_latest(session: nox.Session) -> None:
    """tests/integrations against the newest transformers, diffusers and kernels on the package
    index (unpinned: what `pip install transformers` gives a user today), on the reference and
    on the SYCL CPU device."""
    _install_project(session, *SYCL_RUNTIME, hf=HF_LATEST)
    session.run(
        "python",
        "-c",
        "import importlib.metadata as m; "
        "print('testing', *(f'{d} {m.version(d)}' for d in ('transformers', 'diffusers', 'kernels')))",
    )
    session.run(
        "pytest", "tests/integrations", "-m", "not gpu", *session.posargs, env=_sycl_env(session)
    )


@nox.session(name="tests-cuda", venv_params=["--system-site-packages"])
def tests_cuda(session: nox.Session) -> None:
    """Everything on a machine with a CUDA GPU (uses the machine's CUDA build of torch)."""
    if os.environ.get("SGLJIT_WHEELHOUSE"):
        _install_project(session)
    else:
        session.install(*TEST_DEPS, *HF_PINNED, *(arg for pkg in PACKAGES for arg in ("-e", pkg)))
    # The declared modules and every check case's, in parallel, before the tests need them one by one.
    session.run("sgljit", "build", "--cases", "--jobs", str(os.cpu_count() or 1))
    session.run("pytest", "-m", "not sycl", "--ignore=tests/test_wheels.py", *session.posargs)


@nox.session(venv_params=["--system-site-packages"])
def bench(session: nox.Session) -> None:
    """The JIT-machinery benchmark everywhere; the streaming ceiling and the kernel benchmarks where a
    CUDA GPU is visible (without one each prints why it skipped). posargs go to the family scripts."""
    if os.environ.get("SGLJIT_WHEELHOUSE"):
        _install_project(session)
    else:  # no constraints: on a GPU machine the system's CUDA torch must stay
        session.install("matplotlib", *(arg for pkg in PACKAGES for arg in ("-e", pkg)))
    session.run("python", "benchmarks/bench_jit.py")
    session.run("python", "benchmarks/harness.py")
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        if script.name not in ("bench_jit.py", "bench_example.py"):
            session.run("python", str(script), *session.posargs)


@nox.session
def build(session: nox.Session) -> None:
    """Wheels and sdists of every package into dist/, then install a plugin wheel into a fresh
    virtual environment from local wheels only and check its ops are there."""
    session.install("build", "hatchling", "pytest")
    dist = ROOT / "dist"
    for pkg in PACKAGES:
        session.run("python", "-m", "build", "--no-isolation", "--outdir", str(dist), pkg)
    wheelhouse = Path(session.create_tmp()) / "wheelhouse"
    # A kept folder would hold the last run's sgljit wheel, which pip download does not replace.
    shutil.rmtree(wheelhouse, ignore_errors=True)
    session.run(
        "python",
        "-m",
        "pip",
        "download",
        "--quiet",
        "--dest",
        str(wheelhouse),
        *CONSTRAINTS,
        # core's own wheel: pip gathers exactly the dependencies it declares
        *(str(w) for w in dist.glob("sgljit-0.1.0-*.whl")),
    )
    session.run(
        "pytest",
        "tests/test_wheels.py",
        env={"SGLJIT_DIST": str(dist), "SGLJIT_WHEELHOUSE_DEPS": str(wheelhouse)},
    )

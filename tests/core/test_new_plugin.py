"""`sgljit new-plugin`: the package it writes installs, is discovered, and passes the conformance
suite with no edits — on the reference (and CUDA on a GPU) here, on the SYCL CPU device in
tests-xpu; its CUDA kernels compile with nvcc."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ..conftest import env_with_site, has_nvcc, run_python
from ..plugins.common import SYCL_MISSING
from .test_cli import sgljit_cli

ROOT = Path(__file__).parents[2]
NAME = "my-act"  # family my_act, distribution sgljit-my-act, package sgljit_my_act
TREE = {
    "README.md",
    "pyproject.toml",
    "src/sgljit_my_act/__init__.py",
    "src/sgljit_my_act/csrc/my_act.cuh",
    "src/sgljit_my_act/ops.py",
    "src/sgljit_my_act/py.typed",
    "src/sgljit_my_act/reference.py",
    "src/sgljit_my_act/sycl/my_act.hpp",
    "tests/test_conformance.py",
}


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """The package `sgljit new-plugin my-act` writes."""
    root = tmp_path_factory.mktemp("new_plugin") / "my_act"
    result = sgljit_cli("new-plugin", NAME, "--dir", str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    return root


@pytest.fixture(scope="module")
def env(generated, tmp_path_factory) -> dict[str, str]:
    """An environment with the generated package pip-installed (a wheel built by hatchling, its
    metadata and entry point) and a cache of its own, shared by this module's tests."""
    site = tmp_path_factory.mktemp("new_plugin_site")
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"),
            *("--no-build-isolation", "--target", str(site), str(generated)),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert (site / "sgljit_my_act" / "py.typed").is_file()
    assert (site / "sgljit_my_act" / "csrc" / "my_act.cuh").is_file()
    assert (site / "sgljit_my_act" / "sycl" / "my_act.hpp").is_file()
    cache = tmp_path_factory.mktemp("new_plugin_cache")
    return env_with_site(site, SGLJIT_CACHE_DIR=str(cache))


def run_generated_tests(generated: Path, env: dict[str, str], marker: str) -> str:
    """pytest on the generated tests/ in a fresh process (the package's own pytest config);
    returns its output after checking it passed."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", marker, "tests"],
        cwd=generated,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "configfile: pyproject.toml" in result.stdout  # the sycl/gpu markers are registered
    return result.stdout


def test_writes_the_package(generated):
    assert {
        p.relative_to(generated).as_posix() for p in generated.rglob("*") if p.is_file()
    } == TREE
    pyproject = (generated / "pyproject.toml").read_text()
    assert 'name = "sgljit-my-act"' in pyproject
    assert '[project.entry-points."sgljit.plugins"]\nmy_act = "sgljit_my_act:MANIFEST"' in pyproject
    assert '"sgljit>=0.1,<0.2"' in pyproject
    init = (generated / "src/sgljit_my_act/__init__.py").read_text()
    assert '"name": "my_act"' in init and '"requires_sgljit": ">=0.1,<0.2"' in init
    assert 'conformance("my_act")' in (generated / "tests/test_conformance.py").read_text()
    assert (
        "namespace sgljit_my_act {" in (generated / "src/sgljit_my_act/csrc/my_act.cuh").read_text()
    )


def test_sycl_install_hints_work_without_an_index(generated):
    """sgljit is not on a package index: every hint for its sycl extra says both the checkout's and
    a wheelhouse's install, never a bare `pip install "sgljit[sycl]"`."""
    for name in ("tests/test_conformance.py", "README.md"):
        text = " ".join((generated / name).read_text().split())
        assert "core[sycl]" in text and "--find-links WHEELHOUSE" in text, name
        assert 'install "sgljit[sycl]"' not in text, name


def test_default_folder_is_the_family_name(tmp_path):
    result = sgljit_cli("new-plugin", "gelu_tanh2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "gelu_tanh2/src/sgljit_gelu_tanh2/sycl/gelu_tanh2.hpp").is_file()
    assert "sgljit-gelu-tanh2" in result.stdout and "src/sgljit_gelu_tanh2/ops.py" in result.stdout


def test_next_steps_use_the_python_that_has_sgljit(tmp_path, env):
    """The printed steps install pytest with the plugin (its ``test`` extra) and run both through
    ``python -m``: a pytest elsewhere on PATH (the system's) would not see the plugin."""
    result = sgljit_cli("new-plugin", NAME, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    steps = result.stdout.split("next (with the Python that has sgljit):\n")[1].splitlines()
    commands = [line.split("#")[0].strip() for line in steps]
    assert commands == [
        'python -m pip install -e "./my_act[test]"',
        "python -m pytest ./my_act/tests",
        "sgljit check --plugin my_act",
    ]
    requires = run_python(
        "import importlib.metadata as m; print(*m.requires('sgljit-my-act'), sep='\\n')", env=env
    )
    assert "pytest; extra == 'test'" in requires.stdout.splitlines(), requires


def test_refuses_an_existing_folder(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")
    result = sgljit_cli("new-plugin", NAME, "--dir", str(tmp_path / "taken"))
    assert result.returncode == 2
    assert f"{tmp_path / 'taken'} already exists" in result.stderr
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["mine.txt"]


@pytest.mark.parametrize("name", ["My-Act", "9lives", "my--act", "my act", "act-", "sgljit-act"])
def test_refuses_an_invalid_name(tmp_path, name):
    result = sgljit_cli("new-plugin", name, "--dir", str(tmp_path / "out"))
    assert result.returncode == 2
    assert f"plugin name {name!r} is not valid" in result.stderr
    assert not (tmp_path / "out").exists()


def test_generated_code_is_lint_clean(generated):
    """The templates are not Python files, so the repository's lint does not see them: the
    generated package must pass it as written."""
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip("ruff not installed (nox -s lint has it)")
    config = ("--config", str(ROOT / "pyproject.toml"))
    for command in (["check", *config], ["format", "--check", *config]):
        result = subprocess.run([ruff, *command, str(generated)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_installed_plugin_is_discovered_and_matches_float64(env):
    result = run_python(
        """
        import torch, sgljit
        from sgljit.plugins import discover

        [plugin] = [p for p in discover() if p.name == "my_act"]
        assert plugin.status == "ok" and plugin.distribution == "sgljit-my-act 0.1.0", plugin

        def expected(x, scale):
            x = x.double()
            return x * torch.sigmoid(x) * scale

        def error(y, e):
            return ((y.double() - e).abs() / (1 + e.abs())).max().item()

        x = torch.randn(3, 5, 1001, dtype=torch.bfloat16) * 4
        y = sgljit.ops.scaled_silu(x, 0.5)
        assert y.shape == x.shape and y.dtype == x.dtype
        assert error(y, expected(x, 0.5)) < 1e-2, error(y, expected(x, 0.5))

        wide = torch.randn(7, 1536)  # strided rows into a given out
        out = torch.empty(7, 1000)
        assert sgljit.ops.scaled_silu(wide[:, :1000], 2.0, out=out) is out
        assert error(out, expected(wide[:, :1000], 2.0)) < 1e-6
        assert torch.ops.sgljit.scaled_silu.default is not None   # the custom op
        print("ok")
        """,
        env=env,
    )
    assert result.returncode == 0 and result.stdout.split() == ["ok"], result.stderr


def test_generated_conformance_passes_without_sycl(generated, env):
    """The generated tests/ as the CPU (and CUDA) sessions run it: the reference always, the
    CUDA kernels where a GPU is visible."""
    out = run_generated_tests(generated, env, "not sycl")
    checks = ["reference-numerics", "reference-bad_inputs", "reference-torch_compile"]
    if torch.cuda.is_available():
        checks += ["cuda-numerics", "cuda-bad_inputs", "cuda-torch_compile", "cuda-cuda_graph"]
    for check in checks:
        assert f"[scaled_silu-{check}] PASSED" in out, out
    assert "-sycl-" not in out, out


@pytest.mark.sycl
@pytest.mark.skipif(SYCL_MISSING, reason="SYCL runtime not installed")
def test_generated_conformance_passes_on_the_sycl_cpu_device(generated, env):
    """tests-xpu: the generated tests' SYCL cases run (not skipped, not absent) and pass, and
    `sgljit build` builds the SYCL prebuild keys."""
    out = run_generated_tests(generated, env, "sycl")
    for check in ("numerics", "bad_inputs"):
        assert f"[scaled_silu-sycl-{check}] PASSED" in out, out
    assert "skipped" not in out.splitlines()[-1], out
    build = subprocess.run(
        [sys.executable, "-m", "sgljit.cli", "build", "--backend", "sycl", "--plugin", "my_act"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert "3 of 3 built" in build.stdout, build.stdout


# The generated argument checks call TensorMatcher::writable(), which core's tensor.h gains in a
# change of its own; until then every CUDA build of a declared op fails on it.
_TENSOR_H = ROOT / "core/src/sgljit/include/sgljit/tensor.h"
_NO_WRITABLE = "writable()" not in _TENSOR_H.read_text()


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc(), reason="nvcc not found")
@pytest.mark.skipif(_NO_WRITABLE, reason="core's tensor.h has no TensorMatcher::writable() yet")
def test_generated_cuda_kernel_compiles_for_sm90a(env):
    """Every CUDA prebuild key (the three dtypes) compiles for sm_90a with the generated argument
    checks (compile only: no GPU needed)."""
    build = subprocess.run(
        [
            *(sys.executable, "-m", "sgljit.cli", "build", "--backend", "cuda"),
            *("--arch", "9.0a", "--plugin", "my_act", "--jobs", "3"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert "3 of 3 built" in build.stdout, build.stdout

"""Installed from wheels alone, a plugin's ops are there (run by `nox -s build`)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIST = os.environ.get("SGLJIT_DIST")
DEPS = os.environ.get("SGLJIT_WHEELHOUSE_DEPS")

pytestmark = pytest.mark.skipif(
    not (DIST and DEPS),
    reason="run by `nox -s build`, which builds the wheels and gathers their dependencies",
)


def test_plugin_wheel_installs_offline_into_a_fresh_venv(tmp_path):
    plugin_wheels = sorted(Path(DIST).glob("sgljit_*-0.1.0-py3-none-any.whl"))
    assert plugin_wheels, f"no plugin wheels in {DIST}"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    names = [w.name.split("-")[0].replace("_", "-") for w in plugin_wheels]
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--find-links",
            DIST,
            "--find-links",
            DEPS,
            *names,
        ],
        check=True,
    )
    out = subprocess.run(
        [str(python), "-c", "import sgljit; print(' '.join(dir(sgljit.ops)))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(out) >= len(names), out
    listing = subprocess.run(
        [str(venv / "bin" / "sgljit"), "info"], capture_output=True, text=True, check=True
    ).stdout
    for name in names:
        assert name in listing, listing
    # what a new user runs first: no warnings on import (torch warns without numpy), and the
    # installed ops pass their checks against the references
    first = subprocess.run(
        [str(venv / "bin" / "sgljit"), "check"],
        capture_output=True,
        text=True,
        env={**os.environ, "SGLJIT_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Warning" not in first.stderr, first.stderr
    assert " passed" in first.stdout.strip().splitlines()[-1]


def test_every_wheel_is_typed_and_core_carries_the_plugin_templates():
    wheels = sorted(Path(DIST).glob("sgljit*-0.1.0-py3-none-any.whl"))
    assert any(w.name.startswith("sgljit-") for w in wheels), f"no sgljit wheel in {DIST}"
    for wheel in wheels:
        package = wheel.name.split("-")[0]  # sgljit, sgljit_norm, ...
        names = zipfile.ZipFile(wheel).namelist()
        assert f"{package}/py.typed" in names, f"{wheel.name} lacks {package}/py.typed"
        if package == "sgljit":  # what `sgljit new-plugin` copies
            assert "sgljit/templates/plugin/src/__package__/ops.py.tmpl" in names, names


def _disk_usage(folder: Path) -> int:
    """Bytes allocated to the files under ``folder``, as ``du`` counts them (links once)."""
    seen, total = set(), 0
    for path in [folder, *folder.rglob("*")]:
        st = path.lstat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def readme_wheelhouse_recipe() -> list[list[str]]:
    """The commands of README's wheelhouse block, split into words."""
    readme = (ROOT / "README.md").read_text()
    [block] = [
        b
        for b in re.findall(r"^```bash\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)
        if "--wheel-dir wheelhouse" in b
    ]
    return [shlex.split(line.split("#")[0]) for line in block.splitlines() if line.strip()]


def test_readme_wheelhouse_recipe_and_cli_without_warnings(tmp_path):
    """README's wheelhouse recipe, line by line as written (the package indexes it names stand in
    for the gathered dependencies): `pip wheel` builds a wheelhouse from which `pip install
    --find-links wheelhouse sgljit-rope` installs the plugin with its sgljit, after PyTorch's CPU
    build, so that nothing pulls the CUDA build. The environment stays under 1 GiB, and no
    command warns: torch warns on import without numpy ("Failed to initialize NumPy"), which is
    why sgljit depends on numpy."""
    build, *installs = readme_wheelhouse_recipe()
    # PyTorch's CPU build before the plugin, from PyTorch's CPU index
    assert [words[:2] for words in installs] == [["pip", "install"]] * 2, installs
    assert installs[0][2:] == ["torch", "--index-url", "https://download.pytorch.org/whl/cpu"]
    assert installs[1][-1] == "sgljit-rope"
    wheelhouse = tmp_path / "wheelhouse"
    plugins = sorted(f"./plugins/{p.name}" for p in ROOT.glob("plugins/*"))
    build = [str(wheelhouse) if w == "wheelhouse" else w for w in build if w != "./plugins/*"]
    subprocess.run([sys.executable, "-m", *build, *plugins, "--quiet"], cwd=ROOT, check=True)
    built = sorted(w.name.split("-")[0] for w in wheelhouse.glob("*.whl"))
    assert built == [
        "sgljit",
        "sgljit_activation",
        "sgljit_norm",
        "sgljit_quant_fp8",
        "sgljit_rope",
        "sgljit_timestep_embedding",
    ]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for words in installs:
        args = words[2:]
        if "--index-url" in args:  # the index it names: the gathered dependencies stand in
            del args[args.index("--index-url") : args.index("--index-url") + 2]
        args = [str(wheelhouse) if w == "wheelhouse" else w for w in args]
        offline = ["--quiet", "--no-index", "--find-links", DEPS]
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", *offline, *args], check=True
        )
    listing = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.lower()
    names = {line.split("==")[0] for line in listing.split()}
    assert {"sgljit", "sgljit-rope", "numpy"} <= names, names
    assert not {"sgljit-norm", "sgljit-quant-fp8"} & names, names
    assert not [n for n in names if n.startswith("nvidia-")], names
    size = _disk_usage(venv)
    assert size < 2**30, f"{venv}: {size / 2**20:.0f} MiB"

    env = {**os.environ, "SGLJIT_CACHE_DIR": str(tmp_path / "cache")}
    for name in ("SGLJIT_BACKEND", "PYTHONPATH"):
        env.pop(name, None)
    sgljit = str(venv / "bin" / "sgljit")
    for args in (["info"], ["cache", "path"], ["cache", "list"], ["check"]):
        result = subprocess.run([sgljit, *args], capture_output=True, text=True, env=env)
        assert result.returncode == 0, (args, result.stdout + result.stderr)
        assert "Warning" not in result.stderr, (args, result.stderr)
    summary = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"(\d+) of \1 passed", summary), result.stdout
    # `sgljit build` gets as far as the build (torch imported, the plugins' prebuilds listed),
    # without warnings; this environment has no SYCL runtime, which it reports
    result = subprocess.run(
        [sgljit, "build", "--plugin", "rope", "--backend", "sycl"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert "the SYCL runtime is not installed" in result.stdout + result.stderr, result.stdout
    assert "Warning" not in result.stderr, result.stderr

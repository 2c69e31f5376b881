"""Installed from wheels alone, a plugin's ops are there (run by `nox -s build`)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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

"""Shared fixtures: every test gets its own module cache, and helpers to run fresh processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private, empty SGLJIT_CACHE_DIR; in-process memos are cleared around the test."""
    import sgljit

    path = tmp_path / "cache"
    monkeypatch.setenv("SGLJIT_CACHE_DIR", str(path))
    sgljit.clear_module_cache()
    yield path
    sgljit.clear_module_cache()


def run_python(
    code: str, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (the test's environment plus `env`), logging compiles."""
    full_env = {**os.environ, "SGLJIT_LOG": "info", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


def run_python_concurrently(
    code: str, envs: list[dict], timeout: float = 600
) -> list[tuple[int, str, str]]:
    """Start `code` in one fresh interpreter per entry of `envs` (each the test's environment plus
    that dict, compiles logged), all at once; return (returncode, stdout, stderr) of each."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            env={**os.environ, "SGLJIT_LOG": "info", **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env in envs
    ]
    outputs = [p.communicate(timeout=timeout) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]


def has_nvcc() -> bool:
    from sgljit.toolchain import find_nvcc

    return find_nvcc() is not None


FIXTURE_PLUGINS = Path(__file__).parent / "core" / "fixtures" / "plugins"


def env_with_site(site: Path, **extra: str) -> dict[str, str]:
    """This process's environment with ``site`` (e.g. the installed fixture plugins) first on
    PYTHONPATH, plus ``extra``."""
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **extra}


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory) -> Path:
    """The four fixture distributions, pip-installed (wheel build, metadata, entry points)."""
    target = tmp_path_factory.mktemp("plugin_site")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--target",
            str(target),
            *(str(p) for p in sorted(FIXTURE_PLUGINS.iterdir())),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert len(list(target.glob("sgljit_fixture_*.dist-info"))) == 4
    return target

"""Fleet readiness: one cache shared by many processes and hosts, prebuilds, export/import."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ..conftest import env_with_site, has_nvcc, run_python, run_python_concurrently
from .test_load_jit import KERNELS, LOAD_IN_SUBPROCESS, published


def test_many_hosts_on_one_shared_folder_publish_one_module(cache_dir):
    """Processes claiming three host names (three ranks each) cold-start on one cache folder:
    at most one build per host, exactly one published module, every process gets a working one."""
    code = LOAD_IN_SUBPROCESS % (KERNELS, 0)
    envs = [{"SGLJIT_HOST_ID": host} for host in ("node-a", "node-b", "node-c") for _ in range(3)]
    results = run_python_concurrently(code, envs)
    assert all(rc == 0 for rc, _, _ in results), [err for _, _, err in results]
    assert sum("OK" in out for _, out, _ in results) == 9
    builds = sum(err.count("compiling add_one") for _, _, err in results)
    assert 1 <= builds <= 3
    variants = published(cache_dir)
    assert len({v.parent for v in variants}) == 1 and 1 <= len(variants) <= builds
    root = variants[0].parent.parent
    assert not list((root / ".staging").iterdir())  # losers discarded their copies
    assert sorted(p.name for p in (root / ".locks").iterdir()) == ["node-a", "node-b", "node-c"]


def test_export_import_into_a_fresh_cache_then_run_without_compiling(cache_dir, tmp_path):
    assert run_python(LOAD_IN_SUBPROCESS % (KERNELS, 0)).returncode == 0
    archive = tmp_path / "cache.tar.gz"
    export = run_python(
        f"from sgljit.cli import main; raise SystemExit(main(['cache', 'export', r'{archive}']))"
    )
    assert export.returncode == 0, export.stderr
    assert "exported 1 modules" in export.stdout

    fresh = tmp_path / "fresh"
    env = {"SGLJIT_CACHE_DIR": str(fresh)}
    imported = import_archive(archive, fresh)
    assert imported.returncode == 0, imported.stderr
    assert "imported 1 modules" in imported.stdout
    again = run_python(LOAD_IN_SUBPROCESS % (KERNELS, 0), {**env, "SGLJIT_NO_COMPILE": "1"})
    assert again.returncode == 0, again.stderr
    assert "compiling" not in again.stderr


def write_archive(archive: Path, variant: Path, cache_dir: Path, replace: dict[str, bytes]) -> Path:
    """An export-style archive of one published variant, with some files' bytes replaced."""
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(p for p in variant.iterdir() if p.is_file()):
            data = replace.get(path.name, path.read_bytes())
            info = tarfile.TarInfo(f"{variant.relative_to(cache_dir)}/{path.name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


def import_archive(archive: Path, cache: Path) -> subprocess.CompletedProcess:
    """`sgljit cache import ARCHIVE` into ``cache``, in a fresh process."""
    code = f"from sgljit.cli import main; raise SystemExit(main(['cache', 'import', r'{archive}']))"
    return run_python(code, {"SGLJIT_CACHE_DIR": str(cache)})


def test_import_rejects_a_tampered_module(cache_dir, tmp_path):
    assert run_python(LOAD_IN_SUBPROCESS % (KERNELS, 0)).returncode == 0
    [folder] = published(cache_dir)
    so = next(folder.glob("*.so"))
    archive = write_archive(
        tmp_path / "tampered.tar.gz",
        folder,
        cache_dir,
        {so.name: so.read_bytes()[:-16] + b"\0" * 16},  # same size, different bytes
    )
    fresh = tmp_path / "fresh"
    result = import_archive(archive, fresh)
    assert result.returncode == 1
    assert "REJECTED" in result.stderr and "sha256" in result.stderr
    assert not published(fresh)


@pytest.mark.skipif(not has_nvcc(), reason="nvcc not found")
def test_build_prebuilds_declared_kernels_and_reports_failures(cache_dir, plugin_site):
    env = env_with_site(plugin_site)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sgljit.cli",
            "build",
            "--plugin",
            "good",
            "--arch",
            "9.0a 8.0",
            "--jobs",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out  # the broken specialization fails the command
    assert "built good: value=7 [9.0a]" in out and "built good: value=7 [8.0]" in out
    assert "FAILED good: value=broken [9.0a]" in out and "this fixture never compiles" in out
    assert "2 of 4 built" in out
    # one module per architecture, so each serving host finds its own GPU's
    modules = published(cache_dir, "fixture_")
    assert sorted(p.parent.parent.name for p in modules) == ["8.0", "9.0a"]
    assert {p.parent.name.split("-")[0] for p in modules} == {"fixture_fill_7"}

    # In production: nothing compiles, and the prebuilt module is found.
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "from sgljit_fixture_good.ops import cuda_module; cuda_module(7); print('OK')",
        ],
        capture_output=True,
        text=True,
        env={**env, "SGLJIT_NO_COMPILE": "1", "SGLJIT_CUDA_ARCH": "9.0a"},
    )
    assert check.returncode == 0 and "OK" in check.stdout, check.stderr
    missing = subprocess.run(
        [sys.executable, "-c", "from sgljit_fixture_good.ops import cuda_module; cuda_module(8)"],
        capture_output=True,
        text=True,
        env={**env, "SGLJIT_NO_COMPILE": "1", "SGLJIT_CUDA_ARCH": "9.0a"},
    )
    assert missing.returncode != 0
    assert (
        "fixture_fill_8" in missing.stderr
        and 'sgljit build --backend cuda --arch "9.0a"' in missing.stderr
    )


def test_build_of_an_unknown_plugin_fails(cache_dir):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sgljit.cli",
            "build",
            "--plugin",
            "no-such-plugin",
            "--arch",
            "9.0a",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "no-such-plugin" in result.stdout + result.stderr


# A plugin whose prebuilds are real C++ compiles (a few seconds each on CI's two cores), written
# as an installed distribution (dist-info with its entry point) on PYTHONPATH.
SLOW_PLUGIN = """
from pathlib import Path

import sgljit

MANIFEST = {"name": "slow", "version": "0.1.0", "requires_sgljit": ">=0.1,<0.2", "ops": {},
            "family": "sgljit_fixture_slow:family"}


class _Family:
    name = "slow"
    ops: dict = {}

    @staticmethod
    def prebuild_specs(backend):
        return [{"value": v} for v in range(%d)]

    @staticmethod
    def prebuild(backend, value):
        return sgljit.load_jit("fixture_slow", value, cpp_files=["slow.h"],
                               cpp_wrappers=[("value", f"Value<{value}>::run")],
                               source_dir=Path(__file__).parent)


family = _Family()
"""
SLOW_HEADER = """#pragma once
#include <cstdint>
template <int kValue>
struct Value {
  static int64_t run() { return kValue; }
};
"""


def slow_plugin_site(site: Path, modules: int) -> Path:
    package = site / "sgljit_fixture_slow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(SLOW_PLUGIN % modules)
    (package / "slow.h").write_text(SLOW_HEADER)
    info = site / "sgljit_fixture_slow-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sgljit-fixture-slow\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[sgljit.plugins]\nslow = sgljit_fixture_slow:MANIFEST\n"
    )
    return site


def processes_below(pid: int) -> set[int]:
    from sgljit.fleet import _descendants

    return _descendants({pid})


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has stopped
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_ctrl_c_stops_a_build_at_once_and_the_same_command_resumes(cache_dir, tmp_path):
    """Ctrl-C (SIGINT to the command's process group, as a terminal sends it) after 5 s: the
    command exits within 3 s, non-zero, with no worker or compiler left running and no staging
    folder left; run again, it builds the rest and keeps what the first run built."""
    import signal
    import time

    modules = 12  # well over 5 s of compiles on two jobs, even on an idle machine
    env = env_with_site(slow_plugin_site(tmp_path / "site", modules), SGLJIT_LOG="")
    command = [sys.executable, "-m", "sgljit.cli", "build", "--plugin", "slow", "--jobs", "2"]
    build = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    time.sleep(5)
    below = processes_below(build.pid)
    started = time.monotonic()
    while not below and build.poll() is None and time.monotonic() - started < 60:
        time.sleep(0.2)  # a loaded machine: the workers are not up yet
        below = processes_below(build.pid)
    assert build.poll() is None, "the build finished before the interrupt: give it more modules"
    assert below, "no worker was running"
    interrupted = time.monotonic()
    os.killpg(build.pid, signal.SIGINT)
    _out, err = build.communicate(timeout=60)
    took = time.monotonic() - interrupted
    assert took < 3, f"took {took:.1f}s to stop\n{err}"
    assert build.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert "compiling" not in err  # the workers' lines do not tear the progress bar
    assert not [p for p in below if alive(p)], "a worker or compiler is still running"
    assert not list(cache_dir.glob("*/*/.staging/*")), "a staging folder was left behind"
    first = {p: p.stat().st_mtime_ns for p in published(cache_dir, "fixture_slow")}
    assert len(first) < modules

    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"{modules} of {modules} built" in again.stdout
    lines = again.stdout + again.stderr
    assert lines.count("] cached slow:") == len(first), lines
    assert lines.count("] built slow:") == modules - len(first), lines
    after = published(cache_dir, "fixture_slow")
    assert len(after) == modules
    assert all(p.stat().st_mtime_ns == first[p] for p in first)  # kept, not rebuilt

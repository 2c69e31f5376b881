"""Fleet readiness: one cache shared by many processes and hosts, prebuilds, export/import."""

from __future__ import annotations

import io
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

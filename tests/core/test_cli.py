"""The sgljit command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import env_with_site
from .test_load_jit import load_add_one


def sgljit_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sgljit.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def test_info_reports_versions_compilers_and_cache(cache_dir):
    result = sgljit_cli("info")
    assert result.returncode == 0, result.stderr
    for needle in (
        "sgljit",
        "0.1.0",
        "torch",
        "apache-tvm-ffi",
        "c++",
        "nvcc",
        str(cache_dir),
        "plugins:",
        "programmatic dependent launch",
    ):
        assert needle in result.stdout, (needle, result.stdout)


def test_cache_path_list_clear(cache_dir):
    assert sgljit_cli("cache", "path").stdout.strip() == str(cache_dir)
    load_add_one()
    listing = sgljit_cli("cache", "list").stdout
    assert "add_one_fp32_t" in listing and "cpu" in listing and "host" in listing
    assert sgljit_cli("cache", "clear").returncode == 0
    assert not cache_dir.exists()
    assert "(empty)" in sgljit_cli("cache", "list").stdout


def test_clangd_file_points_at_headers(tmp_path):
    result = sgljit_cli("clangd", "--output", str(tmp_path / ".clangd"))
    assert result.returncode == 0, result.stderr
    text = (tmp_path / ".clangd").read_text()
    assert "sgljit/include" in text and "tvm_ffi" in text and "-std=c++17" in text


def test_bad_usage_exits_nonzero():
    assert sgljit_cli("cache", "export").returncode != 0
    assert sgljit_cli("nonsense").returncode != 0
    repeats = sgljit_cli("check", "--repeats", "0")
    assert repeats.returncode == 2 and "expected a whole number >= 1" in repeats.stderr


def test_a_missing_or_bad_file_is_a_message_not_a_traceback(cache_dir, tmp_path):
    (tmp_path / "notgzip.tar.gz").write_text("not an archive")
    (tmp_path / "folder").mkdir()
    calls = [
        ("cache", "import", str(tmp_path / "missing.tar.gz")),
        ("cache", "import", str(tmp_path / "notgzip.tar.gz")),
        ("cache", "import", str(tmp_path / "folder")),
        ("cache", "export", str(tmp_path / "no" / "such" / "x.tar.gz")),
        ("clangd", "--output", str(tmp_path / "no" / "such" / ".clangd")),
        ("clangd", "--output", str(tmp_path / "folder")),
    ]
    for args in calls:
        result = sgljit_cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith(f"sgljit {args[0]}: error: "), (args, result.stderr)
        assert "Traceback" not in result.stderr, (args, result.stderr)


def test_cache_list_names_an_entry_whose_manifest_is_unreadable(cache_dir):
    load_add_one()
    [manifest] = cache_dir.glob("*/*/add_one*/*/sgljit-manifest.json")
    manifest.write_text("[]")
    result = sgljit_cli("cache", "list")
    assert result.returncode == 0, result.stderr
    assert "BROKEN" in result.stdout and "manifest is a JSON list" in result.stdout


@pytest.mark.parametrize("module", ["sgljit"])
def test_import_is_light(module):
    # `import sgljit` must not pull in torch or tvm-ffi (they load on first use).
    code = f"import sys, {module}; print('torch' in sys.modules, 'tvm_ffi' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True
    ).stdout.split()
    assert out == ["False", "False"]


def test_include_readme_exists():
    assert (Path(__file__).parents[2] / "core/src/sgljit/include/README.md").exists()


def test_check_runs_ops_against_their_reference(plugin_site):

    env = env_with_site(plugin_site)
    good = subprocess.run(
        [sys.executable, "-m", "sgljit.cli", "check", "--plugin", "good", "--repeats", "2"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert good.returncode == 0, good.stdout + good.stderr
    assert (
        "fixture_double" in good.stdout
        and "reference (cpu)" in good.stdout
        and " ok " in good.stdout
    )
    assert "passed" in good.stdout
    unknown = subprocess.run(
        [sys.executable, "-m", "sgljit.cli", "check", "--plugin", "nope"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert unknown.returncode == 2 and "'nope' not installed (installed: " in unknown.stderr
    assert "good" in unknown.stderr
    wrong = subprocess.run(
        [sys.executable, "-m", "sgljit.cli", "check", "--plugin", "conflict", "--repeats", "2"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert wrong.returncode == 1
    assert "WRONG" in wrong.stdout and "fixture_other" in wrong.stdout

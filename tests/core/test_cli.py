"""The sgljit command."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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


def test_check_filters_by_op_and_backend_and_names_public_ops():
    """`--op`/`--backend` pick rows; rows name the public op and its variant (not the declared
    op's name), and show the tolerance beside the error."""
    result = sgljit_cli(
        *("check", "--op", "per_tensor_quant_fp8", "--op", "gemma_rmsnorm"),
        *("--backend", "reference", "--repeats", "1"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    table = result.stdout.strip().splitlines()
    header = table[0].split("  ")
    assert [h for h in header if h][:7] == [
        *("op", "variant", "backend", "shape", "status", "max error", "tolerance"),
    ]
    rows = [line.split()[:2] for line in table[2:] if line and not line.endswith("passed")]
    assert {op for op, _ in rows} == {"per_tensor_quant_fp8", "gemma_rmsnorm"}
    assert {v for op, v in rows if op == "per_tensor_quant_fp8"} == {"static", "dynamic"}
    assert {v for op, v in rows if op == "gemma_rmsnorm"} == {"-", "3d"}
    assert "quant_fp8_static" not in result.stdout and "reference (cpu)" in result.stdout
    assert "sycl" not in result.stdout and "not run" not in result.stdout
    assert re.fullmatch(r"(\d+) of \1 passed", table[-1]), table[-1]


def test_check_refuses_an_op_or_backend_it_cannot_run():
    unknown = sgljit_cli("check", "--op", "no_such_op")
    assert unknown.returncode == 2
    assert "--op: no check case of 'no_such_op' (ops with cases: " in unknown.stderr
    assert "rmsnorm" in unknown.stderr
    bad = sgljit_cli("check", "--backend", "gpu")
    assert bad.returncode == 2 and "invalid choice: 'gpu'" in bad.stderr
    if not torch.cuda.is_available():
        cuda = sgljit_cli("check", "--backend", "cuda")
        assert cuda.returncode == 2
        assert "--backend: cuda cannot run here (cuda: no CUDA GPU visible)" in cuda.stderr


class _CompilingFamily:
    """A family whose check cases log a compile (as a first use does), for the progress test."""

    name = "compiling"
    ops: dict = {}  # noqa: RUF012

    @staticmethod
    def check_cases(device):
        def run():
            logging.getLogger("sgljit.compile").info("sgljit: compiling fake ...")
            x = torch.ones(2)
            return x, x.double()

        return [
            {"op": f"compiling_op_{variant}", "shape": "2", "run": run, "tol": 0.0}
            for variant in ("a", "b", "c")
        ]


COMPILING_FAMILY = _CompilingFamily()


def test_check_prefixes_compile_lines_with_its_progress(monkeypatch, capsys):
    """A first check compiles for minutes: each compile line says which case of how many runs."""
    from sgljit import check, plugins

    plugin = plugins.Plugin(
        entry_point="compiling",
        distribution="sgljit-compiling 0.1.0",
        manifest={
            "name": "compiling",
            "version": "0.1.0",
            "ops": {"compiling_op": "x:y"},
            "family": f"{__name__}:COMPILING_FAMILY",
        },
    )
    monkeypatch.setattr(plugins, "discover", lambda: (plugin,))
    monkeypatch.setattr(
        check, "available_backends", lambda: ([("reference", torch.device("cpu"))], [])
    )
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    compile_log = logging.getLogger("sgljit.compile")
    compile_log.addHandler(handler)
    try:
        assert check.run_checks(repeats=1) == 0
    finally:
        compile_log.removeHandler(handler)
    first_calls = records[::2]  # each case runs once, then `repeats` timed calls
    assert first_calls == [f"[{i}/3] sgljit: compiling fake ..." for i in (1, 2, 3)]
    out = capsys.readouterr().out
    assert "compiling_op  a" in out and "compiling_op  c" in out


class _FailingFamily:
    """Check cases for the streaming and whole-error tests: one passes, one fails with a long
    message whose fix is past its first 88 characters, one records what was printed before it."""

    name = "failing"
    ops: dict = {}  # noqa: RUF012
    printed_before_last: list[str] = []  # noqa: RUF012
    capsys = None

    @staticmethod
    def check_cases(device):
        def passes():
            x = torch.ones(2)
            return x, x.double()

        def fails():
            raise RuntimeError(
                "sgljit: module 'failing_module' (key 0123456789abcdef) is not in the module cache "
                "at /somewhere, and that cache is read-only for this process.\n"
                "To fix: build it into a writable copy of the cache (THE FIX IS HERE)"
            )

        def last():
            _FailingFamily.printed_before_last.append(_FailingFamily.capsys.readouterr().out)
            return passes()

        return [
            {"op": "failing_op_a", "shape": "2", "run": passes, "tol": 0.0},
            {"op": "failing_op_b", "shape": "2", "run": fails, "tol": 0.0},
            {"op": "failing_op_c", "shape": "2", "run": last, "tol": 0.0},
        ]


FAILING_FAMILY = _FailingFamily()


@pytest.mark.parametrize("verbose", [False, True])
def test_check_prints_rows_as_they_finish_and_each_error_whole(monkeypatch, capsys, verbose):
    from sgljit import check, plugins

    plugin = plugins.Plugin(
        entry_point="failing",
        distribution="sgljit-failing 0.1.0",
        manifest={
            "name": "failing",
            "version": "0.1.0",
            "ops": {"failing_op": "x:y"},
            "family": f"{__name__}:FAILING_FAMILY",
        },
    )
    monkeypatch.setattr(plugins, "discover", lambda: (plugin,))
    monkeypatch.setattr(
        check, "available_backends", lambda: ([("reference", torch.device("cpu"))], [])
    )
    monkeypatch.setattr(_FailingFamily, "capsys", capsys)
    monkeypatch.setattr(_FailingFamily, "printed_before_last", [])
    assert check.run_checks(repeats=1, verbose=verbose) == 1
    before = _FailingFamily.printed_before_last[0]  # its first call (then a timed one)
    # the first two rows were out before the third case ran
    assert re.search(r"failing_op +a +reference \(cpu\) +2 +ok", before), before
    assert re.search(r"failing_op +b +reference \(cpu\) +2 +ERROR", before), before
    out = "".join(_FailingFamily.printed_before_last) + capsys.readouterr().out
    assert "To fix: build it into a writable copy of the cache (THE FIX IS HERE)" in out
    assert "ERROR failing_op b reference (cpu) 2:" in out
    assert ("Traceback (most recent call last)" in out) == verbose
    assert "1 of 3 passed" not in out and "2 of 3 passed" in out


def test_check_has_a_verbose_flag():
    result = sgljit_cli("check", "--help")
    assert "--verbose" in result.stdout


@pytest.mark.parametrize("name", ["norm", "quant-fp8", "quant_fp8"])
def test_new_plugin_refuses_the_name_of_an_installed_family(tmp_path, name):
    """`sgljit new-plugin norm` would write sgljit-norm/sgljit_norm, and its `pip install -e`
    would replace the real plugin: refused, naming the one it clashes with."""
    result = sgljit_cli("new-plugin", name, cwd=tmp_path)
    assert result.returncode == 2, result.stdout
    assert f"plugin name {name!r} is taken: the installed plugin sgljit-" in result.stderr
    assert "Choose another name" in result.stderr
    assert not any(tmp_path.iterdir())  # nothing written


def test_new_plugin_refuses_one_of_sgljits_families_even_when_not_installed(tmp_path, monkeypatch):
    from sgljit import plugins, scaffold

    monkeypatch.setattr(plugins, "discover", lambda: ())
    with pytest.raises(ValueError, match="sgljit-rope is one of sgljit's own plugins"):
        scaffold.new_plugin("rope", tmp_path / "rope")
    assert not (tmp_path / "rope").exists()

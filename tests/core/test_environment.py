"""Settings read from SGLJIT_* environment variables: a bad value is an error that names the
variable and what it takes, never a silent fallback or an error from deep inside."""

from __future__ import annotations

import pytest

from sgljit import cache, cuda, sycl

from ..conftest import run_python
from .test_load_jit import KERNELS, LOAD_IN_SUBPROCESS


@pytest.mark.parametrize("value", ["bogus", "2"])
def test_a_bad_log_level_names_the_variable(value):
    result = run_python("import sgljit", env={"SGLJIT_LOG": value})
    assert result.returncode != 0
    assert f"ValueError: SGLJIT_LOG={value!r}: expected one of debug, info" in result.stderr


@pytest.mark.parametrize("value", ["1", "true", "DEBUG", "0", "off"])
def test_log_levels_and_switches_are_accepted(value):
    result = run_python("import sgljit; print('ok')", env={"SGLJIT_LOG": value})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_lock_timeout(monkeypatch):
    for text, seconds in (("", 600.0), ("  ", 600.0), ("30", 30.0), ("0", 0.0), ("2.5", 2.5)):
        monkeypatch.setenv("SGLJIT_LOCK_TIMEOUT", text)
        assert cache.lock_timeout() == seconds
    monkeypatch.delenv("SGLJIT_LOCK_TIMEOUT")
    assert cache.lock_timeout() == 600.0
    for text in ("10s", "nan", "-1", "inf-"):
        monkeypatch.setenv("SGLJIT_LOCK_TIMEOUT", text)
        with pytest.raises(
            ValueError, match=r"^SGLJIT_LOCK_TIMEOUT=.*expected a number of seconds"
        ):
            cache.lock_timeout()


def test_extra_cuda_cflags_name_the_variable_on_bad_quoting(monkeypatch):
    monkeypatch.setenv("SGLJIT_EXTRA_CUDA_CFLAGS", '-DSGLJIT_PDL=0 -Xptxas "-v"')
    assert cuda.extra_cuda_cflags_from_env() == ["-DSGLJIT_PDL=0", "-Xptxas", "-v"]
    monkeypatch.setenv("SGLJIT_EXTRA_CUDA_CFLAGS", '-DX="a')
    with pytest.raises(ValueError, match=r"^SGLJIT_EXTRA_CUDA_CFLAGS='-DX=\"a': No closing"):
        cuda.extra_cuda_cflags_from_env()


def test_an_icpx_that_does_not_exist_is_an_error_not_the_other_route(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLJIT_ICPX", str(tmp_path / "no-icpx"))
    with pytest.raises(FileNotFoundError, match=r"^SGLJIT_ICPX=.*no-icpx.*: no such compiler"):
        sycl._pick_route("auto")
    assert "no such compiler" in sycl.describe()["icpx"]
    fake = tmp_path / "icpx"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SGLJIT_ICPX", str(fake))
    assert sycl._pick_route("auto") == "icpx" and sycl.icpx_command() == str(fake)


@pytest.mark.parametrize("value", ["gpu", "cpu"])
def test_a_bad_backend_name_fails_at_import(value):
    result = run_python("import sgljit", env={"SGLJIT_BACKEND": value})
    assert result.returncode != 0
    assert (
        f"ValueError: SGLJIT_BACKEND={value!r}: expected one of cuda, sycl (or xpu), reference, "
        f"got {value!r}" in result.stderr
    ), result.stderr


@pytest.mark.parametrize("value", ["SYCL", "Cuda", "XPU", "Reference"])
def test_backend_names_are_case_insensitive(value):
    result = run_python(
        "import sgljit.backend as b; print(b.forced_backend())", env={"SGLJIT_BACKEND": value}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == {"xpu": "sycl"}.get(value.lower(), value.lower())


@pytest.mark.parametrize(
    "variable, value, message",
    [
        ("SGLJIT_BACKEND", "gpu", "SGLJIT_BACKEND='gpu': expected one of cuda, sycl"),
        ("SGLJIT_PDL", "maybe", "SGLJIT_PDL='maybe': expected 0 (ordinary launches) or 1"),
        ("SGLJIT_LOG", "bogus", "SGLJIT_LOG='bogus': expected one of debug"),
    ],
)
@pytest.mark.parametrize("how", ["script", "module"])
def test_the_command_reports_a_bad_setting_without_a_traceback(variable, value, message, how):
    """`sgljit info` with a bad setting: one line naming the variable, exit status 2."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    script = shutil.which("sgljit", path=str(Path(sys.executable).parent))
    if how == "script" and script is None:
        pytest.skip("the sgljit script is not installed beside this Python")
    command = [script] if how == "script" else [sys.executable, "-m", "sgljit.cli"]
    result = subprocess.run(
        [*command, "info"], capture_output=True, text=True, env={**os.environ, variable: value}
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"sgljit: error: {message}"), result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("value", ["maybe", "off", "true", " 0"])
def test_a_bad_pdl_switch_fails_at_import(value):
    result = run_python("import sgljit", env={"SGLJIT_PDL": value})
    assert result.returncode != 0
    assert f"ValueError: SGLJIT_PDL={value!r}: expected 0" in result.stderr, result.stderr


@pytest.mark.parametrize("value", ["0", "1"])
def test_pdl_switches_are_accepted(value):
    result = run_python("import sgljit; print('ok')", env={"SGLJIT_PDL": value})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_the_log_message_names_every_value_it_takes():
    result = run_python("import sgljit", env={"SGLJIT_LOG": "bogus"})
    assert "on (1, true, yes: info) or off (0, false, no: nothing)" in result.stderr


def test_xpu_names_the_sycl_backend():
    """xpu tensors run the SYCL kernels, so ``xpu`` is accepted for ``sycl`` (variable and
    use_backend); a bad name given to use_backend is the same error."""
    result = run_python(
        """
        import torch, sgljit
        print(sgljit.select_backend(torch.zeros(1)))
        with sgljit.use_backend("reference"), sgljit.use_backend("xpu"):
            print(sgljit.select_backend(torch.zeros(1)))
        try:
            with sgljit.use_backend("gpu"):
                pass
        except ValueError as err:
            print(err)
        """,
        env={"SGLJIT_BACKEND": "xpu"},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["sycl", "sycl"]
    assert lines[2].startswith("use_backend: expected one of cuda, sycl (or xpu), reference")


@pytest.mark.parametrize(
    "value, lines",
    [(None, 1), ("info", 2), ("off", 0)],
    ids=["unset", "info", "off"],
)
def test_a_compile_says_so_once_unless_turned_off(cache_dir, value, lines):
    """A first use compiles for seconds: unset, SGLJIT_LOG prints one line for it (info adds how
    long it took; off prints nothing)."""
    env = {"SGLJIT_LOG": value} if value else {}
    code = LOAD_IN_SUBPROCESS % (KERNELS, 0)
    if value is None:
        code = "import os; os.environ.pop('SGLJIT_LOG', None)\n" + code
    result = run_python(code, env=env)
    assert result.returncode == 0, result.stderr
    logged = [line for line in result.stderr.splitlines() if line.startswith("sgljit: ")]
    assert len(logged) == lines, result.stderr
    if lines:
        assert logged[0].startswith("sgljit: compiling add_one"), logged
        assert "(first use; cached after) ..." in logged[0]


def test_a_cache_dir_that_is_a_file_is_named_as_the_setting(tmp_path):
    """SGLJIT_CACHE_DIR naming a file: the error names the variable, not a folder below it."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    result = run_python(LOAD_IN_SUBPROCESS % (KERNELS, 0), {"SGLJIT_CACHE_DIR": str(blocker)})
    assert result.returncode != 0
    assert (
        f"sgljit: SGLJIT_CACHE_DIR={blocker} is not a folder ({blocker} is a file)" in result.stderr
    ), result.stderr
    assert "Not a directory" not in result.stderr

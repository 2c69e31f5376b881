"""Plugin discovery with real distributions (good, broken, conflicting, incompatible) installed
into a private folder, each scenario in a fresh interpreter."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from ..conftest import run_python


def run_with_plugins(site: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    import os

    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    result = run_python(code, env={"PYTHONPATH": path, **env})
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_ops_are_listed_without_importing_plugin_code(plugin_site):
    run_with_plugins(
        plugin_site,
        """
        import sys, sgljit
        names = dir(sgljit.ops)
        for op in ("fixture_double", "fixture_shared", "fixture_other", "fixture_broken", "fixture_future"):
            assert op in names, names
        assert not [m for m in sys.modules if m.startswith("sgljit_fixture") and m.endswith(".ops")]
        assert sgljit.ops.fixture_double(21) == 42
        assert "sgljit_fixture_good.ops" in sys.modules
        assert "sgljit_fixture_conflict.ops" not in sys.modules
        """,
    )


def test_unknown_op_lists_what_exists(plugin_site):
    run_with_plugins(
        plugin_site,
        """
        import sgljit
        try:
            sgljit.ops.no_such_op
        except AttributeError as err:
            assert "no op 'no_such_op'" in str(err) and "fixture_double" in str(err), err
        else:
            raise AssertionError("no error")
        """,
    )


def test_an_op_whose_plugin_is_missing_names_its_distribution():
    """sgljit.ops, the HF patch and the vLLM shim all say which distribution to install (the norm
    plugin left out here by SGLJIT_DISABLE_PLUGINS, as if it were not installed)."""
    result = run_python(
        """
        import torch, sgljit
        from sgljit.compat.vllm import _custom_ops
        from sgljit.integrations import _patching
        x = torch.ones(2, 8)
        calls = (
            lambda: sgljit.ops.rmsnorm,
            lambda: _patching.require_op("gemma_rmsnorm"),
            lambda: _custom_ops.rms_norm(torch.empty_like(x), x, torch.ones(8), 1e-6),
        )
        for call in calls:
            try:
                call()
            except AttributeError as err:
                print(err)
            else:
                raise AssertionError("no error")
        """,
        env={"SGLJIT_DISABLE_PLUGINS": "norm"},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3, result.stdout
    for line, op in zip(lines, ("rmsnorm", "gemma_rmsnorm", "rmsnorm"), strict=True):
        assert line.startswith(f"sgljit.ops has no op {op!r}: sgljit-norm provides it"), line
        assert (
            "(from a checkout: pip install ./plugins/norm; from a wheelhouse: pip install "
            "--find-links WHEELHOUSE sgljit-norm), or SGLJIT_DISABLE_PLUGINS='norm' disables it"
        ) in line
        assert "apply_rope" in line  # what is installed


def test_known_ops_are_the_project_plugins_ops():
    """KNOWN_OPS (core's table of op -> distribution) lists exactly the ops of the project's own
    plugins, each with its distribution."""
    from sgljit.plugins import KNOWN_OPS, discover

    project = {
        re.search(r'^name = "([^"]+)"', path.read_text(), re.MULTILINE).group(1)
        for path in (Path(__file__).parents[2] / "plugins").glob("*/pyproject.toml")
    }
    found = {
        op: plugin.distribution.split()[0]
        for plugin in discover()
        if plugin.distribution.split()[0] in project
        for op in plugin.ops
    }
    assert set(found.values()) == project  # every project plugin is installed here
    assert found == KNOWN_OPS


def test_conflict_names_both_distributions_and_can_be_resolved(plugin_site):
    run_with_plugins(
        plugin_site,
        """
        import sgljit
        try:
            sgljit.ops.fixture_shared
        except sgljit.PluginError as err:
            msg = str(err)
            assert "sgljit-fixture-good 0.1.0" in msg and "sgljit-fixture-conflict 0.1.0" in msg, msg
            assert "SGLJIT_DISABLE_PLUGINS" in msg
        else:
            raise AssertionError("no conflict error")
        assert sgljit.ops.fixture_other() == "other"  # the rest of that plugin still works
        """,
    )
    run_with_plugins(
        plugin_site,
        """
        import sgljit
        assert sgljit.ops.fixture_shared() == "good"
        assert "fixture_other" not in dir(sgljit.ops)
        """,
        SGLJIT_DISABLE_PLUGINS="conflict",
    )


def test_broken_plugin_breaks_only_its_own_ops(plugin_site):
    run_with_plugins(
        plugin_site,
        """
        import sgljit
        from sgljit.plugins import discover
        try:
            sgljit.ops.fixture_broken
        except sgljit.PluginError as err:
            msg = str(err)
            assert "sgljit-fixture-broken" in msg and "sgljit_this_module_does_not_exist" in msg, msg
        else:
            raise AssertionError("no error")
        assert sgljit.ops.fixture_double(2) == 4
        bad = [p for p in discover() if p.entry_point == "brokenmanifest"]
        assert bad and bad[0].status.startswith("broken: AttributeError"), bad
        bad = [p for p in discover() if p.entry_point == "badops"]
        assert bad and bad[0].status == "manifest ops must map op names to 'module:function' strings"
        assert "fixture_bad_ops" not in dir(sgljit.ops)
        from sgljit.testing import families
        assert "good" in [f.name for f in families()]  # the broken ones left to sgljit info
        try:
            families(["brokenmanifest"])
        except LookupError as err:
            assert "(brokenmanifest): broken: AttributeError" in str(err), err
        else:
            raise AssertionError("no error")
        """,
    )


def test_incompatible_plugin_errors_on_use(plugin_site):
    run_with_plugins(
        plugin_site,
        """
        import sgljit
        try:
            sgljit.ops.fixture_future
        except sgljit.PluginError as err:
            assert "incompatible: needs sgljit>=9.0, this is sgljit 0.1.0" in str(err), err
        else:
            raise AssertionError("no error")
        """,
    )


def test_info_reports_plugins_and_their_status(plugin_site):
    result = run_with_plugins(
        plugin_site, "from sgljit.cli import main; raise SystemExit(main(['info']))"
    )
    out = result.stdout
    assert "sgljit-fixture-good 0.1.0" in out and "fixture_double" in out
    assert "incompatible: needs sgljit>=9.0" in out
    assert "CONFLICT" in out
    assert "broken: AttributeError" in out
    assert "manifest ops must map op names" in out


def test_a_plugin_installed_later_is_discovered(tmp_path, cache_dir):
    """Discovery is memoized on disk; installing a distribution must invalidate the memo."""
    import sys

    from ..conftest import FIXTURE_PLUGINS

    site = tmp_path / "site"

    def install(name: str) -> None:
        subprocess.run(
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
                str(site),
                str(FIXTURE_PLUGINS / name),
            ],
            check=True,
        )

    listing = "import sgljit; print(' '.join(dir(sgljit.ops)))"
    install("good")
    assert "fixture_other" not in run_with_plugins(site, listing).stdout.split()
    assert "fixture_double" in run_with_plugins(site, listing).stdout.split()  # from the memo
    assert list(cache_dir.glob("plugins/entry-points-*.json"))
    install("conflict")
    assert "fixture_other" in run_with_plugins(site, listing).stdout.split()

"""The module cache's promise, tried as a user would (fresh processes, real compilers): an edit of
any header the compiler read rebuilds, a binary that is not what was built is never loaded, odd
paths and stray files do not break it, and every failure is an error naming what to change."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import sgljit
from sgljit import cache, publish

from ..conftest import run_python
from .test_fleet import import_archive, write_archive
from .test_load_jit import KERNELS, LOAD_IN_SUBPROCESS, published

# A module whose value is the sum of constants from headers reached four ways: a header in
# source_dir that includes one found through `include_dirs`, one through an `-I` flag, and one by
# absolute path. The child prints "value=<n>" and the test reads the compile log from stderr.
VALUE_CHILD = """
import json, sys, torch, sgljit
spec = json.loads(sys.argv[1])
m = sgljit.load_jit("value", cpp_files=["value.h"], cpp_wrappers=[("value", "Value::run")],
                    source_dir=spec["source_dir"], include_dirs=spec.get("include_dirs", []),
                    extra_cflags=spec.get("extra_cflags", []))
out = torch.zeros(1, dtype=torch.int64)
m.value(out)
print(f"value={int(out[0])}")
"""


def value_tree(root: Path, flag_dir_name: str = "flagged") -> dict:
    """source_dir/value.h → level1.h (source_dir) → inc.h (include_dirs) → flag.h (-I flag) and
    /abs/path/abs.h; each header adds one constant."""
    src, inc, flag, absdir = root / "src", root / "inc", root / flag_dir_name, root / "abs"
    for d in (src, inc, flag, absdir):
        d.mkdir(parents=True, exist_ok=True)
    (src / "value.h").write_text(
        textwrap.dedent(
            """\
            #pragma once
            #include <tvm/ffi/container/tensor.h>
            #include "level1.h"
            struct Value {
              static void run(tvm::ffi::TensorView out) {
                static_cast<int64_t*>(out.data_ptr())[0] = kLevel1 + kInc + kFlag + kAbs;
              }
            };
            """
        )
    )
    (src / "level1.h").write_text('#pragma once\n#include "inc.h"\nconstexpr long kLevel1 = 1;\n')
    (inc / "inc.h").write_text(
        f'#pragma once\n#include <flag.h>\n#include "{absdir / "abs.h"}"\nconstexpr long kInc = 10;\n'
    )
    (flag / "flag.h").write_text("#pragma once\nconstexpr long kFlag = 100;\n")
    (absdir / "abs.h").write_text("#pragma once\nconstexpr long kAbs = 1000;\n")
    return {
        "source_dir": str(src),
        "include_dirs": [str(inc)],
        "extra_cflags": [f"-I{flag}"],
        "headers": {
            "level1.h": str(src / "level1.h"),
            "inc.h": str(inc / "inc.h"),
            "flag.h": str(flag / "flag.h"),
            "abs.h": str(absdir / "abs.h"),
        },
    }


def run_value(spec: dict, env: dict | None = None) -> tuple[int | None, bool, str]:
    """(value printed, whether the child compiled, stderr)."""
    args = {k: v for k, v in spec.items() if k != "headers"}
    code = VALUE_CHILD.replace("sys.argv[1]", repr(json.dumps(args)))
    result = run_python(code, env)
    values = [line for line in result.stdout.splitlines() if line.startswith("value=")]
    value = int(values[0].split("=")[1]) if values and result.returncode == 0 else None
    return value, "compiling value" in result.stderr, result.stderr


def set_constant(header: str, value: int) -> None:
    path = Path(header)
    lines = path.read_text().splitlines()
    lines[-1] = lines[-1].rsplit("=", 1)[0] + f"= {value};"
    path.write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------------------------
# 1. the key is what the compiler read


def test_a_header_reached_through_an_I_flag_or_by_absolute_path_rebuilds(cache_dir, tmp_path):
    spec = value_tree(tmp_path)
    assert run_value(spec)[:2] == (1111, True)
    assert run_value(spec)[:2] == (1111, False)
    set_constant(spec["headers"]["flag.h"], 200)  # found through extra_cflags=["-I..."]
    assert run_value(spec)[:2] == (1211, True)
    set_constant(spec["headers"]["abs.h"], 2000)  # #include "/absolute/path.h"
    assert run_value(spec)[:2] == (2211, True)
    # the -I flag pointed at another folder holding a flag.h of another value
    other = value_tree(tmp_path / "other", flag_dir_name="elsewhere")
    set_constant(other["headers"]["flag.h"], 300)
    assert run_value({**spec, "extra_cflags": other["extra_cflags"]})[:2] == (2311, True)


def test_a_header_found_through_cpath_rebuilds(cache_dir, tmp_path):
    spec = value_tree(tmp_path)
    flag_dir = spec.pop("extra_cflags")[0][2:]
    env = {"CPATH": flag_dir}
    assert run_value(spec, env)[:2] == (1111, True)
    set_constant(spec["headers"]["flag.h"], 500)
    assert run_value(spec, env)[:2] == (1511, True)
    assert run_value(spec, env)[:2] == (1511, False)


def test_the_manifest_records_every_header_read_including_tvm_ffi(cache_dir, tmp_path):
    spec = value_tree(tmp_path)
    assert run_value(spec)[0] == 1111
    [variant] = published(cache_dir, "value")
    deps = dict(json.loads((variant / cache.MANIFEST).read_text())["deps"])
    assert "{source}/level1.h" in deps and "{include0}/inc.h" in deps
    assert spec["headers"]["flag.h"] in deps and spec["headers"]["abs.h"] in deps
    assert "{tvm_ffi}/tvm/ffi/container/tensor.h" in deps  # an edit of tvm-ffi's headers rebuilds
    assert not any(p.startswith("/usr/include") for p in deps)  # the toolchain's: its identity


def test_an_edit_of_an_installed_tvm_ffi_header_rebuilds(cache_dir, tmp_path):
    """tvm-ffi's headers are read through its own include path: an edit in place (a patched
    install) rebuilds, and putting the file back finds the first build again. The install edited
    is a private copy: tests running alongside (pytest -n) load modules through the real one."""
    import tvm_ffi

    site = tmp_path / "site"
    shutil.copytree(Path(tvm_ffi.__file__).parent, site / "tvm_ffi")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    roots = run_python(
        "from sgljit.cuda import _tvm_ffi_roots; print(_tvm_ffi_roots()['tvm_ffi'])", env
    )
    assert roots.stdout.strip() == str((site / "tvm_ffi" / "include").resolve()), roots
    header = site / "tvm_ffi" / "include" / "tvm" / "ffi" / "container" / "tensor.h"
    code = LOAD_IN_SUBPROCESS % (KERNELS, 0)
    assert "compiling add_one" in run_python(code, env).stderr
    original = header.read_bytes()
    header.write_bytes(original + b"\n// edited in place by sgljit's tests\n")
    edited = run_python(code, env)
    header.write_bytes(original)
    assert edited.returncode == 0 and "compiling add_one" in edited.stderr, edited.stderr
    restored = run_python(code, env)
    assert restored.returncode == 0 and "compiling" not in restored.stderr, restored.stderr
    assert len(published(cache_dir)) == 2


# A c++ that, on its first compile (not --version), edits a header after compiling: the edit lands
# while the build runs, after the compiler read the header.
EDITING_CXX = """#!/bin/sh
c++ "$@"; rc=$?
case " $* " in *" -c "*)
  if [ ! -e "$EDIT_MARK" ]; then sed -i 's/= 0;/= 4;/' "$EDIT_FILE"; touch "$EDIT_MARK"; fi;;
esac
exit $rc
"""


def test_a_header_edited_during_the_build_is_not_vouched_for(cache_dir, tmp_path):
    """The binary was built from the header before the edit, but the hashes are taken after the
    compile: such a build must not be published (it would be served, stale, from then on). It is
    built again, and what is published, and what a fresh process loads, has the edit."""
    src = tmp_path / "src"
    shutil.copytree(KERNELS, src)
    cxx = tmp_path / "editing-c++"
    cxx.write_text(EDITING_CXX)
    cxx.chmod(0o755)
    env = {"CXX": str(cxx), "EDIT_FILE": str(src / "offset.h"), "EDIT_MARK": str(tmp_path / "mark")}
    first = run_python(LOAD_IN_SUBPROCESS % (src, 4), env=env)
    assert first.returncode == 0, first.stderr
    assert re.search(r"offset\.h changed while add_one\w* compiled; compiling again", first.stderr)
    assert len(published(cache_dir)) == 1
    fresh = run_python(LOAD_IN_SUBPROCESS % (src, 4), env=env)
    assert fresh.returncode == 0, fresh.stderr
    assert "compiling" not in fresh.stderr


def test_a_header_that_changes_during_every_build_is_used_but_never_cached(tmp_path, monkeypatch):
    """After its last attempt the build is used by the process that made it, with a warning, and
    nothing is published."""
    monkeypatch.setenv("SGLJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(
        publish,
        "_unvouched",
        lambda before, after, name: f"/a/header.h changed while {name} compiled",
    )
    src = tmp_path / "src"
    shutil.copytree(KERNELS, src)
    sgljit.clear_module_cache()
    with pytest.warns(UserWarning, match=r"built 3 times.*/a/header\.h changed while"):
        module = sgljit.load_jit(
            "add_one_racing", cpp_files=["add_one.h"], cpp_wrappers=[("add_into", "AddInto::run")],
            source_dir=src,
        )  # fmt: skip
    x = torch.zeros(3)
    module.add_into(torch.ones(3), x)
    assert x.tolist() == [1.0, 1.0, 1.0]
    assert published(tmp_path / "cache", "add_one_racing") == []
    sgljit.clear_module_cache()


def test_random_header_edits_across_fresh_processes(cache_dir, tmp_path):
    """30 rounds, each in a fresh process: edit one header of the four-way include chain (or none);
    the value must reflect every edit, and a round without an edit must not compile."""
    spec = value_tree(tmp_path)
    rng = random.Random(23)
    constants = {"level1.h": 1, "inc.h": 10, "flag.h": 100, "abs.h": 1000}
    value, compiled, err = run_value(spec)
    assert value == 1111 and compiled, err
    for round_ in range(30):
        edited = rng.choice([*constants, None])
        if edited:
            constants[edited] += rng.randint(1, 9) * {"level1.h": 1, "inc.h": 10}.get(edited, 100)
            set_constant(spec["headers"][edited], constants[edited])
        value, compiled, err = run_value(spec)
        assert value == sum(constants.values()), (round_, edited, err)
        assert compiled == (edited is not None), (round_, edited, err)


# ------------------------------------------------------------------------------------------------
# 2. a binary that is not what was built is never loaded


def test_same_size_corruption_is_caught_before_loading(cache_dir):
    assert run_python(LOAD_IN_SUBPROCESS % (KERNELS, 0)).returncode == 0
    [variant] = published(cache_dir)
    so = variant / "add_one_fp32_t.so"
    data = bytearray(so.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4] = b"\xde\xad\xbe\xef"
    patched = variant / "patched.tmp"
    patched.write_bytes(bytes(data))
    os.replace(patched, so)
    result = run_python(LOAD_IN_SUBPROCESS % (KERNELS, 0))
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr
    assert "does not match the sha256" in result.stderr and "compiling add_one" in result.stderr


def test_import_refuses_a_manifest_rewritten_to_vouch_for_a_patched_binary(cache_dir, tmp_path):
    assert run_python(LOAD_IN_SUBPROCESS % (KERNELS, 0)).returncode == 0
    [variant] = published(cache_dir)
    manifest = json.loads((variant / cache.MANIFEST).read_text())
    so = bytearray((variant / manifest["artifact"]).read_bytes())
    so[-16:] = b"\0" * 16
    manifest["artifact_sha256"] = hashlib.sha256(
        bytes(so)
    ).hexdigest()  # consistent with the patched bytes
    archive = write_archive(
        tmp_path / "tampered.tar.gz",
        variant,
        cache_dir,
        {manifest["artifact"]: bytes(so), cache.MANIFEST: json.dumps(manifest).encode()},
    )
    fresh = tmp_path / "fresh"
    result = import_archive(archive, fresh)
    assert result.returncode == 1
    assert "REJECTED" in result.stderr and "not named by the variant" in result.stderr
    assert not published(fresh)


# ------------------------------------------------------------------------------------------------
# 3, 4. the cache and stray files inside a source folder


def test_a_cache_inside_the_source_folder_hits(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(KERNELS, src)
    for i in range(2000):  # unrelated files a warm load must not read
        (src / f"unrelated_{i}.h").write_text(f"#error never included {i}\n")
    env = {"SGLJIT_CACHE_DIR": str(src / "cache")}
    logs = [run_python(LOAD_IN_SUBPROCESS % (src, 0), env) for _ in range(3)]
    assert all(r.returncode == 0 for r in logs), [r.stderr for r in logs]
    assert [("compiling add_one" in r.stderr) for r in logs] == [True, False, False]
    warm = run_python(LOAD_IN_SUBPROCESS % (src, 0), {**env, "SGLJIT_NO_COMPILE": "1"})
    assert warm.returncode == 0, warm.stderr
    assert len(published(src / "cache")) == 1


def test_stray_files_in_the_source_folder_are_never_opened(cache_dir, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(KERNELS, src)
    os.symlink(src / "gone-by-now", src / ".#add_one.h")  # an editor's lock: a dangling link
    os.mkfifo(src / "pipe.h")  # opening it would block forever
    for attempt in ("cold", "warm"):
        result = run_python(LOAD_IN_SUBPROCESS % (src, 0), timeout=120)
        assert result.returncode == 0 and "OK" in result.stdout, (attempt, result.stderr)
    assert len(published(cache_dir)) == 1


# ------------------------------------------------------------------------------------------------
# 5. any path Python can open


def test_paths_with_spaces_dollars_quotes_and_unicode(tmp_path):
    odd = tmp_path / "with space $HOME 'quote' \"dq\" ü"
    src = odd / "src $x"
    shutil.copytree(KERNELS, src)
    env = {"SGLJIT_CACHE_DIR": str(odd / "cache dir")}

    def code(offset: int) -> str:
        return LOAD_IN_SUBPROCESS.replace('r"%s"', repr(str(src))).replace("%d", str(offset))

    first = run_python(code(0), env)
    assert first.returncode == 0 and "OK" in first.stdout, first.stderr
    (src / "offset.h").write_text("#pragma once\ninline constexpr int kOffset = 10;\n")
    second = run_python(code(10), env)
    assert second.returncode == 0 and "compiling add_one" in second.stderr, second.stderr
    assert len(published(odd / "cache dir")) == 2


def fake_ninja(folder: Path, stdout: str) -> str:
    """An executable named ninja that prints ``stdout`` whatever it is asked."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "ninja"
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}\nEOF\n")
    exe.chmod(0o755)
    return str(exe)


def test_a_ninja_that_splits_quoted_paths_is_refused_naming_the_fix(
    cache_dir, tmp_path, monkeypatch
):
    from sgljit import toolchain

    fake_ninja(tmp_path / "bin", "1.11.1")
    monkeypatch.setitem(sys.modules, "ninja", None)  # the ninja package is not installed
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    toolchain.find_ninja.cache_clear()
    try:
        with pytest.raises(sgljit.SgljitError, match=r"1\.11\.1.*ninja>=1\.13"):
            toolchain.find_ninja()
    finally:
        toolchain.find_ninja.cache_clear()


def test_dependencies_ninja_could_not_parse_are_an_error_not_a_cache_entry(tmp_path, monkeypatch):
    from sgljit import cuda

    (tmp_path / "k.cu").write_text("")
    exe = fake_ninja(tmp_path / "bin", "k.o: #deps 3 (VALID)\n    k.cu\n    /src/a \n    q/k.h")
    monkeypatch.setattr(cuda, "find_ninja", lambda: exe)
    with pytest.raises(sgljit.CompileError, match="could not record") as err:
        cuda.ninja_deps(tmp_path)
    assert "/src/a" in err.value.output


# ------------------------------------------------------------------------------------------------
# 6. errors that say what to change


@contextlib.contextmanager
def read_only(folder: Path):
    """Make a folder read-only for this user: a read-only bind mount when root (root ignores
    permission bits), else chmod."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_cache_on_a_cold_load_names_the_setting(tmp_path):
    ro = tmp_path / "ro-cache"
    with read_only(ro):
        result = run_python(LOAD_IN_SUBPROCESS % (KERNELS, 0), {"SGLJIT_CACHE_DIR": str(ro)})
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("sgljit.errors.CacheError"), result.stderr
    assert str(ro) in last and "SGLJIT_CACHE_DIR" in last and "sgljit build" in last


def test_an_unwritable_home_without_a_cache_dir_names_the_setting(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "SGLJIT_CACHE_DIR"}
    with read_only(home):
        result = subprocess.run(
            [sys.executable, "-c", LOAD_IN_SUBPROCESS % (KERNELS, 0)],
            env={**env, "HOME": str(home)},
            capture_output=True,
            text=True,
        )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("sgljit.errors.CacheError"), result.stderr
    assert "SGLJIT_CACHE_DIR" in last and "~/.cache/sgljit" in last


def test_an_unreadable_module_folder_is_an_error_naming_it(cache_dir, monkeypatch):
    load_add_one_once()
    [variant] = published(cache_dir)
    group = variant.parent
    real_scandir = os.scandir

    def scandir(path="."):  # what chmod 000 does to a user other than root
        if Path(path) == group:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(cache.os, "scandir", scandir)
    sgljit.clear_module_cache()
    with pytest.raises(sgljit.CacheError, match="Permission denied") as info:
        load_add_one_once()
    assert str(group) in str(info.value) and "readable" in str(info.value)


def test_no_space_while_writing_the_manifest_is_an_error_and_leaves_nothing(cache_dir, monkeypatch):
    real_write = Path.write_text

    def write_text(self, data, *args, **kwargs):
        if self.name == cache.MANIFEST + ".tmp":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(sgljit.CacheError, match="No space left on device") as info:
        load_add_one_once()
    assert "SGLJIT_CACHE_DIR" in str(info.value) and "free space" in str(info.value)
    assert not published(cache_dir)
    assert not list(cache_dir.glob("cpu/host/.staging/*"))


def load_add_one_once():
    from .test_load_jit import load_add_one

    return load_add_one()


def _wait_for(pattern: str, root: Path, timeout: float = 120) -> list[Path]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(root.glob(pattern))
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{pattern} never appeared under {root}")


@pytest.mark.slow
def test_a_waiter_says_who_holds_the_lock_then_builds_anyway(cache_dir):
    """A builder stopped with SIGSTOP holds the lock: a second process says within ~10 s which
    process holds it and how long it will wait, and builds itself after SGLJIT_LOCK_TIMEOUT."""
    code = LOAD_IN_SUBPROCESS % (KERNELS, 0)
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for("cpu/host/.locks/*/*.owner", cache_dir)
        holder.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        waiter = run_python(code, {"SGLJIT_LOCK_TIMEOUT": "14"})
        waited = time.monotonic() - started
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()
    assert waiter.returncode == 0 and "OK" in waiter.stdout, waiter.stderr
    assert f"waiting for process {holder.pid} on " in waiter.stderr, waiter.stderr
    assert "SGLJIT_LOCK_TIMEOUT" in waiter.stderr and "building anyway" in waiter.stderr
    assert 14 <= waited < 120


def test_staging_folders_of_killed_builds_are_removed(cache_dir):
    code = LOAD_IN_SUBPROCESS % (KERNELS, 0)
    victim = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    [staging] = _wait_for("cpu/host/.staging/*/build.ninja", cache_dir)
    victim.kill()
    victim.wait()
    assert staging.parent.exists()
    # `sgljit cache clear --stale` removes it on demand ...
    result = run_python("from sgljit.cli import main; main(['cache', 'clear', '--stale'])")
    assert result.returncode == 0 and "removed 1 stale" in result.stdout, result.stdout
    assert not staging.parent.exists()
    # ... and the next build does it by itself
    victim = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    [staging] = _wait_for("cpu/host/.staging/*/build.ninja", cache_dir)
    victim.kill()
    victim.wait()
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert not staging.parent.exists()
    assert not list(cache_dir.glob("cpu/host/.staging/*"))
    assert len(published(cache_dir)) == 1


CACHE_MODULES = ("cache", "store", "publish", "toolchain")


def test_the_cache_modules_import_no_circle_and_no_private_name():
    """cache (warm path), store (its insides), publish (miss path), toolchain: no module imports
    one that imports it back, nor a private name of another sgljit module."""
    import ast

    package = Path(sgljit.__file__).parent
    imports: dict[str, set[str]] = {}
    for name in CACHE_MODULES:
        imports[name] = set()
        for node in ast.walk(ast.parse((package / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                imports[name].add(node.module.split(".")[0])
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private or node.module == "_version", (name, node.module, private)

    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in imports.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    for name in CACHE_MODULES:
        assert name not in reaches(name), f"{name} imports itself back through {imports}"


def test_a_warm_load_does_not_import_the_miss_path(cache_dir):
    assert run_python(LOAD_IN_SUBPROCESS % (KERNELS, 0)).returncode == 0
    warm = run_python(
        LOAD_IN_SUBPROCESS % (KERNELS, 0)
        + "\nimport sys; print('publish' if 'sgljit.publish' in sys.modules else 'warm')"
    )
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.split()[-1] == "warm" and "compiling" not in warm.stderr

"""The module cache against an adversary (C++ modules, real compilers, fresh processes): what a
build read is known before it is trusted, every file a build reads is recorded, a compiler is
known by what it says and is, special files in the cache never hang, any entry that fails the one
validity rule is rebuilt over, a build's staging folder survives builders in other PID
namespaces, and a miss in a read-only cache says what to do. (The SYCL cases: test_sycl.py.)"""

from __future__ import annotations

import ctypes
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

import sgljit
from sgljit import cache, publish

from ..conftest import run_python
from .test_cache import _wait_for, read_only
from .test_fleet import import_archive
from .test_load_jit import KERNELS, LOAD_IN_SUBPROCESS, load_add_one, published

HOST = "adversary-host"  # SGLJIT_HOST_ID of every child: lock and staging paths are predictable

# A module whose value is VALUE_EXPR, computed from whatever the test puts in value.h's prelude.
VALUE_CHILD = """
import json, sys, torch, sgljit
spec = json.loads(sys.argv[1])
m = sgljit.load_jit("adversary_value", cpp_files=["value.h"],
                    cpp_wrappers=[("value", "Value::run")], **spec)
out = torch.zeros(1, dtype=torch.int64)
m.value(out)
print(f"value={int(out[0])}")
"""


def value_source(folder: Path, prelude: str, expr: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "value.h").write_text(
        "#pragma once\n#include <tvm/ffi/container/tensor.h>\n"
        + textwrap.dedent(prelude)
        + "\nstruct Value {\n  static void run(tvm::ffi::TensorView out) {\n"
        + f"    static_cast<int64_t*>(out.data_ptr())[0] = {expr};\n  }}\n}};\n"
    )
    return folder


def run_value(spec: dict, env: dict | None = None) -> tuple[int | None, bool, str]:
    """(value printed, whether the child compiled, stderr) of load_jit(**spec) in a fresh process."""
    code = VALUE_CHILD.replace("sys.argv[1]", repr(json.dumps(spec)))
    result = run_python(code, {"SGLJIT_HOST_ID": HOST, **(env or {})})
    values = [line for line in result.stdout.splitlines() if line.startswith("value=")]
    value = int(values[0].split("=")[1]) if values and result.returncode == 0 else None
    return value, "compiling adversary_value" in result.stderr, result.stderr


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory) -> Path:
    """A cache holding add_one (float32 and float64) built once by a child with SGLJIT_HOST_ID
    HOST; tests copy it (:func:`prebuilt_into`) instead of compiling it again."""
    root = tmp_path_factory.mktemp("prebuilt") / "cache"
    code = "import torch\nfrom tests.core.test_load_jit import load_add_one\n"
    code += "load_add_one(dtype=torch.float32)\nload_add_one(dtype=torch.float64)\n"
    result = run_python(code, {"SGLJIT_CACHE_DIR": str(root), "SGLJIT_HOST_ID": HOST})
    assert result.returncode == 0, result.stderr
    return root


def prebuilt_into(prebuilt: Path, cache_dir: Path, dtype: str = "float32") -> Path:
    """Copy the prebuilt cache into ``cache_dir`` with only add_one's ``dtype`` module; returns its
    variant folder."""
    shutil.copytree(prebuilt, cache_dir, symlinks=True)
    keep = "add_one_" + {"float32": "fp32_t", "float64": "double"}[dtype] + "-"
    for group in cache_dir.glob("cpu/host/add_one_*"):
        if not group.name.startswith(keep):
            shutil.rmtree(group)
    [variant] = published(cache_dir)
    return variant


def script(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    path.chmod(0o755)
    return str(path)


# ------------------------------------------------------------------------------------------------
# 1, 2. what a build read is known before it is trusted

# A c++ that, on its first compile, replaces offset.h after compiling as `cp -p` of an older copy
# would, or with an NFS server's clock an hour ahead: new contents, an mtime outside the build.
COPYING_CXX = """\
#!/bin/sh
c++ "$@"; rc=$?
case " $* " in *" -c "*)
  if [ ! -e "$EDIT_MARK" ]; then
    sed 's/= 0;/= 4;/' "$EDIT_FILE" > "$EDIT_FILE.new"
    touch -d "@$EDIT_MTIME" "$EDIT_FILE.new"
    cp -p "$EDIT_FILE.new" "$EDIT_FILE"
    touch "$EDIT_MARK"
  fi;;
esac
exit $rc
"""


@pytest.mark.parametrize("mtime", ["years before", "an hour ahead"])
def test_1_a_header_replaced_during_the_build_with_an_mtime_outside_it(cache_dir, tmp_path, mtime):
    """Case 1: the compiler read offset.h before it was replaced; whatever the new file's mtime,
    its contents differ from the ones hashed before the compile, so that build is not published.
    The process builds again and every later process gets the new header's value."""
    src = tmp_path / "src"
    shutil.copytree(KERNELS, src)
    stamp = 978307200 if mtime == "years before" else int(time.time()) + 3600
    env = {
        "CXX": script(tmp_path / "copying-c++", COPYING_CXX),
        "EDIT_FILE": str(src / "offset.h"),
        "EDIT_MARK": str(tmp_path / "mark"),
        "EDIT_MTIME": str(stamp),
        "SGLJIT_HOST_ID": HOST,
    }
    first = run_python(LOAD_IN_SUBPROCESS % (src, 4), env)
    assert first.returncode == 0 and "OK" in first.stdout, first.stderr
    assert "offset.h changed while add_one_fp32_t compiled; compiling again" in first.stderr
    fresh = run_python(LOAD_IN_SUBPROCESS % (src, 4), env)
    assert fresh.returncode == 0 and "compiling" not in fresh.stderr, fresh.stderr


def test_2_a_save_between_the_compile_and_the_hashes_is_not_vouched_for(cache_dir, tmp_path):
    """Case 2: an ordinary save (mtime now) that lands after the compile finished but before the
    build's inputs are recorded (here: while the built module loads). The binary has the old
    header, so the new header's hash must never be recorded for it: a later lookup rebuilds."""
    src = tmp_path / "src"
    src.mkdir()
    header = src / "value.h"
    header.write_text("#define VALUE 1\n")
    saves = ["#define VALUE 2\n"]

    def build(folder: Path) -> list[str]:
        cmd = ["c++", "-shared", "-fPIC", "-MD", "-MF", "v.d", f"-I{src}", "v.cc", "-o", "v.so"]
        subprocess.run(cmd, cwd=folder, check=True)
        return cache.read_depfile((folder / "v.d").read_text())

    def load(path: Path) -> int:
        value = ctypes.CDLL(str(path)).value()
        if saves:  # the first load: the save lands now
            header.write_text(saves.pop())
        return value

    spec = cache.BuildSpec(
        backend="cpu", arch="host", name="save_race", artifact="v.so", build=build, load=load,
        files={"v.cc": '#include "value.h"\nextern "C" int value() { return VALUE; }\n'},
        roots={"src": src},
    )  # fmt: skip
    cache.get_or_build(spec)
    sgljit.clear_module_cache()
    assert cache.get_or_build(spec) == 2


# ------------------------------------------------------------------------------------------------
# 4. every file the compiler and the linker read is recorded

# A c++ whose system folders include $FAKE_SYSTEM (what /usr/local/include is to a real one).
SYSTEM_CXX = """\
#!/bin/sh
exec c++ -isystem "$FAKE_SYSTEM" "$@"
"""


def test_4_a_header_in_an_I_folder_below_a_system_folder_is_recorded(cache_dir, tmp_path):
    system = tmp_path / "system"
    flagged = system / "x"  # -I/usr/local/include/x: a user folder below a system one
    flagged.mkdir(parents=True)
    (flagged / "x.h").write_text("#define X_VALUE 1\n")
    env = {"CXX": script(tmp_path / "system-c++", SYSTEM_CXX), "FAKE_SYSTEM": str(system)}
    spec = {
        "source_dir": str(value_source(tmp_path / "src", '#include "x.h"', "X_VALUE")),
        "extra_cflags": [f"-I{flagged}"],
    }
    assert run_value(spec, env)[:2] == (1, True)
    (flagged / "x.h").write_text("#define X_VALUE 2\n")
    assert run_value(spec, env)[:2] == (2, True)


LIBRARY_SOURCE = 'extern "C" long library_value() {{ return {}; }}\n'


def make_library(folder: Path, value: int) -> Path:
    """libvalue.a whose library_value() returns ``value``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "value.cc").write_text(LIBRARY_SOURCE.format(value))
    subprocess.run(["c++", "-c", "-fPIC", "value.cc", "-o", "value.o"], cwd=folder, check=True)
    (folder / "libvalue.a").unlink(missing_ok=True)
    subprocess.run(["ar", "rcs", "libvalue.a", "value.o"], cwd=folder, check=True)
    return folder / "libvalue.a"


@pytest.mark.parametrize("named", ["by path", "by -L/-l"])
def test_4_a_static_library_in_the_link_flags_is_recorded(cache_dir, tmp_path, named):
    library = make_library(tmp_path / "lib", 10)
    ldflags = [str(library)] if named == "by path" else [f"-L{library.parent}", "-lvalue"]
    prelude = 'extern "C" long library_value();'
    spec = {
        "source_dir": str(value_source(tmp_path / "src", prelude, "library_value()")),
        "extra_ldflags": ldflags,
    }
    assert run_value(spec)[:2] == (10, True)
    make_library(tmp_path / "lib", 20)
    assert run_value(spec)[:2] == (20, True)
    assert run_value(spec)[:2] == (20, False)


def test_4_a_response_file_is_recorded(cache_dir, tmp_path):
    flags = tmp_path / "flags.rsp"
    flags.write_text("-DRSP_VALUE=5\n")
    spec = {
        "source_dir": str(value_source(tmp_path / "src", "", "RSP_VALUE")),
        "extra_cflags": [f"@{flags}"],
    }
    assert run_value(spec)[:2] == (5, True)
    flags.write_text("-DRSP_VALUE=6\n")
    assert run_value(spec)[:2] == (6, True)
    assert run_value(spec)[:2] == (6, False)


HAS_INCLUDE = """\
#if __has_include("extra.h")
#include "extra.h"
#else
#define EXTRA 0
#endif
"""


def test_4_a_header_that_appears_where_has_include_found_nothing_rebuilds(cache_dir, tmp_path):
    src = value_source(tmp_path / "src", HAS_INCLUDE, "EXTRA")
    spec = {"source_dir": str(src)}
    assert run_value(spec)[:2] == (0, True)
    assert run_value(spec)[:2] == (0, False)
    (src / "extra.h").write_text("#define EXTRA 7\n")
    assert run_value(spec)[:2] == (7, True)
    (src / "extra.h").unlink()
    assert run_value(spec)[:2] == (0, False)  # the first build again


# ------------------------------------------------------------------------------------------------
# 5. a compiler is known by what it says and what it is

WRAPPER_CXX = """\
#!/bin/sh
if [ "$1" = "--version" ]; then echo "wrapped c++ {}"; exit 0; fi
exec c++ "$@"
"""


def test_5_a_wrapper_whose_version_changes_at_the_same_size_and_mtime_rebuilds(cache_dir, tmp_path):
    """A wrapper rewritten in place to switch toolchains, its size and mtime kept (cp -p,
    rsync -a): what it says about itself decides, not its stat."""
    wrapper = tmp_path / "c++"
    script(wrapper, WRAPPER_CXX.format(1))
    spec = {"source_dir": str(value_source(tmp_path / "src", "", "3"))}
    env = {"CXX": str(wrapper)}
    assert run_value(spec, env)[:2] == (3, True)
    assert run_value(spec, env)[:2] == (3, False)
    before = wrapper.stat()
    script(wrapper, WRAPPER_CXX.format(2))
    os.utime(wrapper, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert wrapper.stat().st_size == before.st_size
    value, compiled, err = run_value(spec, env)
    assert (value, compiled) == (3, True), err
    assert "built by another c++ (wrapped c++ 1)" in err


CONFIGURED_CXX = """\
#!/bin/sh
# picks the real compiler from a config file, as a site's toolchain shim does
exec "$(cat "$CXX_CONFIG")" "$@"
"""
# The other "real compiler": another version, and what it builds differs.
OTHER_CXX = """\
#!/bin/sh
if [ "$1" = "--version" ]; then echo "other c++ 9.9"; exit 0; fi
exec c++ -DVALUE_FROM_OTHER_CXX=1 "$@"
"""


def test_5_a_wrapper_switched_by_its_config_rebuilds_though_its_file_is_unchanged(
    cache_dir, tmp_path
):
    """A shim whose file never changes (it reads the compiler to run from a config): switching
    the config is another compiler, asked each process, never the module the old one built."""
    shim, other = tmp_path / "c++", script(tmp_path / "other-c++", OTHER_CXX)
    script(shim, CONFIGURED_CXX)
    config = tmp_path / "compiler.conf"
    config.write_text(shutil.which("c++"))
    spec = {
        "source_dir": str(
            value_source(
                tmp_path / "src",
                "#ifndef VALUE_FROM_OTHER_CXX\n#define VALUE_FROM_OTHER_CXX 0\n#endif",
                "VALUE_FROM_OTHER_CXX",
            )
        )
    }
    env = {"CXX": str(shim), "CXX_CONFIG": str(config)}
    assert run_value(spec, env)[:2] == (0, True)
    stat = shim.stat()
    config.write_text(str(other))
    value, compiled, err = run_value(spec, env)
    assert (value, compiled) == (1, True), err
    assert shim.stat().st_mtime_ns == stat.st_mtime_ns
    config.write_text(shutil.which("c++"))
    assert run_value(spec, env)[:2] == (0, False)  # the first compiler's build again


SLOW_VERSION = """\
#!/bin/sh
if [ "$1" = "--version" ]; then sleep 1; echo "slow c++ {}"; exit 0; fi
exec c++ "$@"
"""


def test_5_compilers_are_asked_at_once_and_once_per_process(tmp_path):
    """A first load asks c++ and nvcc together (it pays for the slowest), and each once."""
    import time

    from sgljit import toolchain

    slow = [script(tmp_path / f"slow-{i}", SLOW_VERSION.format(i)) for i in (1, 2)]
    started = time.monotonic()
    toolchain.ask_identities(*slow)
    identities = [toolchain.compiler_identity(s) for s in slow]
    took = time.monotonic() - started
    assert [i.splitlines()[0] for i in identities] == ["slow c++ 1", "slow c++ 2"]
    assert took < 1.9, f"{took:.1f}s: asked one after the other"
    started = time.monotonic()
    assert toolchain.compiler_identity(slow[0]) == identities[0]
    assert time.monotonic() - started < 0.5  # known for the rest of the process


# ------------------------------------------------------------------------------------------------
# 6. nothing in the cache that is not a regular file is opened


def special_file(path: Path, kind: str) -> None:
    """Put a FIFO, or a link to /dev/zero, at ``path`` (replacing what is there)."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)


@pytest.mark.parametrize(
    ("place", "kind"),
    [
        ("toolchains.json", "fifo"),
        ("toolchains.json", "link to /dev/zero"),
        ("lock owner file", "fifo"),
        ("staging owner file", "fifo"),
        ("staging owner file", "link to /dev/zero"),
        ("artifact", "fifo"),
        ("artifact", "link to /dev/zero"),
        ("manifest", "fifo"),
        ("manifest", "link to /dev/zero"),
    ],
)
def test_6_special_files_in_the_cache_never_hang(prebuilt, cache_dir, place, kind):
    env = {"SGLJIT_HOST_ID": HOST}
    code = LOAD_IN_SUBPROCESS % (KERNELS, 0)
    variant = prebuilt_into(prebuilt, cache_dir)
    group = variant.parent
    target = {
        "toolchains.json": cache_dir / "toolchains.json",
        "lock owner file": group.parent / ".locks" / HOST / f"{group.name}.lock.owner",
        "staging owner file": group.parent / ".staging" / "another-build" / publish.OWNER,
        "artifact": variant / "add_one_fp32_t.so",
        "manifest": variant / cache.MANIFEST,
    }[place]
    if place in ("lock owner file", "staging owner file"):
        shutil.rmtree(variant)  # a miss: the next load builds, past the lock and staging
    special_file(target, kind)
    result = run_python(code, env, timeout=120)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr
    assert len(published(cache_dir)) == 1


# ------------------------------------------------------------------------------------------------
# 7, 10, 11. one validity rule, for lookups and `cache import`; whatever fails it is rebuilt over


def edit_manifest(variant: Path, edit) -> None:
    manifest = json.loads((variant / cache.MANIFEST).read_text())
    edit(manifest)
    (variant / cache.MANIFEST).write_text(json.dumps(manifest))


def test_7_a_manifest_field_of_the_wrong_type_is_rebuilt_over(prebuilt, cache_dir, monkeypatch):
    """A toolchain of null, 0 or a list: the lookup refuses the entry (as a compile-free lookup
    says), and a build replaces it."""
    variant = prebuilt_into(prebuilt, cache_dir)
    pristine = (variant / cache.MANIFEST).read_text()
    for toolchain in (None, 0, ["c++"]):
        (variant / cache.MANIFEST).write_text(pristine)
        edit_manifest(variant, lambda m, t=toolchain: m.update(toolchain=t))
        sgljit.clear_module_cache()
        monkeypatch.setenv("SGLJIT_NO_COMPILE", "1")
        with pytest.raises(sgljit.NoCompileError, match="toolchain"):
            load_add_one()
    monkeypatch.delenv("SGLJIT_NO_COMPILE")
    with pytest.warns(RuntimeWarning, match="toolchain.*rebuilding it"):
        load_add_one()
    [rebuilt] = published(cache_dir)  # the same build, so the same variant name
    assert cache.verify_entry(rebuilt) is None


def test_7_a_symlink_loop_in_a_module_folder_is_not_an_error(prebuilt, cache_dir):
    code = LOAD_IN_SUBPROCESS % (KERNELS, 0)
    variant = prebuilt_into(prebuilt, cache_dir)
    os.symlink("loop", variant.parent / "loop")
    result = run_python(code)
    assert result.returncode == 0 and "compiling" not in result.stderr, result.stderr


def test_7_a_file_named_trash_does_not_keep_a_corrupt_entry(prebuilt, cache_dir):
    code = LOAD_IN_SUBPROCESS % (KERNELS, 0)
    variant = prebuilt_into(prebuilt, cache_dir)
    so = variant / "add_one_fp32_t.so"
    data = bytearray(so.read_bytes())
    data[-8:] = b"\xff" * 8
    so.write_bytes(bytes(data))
    (cache_dir / ".trash").write_text("not a folder\n")
    healing = run_python(code)
    assert healing.returncode == 0 and "rebuilding it" in healing.stderr, healing.stderr
    # the warning alone: attributed to sgljit, not to a line of its source printed under it
    lines = healing.stderr.splitlines()
    [at] = [i for i, line in enumerate(lines) if "rebuilding it" in line]
    assert lines[at].startswith("sgljit:0: RuntimeWarning: sgljit: cached module"), lines[at]
    assert at + 1 == len(lines) or not lines[at + 1].startswith("  "), healing.stderr
    after = run_python(code)
    assert after.returncode == 0 and "compiling" not in after.stderr, after.stderr
    [fresh] = published(cache_dir)
    assert cache.verify_entry(fresh) is None


TAMPERED = {
    "fingerprint edited": lambda m: m["fingerprint"].append("cflags -DEVIL=1"),
    "fingerprint removed": lambda m: m.pop("fingerprint"),
    "files edited": lambda m: m["files"].update({"other.cc": "0" * 64}),
    "name edited": lambda m: m.update(name="other_module"),
    "arch edited": lambda m: m.update(arch="9.0a"),
    "artifact edited": lambda m: m.update(artifact="other.so"),
}


def test_11_a_lookup_refuses_what_cache_import_refuses(prebuilt, cache_dir, monkeypatch):
    """An entry verify_entry refuses (as `cache import` does) is never loaded by a lookup either,
    however right its binary (a compile-free lookup says why it cannot use it)."""
    variant = prebuilt_into(prebuilt, cache_dir)
    pristine = (variant / cache.MANIFEST).read_text()
    shutil.copy(variant / "add_one_fp32_t.so", variant / "other.so")
    monkeypatch.setenv("SGLJIT_NO_COMPILE", "1")
    for tamper, edit in TAMPERED.items():
        (variant / cache.MANIFEST).write_text(pristine)
        edit_manifest(variant, edit)
        assert cache.verify_entry(variant) is not None, tamper
        sgljit.clear_module_cache()
        with pytest.raises(sgljit.NoCompileError, match="none can be used"):
            load_add_one()


def test_10_verify_entry_names_a_field_of_the_wrong_type(prebuilt, cache_dir):
    variant = prebuilt_into(prebuilt, cache_dir)
    pristine = (variant / cache.MANIFEST).read_text()
    for field in ("name", "backend", "artifact"):
        for value in (None, 7, ["x"]):
            (variant / cache.MANIFEST).write_text(pristine)
            edit_manifest(variant, lambda m, f=field, v=value: m.update({f: v}))
            problem = cache.verify_entry(variant)
            assert problem is not None and field in problem, (field, value, problem)


def test_10_cache_import_rejects_a_malformed_manifest_and_imports_the_rest(prebuilt, tmp_path):
    variants = published(prebuilt)
    cache_dir = prebuilt
    manifest = json.loads((variants[0] / cache.MANIFEST).read_text())
    manifest["backend"] = ["cpu"]
    archive = tmp_path / "both.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for variant in variants:
            tar.add(variant, arcname=str(variant.relative_to(cache_dir)))
        info = tarfile.TarInfo(f"{variants[0].relative_to(cache_dir)}/{cache.MANIFEST}")
        data = json.dumps(manifest).encode()
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))  # replaces the first one's manifest on extraction
    fresh = tmp_path / "fresh"
    result = import_archive(archive, fresh)
    assert result.returncode == 1, result.stderr
    assert "REJECTED" in result.stderr and "backend" in result.stderr
    assert "Traceback" not in result.stderr
    assert "imported 1 modules" in result.stdout and len(published(fresh)) == 1


# ------------------------------------------------------------------------------------------------
# 8. a builder's staging folder survives builders in other PID namespaces

# A c++ whose compiles wait (after compiling) until $RELEASE exists, marking $STARTED first.
WAITING_CXX = """\
#!/bin/sh
c++ "$@"; rc=$?
case " $* " in *" -c "*)
  touch "$STARTED"
  i=0; while [ ! -e "$RELEASE" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done;;
esac
exit $rc
"""

# Above Linux's largest pid_max (2^22): no process has this PID here.
NO_SUCH_PID = 4_194_304 + 17


def pretend_foreign(owner: Path) -> None:
    """Rewrite a staging owner file as a builder in another PID namespace (another container on
    this host, with host networking) would have written it: its PID names no process here."""
    text = owner.read_text()
    try:
        record = json.loads(text)
    except ValueError:  # "<host>\n<pid>\n", as sgljit wrote owner files before owner records
        host, _pid = text.split()[:2]
        owner.write_text(f"{host}\n{NO_SUCH_PID}\n")
        return
    record.update(pid=NO_SUCH_PID, namespace="another boot pid:[4026531836]")
    owner.write_text(json.dumps(record))


@pytest.mark.slow
def test_8_another_namespace_does_not_remove_a_live_build(cache_dir, tmp_path):
    """Two containers share a cache and a host name but not a PID namespace: B must not take A's
    in-flight staging folder for a dead build's (its PID is nothing in B's namespace); the
    heartbeat says A is alive. A finishes and publishes."""
    started, release = tmp_path / "started", tmp_path / "release"
    env = {
        **os.environ,
        "SGLJIT_LOG": "info",
        "SGLJIT_HOST_ID": HOST,
        "CXX": script(tmp_path / "waiting-c++", WAITING_CXX),
        "STARTED": str(started),
        "RELEASE": str(release),
    }
    a = subprocess.Popen(
        [sys.executable, "-c", LOAD_IN_SUBPROCESS % (KERNELS, 0)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for("started", tmp_path)
        [owner] = cache_dir.glob(f"cpu/host/.staging/*/{publish.OWNER}")
        pretend_foreign(owner)
        b = run_python(
            "import torch, sgljit\n"
            "from tests.core.test_load_jit import load_add_one\n"
            "load_add_one(dtype=torch.float64)\nprint('B OK')",
            {"SGLJIT_HOST_ID": HOST},
        )
        assert b.returncode == 0 and "B OK" in b.stdout, b.stderr
        assert owner.parent.exists(), "B removed A's staging folder"
    finally:
        release.touch()
        out, err = a.communicate(timeout=300)
    assert a.returncode == 0 and "OK" in out, err
    assert len(published(cache_dir, "add_one_fp32_t")) == 1


# A c++ that removes the folder it compiles in after its first compile (what a cleanup that took
# the build for a dead one does).
REMOVING_CXX = """\
#!/bin/sh
c++ "$@"; rc=$?
case " $* " in *" -c "*)
  if [ ! -e "$EDIT_MARK" ]; then touch "$EDIT_MARK"; rm -rf "$PWD"; fi;;
esac
exit $rc
"""


def test_8_a_build_whose_staging_folder_is_removed_builds_again(cache_dir, tmp_path):
    """The victim of such a removal gets no CompileError about files it could not write: it
    builds again, and publishes."""
    env = {
        "CXX": script(tmp_path / "removing-c++", REMOVING_CXX),
        "EDIT_MARK": str(tmp_path / "mark"),
    }
    result = run_python(LOAD_IN_SUBPROCESS % (KERNELS, 0), env)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr
    assert "removed by another process" in result.stderr
    assert len(published(cache_dir)) == 1


# ------------------------------------------------------------------------------------------------
# 9. a miss on a read-only cache says so and what to do


def test_9_a_miss_on_a_read_only_cache_says_it_is_read_only(prebuilt, cache_dir):
    """A cache prebuilt on this host (its lock folder exists), then mounted read-only: a module
    not in it is an sgljit error saying the cache is read-only and what to do, not a raw OSError
    from the lock."""
    env = {"SGLJIT_HOST_ID": HOST}
    prebuilt_into(prebuilt, cache_dir)
    other = "import torch\nfrom tests.core.test_load_jit import load_add_one\n"
    other += "load_add_one(dtype=torch.float64)"
    with read_only(cache_dir):
        result = run_python(other, env)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("sgljit.errors.CacheError"), result.stderr
    assert "read-only" in last and "sgljit build" in last and "SGLJIT_CACHE_DIR" in last

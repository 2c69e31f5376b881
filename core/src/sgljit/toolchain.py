"""Where the compilers are, what they are, and which GPU architecture to build for.

A compiler's identity is what it says it is (``--version``), asked once per process: a wrapper
script that picks the real compiler from a config file or a variable changes what it does without
changing its own file, so nothing about the file can stand for the answer. Facts derived from a
compiler that cost more to ask (its system include folders, CUDA's root) are memoized on disk
(``<cache>/toolchains.json``) under that identity, and the sha256 of its file under the file's
stat.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from .errors import SgljitError
from .store import ABSENT, cache_root, read_depfile, read_regular, write_atomic

__all__ = [
    "compiler_environment",
    "compiler_identity",
    "cuda_arch_list",
    "cuda_home",
    "dependency_scan",
    "find_ninja",
    "find_nvcc",
    "flag_files",
    "host_cxx",
    "include_folders",
    "outside",
    "system_include_dirs",
]


def _identity_memo_path() -> Path:
    return cache_root() / "toolchains.json"


def _file_sha256(path: str) -> str:
    """sha256 of an executable's file, memoized on disk under its path, size, mtime, ctime (which
    no copy tool can set back) and inode: a fact about the file alone (hashing a compiler's
    megabytes each process would cost more than asking it its version)."""
    st = os.stat(path)
    token = f"sha256:{path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
    known = _memo_get(token)
    if known is None:
        known = hashlib.sha256(read_regular(path, follow=True)).hexdigest()
        _memo_put(token, known)
    return known


# Per process: (executable, version args) -> its identity, and the questions asked but not yet
# collected (the child answering, and the path it was found at).
_identities: dict[tuple[str, ...], str] = {}
_asked: dict[tuple[str, ...], tuple[subprocess.Popen, str]] = {}
_identity_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child asks again: the questions in flight are its parent's children."""
    global _identity_lock
    _identity_lock = threading.Lock()
    _asked.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def ask_identities(*executables: str) -> None:
    """Start asking each compiler its ``--version`` now, all at once, for
    :func:`compiler_identity` to collect: a first load pays for the slowest, not for each, and the
    answers come while the caller does other work (imports)."""
    with _identity_lock:
        for executable in executables:
            _ask((executable,))


def _ask(key: tuple[str, ...]) -> None:
    if key in _identities or key in _asked:
        return
    found = shutil.which(key[0])
    if found is None:
        _identities[key] = ABSENT
        return
    # Run as found on PATH: a multi-call binary (ccache's links) answers by the name it is run as.
    command = [found, *(key[1:] or ("--version",))]
    try:
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
    except OSError as err:  # not executable: an identity all the same (a build then says why)
        _identities[key] = f"{found}: {err}"
        return
    _asked[key] = (child, found)


def compiler_identity(executable: str, *version_args: str) -> str:
    """The compiler's own description of itself (``<exe> --version``) and the sha256 of the file
    it resolves to, asked once per process; :data:`ABSENT` when it is not installed.

    >>> "g++" in compiler_identity(host_cxx()) or "clang" in compiler_identity(host_cxx())
    True
    """
    key = (executable, *version_args)
    known = _identities.get(key)
    if known is not None:
        return known
    with _identity_lock:
        _ask(key)
        if key in _asked:
            child, found = _asked.pop(key)
            out, err = child.communicate()
            real = os.path.realpath(found)
            _identities[key] = (out + err).strip() + f"\n(sha256 of {real}: {_file_sha256(real)})"
        return _identities[key]


def _identity_token(kind: str, executable: str, real: str) -> str:
    """The on-disk memo's key of a fact about a compiler: its path and its identity."""
    digest = hashlib.sha256(compiler_identity(executable).encode()).hexdigest()
    return f"{kind}:{real}:{digest}"


# The on-disk memo as this process last read it (read once: a warm load asks it several times).
_memo_seen: dict | None = None


def _memo_get(token: str) -> str | None:
    """A value of the on-disk memo of toolchain facts (``<cache>/toolchains.json``)."""
    global _memo_seen
    if _memo_seen is None:
        _memo_seen = _memo_read()
    value = _memo_seen.get(token)
    return value if isinstance(value, str) else None


def _memo_read() -> dict:
    try:
        memo = json.loads(read_regular(_identity_memo_path()))
    except (OSError, ValueError):  # missing, not a regular file (never opened), unreadable
        return {}
    return memo if isinstance(memo, dict) else {}


def _memo_put(token: str, value: str) -> None:
    """Record a toolchain fact; a read-only cache only means asking the compiler again."""
    global _memo_seen
    memo = _memo_read()
    memo[token] = value
    _memo_seen = memo
    memo_path = _identity_memo_path()
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(memo_path, json.dumps(memo, indent=1).encode())
    except OSError:
        pass  # a read-only cache still works, it only re-asks the compiler next time


# Variables the compilers read: they change what a build includes, so they are part of its key.
COMPILER_ENV = (
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "NVCC_CCBIN",
)


def compiler_environment() -> tuple[str, ...]:
    """``NAME=value`` for each set variable of :data:`COMPILER_ENV`."""
    return tuple(f"{k}={os.environ[k]}" for k in COMPILER_ENV if os.environ.get(k))


@functools.cache
def system_include_dirs(executable: str) -> tuple[str, ...]:
    """The compiler's own include folders (``<exe> -E -v``), memoized on disk under its identity. Headers there belong
    to the toolchain: its identity, not their contents, is what the cache records."""
    found = shutil.which(executable)
    if found is None:
        return ()
    real = os.path.realpath(found)
    token = _identity_token("system_include_dirs", executable, real)
    known = _memo_get(token)
    if known is not None:
        return tuple(known.split("\n")) if known else ()
    env = {k: v for k, v in os.environ.items() if k not in COMPILER_ENV}
    out = subprocess.run(
        [real, "-E", "-v", "-x", "c++", os.devnull], capture_output=True, text=True, env=env
    )
    text = out.stdout + out.stderr
    start, end = "#include <...> search starts here:", "End of search list."
    dirs: list[str] = []
    if start in text:
        for line in text.split(start, 1)[1].split(end, 1)[0].splitlines():
            line = line.strip().removesuffix(" (framework directory)")
            if line:
                dirs.append(os.path.normpath(line))
    _memo_put(token, "\n".join(dirs))
    return tuple(dirs)


def outside(
    paths: Iterable[str], folders: Iterable[str | os.PathLike], keep: Iterable[str] = ()
) -> list[str]:
    """The paths not under any of ``folders`` (a dependency list without the toolchain's headers);
    a path under one of ``keep`` (a folder the build names itself, such as an ``-I`` folder below a
    system folder) always stays.

    >>> outside(["/usr/include/stdio.h", "/src/k.h"], ["/usr/include"])
    ['/src/k.h']
    >>> outside(["/usr/local/include/x/x.h"], ["/usr/local/include"], keep=["/usr/local/include/x"])
    ['/usr/local/include/x/x.h']
    """
    prefixes = tuple(str(f).rstrip("/") + "/" for f in folders)
    kept = tuple(str(f).rstrip("/") + "/" for f in keep)
    found = []
    for p in paths:
        norm = os.path.normpath(p)
        if not norm.startswith(prefixes) or (kept and norm.startswith(kept)):
            found.append(p)
    return found


def options(flags: Iterable[str], names: Sequence[str]) -> list[tuple[str, str]]:
    """(option, value) of each option of ``names`` in ``flags``, given as one word (``-Idir``) or
    two (``-I dir``); longer names first where one is a prefix of another.

    >>> options(["-I", "/a", "-isystem/b", "-O3", "-DX=1"], ["-I", "-isystem", "-D"])
    [('-I', '/a'), ('-isystem', '/b'), ('-D', 'X=1')]
    """
    ordered = sorted(names, key=len, reverse=True)
    found, words = [], iter(flags)
    for word in words:
        name = next((n for n in ordered if word.startswith(n)), None)
        if name is not None:
            found.append((name, word[len(name) :] or next(words, "")))
    return found


# Options that name header folders; and the variables whose folders the compilers also search.
INCLUDE_FOLDER_OPTIONS = ("-I", "-isystem", "-iquote", "-idirafter")
_INCLUDE_PATH_VARIABLES = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH")
# Response files within response files are followed this deep (one naming itself stops here).
_MAX_RESPONSE_DEPTH = 8


def expand_response_files(flags: Iterable[str], found: list[str] | None = None) -> list[str]:
    """``flags`` with each ``@file`` (an absolute path: builds run in their own folder) replaced by
    the words it holds, as the compilers read it, nested ones too; the files read are appended to
    ``found``. One that cannot be read stays as it is."""

    def expand(words: Iterable[str], depth: int) -> list[str]:
        out: list[str] = []
        for word in words:
            path = word[1:]
            if not (word.startswith("@") and os.path.isabs(path) and depth):
                out.append(word)
                continue
            try:
                inner = shlex.split(read_regular(path, follow=True).decode())
            except (OSError, ValueError):
                out.append(word)
                continue
            if found is not None:
                found.append(os.path.normpath(path))
            out += expand(inner, depth - 1)
        return out

    return expand(flags, _MAX_RESPONSE_DEPTH)


def include_folders(flags: Iterable[str]) -> list[str]:
    """The header folders a build names itself: those of ``flags`` (``-I``, ``-isystem``, ``-iquote``,
    ``-idirafter``; response files expanded), then ``CPATH`` and ``C(PLUS)_INCLUDE_PATH``'s. Their
    headers are the build's own, also where such a folder lies below a compiler's system folder.

    >>> include_folders(["-I", "/a", "-isystem/b", "-O3"])[:2]
    ['/a', '/b']
    """
    words = expand_response_files(flags)
    found = [os.path.abspath(v) for _, v in options(words, INCLUDE_FOLDER_OPTIONS) if v]
    for variable in _INCLUDE_PATH_VARIABLES:
        found += [os.path.abspath(p) for p in os.environ.get(variable, "").split(os.pathsep) if p]
    return list(dict.fromkeys(found))


def flag_files(flags: Iterable[str]) -> list[str]:
    """The files ``flags`` make a build read besides its sources and headers: response files
    (``@file``), files named by absolute path (static libraries, objects, linker scripts,
    ``-include`` headers), and each ``-l<name>`` (``-l:<file>``) found in a ``-L`` folder the flags
    give (the toolchain's own library folders belong to its identity).

    >>> flag_files(["-O3", "-lm"])
    []
    """
    found: list[str] = []
    words = expand_response_files(flags, found)
    found += [w for w in words if os.path.isabs(w) and os.path.isfile(w)]
    lib_dirs = [v for _, v in options(words, ["-L"]) if v]
    for _, name in options(words, ["-l"]):
        names = [name[1:]] if name.startswith(":") else [f"lib{name}.so", f"lib{name}.a"]
        for folder in lib_dirs:
            hits = [
                os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))
            ]
            if hits:
                found += hits
                break
    return list(dict.fromkeys(os.path.abspath(f) for f in found))


def dependency_scan(command: list[str], folder: Path) -> list[str]:
    """The files a preprocessor run as ``command`` (ending in ``-M -MF scan.d``) in ``folder``
    lists, or none when it fails: the compile then reports the error, or reads files no scan
    listed and is built again (see :class:`sgljit.cache.BuildSpec`)."""
    depfile = folder / "scan.d"
    try:
        result = subprocess.run(command, cwd=folder, capture_output=True, text=True)
        return read_depfile(depfile.read_text()) if result.returncode == 0 else []
    except OSError:
        return []
    finally:
        depfile.unlink(missing_ok=True)


def host_cxx() -> str:
    """The host C++ compiler tvm-ffi will use (``$CXX`` or ``c++``)."""
    return os.environ.get("CXX", "c++")


# ninja before 1.13 splits a depfile's paths at quotes and ampersands, so headers under such a
# folder would drop out of a module's dependencies and their edits would not rebuild it.
MIN_NINJA = (1, 13)


@functools.cache
def find_ninja() -> str:
    """The ninja that builds CUDA modules and reads back their dependencies: the ``ninja``
    package's (a dependency of sgljit, so its version is known), else the one on PATH. One older
    than :data:`MIN_NINJA` is refused with the fix in the message.

    >>> os.path.basename(find_ninja())
    'ninja'
    """
    try:
        import ninja

        found = shutil.which("ninja", path=ninja.BIN_DIR)
    except (ImportError, AttributeError):
        found = None
    found = found or shutil.which("ninja")
    need = ".".join(map(str, MIN_NINJA))
    if found is None:
        raise SgljitError(
            f"sgljit: no ninja found to build CUDA modules; pip install 'ninja>={need}'"
        )
    identity = compiler_identity(found).splitlines()[0]
    version = tuple(int(n) for n in re.findall(r"\d+", identity)[:2])
    if version < MIN_NINJA:
        raise SgljitError(
            f"sgljit: {found} is ninja {identity}; CUDA modules need ninja>={need} (older ones "
            f"lose dependency paths that contain quotes); pip install 'ninja>={need}'"
        )
    return found


def find_nvcc() -> str | None:
    """Path of the real ``nvcc`` (under ``$CUDA_HOME`` when set, else on PATH)."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and Path(home, "bin", "nvcc").exists():
        return str(Path(home, "bin", "nvcc"))
    return shutil.which("nvcc")


@functools.lru_cache(maxsize=1)
def cuda_home() -> str:
    """The CUDA toolkit root, derived from the real nvcc when ``CUDA_HOME`` is unset.

    The ``nvcc`` on PATH can be a wrapper script in another folder; tvm-ffi would then guess the
    toolkit root from the wrapper's folder and fail to link cudart. ``nvcc --dryrun`` prints the
    real root as ``TOP=...``.
    """
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return home
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SgljitError("nvcc not found: install the CUDA toolkit or set CUDA_HOME")
    token = _identity_token("cuda_home", nvcc, os.path.realpath(nvcc))
    known = _memo_get(token)
    if known is not None and Path(known, "bin", "nvcc").exists():
        return known
    out = subprocess.run(
        [nvcc, "--dryrun", "-v", "-x", "cu", os.devnull], capture_output=True, text=True
    )
    match = re.search(r"^#\$ TOP=(.+)$", out.stdout + out.stderr, re.MULTILINE)
    home = str(Path(match.group(1).strip()).resolve()) if match else str(Path(nvcc).parent.parent)
    _memo_put(token, home)
    return home


def _arch_of_capability(major: int, minor: int) -> str:
    # Architecture-specific features (wgmma, tcgen05, setmaxnreg) need the "a" targets.
    if (major, minor) in {(9, 0), (10, 0), (10, 3), (12, 0), (12, 1)}:
        return f"{major}.{minor}a"
    return f"{major}.{minor}"


def cuda_arch_list() -> tuple[str, ...]:
    """Target architectures: ``$SGLJIT_CUDA_ARCH`` (space separated), else the current GPU's.

    Never asks nvidia-smi (it fails without a GPU and is known to misreport).
    """
    override = os.environ.get("SGLJIT_CUDA_ARCH", "").split()
    if override:
        for arch in override:
            if not re.fullmatch(r"\d+\.\d+a?", arch):
                raise SgljitError(
                    f"SGLJIT_CUDA_ARCH: {arch!r} is not an architecture like '9.0a' or '8.6'"
                )
        return tuple(override)
    import torch

    if not torch.cuda.is_available():
        raise SgljitError(
            "no CUDA GPU visible and SGLJIT_CUDA_ARCH is unset: set SGLJIT_CUDA_ARCH (e.g. '9.0a') "
            "to build CUDA kernels on a machine without a GPU"
        )
    return (_arch_of_capability(*torch.cuda.get_device_capability()),)


def short_hash(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]

"""Where the compilers are, what they are, and which GPU architecture to build for.

Everything here runs on the warm path of a fresh process, so nothing spawns a process when it can
avoid it: a compiler's identity is memoized on disk, keyed by the binary's path, size and mtime.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from .errors import SgljitError

__all__ = [
    "compiler_environment",
    "compiler_identity",
    "cuda_arch_list",
    "cuda_home",
    "find_ninja",
    "find_nvcc",
    "host_cxx",
    "outside",
    "system_include_dirs",
]


def _identity_memo_path() -> Path:
    from .cache import cache_root

    return cache_root() / "toolchains.json"


def _stat_token(path: str) -> str:
    st = os.stat(path)
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


# A compiler that is not installed, e.g. in a production image that only runs prebuilt kernels.
ABSENT = "absent"


@functools.cache
def compiler_identity(executable: str, *version_args: str) -> str:
    """The compiler's own description of itself (``<exe> --version``), memoized on disk;
    :data:`ABSENT` when it is not installed.

    >>> "g++" in compiler_identity(host_cxx()) or "clang" in compiler_identity(host_cxx())
    True
    """
    found = shutil.which(executable)
    if found is None:
        return ABSENT
    real = os.path.realpath(found)
    args = version_args or ("--version",)
    token = _stat_token(real) + ":" + " ".join(args)
    known = _memo_get(token)
    if known is not None:
        return known
    out = subprocess.run([real, *args], capture_output=True, text=True, check=False)
    identity = (out.stdout + out.stderr).strip()
    _memo_put(token, identity)
    return identity


def _memo_get(token: str) -> str | None:
    """A value of the on-disk memo of toolchain facts (``<cache>/toolchains.json``)."""
    try:
        return json.loads(_identity_memo_path().read_text()).get(token)
    except (OSError, ValueError):
        return None


def _memo_put(token: str, value: str) -> None:
    """Record a toolchain fact; a read-only cache only means asking the compiler again."""
    memo_path = _identity_memo_path()
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    memo[token] = value
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(memo, indent=1))
        os.replace(tmp, memo_path)
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
    """The compiler's own include folders (``<exe> -E -v``), memoized on disk. Headers there belong
    to the toolchain: its identity, not their contents, is what the cache records."""
    found = shutil.which(executable)
    if found is None:
        return ()
    real = os.path.realpath(found)
    token = "system_include_dirs:" + _stat_token(real)
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


def outside(paths: Iterable[str], folders: Iterable[str | os.PathLike]) -> list[str]:
    """The paths not under any of ``folders`` (a dependency list without the toolchain's headers).

    >>> outside(["/usr/include/stdio.h", "/src/k.h"], ["/usr/include"])
    ['/src/k.h']
    """
    prefixes = [str(f).rstrip("/") + "/" for f in folders]
    return [p for p in paths if not os.path.normpath(p).startswith(tuple(prefixes))]


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
    identity = compiler_identity(found)
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
    token = "cuda_home:" + _stat_token(os.path.realpath(nvcc))
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

"""The module cache: one backend-neutral path from a build spec to a loaded module.

    key → in-process memo → published folder → file lock → re-check → build in a private staging
    folder → check it loads → publish by atomic rename

Layout: ``$SGLJIT_CACHE_DIR`` (default ``~/.cache/sgljit``) ``/<backend>/<arch>/<name>-<key>/``.
The key covers everything that changes the binary: generated sources, the *contents* of every file
in the include trees, flags, the compilers' identities, versions and target architectures. A
published folder is never modified in place, so a running process never sees a half-written file,
and a module that fails to load is moved aside and rebuilt. CUDA and SYCL both come through here.

Example (a spec is usually made by :func:`sgljit.load_jit` or :func:`sgljit.load_jit_sycl`)::

    spec = BuildSpec(backend="cpu", arch="host", name="demo", artifact="demo.so",
                     files={"demo.cc": src}, build=compile_into, load=tvm_ffi.load_module)
    module = get_or_build(spec)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import CompileError, NoCompileError

if TYPE_CHECKING:
    from filelock import FileLock

__all__ = [
    "BuildSpec",
    "cache_key",
    "cache_root",
    "clear_module_cache",
    "get_or_build",
    "published_dir",
]

logger = logging.getLogger("sgljit")

# Files whose contents can change a build; anything else in an include tree (READMEs) is ignored.
SOURCE_SUFFIXES = frozenset(
    {
        ".h",
        ".hh",
        ".hpp",
        ".hxx",
        ".cuh",
        ".cu",
        ".c",
        ".cc",
        ".cpp",
        ".cxx",
        ".inc",
        ".inl",
        ".def",
    }
)
MANIFEST = "sgljit-manifest.json"
# Fingerprint entries that start with this name a compiler ("toolchain: nvcc <--version text>").
TOOLCHAIN = "toolchain: "


@dataclasses.dataclass(frozen=True, eq=False)
class BuildSpec:
    """What to build. *How* is the ``build`` callable; *where* is decided by this module.

    Attributes:
        backend: folder under the cache root ("cuda", "cpu", "sycl", ...).
        arch: folder under the backend ("9.0a", "host", ...).
        name: module name, safe as a file name.
        artifact: the file ``build`` produces inside the folder it is given.
        files: generated files (name → text) written into the build folder before ``build`` runs.
        inputs: files and folders whose contents are hashed into the key (sources, include trees).
        fingerprint: flags, compiler identities, versions: anything else that changes the binary.
            Compiler identities start with :data:`TOOLCHAIN`; where a compiler is not installed
            (a production image running prebuilt kernels) any build of the same sources, flags and
            versions is accepted, whichever compiler made it.
        build: compiles inside the given folder; raises :class:`sgljit.CompileError`.
        load: loads the artifact at the given path; raises on a bad binary.
    """

    backend: str
    arch: str
    name: str
    artifact: str
    build: Callable[[Path], None]
    load: Callable[[Path], Any]
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    inputs: tuple[Path, ...] = ()
    fingerprint: tuple[str, ...] = ()


def host_id() -> str:
    """This host's name in lock and staging paths (``$SGLJIT_HOST_ID`` overrides the host name)."""
    return os.environ.get("SGLJIT_HOST_ID") or socket.gethostname()


def cache_root() -> Path:
    """The cache folder: ``$SGLJIT_CACHE_DIR``, else ``~/.cache/sgljit``."""
    return Path(os.environ.get("SGLJIT_CACHE_DIR") or Path.home() / ".cache" / "sgljit")


def _hash_tree(h: hashlib._Hash, path: Path) -> None:
    if path.is_file():
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return
    if not path.is_dir():
        raise FileNotFoundError(f"build input not found: {path}")
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        for name in sorted(files):
            if os.path.splitext(name)[1] in SOURCE_SUFFIXES:
                file = Path(root, name)
                rel = file.relative_to(path).as_posix()
                h.update(rel.encode() + b"\0" + file.read_bytes() + b"\0")


def cache_key(spec: BuildSpec) -> str:
    """Content hash of everything that goes into the binary (paths of inputs are not part of it,
    so a cache built in one installation is valid in another with the same sources)."""
    return _keys(spec)[1]


def _keys(spec: BuildSpec) -> tuple[str, str]:
    """(source key: everything but the compilers, full key: everything)."""
    h = hashlib.sha256()
    for part in (spec.backend, spec.arch, spec.name, spec.artifact, __version__):
        h.update(part.encode() + b"\0")
    for part in spec.fingerprint:
        if not part.startswith(TOOLCHAIN):
            h.update(part.encode() + b"\0")
    for name in sorted(spec.files):
        h.update(name.encode() + b"\0" + spec.files[name].encode() + b"\0")
    for path in spec.inputs:
        _hash_tree(h, Path(path))
    source_key = h.hexdigest()[:20]
    for part in spec.fingerprint:
        if part.startswith(TOOLCHAIN):
            h.update(part.encode() + b"\0")
    return source_key, h.hexdigest()[:20]


def _without_compiler(spec: BuildSpec) -> bool:
    return any(p.startswith(TOOLCHAIN) and p.endswith(" absent") for p in spec.fingerprint)


def _any_build_of_sources(spec: BuildSpec, source_key: str) -> Path | None:
    """A published build of the same sources by whatever compiler (used when none is installed)."""
    for manifest in sorted(
        (cache_root() / spec.backend / spec.arch).glob(f"{spec.name}-*/{MANIFEST}")
    ):
        try:
            if json.loads(manifest.read_text()).get("source_key") == source_key:
                return manifest.parent
        except (OSError, ValueError):
            continue
    return None


def published_dir(spec: BuildSpec, key: str | None = None) -> Path:
    return cache_root() / spec.backend / spec.arch / f"{spec.name}-{key or cache_key(spec)}"


_memo: dict[str, Any] = {}
_memo_locks: dict[str, threading.Lock] = {}
_memo_guard = threading.Lock()


def clear_module_cache() -> None:
    """Forget every module loaded in this process (the files on disk stay; loaded code stays mapped)."""
    from .jit_utils import clear_cache_once

    with _memo_guard:
        _memo.clear()
    clear_cache_once()


def get_or_build(spec: BuildSpec) -> Any:
    """Return the loaded module for ``spec``, building and publishing it on a miss."""
    source_key, key = _keys(spec)
    memo_key = f"{spec.backend}/{spec.arch}/{spec.name}-{key}"
    try:
        return _memo[memo_key]
    except KeyError:
        pass
    with _memo_guard:
        lock = _memo_locks.setdefault(memo_key, threading.Lock())
    with lock:
        if memo_key not in _memo:
            _memo[memo_key] = _load_or_build(spec, key, source_key)
        return _memo[memo_key]


def _check_artifact(folder: Path, artifact: Path) -> None:
    """Refuse a binary whose size differs from what was published: dlopen of a truncated shared
    object can crash the process (SIGBUS) instead of failing."""
    try:
        expected = json.loads((folder / MANIFEST).read_text())["artifact_bytes"]
    except (OSError, ValueError, KeyError) as err:
        raise RuntimeError(f"no readable {MANIFEST} beside it") from err
    actual = artifact.stat().st_size
    if actual != expected:
        raise RuntimeError(f"{artifact.name} has {actual} bytes, {expected} were published")


def _try_load(spec: BuildSpec, folder: Path) -> tuple[Any, Exception | None]:
    artifact = folder / spec.artifact
    if not artifact.exists():
        return None, None
    try:
        _check_artifact(folder, artifact)
        return spec.load(artifact), None
    except Exception as err:  # a truncated or foreign binary: rebuilt below
        return None, err


def _load_or_build(spec: BuildSpec, key: str, source_key: str) -> Any:
    final = published_dir(spec, key)
    module, _ = _try_load(spec, final)  # warm path: no lock, no compiler
    if module is not None:
        return module
    if _without_compiler(spec):
        other = _any_build_of_sources(spec, source_key)
        if other is not None:
            module, _ = _try_load(spec, other)
            if module is not None:
                return module
    if os.environ.get("SGLJIT_NO_COMPILE", "") not in ("", "0"):
        raise NoCompileError(
            f"module {spec.name!r} (key {key}, {spec.backend} {spec.arch}) is not in the cache "
            f"{cache_root()} and SGLJIT_NO_COMPILE is set. Build it beforehand with "
            f"`sgljit build --backend {spec.backend.split('-')[0]}"
            + (f' --arch "{spec.arch.replace("_", " ")}"' if spec.backend == "cuda" else "")
            + "` (or unset SGLJIT_NO_COMPILE)."
        )
    # Locks serialize builds within a host only: file locks are unreliable across NFS clients, and a
    # dead host's lock must not block the others. Across hosts the atomic rename decides.
    lock_path = final.parent / ".locks" / host_id() / f"{final.name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock  # only on a miss: importing it costs more than a warm load

    with _acquire(FileLock(str(lock_path)), final, spec):
        module, err = _try_load(spec, final)
        if module is not None:
            return module  # another process published it while we waited
        if err is not None:
            warnings.warn(
                f"sgljit: cached module {final} failed to load ({err}); rebuilding it",
                RuntimeWarning,
                stacklevel=4,
            )
            _discard(final)
        return _build_and_publish(spec, key, source_key, final)


class _acquire:
    """Hold the file lock, but give up waiting as soon as another host has published the module:
    a lock left by a dead host on a shared file system must not block forever."""

    def __init__(self, lock: FileLock, final: Path, spec: BuildSpec):
        self.lock, self.final, self.spec = lock, final, spec

    def __enter__(self) -> None:
        from filelock import Timeout

        waited_since = time.monotonic()
        stale_after = float(os.environ.get("SGLJIT_LOCK_TIMEOUT", "600"))
        while True:
            try:
                self.lock.acquire(timeout=0.5)
                return
            except Timeout:
                if (self.final / self.spec.artifact).exists():
                    return  # published meanwhile: the re-check under "lock" will load it
                if time.monotonic() - waited_since > stale_after:
                    logger.warning(
                        "sgljit: lock %s held for %.0fs; building anyway",
                        self.lock.lock_file,
                        stale_after,
                    )
                    return

    def __exit__(self, *exc: object) -> None:
        if self.lock.is_locked:
            self.lock.release()


def _discard(folder: Path) -> None:
    """Move a folder out of the way first (atomic), then delete it: readers never see it half gone."""
    trash = cache_root() / ".trash" / f"{folder.name}-{uuid.uuid4().hex[:8]}"
    trash.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _build_and_publish(spec: BuildSpec, key: str, source_key: str, final: Path) -> Any:
    staging = (
        final.parent / ".staging" / f"{final.name}.{host_id()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    )
    staging.mkdir(parents=True)
    for name, text in spec.files.items():
        (staging / name).write_text(text)
    started = time.perf_counter()
    logger.info("sgljit: compiling %s for %s %s ...", spec.name, spec.backend, spec.arch)
    try:
        spec.build(staging)
        module = spec.load(staging / spec.artifact)
    except CompileError as err:
        raise _keep_failed(err, staging, final) from None
    except Exception as err:
        failed = _move_to_failed(staging, final)
        raise CompileError(
            f"built module {spec.name!r} could not be loaded: {err}", source_path=str(failed)
        ) from err
    (staging / MANIFEST).write_text(
        json.dumps(
            {
                "name": spec.name,
                "key": key,
                "source_key": source_key,
                "backend": spec.backend,
                "arch": spec.arch,
                "artifact": spec.artifact,
                "artifact_bytes": (staging / spec.artifact).stat().st_size,
                "artifact_sha256": hashlib.sha256(
                    (staging / spec.artifact).read_bytes()
                ).hexdigest(),
                "sgljit": __version__,
                "fingerprint": list(spec.fingerprint),
                "built_on": host_id(),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "seconds": round(time.perf_counter() - started, 3),
            },
            indent=1,
        )
    )
    try:
        os.rename(staging, final)  # atomic publish; fails if another writer got there first
    except OSError:
        if not (final / spec.artifact).exists():
            raise
        # First writer wins: ours is identical by key; keep using the copy we loaded, drop the folder.
        shutil.rmtree(staging, ignore_errors=True)
    logger.info(
        "sgljit: compiled %s for %s %s in %.1fs",
        spec.name,
        spec.backend,
        spec.arch,
        time.perf_counter() - started,
    )
    return module


def _move_to_failed(staging: Path, final: Path) -> Path:
    failed = cache_root() / "failed" / final.name
    if failed.exists():
        shutil.rmtree(failed, ignore_errors=True)
    failed.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(staging, failed)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return staging
    return failed


def _keep_failed(err: CompileError, staging: Path, final: Path) -> CompileError:
    """Nothing broken is cached: the staging folder moves to ``failed/`` for inspection."""
    failed = _move_to_failed(staging, final)

    def fix(text: str) -> str:
        return text.replace(str(staging), str(failed))

    return CompileError(
        fix(err.message),
        command=fix(err.command),
        source_path=fix(err.source_path),
        output=fix(err.output),
    )

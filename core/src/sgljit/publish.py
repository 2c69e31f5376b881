"""The miss path of the module cache: lock, build in a private staging folder, trust, publish.

    host lock (its holder named in an owner file) → re-check → staging folder (owner file and
    heartbeat) → inputs listed and hashed → build → inputs hashed again → load → manifest →
    atomic rename

:mod:`sgljit.cache` imports this module on a miss only, so a warm load never pays for it; it
imports :mod:`sgljit.store`, never :mod:`sgljit.cache`.

* **Known before trusted**: the files a spec's ``scan`` lists (and the files its flags name) are
  hashed before the build, and everything the build read after it; a file read that was not hashed
  before, or whose contents differ, means the binary cannot vouch for the hashes, and it is built
  again (content decides, never mtimes). Each ``__has_include`` probe in those files records the
  probed name in the probing file's folder and the build's own header folders, found or not.
* **Owners**: the lock and each staging folder carry an owner file (host, PID namespace, PID, a
  token) that the builder touches every :data:`HEARTBEAT_S`. A staging folder is a dead build's
  when its owner ran in this PID namespace under a PID that is gone, or has not been heard from
  for :data:`STALE_AFTER_S` by the file system's clock; a build whose folder was taken anyway
  builds again.
* Where the cache keeps a folder, anything else (a file, a FIFO, a looping link) is replaced; an
  entry that fails the validity rule is moved aside and rebuilt over.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import math
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import CacheError, CompileError
from .store import (
    MANIFEST,
    MANIFEST_FORMAT,
    READ_ONLY,
    BuildSpec,
    Found,
    cache_error,
    cache_root,
    find_usable,
    host_id,
    lock_timeout,
    portable_path,
    read_input,
    read_regular,
    sha256,
    split_fingerprint,
    variant_name,
    verify_entry,
    why_unusable,
    write_atomic,
)
from .toolchain import outside

if TYPE_CHECKING:
    from filelock import FileLock

__all__ = ["build_missing", "clear_stale", "remove_staging_of"]

logger = logging.getLogger("sgljit")
# The line a compile prints even when SGLJIT_LOG is unset (sgljit's __init__ gives it a handler):
# a first use may compile for seconds.
compile_logger = logging.getLogger("sgljit.compile")

OWNER = ".sgljit-owner"  # in a staging folder: who builds there (see _owner_record)
# A waiter reports who holds the build lock after this long.
REPORT_WAIT_AFTER_S = 10.0
# A build touches its owner files this often (its heartbeat) ...
HEARTBEAT_S = 10.0
# ... and one not touched for this long is dead: well above NFS attribute caching (60 s by
# default) and a busy host's scheduling, and a short wait for the next build.
STALE_AFTER_S = 300.0
# Characters ninja and the shell take unquoted in a path; other staging paths build elsewhere.
_SAFE_PATH = re.compile(r"[A-Za-z0-9_./+=,@%-]+")


# --------------------------------------------------------------------------------------------
# The lock


def build_missing(spec: BuildSpec, key: str, group: Path, found: Found) -> Any:
    """Build and publish a module the lookup (``found``) did not find usable, under the host's
    lock; a module another process published meanwhile is loaded instead."""
    # Locks serialize builds within a host only: file locks are unreliable across NFS clients, and a
    # dead host's lock must not block the others. Across hosts the atomic rename decides.
    arch_dir = group.parent
    lock_path = arch_dir / ".locks" / host_id() / f"{group.name}.lock"
    try:
        _ensure_dir(lock_path.parent)
        _clear_non_file(lock_path)
    except OSError as err:
        raise _cannot_build_here(
            err, spec, key, found, arch_dir, f"create the build lock for module {spec.name!r}"
        ) from None
    from filelock import FileLock  # only on a miss: importing it costs more than a warm load

    try:
        acquired = _Acquire(FileLock(str(lock_path)), spec, group)
        with acquired as published_meanwhile:
            found = published_meanwhile or find_usable(spec, group)
            if found.module is not None:
                return found.module  # another process published it while we waited
            for folder, problem in found.broken:
                _warn(f"sgljit: cached module {folder} {problem}; rebuilding it", RuntimeWarning)
                _discard(folder)
            if found.mismatches:  # say why the builds there do not serve this one
                logger.info("sgljit: %s: not reusing %s", spec.name, "; ".join(found.mismatches))
            return _build_and_publish(spec, key, group)
    except _LockUnavailable as err:
        raise _cannot_build_here(
            err.error, spec, key, found, lock_path.parent, f"take the build lock {lock_path}"
        ) from None


def _warn(message: str, category: type[Warning]) -> None:
    """A warning attributed to sgljit, not to a line of its source (which would be printed under
    it, and means nothing to the reader)."""
    warnings.warn_explicit(message, category, filename="sgljit", lineno=0, module="sgljit")


def _clear_non_file(path: Path) -> None:
    """Remove what stands at ``path`` unless it is a regular file (a FIFO or a link where the cache
    keeps one of its own files is debris)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        path.unlink()


class _LockUnavailable(Exception):
    """The lock file could not be created or opened (an OSError, kept in ``error``)."""

    def __init__(self, error: OSError):
        self.error = error


class _Acquire:
    """Hold the host's build lock. While waiting: say once who holds it, give up as soon as a
    usable variant is published (a lock left by a dead host on a shared file system must not block
    forever), and build anyway after ``SGLJIT_LOCK_TIMEOUT`` seconds (600 by default). The holder
    writes an owner file beside the lock and keeps its heartbeat."""

    def __init__(self, lock: FileLock, spec: BuildSpec, group: Path):
        self.lock, self.spec, self.group = lock, spec, group
        self.owner = Path(lock.lock_file + ".owner")

    def __enter__(self) -> Found | None:
        """None once the lock is held; the lookup's result when a usable build appeared."""
        from filelock import Timeout

        started = time.monotonic()
        give_up_after = lock_timeout()
        reported = False
        while True:
            try:
                self.lock.acquire(timeout=0.5)
            except Timeout:
                pass
            except OSError as err:
                raise _LockUnavailable(err) from None
            else:
                with contextlib.suppress(OSError):  # only used to tell waiters who we are
                    write_atomic(self.owner, _owner_record(uuid.uuid4().hex).encode())
                    _heartbeat(self.owner, True)
                return None
            waited = time.monotonic() - started
            found = find_usable(self.spec, self.group)
            if found.module is not None:
                return found  # published meanwhile (perhaps by another host)
            if waited > give_up_after:
                logger.warning(
                    "sgljit: build lock %s still held after %.0fs; building anyway",
                    self.lock.lock_file,
                    give_up_after,
                )
                return None
            if not reported and waited > REPORT_WAIT_AFTER_S:
                reported = True
                logger.warning(
                    "sgljit: waiting for %s to finish building %s (lock %s); waiting up to "
                    "%.0fs more, then building here (SGLJIT_LOCK_TIMEOUT sets the limit)",
                    self._holder(),
                    self.spec.name,
                    self.lock.lock_file,
                    give_up_after - waited,
                )

    def _holder(self) -> str:
        owner = _read_owner(self.owner)
        if owner is None:
            return "another process"
        where = "" if owner["namespace"] == _namespace() else ", in another PID namespace"
        try:
            heard = time.time() - os.stat(self.owner).st_mtime
        except OSError:
            heard = math.nan
        return (
            f"process {owner['pid']} on {owner['host']}{where} (building for "
            f"{time.time() - owner['since']:.0f}s, last heard from {heard:.0f}s ago)"
        )

    def __exit__(self, *exc: object) -> None:
        if self.lock.is_locked:
            _heartbeat(self.owner, False)
            self.owner.unlink(missing_ok=True)
            self.lock.release()


def _discard(folder: Path) -> None:
    """Move a folder out of the way first (an atomic rename to a dot-name beside it, which lookups
    skip), then delete it: readers never see it half gone."""
    aside = folder.parent / f".discarded-{folder.name}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(folder, aside)
    except OSError:
        return  # gone already, or not ours to move: the lookup skips it either way
    shutil.rmtree(aside, ignore_errors=True)


def _cannot_build_here(
    err: OSError, spec: BuildSpec, key: str, found: Found, folder: Path, doing: str
) -> CacheError:
    """The error for a miss that cannot be built in the cache: a read-only cache (a read-only mount,
    another user's prebuilt cache) says so and what to do; any other failure names the folder."""
    if err.errno not in READ_ONLY:
        return cache_error(err, folder, doing)
    default = "" if os.environ.get("SGLJIT_CACHE_DIR") else " (the default, ~/.cache/sgljit)"
    return CacheError(
        f"sgljit: module {spec.name!r} (key {key}, {spec.backend} {spec.arch}) is not in the "
        f"module cache at {cache_root()}{default}, and that cache is read-only for this process "
        f"({err.filename or folder}: {err.strerror or err}), so it cannot be built there."
        f"{why_unusable(found)} To fix: build it into a writable copy of the cache (`sgljit build` "
        "for the plugins' kernels, or this code run once with SGLJIT_CACHE_DIR set to the copy) "
        "and serve that copy, or set SGLJIT_CACHE_DIR to a writable folder."
    )


def _ensure_dir(path: Path) -> None:
    """``mkdir -p``, replacing what is not a folder (a file, a FIFO, a dangling or looping link) at
    any level below the cache root: where the cache keeps a folder, anything else is debris."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        return
    except (FileExistsError, NotADirectoryError):
        pass
    root = cache_root()
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(path)) from None
    current = root
    for part in parts:
        current = current / part
        if not current.is_dir():  # a link to a folder is kept: someone put the cache there
            with contextlib.suppress(FileNotFoundError):
                current.unlink()
            current.mkdir(exist_ok=True)


# --------------------------------------------------------------------------------------------
# Who builds where: owner files and their heartbeat


@functools.cache
def _namespace() -> str:
    """This process's PID namespace on this boot (``"<boot id> <pid namespace>"``), or "" where it
    cannot be told: a PID means something only inside its namespace (containers sharing a cache and
    a host name do not share one)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def _owner_record(token: str) -> str:
    """An owner file's contents: who builds (host, PID namespace, PID) and this build's token."""
    return json.dumps(
        {
            "host": host_id(),
            "namespace": _namespace(),
            "pid": os.getpid(),
            "token": token,
            "since": time.time(),
        }
    )


def _read_owner(path: Path) -> dict | None:
    """An owner file's record, or None (missing, not a regular file, or not one)."""
    try:
        owner = json.loads(read_regular(path))
    except (OSError, ValueError):
        return None
    fields = {"host": str, "namespace": str, "pid": int, "token": str, "since": (int, float)}
    if not isinstance(owner, dict) or not all(
        isinstance(owner.get(k), t) for k, t in fields.items()
    ):
        return None
    return owner


# Owner files of this process's builds, touched by one daemon thread every HEARTBEAT_S.
_beating: set[Path] = set()
_beat_lock = threading.Lock()
_beat_thread: threading.Thread | None = None


def _heartbeat(path: Path, on: bool) -> None:
    """Start (or stop) touching an owner file of this process, so that other processes — other
    hosts, other PID namespaces — can tell a live build from a dead one by its mtime."""
    global _beat_thread
    with _beat_lock:
        if not on:
            _beating.discard(path)
            return
        _beating.add(path)
        if _beat_thread is None or not _beat_thread.is_alive():  # none yet, or lost by a fork
            _beat_thread = threading.Thread(target=_beat, name="sgljit-heartbeat", daemon=True)
            _beat_thread.start()


def _beat() -> None:
    while True:
        time.sleep(HEARTBEAT_S)
        with _beat_lock:
            paths = list(_beating)
        for path in paths:
            with contextlib.suppress(OSError):
                os.utime(path, follow_symlinks=False)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:  # not a process's (0 and -1 would ask about groups)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # someone else's live process (or no such PID here)
    return True


def _owner_dead(owner_path: Path, folder: Path, now: float) -> bool:
    """Whether the build owning ``folder`` (a staging folder) can no longer finish: its heartbeat
    (the owner file's mtime, else the folder's) is older than STALE_AFTER_S by the file system's
    clock ``now``, or it ran in this PID namespace under a PID that is gone."""
    owner = _read_owner(owner_path)
    if (
        owner is not None
        and owner["host"] == host_id()
        and owner["namespace"] == _namespace() != ""
        and not _pid_alive(owner["pid"])
    ):
        return True
    for beat in (owner_path, folder):
        try:
            return now - os.lstat(beat).st_mtime > STALE_AFTER_S
        except OSError:
            continue
    return False


def _fs_now(folder: Path) -> float:
    """The file system's clock (the mtime of a file made now), which heartbeats are measured by:
    a host's own clock may be off from an NFS server's. This host's clock where none can be made."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".clock-")
    except OSError:
        return time.time()
    try:
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)
        os.unlink(probe)


def _remove_dead_staging(staging_root: Path, now: float) -> int:
    removed = 0
    try:
        folders = [
            Path(e.path) for e in os.scandir(staging_root) if e.is_dir(follow_symlinks=False)
        ]
    except OSError:
        return 0
    for folder in folders:
        if _owner_dead(folder / OWNER, folder, now):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def remove_staging_of(pids: set[int], root: Path | None = None) -> int:
    """Remove the staging folders of builds run by ``pids`` in this PID namespace on this host
    (processes just stopped, whose builds cannot finish); returns how many were removed."""
    root = cache_root() if root is None else root
    removed = 0
    for folder in root.glob("*/*/.staging/*"):
        owner = _read_owner(folder / OWNER)
        if (
            owner is not None
            and owner["pid"] in pids
            and owner["host"] == host_id()
            and owner["namespace"] == _namespace()
        ):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def clear_stale(root: Path | None = None) -> int:
    """Remove what no process can use: staging folders of dead builds, discarded entries, kept
    failed builds and folders in an older cache layout. Returns how many were removed."""
    root = cache_root() if root is None else root
    removed = 0
    for staging_root in root.glob("*/*/.staging"):
        removed += _remove_dead_staging(staging_root, _fs_now(staging_root))
    for folder in [
        *root.glob(".trash/*"),  # where earlier versions put discarded entries
        *root.glob("*/*/*/.discarded-*"),
        *root.glob("failed/*"),
        *root.glob(f"*/*/*/{MANIFEST}"),
    ]:
        target = folder.parent if folder.name == MANIFEST else folder
        shutil.rmtree(target, ignore_errors=True)
        removed += 1
    return removed


# --------------------------------------------------------------------------------------------
# Build and publish


class _BuildFolder:
    """Where the build runs: the staging folder itself, or, when its path has characters that ninja
    or the shell would split on (tvm-ffi writes paths into build.ninja unquoted), a private folder
    with a plain name in the temporary folder whose contents move into staging afterwards."""

    def __init__(self, staging: Path):
        self.staging, self.path = staging, staging
        if not _SAFE_PATH.fullmatch(str(staging)):
            tmp = tempfile.gettempdir()
            base = tmp if _SAFE_PATH.fullmatch(tmp) else "/tmp"
            self.path = Path(tempfile.mkdtemp(prefix="sgljit-build-", dir=base))

    def finish(self) -> None:
        """Move what the build wrote into the staging folder (a no-op when it ran there)."""
        if self.path == self.staging or not self.path.exists():
            return
        for entry in self.path.iterdir():
            shutil.move(str(entry), str(self.staging / entry.name))
        shutil.rmtree(self.path, ignore_errors=True)


# What a build read


def _outside_files(paths: Iterable[str | os.PathLike], build_dirs: tuple[str, ...]) -> list[str]:
    """The files a build read, as absolute paths, without the build's own (generated files: their
    text is in the key)."""
    found = (os.path.normpath(os.path.join(build_dirs[0], os.fspath(p))) for p in paths)
    return [path for path in found if outside([path], build_dirs)]


# A __has_include (or __has_include_next) probe of a literal name: the name and its quote. (A
# pattern, compiled by re on first use: builds only, not a warm load's import.)
_PROBE = rb'__has_include(?:_next)?\s*\(\s*(["<])([^">\n]+)[">]\s*\)'


def _snapshot(paths: Iterable[str], include_path: Sequence[str]) -> dict[str, str | None]:
    """What a build's inputs hold now: path → sha256 (None: missing or not a regular file) for
    ``paths`` and for where each ``__has_include`` probe in them looks for its name (the probing
    file's folder for ``"name"``, then ``include_path``), whether it is there or not."""
    found: dict[str, str | None] = {}
    probes: list[str] = []
    for path in paths:
        data = read_input(path)
        found[path] = None if data is None else sha256(data)
        if data is None or b"__has_include" not in data:
            continue
        for quote, name in re.findall(_PROBE, data):
            name = name.decode(errors="replace").strip()
            folders = [os.path.dirname(path)] if quote == b'"' else []
            probes += [os.path.normpath(os.path.join(f, name)) for f in [*folders, *include_path]]
    for path in probes:
        if path not in found:
            data = read_input(path)
            found[path] = None if data is None else sha256(data)
    return found


def _unvouched(
    before: Mapping[str, str | None], after: Mapping[str, str | None], name: str
) -> str | None:
    """Why a build's binary cannot vouch for what it read, or None: every input it read was hashed
    before the compile, with the same contents as after it."""
    for path, digest in after.items():
        if path not in before:
            return f"{name} read {path}, which was not hashed before it compiled"
        if before[path] != digest:
            return f"{path} changed while {name} compiled"
    return None


def _record_deps(snapshot: Mapping[str, str | None], roots: Mapping[str, Path]) -> list[list]:
    """[[portable path, sha256 or None], ...] of a build's inputs, sorted."""
    recorded = {portable_path(path, roots): digest for path, digest in snapshot.items()}
    return [[p, recorded[p]] for p in sorted(recorded)]


# Builds of one module while a file it reads keeps changing under them (or its staging folder is
# taken away): the last one is used but not published.
_BUILD_ATTEMPTS = 3


class _Staging:
    """A private staging folder of one build, with its owner file and heartbeat."""

    def __init__(self, spec: BuildSpec, group: Path):
        root = group.parent / ".staging"
        self.path = root / f"{group.name}.{uuid.uuid4().hex[:12]}"
        self.token = uuid.uuid4().hex
        _ensure_dir(root)
        self.path.mkdir()
        (self.path / OWNER).write_text(_owner_record(self.token))
        _heartbeat(self.path / OWNER, True)
        removed = _remove_dead_staging(root, os.stat(self.path / OWNER).st_mtime)
        if removed:
            logger.info("sgljit: removed %d staging folder(s) of builds that died", removed)

    def ours(self) -> bool:
        """Whether the folder is still this build's (another process may have removed it)."""
        owner = _read_owner(self.path / OWNER)
        return owner is not None and owner["token"] == self.token

    def release(self) -> None:
        """Stop the heartbeat and drop the owner file (before a rename moves the folder)."""
        _heartbeat(self.path / OWNER, False)
        (self.path / OWNER).unlink(missing_ok=True)


def _build_and_publish(
    spec: BuildSpec,
    key: str,
    group: Path,
    attempts: int = _BUILD_ATTEMPTS,
    known: frozenset[str] = frozenset(),
) -> Any:
    """Build in a staging folder and publish it; ``known``: inputs earlier attempts read, hashed
    before this one as well."""
    try:
        staging = _Staging(spec, group)
    except OSError as err:
        raise _cannot_build_here(
            err,
            spec,
            key,
            Found(),
            group.parent,
            f"create a staging folder for module {spec.name!r}",
        ) from None
    started = time.perf_counter()
    compile_logger.info(
        "sgljit: compiling %s for %s %s (first use; cached after) ...",
        spec.name,
        spec.backend,
        spec.arch,
    )
    folder = _BuildFolder(staging.path)
    build_dirs = tuple(
        dict.fromkeys([str(folder.path), str(staging.path), os.path.realpath(staging.path)])
    )
    inputs = [os.path.abspath(p) for p in spec.inputs]
    try:
        try:
            for name, text in spec.files.items():
                (folder.path / name).write_text(text)
            listed = _outside_files(spec.scan(folder.path) if spec.scan else (), build_dirs)
            before = _snapshot(dict.fromkeys([*known, *inputs, *listed]), spec.include_path)
            read = _outside_files(spec.build(folder.path) or (), build_dirs)
            after = _snapshot(dict.fromkeys([*before, *inputs, *read]), spec.include_path)
            module = spec.load(folder.path / spec.artifact)
        finally:
            folder.finish()
    except Exception as err:
        if not staging.ours():  # removed under this build: not what the compiler said was wrong
            return _staging_taken(spec, key, group, attempts, known, err)
        staging.release()
        if isinstance(err, CompileError):
            raise _keep_failed(err, staging.path, group, folder.path) from None
        if isinstance(err, OSError):
            shutil.rmtree(staging.path, ignore_errors=True)
            raise cache_error(err, staging.path, f"build module {spec.name!r}") from None
        failed = _move_to_failed(staging.path, group)
        raise CompileError(
            f"built module {spec.name!r} could not be loaded: {err}", source_path=str(failed)
        ) from err
    if not staging.ours():
        return _staging_taken(spec, key, group, attempts, known, None)
    staging.release()
    changed = _unvouched(before, after, spec.name)
    if changed is not None:
        if attempts > 1:
            logger.info("sgljit: %s; compiling again", changed)
            shutil.rmtree(staging.path, ignore_errors=True)
            return _build_and_publish(spec, key, group, attempts - 1, frozenset(after))
        # Its staging folder goes once this process has (a dead build's, to the next build).
        _warn(
            f"sgljit: module {spec.name!r} was built {_BUILD_ATTEMPTS} times, and no build could "
            f"vouch for what it read (the last: {changed}); this process uses the last build, "
            "but it is not cached",
            UserWarning,
        )
        return module
    try:
        variant = _write_manifest(spec, key, staging.path, after, started)
        _publish(staging.path, group, variant)
    except OSError as err:
        shutil.rmtree(staging.path, ignore_errors=True)
        raise cache_error(err, group, f"publish module {spec.name!r}") from None
    logger.info(
        "sgljit: compiled %s for %s %s in %.1fs",
        spec.name,
        spec.backend,
        spec.arch,
        time.perf_counter() - started,
    )
    return module


def _staging_taken(spec, key, group, attempts, known, err) -> Any:
    """Another process removed this build's staging folder (a cleanup that took it for a dead
    build's): build again rather than report the compiler's failure to write there."""
    if attempts > 1:
        logger.warning(
            "sgljit: the staging folder of module %s was removed by another process during its "
            "build; building again",
            spec.name,
        )
        return _build_and_publish(spec, key, group, attempts - 1, known)
    raise CacheError(
        f"sgljit: the staging folder of module {spec.name!r} under {group.parent / '.staging'} was "
        f"removed by another process during each of {_BUILD_ATTEMPTS} builds"
        + (f" (the last build then failed: {err})" if err else "")
        + "; is a `sgljit cache clear` running, or does another tool clean the cache folder?"
    )


def _publish(staging: Path, group: Path, variant: str) -> None:
    """Rename the staging folder into place (atomic). The first writer wins where the same variant
    is there already and sound; one that fails the validity rule is replaced."""
    _ensure_dir(group)
    final = group / variant
    try:
        os.rename(staging, final)
        return
    except OSError:
        if not os.path.lexists(final):
            raise
    if verify_entry(final) is None:
        shutil.rmtree(staging, ignore_errors=True)  # ours is identical by name; keep using ours
        return
    _discard(final)
    os.rename(staging, final)


def _write_manifest(
    spec: BuildSpec, key: str, staging: Path, inputs: Mapping[str, str | None], started: float
) -> str:
    """Write the manifest into the staging folder; returns the variant's name."""
    flags, toolchain = split_fingerprint(spec.fingerprint)
    recorded = _record_deps(inputs, spec.roots)
    data = (staging / spec.artifact).read_bytes()
    artifact_sha = sha256(data)
    manifest = {
        "format": MANIFEST_FORMAT,
        "name": spec.name,
        "key": key,
        "backend": spec.backend,
        "arch": spec.arch,
        "artifact": spec.artifact,
        "artifact_bytes": len(data),
        "artifact_sha256": artifact_sha,
        "sgljit": __version__,
        "fingerprint": flags,
        "files": {n: sha256(t.encode()) for n, t in spec.files.items()},
        "toolchain": toolchain,
        "deps": recorded,
        "built_on": host_id(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "seconds": round(time.perf_counter() - started, 3),
    }
    tmp = staging / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, staging / MANIFEST)
    return variant_name(toolchain, recorded, artifact_sha)


def _move_to_failed(staging: Path, group: Path) -> Path:
    failed = cache_root() / "failed" / group.name
    (staging / OWNER).unlink(missing_ok=True)
    try:
        if os.path.lexists(failed):
            shutil.rmtree(failed, ignore_errors=True)
        _ensure_dir(failed.parent)
        os.rename(staging, failed)
    except OSError:
        return staging
    return failed


def _keep_failed(err: CompileError, staging: Path, group: Path, build_path: Path) -> CompileError:
    """Nothing broken is cached: the staging folder moves to ``failed/`` for inspection."""
    failed = _move_to_failed(staging, group)

    def fix(text: str) -> str:
        return text.replace(str(build_path), str(failed)).replace(str(staging), str(failed))

    return CompileError(
        fix(err.message),
        command=fix(err.command),
        source_path=fix(err.source_path),
        output=fix(err.output),
    )

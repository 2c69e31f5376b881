"""The module cache: one backend-neutral path from a build spec to a loaded module.

    key → in-process memo → published variants (dependencies re-hashed, artifact verified) → file
    lock → re-check → build in a private staging folder → check it loads → publish by atomic rename

Layout: ``$SGLJIT_CACHE_DIR`` (default ``~/.cache/sgljit``) ``/<backend>/<arch>/<name>-<key>/<variant>/``.

* The **key** hashes what is known before compiling: the generated sources, every flag (include
  paths as given, with the folders a spec names in ``roots`` written by role so an installation can
  move), the environment that steers the compilers, versions and target architectures.
* A **variant** is one build of that key. Its manifest records the compilers' identities and every
  file the compiler actually read (its own dependency output) with a sha256 each, as ccache's
  direct mode does. A lookup re-hashes those files: a header edited anywhere — reached through a
  ``-I`` flag, an absolute include, ``CPATH`` — makes the variant not match, and a build follows.
  Nothing walks a folder, so a large source folder (or the cache inside it) costs nothing.
* The artifact's sha256 is checked before it is loaded, and the variant's name is a hash of the
  manifest's toolchain, dependencies and artifact hash, so neither can be edited alone to vouch for
  another binary (checksums, not signatures: a writer of the cache can forge a consistent entry).
* A build during which a file it read changed (its mtime falls inside the build) is not published.

A published folder is never modified in place, so a running process never sees a half-written file.
CUDA, C++ and SYCL builds all come through here.

Example (a spec is usually made by :func:`sgljit.load_jit` or :func:`sgljit.load_jit_sycl`)::

    spec = BuildSpec(backend="cpu", arch="host", name="demo", artifact="demo.so",
                     files={"demo.cc": src}, build=compile_into, load=tvm_ffi.load_module)
    module = get_or_build(spec)     # build(folder) returns the files the compiler read
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import math
import os
import re
import shutil
import socket
import stat
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import CacheError, CompileError, NoCompileError
from .toolchain import ABSENT, outside

if TYPE_CHECKING:
    from filelock import FileLock

__all__ = [
    "BuildSpec",
    "cache_key",
    "cache_root",
    "clear_module_cache",
    "clear_stale",
    "get_or_build",
    "published_entries",
    "read_depfile",
    "verify_entry",
]

logger = logging.getLogger("sgljit")
# The line a compile prints even when SGLJIT_LOG is unset (sgljit's __init__ gives it a handler):
# a first use may compile for seconds.
compile_logger = logging.getLogger("sgljit.compile")

MANIFEST = "sgljit-manifest.json"
MANIFEST_FORMAT = 2
# Fingerprint entries that start with this name a compiler ("toolchain: nvcc <--version text>").
TOOLCHAIN = "toolchain: "
OWNER = ".sgljit-owner"  # in a staging folder: "<host>\n<pid>\n" of the process building there
# A waiter reports who holds the build lock after this long.
REPORT_WAIT_AFTER_S = 10.0
# Another host's staging folder (or a foreign lock holder) is presumed dead after this long.
FOREIGN_STAGING_MAX_AGE_S = 24 * 3600.0
# Characters ninja and the shell take unquoted in a path; other staging paths build elsewhere.
_SAFE_PATH = re.compile(r"[A-Za-z0-9_./+=,@%-]+")


@dataclasses.dataclass(frozen=True, eq=False)
class BuildSpec:
    """What to build. *How* is the ``build`` callable; *where* is decided by this module.

    Attributes:
        backend: folder under the cache root ("cuda", "cpu", "sycl", ...).
        arch: folder under the backend ("9.0a", "host", ...).
        name: module name, safe as a file name.
        artifact: the file ``build`` produces inside the folder it is given.
        build: compiles inside the given folder (whose path is safe for ninja and the shell) and
            returns the files the compiler read (its depfile); raises :class:`sgljit.CompileError`.
            Files inside the folder (the generated sources) are covered by the key, not recorded.
        load: loads the artifact at the given path; raises on a bad binary.
        files: generated files (name → text) written into the build folder before ``build`` runs.
        fingerprint: flags, environment, versions: anything else that changes the binary.
            Compiler identities start with :data:`TOOLCHAIN` (``"toolchain: <label> <identity>"``)
            and belong to the variant, not the key; where a compiler is not installed (a
            production image running prebuilt kernels) a build by any compiler of that label is
            accepted.
        roots: named folders (``{"source": Path(...)}``): a dependency under one is recorded
            relative to it, so the cache stays valid when an installation moves. The fingerprint
            should name include folders by role (``-I{source}``), not by path.
    """

    backend: str
    arch: str
    name: str
    artifact: str
    build: Callable[[Path], Iterable[str | os.PathLike] | None]
    load: Callable[[Path], Any]
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    fingerprint: tuple[str, ...] = ()
    roots: Mapping[str, Path] = dataclasses.field(default_factory=dict)


def host_id() -> str:
    """This host's name in lock and staging paths (``$SGLJIT_HOST_ID`` overrides the host name)."""
    return os.environ.get("SGLJIT_HOST_ID") or socket.gethostname()


def cache_root() -> Path:
    """The cache folder: ``$SGLJIT_CACHE_DIR``, else ``~/.cache/sgljit``."""
    return Path(os.environ.get("SGLJIT_CACHE_DIR") or Path.home() / ".cache" / "sgljit")


# --------------------------------------------------------------------------------------------
# Keys and manifests


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digest(parts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def _split_fingerprint(fingerprint: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """(entries of the key, {compiler label: identity})."""
    flags, toolchain = [], {}
    for part in fingerprint:
        if part.startswith(TOOLCHAIN):
            label, _, identity = part[len(TOOLCHAIN) :].partition(" ")
            toolchain[label] = identity
        else:
            flags.append(part)
    return flags, toolchain


def _key(backend: str, arch: str, name: str, artifact: str, version: str, flags, files) -> str:
    """The key from its parts; ``files`` maps generated file names to their sha256."""
    parts = [backend, arch, name, artifact, version, *flags]
    parts += [f"{n}={files[n]}" for n in sorted(files)]
    return _digest(parts)[:20]


def cache_key(spec: BuildSpec) -> str:
    """The key of a spec: everything known before compiling (paths under ``roots`` excluded, so a
    cache built in one installation is valid in another with the same sources)."""
    flags, _ = _split_fingerprint(spec.fingerprint)
    files = {n: _sha256(t.encode()) for n, t in spec.files.items()}
    return _key(spec.backend, spec.arch, spec.name, spec.artifact, __version__, flags, files)


def _variant_name(toolchain: Mapping[str, str], deps: list[list[str]], artifact_sha: str) -> str:
    parts = [f"{k}={toolchain[k]}" for k in sorted(toolchain)]
    parts += [f"{p}={h}" for p, h in deps]
    return _digest([*parts, artifact_sha])[:16]


def group_dir(spec: BuildSpec, key: str | None = None) -> Path:
    """The folder holding every variant of a spec's key."""
    return cache_root() / spec.backend / spec.arch / f"{spec.name}-{key or cache_key(spec)}"


def published_entries(root: Path | None = None) -> list[Path]:
    """Every published variant folder under a cache root."""
    root = cache_root() if root is None else root
    return sorted(m.parent for m in root.glob(f"*/*/*/*/{MANIFEST}"))


def read_depfile(text: str) -> list[str]:
    """The prerequisites of a Make-syntax depfile (``-MD``/``-MMD`` output), unescaped.

    >>> read_depfile("a.o: a.cc /x/b\\\\ c.h \\\\\\n  /y/$$d.h\\n")
    ['a.cc', '/x/b c.h', '/y/$d.h']
    """
    deps: list[str] = []
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    for line in text.splitlines():
        _target, sep, rest = line.partition(": ")
        if not sep:
            continue
        word, i = "", 0
        while i < len(rest):
            c = rest[i]
            if c == "\\" and i + 1 < len(rest) and rest[i + 1] in " #\\":
                word += rest[i + 1]
                i += 2
                continue
            if c == "$" and rest[i + 1 : i + 2] == "$":
                word, i = word + "$", i + 2
                continue
            if c.isspace():
                if word:
                    deps.append(word)
                word, i = "", i + 1
                continue
            word, i = word + c, i + 1
        if word:
            deps.append(word)
    return deps


# Per process: (path, size, mtime, ctime, inode) → sha256, for files settled on disk (see _hash_file).
_hash_memo: dict[tuple, str] = {}
# A file changed less than this long ago is hashed again: coarse file-system clocks can give an
# edit the same mtime as the version read before it.
_SETTLED_S = 2.0


def _hash_file(path: str) -> str | None:
    """sha256 of a regular file, or None when it is missing, unreadable or not a regular file
    (a FIFO or a dangling link is never opened)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    token = (path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    known = _hash_memo.get(token)
    if known is not None:
        return known
    try:
        with open(path, "rb") as f:
            digest = _sha256(f.read())
    except OSError:
        return None
    if time.time() - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > _SETTLED_S:
        _hash_memo[token] = digest
    return digest


def _portable(path: str, roots: Mapping[str, Path]) -> str:
    """``{root}/relative`` for a path under one of ``roots`` (the deepest), else the path."""
    best = None
    for role, folder in roots.items():
        folder_s = str(folder).rstrip("/")
        if path.startswith(folder_s + "/") and (best is None or len(folder_s) > len(best[1])):
            best = (role, folder_s)
    if best is None:
        return path
    return "{" + best[0] + "}" + path[len(best[1]) :]


def _resolve(recorded: str, roots: Mapping[str, Path]) -> str | None:
    if not recorded.startswith("{"):
        return recorded
    role, _, rest = recorded[1:].partition("}")
    folder = roots.get(role)
    return None if folder is None else str(folder).rstrip("/") + rest


def _outside_files(paths: Iterable[str | os.PathLike], build_dirs: tuple[str, ...]) -> list[str]:
    """The files a build read, as absolute paths, without the build's own (generated files: their
    text is in the key)."""
    found = (os.path.normpath(os.path.join(build_dirs[0], os.fspath(p))) for p in paths)
    return [path for path in found if outside([path], build_dirs)]


def _changed_during(paths: Iterable[str], start: float, end: float) -> str | None:
    """The first file modified between ``start`` and ``end`` (wall clock: while a build ran), or
    None. The compiler may have read it before the change, so the binary cannot vouch for what its
    manifest would record (ccache's "too new" rule). An mtime past ``end`` is clock skew, not a
    change during the build."""
    for path in paths:
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        if start <= mtime <= end:
            return path
    return None


def _record_deps(
    paths: Iterable[str | os.PathLike], build_dirs: tuple[str, ...], roots: Mapping[str, Path]
) -> list[list[str]]:
    """[[portable path, sha256], ...] of the files a build read, sorted, without the build's own."""
    recorded: dict[str, str] = {}
    for path in _outside_files(paths, build_dirs):
        digest = _hash_file(path)
        if digest is None:
            continue  # gone since, or not a regular file: nothing to compare against later
        recorded[_portable(path, roots)] = digest
    return [[p, recorded[p]] for p in sorted(recorded)]


def _deps_problem(deps: list[list[str]], roots: Mapping[str, Path]) -> str | None:
    """Why recorded dependencies no longer match the files on disk, or None when they all do."""
    for recorded, digest in deps:
        path = _resolve(recorded, roots)
        if path is None:
            return f"it was built from a folder this build does not name ({recorded})"
        now = _hash_file(path)
        if now is None:
            return f"{path} is gone (or not a regular file)"
        if now != digest:
            return f"{path} changed since it was built"
    return None


def _toolchain_problem(built: Mapping[str, str], here: Mapping[str, str]) -> str | None:
    for label, identity in here.items():
        if identity == ABSENT:
            continue  # no compiler here: any build of these sources by one is accepted
        if built.get(label) != identity:
            return f"it was built by another {label} ({(built.get(label) or '?').splitlines()[0]})"
    return None


def _read_manifest(folder: Path) -> dict:
    data = json.loads((folder / MANIFEST).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"manifest is a JSON {type(data).__name__}, expected an object")
    if data.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"manifest format {data.get('format')}, expected {MANIFEST_FORMAT}")
    return data


def verify_entry(folder: Path) -> str | None:
    """Why a published variant folder must not be used, or None when it is sound: its folder names
    match the key and variant recomputed from its manifest, and the artifact's size and sha256
    match the manifest (the bytes are read once)."""
    try:
        m = _read_manifest(folder)
        key = _key(
            m["backend"], m["arch"], m["name"], m["artifact"], m["sgljit"],
            m["fingerprint"], m["files"],
        )  # fmt: skip
        variant = _variant_name(m["toolchain"], m["deps"], m["artifact_sha256"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"unreadable manifest: {err}"
    if folder.parent.name != f"{m['name']}-{key}":
        return f"its folder is not named by the key its manifest describes ({m['name']}-{key})"
    if folder.name != variant:
        return f"its folder is not named by the variant its manifest describes ({variant})"
    if (folder.parent.parent.parent.name, folder.parent.parent.name) != (m["backend"], m["arch"]):
        return "its folder is not under its manifest's backend/arch"
    try:
        data = (folder / m["artifact"]).read_bytes()
    except OSError as err:
        return f"artifact unreadable: {err}"
    return _artifact_problem(folder, m, data)


def _artifact_problem(folder: Path, manifest: Mapping, data: bytes) -> str | None:
    """Why an artifact's bytes are not what its manifest (and the folder named by it) vouch for."""
    digest = manifest.get("artifact_sha256")
    if len(data) != manifest.get("artifact_bytes") or _sha256(data) != digest:
        return "its artifact does not match the sha256 (and size) recorded when it was built"
    if folder.name != _variant_name(manifest["toolchain"], manifest["deps"], digest):
        return "its folder is not named by the variant its manifest describes"
    return None


# --------------------------------------------------------------------------------------------
# Errors


def _cache_error(err: OSError, folder: Path, doing: str) -> CacheError:
    """An sgljit error for a file-system failure: the folder, what was tried, what fixes it."""
    reason = err.strerror or str(err)
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space there, or set SGLJIT_CACHE_DIR to a folder on another disk"
    elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "make it writable and readable by this user, or set SGLJIT_CACHE_DIR to a folder that is"
        if not os.environ.get("SGLJIT_CACHE_DIR"):
            fix += " (the default, ~/.cache/sgljit, is under $HOME)"
        fix += "; a read-only cache serves modules prebuilt into it with `sgljit build`"
    else:
        fix = "check the folder, or set SGLJIT_CACHE_DIR to another one"
    return CacheError(
        f"sgljit: cannot {doing} in the module cache at {folder}: {reason}. To fix: {fix}"
    )


# --------------------------------------------------------------------------------------------
# Lookup


_memo: dict[str, Any] = {}
_memo_locks: dict[str, threading.Lock] = {}
_memo_guard = threading.Lock()


def clear_module_cache() -> None:
    """Forget every module loaded in this process (the files on disk stay; loaded code stays mapped)."""
    from .jit_utils import clear_cache_once

    with _memo_guard:
        _memo.clear()
    _hash_memo.clear()
    clear_cache_once()


def get_or_build(spec: BuildSpec) -> Any:
    """Return the loaded module for ``spec``, building and publishing it on a miss."""
    key = cache_key(spec)
    # The key names folders by role; in one process, other folders of the same module are another
    # module (their files decide which build is theirs).
    roots = ",".join(f"{r}={spec.roots[r]}" for r in sorted(spec.roots))
    memo_key = f"{spec.backend}/{spec.arch}/{spec.name}-{key}|{roots}"
    try:
        return _memo[memo_key]
    except KeyError:
        pass
    with _memo_guard:
        lock = _memo_locks.setdefault(memo_key, threading.Lock())
    with lock:
        if memo_key not in _memo:
            _memo[memo_key] = _load_or_build(spec, key)
        return _memo[memo_key]


class _Found:
    """The outcome of looking through a key's variants."""

    def __init__(self) -> None:
        self.module: Any = None
        self.mismatches: list[str] = []  # why variants did not match (for SGLJIT_NO_COMPILE)
        self.broken: list[tuple[Path, str]] = []  # variants that match but fail to verify or load


def _variants(group: Path) -> list[Path]:
    try:
        entries = [e for e in os.scandir(group) if not e.name.startswith(".") and e.is_dir()]
    except FileNotFoundError:
        return []
    except OSError as err:
        raise _cache_error(err, group, "read the module's folder") from None
    entries.sort(key=_mtime_ns, reverse=True)  # newest first
    return [Path(e.path) for e in entries]


def _mtime_ns(entry: os.DirEntry) -> int:
    try:
        return entry.stat().st_mtime_ns
    except OSError:  # moved aside by another process meanwhile: looked at last, then skipped
        return 0


def _find(spec: BuildSpec, group: Path) -> _Found:
    found = _Found()
    _, toolchain = _split_fingerprint(spec.fingerprint)
    for folder in _variants(group):
        try:
            manifest = _read_manifest(folder)
            problem = _toolchain_problem(manifest["toolchain"], toolchain) or _deps_problem(
                manifest["deps"], spec.roots
            )
        except PermissionError as err:
            raise _cache_error(err, folder, "read a built module") from None
        except (OSError, ValueError, KeyError, TypeError) as err:
            if folder.exists():  # else moved aside by another process since the listing
                found.broken.append((folder, f"unreadable {MANIFEST} ({err})"))
            continue
        if problem:
            found.mismatches.append(f"{folder.name}: {problem}")
            continue
        artifact = folder / spec.artifact
        try:
            data = artifact.read_bytes()
        except PermissionError as err:
            raise _cache_error(err, folder, "read a built module") from None
        except OSError as err:
            if folder.exists():
                found.broken.append((folder, f"artifact unreadable ({err})"))
            continue
        problem = _artifact_problem(folder, manifest, data)
        if problem:
            found.broken.append((folder, problem))
            continue
        try:
            found.module = spec.load(artifact)
            return found
        except Exception as err:  # a foreign binary (another GPU's, a broken runtime): rebuilt
            found.broken.append((folder, f"failed to load ({err})"))
    return found


def _no_compile(spec: BuildSpec, key: str, found: _Found) -> NoCompileError:
    if spec.backend in ("cuda", "sycl"):
        arch = f' --arch "{spec.arch.replace("_", " ")}"' if spec.backend == "cuda" else ""
        how = f"with `sgljit build --backend {spec.backend}{arch}` (or unset SGLJIT_NO_COMPILE)"
    else:  # host modules have no prebuild command: any run that may compile publishes them
        how = "by running the same code once without SGLJIT_NO_COMPILE"
    why = ""
    if found.mismatches or found.broken:
        reasons = found.mismatches + [f"{f.name}: {p}" for f, p in found.broken]
        why = " Builds of it exist but none can be used: " + "; ".join(reasons) + "."
    return NoCompileError(
        f"module {spec.name!r} (key {key}, {spec.backend} {spec.arch}) is not in the cache "
        f"{cache_root()} and SGLJIT_NO_COMPILE is set.{why} Build it beforehand {how}."
    )


def _load_or_build(spec: BuildSpec, key: str) -> Any:
    group = group_dir(spec, key)
    found = _find(spec, group)  # warm path: no lock, no compiler
    if found.module is not None:
        return found.module
    if os.environ.get("SGLJIT_NO_COMPILE", "") not in ("", "0"):
        raise _no_compile(spec, key, found)
    # Locks serialize builds within a host only: file locks are unreliable across NFS clients, and a
    # dead host's lock must not block the others. Across hosts the atomic rename decides.
    arch_dir = group.parent
    lock_path = arch_dir / ".locks" / host_id() / f"{group.name}.lock"
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _cache_error(
            err, arch_dir, f"create the build lock for module {spec.name!r}"
        ) from None
    from filelock import FileLock  # only on a miss: importing it costs more than a warm load

    with _Acquire(FileLock(str(lock_path)), spec, group) as published_meanwhile:
        found = published_meanwhile or _find(spec, group)
        if found.module is not None:
            return found.module  # another process published it while we waited
        for folder, problem in found.broken:
            warnings.warn(
                f"sgljit: cached module {folder} {problem}; rebuilding it",
                RuntimeWarning,
                stacklevel=4,
            )
            _discard(folder)
        if found.mismatches:  # say why the builds there do not serve this one
            logger.info("sgljit: %s: not reusing %s", spec.name, "; ".join(found.mismatches))
        return _build_and_publish(spec, key, group)


def lock_timeout() -> float:
    """``SGLJIT_LOCK_TIMEOUT``: seconds a build waits for another process's build of the same
    module before building anyway (600 when unset or empty)."""
    text = os.environ.get("SGLJIT_LOCK_TIMEOUT", "").strip() or "600"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:  # NaN too
        raise ValueError(f"SGLJIT_LOCK_TIMEOUT={text!r}: expected a number of seconds >= 0")
    return value


class _Acquire:
    """Hold the host's build lock. While waiting: say once who holds it, give up as soon as a
    usable variant is published (a lock left by a dead host on a shared file system must not block
    forever), and build anyway after ``SGLJIT_LOCK_TIMEOUT`` seconds (600 by default)."""

    def __init__(self, lock: FileLock, spec: BuildSpec, group: Path):
        self.lock, self.spec, self.group = lock, spec, group
        self.owner = Path(lock.lock_file + ".owner")

    def __enter__(self) -> _Found | None:
        """None once the lock is held; the lookup's result when a usable build appeared."""
        from filelock import Timeout

        started = time.monotonic()
        give_up_after = lock_timeout()
        reported = False
        while True:
            try:
                self.lock.acquire(timeout=0.5)
                with contextlib.suppress(OSError):  # only used to tell waiters who we are
                    self.owner.write_text(f"{host_id()}\n{os.getpid()}\n{time.time():.0f}\n")
                return None
            except Timeout:
                waited = time.monotonic() - started
                found = _find(self.spec, self.group)
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
        try:
            host, pid, since = self.owner.read_text().split()[:3]
            return f"process {pid} on {host} (building for {time.time() - float(since):.0f}s)"
        except (OSError, ValueError):
            return "another process"

    def __exit__(self, *exc: object) -> None:
        if self.lock.is_locked:
            self.owner.unlink(missing_ok=True)
            self.lock.release()


def _discard(folder: Path) -> None:
    """Move a folder out of the way first (atomic), then delete it: readers never see it half gone."""
    trash = cache_root() / ".trash" / f"{folder.name}-{uuid.uuid4().hex[:8]}"
    try:
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.rename(folder, trash)
    except OSError:
        return  # gone already, or not ours to move: the lookup skips it either way
    shutil.rmtree(trash, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Build and publish


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _dead_staging(folder: Path, now: float) -> bool:
    """Whether a staging folder belongs to a build that can no longer finish."""
    try:
        host, pid = (folder / OWNER).read_text().split()[:2]
        if host == host_id():
            return not _pid_alive(int(pid))
    except (OSError, ValueError):
        pass  # no owner file: created by a process killed before it wrote one, or foreign
    try:
        return now - folder.stat().st_mtime > FOREIGN_STAGING_MAX_AGE_S
    except OSError:
        return False


def _remove_dead_staging(staging_root: Path) -> int:
    removed, now = 0, time.time()
    try:
        folders = [Path(e.path) for e in os.scandir(staging_root) if e.is_dir()]
    except OSError:
        return 0
    for folder in folders:
        if _dead_staging(folder, now):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def clear_stale(root: Path | None = None) -> int:
    """Remove what no process can use: staging folders of dead builds, the trash, kept failed
    builds and folders in an older cache layout. Returns how many were removed."""
    root = cache_root() if root is None else root
    removed = 0
    for staging_root in root.glob("*/*/.staging"):
        removed += _remove_dead_staging(staging_root)
    for folder in [*root.glob(".trash/*"), *root.glob("failed/*"), *root.glob(f"*/*/*/{MANIFEST}")]:
        target = folder.parent if folder.name == MANIFEST else folder
        shutil.rmtree(target, ignore_errors=True)
        removed += 1
    return removed


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


# Builds of one module while a file it reads keeps changing under them: the last one is used but not
# published.
_BUILD_ATTEMPTS = 3


def _build_and_publish(
    spec: BuildSpec, key: str, group: Path, attempts: int = _BUILD_ATTEMPTS
) -> Any:
    arch_dir = group.parent
    staging_root = arch_dir / ".staging"
    staging = staging_root / f"{group.name}.{uuid.uuid4().hex[:12]}"
    try:
        staging.mkdir(parents=True)
        (staging / OWNER).write_text(f"{host_id()}\n{os.getpid()}\n")
    except OSError as err:
        raise _cache_error(
            err, arch_dir, f"create a staging folder for module {spec.name!r}"
        ) from None
    removed = _remove_dead_staging(staging_root)
    if removed:
        logger.info("sgljit: removed %d staging folder(s) of builds that died", removed)
    started = time.perf_counter()
    compile_logger.info(
        "sgljit: compiling %s for %s %s (first use; cached after) ...",
        spec.name,
        spec.backend,
        spec.arch,
    )
    folder = _BuildFolder(staging)
    build_dirs = tuple(dict.fromkeys([str(folder.path), str(staging), os.path.realpath(staging)]))
    try:
        try:
            for name, text in spec.files.items():
                (folder.path / name).write_text(text)
            wall_start = time.time()
            deps = spec.build(folder.path) or ()
            changed = _changed_during(_outside_files(deps, build_dirs), wall_start, time.time())
            module = spec.load(folder.path / spec.artifact)
        finally:
            folder.finish()
    except CompileError as err:
        raise _keep_failed(err, staging, group, folder.path) from None
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise _cache_error(err, staging, f"build module {spec.name!r}") from None
    except Exception as err:
        failed = _move_to_failed(staging, group)
        raise CompileError(
            f"built module {spec.name!r} could not be loaded: {err}", source_path=str(failed)
        ) from err
    if changed is not None:
        if attempts > 1:
            logger.info("sgljit: %s changed while %s compiled; compiling again", changed, spec.name)
            shutil.rmtree(staging, ignore_errors=True)
            return _build_and_publish(spec, key, group, attempts - 1)
        warnings.warn(
            f"sgljit: {changed} changed during each of {_BUILD_ATTEMPTS} builds of module "
            f"{spec.name!r}; this process uses the last one, but it is not cached",
            stacklevel=2,
        )
        return module  # its staging folder goes when this process has (_remove_dead_staging)
    try:
        variant = _write_manifest(spec, key, staging, build_dirs, deps, started)
        group.mkdir(parents=True, exist_ok=True)
        final = group / variant
        try:
            os.rename(staging, final)  # atomic publish; fails if another writer got there first
        except OSError:
            if not (final / MANIFEST).exists():
                raise
            # First writer wins: ours is identical by name; keep using the copy we loaded.
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise _cache_error(err, group, f"publish module {spec.name!r}") from None
    logger.info(
        "sgljit: compiled %s for %s %s in %.1fs",
        spec.name,
        spec.backend,
        spec.arch,
        time.perf_counter() - started,
    )
    return module


def _write_manifest(
    spec: BuildSpec, key: str, staging: Path, build_dirs: tuple[str, ...], deps, started: float
) -> str:
    """Write the manifest into the staging folder; returns the variant's name."""
    flags, toolchain = _split_fingerprint(spec.fingerprint)
    recorded = _record_deps(deps, build_dirs, spec.roots)
    data = (staging / spec.artifact).read_bytes()
    artifact_sha = _sha256(data)
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
        "files": {n: _sha256(t.encode()) for n, t in spec.files.items()},
        "toolchain": toolchain,
        "deps": recorded,
        "built_on": host_id(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "seconds": round(time.perf_counter() - started, 3),
    }
    tmp = staging / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, staging / MANIFEST)
    (staging / OWNER).unlink(missing_ok=True)
    return _variant_name(toolchain, recorded, artifact_sha)


def _move_to_failed(staging: Path, group: Path) -> Path:
    failed = cache_root() / "failed" / group.name
    (staging / OWNER).unlink(missing_ok=True)
    try:
        if failed.exists():
            shutil.rmtree(failed, ignore_errors=True)
        failed.parent.mkdir(parents=True, exist_ok=True)
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

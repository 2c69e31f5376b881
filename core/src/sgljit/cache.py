"""The module cache: one backend-neutral path from a build spec to a loaded module.

    key → in-process memo → published variants (one validity rule; dependencies re-hashed,
    artifact verified) → file lock → re-check → build in a private staging folder, its inputs
    hashed before and after → check it loads → publish by atomic rename

Layout: ``$SGLJIT_CACHE_DIR`` (default ``~/.cache/sgljit``) ``/<backend>/<arch>/<name>-<key>/<variant>/``.

* The **key** hashes what is known before compiling: the generated sources, every flag (include
  paths as given, with the folders a spec names in ``roots`` written by role so an installation can
  move), the environment that steers the compilers, versions and target architectures.
* A **variant** is one build of that key. Its manifest records the compilers' identities and every
  file the build read — the compiler's own dependency output, the files its flags name (response
  files, libraries) and, for each ``__has_include`` probe in them, whether the probed file was there
  — with a sha256 each (None: absent), as ccache's direct mode does. A lookup re-hashes those
  files: a header edited anywhere — reached through a ``-I`` flag, an absolute include, ``CPATH`` —
  makes the variant not match, and a build follows. Nothing walks a folder.
* What a build read is known before it is trusted: the files a spec's ``scan`` lists are hashed
  before the compile, and everything the build read is hashed after it; a file read that was not
  hashed before, or whose contents differ, means the binary cannot vouch for the hashes, and the
  build is not published (content decides, never mtimes).
* One validity rule (:func:`verify_entry`, used by lookups and by ``cache import``): a well-formed
  manifest whose key and variant name its folders, and an artifact with its recorded size and
  sha256 (checksums, not signatures: a writer of the cache can forge a consistent entry). Anything
  that fails it is rebuilt over. Only regular files are opened in the cache, never through a link.

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
import functools
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
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    "read_regular",
    "verify_entry",
    "write_atomic",
]

logger = logging.getLogger("sgljit")

MANIFEST = "sgljit-manifest.json"
# 3: deps may record an absence (sha256 None), and hold the files flags name and probes found.
MANIFEST_FORMAT = 3
# Fingerprint entries that start with this name a compiler ("toolchain: nvcc <--version text>").
TOOLCHAIN = "toolchain: "
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
        scan: lists, without building, the files ``build`` will read (a preprocessor's ``-M``
            with the same options), given the folder ``files`` were written to; they are hashed
            before the build. A file the build reads that it did not list makes the build
            unpublishable, and another follows that hashes it first (without a scan, every first
            build is built twice).
        inputs: files the build reads that its flags name (response files, libraries): hashed
            before and after, and recorded like headers.
        include_path: the header folders the build names itself (not the compiler's system
            folders): a ``__has_include`` probe in a recorded file is recorded as the state of the
            probed name in each of them (and, for ``"name"``, in the probing file's folder).
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
    scan: Callable[[Path], Iterable[str | os.PathLike]] | None = None
    inputs: tuple[str, ...] = ()
    include_path: tuple[str, ...] = ()


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


# --------------------------------------------------------------------------------------------
# Files: only regular ones are read, never through a link inside the cache


def read_regular(path: str | os.PathLike, *, follow: bool = False) -> bytes:
    """The bytes of the regular file at ``path``. Anything else there — a FIFO, a device, a socket
    and, unless ``follow``, a symbolic link — raises OSError without being read: the open neither
    blocks (``O_NONBLOCK``) nor follows a link to ``/dev/zero`` (``O_NOFOLLOW``)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return f.read()


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` as a new file renamed over whatever was there (a FIFO or a link there is
    replaced, never opened)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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


# Per process: (path, size, mtime, ctime, inode) → sha256, for files settled on disk (see _hash_file).
_hash_memo: dict[tuple, str] = {}
# A file changed less than this long ago is hashed again: coarse file-system clocks can give an
# edit the same mtime as the version read before it.
_SETTLED_S = 2.0


def _hash_file(path: str) -> str | None:
    """sha256 of a regular file, or None when it is missing, unreadable or not a regular file
    (a FIFO or a dangling link is never opened). Memoized per process for a lookup."""
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
    data = _read_input(path)
    if data is None:
        return None
    digest = _sha256(data)
    if time.time() - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > _SETTLED_S:
        _hash_memo[token] = digest
    return digest


def _read_input(path: str) -> bytes | None:
    """A build input's bytes, read now (links followed), or None: missing or not a regular file."""
    try:
        return read_regular(path, follow=True)
    except OSError:
        return None


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


# A __has_include (or __has_include_next) probe of a literal name: the name and its quote.
_PROBE = re.compile(rb'__has_include(?:_next)?\s*\(\s*(["<])([^">\n]+)[">]\s*\)')


def _snapshot(paths: Iterable[str], include_path: Sequence[str]) -> dict[str, str | None]:
    """What a build's inputs hold now: path → sha256 (None: missing or not a regular file) for
    ``paths`` and for where each ``__has_include`` probe in them looks for its name (the probing
    file's folder for ``"name"``, then ``include_path``), whether it is there or not."""
    found: dict[str, str | None] = {}
    probes: list[str] = []
    for path in paths:
        data = _read_input(path)
        found[path] = None if data is None else _sha256(data)
        if data is None or b"__has_include" not in data:
            continue
        for quote, name in _PROBE.findall(data):
            name = name.decode(errors="replace").strip()
            folders = [os.path.dirname(path)] if quote == b'"' else []
            probes += [os.path.normpath(os.path.join(f, name)) for f in [*folders, *include_path]]
    for path in probes:
        if path not in found:
            data = _read_input(path)
            found[path] = None if data is None else _sha256(data)
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
    recorded = {_portable(path, roots): digest for path, digest in snapshot.items()}
    return [[p, recorded[p]] for p in sorted(recorded)]


def _deps_problem(deps: list[list], roots: Mapping[str, Path]) -> str | None:
    """Why recorded dependencies no longer match the files on disk, or None when they all do."""
    for recorded, digest in deps:
        path = _resolve(recorded, roots)
        if path is None:
            return f"it was built from a folder this build does not name ({recorded})"
        now = _hash_file(path)
        if now == digest:
            continue
        if digest is None:
            return f"{path} appeared since it was built (where a probe found nothing)"
        if now is None:
            return f"{path} is gone (or not a regular file)"
        return f"{path} changed since it was built"
    return None


def _toolchain_problem(built: Mapping[str, str], here: Mapping[str, str]) -> str | None:
    for label, identity in here.items():
        if identity == ABSENT:
            continue  # no compiler here: any build of these sources by one is accepted
        if built.get(label) != identity:
            return f"it was built by another {label} ({(built.get(label) or '?').splitlines()[0]})"
    return None


# --------------------------------------------------------------------------------------------
# The validity rule of an entry (lookups and `cache import` alike)

_STRINGS = ("name", "key", "backend", "arch", "artifact", "artifact_sha256", "sgljit")


def _manifest_problem(m: Any) -> str | None:
    """Why a parsed manifest is not one this sgljit writes, or None."""
    if not isinstance(m, dict):
        return f"manifest is a JSON {type(m).__name__}, expected an object"
    if m.get("format") != MANIFEST_FORMAT:
        return f"manifest format {m.get('format')!r}, expected {MANIFEST_FORMAT}"
    wrong = [f for f in _STRINGS if not isinstance(m.get(f), str)]
    if not isinstance(m.get("artifact_bytes"), int) or isinstance(m.get("artifact_bytes"), bool):
        wrong.append("artifact_bytes")
    if not (
        isinstance(m.get("fingerprint"), list) and all(isinstance(f, str) for f in m["fingerprint"])
    ):
        wrong.append("fingerprint")
    for field in ("files", "toolchain"):
        value = m.get(field)
        if not (isinstance(value, dict) and all(isinstance(v, str) for v in value.values())):
            wrong.append(field)
    deps = m.get("deps")
    if not (
        isinstance(deps, list)
        and all(
            isinstance(d, list) and len(d) == 2 and isinstance(d[0], str)
            and (d[1] is None or isinstance(d[1], str))
            for d in deps
        )
    ):  # fmt: skip
        wrong.append("deps")
    if wrong:
        return f"manifest fields of the wrong type or missing: {', '.join(wrong)}"
    artifact = m["artifact"]
    if "/" in artifact or artifact.startswith(".") or artifact in ("", MANIFEST):
        return f"manifest names the artifact {artifact!r}, not a file of its folder"
    return None


def _read_entry(folder: Path) -> tuple[dict, str | None]:
    """(manifest, None) for a variant folder whose manifest is well-formed and whose folders are
    named by the key and variant it describes; ({}, why not) otherwise. PermissionError passes."""
    try:
        m = json.loads(read_regular(folder / MANIFEST))
    except PermissionError:
        raise
    except (OSError, ValueError) as err:
        return {}, f"unreadable {MANIFEST} ({err})"
    problem = _manifest_problem(m)
    if problem:
        return {}, problem
    key = _key(
        m["backend"], m["arch"], m["name"], m["artifact"], m["sgljit"], m["fingerprint"], m["files"]
    )
    if folder.parent.name != f"{m['name']}-{key}":
        return {}, f"its folder is not named by the key its manifest describes ({m['name']}-{key})"
    variant = _variant_name(m["toolchain"], m["deps"], m["artifact_sha256"])
    if folder.name != variant:
        return {}, f"its folder is not named by the variant its manifest describes ({variant})"
    if (folder.parent.parent.parent.name, folder.parent.parent.name) != (m["backend"], m["arch"]):
        return {}, "its folder is not under its manifest's backend/arch"
    return m, None


def _artifact_problem(folder: Path, manifest: Mapping) -> str | None:
    """Why a variant's artifact is not the file its manifest (and the folder named by it) vouch
    for, or None. PermissionError passes."""
    try:
        data = read_regular(folder / manifest["artifact"])
    except PermissionError:
        raise
    except OSError as err:
        return f"artifact unreadable ({err})"
    if len(data) != manifest["artifact_bytes"] or _sha256(data) != manifest["artifact_sha256"]:
        return "its artifact does not match the sha256 (and size) recorded when it was built"
    return None


def verify_entry(folder: Path) -> str | None:
    """Why a published variant folder must not be used, or None when it is sound: a well-formed
    manifest whose key and variant name its folders, and an artifact of the recorded size and
    sha256. Lookups apply the same rule (and, besides, match toolchains and dependencies)."""
    try:
        manifest, problem = _read_entry(folder)
        return problem or _artifact_problem(folder, manifest)
    except PermissionError as err:
        return f"unreadable ({err})"


# --------------------------------------------------------------------------------------------
# Errors

# What a file system says where this process may not write.
_READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


def _cache_error(err: OSError, folder: Path, doing: str) -> CacheError:
    """An sgljit error for a file-system failure: the folder, what was tried, what fixes it."""
    reason = err.strerror or str(err)
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space there, or set SGLJIT_CACHE_DIR to a folder on another disk"
    elif err.errno in _READ_ONLY:
        fix = "make it writable and readable by this user, or set SGLJIT_CACHE_DIR to a folder that is"
        if not os.environ.get("SGLJIT_CACHE_DIR"):
            fix += " (the default, ~/.cache/sgljit, is under $HOME)"
        fix += "; a read-only cache serves modules prebuilt into it with `sgljit build`"
    else:
        fix = "check the folder, or set SGLJIT_CACHE_DIR to another one"
    return CacheError(
        f"sgljit: cannot {doing} in the module cache at {folder}: {reason}. To fix: {fix}"
    )


def _unusable(found: _Found) -> str:
    """Why the builds found under a key (if any) could not be used, as a sentence."""
    if not (found.mismatches or found.broken):
        return ""
    reasons = found.mismatches + [f"{f.name}: {p}" for f, p in found.broken]
    return " Builds of it exist but none can be used: " + "; ".join(reasons) + "."


def _cannot_build_here(
    err: OSError, spec: BuildSpec, key: str, found: _Found, folder: Path, doing: str
) -> CacheError:
    """The error for a miss that cannot be built in the cache: a read-only cache (a read-only mount,
    another user's prebuilt cache) says so and what to do; any other failure names the folder."""
    if err.errno not in _READ_ONLY:
        return _cache_error(err, folder, doing)
    default = "" if os.environ.get("SGLJIT_CACHE_DIR") else " (the default, ~/.cache/sgljit)"
    return CacheError(
        f"sgljit: module {spec.name!r} (key {key}, {spec.backend} {spec.arch}) is not in the "
        f"module cache at {cache_root()}{default}, and that cache is read-only for this process "
        f"({err.filename or folder}: {err.strerror or err}), so it cannot be built there."
        f"{_unusable(found)} To fix: build it into a writable copy of the cache (`sgljit build` "
        "for the plugins' kernels, or this code run once with SGLJIT_CACHE_DIR set to the copy) "
        "and serve that copy, or set SGLJIT_CACHE_DIR to a writable folder."
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
        self.broken: list[tuple[Path, str]] = []  # variants that fail the validity rule or to load


def _variants(group: Path) -> list[Path]:
    """The variant folders of a key, newest first (links, files and dot-names are not variants)."""
    try:
        entries = [
            e
            for e in os.scandir(group)
            if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
        ]
    except (FileNotFoundError, NotADirectoryError):  # none yet (a non-folder there is replaced)
        return []
    except OSError as err:
        raise _cache_error(err, group, "read the module's folder") from None
    entries.sort(key=_mtime_ns, reverse=True)  # newest first
    return [Path(e.path) for e in entries]


def _mtime_ns(entry: os.DirEntry) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_mtime_ns
    except OSError:  # moved aside by another process meanwhile: looked at last, then skipped
        return 0


def _find(spec: BuildSpec, group: Path) -> _Found:
    found = _Found()
    _, toolchain = _split_fingerprint(spec.fingerprint)
    for folder in _variants(group):
        try:
            manifest, problem = _read_entry(folder)
            if problem is None:
                mismatch = _toolchain_problem(manifest["toolchain"], toolchain) or _deps_problem(
                    manifest["deps"], spec.roots
                )
                if mismatch:
                    found.mismatches.append(f"{folder.name}: {mismatch}")
                    continue
                problem = _artifact_problem(folder, manifest)
        except PermissionError as err:
            raise _cache_error(err, folder, "read a built module") from None
        if problem:
            if os.path.lexists(folder):  # else moved aside by another process since the listing
                found.broken.append((folder, problem))
            continue
        try:
            found.module = spec.load(folder / spec.artifact)
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
    return NoCompileError(
        f"module {spec.name!r} (key {key}, {spec.backend} {spec.arch}) is not in the cache "
        f"{cache_root()} and SGLJIT_NO_COMPILE is set.{_unusable(found)} Build it beforehand {how}."
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
    except _LockUnavailable as err:
        raise _cannot_build_here(
            err.error, spec, key, found, lock_path.parent, f"take the build lock {lock_path}"
        ) from None


def _clear_non_file(path: Path) -> None:
    """Remove what stands at ``path`` unless it is a regular file (a FIFO or a link where the cache
    keeps one of its own files is debris)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        path.unlink()


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

    def __enter__(self) -> _Found | None:
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
            _Found(),
            group.parent,
            f"create a staging folder for module {spec.name!r}",
        ) from None
    started = time.perf_counter()
    logger.info("sgljit: compiling %s for %s %s ...", spec.name, spec.backend, spec.arch)
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
            raise _cache_error(err, staging.path, f"build module {spec.name!r}") from None
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
        warnings.warn(
            f"sgljit: module {spec.name!r} was built {_BUILD_ATTEMPTS} times, and no build could "
            f"vouch for what it read (the last: {changed}); this process uses the last build, "
            "but it is not cached",
            stacklevel=2,
        )
        return module
    try:
        variant = _write_manifest(spec, key, staging.path, after, started)
        _publish(staging.path, group, variant)
    except OSError as err:
        shutil.rmtree(staging.path, ignore_errors=True)
        raise _cache_error(err, group, f"publish module {spec.name!r}") from None
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
    flags, toolchain = _split_fingerprint(spec.fingerprint)
    recorded = _record_deps(inputs, spec.roots)
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
    return _variant_name(toolchain, recorded, artifact_sha)


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

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
* What a build read is known before it is trusted: hashed before and after the compile, not
  published where they differ (:mod:`sgljit.publish`, the miss path).
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
import hashlib
import json
import math
import os
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ._version import __version__
from .errors import CacheError, NoCompileError
from .toolchain import ABSENT

__all__ = [
    "BuildSpec",
    "cache_key",
    "cache_root",
    "clear_module_cache",
    "get_or_build",
    "published_entries",
    "read_depfile",
    "read_regular",
    "verify_entry",
    "write_atomic",
]

MANIFEST = "sgljit-manifest.json"
# 3: deps may record an absence (sha256 None), and hold the files flags name and probes found.
MANIFEST_FORMAT = 3
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
    from .publish import build_missing  # the miss path: not imported by a warm load

    return build_missing(spec, key, group, found)


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

"""The module cache's insides: its layout, keys, manifests, the validity rule of an entry and the
lookup of a key's variants, shared by the warm path (:mod:`sgljit.cache`) and the miss path
(:mod:`sgljit.publish`). It imports neither, nor anything that compiles.

:mod:`sgljit.cache` describes the design.
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
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ._version import __version__
from .errors import CacheError

__all__ = [
    "ABSENT",
    "MANIFEST",
    "MANIFEST_FORMAT",
    "READ_ONLY",
    "TOOLCHAIN",
    "BuildSpec",
    "Found",
    "cache_error",
    "cache_key",
    "cache_root",
    "find_usable",
    "forget_hashes",
    "group_dir",
    "host_id",
    "lock_timeout",
    "portable_path",
    "published_entries",
    "read_depfile",
    "read_entry",
    "read_input",
    "read_regular",
    "sha256",
    "split_fingerprint",
    "variant_name",
    "verify_entry",
    "why_unusable",
    "write_atomic",
]

MANIFEST = "sgljit-manifest.json"
# 3: deps may record an absence (sha256 None), and hold the files flags name and probes found.
MANIFEST_FORMAT = 3
# Fingerprint entries that start with this name a compiler ("toolchain: nvcc <--version text>").
TOOLCHAIN = "toolchain: "
# A compiler that is not installed, e.g. in a production image that only runs prebuilt kernels.
ABSENT = "absent"


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


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digest(parts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def split_fingerprint(fingerprint: Iterable[str]) -> tuple[list[str], dict[str, str]]:
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
    flags, _ = split_fingerprint(spec.fingerprint)
    files = {n: sha256(t.encode()) for n, t in spec.files.items()}
    return _key(spec.backend, spec.arch, spec.name, spec.artifact, __version__, flags, files)


def variant_name(toolchain: Mapping[str, str], deps: list[list[str]], artifact_sha: str) -> str:
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


def forget_hashes() -> None:
    """Forget the hashes of files this process read (a lookup reads them again)."""
    _hash_memo.clear()


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
    data = read_input(path)
    if data is None:
        return None
    digest = sha256(data)
    if time.time() - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > _SETTLED_S:
        _hash_memo[token] = digest
    return digest


def read_input(path: str) -> bytes | None:
    """A build input's bytes, read now (links followed), or None: missing or not a regular file."""
    try:
        return read_regular(path, follow=True)
    except OSError:
        return None


def portable_path(path: str, roots: Mapping[str, Path]) -> str:
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


def read_entry(folder: Path) -> tuple[dict, str | None]:
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
    variant = variant_name(m["toolchain"], m["deps"], m["artifact_sha256"])
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
    if len(data) != manifest["artifact_bytes"] or sha256(data) != manifest["artifact_sha256"]:
        return "its artifact does not match the sha256 (and size) recorded when it was built"
    return None


def verify_entry(folder: Path) -> str | None:
    """Why a published variant folder must not be used, or None when it is sound: a well-formed
    manifest whose key and variant name its folders, and an artifact of the recorded size and
    sha256. Lookups apply the same rule (and, besides, match toolchains and dependencies)."""
    try:
        manifest, problem = read_entry(folder)
        return problem or _artifact_problem(folder, manifest)
    except PermissionError as err:
        return f"unreadable ({err})"


# --------------------------------------------------------------------------------------------
# Errors

# What a file system says where this process may not write.
READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


def cache_error(err: OSError, folder: Path, doing: str) -> CacheError:
    """An sgljit error for a file-system failure: the folder, what was tried, what fixes it."""
    if err.errno in (errno.ENOTDIR, errno.EEXIST):
        root = cache_root()
        blocker = next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:  # the root itself, or a folder above it, is a file
            setting = os.environ.get("SGLJIT_CACHE_DIR")
            where = f"SGLJIT_CACHE_DIR={setting}" if setting else f"the module cache folder {root}"
            return CacheError(
                f"sgljit: {where} is not a folder ({blocker} is a file), so the module cache "
                "cannot be kept there. To fix: set SGLJIT_CACHE_DIR to a folder"
                + ("" if setting else ", or move that file")
            )
    reason = err.strerror or str(err)
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space there, or set SGLJIT_CACHE_DIR to a folder on another disk"
    elif err.errno in READ_ONLY:
        fix = "make it writable and readable by this user, or set SGLJIT_CACHE_DIR to a folder that is"
        if not os.environ.get("SGLJIT_CACHE_DIR"):
            fix += " (the default, ~/.cache/sgljit, is under $HOME)"
        fix += "; a read-only cache serves modules prebuilt into it with `sgljit build`"
    else:
        fix = "check the folder, or set SGLJIT_CACHE_DIR to another one"
    return CacheError(
        f"sgljit: cannot {doing} in the module cache at {folder}: {reason}. To fix: {fix}"
    )


def why_unusable(found: Found) -> str:
    """Why the builds found under a key (if any) could not be used, as a sentence."""
    if not (found.mismatches or found.broken):
        return ""
    reasons = found.mismatches + [f"{f.name}: {p}" for f, p in found.broken]
    return " Builds of it exist but none can be used: " + "; ".join(reasons) + "."


# --------------------------------------------------------------------------------------------
# Lookup


class Found:
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
        raise cache_error(err, group, "read the module's folder") from None
    entries.sort(key=_mtime_ns, reverse=True)  # newest first
    return [Path(e.path) for e in entries]


def _mtime_ns(entry: os.DirEntry) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_mtime_ns
    except OSError:  # moved aside by another process meanwhile: looked at last, then skipped
        return 0


def find_usable(spec: BuildSpec, group: Path) -> Found:
    found = Found()
    _, toolchain = split_fingerprint(spec.fingerprint)
    for folder in _variants(group):
        try:
            manifest, problem = read_entry(folder)
            if problem is None:
                mismatch = _toolchain_problem(manifest["toolchain"], toolchain) or _deps_problem(
                    manifest["deps"], spec.roots
                )
                if mismatch:
                    found.mismatches.append(f"{folder.name}: {mismatch}")
                    continue
                problem = _artifact_problem(folder, manifest)
        except PermissionError as err:
            raise cache_error(err, folder, "read a built module") from None
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

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
CUDA, C++ and SYCL builds all come through here. Three modules, none importing another's private
names, and no import circle: this one (the API, the in-process memo, the warm path),
:mod:`sgljit.store` (layout, keys, manifests, the validity rule, the lookup) and
:mod:`sgljit.publish` (the miss path: imported on a miss only).

Example (a spec is usually made by :func:`sgljit.load_jit` or :func:`sgljit.load_jit_sycl`)::

    spec = BuildSpec(backend="cpu", arch="host", name="demo", artifact="demo.so",
                     files={"demo.cc": src}, build=compile_into, load=tvm_ffi.load_module)
    module = get_or_build(spec)     # build(folder) returns the files the compiler read
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .errors import NoCompileError
from .store import (
    MANIFEST,
    TOOLCHAIN,
    BuildSpec,
    Found,
    cache_key,
    cache_root,
    find_usable,
    forget_hashes,
    group_dir,
    lock_timeout,
    published_entries,
    read_depfile,
    read_regular,
    verify_entry,
    why_unusable,
    write_atomic,
)

__all__ = [
    "MANIFEST",
    "TOOLCHAIN",
    "BuildSpec",
    "cache_key",
    "cache_root",
    "clear_module_cache",
    "get_or_build",
    "lock_timeout",
    "published_entries",
    "read_depfile",
    "read_regular",
    "verify_entry",
    "write_atomic",
]

_memo: dict[str, Any] = {}
_memo_locks: dict[str, threading.Lock] = {}
_memo_guard = threading.Lock()


def clear_module_cache() -> None:
    """Forget every module loaded in this process (the files on disk stay; loaded code stays mapped)."""
    from .jit_utils import clear_cache_once

    with _memo_guard:
        _memo.clear()
    forget_hashes()
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


def _no_compile(spec: BuildSpec, key: str, found: Found) -> NoCompileError:
    if spec.backend in ("cuda", "sycl"):
        arch = f' --arch "{spec.arch.replace("_", " ")}"' if spec.backend == "cuda" else ""
        how = f"with `sgljit build --backend {spec.backend}{arch}` (or unset SGLJIT_NO_COMPILE)"
    else:  # host modules have no prebuild command: any run that may compile publishes them
        how = "by running the same code once without SGLJIT_NO_COMPILE"
    return NoCompileError(
        f"module {spec.name!r} (key {key}, {spec.backend} {spec.arch}) is not in the cache "
        f"{cache_root()} and SGLJIT_NO_COMPILE is set.{why_unusable(found)} Build it beforehand {how}."
    )


def _load_or_build(spec: BuildSpec, key: str) -> Any:
    group = group_dir(spec, key)
    found = find_usable(spec, group)  # warm path: no lock, no compiler
    if found.module is not None:
        return found.module
    if os.environ.get("SGLJIT_NO_COMPILE", "") not in ("", "0"):
        raise _no_compile(spec, key, found)
    from .publish import build_missing  # the miss path: not imported by a warm load

    return build_missing(spec, key, group, found)

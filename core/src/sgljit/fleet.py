"""Fleet readiness: prebuild every kernel a plugin declares, and move a built cache between hosts.

A plugin's manifest names its :class:`sgljit.op.Family`, whose ops declare what to prebuild
(``prebuild={"cuda": [key, ...], "sycl": [...]}``); ``family.prebuild_specs(backend)`` lists one
entry per module and ``family.prebuild(backend, **entry)`` builds it.

``sgljit build`` runs each in worker processes (so builds run in parallel and one crash cannot take
the others down), for the requested architectures, and reports every failure.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from .plugins import load_target
from .store import (
    MANIFEST,
    cache_error,
    cache_root,
    published_entries,
    read_regular,
    verify_entry,
)

__all__ = ["add_build_parser", "build_all", "cache_export", "cache_import", "prebuild_jobs"]

BACKENDS = ("cuda", "sycl")
# The exit status of a command stopped by Ctrl-C (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130


def prebuild_jobs(
    plugins: list[str] | None, backend: str, *, cases: bool = False
) -> tuple[list[dict], list[str]]:
    """(jobs, problems): every declared specialization of the selected plugins for ``backend``
    (``cases``: and the modules of their ops' check cases)."""
    from .plugins import discover

    jobs, problems = [], []
    found = {p.name: p for p in discover()}
    for name in plugins or sorted(found):
        plugin = found.get(name)
        if plugin is None:
            problems.append(
                f"plugin {name!r} is not installed (installed: {', '.join(sorted(found)) or 'none'})"
            )
            continue
        if plugin.error:
            problems.append(f"plugin {name!r} is {plugin.error}")
            continue
        target = (plugin.manifest or {}).get("family")
        if not target:
            continue
        try:
            family = load_target(target)
            # `cases` only when asked: a family object of its own may take the backend alone
            specs = (
                family.prebuild_specs(backend, cases=True)
                if cases
                else family.prebuild_specs(backend)
            )
        except Exception as err:
            problems.append(
                f"plugin {name!r}: {target}.prebuild_specs({backend!r}) failed: "
                f"{type(err).__name__}: {err}"
            )
            continue
        builder = target + ".prebuild"
        for spec in specs:
            label = ", ".join(f"{k}={str(v).removeprefix('torch.')}" for k, v in spec.items())
            jobs.append(
                {
                    "plugin": name,
                    "backend": backend,
                    "builder": builder,
                    "spec": spec,
                    "label": label,
                }
            )
    return jobs, problems


class _CompileCounter(logging.Handler):
    """Counts a worker's compiles (the "compiling" records), which it does not print."""

    compiles = 0

    def emit(self, record: logging.LogRecord) -> None:
        _CompileCounter.compiles += 1


def _run_job(job: dict, env: dict[str, str]) -> tuple[str, str, float]:
    """In a worker process: build one specialization into the cache. Returns ("built" or
    "cached" or "FAILED", the error, seconds)."""
    os.environ.update(env)
    started = time.perf_counter()
    compiles = _CompileCounter.compiles
    try:
        result = load_target(job["builder"])(job["backend"], **job["spec"])
        if hasattr(result, "build"):  # a SYCL module: compile now, not at its first launch
            result.build()
            if result.route == "rtc":
                from .sycl import saved_binaries_supported

                kept, backend = saved_binaries_supported()
                if not kept:
                    raise RuntimeError(
                        f"compiled, but not kept on disk: the runtime compiler saves device "
                        f"binaries for OpenCL devices only, and this SYCL device is {backend}"
                    )
        outcome = "built" if _CompileCounter.compiles > compiles else "cached"
        return outcome, "", time.perf_counter() - started
    except Exception as err:
        return "FAILED", f"{type(err).__name__}: {err}", time.perf_counter() - started


def _worker_init() -> None:
    """A build worker: a process group of its own, so a Ctrl-C at the terminal reaches the command
    alone, which then stops every worker and compiler together (:func:`_stop_workers`); and no
    "compiling" line of its own, which would tear the progress bar (the command prints one line per
    module)."""
    os.setpgrp()
    compiles = logging.getLogger("sgljit.compile")
    for handler in list(compiles.handlers):
        compiles.removeHandler(handler)
    compiles.addHandler(_CompileCounter())
    compiles.setLevel(logging.INFO)
    compiles.propagate = False


def _descendants(pids: set[int]) -> set[int]:
    """The processes below ``pids`` (compilers, ninja's jobs in their own process groups), from
    /proc; none where it cannot be read."""
    parent_of: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses
                parent_of[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = set(), set(pids)
    while frontier:
        frontier = {p for p, parent in parent_of.items() if parent in frontier} - found
        found |= frontier
    return found


def _signal(pids: set[int], groups: set[int], sig: int) -> None:
    for send, targets in ((os.killpg, groups), (os.kill, pids)):
        for target in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                send(target, sig)


# After a Ctrl-C, workers and compilers get this long to stop on SIGTERM (ninja passes it to its
# jobs and waits for them) before SIGKILL.
_STOP_GRACE_S = 1.0


def _stop_workers(pool: cf.ProcessPoolExecutor) -> None:
    """Stop every worker of ``pool`` and everything it started, now, and remove the staging
    folders of the builds they leave unfinished (what they published stays)."""
    from .publish import remove_staging_of

    workers = multiprocessing.active_children()
    pool.shutdown(wait=False, cancel_futures=True)
    pids = {w.pid for w in workers if w.pid}
    below = _descendants(pids)
    _signal(pids | below, pids, signal.SIGTERM)
    multiprocessing.connection.wait([w.sentinel for w in workers], timeout=_STOP_GRACE_S)
    _signal(pids | (below | _descendants(pids)), pids, signal.SIGKILL)
    multiprocessing.connection.wait([w.sentinel for w in workers], timeout=_STOP_GRACE_S)
    remove_staging_of(pids, cache_root())


def build_all(
    plugins: list[str] | None, backend: str, arch: str | None, jobs: int, *, cases: bool = False
) -> int:
    """Compile every declared specialization (``cases``: and every check case's module) into the
    cache; 0 when all built, 1 when one failed, 130 when interrupted (Ctrl-C: the workers and
    their compilers stop at once; what was built stays, and the same command builds the rest)."""
    env = {"SGLJIT_NO_COMPILE": "0"}
    work, problems = prebuild_jobs(plugins, backend, cases=cases)
    archs = (arch or "").split() if backend == "cuda" else []
    if len(archs) > 1:
        # One module per architecture: a serving host looks up its own GPU's architecture alone.
        work = [{**job, "arch": a, "label": f"{job['label']} [{a}]"} for a in archs for job in work]
    elif archs:
        env["SGLJIT_CUDA_ARCH"] = archs[0]
    if not work and not problems:
        print(f"nothing to build for {backend}: no installed plugin declares prebuilds")
        return 0
    failures: list[tuple[str, str]] = [("(discovery)", p) for p in problems]
    try:
        from tqdm import tqdm
    except ImportError:  # progress lines without tqdm
        tqdm = None
    bar = tqdm(total=len(work), desc=f"sgljit build {backend}", unit="module") if tqdm else None
    pool = cf.ProcessPoolExecutor(max_workers=max(1, jobs), initializer=_worker_init)
    finished = 0
    try:
        futures = {
            pool.submit(
                _run_job,
                job,
                {**env, **({"SGLJIT_CUDA_ARCH": job["arch"]} if "arch" in job else {})},
            ): job
            for job in work
        }
        for future in cf.as_completed(futures):
            job = futures[future]
            label = f"{job['plugin']}: {job['label']}"
            try:
                outcome, message, seconds = future.result()
            except Exception as err:  # the worker died
                outcome, message, seconds = "FAILED", f"worker crashed: {err}", 0.0
            finished += 1
            if outcome == "FAILED":
                failures.append((label, message))
            line = f"[{finished}/{len(work)}] {outcome} {label} ({seconds:.1f}s)"
            if bar is not None:
                bar.update(1)
                bar.write(line)
            else:
                print(line, flush=True)
    except KeyboardInterrupt:
        # A second Ctrl-C does not cut the cleanup short.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            _stop_workers(pool)
        finally:
            signal.signal(signal.SIGINT, previous)
        if bar is not None:
            bar.close()
        built = finished - len(failures) + len(problems)
        print(
            f"\ninterrupted: {built} of {len(work)} built into {cache_root()} (kept); "
            "the same command builds the rest",
            file=sys.stderr,
        )
        return INTERRUPTED
    pool.shutdown()
    if bar is not None:
        bar.close()
    print(f"\n{len(work) - len(failures) + len(problems)} of {len(work)} built into {cache_root()}")
    for label, message in failures:
        print(
            f"FAILED {label}:\n  {message.strip().splitlines()[0] if message.strip() else ''}",
            file=sys.stderr,
        )
        if "\n" in message.strip():
            print("  " + "\n  ".join(message.strip().splitlines()[1:40]), file=sys.stderr)
    return 1 if failures else 0


def cmd_build(args: argparse.Namespace) -> int:
    backends = BACKENDS if args.backend == "all" else (args.backend,)
    status = 0
    for backend in backends:
        status = max(
            status, build_all(args.plugin or None, backend, args.arch, args.jobs, cases=args.cases)
        )
        if status == INTERRUPTED:
            break
    return status


def add_build_parser(sub: Any) -> None:
    build = sub.add_parser("build", help="prebuild every kernel the plugins declare into the cache")
    build.add_argument("--plugin", action="append", help="only this plugin (repeatable)")
    build.add_argument("--backend", choices=[*BACKENDS, "all"], default="cuda")
    build.add_argument(
        "--arch", help='CUDA architectures, e.g. "9.0a 10.0a" (default: this GPU\'s)'
    )
    build.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel builds")
    build.add_argument(
        "--cases",
        action="store_true",
        help="also the modules of every op's check cases (what the conformance suite and "
        "`sgljit check` run), so a test session finds them built",
    )
    build.set_defaults(fn=cmd_build)


def cache_export(file: str) -> int:
    """Pack every published module (not locks, staging or failed builds) into a tar.gz."""
    root = cache_root()
    entries = published_entries(root)
    with tarfile.open(file, "w:gz") as tar:
        for entry in entries:
            tar.add(entry, arcname=str(entry.relative_to(root)))
    print(f"exported {len(entries)} modules from {root} to {file}")
    return 0


def _verify(entry: Path) -> str | None:
    """Why an imported entry must not be used, or None when it is sound."""
    problem = verify_entry(entry)
    if problem:
        return problem
    from .sycl import SAVED_SUFFIX  # here: the CLI starts without the SYCL module

    manifest = json.loads(read_regular(entry / MANIFEST))
    if manifest["backend"] == "sycl" and manifest["artifact"].endswith(SAVED_SUFFIX):
        return None  # a device binary of the runtime compiler: it loads on its own device only
    return _check_loads(manifest["backend"], entry / manifest["artifact"])


def _check_loads(backend: str, artifact: Path) -> str | None:
    # In a child process: a foreign binary must not be able to take this one down.
    code = (
        "import ctypes, sys; ctypes.CDLL(sys.argv[1])"
        if backend.startswith("sycl")
        else "import sys, tvm_ffi; tvm_ffi.load_module(sys.argv[1])"
    )
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", code, str(artifact)], capture_output=True, text=True
    )
    if result.returncode != 0:
        return "does not load: " + (result.stderr.strip().splitlines() or ["?"])[-1]
    return None


def cache_import(file: str) -> int:
    """Unpack an exported cache, verify each module (key, checksum, loadability), publish the sound ones."""
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".import-{uuid.uuid4().hex[:8]}-", dir=root))
    except OSError as err:
        raise cache_error(err, root, f"import {file}") from None
    bad = imported = skipped = 0
    try:
        with tarfile.open(file, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.isfile() or m.isdir()]  # no links, devices
            if hasattr(tarfile, "data_filter"):  # refuses absolute paths and escapes from `staging`
                tar.extractall(staging, members=members, filter="data")
            else:  # Python < 3.10.12: check the names ourselves
                for m in members:
                    if m.name.startswith("/") or ".." in Path(m.name).parts:
                        raise ValueError(f"{file}: unsafe path in archive: {m.name}")
                tar.extractall(staging, members=members)
        for entry in published_entries(staging):
            rel = entry.relative_to(staging)
            problem = _verify(entry)
            if problem:
                print(f"REJECTED {rel}: {problem}", file=sys.stderr)
                bad += 1
                continue
            final = root / rel
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(entry, final)  # atomic; an existing entry (same key) is kept
                imported += 1
            except OSError:
                skipped += 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(
        f"imported {imported} modules into {root}"
        + (f", {skipped} already present" if skipped else "")
        + (f", {bad} rejected" if bad else "")
    )
    return 1 if bad else 0

"""``sgljit check``: run every installed op on every backend this machine has, against its reference.

The rows come from each op's declared check cases (:class:`sgljit.op.Case`, through the plugin
manifest's ``family``): fresh random inputs, outputs poisoned, against the reference run on float64
copies. The error reported is ``max |result - expected| / (1 + |expected|)``
(:func:`sgljit.testing.max_error`): absolute near zero, relative for large values, so one tolerance
per dtype fits every op (bf16/fp16 ~2e-2, fp32 ~1e-5, bit-exact 0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

__all__ = ["add_parser", "available_backends", "run_checks"]


def available_backends() -> tuple[list[tuple[str, Any]], list[str]]:
    """([(backend, device)], notes): what this machine can run, and why the rest cannot."""
    import torch

    found, notes = [], []
    if torch.cuda.is_available():
        found.append(("cuda", torch.device("cuda")))
    else:
        notes.append("cuda: no CUDA GPU visible")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        found.append(("sycl", torch.device("xpu")))
    try:
        from . import sycl

        info = sycl.describe()
        if any(d["type"] == "cpu" and d["can_build_source"] for d in info["devices"]):
            found.append(("sycl", torch.device("cpu")))
        elif info["runtime"] is None:
            notes.append(
                f"sycl (CPU device): the SYCL runtime is not installed: {sycl.INSTALL_HINT}"
            )
        else:
            notes.append(
                f"sycl (CPU device): no SYCL CPU device can build kernels ({info['error']})"
            )
    except Exception as err:
        notes.append(f"sycl (CPU device): unavailable ({err})")
    found.append(("reference", torch.device("cpu")))
    return found, notes


def run_checks(plugins: list[str] | None = None, repeats: int = 5) -> int:
    """Print one table of op, backend, shape, status, max error and time per call; 0 if all pass."""
    from .backend import use_backend
    from .plugins import discover, known_distributions, load_target
    from .testing import max_error, synchronize

    if plugins:
        installed = {p.name for p in discover()}
        unknown = sorted(set(plugins) - installed)
        if unknown:
            print(
                f"plugin(s) {', '.join(map(repr, unknown))} not installed "
                f"(installed: {', '.join(sorted(installed)) or 'none'})",
                file=sys.stderr,
            )
            return 2
    backends, notes = available_backends()
    rows: list[tuple[str, ...]] = []
    failed = 0
    for plugin in discover():
        if plugins and plugin.name not in plugins:
            continue
        target = None if plugin.error else plugin.manifest.get("family")
        if plugin.error or not target:
            rows.append(
                (f"({plugin.name})", "-", "-", plugin.error or "no checks declared", "-", "-")
            )
            failed += bool(plugin.error)
            continue
        try:
            family = load_target(target)
            if not hasattr(family, "check_cases"):  # what this command uses of a family
                raise TypeError(f"a {type(family).__name__}, not a sgljit.op.Family")
        except Exception as err:  # the plugin's mistake, reported on its row: the others still run
            problem = f"family {target!r}: {type(err).__name__}: {err}"
            rows.append((f"({plugin.name})", "-", "-", f"ERROR {problem[:120]}", "-", "-"))
            failed += 1
            continue
        for backend, device in backends:
            for case in family.check_cases(device):
                label = f"{backend} ({device.type})"
                try:
                    with use_backend(backend):
                        started = time.perf_counter()
                        result, expected = case["run"]()  # first call: may compile
                        synchronize(device)
                        first = time.perf_counter() - started
                        error = max_error(result, expected)
                        times = []
                        for _ in range(repeats):
                            t0 = time.perf_counter()
                            case["run"]()
                            synchronize(device)
                            times.append(time.perf_counter() - t0)
                    ok = error <= case.get("tol", 1e-5)
                    status = "ok" if ok else "WRONG"
                    timing = f"{statistics.median(times) * 1e6:.0f} µs (first {first:.2f}s)"
                    rows.append((case["op"], label, case["shape"], status, f"{error:.2e}", timing))
                except Exception as err:
                    ok = False
                    message = (
                        str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                    )
                    rows.append(
                        (case["op"], label, case["shape"], f"ERROR {message[:80]}", "-", "-")
                    )
                failed += not ok
    header = (
        "op",
        "backend",
        "shape",
        "status",
        "max error",
        "time per call (incl. inputs and reference)",
    )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print()
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    for note in notes:
        print(f"\nnot run: {note}")
    if not rows:
        print(f"no plugins installed: pip install {' '.join(known_distributions())}")
        return 1
    print(f"\n{len(rows) - failed} of {len(rows)} passed")
    return 1 if failed else 0


def cmd_check(args: argparse.Namespace) -> int:
    return run_checks(args.plugin or None, args.repeats)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text}")
    return value


def add_parser(sub: Any) -> None:
    check = sub.add_parser(
        "check", help="run every installed op on each backend against its reference"
    )
    check.add_argument("--plugin", action="append", help="only this plugin (repeatable)")
    check.add_argument(
        "--repeats", type=_positive, default=5, help="timed calls per case (median; at least 1)"
    )
    check.set_defaults(fn=cmd_check)

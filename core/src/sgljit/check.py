"""``sgljit check``: run every installed op on every backend this machine has, against its reference.

The rows come from each op's declared check cases (:class:`sgljit.op.Case`, through the plugin
manifest's ``family``): fresh random inputs, outputs poisoned, against the reference run on float64
copies. The error reported is ``max |result - expected| / (1 + |expected|)``
(:func:`sgljit.testing.max_error`): absolute near zero, relative for large values, so one tolerance
per dtype fits every op (bf16/fp16 ~2e-2, fp32 ~1e-5, bit-exact 0).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import traceback
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


def public_op(kernel_op: str, public_ops: Any) -> tuple[str, str]:
    """(the public op, the variant) a declared op serves: the longest public op name (the plugin
    manifest's) that ``kernel_op`` is or starts with, the rest is the variant; ``kernel_op`` itself
    when none.

    >>> public_op("per_tensor_quant_fp8_static", ["per_tensor_quant_fp8"])
    ('per_tensor_quant_fp8', 'static')
    >>> public_op("gemma_rmsnorm_3d", ["rmsnorm", "gemma_rmsnorm"])
    ('gemma_rmsnorm', '3d')
    """
    names = [n for n in public_ops if kernel_op == n or kernel_op.startswith(n + "_")]
    if not names:
        return kernel_op, ""
    name = max(names, key=len)
    return name, kernel_op[len(name) + 1 :]


class _Progress(logging.Filter):
    """Prefixes the compile lines logged while case ``done + 1`` of ``total`` runs with
    ``[N/M]``: a first check compiles for minutes, and those lines are what it prints then."""

    def __init__(self, total: int) -> None:
        super().__init__()
        self.done, self.total = 0, total

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = f"[{self.done + 1}/{self.total}] {record.msg}"
        return True


def run_checks(
    plugins: list[str] | None = None,
    repeats: int = 5,
    *,
    ops: list[str] | None = None,
    backends: list[str] | None = None,
    verbose: bool = False,
) -> int:
    """Print one table of op, variant, backend, shape, status, max error, tolerance and time per
    call, a row as each case finishes, then each error's whole message; 0 if all pass. ``ops``:
    public op names (or declared ones) to keep; ``backends``: the backends to run (of those this
    machine has); ``verbose``: errors with their tracebacks."""
    from .backend import backend_name
    from .plugins import discover, install_hint, known_distributions, load_target

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
    found, notes = available_backends()
    if backends:
        wanted = {backend_name(b, "--backend") for b in backends}
        missing = wanted - {b for b, _ in found}
        if missing:
            why = [n for n in notes if n.split(":")[0].split()[0] in missing]
            print(
                f"--backend: {', '.join(sorted(missing))} cannot run here"
                + (f" ({'; '.join(why)})" if why else ""),
                file=sys.stderr,
            )
            return 2
        found = [(b, d) for b, d in found if b in wanted]
        notes = []
    rows: list[tuple[str, ...]] = []
    errors: list[tuple[str, str]] = []  # (the row's label, the whole message)
    cases: list[tuple[str, str, str, Any, dict]] = []  # (op, variant, backend, device, case)
    failed = 0
    seen_ops: set[str] = set()
    for plugin in discover():
        if plugins and plugin.name not in plugins:
            continue
        target = None if plugin.error else plugin.manifest.get("family")
        if plugin.error or not target:
            if not ops:
                status = "ERROR" if plugin.error else "no checks declared"
                rows.append((f"({plugin.name})", "", "-", "-", status, "-", "-", "-"))
                if plugin.error:
                    errors.append((f"({plugin.name})", plugin.error))
                failed += bool(plugin.error)
            continue
        try:
            family = load_target(target)
            if not hasattr(family, "check_cases"):  # what this command uses of a family
                raise TypeError(f"a {type(family).__name__}, not a sgljit.op.Family")
            for backend, device in found:
                for case in family.check_cases(device):
                    op, variant = public_op(case["op"], plugin.ops)
                    seen_ops.update((op, case["op"]))
                    if not ops or op in ops or case["op"] in ops:
                        cases.append((op, variant, backend, device, case))
        except Exception as err:  # the plugin's mistake, reported on its row: the others still run
            rows.append((f"({plugin.name})", "", "-", "-", "ERROR", "-", "-", "-"))
            errors.append((f"({plugin.name})", f"family {target!r}: {type(err).__name__}: {err}"))
            failed += 1
    if ops and not set(ops) & seen_ops:
        print(
            f"--op: no check case of {', '.join(map(repr, ops))} (ops with cases: "
            f"{', '.join(sorted(seen_ops)) or 'none'})",
            file=sys.stderr,
        )
        return 2
    header = (
        "op",
        "variant",
        "backend",
        "shape",
        "status",
        "max error",
        "tolerance",
        "time per call (incl. inputs and reference)",
    )
    # Each row is printed when its case finishes (a warm check still takes a while), so the
    # columns are sized from what is known before: the cases, and the widest status and numbers.
    known = [
        *rows,
        *((op, v or "-", _label(b, d), c["shape"], "ERROR") for op, v, b, d, c in cases),
    ]
    widths = [max(len(r[i]) for r in [header, *known]) for i in range(5)]
    widths += [len(h) for h in header[5:]]
    print()
    for row in [header, tuple("-" * w for w in widths), *rows]:
        _print_row(row, widths)
    progress = _Progress(len(cases))
    compile_log = logging.getLogger("sgljit.compile")
    compile_log.addFilter(progress)
    try:
        for op, variant, backend, device, case in cases:
            row, ok, error = _run_case(case, backend, device, repeats, verbose)
            _print_row((op, variant or "-", *row), widths)
            rows.append((op, variant or "-", *row))
            failed += not ok
            progress.done += 1
            if error:
                errors.append((f"{op} {variant or '-'} {row[0]} {row[1]}", error))
    finally:
        compile_log.removeFilter(progress)
    for label, error in errors:  # whole: the reason and its fix are often past the first line
        print(f"\nERROR {label}:\n  " + "\n  ".join(error.rstrip().splitlines()))
    for note in notes:
        print(f"\nnot run: {note}")
    if not rows:
        print(f"no plugins installed ({install_hint(known_distributions())})")
        return 1
    print(f"\n{len(rows) - failed} of {len(rows)} passed")
    return 1 if failed else 0


def _label(backend: str, device: Any) -> str:
    return f"{backend} ({device.type})"


def _print_row(row: tuple[str, ...], widths: list[int]) -> None:
    print(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), flush=True
    )


def _run_case(
    case: dict, backend: str, device: Any, repeats: int, verbose: bool = False
) -> tuple[tuple[str, ...], bool, str]:
    """(backend, shape, status, max error, tolerance, time) of one case, whether it passed, and
    its error's whole message ("" when it ran; ``verbose``: with the traceback)."""
    from .backend import use_backend
    from .testing import max_error, synchronize

    label = _label(backend, device)
    tol = case.get("tol", 1e-5)
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
    except Exception as err:
        message = f"{type(err).__name__}: {err}"
        if verbose:
            message = "".join(traceback.format_exception(err))
        return (label, case["shape"], "ERROR", "-", f"{tol:.2e}", "-"), False, message
    ok = error <= tol
    timing = f"{statistics.median(times) * 1e6:.0f} µs (first {first:.2f}s)"
    status = "ok" if ok else "WRONG"
    return (label, case["shape"], status, f"{error:.2e}", f"{tol:.2e}", timing), ok, ""


def cmd_check(args: argparse.Namespace) -> int:
    return run_checks(
        args.plugin or None, args.repeats, ops=args.op, backends=args.backend, verbose=args.verbose
    )


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
        "--op", action="append", help="only this op, e.g. rmsnorm (repeatable; its variants too)"
    )
    check.add_argument(
        "--backend",
        action="append",
        choices=["cuda", "sycl", "xpu", "reference"],
        help="only this backend (repeatable; xpu is sycl)",
    )
    check.add_argument(
        "--repeats", type=_positive, default=5, help="timed calls per case (median; at least 1)"
    )
    check.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print each error with its traceback (without: its whole message)",
    )
    check.set_defaults(fn=cmd_check)

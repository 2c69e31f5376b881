"""Shared benchmark harness for sgljit's kernel families.

A family script (``benchmarks/bench_<family>.py``) builds a list of :class:`Op` objects (cases +
providers) and hands them to :func:`run_family`; see benchmarks/README.md. Run as
``python3 benchmarks/bench_<family>.py`` (this folder is then on ``sys.path``).

Timing: one CUDA graph calls the op once on each of K copies of the inputs (K copies together move
more than twice the L2 cache, so no case is timed from cache; outputs an op allocates are kept until
the K calls are done, so they take K buffers too); the graph is replayed and we take the median,
divided by K (:func:`bench_cudagraph_ms`). Warm-up (JIT builds, torch.compile, autotuning) runs on
every copy before anything is timed. An op's floor (``Op.floor``: kernels that only move its
bytes) is timed the same way, as the ``copy floor`` row (``--no-floor``: not timed).

``python3 benchmarks/harness.py`` measures only the streaming ceiling and writes ceiling.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEFAULT_L2_BYTES = 60 * 2**20
SGLJIT = "sgljit"
EAGER = "torch"
COMPILE = "torch.compile"
LIGER = "liger"
FLOOR = "copy floor"  # the row of an op's floor (Op.floor): timed like a provider, never a peer
# The acceptance rule: the subject at this fraction of the best peer's speed or more matches it (a
# 2% margin for timing noise).
MATCH_RATIO = 0.98
# A peer this close to the floor's time (relative) moves the bytes as fast as a kernel that does
# nothing else, within the same margin: a cell the subject cannot win by more than noise.
AT_FLOOR_TOLERANCE = 0.02

Inputs = dict[str, Any]
GRIDS = ("default", "models", "decode", "serving", "quick")
# The `models` grid's shared facts. Token counts, decode to long prefill:
MODEL_TOKENS = (1, 16, 128, 1024, 4096, 16384, 65536)
# The `decode` grid: the models grid's shapes at a serving engine's decode batch sizes.
DECODE_TOKENS = (1, 4, 16, 64, 256)
# The `serving` grid: the models grid's shapes at the batch sizes between those two grids' (two
# decode tokens, small batches, a chunk of prefill).
SERVING_TOKENS = (1, 2, 8, 64, 512)


def model_tokens(grid: str, tokens: Sequence[int] = MODEL_TOKENS) -> Sequence[int]:
    """A models-grid series' token counts: ``tokens``, or the decode or serving grid's."""
    return {"decode": DECODE_TOKENS, "serving": SERVING_TOKENS}.get(grid, tokens)


# (q heads, kv heads, head_dim) of real attention layers: Qwen3-0.6B/1.7B 16/8x128, Qwen2.5-7B
# 28/4x128, Llama-3-8B / Qwen3-8B 32/8x128, Qwen3-14B 40/8x128, Qwen3-32B / Llama-3-70B 64/8x128,
# Llama-3.1-405B 128/8x128, Gemma-2-2B 8/4x256, small models' 14/2x64.
MODEL_HEADS = (
    (16, 8, 128),
    (28, 4, 128),
    (32, 8, 128),
    (40, 8, 128),
    (64, 8, 128),
    (128, 8, 128),
    (8, 4, 256),
    (14, 2, 64),
)


# --------------------------------------------------------------------------------------------
# What a family script provides
# --------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One shape of one op.

    ``make_inputs(device)`` returns a fresh dict of everything the op needs, output buffers
    included (sgljit ops are destination passing). It is called K times to make the rotated copies.
    ``bytes``: bytes one call moves (each input read once, each output written once), an int or a
    function of the inputs dict. ``tokens`` is the plot's x value; cases of one op with the same
    ``series`` (e.g. ``"H=4096 bf16"``) form one panel of the plot.
    """

    label: str
    tokens: int
    make_inputs: Callable[[torch.device], Inputs]
    bytes: int | Callable[[Inputs], int]
    series: str = ""

    def nbytes(self, inputs: Inputs) -> int:
        return int(self.bytes(inputs) if callable(self.bytes) else self.bytes)


class Unavailable(Exception):
    """Raised by a provider's or floor's call that cannot run here (a Triton kernel given CPU
    tensors in a dry run): its cell reads "missing: <reason>", as for a package not installed."""


@dataclass
class Provider:
    """One implementation of an op.

    ``load()`` is called once per op and returns the callable that is timed, ``fn(inputs)``; if it
    raises (package not installed, op not there) the provider is reported as "missing: <reason>".
    ``prepare(inputs) -> inputs`` runs on every input copy before timing (e.g. to turn a cos/sin
    cache into the layout another library wants); it is not timed.
    """

    name: str
    load: Callable[[], Callable[[Inputs], Any]]
    prepare: Callable[[Inputs], Inputs] | None = None


@dataclass
class Op:
    """One op: its cases and providers; ``subject``'s speed-up over the best other one is reported.

    ``floor(inputs)``: reads the op's inputs and writes its outputs (the bytes ``Case.bytes``
    counts) and does nothing else; timed as the ``copy floor`` row, a reference and not a peer.
    """

    name: str
    cases: list[Case]
    providers: list[Provider]
    subject: str = SGLJIT
    floor: Callable[[Inputs], Any] | None = None


def fixed(fn: Callable[[Inputs], Any], name: str, prepare=None) -> Provider:
    """A provider that is always available (e.g. torch eager)."""
    return Provider(name, lambda: fn, prepare)


def torch_compiled(fn: Callable[[Inputs], Any], name: str = COMPILE, prepare=None) -> Provider:
    """``torch.compile(fn, dynamic=False)``: one static specialization per shape."""

    def load():
        _raise_dynamo_limits()
        return torch.compile(fn, dynamic=False)

    return Provider(name, load, prepare)


def standard_providers(
    sgljit_load: Callable[[], Callable[[Inputs], Any]],
    torch_fn: Callable[[Inputs], Any],
    liger_load: Callable[[], Callable[[Inputs], Any]] | None = None,
    *,
    liger_prepare: Callable[[Inputs], Inputs] | None = None,
) -> list[Provider]:
    """sgljit, torch eager, torch.compile of the same eager function, and Liger where one exists.

    ``torch_fn`` should *return* its result (not copy it into the output buffer: that adds a pass).
    """
    out = [
        Provider(SGLJIT, sgljit_load),
        fixed(torch_fn, EAGER),
        torch_compiled(torch_fn),
    ]
    if liger_load is not None:
        out.append(Provider(LIGER, liger_load, liger_prepare))
    return out


def nbytes(*tensors: torch.Tensor | None) -> int:
    """Sum of numel * element size (None is skipped)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def narrowing_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Reads contiguous ``src`` and writes contiguous ``dst`` of half its bytes (bf16 -> fp8) in
    one elementwise kernel that does nothing else: a floor for conversions to a type half as wide."""
    # 2-byte views (dst's words = the sum of src's two halves): torch's kernel then moves 16 bytes
    # a load, as for the ceiling's bf16, where 1-byte elements would move 8
    out = dst.view(-1).view(torch.int16)
    words = src.view(-1).view(torch.int16)
    torch.add(words[: out.numel()], words[out.numel() :], out=out)


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------
def _raise_dynamo_limits() -> None:
    cfg = torch._dynamo.config
    for name in (
        "cache_size_limit",
        "recompile_limit",
        "accumulated_cache_size_limit",
        "accumulated_recompile_limit",
    ):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 1024))


def _compile_counts() -> tuple[int, int]:
    """torch.compile's FX graph cache (hits, misses) so far in this process."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_name() -> str:
    """GPU name if torch sees a CUDA GPU, else 'cpu-<model>' (used as the results folder)."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "cpu " + cpu_name()


def results_dir(machine: str | None = None) -> Path:
    d = RESULTS_DIR / slug(machine or machine_name())
    d.mkdir(parents=True, exist_ok=True)
    return d


def versions() -> dict[str, str]:
    """Versions of what the numbers depend on (installed distributions; nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "torch": torch.__version__}
    if torch.version.cuda:
        out["cuda"] = torch.version.cuda
    for dist in ("triton", "apache-tvm-ffi", "sgljit", "liger-kernel"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "missing"
    try:  # the sglang-jit provider's fetched tree (sglang_provider.py; a file read, no import)
        from sglang_provider import version as sglang_jit_version

        out["sglang-jit"] = sglang_jit_version() or "missing"
    except ImportError:
        pass
    return out


def l2_bytes() -> int:
    if torch.cuda.is_available():
        n = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)
        if n:
            return int(n)
    return DEFAULT_L2_BYTES


def command_line() -> str:
    argv = list(sys.argv)
    if argv:
        with contextlib.suppress(ValueError):
            argv[0] = str(Path(argv[0]).resolve().relative_to(RESULTS_DIR.parent.parent))
    return " ".join(shlex.quote(a) for a in ["python3", *argv])


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------
def _capture(fn: Callable[[], Any], calls: int) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return g


def bench_cudagraph_ms(fn: Callable[[], Any], rep_ms: float = 25.0) -> float:
    """Median ms per ``fn()`` over 10 replays of one CUDA graph that calls fn n times, n such that
    a replay lasts about ``rep_ms``. This is triton.testing.do_bench_cudagraph's method, except
    that n comes from replaying a one-call graph rather than from five eager calls: over thousands
    of small input copies eager calls are host-bound, cost seconds a case and say nothing of the
    GPU's time. One eager call first does the builds, compiles and autotuning."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def replay_ms(g: torch.cuda.CUDAGraph) -> float:
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    with torch.cuda.stream(torch.cuda.Stream()):  # graphs cannot be captured on the default stream
        fn()
        g = _capture(fn, 1)
        replay_ms(g)  # the first replay uploads the graph
        calls = max(1, int(rep_ms / max(replay_ms(g), 1e-3)))
        if calls > 1:
            g.reset()  # frees its memory pool before the bigger graph takes one
            g = _capture(fn, calls)
            replay_ms(g)
        times = [replay_ms(g) / calls for _ in range(10)]
    return statistics.median(times)


TIMER = "CUDA-graph replays, median of 10 (harness.bench_cudagraph_ms)"


def call_each(fn: Callable[[Inputs], Any], copies: Sequence[Inputs]) -> list[Any]:
    """fn on each copy in turn, every result kept until the last call: outputs an op allocates take
    K distinct buffers, as its inputs do. Dropped at once they would be recycled by the allocator (in
    a graph too), and the next call would write into lines still in the L2, a cache hit that
    destination-passing ops (writing into each copy's own output) never get."""
    return [fn(c) for c in copies]


def time_rotated(fn: Callable[[Inputs], Any], copies: Sequence[Inputs], rep_ms: float) -> float:
    """µs per call: one graph that calls fn on each copy once, timed by bench_cudagraph_ms."""

    def run_all():
        call_each(fn, copies)

    ms = bench_cudagraph_ms(run_all, rep_ms)
    return ms * 1e3 / len(copies)


_CEILING: tuple[float, str] | None = None


def streaming_ceiling(gib: float = 4.0, rep_ms: float = 100.0) -> tuple[float, str]:
    """Measured streaming bandwidth in GB/s (bytes read + bytes written) and a description.

    ``torch.mul(a, 1, out=b)`` on ``gib`` GiB of bf16 (a vectorized elementwise read+write kernel;
    a D2D ``copy_`` in a graph goes through the copy engine and is slower, so it is not used).
    Cached per process.
    """
    global _CEILING
    if _CEILING is not None:
        return _CEILING
    free, _total = torch.cuda.mem_get_info()
    size = min(int(gib * 2**30), int(free * 0.4))  # bytes of a (and of b)
    n = (size // 2) // 4096 * 4096
    a = torch.ones(n, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        torch.mul(a, 1, out=b)
    torch.cuda.synchronize()

    def step():
        torch.mul(a, 1, out=b)

    ms = bench_cudagraph_ms(step, rep_ms)
    gbps = 2 * a.nbytes / (ms * 1e-3) / 1e9
    desc = (
        f"torch.mul(a, 1, out=b), a = {a.nbytes / 2**30:.2f} GiB bf16, "
        f"{ms * 1e3:.0f} µs, read + write counted"
    )
    a = b = None
    torch.cuda.empty_cache()
    _CEILING = (gbps, desc)
    return _CEILING


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------
@dataclass
class Cell:
    provider: str
    us: float | None = None
    error: str | None = None  # "missing: ..." or "failed: ..."


@dataclass
class CaseResult:
    case: Case
    bytes: int
    copies: int
    cells: dict[str, Cell] = field(default_factory=dict)


@dataclass
class OpResult:
    op: Op
    cases: list[CaseResult] = field(default_factory=list)
    untimed: list[Case] = field(default_factory=list)  # --budget ran out before them


def _short(e: BaseException, limit: int = 160) -> str:
    """One line for a table cell: paths under the repo root made relative (results are committed),
    and the root cause of a tvm-ffi tensor check (sglang's jit_kernel: "- Root cause: ...") first."""
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    cause = next((x for x in lines if x.startswith("- Root cause:")), None)
    if cause:
        lines = [cause.removeprefix("- "), *(x for x in lines if x is not cause)]
    msg = f"{type(e).__name__}: {' '.join(lines)}".replace("|", "/")
    msg = msg.replace(str(RESULTS_DIR.parent.parent) + "/", "")
    return msg if len(msg) <= limit else msg[: limit - 1] + "…"


def _tensor_bytes(inputs: Inputs, shared_with: Inputs | None = None) -> int:
    """Bytes of the tensors in inputs; with shared_with, only those it does not share (a tensor
    every copy shares, like a rope cos/sin cache, costs no memory per copy)."""
    total = 0
    for key, v in inputs.items():
        if not isinstance(v, torch.Tensor):
            continue
        other = shared_with.get(key) if shared_with else None
        if isinstance(other, torch.Tensor) and other.data_ptr() == v.data_ptr():
            continue
        total += v.numel() * v.element_size()
    return total


def _timed_providers(op: Op, args: argparse.Namespace) -> list[Provider]:
    """The providers --providers keeps and --without does not drop, then the op's floor unless
    --no-floor (--providers does not drop it: it is what the peers' times are read against)."""
    only = set(args.providers.split(",")) if args.providers else None
    without = set(args.without.split(",")) if args.without else set()
    out = [p for p in op.providers if (not only or p.name in only) and p.name not in without]
    if op.floor is not None and not args.no_floor:
        out.append(fixed(op.floor, FLOOR))
    return out


def _load_providers(providers: list[Provider]) -> dict[str, Callable | str]:
    loaded: dict[str, Callable | str] = {}
    for p in providers:
        try:
            loaded[p.name] = p.load()
        except Exception as e:
            loaded[p.name] = "missing: " + _short(e)
    return loaded


def _selected_cases(op: Op, args: argparse.Namespace) -> list[Case]:
    """The op's cases this run times (--tokens; --dry-run: the smallest)."""
    cases = op.cases
    if args.tokens:
        want = {int(t) for t in args.tokens.split(",")}
        cases = [c for c in cases if c.tokens in want]
    return _dry_run_cases(cases) if args.dry_run else cases


def _precompile_cases(
    factory, grid: str, op_name: str, keys: list[str], names: list[str], device: str
) -> int:
    """In a worker process: each named provider (or the floor, FLOOR) called once on each listed
    case's inputs, which leaves what they build in the on-disk caches: sgljit's and sglang's
    modules, torch.compile's graphs, Triton's kernels. Returns the calls that ran; one that fails
    is left for the run to time and report."""
    # The bench script is this process's __mp_main__, registered before torch: pickle (Python
    # 3.11) then names torch.contiguous_format "__mp_main__.torch.contiguous_format" in the cache
    # key of every graph, and no key matched the run's. Listed last, torch's own modules come first.
    main = sys.modules.pop("__mp_main__", None)
    if main is not None:
        sys.modules["__mp_main__"] = main
    _raise_dynamo_limits()
    op = next(o for o in factory(grid) if o.name == op_name)
    providers = [p for p in op.providers if p.name in names]
    if FLOOR in names and op.floor is not None:
        providers.append(fixed(op.floor, FLOOR))
    fns = []
    for p in providers:
        with contextlib.suppress(Exception):  # the run reports it as missing
            fns.append((p, p.load()))
    wanted, calls = set(keys), 0
    for case in op.cases:
        if case_key(case) not in wanted:
            continue
        with contextlib.suppress(Exception):  # out of memory beside the other workers, say
            inputs = case.make_inputs(torch.device(device))
            for p, fn in fns:
                with contextlib.suppress(Exception):
                    fn(p.prepare(inputs) if p.prepare else inputs)
                    calls += 1
        inputs = None
        if device == "cuda":  # what a large case reserved goes back for the other workers
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return calls


def _series_first(cases: Sequence[Case]) -> list[Case]:
    """The cases reordered: every series' first case, then every series' second, ... Dealt out to
    the precompile workers, a series' module (its width) is built by one worker while the others
    build other series' instead of waiting on its lock."""
    seen: dict[str, int] = {}
    ranked = []
    for i, case in enumerate(cases):
        ranked.append((seen.get(case.series, 0), i, case))
        seen[case.series] = seen.get(case.series, 0) + 1
    return [case for _, _, case in sorted(ranked, key=lambda r: r[:2])]


class Precompiler:
    """--precompile JOBS: before a case is timed, it and the next cases not built yet (2 × JOBS in
    all) are called once with every provider the run times, in JOBS worker processes
    (:func:`_precompile_cases`). The builds that would run one at a time in the run (a module per
    width for sgljit and for sglang's jit_kernel, a static torch.compile graph a shape, Triton's
    kernels: seconds each) then load from their on-disk caches. Chunks just ahead of the timing,
    not the whole grid first: a run that --budget stops has built little it did not time."""

    def __init__(self, factory, args: argparse.Namespace, device: torch.device):
        self.factory, self.args, self.device = factory, args, device
        self.jobs = args.precompile
        self.built: set[tuple[str, str]] = set()
        self.pool = None
        self.calls = self.total = 0
        self.seconds = 0.0

    def ahead(self, op: Op, case: Case, todo: Sequence[Case]) -> None:
        """Builds for ``case``, about to be timed, and the cases of ``todo`` (the op's cases this
        run times, in order) after it, unless done already: the ones before it all were."""
        if (op.name, case_key(case)) in self.built:
            return
        chunk = [c for c in todo if (op.name, case_key(c)) not in self.built][: 2 * self.jobs]
        names = [p.name for p in _timed_providers(op, self.args)]
        keys = [case_key(c) for c in _series_first(chunk)]
        if self.pool is None:
            import concurrent.futures
            import multiprocessing

            context = multiprocessing.get_context("spawn")
            self.pool = concurrent.futures.ProcessPoolExecutor(self.jobs, mp_context=context)
        t0 = time.perf_counter()
        futures = [
            self.pool.submit(
                _precompile_cases, self.factory, self.args.grid, op.name, keys[i :: self.jobs],
                names, self.device.type,
            )
            for i in range(min(self.jobs, len(keys)))
        ]  # fmt: skip
        for fut in futures:
            try:
                self.calls += fut.result()
            except Exception as e:  # those builds happen when the cases are timed, as without it
                print(f"    precompile: {_short(e)}", flush=True)
        self.total += len(keys) * len(names)
        self.seconds += time.perf_counter() - t0
        self.built.update((op.name, k) for k in keys)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        if self.total:
            print(
                f"precompile: {self.calls} of {self.total} provider calls in {self.seconds:.0f} s "
                f"({self.jobs} processes, chunks ahead of the timing)",
                flush=True,
            )


def run_op(
    op: Op,
    args: argparse.Namespace,
    device: torch.device,
    done: Mapping[tuple[str, str], list[dict]] | None = None,
    deadline: float | None = None,
    on_case: Callable[[CaseResult], None] | None = None,
    precompiler: Precompiler | None = None,
) -> OpResult:
    """Time the op's selected cases. ``done``: an earlier run's records by (op, case), rebuilt
    instead of timed (--resume); ``deadline``: time.monotonic() after which no case starts
    (--budget); ``on_case``: called with each case timed; ``precompiler``: builds ahead of the
    cases (--precompile)."""
    done = done or {}
    providers = _timed_providers(op, args)
    res = OpResult(op)
    cases = _selected_cases(op, args)
    todo = [c for c in cases if (op.name, case_key(c)) not in done]
    loaded = _load_providers(providers) if todo else {}
    l2 = l2_bytes()
    for case in cases:
        records = done.get((op.name, case_key(case)))
        if records is not None:
            res.cases.append(_resumed_case(case, records))
            continue
        if deadline is not None and time.monotonic() > deadline:
            res.untimed.append(case)
            continue
        if precompiler is not None:
            precompiler.ahead(op, case, todo)
        print(f"[{op.name}] {case.label} ...", flush=True)
        case_started = time.monotonic()
        try:
            first = case.make_inputs(device)
            nb = case.nbytes(first)
        except Exception as e:
            cr = CaseResult(case, 0, 0)
            for name in loaded:
                cr.cells[name] = Cell(name, error="failed: make_inputs: " + _short(e))
            res.cases.append(cr)
            if on_case is not None:
                on_case(cr)
            continue
        second = None
        if args.dry_run:
            k = 1
        else:
            k = max(1, math.floor(2 * l2 / max(nb, 1)) + 1)
            k = min(k, args.max_copies)
            second = case.make_inputs(device) if k > 1 else None
            per_copy = _tensor_bytes(second, shared_with=first) if second else _tensor_bytes(first)
            k = min(k, max(1, int(args.max_copy_gib * 2**30) // max(per_copy, 1)))
        copies = [first] + ([second] if second is not None and k > 1 else [])
        copies += [case.make_inputs(device) for _ in range(k - len(copies))]
        second = None
        cr = CaseResult(case, nb, k)
        for p in providers:
            fn = loaded[p.name]
            if isinstance(fn, str):
                cr.cells[p.name] = Cell(p.name, error=fn)
                continue
            try:
                pc = [p.prepare(c) for c in copies] if p.prepare else copies
                us = _time_cpu(fn, pc) if args.dry_run else time_rotated(fn, pc, args.rep)
                cr.cells[p.name] = Cell(p.name, us=us)
                if args.kernels and not args.dry_run:
                    try:
                        print(f"    {p.name} kernels: {kernel_times(fn, pc)}", flush=True)
                    except Exception as e:  # a diagnostic: never fails the case
                        print(f"    {p.name} kernels: failed: {_short(e)}", flush=True)
            except (ImportError, Unavailable) as e:  # cannot run here (no Triton, no GPU)
                cr.cells[p.name] = Cell(p.name, error="missing: " + _short(e))
            except Exception as e:
                if args.verbose:
                    traceback.print_exc()
                cr.cells[p.name] = Cell(p.name, error="failed: " + _short(e))
            finally:
                pc = None
                if device.type == "cuda":
                    with contextlib.suppress(Exception):
                        torch.cuda.synchronize()
        res.cases.append(cr)
        if on_case is not None:
            on_case(cr)
        line = ", ".join(
            f"{c.provider} {_fmt_us(c.us)} µs" if c.us is not None else f"{c.provider} {c.error}"
            for c in cr.cells.values()
        )
        spent = time.monotonic() - case_started
        print(f"    K={k}, {nb / 1e6:.3g} MB/call: {line} ({spent:.1f} s)", flush=True)
        del copies, first
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return res


def _resumed_case(case: Case, records: list[dict]) -> CaseResult:
    """A case as an earlier run's --json records give it."""
    cr = CaseResult(case, records[0]["bytes"], records[0].get("copies", 0))
    for r in records:
        cr.cells[r["provider"]] = Cell(r["provider"], us=r["us"], error=r["error"])
    return cr


def _finished_cases(
    records: list[dict], family: str, ops: Sequence[Op], args: argparse.Namespace
) -> dict[tuple[str, str], list[dict]]:
    """--resume: the earlier run's records by (op, case), for the cases that have a record of
    every provider this run would time (failed cells count: they are results too)."""
    by_case: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if r.get("family") == family:
            by_case.setdefault((r["op"], r["case"]), []).append(r)
    finished = {}
    for op in ops:
        wanted = {p.name for p in _timed_providers(op, args)}
        for case in _selected_cases(op, args):
            have = by_case.get((op.name, case_key(case)), [])
            if have and wanted and wanted <= {r["provider"] for r in have}:
                finished[(op.name, case_key(case))] = [r for r in have if r["provider"] in wanted]
    return finished


def _write_records(path: str, records: list[dict]) -> None:
    """Replace the file whole, so a run stopped mid-write leaves the previous version."""
    file = Path(path)
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(records, indent=1) + "\n")
    os.replace(tmp, file)


def _dry_run_cases(cases: list[Case]) -> list[Case]:
    """The two smallest token counts of each series."""
    by_series: dict[str, list[Case]] = {}
    for c in cases:
        by_series.setdefault(c.series, []).append(c)
    out = []
    for group in by_series.values():
        out.extend(sorted(group, key=lambda c: c.tokens)[:2])
    return out


def _time_cpu(fn: Callable[[Inputs], Any], copies: Sequence[Inputs]) -> float:
    fn(copies[0])
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn(copies[0])
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


# --------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------
def _fmt_us(us: float | None) -> str:
    if us is None:
        return "–"
    if us < 10:
        return f"{us:.2f}"
    if us < 1000:
        return f"{us:.1f}"
    return f"{us:.0f}"


def gbps(nb: int, us: float) -> float:
    return nb / (us * 1e-6) / 1e9


def peer_at_floor(peer_us: float, floor_us: float | None) -> bool:
    """The peer moves the bytes as fast as the copy floor, within AT_FLOOR_TOLERANCE either way (a
    peer further ahead shows the floor kernel is no floor for that case)."""
    return floor_us is not None and abs(peer_us / floor_us - 1) <= AT_FLOOR_TOLERANCE


def _short_of_peer_at_floor(subject_us: float, best_us: float, floor: Cell | None) -> bool:
    """The subject is short of matching the best peer, and that peer is at the copy floor."""
    return best_us / subject_us < MATCH_RATIO and peer_at_floor(
        best_us, floor.us if floor else None
    )


def op_table(res: OpResult, ceiling: float | None) -> str:
    subject = res.op.subject
    lines = [
        f"| case | provider | µs | GB/s | % of ceiling | {subject} speed-up |",
        "|---|---|---:|---:|---:|---|",
    ]
    for cr in res.cases:
        subj = cr.cells.get(subject)
        peers = [
            c for c in cr.cells.values() if c.provider not in (subject, FLOOR) and c.us is not None
        ]
        best = min(peers, key=lambda c: c.us) if peers else None
        first = True
        for cell in cr.cells.values():
            name_ = f"{cr.case.series}, {cr.case.label}" if cr.case.series else cr.case.label
            label = f"{name_} ({cr.bytes / 1e6:.3g} MB, K={cr.copies})" if first else ""
            first = False
            if cell.us is None:
                lines.append(f"| {label} | {cell.provider} | {cell.error} | | | |")
                continue
            gb = gbps(cr.bytes, cell.us) if cr.bytes else 0.0
            pct = f"{100 * gb / ceiling:.0f}%" if ceiling else "–"
            if cell.provider == subject:
                sp = f"**{best.us / cell.us:.2f}×** vs {best.provider}" if best else "–"
                if best and _short_of_peer_at_floor(cell.us, best.us, cr.cells.get(FLOOR)):
                    sp += " (peer at the copy floor)"
            elif subj is not None and subj.us is not None:
                sp = f"{cell.us / subj.us:.2f}×"
            else:
                sp = ""
            name = f"**{cell.provider}**" if cell.provider == subject else cell.provider
            lines.append(f"| {label} | {name} | {_fmt_us(cell.us)} | {gb:.0f} | {pct} | {sp} |")
    return "\n".join(lines)


def header(
    family: str,
    machine: str,
    ceiling: tuple[float, str] | None,
    dry_run: bool,
    copy_floor: bool = False,
) -> str:
    v = versions()
    vtxt = ", ".join(f"{k} {val}" for k, val in v.items())
    out = [f"# {family} — {machine}", ""]
    if dry_run:
        out += ["**Dry run on the CPU: wiring check only, these are not benchmark numbers.**", ""]
    out += [
        f"- command: `{command_line()}`",
        f"- date: {now_utc()}",
        f"- versions: {vtxt}",
    ]
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.append(
            f"- GPU: {p.name}, {p.multi_processor_count} SMs, L2 {l2_bytes() / 2**20:.0f} MiB, "
            f"{p.total_memory / 2**30:.0f} GiB"
        )
    if ceiling:
        out.append(f"- streaming ceiling: **{ceiling[0]:.0f} GB/s** ({ceiling[1]})")
    out += [
        f"- timing: {TIMER}; one graph calls the op once on each of K input copies "
        "(K × bytes > 2 × L2, so nothing is timed from cache), time ÷ K; host overhead excluded",
        "- bytes: each input read once, each output written once; GB/s = bytes ÷ time",
        "- speed-up: best other provider's time ÷ the subject's (subject row); "
        "other rows: their time ÷ the subject's",
    ]
    if copy_floor:
        out.append(
            f"- {FLOOR}: kernels that only move the op's bytes (described under the op); not a "
            f"provider, never the best other one; a subject below {MATCH_RATIO}× whose best peer "
            f'is within {AT_FLOOR_TOLERANCE:.0%} of the floor reads "(peer at the copy floor)"'
        )
    return "\n".join(out)


def plot_family(path: Path, family: str, results: list[OpResult], ceiling: float | None) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"plot skipped: {e}"
    panels = []
    for r in results:
        series: dict[str, list[CaseResult]] = {}
        for cr in r.cases:
            series.setdefault(cr.case.series, []).append(cr)
        for s, crs in series.items():
            panels.append((f"{r.op.name} {s}".strip(), r.op.subject, crs))
    if not panels:
        return "plot skipped: no results"
    ncols = min(2, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7 * ncols, 4.5 * nrows), squeeze=False)
    for ax, (title, subject, crs) in zip(axes.flat, panels, strict=False):
        crs = sorted(crs, key=lambda c: c.case.tokens)
        providers: list[str] = []
        for cr in crs:
            providers += [p for p in cr.cells if p not in providers]
        for p in providers:
            pts = [
                (cr.case.tokens, gbps(cr.bytes, cr.cells[p].us))
                for cr in crs
                if p in cr.cells and cr.cells[p].us is not None and cr.bytes
            ]
            label = p
            if not pts:
                err = next((cr.cells[p].error for cr in crs if p in cr.cells), "") or ""
                ax.plot([], [], label=f"{p} ({err.split(':')[0]})")
                continue
            xs, ys = zip(*pts, strict=True)
            if p == FLOOR:
                ax.plot(xs, ys, color="grey", linestyle="--", linewidth=1.5, label=label)
            else:
                ax.plot(xs, ys, marker="o", label=label, linewidth=2.5 if p == subject else 1.5)
        if ceiling:
            ax.axhline(
                ceiling,
                color="black",
                linestyle="--",
                linewidth=1,
                label=f"ceiling {ceiling:.0f} GB/s",
            )
        ax.set_xscale("log")
        ticks = sorted({cr.case.tokens for cr in crs})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("tokens")
        ax.set_ylabel("GB/s")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"{family} — {machine_name()}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot: {path}"


def parse_args(argv: Sequence[str] | None, family: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=f"benchmark the {family} family")
    ap.add_argument("--tokens", help="only these token counts (comma separated)")
    ap.add_argument("--providers", help="only these providers (comma separated)")
    ap.add_argument("--without", help="not these providers (comma separated), e.g. torch")
    ap.add_argument("--ops", help="only these ops (comma separated)")
    ap.add_argument(
        "--grid",
        choices=GRIDS,
        default="default",
        help="default: the family's headline shapes; models: the grid of real models' shapes; "
        "decode: those shapes at decode batch sizes (1-256 tokens); serving: at 1, 2, 8, 64 and 512 "
        "tokens; quick: a subset of the models grid",
    )
    ap.add_argument(
        "--series", help="only cases whose series contains one of these (comma separated)"
    )
    ap.add_argument(
        "--cases",
        help="only the cases a JSON list of {family, op, case} records names (benchmarks/"
        "verdict.py --rerun writes one: the cells a second machine start must time)",
    )
    ap.add_argument(
        "--precompile",
        type=int,
        default=0,
        metavar="JOBS",
        help="call every provider once on each case in JOBS processes, a few cases ahead of "
        f"the timing, so that the run's builds (sgljit and sglang modules, {COMPILE} graphs, "
        "Triton kernels) load from their on-disk caches; 0: each builds when it is timed",
    )
    ap.add_argument("--rep", type=float, default=25.0, help="ms of graph replays per sample")
    ap.add_argument("--max-copies", type=int, default=8192, help="cap on rotated input copies")
    ap.add_argument("--max-copy-gib", type=float, default=16.0, help="cap on memory of copies")
    ap.add_argument("--ceiling", type=float, help="use this ceiling (GB/s) instead of measuring")
    ap.add_argument("--out", help="results folder (default benchmarks/results/<gpu>)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument(
        "--kernels",
        action="store_true",
        help="also print each provider's GPU kernels and their mean time (torch.profiler; "
        "set SGLJIT_PDL=0 so that consecutive kernels do not overlap)",
    )
    ap.add_argument(
        "--json",
        help="also write every timed cell to this JSON file, after each case (benchmarks/ab.py "
        "and verdict.py read it)",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the cases --json's file already has (every provider timed) instead of timing "
        "them again; the tables cover both",
    )
    ap.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="start no case after this many seconds of the run; --resume times the rest later",
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU needed: call every provider on the two smallest cases on the CPU",
    )
    ap.add_argument(
        "--no-floor",
        action="store_true",
        help=f"do not time the ops' floors (the '{FLOOR}' row: a kernel that only moves the bytes)",
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="print tracebacks")
    args = ap.parse_args(argv)
    if args.precompile < 0:
        ap.error(f"--precompile: expected a number of processes >= 0, got {args.precompile}")
    if args.cases:
        args.cases = _case_list(ap, args.cases)
    if args.resume and not args.json:
        ap.error("--resume: needs --json FILE (the records it continues)")
    if args.budget is not None and args.budget <= 0:
        ap.error(f"--budget: expected seconds > 0, got {args.budget}")
    args.records = []
    if args.resume and Path(args.json).exists():  # a first run has no file yet
        keys = ("family", "op", "case", "provider", "bytes")
        args.records = _json_records(
            ap, "--resume", args.json, lambda r: all(k in r for k in keys), "a --json run's records"
        )
    return args


def _case_list(ap: argparse.ArgumentParser, path: str) -> list[dict[str, str]]:
    """--cases' file: a JSON list of {family, op, case} records (verdict.py --rerun's)."""
    keys = ("family", "op", "case")
    return _json_records(
        ap,
        "--cases",
        path,
        lambda r: all(isinstance(r.get(k), str) for k in keys),
        "a JSON list of {family, op, case} records",
    )


def _json_records(
    ap: argparse.ArgumentParser,
    option: str,
    path: str,
    valid: Callable[[dict], bool],
    expected: str,
) -> list[dict]:
    """An option's file: a JSON list of records each ``valid``; otherwise ap.error names the option."""
    try:
        records = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        ap.error(f"{option}: cannot read {path} as JSON: {e}")
    if not isinstance(records, list) or not all(isinstance(r, dict) and valid(r) for r in records):
        ap.error(f"{option}: {path} must hold {expected}")
    return records


def kernel_times(fn: Callable[[Inputs], Any], copies: list[Inputs], calls: int = 20) -> str:
    """The GPU kernels `calls` calls of fn launch (rotating over the copies, outside graphs), as
    'name mean-µs ×launches-per-call', by total time."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            fn(copies[i % len(copies)])
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.count > 0]
    rows.sort(key=lambda e: -e.device_time_total)
    parts = []
    for e in rows[:6]:
        name = re.sub(r"\s+", " ", e.key)
        name = name if len(name) <= 70 else name[:69] + "…"
        parts.append(f"{name} {e.device_time_total / e.count:.2f} µs ×{e.count / calls:g}")
    return "; ".join(parts) or "none recorded"


def case_key(case: Case) -> str:
    """A case's name in --json records and --cases lists: "<series>, <label>" (or the label)."""
    return f"{case.series}, {case.label}" if case.series else case.label


def case_records(
    family: str, op: str, cr: CaseResult, ceiling_gbps: float | None, l2: int
) -> list[dict[str, Any]]:
    """A case's --json records: one per provider."""
    return [
        {
            "family": family,
            "op": op,
            "case": case_key(cr.case),
            "tokens": cr.case.tokens,
            "provider": cell.provider,
            "us": cell.us,
            "error": cell.error,
            "bytes": cr.bytes,
            "copies": cr.copies,
            "ceiling_gbps": ceiling_gbps,
            "l2_bytes": l2,
        }
        for cell in cr.cells.values()
    ]


def run_family(
    family: str,
    ops: Iterable[Op] | Callable[[str], Iterable[Op]],
    argv: Sequence[str] | None = None,
) -> int:
    """Benchmark a family; print the tables, write <family>.md and <family>.png (<family>-<grid>
    for the other grids). ``ops``: the ops, or a function of the grid name (``--grid``) returning
    them. Returns an exit code: 0, or 1 if a subject provider is missing or failed on some case.
    Without a CUDA GPU (and without --dry-run) it prints a skip line and returns 0."""
    started = time.monotonic()
    args = parse_args(argv, family)
    factory = ops
    ops = list(ops(args.grid) if callable(ops) else ops)
    if args.series:
        wanted_series = args.series.split(",")
        for op in ops:
            op.cases = [c for c in op.cases if any(w in c.series for w in wanted_series)]
    if args.ops:
        wanted = set(args.ops.split(","))
        unknown = wanted - {op.name for op in ops}
        if unknown:
            print(f"unknown op(s) {sorted(unknown)}; {family} has {[op.name for op in ops]}")
            return 2
        ops = [op for op in ops if op.name in wanted]
    if args.cases:  # after --ops: an op the list leaves empty is dropped, not "unknown"
        listed = {(r["op"], r["case"]) for r in args.cases if r["family"] == family}
        for op in ops:
            op.cases = [c for c in op.cases if (op.name, case_key(c)) in listed]
        ops = [op for op in ops if op.cases]
    if not args.dry_run and not torch.cuda.is_available():
        print(
            f"SKIP bench_{family}: needs a CUDA GPU (torch.cuda.is_available() is False); "
            "use --dry-run to check the wiring on the CPU"
        )
        return 0
    device = torch.device("cpu" if args.dry_run else "cuda")
    machine = machine_name()
    ceiling = None
    if not args.dry_run:
        if args.ceiling:
            ceiling = (args.ceiling, "given on the command line")
        else:
            ceiling = streaming_ceiling()
        print(f"streaming ceiling: {ceiling[0]:.0f} GB/s ({ceiling[1]})", flush=True)
    finished = _finished_cases(args.records, family, ops, args)
    # Records this run does not time again stay in --json's file as they were.
    todo = {
        (op.name, case_key(c))
        for op in ops
        for c in _selected_cases(op, args)
        if (op.name, case_key(c)) not in finished
    }
    kept = [
        r for r in args.records if r.get("family") != family or (r["op"], r["case"]) not in todo
    ]
    if finished:
        print(f"resumed: {len(finished)} case(s) from {args.json}", flush=True)
    precompiler = (
        Precompiler(factory, args, device) if args.precompile and callable(factory) else None
    )
    compiled = _compile_counts() if args.precompile else None  # imports dynamo: only when asked
    l2 = l2_bytes()
    fresh: list[dict] = []

    def record(op_name: str) -> Callable[[CaseResult], None]:
        def on_case(cr: CaseResult) -> None:
            fresh.extend(case_records(family, op_name, cr, ceiling[0] if ceiling else None, l2))
            if args.json:
                _write_records(args.json, kept + fresh)

        return on_case

    deadline = started + args.budget if args.budget is not None else None
    try:
        results = [
            run_op(op, args, device, finished, deadline, record(op.name), precompiler) for op in ops
        ]
    finally:
        if precompiler is not None:
            precompiler.close()
    if compiled is not None:
        hits, misses = (a - b for a, b in zip(_compile_counts(), compiled, strict=True))
        print(f"{COMPILE}: {hits} of {hits + misses} graphs came from the cache")
    timed_floor = not args.no_floor and any(op.floor is not None for op in ops)
    head = header(family, machine, ceiling, args.dry_run, copy_floor=timed_floor)
    body = [head]
    if finished:
        body += [
            f"- resumed: {len(finished)} case(s) as an earlier run's `--json` records give them"
        ]
    for r in results:
        body += ["", f"## {r.op.name}", ""]
        if timed_floor and r.op.floor is not None and r.op.floor.__doc__:
            body += [f"{FLOOR}: {' '.join(r.op.floor.__doc__.split())}", ""]
        body.append(op_table(r, ceiling[0] if ceiling else None))
    text = "\n".join(body) + "\n"
    write = not args.no_write and (not args.dry_run or args.out)
    if write:
        out_dir = Path(args.out) if args.out else results_dir(machine)
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = family if args.grid == "default" else f"{family}-{args.grid}"
        png = out_dir / f"{stem}.png"
        note = plot_family(png, family, results, ceiling[0] if ceiling else None)
        if png.exists():
            text += f"\n![{family}]({stem}.png)\n"
        (out_dir / f"{stem}.md").write_text(text)
        print(text)
        print(f"written: {out_dir / (stem + '.md')}; {note}")
    else:
        print(text)
    if args.json:
        _write_records(args.json, kept + fresh)
    untimed = sum(len(r.untimed) for r in results)
    if untimed:
        print(f"budget: {untimed} case(s) not timed; run again with --resume to time them")
    bad = [
        f"{r.op.name} {cr.case.label}: {cr.cells[r.op.subject].error}"
        for r in results
        for cr in r.cases
        if r.op.subject in cr.cells and cr.cells[r.op.subject].us is None
    ]
    if bad:
        print(f"!! {len(bad)} case(s) without a {results[0].op.subject if results else ''} time:")
        for b in bad:
            print("   ", b)
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="measure the streaming ceiling (GB/s)")
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("SKIP ceiling: needs a CUDA GPU (torch.cuda.is_available() is False)")
        return 0
    gbps, desc = streaming_ceiling(args.gib)
    text = "\n".join(
        [
            f"# streaming ceiling — {machine_name()}",
            "",
            f"- command: `{command_line()}`",
            f"- date: {now_utc()}",
            "- versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()),
            f"- timing: {TIMER}",
            "",
            f"**{gbps:.0f} GB/s** — {desc}",
            "",
        ]
    )
    print(text)
    if not args.no_write:
        path = results_dir() / "ceiling.md"
        path.write_text(text)
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

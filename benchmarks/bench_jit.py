"""Benchmark of the JIT machinery (no GPU needed; GPU rows are added when one is present).

    python3 benchmarks/bench_jit.py [--repeats N] [--no-write]

Measures, each as the median over fresh processes (or calls):
  - ``import sgljit`` + plugin discovery, with torch already imported (target ≤ 30 ms);
  - warm load of a cached module in a fresh process: ``sgljit.load_jit(...)`` of a module already in
    the cache, including the first import of tvm_ffi (target ≤ 20 ms of sgljit's own time), also
    with 50 000 unrelated files in its source folder, and a SYCL module on the SYCL CPU device
    (its saved device binary) where the SYCL runtime is installed;
  - cold build of one specialization into an empty cache (C++; CUDA too when nvcc is found);
  - eager host overhead per call: the bare tvm-ffi call, a validating C++ op, a ``kernel_op``
    dispatch, torch for comparison; on a CUDA GPU also a JIT CUDA op and installed plugin ops;
  - on a CUDA GPU, the eager table: every sgljit op at one token, wall time per call of back-to-back
    eager calls, beside sglang's jit_kernel for the same op (the ``sglang-jit`` provider,
    benchmarks/sglang_provider.py), against the target: at most 6 µs, and never slower than sglang.
Writes benchmarks/results/<machine>/jit.md (``--eager-only``: only the eager table, to jit_eager.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "jit_sources"
TARGET_IMPORT_MS = 30.0
TARGET_WARM_MS = 20.0
TARGET_EAGER_US = 6.0
MARK = "@@BENCH@@"

# Loader code shared by the children and this process. CUDA arch: SGLJIT_CUDA_ARCH or torch's.
LOADERS = f"""
import sgljit
SOURCES = {str(SOURCES)!r}

def load_cpu(scale=3, source_dir=SOURCES):
    return sgljit.load_jit("bench_jit_scale", scale, cpp_files=["scale.h"],
                           cpp_wrappers=[("scale", f"ScaleCpu<{{scale}}>::run"), ("noop", "Noop::run")],
                           source_dir=source_dir)

def load_sycl(scale=3, source_dir=SOURCES):
    return sgljit.load_jit_sycl("bench_jit_scale_sycl", scale, sycl_files=[source_dir + "/scale.hpp"],
                                extra_sycl_cflags=[f"-DSCALE={{scale}}"], route="rtc")

def load_cuda(scale=3):
    return sgljit.load_jit("bench_jit_scale_cuda", scale, cuda_files=["scale.cuh"],
                           cuda_wrappers=[("scale", f"ScaleCuda<{{scale}}>::run"),
                                          ("scale_runtime_launch", f"ScaleCuda<{{scale}}>::run_runtime_launch"),
                                          ("scale_alloc", f"ScaleCuda<{{scale}}>::run_alloc")],
                           source_dir=SOURCES)
"""

CHILD_TORCH = """
import time, json
t0 = time.perf_counter(); import torch; t1 = time.perf_counter()
print(MARK + json.dumps({"ms": (t1 - t0) * 1e3}))
"""

CHILD_SGLJIT_AFTER_TORCH = """
import time, json
import torch
t0 = time.perf_counter()
import sgljit
from sgljit import plugins
found = plugins.discover()
ops = dir(sgljit.ops)
t1 = time.perf_counter()
print(MARK + json.dumps({"ms": (t1 - t0) * 1e3, "plugins": [p.name for p in found], "ops": ops}))
"""

CHILD_SGLJIT_ALONE = """
import time, json, sys
t0 = time.perf_counter()
import sgljit
from sgljit import plugins
plugins.discover(); dir(sgljit.ops)
t1 = time.perf_counter()
print(MARK + json.dumps({"ms": (t1 - t0) * 1e3, "torch_imported": "torch" in sys.modules}))
"""

CHILD_FIRST_OP = """
import time, json
import torch, sgljit
name = sorted(dir(sgljit.ops))[0]
t0 = time.perf_counter(); getattr(sgljit.ops, name); t1 = time.perf_counter()
print(MARK + json.dumps({"ms": (t1 - t0) * 1e3, "op": name}))
"""

CHILD_LOAD = """
import time, json, sys
import torch, sgljit
t0 = time.perf_counter()
import tvm_ffi
t1 = time.perf_counter()
import sgljit.cuda
t2 = time.perf_counter()
mod = LOADER()
t3 = time.perf_counter()
x = torch.ones(16, device=DEVICE); out = torch.empty_like(x)
mod.scale(x, out)
if DEVICE == "cuda": torch.cuda.synchronize()
t4 = time.perf_counter()
assert float(out[0]) == 3.0, out
print(MARK + json.dumps({"ms": (t3 - t0) * 1e3, "tvm_ffi_ms": (t1 - t0) * 1e3,
                         "import_ms": (t2 - t1) * 1e3, "load_ms": (t3 - t2) * 1e3,
                         "first_call_ms": (t4 - t3) * 1e3}))
"""


def child_env(cache_dir: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # tvm-ffi runs `ninja` from PATH: make this interpreter's scripts folder visible.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("SGLJIT_LOG", None)
    # An installed package imports from bytecode; measure that, not a compile of every source.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if cache_dir is not None:
        env["SGLJIT_CACHE_DIR"] = cache_dir
    return env


def run_child(code: str, env: dict[str, str], timeout: float = 600) -> dict:
    prog = f"MARK = {MARK!r}\n" + code
    r = subprocess.run(
        [sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=timeout
    )
    for line in r.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = (r.stdout + r.stderr).strip().splitlines()[-15:]
    raise RuntimeError(f"child failed (rc {r.returncode}):\n" + "\n".join(tail))


def med(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> str:
    return f"{min(values):.1f}–{max(values):.1f}" if len(values) > 1 else ""


class Report:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []  # what, value, range/n, note
        self.failed: list[str] = []

    def add(self, what: str, value: str, detail: str = "", note: str = "") -> None:
        self.rows.append((what, value, detail, note))
        print(f"  {what}: {value}  {detail}  {note}".rstrip(), flush=True)

    def error(self, what: str, err: BaseException | str) -> None:
        msg = str(err).strip().splitlines()
        short = msg[-1] if msg else repr(err)
        self.rows.append((what, "failed", "", short.replace("|", "/")[:200]))
        self.failed.append(what)
        print(f"  {what}: FAILED\n    " + "\n    ".join(msg[-15:]), flush=True)

    def skip(self, what: str, reason: str) -> None:
        self.rows.append((what, "skipped", "", reason))
        print(f"  {what}: skipped ({reason})", flush=True)

    def table(self) -> str:
        out = ["| measurement | value | range (n) | note |", "|---|---:|---|---|"]
        out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in self.rows]
        return "\n".join(out)


def verdict(value: float, target: float) -> str:
    return f"target ≤ {target:.0f} ms: {'met' if value <= target else 'NOT met'}"


def bench_import(rep: Report, n: int) -> None:
    env = child_env()
    run_child(CHILD_SGLJIT_AFTER_TORCH, env)  # warm the page cache and __pycache__
    torch_ms = [run_child(CHILD_TORCH, env)["ms"] for _ in range(n)]
    rep.add("import torch (fresh process)", f"{med(torch_ms):.0f} ms", f"{spread(torch_ms)} ({n})")
    res = [run_child(CHILD_SGLJIT_AFTER_TORCH, env) for _ in range(n)]
    ms = [r["ms"] for r in res]
    have_ops = bool(res[0]["ops"])
    plugins = ", ".join(res[0]["plugins"]) or "none installed"
    rep.add(
        "import sgljit + plugin discovery, over import torch",
        f"{med(ms):.1f} ms",
        f"{spread(ms)} ({n})",
        f"{verdict(med(ms), TARGET_IMPORT_MS)}; plugins: {plugins}; {len(res[0]['ops'])} ops",
    )
    res = [run_child(CHILD_SGLJIT_ALONE, env) for _ in range(n)]
    ms = [r["ms"] for r in res]
    rep.add(
        "import sgljit + plugin discovery, without torch",
        f"{med(ms):.1f} ms",
        f"{spread(ms)} ({n})",
        "torch imported by it: " + ("yes" if res[0]["torch_imported"] else "no"),
    )
    if have_ops:
        res = [run_child(CHILD_FIRST_OP, env) for _ in range(n)]
        ms = [r["ms"] for r in res]
        rep.add(
            f"first lookup of an op (sgljit.ops.{res[0]['op']}: imports its plugin)",
            f"{med(ms):.1f} ms",
            f"{spread(ms)} ({n})",
        )


def bench_load(rep: Report, n: int, kind: str, workdir: Path) -> None:
    """Cold build (empty cache) then warm loads in fresh processes, for kind 'cpu' or 'cuda'."""
    loader = "load_cpu" if kind == "cpu" else "load_cuda"
    device = "cpu" if kind == "cpu" else "cuda"
    label = "C++ (CPU)" if kind == "cpu" else "CUDA"
    build_code = (
        LOADERS
        + f"\nimport time, json\nt0 = time.perf_counter()\n{loader}()\n"
        + ("print(MARK + json.dumps({'ms': (time.perf_counter() - t0) * 1e3}))\n")
    )
    cold: list[float] = []
    cache = None
    n_cold = 3 if kind == "cpu" else 2
    for i in range(n_cold):
        cache = str(workdir / f"cache-{kind}-{i}")
        cold.append(run_child(build_code, child_env(cache))["ms"])
    rep.add(
        f"cold build of one specialization, {label} (empty cache)",
        f"{med(cold) / 1e3:.2f} s",
        f"{spread([c / 1e3 for c in cold])} s ({n_cold})",
        "compiler + link through tvm-ffi/ninja" + (f", arch {_arch()}" if kind == "cuda" else ""),
    )
    if kind == "cuda" and not _has_gpu():
        rep.skip("warm load of a cached module, CUDA (fresh process)", "needs a CUDA GPU")
        return
    code = LOADERS + CHILD_LOAD.replace("LOADER", loader).replace("DEVICE", repr(device))
    env = child_env(cache)
    run_child(code, env)  # first load after the build (page cache)
    res = [run_child(code, env) for _ in range(n)]
    ms = [r["ms"] for r in res]
    rep.add(
        f"warm load of a cached module, {label} (fresh process)",
        f"{med(ms):.1f} ms",
        f"{spread(ms)} ({n})",
        "of which import tvm_ffi (not sgljit's time) "
        f"{med([r['tvm_ffi_ms'] for r in res]):.1f} ms, import sgljit.cuda (+cache, filelock) "
        f"{med([r['import_ms'] for r in res]):.1f} ms, load_jit call "
        f"{med([r['load_ms'] for r in res]):.1f} ms; then first call "
        f"{med([r['first_call_ms'] for r in res]):.2f} ms",
    )
    rest = [r["import_ms"] + r["load_ms"] for r in res]
    rep.add(
        f"warm load, {label}, sgljit's own time (excluding the import of tvm_ffi)",
        f"{med(rest):.1f} ms",
        f"{spread(rest)} ({n})",
        f"{verdict(med(rest), TARGET_WARM_MS)}; import sgljit.cuda + load_jit call",
    )


CHILD_LOAD_SYCL = """
import time, json
import torch, sgljit
t0 = time.perf_counter()
from sgljit import sycl
lib = sycl.bridge()                      # loads libsycl and the bridge
t1 = time.perf_counter()
lib.sgljit_sycl_cpu_queue()              # the runtime finds the OpenCL CPU device
t2 = time.perf_counter()
mod = load_sycl(source_dir=SOURCE_DIR).build("cpu")   # key, lookup, verify, reload the binary
t3 = time.perf_counter()
x = torch.ones(16); out = torch.empty_like(x)
mod.get_function("scale", ("ptr", "ptr", "i64"))(16, 16, x, out, 16)
t4 = time.perf_counter()
assert float(out[0]) == 3.0, out
print(MARK + json.dumps({"bridge_ms": (t1 - t0) * 1e3, "queue_ms": (t2 - t1) * 1e3,
                         "load_ms": (t3 - t2) * 1e3, "first_call_ms": (t4 - t3) * 1e3}))
"""


def many_files_copy(workdir: Path, count: int = 50_000) -> Path:
    """A copy of the benchmark's sources in a folder that also holds ``count`` unrelated headers."""
    folder = workdir / "many-files"
    shutil.copytree(SOURCES, folder)
    for i in range(count):
        (folder / f"unrelated_{i}.h").write_text("#error not included\n")
    return folder


def bench_load_many_files(rep: Report, n: int, workdir: Path) -> None:
    """Warm load of a C++ module whose source folder holds 50 000 unrelated files."""
    src = many_files_copy(workdir)
    cache = str(workdir / "cache-many-files")
    loader = f"(lambda: load_cpu(source_dir={str(src)!r}))"
    code = LOADERS + CHILD_LOAD.replace("LOADER", loader).replace("DEVICE", repr("cpu"))
    run_child(code, child_env(cache))  # the build
    run_child(code, child_env(cache))  # page cache
    res = [run_child(code, child_env(cache)) for _ in range(n)]
    rest = [r["import_ms"] + r["load_ms"] for r in res]
    rep.add(
        "warm load, C++ (CPU), 50 000 unrelated files in source_dir, sgljit's own time",
        f"{med(rest):.1f} ms",
        f"{spread(rest)} ({n})",
        f"{verdict(med(rest), TARGET_WARM_MS)}; load_jit call "
        f"{med([r['load_ms'] for r in res]):.1f} ms (nothing walks the folder)",
    )


def bench_load_sycl(rep: Report, n: int, workdir: Path) -> None:
    """Cold build, then warm loads of a runtime-compiled SYCL module on the SYCL CPU device."""
    from sgljit import sycl

    try:
        sycl.find_runtime()
    except sycl.SYCLRuntimeNotFound as err:
        rep.skip("warm load of a cached module, SYCL (fresh process)", str(err))
        return
    cache = str(workdir / "cache-sycl")
    code = LOADERS + CHILD_LOAD_SYCL.replace("SOURCE_DIR", "SOURCES")
    cold = run_child(code, child_env(cache))
    rep.add(
        "cold build of one specialization, SYCL (runtime compiler, CPU device)",
        f"{cold['load_ms'] / 1e3:.2f} s",
        "(1)",
        "bridge already built; compile from source + save the device binary + dependency scan",
    )
    run_child(code, child_env(cache))
    res = [run_child(code, child_env(cache)) for _ in range(n)]
    rep.add(
        "warm load of a cached module, SYCL (fresh process), sgljit's own time",
        f"{med([r['load_ms'] for r in res]):.1f} ms",
        f"{spread([r['load_ms'] for r in res])} ({n})",
        f"{verdict(med([r['load_ms'] for r in res]), TARGET_WARM_MS)}; key, lookup, sha256 "
        "checks, reload of the saved OpenCL binary; before it the runtime's own start: libsycl + "
        f"bridge {med([r['bridge_ms'] for r in res]):.0f} ms, CPU queue "
        f"{med([r['queue_ms'] for r in res]):.0f} ms",
    )


def bench_check_twice(rep: Report, workdir: Path) -> None:
    """`sgljit check` twice on an empty cache: the first run compiles every module it needs, the
    second must compile nothing."""
    env = child_env(str(workdir / "cache-check"))
    env["SGLJIT_LOG"] = "info"
    for run in ("first", "second"):
        started = time.perf_counter()
        r = subprocess.run(
            [sys.executable, "-m", "sgljit.cli", "check"], env=env, capture_output=True, text=True
        )
        seconds = time.perf_counter() - started
        compiles = len(re.findall(r"^sgljit: compiling \S+ for ", r.stderr, re.MULTILINE))
        last = (r.stdout.strip().splitlines() or ["?"])[-1]
        rep.add(
            f"sgljit check, {run} run on one cache (fresh process)",
            f"{seconds:.1f} s",
            "(1)",
            f"{compiles} modules compiled; {last}" + ("" if r.returncode == 0 else " (FAILED)"),
        )


def per_call_us(fn, calls: int, sync=None) -> float:
    """Best of 7 rounds of wall time per call (calls back to back; sync at the end of a round).
    The best round is the least disturbed by other work on the host, as timeit advises: on the
    GPU machine the median of one op moved by 30% between rows of one run."""
    for _ in range(max(10, calls // 10)):
        fn()
    if sync:
        sync()
    rounds = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if sync:
            sync()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    return min(rounds)


def bench_host_overhead(rep: Report, workdir: Path) -> None:
    import torch

    os.environ["SGLJIT_CACHE_DIR"] = str(workdir / "cache-cpu-0")
    ns: dict = {}
    exec(LOADERS, ns)  # our own loader code
    calls = 20000
    try:
        mod = ns["load_cpu"]()
        x = torch.ones(16)
        out = torch.empty_like(x)
        rep.add(
            "host: bare tvm-ffi call, 1 tensor (C++ no-op)",
            f"{per_call_us(lambda: mod.noop(x), calls):.2f} µs",
        )
        rep.add(
            "host: validating C++ op, 2 tensors (TensorMatcher + 16 floats)",
            f"{per_call_us(lambda: mod.scale(x, out), calls):.2f} µs",
        )
    except Exception as e:
        rep.error("host: tvm-ffi C++ calls", e)
        mod = None
    rep.add(
        "host: torch.mul(x, 3, out=y), 16 floats CPU (for comparison)",
        f"{per_call_us(lambda: torch.mul(x, 3, out=out), calls):.2f} µs",
    )
    try:
        from sgljit.op import Family, Tensor

        kop = Family("bench_jit", __file__).op(
            "bench_jit_scale",
            args={"x": Tensor("n"), "out": Tensor("n", dtype="x", io="out")},
            reference=lambda x, out: torch.mul(x, 3, out=out),
        )
        rep.add(
            "host: declared op's eager dispatch to the reference (torch.mul) body",
            f"{per_call_us(lambda: kop(x, out), calls):.2f} µs",
            note="dispatch + the reference's Python argument checks = this minus torch.mul above",
        )
        rep.add(
            "host: same through torch.ops.sgljit.bench_jit_scale (custom op)",
            f"{per_call_us(lambda: torch.ops.sgljit.bench_jit_scale(x, out), calls // 4):.2f} µs",
            note="what a compiled graph pays outside CUDA graphs",
        )
    except Exception as e:
        rep.error("host: declared op dispatch", e)

    if not _has_gpu():
        rep.skip("host: CUDA ops (JIT CUDA op, plugin ops)", "needs a CUDA GPU")
        return
    os.environ["SGLJIT_CACHE_DIR"] = str(workdir / "cache-cuda-0")
    sync = torch.cuda.synchronize
    xc = torch.ones(4096, device="cuda")
    oc = torch.empty_like(xc)
    rep.add(
        "host: torch.mul(x, 3, out=y), 4096 floats CUDA (for comparison)",
        f"{per_call_us(lambda: torch.mul(xc, 3, out=oc), calls, sync):.2f} µs",
        note="wall per call, launches back to back",
    )
    try:
        cmod = ns["load_cuda"]()
        # Interleaved rounds: the launch forms and output allocations are compared within a row's
        # noise, not a run's.
        (ours, _), (runtime, _), (py_alloc, _), (cpp_alloc, _) = _eager_times(
            [
                (lambda: lambda _: cmod.scale(xc, oc), None, contextlib.nullcontext),
                (lambda: lambda _: cmod.scale_runtime_launch(xc, oc), None, contextlib.nullcontext),
                (
                    lambda: lambda _: cmod.scale(xc, torch.empty_like(xc)),
                    None,
                    contextlib.nullcontext,
                ),
                (lambda: lambda _: cmod.scale_alloc(xc), None, contextlib.nullcontext),
            ],
            calls,
            sync,
        )
        rep.add(
            "host: JIT CUDA op through tvm-ffi (validate + launch), 4096 floats",
            f"{ours:.2f} µs",
            note="wall per call, launches back to back; LaunchKernel: the driver's launch with the "
            "kernel's handle cached",
        )
        rep.add(
            "host: same op launched by cudaLaunchKernelEx instead of LaunchKernel, 4096 floats",
            f"{runtime:.2f} µs",
            note="the runtime's launch (looks the kernel up per call); rounds interleaved with the "
            "rows above and below",
        )
        rep.add(
            "host: same op, out allocated by torch.empty_like first",
            f"{py_alloc:.2f} µs",
        )
        rep.add(
            "host: same op, out allocated in C++ (tvm-ffi's environment allocator) and returned",
            f"{cpp_alloc:.2f} µs",
            note="torch's allocator, reached through the DLPack exchange API during the call",
        )
    except Exception as e:
        rep.error("host: JIT CUDA op", e)
    bench_plugin_ops(rep, calls, sync)


def bench_plugin_ops(rep: Report, calls: int, sync) -> None:
    """Host time per eager call of installed plugin ops, on small bf16 CUDA inputs."""
    import torch

    import sgljit

    known = {"rmsnorm": _rms_args}  # signatures fixed by the contract
    available = set(dir(sgljit.ops))
    for name, make in known.items():
        if name not in available:
            rep.skip(f"host: sgljit.ops.{name} (1×4096 bf16)", "op not installed")
            continue
        try:
            call = make(getattr(sgljit.ops, name))
            call()
            torch.cuda.synchronize()
            rep.add(
                f"host: sgljit.ops.{name} (1×4096 bf16, out= given)",
                f"{per_call_us(call, calls // 2, sync):.2f} µs",
                note="wall per call incl. validation and launch",
            )
        except Exception as e:
            rep.error(f"host: sgljit.ops.{name}", e)
    if "rmsnorm" in available:
        bench_rmsnorm_parts(rep, calls, sync)


# The module function of rmsnorm alone (its generated C++ checks and launch, no Python dispatch),
# timed in a fresh process so SGLJIT_PDL (read once per module) takes effect; prints µs per call.
_RMS_MODULE_CODE = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from bench_jit import per_call_us
from sgljit_norm.ops import family
x = torch.randn(1, 4096, dtype=torch.bfloat16, device="cuda")
w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
out = torch.empty_like(x)
key = {"dtype": torch.bfloat16, "weight": torch.bfloat16, "width": 4096, "round": False}
f = family.cuda_module("rows", key).rmsnorm
print(per_call_us(lambda: f(x, w, out, 1e-6, False), int(sys.argv[2]), torch.cuda.synchronize))
"""


@contextlib.contextmanager
def _module_functions(wrap, ops):
    """Inside the block, every memoized CUDA function of ``ops`` is ``wrap(fn)``."""
    saved = {op: dict(op._cuda_fns) for op in ops}
    try:
        for op in ops:
            op._cuda_fns.update({key: wrap(fn) for key, fn in saved[op].items()})
        yield
    finally:
        for op in ops:
            op._cuda_fns.update(saved[op])


def _no_op(fn):
    """A module function's stand-in that does nothing (the Python path timed alone)."""
    return lambda *args: None


def bench_rmsnorm_parts(rep: Report, calls: int, sync) -> None:
    """Where an eager rmsnorm call's host time goes: its Python path alone (the module function
    replaced by a no-op), and its module function alone (tvm-ffi call, generated C++ checks,
    launch) with and without PDL."""
    try:
        import torch

        from sgljit_norm import ops

        x, w, out = _rms_tensors()
        ops.rmsnorm(x, w, out=out)
        with _module_functions(_no_op, [ops._rmsnorm]):
            for label, ctx in (
                ("", contextlib.nullcontext),
                (", inference_mode", torch.inference_mode),
            ):
                with ctx():
                    rep.add(
                        f"host: rmsnorm's Python path alone{label}",
                        f"{per_call_us(lambda: ops.rmsnorm(x, w, out=out), calls):.2f} µs",
                        note="public function + dispatch, no C++ call",
                    )
    except Exception as e:
        rep.error("host: rmsnorm's Python path", e)
    for pdl in ("1", "0"):
        what = f"host: rmsnorm's module function alone, SGLJIT_PDL={pdl}"
        try:
            done = subprocess.run(
                [sys.executable, "-c", _RMS_MODULE_CODE, str(HERE), str(calls // 2)],
                env={**os.environ, "SGLJIT_PDL": pdl},
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            us = float(done.stdout.split()[-1])
            rep.add(
                what, f"{us:.2f} µs", note="tvm-ffi call + C++ validation + launch, back to back"
            )
        except subprocess.CalledProcessError as e:
            rep.error(what, e.stderr or e)
        except Exception as e:
            rep.error(what, e)


def _rms_tensors():
    """input, weight and out of the host-overhead rmsnorm calls: 1x4096 bf16 on the GPU."""
    import torch

    x = torch.randn(1, 4096, dtype=torch.bfloat16, device="cuda")
    return x, torch.randn(4096, dtype=torch.bfloat16, device="cuda"), torch.empty_like(x)


def _rms_args(f):
    x, w, out = _rms_tensors()
    return lambda: f(x, w, 1e-6, out=out)


# ------------------------------------------------------------------------------------------------
# The eager table: one token, sgljit vs sglang's jit_kernel


def _eager_specs(dev: str = "cuda") -> list[dict]:
    """The eager table's rows. Each: ``op`` (label), ``inputs()`` (a fresh dict of CUDA tensors),
    ``sgljit(ops) -> fn(inputs)``, and for sglang either ``sglang`` (a sglang_provider loader, with
    ``sglang_prepare`` when it needs extra buffers) or ``sglang_na`` (why there is no such call);
    ``note`` says where the two calls do different work. Weights are ones, so in-place ops stay
    finite over many calls."""
    import sglang_provider as sj
    import torch

    bf16, fp8, eps = torch.bfloat16, torch.float8_e4m3fn, 1e-6

    def randn(*shape, dtype=bf16):
        return torch.randn(*shape, dtype=dtype, device=dev)

    def ones(*shape):
        return torch.ones(*shape, dtype=bf16, device=dev)

    def rms(out=True):
        x = randn(1, 4096)
        return {"x": x, "w": ones(4096), **({"out": torch.empty_like(x)} if out else {})}

    def fused():
        return {"x": randn(1, 4096), "r": randn(1, 4096), "w": ones(4096)}

    def qk(per_head: bool, hk: int = 8, fused_qkv: bool = True):
        if fused_qkv:  # views into one qkv buffer, as attention layers have them
            qkv = randn(1, (32 + 2 * hk) * 128)
            q, k = qkv[:, : 32 * 128], qkv[:, 32 * 128 : (32 + hk) * 128]
        else:
            q, k = randn(1, 32 * 128), randn(1, hk * 128)
        if per_head:
            return {
                "q": q.view(1, 32, 128),
                "k": k.view(1, hk, 128),
                "qw": ones(128),
                "kw": ones(128),
            }
        return {"q": q, "k": k, "qw": ones(32 * 128), "kw": ones(hk * 128)}

    def rope(kv: bool = False):
        i = {
            "q": randn(1, 32, 128),
            "k": randn(1, 8, 128),
            "cache": randn(4096, 128, dtype=torch.float32),
            "pos": torch.tensor([7], device=dev),
            "is_neox": True,
        }
        if kv:
            i |= {
                "v": randn(1, 8, 128),
                "k_cache": torch.zeros(64, 8, 128, dtype=bf16, device=dev),
                "v_cache": torch.zeros(64, 8, 128, dtype=bf16, device=dev),
                "loc": torch.tensor([3], device=dev),
            }
        return i

    def quant(static: bool = False):
        x = randn(1, 4096)
        i = {"x": x, "out": torch.empty(1, 4096, dtype=fp8, device=dev)}
        if static:
            i["scale"] = (x.abs().amax().float() / 448.0).reshape(1)
        return i

    def qk_rope():
        qkv = randn(1, (32 + 2 * 8) * 128)  # q and k as views into one qkv buffer
        return {
            "q": qkv[:, : 32 * 128].view(1, 32, 128),
            "k": qkv[:, 32 * 128 : 40 * 128].view(1, 8, 128),
            "qw": ones(128),
            "kw": ones(128),
            "cache": randn(4096, 128, dtype=torch.float32),
            "pos": torch.tensor([7], device=dev),
            "is_neox": True,
        }

    def norm_quant(fused_add: bool = False, static: bool = True):
        i = rms(out=False) | {"out": torch.empty(1, 4096, dtype=fp8, device=dev)}
        if fused_add:
            i["r"] = randn(1, 4096)
        if static:
            i["scale"] = torch.full((1,), 0.01, device=dev)
        else:
            i["scales"] = torch.empty(1, 1, device=dev)
        return i

    def group_quant():
        return quant() | {"scales": torch.empty(1, 4096 // 128, device=dev)}

    def act_inputs(d: int = 14336, quant: bool = False):
        """One token of a gated MLP (Llama-3-8B's 14336; DeepSeek-V3's expert 2048 for the fp8 form)."""
        if quant:
            return {
                "x": randn(1, 2 * d),
                "out": torch.empty(1, d, dtype=fp8, device=dev),
                "scales": torch.empty(1, d // 128, device=dev),
            }
        return {"x": randn(1, 2 * d), "out": torch.empty(1, d, dtype=bf16, device=dev)}

    def act_call(f):
        return lambda i: f(i["x"], out=i["out"])

    def timestep(out=True):
        i = {"t": torch.rand(1, device=dev) * 1000, "dim": 256}
        return i | ({"out": torch.empty(1, 256, dtype=torch.float32, device=dev)} if out else {})

    ts_kw = {"flip_sin_to_cos": True, "downscale_freq_shift": 0.0}
    return [
        {
            "op": "rmsnorm 1×4096, out= given",
            "inputs": rms,
            "sgljit": lambda o: lambda i, f=o.rmsnorm: f(i["x"], i["w"], eps, out=i["out"]),
            "sglang": lambda: sj.load_rmsnorm(eps),
        },
        {
            "op": "rmsnorm 1×4096, no out=",
            "inputs": lambda: rms(out=False),
            "sgljit": lambda o: lambda i, f=o.rmsnorm: f(i["x"], i["w"], eps),
            "sglang": lambda: sj.load_rmsnorm(eps),
            "note": "sgljit allocates the output; sglang's out=None normalizes x in place",
        },
        {
            "op": "fused_add_rmsnorm 1×4096",
            "inputs": fused,
            "sgljit": lambda o: lambda i, f=o.fused_add_rmsnorm: f(i["x"], i["r"], i["w"], eps),
            "sglang": lambda: sj.load_fused_add_rmsnorm(eps),
        },
        {
            "op": "gemma_rmsnorm 1×4096, out= given",
            "inputs": rms,
            "sgljit": lambda o: lambda i, f=o.gemma_rmsnorm: f(i["x"], i["w"], eps, out=i["out"]),
            "sglang": lambda: sj.load_gemma_rmsnorm(eps),
        },
        {
            "op": "gemma_fused_add_rmsnorm 1×4096",
            "inputs": fused,
            "sgljit": lambda o: (
                lambda i, f=o.gemma_fused_add_rmsnorm: f(i["x"], i["r"], i["w"], eps)
            ),
            "sglang": lambda: sj.load_gemma_fused_add_rmsnorm(eps),
        },
        {
            "op": "qknorm 32/8 heads × 128 (views into qkv)",
            "inputs": lambda: qk(per_head=True),
            "sgljit": lambda o: lambda i, f=o.qknorm: f(i["q"], i["k"], i["qw"], i["kw"], eps),
            "sglang": lambda: sj.load_qknorm(eps),
        },
        {
            "op": "qknorm_across_heads q 4096 / k 1024 wide (views into qkv)",
            "inputs": lambda: qk(per_head=False),
            "sgljit": lambda o: (
                lambda i, f=o.qknorm_across_heads: f(i["q"], i["k"], i["qw"], i["kw"], eps)
            ),
            "sglang": lambda: sj.load_qknorm_across_heads(eps),
            "note": "sglang's needs q and k of one width and contiguous rows",
        },
        {
            "op": "qknorm_across_heads q, k 4096 wide (contiguous)",
            "inputs": lambda: qk(per_head=False, hk=32, fused_qkv=False),
            "sgljit": lambda o: (
                lambda i, f=o.qknorm_across_heads: f(i["q"], i["k"], i["qw"], i["kw"], eps)
            ),
            "sglang": lambda: sj.load_qknorm_across_heads(eps),
            "note": "a shape both accept",
        },
        {
            "op": "apply_rope 32/8 heads × 128, neox",
            "inputs": rope,
            "sgljit": lambda o: (
                lambda i, f=o.apply_rope: f(i["q"], i["k"], i["cache"], i["pos"], is_neox=True)
            ),
            "sglang": sj.load_apply_rope,
        },
        {
            "op": "apply_rope_with_kv_cache 32/8 heads × 128",
            "inputs": lambda: rope(kv=True),
            "sgljit": lambda o: (
                lambda i, f=o.apply_rope_with_kv_cache: f(
                    i["q"],
                    i["k"],
                    i["v"],
                    i["k_cache"],
                    i["v_cache"],
                    i["cache"],
                    i["pos"],
                    i["loc"],
                )
            ),
            "sglang": sj.load_apply_rope_with_kv_cache,
            "sglang_prepare": sj.prepare_kv_cache_2d,
            "note": "sglang also rotates k in place (writes k back)",
        },
        {
            "op": "per_tensor_quant_fp8 static 1×4096",
            "inputs": lambda: quant(static=True),
            "sgljit": lambda o: (
                lambda i, f=o.per_tensor_quant_fp8: f(i["x"], i["scale"], out=i["out"])
            ),
            "sglang": sj.load_per_tensor_quant_fp8_static,
        },
        {
            "op": "per_tensor_quant_fp8 dynamic 1×4096",
            "inputs": quant,
            "sgljit": lambda o: lambda i, f=o.per_tensor_quant_fp8: f(i["x"], out=i["out"]),
            "sglang": sj.load_per_tensor_quant_fp8_dynamic,
            "sglang_prepare": sj.prepare_dynamic_scale,
            "note": "sgljit allocates its scale; sglang's time includes scale.zero_() (its "
            "absmax is an atomic max into the given scale)",
        },
        {
            "op": "per_token_quant_fp8 1×4096",
            "inputs": quant,
            "sgljit": lambda o: lambda i, f=o.per_token_quant_fp8: f(i["x"], out=i["out"]),
            "sglang": sj.load_per_token_quant_fp8,
            "sglang_prepare": sj.prepare_per_token_scales,
            "note": "sgljit allocates its scales; sglang: per_token_group_quant_8bit, one group "
            "per row, into a given scales buffer",
        },
        {
            "op": "per_token_quant_fp8 1×4096, scales= given",
            "inputs": lambda: quant() | {"scales": torch.empty(1, 1, device=dev)},
            "sgljit": lambda o: (
                lambda i, f=o.per_token_quant_fp8: f(i["x"], out=i["out"], scales=i["scales"])
            ),
            "sglang": sj.load_per_token_quant_fp8,
            "sglang_prepare": sj.prepare_per_token_scales,
            "note": "both write into given buffers",
        },
        {
            "op": "per_token_group_quant_fp8 1×4096, g128, scales= given",
            "inputs": group_quant,
            "sgljit": lambda o: (
                lambda i, f=o.per_token_group_quant_fp8: f(i["x"], out=i["out"], scales=i["scales"])
            ),
            "sglang": sj.load_per_token_group_quant_fp8,
            "note": "both write into given buffers",
        },
        {
            "op": "rmsnorm_quant_fp8 1×4096, static, out= given",
            "inputs": norm_quant,
            "sgljit": lambda o: (
                lambda i, f=o.rmsnorm_quant_fp8: f(i["x"], i["w"], i["scale"], eps, out=i["out"])
            ),
            "sglang_na": "sglang's JIT kernels have no norm->fp8 op",
        },
        {
            "op": "rmsnorm_quant_fp8 1×4096, per token, out= and scales= given",
            "inputs": lambda: norm_quant(static=False),
            "sgljit": lambda o: (
                lambda i, f=o.rmsnorm_quant_fp8: f(
                    i["x"], i["w"], None, eps, out=i["out"], scales=i["scales"]
                )
            ),
            "sglang_na": "(none)",
        },
        {
            "op": "fused_add_rmsnorm_quant_fp8 1×4096, static, out= given",
            "inputs": lambda: norm_quant(fused_add=True),
            "sgljit": lambda o: (
                lambda i, f=o.fused_add_rmsnorm_quant_fp8: f(
                    i["x"], i["r"], i["w"], i["scale"], eps, out=i["out"]
                )
            ),
            "sglang_na": "(none)",
        },
        {
            "op": "qknorm_rope 32/8 heads × 128, neox (views into qkv)",
            "inputs": qk_rope,
            "sgljit": lambda o: (
                lambda i, f=o.qknorm_rope: f(
                    i["q"], i["k"], i["qw"], i["kw"], i["cache"], i["pos"], eps=eps
                )
            ),
            "sglang": lambda: sj.load_qknorm_rope(eps),
            "note": "sglang: fused_inplace_qknorm_rope (0.5.23: diffusion.rope.qknorm_rope_jit)",
        },
        *(
            {
                "op": f"{act}_and_mul 1×(2×14336), out= given",
                "inputs": lambda: act_inputs(),
                "sgljit": lambda o, act=act: act_call(getattr(o, f"{act}_and_mul")),
                "sglang": lambda act=act: sj.load_act_and_mul(act),
            }
            for act in ("silu", "gelu", "gelu_tanh")
        ),
        {
            "op": "silu_and_mul_per_token_group_quant_fp8 1×(2×2048), g128, out= and scales= given",
            "inputs": lambda: act_inputs(2048, quant=True),
            "sgljit": lambda o: (
                lambda i, f=o.silu_and_mul_per_token_group_quant_fp8: f(
                    i["x"], 128, out=i["out"], scales=i["scales"]
                )
            ),
            "sglang": sj.load_silu_and_mul_quant_fp8,
            "note": "sglang 0.5.23: per_token_group_quant(fuse_silu_and_mul=True, dense)",
        },
        {
            "op": "timestep_embedding B=1 dim=256 fp32, out= given",
            "inputs": timestep,
            "sgljit": lambda o: (
                lambda i, f=o.timestep_embedding: f(i["t"], i["dim"], **ts_kw, out=i["out"])
            ),
            "sglang_na": "no out= (it allocates; next row)",
        },
        {
            "op": "timestep_embedding B=1 dim=256 fp32, allocating",
            "inputs": lambda: timestep(out=False),
            "sgljit": lambda o: lambda i, f=o.timestep_embedding: f(i["t"], i["dim"], **ts_kw),
            "sglang": lambda: sj.load_timestep_embedding(True, 0.0),
        },
    ]


def _eager_times(contestants, calls: int, sync) -> list[tuple[float | None, str]]:
    """Per contestant ``(make_fn, inputs, context)``: (µs per call, "") or (None, "missing: …" /
    "failed: …"). Each is called once (and synced) first, which compiles or loads its kernel; then
    the contestants take turns, 7 rounds of ``calls`` back-to-back calls each, and each keeps its
    best round: interleaved, so a slow stretch of the host or a clock ramp hits every side alike
    (timed one after another, two rows running the same code differed by 20 %)."""
    fns: list = []
    results: list = []
    for make_fn, inputs, context in contestants:
        try:
            fn = make_fn()
        except _Unavailable as e:
            fns.append(None)
            results.append((None, str(e)))
            continue
        except Exception as e:
            fns.append(None)
            results.append((None, "missing: " + _short(e)))
            continue
        try:
            with context():
                for _ in range(max(10, calls // 10)):
                    fn(inputs)
                sync()
            fns.append((lambda fn=fn, inputs=inputs: fn(inputs), context))
            results.append((float("inf"), ""))
        except Exception as e:
            with contextlib.suppress(Exception):
                sync()
            fns.append(None)
            results.append((None, "failed: " + _short(e)))
    for _ in range(7):
        for i, entry in enumerate(fns):
            if entry is None:
                continue
            call, context = entry
            with context():
                t0 = time.perf_counter()
                for _ in range(calls):
                    call()
                sync()
                us = (time.perf_counter() - t0) / calls * 1e6
            results[i] = (min(results[i][0], us), "")
    return results


def _call_parts(make_fn, inputs, calls: int, sync) -> tuple[str, str]:
    """Where one sgljit row's host time goes, as two cells: its Python path alone (every op's
    memoized module function replaced by a no-op) and its module functions alone (called directly
    with the arguments the Python path gave them: tvm-ffi, the generated C++ checks, the launch)."""
    from sgljit.testing import families

    ops = [op for family in families() for op in family.ops.values()]
    recorded: list = []

    def recording(fn):
        return lambda *args: recorded.append((fn, args)) or fn(*args)

    try:
        fn = make_fn()
        with _module_functions(recording, ops):
            fn(inputs)
            sync()
        with _module_functions(_no_op, ops):
            python_us = per_call_us(lambda: fn(inputs), calls)
    except Exception as e:
        return "failed: " + _short(e), ""
    if not recorded:
        return f"{python_us:.2f}", "no module call"

    def modules():
        for f, args in recorded:
            f(*args)

    return f"{python_us:.2f}", f"{per_call_us(modules, calls, sync):.2f}"


class _Unavailable(Exception):
    """A contestant that has no time, with the cell text saying why."""


def _raiser(why, kind: str = "missing"):
    """A make_fn that fails with ``why`` (an exception or a text) as its table cell."""
    text = why if isinstance(why, str) else _short(why)
    cell = f"{kind}: {text}" if kind else text

    def make_fn():
        raise _Unavailable(cell)

    return make_fn


def _short(e: BaseException, limit: int = 150) -> str:
    from harness import _short as short  # one line, repo paths relative, root cause first

    return short(e, limit)


def eager_verdict(ours: float | None, theirs: float | None) -> str:
    """Against the target: at most TARGET_EAGER_US per call, and never slower than sglang's."""
    if ours is None:
        return "no sgljit time"
    misses = []
    if ours > TARGET_EAGER_US:
        misses.append(f"> {TARGET_EAGER_US:g} µs")
    if theirs is not None and ours > theirs:
        misses.append("slower than sglang")
    return "met" if not misses else "NOT met: " + ", ".join(misses)


def _sglang_inputs(spec: dict) -> dict:
    """A fresh copy of a row's inputs as sglang's call takes them (``sglang_prepare``, if any)."""
    inputs = spec["inputs"]()
    prepare = spec.get("sglang_prepare")
    return prepare(inputs) if prepare else inputs


def _eager_warm(index: int) -> str:
    """(A worker process) builds row ``index``'s modules by calling each side once: the kernels
    load from the on-disk caches when the table times them."""
    import torch

    import sgljit

    spec = _eager_specs("cuda")[index]
    done = []
    for side in ("sgljit", "sglang"):
        try:
            if side == "sgljit":
                fn, inputs = spec["sgljit"](sgljit.ops), spec["inputs"]()
            elif "sglang" in spec:
                fn, inputs = spec["sglang"](), _sglang_inputs(spec)
            else:
                continue
            fn(inputs)
            torch.cuda.synchronize()
            done.append(side)
        except Exception as e:  # the table reports it
            done.append(f"{side}: {_short(e)}")
    return f"{spec['op']}: {', '.join(done)}"


def warm_eager(jobs: int, only: Sequence[str] = ()) -> None:
    """Build the eager table's modules (both sides) in ``jobs`` spawned processes."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    specs = _eager_specs("cpu")
    rows = [i for i, s in enumerate(specs) if not only or any(o in s["op"] for o in only)]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        jobs, mp_context=context, initializer=sys.path.insert, initargs=(0, str(HERE))
    ) as pool:
        for line in pool.map(_eager_warm, rows):
            print(f"  warm: {line}", flush=True)


def bench_eager(calls: int, dev: str = "cuda", only: Sequence[str] = ()) -> tuple[str, list[str]]:
    """The eager table (markdown, also printed row by row) and the ops sgljit has no time for;
    ``only``: the rows whose label contains one of these.
    Without a CUDA GPU: one line saying so, and no failures. (``dev="cpu"`` only checks the
    table's wiring: sgljit's reference backend, and sglang-jit missing.)"""
    import torch

    title = "## Eager host time per call, one token: sgljit vs sglang's jit_kernel"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    if dev == "cuda" and not torch.cuda.is_available():
        line = "eager table: skipped (needs a CUDA GPU; torch.cuda.is_available() is False)"
        print(line, flush=True)
        return f"{title}\n\n{line}\n", []
    import sglang_provider

    import sgljit

    version = sglang_provider.version()
    print(f"eager table ({calls} calls per round, 7 rounds):", flush=True)
    lines = [
        title,
        "",
        f"- sglang-jit: sglang {version or 'not fetched'} JIT kernels, called under "
        "inference_mode "
        f"(benchmarks/sglang_provider.py); target: ≤ {TARGET_EAGER_US:g} µs per call, and never "
        "slower than sglang's",
        f"- best of 7 rounds of {calls} back-to-back eager calls, wall time per call (launches "
        "included, synchronized at the end of a round), the three columns' rounds taking turns; "
        "bf16 unless said; both sides are called as fn(inputs) on their own copy of the inputs",
        "",
        "- Python path / module functions: the sgljit call's two parts timed apart (no-op module "
        "functions; the module functions called directly with the arguments the call gave them)",
        "",
        "| op (one token) | sgljit µs | sgljit µs, inference_mode | sglang-jit µs | sgljit ÷ sglang "
        "| verdict | Python path µs | module functions µs | note |",
        "|---|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    failed = []
    available = set(dir(sgljit.ops))
    for spec in _eager_specs(dev):
        op = spec["op"]
        if only and not any(o in op for o in only):
            continue
        name = op.split()[0]
        contestants = []
        try:
            if name not in available:
                raise LookupError("op not installed")
            for context in (contextlib.nullcontext, torch.inference_mode):
                contestants.append(
                    (lambda spec=spec: spec["sgljit"](sgljit.ops), spec["inputs"](), context)
                )
        except LookupError as e:
            contestants = [(_raiser(e), None, contextlib.nullcontext)] * 2
        except Exception as e:  # making the inputs
            contestants = [(_raiser(e, "failed"), None, contextlib.nullcontext)] * 2
        if "sglang_na" in spec:
            contestants.append((_raiser(spec["sglang_na"], ""), None, contextlib.nullcontext))
        else:
            try:
                # sglang's custom-op fast path needs grad off, as sgljit's does: its rounds run
                # under inference_mode, as sglang's server calls it
                contestants.append((spec["sglang"], _sglang_inputs(spec), torch.inference_mode))
            except Exception as e:
                contestants.append((_raiser(e, "failed"), None, contextlib.nullcontext))
        (ours, why), (served, served_why), (theirs, their_why) = _eager_times(
            contestants, calls, sync
        )
        if ours is None:
            failed.append(f"eager: {op}")
        ratio = f"{ours / theirs:.2f}" if ours is not None and theirs else ""
        python_path, module_fns = "", ""
        if ours is not None and dev == "cuda":
            python_path, module_fns = _call_parts(*contestants[0][:2], calls, sync)
        cells = [
            op,
            f"{ours:.2f}" if ours is not None else why,
            f"{served:.2f}" if served is not None else served_why,
            f"{theirs:.2f}" if theirs is not None else their_why,
            ratio,
            eager_verdict(ours, theirs),
            python_path,
            module_fns,
            spec.get("note", ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
        print("  " + " | ".join(c for c in cells if c), flush=True)
    return "\n".join(lines) + "\n", failed


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _arch() -> str:
    if os.environ.get("SGLJIT_CUDA_ARCH"):
        return os.environ["SGLJIT_CUDA_ARCH"]
    try:
        from sgljit.toolchain import cuda_arch_list

        return " ".join(cuda_arch_list())
    except Exception as e:
        return f"? ({e})"


def _nvcc() -> str | None:
    try:
        from sgljit.toolchain import find_nvcc

        return find_nvcc()
    except Exception:
        return shutil.which("nvcc")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7, help="fresh processes per measurement")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--skip-cuda-build", action="store_true", help="no CUDA cold build")
    ap.add_argument(
        "--check-twice", action="store_true", help="also time `sgljit check` twice on one cache"
    )
    ap.add_argument(
        "--eager-only",
        action="store_true",
        help="only the eager table (every op at one token, sgljit vs sglang-jit); "
        "writes jit_eager.md",
    )
    ap.add_argument(
        "--eager-calls", type=int, default=10000, help="calls per round in the eager table"
    )
    ap.add_argument(
        "--eager-ops",
        type=lambda text: [o for o in text.split(",") if o],
        default=[],
        help="with --eager-only: only the rows whose op contains one of these (comma separated)",
    )
    ap.add_argument(
        "--eager-precompile",
        type=int,
        default=0,
        metavar="JOBS",
        help="with --eager-only: first build every row's modules (sgljit's and sglang's) in JOBS "
        "processes",
    )
    ap.add_argument(
        "--with-host",
        action="store_true",
        help="with --eager-only: also the host-overhead rows (bare and checked tvm-ffi calls, "
        "declared-op dispatch, rmsnorm's Python path and module function alone)",
    )
    args = ap.parse_args(argv)

    sys.path.insert(0, str(HERE))
    import harness

    rep = Report()
    machine = harness.machine_name()
    if args.eager_only:
        return _main_eager_only(args, machine)
    print(f"JIT machinery on {machine}", flush=True)
    # The measurements below build into throwaway caches; the eager table uses the caller's.
    cache_dir = os.environ.get("SGLJIT_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="sgljit-bench-jit-") as tmp:
        work = Path(tmp)
        for what, fn in (
            ("import", lambda: bench_import(rep, args.repeats)),
            ("C++ module", lambda: bench_load(rep, args.repeats, "cpu", work)),
            ("C++ module, 50k files", lambda: bench_load_many_files(rep, args.repeats, work)),
            ("SYCL module", lambda: bench_load_sycl(rep, args.repeats, work)),
        ):
            try:
                fn()
            except Exception as e:
                rep.error(what, e)
        cuda_reason = None
        if args.skip_cuda_build:
            cuda_reason = "--skip-cuda-build"
        elif not _nvcc():
            cuda_reason = "nvcc not found"
        elif not _has_gpu() and not os.environ.get("SGLJIT_CUDA_ARCH"):
            cuda_reason = "no GPU and SGLJIT_CUDA_ARCH unset (e.g. SGLJIT_CUDA_ARCH=9.0a)"
        if cuda_reason:
            rep.skip("cold build / warm load, CUDA", cuda_reason)
        else:
            try:
                bench_load(rep, args.repeats, "cuda", work)
            except Exception as e:
                rep.error("CUDA module", e)
        if args.check_twice:
            try:
                bench_check_twice(rep, work)
            except Exception as e:
                rep.error("sgljit check twice", e)
        try:
            bench_host_overhead(rep, work)
        except Exception as e:
            rep.error("host overhead", e)

    _set_env("SGLJIT_CACHE_DIR", cache_dir)
    eager_text, eager_failed = _eager_section(args.eager_calls)
    rep.failed += eager_failed
    _write_report(
        args,
        f"JIT machinery — {machine}",
        [
            f"- fresh-process figures: median of {args.repeats} processes (one discarded warm-up); "
            "host figures: best of 7 rounds of back-to-back calls",
            "",
            rep.table(),
            "",
            eager_text,
        ],
        "jit.md",
    )
    return 1 if rep.failed else 0


def _write_report(args: argparse.Namespace, title: str, body: list[str], file: str) -> None:
    """Print the report (a header of what ran where, then ``body``) and write it to results/."""
    import harness

    v = harness.versions()
    text = "\n".join(
        [
            f"# {title}",
            "",
            f"- command: `{harness.command_line()}`",
            f"- date: {harness.now_utc()}",
            "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
            f"- CPU: {harness.cpu_name()}, {os.cpu_count()} cores",
            *body,
        ]
    )
    print()
    print(text)
    if not args.no_write:
        path = harness.results_dir(harness.machine_name()) / file
        path.write_text(text)
        print(f"written: {path}")


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _eager_section(calls: int, only: Sequence[str] = ()) -> tuple[str, list[str]]:
    try:
        return bench_eager(calls, only=only)
    except Exception as e:  # a row's own errors are in its cells; this is the table failing
        print(f"eager table: FAILED\n    {e}", flush=True)
        return f"eager table: failed: {_short(e)}\n", ["eager table"]


def _main_eager_only(args: argparse.Namespace, machine: str) -> int:

    host = ""
    if args.with_host:
        rep = Report()
        cache_dir = os.environ.get("SGLJIT_CACHE_DIR")
        with tempfile.TemporaryDirectory(prefix="sgljit-bench-jit-") as tmp:
            try:
                bench_host_overhead(rep, Path(tmp))
            except Exception as e:
                rep.error("host overhead", e)
        _set_env("SGLJIT_CACHE_DIR", cache_dir)
        host = rep.table() + "\n"
    if args.eager_precompile and _has_gpu():
        warm_eager(args.eager_precompile, args.eager_ops)
    eager_text, failed = _eager_section(args.eager_calls, args.eager_ops)
    _write_report(
        args, f"Eager host time per call — {machine}", ["", host, eager_text], "jit_eager.md"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

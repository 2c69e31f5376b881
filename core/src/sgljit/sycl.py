"""SYCL kernels: :func:`load_jit_sycl` and its two routes.

* ``icpx`` (Intel GPU hosts with oneAPI): the sources are compiled ahead of time with
  ``icpx -fsycl`` into a shared library through core's module cache, loaded with ctypes.
* ``rtc`` (everywhere the runtime wheels are installed, no toolkit): the sources are compiled at run
  time by the SYCL runtime's ``kernel_compiler`` extension, through a small host bridge
  (``csrc/sycl_bridge.cpp``) built once with the host c++. On a machine with no Intel GPU this runs
  the kernels on the SYCL CPU device (Intel's OpenCL CPU runtime)::

      pip install intel-sycl-rt==2026.1.2 intel-opencl-rt==2026.1.2

  On OpenCL devices the built program's device binary goes into core's module cache (key: the
  source, options, device, driver and runtime; dependencies from a preprocessor scan), so a fresh
  process reloads it in milliseconds; on other backends it is compiled once per process.

``route="auto"`` takes icpx when it is on PATH, else rtc. Both routes launch through the same C ABI
(``csrc/sycl_bridge.hpp``), on torch's current XPU queue for ``xpu`` tensors (asynchronously) and on
the SYCL CPU device for CPU tensors (waiting: the caller reads host memory right after).

Example (one kernel source serves both routes; see include/README.md for the convention)::

    import torch, sgljit
    mod = sgljit.load_jit_sycl("scale", "fp32_t", sycl_files=["scale.hpp"],
                               extra_sycl_cflags=["-DSGLJIT_T=fp32_t"])
    fn = mod.get_function("scale", ("ptr", "ptr", "f32", "i64"))
    x = torch.randn(1000); out = torch.empty_like(x)
    fn(1024, 64, x, out, 2.0, x.numel())          # global size, work-group size, *args
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib.metadata
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .cache import (
    TOOLCHAIN,
    BuildSpec,
    cache_key,
    cache_root,
    get_or_build,
    read_depfile,
    read_regular,
)
from .errors import CompileError, NoCompileError, SgljitError
from .jit_utils import cache_once, forget_on_clear, module_name
from .toolchain import (
    compiler_environment,
    compiler_identity,
    dependency_scan,
    flag_files,
    host_cxx,
    include_folders,
    options,
    outside,
    short_hash,
    system_include_dirs,
)

__all__ = [
    "ARG_KINDS",
    "INSTALL_HINT",
    "IcpxPlan",
    "SYCLFunction",
    "SYCLModule",
    "SYCLRuntimeNotFound",
    "bridge",
    "bridge_spec",
    "describe",
    "find_runtime",
    "load_jit_sycl",
    "plan_icpx_build",
    "sycl_targets",
]

logger = logging.getLogger("sgljit")

INSTALL_HINT = "pip install intel-sycl-rt==2026.1.2 intel-opencl-rt==2026.1.2"
INCLUDE_DIR = Path(__file__).parent / "include"
CSRC_DIR = Path(__file__).parent / "csrc"
ROUTES = ("auto", "icpx", "rtc")

# Kernel argument kinds → the numbers csrc/sycl_bridge.hpp's ArgKind uses, and their ctypes.
ARG_KINDS = {"ptr": 0, "i32": 1, "i64": 2, "u32": 3, "u64": 4, "f32": 5, "f64": 6}
_CTYPES = {
    "ptr": ctypes.c_void_p,
    "i32": ctypes.c_int32,
    "i64": ctypes.c_int64,
    "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64,
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
}

# Flags that keep icpx's numerics those of the reference: icpx defaults to -fp-model=fast
# (reassociation, flush-to-zero, approximate math), which the CUDA side does not use either.
ICPX_NUMERICS_FLAGS = (
    "-fp-model=precise",
    "-fhonor-nans",
    "-fhonor-infinities",
    "-fno-associative-math",
    "-no-ftz",
)
BRIDGE_FLAGS = (
    "-std=c++17",
    "-O2",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    "-DSYCL_DISABLE_FSYCL_SYCLHPP_WARNING",
    "-Wno-deprecated-declarations",
)


class SYCLRuntimeNotFound(SgljitError):
    """The SYCL runtime (the ``intel-sycl-rt`` wheel) is not installed."""


# --------------------------------------------------------------------------------------------
# The runtime wheels


@dataclasses.dataclass(frozen=True)
class Runtime:
    """Where the runtime wheels put things. ``opencl_cpu`` is None without ``intel-opencl-rt``."""

    version: str
    include: Path
    lib: Path
    opencl_cpu: Path | None


def _dist_file(dist: str, suffix: str) -> Path | None:
    try:
        files = importlib.metadata.distribution(dist).files or ()
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.as_posix().endswith(suffix):
            return Path(f.locate()).resolve()
    return None


@functools.lru_cache(maxsize=1)
def find_runtime() -> Runtime:
    """Locate the SYCL runtime installed from PyPI (headers, ``libsycl.so``, Intel's OpenCL CPU
    library), or raise :class:`SYCLRuntimeNotFound` naming the packages to install."""
    libsycl = _dist_file("intel-sycl-rt", "/libsycl.so")
    header = _dist_file("intel-sycl-rt", "include/sycl/sycl.hpp")
    if libsycl is None or header is None:
        raise SYCLRuntimeNotFound(
            "the SYCL runtime is not installed (needed to run SYCL kernels without oneAPI's icpx, "
            f"e.g. on the SYCL CPU device): {INSTALL_HINT}"
        )
    return Runtime(
        version=importlib.metadata.version("intel-sycl-rt"),
        include=header.parent.parent,
        lib=libsycl.parent,
        opencl_cpu=_dist_file("intel-opencl-rt", "/libintelocl.so"),
    )


def _configure_opencl_loader(rt: Runtime) -> None:
    """Point the OpenCL ICD loader at Intel's CPU runtime from the wheel, before libsycl loads.

    The wheel's .icd file holds a placeholder path, and a system ICD (pocl) can win the CPU
    selector and then fail to build SPIR-V; so, unless the user set them: OCL_ICD_FILENAMES = the
    wheel's libintelocl.so, OCL_ICD_VENDORS = an empty folder (no system ICDs).
    """
    if rt.opencl_cpu is None:
        return
    if "OCL_ICD_FILENAMES" not in os.environ:
        os.environ["OCL_ICD_FILENAMES"] = str(rt.opencl_cpu)
    if "OCL_ICD_VENDORS" not in os.environ:
        os.environ["OCL_ICD_VENDORS"] = str(_empty_folder())


def _empty_folder() -> Path:
    """An empty folder: in the cache, or, where the cache is read-only (a prebuilt fleet cache),
    a fresh one in the temporary folder."""
    empty = cache_root() / "sycl" / "no-opencl-vendors"
    try:
        empty.mkdir(parents=True, exist_ok=True)
        if not any(empty.iterdir()):
            return empty
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="sgljit-no-opencl-vendors-"))


# --------------------------------------------------------------------------------------------
# The C ABI both routes export (csrc/sycl_bridge.hpp)


def _declare_abi(lib: ctypes.CDLL) -> ctypes.CDLL:
    vp, c_int = ctypes.c_void_p, ctypes.c_int
    lib.sgljit_sycl_abi_version.restype = c_int
    lib.sgljit_sycl_last_error.restype = ctypes.c_char_p
    lib.sgljit_sycl_last_error_kind.restype = c_int
    lib.sgljit_sycl_cpu_queue.restype = vp
    lib.sgljit_sycl_devices.restype = ctypes.c_char_p
    lib.sgljit_sycl_launch.restype = c_int
    lib.sgljit_sycl_launch.argtypes = [
        vp, vp, c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t),
        c_int, ctypes.POINTER(ctypes.c_int8), ctypes.POINTER(vp), c_int,
    ]  # fmt: skip
    if lib.sgljit_sycl_abi_version() != 1:
        raise OSError(f"{lib._name}: unexpected bridge ABI version")
    return lib


def _last_error(lib: ctypes.CDLL) -> str:
    return (lib.sgljit_sycl_last_error() or b"").decode(errors="replace")


def _load_bridge(path: Path) -> ctypes.CDLL:
    # Never dlclose'd (ctypes does not): kernels and queues made by it live until exit.
    lib = _declare_abi(ctypes.CDLL(str(path)))
    lib.sgljit_sycl_build.restype = ctypes.c_void_p
    lib.sgljit_sycl_build.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_char_p),
    ]
    lib.sgljit_sycl_get_kernel.restype = ctypes.c_void_p
    lib.sgljit_sycl_get_kernel.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.sgljit_sycl_raw_kernel_name.restype = ctypes.c_char_p
    lib.sgljit_sycl_raw_kernel_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.sgljit_sycl_save.restype = ctypes.c_int64
    lib.sgljit_sycl_save.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.sgljit_sycl_load.restype = ctypes.c_void_p
    lib.sgljit_sycl_load.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64]
    lib.sgljit_sycl_device_identity.restype = ctypes.c_char_p
    lib.sgljit_sycl_device_identity.argtypes = [ctypes.c_void_p]
    return lib


def _run_compiler(cmd: list[str], cwd: Path, source: Path | str) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CompileError(
            f"{Path(cmd[0]).name} failed (exit {proc.returncode})",
            command=shlex.join(cmd),
            source_path=str(source),
            output=proc.stdout + proc.stderr,
        )


def bridge_spec(csrc_dir: Path = CSRC_DIR) -> BuildSpec:
    """The cache spec of the runtime-compiler bridge: its sources (through the compiler's depfile),
    the host compiler, the runtime version and location (the library is linked with an rpath to
    it) decide which build is used."""
    rt = find_runtime()
    cxx = host_cxx()
    csrc_dir = Path(csrc_dir).resolve()
    artifact = "libsgljit_sycl_bridge.so"

    includes = [f"-I{csrc_dir}", f"-I{rt.include}"]
    own = [str(csrc_dir), *include_folders(())]  # and CPATH's

    def toolchain_dirs() -> list[str]:
        return [*system_include_dirs(cxx), str(rt.include)]

    def scan(folder: Path) -> list[str]:
        source = str(csrc_dir / "sycl_bridge.cpp")
        cmd = [cxx, *BRIDGE_FLAGS, *includes, source, "-M", "-MF", "scan.d"]
        return outside(dependency_scan(cmd, folder), toolchain_dirs(), own)

    def build(folder: Path) -> list[str]:
        cmd = [
            cxx, *BRIDGE_FLAGS, "-MD", "-MF", "bridge.d", *includes,
            str(csrc_dir / "sycl_bridge.cpp"), "-o", artifact,
            f"-L{rt.lib}", f"-Wl,-rpath,{rt.lib}", "-lsycl", "-ldl",
        ]  # fmt: skip
        _run_compiler(cmd, folder, csrc_dir / "sycl_bridge.cpp")
        deps = read_depfile((folder / "bridge.d").read_text())
        return outside(deps, toolchain_dirs(), own)

    return BuildSpec(
        backend="sycl",
        arch="bridge",
        name="sycl_bridge",
        artifact=artifact,
        roots={"csrc": csrc_dir},
        fingerprint=(
            TOOLCHAIN + "c++ " + compiler_identity(cxx),
            f"intel-sycl-rt=={rt.version}",
            f"runtime {rt.lib}",
            *BRIDGE_FLAGS,
            *("env " + e for e in compiler_environment()),
        ),
        build=build,
        load=_load_bridge,
        scan=scan,
        include_path=tuple(own),
    )


@cache_once
def bridge() -> ctypes.CDLL:
    """The runtime-compiler bridge, built on first use (a few seconds) and cached on disk."""
    _configure_opencl_loader(find_runtime())
    return get_or_build(bridge_spec())


# --------------------------------------------------------------------------------------------
# Modules and launchers


def _dims(size: int | Sequence[int], what: str, empty_ok: bool = False) -> tuple[int, ...]:
    dims = (int(size),) if isinstance(size, int) else tuple(int(s) for s in size)
    if not 1 <= len(dims) <= 3 or min(dims) < (0 if empty_ok else 1):
        raise ValueError(
            f"{what} must be a positive int or a tuple of 1-3 positive ints, got {size!r}"
        )
    return dims


class SYCLFunction:
    """A kernel with a fixed signature: ``fn(global_size, local_size, *args)``.

    ``global_size`` is the total number of work-items per dimension (a multiple of ``local_size``,
    the work-group size). Tensors pass as ``ptr`` (their ``data_ptr()``); all tensors must be on one
    device, which picks the queue. An empty ``global_size`` (a 0 in it) launches nothing, as an
    empty CUDA grid does.
    """

    def __init__(self, module: SYCLModule, name: str, argtypes: Sequence[str]):
        unknown = [a for a in argtypes if a not in ARG_KINDS]
        if unknown:
            raise ValueError(
                f"get_function({name!r}): unknown argument kinds {unknown}; use {list(ARG_KINDS)}"
            )
        self.module, self.name, self.argtypes = module, name, tuple(argtypes)
        self._kinds = (ctypes.c_int8 * len(argtypes))(*(ARG_KINDS[a] for a in argtypes))
        self._kernels: dict[str, int] = {}  # device key → sycl::kernel*

    def __repr__(self) -> str:
        sig = ", ".join(self.argtypes)
        return f"<SYCLFunction {self.name}({sig}) of {self.module.name} ({self.module.route})>"

    def __call__(
        self, global_size: int | Sequence[int], local_size: int | Sequence[int], *args: Any
    ) -> None:
        if len(args) != len(self.argtypes):
            raise TypeError(f"{self.name} takes {len(self.argtypes)} arguments, got {len(args)}")
        g, loc = _dims(global_size, "global_size", empty_ok=True), _dims(local_size, "local_size")
        if 0 in g:
            return
        if len(g) != len(loc) or any(a % b for a, b in zip(g, loc, strict=True)):
            raise ValueError(f"{self.name}: global_size {g} must be a multiple of local_size {loc}")
        device = None
        values = []
        for kind, arg in zip(self.argtypes, args, strict=True):
            if kind == "ptr":
                if hasattr(arg, "data_ptr"):
                    if device is not None and arg.device != device:
                        raise ValueError(f"{self.name}: tensors on {device} and {arg.device}")
                    device, arg = arg.device, arg.data_ptr()
                values.append(ctypes.c_void_p(arg))
            else:
                values.append(_CTYPES[kind](arg))
        queue, key, wait = self.module._queue(device)
        kernel = self._kernels.get(key) or self._kernels.setdefault(
            key, self.module._kernel(self.name, queue, key)
        )
        n = len(values)
        ok = self.module._lib.sgljit_sycl_launch(
            queue, kernel, len(g), (ctypes.c_size_t * 3)(*g), (ctypes.c_size_t * 3)(*loc),
            n, self._kinds, (ctypes.c_void_p * n)(*(ctypes.addressof(v) for v in values)), wait,
        )  # fmt: skip
        if not ok:
            raise RuntimeError(
                f"SYCL kernel {self.name} ({self.module.name}) failed: "
                f"{_last_error(self.module._lib)}"
            )


@dataclasses.dataclass(frozen=True)
class RtcSource:
    """What the runtime compiler builds for a module: the generated source, its build options (by
    path for the compiler, by role for the key), the folders those roles name, and the kernels
    the sources define (their saved binaries look kernels up by the names recorded for these)."""

    source: str
    options: tuple[str, ...]
    key_options: tuple[str, ...]
    roots: dict[str, Path]
    kernels: tuple[str, ...]


class SYCLModule:
    """A loaded SYCL module; ``get_function(name, argtypes)`` gives its launchers."""

    def __init__(self, name: str, route: str, key: str, lib: ctypes.CDLL, *, rtc=None):
        self.name, self.route, self.key = name, route, key
        self._lib = lib
        self._rtc: RtcSource | None = rtc
        self._functions: dict[tuple[str, tuple[str, ...]], SYCLFunction] = {}
        self._lock = threading.Lock()
        self.targets: tuple[str, ...] = ()  # icpx: the AOT targets it was built for

    def __repr__(self) -> str:
        return f"<SYCLModule {self.name} route={self.route} key={self.key}>"

    def get_function(self, name: str, argtypes: Sequence[str]) -> SYCLFunction:
        sig = (name, tuple(argtypes))
        fn = self._functions.get(sig)
        if fn is None:
            fn = self._functions.setdefault(sig, SYCLFunction(self, name, argtypes))
        return fn

    def build(self, device: Any = "cpu") -> SYCLModule:
        """Compile now for ``device`` (``"cpu"``, ``"xpu:0"``, a torch.device) rather than at the
        first launch, e.g. to prebuild it into the cache. icpx modules are built already."""
        if self.route == "rtc":
            import torch

            queue, key, _ = self._queue(torch.device(device))
            _rtc_program(self, queue, key)
        return self

    def _queue(self, device) -> tuple[int, str, int]:
        return _queue_for(self._lib, device)

    def _kernel(self, name: str, queue: int, device_key: str) -> int:
        with self._lock:
            if self.route == "rtc":
                program = _rtc_program(self, queue, device_key)
                if program.kernel_names and name not in program.kernel_names:
                    raise AttributeError(
                        f"{self.name}: no kernel named '{name}' in the module "
                        f"(it has {', '.join(sorted(program.kernel_names))})"
                    )
                kernel = self._lib.sgljit_sycl_get_kernel(
                    program.handle, program.kernel_names.get(name, name).encode()
                )
            else:
                if device_key == "cpu" and not any(t.startswith("spir64") for t in self.targets):
                    raise RuntimeError(
                        f"{self.name} was built by icpx for {','.join(self.targets)} only; to run it "
                        "on CPU tensors add spir64_x86_64 to SGLJIT_SYCL_TARGETS or use route='rtc'"
                    )
                getter = getattr(self._lib, f"sgljit_sycl_kernel_{name}", None)
                if getter is None:
                    raise AttributeError(
                        f"no kernel {name!r} in {self.name}: icpx modules export the "
                        'extern "C" nd-range free functions found in the sources '
                        "(see include/README.md)"
                    )
                getter.restype, getter.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
                kernel = getter(queue)
        if not kernel:
            raise AttributeError(f"{self.name}: {_last_error(self._lib)}")
        return kernel


def _queue_for(lib: ctypes.CDLL, device) -> tuple[int, str, int]:
    """(sycl::queue*, device key, wait) for tensors on ``device`` (None: no tensors)."""
    if device is None or device.type == "cpu":
        queue = lib.sgljit_sycl_cpu_queue()
        if not queue:
            raise RuntimeError(
                f"no SYCL CPU device: {_last_error(lib)} "
                f"(the SYCL CPU device comes from: {INSTALL_HINT})"
            )
        return queue, "cpu", 1
    if device.type == "xpu":
        import torch

        queue = torch.xpu.current_stream(device).sycl_queue  # torch's sycl::queue*, as an int
        index = torch.xpu.current_device() if device.index is None else device.index
        return int(getattr(queue, "value", queue)), f"xpu:{index}", 0
    raise ValueError(f"SYCL kernels run on xpu or cpu tensors, not {device}")


def _device_identity(lib: ctypes.CDLL, queue: int) -> tuple[str, str]:
    """(backend, "backend\tname\tdriver\tplatform") of the queue's device."""
    identity = (lib.sgljit_sycl_device_identity(queue) or b"").decode()
    return identity.split("\t")[0] or "unknown backend", identity


@dataclasses.dataclass(frozen=True)
class _Program:
    """A built or reloaded program (bridge ``Program*``) and the names its kernels go by."""

    handle: int
    kernel_names: dict[str, str]


# Programs per process: (module key, device key) → _Program. Never freed: launched kernels use them.
_programs: dict[tuple[str, str], _Program] = forget_on_clear({})
_programs_lock = threading.Lock()
# A saved binary: one JSON line (format, kernel names), then the device binary.
SAVED_FORMAT = "sgljit-sycl-opencl-binary-1"
SAVED_SUFFIX = ".bin"


def _compile_source(
    module: SYCLModule, queue: int, device_key: str, extra: Sequence[str] = ()
) -> int:
    """Compile the module's source for a queue's device; ``extra``: options that do not change the
    binary (where to write the dependency file)."""
    rtc, lib = module._rtc, module._lib
    opts = [o.encode() for o in (*rtc.options, *extra)]
    logger.debug("sgljit: runtime compiler: %s on %s", module.name, device_key)
    handle = lib.sgljit_sycl_build(
        queue, rtc.source.encode(), len(opts), (ctypes.c_char_p * len(opts))(*opts)
    )
    if not handle:
        message = _last_error(lib)
        if lib.sgljit_sycl_last_error_kind() == 1:
            raise CompileError(
                f"SYCL module {module.name!r} failed to compile (runtime compiler, {device_key})",
                command="kernel_compiler build options: " + shlex.join(rtc.options),
                source_path=rtc.source,
                output=message,
            )
        raise RuntimeError(f"SYCL module {module.name!r}: {message}")
    return handle


def _save_binary(lib: ctypes.CDLL, handle: int, kernels: Sequence[str], path: Path) -> None:
    size = lib.sgljit_sycl_save(handle, None, 0)
    if size < 0:
        raise RuntimeError(_last_error(lib))
    buf = (ctypes.c_ubyte * size)()
    if lib.sgljit_sycl_save(handle, buf, size) != size:
        raise RuntimeError(_last_error(lib))
    names = {}
    for k in kernels:
        raw = lib.sgljit_sycl_raw_kernel_name(handle, k.encode())
        if raw is None:
            raise RuntimeError(_last_error(lib))
        names[k] = raw.decode()
    header = json.dumps({"format": SAVED_FORMAT, "kernels": names}, sort_keys=True)
    path.write_bytes(header.encode() + b"\n" + bytes(buf))


def load_saved(lib: ctypes.CDLL, queue: int, path: Path) -> _Program:
    """A program from a binary saved by the runtime-compiler route, for the queue's device."""
    header, _, blob = read_regular(path).partition(b"\n")
    meta = json.loads(header)
    if meta.get("format") != SAVED_FORMAT:
        raise ValueError(f"{path}: not a saved SYCL binary of format {SAVED_FORMAT}")
    handle = lib.sgljit_sycl_load(queue, blob, len(blob))
    if not handle:
        raise RuntimeError(f"{path}: {_last_error(lib)}")
    return _Program(handle, dict(meta["kernels"]))


# The runtime compile's options that decide which headers a source reaches, as one word (-Idir) or
# two (-I dir).
_HEADER_OPTIONS = ("-I", "-isystem", "-iquote", "-idirafter", "-include", "-D", "-U")
# The runtime compiler's own headers, built into libsycl-jit: its dependency output names them
# under this folder, which exists nowhere on disk (the runtime's version is in the key).
_RTC_OWN_HEADERS = "/sycl-jit-toolchain"


def _header_options(opts: Sequence[str]) -> list[str]:
    """The options of ``opts`` the host preprocessor needs to find the same headers.

    >>> _header_options(["-I", "/a", "-isystem/b", "-O3", "-DX=1", "-fsycl"])
    ['-I', '/a', '-isystem', '/b', '-D', 'X=1']
    """
    return [word for pair in options(opts, _HEADER_OPTIONS) for word in pair]


def _host_scan(folder: Path, rtc: RtcSource) -> list[str]:
    """The headers the module's source includes as the host preprocessor sees it, with the same
    include and macro options: what the build will read, listed before it (the device compile's
    own dependency output, after it, is what is recorded)."""
    rt = find_runtime()
    cmd = [
        host_cxx(), "-std=c++17", "-DSYCL_DISABLE_FSYCL_SYCLHPP_WARNING", "-isystem",
        str(rt.include), *_header_options(rtc.options), "-x", "c++", "module.cpp",
        "-M", "-MF", "scan.d",
    ]  # fmt: skip
    return dependency_scan(cmd, folder)


def _rtc_spec(
    module: SYCLModule, queue: int, device_key: str, backend: str, identity: str
) -> BuildSpec:
    """The cache spec of a runtime-compiled module for one device (its binary is the device's own:
    the device, its driver and the runtime are in the key)."""
    rt, rtc, lib, cxx = find_runtime(), module._rtc, module._lib, host_cxx()
    artifact = module.name + SAVED_SUFFIX
    own = include_folders(rtc.options)

    def toolchain_dirs() -> list[str]:
        # The runtime compiler reads the host C++ library's headers too (the host c++'s identity).
        return [*system_include_dirs(cxx), str(rt.include), _RTC_OWN_HEADERS]

    def scan(folder: Path) -> list[str]:
        return outside(_host_scan(folder, rtc), toolchain_dirs(), own)

    def build(folder: Path) -> list[str]:  # module.cpp (spec.files) is in the folder already
        depfile = folder / "device.d"
        handle = _compile_source(module, queue, device_key, ("-MD", "-MF", str(depfile)))
        _save_binary(lib, handle, rtc.kernels, folder / artifact)
        # The device compile's own dependency output: the headers it read under the macros it
        # defines (__SYCL_DEVICE_ONLY__, __clang__, ...), which no host scan sees. A runtime that
        # writes none leaves the host scan's list.
        written = depfile.is_file()
        deps = read_depfile(depfile.read_text()) if written else _host_scan(folder, rtc)
        return outside(deps, toolchain_dirs(), own)

    return BuildSpec(
        backend="sycl",
        arch=f"{backend}-{short_hash(identity)[:12]}",
        name=module.name,
        artifact=artifact,
        files={"module.cpp": rtc.source},
        fingerprint=(
            TOOLCHAIN + "c++ " + compiler_identity(cxx),
            f"intel-sycl-rt=={rt.version}",
            "device " + identity,
            "options " + shlex.join(rtc.key_options),
        ),
        roots=rtc.roots,
        build=build,
        load=lambda path: load_saved(lib, queue, path),
        scan=scan,
        inputs=tuple(flag_files(rtc.options)),
        include_path=tuple(own),
    )


def _rtc_program(module: SYCLModule, queue: int, device_key: str) -> _Program:
    """The module's program for a device: from the cache on disk where the device's binaries can
    be kept (OpenCL: the SYCL CPU device), else compiled once per process."""
    with _programs_lock:
        program = _programs.get((module.key, device_key))
        if program is not None:
            return program
        lib = module._lib
        backend, identity = _device_identity(lib, queue)
        if backend == "opencl":
            program = get_or_build(_rtc_spec(module, queue, device_key, backend, identity))
        else:
            if os.environ.get("SGLJIT_NO_COMPILE", "") not in ("", "0"):
                raise NoCompileError(
                    f"SYCL module {module.name!r} cannot be kept on disk for {device_key} "
                    f"({backend}: the runtime compiler "
                    "saves binaries for OpenCL devices only) and SGLJIT_NO_COMPILE is set; use "
                    "the icpx route (oneAPI) to prebuild it, or unset SGLJIT_NO_COMPILE"
                )
            logging.getLogger("sgljit.compile").info(
                "sgljit: compiling %s for %s in this process (runtime compiler; not kept on disk "
                "on this backend) ...",
                module.name,
                device_key,
            )
            program = _Program(_compile_source(module, queue, device_key), {})
        _programs[(module.key, device_key)] = program
        return program


def saved_binaries_supported(device: Any = "cpu") -> tuple[bool, str]:
    """(whether runtime-compiled modules for ``device`` are kept on disk, the device's backend)."""
    import torch

    lib = bridge()
    queue, _, _ = _queue_for(lib, torch.device(device))
    backend, _ = _device_identity(lib, queue)
    return backend == "opencl", backend


def _sources(sycl_files: Sequence[str | os.PathLike]) -> tuple[Path, ...]:
    files = tuple(Path(f).resolve() for f in sycl_files)
    if not files:
        raise ValueError("load_jit_sycl: give at least one file in sycl_files")
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"load_jit_sycl: sycl file not found: {f}")
    return files


def _include_roots(
    files: tuple[Path, ...], include_dirs: tuple[Path, ...]
) -> tuple[dict[str, Path], list[str]]:
    """(role → folder, roles in include order): core's include folder, the sources' folders, the
    include dirs."""
    roots: dict[str, Path] = {"sgljit": INCLUDE_DIR}
    for i, d in enumerate(dict.fromkeys(f.parent for f in files)):
        roots[f"src{i}"] = d
    for i, d in enumerate(include_dirs):
        roots[f"include{i}"] = d
    return roots, list(roots)


def _load_rtc(name, files, include_dirs, cflags) -> SYCLModule:
    lib = bridge()
    roots, order = _include_roots(files, include_dirs)
    # Sources are included by name from their folders (on the include path), so neither the
    # source text nor the key holds an installation's paths; in angle brackets, because the
    # runtime compiler looks for a quoted name in the process's working directory first.
    source = "".join(f"#include <{f.name}>\n" for f in files)
    kernels = tuple(dict.fromkeys(k for f in files for k in find_kernels(f.read_text())))
    rtc = RtcSource(
        source=source,
        options=(*(f"-I{roots[r]}" for r in order), *cflags),
        key_options=(*("-I{" + r + "}" for r in order), *cflags),
        roots=roots,
        kernels=kernels,
    )
    # In-process identity: by path (two source folders of one module name are two modules here;
    # on disk the key names folders by role and the recorded dependencies tell builds apart).
    key = short_hash(name, source, *rtc.options)
    return SYCLModule(name, "rtc", key, lib, rtc=rtc)


# --------------------------------------------------------------------------------------------
# The icpx route

# An nd-range free-function kernel as the convention writes it: extern "C", properties, void name(.
_KERNEL_RE = re.compile(
    r'extern\s+"C"\s+((?:SYCL_EXT_ONEAPI_FUNCTION_PROPERTY\s*\(\(.*?\)\)\s*)+)void\s+(\w+)\s*\(',
    re.S,
)
_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def find_kernels(text: str) -> tuple[str, ...]:
    """Names of the nd-range free-function kernels in a source, in order.

    >>> find_kernels('extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))'
    ...              ' void scale(const float* x) {}')
    ('scale',)
    """
    text = _COMMENT_RE.sub(" ", text)
    return tuple(m.group(2) for m in _KERNEL_RE.finditer(text) if "nd_range_kernel" in m.group(1))


_XPU_TARGETS = (
    ("Max", "intel_gpu_pvc"),
    ("B580", "intel_gpu_bmg_g21"),
    ("B570", "intel_gpu_bmg_g21"),
)


def sycl_targets() -> tuple[str, ...]:
    """AOT targets for icpx: ``$SGLJIT_SYCL_TARGETS`` (comma separated), else the current XPU's,
    else ``spir64`` (JIT-compiled by the driver at first launch) with a warning."""
    override = [t for t in re.split(r"[,\s]+", os.environ.get("SGLJIT_SYCL_TARGETS", "")) if t]
    if override:
        return tuple(override)
    try:
        import torch

        if torch.xpu.is_available():
            name = torch.xpu.get_device_properties(torch.xpu.current_device()).name
            for needle, target in _XPU_TARGETS:
                if needle in name:
                    return (target,)
            warnings.warn(
                f"sgljit: no AOT target known for XPU {name!r}; building spir64 "
                "(JIT-compiled at first launch). "
                "Set SGLJIT_SYCL_TARGETS (e.g. intel_gpu_pvc) to compile ahead of time.",
                RuntimeWarning,
                stacklevel=3,
            )
            return ("spir64",)
    except (ImportError, AttributeError, RuntimeError):
        pass
    warnings.warn(
        "sgljit: no XPU found and SGLJIT_SYCL_TARGETS unset; building spir64",
        RuntimeWarning,
        stacklevel=3,
    )
    return ("spir64",)


@dataclasses.dataclass(frozen=True)
class IcpxPlan:
    """What the icpx route would run: the exact command (run inside the staging folder), the cache
    key, the generated translation unit and the kernels it exports."""

    name: str
    key: str
    command: tuple[str, ...]
    source: str
    kernels: tuple[str, ...]
    targets: tuple[str, ...]
    spec: BuildSpec


def _icpx_source(name: str, files: tuple[Path, ...], kernels: tuple[str, ...], tag: str) -> str:
    lines = [
        f"// Generated by sgljit for SYCL module {name} (icpx route).",
        "#include <sycl/sycl.hpp>",
        "#include <sgljit/sycl/kernel.hpp>",
        '#include "sycl_bridge.hpp"',
        "// DPC++ kernel names are process-wide: give this module's kernels unique names, so",
        '// two specializations of one source (same extern "C" names) never swap kernels.',
        *(f"#define {k} {k}__{tag}" for k in kernels),
        *(f'#include "{f.name}"' for f in files),  # from their folders, on the include path
        *(f"#undef {k}" for k in kernels),
    ]
    for k in kernels:
        lines += [
            f"SGLJIT_SYCL_API void* sgljit_sycl_kernel_{k}(void* queue) {{",
            "  return sgljit_bridge::guarded([&]() -> void* {",
            "    auto& q = *static_cast<sycl::queue*>(queue);",
            f"    sycl::kernel_id id = syclexp::get_kernel_id<{k}__{tag}>();",
            "    auto bundle = sycl::get_kernel_bundle<sycl::bundle_state::executable>(",
            "        q.get_context(), {q.get_device()}, {id});",
            "    return new sycl::kernel(bundle.get_kernel(id));",
            "  }, static_cast<void*>(nullptr));",
            "}",
        ]
    return "\n".join(lines) + "\n"


def plan_icpx_build(
    *markers: Any,
    sycl_files: Sequence[str | os.PathLike] = (),
    include_dirs: Sequence[str | os.PathLike] = (),
    extra_sycl_cflags: Sequence[str] = (),
    extra_ldflags: Sequence[str] = (),
    icpx: str | None = None,
) -> IcpxPlan:
    """Plan the icpx build of a module without running anything (a dry run: icpx need not exist).

    >>> plan = plan_icpx_build("scale", sycl_files=["scale.hpp"])  # doctest: +SKIP
    >>> plan.command[:2], plan.kernels  # doctest: +SKIP
    (('icpx', '-fsycl'), ('scale',))
    """
    name = module_name(*markers)
    files = _sources(sycl_files)
    incs = tuple(Path(d).resolve() for d in include_dirs)
    texts = [f.read_text() for f in files]
    kernels = tuple(dict.fromkeys(k for t in texts for k in find_kernels(t)))
    if not kernels:
        raise ValueError(
            f"load_jit_sycl({name}): no kernels found in {[str(f) for f in files]}; the icpx "
            'route needs extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY('
            "(syclexp::nd_range_kernel<N>)) void name(...)"
        )
    icpx = icpx or icpx_command() or "icpx"
    targets = sycl_targets()
    artifact = f"lib{name}.so"
    roots, order = _include_roots(files, incs)
    roots["csrc"] = CSRC_DIR

    def flags_with(include: Callable[[str], str]) -> tuple[str, ...]:
        return (
            icpx, "-fsycl", "-O3", "-std=c++17", "-fPIC", "-shared", *ICPX_NUMERICS_FLAGS,
            f"-fsycl-targets={','.join(targets)}", *(include(r) for r in [*order, "csrc"]),
            *extra_sycl_cflags,
        )  # fmt: skip

    outputs = ("-MD", "-MF", "module.d", "module.cpp", "-o", artifact, *extra_ldflags)
    command = (*flags_with(lambda role: f"-I{roots[role]}"), *outputs)
    key_command = (*flags_with(lambda role: "-I{" + role + "}"), *outputs)
    tag = short_hash(name, *key_command)
    source = _icpx_source(name, files, kernels, tag)
    own = [*(str(roots[r]) for r in [*order, "csrc"]), *include_folders(extra_sycl_cflags)]

    def toolchain_dirs() -> list[str]:
        found = shutil.which(icpx)
        root = [os.path.dirname(os.path.dirname(os.path.realpath(found)))] if found else []
        return [*root, *system_include_dirs(icpx)]

    def scan(folder: Path) -> list[str]:
        cmd = [*flags_with(lambda role: f"-I{roots[role]}"), "module.cpp", "-M", "-MF", "scan.d"]
        return outside(dependency_scan(cmd, folder), toolchain_dirs(), own)

    def build(folder: Path) -> list[str]:
        _run_compiler(list(command), folder, folder / "module.cpp")
        deps = read_depfile((folder / "module.d").read_text())
        return outside(deps, toolchain_dirs(), own)

    spec = BuildSpec(
        backend="sycl",
        arch="+".join(targets),
        name=name,
        artifact=artifact,
        files={"module.cpp": source},
        fingerprint=(TOOLCHAIN + "icpx " + compiler_identity(icpx), *key_command),
        roots=roots,
        build=build,
        load=lambda path: _declare_abi(ctypes.CDLL(str(path))),  # never dlclose'd
        scan=scan,
        inputs=tuple(flag_files([*extra_sycl_cflags, *extra_ldflags])),
        include_path=tuple(own),
    )
    return IcpxPlan(name, cache_key(spec), command, source, kernels, targets, spec)


# --------------------------------------------------------------------------------------------
# Entry points


def _pick_route(route: str) -> str:
    if route not in ROUTES:
        raise ValueError(f"load_jit_sycl: route must be one of {ROUTES}, got {route!r}")
    if route == "auto":
        return "icpx" if icpx_command() else "rtc"
    return route


def icpx_command() -> str | None:
    """The icpx to use: ``SGLJIT_ICPX`` (which must name one), else ``icpx`` on the PATH, else None."""
    named = os.environ.get("SGLJIT_ICPX", "").strip()
    found = shutil.which(named or "icpx")
    if named and found is None:
        raise FileNotFoundError(
            f"SGLJIT_ICPX={named!r}: no such compiler (unset it to use the PATH)"
        )
    return found


def load_jit_sycl(
    *markers: Any,
    sycl_files: Sequence[str | os.PathLike] = (),
    include_dirs: Sequence[str | os.PathLike] = (),
    extra_sycl_cflags: Sequence[str] = (),
    extra_ldflags: Sequence[str] = (),
    route: str = "auto",
) -> SYCLModule:
    """Compile SYCL kernel sources into a module (memoized in-process and, for icpx, on disk).

    ``markers`` name the specialization (module name = markers joined); ``extra_sycl_cflags``
    specialize the source (``-DSGLJIT_T=bf16_t``, sizes). ``extra_ldflags`` apply to icpx only.
    Wrap loaders in :func:`sgljit.cache_once`: each call hashes the sources.
    """
    route = _pick_route(route)
    if route == "icpx":
        plan = plan_icpx_build(
            *markers,
            sycl_files=sycl_files,
            include_dirs=include_dirs,
            extra_sycl_cflags=extra_sycl_cflags,
            extra_ldflags=extra_ldflags,
        )
        module = SYCLModule(plan.name, "icpx", plan.key, get_or_build(plan.spec))
        module.targets = plan.targets
        return module
    files = _sources(sycl_files)
    incs = tuple(Path(d).resolve() for d in include_dirs)
    return _load_rtc(module_name(*markers), files, incs, tuple(extra_sycl_cflags))


def describe() -> dict[str, Any]:
    """What ``sgljit info`` prints about SYCL: runtime, devices, routes, icpx.

    >>> sorted(describe())  # doctest: +SKIP
    ['default_route', 'devices', 'error', 'icpx', 'opencl_loader', 'routes', 'runtime']
    """
    try:
        icpx = icpx_command()
    except FileNotFoundError as err:
        icpx = str(err)
    info: dict[str, Any] = {
        "runtime": None,
        "devices": [],
        "routes": [],
        "icpx": icpx,
        "error": None,
    }
    if icpx:
        info["routes"].append("icpx")
    try:
        rt = find_runtime()
        info["runtime"] = f"intel-sycl-rt {rt.version} ({rt.lib})"
        info["routes"].append("rtc")
        text = (bridge().sgljit_sycl_devices() or b"").decode()
        for line in text.splitlines():
            backend, kind, name, can_build, sub_groups = line.split("\t")
            info["devices"].append(
                {
                    "backend": backend,
                    "type": kind,
                    "name": name,
                    "can_build_source": can_build == "1",
                    "sub_group_sizes": [int(s) for s in sub_groups.split()],
                }
            )
    except (SgljitError, OSError) as err:
        info["error"] = str(err)
    info["default_route"] = info["routes"][0] if info["routes"] else None
    info["opencl_loader"] = {k: os.environ.get(k) for k in ("OCL_ICD_FILENAMES", "OCL_ICD_VENDORS")}
    return info

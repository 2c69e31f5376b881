"""sgljit: just-in-time compiled GPU kernels for LLM and diffusion serving.

>>> import sgljit
>>> sgljit.__version__
'0.1.0'

Kernels live in plugins and are called as ``sgljit.ops.<name>(...)``. Building blocks for writing
kernels: :func:`load_jit` (CUDA/C++ through tvm-ffi), :func:`load_jit_sycl` (SYCL), :func:`make_cpp_args`,
:func:`cache_once`, and :mod:`sgljit.op` (declaring ops: ``Family``, ``Tensor``, ``Scalar``, ``Cuda``,
``Sycl``, ``Case``). Torch modules over the kernels: :mod:`sgljit.nn`; one-line patches of Hugging
Face models: :mod:`sgljit.integrations`. Heavy imports (torch, tvm-ffi) happen on first use.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

from ._version import __version__
from .errors import CacheError, CompileError, NoCompileError, PluginError, SgljitError
from .jit_utils import cache_once, make_cpp_args

__all__ = [
    "CacheError",
    "CompileError",
    "NoCompileError",
    "PluginError",
    "SgljitError",
    "__version__",
    "cache_once",
    "clear_module_cache",
    "integrations",
    "load_jit",
    "load_jit_sycl",
    "make_cpp_args",
    "nn",
    "ops",
    "select_backend",
    "use_backend",
]

_LAZY = {
    "load_jit": ("cuda", "load_jit"),
    "load_jit_sycl": ("sycl", "load_jit_sycl"),
    "clear_module_cache": ("cache", "clear_module_cache"),
    "select_backend": ("backend", "select_backend"),
    "use_backend": ("backend", "use_backend"),
    "ops": ("ops", None),
    "nn": ("nn", None),
    "integrations": ("integrations", None),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'sgljit' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(f".{module_name}", __name__)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def _configure_logging() -> None:
    """Unset, SGLJIT_LOG prints one line per compile to stderr (a first use compiles for seconds);
    info adds how long each took and why a cached build was not reused, debug more; 1/true/on mean
    info; 0/false/off print nothing."""
    levels = ("debug", "info", "warning", "error", "critical")
    level = os.environ.get("SGLJIT_LOG", "").strip().lower()
    level = {"1": "info", "true": "info", "yes": "info", "on": "info"}.get(level, level)
    if level in ("0", "false", "no", "off"):
        return
    if level == "":
        compiles = logging.getLogger("sgljit.compile")
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        compiles.addHandler(handler)
        compiles.setLevel("INFO")
        compiles.propagate = False  # printed here only, whatever the application's logging
        return
    if level not in levels:
        raise ValueError(
            f"SGLJIT_LOG={os.environ['SGLJIT_LOG']!r}: expected one of {', '.join(levels)}, "
            "on (1, true, yes: info) or off (0, false, no: nothing); unset, one line per compile"
        )
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("sgljit").addHandler(handler)
    logging.getLogger("sgljit").setLevel(level.upper())


def _check_pdl() -> None:
    """SGLJIT_PDL, which the CUDA kernels read (include/sgljit/cuda.cuh): 0 turns programmatic
    dependent launch off, 1 or unset leaves it on; anything else would silently mean on."""
    value = os.environ.get("SGLJIT_PDL")
    if value is not None and value not in ("0", "1"):
        raise ValueError(
            f"SGLJIT_PDL={value!r}: expected 0 (ordinary launches) or 1 (programmatic dependent "
            "launch on sm_90+, the default when unset)"
        )


def _run_as_the_command() -> bool:
    """Whether this process is the ``sgljit`` command (its script, or ``python -m sgljit.cli``)."""
    argv = getattr(sys, "orig_argv", sys.argv)
    modules = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "-m"]
    return os.path.basename(sys.argv[0] if sys.argv else "") == "sgljit" or "sgljit.cli" in modules


# The settings are checked here, so a bad value fails at import, not at the first op; the backend
# module imports nothing heavy. The command says what is wrong without a traceback.
try:
    _configure_logging()
    _check_pdl()
    importlib.import_module(".backend", __name__)  # checks $SGLJIT_BACKEND
except ValueError as _err:
    if not _run_as_the_command():
        raise
    print(f"sgljit: error: {_err}", file=sys.stderr)
    raise SystemExit(2) from None

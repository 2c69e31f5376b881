"""Small helpers for writing module loaders: C++ template arguments and a compile-safe memo."""

from __future__ import annotations

import functools
import re
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["CppArgs", "as_dtype", "cache_once", "make_cpp_args", "module_name"]

F = TypeVar("F", bound=Callable[..., Any])

# torch dtype name → the C++ type names core's headers define (type.cuh; int types from <cstdint>).
_CPP_DTYPES = {
    "float32": "fp32_t",
    "float16": "fp16_t",
    "bfloat16": "bf16_t",
    "float8_e4m3fn": "fp8_e4m3_t",
    "float8_e5m2": "fp8_e5m2_t",
    "float64": "double",
    "int8": "int8_t",
    "int16": "int16_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "uint8": "uint8_t",
    "bool": "bool",
}


class CppArgs(list):
    """C++ template arguments; ``str()`` joins them with ", " so they drop into ``Kernel<{args}>``."""

    def __str__(self) -> str:
        return ", ".join(self)


def make_cpp_args(*values: Any) -> CppArgs:
    """Turn Python values into C++ template arguments.

    >>> import torch
    >>> str(make_cpp_args(torch.bfloat16, 4096, True, 0.5))
    'bf16_t, 4096, true, 0.5f'
    """
    out = CppArgs()
    for v in values:
        if isinstance(v, bool):
            out.append("true" if v else "false")
        elif isinstance(v, int):
            out.append(str(v))
        elif isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise ValueError(f"make_cpp_args: {v} has no C++ literal")
            out.append(f"{v!r}f")
        elif type(v).__name__ == "dtype" and type(v).__module__ == "torch":
            name = str(v).removeprefix("torch.")
            if name not in _CPP_DTYPES:
                raise TypeError(
                    f"make_cpp_args: no C++ type for {v}; supported: {sorted(_CPP_DTYPES)}"
                )
            out.append(_CPP_DTYPES[name])
        elif isinstance(v, str):
            out.append(v)
        else:
            raise TypeError(
                f"make_cpp_args: cannot turn {type(v).__name__} {v!r} into a C++ argument"
            )
    return out


def as_dtype(value: Any, name: str = "dtype") -> Any:
    """A ``torch.dtype`` from a dtype or its name, as prebuild specs may give it.

    >>> import torch
    >>> as_dtype("bfloat16") is as_dtype("torch.bfloat16") is torch.bfloat16
    True
    """
    import torch

    if isinstance(value, torch.dtype):
        return value
    dtype = getattr(torch, str(value).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name}: {value!r} is not a torch dtype")
    return dtype


def module_name(*markers: Any) -> str:
    """A file-name-safe module name from markers: ``("rmsnorm", "bf16_t", 4096)`` → ``rmsnorm_bf16_t_4096``."""
    parts = []
    for m in markers:
        parts.extend(m if isinstance(m, CppArgs) else [m])
    name = "_".join(re.sub(r"[^A-Za-z0-9]+", "_", str(p)).strip("_") for p in parts)
    if not name:
        raise ValueError("load_jit: give at least one marker to name the module")
    return name[:120]


_all_memos: list[dict] = []


def _compiling() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def cache_once(fn: F) -> F:
    """Memoize ``fn`` by its (hashable) arguments, computing each result once.

    Thread-safe: concurrent first calls with the same arguments run ``fn`` once. Unlike
    ``functools.lru_cache`` it is plain Python that torch.compile can trace, so a loader may be
    called from a function compiled with ``fullgraph=True``.

    >>> @cache_once
    ... def square(n):
    ...     return n * n
    >>> square(4), square(4)
    (16, 16)
    """
    results: dict = {}
    locks: dict = {}
    guard = threading.Lock()
    _all_memos.append(results)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
        if key in results:
            return results[key]
        if _compiling():  # dynamo traces this branch; locks are not traceable
            return results.setdefault(key, fn(*args, **kwargs))
        with guard:
            lock = locks.setdefault(key, threading.Lock())
        with lock:
            if key not in results:
                results[key] = fn(*args, **kwargs)
            return results[key]

    wrapper.cache_clear = results.clear  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def forget_on_clear(memo: dict) -> dict:
    """Register a process-wide memo that :func:`sgljit.clear_module_cache` empties."""
    _all_memos.append(memo)
    return memo


def clear_cache_once() -> None:
    for memo in _all_memos:
        memo.clear()

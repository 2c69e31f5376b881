"""Which implementation of an op runs: chosen by the tensors' device, or forced by the user.

Default: ``cuda`` tensors → CUDA kernels, ``xpu`` tensors → SYCL kernels, ``cpu`` tensors → the
PyTorch reference. ``use_backend("sycl")`` (or ``SGLJIT_BACKEND=sycl``) runs the SYCL kernels on CPU
tensors through the SYCL CPU device; ``use_backend("reference")`` runs the reference everywhere.
``$SGLJIT_BACKEND`` is read and checked once, at ``import sgljit``; to change the backend at run time
use ``use_backend``. ``xpu`` names the SYCL backend too (what ``xpu`` tensors run); names are
case-insensitive.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

__all__ = ["BACKENDS", "backend_name", "forced_backend", "select_backend", "use_backend"]

BACKENDS = ("cuda", "sycl", "reference")
_DEVICE_BACKEND = {"cuda": "cuda", "xpu": "sycl", "cpu": "reference"}
_ALIASES = {"xpu": "sycl"}  # a device whose tensors one backend runs names that backend


def backend_name(name: object, where: str) -> str:
    """The backend ``name`` names, in any case (``xpu`` is ``sycl``); else a ValueError that starts
    with ``where`` (the variable or argument the name came from)."""
    backend = name
    if isinstance(name, str):
        backend = _ALIASES.get(name.lower(), name.lower())
    if backend not in BACKENDS:
        raise ValueError(
            f"{where}: expected one of cuda, sycl (or xpu), reference, got {name!r} (left unset, "
            "the tensors' device chooses: cuda -> CUDA kernels, xpu -> SYCL, cpu -> the reference)"
        )
    return backend


_ENV_TEXT = os.environ.get("SGLJIT_BACKEND", "").strip()
_ENV_BACKEND = backend_name(_ENV_TEXT, f"SGLJIT_BACKEND={_ENV_TEXT!r}") if _ENV_TEXT else None
_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "sgljit_backend", default=_ENV_BACKEND
)


def forced_backend() -> str | None:
    """The backend the user forced, by ``use_backend`` or ``$SGLJIT_BACKEND``; None if not forced."""
    return _forced.get()


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force a backend inside the block.

    >>> import torch, sgljit
    >>> with sgljit.use_backend("reference"):
    ...     sgljit.select_backend(torch.zeros(1))
    'reference'
    """
    token = _forced.set(backend_name(name, "use_backend"))
    try:
        yield
    finally:
        _forced.reset(token)


def select_backend(tensor) -> str:
    """The backend that runs an op whose first tensor argument is ``tensor``."""
    if tensor.is_cuda and _forced.get() is None:  # the eager hot path: one attribute, one lookup
        return "cuda"
    device = tensor.device.type
    default = _DEVICE_BACKEND.get(device)
    forced = forced_backend()
    if forced is None or forced == default:
        if default is None:
            raise ValueError(f"sgljit has no backend for tensors on {tensor.device}")
        return default
    if forced == "reference":
        return "reference"
    if forced == "sycl" and device in ("cpu", "xpu"):
        return "sycl"
    how = "$SGLJIT_BACKEND" if forced == _ENV_BACKEND else "use_backend"
    raise ValueError(
        f"backend {forced!r} was forced (by {how}) but the tensors are on {tensor.device}; "
        f"{forced} kernels cannot run there"
    )

"""Which implementation of an op runs: chosen by the tensors' device, or forced by the user.

Default: ``cuda`` tensors → CUDA kernels, ``xpu`` tensors → SYCL kernels, ``cpu`` tensors → the
PyTorch reference. ``use_backend("sycl")`` (or ``SGLJIT_BACKEND=sycl``) runs the SYCL kernels on CPU
tensors through the SYCL CPU device; ``use_backend("reference")`` runs the reference everywhere.
``$SGLJIT_BACKEND`` is read once, at import; to change the backend at run time use ``use_backend``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

__all__ = ["BACKENDS", "forced_backend", "select_backend", "use_backend"]

BACKENDS = ("cuda", "sycl", "reference")
_DEVICE_BACKEND = {"cuda": "cuda", "xpu": "sycl", "cpu": "reference"}
_ENV_BACKEND = os.environ.get("SGLJIT_BACKEND", "").strip() or None
if _ENV_BACKEND is not None and _ENV_BACKEND not in BACKENDS:
    raise ValueError(f"SGLJIT_BACKEND={_ENV_BACKEND!r}: expected one of {', '.join(BACKENDS)}")
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
    if name not in BACKENDS:
        raise ValueError(f"use_backend: {name!r} is not one of {', '.join(BACKENDS)}")
    token = _forced.set(name)
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

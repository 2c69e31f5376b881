"""What every plugin's tests share: which backends this machine can run, as pytest parameters."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


def _sycl_runtime_missing() -> bool:
    try:
        from sgljit import sycl

        sycl.find_runtime()
    except Exception:  # SYCLRuntimeNotFound
        return True
    return False


SYCL_MISSING = _sycl_runtime_missing()

# Every op test runs on each backend: the PyTorch reference everywhere, the SYCL kernels on the SYCL
# CPU device (nox -s tests-xpu installs the runtime), the CUDA kernels on a GPU.
BACKENDS = [
    "reference",
    pytest.param(
        "sycl",
        marks=[
            pytest.mark.sycl,
            pytest.mark.skipif(SYCL_MISSING, reason="SYCL runtime not installed"),
        ],
    ),
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]
    ),
]


def needs_gpu(test):
    """Decorator: a test that only runs on a CUDA GPU."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")(test))


def run_wide_dir(tmp_path_factory, name: str) -> Path:
    """A temporary folder that every pytest-xdist worker of this run shares (each worker's base
    folder is a sibling under the run's), so a module cache there compiles each module once."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    return path

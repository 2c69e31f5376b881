"""pytest plugin that runs sglang's own jit_kernel tests on ``sgljit.compat.sglang``.

Loaded with ``-p`` by ``test_sglang_quant_timestep.py`` in a fresh interpreter. It puts modules in
``sys.modules`` under the names those test files import, before they are collected:

- ``sglang.jit_kernel.per_tensor_quant_fp8`` and ``sglang.jit_kernel.timestep_embedding``: the
  modules of ``sgljit.compat.sglang`` themselves;
- ``sglang.jit_kernel.utils.get_ci_test_range`` and ``sglang.test.ci.ci_register.register_cuda_ci``:
  what sglang's versions do (ranges chosen by ``SGLANG_JIT_KERNEL_RUN_FULL_TESTS`` and
  ``SGLANG_IS_IN_CI``; registration is a no-op at run time);
- nothing else: ``sglang.srt.utils`` stays missing, which the quant test reads as "not ROCm".

``--cuda-as=cpu`` runs the tests without a GPU: a torch function mode, active around each test,
turns a ``device`` of type ``cuda`` given to a torch function (``torch.rand(..., device="cuda")``,
``x.to("cuda")``) into the CPU, so the tensors reach sgljit on the CPU, where ``SGLJIT_BACKEND``
picks the reference or the SYCL kernels. The tests' own code is not touched.
"""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch
from torch.overrides import TorchFunctionMode


def get_ci_test_range(full_range: list, ci_range: list) -> list:
    """sglang.jit_kernel.utils.get_ci_test_range: the full range unless sglang's CI is set."""
    if os.getenv("SGLANG_JIT_KERNEL_RUN_FULL_TESTS", "false").lower() == "true":
        return full_range
    in_ci = os.getenv("SGLANG_IS_IN_CI", "false").lower() in ("true", "1", "yes", "y")
    return ci_range if in_ci else full_range


def register_cuda_ci(*args, **kwargs) -> None:
    """sglang.test.ci.ci_register.register_cuda_ci: a marker read from the source, no-op here."""


def _module(name: str, package: bool = False, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    if package:
        module.__path__ = []
    module.__dict__.update(attrs)
    return module


def install_aliases() -> None:
    from sgljit.compat.sglang import per_tensor_quant_fp8, timestep_embedding

    modules = {
        "sglang": _module("sglang", package=True),
        "sglang.jit_kernel": _module("sglang.jit_kernel", package=True),
        "sglang.jit_kernel.per_tensor_quant_fp8": per_tensor_quant_fp8,
        "sglang.jit_kernel.timestep_embedding": timestep_embedding,
        "sglang.jit_kernel.utils": _module(
            "sglang.jit_kernel.utils", get_ci_test_range=get_ci_test_range
        ),
        "sglang.test": _module("sglang.test", package=True),
        "sglang.test.ci": _module("sglang.test.ci", package=True),
        "sglang.test.ci.ci_register": _module(
            "sglang.test.ci.ci_register", register_cuda_ci=register_cuda_ci
        ),
    }
    for name, module in modules.items():
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)


def _on_cpu(device):
    """``device`` with the CPU in place of CUDA (anything else unchanged)."""
    if isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda":
        return torch.device("cpu")
    return device


class CudaAsCpu(TorchFunctionMode):
    """Torch functions asked for a CUDA device get the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to:
            args = tuple(_on_cpu(a) for a in args)
        return func(*args, **kwargs)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cuda-as",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: run the tests' CUDA tensors on the CPU",
    )


def pytest_configure(config: pytest.Config) -> None:
    install_aliases()


@pytest.fixture(autouse=True)
def _cuda_as_cpu(request):
    if request.config.getoption("--cuda-as") == "cpu":
        with CudaAsCpu():
            yield
    else:
        yield

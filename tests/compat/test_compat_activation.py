"""sgljit.compat's activation functions: the signatures of the libraries they stand in for (sglang's
read from its 0.5.13 wheel, FlashInfer's and vLLM's as documented), and on every backend that each
writes what sgljit's op writes, where its library puts the result."""

from __future__ import annotations

import ast
import contextlib
import inspect

import pytest
import torch

import sgljit
from sgljit.compat.flashinfer import activation as fi
from sgljit.compat.sglang import activation as sg
from sgljit.compat.vllm import _custom_ops as vllm_ops

from ..plugins.common import BACKENDS
from . import sglang_suite
from .test_compat_norm import _our_parameters, _parameters

NAMES = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")


@pytest.fixture(scope="module")
def sglang_activation(request, tmp_path_factory):
    """sglang's activation.py, parsed (not imported: it needs sglang's runtime)."""
    dest = sglang_suite.sglang_files(request, tmp_path_factory, ["activation.py"])
    return ast.parse((dest / "activation.py").read_text())


def test_sglang_public_functions_have_sglangs_signatures(sglang_activation):
    functions = [
        node
        for node in sglang_activation.body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
    ]
    assert {fn.name for fn in functions} >= {*NAMES, "run_activation", "relu2"}
    for fn in functions:
        assert fn.name in sg.__all__, f"sglang.jit_kernel.activation.{fn.name} is missing"
        assert _our_parameters(getattr(sg, fn.name)) == _parameters(fn), fn.name
    constants = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in sglang_activation.body
        if isinstance(node, ast.Assign) and node.targets[0].id.startswith("SUPPORTED")
    }
    assert constants == {
        "SUPPORTED_ACTIVATIONS": sg.SUPPORTED_ACTIVATIONS,
        "SUPPORTED_UNARY_ACTIVATIONS": sg.SUPPORTED_UNARY_ACTIVATIONS,
    }


def test_flashinfer_and_vllm_signatures():
    empty = inspect.Parameter.empty
    for name in NAMES:
        assert _our_parameters(getattr(fi, name)) == [
            ("input", "positional", empty),
            ("out", "positional", None),
            ("enable_pdl", "positional", None),
        ]
        # vLLM's destination-first form
        assert _our_parameters(getattr(vllm_ops, name)) == [
            ("out", "positional", empty),
            ("input", "positional", empty),
        ]
        assert name in fi.__all__ and name in vllm_ops.__all__


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_each_writes_what_sgljits_op_writes(backend, name):
    dev = "cuda" if backend == "cuda" else "cpu"
    x = (torch.randn(3, 5, 2 * 96) * 3).to(torch.bfloat16).to(dev)
    ctx = contextlib.nullcontext() if backend == "cuda" else sgljit.use_backend(backend)
    with ctx:
        want = getattr(sgljit.ops, name)(x)
        out = torch.full_like(want, float("nan"))
        assert getattr(vllm_ops, name)(out, x) is None
        assert torch.equal(out, want)
        assert torch.equal(getattr(fi, name)(x, enable_pdl=True), want)
        given = torch.empty_like(want)
        assert getattr(fi, name)(x, given) is given and torch.equal(given, want)
        assert torch.equal(getattr(sg, name)(x), want)
        # sglang's MoE filter: tokens of expert -1 keep out's rows
        out = torch.zeros_like(want)
        ids = torch.tensor(
            [0, -1], dtype=torch.int32, device=dev
        )  # expert_step 8: tokens 0-7, 8-14
        assert getattr(sg, name)(x, out, ids, 8) is out
    rows = out.view(15, 96)
    assert torch.equal(rows[:8], want.view(15, 96)[:8]) and not rows[8:].any()


def test_sglang_refuses_what_its_kernel_refuses():
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match=r"^op_name: expected one of"):
        sg.run_activation("relu", x, None)
    with pytest.raises(TypeError, match=r"^expert_ids: expected dtype torch.int32"):
        sg.silu_and_mul(x, None, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^expert_step: expected a positive int"):
        sg.silu_and_mul(x, None, torch.zeros(4, dtype=torch.int32), 0)
    y = sg.relu2(x.bfloat16())
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, torch.relu(x.bfloat16().float()).square().bfloat16())

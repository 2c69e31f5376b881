"""sgljit's layers through transformers' own kernel mechanism (the ``kernels`` library):
``from_pretrained(..., use_kernels=True, kernel_config=sgl.kernel_config())`` and
``sgl.kernelize(model)`` on tiny random Llama, Qwen 3 and Gemma 3 models (nothing downloaded).

On each backend: float32 logits agree with HF's to 1e-5 and 32 greedy tokens are identical, and
the spy shows every norm width (per-head q/k norms included), rope and the MLP's activation ran on
sgljit's ops. In
training nothing runs on a kernel and gradients are HF's exactly; a transformers whose code
differs is refused; nothing is fetched from the Hub.
"""

from __future__ import annotations

import collections

import pytest
import torch

import sgljit
import sgljit.integrations as sgl

from ..plugins.common import BACKENDS
from .hf_models import (
    HIDDEN,
    MODELS,
    assert_matches_hf,
    build,
    mlp_op,
    norm_op,
    prompt,
    transformers,
)

kernels = pytest.importorskip(
    "kernels", reason="the kernels library is not installed (the nox sessions install it)"
)

FAMILIES = ["llama", "qwen3", "gemma3"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_from_pretrained_with_kernel_config(family, backend, backend_env, op_calls, tmp_path):
    device, ctx = backend_env
    build(family).save_pretrained(tmp_path)
    model_cls = getattr(transformers, MODELS[family][1])
    with ctx():
        model = model_cls.from_pretrained(
            tmp_path, use_kernels=True, kernel_config=sgl.kernel_config()
        )
        model = model.to(device).eval()
        assert model.use_kernels
        assert_matches_hf(family, device, model, op_calls)


@pytest.mark.parametrize("families", [("llama", "llama"), ("qwen3", "gemma3")])
def test_one_kernel_config_serves_several_from_pretrained(families, op_calls, tmp_path):
    """One ``sgl.kernel_config()`` passed to ``from_pretrained`` again (the same family or
    another): each model gets its own mapping, and runs sgljit's ops like the first."""
    config = sgl.kernel_config()
    for i, family in enumerate(families):
        build(family).save_pretrained(tmp_path / str(i))
        model_cls = getattr(transformers, MODELS[family][1])
        model = model_cls.from_pretrained(tmp_path / str(i), use_kernels=True, kernel_config=config)
        assert model.eval().use_kernels
        op_calls.clear()
        assert_matches_hf(family, "cpu", model, op_calls)
        assert config.kernel_mapping == {}  # the model's mapping is the model's own


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_kernelize(family, backend, backend_env, op_calls):
    device, ctx = backend_env
    model = build(family, device=device)
    with ctx():
        assert sgl.kernelize(model, kernels.Mode.INFERENCE) is model
        assert_matches_hf(family, device, model, op_calls)


@pytest.mark.parametrize("family", FAMILIES)
def test_training_runs_hf_code(family, op_calls):
    """Kernelized for training, a model runs HF's own code wherever autograd needs a graph:
    same loss and gradients, bit for bit, and no kernel call."""
    ids, _ = prompt("cpu")
    grads = []
    for kernelized in (False, True):
        model = build(family).train()
        if kernelized:
            sgl.kernelize(model)  # Mode.TRAINING, from model.training
        loss = model(ids, labels=ids).loss
        loss.backward()
        grads.append([loss.detach()] + [p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    assert not op_calls


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_compiles_to_one_graph(family):
    """Kernelized for torch.compile, the model compiles with fullgraph=True (the reference
    backend on the CPU) and every norm, rope and MLP activation in the graph is sgljit's custom
    op."""
    model = build(family)
    ids, mask = prompt("cpu")
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
    sgl.kernelize(model, kernels.Mode.INFERENCE | kernels.Mode.TORCH_COMPILE)
    ops = collections.Counter()

    def backend(graph_module, example_inputs):
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and str(node.target).startswith("sgljit."):
                ops[str(node.target).split(".")[1]] += 1
        return graph_module.forward

    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        got = compiled(ids, attention_mask=mask).logits
    torch._dynamo.reset()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    norms = sum(1 for m in model.modules() if type(m).__name__.endswith("RMSNorm"))
    layers = model.config.num_hidden_layers
    assert ops == {norm_op(family): norms, "apply_rope": layers, mlp_op(family): layers}


def test_nothing_comes_from_the_hub(monkeypatch, op_calls):
    """Only sgljit's layers are mapped: no Hub repository is loaded, and the model's other
    kernel-ready layers (the MLP's activation) keep transformers' forward."""

    def no_hub(self):
        raise AssertionError(f"loaded {self} from the Hub")

    monkeypatch.setattr(kernels.LayerRepository, "load", no_hub)
    model = build("llama")
    sgl.kernelize(model)
    activation = model.model.layers[0].mlp.act_fn
    assert hasattr(type(activation), "kernel_layer_name")  # transformers registers it
    assert activation.forward.__func__ is type(activation).forward  # ... and kept its own
    ids, mask = prompt("cpu")
    with torch.no_grad():
        model(ids, attention_mask=mask)
    assert op_calls


def test_other_families_keep_their_own_forward(op_calls):
    """A norm class of a family sgljit does not check, registered under the same name, runs its
    own forward after kernelize."""
    from transformers.models.granite.modeling_granite import GraniteRMSNorm

    assert GraniteRMSNorm.kernel_layer_name == "RMSNorm"
    other = GraniteRMSNorm(HIDDEN, eps=1e-6)
    with torch.no_grad():
        other.weight.normal_(1.0, 0.2)
    x = torch.randn(3, HIDDEN)
    with torch.no_grad():
        expected = other(x)
    model = torch.nn.ModuleDict({"llama": build("llama"), "other": other})
    sgl.kernelize(model)
    assert "forward" in vars(other)  # kernelize gave it sgljit's layer ...
    with torch.no_grad():
        got = other(x)
    assert torch.equal(got, expected) and not op_calls  # ... which runs Granite's own forward


def test_refuses_changed_hf_code(monkeypatch):
    from transformers.models.llama import modeling_llama

    def other_norm(self, hidden_states):  # Gemma's formula under Llama's name
        return sgljit.nn.gemma_rms_norm(hidden_states, self.weight, self.variance_epsilon)

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", other_norm)
    with pytest.raises(RuntimeError, match=r"LlamaRMSNorm\.forward no longer computes"):
        sgl.kernelize(build("llama"))


def test_gemma_norm_registration_is_reverted():
    """transformers does not register Gemma's norm; sgljit does, until revert()."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    assert "kernel_layer_name" not in vars(Gemma3RMSNorm)
    sgl.kernelize(build("gemma3"))
    assert Gemma3RMSNorm.kernel_layer_name == "GemmaRMSNorm"
    sgl.revert()
    assert "kernel_layer_name" not in vars(Gemma3RMSNorm)


def test_mlp_registration_and_fusion_are_reverted():
    """transformers 5.24 registers no MLP; sgljit registers the checked ones as "GatedMLP" and
    kernelize fuses the model's gate and up weights; revert() undoes the registration and drops the
    fused weight (the parameters keep their values)."""
    from transformers.models.llama.modeling_llama import LlamaMLP

    assert "kernel_layer_name" not in vars(LlamaMLP)
    model = build("llama")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    sgl.kernelize(model)
    mlp = model.model.layers[0].mlp
    assert LlamaMLP.kernel_layer_name == "GatedMLP"
    assert mlp.gate_proj.weight.data_ptr() == vars(mlp)["_sgljit_gate_up"].data_ptr()
    sgl.revert()
    assert "kernel_layer_name" not in vars(LlamaMLP) and "_apply" not in vars(LlamaMLP)
    assert "_sgljit_gate_up" not in vars(mlp)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


def test_errors():
    with pytest.raises(ValueError, match=r"model: Linear has no module of a family sgljit"):
        sgl.kernelize(torch.nn.Linear(2, 2))

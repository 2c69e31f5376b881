"""sgljit.integrations on Hugging Face transformers: tiny randomly initialised models of every
supported family, built from configs (nothing downloaded), patched against unpatched.

On each backend (the reference and the SYCL kernels on CPU tensors, CUDA on a GPU): float32 logits
agree to 1e-5 and 32 greedy tokens are identical; bfloat16 logits agree within bf16 rounding and
are no further from the float32 model's than HF's own bfloat16 logits are. The spy checks that the
kernels really ran (norms of every width, q_norm/k_norm included, rope and the MLP's activation
over its fused gate-and-up GEMM). Under autograd nothing runs on a kernel and gradients are HF's
exactly. The fused MLP keeps the model's parameters, state_dict, saving and memory.
"""

from __future__ import annotations

import importlib
import inspect
import sys

import pytest
import torch

import sgljit
import sgljit.integrations as sgl

from ..plugins.common import BACKENDS
from .conftest import called
from .hf_models import (
    HEAD_DIM,
    HIDDEN,
    MODELS,
    assert_matches_hf,
    build,
    mlp_op,
    norm_op,
    prompt,
    transformers,
    unpatched,
)

# ------------------------------------------------------------------------------------------------
# Patched models against unpatched ones


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", MODELS)
def test_float32_logits_and_greedy_tokens(family, backend, backend_env, op_calls):
    device, ctx = backend_env
    model = build(family, torch.float32, device)
    with ctx():
        assert sgl.apply_to_model(model) == [family]
        assert_matches_hf(family, device, model, op_calls)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_readme_one_liner_with_from_pretrained(family, backend, backend_env, op_calls, tmp_path):
    """README's example as written: patch, then from_pretrained (which on transformers 5.25
    kernelizes by default, with the Hub's mapping: none for the CPU, so nothing is fetched and the
    patched classes serve)."""
    device, ctx = backend_env
    build(family).save_pretrained(tmp_path)
    with ctx():
        getattr(sgl, f"apply_to_{family}")()
        model = getattr(transformers, MODELS[family][1]).from_pretrained(tmp_path).to(device)
        assert_matches_hf(family, device, model.eval(), op_calls)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", MODELS)
def test_bfloat16_logits(family, backend, backend_env, op_calls):
    """Within bf16 rounding of HF's bf16 logits, and no further from the float32 model's (HF
    rounds the norm and rope more often than the kernels do)."""
    device, ctx = backend_env
    exact, _ = unpatched(family, torch.float32, device)
    model = build(family, torch.bfloat16, device)
    ids, mask = prompt(device)
    with torch.no_grad():
        hf = model(ids, attention_mask=mask).logits.float()
    with ctx():
        sgl.apply_to_model(model)
        with torch.no_grad():
            ours = model(ids, attention_mask=mask).logits.float()
    assert called(op_calls, norm_op(family)) and called(op_calls, "apply_rope")
    assert called(op_calls, mlp_op(family))
    torch.testing.assert_close(ours, hf, rtol=0, atol=2e-2)
    assert (ours - exact).abs().max() <= 1.5 * (hf - exact).abs().max()


@pytest.mark.parametrize("family", MODELS)
def test_training_runs_hf_code(family, op_calls):
    """Under autograd the patched model runs HF's own formulas: same loss and gradients, bit for
    bit, and no kernel call."""
    ids, _ = prompt("cpu")
    grads = []
    for patch in (False, True):
        model = build(family).train()
        if patch:
            sgl.apply_to_model(model)
        loss = model(ids, labels=ids).loss
        loss.backward()
        grads.append([loss.detach()] + [p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    assert not op_calls


# ------------------------------------------------------------------------------------------------
# The MLP: gate and up fused into one weight whose halves the two parameters are


def _gate_up(mlp) -> torch.Tensor:
    return mlp.__dict__["_sgljit_gate_up"]


def _assert_fused(model) -> None:
    for layer in model.model.layers:
        mlp = layer.mlp
        gate_up, gate, up = _gate_up(mlp), mlp.gate_proj.weight, mlp.up_proj.weight
        assert gate_up.shape == (2 * gate.shape[0], gate.shape[1])
        assert gate.untyped_storage().data_ptr() == gate_up.untyped_storage().data_ptr()
        assert torch.equal(gate_up, torch.cat((gate, up)))
        assert up.data_ptr() == gate_up[gate.shape[0] :].data_ptr()


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral", "gemma3"])
def test_mlp_keeps_state_dict_saving_and_memory(family, op_calls, tmp_path):
    """Fused, the model has the same parameters (the same objects), state_dict keys and values,
    no more parameter storage than before, and saves and loads as HF's; revert gives the class
    its forward back."""
    model = build(family)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = dict(model.named_parameters())
    storage = sum(p.untyped_storage().nbytes() for p in params.values())
    cls = type(model.model.layers[0].mlp)
    forward = cls.forward
    sgl.apply_to_model(model)
    _assert_fused(model)
    assert cls.forward is not forward
    assert dict(model.named_parameters()) == params  # the same Parameter objects
    fused = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in params.values()}
    assert sum(fused.values()) == storage
    got = model.state_dict()
    assert list(got) == list(state)
    assert all(torch.equal(got[k], v) for k, v in state.items())
    model.save_pretrained(tmp_path)
    loaded = getattr(transformers, MODELS[family][1]).from_pretrained(tmp_path)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    torch.save(model.state_dict(), tmp_path / "state.pt")
    fresh = build(family)
    fresh.load_state_dict(torch.load(tmp_path / "state.pt"))
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in state.items())
    sgl.revert()
    assert cls.forward is forward
    assert "_sgljit_gate_up" not in vars(model.model.layers[0].mlp)
    op_calls.clear()
    ids, mask = prompt("cpu")
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, attention_mask=mask).logits, loaded(ids, attention_mask=mask).logits
        )
    assert not called(op_calls, mlp_op(family))


def test_mlp_load_state_dict_keeps_fusion_and_to_refuses(op_calls):
    """load_state_dict copies into the fused halves (the forward sees the new weights); model.to()
    gives each parameter its own storage again, and the next forward fuses them anew."""
    model, other = build("llama"), build("llama")
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    ids, mask = prompt("cpu")
    with torch.no_grad():
        expected = other(ids, attention_mask=mask).logits
    sgl.apply_to_model(model)
    model.load_state_dict(other.state_dict())
    _assert_fused(model)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, attention_mask=mask).logits, expected)
    assert called(op_calls, "silu_and_mul")
    model.to(torch.bfloat16)
    mlp = model.model.layers[0].mlp
    assert "_sgljit_gate_up" not in vars(mlp)  # the float32 weight is not held
    with torch.no_grad():
        model(ids, attention_mask=mask)
    _assert_fused(model)
    assert _gate_up(mlp).dtype == torch.bfloat16


def test_mlp_fused_at_first_forward_when_patched_by_class(op_calls, tmp_path):
    """apply_to_llama() before from_pretrained: the model is fused at its first forward."""
    build("llama").save_pretrained(tmp_path)
    sgl.apply_to_llama()
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert "_sgljit_gate_up" not in vars(model.model.layers[0].mlp)
    ids, mask = prompt("cpu")
    with torch.inference_mode():
        model(ids, attention_mask=mask)
    _assert_fused(model)
    assert not _gate_up(model.model.layers[0].mlp).is_inference()


class _LoraLike(torch.nn.Linear):
    """A Linear subclass standing for PEFT's LoRA layers (a forward sgljit does not know)."""

    def forward(self, x):
        return super().forward(x) + 1.0


@pytest.mark.parametrize(
    "case,reason",
    [
        ("bias", "gate_proj has a bias"),
        ("lora", "up_proj is a _LoraLike, not a torch.nn.Linear"),
        ("act", "act_fn ReLU is neither SiLU nor tanh-GELU"),
    ],
)
def test_mlp_falls_back_with_a_reason(case, reason, op_calls):
    """MLPs the fused path cannot take run HF's forward, and say why."""
    if case == "bias":
        config = transformers.LlamaConfig(**build("llama").config.to_dict())
        config.mlp_bias = True
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
    else:
        model = build("llama")
        for layer in model.model.layers:
            if case == "lora":
                lora = _LoraLike(HIDDEN, layer.mlp.up_proj.out_features, bias=False)
                lora.load_state_dict(layer.mlp.up_proj.state_dict())
                layer.mlp.up_proj = lora
            else:
                layer.mlp.act_fn = torch.nn.ReLU()
    ids, mask = prompt("cpu")
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        sgl.apply_to_model(model)
        got = model(ids, attention_mask=mask).logits
    assert all(layer.mlp.sgljit_mlp_fallback.startswith(reason) for layer in model.model.layers)
    assert torch.equal(got, expected)
    assert not called(op_calls, "silu_and_mul") and called(op_calls, "rmsnorm")


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_mlp_off(family, op_calls):
    """mlp=False patches the norms and rope only: the weights stay as they were."""
    model = build(family)
    gate = model.model.layers[0].mlp.gate_proj.weight.data_ptr()
    sgl.apply_to_model(model, mlp=False)
    ids, mask = prompt("cpu")
    with torch.no_grad():
        model(ids, attention_mask=mask)
    assert model.model.layers[0].mlp.gate_proj.weight.data_ptr() == gate
    assert called(op_calls, norm_op(family)) and not called(op_calls, mlp_op(family))


# ------------------------------------------------------------------------------------------------
# The pieces


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shared_cos", [True, False], ids=["cos-shared", "cos-per-seq"])
@pytest.mark.parametrize("batch,seq", [(3, 5), (1, 5), (3, 1), (1, 1)])
def test_rope_function(backend, backend_env, op_calls, dtype, shared_cos, batch, seq):
    """The patched apply_rotary_pos_emb against HF's on [B, H, S, D] views (HF's layout): several
    sequences, one (prefill), one token each (decode); cos/sin shared by the batch or per
    sequence; the inputs are left as they were."""
    from transformers.models.llama import modeling_llama

    device, ctx = backend_env
    original = modeling_llama.apply_rotary_pos_emb
    g = torch.Generator().manual_seed(2)
    q = torch.randn(batch, seq, 4, HEAD_DIM, generator=g).to(device, dtype).transpose(1, 2)
    k = torch.randn(batch, seq, 2, HEAD_DIM, generator=g).to(device, dtype).transpose(1, 2)
    cos_batch = 1 if shared_cos else batch
    angles = torch.rand(cos_batch, seq, HEAD_DIM // 2, generator=g) * 50
    emb = torch.cat((angles, angles), dim=-1).to(device)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    q0, k0 = q.clone(), k.clone()
    expected = original(q, k, cos, sin)
    with ctx():
        sgl.apply_to_llama(rms_norm=False)
        got = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert op_calls["apply_rope", HEAD_DIM] == 1
    assert torch.equal(q, q0) and torch.equal(k, k0)
    tol = {"rtol": 0, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 2e-2}
    for e, r in zip(expected, got, strict=True):
        assert r.shape == e.shape and r.dtype == e.dtype
        torch.testing.assert_close(r, e, **tol)


def test_rope_function_compiles_to_one_graph():
    """The patched apply_rotary_pos_emb under torch.compile(fullgraph=True) (the reference backend
    on the CPU): no graph break, HF's result at a decode step, twice (positions are not kept)."""
    from transformers.models.llama import modeling_llama

    original = modeling_llama.apply_rotary_pos_emb
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 1, 4, HEAD_DIM, generator=g).transpose(1, 2)
    k = torch.randn(2, 1, 2, HEAD_DIM, generator=g).transpose(1, 2)
    angles = torch.rand(1, 1, HEAD_DIM // 2, generator=g) * 50
    emb = torch.cat((angles, angles), dim=-1)
    expected = original(q, k, emb.cos(), emb.sin())
    sgl.apply_to_llama(rms_norm=False)
    compiled = torch.compile(modeling_llama.apply_rotary_pos_emb, fullgraph=True, backend="eager")
    for _ in range(2):
        got = compiled(q, k, emb.cos(), emb.sin())
        for e, r in zip(expected, got, strict=True):
            torch.testing.assert_close(r, e, rtol=0, atol=1e-5)


def test_rope_function_as_a_plain_function(monkeypatch, op_calls):
    """Where the ``kernels`` library is not installed (transformers 5.24 and older) the modeling
    module holds HF's function itself, not a module standing for it: it is patched the same way."""
    from transformers.models.llama import modeling_llama

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):  # HF's, as written
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        rotate_half = modeling_llama.rotate_half
        return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", apply_rotary_pos_emb)
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 4, 3, HEAD_DIM, generator=g), torch.randn(2, 2, 3, HEAD_DIM, generator=g)
    angles = torch.rand(1, 3, HEAD_DIM // 2, generator=g) * 50
    emb = torch.cat((angles, angles), dim=-1)
    expected = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    try:
        sgl.apply_to_llama(rms_norm=False)
        patched = modeling_llama.apply_rotary_pos_emb
        assert patched.__wrapped__ is apply_rotary_pos_emb
        assert inspect.signature(patched) == inspect.signature(apply_rotary_pos_emb)
        got = patched(q, k, emb.cos(), emb.sin())
    finally:  # before monkeypatch puts HF's back (revert would restore this function over it)
        sgl.revert()
    assert op_calls["apply_rope", HEAD_DIM] == 1
    for e, r in zip(expected, got, strict=True):
        torch.testing.assert_close(r, e, rtol=0, atol=1e-5)


def test_rope_function_falls_back(op_calls):
    """Calls the kernel route does not take exactly run HF's function."""
    from transformers.models.llama import modeling_llama

    original = modeling_llama.apply_rotary_pos_emb
    sgl.apply_to_llama(rms_norm=False)
    patched = modeling_llama.apply_rotary_pos_emb
    assert patched is not original
    assert list(inspect.signature(patched).parameters) == ["q", "k", "cos", "sin", "unsqueeze_dim"]
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 2, 4, 8, generator=g), torch.randn(1, 2, 4, 8, generator=g)
    cos, sin = torch.randn(1, 4, 8, generator=g), torch.randn(1, 4, 8, generator=g)
    qs, ks = q.transpose(1, 2), k.transpose(1, 2)  # [B, S, H, D]: unsqueeze_dim=2
    cases = [
        ((qs, ks, cos, sin), {"unsqueeze_dim": 2}),  # another layout
        ((q, k, cos[..., :4], sin[..., :4]), {}),  # partial rotary: HF's function would fail too
        ((q, k, cos.double(), sin.double()), {}),  # cos in another dtype (HF promotes)
        ((q.requires_grad_(), k, cos, sin), {}),  # autograd
    ]
    for args, kwargs in cases:
        try:
            expected = original(*args, **kwargs)
        except RuntimeError:  # HF's function refuses it: so does the patched one
            with pytest.raises(RuntimeError):
                patched(*args, **kwargs)
            continue
        got = patched(*args, **kwargs)
        assert all(torch.equal(e, r) for e, r in zip(expected, got, strict=True))
    assert not op_calls


@pytest.mark.parametrize("family", MODELS)
def test_norm_fallback_keeps_hf_dtypes(family, op_calls):
    """A float32 weight on bfloat16 input (mixed precision): HF's result and dtype, no kernel."""
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    norm_cls = getattr(modeling, sgl.FAMILIES[family][0])
    norm = norm_cls(HIDDEN, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_(0.5, 0.2)
    x = torch.randn(3, HIDDEN, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = norm(x)
        getattr(sgl, f"apply_to_{family}")()
        got = norm(x)
    assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert not op_calls


def test_refuses_changed_hf_code(monkeypatch):
    """A transformers whose RMSNorm or rope differs from what sgljit implements is not patched."""
    from transformers.models.llama import modeling_llama

    def other_norm(self, hidden_states):  # Gemma's formula under Llama's name
        return sgljit.nn.gemma_rms_norm(hidden_states, self.weight, self.variance_epsilon)

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", other_norm)
    with pytest.raises(RuntimeError, match=r"LlamaRMSNorm\.forward no longer computes"):
        sgl.apply_to_llama(rope=False)
    monkeypatch.undo()

    def old_rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        raise AssertionError("not called")

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", old_rope)
    with pytest.raises(RuntimeError, match="pass rope=False"):
        sgl.apply_to_llama()
    sgl.apply_to_llama(rope=False)
    assert modeling_llama.apply_rotary_pos_emb is old_rope


def test_revert_and_reapply():
    from transformers.models.qwen3 import modeling_qwen3

    forward, rope = modeling_qwen3.Qwen3RMSNorm.forward, modeling_qwen3.apply_rotary_pos_emb
    sgl.apply_to_qwen3()
    patched_rope = modeling_qwen3.apply_rotary_pos_emb
    assert modeling_qwen3.Qwen3RMSNorm.forward is sgljit.nn.RMSNorm.forward
    sgl.apply_to_qwen3()  # wraps HF's function again, not its own wrapper
    assert modeling_qwen3.apply_rotary_pos_emb.__wrapped__ is rope
    assert modeling_qwen3.apply_rotary_pos_emb is not patched_rope
    sgl.revert()
    assert modeling_qwen3.Qwen3RMSNorm.forward is forward
    assert modeling_qwen3.apply_rotary_pos_emb is rope


def test_state_dict_of_hf_norms_loads():
    """sgljit.nn's norms are drop-ins for HF's: same parameter and attribute names."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    for hf_cls, ours_cls, eps_attr in (
        (LlamaRMSNorm, sgljit.nn.RMSNorm, "variance_epsilon"),
        (Gemma3RMSNorm, sgljit.nn.GemmaRMSNorm, "eps"),
    ):
        hf, ours = hf_cls(HIDDEN, eps=1e-5), ours_cls(HIDDEN, eps=1e-5)
        assert torch.equal(hf.weight, ours.weight)  # both start at HF's initial value
        with torch.no_grad():
            hf.weight.normal_()
        ours.load_state_dict(hf.state_dict())
        assert getattr(ours, eps_attr) == getattr(hf, eps_attr)
        x = torch.randn(4, HIDDEN)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), hf(x), rtol=1e-6, atol=1e-6)


def test_errors():
    with pytest.raises(TypeError, match=r"model: expected a torch\.nn\.Module"):
        sgl.apply_to_model("llama")
    with pytest.raises(ValueError, match=r"model: Linear has no module of a family sgljit patches"):
        sgl.apply_to_model(torch.nn.Linear(2, 2))


def test_missing_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(ImportError, match=r"needs Hugging Face transformers \(pip install"):
        sgl.apply_to_llama()

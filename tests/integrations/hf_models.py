"""Tiny randomly initialised Hugging Face models of every supported family, built from configs
(nothing downloaded), and what the integration tests run on them."""

from __future__ import annotations

import functools

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (the nox sessions install it)"
)

HIDDEN, HEAD_DIM, VOCAB, STEPS, INTERMEDIATE = 128, 64, 128, 32, 256
COMMON = dict(
    hidden_size=HIDDEN,
    intermediate_size=INTERMEDIATE,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=HEAD_DIM,
    vocab_size=VOCAB,
    max_position_embeddings=256,
)
GEMMA = dict(query_pre_attn_scalar=HEAD_DIM, sliding_window=16)  # 16 < prompt + 32 steps
MODELS = {  # family -> (config class, model class, config extras)
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", GEMMA),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA),
}
PER_HEAD_NORMS = {"qwen3", "gemma3"}  # q_norm / k_norm over head_dim


def norm_op(family: str) -> str:
    return "gemma_rmsnorm" if family.startswith("gemma") else "rmsnorm"


def mlp_op(family: str) -> str:
    """The gated activation of the family's MLP (Gemma's hidden_activation: gelu_pytorch_tanh)."""
    return "gelu_tanh_and_mul" if family.startswith("gemma") else "silu_and_mul"


def build(family: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """The family's tiny model, seeded; norm weights random too (HF starts them at 1 / 0, which
    would hide a kernel that ignored its weight). Every weight is drawn on the CPU, so a model built
    on a GPU and one loaded from a CPU build's checkpoint are the same model."""
    config_cls, model_cls, extra = MODELS[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**COMMON, **extra)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0 if family.startswith("gemma") else 1.0, 0.2)
    return model.to(device=device, dtype=dtype)


def prompt(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 8), generator=g).to(device)
    return ids, torch.ones_like(ids)


def run(model, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits of the prompt, the prompt + 32 greedy tokens)."""
    ids, mask = prompt(device)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits.float()
        tokens = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            do_sample=False,
        )
    return logits, tokens


@functools.cache
def unpatched(family: str, dtype: torch.dtype, device: str):
    """HF's results (computed before any patch: the autouse fixture reverts after each test)."""
    return run(build(family, dtype, device), device)


def assert_matches_hf(family: str, device: str, model, op_calls) -> None:
    """``model`` (float32, on sgljit) gives HF's logits to 1e-5 and its greedy tokens, and ran the
    norm of every width (per-head q/k norms too), rope and the MLP's activation (over the fused
    gate and up projections' [T, 2 * intermediate] output) on sgljit's ops."""
    expected_logits, expected_tokens = unpatched(family, torch.float32, device)
    logits, tokens = run(model, device)
    torch.testing.assert_close(logits, expected_logits, rtol=1e-5, atol=1e-5)
    assert tokens.shape == (2, 8 + STEPS)
    assert torch.equal(tokens, expected_tokens)
    assert op_calls[norm_op(family), HIDDEN] > 0
    if family in PER_HEAD_NORMS:
        assert op_calls[norm_op(family), HEAD_DIM] > 0
    assert op_calls["apply_rope", HEAD_DIM] > 0
    assert op_calls[mlp_op(family), 2 * INTERMEDIATE] > 0

"""sgljit_activation.moe.gated_act_filtered: the gated activations over MoE-routed rows (sglang's
``expert_ids``/``expert_step`` filter and its sorted layout), on every backend. The kept rows equal
the plain op's bit for bit; the others keep out's contents."""

from __future__ import annotations

import contextlib

import pytest
import torch

import sgljit
from sgljit_activation import moe
from sgljit_quant_fp8.moe import sorted_ids

from .common import BACKENDS, HAS_CUDA, needs_gpu


def _dev(backend):
    return "cuda" if backend == "cuda" else "cpu"


def _ctx(backend):
    return contextlib.nullcontext() if backend == "cuda" else sgljit.use_backend(backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("act", moe.ACTIVATIONS)
@pytest.mark.parametrize("step", [1, 4])
def test_expert_filter(backend, act, step):
    dev = _dev(backend)
    g = torch.Generator().manual_seed(step)
    rows, d = 22, 256
    x = torch.randn(rows, 2 * d, generator=g).bfloat16().to(dev)
    expert_ids = torch.randint(0, 8, (-(-rows // step),), generator=g, dtype=torch.int32)
    expert_ids[1::2] = -1
    out = torch.full((rows, d), -7.0, dtype=torch.bfloat16, device=dev)
    with _ctx(backend):
        got = moe.gated_act_filtered(
            x, act, expert_ids=expert_ids.to(dev), expert_step=step, out=out
        )
        want = getattr(sgljit.ops, f"{act}_and_mul")(x)
    assert got is out
    keep = (expert_ids[torch.arange(rows) // step] != -1).to(dev)
    assert torch.equal(out[keep], want[keep]) and (out[~keep] == -7.0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_sorted_layout(backend):
    """Rows past num_tokens_post_padded, padding ids (>= num_valid_tokens or negative) and blocks of
    expert -1 keep out's contents."""
    dev = _dev(backend)
    block = 4
    ids, post, valid = sorted_ids(7, 2, 4, block, torch.Generator().manual_seed(1))
    ids[0] = -1
    rows, d = ids.numel(), 128
    expert_ids = torch.zeros(rows // block, dtype=torch.int32)
    expert_ids[2] = -1
    x = torch.randn(rows, 2 * d).half().to(dev)
    out = torch.full((rows, d), -7.0, dtype=torch.float16, device=dev)
    with _ctx(backend):
        moe.gated_act_filtered(
            x, "silu", expert_ids=expert_ids.to(dev), expert_step=block,
            sorted_token_ids=ids.to(dev), num_tokens_post_padded=post.to(dev),
            num_valid_tokens=valid, out=out,
        )  # fmt: skip
        want = sgljit.ops.silu_and_mul(x)
    index = torch.arange(rows)
    keep = (index < int(post)) & (ids >= 0) & (ids < valid) & (expert_ids[index // block] != -1)
    assert 0 < int(keep.sum()) < rows
    keep = keep.to(dev)
    assert torch.equal(out[keep], want[keep]) and (out[~keep] == -7.0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_short_ids_are_named_before_any_write(backend):
    dev = _dev(backend)
    x = torch.randn(8, 64, device=dev)
    out = torch.full((8, 32), -7.0, device=dev)
    ids = torch.zeros(8, dtype=torch.int32, device=dev)
    with _ctx(backend):
        with pytest.raises(ValueError, match=r"^expert_ids: expected at least 2 entries"):
            moe.gated_act_filtered(x, expert_ids=ids[:1], expert_step=4, out=out)
        with pytest.raises(ValueError, match=r"^sorted_token_ids: expected at least 8 entries"):
            moe.gated_act_filtered(x, expert_ids=ids, sorted_token_ids=ids[:7], out=out)
        with pytest.raises(ValueError, match=r"^act: expected one of"):
            moe.gated_act_filtered(x, "relu", expert_ids=ids, out=out)
    assert (out == -7.0).all()


@needs_gpu
def test_cuda_large_filtered():
    """Rows over several launches' worth of items, a kept/skipped pattern per block of 64 rows."""
    rows, d = 40000, 2048
    x = torch.randn(rows, 2 * d, device="cuda", dtype=torch.bfloat16)
    expert_ids = torch.randint(-1, 2, (-(-rows // 64),), dtype=torch.int32, device="cuda")
    out = torch.zeros(rows, d, device="cuda", dtype=torch.bfloat16)
    moe.gated_act_filtered(x, expert_ids=expert_ids, expert_step=64, out=out)
    keep = expert_ids[torch.arange(rows, device="cuda") // 64] != -1
    want = sgljit.ops.silu_and_mul(x)
    assert torch.equal(out[keep], want[keep]) and not out[~keep].any()


def _has_nvcc() -> bool:
    from sgljit.toolchain import find_nvcc

    return find_nvcc() is not None


@pytest.mark.skipif(HAS_CUDA or not _has_nvcc(), reason="nvcc not found (or a GPU runs it)")
def test_cuda_filtered_module_compiles_for_sm90a_and_sm100a(tmp_path, monkeypatch):
    import os

    from sgljit_activation import ops

    monkeypatch.setenv("SGLJIT_CUDA_ARCH", os.environ.get("SGLJIT_CUDA_ARCH", "9.0a 10.0a"))
    monkeypatch.setenv("SGLJIT_CACHE_DIR", str(tmp_path))
    module = ops.family.prebuild("cuda", "gated_act_filtered", dtype=torch.bfloat16)
    assert callable(module.gated_act_filtered)

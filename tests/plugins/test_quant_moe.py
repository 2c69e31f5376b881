"""sgljit_quant_fp8.moe: per-token-group over the masked and sorted MoE layouts, int8 codes, group
sizes 16-256, on every backend; the numerics against float64 formulas written here from the
documented semantics (not the plugin's reference), the rows a layout leaves alone byte for byte.
The conformance suite (tests/plugins/test_conformance.py) runs the ops' declared cases too."""

from __future__ import annotations

import contextlib
import os
import re

import pytest
import torch

import sgljit
from sgljit_quant_fp8 import moe, ops

from .common import BACKENDS, HAS_CUDA, needs_gpu

E4M3, E5M2, INT8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.int8


def _dev(backend: str) -> str:
    return "cuda" if backend == "cuda" else "cpu"


def _ctx(backend: str):
    return contextlib.nullcontext() if backend == "cuda" else sgljit.use_backend(backend)


def _data(shape, dtype, device, group_size, seed=0) -> torch.Tensor:
    """Random groups over magnitudes 2^-8 .. 2^8 (each group its own)."""
    g = torch.Generator().manual_seed(seed)
    *lead, hidden = shape
    mags = torch.exp2(torch.randint(-8, 9, (*lead, hidden // group_size, 1), generator=g).double())
    x = torch.randn(*lead, hidden // group_size, group_size, generator=g, dtype=torch.float64)
    return (x * mags).reshape(shape).to(dtype).to(device)


def _expected(x: torch.Tensor, group_size: int, out_dtype, eps=1e-10):
    """float64 formulas of the docstrings: scale = max(absmax / qmax, eps) rounded to fp32 (the
    division of two fp32 values, correctly rounded, equals the float64 quotient rounded); codes
    x / scale correctly rounded, then to the output type."""
    x64 = x.double().cpu()
    *lead, hidden = x64.shape
    groups = x64.reshape(*lead, hidden // group_size, group_size)
    qmax = 127.0 if out_dtype == INT8 else float(torch.finfo(out_dtype).max)
    amax = groups.abs().amax(-1)
    scale = torch.maximum(amax / qmax, torch.tensor(eps).float().double()).float()
    q = groups / scale.double().unsqueeze(-1)
    if out_dtype == INT8:
        codes = q.float().double().round().clamp(-127, 127).to(INT8)
    else:
        codes = q.float().clamp(-qmax, qmax).to(out_dtype)
    return codes.reshape(*lead, hidden), scale


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8)


def _poison_like(shape, dtype, device) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    if dtype.itemsize == 1:
        t.view(torch.uint8).fill_(0x7E)
    else:
        t.fill_(-7.0)
    return t


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("group_size", [16, 256])
@pytest.mark.parametrize("out_dtype", [E4M3, INT8], ids=["e4m3", "int8"])
def test_group_sizes_16_and_256(backend, group_size, out_dtype):
    dev = _dev(backend)
    x = _data((5, 1024), torch.bfloat16, dev, group_size, seed=group_size)
    with _ctx(backend):
        if out_dtype == INT8:
            q, s = moe.per_token_group_quant_int8(x, group_size)
        else:
            q, s = ops.per_token_group_quant_fp8(x, group_size)
    codes, scale = _expected(x, group_size, out_dtype)
    assert torch.equal(s.cpu(), scale)
    assert torch.equal(_bytes(q), _bytes(codes))


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_codes_symmetric_round_half_even(backend):
    """absmax / 127 scales; x / scale rounded half to even; the extremes are +-127."""
    dev = _dev(backend)
    # one group of 16: absmax 127 gives scale 1, so the codes are round(x) exactly
    row = torch.tensor([127.0, -127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 3.49, 0, 1, 2, 3, 4, 5, 6, 7])
    x = row.view(1, 16).to(dev)
    with _ctx(backend):
        q, s = moe.per_token_group_quant_int8(x, 16)
    assert s.cpu().tolist() == [[1.0]]
    assert q.cpu().tolist() == [[127, -127, 0, 2, 2, 0, -2, 3, 0, 1, 2, 3, 4, 5, 6, 7]]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("column_major", [False, True], ids=["row", "col"])
@pytest.mark.parametrize("out_dtype", [E4M3, INT8], ids=["e4m3", "int8"])
def test_masked_layout(backend, column_major, out_dtype):
    """Rows t < masked_m[e] as the dense op on them; all other rows of out and scales untouched;
    expected_m changes nothing."""
    dev = _dev(backend)
    experts, pad, hidden, gs = 4, 11, 512, 128
    x = _data((experts, pad, hidden), torch.bfloat16, dev, gs, seed=3)
    counts = [11, 0, 4, 1]
    masked_m = torch.tensor(counts, dtype=torch.int32, device=dev)
    for hint in (None, 1, 100):
        out = _poison_like((experts, pad, hidden), out_dtype, dev)
        scales = moe._scales_for((experts, pad, hidden), gs, dev, column_major)
        scales.fill_(-7.0)
        with _ctx(backend):
            q, s = moe.per_token_group_quant_masked(
                x, masked_m, gs, expected_m=hint, out_dtype=out_dtype,
                column_major_scales=column_major, out=out, scales=scales,
            )  # fmt: skip
        assert q is out and s is scales
        for e, m in enumerate(counts):
            codes, scale = _expected(x[e, :m], gs, out_dtype)
            assert torch.equal(_bytes(q[e, :m]), _bytes(codes)), (e, hint)
            assert torch.equal(s[e, :m].cpu(), scale), (e, hint)
            assert (_bytes(q[e, m:]) == 0x7E).all(), (e, hint)
            assert (s[e, m:].cpu() == -7.0).all(), (e, hint)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sorted_layout(backend):
    """Row i quantized where i < num_tokens_post_padded and its id < num_valid_tokens; others
    untouched (the padding of each expert's block, the rows past the padded total, negative ids)."""
    dev = _dev(backend)
    gen = torch.Generator().manual_seed(5)
    ids, post, valid = moe.sorted_ids(9, 2, 4, 4, gen)
    ids[2] = -1  # a negative id is padding too
    rows, hidden, gs = ids.numel(), 256, 64
    x = _data((rows, hidden), torch.float16, dev, gs, seed=6)
    out = _poison_like((rows, hidden), E4M3, dev)
    with _ctx(backend):
        q, s = moe.per_token_group_quant_sorted(
            x, ids.to(dev), post.to(dev), valid, gs, out=out,
            scales=torch.full((rows, hidden // gs), -7.0, device=dev),
        )  # fmt: skip
    live = (torch.arange(rows) < int(post)) & (ids >= 0) & (ids < valid)
    assert 0 < int(live.sum()) < rows
    codes, scale = _expected(x[live.to(dev)], gs, E4M3)
    assert torch.equal(_bytes(q[live.to(dev)]), _bytes(codes))
    assert torch.equal(s[live.to(dev)].cpu(), scale)
    assert (_bytes(q[~live.to(dev)]) == 0x7E).all()
    assert (s[~live.to(dev)].cpu() == -7.0).all()


def _masked_args(dev, **changes):
    a = {
        "input": _data((3, 8, 256), torch.bfloat16, dev, 128),
        "out": _poison_like((3, 8, 256), E4M3, dev),
        "scales": torch.full((3, 8, 2), -7.0, device=dev),
        "masked_m": torch.tensor([8, 2, 0], dtype=torch.int32, device=dev),
        "group_size": 128,
        "eps": 1e-10,
        "scale_ue8m0": False,
        "expected_m": -1,
    }
    a.update(changes)
    return a


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_inputs_name_the_argument_before_any_write(backend):
    dev = _dev(backend)
    op = moe._per_token_group_masked
    cases = [
        ("masked_m", {"masked_m": torch.tensor([1, 2, 3, 4], dtype=torch.int32, device=dev)}),
        ("masked_m", {"masked_m": torch.tensor([1.0, 2.0, 3.0], device=dev)}),
        ("group_size: expected one of", {"group_size": 48}),
        (
            "group_size: must divide input's last dimension 384",
            {
                "input": _data((3, 8, 384), torch.bfloat16, dev, 128),
                "out": _poison_like((3, 8, 384), E4M3, dev),
                "group_size": 256,
                "scales": torch.full((3, 8, 1), -7.0, device=dev),
            },
        ),
        ("scales: dimension 2 expected 2", {"scales": torch.full((3, 8, 4), -7.0, device=dev)}),
        (
            "scale_ue8m0: int8 output",
            {"out": _poison_like((3, 8, 256), INT8, dev), "scale_ue8m0": True},
        ),
    ]
    if dev == "cpu":  # the counts are data: checked where reading them is free
        cases.append(
            (
                "masked_m: expected counts in [0, 8]",
                {"masked_m": torch.tensor([9, 0, 0], dtype=torch.int32)},
            )
        )
    for message, change in cases:
        a = _masked_args(dev, **change)
        with (
            _ctx(backend),
            pytest.raises(
                (ValueError, TypeError),
                match="^" + re.escape(message),
            ),
        ):
            op(**a)
        assert (_bytes(a["out"]) == 0x7E).all(), message
        assert (a["scales"].cpu() == -7.0).all(), message
    # sorted: ids must cover every row
    x = _data((8, 256), torch.bfloat16, dev, 128)
    out = _poison_like((8, 256), E4M3, dev)
    with _ctx(backend), pytest.raises(ValueError, match=r"^sorted_token_ids: expected at least 8"):
        moe.per_token_group_quant_sorted(
            x, torch.zeros(7, dtype=torch.int32, device=dev),
            torch.tensor([8], dtype=torch.int32, device=dev), 8, 128, out=out,
        )  # fmt: skip
    assert (_bytes(out) == 0x7E).all()
    with _ctx(backend), pytest.raises(ValueError, match=r"^group_size: expected one of"):
        moe.per_token_group_quant_int8(x, 96)


@needs_gpu
def test_cuda_masked_counts_are_clamped():
    """A count above T_pad (or negative) never reaches memory past the expert: it is clamped."""
    experts, pad, hidden = 3, 8, 256
    x = _data((experts + 1, pad, hidden), torch.bfloat16, "cuda", 128)
    out = _poison_like((experts + 1, pad, hidden), E4M3, "cuda")
    scales = torch.full((experts + 1, pad, 2), -7.0, device="cuda")
    masked_m = torch.tensor([1000, -5, 3], dtype=torch.int64, device="cuda")
    moe.per_token_group_quant_masked(
        x[:experts], masked_m, 128, out=out[:experts], scales=scales[:experts]
    )
    torch.cuda.synchronize()
    assert (_bytes(out[experts]) == 0x7E).all() and (scales[experts] == -7.0).all()
    assert (_bytes(out[1]) == 0x7E).all()
    codes, _ = _expected(x[0], 128, E4M3)
    assert torch.equal(_bytes(out[0]), _bytes(codes))


@needs_gpu
@pytest.mark.parametrize("experts,pad,expected", [(8, 4096, 64), (32, 256, 200), (256, 16, -1)])
def test_cuda_masked_large(experts, pad, expected):
    """Grids sized from the hint with counts far above and below it (the blocks stride)."""
    hidden = 2048
    x = _data((experts, pad, hidden), torch.bfloat16, "cuda", 128, seed=experts)
    g = torch.Generator().manual_seed(experts)
    masked_m = torch.randint(0, pad + 1, (experts,), generator=g).to(torch.int32).cuda()
    q, s = moe.per_token_group_quant_masked(x, masked_m, 128, expected_m=expected)
    for e in range(experts):
        m = int(masked_m[e])
        codes, scale = _expected(x[e, :m], 128, E4M3)
        assert torch.equal(_bytes(q[e, :m]), _bytes(codes)) and torch.equal(s[e, :m].cpu(), scale)


# ------------------------------------------------------------------------------------------------
# CUDA compile in CI (no GPU needed)


def _has_nvcc() -> bool:
    from sgljit.toolchain import find_nvcc

    return find_nvcc() is not None


@pytest.mark.skipif(
    HAS_CUDA or not _has_nvcc(), reason="nvcc not found (or a GPU runs the kernels)"
)
def test_cuda_layouts_compile_for_sm90a_and_sm100a(tmp_path, monkeypatch):
    """The layouts module (masked, sorted, int8 entry points) for fp8 and int8 codes, both archs."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("SGLJIT_CUDA_ARCH", os.environ.get("SGLJIT_CUDA_ARCH", "9.0a 10.0a"))
    monkeypatch.setenv("SGLJIT_CACHE_DIR", str(tmp_path))

    def build(key):
        dtype, out_dtype, group_size = key
        return ops.family.prebuild(
            "cuda", "per_token_group_quant_masked", dtype=dtype, out_dtype=out_dtype,
            group_size=group_size,
        )  # fmt: skip

    keys = [(torch.bfloat16, E4M3, 128), (torch.float32, INT8, 16)]
    with ThreadPoolExecutor(2) as pool:
        mods = list(pool.map(build, keys))
    for mod in mods:
        for name in ("per_token_group_quant_masked", "per_token_group_quant_sorted"):
            assert callable(getattr(mod, name))

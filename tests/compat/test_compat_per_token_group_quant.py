"""``sgljit.compat.sglang.per_token_group_quant`` against sglang 0.5.23's documented semantics
(its docstring: the dense, masked and sorted layouts, the rows left unwritten, the four ``output_s``
formats, ``out_dtype``, ``fuse_silu_and_mul``), on every backend. Expected values come from float64
formulas written here."""

from __future__ import annotations

import contextlib

import pytest
import torch

import sgljit
from sgljit.compat.sglang.per_token_group_quant import per_token_group_quant
from sgljit_quant_fp8 import moe

from ..plugins.common import BACKENDS

E4M3, INT8 = torch.float8_e4m3fn, torch.int8


def _dev(backend):
    return "cuda" if backend == "cuda" else "cpu"


def _ctx(backend):
    return contextlib.nullcontext() if backend == "cuda" else sgljit.use_backend(backend)


def _data(shape, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x = x * torch.exp2(torch.randint(-6, 7, shape, generator=g).double())
    return x.to(dtype).to(device)


def _scales(x, group_size, qmax, ue8m0=False):
    """float64 formula: max(absmax / qmax, 1e-10) in fp32; ue8m0: 2^ceil(log2)."""
    x64 = x.double().cpu()
    g = x64.reshape(*x64.shape[:-1], x64.shape[-1] // group_size, group_size).abs().amax(-1)
    s = torch.maximum(g / qmax, torch.tensor(1e-10).float().double()).float()
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s.double()))).float()
    return s


def _codes(x, scale, group_size, out_dtype):
    x64 = x.double().cpu()
    groups = x64.reshape(*x64.shape[:-1], x64.shape[-1] // group_size, group_size)
    q = (groups / scale.double().unsqueeze(-1)).float()
    if out_dtype == INT8:
        return q.double().round().clamp(-127, 127).to(INT8).reshape(x64.shape)
    return q.clamp(-448, 448).to(out_dtype).reshape(x64.shape)


def _unpack(words: torch.Tensor, groups: int) -> torch.Tensor:
    """int32 words [..., W] -> the exponent bytes [..., 4 W] (byte b of word w is group 4 w + b)."""
    b = words.cpu().contiguous().view(torch.uint8)
    assert (b[..., groups:] == 0).all(), "tail bytes of the last word must be zero"
    return b[..., :groups]


def _b(t):
    return t.cpu().contiguous().view(torch.uint8)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("column_major", [False, True], ids=["row", "col"])
def test_dense_fp32_scales(backend, column_major):
    dev = _dev(backend)
    x = _data((7, 1024), torch.bfloat16, dev)
    with _ctx(backend):
        q, s = per_token_group_quant(x, group_size=128, column_major_scales=column_major)
    assert q.dtype == E4M3 and s.dtype == torch.float32 and s.shape == (7, 8)
    if column_major:
        assert s.stride() == (1, 8)  # tokens contiguous, columns of 8 (7 rounded up to 4)
    scale = _scales(x, 128, 448.0)
    assert torch.equal(s.cpu(), scale)
    assert torch.equal(_b(q), _b(_codes(x, scale, 128, E4M3)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("column_major", [False, True], ids=["row", "col"])
def test_ue8m0_packed_int32(backend, column_major):
    """6 groups: two int32 words a row, the second's last two bytes zero."""
    dev = _dev(backend)
    x = _data((5, 768), torch.bfloat16, dev, seed=1)
    with _ctx(backend):
        q, s = per_token_group_quant(
            x, group_size=128, scale_ue8m0=True, column_major_scales=column_major
        )
    assert s.dtype == torch.int32 and s.shape == (5, 2)
    if column_major:
        assert s.stride(0) == 1
    scale = _scales(x, 128, 448.0, ue8m0=True)
    exponents = _unpack(s, 6)
    assert torch.equal(torch.exp2(exponents.double() - 127).float(), scale)
    assert torch.equal(_b(q), _b(_codes(x, scale, 128, E4M3)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("packed", [False, True], ids=["fp32", "ue8m0"])
def test_masked_rows_left_unwritten(backend, packed):
    dev = _dev(backend)
    experts, pad, hidden = 3, 6, 512
    x = _data((experts, pad, hidden), torch.float16, dev, seed=2)
    counts = [6, 0, 2]
    masked_m = torch.tensor(counts, dtype=torch.int32, device=dev)
    q = torch.full((experts, pad, hidden), 0x7E, dtype=torch.uint8, device=dev).view(E4M3)
    if packed:
        s = torch.full((experts, pad, 1), 12345, dtype=torch.int32, device=dev)
    else:
        s = torch.full((experts, pad, 4), -7.0, device=dev)
    with _ctx(backend):
        per_token_group_quant(
            x, q, s, group_size=128, scale_ue8m0=packed, masked_m=masked_m, expected_m=2
        )
    for e, m in enumerate(counts):
        scale = _scales(x[e, :m], 128, 448.0, ue8m0=packed)
        assert torch.equal(_b(q[e, :m]), _b(_codes(x[e, :m], scale, 128, E4M3)))
        assert (_b(q[e, m:]) == 0x7E).all()
        if packed:
            assert torch.equal(torch.exp2(_unpack(s[e, :m], 4).double() - 127).float(), scale)
            assert (s[e, m:] == 12345).all()
        else:
            assert torch.equal(s[e, :m].cpu(), scale)
            assert (s[e, m:] == -7.0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("out_dtype", [E4M3, INT8], ids=["e4m3", "int8"])
def test_sorted_rows_left_unwritten(backend, out_dtype):
    dev = _dev(backend)
    ids, post, valid = moe.sorted_ids(6, 2, 3, 4, torch.Generator().manual_seed(3))
    rows = ids.numel()
    x = _data((rows, 256), torch.bfloat16, dev, seed=4)
    q = torch.full((rows, 256), 0x7E, dtype=torch.uint8, device=dev).view(out_dtype)
    s = torch.full((rows, 2), -7.0, device=dev)
    with _ctx(backend):
        per_token_group_quant(
            x, q, s, group_size=128, sorted_token_ids=ids.to(dev),
            num_tokens_post_padded=post.to(dev), num_valid_tokens=valid,
        )  # fmt: skip
    live = ((torch.arange(rows) < int(post)) & (ids < valid)).to(dev)
    qmax = 127.0 if out_dtype == INT8 else 448.0
    scale = _scales(x[live], 128, qmax)
    assert torch.equal(s[live].cpu(), scale)
    assert torch.equal(_b(q[live]), _b(_codes(x[live], scale, 128, out_dtype)))
    assert (_b(q[~live]) == 0x7E).all() and (s[~live] == -7.0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_out_dtype_and_group_16(backend):
    dev = _dev(backend)
    x = _data((4, 256), torch.bfloat16, dev, seed=5)
    with _ctx(backend):
        q, s = per_token_group_quant(x, group_size=16, out_dtype=INT8)
    scale = _scales(x, 16, 127.0)
    assert q.dtype == INT8 and torch.equal(s.cpu(), scale)
    assert torch.equal(q.cpu(), _codes(x, scale, 16, INT8))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["dense", "legacy"])
def test_fuse_silu_and_mul(backend, mode):
    """dense: silu(gate) * up in fp32, rounded once to the input dtype; legacy: SiLU rounded to
    the input dtype first, the product in it. Then quantized as the unfused op."""
    dev = _dev(backend)
    x = _data((5, 2 * 256), torch.bfloat16, dev, seed=6)
    with _ctx(backend):
        q, s = per_token_group_quant(
            x, group_size=64, fuse_silu_and_mul=True, silu_and_mul_mode=mode
        )
    gate, up = x.double().cpu().chunk(2, dim=-1)
    silu = gate / (1 + torch.exp(-gate))
    if mode == "dense":
        y = (silu * up).to(torch.bfloat16)
        tol = 1  # the kernel's exp is not correctly rounded: y may differ by one bf16 step
    else:
        y = (silu.to(torch.bfloat16).double() * up).to(torch.bfloat16)
        tol = 1
    scale = _scales(y, 64, 448.0)
    assert q.shape == (5, 256)
    rel = ((s.cpu().double() - scale.double()).abs() / scale.double()).max()
    assert rel <= tol * 2.0**-7
    assert s.shape == (5, 4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_arguments_are_named(backend):
    dev = _dev(backend)
    x = _data((4, 256), torch.bfloat16, dev)
    q = torch.empty(4, 256, dtype=E4M3, device=dev)
    with _ctx(backend):
        with pytest.raises(ValueError, match=r"^output_s: int32-packed scales"):
            per_token_group_quant(x, q, torch.zeros(4, 1, dtype=torch.int32, device=dev))
        with pytest.raises(ValueError, match=r"^output_s: given without output_q"):
            per_token_group_quant(x, None, torch.zeros(4, 2, device=dev))
        with pytest.raises(ValueError, match=r"^silu_and_mul_mode"):
            per_token_group_quant(x, silu_and_mul_mode="fast")
        with pytest.raises(ValueError, match=r"^group_size: expected one of"):
            per_token_group_quant(x, group_size=24)
        with pytest.raises(ValueError, match=r"^scale_ue8m0: int8 output"):
            per_token_group_quant(x, group_size=128, out_dtype=INT8, scale_ue8m0=True)
        with pytest.raises(ValueError, match=r"^output_s: packed UE8M0 scales need 1"):
            per_token_group_quant(
                x, q, torch.zeros(4, 2, dtype=torch.int32, device=dev), scale_ue8m0=True
            )

"""Triton kernels that only move an op's bytes, for traffic torch has no one-kernel expression of:
the copy floors of the benchmarks (``Op.floor``) and benchmarks/traffic_ceilings.py.

Needs Triton (GPU machines): bench scripts import this inside their floor functions, so that on
the CPU the floor's cell reads "missing" and the rest of the run goes on.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from harness import Unavailable

# 1024-element blocks of 4 warps: the fastest 2R + 2W kernel of results/nvidia-h200/
# traffic_ceilings.md (4138-4190 GB/s; 2048-element blocks 4100-4170, a row per program 3924-3981)
BLOCK = 1024
WARPS = 4


# 2 reads + 2 writes in place over flat blocks: res = x + res; x = 2 * res
@triton.jit
def add_in_place_flat(x, res, n, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    s = tl.load(x + o, mask=m) + tl.load(res + o, mask=m)
    tl.store(res + o, s, mask=m)
    tl.store(x + o, s * 2, mask=m)


# reads x and res (2-byte elements), writes res and out (1-byte elements) over flat blocks
@triton.jit
def _add_in_place_and_narrow_flat(x, res, out, n, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    s = tl.load(x + o, mask=m) + tl.load(res + o, mask=m)
    tl.store(res + o, s, mask=m)
    tl.store(out + o, s.to(tl.int8), mask=m)


# rows of unit stride (any row stride) read and written in place: a program per tile of BLOCK
# elements, rows x columns (narrow rows several a program, wide ones split into 1024 columns)
@triton.jit
def _rows_in_place(x, rows, row_stride, width, ROWS: tl.constexpr, COLS: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * COLS + tl.arange(0, COLS)
    m = (r[:, None] < rows) & (c[None, :] < width)
    p = x + r[:, None].to(tl.int64) * row_stride + c[None, :]
    tl.store(p, tl.load(p, mask=m), mask=m)


# gate and up (the halves of each row of x) read, their sum (of out's element type: 2-byte, or 1-byte
# for fp8 codes) written: a program per tile of ROWS rows x COLS columns of out
@triton.jit
def _halves_to_rows(
    x, out, rows, width, x_stride, out_stride, ROWS: tl.constexpr, COLS: tl.constexpr
):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * COLS + tl.arange(0, COLS)
    m = (r[:, None] < rows) & (c[None, :] < width)
    src = x + r[:, None].to(tl.int64) * x_stride + c[None, :]
    s = tl.load(src, mask=m) + tl.load(src + width, mask=m)
    dst = out + r[:, None].to(tl.int64) * out_stride + c[None, :]
    tl.store(dst, s.to(out.dtype.element_ty), mask=m)


def _launchable(*tensors: torch.Tensor) -> None:
    """Triton launches on GPU tensors, or on any under its interpreter (TRITON_INTERPRET=1)."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not all(t.is_cuda for t in tensors):
        raise Unavailable("the Triton floor needs GPU tensors (or TRITON_INTERPRET=1)")


def rows_in_place(x: torch.Tensor) -> None:
    """x [rows, width] (unit column stride, any row stride) read and written in place: the traffic
    of an in-place op on strided rows (qknorm's q|k rows in one qkv buffer, rope's rotated dims)."""
    assert x.dim() == 2 and x.stride(1) == 1, (x.shape, x.stride())
    _launchable(x)
    rows, width = x.shape
    cols = min(BLOCK, triton.next_power_of_2(width))
    grid = (triton.cdiv(rows, BLOCK // cols), triton.cdiv(width, cols))
    _rows_in_place[grid](
        x, rows, x.stride(0), width, ROWS=BLOCK // cols, COLS=cols, num_warps=WARPS
    )


def fused_add(x: torch.Tensor, res: torch.Tensor) -> None:
    """x and res (contiguous, one shape) read and written in place: fused_add_rmsnorm's traffic."""
    _launchable(x, res)
    n = x.numel()
    add_in_place_flat[(triton.cdiv(n, BLOCK),)](x, res, n, BLOCK=BLOCK, num_warps=WARPS)


def fused_add_narrow(x: torch.Tensor, res: torch.Tensor, out: torch.Tensor) -> None:
    """x and res (bf16) read, res and out (fp8, one shape with them) written, all contiguous: the
    traffic of fused_add_rmsnorm_quant_fp8. Integer views: the floor moves bytes, no fp8 math."""
    _launchable(x, res, out)
    n = x.numel()
    _add_in_place_and_narrow_flat[(triton.cdiv(n, BLOCK),)](
        x.view(torch.int16),
        res.view(torch.int16),
        out.view(torch.int8),
        n,
        BLOCK=BLOCK,
        num_warps=WARPS,
    )


def gate_up(x: torch.Tensor, out: torch.Tensor) -> None:
    """x ``[T, 2d]`` (16-bit, unit column stride) read, out ``[T, d]`` written (16-bit, or fp8
    codes): the traffic of a gated activation (silu_and_mul) and of its fused fp8 form (the scales
    left out). Integer views: the floor moves bytes, no math."""
    assert x.dim() == 2 and x.stride(1) == 1 and out.stride(1) == 1, (x.stride(), out.stride())
    _launchable(x, out)
    rows, width = out.shape
    cols = min(BLOCK, triton.next_power_of_2(width))
    grid = (triton.cdiv(rows, BLOCK // cols), triton.cdiv(width, cols))
    words = out.view(torch.int16 if out.element_size() == 2 else torch.int8)
    _halves_to_rows[grid](
        x.view(torch.int16), words, rows, width, x.stride(0), out.stride(0),
        ROWS=BLOCK // cols, COLS=cols, num_warps=WARPS,
    )  # fmt: skip

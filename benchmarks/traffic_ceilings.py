"""Streaming ceilings for the memory traffic of the norm targets, at their shapes.

    python3 benchmarks/traffic_ceilings.py [--tokens 16384,65536] [--hidden 4096] [--out FILE.md]

A kernel that reads and writes the same bytes as an op, with nothing else to do, bounds what the op
can reach on this GPU. For each [T, H] bf16 shape this times (CUDA graphs, median, like the
benchmarks; tensors of 128 MB and more, so nothing is served from L2):

- 1 read + 1 write (rmsnorm's traffic): ``torch.mul(x, 1, out=y)``, and a Triton kernel copying one
  row per program (the shape of a row-wise norm);
- 2 reads + 2 writes in place (the fused add's traffic: ``r = x + r; x = f(r)``): Triton kernels,
  one row per program, and flat over 1024/2048-element blocks (benchmarks/floors.py's, the copy
  floor of fused_add_rmsnorm in bench_norm.py);
- 2 reads + 1 write: ``torch.add(x, r, out=y)``.

Needs a CUDA GPU and Triton.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floors import add_in_place_flat
from harness import bench_cudagraph_ms, command_line, now_utc, streaming_ceiling


@triton.jit
def _copy_rows(x, y, N: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, N)
    tl.store(y + r * N + o, tl.load(x + r * N + o))


@triton.jit
def _add_in_place_rows(x, res, N: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, N)
    s = tl.load(x + r * N + o) + tl.load(res + r * N + o)
    tl.store(res + r * N + o, s)
    tl.store(x + r * N + o, s * 2)


def _row(kernel: str, traffic: str, shape: str, us: float, nbytes: int) -> str:
    return f"| {shape} | {traffic} | {kernel} | {us:.1f} | {nbytes / us / 1e3:.0f} |"


def measure(tokens: int, hidden: int, rep_ms: float) -> list[str]:
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    r = torch.randn_like(x)
    y = torch.empty_like(x)
    shape, n = f"{tokens}x{hidden}", x.nbytes
    rows = []

    def time(fn) -> float:
        return bench_cudagraph_ms(fn, rep_ms) * 1e3

    rows.append(
        _row(
            "torch.mul(x, 1, out=y)", "1R + 1W", shape, time(lambda: torch.mul(x, 1, out=y)), 2 * n
        )
    )
    for warps in (4, 8):
        us = time(lambda w=warps: _copy_rows[(tokens,)](x, y, N=hidden, num_warps=w))
        rows.append(_row(f"Triton, a row per program, {warps} warps", "1R + 1W", shape, us, 2 * n))
    for warps in (4, 8):
        us = time(lambda w=warps: _add_in_place_rows[(tokens,)](x, r, N=hidden, num_warps=w))
        rows.append(
            _row(f"Triton, a row per program, {warps} warps", "2R + 2W in place", shape, us, 4 * n)
        )
    for block in (1024, 2048):
        us = time(
            lambda b=block: add_in_place_flat[(triton.cdiv(x.numel(), b),)](
                x, r, x.numel(), BLOCK=b, num_warps=4
            )
        )
        rows.append(
            _row(f"Triton, flat, {block}-element blocks", "2R + 2W in place", shape, us, 4 * n)
        )
    rows.append(
        _row(
            "torch.add(x, r, out=y)", "2R + 1W", shape, time(lambda: torch.add(x, r, out=y)), 3 * n
        )
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", default="16384,65536")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument("--out", help="also write the table (markdown) here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("traffic_ceilings.py needs a CUDA GPU", file=sys.stderr)
        return 2
    gbps, desc = streaming_ceiling()
    lines = [
        f"# Streaming ceilings by traffic pattern — {torch.cuda.get_device_name()}",
        "",
        f"- command: `{command_line()}`",
        f"- date: {now_utc()}",
        f"- streaming ceiling of the benchmarks: {gbps:.0f} GB/s ({desc})",
        "- bf16; median µs of CUDA-graph replays; GB/s = bytes moved ÷ time",
        "",
        "| shape | traffic | kernel | µs | GB/s |",
        "|---|---|---|---:|---:|",
    ]
    for t in (int(v) for v in args.tokens.split(",")):
        lines += measure(t, args.hidden, args.rep_ms)
        torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

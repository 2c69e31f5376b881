"""Where the fused dynamic FP8 quant kernel spends its time: per-block phase timestamps.

    python3 benchmarks/trace_quant_fused.py 16384            # rows of 4096 bf16, on a CUDA GPU
    SGLJIT_EXTRA_CUDA_CFLAGS="-DQUANT_FP8_FUSED_STAGES=6 -DQUANT_FP8_FUSED_STAGE_BYTES=16384" \\
        python3 benchmarks/trace_quant_fused.py 16384         # the same for another build

Builds the kernel with ``-DQUANT_FP8_FUSED_TRACE=1`` (a separate JIT cache entry): every block
records ``%globaltimer`` at its phase boundaries and writes the stamps over the output (so the
quantized values of this build are not checked here). Prints, per mark, the earliest, median and
latest block in µs from the first block's start (median over runs; every third run follows a
256 MB write, so the input is not in L2; a mark a block never reached is left out), then the op's
time per call from CUDA events (the trace adds a last grid barrier).
"""

import argparse
import os
import sys

MARKS = (
    "start",  # before the PDL wait
    "first chunk",  # the first ring chunk arrived (the stash copies are issued before it)
    "ring done",  # phase A's ring chunks reduced
    "stash+reduce",  # the stash reduced, the block's max written
    "grid barrier",  # past the grid barrier
    "stash quant",  # phase B's stash quantized
    "L2 chunks",  # phase B's L2-kept ring chunks quantized (none: left out)
    "end",
)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("rows", type=int)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=12)
    args = ap.parse_args()

    os.environ["SGLJIT_QUANT_FP8_DYNAMIC"] = "fused"
    flags = os.environ.get("SGLJIT_EXTRA_CUDA_CFLAGS", "")
    os.environ["SGLJIT_EXTRA_CUDA_CFLAGS"] = f"{flags} -DQUANT_FP8_FUSED_TRACE=1".strip()
    import torch

    import sgljit

    if not torch.cuda.is_available():
        print("trace_quant_fused: needs a CUDA GPU", file=sys.stderr)
        return 2
    op = sgljit.ops.per_tensor_quant_fp8
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # Every SM's block must own a chunk (up to 64 KB a stage), or fewer blocks than SMs write stamps.
    if args.rows * args.cols * 2 < sms * 65536:
        print(f"trace_quant_fused: needs at least {sms * 32768} elements", file=sys.stderr)
        return 2
    xs = [torch.randn(args.rows, args.cols, device="cuda").to(torch.bfloat16) for _ in range(2)]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    runs = []
    for it in range(args.runs):
        if it % 3 == 0:
            flush.fill_(it)
        out, _ = op(xs[it % 2])
        torch.cuda.synchronize()
        stamps = out.view(torch.uint8).flatten()[: sms * 64].view(torch.int64).reshape(sms, 8)
        if it >= 2:  # the first runs build and warm up
            rel = (stamps - stamps[:, 0].min()).double() / 1000.0
            # A stamp left at 0 is a mark the block never reached.
            runs.append(rel.masked_fill(stamps == 0, float("nan")))
    rel = torch.stack(runs).nanmedian(dim=0).values  # [block, mark]
    print(
        f"fused quant trace, {args.rows}x{args.cols} bf16 -> e4m3, {sms} blocks; µs from the "
        f"first block's start, median of {len(runs)} runs"
    )
    print("| mark | earliest block | median block | latest block |\n|---|---:|---:|---:|")
    for i, name in enumerate(MARKS):
        col = rel[:, i][~rel[:, i].isnan()]
        if col.numel() == 0:
            print(f"| {name} | - | - | - |")
            continue
        print(f"| {name} | {col.min():.2f} | {col.median():.2f} | {col.max():.2f} |")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(20):
        op(xs[i % 2])
    end.record()
    torch.cuda.synchronize()
    print(
        f"\nCUDA events: {start.elapsed_time(end) * 1000 / 20:.1f} µs per call (two inputs in turn)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

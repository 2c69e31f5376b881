#!/usr/bin/env bash
# Issue 60's A/B steps (benchmarks/NOTES.md, "Issue 60"): one step a call, so that h200.sh's per-step
# limits and packing keep every finished step of a cut run (ab.py rewrites its table after each
# variant too). Variants are ordered by expected value; sglang's jit_kernel is timed beside `base`.
#
#   bash benchmarks/h200.sh '@110:sh:bash benchmarks/ab-issue60.sh silu' '@90:sh:bash benchmarks/ab-issue60.sh fp8' \
#       '@100:sh:bash benchmarks/ab-issue60.sh norm' '@55:sh:bash benchmarks/ab-issue60.sh rope' \
#       '@45:sh:bash benchmarks/ab-issue60.sh group' '@40:sh:bash benchmarks/ab-issue60.sh bits'
#
# `bits` checks that ACT_AB_SILU_DIV=1 keeps today's bits (its modules are cached by then).
# Tables go to $AB_OUT (default benchmarks/results/nvidia-h100-80gb-hbm3), ab-issue60-STEP.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT_DIR="${AB_OUT:-benchmarks/results/nvidia-h100-80gb-hbm3}"
mkdir -p "$OUT_DIR"
ab() { python3 benchmarks/ab.py "$@" --rep 5 --jobs 8 --with-provider sglang-jit; }

case "${1:-}" in
silu)
    ab activation --ops silu_and_mul --grid serving --series 'd=2048 ,d=14336 ' --tokens 1,2,8,64,512 \
        --build-precompile 2 --variant base= --variant div1=-DACT_AB_SILU_DIV=1 \
        --variant wave=-DACT_AB_LARGE_BLOCKS_PER_SM=8 \
        --variant 'div1wave=-DACT_AB_SILU_DIV=1 -DACT_AB_LARGE_BLOCKS_PER_SM=8' --variant fast=-DACT_AB_SILU_DIV=2 \
        --variant sg256=-DACT_AB_MIN_THREADS=256 --out "$OUT_DIR/ab-issue60-silu.md"
    ;;
fp8)
    ab activation --ops silu_and_mul_per_token_group_quant_fp8 --grid serving --series 'd=2048 ,d=25600 ' \
        --tokens 1,8,64,512 --build-precompile 2 --variant base= --variant div1=-DACT_AB_SILU_DIV=1 \
        --variant 'div1br=-DACT_AB_SILU_DIV=1 -DACT_AB_QUANT_BRACKET=1' --variant fast=-DACT_AB_SILU_DIV=2 \
        --out "$OUT_DIR/ab-issue60-fp8.md"
    ;;
norm)
    ab norm --ops rmsnorm,qknorm --grid serving \
        --series 'H=2048 bf,H=3072 bf,H=12288 bf,14/2 heads x 64,128/8 heads x 128' --tokens 2,64,512 \
        --build-precompile 3 --variant base= --variant flat=-DNORM_AB_FLAT=1 \
        --variant 'dec=-DNORM_AB_DECODE=1 -DNORM_AB_DECODE_WAVES=4' --variant div32=-DNORM_AB_DIV32=1 \
        --variant 'all=-DNORM_AB_FLAT=1 -DNORM_AB_DECODE=1 -DNORM_AB_DECODE_WAVES=4 -DNORM_AB_DIV32=1' \
        --out "$OUT_DIR/ab-issue60-norm.md"
    ;;
rope)
    ab rope --ops apply_rope --grid serving --series '32/8 heads x 128 bf16 neox,14/2 heads x 64 bf16 neox' \
        --tokens 1,2,64 --build-precompile 2 --variant base= --variant 'h1v4=-DROPE_AB_HEADS=1 -DROPE_AB_VEC=4' \
        --variant h1=-DROPE_AB_HEADS=1 --variant late=-DROPE_AB_LATE_TRIGGER=1 --out "$OUT_DIR/ab-issue60-rope.md"
    ;;
group)
    ab quant_fp8 --ops per_token_group --grid models --series 'H=7168 b' --tokens 128,1024,4096 \
        --variant base= --variant r1=-DQF8_AB_GROUP_TPSM=2048 --variant t256=-DQF8_AB_GROUP_THREADS=256 \
        --out "$OUT_DIR/ab-issue60-group.md"
    ;;
bits)
    # ACT_AB_SILU_DIV=1 claims today's bits: silu_and_mul and the fused fp8 op (bf16) on wide
    # random data and the edge values, base against div1 (each in its own process: its own module)
    dump() {
        SGLJIT_EXTRA_CUDA_CFLAGS="$1" python3 - "$2" <<'PY'
import sys
import torch
from sgljit_activation import ops
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(512, 2 * 14336, device="cuda", generator=g) * 2.0 ** torch.randint(-8, 8, (512, 2 * 14336), device="cuda", generator=g)
x[0, :12] = torch.tensor([0.0, -0.0, -79.9, -80.1, -87.0, -90.0, -200.0, 90.0, 2e30, float("inf"), float("-inf"), float("nan")])
out = {f"bf16 T={t}": ops.silu_and_mul(x[:t].bfloat16()) for t in (1, 8, 64, 512)}
for t in (1, 64, 512):
    q, s = ops.silu_and_mul_per_token_group_quant_fp8(x[:t].bfloat16(), 128)
    out[f"fp8 T={t}"], out[f"scales T={t}"] = q.view(torch.uint8), s
torch.save({k: v.cpu() for k, v in out.items()}, sys.argv[1])
PY
    }
    dump "" /tmp/ab-issue60-base.pt
    dump "-DACT_AB_SILU_DIV=1" /tmp/ab-issue60-div1.pt
    python3 - <<'PY'
import torch
a, b = torch.load("/tmp/ab-issue60-base.pt"), torch.load("/tmp/ab-issue60-div1.pt")
bad = [k for k in a if not torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8))]
print("ACT_AB_SILU_DIV=1 bits:", "identical" if not bad else f"DIFFER in {bad}")
raise SystemExit(1 if bad else 0)
PY
    ;;
*)
    echo "usage: $0 silu|fp8|norm|rope|group|bits" >&2
    exit 2
    ;;
esac

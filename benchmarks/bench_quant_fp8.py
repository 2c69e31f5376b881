"""FP8 quantization: per-tensor dynamic, per-tensor static, per-token, per-token-group (bf16 ->
float8_e4m3fn).

    python3 benchmarks/bench_quant_fp8.py                  # on a CUDA GPU; writes quant_fp8.md
    python3 benchmarks/bench_quant_fp8.py --grid models    # real models' widths: quant_fp8-models.md
    python3 benchmarks/bench_quant_fp8.py --dry-run        # wiring check on the CPU
    python3 benchmarks/bench_quant_fp8.py --ops per_token_group_masked,per_token_group_sorted
                                                           # the MoE layouts (see moe_ops)

Providers: sgljit, torch eager and torch.compile of the same PyTorch formula
(``(x.float() / scale).clamp(-448, 448).to(float8_e4m3fn)``, scale ``max(absmax / 448, 2^-126)``),
and sglang's jit_kernel ("sglang-jit", benchmarks/sglang_provider.py): its dynamic per-tensor time
includes zeroing the scale buffer first (its absmax is an atomic max into it), its per-token time is
per-token-group quantization with one group per row.
Per-token-group (group 128, scales row-major, and column-major as DeepSeek-style GEMMs take them:
strides (1, T rounded up to 4)): sgljit, torch eager and torch.compile of the same formula (scale
``max(absmax(group) / 448, eps)``; the column-major result is transposed by ``.t().contiguous()``),
and sglang-jit's ``per_token_group_quant_8bit`` writing the same scales tensor (its scale is
``max(absmax, eps) / 448``: the same for these inputs).

Shapes (bf16 input), --grid default: per-tensor and per-token at H=4096, T in TOKENS; per-token-group
at H in GROUP_HIDDEN (4096, 7168), T in GROUP_TOKENS. --grid models: the widths of real GEMM inputs
(MODEL_HIDDENS: hidden and MLP intermediate sizes) at MODEL_TOKENS; per-token-group over the widths
block-quantized checkpoints feed their GEMMs (MODEL_GROUP_HIDDENS: DeepSeek-V3's and Qwen3's), both
scale layouts. --grid quick: a few of each (QUICK_*), for A/B runs.

Bytes: input read once, fp8 output and scale(s) written once. The dynamic per-tensor op must read
the input twice in general (absmax, then quantize); that second read is *not* counted, so its GB/s
is against one read (sgljit keeps up to ~29 MB of it on chip: shared memory + L2).
"""

import sys

import sglang_provider as sglang_jit
import torch
from harness import Case, Op, model_tokens, narrowing_copy, nbytes, run_family, standard_providers

TOKENS = (1, 16, 128, 1024, 2048, 4096, 8192, 16384, 65536)
HIDDEN = 4096
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_SCALE = 2.0**-126
# --grid models: widths of GEMM inputs that get quantized (fp8 activations): 2048 (DeepSeek-V3's MoE
# expert intermediate, Qwen3-1.7B hidden), 4096 (Llama-3-8B / Qwen3-8B hidden), 5120 (Qwen3-14B/32B
# hidden), 7168 (DeepSeek-V3 hidden), 8192 (Llama-3-70B hidden), 12288 (Qwen3-8B intermediate),
# 14336 (Llama-3-8B / Mistral-7B intermediate), 18432 (DeepSeek-V3's dense-layer intermediate).
MODEL_HIDDENS = (2048, 4096, 5120, 7168, 8192, 12288, 14336, 18432)
QUICK_HIDDENS = (4096, 7168, 14336)
QUICK_TOKENS = (1, 128, 4096, 65536)


def make_case(tokens: int, hidden: int, dtype: torch.dtype, kind: str) -> Case:
    def make_inputs(device):
        x = torch.randn(tokens, hidden, dtype=dtype, device=device)
        inputs = {"x": x, "out": torch.empty(tokens, hidden, dtype=FP8, device=device)}
        if kind == "static":
            inputs["scale"] = (x.abs().amax().float() / FP8_MAX).reshape(1)
        return inputs

    def nb(i):
        scales = 4 * (tokens if kind == "per_token" else 1)
        return nbytes(i["x"], i["out"]) + scales

    return Case(
        label=f"T={tokens}",
        tokens=tokens,
        make_inputs=make_inputs,
        bytes=nb,
        series=f"H={hidden} {str(dtype).removeprefix('torch.')} -> e4m3",
    )


GROUP_TOKENS = (1, 128, 1024, 4096, 16384, 65536)
GROUP_HIDDEN = (4096, 7168)
GROUP_SIZE = 128
GROUP_EPS = 1e-10  # sglang's default
# --grid models, per-token-group (128-wide blocks, as DeepSeek-V3 and Qwen3's FP8 checkpoints quantize
# activations): DeepSeek-V3's 1536 (q_lora_rank: q_b_proj's input), 2048 (MoE expert intermediate),
# 7168 (hidden), 16384 (128 heads x 128: o_proj's input), 18432 (dense intermediate); Qwen3-8B's
# 4096 and Qwen3-14B/32B's 5120 (hidden).
MODEL_GROUP_HIDDENS = (1536, 2048, 4096, 5120, 7168, 16384, 18432)
QUICK_GROUP_HIDDENS = (2048, 7168, 18432)


def group_scales(tokens: int, groups: int, device, column_major: bool) -> torch.Tensor:
    """fp32 [T, G]: row-major, or column-major with the token stride rounded up to 4 floats."""
    if column_major:
        aligned = -(-tokens // 4) * 4
        return torch.empty(groups, aligned, dtype=torch.float32, device=device).t()[:tokens]
    return torch.empty(tokens, groups, dtype=torch.float32, device=device)


def make_group_case(tokens: int, hidden: int, column_major: bool) -> Case:
    groups = hidden // GROUP_SIZE

    def make_inputs(device):
        x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device)
        return {
            "x": x,
            "out": torch.empty(tokens, hidden, dtype=FP8, device=device),
            "scales": group_scales(tokens, groups, device, column_major),
            "column_major": column_major,
        }

    return Case(
        label=f"T={tokens}",
        tokens=tokens,
        make_inputs=make_inputs,
        bytes=lambda i: nbytes(i["x"], i["out"]) + 4 * tokens * groups,
        series=f"H={hidden} bfloat16 -> e4m3, g{GROUP_SIZE}",
    )


def _div(a, b):
    return a / torch.full_like(a, b)


def torch_dynamic(i):
    x = i["x"]
    scale = _div(x.abs().amax().float().reshape(1), FP8_MAX).clamp_min(MIN_SCALE)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def torch_static(i):
    return (i["x"].float() / i["scale"]).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def torch_per_token(i):
    x = i["x"]
    scales = _div(x.abs().amax(dim=-1, keepdim=True).float(), FP8_MAX).clamp_min(MIN_SCALE)
    return (x.float() / scales).clamp(-FP8_MAX, FP8_MAX).to(FP8), scales


def torch_per_token_group(i):
    x = i["x"]
    tokens, hidden = x.shape
    g = x.view(tokens, hidden // GROUP_SIZE, GROUP_SIZE)
    amax = g.abs().amax(dim=-1).float()
    scales = torch.maximum(_div(amax, FP8_MAX), torch.full_like(amax, GROUP_EPS))
    out = (g.float() / scales.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(tokens, hidden)
    return out, scales.t().contiguous().t() if i["column_major"] else scales


def quant_floor(i):
    """x (bf16) read, out (fp8) written: harness.narrowing_copy, one kernel (the scales left out:
    4 bytes, T x 4, or per-token-group's T x H / 32, 1% of the bytes)."""
    narrowing_copy(i["x"], i["out"])


def load_dynamic():
    import sgljit

    f = sgljit.ops.per_tensor_quant_fp8
    return lambda i: f(i["x"], out=i["out"])


def load_static():
    import sgljit

    f = sgljit.ops.per_tensor_quant_fp8
    return lambda i: f(i["x"], i["scale"], out=i["out"])


def load_per_token():
    import sgljit

    f = sgljit.ops.per_token_quant_fp8
    return lambda i: f(i["x"], out=i["out"])


def load_per_token_group():
    import sgljit

    f = sgljit.ops.per_token_group_quant_fp8

    def fn(i):
        return f(
            i["x"],
            GROUP_SIZE,
            eps=GROUP_EPS,
            column_major_scales=i["column_major"],
            out=i["out"],
            scales=i["scales"],
        )

    return fn


# ------------------------------------------------------------------------------------------------
# Per-token-group over the MoE layouts (--ops per_token_group_masked,per_token_group_sorted; every
# series on --grid models, see moe_ops): fp8 e4m3, group 128, at expert-GEMM input widths.
# Masked (DeepEP low-latency: [E local, T_pad, H], masked_m around expected_m, scales column-major as
# DeepGEMM's masked grouped GEMM reads them): DeepSeek-V3 (256 experts over EP 32 or 8: 8 or 32 local;
# H 7168 into gate/up, 2048 into down) and Qwen3-MoE (128 experts, one GPU: H 2048 / 4096 into
# gate/up, 768 / 1536 into down), T_pad 1024 (DeepEP's 128 tokens a rank over 8 ranks).
MASKED_SERIES = (
    ("DeepSeek-V3", 8, 7168), ("DeepSeek-V3", 32, 7168), ("DeepSeek-V3", 32, 2048),
    ("Qwen3-30B-A3B", 128, 2048), ("Qwen3-30B-A3B", 128, 768),
    ("Qwen3-235B-A22B", 128, 4096), ("Qwen3-235B-A22B", 128, 1536),
)  # fmt: skip
MASKED_PAD = 1024
MASKED_EXPECTED = (4, 32, 256)  # tokens an expert gets: decode to prefill
# Sorted (moe_align_block_size's layout, the down GEMM's input [M, I] after the activation; top-8,
# block 64): DeepSeek-V3 (256 experts, I 2048), Qwen3-MoE (128 experts, I 768 / 1536).
SORTED_SERIES = (
    ("DeepSeek-V3", 256, 2048),
    ("Qwen3-30B-A3B", 128, 768),
    ("Qwen3-235B-A22B", 128, 1536),
)
SORTED_TOKENS = (16, 512, 8192)
SORTED_TOP_K, SORTED_BLOCK = 8, 64


def make_masked_case(model: str, experts: int, hidden: int, expected: int) -> Case:
    groups = hidden // GROUP_SIZE
    g = torch.Generator().manual_seed(experts * 100003 + hidden + expected)
    low, high = max(0, expected // 2), min(MASKED_PAD, expected * 3 // 2)
    counts = torch.randint(low, high + 1, (experts,), generator=g, dtype=torch.int32)
    valid = int(counts.sum())

    def make_inputs(device):
        aligned = -(-MASKED_PAD // 4) * 4
        scales = torch.empty(experts, groups, aligned, dtype=torch.float32, device=device)
        return {
            "x": torch.randn(experts, MASKED_PAD, hidden, dtype=torch.bfloat16, device=device),
            "out": torch.empty(experts, MASKED_PAD, hidden, dtype=FP8, device=device),
            "scales": scales.transpose(1, 2)[:, :MASKED_PAD],
            "masked_m": counts.to(device),
            "expected_m": expected,
        }

    return Case(
        label=f"m~{expected}",
        tokens=expected,
        make_inputs=make_inputs,
        bytes=valid * hidden * 3
        + 4 * valid * groups,  # the valid rows: bf16 read, fp8 + scales written
        series=f"{model} E={experts} T_pad={MASKED_PAD} H={hidden}",
    )


def make_sorted_case(model: str, experts: int, hidden: int, tokens: int) -> Case:
    from sgljit_quant_fp8.moe import sorted_ids

    groups = hidden // GROUP_SIZE
    g = torch.Generator().manual_seed(experts * 7 + tokens)
    ids, post, valid = sorted_ids(tokens, SORTED_TOP_K, experts, SORTED_BLOCK, g)
    live = int(((torch.arange(ids.numel()) < int(post)) & (ids < valid)).sum())

    def make_inputs(device):
        rows = ids.numel()
        return {
            "x": torch.randn(rows, hidden, dtype=torch.bfloat16, device=device),
            "out": torch.empty(rows, hidden, dtype=FP8, device=device),
            "scales": torch.empty(rows, groups, dtype=torch.float32, device=device),
            "ids": ids.to(device),
            "post": post.to(device),
            "valid": valid,
        }

    return Case(
        label=f"T={tokens}",
        tokens=tokens,
        make_inputs=make_inputs,
        bytes=live * hidden * 3 + 4 * live * groups,
        series=f"{model} E={experts} top{SORTED_TOP_K} block {SORTED_BLOCK} I={hidden}",
    )


def torch_masked(i):
    """Every row quantized (PyTorch has no row mask cheaper than the work), scales column-major."""
    x = i["x"]
    experts, pad, hidden = x.shape
    out, scales = torch_per_token_group({"x": x.view(-1, hidden), "column_major": False})
    return out.view(experts, pad, hidden), scales.view(experts, pad, -1).transpose(1, 2)


def torch_sorted(i):
    return torch_per_token_group({"x": i["x"], "column_major": False})


def load_masked():
    import sgljit

    f = sgljit.ops.per_token_group_quant_masked
    return lambda i: f(
        i["x"], i["masked_m"], GROUP_SIZE, expected_m=i["expected_m"], eps=GROUP_EPS,
        out=i["out"], scales=i["scales"],
    )  # fmt: skip


def load_sorted():
    import sgljit

    f = sgljit.ops.per_token_group_quant_sorted
    return lambda i: f(
        i["x"], i["ids"], i["post"], i["valid"], GROUP_SIZE, eps=GROUP_EPS, out=i["out"],
        scales=i["scales"],
    )  # fmt: skip


def moe_ops(grid: str) -> list[Op]:
    """The MoE layouts' ops: every series on the models (and decode) grid, DeepSeek-V3 (E=32,
    H=7168 / I=2048) and Qwen3-30B-A3B's first on the default grid, DeepSeek-V3's alone on quick."""
    keep = {"default": 2, "quick": 1}.get(grid)
    masked_series = [MASKED_SERIES[1], MASKED_SERIES[3]][:keep] if keep else MASKED_SERIES
    sorted_series = SORTED_SERIES[:keep] if keep else SORTED_SERIES
    masked = [make_masked_case(m, e, h, x) for m, e, h in masked_series for x in MASKED_EXPECTED]
    sorted_cases = [
        make_sorted_case(m, e, h, t) for m, e, h in sorted_series for t in SORTED_TOKENS
    ]
    return [
        Op(
            "per_token_group_masked",
            masked,
            [
                *standard_providers(load_masked, torch_masked),
                sglang_jit.provider(lambda: sglang_jit.load_per_token_group_quant_moe("masked")),
            ],
        ),
        Op(
            "per_token_group_sorted",
            sorted_cases,
            [
                *standard_providers(load_sorted, torch_sorted),
                sglang_jit.provider(lambda: sglang_jit.load_per_token_group_quant_moe("sorted")),
            ],
        ),
    ]


def ops(grid: str = "default") -> list[Op]:
    if grid == "default":
        hiddens, tokens = (HIDDEN,), TOKENS
        group_hiddens, group_tokens = GROUP_HIDDEN, GROUP_TOKENS
    elif grid == "quick":
        hiddens, tokens = QUICK_HIDDENS, QUICK_TOKENS
        group_hiddens, group_tokens = QUICK_GROUP_HIDDENS, QUICK_TOKENS
    else:
        hiddens, tokens = MODEL_HIDDENS, model_tokens(grid)
        group_hiddens, group_tokens = MODEL_GROUP_HIDDENS, tokens

    def cases(kind):
        return [make_case(t, h, torch.bfloat16, kind) for h in hiddens for t in tokens]

    def group_cases(column_major):
        return [make_group_case(t, h, column_major) for h in group_hiddens for t in group_tokens]

    def group_providers():
        return [
            *standard_providers(load_per_token_group, torch_per_token_group),
            sglang_jit.provider(lambda: sglang_jit.load_per_token_group_quant_fp8(GROUP_EPS)),
        ]

    return [
        Op(
            "per_tensor_dynamic",
            cases("dynamic"),
            [
                *standard_providers(load_dynamic, torch_dynamic),
                sglang_jit.provider(
                    sglang_jit.load_per_tensor_quant_fp8_dynamic, sglang_jit.prepare_dynamic_scale
                ),
            ],
            floor=quant_floor,
        ),
        Op(
            "per_tensor_static",
            cases("static"),
            [
                *standard_providers(load_static, torch_static),
                sglang_jit.provider(sglang_jit.load_per_tensor_quant_fp8_static),
            ],
            floor=quant_floor,
        ),
        Op(
            "per_token",
            cases("per_token"),
            [
                *standard_providers(load_per_token, torch_per_token),
                sglang_jit.provider(
                    sglang_jit.load_per_token_quant_fp8, sglang_jit.prepare_per_token_scales
                ),
            ],
            floor=quant_floor,
        ),
        Op("per_token_group", group_cases(False), group_providers(), floor=quant_floor),
        Op(
            "per_token_group_col_major",
            group_cases(True),
            group_providers(),
            floor=quant_floor,
        ),
        *moe_ops(grid),
    ]


if __name__ == "__main__":
    sys.exit(run_family("quant_fp8", ops))

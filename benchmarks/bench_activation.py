"""Gated activations: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul, and SiLU-and-mul fused with
per-token-group fp8 quantization (bf16 input [T, 2d], gate then up).

    python3 benchmarks/bench_activation.py                  # on a CUDA GPU; writes activation.md
    python3 benchmarks/bench_activation.py --grid models    # the MLP widths of real models
    python3 benchmarks/bench_activation.py --dry-run        # wiring check on the CPU
    python3 benchmarks/bench_activation.py --ops silu_and_mul_sorted  # MoE sorted rows

Providers: sgljit; torch eager and torch.compile of the same formula (``act(gate.float()) *
up.float()``, rounded once); Liger's SwiGLU (``LigerSiLUMulFunction``) and GEGLU
(``LigerGELUMulFunction``, GELU's tanh form; Liger has no erf form), which take gate and up as two
tensors, as Liger's MLPs compute them (``prepare`` splits each input copy into two contiguous
tensors, untimed: the same bytes); sglang's JIT kernels ("sglang-jit", benchmarks/sglang_provider.py:
``activation.<act>_and_mul``). The fused op: sgljit, the same formulas in torch and torch.compile
(quant_fp8's per-token-group formulas on the float32 product), "sgljit-unfused" (sgljit's
silu_and_mul in bf16, then its per_token_group_quant_fp8: the pair the fused op replaces) and
sglang-jit's fused kernel: from 0.5.23 ``per_token_group_quant(..., fuse_silu_and_mul=True,
silu_and_mul_mode="dense")``, in 0.5.13 DeepSeek-V4's ``silu_and_mul_contig_post_quant`` (bf16 ->
e4m3, group 128, d <= 8192).

Shapes, --grid default: d = 14336 (Llama-3-8B / Mistral-7B) at T in TOKENS, and MoE experts' 768 and
2048 at a few T; the fused op at DeepSeek-V3's 2048 (MoE expert) and 18432 (dense). --grid models:
every d in MODEL_DS at T in harness.MODEL_TOKENS (1 to 65536). --grid quick: a few of those, for A/B
runs.

Bytes: x read once, out written once (the fused op: fp8 out and the scales). The unfused pair is
timed against the fused op's bytes (its own traffic is larger: the bf16 product out and back in).
The copy floor (floors.gate_up, Triton): one kernel that reads both halves of every row and writes
out, doing no math (the scales left out).
"""

import sys

import sglang_provider as sglang_jit
import torch
import torch.nn.functional as F
from harness import (
    LIGER,
    Case,
    Op,
    Provider,
    fixed,
    model_tokens,
    nbytes,
    run_family,
    standard_providers,
    torch_compiled,
)

TOKENS = (1, 16, 128, 1024, 4096, 16384, 65536)
MOE_TOKENS = (1, 128, 4096)
# The intermediate (MLP) sizes of real models, d of x [T, 2d]: 768 (Qwen3-30B-A3B expert), 1408
# (DeepSeek-V2-Lite / Qwen1.5-MoE expert), 2048 (DeepSeek-V3 expert), 8192 (Llama-3.2-3B), 11008
# (Llama-2-7B, Qwen-7B), 12288 (Qwen3-8B), 14336 (Llama-3-8B, Mistral-7B), 18432 (DeepSeek-V3 dense
# layers), 25600 (Qwen3-32B), 28672 (Llama-3-70B).
MODEL_DS = (768, 1408, 2048, 8192, 11008, 12288, 14336, 18432, 25600, 28672)
QUICK_DS = (768, 2048, 14336, 28672)
QUICK_TOKENS = (1, 128, 4096, 65536)
QUANT_DS = (2048, 18432)
GROUP = 128
EPS = 1e-10
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BF16 = torch.bfloat16
ACTS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def act_case(tokens: int, d: int) -> Case:
    def make_inputs(device):
        return {
            "x": torch.randn(tokens, 2 * d, dtype=BF16, device=device),
            "out": torch.empty(tokens, d, dtype=BF16, device=device),
        }

    return Case(
        label=f"T={tokens} d={d}",
        tokens=tokens,
        make_inputs=make_inputs,
        bytes=lambda i: nbytes(i["x"], i["out"]),
        series=f"d={d} bfloat16",
    )


def quant_case(tokens: int, d: int) -> Case:
    def make_inputs(device):
        return {
            "x": torch.randn(tokens, 2 * d, dtype=BF16, device=device),
            "out": torch.empty(tokens, d, dtype=FP8, device=device),
            "scales": torch.empty(tokens, d // GROUP, dtype=torch.float32, device=device),
            # the unfused pair's bf16 product (not counted in the bytes)
            "tmp": torch.empty(tokens, d, dtype=BF16, device=device),
        }

    return Case(
        label=f"T={tokens} d={d}",
        tokens=tokens,
        make_inputs=make_inputs,
        bytes=lambda i: nbytes(i["x"], i["out"], i["scales"]),
        series=f"d={d} bfloat16 -> e4m3, g{GROUP}",
    )


def _product(x: torch.Tensor, act: str) -> torch.Tensor:
    d = x.shape[-1] // 2
    return ACTS[act](x[:, :d].float()) * x[:, d:].float()


def torch_act(act: str):
    return lambda i: _product(i["x"], act).to(BF16)


def torch_quant(i):
    y = _product(i["x"], "silu")
    tokens, d = y.shape
    groups = y.view(tokens, d // GROUP, GROUP)
    amax = groups.abs().amax(dim=-1)
    scales = torch.maximum(amax / torch.full_like(amax, FP8_MAX), torch.full_like(amax, EPS))
    q = (groups / scales.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(tokens, d), scales


def load_sgljit(act: str):
    def load():
        import sgljit

        f = getattr(sgljit.ops, f"{act}_and_mul")
        return lambda i: f(i["x"], out=i["out"])

    return load


def load_sgljit_quant():
    import sgljit

    f = sgljit.ops.silu_and_mul_per_token_group_quant_fp8
    return lambda i: f(i["x"], GROUP, eps=EPS, out=i["out"], scales=i["scales"])


def load_sgljit_unfused():
    """sgljit's silu_and_mul (bf16 product through memory), then its per_token_group_quant_fp8."""
    import sgljit

    act, quant = sgljit.ops.silu_and_mul, sgljit.ops.per_token_group_quant_fp8

    def fn(i):
        y = act(i["x"], out=i["tmp"])
        return quant(y, GROUP, eps=EPS, out=i["out"], scales=i["scales"])

    return fn


def split_gate_up(i):
    """Gate and up as two contiguous tensors, as Liger's MLPs have them (untimed)."""
    d = i["x"].shape[-1] // 2
    return {**i, "gate": i["x"][:, :d].contiguous(), "up": i["x"][:, d:].contiguous()}


def load_liger(act: str):
    def load():
        if act == "silu":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction as fn
        else:
            from liger_kernel.ops.geglu import LigerGELUMulFunction as fn
        return lambda i: fn.apply(i["gate"], i["up"])

    return load


def act_floor(i):
    """x read (both halves), out written, by one Triton kernel doing no math (benchmarks/floors.py)."""
    from floors import gate_up

    gate_up(i["x"], i["out"])


def act_ops(ds, tokens, moe=()) -> list[Op]:
    out = []
    for act in ACTS:
        providers = standard_providers(load_sgljit(act), torch_act(act))
        if act != "gelu":  # Liger has SwiGLU and GEGLU (tanh form) only
            providers.append(Provider(LIGER, load_liger(act), split_gate_up))
        providers.append(sglang_jit.provider(lambda act=act: sglang_jit.load_act_and_mul(act)))
        cases = [act_case(t, d) for d in ds for t in tokens]
        cases += [act_case(t, d) for d in moe for t in MOE_TOKENS]
        out.append(Op(f"{act}_and_mul", cases, providers, floor=act_floor))
    return out


def quant_op(ds, tokens) -> Op:
    return Op(
        "silu_and_mul_per_token_group_quant_fp8",
        [quant_case(t, d) for d in ds for t in tokens],
        [
            Provider("sgljit", load_sgljit_quant),
            fixed(torch_quant, "torch"),
            torch_compiled(torch_quant),
            Provider("sgljit-unfused", load_sgljit_unfused),
            sglang_jit.provider(sglang_jit.load_silu_and_mul_quant_fp8),
        ],
        floor=act_floor,
    )


# silu_and_mul over the sorted MoE layout (--ops silu_and_mul_sorted; all series on --grid models): the first
# GEMM's output [M, 2I] in moe_align_block_size's order (top-8, block 64), rows of padding and of
# experts -1 skipped. DeepSeek-V3 (256 experts, I 2048), Qwen3-MoE (128 experts, I 768 / 1536).
SORTED_SERIES = (
    ("DeepSeek-V3", 256, 2048),
    ("Qwen3-30B-A3B", 128, 768),
    ("Qwen3-235B-A22B", 128, 1536),
)
SORTED_TOKENS = (16, 512, 8192)
SORTED_TOP_K, SORTED_BLOCK = 8, 64


def sorted_case(model: str, experts: int, d: int, tokens: int) -> Case:
    from sgljit_quant_fp8.moe import sorted_ids

    g = torch.Generator().manual_seed(experts * 7 + tokens)
    ids, post, valid = sorted_ids(tokens, SORTED_TOP_K, experts, SORTED_BLOCK, g)
    rows = ids.numel()
    live = int(((torch.arange(rows) < int(post)) & (ids < valid)).sum())

    def make_inputs(device):
        return {
            "x": torch.randn(rows, 2 * d, dtype=BF16, device=device),
            "out": torch.empty(rows, d, dtype=BF16, device=device),
            "expert_ids": torch.zeros(rows // SORTED_BLOCK, dtype=torch.int32, device=device),
            "ids": ids.to(device),
            "post": post.to(device),
            "valid": valid,
        }

    return Case(
        label=f"T={tokens}",
        tokens=tokens,
        make_inputs=make_inputs,
        bytes=live * d * 3 * 2,  # the kept rows: both halves read, out written (bf16)
        series=f"{model} E={experts} top{SORTED_TOP_K} block {SORTED_BLOCK} d={d}",
    )


def load_sgljit_sorted():
    from sgljit_activation.moe import gated_act_filtered

    return lambda i: gated_act_filtered(
        i["x"], "silu", expert_ids=i["expert_ids"], expert_step=SORTED_BLOCK,
        sorted_token_ids=i["ids"], num_tokens_post_padded=i["post"], num_valid_tokens=i["valid"],
        out=i["out"],
    )  # fmt: skip


def sorted_op(grid: str) -> Op:
    """Every series on the models (and decode) grid, DeepSeek-V3's and Qwen3-30B-A3B's on the
    default grid, DeepSeek-V3's alone on quick."""
    keep = {"default": 2, "quick": 1}.get(grid)
    series = SORTED_SERIES[:keep] if keep else SORTED_SERIES
    cases = [sorted_case(m, e, d, t) for m, e, d in series for t in SORTED_TOKENS]
    return Op(
        "silu_and_mul_sorted",
        cases,
        [
            *standard_providers(load_sgljit_sorted, torch_act("silu")),
            sglang_jit.provider(lambda: sglang_jit.load_silu_and_mul_sorted(SORTED_BLOCK)),
        ],
    )


def ops(grid: str = "default") -> list[Op]:
    if grid == "default":
        return [
            *act_ops((14336,), TOKENS, moe=(768, 2048)),
            quant_op(QUANT_DS, TOKENS),
            sorted_op(grid),
        ]
    if grid == "quick":
        return [*act_ops(QUICK_DS, QUICK_TOKENS), quant_op(QUANT_DS, QUICK_TOKENS), sorted_op(grid)]
    tokens = model_tokens(grid)
    return [*act_ops(MODEL_DS, tokens), quant_op(MODEL_DS, tokens), sorted_op(grid)]


if __name__ == "__main__":
    sys.exit(run_family("activation", ops))

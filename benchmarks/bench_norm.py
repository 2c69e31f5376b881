"""RMSNorm family: sgljit vs torch eager, torch.compile, Liger (where it has the op) and sglang's
jit_kernel ("sglang-jit", benchmarks/sglang_provider.py; missing until fetch_sglang_jit.sh ran).

    python3 benchmarks/bench_norm.py                      # on a CUDA GPU; writes results/<gpu>/norm.md
    python3 benchmarks/bench_norm.py --dry-run            # wiring check on the CPU

Ops and shapes (bf16; inputs rotated so nothing is timed from L2), --grid default:
  rmsnorm, fused_add_rmsnorm     H=4096 at T = 1 .. 65536; H=8192 and H=16384 at a few T
  gemma_rmsnorm                  H=4096 (Liger with offset 1, gemma casting)
  qknorm                         q 32 heads, k 8 heads, D=128, strided views into one qkv buffer
  qknorm_across_heads            q 4096, k 1024 wide, strided views into one qkv buffer
--grid models: the hidden sizes and q/k head layouts of real models (MODEL_HIDDENS, MODEL_HEADS) at
MODEL_TOKENS; --grid quick: a subset of it (QUICK_*), for A/B runs.
Bytes: each input read once, each output written once (fused add: input, residual read and written).
"""

import sys

import sglang_provider as sglang_jit
import torch
from harness import Case, Op, nbytes, run_family, standard_providers

TOKENS = (1, 16, 128, 1024, 4096, 16384, 65536)
WIDE_TOKENS = (1, 128, 16384)
EPS = 1e-6
# Hidden sizes of real models: 1024 (Qwen3-0.6B), 1536 (Qwen2.5-1.5B), 2048 (Qwen3-1.7B, Llama-3.2-1B),
# 2304 (Gemma-2-2B), 2560 (Qwen3-4B), 3072 (Llama-3.2-3B), 3584 (Qwen2.5-7B, Gemma-2-9B), 4096
# (Llama-3-8B, Qwen3-8B), 5120 (Qwen3-14B/32B, Llama-2-13B), 6144 (Mixtral-8x22B), 7168 (DeepSeek-V3),
# 8192 (Llama-3-70B), 8704 (an odd width, 17 x 512), 12288 (GPT-3 175B class), 16384 (Llama-3.1-405B).
MODEL_HIDDENS = (
    1024,
    1536,
    2048,
    2304,
    2560,
    3072,
    3584,
    4096,
    5120,
    6144,
    7168,
    8192,
    8704,
    12288,
    16384,
)
MODEL_TOKENS = (1, 16, 128, 1024, 4096, 16384, 65536)
# (q heads, k heads, head_dim) of real attention layers: Qwen3-0.6B/1.7B 16/8x128, Qwen2.5-7B 28/4x128,
# Llama-3-8B / Qwen3-8B 32/8x128, Qwen3-14B 40/8x128, Qwen3-32B / Llama-3-70B 64/8x128, Llama-3.1-405B
# 128/8x128, Gemma-2-2B 8/4x256, small models' 14/2x64.
MODEL_HEADS = (
    (16, 8, 128),
    (28, 4, 128),
    (32, 8, 128),
    (40, 8, 128),
    (64, 8, 128),
    (128, 8, 128),
    (8, 4, 256),
    (14, 2, 64),
)
QK_TOKENS = (1, 128, 1024, 16384)
QUICK_HIDDENS = (2048, 3584, 4096, 5120, 7168, 8192)
QUICK_TOKENS = (1, 128, 4096, 65536)
QUICK_HEADS = ((32, 8, 128), (40, 8, 128), (64, 8, 128))


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (w.float() + offset)).to(x.dtype)


# ------------------------------------------------------------------------------------------------
# rmsnorm / gemma_rmsnorm


def rms_case(tokens: int, hidden: int, dtype: torch.dtype) -> Case:
    def make_inputs(device):
        x = torch.randn(tokens, hidden, dtype=dtype, device=device)
        return {
            "x": x,
            "w": torch.randn(hidden, dtype=dtype, device=device),
            "out": torch.empty_like(x),
        }

    return Case(
        label=f"T={tokens} H={hidden}",
        tokens=tokens,
        make_inputs=make_inputs,
        bytes=lambda i: nbytes(i["x"], i["w"], i["out"]),
        series=f"H={hidden} {_name(dtype)}",
    )


def load_sgljit_rmsnorm():
    import sgljit

    f = sgljit.ops.rmsnorm
    return lambda i: f(i["x"], i["w"], EPS, out=i["out"])


def load_sgljit_gemma_rmsnorm():
    import sgljit

    f = sgljit.ops.gemma_rmsnorm
    return lambda i: f(i["x"], i["w"], EPS, out=i["out"])


def torch_rmsnorm(i):
    return _rms(i["x"], i["w"], EPS)


def torch_gemma_rmsnorm(i):
    return _rms(i["x"], i["w"], EPS, offset=1.0)


def load_liger_rmsnorm():
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    return lambda i: LigerRMSNormFunction.apply(i["x"], i["w"], EPS)


def load_liger_gemma_rmsnorm():
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    return lambda i: LigerRMSNormFunction.apply(i["x"], i["w"], EPS, 1.0, "gemma")


# ------------------------------------------------------------------------------------------------
# fused_add_rmsnorm


def fused_case(tokens: int, hidden: int, dtype: torch.dtype) -> Case:
    def make_inputs(device):
        return {
            "x": torch.randn(tokens, hidden, dtype=dtype, device=device),
            "r": torch.randn(tokens, hidden, dtype=dtype, device=device),
            "w": torch.randn(hidden, dtype=dtype, device=device),
        }

    return Case(
        label=f"T={tokens} H={hidden}",
        tokens=tokens,
        make_inputs=make_inputs,
        # reads input, residual, weight; writes input, residual
        bytes=lambda i: 2 * nbytes(i["x"], i["r"]) + nbytes(i["w"]),
        series=f"H={hidden} {_name(dtype)}",
    )


def load_sgljit_fused():
    import sgljit

    f = sgljit.ops.fused_add_rmsnorm
    return lambda i: f(i["x"], i["r"], i["w"], EPS)


def torch_fused(i):
    total = i["x"] + i["r"]
    return _rms(total, i["w"], EPS), total


def load_liger_fused():
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

    return lambda i: LigerFusedAddRMSNormFunction.apply(i["x"], i["r"], i["w"], EPS)


# ------------------------------------------------------------------------------------------------
# qknorm / qknorm_across_heads (views into one fused qkv buffer, as attention layers have them)


def qk_case(tokens: int, hq: int, hk: int, d: int, dtype: torch.dtype, per_head: bool) -> Case:
    def make_inputs(device):
        qkv = torch.randn(tokens, (hq + 2 * hk) * d, dtype=dtype, device=device)
        q, k = qkv[:, : hq * d], qkv[:, hq * d : (hq + hk) * d]
        if per_head:
            q, k = q.view(tokens, hq, d), k.view(tokens, hk, d)
        wq, wk = (d, d) if per_head else (hq * d, hk * d)
        return {
            "q": q,
            "k": k,
            "qw": torch.randn(wq, dtype=dtype, device=device),
            "kw": torch.randn(wk, dtype=dtype, device=device),
        }

    shape = f"{hq}/{hk} heads x {d}"
    return Case(
        label=f"T={tokens}",
        tokens=tokens,
        make_inputs=make_inputs,
        bytes=lambda i: 2 * nbytes(i["q"], i["k"]) + nbytes(i["qw"], i["kw"]),
        series=f"{shape} {_name(dtype)}",
    )


def load_sgljit_qknorm():
    import sgljit

    f = sgljit.ops.qknorm
    return lambda i: f(i["q"], i["k"], i["qw"], i["kw"], EPS)


def load_sgljit_qknorm_across_heads():
    import sgljit

    f = sgljit.ops.qknorm_across_heads
    return lambda i: f(i["q"], i["k"], i["qw"], i["kw"], EPS)


def torch_qknorm(i):
    return _rms(i["q"], i["qw"], EPS), _rms(i["k"], i["kw"], EPS)


# ------------------------------------------------------------------------------------------------


def ops(grid: str = "default") -> list[Op]:
    bf16 = torch.bfloat16
    if grid == "default":
        rms = [rms_case(t, 4096, bf16) for t in TOKENS]
        rms += [rms_case(t, h, bf16) for h in (8192, 16384) for t in WIDE_TOKENS]
        fused = [fused_case(t, 4096, bf16) for t in TOKENS]
        fused += [fused_case(t, h, bf16) for h in (8192, 16384) for t in WIDE_TOKENS]
        gemma = [rms_case(t, 4096, bf16) for t in (1, 128, 16384, 65536)]
        qk = [qk_case(t, 32, 8, 128, bf16, True) for t in TOKENS]
        across = [qk_case(t, 32, 8, 128, bf16, False) for t in TOKENS]
    else:
        quick = grid == "quick"
        hiddens, tokens = (QUICK_HIDDENS, QUICK_TOKENS) if quick else (MODEL_HIDDENS, MODEL_TOKENS)
        heads = QUICK_HEADS if quick else MODEL_HEADS
        rms = [rms_case(t, h, bf16) for h in hiddens for t in tokens]
        fused = [fused_case(t, h, bf16) for h in hiddens for t in tokens]
        gemma = [rms_case(t, h, bf16) for h in (2304, 3584) for t in tokens]
        qk = [qk_case(t, hq, hk, d, bf16, True) for hq, hk, d in heads for t in QK_TOKENS]
        across = [qk_case(t, hq, hk, d, bf16, False) for hq, hk, d in heads for t in QK_TOKENS]
    return [
        Op(
            "rmsnorm",
            rms,
            [
                *standard_providers(load_sgljit_rmsnorm, torch_rmsnorm, load_liger_rmsnorm),
                sglang_jit.provider(lambda: sglang_jit.load_rmsnorm(EPS)),
            ],
        ),
        Op(
            "fused_add_rmsnorm",
            fused,
            [
                *standard_providers(load_sgljit_fused, torch_fused, load_liger_fused),
                sglang_jit.provider(lambda: sglang_jit.load_fused_add_rmsnorm(EPS)),
            ],
        ),
        Op(
            "gemma_rmsnorm",
            gemma,
            [
                *standard_providers(
                    load_sgljit_gemma_rmsnorm, torch_gemma_rmsnorm, load_liger_gemma_rmsnorm
                ),
                sglang_jit.provider(lambda: sglang_jit.load_gemma_rmsnorm(EPS)),
            ],
        ),
        Op(
            "qknorm",
            qk,
            [
                *standard_providers(load_sgljit_qknorm, torch_qknorm),
                sglang_jit.provider(lambda: sglang_jit.load_qknorm(EPS)),
            ],
        ),
        Op(
            "qknorm_across_heads",
            across,
            [
                *standard_providers(load_sgljit_qknorm_across_heads, torch_qknorm),
                # sglang's needs q and k of one width, contiguous: fails on this GQA qkv layout
                sglang_jit.provider(lambda: sglang_jit.load_qknorm_across_heads(EPS)),
            ],
        ),
    ]


if __name__ == "__main__":
    sys.exit(run_family("norm", ops))

"""RMSNorm family: sgljit vs torch eager, torch.compile, Liger (where it has the op) and sglang's
jit_kernel ("sglang-jit", benchmarks/sglang_provider.py; missing until fetch_sglang_jit.sh ran).

    python3 benchmarks/bench_norm.py                      # on a CUDA GPU; writes results/<gpu>/norm.md
    python3 benchmarks/bench_norm.py --dry-run            # wiring check on the CPU

Ops and shapes (bf16; inputs rotated so nothing is timed from L2), --grid default:
  rmsnorm, fused_add_rmsnorm     H=4096 at T = 1 .. 65536; H=8192 and H=16384 at a few T
  gemma_rmsnorm                  H=4096 (Liger with offset 1, gemma casting)
  qknorm                         q 32 heads, k 8 heads, D=128, strided views into one qkv buffer
  qknorm_across_heads            q 4096, k 1024 wide, strided views into one qkv buffer
  rmsnorm_quant_fp8_static, rmsnorm_quant_fp8_per_token, fused_add_rmsnorm_quant_fp8_static,
  fused_add_rmsnorm_quant_fp8_per_token: bf16 -> float8_e4m3fn, H in QUANT_HIDDENS at QUANT_TOKENS;
                                 beside sgljit: "sgljit-unfused" (rmsnorm or fused_add_rmsnorm, then
                                 per_tensor_quant_fp8 / per_token_quant_fp8) and torch.compile of
                                 the reference formula
  layernorm                      bf16 rows, float32 gamma and beta (FlashInfer's contract), H in
                                 LN_HIDDENS; beside sgljit: F.layer_norm eager and compiled, Liger
  layernorm_quant_fp8            the same -> float8_e4m3fn (static scale); beside sgljit:
                                 "sgljit-unfused" (layernorm, then per_tensor_quant_fp8) and
                                 torch.compile of the reference formula
--grid models: the hidden sizes and q/k head layouts of real models (MODEL_HIDDENS, MODEL_HEADS) at
MODEL_TOKENS; --grid quick: a subset of it (QUICK_*), for A/B runs.
Bytes: each input read once, each output written once (LayerNorm: x, gamma, beta, out; fused add: input, residual read and written;
its quant form: input and residual read, residual and the fp8 output written). The unfused pair is
timed against the fused op's bytes (its own traffic is larger: the bf16 intermediate out and back).
"""

import sys

import sglang_provider as sglang_jit
import torch
from harness import (
    MODEL_HEADS,
    MODEL_TOKENS,
    Case,
    Op,
    Provider,
    model_tokens,
    narrowing_copy,
    nbytes,
    run_family,
    standard_providers,
)

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
QK_TOKENS = (1, 128, 1024, 16384)
QUICK_HIDDENS = (2048, 3584, 4096, 5120, 7168, 8192)
QUICK_TOKENS = (1, 128, 4096, 65536)
QUICK_HEADS = ((32, 8, 128), (40, 8, 128), (64, 8, 128))
QUANT_TOKENS = (1, 128, 1024, 4096, 16384, 65536)
QUANT_HIDDENS = (4096, 5120, 8192)
# LayerNorm's models: vision towers (SigLIP 1152, ViT-H 1280, ViT-g 1408), DiT (1152, 3072 Flux/SD3),
# older LLMs (2048, 4096, 5120); --grid default times 4096 at TOKENS, the others at WIDE_TOKENS.
LN_HIDDENS = (1152, 1280, 1408, 2048, 3072, 4096, 5120)
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_SCALE = 2.0**-126


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


def rmsnorm_floor(i):
    """torch.mul(x, 1, out=out): x read, out written (the weight, one row, left out)."""
    # not out.copy_(x): in a CUDA graph a copy goes through the copy engine, slower than a kernel
    torch.mul(i["x"], 1, out=i["out"])


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


def fused_add_floor(i):
    """x and r read and written in place, one Triton kernel over flat blocks (benchmarks/floors.py;
    the weight left out)."""
    from floors import fused_add

    fused_add(i["x"], i["r"])


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


def qknorm_floor(i):
    """The q and k views (adjacent in one qkv buffer) read and written in place by one Triton kernel
    over their rows (benchmarks/floors.py; the weights left out)."""
    from floors import rows_in_place

    q, k = i["q"], i["k"]
    width = q[0].numel() + k[0].numel()
    assert k.data_ptr() == q.data_ptr() + q[0].numel() * q.element_size(), "k must follow q"
    rows_in_place(q.as_strided((q.shape[0], width), (q.stride(0), 1)))


# ------------------------------------------------------------------------------------------------
# RMSNorm -> fp8 (bf16 -> float8_e4m3fn), static or per-token scale, plain or after the fused add


def quant_case(tokens: int, hidden: int, fused: bool, dynamic: bool) -> Case:
    def make_inputs(device):
        x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device)
        i = {
            "x": x,
            "w": torch.randn(hidden, dtype=torch.bfloat16, device=device),
            "out": torch.empty(tokens, hidden, dtype=FP8, device=device),
            # the unfused pair's bf16 intermediate (not counted in the bytes)
            "tmp": torch.empty_like(x),
        }
        if fused:
            i["r"] = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device)
        if dynamic:
            i["scales"] = torch.empty(tokens, 1, dtype=torch.float32, device=device)
        else:
            i["scale"] = torch.tensor([0.02], dtype=torch.float32, device=device)
        return i

    def nb(i):
        # reads x (+ residual), weight, a static scale; writes out (+ residual, + scales)
        fused_bytes = 2 * nbytes(i["r"]) if fused else 0
        return nbytes(i["x"], i["w"], i["out"], i.get("scale"), i.get("scales")) + fused_bytes

    return Case(
        label=f"T={tokens} H={hidden}",
        tokens=tokens,
        make_inputs=make_inputs,
        bytes=nb,
        series=f"H={hidden} bfloat16 -> e4m3",
    )


def load_sgljit_quant(fused: bool, dynamic: bool):
    def load():
        import sgljit

        if fused:
            f = sgljit.ops.fused_add_rmsnorm_quant_fp8
            if dynamic:
                return lambda i: f(
                    i["x"], i["r"], i["w"], None, EPS, out=i["out"], scales=i["scales"]
                )
            return lambda i: f(i["x"], i["r"], i["w"], i["scale"], EPS, out=i["out"])
        f = sgljit.ops.rmsnorm_quant_fp8
        if dynamic:
            return lambda i: f(i["x"], i["w"], None, EPS, out=i["out"], scales=i["scales"])
        return lambda i: f(i["x"], i["w"], i["scale"], EPS, out=i["out"])

    return load


def load_sgljit_unfused(fused: bool, dynamic: bool):
    """sgljit's norm, then its quantization: the pair the fused op replaces (the norm's output goes
    through memory)."""

    def load():
        import sgljit

        rmsnorm, fused_add = sgljit.ops.rmsnorm, sgljit.ops.fused_add_rmsnorm
        per_tensor, per_token = sgljit.ops.per_tensor_quant_fp8, sgljit.ops.per_token_quant_fp8

        def norm(i):
            if fused:
                fused_add(i["x"], i["r"], i["w"], EPS)  # the normalized row lands in x
                return i["x"]
            return rmsnorm(i["x"], i["w"], EPS, out=i["tmp"])

        if dynamic:
            return lambda i: per_token(norm(i), out=i["out"])
        return lambda i: per_tensor(norm(i), i["scale"], out=i["out"])

    return load


def _rms_f32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()


def _quantize(y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (y / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def torch_quant(fused: bool, dynamic: bool):
    """The reference formula (sgljit_norm.reference), returning what it writes."""

    def fn(i):
        total = (i["x"].float() + i["r"].float()).to(i["x"].dtype) if fused else i["x"]
        y = _rms_f32(total, i["w"])
        if dynamic:
            scale = (y.abs().amax(-1, keepdim=True) / FP8_MAX).clamp_min(MIN_SCALE)
        else:
            scale = i["scale"]
        q = _quantize(y, scale)
        return (q, scale, total) if fused else (q, scale)

    return fn


def quant_floor(i):
    """x (bf16) read, out (fp8) written: harness.narrowing_copy, one kernel (the weight and scales
    left out)."""
    narrowing_copy(i["x"], i["out"])


def fused_add_quant_floor(i):
    """x and r (bf16) read, r and out (fp8) written: one Triton kernel over flat blocks
    (benchmarks/floors.py; the weight and scales left out)."""
    from floors import fused_add_narrow

    fused_add_narrow(i["x"], i["r"], i["out"])


def quant_ops(hiddens, tokens) -> list[Op]:
    out = []
    for fused in (False, True):
        for dynamic in (False, True):
            name = ("fused_add_" if fused else "") + "rmsnorm_quant_fp8_"
            name += "per_token" if dynamic else "static"
            out.append(
                Op(
                    name,
                    [quant_case(t, h, fused, dynamic) for h in hiddens for t in tokens],
                    [
                        *standard_providers(
                            load_sgljit_quant(fused, dynamic), torch_quant(fused, dynamic)
                        ),
                        Provider("sgljit-unfused", load_sgljit_unfused(fused, dynamic)),
                    ],
                    floor=fused_add_quant_floor if fused else quant_floor,
                )
            )
    return out


# ------------------------------------------------------------------------------------------------
# LayerNorm (bf16 rows, float32 gamma and beta), plain or -> float8_e4m3fn with a static scale


def ln_case(tokens: int, hidden: int, quant: bool) -> Case:
    def make_inputs(device):
        x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device)
        i = {
            "x": x,
            "g": torch.randn(hidden, device=device) * 0.5 + 1,
            "b": torch.randn(hidden, device=device),
            "out": torch.empty(tokens, hidden, dtype=FP8, device=device)
            if quant
            else torch.empty_like(x),
        }
        if quant:
            i["scale"] = torch.tensor([0.02], dtype=torch.float32, device=device)
            i["tmp"] = torch.empty_like(x)  # the unfused pair's bf16 intermediate (not counted)
        return i

    return Case(
        label=f"T={tokens} H={hidden}",
        tokens=tokens,
        make_inputs=make_inputs,
        bytes=lambda i: nbytes(i["x"], i["g"], i["b"], i["out"], i.get("scale")),
        series=f"H={hidden} bfloat16" + (" -> e4m3" if quant else "") + ", float32 params",
    )


def load_sgljit_layernorm():
    import sgljit

    f = sgljit.ops.layernorm
    return lambda i: f(i["x"], i["g"], i["b"], EPS, out=i["out"])


def load_sgljit_layernorm_quant():
    import sgljit

    f = sgljit.ops.layernorm_quant_fp8
    return lambda i: f(i["x"], i["g"], i["b"], i["scale"], EPS, out=i["out"])


def load_sgljit_layernorm_unfused():
    """sgljit's layernorm, then its per-tensor quantization (the bf16 row through memory)."""
    import sgljit

    ln, quant = sgljit.ops.layernorm, sgljit.ops.per_tensor_quant_fp8
    return lambda i: quant(ln(i["x"], i["g"], i["b"], EPS, out=i["tmp"]), i["scale"], out=i["out"])


def torch_layernorm(i):
    # mixed dtypes (bf16 rows, float32 gamma and beta): torch's CUDA kernel takes them as they are
    return torch.nn.functional.layer_norm(i["x"], i["x"].shape[-1:], i["g"], i["b"], EPS)


def torch_layernorm_quant(i):
    """The reference formula (sgljit_norm.layernorm): float32 LayerNorm, / scale, clamp, to fp8."""
    x = i["x"].float()
    y = torch.nn.functional.layer_norm(x, x.shape[-1:], i["g"], i["b"], EPS)
    return _quantize(y, i["scale"])


def load_liger_layernorm():
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    return lambda i: LigerLayerNormFunction.apply(i["x"], i["g"], i["b"], EPS)


def layernorm_ops(hiddens, tokens, wide_tokens=None) -> list[Op]:
    """``wide_tokens``: the token counts of the widths other than 4096 (default: ``tokens``)."""

    def cases(quant):
        return [
            ln_case(t, h, quant)
            for h in hiddens
            for t in (tokens if h == 4096 or wide_tokens is None else wide_tokens)
        ]

    return [
        Op(
            "layernorm",
            cases(False),
            standard_providers(load_sgljit_layernorm, torch_layernorm, load_liger_layernorm),
            floor=rmsnorm_floor,
        ),
        Op(
            "layernorm_quant_fp8",
            cases(True),
            [
                *standard_providers(load_sgljit_layernorm_quant, torch_layernorm_quant),
                Provider("sgljit-unfused", load_sgljit_layernorm_unfused),
            ],
            floor=quant_floor,
        ),
    ]


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
        quant = quant_ops(QUANT_HIDDENS, QUANT_TOKENS)
        layernorm = layernorm_ops((1152, 3072, 4096), TOKENS, WIDE_TOKENS)
    else:
        quick = grid == "quick"
        hiddens, tokens = (QUICK_HIDDENS, QUICK_TOKENS) if quick else (MODEL_HIDDENS, MODEL_TOKENS)
        tokens, qk_tokens = model_tokens(grid, tokens), model_tokens(grid, QK_TOKENS)
        heads = QUICK_HEADS if quick else MODEL_HEADS
        rms = [rms_case(t, h, bf16) for h in hiddens for t in tokens]
        fused = [fused_case(t, h, bf16) for h in hiddens for t in tokens]
        gemma = [rms_case(t, h, bf16) for h in (2304, 3584) for t in tokens]
        qk = [qk_case(t, hq, hk, d, bf16, True) for hq, hk, d in heads for t in qk_tokens]
        across = [qk_case(t, hq, hk, d, bf16, False) for hq, hk, d in heads for t in qk_tokens]
        quant = quant_ops(hiddens, tokens)
        layernorm = layernorm_ops(LN_HIDDENS, tokens)
    return [
        Op(
            "rmsnorm",
            rms,
            [
                *standard_providers(load_sgljit_rmsnorm, torch_rmsnorm, load_liger_rmsnorm),
                sglang_jit.provider(lambda: sglang_jit.load_rmsnorm(EPS)),
            ],
            floor=rmsnorm_floor,
        ),
        Op(
            "fused_add_rmsnorm",
            fused,
            [
                *standard_providers(load_sgljit_fused, torch_fused, load_liger_fused),
                sglang_jit.provider(lambda: sglang_jit.load_fused_add_rmsnorm(EPS)),
            ],
            floor=fused_add_floor,
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
            floor=rmsnorm_floor,
        ),
        Op(
            "qknorm",
            qk,
            [
                *standard_providers(load_sgljit_qknorm, torch_qknorm),
                sglang_jit.provider(lambda: sglang_jit.load_qknorm(EPS)),
            ],
            floor=qknorm_floor,
        ),
        Op(
            "qknorm_across_heads",
            across,
            [
                *standard_providers(load_sgljit_qknorm_across_heads, torch_qknorm),
                # sglang's needs q and k of one width, contiguous: fails on this GQA qkv layout
                sglang_jit.provider(lambda: sglang_jit.load_qknorm_across_heads(EPS)),
            ],
            floor=qknorm_floor,
        ),
        *quant,
        *layernorm,
    ]


if __name__ == "__main__":
    sys.exit(run_family("norm", ops))

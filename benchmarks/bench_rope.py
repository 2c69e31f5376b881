"""Rotary embedding: sgljit vs torch eager, torch.compile, Liger and sglang's jit_kernel
("sglang-jit", benchmarks/sglang_provider.py).

    python3 benchmarks/bench_rope.py                      # on a CUDA GPU; writes results/<gpu>/rope.md
    python3 benchmarks/bench_rope.py --grid models        # real models' heads: rope-models.md
    python3 benchmarks/bench_rope.py --dry-run            # wiring check on the CPU

Ops:
- ``apply_rope``: in place on q and k. torch providers compute the same thing out of place (fp32
  math, rounded once) and return new tensors. Liger (neox, rotary_dim == head_dim only) is given
  cos/sin already gathered per token in its layout (untimed ``prepare``), so it skips the gather.
  sglang-jit is given views of the rotated part of each head when the rotary is partial.
- ``apply_rope_with_kv_cache``: q in place, rotated k and v stored into the caches at out_loc;
  also timed: sgljit ``apply_rope`` + two ``index_copy_`` (the unfused way). sglang-jit's fused
  op also writes the rotated k back into k (more bytes than counted here; see its loader).
- ``qknorm_rope``: per-head RMSNorm of q and k then rope, in place, q and k views into one qkv
  buffer (Qwen3 layers, rope base 1e6); also timed: sgljit ``qknorm`` then ``apply_rope`` (the
  unfused pair), torch.compile of the reference (out of place, same roundings), and sglang-jit's
  fused kernels: ``fused_qk_norm_rope`` (cos/sin computed, not read: fewer bytes than counted),
  ``fused_inplace_qknorm_rope`` (the same contract as sgljit's; both round once) and, from 0.5.23,
  the Triton ``table_qk_norm_rope_`` on the qkv buffer (cos/sin read from the same table; neox and
  full rotary only) (see their loaders).

Shapes (bf16, fp32 cos_sin_cache), --grid default (the issue's shapes):
  apply_rope                 q 32 heads / k 8 heads x 128, neox and gptj, T in TOKENS
  apply_rope_with_kv_cache   the same heads, neox, T in KV_TOKENS (decode sizes 1-256 and prefill)
  qknorm_rope                Qwen3's 32/8, 64/8, 16/8 heads x 128 (QK_HEADS), T in QK_TOKENS
--grid models: real models' attention heads (MODEL_ROPE: q/k heads, head_dim, rotary_dim, style,
  partial rotary included) at MODEL_TOKENS; the KV store for the models' head layouts (MODEL_HEADS)
  at decode sizes T = 1-256 plus 1024 and 16384 (MODEL_KV_TOKENS); qknorm_rope over Qwen3's heads
  (MODEL_QK_HEADS). --grid quick: a few of each (QUICK_*), for A/B runs.

Inputs: positions uniform in [0, 65536) over one shared cos_sin_cache per rotary width and base
(32 MiB at width 128; rows read are counted as bytes; the cache may partly sit in L2 for every
provider alike).
Bytes: the rotated part of q and k read + written (the whole heads unless the rotary is partial),
positions read, the cos/sin rows read (T x rotary_dim x 4 B); KV variant (whole heads): q read +
written, k and v read, k and v cache rows written, positions, out_loc and the cos/sin rows read;
qknorm_rope: q and k read + written, positions, the cos/sin rows and the two weights read.
"""

import sys

import sglang_provider as sglang_jit
import torch
from harness import (
    COMPILE,
    EAGER,
    LIGER,
    MODEL_HEADS,
    MODEL_TOKENS,
    SGLJIT,
    Case,
    Op,
    Provider,
    fixed,
    model_tokens,
    nbytes,
    run_family,
    torch_compiled,
)

TOKENS = (1, 16, 64, 256, 1024, 4096, 16384, 65536)
# apply_rope_with_kv_cache also at decode batch sizes (8, 32, 128)
KV_TOKENS = (1, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384, 65536)
HQ, HK, D, MAX_POS = 32, 8, 128, 65536
DTYPE = torch.bfloat16
# qknorm_rope: (q heads, k heads) of Qwen3-8B, -32B and -0.6B/1.7B (head_dim 128), and their rope base
QK_HEADS = ((32, 8), (64, 8), (16, 8))
QK_TOKENS = (1, 16, 128, 1024, 4096, 16384, 65536)
QWEN3_BASE = 1e6
EPS = 1e-6

# --grid models. (q heads, k heads, head_dim, rotary_dim, neox) of real attention layers: Qwen3-0.6B /
# 1.7B 16/8x128, Qwen2.5-7B 28/4x128, Llama-3-8B / Qwen3-8B 32/8x128, Qwen3-14B 40/8x128, Llama-3-70B /
# Qwen3-32B 64/8x128, Llama-3.1-405B 128/8x128, Gemma-2-2B 8/4x256, Qwen2.5-0.5B 14/2x64 (all neox,
# whole heads); partial rotary: Phi-2 32/32x80 rotating 32 (partial_rotary_factor 0.4, neox) and
# ChatGLM3-6B / GLM-4-9B 32/2x128 rotating 64 (half the head, gptj pairs); and Llama-3-8B's heads in
# gptj style, beside its neox row.
MODEL_ROPE = (
    (16, 8, 128, 128, True),
    (28, 4, 128, 128, True),
    (32, 8, 128, 128, True),
    (40, 8, 128, 128, True),
    (64, 8, 128, 128, True),
    (128, 8, 128, 128, True),
    (8, 4, 256, 256, True),
    (14, 2, 64, 64, True),
    (32, 32, 80, 32, True),
    (32, 2, 128, 64, False),
    (32, 8, 128, 128, False),
)
# rope + KV store: the attention layouts of real models (harness.MODEL_HEADS: whole heads, neox), at
# decode sizes and two prefill sizes
MODEL_KV_TOKENS = (1, 8, 32, 64, 128, 256, 1024, 16384)
# qknorm_rope: Qwen3-0.6B/1.7B 16/8, Qwen3-4B/8B 32/8, Qwen3-14B 40/8, Qwen3-32B 64/8 (x 128)
MODEL_QK_HEADS = ((16, 8), (32, 8), (40, 8), (64, 8))
# --grid quick: Llama-3-8B, Gemma-2-2B and GLM's partial gptj rotary; the KV store of Llama-3-8B and
# -70B; Qwen3-8B's and -14B's qknorm_rope
QUICK_ROPE = ((32, 8, 128, 128, True), (8, 4, 256, 256, True), (32, 2, 128, 64, False))
QUICK_TOKENS = (1, 128, 4096, 65536)
QUICK_KV_HEADS = ((32, 8, 128), (64, 8, 128))
QUICK_KV_TOKENS = (1, 32, 256, 16384)
QUICK_QK_HEADS = ((32, 8), (40, 8))

_CACHES: dict[tuple[str, float, int], torch.Tensor] = {}


def cos_sin_cache(device, base: float = 10000.0, rot: int = D) -> torch.Tensor:
    """fp32 [MAX_POS, rot]: cos | sin of position x base^(-2j / rot), one per device, base, width."""
    key = (str(device), base, rot)
    if key not in _CACHES:
        inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)
        ang = torch.arange(MAX_POS, dtype=torch.float32)[:, None] * inv[None, :]
        _CACHES[key] = torch.cat((ang.cos(), ang.sin()), dim=-1).to(device)
    return _CACHES[key]


def _heads(hq: int, hk: int, d: int, rot: int) -> str:
    """The series' shape, e.g. ``32/8 heads x 128`` (``... rotary 64`` when partial)."""
    return f"{hq}/{hk} heads x {d}" + (f" rotary {rot}" if rot != d else "")


def rope_case(
    tokens: int, is_neox: bool, hq: int = HQ, hk: int = HK, d: int = D, rot: int = D
) -> Case:
    def make_inputs(device):
        return {
            "q": torch.randn(tokens, hq, d, device=device).to(DTYPE),
            "k": torch.randn(tokens, hk, d, device=device).to(DTYPE),
            "cache": cos_sin_cache(device, rot=rot),
            "pos": torch.randint(0, MAX_POS, (tokens,), device=device),
            "is_neox": is_neox,
        }

    def nb(i):
        # only the first rot dims of each head are read and written
        return 2 * nbytes(i["q"], i["k"]) * rot // d + nbytes(i["pos"]) + tokens * rot * 4

    style = "neox" if is_neox else "gptj"
    return Case(
        f"T={tokens}", tokens, make_inputs, nb, series=f"{_heads(hq, hk, d, rot)} bf16 {style}"
    )


def kv_case(tokens: int, hq: int = HQ, hk: int = HK, d: int = D) -> Case:
    def make_inputs(device):
        slots = max(2 * tokens, 64)
        return {
            "q": torch.randn(tokens, hq, d, device=device).to(DTYPE),
            "k": torch.randn(tokens, hk, d, device=device).to(DTYPE),
            "v": torch.randn(tokens, hk, d, device=device).to(DTYPE),
            "k_cache": torch.zeros(slots, hk, d, device=device, dtype=DTYPE),
            "v_cache": torch.zeros(slots, hk, d, device=device, dtype=DTYPE),
            "cache": cos_sin_cache(device, rot=d),
            "pos": torch.randint(0, MAX_POS, (tokens,), device=device),
            "loc": torch.randperm(slots, device=device)[:tokens],
        }

    def nb(i):
        return (
            2 * nbytes(i["q"])
            + 2 * nbytes(i["k"], i["v"])
            + nbytes(i["pos"], i["loc"])
            + tokens * d * 4
        )

    return Case(f"T={tokens}", tokens, make_inputs, nb, series=f"{hq}/{hk} heads x {d} bf16 neox")


def qknorm_rope_case(tokens: int, hq: int, hk: int, d: int = D) -> Case:
    def make_inputs(device):
        qkv = torch.randn(tokens, (hq + 2 * hk) * d, device=device).to(DTYPE)
        return {
            "qkv": qkv,
            "q": qkv[:, : hq * d].view(tokens, hq, d),
            "k": qkv[:, hq * d : (hq + hk) * d].view(tokens, hk, d),
            "qw": (1 + 0.1 * torch.randn(d, device=device)).to(DTYPE),
            "kw": (1 + 0.1 * torch.randn(d, device=device)).to(DTYPE),
            "cache": cos_sin_cache(device, QWEN3_BASE, d),
            "pos": torch.randint(0, MAX_POS, (tokens,), device=device),
            "is_neox": True,
            "hq": hq,
            "hk": hk,
            "base": QWEN3_BASE,
        }

    def nb(i):
        return 2 * nbytes(i["q"], i["k"]) + nbytes(i["qw"], i["kw"], i["pos"]) + tokens * d * 4

    return Case(f"T={tokens}", tokens, make_inputs, nb, series=f"{hq}/{hk} heads x {d} bf16 neox")


# --- providers ------------------------------------------------------------------------------


def load_sgljit_rope():
    import sgljit

    op = sgljit.ops.apply_rope

    def fn(i):
        op(i["q"], i["k"], i["cache"], i["pos"], is_neox=i["is_neox"])

    return fn


def torch_rope(i):
    from sgljit_rope.reference import rope_torch

    return rope_torch(i["q"], i["k"], i["cache"], i["pos"], i["is_neox"])


def load_liger():
    try:
        from liger_kernel.ops.rope import rope_forward
    except ImportError:
        from liger_kernel.ops.rope import LigerRopeFunction

        def rope_forward(q, k, cos, sin):
            return LigerRopeFunction.apply(q, k, cos, sin)

    def fn(i):
        if not i["is_neox"]:
            raise NotImplementedError("Liger's rope is neox-style only")
        if "q4" not in i:
            raise NotImplementedError("Liger's rope rotates whole heads (rotary_dim == head_dim)")
        # q/k as (1, H, T, D) views of the (T, H, D) tensors: Liger rotates them in place
        return rope_forward(i["q4"], i["k4"], i["cos"], i["sin"])

    return fn


def liger_prepare(i):
    tokens, hq, d = i["q"].shape
    rot = i["cache"].shape[1]
    if not i["is_neox"] or rot != d:
        return i  # a case Liger does not take (its fn says why)
    rows = i["cache"].index_select(0, i["pos"])  # [T, d]: cos | sin (d / 2 each)
    cos, sin = rows[:, : d // 2], rows[:, d // 2 :]
    return {
        **i,
        "q4": i["q"].view(1, tokens, hq, d).transpose(1, 2),
        "k4": i["k"].view(1, tokens, i["k"].shape[1], d).transpose(1, 2),
        "cos": torch.cat((cos, cos), -1)[None].contiguous(),
        "sin": torch.cat((sin, sin), -1)[None].contiguous(),
    }


def load_sgljit_kv():
    import sgljit

    op = sgljit.ops.apply_rope_with_kv_cache

    def fn(i):
        op(i["q"], i["k"], i["v"], i["k_cache"], i["v_cache"], i["cache"], i["pos"], i["loc"])

    return fn


def load_sgljit_unfused():
    import sgljit

    op = sgljit.ops.apply_rope

    def fn(i):
        op(i["q"], i["k"], i["cache"], i["pos"])
        i["k_cache"].index_copy_(0, i["loc"], i["k"])
        i["v_cache"].index_copy_(0, i["loc"], i["v"])

    return fn


def torch_kv(i):
    from sgljit_rope.reference import rope_torch

    q, k = rope_torch(i["q"], i["k"], i["cache"], i["pos"], True)
    i["k_cache"].index_copy_(0, i["loc"], k)
    i["v_cache"].index_copy_(0, i["loc"], i["v"])
    return q


def load_sgljit_qknorm_rope():
    import sgljit

    op = sgljit.ops.qknorm_rope

    def fn(i):
        op(i["q"], i["k"], i["qw"], i["kw"], i["cache"], i["pos"], eps=EPS, is_neox=i["is_neox"])

    return fn


def load_sgljit_qknorm_then_rope():
    import sgljit

    qknorm, rope = sgljit.ops.qknorm, sgljit.ops.apply_rope

    def fn(i):
        qknorm(i["q"], i["k"], i["qw"], i["kw"], EPS)
        rope(i["q"], i["k"], i["cache"], i["pos"], is_neox=i["is_neox"])

    return fn


def torch_qknorm_rope(i):
    from sgljit_rope.reference import qknorm_rope_torch

    return qknorm_rope_torch(
        i["q"], i["k"], i["qw"], i["kw"], i["cache"], i["pos"], EPS, i["is_neox"]
    )


def rotated_rows(x: torch.Tensor, rot: int) -> torch.Tensor:
    """x[..., :rot] of x [T, H, D] (heads contiguous in a token) as 2-D rows of unit column stride:
    [T, H * D] rows of x's token stride when rot == D, else [T * H, rot] rows of stride D (x
    contiguous)."""
    t, h, d = x.shape
    assert x.stride(2) == 1 and x.stride(1) == d, x.stride()
    if rot == d:
        return x.as_strided((t, h * d), (x.stride(0), 1))
    assert x.is_contiguous(), "partial rotary floors take contiguous q and k"
    return x.as_strided((t * h, rot), (d, 1))


def rope_floor(i):
    """q and k's rotated dims read and written in place: one Triton kernel each over their rows
    (benchmarks/floors.py; at small T two launches are in it); positions, cos/sin rows (1 / (q + k
    heads + 1) of the bytes: up to 8% here) and qknorm_rope's weights left out."""
    from floors import rows_in_place

    rot = i["cache"].shape[1]
    rows_in_place(rotated_rows(i["q"], rot))
    rows_in_place(rotated_rows(i["k"], rot))


def rope_kv_floor(i):
    """q.mul_(1): q read and written in place; k and v read and their cache rows written at out_loc
    (index_copy_, as the unfused provider stores them): three kernels (at small T their launches
    are in it); positions and cos/sin rows left out."""
    i["q"].mul_(1)
    i["k_cache"].index_copy_(0, i["loc"], i["k"])
    i["v_cache"].index_copy_(0, i["loc"], i["v"])


def ops(grid: str = "default") -> list[Op]:
    if grid == "default":
        rope = [rope_case(t, True) for t in TOKENS] + [rope_case(t, False) for t in TOKENS]
        kv = [kv_case(t) for t in KV_TOKENS]
        qk = [qknorm_rope_case(t, hq, hk) for hq, hk in QK_HEADS for t in QK_TOKENS]
    else:
        quick = grid == "quick"
        heads, tokens = (QUICK_ROPE, QUICK_TOKENS) if quick else (MODEL_ROPE, MODEL_TOKENS)
        kv_heads, kv_tokens = (
            (QUICK_KV_HEADS, QUICK_KV_TOKENS) if quick else (MODEL_HEADS, MODEL_KV_TOKENS)
        )
        qk_heads, qk_tokens = (
            (QUICK_QK_HEADS, QUICK_TOKENS) if quick else (MODEL_QK_HEADS, QK_TOKENS)
        )
        tokens, kv_tokens, qk_tokens = (
            model_tokens(grid, x) for x in (tokens, kv_tokens, qk_tokens)
        )
        rope = [
            rope_case(t, neox, hq, hk, d, rot) for hq, hk, d, rot, neox in heads for t in tokens
        ]
        kv = [kv_case(t, hq, hk, d) for hq, hk, d in kv_heads for t in kv_tokens]
        qk = [qknorm_rope_case(t, hq, hk) for hq, hk in qk_heads for t in qk_tokens]
    return [
        Op(
            "apply_rope",
            rope,
            providers=[
                Provider(SGLJIT, load_sgljit_rope),
                fixed(torch_rope, EAGER),
                torch_compiled(torch_rope),
                Provider(LIGER, load_liger, liger_prepare),
                sglang_jit.provider(sglang_jit.load_apply_rope, sglang_jit.prepare_rotary_views),
            ],
            floor=rope_floor,
        ),
        Op(
            "apply_rope_with_kv_cache",
            kv,
            providers=[
                Provider(SGLJIT, load_sgljit_kv),
                Provider("sgljit apply_rope + 2 index_copy_", load_sgljit_unfused),
                fixed(torch_kv, EAGER),
                torch_compiled(torch_kv, COMPILE),
                sglang_jit.provider(
                    sglang_jit.load_apply_rope_with_kv_cache, sglang_jit.prepare_kv_cache_2d
                ),
            ],
            floor=rope_kv_floor,
        ),
        Op(
            "qknorm_rope",
            qk,
            providers=[
                Provider(SGLJIT, load_sgljit_qknorm_rope),
                Provider("sgljit qknorm + apply_rope", load_sgljit_qknorm_then_rope),
                torch_compiled(torch_qknorm_rope),
                sglang_jit.provider(
                    lambda: sglang_jit.load_fused_qk_norm_rope(EPS), sglang_jit.prepare_qkv_int32
                ),
                sglang_jit.provider(
                    lambda: sglang_jit.load_qknorm_rope(EPS),
                    name="sglang-jit fused_inplace_qknorm_rope",
                ),
                sglang_jit.provider(
                    lambda: sglang_jit.load_table_qk_norm_rope(EPS),
                    name="sglang-jit table_qk_norm_rope_",
                ),
            ],
            floor=rope_floor,
        ),
    ]


if __name__ == "__main__":
    sys.exit(run_family("rope", ops))

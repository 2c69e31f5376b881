"""Rotary embedding: sgljit vs torch eager, torch.compile, Liger and sglang's jit_kernel
("sglang-jit", benchmarks/sglang_provider.py) (issue shapes: bf16, q 32 heads / k 8 heads x 128,
neox, fp32 cos_sin_cache).

    python3 benchmarks/bench_rope.py              # on a CUDA GPU
    python3 benchmarks/bench_rope.py --dry-run    # wiring check on the CPU

Ops:
- ``apply_rope``: in place on q and k. torch providers compute the same thing out of place (fp32
  math, rounded once) and return new tensors. Liger (neox, rotary_dim == head_dim only) is given
  cos/sin already gathered per token in its layout (untimed ``prepare``), so it skips the gather.
- ``apply_rope_with_kv_cache``: q in place, rotated k and v stored into the caches at out_loc;
  also timed: sgljit ``apply_rope`` + two ``index_copy_`` (the unfused way). sglang-jit's fused
  op also writes the rotated k back into k (more bytes than counted here; see its loader).
- ``qknorm_rope``: per-head RMSNorm of q and k then rope, in place, q and k views into one qkv
  buffer (Qwen3 layers: 16/8, 32/8, 64/8 heads x 128, rope base 1e6); also timed: sgljit
  ``qknorm`` then ``apply_rope`` (the unfused pair), torch.compile of the reference (out of place,
  same roundings), and sglang-jit's two fused kernels: ``fused_qk_norm_rope`` (cos/sin computed,
  not read: fewer bytes than counted) and ``fused_inplace_qknorm_rope`` (the same contract as
  sgljit's); both round once (see their loaders).

Inputs: positions uniform in [0, 65536) over one shared 32 MiB cos_sin_cache (rows read are
counted as bytes; the cache may partly sit in L2 for every provider alike).
Bytes: q and k read + written, positions read, the cos/sin rows read (T x 128 x 4 B);
KV variant: q read + written, k and v read, k and v cache rows written, positions and out_loc read;
qknorm_rope: as apply_rope, plus the two weights.
"""

import sys

import sglang_provider as sglang_jit
import torch
from harness import (
    COMPILE,
    EAGER,
    LIGER,
    SGLJIT,
    Case,
    Op,
    Provider,
    fixed,
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
_CACHES: dict[tuple[str, float], torch.Tensor] = {}


def cos_sin_cache(device, base: float = 10000.0) -> torch.Tensor:
    key = (str(device), base)
    if key not in _CACHES:
        inv = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
        ang = torch.arange(MAX_POS, dtype=torch.float32)[:, None] * inv[None, :]
        _CACHES[key] = torch.cat((ang.cos(), ang.sin()), dim=-1).to(device)
    return _CACHES[key]


def rope_case(tokens: int, is_neox: bool) -> Case:
    def make_inputs(device):
        return {
            "q": torch.randn(tokens, HQ, D, device=device).to(DTYPE),
            "k": torch.randn(tokens, HK, D, device=device).to(DTYPE),
            "cache": cos_sin_cache(device),
            "pos": torch.randint(0, MAX_POS, (tokens,), device=device),
            "is_neox": is_neox,
        }

    def nb(i):
        return 2 * nbytes(i["q"], i["k"]) + nbytes(i["pos"]) + tokens * D * 4

    style = "neox" if is_neox else "gptj"
    return Case(
        f"T={tokens}", tokens, make_inputs, nb, series=f"{HQ}/{HK} heads x {D} bf16 {style}"
    )


def kv_case(tokens: int) -> Case:
    def make_inputs(device):
        slots = max(2 * tokens, 64)
        return {
            "q": torch.randn(tokens, HQ, D, device=device).to(DTYPE),
            "k": torch.randn(tokens, HK, D, device=device).to(DTYPE),
            "v": torch.randn(tokens, HK, D, device=device).to(DTYPE),
            "k_cache": torch.zeros(slots, HK, D, device=device, dtype=DTYPE),
            "v_cache": torch.zeros(slots, HK, D, device=device, dtype=DTYPE),
            "cache": cos_sin_cache(device),
            "pos": torch.randint(0, MAX_POS, (tokens,), device=device),
            "loc": torch.randperm(slots, device=device)[:tokens],
        }

    def nb(i):
        return (
            2 * nbytes(i["q"])
            + 2 * nbytes(i["k"], i["v"])
            + nbytes(i["pos"], i["loc"])
            + tokens * D * 4
        )

    return Case(f"T={tokens}", tokens, make_inputs, nb, series=f"{HQ}/{HK} heads x {D} bf16 neox")


def qknorm_rope_case(tokens: int, hq: int, hk: int) -> Case:
    def make_inputs(device):
        qkv = torch.randn(tokens, (hq + 2 * hk) * D, device=device).to(DTYPE)
        return {
            "qkv": qkv,
            "q": qkv[:, : hq * D].view(tokens, hq, D),
            "k": qkv[:, hq * D : (hq + hk) * D].view(tokens, hk, D),
            "qw": (1 + 0.1 * torch.randn(D, device=device)).to(DTYPE),
            "kw": (1 + 0.1 * torch.randn(D, device=device)).to(DTYPE),
            "cache": cos_sin_cache(device, QWEN3_BASE),
            "pos": torch.randint(0, MAX_POS, (tokens,), device=device),
            "is_neox": True,
            "hq": hq,
            "hk": hk,
            "base": QWEN3_BASE,
        }

    def nb(i):
        return 2 * nbytes(i["q"], i["k"]) + nbytes(i["qw"], i["kw"], i["pos"]) + tokens * D * 4

    return Case(f"T={tokens}", tokens, make_inputs, nb, series=f"{hq}/{hk} heads x {D} bf16 neox")


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
        # q/k as (1, H, T, D) views of the (T, H, D) tensors: Liger rotates them in place
        return rope_forward(i["q4"], i["k4"], i["cos"], i["sin"])

    return fn


def liger_prepare(i):
    rows = i["cache"].index_select(0, i["pos"])  # [T, 128]: cos | sin (64 each)
    cos, sin = rows[:, : D // 2], rows[:, D // 2 :]
    tokens = i["q"].shape[0]
    return {
        **i,
        "q4": i["q"].view(1, tokens, HQ, D).transpose(1, 2),
        "k4": i["k"].view(1, tokens, HK, D).transpose(1, 2),
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


def ops() -> list[Op]:
    return [
        Op(
            "apply_rope",
            [rope_case(t, True) for t in TOKENS] + [rope_case(t, False) for t in TOKENS],
            providers=[
                Provider(SGLJIT, load_sgljit_rope),
                fixed(torch_rope, EAGER),
                torch_compiled(torch_rope),
                Provider(LIGER, load_liger, liger_prepare),
                sglang_jit.provider(sglang_jit.load_apply_rope),
            ],
        ),
        Op(
            "apply_rope_with_kv_cache",
            [kv_case(t) for t in KV_TOKENS],
            providers=[
                Provider(SGLJIT, load_sgljit_kv),
                Provider("sgljit apply_rope + 2 index_copy_", load_sgljit_unfused),
                fixed(torch_kv, EAGER),
                torch_compiled(torch_kv, COMPILE),
                sglang_jit.provider(
                    sglang_jit.load_apply_rope_with_kv_cache, sglang_jit.prepare_kv_cache_2d
                ),
            ],
        ),
        Op(
            "qknorm_rope",
            [qknorm_rope_case(t, hq, hk) for hq, hk in QK_HEADS for t in QK_TOKENS],
            providers=[
                Provider(SGLJIT, load_sgljit_qknorm_rope),
                Provider("sgljit qknorm + apply_rope", load_sgljit_qknorm_then_rope),
                torch_compiled(torch_qknorm_rope),
                sglang_jit.provider(
                    lambda: sglang_jit.load_fused_qk_norm_rope(EPS), sglang_jit.prepare_qkv_int32
                ),
                Provider(
                    "sglang-jit fused_inplace_qknorm_rope",
                    lambda: sglang_jit.load_qknorm_rope(EPS),
                ),
            ],
        ),
    ]


if __name__ == "__main__":
    sys.exit(run_family("rope", ops()))

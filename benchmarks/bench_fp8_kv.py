"""The fp8 KV-cache write: sgljit's fused rope -> fp8 (-> paged append) vs the unfused sequence and
torch.

    python3 benchmarks/bench_fp8_kv.py                # on a CUDA GPU; writes results/<gpu>/fp8_kv.md
    python3 benchmarks/bench_fp8_kv.py --dry-run      # wiring check on the CPU

Ops:
- ``rope_quantize_fp8_append_paged_kv_cache``: Llama-3-8B's 32/8 heads x 128 (bf16 -> e4m3, neox,
  whole-head rotary), NHD pages of 16 tokens, one appended token per sequence at decode sizes (T =
  batch) and whole prefills of 1024-token sequences; q quantized into a new tensor, k and v into the
  cache. Also timed: the unfused sequence (sgljit ``apply_rope`` on q and k, then a torch quantize
  of q, k and v, then ``index_copy_`` of k and v into the pages' token rows), torch eager and
  torch.compile of the reference.
- ``rope_quantize_fp8`` (MLA): DeepSeek-V3's q 128 heads x (64 rotary + 512 other), k 1 x (64 +
  512), bf16 -> e4m3; the unfused sequence is ``apply_rope`` then a torch quantize of the four parts.

Bytes: inputs read once (bf16), fp8 outputs written once, positions, the cos/sin rows (T x 128 x 4
B resp. T x 64 x 4 B) and, paged, batch indices and positions within the sequence.
The copy floor: q cast to fp8 (one kernel), k and v cast to fp8 and ``index_copy_``-ed into the
pages' rows (k and v's casts make a pass more than the bytes counted: a fifth of the traffic).
"""

import sys

import torch
from harness import (
    COMPILE,
    EAGER,
    SGLJIT,
    Case,
    Op,
    Provider,
    fixed,
    nbytes,
    run_family,
    torch_compiled,
)

HQ, HK, D, MAX_POS, PAGE = 32, 8, 128, 65536, 16
DECODE = (1, 8, 32, 64, 128, 256)
PREFILL_SEQS = (1, 4, 16)  # sequences of 1024 tokens
MLA_TOKENS = (1, 16, 128, 1024, 4096, 16384)
MLA_HEADS, MLA_ROPE, MLA_NOPE = 128, 64, 512
E4M3 = torch.float8_e4m3fn
SCALE_Q, SCALE_KV = 0.5, 0.25

_TABLES: dict[tuple[str, int], torch.Tensor] = {}


def cos_sin_cache(device, rot: int) -> torch.Tensor:
    key = (str(device), rot)
    if key not in _TABLES:
        inv = 1.0 / 10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)
        ang = torch.arange(MAX_POS, dtype=torch.float32)[:, None] * inv[None, :]
        _TABLES[key] = torch.cat((ang.cos(), ang.sin()), dim=-1).to(device)
    return _TABLES[key]


def paged_case(seqs: int, appended: int, context: int) -> Case:
    """``seqs`` sequences of ``context`` tokens after the append, the last ``appended`` each new."""
    tokens = seqs * appended

    def make_inputs(device):
        from sgljit_rope.fp8_kv import get_batch_indices_positions

        pages = -(-context // PAGE)
        num_pages = seqs * pages
        kv_indices = torch.randperm(num_pages, device=device).to(torch.int32)
        kv_indptr = torch.arange(0, num_pages + 1, pages, device=device, dtype=torch.int32)
        append_indptr = torch.arange(0, tokens + 1, appended, device=device, dtype=torch.int32)
        seq_lens = torch.full((seqs,), context, device=device, dtype=torch.int32)
        b, p = get_batch_indices_positions(append_indptr, seq_lens, tokens)
        # the flat token row of each appended token in [num_pages * PAGE] (for the unfused copy)
        rows = (
            kv_indices.long()[kv_indptr.long()[b.long()] + p.long() // PAGE] * PAGE
            + p.long() % PAGE
        )
        return {
            "q": torch.randn(tokens, HQ, D, device=device).to(torch.bfloat16),
            "k": torch.randn(tokens, HK, D, device=device).to(torch.bfloat16),
            "v": torch.randn(tokens, HK, D, device=device).to(torch.bfloat16),
            "cache": cos_sin_cache(device, D),
            "pos": torch.randint(0, MAX_POS, (tokens,), device=device),
            "k_cache": torch.zeros(num_pages, PAGE, HK, D, device=device, dtype=E4M3),
            "v_cache": torch.zeros(num_pages, PAGE, HK, D, device=device, dtype=E4M3),
            "q_out": torch.empty(tokens, HQ, D, device=device, dtype=E4M3),
            "kv_indices": kv_indices,
            "kv_indptr": kv_indptr,
            "b": b,
            "p": p,
            "rows": rows,
        }

    def nb(i):
        written = nbytes(i["q"], i["k"], i["v"]) // 2  # fp8: half of bf16's bytes
        return nbytes(i["q"], i["k"], i["v"], i["pos"], i["b"], i["p"]) + written + tokens * D * 4

    label = f"T={tokens}" if appended == 1 else f"T={tokens} ({seqs}x{appended})"
    kind = "decode" if appended == 1 else "prefill"
    return Case(label, tokens, make_inputs, nb, series=f"{HQ}/{HK} heads x {D} bf16->e4m3 {kind}")


def mla_case(tokens: int) -> Case:
    def make_inputs(device):
        bf16 = torch.bfloat16
        return {
            "q_rope": torch.randn(tokens, MLA_HEADS, MLA_ROPE, device=device).to(bf16),
            "q_nope": torch.randn(tokens, MLA_HEADS, MLA_NOPE, device=device).to(bf16),
            "k_rope": torch.randn(tokens, MLA_ROPE, device=device).to(bf16),
            "k_nope": torch.randn(tokens, MLA_NOPE, device=device).to(bf16),
            "cache": cos_sin_cache(device, MLA_ROPE),
            "pos": torch.randint(0, MAX_POS, (tokens,), device=device),
            "outs": [
                torch.empty(tokens, MLA_HEADS, MLA_ROPE, device=device, dtype=E4M3),
                torch.empty(tokens, MLA_ROPE, device=device, dtype=E4M3),
                torch.empty(tokens, MLA_HEADS, MLA_NOPE, device=device, dtype=E4M3),
                torch.empty(tokens, MLA_NOPE, device=device, dtype=E4M3),
            ],
        }

    def nb(i):
        parts = nbytes(i["q_rope"], i["q_nope"], i["k_rope"], i["k_nope"])
        return parts + parts // 2 + nbytes(i["pos"]) + tokens * MLA_ROPE * 4

    series = f"MLA q {MLA_HEADS}x({MLA_ROPE}+{MLA_NOPE}) bf16->e4m3"
    return Case(f"T={tokens}", tokens, make_inputs, nb, series=series)


# --- providers ------------------------------------------------------------------------------


def load_sgljit_paged():
    from sgljit import ops

    def fn(i):
        ops.rope_quantize_fp8_append_paged_kv_cache(
            i["q"], i["k"], None, None, i["v"], i["cache"], i["pos"], (i["k_cache"], i["v_cache"]),
            i["kv_indices"], i["kv_indptr"], i["b"], i["p"], quant_scale_q=SCALE_Q,
            quant_scale_kv=SCALE_KV, page_size=PAGE, q_rope_out=i["q_out"],
        )  # fmt: skip

    return fn


def _quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.float() * scale).clamp(-448.0, 448.0).to(E4M3)


def _page_copy(cache: torch.Tensor, rows: torch.Tensor, x8: torch.Tensor) -> None:
    """fp8 heads ``x8`` [T, HK, D] into the token rows ``rows`` of the pages (as bytes: index_copy_
    has no fp8 kernel)."""
    cache.view(torch.uint8).view(-1, HK, D).index_copy_(0, rows, x8.view(torch.uint8))


def load_sgljit_unfused():
    """sgljit apply_rope (in place), then a torch quantize of each part, then the page copies."""
    from sgljit import ops

    def fn(i):
        ops.apply_rope(i["q"], i["k"], i["cache"], i["pos"])
        i["q_out"].copy_(_quantize(i["q"], SCALE_Q))
        rows = i["rows"]
        _page_copy(i["k_cache"], rows, _quantize(i["k"], SCALE_KV))
        _page_copy(i["v_cache"], rows, _quantize(i["v"], SCALE_KV))

    return fn


def torch_paged(i):
    from sgljit_rope.reference import rope_torch

    q, k = rope_torch(i["q"], i["k"], i["cache"], i["pos"], True)
    rows = i["rows"]
    _page_copy(i["k_cache"], rows, _quantize(k, SCALE_KV))
    _page_copy(i["v_cache"], rows, _quantize(i["v"], SCALE_KV))
    return _quantize(q, SCALE_Q)


def paged_floor(i):
    i["q_out"].copy_(i["q"])
    _page_copy(i["k_cache"], i["rows"], i["k"].to(E4M3))
    _page_copy(i["v_cache"], i["rows"], i["v"].to(E4M3))


def load_sgljit_mla():
    from sgljit import ops

    def fn(i):
        q_r, k_r, q_n, k_n = i["outs"]
        ops.rope_quantize_fp8(
            i["q_rope"], i["k_rope"], i["q_nope"], i["k_nope"], i["cache"], i["pos"],
            quant_scale_q=SCALE_Q, quant_scale_kv=SCALE_KV, q_rope_out=q_r, k_rope_out=k_r,
            q_nope_out=q_n, k_nope_out=k_n,
        )  # fmt: skip

    return fn


def load_sgljit_mla_unfused():
    from sgljit import ops

    def fn(i):
        q_r, k_r, q_n, k_n = i["outs"]
        ops.apply_rope(i["q_rope"], i["k_rope"].unsqueeze(1), i["cache"], i["pos"])
        q_r.copy_(_quantize(i["q_rope"], SCALE_Q))
        k_r.copy_(_quantize(i["k_rope"], SCALE_KV))
        q_n.copy_(_quantize(i["q_nope"], SCALE_Q))
        k_n.copy_(_quantize(i["k_nope"], SCALE_KV))

    return fn


def torch_mla(i):
    from sgljit_rope.reference import rope_torch

    q, k = rope_torch(i["q_rope"], i["k_rope"].unsqueeze(1), i["cache"], i["pos"], True)
    return (_quantize(q, SCALE_Q), _quantize(k, SCALE_KV), _quantize(i["q_nope"], SCALE_Q),
            _quantize(i["k_nope"], SCALE_KV))  # fmt: skip


def mla_floor(i):
    for x, out in zip((i["q_rope"], i["k_rope"], i["q_nope"], i["k_nope"]), i["outs"], strict=True):
        out.copy_(x)


def ops(grid: str = "default") -> list[Op]:
    paged = [paged_case(t, 1, 4096) for t in DECODE] + [
        paged_case(s, 1024, 1024) for s in PREFILL_SEQS
    ]
    return [
        Op(
            "rope_quantize_fp8_append_paged_kv_cache",
            paged,
            providers=[
                Provider(SGLJIT, load_sgljit_paged),
                Provider("sgljit apply_rope + quantize + index_copy_", load_sgljit_unfused),
                fixed(torch_paged, EAGER),
                torch_compiled(torch_paged, COMPILE),
            ],
            floor=paged_floor,
        ),
        Op(
            "rope_quantize_fp8 (MLA)",
            [mla_case(t) for t in MLA_TOKENS],
            providers=[
                Provider(SGLJIT, load_sgljit_mla),
                Provider("sgljit apply_rope + quantize", load_sgljit_mla_unfused),
                fixed(torch_mla, EAGER),
                torch_compiled(torch_mla, COMPILE),
            ],
            floor=mla_floor,
        ),
    ]


if __name__ == "__main__":
    sys.exit(run_family("fp8_kv", ops))

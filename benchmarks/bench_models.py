"""A whole model with and without ``sgljit.integrations``: HF transformers' Llama at Llama-3-8B's
shapes (random init, nothing downloaded), patched against unpatched, on a CUDA GPU.

    python3 benchmarks/bench_models.py              # writes benchmarks/results/<gpu>/models.md
    python3 benchmarks/bench_models.py --layers 8   # fewer layers (same shapes)
    python3 benchmarks/bench_models.py --dry-run    # a tiny config on the CPU: wiring check only

Measured (HF eager, sdpa attention, batch 1, bf16):
- prefill: one forward over ``--tokens`` tokens (2048), logits of the last token only;
- decode: one token at that context, on a DynamicCache holding the prefill (the step's token is
  cropped off again after each timed call);
each as the median of ``--iters`` calls after ``--warmup`` calls, CUDA events around the call
(host time included: eager decoding is launch-bound, which is what the patch changes).

Agreement: the prefill's logits at every position (patched vs HF, and both against the float32
model with the same weights), and 32 greedy tokens after the prompt — in float32 (token for token)
and bfloat16 (random weights leave near-tied logits that any bf16 rounding can flip; HF's own bf16
against its float32 is printed beside it for that reason).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from harness import command_line, machine_name, now_utc, results_dir, versions

LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=8192,
)
TINY = dict(  # --dry-run
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=512,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=1024,
)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=32, help="decoder layers (Llama-3-8B: 32)")
    ap.add_argument(
        "--tokens", type=int, default=2048, help="prompt length (prefill, decode context)"
    )
    ap.add_argument("--steps", type=int, default=32, help="greedy tokens compared")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", help="results folder (default benchmarks/results/<gpu>)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument(
        "--dry-run", action="store_true", help="tiny config on the CPU, nothing written"
    )
    args, unknown = ap.parse_known_args(argv)  # `nox -s bench` passes the family scripts' options
    if unknown:
        print(f"bench_models: ignoring {' '.join(unknown)}")
    return args


class Timer:
    """Median milliseconds of calls: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device, warmup: int, iters: int):
        self.cuda = device.type == "cuda"
        self.warmup, self.iters = warmup, iters

    def __call__(self, fn, after=None) -> float:
        for _ in range(self.warmup):
            fn()
            if after:
                after()
        times = []
        for _ in range(self.iters):
            self._sync()
            if self.cuda:
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            if after:
                after()
        return statistics.median(times)

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()


@contextlib.contextmanager
def counting_ops(names=("rmsnorm", "gemma_rmsnorm", "apply_rope")):
    """Count the sgljit ops called inside the block (through sgljit.ops, as the patches call them)."""
    import sgljit

    calls: collections.Counter = collections.Counter()
    saved = {name: getattr(sgljit.ops, name) for name in names}

    def spy(name):
        def call(*args, **kwargs):
            calls[name] += 1
            return saved[name](*args, **kwargs)

        return call

    for name in names:
        setattr(sgljit.ops, name, spy(name))
    try:
        yield calls
    finally:
        for name, fn in saved.items():
            setattr(sgljit.ops, name, fn)


def greedy(model, ids, steps: int) -> torch.Tensor:
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=steps,
        min_new_tokens=steps,
        do_sample=False,
    )
    return out[0, ids.shape[1] :]


def same_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many tokens agree before the first difference."""
    diff = (a != b).nonzero()
    return int(diff[0, 0]) if diff.numel() else a.numel()


def measure(model, ids, timer: Timer) -> tuple[tuple[float, float], dict]:
    """(prefill ms, decode ms), and the sgljit ops one decode step calls."""
    prefill_ms = timer(lambda: model(ids, use_cache=False, logits_to_keep=1))
    out = model(ids, use_cache=True, logits_to_keep=1)
    cache, next_token = out.cache, out.logits[:, -1:].argmax(-1)

    def decode():
        model(next_token, cache=cache, use_cache=True)

    def drop_token():
        cache.crop(-1)

    decode_ms = timer(decode, after=drop_token)
    with counting_ops() as calls:
        decode()
        drop_token()
    return (prefill_ms, decode_ms), dict(calls)


def all_logits(model, ids) -> torch.Tensor:
    return model(ids, use_cache=False).logits.float()


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("SKIP bench_models: needs a CUDA GPU; use --dry-run to check the wiring on the CPU")
        return 0
    try:
        import transformers
    except ImportError:
        print("SKIP bench_models: transformers is not installed")
        return 0
    import sgljit.integrations as sgl

    device = torch.device("cpu" if args.dry_run else "cuda")
    shapes = TINY if args.dry_run else LLAMA3_8B
    tokens = min(args.tokens, 64) if args.dry_run else args.tokens
    config = transformers.LlamaConfig(num_hidden_layers=args.layers, **shapes)
    config._attn_implementation = "sdpa"
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (1, tokens), generator=g).to(device)

    # Float32 first (the reference for both dtypes), then the same weights in bf16.
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).eval()
    print(f"built {args.layers} layers in {time.perf_counter() - t0:.1f} s", flush=True)
    agreement = {}
    with torch.inference_mode():
        exact = all_logits(model, ids)
        hf_tokens32 = greedy(model, ids, args.steps)
        sgl.apply_to_llama()
        ours32 = all_logits(model, ids)
        our_tokens32 = greedy(model, ids, args.steps)
        sgl.revert()
        agreement["float32"] = (ours32, exact, our_tokens32, hf_tokens32)
        del ours32
        model.to(torch.bfloat16)
        hf16 = all_logits(model, ids)
        hf_tokens16 = greedy(model, ids, args.steps)
        sgl.apply_to_llama()
        ours16 = all_logits(model, ids)
        our_tokens16 = greedy(model, ids, args.steps)
        sgl.revert()
        agreement["bfloat16"] = (ours16, hf16, our_tokens16, hf_tokens16)

        timer = Timer(device, args.warmup, args.iters)
        timings, counts = {}, {}
        for label, patch in (("HF", False), ("HF + sgljit", True)):
            if patch:
                sgl.apply_to_llama()
            timings[label], counts[label] = measure(model, ids, timer)
            sgl.revert()

    text = report(args, config, tokens, timings, counts, agreement, exact)
    print(text)
    if not args.no_write and (not args.dry_run or args.out):
        out_dir = Path(args.out) if args.out else results_dir(machine_name())
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "models.md").write_text(text)
        print(f"written: {out_dir / 'models.md'}")
    bad = (
        counts["HF + sgljit"].get("rmsnorm", 0) == 0
        or counts["HF + sgljit"].get("apply_rope", 0) == 0
    )
    if bad:
        print("!! the patched model called no sgljit kernel")
    return 1 if bad else 0


def report(args, config, tokens, timings, counts, agreement, exact) -> str:
    v = versions()
    for dist in ("transformers",):
        try:
            v[dist] = version(dist)
        except PackageNotFoundError:
            v[dist] = "missing"
    out = [f"# models — {machine_name()}", ""]
    if args.dry_run:
        out += [
            "**Dry run on the CPU (a tiny config): wiring check only, not benchmark numbers.**",
            "",
        ]
    shape = (
        f"hidden {config.hidden_size}, {config.num_attention_heads} heads / "
        f"{config.num_key_value_heads} KV heads × {config.head_dim}, MLP {config.intermediate_size}, "
        f"vocab {config.vocab_size}"
    )
    out += [
        f"- command: `{command_line()}`",
        f"- date: {now_utc()}",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- model: HF `LlamaForCausalLM`, {'a tiny config' if args.dry_run else 'Llama-3-8B shapes'} "
        f"({shape}), {config.num_hidden_layers} layers, random init, sdpa attention, eager, batch 1",
        "- patch: `sgljit.integrations.apply_to_llama()` (RMSNorm → `rmsnorm`, "
        "`apply_rotary_pos_emb` → `apply_rope`)",
        f"- timing: CUDA events around each call (host time included), {args.warmup} warm-up "
        f"calls, median of {args.iters}",
        "",
        "| phase (bfloat16) | HF ms | HF + sgljit ms | speed-up |",
        "|---|---:|---:|---:|",
    ]
    names = (
        f"prefill {tokens} tokens (last token's logits)",
        f"decode 1 token at {tokens} context",
    )
    for i, name in enumerate(names):
        hf, ours = timings["HF"][i], timings["HF + sgljit"][i]
        out.append(f"| {name} | {hf:.3f} | {ours:.3f} | {hf / ours:.2f}× |")
    patched = counts["HF + sgljit"]
    out += [
        "",
        "sgljit kernels in one patched decode step: "
        + ", ".join(f"{k} × {n}" for k, n in sorted(patched.items()))
        + f" (unpatched: {sum(counts['HF'].values())})",
        "",
        "## Agreement",
        "",
        f"Prefill logits at all {tokens} positions; greedy: tokens equal before the first "
        f"difference, of {args.steps}.",
        "",
        "| dtype | max \\|patched − HF\\| | max \\|HF − fp32\\| | max \\|patched − fp32\\| "
        "| max \\|logit\\| | greedy patched = HF | HF = fp32 | patched = fp32 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    hf_tokens32 = agreement["float32"][3]
    for dtype, (ours, hf, our_tokens, hf_tokens) in agreement.items():
        d = (ours - hf).abs().max().item()
        hf_err = (hf - exact).abs().max().item()
        our_err = (ours - exact).abs().max().item()
        scale = exact.abs().max().item()
        greedy_ours = same_prefix(our_tokens, hf_tokens)
        greedy_hf = same_prefix(hf_tokens, hf_tokens32)
        greedy_exact = same_prefix(our_tokens, hf_tokens32)
        out.append(
            f"| {dtype} | {d:.3g} | {hf_err:.3g} | {our_err:.3g} | {scale:.3g} "
            f"| {greedy_ours}/{args.steps} | {greedy_hf}/{args.steps} "
            f"| {greedy_exact}/{args.steps} |"
        )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())

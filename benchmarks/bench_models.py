"""Whole models with and without ``sgljit.integrations``: HF transformers' Llama, Qwen3 and Gemma 3
at real models' shapes (random init, nothing downloaded), patched against unpatched, on a CUDA GPU.

    python3 benchmarks/bench_models.py                   # writes benchmarks/results/<gpu>/models.md
    python3 benchmarks/bench_models.py --families llama --layers 8 --prefill 1024
    python3 benchmarks/bench_models.py --dry-run         # toy configs on the CPU: wiring check only
    python3 benchmarks/bench_models.py --mlp on          # time the MLP patch only with the rest

Measured (HF eager, sdpa attention, batch 1, bf16), for each family:
- prefill: one forward over each of ``--prefill``'s token counts, logits of the last token only;
- decode: one token at ``--context`` tokens of context, on a DynamicCache holding that prefill (the
  step's token is cropped off again after each timed call);
each as the median of ``--iters`` calls after ``--warmup`` calls, CUDA events around the call
(host time included: eager decoding is launch-bound, which is what the patch changes); HF and
patched alternate, ``--rounds`` times, and each keeps its best round. ``--mlp both`` (the default)
times the patch with and without the MLP's (one gate-and-up GEMM and sgljit's gated activation)
in the same run, so each phase shows whether the MLP patch pays; ``on`` / ``off`` time one.

Agreement (``--agree-tokens`` of prompt): the prefill's logits at every position (patched vs HF,
and both against the float32 model with the same weights), and ``--steps`` greedy tokens after the
prompt — in float32 (token for token) and bfloat16 (random weights leave near-tied logits that any
bf16 rounding can flip; HF's own bf16 against its float32 is printed beside it for that reason).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import inspect
import statistics
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from harness import command_line, machine_name, now_utc, results_dir, versions

# Each family at one real model's shapes (random init, nothing downloaded): its config class, model
# class and shapes. --layers keeps the shapes and cuts the depth.
FAMILIES = {
    "llama": (  # Llama-3-8B
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=128256,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=8192,
        ),
    ),
    "qwen3": (  # Qwen3-8B: per-head q_norm / k_norm too
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(
            hidden_size=4096,
            intermediate_size=12288,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=8192,
        ),
    ),
    "gemma3": (  # Gemma-3-4B's text model: (1 + w) norms, q_norm / k_norm, 256-wide heads
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            hidden_size=2560,
            intermediate_size=10240,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            vocab_size=262208,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=8192,
            sliding_window=1024,
        ),
    ),
}
# --dry-run: the same families at toy sizes on the CPU
TINY = dict(
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=512,
    max_position_embeddings=1024,
)
# Prefill lengths (tokens) timed: one token to long prompts
PREFILL_TOKENS = (1, 16, 128, 1024, 4096)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--families", default=",".join(FAMILIES), help="comma separated, of " + ", ".join(FAMILIES)
    )
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (the shapes stay)")
    ap.add_argument(
        "--prefill",
        default=",".join(map(str, PREFILL_TOKENS)),
        help="prompt lengths timed (comma separated)",
    )
    ap.add_argument("--context", type=int, default=2048, help="the decode step's context")
    ap.add_argument("--agree-tokens", type=int, default=256, help="prompt of the agreement check")
    ap.add_argument("--steps", type=int, default=32, help="greedy tokens compared")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2, help="HF / patched alternations")
    ap.add_argument(
        "--mlp",
        choices=("both", "on", "off"),
        default="both",
        help="time the patched model with the MLP patch, without it, or both (default)",
    )
    ap.add_argument("--out", help="results folder (default benchmarks/results/<gpu>)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument(
        "--dry-run", action="store_true", help="toy configs on the CPU, nothing written"
    )
    args, unknown = ap.parse_known_args(argv)  # `nox -s bench` passes the family scripts' options
    if unknown:
        print(f"bench_models: ignoring {' '.join(unknown)}")
    args.families = [f for f in args.families.split(",") if f]
    bad = [f for f in args.families if f not in FAMILIES]
    if bad:
        ap.error(f"--families: unknown {', '.join(bad)}; expected some of {', '.join(FAMILIES)}")
    args.prefill = [int(t) for t in args.prefill.split(",") if t]
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
def counting_ops(
    names=("rmsnorm", "gemma_rmsnorm", "apply_rope", "silu_and_mul", "gelu_tanh_and_mul"),
):
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


def prefill_ms(model, ids, timer: Timer) -> float:
    return timer(lambda: model(ids, use_cache=False, logits_to_keep=1))


def decode_ms(model, ids, timer: Timer) -> tuple[float, dict]:
    """One decode step at ``ids``' context (ms), and the sgljit ops that step calls."""
    out = model(ids, use_cache=True, logits_to_keep=1)
    # transformers 5.2x names the KV cache `cache`; earlier 5.x releases `past_key_values`
    cache_arg = (
        "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    )
    cache, next_token = getattr(out, cache_arg), out.logits[:, -1:].argmax(-1)

    def decode():
        model(next_token, use_cache=True, **{cache_arg: cache})

    def drop_token():
        cache.crop(-1)

    ms = timer(decode, after=drop_token)
    with counting_ops() as calls:
        decode()
        drop_token()
    return ms, dict(calls)


def all_logits(model, ids) -> torch.Tensor:
    return model(ids, use_cache=False).logits.float()


def build(family: str, layers: int, device: torch.device, tiny: bool):
    import transformers

    config_name, model_name, shapes = FAMILIES[family]
    shapes = {**shapes, **TINY} if tiny else shapes
    config = getattr(transformers, config_name)(num_hidden_layers=layers, **shapes)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        return getattr(transformers, model_name)(config).eval()


PATCHED = "HF + sgljit"  # every patch sgljit has, the MLP's included
NO_MLP = "HF + sgljit, HF's MLP"  # the norms and rope only


def variants(mlp: str) -> list[tuple[str, bool | None]]:
    """(label, the apply_to_model mlp argument or None for HF's model) of each timed model."""
    patched = {"on": [(PATCHED, True)], "off": [(NO_MLP, False)]}
    return [("HF", None), *patched.get(mlp, [(NO_MLP, False), (PATCHED, True)])]


def bench_family(family: str, args, device: torch.device) -> dict:
    """The family's timings, op counts and agreement (see the module docstring)."""
    import sgljit.integrations as sgl

    t0 = time.perf_counter()
    model = build(family, args.layers, device, args.dry_run)
    config = model.config
    print(f"{family}: built {args.layers} layers in {time.perf_counter() - t0:.1f} s", flush=True)
    g = torch.Generator().manual_seed(0)

    def prompt(n: int) -> torch.Tensor:
        return torch.randint(0, config.vocab_size, (1, n), generator=g).to(device)

    agree_ids = prompt(args.agree_tokens)
    agreement = {}
    # The patched model agreement is checked on: the MLP patch too unless it is not timed.
    mlp = args.mlp != "off"
    with torch.inference_mode():
        # Float32 first (the reference for both dtypes), then the same weights in bf16.
        exact = all_logits(model, agree_ids)
        hf_tokens32 = greedy(model, agree_ids, args.steps)
        sgl.apply_to_model(model, mlp=mlp)
        ours32 = all_logits(model, agree_ids)
        our_tokens32 = greedy(model, agree_ids, args.steps)
        sgl.revert()
        agreement["float32"] = (ours32, exact, our_tokens32, hf_tokens32)
        del ours32
        model.to(torch.bfloat16)
        hf16 = all_logits(model, agree_ids)
        hf_tokens16 = greedy(model, agree_ids, args.steps)
        sgl.apply_to_model(model, mlp=mlp)
        ours16 = all_logits(model, agree_ids)
        our_tokens16 = greedy(model, agree_ids, args.steps)
        sgl.revert()
        agreement["bfloat16"] = (ours16, hf16, our_tokens16, hf_tokens16)

        timer = Timer(device, args.warmup, args.iters)
        phases = [(f"prefill {n}", prompt(n)) for n in args.prefill]
        context = prompt(args.context)
        best: dict[tuple[str, str], float] = {}
        counts: dict[str, dict] = {}
        for _ in range(args.rounds):
            for label, patch in variants(args.mlp):
                if patch is not None:
                    sgl.apply_to_model(model, mlp=patch)
                times = {name: prefill_ms(model, ids, timer) for name, ids in phases}
                times[f"decode at {args.context}"], counts[label] = decode_ms(model, context, timer)
                sgl.revert()
                for name, ms in times.items():
                    best[name, label] = min(ms, best.get((name, label), float("inf")))
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "config": config,
        "best": best,
        "counts": counts,
        "agreement": agreement,
        "exact": exact,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("SKIP bench_models: needs a CUDA GPU; use --dry-run to check the wiring on the CPU")
        return 0
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("SKIP bench_models: transformers is not installed")
        return 0
    device = torch.device("cpu" if args.dry_run else "cuda")
    if args.dry_run:
        args.prefill = [min(t, 32) for t in args.prefill]
        args.context, args.agree_tokens = min(args.context, 32), min(args.agree_tokens, 32)
    results = {family: bench_family(family, args, device) for family in args.families}
    text = report(args, results)
    print(text)
    if not args.no_write and (not args.dry_run or args.out):
        out_dir = Path(args.out) if args.out else results_dir(machine_name())
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "models.md").write_text(text)
        print(f"written: {out_dir / 'models.md'}")
    bad = [
        f for f, r in results.items() if not any(r["counts"][k] for k in r["counts"] if k != "HF")
    ]
    for family in bad:
        print(f"!! the patched {family} model called no sgljit kernel")
    return 1 if bad else 0


def report(args, results: dict) -> str:
    v = versions()
    for dist in ("transformers",):
        try:
            v[dist] = version(dist)
        except PackageNotFoundError:
            v[dist] = "missing"
    out = [f"# models — {machine_name()}", ""]
    if args.dry_run:
        out += [
            "**Dry run on the CPU (toy configs): wiring check only, not benchmark numbers.**",
            "",
        ]
    out += [
        f"- command: `{command_line()}`",
        f"- date: {now_utc()}",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- models: HF's, {args.layers} layers at real models' shapes (below), random init, sdpa "
        "attention, eager, batch 1, bf16; patched by `sgljit.integrations.apply_to_model(model)` "
        f"({PATCHED!r}), and with `mlp=False` ({NO_MLP!r}: the MLP left to HF)",
        f"- timing: CUDA events around each call (host time included), {args.warmup} warm-up "
        f"calls, median of {args.iters}; HF and patched alternate {args.rounds} times, best round",
        "",
    ]
    for family, r in results.items():
        c = r["config"]
        out += [
            f"## {family}: {FAMILIES[family][1]}",
            "",
            f"hidden {c.hidden_size}, {c.num_attention_heads} heads / {c.num_key_value_heads} KV "
            f"heads × {c.head_dim}, MLP {c.intermediate_size}, vocab {c.vocab_size}",
            "",
        ]
        labels = [label for label, _ in variants(args.mlp)]
        out += [
            "| phase (bfloat16) | " + " | ".join(f"{label} ms" for label in labels)
            + "".join(f" | {label}: speed-up" for label in labels[1:]) + " |",
            "|---|" + "---:|" * (2 * len(labels) - 1),
        ]  # fmt: skip
        for name in dict.fromkeys(name for name, _ in r["best"]):
            ms = [r["best"][name, label] for label in labels]
            out.append(
                f"| {name} | " + " | ".join(f"{t:.3f}" for t in ms)
                + "".join(f" | {ms[0] / t:.2f}×" for t in ms[1:]) + " |"
            )  # fmt: skip
        out.append("")
        for label in labels[1:]:
            patched = r["counts"][label]
            out.append(
                f"sgljit kernels in one decode step of {label}: "
                + (", ".join(f"{k} × {n}" for k, n in sorted(patched.items())) or "none")
                + "  "
            )
        out += [
            "",
            f"Agreement ({PATCHED if args.mlp != 'off' else NO_MLP}): prefill logits at all "
            f"{args.agree_tokens} positions; greedy: tokens equal before the first difference, "
            f"of {args.steps}.",
            "",
            "| dtype | max \\|patched − HF\\| | max \\|HF − fp32\\| | max \\|patched − fp32\\| "
            "| max \\|logit\\| | greedy patched = HF | HF = fp32 | patched = fp32 |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        exact = r["exact"]
        hf_tokens32 = r["agreement"]["float32"][3]
        for dtype, (ours, hf, our_tokens, hf_tokens) in r["agreement"].items():
            d = (ours - hf).abs().max().item()
            hf_err = (hf - exact).abs().max().item()
            our_err = (ours - exact).abs().max().item()
            scale = exact.abs().max().item()
            out.append(
                f"| {dtype} | {d:.3g} | {hf_err:.3g} | {our_err:.3g} | {scale:.3g} "
                f"| {same_prefix(our_tokens, hf_tokens)}/{args.steps} "
                f"| {same_prefix(hf_tokens, hf_tokens32)}/{args.steps} "
                f"| {same_prefix(our_tokens, hf_tokens32)}/{args.steps} |"
            )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())

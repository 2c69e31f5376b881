"""A/B-compare builds of one family's kernels: each variant is the same benchmark with other nvcc
flags (``SGLJIT_EXTRA_CUDA_CFLAGS``, part of the JIT cache key, so variants build side by side)
and/or other environment variables. Only sgljit is timed.

    python3 benchmarks/ab.py norm --tokens 1,128,65536 --ops rmsnorm \\
        --variant base= --variant "lineinfo=-lineinfo" \\
        --variant "nopdl=@SGLJIT_PDL=0" --rounds 2 --out /tmp/ab.md

A variant is ``NAME=FLAGS``; words of FLAGS that start with ``@`` are ``KEY=VALUE`` environment
settings instead of nvcc flags. First every variant is built in parallel (the benchmark on the
smallest token count, ``--jobs`` at a time; other arguments go to the benchmark), then the variants are timed one after another, all of
them ``--rounds`` times in turn; a case's figure is its best round (the least disturbed). The table
gives each variant's µs and its ratio to the first variant.

``--with-provider NAME`` (repeatable, e.g. ``sglang-jit``) is built with the first variant and timed
in its process of every round, case by case beside it, as a column of its own; the last column is then
the peer's µs over the fastest variant's (a speed ratio: above 1, sgljit's best is ahead). ``--out``
is rewritten after every variant's run, so a run stopped by a time limit keeps its finished cells.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_variant(text: str) -> tuple[str, str, dict[str, str]]:
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--variant expects NAME=FLAGS, got {text!r}")
    flags, env = [], {}
    for word in rest.split():
        if word.startswith("@"):
            key, eq, value = word[1:].partition("=")
            if not eq or not key:
                raise argparse.ArgumentTypeError(f"--variant {name}: {word!r} is not @KEY=VALUE")
            env[key] = value
        else:
            flags.append(word)
    return name, " ".join(flags), env


def bench_command(family: str, args: list[str], provider: str) -> list[str]:
    """``provider``: one name, or several comma separated (the peers beside the first variant)."""
    return [
        sys.executable,
        str(HERE / f"bench_{family}.py"),
        *args,
        "--providers",
        provider,
        "--no-floor",  # its cells would be read as the provider's: one time per (op, case)
        "--no-write",
    ]


def variant_env(flags: str, env: dict[str, str]) -> dict[str, str]:
    out = dict(os.environ)
    base = out.get("SGLJIT_EXTRA_CUDA_CFLAGS", "")
    out["SGLJIT_EXTRA_CUDA_CFLAGS"] = f"{base} {flags}".strip()
    out.update(env)
    return out


def run(cmd: list[str], env: dict[str, str], label: str) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"ab: {label} failed (exit {proc.returncode}): {' '.join(cmd)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("family", help="activation, norm, rope, quant_fp8, timestep_embedding")
    ap.add_argument(
        "--variant", action="append", type=parse_variant, required=True, help="NAME=FLAGS"
    )
    ap.add_argument("--tokens", required=True, help="token counts (comma separated)")
    ap.add_argument("--ops", help="only these ops (comma separated)")
    ap.add_argument("--ceiling", type=float, default=4290.0, help="GB/s (not measured here)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--out", help="also write the table (markdown) here")
    ap.add_argument("--provider", default="sgljit", help="the provider timed (default sgljit)")
    ap.add_argument(
        "--build-precompile",
        type=int,
        default=0,
        metavar="JOBS",
        help="the builds' --precompile: each variant's modules built in JOBS processes",
    )
    ap.add_argument(
        "--with-provider",
        action="append",
        default=[],
        metavar="NAME",
        help="also time this peer (e.g. sglang-jit) in the first variant's run, as a column",
    )
    args, passthrough = ap.parse_known_args(argv)  # e.g. --dry-run, --rep: given to the benchmark

    common = ["--tokens", args.tokens, "--ceiling", str(args.ceiling), *passthrough]
    if args.ops:
        common += ["--ops", args.ops]
    smallest = str(min(int(t) for t in args.tokens.split(",")))
    warm = [a if a != args.tokens else smallest for a in common] + ["--rep", "1"]
    if args.build_precompile:
        warm += ["--precompile", str(args.build_precompile)]
    peers = [p for p in args.with_provider if p != args.provider]

    def build(i: int) -> None:
        name, flags, env = args.variant[i]
        providers = ",".join([args.provider, *peers] if i == 0 else [args.provider])
        run(bench_command(args.family, warm, providers), variant_env(flags, env), f"build {name}")

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(build, range(len(args.variant))))
    print(f"ab: built {len(args.variant)} variant(s)", flush=True)

    best: dict[tuple[str, str], dict[str, float | None]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for i, (name, flags, env) in enumerate(args.variant):
                path = Path(tmp) / f"{name}.json"
                path.unlink(missing_ok=True)
                providers = ",".join([args.provider, *peers] if i == 0 else [args.provider])
                run(
                    bench_command(args.family, [*common, "--json", str(path)], providers),
                    variant_env(flags, env),
                    name,
                )
                if not path.exists():
                    raise SystemExit(
                        f"ab: {name}: the benchmark timed nothing (no CUDA GPU? try --dry-run)"
                    )
                for cell in json.loads(path.read_text()):
                    column = name if cell["provider"] == args.provider else cell["provider"]
                    row = best.setdefault((cell["op"], cell["case"]), {})
                    us = cell["us"]
                    # each cell as it comes: a run stopped by a time limit keeps what it timed
                    print(f"ab: {column} | {cell['op']} | {cell['case']} | {us}", flush=True)
                    old = row.get(column)
                    row[column] = us if old is None or (us is not None and us < old) else old
                print(f"ab: round {rnd + 1} {name} done", flush=True)
                if args.out and best:
                    Path(args.out).write_text(table(args, peers, best))

    if not best:
        raise SystemExit(
            f"ab: no case of {args.family} was timed for provider {args.provider!r} "
            "(check --ops, --tokens, --provider)"
        )
    text = table(args, peers, best)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def table(
    args: argparse.Namespace, peers: list[str], best: dict[tuple[str, str], dict[str, float | None]]
) -> str:
    """The markdown table: a column per variant, then per peer; with peers, the last columns
    are each peer's µs over the fastest variant's."""
    names = [v[0] for v in args.variant]
    columns = [*names, *peers]
    lines = [
        f"A/B `{args.family}` ({args.rounds} round(s), best of rounds, µs; ratio to `{names[0]}`)",
        "",
        "| op | case | " + " | ".join([*columns, *(f"{p} ÷ best (speed)" for p in peers)]) + " |",
        "|---|---|" + "---:|" * (len(columns) + len(peers)),
    ]
    for (op, case), row in best.items():
        base = row.get(names[0])
        cells = []
        for n in columns:
            us = row.get(n)
            if us is None:
                cells.append("failed" if n in row or n == names[0] else "–")
            elif n == names[0] or not base:
                cells.append(f"{us:.2f}")
            else:
                cells.append(f"{us:.2f} ({us / base:.3f})")
        timed = [(row[n], n) for n in names if row.get(n) is not None]
        for p in peers:
            peer = row.get(p)
            if peer is None or not timed:
                cells.append("–")
            else:
                us, n = min(timed)
                cells.append(f"{peer / us:.3f} (`{n}`)")
        lines.append(f"| {op} | {case} | " + " | ".join(cells) + " |")
    legend = [
        f"- `{n}`: `{f or '(defaults)'}`" + (f" env {e}" if e else "") for n, f, e in args.variant
    ]
    legend += [f"- `{p}`: timed in `{names[0]}`'s run, case by case beside it" for p in peers]
    return "\n".join([*lines, "", *legend]) + "\n"


if __name__ == "__main__":
    sys.exit(main())

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
    args, passthrough = ap.parse_known_args(argv)  # e.g. --dry-run, --rep: given to the benchmark

    common = ["--tokens", args.tokens, "--ceiling", str(args.ceiling), *passthrough]
    if args.ops:
        common += ["--ops", args.ops]
    smallest = str(min(int(t) for t in args.tokens.split(",")))
    warm = [a if a != args.tokens else smallest for a in common] + ["--rep", "1"]

    with ThreadPoolExecutor(args.jobs) as pool:
        list(
            pool.map(
                lambda v: run(
                    bench_command(args.family, warm, args.provider),
                    variant_env(v[1], v[2]),
                    f"build {v[0]}",
                ),
                args.variant,
            )
        )
    print(f"ab: built {len(args.variant)} variant(s)", flush=True)

    best: dict[tuple[str, str], dict[str, float | None]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for name, flags, env in args.variant:
                path = Path(tmp) / f"{name}.json"
                path.unlink(missing_ok=True)
                run(
                    bench_command(args.family, [*common, "--json", str(path)], args.provider),
                    variant_env(flags, env),
                    name,
                )
                if not path.exists():
                    raise SystemExit(
                        f"ab: {name}: the benchmark timed nothing (no CUDA GPU? try --dry-run)"
                    )
                for cell in json.loads(path.read_text()):
                    row = best.setdefault((cell["op"], cell["case"]), {})
                    us = cell["us"]
                    # each cell as it comes: a run stopped by a time limit keeps what it timed
                    print(f"ab: {name} | {cell['op']} | {cell['case']} | {us}", flush=True)
                    old = row.get(name)
                    row[name] = us if old is None or (us is not None and us < old) else old
                print(f"ab: round {rnd + 1} {name} done", flush=True)

    if not best:
        raise SystemExit(
            f"ab: no case of {args.family} was timed for provider {args.provider!r} "
            "(check --ops, --tokens, --provider)"
        )
    names = [v[0] for v in args.variant]
    lines = [
        f"A/B `{args.family}` ({args.rounds} round(s), best of rounds, µs; ratio to `{names[0]}`)",
        "",
        "| op | case | " + " | ".join(f"{n}" for n in names) + " |",
        "|---|---|" + "---:|" * len(names),
    ]
    for (op, case), row in best.items():
        base = row.get(names[0])
        cells = []
        for n in names:
            us = row.get(n)
            if us is None:
                cells.append("failed")
            elif n == names[0] or not base:
                cells.append(f"{us:.2f}")
            else:
                cells.append(f"{us:.2f} ({us / base:.3f})")
        lines.append(f"| {op} | {case} | " + " | ".join(cells) + " |")
    legend = [
        f"- `{n}`: `{f or '(defaults)'}`" + (f" env {e}" if e else "") for n, f, e in args.variant
    ]
    text = "\n".join([*lines, "", *legend]) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

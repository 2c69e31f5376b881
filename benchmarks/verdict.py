"""Where sgljit stands on every cell of one or more benchmark runs, by the acceptance rule.

    python3 benchmarks/bench_norm.py --grid models --series H=4096 --json a.json   # machine start 1
    python3 benchmarks/bench_norm.py --grid models --series H=4096 --json b.json   # machine start 2
    python3 benchmarks/verdict.py a.json b.json --out verdict.md

A second machine start need only time the cells the first did not settle (``--rerun`` lists them,
a bench's ``--cases`` takes the list): ``verdict.py a.json --rerun r.json``, then ``bench_norm.py
--grid models --cases r.json --json b.json``, then ``verdict.py a.json b.json``.

The rule, per (family, op, case): sgljit against the best peer (every provider but sgljit's own
variants and the copy floor) is a win at ≥ 1.00×, a tie at ≥ ``harness.MATCH_RATIO`` only if every
run holds it, behind otherwise — unless the peer is at the copy floor (within
``harness.AT_FLOOR_TOLERANCE`` of the floor's time in that run), which the verdict names. Where a
call moves more than twice the L2, sgljit must also reach ``CEILING_SHARE`` of the run's streaming
ceiling, unless it is at the copy floor there (the op's bytes cannot move faster in its access
pattern), which the verdict names. Runs of parts of a grid (``--series``, ``--ops``) combine: each
cell is judged on the runs that have it. Exits 1 when a cell is behind without the floor or below
the ceiling share off the floor.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import AT_FLOOR_TOLERANCE, FLOOR, MATCH_RATIO, SGLJIT, gbps, peer_at_floor

# Share of the streaming ceiling a call moving more than 2x the L2 must reach (issue 25's target).
CEILING_SHARE = 0.95


@dataclass
class RunCell:
    """One run's view of a case: sgljit's µs, the best peer, the floor, the bytes, the ceiling."""

    subject_us: float
    peer: str
    peer_us: float
    floor_us: float | None
    bytes: int
    ceiling_gbps: float | None
    l2_bytes: int

    @property
    def ratio(self) -> float:
        return self.peer_us / self.subject_us

    @property
    def peer_at_floor(self) -> bool:
        return peer_at_floor(self.peer_us, self.floor_us)

    @property
    def subject_at_floor(self) -> bool:
        """sgljit moves the bytes as fast as the copy floor (or faster), within the tolerance."""
        return self.floor_us is not None and self.subject_us <= self.floor_us * (
            1 + AT_FLOOR_TOLERANCE
        )

    @property
    def ceiling_share(self) -> float | None:
        """sgljit's share of the ceiling where the call moves more than 2x the L2, else None."""
        if not self.ceiling_gbps or not self.l2_bytes or self.bytes <= 2 * self.l2_bytes:
            return None
        return gbps(self.bytes, self.subject_us) / self.ceiling_gbps


@dataclass
class Verdict:
    family: str
    op: str
    case: str
    runs: list[RunCell] = field(default_factory=list)

    @property
    def worst(self) -> RunCell:
        return min(self.runs, key=lambda r: r.ratio)

    @property
    def status(self) -> str:
        worst = self.worst
        if worst.ratio >= 1.0:
            return "win"
        if worst.ratio >= MATCH_RATIO:
            return "tie" if len(self.runs) >= 2 else "tie, one run"
        return "behind, peer at the copy floor" if worst.peer_at_floor else "behind"

    def _short_runs(self) -> list[RunCell]:
        return [
            r for r in self.runs if r.ceiling_share is not None and r.ceiling_share < CEILING_SHARE
        ]

    @property
    def below_ceiling(self) -> bool:
        return bool(self._short_runs())

    @property
    def below_ceiling_at_floor(self) -> bool:
        """Below the ceiling share where the copy floor is too: in every run short of the share,
        sgljit is at the floor (the bytes cannot move faster in that access pattern)."""
        short = self._short_runs()
        return bool(short) and all(r.subject_at_floor for r in short)


def is_peer(provider: str) -> bool:
    """Other systems: not sgljit, not its own variants (e.g. sgljit-unfused), not the floor."""
    return provider != FLOOR and not provider.startswith(SGLJIT)


def collect(records_per_run: list[list[dict]]) -> list[Verdict]:
    """The verdicts of every case timed by sgljit and at least one peer in some run."""
    verdicts: dict[tuple[str, str, str], Verdict] = {}
    for records in records_per_run:
        cases: dict[tuple[str, str, str], dict[str, dict]] = defaultdict(dict)
        for r in records:
            cases[(r["family"], r["op"], r["case"])][r["provider"]] = r
        for key, cells in cases.items():
            subject = cells.get(SGLJIT)
            peers = [c for p, c in cells.items() if is_peer(p) and c.get("us")]
            if not subject or not subject.get("us") or not peers:
                continue
            best = min(peers, key=lambda c: c["us"])
            floor = cells.get(FLOOR)
            run = RunCell(
                subject_us=subject["us"],
                peer=best["provider"],
                peer_us=best["us"],
                floor_us=floor["us"] if floor and floor.get("us") else None,
                bytes=int(subject.get("bytes") or 0),
                ceiling_gbps=subject.get("ceiling_gbps"),
                l2_bytes=int(subject.get("l2_bytes") or 0),
            )
            verdicts.setdefault(key, Verdict(*key)).runs.append(run)
    return list(verdicts.values())


def report(verdicts: list[Verdict], sources: list[str]) -> str:
    lines = [
        "# Verdict: sgljit against the best peer, cell by cell",
        "",
        f"- runs: {', '.join(f'`{s}`' for s in sources)}",
        f"- win ≥ 1.00×; tie ≥ {MATCH_RATIO}× on two runs or more; behind otherwise, unless the "
        f"peer is within {AT_FLOOR_TOLERANCE:.0%} of the copy floor; calls moving more than 2× the "
        f"L2 must reach {CEILING_SHARE:.0%} of the ceiling unless sgljit is at the copy floor",
        "",
        "| family | op | cells | win | tie | tie, one run | behind at floor | behind | "
        f"< {CEILING_SHARE:.0%} of ceiling | of them sgljit at floor |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_op: dict[tuple[str, str], list[Verdict]] = defaultdict(list)
    for v in verdicts:
        by_op[(v.family, v.op)].append(v)
    for (family, op), vs in sorted(by_op.items()):
        count = defaultdict(int)
        for v in vs:
            count[v.status] += 1
        lines.append(
            f"| {family} | {op} | {len(vs)} | {count['win']} | {count['tie']} | "
            f"{count['tie, one run']} | {count['behind, peer at the copy floor']} | "
            f"{count['behind']} | {sum(v.below_ceiling for v in vs)} | "
            f"{sum(v.below_ceiling_at_floor for v in vs)} |"
        )
    flagged = [v for v in verdicts if v.status != "win" or v.below_ceiling]
    if flagged:
        lines += [
            "",
            "## Cells short of a win or of the ceiling share (worst run)",
            "",
            "| family | op | case | status | sgljit µs | best peer | peer µs | ratio | "
            "floor µs | % of ceiling | runs |",
            "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|",
        ]
        for v in sorted(flagged, key=lambda v: v.worst.ratio):
            w = v.worst
            shares = [s for s in (r.ceiling_share for r in v.runs) if s is not None]
            share = f"{100 * min(shares):.0f}%" if shares else "–"
            floor = f"{w.floor_us:.2f}" if w.floor_us is not None else "–"
            status = v.status + (", sgljit at the copy floor" if v.below_ceiling_at_floor else "")
            lines.append(
                f"| {v.family} | {v.op} | {v.case} | {status} | {w.subject_us:.2f} | {w.peer} | "
                f"{w.peer_us:.2f} | {w.ratio:.3f} | {floor} | {share} | {len(v.runs)} |"
            )
    return "\n".join(lines) + "\n"


def failing(verdicts: list[Verdict]) -> list[Verdict]:
    """Cells the rule does not accept (yet): behind a peer that is not at the floor, a tie seen on
    one run only, or below the ceiling share where sgljit is not at the copy floor."""
    return [
        v
        for v in verdicts
        if v.status in ("behind", "tie, one run")
        or (v.below_ceiling and not v.below_ceiling_at_floor)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="JSON files written by a family bench's --json")
    ap.add_argument("--out", help="also write the report to this markdown file")
    ap.add_argument(
        "--rerun",
        help="also write the cells not accepted yet (a tie seen on one run, behind, below the "
        "ceiling share) to this JSON file: a bench's --cases times only those",
    )
    args = ap.parse_args(argv)
    verdicts = collect([json.loads(Path(p).read_text()) for p in args.runs])
    if not verdicts:
        print("verdict: no case has both an sgljit time and a peer's time in these runs")
        return 2
    text = report(verdicts, args.runs)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    bad = failing(verdicts)
    if args.rerun:
        records = [{"family": v.family, "op": v.op, "case": v.case} for v in bad]
        Path(args.rerun).write_text(json.dumps(records, indent=1) + "\n")
    print(f"verdict: {len(verdicts)} cells, {len(bad)} not accepted")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

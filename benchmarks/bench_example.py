"""Smoke test of the harness with torch ops only (no sgljit kernel needed).

    python3 benchmarks/bench_example.py              # on a CUDA GPU
    python3 benchmarks/bench_example.py --dry-run    # wiring check on the CPU

Op ``add``: ``out = a + b``. The subject is torch's destination-passing
``torch.add(a, b, out=out)`` (as sgljit ops are); ``torch.compile`` of ``a + b`` and a provider that
is never installed (to show how a missing provider is reported) are the others; the subject's own
call is the copy floor (it moves the op's bytes and does nothing else).
"""

import sys

import torch
from harness import Case, Op, Provider, fixed, nbytes, run_family, torch_compiled

TOKENS = (1, 16, 128, 1024, 8192, 65536)


def make_case(tokens: int, hidden: int, dtype: torch.dtype) -> Case:
    def make_inputs(device):
        a = torch.randn(tokens, hidden, dtype=dtype, device=device)
        b = torch.randn(tokens, hidden, dtype=dtype, device=device)
        return {"a": a, "b": b, "out": torch.empty_like(a)}

    return Case(
        label=f"T={tokens}",
        tokens=tokens,
        make_inputs=make_inputs,
        bytes=lambda i: nbytes(i["a"], i["b"], i["out"]),  # two reads, one write
        series=f"H={hidden} {str(dtype).removeprefix('torch.')}",
    )


def add_out(i):
    """torch.add(a, b, out=out): one kernel that reads a and b and writes out, nothing else (the op
    is its own copy floor)."""
    torch.add(i["a"], i["b"], out=i["out"])


def add_eager(i):
    return i["a"] + i["b"]


def load_missing():
    import sgljit_example_not_a_package  # noqa: F401  (never installed: shows "missing: ...")

    raise AssertionError("unreachable")


def ops() -> list[Op]:
    cases = [make_case(t, 4096, torch.bfloat16) for t in TOKENS]
    cases += [make_case(t, 1024, torch.float32) for t in TOKENS]
    return [
        Op(
            "add",
            cases,
            providers=[
                fixed(add_out, "torch (out=)"),
                fixed(add_eager, "torch"),
                torch_compiled(add_eager),
                Provider("not-installed", load_missing),
            ],
            subject="torch (out=)",
            floor=add_out,
        )
    ]


if __name__ == "__main__":
    sys.exit(run_family("example", ops()))

"""What README.md tells a new user to run, run as written where this machine can."""

from __future__ import annotations

import re
from pathlib import Path

from .conftest import run_python

README = (Path(__file__).parents[1] / "README.md").read_text()


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.MULTILINE | re.DOTALL)


def test_the_first_example_runs_on_a_cpu():
    """The first example needs no GPU and no SYCL runtime (the PyTorch reference)."""
    first = code_blocks("python")[0]
    assert '"cuda"' not in first.split("#")[0]
    result = run_python(
        "import os; os.environ.pop('SGLJIT_BACKEND', None)\n" + first + "\nprint(y.shape, y.dtype)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["torch.Size([128,", "4096])", "torch.bfloat16"]

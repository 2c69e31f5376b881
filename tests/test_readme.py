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


CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def test_install_cannot_be_followed_into_cuda_torch_on_a_cpu():
    """Read top to bottom, the Install section installs PyTorch's CPU build before any command
    that would install sgljit (whose plain `torch` requirement pulls the CUDA build)."""
    section = README.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    commands = [
        line.strip()
        for block in re.findall(r"^```bash\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
        for line in block.replace("\\\n", " ").splitlines()
        if re.match(r"\s*pip (install|wheel)\b", line)
    ]
    installs_sgljit = [
        i
        for i, c in enumerate(commands)
        if c.startswith("pip install") and re.search(r"\./core|\./plugins|\bsgljit-", c)
    ]
    assert installs_sgljit, commands
    first_cpu_torch = next(i for i, c in enumerate(commands) if c.startswith(CPU_TORCH))
    assert first_cpu_torch < installs_sgljit[0], commands
    # and the prose before the first command says when to run it
    before = section.split("```bash", 1)[0]
    assert "without an NVIDIA GPU" in before or "without an NVIDIA GPU" in commands[0]

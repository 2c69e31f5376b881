"""sglang's own test of its activation module (sglang 0.5.13's ``jit_kernel/tests/test_activation.py``),
unmodified, against ``sgljit.compat.sglang.activation`` on every backend this machine has (see
``sglang_suite`` for how).

Every case passes: the gated activations (their out= form, every dtype), the MoE expert filter (rows
of tokens routed to expert -1 left as they were, bit for bit the unfiltered rows elsewhere) and
``relu2``, which the compat module computes with PyTorch (not an sgljit op). On the CPU sglang's CI
ranges (73 cases), on CUDA its full ones (427).
"""

from __future__ import annotations

import pytest

from ..plugins.common import BACKENDS
from . import sglang_suite

FILE = "test_activation.py"
MODULES = {"sglang.jit_kernel.activation": "sgljit.compat.sglang.activation"}
PASSED = {"cpu": 73, "cuda": 427}


@pytest.fixture(scope="session")
def sglang_tests(request, tmp_path_factory):
    return sglang_suite.sglang_files(request, tmp_path_factory, [f"tests/{FILE}"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_sglang_activation_tests_pass(backend, sglang_tests, tmp_path, cache_dir):
    on_cpu = backend != "cuda"
    outcome = sglang_suite.run_suite(
        sglang_tests / FILE,
        backend,
        tmp_path,
        modules=MODULES,
        ci_ranges=on_cpu,
        env={"SGLJIT_CACHE_DIR": str(cache_dir)},
    )
    sglang_suite.assert_passes(outcome, passed=PASSED["cpu" if on_cpu else "cuda"])
    # the cases reached sgljit's kernels of that backend, not a fallback (the cache started empty)
    built = sorted(p.name for p in cache_dir.glob("*/*/activation_*"))
    if backend == "reference":
        assert not built, built
    else:
        assert any(cache_dir.glob(f"{backend}/*/activation_*")), built

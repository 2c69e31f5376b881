"""sglang's own rope tests, unmodified, run against ``sgljit.compat`` (see ``sglang_suite`` for
how the files are obtained and run).

sglang 0.5.13's ``jit_kernel/tests/test_rope.py`` and ``test_pos_enc.py`` are taken as they are
(their sha256 is checked). Their imports resolve to sgljit: ``sglang.jit_kernel.rope`` to
``sgljit.compat.sglang.rope`` (the module under test); ``flashinfer.rope`` (test_rope.py's oracle,
what sglang compares its kernels with), where FlashInfer is not installed, to
``sgljit.compat.flashinfer.rope`` run on sgljit's PyTorch reference backend; ``triton``, where it
cannot run (no GPU, or not installed), to a stand-in whose ``assert_close`` is triton's test and
whose ``@triton.jit`` kernels do nothing (test_pos_enc's "burn" kernel, which only keeps the GPU
busy to test stream ordering).

Backends: ``cuda`` runs the files as written on a GPU, with sglang's full ranges. ``reference``
and ``sycl`` run them on the CPU (sgljit's PyTorch reference, or its SYCL kernels on the SYCL CPU
device) with sglang's CI ranges: the device ``"cuda"`` the files name is the CPU in every torch
call, and ``torch.cuda``'s streams and ``synchronize`` do nothing (CPU work is synchronous). Stream
ordering is therefore only tested on a GPU, and on ``reference`` test_rope.py compares the
reference with itself (it still checks the compat module's argument handling).

What passes (every backend): every test of both files, except the skips in ``EXPECTED_SKIPS``,
which are sglang's own. Any other skip, failure or error fails this test.
"""

from __future__ import annotations

import hashlib

import pytest

from ..plugins.common import BACKENDS
from . import sglang_suite

pytestmark = pytest.mark.slow

# The files validated here, by sha256: another version's tests are another test.
FILES = {
    "test_rope.py": "9c326bbb353ea4ae959b0259e04df48467109c75f15bdcee77189cc22b5f794f",
    "test_pos_enc.py": "d04f013e036e7cd989635a0d7fc196377787ee6ed30ae229445fa06060a5a06e",
}
MODULES = {"sglang.jit_kernel.rope": "sgljit.compat.sglang.rope"}
EXPECTED_SKIPS = {
    # it times sglang's AOT sgl_kernel, which is not installed
    "test_pos_enc.py::test_performance": "SglKernelRotaryEmbedding is not available",
    # the cases with head_dim < rope_dim
    "test_rope.py::test_partial_rope": "Invalid config: head_dim must be >= rope_dim",
}


@pytest.fixture(scope="session")
def sglang_tests(request, tmp_path_factory):
    tests = sglang_suite.sglang_files(request, tmp_path_factory, [f"tests/{n}" for n in FILES])
    for name, sha256 in FILES.items():
        assert hashlib.sha256((tests / name).read_bytes()).hexdigest() == sha256, (
            f"{name} is not the file validated"
        )
    return tests


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(FILES))
def test_sglang_rope_tests_pass_on_sgljit_compat(sglang_tests, name, backend, tmp_path):
    outcome = sglang_suite.run_suite(
        sglang_tests / name, backend, tmp_path, modules=MODULES, ci_ranges=backend != "cuda"
    )
    sglang_suite.assert_passes(outcome, EXPECTED_SKIPS)

"""sglang's own jit_kernel tests of the norm family (sglang 0.5.13: test_rmsnorm.py,
test_fused_add_rmsnorm.py, test_qknorm.py, test_qknorm_across_heads.py, test_rmsnorm_hf.py),
unmodified, against ``sgljit.compat.sglang.norm`` and ``.rmsnorm_hf`` on every backend this machine
has (see ``sglang_suite`` for how, README.md for the results and what does not apply)."""

from __future__ import annotations

import pytest

from ..plugins.common import BACKENDS
from . import sglang_suite

FILES = (
    "test_rmsnorm.py",
    "test_fused_add_rmsnorm.py",
    "test_qknorm.py",
    "test_qknorm_across_heads.py",
    "test_rmsnorm_hf.py",
)
# The modules they import, and the sgljit.compat modules that stand for them.
MODULES = {
    "sglang.jit_kernel.norm": "sgljit.compat.sglang.norm",
    "sglang.jit_kernel.rmsnorm_hf": "sgljit.compat.sglang.rmsnorm_hf",
}
# Tests of those files that do not apply to sgljit, and why.
NOT_APPLICABLE = {
    "test_rmsnorm.py::test_rmsnorm_kernel_dispatch": (
        "asserts which of sglang's own CUDA kernel classes (the private _rmsnorm_kernel_class) a "
        "width takes: sglang's implementation, not its interface"
    ),
}


@pytest.fixture(scope="session")
def sglang_tests(request, tmp_path_factory):
    return sglang_suite.sglang_files(request, tmp_path_factory, [f"tests/{f}" for f in FILES])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", FILES)
def test_sglang_norm_tests_pass(name, backend, sglang_tests, tmp_path):
    outcome = sglang_suite.run_suite(
        sglang_tests / name,
        backend,
        tmp_path,
        modules=MODULES,
        ci_ranges=True,  # on CUDA too
        deselect=tuple(NOT_APPLICABLE),
    )
    sglang_suite.assert_passes(outcome)

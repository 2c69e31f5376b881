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
# Tests of those files that do not apply to sgljit, and why.
NOT_APPLICABLE = {
    "test_rmsnorm.py::test_rmsnorm_kernel_dispatch": (
        "asserts which of sglang's own CUDA kernel classes (the private _rmsnorm_kernel_class) a "
        "width takes: sglang's implementation, not its interface"
    ),
}


@pytest.fixture(scope="session")
def sglang_norm_tests(request, tmp_path_factory):
    """The test files, copied from the sglang wheel (see sglang_suite.sglang_files)."""
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    where = f"sglang-{sglang_suite.SGLANG_VERSION}"
    folder = cache.mkdir(where) if cache is not None else tmp_path_factory.mktemp(where)
    try:
        return sglang_suite.sglang_files(
            [f"tests/{f}" for f in FILES], folder, tmp_path_factory.mktemp("sglang_norm_tests")
        )
    except sglang_suite.Unavailable as err:
        pytest.skip(f"sglang {sglang_suite.SGLANG_VERSION}'s test files are not available: {err}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", FILES)
def test_sglang_norm_tests_pass(name, backend, sglang_norm_tests, tmp_path):
    deselect = tuple(k for k in NOT_APPLICABLE if k.startswith(f"{name}::"))
    outcome = sglang_suite.run_suite(
        [sglang_norm_tests / name],
        device="cuda" if backend == "cuda" else "cpu",
        backend=None if backend == "cuda" else backend,
        workdir=tmp_path,
        deselect=deselect,
    )
    summary = f"{name} on {backend}: {outcome.passed} passed, {outcome.failed} failed"
    print(f"{summary}, {outcome.skipped} skipped, {len(deselect)} not applicable deselected")
    assert outcome.returncode == 0 and outcome.failed == 0, f"{summary}\n{outcome.output[-6000:]}"
    assert outcome.passed > 0, f"{summary}: nothing ran\n{outcome.output[-3000:]}"

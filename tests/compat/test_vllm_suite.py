"""vLLM's own kernel tests of the norm, rotary and fp8 call sites (vLLM 0.33.0's
``tests/kernels/core/test_layernorm.py``, ``test_pos_encoding.py``, ``test_rotary_embedding.py``,
vendored unmodified in ``tests/compat/vllm/``), run against ``sgljit.compat.vllm`` on every
backend this machine has (see ``vllm_suite`` for how their imports resolve).

On the CPU backends (the reference, and SYCL on the CPU device) a deterministic selection of about
one case in ``SAMPLE[file]`` runs (``vllm_suite.sample``: a CRC-32 of the node id, plus the first
case of every parameter value left out), so the two runs take minutes, not an hour;
``SGLJIT_COMPAT_SAMPLE=1`` runs every case. On CUDA every case runs.
"""

from __future__ import annotations

import hashlib
import os

import pytest

from ..plugins.common import BACKENDS
from . import sglang_suite, vllm_suite

pytestmark = pytest.mark.slow

# The files validated here, by sha256: another version's tests are another test.
FILES = {
    "test_layernorm.py": "13e87255cc2ee2ce693f3f3befcba0f3ef4890686bb1da03fa09e2459b293eec",
    "test_pos_encoding.py": "b321234af714c54b2c50fdbfc7808daafacb25b3a918ce5709c3d7fb2887b752",
    "test_rotary_embedding.py": "8aa49c72d3232586f7f5329c99279e4d1d6ea9d2b20de6b3632bea97d7e0e995",
}
# About one case in this many on the CPU backends (each file's cases cost differently).
SAMPLE = {"test_layernorm.py": 16, "test_pos_encoding.py": 16, "test_rotary_embedding.py": 16}
EXPECTED_SKIPS = {
    # vLLM's own skip without a CUDA device (its Gemma layer test); runs on CUDA
    "test_layernorm.py::test_gemma_rms_norm_mixed_input_weight_dtype": "CUDA required",
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(FILES))
def test_vllm_kernel_tests_pass_on_sgljit_compat(name, backend, tmp_path):
    path = vllm_suite.VENDORED / name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == FILES[name], (
        f"{name} is not the file validated"
    )
    every = int(os.environ.get("SGLJIT_COMPAT_SAMPLE", 1 if backend == "cuda" else SAMPLE[name]))
    outcome = vllm_suite.run_file(name, backend, tmp_path, sample=every)
    sglang_suite.assert_passes(outcome, EXPECTED_SKIPS)

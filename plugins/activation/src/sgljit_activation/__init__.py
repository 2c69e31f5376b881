"""sgljit-activation: ``scaled_silu``. CUDA and SYCL kernels; the ops are ``sgljit.ops.<name>``.

This module is what sgljit reads to discover the plugin: keep it free of heavy imports (torch,
the kernels), so that discovery stays cheap; ``ops`` is imported on the first use of an op.
"""

from sgljit.plugins import Manifest

MANIFEST: Manifest = {
    "name": "activation",
    "version": "0.1.0",
    "requires_sgljit": ">=0.1,<0.2",
    "ops": {"scaled_silu": "sgljit_activation.ops:scaled_silu"},
    "family": "sgljit_activation.ops:family",
}

"""One line to run Hugging Face models on sgljit's kernels.

    import sgljit.integrations as sgl

    sgl.apply_to_llama()          # or apply_to_mistral / _qwen2 / _qwen3 / _gemma2 / _gemma3
    model = AutoModelForCausalLM.from_pretrained(...)   # before or after: the classes are patched
    sgl.apply_to_model(model)     # the same, for whichever supported families `model` contains
    sgl.apply_to_diffusers()      # diffusers' get_timestep_embedding / Timesteps
    sgl.revert()                  # everything back as it was

or through transformers' own kernel mechanism (the ``kernels`` library, which transformers 5.25
and newer install), with sgljit's layers and nothing downloaded::

    model = AutoModelForCausalLM.from_pretrained(..., use_kernels=True,
                                                 kernel_config=sgl.kernel_config())
    model = sgl.kernelize(model)  # a model already built (kernels.Mode.INFERENCE in eval())

transformers and diffusers are not dependencies of sgljit: they are imported when a function
here is called, and an ImportError says which one is missing. Patches are process-wide (classes
and module functions), as Liger-Kernel's are; ``mlp=False`` leaves the MLP (one gate-and-up GEMM over
weights that share one tensor, then sgljit's gated activation) to HF. Under autograd (training) the patched code runs the
libraries' own PyTorch, so a patched model still trains; see :mod:`sgljit.nn` for the numerics.
"""

from __future__ import annotations

from ._patching import revert
from .hf_diffusers import apply_to_diffusers
from .hf_kernels import kernel_config, kernelize
from .hf_transformers import (
    FAMILIES,
    apply_to_gemma2,
    apply_to_gemma3,
    apply_to_llama,
    apply_to_mistral,
    apply_to_model,
    apply_to_qwen2,
    apply_to_qwen3,
)

__all__ = [
    "FAMILIES",
    "apply_to_diffusers",
    "apply_to_gemma2",
    "apply_to_gemma3",
    "apply_to_llama",
    "apply_to_mistral",
    "apply_to_model",
    "apply_to_qwen2",
    "apply_to_qwen3",
    "kernel_config",
    "kernelize",
    "revert",
]

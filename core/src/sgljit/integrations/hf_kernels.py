"""sgljit's kernels through transformers' own mechanism: the ``kernels`` library's layers.

transformers marks the layers and functions a kernel may replace with the ``kernels`` library's
``use_kernel_forward_from_hub(name)``: ``"RMSNorm"`` (the norms of Llama, Mistral, Qwen2, Qwen3 —
Qwen 3's per-head ``q_norm``/``k_norm`` too) and ``"rotary_pos_emb"`` (``apply_rotary_pos_emb``
of every family). ``kernelize`` then replaces each such module's ``forward`` with the layer a
*kernel mapping* gives for its name, device and mode. This module gives that mapping with sgljit's
layers::

    model = AutoModelForCausalLM.from_pretrained(name, use_kernels=True,
                                                 kernel_config=sgl.kernel_config())
    model = sgl.kernelize(model)          # a model already built (mode: Mode.INFERENCE in eval())

- **Local layers only.** The mapping's repositories are the layer classes below (nothing is
  downloaded, no kernel folder is read), for the devices sgljit dispatches (cuda, xpu, cpu), and
  it is the only mapping used (``inherit_mapping=False``): the model's other kernel-ready layers
  run transformers' own code, none comes from the Hub.
- **Gemma's norms** (``(1 + weight)``) are not registered by transformers; for a Gemma 2/3 model
  sgljit registers its RMSNorm class as ``"GemmaRMSNorm"`` (its ``kernel_layer_name``, as
  ``kernels.replace_kernel_forward_from_hub`` does; :func:`sgljit.integrations.revert` undoes it).
- **The MLPs** (gate and up as one GEMM, then ``silu_and_mul`` / ``gelu_tanh_and_mul``:
  :mod:`.hf_mlp`) likewise: their classes are registered as ``"GatedMLP"`` where transformers
  registers none; ``kernelize`` fuses the model's gate and up weights, ``kernel_config``'s model
  has them fused at its first forward.
- **Checked first, exact per call.** Before a model is kernelized each of its supported families
  is checked as ``apply_to_<family>`` checks it (HF's norm formula bit for bit, the rope
  convention): a transformers whose code differs is refused with an error. Per call, a layer runs
  the kernel when it takes the call exactly (the same rules as ``apply_to_*``) and transformers'
  own code otherwise: when autograd needs a graph (training), for a weight of another dtype, and
  for any class of a family sgljit does not know that registers the same name.

The layers serve every mode (registered as ``Mode.FALLBACK``): in training they run HF's code
wherever autograd needs a graph; they compile with ``torch.compile`` (the ops are torch custom
ops). ``transformers >= 5.25`` installs ``kernels``; before it, ``pip install kernels``.
"""

from __future__ import annotations

import copy
import functools

import torch

from . import _patching, hf_mlp
from .hf_transformers import (
    checked_norm,
    checked_rope,
    families_of,
    is_hub_function,
    modeling_module,
    rope_fits,
    rope_kernel,
)

__all__ = ["DEVICES", "LAYER_NAMES", "kernel_config", "kernelize"]

# The kernels library's device types that sgljit dispatches (a ROCm GPU is "rocm": not mapped).
DEVICES = ("cuda", "xpu", "cpu")
GEMMA_NORM = "GemmaRMSNorm"  # the name sgljit registers Gemma's norm classes under
GATED_MLP = "GatedMLP"  # ... and the MLP classes, which transformers does not register

# What _prepare() learned of the classes the layers meet (kept: a fact about a class, not a patch).
# A norm class checked -> the sgljit forward that serves it (sgljit.nn's, as apply_to_* uses).
_NORM_FORWARDS: dict[type, object] = {}
# A rope module class (one per modeling module) -> (an instance of it that only ever runs HF's
# function, whether the family was checked). The instance is never a model's: kernelize routes a
# model's calls through that model's own instances, so calling one of those would come back here.
_ROPES: dict[type, tuple[torch.nn.Module, bool]] = {}
# The MLP classes checked (their forward computes what sgljit's fused MLP does); the names they
# are registered under map to GatedMLP.
_MLPS: set[type] = set()


class RMSNorm(torch.nn.Module):
    """The layer for ``"RMSNorm"`` and ``"GemmaRMSNorm"``: its ``forward`` runs as the forward of
    transformers' norm module (``self``), with sgljit's kernel for a class whose formula was
    checked (Llama's or Gemma's), transformers' own forward for any other."""

    can_torch_compile = True
    has_backward = True  # autograd runs transformers' formula

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        forward = _NORM_FORWARDS.get(type(self))
        if forward is None:
            return type(self).forward(self, hidden_states)
        return forward(self, hidden_states)


class RotaryPosEmb(torch.nn.Module):
    """The layer for ``"rotary_pos_emb"``: ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)``
    on the ``apply_rope`` kernel (as ``apply_to_*``'s patched function), transformers' function
    for any call the kernel does not take exactly and for a family not checked."""

    can_torch_compile = True
    has_backward = True  # autograd runs transformers' function

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        # A class _prepare() did not meet (another family's): transformers' function only.
        hf, checked = _ROPES.get(type(self)) or _ROPES.setdefault(type(self), (type(self)(), False))
        if checked and unsqueeze_dim == 1 and rope_fits(q, k, cos, sin):
            return rope_kernel(q, k, cos, sin)
        return hf(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)


class GatedMLP(torch.nn.Module):
    """The layer for ``"GatedMLP"``: the MLP's forward on one gate-and-up GEMM and a gated
    activation kernel (:mod:`.hf_mlp`) for a class checked, transformers' own forward for any
    other and for any call the kernel path does not take."""

    can_torch_compile = True
    has_backward = True  # autograd runs transformers' forward

    def forward(self, x):
        out = hf_mlp.mlp_forward(self, x) if type(self) in _MLPS else None
        return type(self).forward(self, x) if out is None else out


class _Repository:
    """A ``kernels`` repository over a layer of this module: ``load`` returns it."""

    def __init__(self, layer: type[torch.nn.Module]):
        self.layer_name = layer.__name__
        self._layer = layer

    def load(self) -> type[torch.nn.Module]:
        return self._layer

    def __str__(self) -> str:
        return f"{__name__}.{self.layer_name}"


_REPOSITORIES = {
    "RMSNorm": _Repository(RMSNorm),
    "rotary_pos_emb": _Repository(RotaryPosEmb),
    GATED_MLP: _Repository(GatedMLP),
}
LAYER_NAMES = {
    "RMSNorm": "RMSNorm",
    GEMMA_NORM: "RMSNorm",
    "rotary_pos_emb": "rotary_pos_emb",
    GATED_MLP: GATED_MLP,
}


def _mapping(model: torch.nn.Module) -> dict:
    """The ``kernels`` mapping for ``model``: layer name -> device -> repository (every mode) for
    sgljit's layers, and no device for the other names the model registers (their modules keep
    transformers' forward, without the kernels library's warning that it found no mapping).
    Private: the layers take a class only once :func:`_prepare` has checked it."""
    mapping: dict = {name: {} for name in _registered_names(model)}
    for name, layer in LAYER_NAMES.items():
        mapping[name] = dict.fromkeys(DEVICES, _REPOSITORIES[layer])
    for mlp in _MLPS:  # a name transformers registers an MLP under (none in 5.24)
        name = str(getattr(mlp, "kernel_layer_name", GATED_MLP))
        mapping[name] = dict.fromkeys(DEVICES, _REPOSITORIES[GATED_MLP])
    return mapping


def _registered_names(model: torch.nn.Module) -> set[str]:
    """The layer names ``kernels.kernelize`` meets in ``model``: modules' and their functions'."""
    names = set()
    for module in model.modules():
        for kernel_module in (module, *getattr(module, "_kernel_funcs", {}).values()):
            name = getattr(type(kernel_module), "kernel_layer_name", None)
            if name is not None:
                names.add(str(name))
    return names


def _prepare(model: torch.nn.Module) -> list[str]:
    """Check the supported families ``model`` contains and record what the layers need; register
    their Gemma norm classes. Returns the families."""
    _kernels()
    families = families_of(model)
    for family in families:
        modeling = modeling_module(family)
        cls, forward = checked_norm(family, modeling)
        if not hasattr(cls, "kernel_layer_name"):  # Gemma's: transformers does not register it
            _patching.patch(cls, "kernel_layer_name", GEMMA_NORM)
        _NORM_FORWARDS[cls] = forward
        rope = checked_rope(family, modeling)
        if is_hub_function(rope):
            _ROPES[type(rope)] = (type(rope)(), True)
        mlp = hf_mlp.checked_mlp(family, modeling)
        hf_mlp.patch_class(mlp, forward=False)
        if not hasattr(mlp, "kernel_layer_name"):  # transformers 5.24 registers no MLP
            _patching.patch(mlp, "kernel_layer_name", GATED_MLP)
        _MLPS.add(mlp)
    return families


def kernelize(model: torch.nn.Module, mode=None, *, device=None) -> torch.nn.Module:
    """Replace the forward of ``model``'s kernel-ready layers by sgljit's (``kernels.kernelize``
    with sgljit's mapping alone) after checking the model's families; returns ``model``.

    ``mode``: a ``kernels.Mode`` (default ``Mode.TRAINING`` if ``model.training`` else
    ``Mode.INFERENCE``); ``device``: the kernels library's device (default: the parameters').
    Layers without an sgljit layer are set back to transformers' own forward."""
    kernels = _kernels()
    _prepare(model)
    hf_mlp.fuse_model(model, tuple(_MLPS))
    if mode is None:
        mode = kernels.Mode.TRAINING if model.training else kernels.Mode.INFERENCE
    with kernels.use_kernel_mapping(_mapping(model), inherit_mapping=False):
        return kernels.kernelize(model, mode=mode, device=device, use_fallback=True)


def kernel_config():
    """A ``transformers.KernelConfig`` of sgljit's layers, for
    ``from_pretrained(..., use_kernels=True, kernel_config=sgl.kernel_config())``.

    A config serves any number of ``from_pretrained`` calls: when transformers validates it
    against a model (the model's families are checked then), the model gets a copy holding its
    own mapping, and the config stays empty for the next."""
    _kernels()
    return _config_class()()


@functools.cache
def _config_class() -> type:
    try:
        from transformers import KernelConfig
    except ImportError as err:
        raise ImportError(
            "sgljit.integrations.kernel_config needs Hugging Face transformers with KernelConfig "
            "(pip install transformers); sgljit itself does not depend on it"
        ) from err

    class SgljitKernelConfig(KernelConfig):
        """sgljit's layers for every name transformers registers that sgljit implements."""

        def __init__(self) -> None:
            # Empty until the model is known: from_pretrained reads a mapping of Hub repository
            # names before it builds the model, and sgljit's layers are no such name.
            super().__init__(kernel_mapping={}, inherit_mapping=False)

        def sanitize_kernel_mapping(self, model) -> None:
            _prepare(model)
            self.store_registered_layer_names(model)

        def create_compatible_mapping(self, model, compile: bool = False) -> None:
            # The model keeps its own copy (transformers kernelizes it from
            # model.kernel_config): this one stays empty, because from_pretrained refuses a
            # filled mapping (a repository per device) before it builds the next model.
            own = copy.copy(self)
            own.kernel_mapping = _mapping(model)
            model.kernel_config = own

    return SgljitKernelConfig


def _kernels():
    try:
        import kernels
    except ImportError as err:
        raise ImportError(
            "sgljit.integrations.kernelize and kernel_config use the kernels library, which "
            "transformers 5.25 and newer install (pip install kernels; sgljit itself does not "
            "depend on it); apply_to_<family>() patches without it"
        ) from err
    return kernels

"""The gated MLP of Llama, Mistral, Qwen2, Qwen3, Gemma 2 and Gemma 3 on sgljit:
``down_proj(act(gate_proj(x)) * up_proj(x))`` as one GEMM over the concatenated gate and up weights,
then ``silu_and_mul`` (``hidden_act="silu"``) or ``gelu_tanh_and_mul`` (Gemma's
``gelu_pytorch_tanh``), then ``down_proj``: two launches and one ``[T, 2d]`` round trip where HF
has four launches (two GEMMs, the activation, the multiply) and three ``[T, d]`` round trips.

**Weights, without a copy.** An MLP is *fused* once: its gate and up weights are copied into one
``[2d, H]`` tensor and the two parameters are pointed at its halves (``param.data = half``: the same
Parameter objects, so optimizers, hooks and tied references keep them). The model's memory does not
grow (for a moment, one MLP's gate and up weights are held twice); ``state_dict`` still has
``gate_proj.weight`` and ``up_proj.weight`` with their values, and ``save_pretrained`` writes them as
two tensors (transformers clones disjoint views of one storage when it saves). ``apply_to_model`` and
``kernelize`` fuse the model's MLPs when they are called; an MLP of a model patched through its
class (``apply_to_llama()`` then ``from_pretrained``) is fused at its first forward that runs the
kernel path (never while ``torch.compile`` traces or a CUDA graph is captured: that call runs HF's
forward). Weights replaced or moved since (``load_state_dict`` copies in place and keeps the fusion;
``model.to(...)`` gives each parameter its own storage) are fused again at the next such forward.

**When HF's forward runs instead.** Per MLP, for good (the reason is ``module.sgljit_mlp_fallback``):
gate/up projections that are not plain ``torch.nn.Linear`` (LoRA, quantized layers), a bias, gate
and up of different shapes, dtypes or devices, or an ``act_fn`` that computes neither ``F.silu`` nor
``F.gelu(approximate="tanh")`` bit for bit. Per call: when autograd needs a graph (training; the
gradients are then HF's exactly), when the input's dtype or device differs from the weights'.

Numerics: the GEMM is torch's (the same ``F.linear``, over the concatenated weight: gate and up each
as HF computes them, up to the GEMM library's blocking); the activation is computed in float32 and
rounded once, where HF rounds ``act(gate)`` to the input's dtype before the multiply (bfloat16: within
one rounding step of HF's, and no further from a float32 model's).
"""

from __future__ import annotations

import types
import weakref

import torch
import torch.nn.functional as F

from .. import nn, ops
from . import _patching

__all__ = ["MLP_CLASSES", "fuse", "fuse_model", "mlp_forward", "patch_class"]

MLP_CLASSES = {
    "llama": "LlamaMLP",
    "mistral": "MistralMLP",
    "qwen2": "Qwen2MLP",
    "qwen3": "Qwen3MLP",
    "gemma2": "Gemma2MLP",
    "gemma3": "Gemma3MLP",
}
# op name -> the torch function whose gated form it computes
_ACTIVATIONS = {
    "silu_and_mul": F.silu,
    "gelu_tanh_and_mul": lambda t: F.gelu(t, approximate="tanh"),
}
# Per-instance state (module.__dict__ entries, never parameters or buffers: not in state_dict)
_GATE_UP = "_sgljit_gate_up"  # the [2d, H] tensor the gate and up weights are the halves of
_ACT_OP = "_sgljit_act_op"  # the sgljit op of its activation
_FALLBACK = "sgljit_mlp_fallback"  # why HF's forward runs for good, or None
_fused_modules: weakref.WeakSet = weakref.WeakSet()  # whose state revert() drops


def checked_mlp(family: str, modeling) -> type:
    """The family's MLP class, once its forward is checked to compute
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``."""
    for op in _ACTIVATIONS:
        _patching.require_op(op)
    cls = getattr(modeling, MLP_CLASSES[family])
    forward = _patching.original(cls, "forward")
    config = types.SimpleNamespace(
        hidden_size=8,
        intermediate_size=16,
        mlp_bias=False,
        hidden_act="silu",
        hidden_activation="gelu_pytorch_tanh",
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, generator=g)
    with torch.device("cpu"), torch.no_grad():
        try:
            module = cls(config)
            expected = module.down_proj(module.act_fn(module.gate_proj(x)) * module.up_proj(x))
        except (AttributeError, TypeError) as err:
            raise RuntimeError(
                f"transformers {_version()}: {cls.__name__} no longer has gate_proj, up_proj, "
                f"down_proj and act_fn ({err}); pass mlp=False to patch the norms and rope only"
            ) from err
        if not torch.equal(forward(module, x), expected):
            raise RuntimeError(
                f"transformers {_version()}: {cls.__name__}.forward no longer computes "
                "down_proj(act_fn(gate_proj(x)) * up_proj(x)); pass mlp=False to patch the norms "
                "and rope only"
            )
    return cls


def patch_class(cls: type, *, forward: bool) -> None:
    """Patch ``cls`` (until :func:`sgljit.integrations.revert`): its ``_apply`` (what
    ``module.to()`` and the like call) forgets the fused weight, whose storage the parameters are
    about to leave; with ``forward``, its forward becomes :func:`mlp_forward` or HF's."""
    original_apply = _patching.original(cls, "_apply")

    def _apply(self, fn, *args, **kwargs):
        self.__dict__.pop(_GATE_UP, None)
        return original_apply(self, fn, *args, **kwargs)

    _patching.patch(cls, "_apply", _apply)
    if forward:
        original = _patching.original(cls, "forward")

        def patched(self, x):
            out = mlp_forward(self, x)
            return original(self, x) if out is None else out

        patched.__wrapped__ = original  # type: ignore[attr-defined]
        _patching.patch(cls, "forward", patched)
    _patching.on_revert(_forget_fused)


def _forget_fused() -> None:
    """After revert: no module keeps a fused weight (its parameters keep their storage)."""
    for module in list(_fused_modules):
        module.__dict__.pop(_GATE_UP, None)
        module.__dict__.pop(_FALLBACK, None)
    _fused_modules.clear()


def mlp_forward(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """The MLP's output on sgljit, or None where HF's forward must run (see the module's doc)."""
    gate, up = mlp.gate_proj.weight, mlp.up_proj.weight
    if not isinstance(x, torch.Tensor) or not nn.kernel_can_run(x, gate, up):
        return None
    state = mlp.__dict__
    if state.get(_FALLBACK):
        return None
    gate_up = state.get(_GATE_UP)
    if torch.compiler.is_compiling():
        # Fused when the model was patched; the data pointers are not traced (a compiled model's
        # weights are not swapped between calls).
        if gate_up is None or gate_up.dtype != gate.dtype or gate_up.device != gate.device:
            return None
    elif not _is_fused(gate, up, gate_up):
        if x.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        if fuse(mlp) is not None:
            return None
        gate_up = state[_GATE_UP]
    return mlp.down_proj(getattr(ops, state[_ACT_OP])(F.linear(x, gate_up)))


def _is_fused(gate: torch.Tensor, up: torch.Tensor, gate_up: torch.Tensor | None) -> bool:
    """Whether ``gate`` and ``up`` are still the two halves of ``gate_up``."""
    if gate_up is None or gate.dtype != gate_up.dtype or gate.device != gate_up.device:
        return False
    start = gate_up.data_ptr()
    return (
        gate.data_ptr() == start
        and up.data_ptr() == start + gate.numel() * gate.element_size()
        and gate.shape == up.shape
        and gate.shape[0] * 2 == gate_up.shape[0]
    )


def fuse(mlp: torch.nn.Module) -> str | None:
    """Point ``mlp``'s gate and up weights at the halves of one new ``[2d, H]`` tensor (kept for
    the forward), unless already so. Returns why HF's forward must run instead, or None."""
    state = mlp.__dict__
    reason = _unfusable(mlp)
    if reason is not None:
        state[_FALLBACK], state[_GATE_UP] = reason, None
        _fused_modules.add(mlp)
        return reason
    gate, up = mlp.gate_proj.weight, mlp.up_proj.weight
    state[_FALLBACK] = None
    if _is_fused(gate, up, state.get(_GATE_UP)):
        return None
    with torch.inference_mode(False), torch.no_grad():
        gate_up = torch.empty(
            (gate.shape[0] * 2, gate.shape[1]), dtype=gate.dtype, device=gate.device
        )
        gate_up[: gate.shape[0]].copy_(gate)
        gate_up[gate.shape[0] :].copy_(up)
        gate.data, up.data = gate_up[: gate.shape[0]], gate_up[gate.shape[0] :]
    state[_GATE_UP] = gate_up
    _fused_modules.add(mlp)
    return None


def _unfusable(mlp: torch.nn.Module) -> str | None:
    """Why ``mlp`` cannot run fused, or None; records its activation's op."""
    gate_proj, up_proj = getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)
    for name, proj in (("gate_proj", gate_proj), ("up_proj", up_proj)):
        if type(proj) is not torch.nn.Linear:
            return f"{name} is a {type(proj).__name__}, not a torch.nn.Linear (LoRA, quantized)"
        if proj.bias is not None:
            return f"{name} has a bias"
    gate, up = gate_proj.weight, up_proj.weight
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device:
        return (
            f"gate_proj.weight ({tuple(gate.shape)}, {gate.dtype}, {gate.device}) and up_proj.weight "
            f"({tuple(up.shape)}, {up.dtype}, {up.device}) differ"
        )
    if gate.is_meta:
        return "the weights are on the meta device"
    op = _activation_op(getattr(mlp, "act_fn", None))
    if op is None:
        return f"act_fn {type(getattr(mlp, 'act_fn', None)).__name__} is neither SiLU nor tanh-GELU"
    mlp.__dict__[_ACT_OP] = op
    return None


def _activation_op(act_fn) -> str | None:
    """The op whose activation ``act_fn`` computes bit for bit (on float32 CPU values)."""
    if not callable(act_fn):
        return None
    x = torch.linspace(-8, 8, 97)
    with torch.no_grad():
        try:
            got = act_fn(x)
        except Exception:  # an activation that cannot take a CPU tensor is not one we know
            return None
        for op, fn in _ACTIVATIONS.items():
            if isinstance(got, torch.Tensor) and torch.equal(got, fn(x)):
                return op
    return None


def fuse_model(model: torch.nn.Module, classes: tuple[type, ...]) -> dict[str, str]:
    """Fuse every MLP of ``model`` whose class is one of ``classes``; returns
    ``{module name: reason}`` for those that keep HF's forward."""
    fallbacks = {}
    for name, module in model.named_modules():
        if isinstance(module, classes):
            reason = fuse(module)
            if reason is not None:
                fallbacks[name] = reason
    return fallbacks


def _version() -> str:
    import transformers

    return transformers.__version__

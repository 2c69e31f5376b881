"""Hugging Face transformers: the RMSNorms, rope and MLP of Llama, Mistral, Qwen2, Qwen3 (its
per-head q_norm/k_norm too), Gemma 2 and Gemma 3 on sgljit's kernels.

What is patched, in the model family's modeling module (``transformers.models.<family>.modeling_<family>``):

- ``<Family>RMSNorm.forward`` (the class, so models created before and after the patch both use it)
  becomes :class:`sgljit.nn.RMSNorm`'s or :class:`sgljit.nn.GemmaRMSNorm`'s forward: the
  ``rmsnorm``/``gemma_rmsnorm`` kernel, or HF's formula when autograd needs a graph or the weight's
  dtype differs from the input's.
- ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``: HF passes cos/sin already gathered for
  each token (``[B, S, D]``, ``cos = cos(cat(freqs, freqs)) * attention_scaling`` in the model's
  dtype, every rope type of these families). Its first half per token is exactly a row of an
  ``apply_rope`` table: the call builds that ``[B*S, D]`` table in the model's dtype (one ``cat``),
  takes positions ``0..B*S-1`` (kept per shape) and rotates copies of q and k in one kernel (neox
  pairs = ``rotate_half``). Any other call (partial rotary, another ``unsqueeze_dim``, cos in
  another dtype, grad needed) runs HF's function. Where transformers wraps that function with the
  ``kernels`` library's hub decorator (5.25, which installs ``kernels``; 5.24 with it installed),
  the module-level name holds a module standing for it: the patch replaces the name all the
  same, and its fallback calls that module (so whatever ``kernelize`` chose still runs there).

- ``<Family>MLP.forward``: one GEMM over the gate and up weights (made the halves of one tensor, no
  copy kept) and ``silu_and_mul`` / ``gelu_tanh_and_mul``, or HF's forward: :mod:`.hf_mlp`.

The same checks and kernels serve transformers' own kernel mechanism: :mod:`.hf_kernels`.

Before patching, each replacement is checked against the installed transformers on small CPU
tensors (the norm formula bit for bit, the rope convention to 1e-6): a version whose code has
changed is refused with an error instead of being patched wrong.
"""

from __future__ import annotations

import functools
import importlib
import inspect

import torch

from .. import nn, ops
from . import _patching, hf_mlp

__all__ = [
    "FAMILIES",
    "apply_to_gemma2",
    "apply_to_gemma3",
    "apply_to_llama",
    "apply_to_mistral",
    "apply_to_model",
    "apply_to_qwen2",
    "apply_to_qwen3",
]

# family -> (its RMSNorm class, which formula it computes)
FAMILIES = {
    "llama": ("LlamaRMSNorm", "llama"),
    "mistral": ("MistralRMSNorm", "llama"),
    "qwen2": ("Qwen2RMSNorm", "llama"),
    "qwen3": ("Qwen3RMSNorm", "llama"),
    "gemma2": ("Gemma2RMSNorm", "gemma"),
    "gemma3": ("Gemma3RMSNorm", "gemma"),
}
# formula -> (the forward that replaces HF's, HF's formula, the eps attribute, the op it calls)
_NORMS = {
    "llama": (nn.RMSNorm.forward, nn.llama_rms_norm, "variance_epsilon", "rmsnorm"),
    "gemma": (nn.GemmaRMSNorm.forward, nn.gemma_rms_norm, "eps", "gemma_rmsnorm"),
}
_ROPE_PARAMETERS = ["q", "k", "cos", "sin", "unsqueeze_dim"]


def apply_to_llama(*, rms_norm: bool = True, rope: bool = True, mlp: bool = True) -> None:
    """Run Llama's RMSNorm, rope and MLP on sgljit kernels (every Llama model, existing or future)."""
    _apply("llama", rms_norm=rms_norm, rope=rope, mlp=mlp)


def apply_to_mistral(*, rms_norm: bool = True, rope: bool = True, mlp: bool = True) -> None:
    """Run Mistral's RMSNorm, rope and MLP on sgljit kernels."""
    _apply("mistral", rms_norm=rms_norm, rope=rope, mlp=mlp)


def apply_to_qwen2(*, rms_norm: bool = True, rope: bool = True, mlp: bool = True) -> None:
    """Run Qwen2's RMSNorm, rope and MLP on sgljit kernels."""
    _apply("qwen2", rms_norm=rms_norm, rope=rope, mlp=mlp)


def apply_to_qwen3(*, rms_norm: bool = True, rope: bool = True, mlp: bool = True) -> None:
    """Run Qwen3's RMSNorms (hidden and the per-head q_norm/k_norm), rope and MLP on sgljit kernels."""
    _apply("qwen3", rms_norm=rms_norm, rope=rope, mlp=mlp)


def apply_to_gemma2(*, rms_norm: bool = True, rope: bool = True, mlp: bool = True) -> None:
    """Run Gemma 2's RMSNorms (``(1 + weight)``), rope and MLP on sgljit kernels."""
    _apply("gemma2", rms_norm=rms_norm, rope=rope, mlp=mlp)


def apply_to_gemma3(*, rms_norm: bool = True, rope: bool = True, mlp: bool = True) -> None:
    """Run Gemma 3's RMSNorms (``(1 + weight)``, q_norm/k_norm too), rope and MLP on sgljit kernels."""
    _apply("gemma3", rms_norm=rms_norm, rope=rope, mlp=mlp)


def apply_to_model(
    model: torch.nn.Module, *, rms_norm: bool = True, rope: bool = True, mlp: bool = True
) -> list[str]:
    """Patch every supported family whose modules ``model`` contains; returns their names.

    The patch is on the families' classes and modeling modules, so it also covers other models of
    those families in this process (as the per-family functions do). With ``mlp``, ``model``'s
    MLPs are fused now (see :mod:`.hf_mlp`)."""
    found = families_of(model)
    classes = tuple(_apply(family, rms_norm=rms_norm, rope=rope, mlp=mlp) for family in found)
    if mlp:
        hf_mlp.fuse_model(model, classes)
    return found


# ------------------------------------------------------------------------------------------------


def families_of(model: torch.nn.Module) -> list[str]:
    """The supported families whose modules ``model`` contains, in the order met; an error naming
    the families it has when none is supported."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    prefix = "transformers.models."
    found: list[str] = []
    seen: set[str] = set()
    for module in model.modules():
        name = type(module).__module__
        if name.startswith(prefix):
            family = name[len(prefix) :].split(".")[0]
            seen.add(family)
            if family in FAMILIES and family not in found:
                found.append(family)
    if not found:
        raise ValueError(
            f"model: {type(model).__name__} has no module of a family sgljit patches "
            f"({', '.join(FAMILIES)}); its transformers modules are from: "
            f"{', '.join(sorted(seen)) or 'none'}"
        )
    return found


def modeling_module(family: str):
    try:
        import transformers
    except ImportError as err:
        raise ImportError(
            "sgljit.integrations needs Hugging Face transformers (pip install transformers); "
            "sgljit itself does not depend on it"
        ) from err
    try:
        return importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    except ImportError as err:
        raise ImportError(
            f"transformers {transformers.__version__} has no {family} model ({err})"
        ) from err


def _apply(family: str, *, rms_norm: bool, rope: bool, mlp: bool) -> type:
    """Patch the family; returns its MLP class."""
    modeling = modeling_module(family)
    if rms_norm:
        cls, forward = checked_norm(family, modeling)
        _patching.patch(cls, "forward", forward)
    if rope:
        original = checked_rope(family, modeling)
        _patching.patch(modeling, "apply_rotary_pos_emb", _rope_function(original))
    if mlp:
        hf_mlp.patch_class(hf_mlp.checked_mlp(family, modeling), forward=True)
    return getattr(modeling, hf_mlp.MLP_CLASSES[family])


def checked_norm(family: str, modeling) -> tuple[type, object]:
    """The family's RMSNorm class and the sgljit forward that replaces HF's, once HF's is checked."""
    cls_name, formula = FAMILIES[family]
    cls = getattr(modeling, cls_name)
    forward, reference, eps_attr, op = _NORMS[formula]
    _patching.require_op(op)
    _check_norm(cls, reference, eps_attr)
    return cls, forward


def checked_rope(family: str, modeling):
    """The family's ``apply_rotary_pos_emb`` as transformers defines it (before any sgljit
    patch), once checked."""
    _patching.require_op("apply_rope")
    original = _patching.original(modeling, "apply_rotary_pos_emb")
    _check_rope(original, family)
    return original


def _version() -> str:
    import transformers

    return transformers.__version__


def _check_norm(cls: type, reference, eps_attr: str) -> None:
    """HF's forward (the original) must equal ``reference`` bit for bit on the CPU, in float32 and
    bfloat16, and keep its weight and eps where sgljit's forward reads them."""
    forward = _patching.original(cls, "forward")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 16, generator=g) * 3
    w = torch.randn(16, generator=g)
    with torch.device("cpu"), torch.no_grad():
        module = cls(16, eps=1e-5)
        if getattr(module, eps_attr, None) != 1e-5 or getattr(module, "weight", None) is None:
            raise RuntimeError(
                f"transformers {_version()}: {cls.__name__} no longer keeps its eps in "
                f".{eps_attr} and its weight in .weight; sgljit cannot patch it"
            )
        for dtype in (torch.float32, torch.bfloat16):
            module.to(dtype).weight.copy_(w)
            xd = x.to(dtype)
            if not torch.equal(forward(module, xd), reference(xd, module.weight, 1e-5)):
                raise RuntimeError(
                    f"transformers {_version()}: {cls.__name__}.forward no longer computes what "
                    f"sgljit.nn.{reference.__name__} does; sgljit cannot patch it"
                )


def _check_rope(original, family: str) -> None:
    """HF's ``apply_rotary_pos_emb`` must take (q, k, cos, sin, unsqueeze_dim) and rotate neox
    pairs by the first half of cos/sin, as the kernel route does."""
    params = list(function_signature(original).parameters)
    if params != _ROPE_PARAMETERS:
        raise RuntimeError(
            f"transformers {_version()}: {family}'s apply_rotary_pos_emb takes ({', '.join(params)}), "
            f"not ({', '.join(_ROPE_PARAMETERS)}); pass rope=False to patch only the norms"
        )
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 5, 8, generator=g), torch.randn(2, 1, 5, 8, generator=g)
    angles = torch.randn(2, 5, 4, generator=g)
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    expected = original(q, k, cos, sin)
    got = _rope_math(q, k, cos, sin)
    if not all(torch.allclose(e, r, atol=1e-6) for e, r in zip(expected, got, strict=True)):
        raise RuntimeError(
            f"transformers {_version()}: {family}'s apply_rotary_pos_emb no longer rotates "
            "(i, i + D/2) pairs by cos/sin as given; pass rope=False to patch only the norms"
        )


def _rope_math(q, k, cos, sin):
    """What the kernel route computes (in torch): neox rotation by the first half of cos/sin."""
    half = q.shape[-1] // 2
    c, s = cos[..., :half].unsqueeze(1).float(), sin[..., :half].unsqueeze(1).float()

    def rotate(x):
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def rope_fits(q, k, cos, sin) -> bool:
    """q [B, Hq, S, D], k [B, Hk, S, D], cos/sin [1 or B, S, D], all of one dtype and device, no
    autograd, B * S > 0 and D even (full rotary)."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)):
        return False
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or not nn.kernel_can_run(q, k, cos, sin):
        return False
    b, _, s, d = q.shape
    return (
        b * s > 0
        and d > 0
        and d % 2 == 0
        and k.shape[0] == b
        and k.shape[2:] == q.shape[2:]
        and sin.shape == cos.shape
        and cos.shape[1:] == (s, d)
        and cos.shape[0] in (1, b)
    )


def rope_kernel(q, k, cos, sin):
    """New q, k: rotated copies, as HF returns. With one token per sequence (every decode step),
    q and k are copied by one ``cat`` into a [B, Hq + Hk, 1, D] buffer whose [B, H, D] view the
    kernel rotates in place; else each is copied into [B, S, H, D], HF's own layout, which a plain
    copy gives (a ``cat`` in [B, H, S, D] order would transpose them)."""
    b, hq, s, d = q.shape
    rows, half = cos.shape[0] * s, d // 2
    # cos/sin rows are exactly rows of an apply_rope table (cos | sin halves) in q's dtype.
    cache = torch.cat((cos[..., :half], sin[..., :half]), dim=-1).view(rows, d)
    positions = _positions(rows, b // cos.shape[0], q.device)
    if s == 1:
        qk = torch.cat((q, k), dim=1)
        rows_view = qk.view(b, qk.shape[1], d)
        ops.apply_rope(rows_view[:, :hq], rows_view[:, hq:], cache, positions)
        return qk[:, :hq], qk[:, hq:]
    q_out = q.transpose(1, 2).clone(memory_format=torch.contiguous_format)
    k_out = k.transpose(1, 2).clone(memory_format=torch.contiguous_format)
    ops.apply_rope(q_out.view(b * s, hq, d), k_out.view(b * s, -1, d), cache, positions)
    return q_out.transpose(1, 2), k_out.transpose(1, 2)


@functools.lru_cache(maxsize=64)
def _cached_positions(rows: int, repeats: int, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False):  # usable outside inference mode too
        return torch.arange(rows, device=device).repeat(repeats)


def _positions(rows: int, repeats: int, device: torch.device) -> torch.Tensor:
    """``0..rows-1`` ``repeats`` times (cos/sin shared by a batch: one row per position), kept per
    shape and device: a decode step then launches nothing for it. Not kept while a CUDA graph is
    captured (its values would exist only once the graph replays) nor in a compiled graph (which
    computes it once in its own code)."""
    if torch.compiler.is_compiling() or (
        device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    ):
        return torch.arange(rows, device=device).repeat(repeats)
    return _cached_positions(rows, repeats, device)


def is_hub_function(fn) -> bool:
    """Whether ``fn`` is a modeling function made a module by the ``kernels`` library's
    ``use_kernel_forward_from_hub`` (see :func:`function_signature`)."""
    return isinstance(fn, torch.nn.Module) and hasattr(type(fn), "kernel_layer_name")


def function_signature(fn) -> inspect.Signature:
    """The signature of a modeling function. transformers decorates some with the ``kernels``
    library's ``use_kernel_forward_from_hub`` (from 5.25, which depends on ``kernels``; earlier
    ones too where ``kernels`` is installed): the name then holds an ``nn.Module`` instance whose
    forward calls the function, and carries its signature after ``self``."""
    if is_hub_function(fn):
        signature = inspect.signature(type(fn).forward)
        return signature.replace(parameters=list(signature.parameters.values())[1:])
    return inspect.signature(fn)


def _rope_function(original):
    """The patched ``apply_rotary_pos_emb``: the kernel, or ``original`` (HF's function, or the
    module standing for it, which then routes the call through whatever ``kernelize`` chose)."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if unsqueeze_dim == 1 and rope_fits(q, k, cos, sin):
            return rope_kernel(q, k, cos, sin)
        return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    apply_rotary_pos_emb.__module__ = original.__module__
    apply_rotary_pos_emb.__wrapped__ = original  # type: ignore[attr-defined]
    apply_rotary_pos_emb.__signature__ = function_signature(original)  # type: ignore[attr-defined]
    return apply_rotary_pos_emb

"""diffusers: ``get_timestep_embedding`` (and so every ``Timesteps`` module) on sgljit's
``timestep_embedding`` kernel.

sgljit's op takes every argument of diffusers' function (``flip_sin_to_cos``,
``downscale_freq_shift``, ``scale``, ``max_period``) with its meaning, and returns float32 as
diffusers does. The patched function calls diffusers' own for what the kernel does not take
exactly: timesteps that need autograd or are not a 1-D real tensor, an ``embedding_dim`` that is
not a positive int, non-finite or tensor-valued scalars, ``downscale_freq_shift == embedding_dim
// 2`` (diffusers divides by zero there), a max_period that is not positive.

Numerics: the sin/cos argument is ``t * freq * scale`` in float32 in both; diffusers' float32
``exp`` for ``freq`` may be an ulp off the kernel's correctly rounded one, so the two differ by up
to ``|t * scale| * 1.2e-7`` (about 1e-4 at t = 1000), plus 1e-6 for sin/cos.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import sys

import torch

from .. import nn, ops
from . import _patching

__all__ = ["apply_to_diffusers"]

_PARAMETERS = {
    "timesteps": inspect.Parameter.empty,
    "embedding_dim": inspect.Parameter.empty,
    "flip_sin_to_cos": False,
    "downscale_freq_shift": 1,
    "scale": 1,
    "max_period": 10000,
}


def apply_to_diffusers() -> None:
    """Run diffusers' ``get_timestep_embedding`` on the sgljit kernel: in
    ``diffusers.models.embeddings`` (``Timesteps`` calls it from there) and in every diffusers
    module already imported that bound it by name (modules imported later bind the patched one;
    ``revert`` finds those too)."""
    try:
        from diffusers.models import embeddings
    except ImportError as err:
        raise ImportError(
            "sgljit.integrations.apply_to_diffusers needs diffusers (pip install diffusers); "
            "sgljit itself does not depend on it"
        ) from err
    _patching.require_op("timestep_embedding")
    original = _patching.original(embeddings, "get_timestep_embedding")
    _check_signature(original)
    patched = _timestep_function(original)
    _patching.patch(embeddings, "get_timestep_embedding", patched)
    for module in _bound_modules(original):
        if module is not embeddings:
            _patching.patch(module, "get_timestep_embedding", patched, was=original)
    _patching.on_revert(_unbind_later_imports)


def _bound_modules(original) -> list:
    """The imported diffusers modules whose ``get_timestep_embedding`` is ``original`` or an sgljit
    wrapper of it (bound by name at their import, before or after a patch)."""
    return [
        module
        for module, bound in _bindings()
        if bound is original or getattr(bound, "_sgljit_wraps", None) is original
    ]


def _unbind_later_imports() -> None:
    """At revert: modules imported while patched still hold the wrapper; give them diffusers'."""
    for module, bound in _bindings():
        original = getattr(bound, "_sgljit_wraps", None)
        if original is not None:
            module.get_timestep_embedding = original


def _bindings() -> list:
    """(module, its get_timestep_embedding) of every imported diffusers module that has one."""
    return [
        (module, vars(module)["get_timestep_embedding"])
        for name, module in list(sys.modules.items())
        if name.startswith("diffusers.")
        and module is not None
        and "get_timestep_embedding" in vars(module)
    ]


def _check_signature(original) -> None:
    import diffusers

    params = inspect.signature(original).parameters
    found = {name: p.default for name, p in params.items()}
    if found != _PARAMETERS:
        raise RuntimeError(
            f"diffusers {diffusers.__version__}: get_timestep_embedding{inspect.signature(original)} "
            f"is not the function sgljit's timestep_embedding implements "
            f"({', '.join(f'{k}={v}' for k, v in _PARAMETERS.items())}); not patched"
        )


def _finite(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _fits(timesteps, embedding_dim, downscale_freq_shift, scale, max_period) -> bool:
    if not isinstance(timesteps, torch.Tensor) or timesteps.dim() != 1:
        return False
    if timesteps.is_complex() or timesteps.dtype == torch.bool:
        return False
    if timesteps.device.type not in nn.KERNEL_DEVICES or (
        timesteps.requires_grad and torch.is_grad_enabled()
    ):
        return False
    if type(embedding_dim) is not int or embedding_dim < 1:
        return False
    if not (_finite(downscale_freq_shift) and _finite(scale) and _finite(max_period)):
        return False
    half = embedding_dim // 2
    return max_period > 0 and not (half > 0 and half == downscale_freq_shift)


def _timestep_function(original):
    @functools.wraps(original)
    def get_timestep_embedding(
        timesteps,
        embedding_dim,
        flip_sin_to_cos=False,
        downscale_freq_shift=1,
        scale=1,
        max_period=10000,
    ):
        if _fits(timesteps, embedding_dim, downscale_freq_shift, scale, max_period):
            return ops.timestep_embedding(
                timesteps,
                embedding_dim,
                flip_sin_to_cos=bool(flip_sin_to_cos),
                downscale_freq_shift=float(downscale_freq_shift),
                scale=float(scale),
                max_period=float(max_period),
            )
        return original(
            timesteps, embedding_dim, flip_sin_to_cos, downscale_freq_shift, scale, max_period
        )

    get_timestep_embedding._sgljit_wraps = original  # what revert puts back wherever it went
    return get_timestep_embedding

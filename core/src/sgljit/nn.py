"""Torch modules over sgljit's kernels: ``RMSNorm``, ``GemmaRMSNorm``, ``RotaryEmbedding``.

``RMSNorm`` and ``GemmaRMSNorm`` are drop-ins for Hugging Face's ``LlamaRMSNorm`` and
``Gemma2RMSNorm``/``Gemma3RMSNorm``: same constructor, parameter and attribute names
(``weight``, ``variance_epsilon`` / ``eps``), so state dicts load unchanged and
:mod:`sgljit.integrations` can give HF's classes their ``forward``.

The kernels are inference-only. When autograd needs a graph (grad enabled and the input or the
weight requires grad: training), or when the kernel cannot take the call exactly (the weight's
dtype differs from the input's, an unsupported dtype or device), ``forward`` runs the PyTorch
formula of the module it replaces instead, so a model keeps training and keeps its semantics.

Numerics of the kernel path (math in float32, rounded once to the input dtype):

- ``RMSNorm``: HF's Llama rounds twice, ``weight * round(x * rsqrt(mean(x^2) + eps))``; the kernel
  rounds ``x * rsqrt(...) * weight`` once. Equal in float32; within one rounding step in 16-bit.
- ``GemmaRMSNorm``: HF computes ``x * rsqrt(...) * (1 + weight)`` in float32 and rounds once, as
  the kernel does (reduction order aside).
"""

from __future__ import annotations

import torch

from . import ops

__all__ = ["KERNEL_DEVICES", "GemmaRMSNorm", "RMSNorm", "RotaryEmbedding", "kernel_can_run"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
# Devices sgljit dispatches: cuda -> CUDA kernels, xpu -> SYCL, cpu -> the reference (or SYCL on
# the CPU device under sgljit.use_backend("sycl")).
KERNEL_DEVICES = ("cuda", "xpu", "cpu")


def kernel_can_run(*tensors: torch.Tensor) -> bool:
    """True when no tensor needs autograd and all are float16/bfloat16/float32 of one dtype on one
    device sgljit dispatches (cuda, xpu, cpu)."""
    first = tensors[0]
    dtype, device = first.dtype, first.device
    if dtype not in _FLOATS or device.type not in KERNEL_DEVICES:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t.dtype != dtype or t.device != device or (grad and t.requires_grad):
            return False
    return True


def _rows_fit(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The norm kernels' layout: weight [H] contiguous, x [..., H] with a unit last stride."""
    return (
        weight.dim() == 1
        and x.dim() >= 1
        and x.shape[-1] == weight.shape[0] > 0
        and x.stride(-1) == 1
        and weight.is_contiguous()
        and kernel_can_run(x, weight)
    )


def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF ``LlamaRMSNorm.forward`` as written: normalize in float32, round, multiply by weight."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF ``Gemma2RMSNorm.forward`` / ``Gemma3RMSNorm.forward`` as written: all in float32,
    times ``(1 + weight)``, rounded once to x's dtype."""
    h = x.float()
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).type_as(x)


class RMSNorm(torch.nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension: HF's ``LlamaRMSNorm``
    (also Mistral's, Qwen2's, Qwen3's). ``weight`` starts at ones."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if _rows_fit(hidden_states, self.weight):
            return ops.rmsnorm(hidden_states, self.weight, self.variance_epsilon)
        return llama_rms_norm(hidden_states, self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class GemmaRMSNorm(torch.nn.Module):
    """``x / sqrt(mean(x^2) + eps) * (1 + weight)``: HF's ``Gemma2RMSNorm``/``Gemma3RMSNorm``. The
    weight is stored as an offset from one and starts at zeros; the output has x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6, *, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _rows_fit(x, self.weight):
            return ops.gemma_rmsnorm(x, self.weight, self.eps)
        return gemma_rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


class RotaryEmbedding(torch.nn.Module):
    """Rotary position embedding over a cos/sin table, called as serving engines call it:
    ``q, k = rope(positions, q, k)``.

    Args:
        head_dim: size of a head. max_position: rows of the table (positions ``0 .. max_position-1``).
        base: the frequency base (``rope_theta``). rotary_dim: how many leading dims of a head
            rotate (default ``head_dim``). is_neox: pairs ``(i, i + rotary_dim/2)`` (HF's
            ``rotate_half``), else interleaved pairs ``(2i, 2i + 1)`` (GPT-J).
        inv_freq: the ``rotary_dim // 2`` inverse frequencies, to use a scaled rope (HF's
            ``ROPE_INIT_FUNCTIONS`` give them); overrides ``base``. attention_scaling: multiplies
            cos and sin (HF's ``attention_scaling`` of YaRN / LongRoPE).

    ``positions`` int32/int64 ``[T]``; q ``[T, Hq, head_dim]`` or ``[T, Hq * head_dim]``, k likewise.
    On the kernel path q and k are rotated in place (and returned); when autograd needs a graph,
    new tensors are returned and the inputs are left alone — always use the returned pair. The
    table is float32, built in float64, kept off the module's buffers so that ``model.to(dtype)``
    cannot round it; it follows q's device.
    """

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        base: float = 10000.0,
        *,
        rotary_dim: int | None = None,
        is_neox: bool = True,
        inv_freq: torch.Tensor | None = None,
        attention_scaling: float = 1.0,
    ) -> None:
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
            raise ValueError(
                f"rotary_dim: expected an even number in [2, head_dim={head_dim}], got {rotary_dim}"
            )
        if inv_freq is None:
            exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
            inv_freq = 1.0 / (base**exponents)
        elif inv_freq.shape != (rotary_dim // 2,):
            raise ValueError(
                f"inv_freq: expected shape ({rotary_dim // 2},) (rotary_dim // 2), "
                f"got {tuple(inv_freq.shape)}"
            )
        angles = torch.outer(
            torch.arange(max_position, dtype=torch.float64), inv_freq.double().cpu()
        )
        table = torch.cat((angles.cos(), angles.sin()), dim=-1) * attention_scaling
        self.head_dim, self.rotary_dim, self.is_neox = head_dim, rotary_dim, is_neox
        self._cos_sin_cache = table.float()

    @property
    def cos_sin_cache(self) -> torch.Tensor:
        """float32 ``[max_position, rotary_dim]``: cos in the first half of a row, sin in the second."""
        return self._cos_sin_cache

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cache = self._cos_sin_cache
        if cache.device != q.device:
            cache = cache.to(q.device)
            if not cache.is_meta:  # a call on meta tensors (a shape probe) keeps the table
                self._cos_sin_cache = cache
        if kernel_can_run(q, k) and q.stride(-1) == 1 and k.stride(-1) == 1:
            ops.apply_rope(q, k, cache, positions, is_neox=self.is_neox, head_dim=self.head_dim)
            return q, k
        return self._rotate(positions, q, cache), self._rotate(positions, k, cache)

    def _rotate(
        self, positions: torch.Tensor, x: torch.Tensor, cache: torch.Tensor
    ) -> torch.Tensor:
        """Out of place, differentiable: the kernel's math (float32, rounded once)."""
        heads = x.unflatten(-1, (-1, self.head_dim)) if x.dim() == 2 else x
        rot = self.rotary_dim
        cos, sin = cache[positions].unsqueeze(1).chunk(2, dim=-1)
        xr = heads[..., :rot].float()
        if self.is_neox:
            x1, x2 = xr.chunk(2, dim=-1)
            out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = xr[..., 0::2], xr[..., 1::2]
            out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        out = torch.cat((out.to(x.dtype), heads[..., rot:]), dim=-1)
        return out.reshape(x.shape)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, "
            f"max_position={self._cos_sin_cache.shape[0]}, is_neox={self.is_neox}"
        )

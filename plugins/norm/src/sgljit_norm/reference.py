"""PyTorch implementation of the RMSNorm family: the CPU path and the test oracle.

Math in float32, cast once: ``y = x * rsqrt(mean(x^2) + eps) * w`` (Gemma: ``* (1 + w)``). The fused
add rounds ``input + residual`` to the dtype first and normalizes that rounded sum.
"""

import torch

__all__ = [
    "fused_add_rmsnorm_",
    "qknorm_",
    "qknorm_across_heads_",
    "rms_norm",
    "rmsnorm_into",
]


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool = False
) -> torch.Tensor:
    """RMSNorm over the last dimension, in float32 (returns float32)."""
    xf = x.float()
    wf = weight.float()
    if gemma:
        wf = wf + 1.0
    return xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * wf


def rmsnorm_into(
    input: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float, gemma: bool = False
) -> None:
    out.copy_(rms_norm(input, weight, eps, gemma))


def fused_add_rmsnorm_(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    gemma: bool = False,
) -> None:
    """``residual <- input + residual`` (rounded to the dtype); ``input <- rmsnorm(residual)``."""
    total = (input.float() + residual.float()).to(residual.dtype)
    residual.copy_(total)
    input.copy_(rms_norm(total, weight, eps, gemma))


def qknorm_(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float
) -> None:
    """In place: each head of q ``[T, Hq, D]`` and k ``[T, Hk, D]`` normalized over D."""
    q.copy_(rms_norm(q, q_weight, eps))
    k.copy_(rms_norm(k, k_weight, eps))


def qknorm_across_heads_(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float
) -> None:
    """In place: each row of q ``[T, Hq*D]`` and k ``[T, Hk*D]`` normalized over the whole row."""
    q.copy_(rms_norm(q, q_weight, eps))
    k.copy_(rms_norm(k, k_weight, eps))

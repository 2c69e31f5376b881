"""PyTorch implementation of the RMSNorm family: the CPU path and the test oracle.

Math in float32, cast once: ``y = x * rsqrt(mean(x^2) + eps) * w`` (Gemma: ``* (1 + w)``); the weight
has the input's dtype or float32. ``round_before_weight`` (Hugging Face's LlamaRMSNorm) rounds
``x * rsqrt(...)`` to the input's dtype before the weight multiply. The fused add rounds
``input + residual`` to the dtype first and normalizes that rounded sum; with
``round_before_weight`` it normalizes the float32 sum (sglang's ``cast_x_before_out_mul``). Rows are
``[T, H]`` or ``[B, S, H]``.
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
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    gemma: bool = False,
    round_to: torch.dtype | None = None,
) -> torch.Tensor:
    """RMSNorm over the last dimension, in float32 (returns float32); ``round_to``: the dtype
    ``x * rsqrt(...)`` is rounded to before the weight multiply."""
    xf = x.float()
    wf = weight.float()
    if gemma:
        wf = wf + 1.0
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if round_to is not None:
        y = y.to(round_to).float()
    return y * wf


def rmsnorm_into(
    input: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    round_before_weight: bool = False,
    gemma: bool = False,
) -> None:
    out.copy_(rms_norm(input, weight, eps, gemma, input.dtype if round_before_weight else None))


def fused_add_rmsnorm_(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    round_before_weight: bool = False,
    gemma: bool = False,
) -> None:
    """``residual <- input + residual`` (rounded to the dtype); ``input <- rmsnorm(residual)``
    (``round_before_weight``: of the float32 sum)."""
    total = input.float() + residual.float()
    rounded = total.to(residual.dtype)
    residual.copy_(rounded)
    if round_before_weight:
        input.copy_(rms_norm(total, weight, eps, gemma, input.dtype))
    else:
        input.copy_(rms_norm(rounded, weight, eps, gemma))


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

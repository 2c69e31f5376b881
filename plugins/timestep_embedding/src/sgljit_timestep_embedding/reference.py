"""PyTorch reference of the timestep embedding: the CPU path and the tests' oracle.

The embedding is diffusers' ``get_timestep_embedding``; the *argument* of sin/cos is pinned down to
the bit so every backend computes the same fp32 value:

    half      = dim // 2
    exponent  = fl32(fl32(-ln(max_period)) * j) / fl32(half - downscale_freq_shift)   (fp32 ops)
    freq[j]   = exp(exponent), correctly rounded to fp32 (evaluated in fp64, rounded once)
    arg[b, j] = fl32(fl32(fl32(t[b]) * freq[j]) * fl32(scale))

This is PyTorch's fp32 formula with the one operation PyTorch leaves loose (fp32 ``exp``, within an
ulp or two and different between its CPU and CUDA builds) made exact. sin/cos of ``arg`` are
evaluated here in fp64; the output is ``[sin | cos]`` (``[cos | sin]`` with ``flip_sin_to_cos``),
plus one zero column when ``dim`` is odd.
"""

from __future__ import annotations

import math

import torch

__all__ = ["column_frequencies", "timestep_embedding_fp64", "timestep_embedding_into"]


def column_frequencies(half: int, downscale_freq_shift: float, max_period: float) -> torch.Tensor:
    """fp32 ``freq[j]`` for ``j < half`` (computed on the CPU, so it is the same for every device)."""
    numerator = torch.arange(half, dtype=torch.float32) * -math.log(
        max_period
    )  # fp32 multiplication
    denominator = torch.tensor(half - downscale_freq_shift, dtype=torch.float32).double()
    # The IEEE fp32 quotient: the fp64 quotient of two fp32 values, rounded once, is exactly it.
    exponent = (numerator.double() / denominator).float()
    return torch.exp(exponent.double()).float()


def timestep_arguments(
    t: torch.Tensor, dim: int, downscale_freq_shift: float, scale: float, max_period: float
) -> torch.Tensor:
    """The fp32 ``arg[b, j]`` of shape ``[B, dim // 2]`` on ``t``'s device."""
    freq = column_frequencies(dim // 2, downscale_freq_shift, max_period).to(t.device)
    return (t.to(torch.float32)[:, None] * freq[None, :]) * scale  # two fp32 multiplications


def timestep_embedding_fp64(
    t: torch.Tensor,
    dim: int,
    *,
    flip_sin_to_cos: bool = False,
    downscale_freq_shift: float = 0.0,
    scale: float = 1.0,
    max_period: float = 10000,
) -> torch.Tensor:
    """The exact embedding ``[B, dim]`` in float64: sin/cos (fp64) of the fp32 arguments."""
    arg = timestep_arguments(t, dim, downscale_freq_shift, scale, max_period).double()
    sin, cos = torch.sin(arg), torch.cos(arg)
    parts = [cos, sin] if flip_sin_to_cos else [sin, cos]
    if dim % 2:
        parts.append(torch.zeros(arg.shape[0], 1, dtype=torch.float64, device=arg.device))
    return torch.cat(parts, dim=-1)


def timestep_embedding_into(
    t: torch.Tensor,
    out: torch.Tensor,
    flip_sin_to_cos: bool,
    downscale_freq_shift: float,
    scale: float,
    max_period: float,
) -> None:
    """Write the embedding of ``t`` into ``out`` ``[B, dim]`` (the fp64 values rounded to out's dtype)."""
    emb = timestep_embedding_fp64(
        t,
        out.shape[1],
        flip_sin_to_cos=flip_sin_to_cos,
        downscale_freq_shift=downscale_freq_shift,
        scale=scale,
        max_period=max_period,
    )
    out.copy_(emb)

"""``sglang.jit_kernel.timestep_embedding``'s call: the fp32 sinusoidal timestep embedding.

    >>> import torch
    >>> from sgljit.compat.sglang.timestep_embedding import timestep_embedding
    >>> emb = timestep_embedding(torch.tensor([0, 500]), 8, flip_sin_to_cos=True)
    >>> emb.shape, emb.dtype, emb[0].tolist()
    (torch.Size([2, 8]), torch.float32, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])

sglang's signature and semantics on ``sgljit.ops.timestep_embedding``: the output is always fp32
``[B, dim]``, ``[sin | cos]`` (``[cos | sin]`` with ``flip_sin_to_cos``); ``dtype`` is the dtype
timesteps that are not fp32/fp16/bf16 (integer ones, say) are converted to first, as sglang
converts them (in ``sgljit.ops.timestep_embedding``, ``dtype`` is the output dtype). Values are
sgljit's: sin/cos of a bit-exactly defined fp32 argument within 1e-6 (see
``sgljit_timestep_embedding.reference``).

Wider than sglang's, which needs CUDA, ``dim % 8 == 0`` and contiguous timesteps: any ``dim >= 1``
(an odd one gets a zero last column, as diffusers'), strided timesteps, CPU and XPU tensors.
"""

from __future__ import annotations

import torch

from sgljit import ops

__all__ = ["timestep_embedding"]

_KERNEL_T_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def timestep_embedding(
    t: torch.Tensor,
    dim: int,
    flip_sin_to_cos: bool = False,
    downscale_freq_shift: float = 0.0,
    scale: float = 1,
    max_period: int = 10000,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Embedding ``[B, dim]`` (fp32) of the timesteps ``t`` ``[B]``.

    ``freq_j = exp(-ln(max_period) * j / (dim // 2 - downscale_freq_shift))``,
    ``arg = scale * t * freq``; timesteps of a dtype other than fp32/fp16/bf16 are converted to
    ``dtype`` first.
    """
    if isinstance(t, torch.Tensor) and t.dtype not in _KERNEL_T_DTYPES:
        t = t.to(dtype)
    return ops.timestep_embedding(
        t,
        dim,
        flip_sin_to_cos=flip_sin_to_cos,
        downscale_freq_shift=downscale_freq_shift,
        scale=scale,
        max_period=max_period,
        dtype=torch.float32,
    )

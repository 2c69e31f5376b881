"""sglang's fused QK-norm + rope (``fused_qk_norm_rope``, sglang 0.5.23's
``ops/attention/fused_qknorm_rope.py``, the call signature of ``sgl_kernel.fused_qk_norm_rope``) on
sgljit's ``qknorm_rope_theta``.

In place on a fused ``qkv`` ``[T, (nq + nk + nv) * head_dim]``: each q and k head RMS-normalized
with its weight, then its first ``rotary_dim`` dims rotated by cos/sin computed from ``base`` (YaRN
when ``factor != 1``: ``low``/``high`` bound the ramp over pair indices, ``attention_factor`` scales
the rotated dims) and rounded once; the v heads are left untouched. Beyond sglang: float16/float32
besides bfloat16, int64 positions besides int32, any even head_dim up to 1024 (sglang: 64, 128,
256), and the SYCL and reference backends. Formulas and accuracy: :mod:`sgljit_rope.qknorm_rope_theta`.
"""

from __future__ import annotations

import torch

from sgljit import ops

__all__ = ["fused_qk_norm_rope", "fused_qk_norm_rope_out"]


def fused_qk_norm_rope_out(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    position_ids: torch.Tensor,
    num_heads_q: int,
    num_heads_k: int,
    num_heads_v: int,
    head_dim: int,
    eps: float,
    base: float,
    is_neox: bool,
    factor: float,
    low: float,
    high: float,
    attention_factor: float,
    rotary_dim: int,
) -> None:
    """sglang's ``fused_qk_norm_rope_out``: :func:`fused_qk_norm_rope` with the weights and
    positions first and ``rotary_dim`` required."""
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 2:
        what = f"shape {list(qkv.shape)}" if isinstance(qkv, torch.Tensor) else type(qkv).__name__
        raise ValueError(f"qkv: expected a 2-D tensor [T, (nq + nk + nv) * head_dim], got {what}")
    width = (num_heads_q + num_heads_k + num_heads_v) * head_dim
    if qkv.shape[1] != width:
        raise ValueError(
            f"qkv: expected {width} columns ((num_heads_q + num_heads_k + num_heads_v) * "
            f"head_dim = ({num_heads_q} + {num_heads_k} + {num_heads_v}) * {head_dim}), "
            f"got {qkv.shape[1]}"
        )
    heads = qkv.unflatten(1, (-1, head_dim))
    ops.qknorm_rope_theta(
        heads[:, :num_heads_q],
        heads[:, num_heads_q : num_heads_q + num_heads_k],
        q_weight,
        k_weight,
        position_ids,
        base=base,
        rotary_dim=rotary_dim,
        eps=eps,
        is_neox=bool(is_neox),
        factor=factor,
        low=low,
        high=high,
        attention_factor=attention_factor,
    )


def fused_qk_norm_rope(
    qkv: torch.Tensor,
    num_heads_q: int,
    num_heads_k: int,
    num_heads_v: int,
    head_dim: int,
    eps: float,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    base: float,
    is_neox: bool,
    position_ids: torch.Tensor,
    factor: float,
    low: float,
    high: float,
    attention_factor: float,
    rotary_dim: int | None = None,
) -> None:
    """Fused QK RMSNorm + rope in place on ``qkv`` (see the module doc); ``rotary_dim`` defaults
    to ``head_dim``."""
    fused_qk_norm_rope_out(
        qkv, q_weight, k_weight, position_ids, num_heads_q, num_heads_k, num_heads_v, head_dim,
        eps, base, is_neox, factor, low, high, attention_factor,
        head_dim if rotary_dim is None else rotary_dim,
    )  # fmt: skip

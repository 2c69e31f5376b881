"""PyTorch implementation of the rope ops: the CPU path and the oracle the kernels are tested against.

Math is done in float32 (the kernels' precision), in float64 for float64 tensors (the oracle: the
conformance suite runs it on float64 copies); results are rounded once to the tensors' dtype, except
``qknorm_rope``, which rounds twice as the unfused chain it replaces does (qknorm's output, then
the rotation). The cos/sin cache is read in its own dtype (float32, or the tensors' dtype) and
converted.
Out-of-range indices behave exactly as in the kernels: a position outside ``[0, max_pos)`` leaves its
token unrotated, an ``out_loc`` outside ``[0, num_slots)`` stores nothing for its token.
"""

from __future__ import annotations

import torch

__all__ = [
    "apply_rope_into",
    "apply_rope_with_kv_cache_into",
    "qknorm_rope_into",
    "qknorm_rope_torch",
    "rope_torch",
]


def _math(x: torch.Tensor) -> torch.Tensor:
    """``x`` in the math dtype: float32, or float64 when it is float64."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _gather_cos_sin(
    cos_sin_cache: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cos [T, 1, r/2], sin [T, 1, r/2], valid [T, 1, 1]) for each token's position."""
    max_pos, rot = cos_sin_cache.shape
    valid = (positions >= 0) & (positions < max_pos)
    idx = positions.long().clamp(0, max(max_pos - 1, 0))
    rows = _math(cos_sin_cache.index_select(0, idx))
    cos, sin = rows[:, : rot // 2], rows[:, rot // 2 :]
    return cos.unsqueeze(1), sin.unsqueeze(1), valid.view(-1, 1, 1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """Rotate the pairs of ``x`` [T, H, r] (in the math dtype): neox pairs (i, i + r/2), gptj pairs (2i, 2i + 1)."""
    if is_neox:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def _rope_one(x, cos, sin, valid, rot, is_neox, round_products=False) -> torch.Tensor:
    """The rotated first ``rot`` dims of ``x`` [T, H, D], in x's dtype (unrotated where not valid).
    ``round_products``: computed in x's dtype, as vLLM's kernel (cos, sin, each product and the
    result rounded to it)."""
    if round_products:
        xr = x[..., :rot]
        rotated = _rotate(xr, cos.to(x.dtype), sin.to(x.dtype), is_neox)
        return torch.where(valid, rotated, xr)
    xr = _math(x[..., :rot])
    return torch.where(valid, _rotate(xr, cos, sin, is_neox), xr).to(x.dtype)


def rope_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out-of-place rope on q [T, Hq, D], k [T, Hk, D]: returns new (q, k)."""
    rot = cos_sin_cache.shape[1]
    cos, sin, valid = _gather_cos_sin(cos_sin_cache, positions)
    out = []
    for x in (q, k):
        y = _rope_one(x, cos, sin, valid, rot, is_neox)
        if rot < x.shape[-1]:
            y = torch.cat((y, x[..., rot:]), dim=-1)
        out.append(y)
    return out[0], out[1]


def apply_rope_into(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    is_neox: bool,
    round_products: bool = False,
) -> None:
    """In place on q [T, Hq, D] and k [T, Hk, D] (views allowed); ``round_products``: vLLM's
    rounding (each product rounded to the dtype)."""
    rot = cos_sin_cache.shape[1]
    cos, sin, valid = _gather_cos_sin(cos_sin_cache, positions)
    for x in (q, k):
        x[..., :rot].copy_(_rope_one(x, cos, sin, valid, rot, is_neox, round_products))


def apply_rope_with_kv_cache_into(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    out_loc: torch.Tensor,
    is_neox: bool,
    rotate_k: bool = False,
) -> None:
    """q rotated in place; rotated k and v stored at ``k_cache[out_loc]``, ``v_cache[out_loc]``;
    v is not modified, nor is k unless ``rotate_k`` (then it is rotated in place too, every
    token's, stored or not)."""
    rot = cos_sin_cache.shape[1]
    cos, sin, valid = _gather_cos_sin(cos_sin_cache, positions)
    q[..., :rot].copy_(_rope_one(q, cos, sin, valid, rot, is_neox))
    k_rot = _rope_one(k, cos, sin, valid, rot, is_neox)
    store = (out_loc >= 0) & (out_loc < k_cache.shape[0])
    loc = out_loc[store].long()
    k_cache[loc, :, :rot] = k_rot[store]
    if rot < k.shape[-1]:
        k_cache[loc, :, rot:] = k[store][..., rot:]
    v_cache[loc] = v[store]
    if rotate_k:
        k[..., :rot].copy_(k_rot)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-head RMSNorm of ``x`` [T, H, D] over D, ``x * rsqrt(mean(x^2) + eps) * weight`` in the
    math dtype, rounded to x's dtype (what sgljit's ``qknorm`` stores)."""
    xm = _math(x)
    return (xm * torch.rsqrt(xm.square().mean(-1, keepdim=True) + eps) * _math(weight)).to(x.dtype)


def qknorm_rope_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    eps: float = 1e-6,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out-of-place qknorm then rope on q [T, Hq, D], k [T, Hk, D]: returns new (q, k)."""
    q_normed, k_normed = _rms_norm(q, q_weight, eps), _rms_norm(k, k_weight, eps)
    return rope_torch(q_normed, k_normed, cos_sin_cache, positions, is_neox)


def qknorm_rope_into(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    eps: float,
    is_neox: bool,
) -> None:
    """In place on q [T, Hq, D] and k [T, Hk, D] (views allowed): each head RMS-normalized over D
    (weights [D]) and rounded to the dtype, then its first rotary_dim dims rotated and rounded again
    (the unfused chain ``qknorm`` then ``apply_rope``). An out-of-range position leaves its token
    normalized but unrotated."""
    new_q, new_k = qknorm_rope_torch(
        q, k, q_weight, k_weight, cos_sin_cache, positions, eps, is_neox
    )
    q.copy_(new_q)
    k.copy_(new_k)

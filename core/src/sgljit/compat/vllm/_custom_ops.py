"""vLLM's ``vllm._custom_ops`` norm and rotary functions on sgljit's ops.

``from sgljit.compat.vllm import _custom_ops as ops`` where vLLM code has
``from vllm import _custom_ops as ops``. Each function keeps vLLM's signature and semantics (its
``csrc/layernorm_kernels.cu`` and ``csrc/pos_encoding_kernels.cu``): destination passing, in place,
returning None. Beyond vLLM: positions may be int32 as well as int64, and a position outside the
cache leaves its token unrotated (vLLM reads out of bounds).
"""

from __future__ import annotations

import torch

from sgljit import ops

__all__ = ["fused_add_rms_norm", "rms_norm", "rotary_embedding"]


def rms_norm(
    out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor | None, epsilon: float
) -> None:
    """``out = input * rsqrt(mean(input^2, -1) + epsilon) * weight`` over the last dimension.

    input and out ``[..., hidden]``, weight ``[hidden]`` or None (no weight: a ones weight is made
    for the call).
    """
    if weight is None:
        weight = torch.ones(input.shape[-1], dtype=input.dtype, device=input.device)
    ops.rmsnorm(input, weight, epsilon, out=out)


def fused_add_rms_norm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, epsilon: float
) -> None:
    """In place: ``residual <- input + residual``, then ``input <- rms_norm(residual) * weight``
    (weight None: no weight)."""
    if weight is None:
        weight = torch.ones(input.shape[-1], dtype=input.dtype, device=input.device)
    ops.fused_add_rmsnorm(input, residual, weight, epsilon)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    rope_dim_offset: int = 0,
    inverse: bool = False,
) -> None:
    """Rotary embedding of query and key (None: query alone), in place.

    positions ``[T]`` or ``[B, S]``; query ``[T, Hq * head_size]`` or ``[T, Hq, head_size]``, or
    with ``[B, S]`` leading dimensions to match positions (they must collapse into one token
    dimension without a copy); key likewise with Hk heads. cos_sin_cache ``[max_pos, rotary_dim]``
    (cos | sin) of float32, float16 or bfloat16: q's dtype and float32 are read as they are, another
    is converted to float32 for the call. Dims ``[rope_dim_offset, rope_dim_offset + rotary_dim)``
    of each head rotate (the rest are untouched); ``inverse`` rotates by ``-theta`` (it makes a
    copy of the cache with sin negated for the call).
    """
    if positions.dim() not in (1, 2):
        raise ValueError(
            f"positions: expected [num_tokens] or [batch_size, seq_len], got shape "
            f"{tuple(positions.shape)}"
        )
    query = _tokens(query, "query", positions)
    key = None if key is None else _tokens(key, "key", positions)
    if cos_sin_cache.dtype not in (query.dtype, torch.float32):
        cos_sin_cache = cos_sin_cache.float()
    if inverse:
        cos, sin = cos_sin_cache.chunk(2, dim=-1)
        cos_sin_cache = torch.cat((cos, -sin), dim=-1)
    if rope_dim_offset:
        if rope_dim_offset < 0 or rope_dim_offset + cos_sin_cache.shape[-1] > head_size:
            raise ValueError(
                f"rope_dim_offset: {rope_dim_offset} plus the rotary dim {cos_sin_cache.shape[-1]} "
                f"must lie within head_size {head_size}"
            )
        query = _heads(query, "query", head_size)[..., rope_dim_offset:]
        key = None if key is None else _heads(key, "key", head_size)[..., rope_dim_offset:]
        head_size -= rope_dim_offset
    ops.apply_rope(
        query, key, cos_sin_cache, positions.reshape(-1), is_neox=is_neox, head_dim=head_size
    )


def _tokens(x: torch.Tensor, name: str, positions: torch.Tensor) -> torch.Tensor:
    """``x`` with the leading dimensions positions has collapsed into one of tokens (a view)."""
    lead = positions.dim()
    if x.dim() not in (lead + 1, lead + 2) or tuple(x.shape[:lead]) != tuple(positions.shape):
        raise ValueError(
            f"{name}: expected its leading dimensions to be positions' {tuple(positions.shape)}, "
            f"then [heads * head_size] or [heads, head_size]; got shape {tuple(x.shape)}"
        )
    if lead == 1:
        return x
    try:
        return x.view(-1, *x.shape[2:])
    except RuntimeError:
        raise ValueError(
            f"{name}: rotated in place, so its batch and sequence dimensions must collapse into "
            f"one (a view); got shape {tuple(x.shape)} with strides {x.stride()}"
        ) from None


def _heads(x: torch.Tensor, name: str, head_size: int) -> torch.Tensor:
    """``[T, H * head_size]`` or ``[T, H, head_size]`` as ``[T, H, head_size]`` (a view)."""
    if x.shape[-1] % head_size:
        raise ValueError(f"{name}: width {x.shape[-1]} is not a multiple of head_size {head_size}")
    return x if x.dim() == 3 else x.unflatten(1, (-1, head_size))


# ------------------------------------------------------------------------------------------------
# Gated activations (vLLM's csrc/activation_kernels.cu): out [..., d] = act(x[..., :d]) * x[..., d:],
# destination first, returning None. sgljit computes in float32 and rounds once; vLLM's kernels round
# act(gate) to the dtype before the multiply, so 16-bit results may differ by one rounding. Any width
# and strided rows are accepted (the last dimension contiguous).

__all__ += ["gelu_and_mul", "gelu_tanh_and_mul", "silu_and_mul"]


def silu_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
    """``out = silu(input[..., :d]) * input[..., d:]``; input ``[..., 2 * d]``, out ``[..., d]``."""
    ops.silu_and_mul(input, out=out)


def gelu_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
    """``out = gelu(input[..., :d]) * input[..., d:]``, GELU's erf form."""
    ops.gelu_and_mul(input, out=out)


def gelu_tanh_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
    """``out = gelu_tanh(input[..., :d]) * input[..., d:]``, GELU's tanh approximation."""
    ops.gelu_tanh_and_mul(input, out=out)

"""vLLM's ``vllm._custom_ops`` norm, rotary and fp8 functions on sgljit's ops.

``from sgljit.compat.vllm import _custom_ops as ops`` where vLLM code has
``from vllm import _custom_ops as ops``. Each function keeps vLLM's signature and semantics (its
``csrc/layernorm_kernels.cu``, ``layernorm_quant_kernels.cu``, ``pos_encoding_kernels.cu`` and
``quantization/w8a8/fp8/common.cu``): destination passing, in place, returning None; the ops vLLM
binds only as ``torch.ops._C.<name>`` (``rms_norm_static_fp8_quant``,
``fused_add_rms_norm_static_fp8_quant``, ``static_scaled_fp8_quant``, ``dynamic_scaled_fp8_quant``,
``dynamic_per_token_scaled_fp8_quant``) are here under those names and argument orders.

Numerics are vLLM's: ``rotary_embedding`` computes in the tensors' dtype (cos, sin and each product
rounded to it: sgljit's ``round_products``); the norms round once (the fused add normalizes the
rounded sum); the fused norm + fp8 functions quantize the normalized row rounded to the input's
dtype, as vLLM's kernels do (here: sgljit's norm, then its fp8 quantization, two passes).

Where this differs on purpose:

- fp8 codes: ``x / scale`` correctly rounded (vLLM's static and per-tensor kernels multiply by the
  rounded reciprocal: a code one step apart where the two straddle a rounding boundary, rare).
- Dynamic scales: at least ``2^-126`` (vLLM: per tensor ``absmax / fp8_max``, 0 for an all-zero
  input, whose codes are then NaN; per token at least ``1 / (fp8_max * 512)``).
- Not taken (an error naming the argument): static scales other than one per tensor
  (``group_shape``, per-token or per-channel scale tensors) and ``scale_ub``.
- Positions may be int32 as well as int64; a position outside the cache leaves its token
  unrotated (vLLM reads out of bounds).
"""

from __future__ import annotations

import torch

from sgljit import ops

__all__ = [
    "dynamic_per_token_scaled_fp8_quant",
    "dynamic_scaled_fp8_quant",
    "fused_add_rms_norm",
    "fused_add_rms_norm_static_fp8_quant",
    "rms_norm",
    "rms_norm_dynamic_per_token_quant",
    "rms_norm_static_fp8_quant",
    "rotary_embedding",
    "scaled_fp8_quant",
    "static_scaled_fp8_quant",
]


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
    """Rotary embedding of query and key (None: query alone), in place, computed in their dtype
    as vLLM's kernel does.

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
    ops.apply_rope(query, key, cos_sin_cache, positions.reshape(-1), is_neox=is_neox,
                   head_dim=head_size, round_products=True)  # fmt: skip


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
# RMSNorm -> fp8 and fp8 quantization


def rms_norm_static_fp8_quant(
    result: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    epsilon: float,
) -> None:
    """``result = fp8(rms_norm(input) * weight / scale)``, the normalized row rounded to input's
    dtype first; result fp8 ``[..., hidden]``, scale float32 with one element."""
    normed = ops.rmsnorm(input, weight, epsilon)
    static_scaled_fp8_quant(result, normed, scale)


def fused_add_rms_norm_static_fp8_quant(
    result: torch.Tensor,
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    epsilon: float,
) -> None:
    """``residual <- input + residual`` in place (rounded), then ``result`` =
    :func:`rms_norm_static_fp8_quant` of it; ``input`` is only read."""
    normed = input.clone()
    ops.fused_add_rmsnorm(normed, residual, weight, epsilon)
    static_scaled_fp8_quant(result, normed, scale)


def rms_norm_dynamic_per_token_quant(
    input: torch.Tensor,
    weight: torch.Tensor,
    epsilon: float,
    quant_dtype: torch.dtype,
    scale_ub: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm (after ``residual <- input + residual`` in place when a residual is given), then
    fp8 with a dynamic scale per token. Returns ``(output, scales [tokens, 1])``."""
    _no_scale_ub(scale_ub)
    if residual is None:
        normed = ops.rmsnorm(input, weight, epsilon)
    else:
        normed = input.clone()
        ops.fused_add_rmsnorm(normed, residual, weight, epsilon)
    rows = normed.reshape(-1, normed.shape[-1])
    output, scales = ops.per_token_quant_fp8(rows, fp8_dtype=quant_dtype)
    return output.view(input.shape), scales


def static_scaled_fp8_quant(
    result: torch.Tensor,
    input: torch.Tensor,
    scale: torch.Tensor,
    group_shape: list[int] | tuple[int, int] | None = None,
) -> None:
    """``result = fp8(clamp(input / scale))`` with one float32 scale for the whole tensor."""
    if not isinstance(scale, torch.Tensor) or scale.numel() != 1:
        shape = tuple(scale.shape) if isinstance(scale, torch.Tensor) else type(scale).__name__
        raise ValueError(f"scale: only one scale per tensor is supported here, got {shape}")
    if group_shape is not None and any(g != -1 for g in group_shape):
        raise ValueError(
            f"group_shape: only per-tensor scaling ((-1, -1) or None) is supported here, got "
            f"{tuple(group_shape)}"
        )
    ops.per_tensor_quant_fp8(input.contiguous(), scale.reshape(1), out=result,
                             fp8_dtype=result.dtype)  # fmt: skip


def dynamic_scaled_fp8_quant(
    result: torch.Tensor, input: torch.Tensor, scale: torch.Tensor
) -> None:
    """``scale <- absmax(input) / fp8_max`` (float32 ``[1]``), then ``result`` as
    :func:`static_scaled_fp8_quant`."""
    ops.per_tensor_quant_fp8(input.contiguous(), out=result, scale_out=scale.view(-1),
                             fp8_dtype=result.dtype)  # fmt: skip


def dynamic_per_token_scaled_fp8_quant(
    result: torch.Tensor,
    input: torch.Tensor,
    scale: torch.Tensor,
    scale_ub: torch.Tensor | None,
) -> None:
    """Per row (token) of input ``[..., hidden]``: ``scale[t] <- absmax(row) / fp8_max``
    (float32 ``[tokens, 1]``), ``result[t] = fp8(row / scale[t])``."""
    _no_scale_ub(scale_ub)
    rows = input.reshape(-1, input.shape[-1])
    out = result.view(-1, result.shape[-1])
    ops.per_token_quant_fp8(rows, out=out, scales=scale.view(-1, 1), fp8_dtype=result.dtype)


def scaled_fp8_quant(
    input: torch.Tensor,
    scale: torch.Tensor | None = None,
    num_token_padding: int | None = None,
    scale_ub: torch.Tensor | None = None,
    use_per_token_if_dynamic: bool = False,
    output: torch.Tensor | None = None,
    group_shape: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's fp8 entry point: input ``[M, N]``; static with ``scale``, else dynamic (one scale,
    or one per token with ``use_per_token_if_dynamic``). ``num_token_padding`` pads the output's
    rows. Returns ``(output float8_e4m3fn, scale)``."""
    if not isinstance(input, torch.Tensor) or input.dim() != 2:
        raise ValueError("input: expected a 2-D tensor [M, N]")
    shape = tuple(input.shape)
    if num_token_padding:
        shape = (max(num_token_padding, shape[0]), shape[1])
    if output is None:
        output = torch.empty(shape, device=input.device, dtype=torch.float8_e4m3fn)
    elif num_token_padding is not None:
        raise ValueError("num_token_padding: not supported with a given output")
    rows = output[: input.shape[0]]
    if scale is None:
        if use_per_token_if_dynamic:
            scale = torch.empty((shape[0], 1), device=input.device, dtype=torch.float32)
            dynamic_per_token_scaled_fp8_quant(rows, input, scale[: input.shape[0]], scale_ub)
        else:
            scale = torch.empty(1, device=input.device, dtype=torch.float32)
            dynamic_scaled_fp8_quant(rows, input, scale)
    else:
        static_scaled_fp8_quant(rows, input, scale, group_shape)
    return output, scale


def _no_scale_ub(scale_ub) -> None:
    if scale_ub is not None:
        raise ValueError("scale_ub: an upper bound of the dynamic scales is not supported here")


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

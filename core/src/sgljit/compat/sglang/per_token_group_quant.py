"""sglang 0.5.23's ``per_token_group_quant`` (``sglang.kernels.ops.quantization``) on sgljit's
per-token-group ops: its signature, its layouts and its scale formats, so a call site ports by
changing the import::

    from sgljit.compat.sglang.per_token_group_quant import per_token_group_quant

    q, s = per_token_group_quant(x, group_size=128)                       # dense [T, H]
    q, s = per_token_group_quant(x, masked_m=m, expected_m=8)             # masked [E, T_pad, H]
    q, s = per_token_group_quant(y, sorted_token_ids=ids, num_tokens_post_padded=n,
                                 num_valid_tokens=topk_ids.numel())        # sorted MoE rows

Layouts (sglang's): dense ``input`` ``[T, H]``; masked ``[E, T_pad, H]`` with ``masked_m`` (int32
or int64 ``[E]``), rows ``t >= masked_m[e]`` left unwritten, ``expected_m`` a grid hint only;
sorted (``sorted_token_ids`` from ``moe_align_block_size``), rows at or past
``num_tokens_post_padded[0]`` or whose id is ``>= num_valid_tokens`` left unwritten.
``fuse_silu_and_mul``: ``input`` holds ``[..., 2 * H]`` (gate, up) and ``silu(gate) * up`` is
quantized; ``silu_and_mul_mode="dense"`` rounds that float32 product once to the input's dtype
(sgljit's ``silu_and_mul``), ``"legacy"`` rounds SiLU to the input's dtype first and multiplies in
it, as sglang's default.

``output_s`` formats (inferred from a given buffer's dtype and strides, or allocated as sglang
does): float32 row-major or column-major (token stride 1; allocated TMA-aligned, the token count
rounded up to 4); int32 with ``scale_ue8m0``: UE8M0 exponent bytes packed 4 per int32, byte ``b``
of word ``w`` holding group ``4 w + b``, the tail bytes of a last partial word zero, row-major
``[..., T, ceil(G / 4)]`` or column-major (allocated ``[..., ceil(G / 4), T rounded up to 4]``
transposed). Quant range per ``output_q.dtype``: fp8 e4m3 (+-448; e5m2 too) or int8.

Differences (sglang's behaviour in parentheses):

- Scales are ``max(absmax / qmax, 1e-10)`` (``max(absmax, 1e-10) / qmax``): equal unless a
  group's absmax is below ``1e-10 * qmax``, e.g. all zero. fp8 codes are ``x / scale`` correctly
  rounded (``x * (qmax / absmax)``), which can differ by one step.
- int8 codes round to nearest even and clamp to +-127 (truncate toward zero, clamp to [-128, 127]).
- ``scale_ue8m0`` with a float32 ``output_s`` writes the power-of-two scales as float32 (sglang
  raises); NaN propagates into the scale (sglang's absmax skips it). Packed scales go through a
  float32 buffer and one packing pass in PyTorch (sglang's kernel writes the bytes).
- Any fp16/bf16/fp32 input, rows may be strided (rows 32-byte aligned, contiguous input).
"""

from __future__ import annotations

import torch

import sgljit

__all__ = ["pack_ue8m0", "per_token_group_quant"]

_OUT_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)


def _round4(n: int) -> int:
    return -(-n // 4) * 4


def _allocate(input, hidden, group_size, out_dtype, scale_ue8m0, column_major, fused):
    """(output_q, output_s) as sglang allocates them."""
    shape = (*input.shape[:-1], hidden)
    output_q = torch.empty(shape, device=input.device, dtype=out_dtype)
    *lead, rows = shape[:-1]
    groups = hidden // group_size if group_size > 0 else 0
    dev = input.device
    if scale_ue8m0:
        words = -(-groups // 4)
        if column_major:
            full = torch.empty(*lead, words, _round4(rows), device=dev, dtype=torch.int32)
            return output_q, full.transpose(-1, -2)[..., :rows, :]
        return output_q, torch.empty(*lead, rows, words, device=dev, dtype=torch.int32)
    if column_major:
        full = torch.empty(*lead, groups, _round4(rows), device=dev, dtype=torch.float32)
        return output_q, full.transpose(-1, -2)[..., :rows, :]
    return output_q, torch.empty(*lead, rows, groups, device=dev, dtype=torch.float32)


def pack_ue8m0(scales: torch.Tensor, output_s: torch.Tensor, live: torch.Tensor | None = None):
    """Pack power-of-two float32 ``scales`` ``[..., G]`` into int32 ``output_s`` ``[..., ceil(G /
    4)]`` (any strides): the exponent byte of group ``4 w + b`` in byte ``b`` of word ``w``, tail
    bytes zero; rows where ``live`` (leading dimensions) is False keep their words."""
    groups, words = scales.shape[-1], output_s.shape[-1]
    if words != -(-groups // 4):
        raise ValueError(
            f"output_s: packed UE8M0 scales need {-(-groups // 4)} int32 words a row (ceil of "
            f"{groups} groups / 4), got {words}"
        )
    exponents = ((scales.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    if words * 4 != groups:
        exponents = torch.nn.functional.pad(exponents, (0, words * 4 - groups))
    packed = exponents.contiguous().view(torch.int32)
    if live is not None:
        packed = torch.where(live.unsqueeze(-1), packed, output_s)
    output_s.copy_(packed)


def _silu_and_mul(input: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "dense":
        return sgljit.ops.silu_and_mul(input)
    gate, up = input.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate.float()).to(input.dtype) * up


def _live_rows(input, masked_m, sorted_token_ids, num_tokens_post_padded, num_valid_tokens):
    """The rows the layout writes (for packing the scales of those rows only), or None: all."""
    if masked_m is not None:
        pad = input.shape[1]
        counts = masked_m.to(torch.int64).clamp(0, pad).unsqueeze(1)
        return torch.arange(pad, device=input.device).unsqueeze(0) < counts
    if sorted_token_ids is not None:
        rows = input.shape[0]
        ids = sorted_token_ids[:rows].to(torch.int64)
        post = num_tokens_post_padded.reshape(-1)[0]
        index = torch.arange(rows, device=input.device)
        return (index < post) & (ids >= 0) & (ids < num_valid_tokens)
    return None


def per_token_group_quant(
    input: torch.Tensor,
    output_q: torch.Tensor | None = None,
    output_s: torch.Tensor | None = None,
    group_size: int = 128,
    scale_ue8m0: bool = False,
    fuse_silu_and_mul: bool = False,
    masked_m: torch.Tensor | None = None,
    expected_m: int | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    column_major_scales: bool = False,
    sorted_token_ids: torch.Tensor | None = None,
    num_tokens_post_padded: torch.Tensor | None = None,
    num_valid_tokens: int = 0,
    silu_and_mul_mode: str = "legacy",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group quantization; returns ``(output_q, output_s)`` (see the module docstring).

    ``output_q``/``output_s``: caller-owned buffers (both or neither); without them they are
    allocated per ``out_dtype`` (default float8_e4m3fn), ``scale_ue8m0`` and
    ``column_major_scales``. ``group_size``: 16, 32, 64, 128 or 256.
    """
    if silu_and_mul_mode not in ("legacy", "dense"):
        raise ValueError(
            f"silu_and_mul_mode: expected 'legacy' or 'dense', got {silu_and_mul_mode!r}"
        )
    if masked_m is not None and sorted_token_ids is not None:
        raise ValueError(
            "sorted_token_ids: the masked (masked_m) and sorted layouts exclude each other"
        )
    if sorted_token_ids is not None and num_tokens_post_padded is None:
        raise ValueError("num_tokens_post_padded: required with sorted_token_ids")
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    dims = 3 if masked_m is not None else 2
    if input.dim() != dims:
        want = "[E, T_pad, H]" if dims == 3 else "[T, H]"
        raise ValueError(
            f"input: expected a {dims}-D tensor {want}, got shape {tuple(input.shape)}"
        )
    hidden = input.shape[-1] // (2 if fuse_silu_and_mul else 1)
    if output_q is None:
        if output_s is not None:
            raise ValueError("output_s: given without output_q (pass both or neither)")
        out_dtype = torch.float8_e4m3fn if out_dtype is None else out_dtype
        if out_dtype not in _OUT_DTYPES:
            raise TypeError(
                f"out_dtype: expected torch.float8_e4m3fn, torch.float8_e5m2 or torch.int8, got "
                f"{out_dtype!r}"
            )
        output_q, output_s = _allocate(
            input, hidden, group_size, out_dtype, scale_ue8m0, column_major_scales,
            fuse_silu_and_mul,
        )  # fmt: skip
    elif output_s is None:
        raise ValueError("output_s: required with output_q (pass both or neither)")
    elif out_dtype is not None and out_dtype != output_q.dtype:
        raise ValueError(f"out_dtype: {out_dtype} differs from output_q's dtype {output_q.dtype}")
    if output_s.dtype not in (torch.float32, torch.int32):
        raise TypeError(
            f"output_s: expected float32 scales or int32-packed UE8M0 scales, got {output_s.dtype}"
        )
    packed = output_s.dtype == torch.int32
    if packed and not scale_ue8m0:
        raise ValueError(
            "output_s: int32-packed scales hold UE8M0 exponents; pass scale_ue8m0=True"
        )
    if scale_ue8m0 and output_q.dtype == torch.int8:
        raise ValueError("scale_ue8m0: int8 output takes float32 scales (absmax / 127), not ue8m0")
    column_major = output_s.dim() >= 2 and output_s.stride(-2) < output_s.stride(-1)

    x = _silu_and_mul(input, silu_and_mul_mode) if fuse_silu_and_mul else input
    if packed:  # float32 powers of two first, packed below
        lead = x.shape[:-1]
        groups = hidden // group_size if isinstance(group_size, int) and group_size > 0 else 0
        scales = torch.empty(*lead, groups, device=x.device, dtype=torch.float32)
        column_major = False
    else:
        scales = output_s

    common = {"out": output_q, "scales": scales, "scale_ue8m0": scale_ue8m0}
    if masked_m is not None:
        sgljit.ops.per_token_group_quant_masked(
            x, masked_m, group_size, expected_m=expected_m, out_dtype=output_q.dtype,
            column_major_scales=column_major, **common,
        )  # fmt: skip
    elif sorted_token_ids is not None:
        sgljit.ops.per_token_group_quant_sorted(
            x, sorted_token_ids, num_tokens_post_padded, num_valid_tokens, group_size,
            out_dtype=output_q.dtype, column_major_scales=column_major, **common,
        )  # fmt: skip
    elif output_q.dtype == torch.int8:
        sgljit.ops.per_token_group_quant_int8(
            x, group_size, column_major_scales=column_major, out=output_q, scales=scales
        )
    else:
        sgljit.ops.per_token_group_quant_fp8(
            x, group_size, fp8_dtype=output_q.dtype, column_major_scales=column_major, **common
        )
    if packed:
        live = _live_rows(x, masked_m, sorted_token_ids, num_tokens_post_padded, num_valid_tokens)
        pack_ue8m0(scales, output_s, live)
    return output_q, output_s

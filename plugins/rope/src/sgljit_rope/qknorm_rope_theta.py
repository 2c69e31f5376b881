"""``qknorm_rope_theta``: ``qknorm_rope`` with cos/sin computed in the kernel from ``rope_theta``
(plain rope, YaRN, Llama 3.1), no table: sglang's ``fused_qk_norm_rope`` (Qwen3-class attention, where a
``[max_pos, rotary_dim]`` table read per token is traffic the kernel can spare).

Declared in the rope family beside the table form (``qknorm_rope``, ops.py): the same q/k layout,
weights, positions, eps and styles; ``rotary_dim`` is an argument (the table form reads it from the
table's width).

Frequencies, as sglang 0.5.23's kernel computes them (in float32; float64 in the oracle): pair ``j``
of ``rotary_dim / 2`` turns at ``f_j = base ** (-2 j / rotary_dim)``; with ``factor != 1`` (YaRN)
``f_j = (f_j / factor) * r + f_j * (1 - r)`` with the ramp ``r = clamp((j - low) / (high - low), 0,
1)`` (``high`` nudged by 0.001 when ``|low - high| <= 1e-6``): pairs below ``low`` keep their
frequency, pairs above ``high`` are interpolated by ``factor``. With ``ramp_scale > 0`` the ramp
runs over ``u_j = ramp_scale * f_j`` instead of ``j``: Llama 3.1's smoothing, with ``ramp_scale =
original_max_position / (2 pi)`` (``u_j`` is the context over the wavelength), ``low =
high_freq_factor`` and ``high = low_freq_factor`` (:func:`qknorm_rope_theta` takes HF's names and
does this). The angle is ``position * f_j``
(the position as a float: exact below 2^24); the rotated dims are multiplied by
``attention_factor`` (YaRN's magnitude scale; 1.0 for plain rope), the tail (dims past
``rotary_dim``) is only normalized.

Numerics: RMSNorm in float32 (``x * rsqrt(mean(x^2) + eps) * weight``), *not* rounded before the
rotation (sglang's fused kernel rounds once, at the store; the table form rounds twice, as the
unfused qknorm + apply_rope pair does). The angle in float32 is the accuracy limit at long context:
``position * f`` rounds to half an ulp of the angle and ``f`` itself carries about an ulp, so at
position ``p`` the highest-frequency pairs' angle is off by up to about ``p * 2^-23`` radians (0.016
at 128k) against a float64 angle; the check cases' tolerance grows with their largest position by
that bound (HF's and sglang's tables, built in float32, share it).
"""

from __future__ import annotations

import math

import torch

from sgljit.op import Case, Cuda, Scalar, Sycl, Tensor

from .ops import (
    _POSITIONS,
    _QK,
    _check_qknorm_rope_head,
    _heads_of,
    _qknorm_rope_heads,
    _require_tensors,
    family,
)

__all__ = ["qknorm_rope_theta", "qknorm_rope_theta_torch"]

_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
_SYCL_LANES = 32  # work-items a head: one sub-group's worth, pairs strided over them


def _check_rotary_dim(rotary_dim: int, head_dim: int) -> None:
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(
            f"rotary_dim: expected an even number in [2, head_dim={head_dim}], got {rotary_dim}"
        )


def _check(q, rotary_dim) -> None:
    """What the spec cannot say: the head size the kernels take, rotary_dim against it."""
    _check_qknorm_rope_head(q.shape[2])
    _check_rotary_dim(rotary_dim, q.shape[2])


def frequencies(rotary_dim: int, base: float, factor: float, low: float, high: float,
                dtype: torch.dtype, ramp_scale: float = 0.0) -> torch.Tensor:  # fmt: skip
    """The ``rotary_dim / 2`` frequencies in ``dtype`` (the module doc's formula)."""
    j = torch.arange(rotary_dim // 2, dtype=dtype)
    freq = torch.pow(torch.tensor(base, dtype=dtype), -2.0 * j / rotary_dim)
    if factor != 1.0:
        high = high + 0.001 if abs(low - high) <= 1e-6 else high
        u = ramp_scale * freq if ramp_scale > 0 else j
        ramp = ((u - low) / (high - low)).clamp(0.0, 1.0)
        freq = freq / factor * ramp + freq * (1.0 - ramp)
    return freq


def qknorm_rope_theta_torch(q, k, q_weight, k_weight, positions, eps, is_neox, rotary_dim, base,
                            factor, low, high, attention_factor, ramp_scale=0.0):  # fmt: skip
    """New q and k (the op's math in float32, or float64 for float64 inputs)."""
    mdtype = torch.promote_types(q.dtype, torch.float32)
    freq = frequencies(rotary_dim, base, factor, low, high, mdtype, ramp_scale).to(q.device)
    angles = positions.to(mdtype).unsqueeze(1) * freq  # [T, r/2]
    cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)

    def one(x, w):
        xm = x.to(mdtype)
        y = xm * torch.rsqrt(xm.square().mean(-1, keepdim=True) + eps) * w.to(mdtype)
        rot, tail = y[..., :rotary_dim], y[..., rotary_dim:]
        if is_neox:
            x1, x2 = rot.chunk(2, dim=-1)
            out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((out * attention_factor, tail), dim=-1).to(x.dtype)

    return one(q, q_weight), one(k, k_weight)


def _reference(q, k, q_weight, k_weight, positions, eps, is_neox, rotary_dim, base, factor, low,
               high, attention_factor, ramp_scale) -> None:  # fmt: skip
    _check(q, rotary_dim)
    new_q, new_k = qknorm_rope_theta_torch(
        q, k, q_weight, k_weight, positions, eps, is_neox, rotary_dim, base, factor, low, high,
        attention_factor, ramp_scale,
    )  # fmt: skip
    q.copy_(new_q)
    k.copy_(new_k)


# ------------------------------------------------------------------------------------------------
# Specializations: element type, index type, style, YaRN or not (head_dim and rotary_dim are
# runtime values: one module serves every Qwen3-class head).

_PARAMS = ("dtype", "idx_dtype", "is_neox", "yarn")


def _key(q, k, q_weight, k_weight, positions, eps, is_neox, rotary_dim, base, factor, low, high,
         attention_factor, ramp_scale) -> tuple:  # fmt: skip
    if not 0 < rotary_dim <= q.shape[2] or rotary_dim % 2:  # (the module checks it too)
        _check_rotary_dim(rotary_dim, q.shape[2])
    return q.dtype, positions.dtype, is_neox, factor != 1.0


def _sycl_key(q, k, q_weight, k_weight, positions, eps, is_neox, rotary_dim, base, factor, low,
              high, attention_factor, ramp_scale) -> dict:  # fmt: skip
    _check(q, rotary_dim)
    return {"SGLJIT_T": q.dtype, "QKRT_IDX_T": positions.dtype, "QKRT_NEOX": int(is_neox),
            "QKRT_YARN": int(factor != 1.0), "QKRT_LANES": _SYCL_LANES}  # fmt: skip


def _launch(module, key, q, k, q_weight, k_weight, positions, eps, is_neox, rotary_dim, base,
            factor, low, high, attention_factor, ramp_scale) -> None:  # fmt: skip
    _check(q, rotary_dim)
    heads = q.shape[0] * (q.shape[1] + k.shape[1])
    if heads == 0:
        return
    fn = module.get_function(
        "qknorm_rope_theta", ("ptr",) * 5 + ("i64",) * 8 + ("f32",) * 7
    )  # fmt: skip
    fn(heads * _SYCL_LANES, _SYCL_LANES, q, k, q_weight, k_weight, positions, q.shape[1],
       k.shape[1], q.shape[2], rotary_dim, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
       eps, base, factor, low, high, attention_factor, ramp_scale)  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Check cases at Qwen3's shapes (head_dim 128, 32-64 q heads, 4-8 KV heads), positions up to 128k.

# The rounding of the outputs (one rounding a dim, to the dtype), relative to 1 + |expected|
_ROUNDING = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 2e-6}
_ANGLE_ULPS = 2  # the float32 angle: half an ulp from the product, about an ulp from f, rounded up


def _tolerance(dtype, max_position: int) -> float:
    """Rounding, plus the angle error at the largest position: |d out| <= |y| * d angle, |y| up to
    about 3x 1 + |expected| for these weights (|w| < 2.5 and unit-variance heads)."""
    angle_error = _ANGLE_ULPS * max(max_position, 1) * 2.0**-24
    return _ROUNDING[dtype] + 3 * angle_error


def _case(name, tokens, heads, head_dim, rot, dtype, is_neox=True, *, idx=torch.int64,
          max_position=4096, yarn=None, attention_factor=1.0, ramp_scale=0.0) -> Case:  # fmt: skip
    hq, hk = heads
    factor, low, high = yarn or (1.0, 0.0, 0.0)

    def make(device):
        width = (hq + 2 * hk) * head_dim + 64  # a fused qkv buffer's rows, padded
        buffer = torch.randn(tokens, width, device=device, dtype=dtype)
        q, k = _heads_of(buffer, 0, hq, head_dim), _heads_of(buffer, hq, hk, head_dim)
        weights = (1 + 0.5 * torch.randn(2, head_dim, device=device)).to(dtype)
        positions = torch.randint(0, max_position, (tokens,), dtype=idx, device=device)
        positions[0] = max_position - 1
        return (q, k, weights[0], weights[1], positions, 1e-6, is_neox, rot, 1e6, factor, low,
                high, attention_factor, ramp_scale)  # fmt: skip

    style = "neox" if is_neox else "gptj"
    rotary = f" rotary {rot}" if rot != head_dim else ""
    scaled = f" {'llama3' if ramp_scale else 'yarn'} x{factor}" if yarn else ""
    label = f"{tokens}x({hq}+{hk})x{head_dim} {style}{rotary}{scaled} pos<{max_position}"
    label += f" {str(dtype).removeprefix('torch.')} {name}"
    return Case(label.strip(), make, _tolerance(dtype, max_position))


_YARN = (4.0, 10.0, 40.0)  # Qwen3's YaRN: factor 4 over 32k, sglang's low/high ramp
_CASES = [
    _case("", 5, (32, 8), 128, 128, torch.bfloat16),
    _case(
        "",
        3,
        (64, 4),
        128,
        128,
        torch.bfloat16,
        max_position=131072,
        yarn=_YARN,
        attention_factor=1.1386,
    ),
    _case("", 4, (32, 8), 128, 128, torch.float32, max_position=131072),
    _case("", 4, (32, 8), 128, 128, torch.float32, False, max_position=32768, yarn=_YARN),
    _case("int32 positions", 3, (16, 4), 128, 64, torch.float16, idx=torch.int32),
    _case("", 2, (8, 2), 256, 256, torch.bfloat16, False),
    _case("", 3, (4, 1), 64, 32, torch.float32, yarn=(8.0, 4.0, 4.0)),  # low == high: nudged
    # Llama 3.1 (8B): factor 8, low/high frequency factors 1 and 4 over 8192 positions
    _case(
        "",
        4,
        (32, 8),
        128,
        128,
        torch.bfloat16,
        max_position=131072,
        yarn=(8.0, 4.0, 1.0),
        ramp_scale=8192 / (2 * math.pi),
    ),
]

_qknorm_rope_theta = family.op(
    "qknorm_rope_theta",
    args={
        **_QK,
        "q_weight": Tensor("head_dim", dtype="q", layout="contiguous"),
        "k_weight": Tensor("head_dim", dtype="q", layout="contiguous"),
        "positions": _POSITIONS,
        "eps": Scalar(float, min=0.0),
        "is_neox": Scalar(bool),
        "rotary_dim": Scalar(int, min=2),
        "base": Scalar(float, min=1e-30),
        "factor": Scalar(float, min=1e-30),
        "low": Scalar(float),
        "high": Scalar(float),
        "attention_factor": Scalar(float),
        "ramp_scale": Scalar(float, min=0.0),
    },
    reference=_reference,
    doc="See :func:`qknorm_rope_theta`.",
    cuda=Cuda(
        "csrc/qknorm_rope_theta.cuh",
        "sgljit_rope::QKNormRopeTheta<{dtype}, {idx_dtype}, {is_neox}, {yarn}>::run",
        key=_key,
        params=_PARAMS,
    ),
    sycl=Sycl("sycl/qknorm_rope_theta.hpp", key=_sycl_key, launch=_launch),
    prebuild={
        "cuda": [
            dict(zip(_PARAMS, (dt, torch.int64, True, yarn), strict=True))
            for dt in (torch.bfloat16, torch.float16)
            for yarn in (False, True)
        ],
    },
    cases=_CASES,
)


def qknorm_rope_theta(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    positions: torch.Tensor,
    *,
    base: float,
    rotary_dim: int | None = None,
    eps: float = 1e-6,
    is_neox: bool = True,
    factor: float = 1.0,
    low: float = 0.0,
    high: float = 0.0,
    attention_factor: float = 1.0,
    llama3_original_max_position: int | None = None,
) -> None:
    """Per-head RMSNorm of q ``[T, Hq, D]`` and k ``[T, Hk, D]`` then rotary embedding with cos/sin
    computed from ``base`` (``rope_theta``) in the kernel, in place, in one pass.

    ``rotary_dim`` (default D): the leading dims of a head that rotate (even, at most D).
    ``factor``/``low``/``high``/``attention_factor``: YaRN, as sglang's ``fused_qk_norm_rope``
    takes them (``factor == 1``: plain rope; see the module doc for the formula and numerics).
    ``llama3_original_max_position``: Llama 3.1's smoothing instead (HF's ``rope_type="llama3"``),
    with ``low``/``high`` its ``low_freq_factor``/``high_freq_factor``.
    q and k may be strided views (e.g. into a fused qkv buffer; last dim contiguous) or flattened
    ``[T, H * D]``; weights ``[D]`` of q's dtype; positions int32/int64 ``[T]``. fp16/bf16/fp32;
    D even, at most 1024.
    """
    try:
        if q.dim() != 3 or k.dim() != 3:
            q, k = _qknorm_rope_heads(q, k, q_weight)
        positions = positions.contiguous()
    except AttributeError:  # name the argument that is not a tensor
        _require_tensors(q=q, k=k, q_weight=q_weight, positions=positions)
        raise
    if rotary_dim is None:
        rotary_dim = q.shape[2]
    ramp_scale = 0.0
    if llama3_original_max_position is not None:
        if not llama3_original_max_position > 0:
            raise ValueError(
                "llama3_original_max_position: expected a positive number, got "
                f"{llama3_original_max_position}"
            )
        # the ramp over context / wavelength, from high_freq_factor down to low_freq_factor
        ramp_scale = llama3_original_max_position / (2 * math.pi)
        low, high = high, low
    _qknorm_rope_theta(
        q, k, q_weight, k_weight, positions, float(eps), is_neox, rotary_dim, float(base),
        float(factor), float(low), float(high), float(attention_factor), ramp_scale,
    )  # fmt: skip

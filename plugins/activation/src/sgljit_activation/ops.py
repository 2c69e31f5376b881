"""The activation family: the gated activations of an LLM's MLP, ``silu_and_mul`` (Llama, Qwen,
Mistral, DeepSeek), ``gelu_and_mul`` (erf GELU) and ``gelu_tanh_and_mul`` (Gemma), and
``silu_and_mul_per_token_group_quant_fp8`` (DeepSeek-style FP8 serving: the down projection's input
quantized per group of columns in the same pass).

Input ``[..., 2 * d]``, gate first, then up (vLLM's and FlashInfer's layout); output ``[..., d]`` =
``act(gate) * up``. float16, bfloat16, float32; math in float32, rounded once. Rows may be strided
(a row stride other than 2d, e.g. a slice of a bigger buffer); the last dimension is contiguous.

An op is declared once (``family.op``): its arguments, reference, kernels, what ``sgljit build``
prebuilds and the cases ``sgljit check`` and the conformance suite run. sgljit derives the torch
custom op, backend dispatch and every argument check from it (see ``sgljit.op``); what the spec
cannot say (input's width is twice out's; the group size divides it) is ``_check_halves`` and
``_check_groups`` here, and the same checks in the CUDA entry points.
"""

import torch

from sgljit.op import FLOATS, Case, Cuda, Family, Scalar, Sycl, Tensor, as_rows

from . import reference

__all__ = [
    "FP8_DTYPES",
    "GROUP_SIZES",
    "family",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "silu_and_mul",
    "silu_and_mul_per_token_group_quant_fp8",
]

family = Family("activation", __file__)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
GROUP_SIZES = (32, 64, 128)
_E4M3, _E5M2 = FP8_DTYPES
_BF16, _FP16, _FP32 = torch.bfloat16, torch.float16, torch.float32


# ------------------------------------------------------------------------------------------------
# What the spec cannot say (csrc/common.cuh's check_halves and csrc/activation_quant.cuh: the same
# messages)


def _check_halves(input, out) -> None:
    width, hidden = input.shape[1], out.shape[1]
    if width % 2:
        raise ValueError(f"input: last dimension must be even (gate and up halves), got {width}")
    if hidden * 2 != width:
        raise ValueError(
            f"out: dimension 1 expected {width // 2} (half of input's last dimension {width}), "
            f"got {hidden}"
        )


def _check_group_size(group_size: int) -> None:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size: expected one of 32, 64, 128, got {group_size}")


def _check_groups(input, out, scales, group_size) -> None:
    _check_group_size(group_size)
    _check_halves(input, out)
    hidden = out.shape[1]
    if hidden % group_size:
        raise ValueError(f"group_size: must divide out's last dimension {hidden}, got {group_size}")
    if scales.shape[1] != hidden // group_size:
        raise ValueError(
            f"scales: dimension 1 expected {hidden // group_size} (out's last dimension / "
            f"group_size), got {scales.shape[1]}"
        )


# ------------------------------------------------------------------------------------------------
# SYCL launches: the host decides the geometry (global size in work-items, work-group size).

_SYCL_WG = 256
_SYCL_MAX_GROUPS = 4096  # a grid-stride loop covers the rest
_SYCL_GROUP_ITEMS = 32  # sycl/activation_quant.hpp's kGroupItems: one work-group a group


def _sycl_vec(dtype: torch.dtype, hidden: int, *tensors: torch.Tensor) -> int:
    """16 bytes of elements a work-item where d, every pointer and row stride allow it, else 1."""
    vec = 16 // dtype.itemsize
    aligned = all(
        t.data_ptr() % 16 == 0 and (t.shape[0] == 1 or t.stride(0) % vec == 0) for t in tensors
    )
    return vec if hidden % vec == 0 and aligned else 1


def _act_sycl_key(input, out) -> dict:
    return {"SGLJIT_T": input.dtype, "ACT_VEC": _sycl_vec(input.dtype, out.shape[1], input, out)}


def _launch_act(kernel: str):
    def launch(module, key, input, out) -> None:
        _check_halves(input, out)
        rows, hidden = out.shape
        items = rows * (hidden // key["ACT_VEC"])
        if items == 0:
            return
        groups = min(-(-items // _SYCL_WG), _SYCL_MAX_GROUPS)
        fn = module.get_function(kernel, ("ptr", "ptr", "i64", "i64", "i64", "i64"))
        fn(groups * _SYCL_WG, _SYCL_WG, input, out, rows, hidden, input.stride(0), out.stride(0))

    return launch


_QUANT_SYCL_ARGS = (
    "ptr",
    "i64",
    "ptr",
    "i64",
    "ptr",
    "i64",
    "i64",
    "i64",
    "i64",
    "i64",
    "f32",
    "i32",
)


def _launch_quant(module, key, input, out, scales, group_size, eps, scale_ue8m0) -> None:
    _check_groups(input, out, scales, group_size)
    rows, hidden = out.shape
    per_row = hidden // group_size
    if rows * per_row == 0:
        return
    fn = module.get_function("silu_and_mul_quant_fp8", _QUANT_SYCL_ARGS)
    fn(
        rows * per_row * _SYCL_GROUP_ITEMS, _SYCL_GROUP_ITEMS, input, input.stride(0), out,
        out.stride(0), scales, scales.stride(0), scales.stride(1), hidden, per_row, group_size,
        eps, int(scale_ue8m0),
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Check cases: fresh random arguments in the op's order; the error against the float64 reference is
# max |result - expected| / (1 + |expected|).

# float32: PyTorch's GELU formula loses about 1e-6 of |gate| to cancellation in 1 + erf(...) (the
# kernels use it too), times |up|
_TOLERANCES = {_BF16: 2e-2, _FP16: 1e-2, _FP32: 5e-5}
# One fp8 step (adjacent codes differ by less): the float64 oracle's y may round to the other side of
# a code boundary. The fused op's exact contract is tested bit for bit in tests/plugins/test_activation.py.
_QUANT_TOL = {_E4M3: 0.125, _E5M2: 0.25}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").removeprefix("float8_")


def _rows(device, rows: int, width: int, dtype, pad: int = 0, offset: int = 0) -> torch.Tensor:
    """``[rows, width]`` random values (over several magnitudes) in columns ``[pad, pad + width)``
    of a wider buffer, ``offset`` elements into its storage (odd: not 16-byte aligned)."""
    full = torch.randn(offset + rows * (width + pad), device=device) * 3
    return full.to(dtype)[offset:].view(rows, width + pad)[:, pad:]


def _act_case(rows, hidden, dtype, pad=0, offset=0) -> Case:
    def make(device):
        out = torch.empty(rows, hidden + pad // 2, device=device, dtype=dtype)[:, pad // 2 :]
        return _rows(device, rows, 2 * hidden, dtype, pad, offset), out

    label = (" strided" if pad else "") + (" misaligned" if offset % 2 else "")
    return Case(f"{rows}x2*{hidden}{label} {_name(dtype)}", make, _TOLERANCES[dtype])


_ACT_CASES = [
    _act_case(7, 4096, _BF16),
    _act_case(300, 4096, _BF16),  # enough rows for the CUDA kernel's large-grid configuration
    _act_case(3, 1001, _FP16),  # an odd width: one element a vector
    _act_case(1, 768, _FP32),  # one token of a small MoE expert
    _act_case(5, 1408, _BF16, pad=256),  # rows 3072 and 1536 apart: strided, still aligned
    _act_case(4, 1000, _FP16, pad=6, offset=1),  # strided and misaligned
]


def _quant_case(rows, hidden, dtype, fp8_dtype, group_size, *, pad=0, offset=0, col_major=False,
                ue8m0=False) -> Case:  # fmt: skip
    """Groups of y over several magnitudes, one tiny (its scale is eps) and one all zero (up = 0)."""
    per_row = hidden // group_size

    def make(device):
        x = _rows(device, rows, 2 * hidden, dtype, pad, offset)
        up = x[:, hidden:].view(rows, per_row, group_size)
        mags = torch.exp2(torch.randint(-6, 7, (rows, per_row, 1), device=device).float())
        mags.view(-1)[0] = 1e-12
        if mags.numel() > 1:
            mags.view(-1)[-1] = 0.0
        up.copy_((up.float() * mags).to(dtype))
        out = torch.empty(rows, hidden + pad, device=device, dtype=fp8_dtype)[:, pad // 2 :][
            :, :hidden
        ]
        return x, out, _group_scales(rows, per_row, device, col_major), group_size, 1e-10, ue8m0

    label = (" strided" if pad else "") + (" misaligned" if offset % 2 else "")
    label += (" col-major" if col_major else "") + (" ue8m0" if ue8m0 else "")
    name = f"{rows}x2*{hidden} g{group_size}{label} {_name(dtype)}->{_name(fp8_dtype)}"
    return Case(name, make, _QUANT_TOL[fp8_dtype])


def _group_scales(rows: int, per_row: int, device, column_major: bool) -> torch.Tensor:
    """fp32 ``[rows, per_row]``: row-major, or column-major with 16-byte aligned columns (the token
    stride rounded up to 4 floats, as TMA loads of DeepSeek-style GEMMs need), as quant_fp8's."""
    if column_major:
        aligned = -(-rows // 4) * 4
        return torch.empty(per_row, aligned, dtype=torch.float32, device=device).t()[:rows]
    return torch.empty(rows, per_row, dtype=torch.float32, device=device)


# ------------------------------------------------------------------------------------------------
# The ops (destination passing: they write `out` (and `scales`) and return None)

_ACT_ARGS = {
    "input": Tensor("num_tokens", "gate_up"),  # float16/bfloat16/float32, unit last stride
    "out": Tensor("num_tokens", "hidden", dtype="input", io="out"),
}


def _act_op(name: str, kind: str, cpp: str):
    """One of the three gated activations: one CUDA module (and one SYCL module) per dtype holds
    all three."""

    def ref(input, out) -> None:
        _check_halves(input, out)
        reference.act_and_mul_into(kind, input, out)

    return family.op(
        name,
        args=_ACT_ARGS,
        reference=ref,
        doc=f"``out = {kind}(gate) * up``: see :func:`{name}`.",
        cuda=Cuda(
            "csrc/activation.cuh",
            f"sgljit_activation::ActAndMul<{{dtype}}, sgljit_activation::Act::{cpp}>::run",
            key=lambda input, out: (input.dtype,),
            params=("dtype",),
            module="act",
        ),
        sycl=Sycl("sycl/activation.hpp", key=_act_sycl_key, launch=_launch_act(name), module="act"),
        # One entry per dtype builds the module the three ops share.
        prebuild={
            "cuda": [{"dtype": dt} for dt in FLOATS],
            "sycl": [{"SGLJIT_T": dt, "ACT_VEC": 16 // dt.itemsize} for dt in FLOATS],
        }
        if kind == "silu"
        else None,
        cases=_ACT_CASES,
    )


_silu_and_mul = _act_op("silu_and_mul", "silu", "kSilu")
_gelu_and_mul = _act_op("gelu_and_mul", "gelu", "kGelu")
_gelu_tanh_and_mul = _act_op("gelu_tanh_and_mul", "gelu_tanh", "kGeluTanh")


def _quant_reference(input, out, scales, group_size, eps, scale_ue8m0) -> None:
    _check_groups(input, out, scales, group_size)
    reference.silu_and_mul_quant_fp8_into(input, out, scales, group_size, eps, scale_ue8m0)


def _quant_params(dtype, fp8_dtype, group_size) -> dict:
    """The CUDA module's template parameters; an unsupported group size is refused before a build."""
    _check_group_size(group_size)
    return {"dtype": dtype, "fp8_dtype": fp8_dtype, "group_size": group_size}


_silu_and_mul_quant = family.op(
    "silu_and_mul_per_token_group_quant_fp8",
    args={
        "input": Tensor("num_tokens", "gate_up"),
        "out": Tensor("num_tokens", "hidden", dtype=FP8_DTYPES, io="out"),
        "scales": Tensor("num_tokens", "groups", dtype=(_FP32,), layout="strided", io="out"),
        "group_size": Scalar(int, min=min(GROUP_SIZES), max=max(GROUP_SIZES)),
        "eps": Scalar(float, min=2.0**-126, max=float(torch.finfo(_FP32).max)),
        "scale_ue8m0": Scalar(bool),
    },
    reference=_quant_reference,
    doc="See :func:`silu_and_mul_per_token_group_quant_fp8`.",
    cuda=Cuda(
        "csrc/activation_quant.cuh",
        "sgljit_activation::SiluAndMulQuantFp8<{dtype}, {fp8_dtype}, {group_size}>::run",
        key=lambda input, out, scales, group_size, *_: (input.dtype, out.dtype, group_size),
        params=_quant_params,
        module="act_quant",
    ),
    sycl=Sycl(
        "sycl/activation_quant.hpp",
        key=lambda input, out, *_: {"SGLJIT_T": input.dtype, "ACT_FP8": out.dtype},
        launch=_launch_quant,
        module="act_quant",
    ),
    prebuild={
        "cuda": [{"dtype": dt, "fp8_dtype": _E4M3, "group_size": 128} for dt in (_BF16, _FP16)],
        "sycl": [{"SGLJIT_T": dt, "ACT_FP8": _E4M3} for dt in (_BF16, _FP16)],
    },
    cases=[
        _quant_case(9, 2048, _BF16, _E4M3, 128),
        _quant_case(1, 1408, _BF16, _E4M3, 128),  # one token of DeepSeek-style MoE expert width
        _quant_case(7, 7168, _BF16, _E5M2, 128, col_major=True),
        _quant_case(5, 4096, _BF16, _E4M3, 128, col_major=True, ue8m0=True),
        _quant_case(11, 1024, _FP16, _E4M3, 64, pad=64),
        _quant_case(3, 512, _FP32, _E5M2, 32, ue8m0=True),
        _quant_case(13, 640, _BF16, _E4M3, 128, offset=1),
        _quant_case(6, 96, _FP16, _E5M2, 32, pad=3, col_major=True),
    ],
)


# ------------------------------------------------------------------------------------------------
# Public functions


def _act(op, input, out) -> torch.Tensor:
    if not isinstance(input, torch.Tensor) or input.dim() == 0:
        what = "a 0-d tensor" if isinstance(input, torch.Tensor) else type(input).__name__
        raise TypeError(f"input: expected a torch.Tensor [..., 2 * d], got {what}")
    if out is None:
        out = input.new_empty((*input.shape[:-1], input.shape[-1] // 2))
    elif isinstance(out, torch.Tensor) and out.shape[:-1] != input.shape[:-1]:
        raise ValueError(
            f"out: expected leading dimensions {list(input.shape[:-1])} (input's), got "
            f"{list(out.shape)}"
        )
    op(as_rows(input, "input"), as_rows(out, "out", written=True))
    return out


def silu_and_mul(input: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``out = silu(gate) * up`` with ``gate, up = input[..., :d], input[..., d:]``,
    ``silu(x) = x / (1 + exp(-x))``.

    input ``[..., 2 * d]`` (float16, bfloat16, float32; rows may be strided, last dimension
    contiguous). Computed in float32 and rounded once. Returns ``out`` ``[..., d]`` of input's
    dtype (allocated if not given; its rows may be strided too).
    """
    return _act(_silu_and_mul, input, out)


def gelu_and_mul(input: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`silu_and_mul` with GELU's erf form, ``gelu(x) = x / 2 * (1 + erf(x / sqrt(2)))``."""
    return _act(_gelu_and_mul, input, out)


def gelu_tanh_and_mul(input: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`silu_and_mul` with GELU's tanh form, ``x / 2 * (1 + tanh(sqrt(2 / pi) * (x +
    0.044715 x^3)))`` (Gemma's ``gelu_pytorch_tanh``)."""
    return _act(_gelu_tanh_and_mul, input, out)


def silu_and_mul_per_token_group_quant_fp8(
    input: torch.Tensor,
    group_size: int = 128,
    *,
    eps: float = 1e-10,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    column_major_scales: bool = False,
    scale_ue8m0: bool = False,
    out: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``y = silu(gate) * up`` of ``input`` ``[T, 2 * d]`` (float16, bfloat16, float32; rows may be
    strided, the last dimension contiguous), quantized to ``fp8_dtype`` with one dynamic float32
    scale per group of ``group_size`` (32, 64 or 128, dividing d) consecutive columns of a row.

    Numerics: ``y`` is the float32 product :func:`silu_and_mul` computes, **not rounded** to the
    input's dtype; the codes and scales are then bit for bit those of sgljit-quant-fp8's
    ``per_token_group_quant_fp8`` applied to it (on every backend, each backend with its own float32
    ``y``): ``per_token_group_quant_fp8(silu_and_mul(input.float()), group_size, eps=..., ...)``.
    That is, ``scale = max(absmax(group) / fp8_max, eps)`` (true float32 division, eps a positive
    normal float32 value; with ``scale_ue8m0`` rounded up to a power of two, ``2^ceil(log2(scale))``)
    and codes ``(y / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)``. A NaN in a group gives a NaN
    scale and NaN codes for the group; an inf an inf scale, NaN codes for the infs and +-0 for the
    rest. The unfused pair (silu_and_mul in the input's dtype, then quantize) rounds y to that dtype
    in between, so its codes can differ by one step.

    Returns ``(out [T, d], scales [T, d / group_size])``: ``scales`` row-major, or with
    ``column_major_scales`` column-major as DeepSeek-style FP8 GEMMs take it (strides ``(1,
    T_aligned)``, T rounded up to a multiple of 4). ``out`` (fp8_dtype ``[T, d]``, last dimension
    contiguous) and ``scales`` (float32, in the layout ``column_major_scales`` names) may be given.
    """
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(
            f"fp8_dtype: expected torch.float8_e4m3fn or torch.float8_e5m2, got {fp8_dtype!r}"
        )
    if not isinstance(input, torch.Tensor) or input.dim() != 2:
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
        raise ValueError(f"input: expected a 2-D tensor [T, 2 * d], got shape {list(input.shape)}")
    rows, hidden = input.shape[0], input.shape[1] // 2
    if out is None:
        out = torch.empty(rows, hidden, dtype=fp8_dtype, device=input.device)
    elif isinstance(out, torch.Tensor) and out.dtype != fp8_dtype:
        raise TypeError(f"out: dtype must be {fp8_dtype} (fp8_dtype), got {out.dtype}")
    # (a group size the op refuses allocates no groups; the op then names it)
    valid = isinstance(group_size, int) and not isinstance(group_size, bool) and group_size > 0
    per_row = hidden // group_size if valid else 0
    if scales is None:
        scales = _group_scales(rows, per_row, input.device, column_major_scales)
    elif isinstance(scales, torch.Tensor) and scales.dim() == 2:
        dim = 0 if column_major_scales else 1
        if scales.stride(dim) != 1 and scales.shape[dim] > 1:
            raise ValueError(
                f"scales: column_major_scales={column_major_scales} expects stride 1 along "
                f"dimension {dim}, got strides {tuple(scales.stride())}"
            )
    _silu_and_mul_quant(input, out, scales, group_size, eps, scale_ue8m0)
    return out, scales

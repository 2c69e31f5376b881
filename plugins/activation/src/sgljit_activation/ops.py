"""The activation family: the gated activations of an LLM's MLP, ``silu_and_mul`` (Llama, Qwen,
DeepSeek), ``gelu_and_mul`` (erf GELU), ``gelu_tanh_and_mul`` (Gemma), and SiLU-and-mul fused with
per-token-group fp8 quantization (DeepSeek-style FP8 serving). Input ``[..., 2 * d]``, gate then up
(vLLM's layout); output ``[..., d]``; float16, bfloat16, float32, math in float32, rounded once.
"""

import functools

import torch

from sgljit import fp8
from sgljit.op import FLOATS, Cuda, Family, Scalar, Sizes, Sycl, Tensor, vector_width

from . import reference

__all__ = ["FP8_DTYPES", "GROUP_SIZES", "family", "gelu_and_mul", "gelu_tanh_and_mul",
           "silu_and_mul", "silu_and_mul_per_token_group_quant_fp8"]  # fmt: skip

family = Family("activation", __file__)
FP8_DTYPES, GROUP_SIZES = fp8.FP8_DTYPES, (32, 64, 128)
(_E4M3, _E5M2), (_BF16, _FP16, _FP32) = FP8_DTYPES, (torch.bfloat16, torch.float16, torch.float32)
# float32: PyTorch's GELU formula (the kernels' too) loses ~1e-6 of |gate| in 1 + erf(...), times |up|
_TOL = {_BF16: 2e-2, _FP16: 1e-2, _FP32: 5e-5}
# One fp8 step: the float64 oracle's y may round across a code boundary (bit for bit: test_activation)
_QUANT_TOL = {_E4M3: 0.125, _E5M2: 0.25}

_ACT_CASES = [  # real widths: Llama 8B/70B, one odd width, a small MoE expert, strided and misaligned
    Sizes({"rows": 7, "d": 4096}, _BF16, _TOL),
    Sizes({"rows": 300, "d": 4096}, _BF16, _TOL),  # the CUDA kernel's large-grid configuration
    Sizes({"rows": 3, "d": 1001}, _FP16, _TOL),
    Sizes({"rows": 1, "d": 768}, _FP32, _TOL),
    Sizes({"rows": 5, "d": 1408}, _BF16, _TOL, pad=256),
    Sizes({"rows": 4, "d": 1000}, _FP16, _TOL, pad=6, offset=1),
]
_ACT_PREBUILD = {  # one entry per dtype
    "cuda": [{"dtype": dt} for dt in FLOATS],
    "sycl": [{"SGLJIT_T": dt, "ACT_VEC": 16 // dt.itemsize} for dt in FLOATS],
}


def _act_sycl_key(input, out) -> dict:
    return {"SGLJIT_T": input.dtype, "ACT_VEC": vector_width(input.dtype, out.shape[1], input, out)}


def _act_op(name: str, kind: str, cpp: str):
    """One of the three gated activations; one module per dtype (CUDA and SYCL) holds all three."""
    return family.op(
        name,
        args={"input": Tensor("...", "2*d"), "out": Tensor("...", "d", dtype="input", io="out")},
        reference=functools.partial(reference.act_and_mul_into, kind),
        doc=f"``out = {kind}(gate) * up``: see :func:`{name}`.",
        cuda=Cuda(
            "csrc/activation.cuh",
            f"sgljit_activation::ActAndMul<{{dtype}}, sgljit_activation::Act::{cpp}>::run",
            key=lambda input, out: (input.dtype,),
            params=("dtype",),
            module="act",
        ),
        sycl=Sycl(
            "sycl/activation.hpp",
            key=_act_sycl_key,
            items=lambda n, key: n["rows"] * (n["d"] // key["ACT_VEC"]),
            max_groups=4096,  # a grid-stride loop covers the rest
            module="act",
        ),
        prebuild=_ACT_PREBUILD if kind == "silu" else None,  # the module the three share
        cases=_ACT_CASES,
    )


_silu_and_mul = _act_op("silu_and_mul", "silu", "kSilu")
_gelu_and_mul = _act_op("gelu_and_mul", "gelu", "kGelu")
_gelu_tanh_and_mul = _act_op("gelu_tanh_and_mul", "gelu_tanh", "kGeluTanh")
silu_and_mul = _silu_and_mul.public(
    "``out = silu(gate) * up``, ``gate, up = input[..., :d], input[..., d:]``, ``silu(x) = x / (1 +"
    " exp(-x))``; rows may be strided (last dimension contiguous)."
)
gelu_and_mul = _gelu_and_mul.public(
    """:func:`silu_and_mul` with GELU's erf form, ``gelu(x) = x / 2 * (1 + erf(x / sqrt(2)))``."""
)
gelu_tanh_and_mul = _gelu_tanh_and_mul.public(
    ":func:`silu_and_mul` with GELU's tanh form (Gemma's ``gelu_pytorch_tanh``)."
)


def _quant_case(rows, d, dtype, fp8_dtype, group_size, ue8m0=False, **layout) -> Sizes:
    fill = lambda args: fp8.spread_groups(args[0][:, d:], group_size)  # noqa: E731 (y's magnitudes)
    values = {"group_size": group_size, "eps": 1e-10, "scale_ue8m0": ue8m0}
    return Sizes({"T": rows, "d": d}, dtype, _QUANT_TOL[fp8_dtype], {"out": fp8_dtype}, values,
                 fill=fill, label=f"g{group_size}" + " ue8m0" * ue8m0, **layout)  # fmt: skip


_silu_and_mul_quant = family.op(
    "silu_and_mul_per_token_group_quant_fp8",
    args={
        "input": Tensor("T", "2*d"),
        "out": Tensor("T", "d", dtype=FP8_DTYPES, io="out"),
        "scales": Tensor("T", "d/group_size", dtype=(_FP32,), layout="strided", io="out"),
        "group_size": Scalar(int, one_of=GROUP_SIZES),
        "eps": Scalar(float, min=2.0**-126, max=float(torch.finfo(_FP32).max)),
        "scale_ue8m0": Scalar(bool),
    },
    reference=reference.silu_and_mul_quant_fp8_into,
    doc="See :func:`silu_and_mul_per_token_group_quant_fp8`.",
    cuda=Cuda(
        "csrc/activation_quant.cuh",
        "sgljit_activation::SiluAndMulQuantFp8<{dtype}, {fp8_dtype}, {group_size}>::run",
        key=lambda input, out, scales, group_size, *_: (input.dtype, out.dtype, group_size),
        params=("dtype", "fp8_dtype", "group_size"),
        module="act_quant",
    ),
    sycl=Sycl(
        "sycl/activation_quant.hpp",
        key=lambda input, out, *_: {"SGLJIT_T": input.dtype, "ACT_FP8": out.dtype},
        kernel="silu_and_mul_quant_fp8",
        items=lambda n, key: n["T"] * (n["d"] // n["group_size"]) * 32,  # 32 work-items a group
        group=32,
        module="act_quant",
    ),
    prebuild={
        "cuda": [{"dtype": dt, "fp8_dtype": _E4M3, "group_size": 128} for dt in (_BF16, _FP16)],
        "sycl": [{"SGLJIT_T": dt, "ACT_FP8": _E4M3} for dt in (_BF16, _FP16)],
    },
    cases=[
        _quant_case(9, 2048, _BF16, _E4M3, 128),
        _quant_case(1, 1408, _BF16, _E4M3, 128),  # one token of DeepSeek-style MoE expert width
        _quant_case(7, 7168, _BF16, _E5M2, 128, column_major=("scales",)),
        _quant_case(5, 4096, _BF16, _E4M3, 128, True, column_major=("scales",)),
        _quant_case(11, 1024, _FP16, _E4M3, 64, pad=64),
        _quant_case(3, 512, _FP32, _E5M2, 32, True),
        _quant_case(13, 640, _BF16, _E4M3, 128, offset=1),
        _quant_case(6, 96, _FP16, _E5M2, 32, pad=3, column_major=("scales",)),
    ],
)


silu_and_mul_per_token_group_quant_fp8 = fp8.group_quant_function(
    _silu_and_mul_quant,
    """``y = silu(gate) * up`` of ``input`` ``[T, 2 * d]`` in float32, quantized to ``fp8_dtype``
    with one float32 scale per group of ``group_size`` (32, 64 or 128, dividing d) columns of a row:
    bit for bit sgljit-quant-fp8's ``per_token_group_quant_fp8(silu_and_mul(input.float()), ...)``
    (``scale = max(absmax / fp8_max, eps)``, ue8m0: rounded up to a power of two; NaN and inf as
    there). The unfused pair rounds y to the input's dtype in between: its codes can differ by a step.

    Returns ``(out [T, d], scales [T, d / group_size])``, ``scales`` row-major or, with
    ``column_major_scales``, column-major with 16-byte aligned columns (DeepSeek-style FP8 GEMMs);
    both may be given (scales in that layout).
    """,
    gated=True,
)

"""LayerNorm: ``layernorm`` (gamma and beta) and ``layernorm_quant_fp8`` (LayerNorm -> fp8 with a
static per-tensor scale, e4m3 or e5m2), for vision towers, diffusion transformers and older LLMs.

``y = (x - mean) * rsqrt(var + eps) * gamma + beta`` over the last dimension, mean and (biased)
variance in float32 by two passes over the row the kernel holds (no cancellation where the mean is
large against the spread; the row is read from memory once either way), rounded once to the input's
dtype. Dtypes float16, bfloat16, float32; gamma and beta of the input's dtype or both float32. CUDA
kernels are specialized by dtype, parameter dtype and row width: widths that are a whole number of
16-byte vectors (up to 32768 16-bit elements) take the fast path (the row in registers), any other
width or alignment a correct generic kernel.

LayerNorm -> fp8 quantizes the float32 ``y`` (not rounded to the input's dtype first) as the norm
family's RMSNorm -> fp8 does: ``out = (y / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)`` with a
correctly rounded float32 division. No fused residual add: FlashInfer's ``layernorm`` and
``layernorm_quant`` have none, nor have vLLM and sglang a LayerNorm kernel; FlashInfer's
``fused_dit_*_layernorm_*`` (a gated residual and DiT's scale/shift modulation) are other ops.
"""

import torch

from sgljit.op import Case, Cuda, Scalar, Sycl, Tensor, as_rows

from .ops import compiled_width, family
from .reference import FP8_DTYPES, quantize_fp8

__all__ = [
    "layer_norm",
    "layernorm",
    "layernorm_into",
    "layernorm_quant_fp8",
    "layernorm_quant_fp8_into",
]

_E4M3, _E5M2 = FP8_DTYPES
_FP32 = (torch.float32,)
# Widths of the models LayerNorm serves: SigLIP/ViT towers 1152, 1280, 1408; DiT 1152, 3072;
# GPT-2/OPT/Falcon-era LLMs 2048, 4096, 5120.
_FLEET_HIDDENS = (1152, 1280, 1408, 2048, 3072, 4096, 5120)
_TOLERANCES = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 1e-5}
_QUANT_TOL = {_E4M3: 0.125, _E5M2: 0.25}  # one fp8 step (as the RMSNorm -> fp8 cases)


# ------------------------------------------------------------------------------------------------
# Reference (the CPU path and the test oracle)


def layer_norm(
    x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float
) -> torch.Tensor:
    """LayerNorm over the last dimension in float32 (float64 for float64 rows: the test oracle),
    mean and variance by two passes; returns that dtype."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(dtype)
    centered = xf - xf.mean(-1, keepdim=True)
    var = centered.square().mean(-1, keepdim=True)
    return centered * torch.rsqrt(var + eps) * gamma.to(dtype) + beta.to(dtype)


def layernorm_into(
    input: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, out: torch.Tensor, eps: float
) -> None:
    """``out = (input - mean) * rsqrt(var + eps) * gamma + beta``, rounded once."""
    out.copy_(layer_norm(input, gamma, beta, eps))


def layernorm_quant_fp8_into(
    input: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    scale: torch.Tensor,
    out: torch.Tensor,
    eps: float,
) -> None:
    """``out = quantize(layernorm(input, gamma, beta, eps) / scale)`` (scale: float32 ``[1]``)."""
    out.copy_(quantize_fp8(layer_norm(input, gamma, beta, eps), scale, out.dtype))


# ------------------------------------------------------------------------------------------------
# Specializations


def _cuda_params(dtype: torch.dtype, weight: torch.dtype, hidden: int, fp8=None) -> dict:
    params = {"dtype": dtype, "weight": weight, "width": compiled_width(dtype, hidden)}
    if fp8 is not None:
        params["fp8_dtype"] = fp8
    return params


def _sycl_vec(hidden: int, *tensors: torch.Tensor) -> int:
    """16 bytes of the rows' dtype when the width, every pointer (aligned to that many elements of
    its own dtype) and every row stride allow it, else 1 element."""
    vec = 16 // tensors[0].element_size()
    if hidden % vec:
        return 1
    for t in tensors:
        if t.data_ptr() % (vec * t.element_size()):
            return 1
        if t.dim() == 2 and t.shape[0] > 1 and t.stride(0) % vec:
            return 1
    return vec


def _sycl_key(dtype: torch.dtype, weight: torch.dtype, hidden: int, vec: int, fp8=None) -> dict:
    """norm_row.hpp's macros; work-items per row a power of two in [16, 256] (sub-groups of 16)."""
    key = {
        "SGLJIT_T": dtype,
        "NORM_W": weight,
        "NORM_HIDDEN": hidden,
        "NORM_VEC": vec,
        "NORM_WG": min(256, max(16, 1 << (hidden // vec - 1).bit_length())),
    }
    if fp8 is not None:
        key["LN_FP8"] = fp8
    return key


def _sycl_rows_key(input, gamma, beta, *rest) -> dict:
    """(input, gamma, beta, out, eps) or (input, gamma, beta, scale, out, eps)."""
    out = rest[-2]
    fp8 = out.dtype if len(rest) == 3 else None
    hidden = input.shape[-1]
    vec = _sycl_vec(hidden, input, gamma, beta, *((out,) if fp8 is None else ()))
    return _sycl_key(input.dtype, gamma.dtype, hidden, vec, fp8)


def _sycl_launch(kernel: str):
    def launch(module, key, input, gamma, beta, *rest) -> None:
        *scale, out, eps = rest
        rows = input.shape[0]
        if rows == 0:
            return
        kinds = ("ptr",) * (4 + len(scale)) + ("i64", "i64", "f32")
        wg = key["NORM_WG"]
        fn = module.get_function(kernel, kinds)
        fn(rows * wg, wg, input, gamma, beta, *scale, out, input.stride(0), out.stride(0), eps)

    return launch


# ------------------------------------------------------------------------------------------------
# Check cases: real-model widths, odd widths (generic kernel), strided and unaligned rows


def _case(
    tokens: int,
    hidden: int,
    dtype: torch.dtype,
    weight: torch.dtype | None = None,
    *,
    fp8: torch.dtype | None = None,
    pad: int = 0,
    offset: float = 0.0,
    label: str = "",
) -> Case:
    """Rows of several magnitudes around ``offset`` (a DiT-like mean far from 0 tests the two-pass
    variance); ``pad``: input and out are column slices of wider buffers (pad odd: unaligned);
    ``fp8``: the quant op's case, with a scale that saturates some e4m3 values."""
    weight = weight or dtype

    def make(device):
        full = torch.randn(tokens, hidden + pad, device=device)
        rows = full.mul(torch.rand(tokens, 1, device=device) * 3 + 0.1).add(offset)
        x = rows.to(dtype)[:, pad:]
        gamma = (torch.randn(hidden, device=device) * 0.5 + 1).to(weight)
        beta = torch.randn(hidden, device=device).to(weight)
        if fp8 is None:
            out = torch.empty(tokens, hidden + pad, device=device, dtype=dtype)[:, pad:]
            return x, gamma, beta, out, 1e-6
        out = torch.empty(tokens, hidden + pad, device=device, dtype=fp8)[:, pad:]
        return x, gamma, beta, torch.tensor([0.0075], device=device), out, 1e-5

    name = f"{tokens}x{hidden}{label} {str(dtype).removeprefix('torch.')}"
    if weight != dtype:
        name += f" params {str(weight).removeprefix('torch.')}"
    if fp8 is not None:
        name += f"->{str(fp8).removeprefix('torch.float8_')}"
    return Case(name, make, _QUANT_TOL[fp8] if fp8 else _TOLERANCES[dtype])


_BF16, _FP16, _F32 = torch.bfloat16, torch.float16, torch.float32
_LAYERNORM_CASES = [
    _case(7, 4096, _BF16, _F32),  # FlashInfer's contract: bf16 rows, float32 gamma and beta
    _case(5, 1152, _BF16),
    _case(3, 1280, _FP16, _F32),
    _case(2, 1408, _F32),
    _case(4, 3072, _BF16, _F32, offset=8.0, label=" mean 8"),
    _case(1, 5120, _FP16),
    _case(3, 2048, _BF16, pad=16, label=" strided"),
    _case(2, 32768, _BF16, _F32),  # past 1024 threads of 2 vectors: gamma and beta from L1
    _case(3, 37, _BF16, _F32),
    _case(4, 1001, _F32, pad=1, label=" unaligned"),
    _case(2, 1000, _FP16, pad=3, label=" unaligned"),
]
_QUANT_CASES = [
    _case(7, 4096, _BF16, _F32, fp8=_E4M3),
    _case(1, 1152, _BF16, fp8=_E5M2),
    _case(5, 1280, _FP16, _F32, fp8=_E4M3, pad=24, label=" strided"),
    _case(4, 3072, _BF16, _F32, fp8=_E4M3, offset=8.0, label=" mean 8"),
    _case(3, 37, _BF16, fp8=_E5M2),
    _case(4, 1001, _F32, fp8=_E4M3, pad=1, label=" unaligned"),
    _case(2, 2048, _FP16, fp8=_E5M2),
]


# ------------------------------------------------------------------------------------------------
# The ops (destination passing)


def _args(quant: bool) -> dict:
    args = {
        "input": Tensor("num_tokens", "hidden"),
        "gamma": Tensor("hidden", dtype=("input", torch.float32), layout="contiguous"),
        "beta": Tensor("hidden", dtype="gamma", layout="contiguous"),
    }
    if quant:
        args["scale"] = Tensor(1, dtype=_FP32, layout="strided")
        args["out"] = Tensor("num_tokens", "hidden", dtype=FP8_DTYPES, io="out")
    else:  # in place: out=input
        args["out"] = Tensor("num_tokens", "hidden", dtype="input", io="out", alias="input")
    args["eps"] = Scalar(float, min=0.0)
    return args


_layernorm = family.op(
    "layernorm",
    args=_args(quant=False),
    reference=layernorm_into,
    cuda=Cuda(
        "csrc/layernorm.cuh",
        "sgljit_layernorm::LayerNorm<{dtype}, {weight}, sgljit_layernorm::NoQuant, {width}>::plain",
        key=lambda x, gamma, *_: (x.dtype, gamma.dtype, x.shape[1]),
        params=_cuda_params,
    ),
    sycl=Sycl("sycl/layernorm.hpp", key=_sycl_rows_key, launch=_sycl_launch("layernorm")),
    prebuild={
        "cuda": [
            _cuda_params(dt, w, h)
            for dt, w in ((_BF16, _F32), (_BF16, _BF16), (_FP16, _FP16))
            for h in _FLEET_HIDDENS
        ],
        "sycl": [_sycl_key(_BF16, w, h, 8) for w in (_F32, _BF16) for h in _FLEET_HIDDENS],
    },
    cases=_LAYERNORM_CASES,
)

_layernorm_quant_fp8 = family.op(
    "layernorm_quant_fp8",
    args=_args(quant=True),
    reference=layernorm_quant_fp8_into,
    cuda=Cuda(
        "csrc/layernorm.cuh",
        "sgljit_layernorm::LayerNorm<{dtype}, {weight}, {fp8_dtype}, {width}>::quant",
        key=lambda x, gamma, beta, scale, out, eps: (x.dtype, gamma.dtype, x.shape[1], out.dtype),
        params=_cuda_params,
    ),
    sycl=Sycl(
        "sycl/layernorm_quant.hpp", key=_sycl_rows_key, launch=_sycl_launch("layernorm_quant_fp8")
    ),
    prebuild={
        "cuda": [_cuda_params(_BF16, _F32, h, _E4M3) for h in _FLEET_HIDDENS],
        "sycl": [_sycl_key(_BF16, _F32, h, 8, _E4M3) for h in _FLEET_HIDDENS],
    },
    cases=_QUANT_CASES,
)


# ------------------------------------------------------------------------------------------------
# Public functions


def layernorm(
    input: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float = 1e-6,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out = (input - mean) * rsqrt(var + eps) * gamma + beta`` over the last dimension (biased
    variance, as ``torch.nn.functional.layer_norm``), in float32, rounded once.

    input ``[..., H]`` float16, bfloat16 or float32 (rows may be strided; the last dimension
    contiguous), gamma and beta ``[H]``, both of input's dtype or both float32. Returns ``out``
    (allocated like input if not given); ``out`` may be ``input`` (in place).
    """
    if out is None:
        try:
            out = torch.empty_like(input, memory_format=torch.contiguous_format)
        except TypeError:
            raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}") from None
    _layernorm(as_rows(input, "input"), gamma, beta, as_rows(out, "out", True), eps)
    return out


def layernorm_quant_fp8(
    input: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    scale: torch.Tensor,
    eps: float = 1e-6,
    *,
    fp8_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """LayerNorm, then fp8 quantization, in one pass: ``y`` = :func:`layernorm` in float32 (not
    rounded to the input's dtype), ``out = (y / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)``
    (correctly rounded float32 division, round to nearest even; NaN stays NaN).

    input, gamma, beta as :func:`layernorm`; ``scale``: float32 ``[1]`` (or ``[]``), the static
    per-tensor scale. ``fp8_dtype``: torch.float8_e4m3fn (fp8_max 448, the default) or
    torch.float8_e5m2 (57344); without it, ``out``'s dtype. ``out``: fp8 ``[..., H]`` (rows may be
    strided). Returns ``out``.
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    if fp8_dtype is None:
        fp8_dtype = out.dtype if isinstance(out, torch.Tensor) else _E4M3
    elif fp8_dtype not in FP8_DTYPES:
        raise TypeError(
            f"fp8_dtype: expected torch.float8_e4m3fn or torch.float8_e5m2, got {fp8_dtype!r}"
        )
    elif isinstance(out, torch.Tensor) and out.dtype != fp8_dtype:
        raise TypeError(f"out: dtype must be {fp8_dtype} (fp8_dtype), got {out.dtype}")
    if out is None:
        out = torch.empty_like(input, dtype=fp8_dtype, memory_format=torch.contiguous_format)
    if isinstance(scale, torch.Tensor) and scale.dim() == 0:
        scale = scale.view(1)
    _layernorm_quant_fp8(
        as_rows(input, "input"), gamma, beta, scale, as_rows(out, "out", True), eps
    )
    return out

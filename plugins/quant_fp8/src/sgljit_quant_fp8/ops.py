"""FP8 quantization: ``per_tensor_quant_fp8`` (static or dynamic scale), ``per_token_quant_fp8`` and
``per_token_group_quant_fp8``, each returning ``(out, scale)``. Codes are bit for bit PyTorch's
``(x.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)`` for the same fp32 scale on every
backend; dynamic scales are ``max(absmax / fp8_max, 2^-126)`` (NaN in, NaN scale).

``SGLJIT_QUANT_FP8_DYNAMIC`` (read at import) picks the CUDA algorithm of the dynamic per-tensor
op: ``auto`` (default: up to 64 KB one launch of the per-token kernel on the tensor as one row;
beyond twice the L2 ``three_kernels``: absmax, scale, static kernel; bf16 from a quarter of the L2
``fused``: one cooperative kernel, sm_90+, 16-byte-aligned data; else ``two_kernels``: absmax, then
a pass that computes the scale itself), or one of those always; another value makes the dynamic op
raise, naming the variable. SYCL has one algorithm (two kernels).
"""

import os

import torch

from sgljit import fp8
from sgljit.op import Cuda, Family, Scalar, Sizes, Sycl, Tensor

from . import reference

__all__ = ["FP8_DTYPES", "GROUP_SIZES", "WORKSPACE_SIZE", "family", "per_tensor_quant_fp8",
           "per_token_group_quant_fp8", "per_token_quant_fp8"]  # fmt: skip

family = Family("quant_fp8", __file__)
FP8_DTYPES, GROUP_SIZES = fp8.FP8_DTYPES, (16, 32, 64, 128, 256)
(_E4M3, _E5M2), _FP32 = FP8_DTYPES, (torch.float32,)
_BF16, _FP16 = torch.bfloat16, torch.float16
# Partial maxima of the dynamic per-tensor scale: one slot per block of the absmax pass (its grid is
# capped by it). The dynamic op takes a workspace of exactly this size.
WORKSPACE_SIZE = 1024
_DYNAMIC_ALGOS = {"auto": 0, "fused": 1, "two_kernels": 2, "three_kernels": 3}


def _dynamic_algo(name: str) -> int:
    """The dynamic op's ``algo`` for a ``SGLJIT_QUANT_FP8_DYNAMIC`` value."""
    if name not in _DYNAMIC_ALGOS:
        raise ValueError(
            f"SGLJIT_QUANT_FP8_DYNAMIC={name!r}: expected one of {', '.join(_DYNAMIC_ALGOS)}"
        )
    return _DYNAMIC_ALGOS[name]


# Read once (the eager path does no environment lookups); a bad value is raised by the dynamic op.
try:
    _DYNAMIC_ALGO: int | None = _dynamic_algo(os.environ.get("SGLJIT_QUANT_FP8_DYNAMIC", "auto"))
    _DYNAMIC_ALGO_ERROR: ValueError | None = None
except ValueError as _err:
    _DYNAMIC_ALGO, _DYNAMIC_ALGO_ERROR = None, _err

# One module per (input dtype, fp8 dtype) holds the per-tensor and per-token kernels (CUDA) and all
# four (SYCL); every check case is bit-exact (tolerance 0: the float64 oracle's x.float() recovers
# the 16/32-bit input exactly).
_INPUT_DTYPES = (_BF16, _FP16, torch.float32)
_COMBOS = [(dt, f) for dt in _INPUT_DTYPES for f in FP8_DTYPES]
_MODULE = "quant"


def _sycl_key(dtype: torch.dtype, fp8_dtype: torch.dtype) -> dict:
    return {"SGLJIT_T": dtype, "QFP8_E5M2": int(fp8_dtype == _E5M2)}


def _kernels(entry: str, key, **sycl) -> dict:
    """The CUDA and SYCL kernels of an op of the shared module; ``key(*args)``: (dtype, fp8 dtype)."""
    return {
        "cuda": Cuda("csrc/quant_fp8.cuh", f"sgljit_quant_fp8::QuantFp8<{{dtype}}, {{fp8_dtype}}>::{entry}",
                     key=key, params=("dtype", "fp8_dtype"), module=_MODULE),
        "sycl": Sycl("sycl/quant_fp8.hpp", key=lambda *a: _sycl_key(*key(*a)), module=_MODULE, **sycl),
    }  # fmt: skip


def _case(rows, hidden, dtype, fp8_dtype, mag=3.0, static=False, **more) -> Sizes:
    """Input ``mag`` times normal random values; a static scale of 0.0371 (saturating some codes)."""

    def fill(args) -> None:
        args[0].mul_(mag / 3)
        if static:
            args[1].fill_(0.0371)

    algo = more.get("values", {}).get("algo")
    label = "" if algo is None else next(k for k, v in _DYNAMIC_ALGOS.items() if v == algo)
    return Sizes({"num_tokens": rows, "hidden": hidden}, dtype, 0.0, {"out": fp8_dtype},
                 **{"fill": fill, "label": label, **more})  # fmt: skip


def _launch_dynamic(module, key, input, out, scale, workspace, algo) -> None:
    """Two kernels (partial maxima, then every work-group reduces them and quantizes its range);
    an empty input still writes the scale (2^-126)."""
    n, wg = input.numel(), 256
    items = max(1, min(workspace.numel(), -(-n // (wg * 64)))) * wg
    absmax = module.get_function("quant_fp8_absmax", ("ptr", "ptr", "i64"))
    quant = module.get_function("quant_fp8_dynamic", ("ptr", "ptr", "ptr", "ptr", "i64"))
    absmax(items, wg, input, workspace, n)
    quant(items, wg, input, out, scale, workspace, n)


_TH = ("num_tokens", "hidden")
_per_tensor_static = family.op(
    "per_tensor_quant_fp8_static",
    args={
        "input": Tensor(*_TH, layout="contiguous"),
        "scale": Tensor(1, dtype=_FP32, layout="strided"),
        "out": Tensor(*_TH, dtype=FP8_DTYPES, layout="contiguous", io="out"),
    },
    reference=reference.per_tensor_static_into,
    **_kernels(
        "per_tensor_static",
        lambda input, scale, out: (input.dtype, out.dtype),
        kernel="quant_fp8_static",
        items=lambda n, key: -(-n["num_tokens"] * n["hidden"] // 16),  # 16 elements a work-item
        max_groups=1024,
    ),
    # One entry per (dtype, fp8 dtype) builds the module all three ops share.
    prebuild={
        "cuda": [{"dtype": dt, "fp8_dtype": f} for dt, f in _COMBOS],
        "sycl": [_sycl_key(dt, f) for dt, f in _COMBOS],
    },
    cases=[
        *(_case(7, 1000, dt, f, 50.0, True) for dt, f in _COMBOS),
        _case(3, 37, _BF16, _E4M3, 50.0, True, offset=1),
    ],
)

_per_tensor_dynamic = family.op(
    "per_tensor_quant_fp8_dynamic",
    args={
        "input": Tensor(*_TH, layout="contiguous"),
        "out": Tensor(*_TH, dtype=FP8_DTYPES, layout="contiguous", io="out"),
        "scale_out": Tensor(1, dtype=_FP32, layout="strided", io="out"),
        "workspace": Tensor(WORKSPACE_SIZE, dtype=_FP32, layout="contiguous", io="scratch"),
        "algo": Scalar(int, min=0, max=3),
    },
    reference=reference.per_tensor_dynamic_into,
    doc="""``scale_out[0] = max(absmax(input) / fp8_max, 2^-126)``,
    ``out = quantize(input / scale_out)``.
    ``workspace``: float32 ``[WORKSPACE_SIZE]`` (contents irrelevant, overwritten). ``algo`` (CUDA;
    the reference and SYCL have one): 0 auto, 1 the fused cooperative kernel, 2 two kernels, 3
    three kernels (see the module docstring).""",
    **_kernels(
        "per_tensor_dynamic",
        lambda input, out, *_: (input.dtype, out.dtype),
        launch=_launch_dynamic,
    ),
    cases=[
        *(_case(33, 4096, dt, f, values={"algo": 0}) for dt, f in _COMBOS),
        _case(3, 37, _BF16, _E4M3, offset=1, values={"algo": 0}),
        _case(4, 1024, torch.float32, _E5M2, values={"algo": 0}),
        *(_case(257, 4096, _BF16, _E4M3, values={"algo": a}) for a in (1, 2, 3)),
        _case(257, 4097, _FP16, _E5M2, offset=1, values={"algo": 1}),
    ],
)


def _rows_over_magnitudes(args) -> None:
    args[0].mul_(torch.rand(args[0].shape[0], 1, device=args[0].device) * 10 / 3)


_per_token = family.op(
    "per_token_quant_fp8",
    args={
        "input": Tensor(*_TH),
        "out": Tensor(*_TH, dtype=FP8_DTYPES, io="out"),
        "scales": Tensor("num_tokens", 1, dtype=_FP32, layout="contiguous", io="out"),
    },
    reference=reference.per_token_into,
    **_kernels(
        "per_token",
        lambda input, out, scales: (input.dtype, out.dtype),
        kernel="quant_fp8_per_token",
        items=lambda n, key: n["num_tokens"] * 64,  # one work-group of 64 a row
        group=64,
    ),
    cases=[
        *(_case(9, 2048, dt, f, fill=_rows_over_magnitudes) for dt, f in _COMBOS),
        _case(7, 37, _BF16, _E5M2, fill=_rows_over_magnitudes, pad=3),
        _case(5, 1000, torch.float32, _E4M3, fill=_rows_over_magnitudes, pad=32),
    ],
)


def _group_case(rows, hidden, dtype, fp8_dtype, group_size, ue8m0=False, **layout) -> Sizes:
    """Groups over several magnitudes, one of them tiny (its scale is eps) and one all zero."""
    values = {"group_size": group_size, "eps": 1e-10, "scale_ue8m0": ue8m0}
    fill = lambda args: fp8.spread_groups(args[0], group_size, -8, 8)  # noqa: E731
    return _case(rows, hidden, dtype, fp8_dtype, values=values, fill=fill,
                 label=f"g{group_size}" + " ue8m0" * ue8m0, **layout)  # fmt: skip


_group_scales = fp8.group_scales
_GROUP_PREBUILD = {"cuda": [{"dtype": dt, "fp8_dtype": _E4M3, "group_size": g}
                            for dt, g in ((_BF16, 128), (_FP16, 128), (_BF16, 64))]}  # fmt: skip
_per_token_group = family.op(
    "per_token_group_quant_fp8",
    args={
        "input": Tensor(*_TH),
        "out": Tensor(*_TH, dtype=FP8_DTYPES, io="out"),
        "scales": Tensor(
            "num_tokens", "hidden/group_size", dtype=_FP32, layout="strided", io="out"
        ),
        "group_size": Scalar(int, min=min(GROUP_SIZES), max=max(GROUP_SIZES), one_of=GROUP_SIZES),
        "eps": Scalar(float, min=2.0**-126, max=float(torch.finfo(torch.float32).max)),
        "scale_ue8m0": Scalar(bool),
    },  # eps: a positive normal fp32 value (so the scale is never 0 or subnormal)
    reference=reference.per_token_group_into,
    doc="""``scales[t, g] = max(absmax(group) / fp8_max, eps)`` (ue8m0: a power of two), ``out``
    the groups quantized with them; see :func:`per_token_group_quant_fp8`.""",
    # CUDA: a module per (input dtype, fp8 dtype, group size); SYCL: a kernel of the shared module
    cuda=Cuda(
        "csrc/group.cuh",
        "sgljit_quant_fp8::GroupQuantFp8<{dtype}, {fp8_dtype}, {group_size}>::run",
        key=lambda input, out, scales, group_size, *_: (input.dtype, out.dtype, group_size),
        params=("dtype", "fp8_dtype", "group_size"),
        module="group",
    ),
    sycl=Sycl(
        "sycl/quant_fp8.hpp",
        key=lambda input, out, *_: _sycl_key(input.dtype, out.dtype),
        kernel="quant_fp8_per_token_group",
        items=lambda n, key: n["num_tokens"] * (n["hidden"] // n["group_size"]) * 32,
        group=32,  # one work-group a group
        module=_MODULE,
    ),
    prebuild=_GROUP_PREBUILD,
    cases=[
        _group_case(9, 2048, _BF16, _E4M3, 128),
        _group_case(7, 7168, _BF16, _E5M2, 128, column_major=("scales",)),
        _group_case(5, 4096, _BF16, _E4M3, 128, True, column_major=("scales",)),
        _group_case(11, 1024, _FP16, _E4M3, 64, pad=64),
        _group_case(3, 512, torch.float32, _E5M2, 32, True),
        _group_case(13, 640, _BF16, _E4M3, 128, offset=1),
        _group_case(6, 96, _FP16, _E5M2, 32, pad=3, column_major=("scales",)),
    ],
)


# ------------------------------------------------------------------------------------------------
# Public functions


def _as_rows(input, out) -> tuple:
    """A non-2-D ``input`` and ``out`` as ``[1, numel]`` views (both contiguous, one shape)."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out: expected a torch.Tensor or None, got {type(out).__name__}")
    if out.shape != input.shape:
        raise ValueError(
            f"out: shape {tuple(out.shape)} does not match input's {tuple(input.shape)}"
        )
    for name, t in (("input", input), ("out", out)):
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous() first)")
    return input.view(1, -1), out.view(1, -1)


def per_tensor_quant_fp8(
    input: torch.Tensor,
    scale: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    scale_out: torch.Tensor | None = None,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``input`` (fp16/bf16/fp32, contiguous, any shape) to ``fp8_dtype`` with one scale.

    ``scale=None``: dynamic, ``scale = max(absmax(input) / fp8_max, 2^-126)``, returned as a new
    fp32 ``[1]`` tensor, or written into ``scale_out`` (fp32 ``[1]`` or ``[]``) and returned as it. A given
    fp32 scale tensor (shape ``[1]`` or ``[]``): static, returned as is. ``out`` (optional): fp8
    tensor of input's shape, contiguous. Returns ``(out, scale)`` with
    ``out = (input.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)`` bit for bit.
    """
    fp8.check_fp8_dtype(fp8_dtype)
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    if out is None:
        out = torch.empty_like(input, dtype=fp8_dtype, memory_format=torch.contiguous_format)
    fp8.check_out_dtype(out, fp8_dtype)
    x, o = (input, out) if input.dim() == 2 else _as_rows(input, out)
    if scale is not None:
        if scale_out is not None:
            raise ValueError("scale_out: only for a dynamic scale (scale=None), got both")
        if isinstance(scale, torch.Tensor) and scale.dim() == 0:
            _per_tensor_static(x, scale.view(1), o)
        else:
            _per_tensor_static(x, scale, o)
        return out, scale
    if _DYNAMIC_ALGO is None:
        raise _DYNAMIC_ALGO_ERROR
    scale = scale_out
    if scale is None:
        scale = torch.empty(1, dtype=torch.float32, device=input.device)
    workspace = torch.empty(WORKSPACE_SIZE, dtype=torch.float32, device=input.device)
    one = scale.view(1) if isinstance(scale, torch.Tensor) and scale.dim() == 0 else scale
    _per_tensor_dynamic(x, o, one, workspace, _DYNAMIC_ALGO)
    return out, scale


def per_token_quant_fp8(
    input: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize each row of ``input`` ``[T, H]`` (fp16/bf16/fp32; rows may be strided, the last
    dimension contiguous) with its own dynamic scale ``max(absmax(row) / fp8_max, 2^-126)``.

    Returns ``(out [T, H] fp8_dtype, scales [T, 1] fp32)``; either may be given (``out``: fp8,
    ``[T, H]``, last dimension contiguous; ``scales``: float32 ``[T, 1]``, contiguous) — serving
    loops that reuse buffers skip two allocations per call.
    """
    out, scales = fp8.group_outputs(input, None, fp8_dtype, False, out, scales)
    _per_token(input, out, scales)
    return out, scales


per_token_group_quant_fp8 = fp8.group_quant_function(
    _per_token_group,
    """Quantize ``input`` ``[T, H]`` (fp16/bf16/fp32; rows may be strided, the last dimension
    contiguous) to ``fp8_dtype`` with one dynamic fp32 scale per group of ``group_size`` (16, 32,
    64, 128 or 256, dividing H) consecutive elements of a row: ``scale = max(absmax(group) / fp8_max, eps)``
    (true fp32 division; eps a positive normal fp32 value), with ``scale_ue8m0`` rounded up to a
    power of two exactly; codes ``(x.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)`` bit
    for bit (NaN and inf as torch computes them).

    Returns ``(out [T, H], scales [T, H / group_size])``, ``scales`` row-major or, with
    ``column_major_scales``, column-major with 16-byte aligned columns (DeepSeek-style FP8 GEMMs'
    TMA loads); both may be given (``scales`` in that layout).

    Differences from sglang's kernel: see the README. int8 output and the MoE layouts:
    :mod:`sgljit_quant_fp8.moe`.
    """,
)

"""FP8 quantization: ``per_tensor_quant_fp8`` (static or dynamic scale), ``per_token_quant_fp8`` and
``per_token_group_quant_fp8``.

All return ``(out, scale)``. Quantized values are bit-identical to PyTorch's
``(x.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)`` for the same fp32 scale, on every
backend (CUDA: hardware conversion after a correctly rounded division; SYCL: software conversion
with round-to-nearest-even, saturation and NaN handling). Dynamic scales are
``max(absmax / fp8_max, 2^-126)`` in fp32: all-zero input gets a finite scale; a NaN in the input
gives a NaN scale (as ``torch.amax`` does). fp8_max is 448 (float8_e4m3fn) or 57344 (float8_e5m2).

The kernel ops (``sgljit::per_tensor_quant_fp8_static``, ``sgljit::per_tensor_quant_fp8_dynamic``,
``sgljit::per_token_quant_fp8``, ``sgljit::per_token_group_quant_fp8``) are destination passing; the
public functions allocate and return the tuple, so ``torch.compile(fullgraph=True)`` and CUDA graphs
work. One module per (input dtype, fp8 dtype) holds the first three kernels on CUDA, and all four on
SYCL; per-token-group has its own CUDA module per (input dtype, fp8 dtype, group size).

``SGLJIT_QUANT_FP8_DYNAMIC`` picks the CUDA algorithm of the dynamic per-tensor op; it is read
once, when this module is imported (set it before the first use of a quant op): ``auto`` (the
default: up to 64 KB of input one launch of the per-token kernel on the tensor as one row; beyond
twice the GPU's L2 size ``three_kernels``: absmax, scale, then the static kernel; bf16 from a
quarter of the L2 size up to there ``fused``: one cooperative kernel, sm_90+ with 16-byte-aligned
data; else ``two_kernels``: absmax, then a quantize pass that computes the scale itself), or one of
those always. Another value makes the dynamic op raise (naming the variable). SYCL has one
algorithm (two kernels).
"""

import os

import torch

from sgljit.op import Case, Cuda, Family, Scalar, Sycl, Tensor

from . import reference

__all__ = [
    "FP8_DTYPES",
    "GROUP_SIZES",
    "WORKSPACE_SIZE",
    "family",
    "per_tensor_quant_fp8",
    "per_token_group_quant_fp8",
    "per_token_quant_fp8",
]

family = Family("quant_fp8", __file__)
FP8_DTYPES = reference.FP8_DTYPES
_E4M3, _E5M2 = FP8_DTYPES
_FP32 = (torch.float32,)
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


# ------------------------------------------------------------------------------------------------
# Specializations: one module per (input dtype, fp8 dtype) with all three kernels.

_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_CUDA_PARAMS = ("dtype", "fp8_dtype")  # the key of every CUDA kernel: input dtype, output fp8 dtype
_CUDA_FILE = "csrc/quant_fp8.cuh"
_CUDA_CLASS = "sgljit_quant_fp8::QuantFp8<{dtype}, {fp8_dtype}>"
_SYCL_FILE = "sycl/quant_fp8.hpp"
_MODULE = "quant"


def _sycl_key(dtype: torch.dtype, fp8_dtype: torch.dtype) -> dict:
    return {"SGLJIT_T": dtype, "QFP8_E5M2": int(fp8_dtype == _E5M2)}


_PREBUILD = {
    "cuda": [{"dtype": dt, "fp8_dtype": f} for dt in _INPUT_DTYPES for f in FP8_DTYPES],
    "sycl": [_sycl_key(dt, f) for dt in _INPUT_DTYPES for f in FP8_DTYPES],
}

_SYCL_WG = 256


def _sycl_items(n: int, per_item: int, max_groups: int) -> int:
    """Global size: enough work-groups of _SYCL_WG for ``n`` elements at ``per_item`` each."""
    groups = max(1, min(max_groups, -(-n // (_SYCL_WG * per_item))))
    return groups * _SYCL_WG


def _launch_static(module, key, input, scale, out) -> None:
    n = input.numel()
    if n == 0:
        return
    fn = module.get_function("quant_fp8_static", ("ptr", "ptr", "ptr", "i64"))
    fn(_sycl_items(n, 16, 1024), _SYCL_WG, input, scale, out, n)


def _launch_dynamic(module, key, input, out, scale, workspace, algo) -> None:
    """Two kernels (partial maxima, then every work-group reduces them and quantizes its range);
    an empty input still writes the scale (2^-126)."""
    n = input.numel()
    items = _sycl_items(n, 64, workspace.numel())
    absmax = module.get_function("quant_fp8_absmax", ("ptr", "ptr", "i64"))
    quant = module.get_function("quant_fp8_dynamic", ("ptr", "ptr", "ptr", "ptr", "i64"))
    absmax(items, _SYCL_WG, input, workspace, n)
    quant(items, _SYCL_WG, input, out, scale, workspace, n)


def _launch_per_token(module, key, input, out, scales) -> None:
    rows, hidden = input.shape
    if rows == 0:
        return
    fn = module.get_function("quant_fp8_per_token", ("ptr", "i64", "ptr", "i64", "ptr", "i64"))
    wg = 64
    fn(rows * wg, wg, input, input.stride(0), out, out.stride(0), scales, hidden)


# ------------------------------------------------------------------------------------------------
# Check cases: bit-exact (tolerance 0) against the reference. The float64 oracle gives the same
# bytes: the reference converts with x.float(), which recovers the 16/32-bit input exactly.


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").removeprefix("float8_")


_COMBOS = [(dt, f) for dt in _INPUT_DTYPES for f in FP8_DTYPES]


def _rand(device, shape, dtype, mul: float = 1.0, offset: int = 0) -> torch.Tensor:
    """Contiguous random ``shape`` in ``dtype``; ``offset`` elements into its storage (so not
    16-byte aligned when odd)."""
    n = 1
    for s in shape:
        n *= s
    flat = torch.randn(offset + n, device=device) * mul
    return flat.to(dtype)[offset:].view(shape)


def _fp8(device, shape, fp8_dtype, offset: int = 0) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.empty(offset + n, device=device, dtype=fp8_dtype)[offset:].view(shape)


def _static_case(shape, dtype, fp8_dtype, offset=0, label="") -> Case:
    def make(device):
        x = _rand(device, shape, dtype, 50.0, offset)
        scale = torch.tensor([0.0371], device=device)
        return x, scale, _fp8(device, shape, fp8_dtype, offset)

    name = f"{shape[0]}x{shape[1]}{label} {_name(dtype)}->{_name(fp8_dtype)}"
    return Case(name, make, 0.0)


def _dynamic_case(shape, dtype, fp8_dtype, algo=0, offset=0, label="") -> Case:
    def make(device):
        x = _rand(device, shape, dtype, 3.0, offset)
        scale = torch.empty(1, device=device)
        workspace = torch.empty(WORKSPACE_SIZE, device=device)
        return x, _fp8(device, shape, fp8_dtype, offset), scale, workspace, algo

    algo_name = next(k for k, v in _DYNAMIC_ALGOS.items() if v == algo)
    name = f"{shape[0]}x{shape[1]}{label} {algo_name} {_name(dtype)}->{_name(fp8_dtype)}"
    return Case(name, make, 0.0)


def _per_token_case(rows, hidden, dtype, fp8_dtype, pad=0) -> Case:
    """Rows over several magnitudes; ``pad``: input and out are column slices of wider buffers
    (strided rows, starting ``pad`` and ``pad // 2`` elements in)."""

    def make(device):
        x = torch.randn(rows, hidden + pad, device=device) * torch.rand(rows, 1, device=device) * 10
        x = x.to(dtype)[:, pad : pad + hidden]
        out = torch.empty(rows, hidden + pad, device=device, dtype=fp8_dtype)
        out = out[:, pad // 2 : pad // 2 + hidden]
        return x, out, torch.empty(rows, 1, device=device)

    label = " strided" if pad else ""
    return Case(f"{rows}x{hidden}{label} {_name(dtype)}->{_name(fp8_dtype)}", make, 0.0)


_BF16 = torch.bfloat16

# ------------------------------------------------------------------------------------------------
# The kernel ops (destination passing). Per-tensor ops see the tensor as [rows, cols] (contiguous;
# the kernels treat it as one flat range), the public function views other shapes as [1, numel].


def _kernels(entry: str, key, launch) -> dict:
    """The CUDA and SYCL kernels of a quant op: one module per (input dtype, fp8 dtype) exports all
    three ops; ``key(*args)`` gives that pair."""
    return {
        "cuda": Cuda(
            _CUDA_FILE, f"{_CUDA_CLASS}::{entry}", key=key, params=_CUDA_PARAMS, module=_MODULE
        ),
        "sycl": Sycl(_SYCL_FILE, key=lambda *a: _sycl_key(*key(*a)), launch=launch, module=_MODULE),
    }


_per_tensor_static = family.op(
    "per_tensor_quant_fp8_static",
    args={
        "input": Tensor("num_tokens", "hidden", layout="contiguous"),
        "scale": Tensor(1, dtype=_FP32, layout="strided"),
        "out": Tensor("num_tokens", "hidden", dtype=FP8_DTYPES, layout="contiguous", io="out"),
    },
    reference=reference.per_tensor_static_into,
    **_kernels(
        "per_tensor_static", lambda input, scale, out: (input.dtype, out.dtype), _launch_static
    ),
    # One entry per (dtype, fp8 dtype) builds the module all three ops share.
    prebuild=_PREBUILD,
    cases=[
        *(_static_case((7, 1000), dt, f) for dt, f in _COMBOS),
        _static_case((3, 37), _BF16, _E4M3, offset=1, label=" misaligned"),
    ],
)

_per_tensor_dynamic = family.op(
    "per_tensor_quant_fp8_dynamic",
    args={
        "input": Tensor("num_tokens", "hidden", layout="contiguous"),
        "out": Tensor("num_tokens", "hidden", dtype=FP8_DTYPES, layout="contiguous", io="out"),
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
        "per_tensor_dynamic", lambda input, out, *_: (input.dtype, out.dtype), _launch_dynamic
    ),
    cases=[
        *(_dynamic_case((33, 4096), dt, f) for dt, f in _COMBOS),
        _dynamic_case((3, 37), _BF16, _E4M3, offset=1, label=" misaligned"),
        _dynamic_case((4, 1024), torch.float32, _E5M2),
        *(_dynamic_case((257, 4096), _BF16, _E4M3, algo=a) for a in (1, 2, 3)),
        _dynamic_case((257, 4097), torch.float16, _E5M2, algo=1, offset=1, label=" misaligned"),
    ],
)

_per_token = family.op(
    "per_token_quant_fp8",
    args={
        "input": Tensor("num_tokens", "hidden"),
        "out": Tensor("num_tokens", "hidden", dtype=FP8_DTYPES, io="out"),
        "scales": Tensor("num_tokens", 1, dtype=_FP32, layout="contiguous", io="out"),
    },
    reference=reference.per_token_into,
    **_kernels("per_token", lambda input, out, scales: (input.dtype, out.dtype), _launch_per_token),
    cases=[
        *(_per_token_case(9, 2048, dt, f) for dt, f in _COMBOS),
        _per_token_case(7, 37, _BF16, _E5M2, pad=3),
        _per_token_case(5, 1000, torch.float32, _E4M3, pad=32),
    ],
)


# ------------------------------------------------------------------------------------------------
# Per-token-group: on CUDA its own module per (input dtype, fp8 dtype, group size) (csrc/group.cuh);
# on SYCL a kernel of the shared module, the group size an argument.

GROUP_SIZES = (16, 32, 64, 128, 256)
_MIN_EPS = 2.0**-126  # eps: a positive normal fp32 value (so the scale is never 0 or subnormal)
_MAX_EPS = float(torch.finfo(torch.float32).max)


def _check_group_size(group_size: int) -> None:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size: expected one of 16, 32, 64, 128, 256, got {group_size}")


def _check_groups(input, scales, group_size) -> None:
    """What the spec cannot say (csrc/group.cuh checks the same, with the same messages)."""
    _check_group_size(group_size)
    hidden = input.shape[1]
    if hidden % group_size:
        raise ValueError(
            f"group_size: must divide input's last dimension {hidden}, got {group_size}"
        )
    if scales.shape[1] != hidden // group_size:
        raise ValueError(
            f"scales: dimension 1 expected {hidden // group_size} (input's last dimension / "
            f"group_size), got {scales.shape[1]}"
        )


def _group_reference(input, out, scales, group_size, eps, scale_ue8m0) -> None:
    _check_groups(input, scales, group_size)
    reference.per_token_group_into(input, out, scales, group_size, eps, scale_ue8m0)


def _group_params(dtype, fp8_dtype, group_size) -> dict:
    """The CUDA module's template parameters; an unsupported group size is refused before a build."""
    _check_group_size(group_size)
    return {"dtype": dtype, "fp8_dtype": fp8_dtype, "group_size": group_size}


_GROUP_SYCL_ARGS = ("ptr", "i64", "ptr", "i64", "ptr", "i64", "i64", "i64", "i64", "f32", "i32")


def _launch_group(module, key, input, out, scales, group_size, eps, scale_ue8m0) -> None:
    _check_groups(input, scales, group_size)
    rows, hidden = input.shape
    per_row = hidden // group_size
    if rows * per_row == 0:
        return
    fn = module.get_function("quant_fp8_per_token_group", _GROUP_SYCL_ARGS)
    wg = 32
    fn(
        rows * per_row * wg, wg, input, input.stride(0), out, out.stride(0), scales,
        scales.stride(0), scales.stride(1), per_row, group_size, eps, int(scale_ue8m0),
    )  # fmt: skip


def _group_case(
    rows, hidden, dtype, fp8_dtype, group_size, *, pad=0, offset=0, column_major=False, ue8m0=False
) -> Case:
    """Groups over several magnitudes, one of them tiny (its scale is eps) and one all zero.
    ``pad``: input and out are column slices of wider buffers (strided rows); ``offset``: input
    starts that many elements into its storage (odd: no 16-byte vectors); ``column_major``: scales
    as DeepSeek-style GEMMs take them (strides (1, rows rounded up to 4))."""
    per_row = hidden // group_size

    def make(device):
        mags = torch.exp2(torch.randint(-8, 9, (rows, per_row, 1), device=device).float())
        mags.view(-1)[0] = 1e-12
        if mags.numel() > 1:
            mags.view(-1)[-1] = 0.0
        x = (torch.randn(rows, per_row, group_size, device=device) * mags).view(rows, hidden)
        width = hidden + pad
        flat = torch.randn(offset + rows * width, device=device).to(dtype)
        full = flat[offset:].view(rows, width)
        full[:, pad : pad + hidden] = x.to(dtype)
        out = torch.empty(rows, width, device=device, dtype=fp8_dtype)
        out = out[:, pad // 2 : pad // 2 + hidden]
        return (
            full[:, pad : pad + hidden],
            out,
            _group_scales(rows, per_row, device, column_major),
            group_size,
            1e-10,
            ue8m0,
        )

    label = "".join(
        [
            " strided" if pad else "",
            " misaligned" if offset % 2 else "",
            " col-major" if column_major else "",
            " ue8m0" if ue8m0 else "",
        ]
    )
    name = f"{rows}x{hidden} g{group_size}{label} {_name(dtype)}->{_name(fp8_dtype)}"
    return Case(name, make, 0.0)


def _group_scales(rows: int, per_row: int, device, column_major: bool) -> torch.Tensor:
    """fp32 ``[rows, per_row]``: row-major, or column-major with columns 16-byte aligned (the
    token stride rounded up to 4 floats, as TMA loads of DeepSeek-style GEMMs need)."""
    if column_major:
        aligned = -(-rows // 4) * 4
        return torch.empty(per_row, aligned, dtype=torch.float32, device=device).t()[:rows]
    return torch.empty(rows, per_row, dtype=torch.float32, device=device)


_per_token_group = family.op(
    "per_token_group_quant_fp8",
    args={
        "input": Tensor("num_tokens", "hidden"),
        "out": Tensor("num_tokens", "hidden", dtype=FP8_DTYPES, io="out"),
        "scales": Tensor("num_tokens", "groups", dtype=_FP32, layout="strided", io="out"),
        "group_size": Scalar(int, min=min(GROUP_SIZES), max=max(GROUP_SIZES)),
        "eps": Scalar(float, min=_MIN_EPS, max=_MAX_EPS),
        "scale_ue8m0": Scalar(bool),
    },
    reference=_group_reference,
    doc="""Per group of ``group_size`` (16 to 256, a power of two dividing H) consecutive elements of a row of
    ``input`` ``[T, H]``: ``scales[t, g] = max(absmax(group) / fp8_max, eps)`` (fp32; with
    ``scale_ue8m0`` rounded up to a power of two), ``out`` = the group quantized with it. ``scales``
    fp32 ``[T, H / group_size]`` in any layout whose elements are distinct (row- or column-major).
    ``eps``: a positive normal fp32 value. See :func:`per_token_group_quant_fp8`.""",
    cuda=Cuda(
        "csrc/group.cuh",
        "sgljit_quant_fp8::GroupQuantFp8<{dtype}, {fp8_dtype}, {group_size}>::run",
        key=lambda input, out, scales, group_size, *_: (input.dtype, out.dtype, group_size),
        params=_group_params,
        module="group",
    ),
    sycl=Sycl(
        _SYCL_FILE,
        key=lambda input, out, *_: _sycl_key(input.dtype, out.dtype),
        launch=_launch_group,
        module=_MODULE,
    ),
    prebuild={
        "cuda": [
            {"dtype": _BF16, "fp8_dtype": _E4M3, "group_size": 128},
            {"dtype": torch.float16, "fp8_dtype": _E4M3, "group_size": 128},
            {"dtype": _BF16, "fp8_dtype": _E4M3, "group_size": 64},
        ]
    },
    cases=[
        _group_case(9, 2048, _BF16, _E4M3, 128),
        _group_case(7, 7168, _BF16, _E5M2, 128, column_major=True),
        _group_case(5, 4096, _BF16, _E4M3, 128, column_major=True, ue8m0=True),
        _group_case(11, 1024, torch.float16, _E4M3, 64, pad=64),
        _group_case(3, 512, torch.float32, _E5M2, 32, ue8m0=True),
        _group_case(13, 640, _BF16, _E4M3, 128, offset=1),
        _group_case(6, 96, torch.float16, _E5M2, 32, pad=3, column_major=True),
    ],
)


# ------------------------------------------------------------------------------------------------
# Public functions


def _check_fp8_dtype(fp8_dtype) -> None:
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(
            f"fp8_dtype: expected torch.float8_e4m3fn or torch.float8_e5m2, got {fp8_dtype!r}"
        )


def _check_out_dtype(out, fp8_dtype) -> None:
    if isinstance(out, torch.Tensor) and out.dtype != fp8_dtype:
        raise TypeError(f"out: dtype must be {fp8_dtype} (fp8_dtype), got {out.dtype}")


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
    _check_fp8_dtype(fp8_dtype)
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    if out is None:
        out = torch.empty_like(input, dtype=fp8_dtype, memory_format=torch.contiguous_format)
    else:
        _check_out_dtype(out, fp8_dtype)
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
    _check_fp8_dtype(fp8_dtype)
    if not isinstance(input, torch.Tensor) or input.dim() != 2:
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
        raise ValueError(f"input: expected a 2-D tensor [T, H], got shape {tuple(input.shape)}")
    if out is None:
        out = torch.empty_like(input, dtype=fp8_dtype, memory_format=torch.contiguous_format)
    else:
        _check_out_dtype(out, fp8_dtype)
    if scales is None:
        scales = torch.empty(input.shape[0], 1, dtype=torch.float32, device=input.device)
    _per_token(input, out, scales)
    return out, scales


def per_token_group_quant_fp8(
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
    """Quantize ``input`` ``[T, H]`` (fp16/bf16/fp32; rows may be strided, the last dimension
    contiguous) to ``fp8_dtype`` with one dynamic fp32 scale per group of ``group_size`` (16, 32,
    64, 128 or 256, dividing H) consecutive elements of a row.

    ``scale = max(absmax(group) / fp8_max, eps)`` (true fp32 division, eps rounded to fp32; eps a
    positive normal fp32 value); with ``scale_ue8m0`` rounded up to a power of two,
    ``2^ceil(log2(scale))`` exactly. Codes are ``(x.float() / scale).clamp(-fp8_max,
    fp8_max).to(fp8_dtype)`` bit for bit. NaN and inf as torch computes them: a NaN in a group
    gives a NaN scale and NaN codes for the whole group; an inf gives an inf scale, NaN codes for
    the infs and +-0 for the rest of its group.

    Returns ``(out [T, H], scales [T, H / group_size])``. ``scales`` is row-major, or with
    ``column_major_scales`` column-major as DeepSeek-style FP8 GEMMs take it: strides ``(1,
    T_aligned)``, T rounded up to a multiple of 4 (16-byte aligned columns for TMA). ``out``
    (fp8_dtype, ``[T, H]``, last dimension contiguous) and ``scales`` (fp32, in the layout
    ``column_major_scales`` names) may be given.

    Differences from sglang's ``per_token_group_quant_8bit``: its scale is ``max(absmax, eps) /
    fp8_max`` (different only for groups with absmax below ``eps * fp8_max``, e.g. all-zero
    groups: sglang ``eps / fp8_max``, here ``eps``); its absmax skips NaNs (here NaN propagates);
    with ue8m0 it rounds through ``exp2f(ceilf(log2f(s)))`` and writes packed uint8 exponents
    (int32 words, for Blackwell GEMMs), where this writes the fp32 power of two; it needs a
    contiguous input. int8 output and the MoE layouts: :mod:`sgljit_quant_fp8.moe`.
    """
    _check_fp8_dtype(fp8_dtype)
    if not isinstance(input, torch.Tensor) or input.dim() != 2:
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
        raise ValueError(f"input: expected a 2-D tensor [T, H], got shape {tuple(input.shape)}")
    rows, hidden = input.shape
    if out is None:
        out = torch.empty_like(input, dtype=fp8_dtype, memory_format=torch.contiguous_format)
    else:
        _check_out_dtype(out, fp8_dtype)
    # (a group size the op refuses allocates no groups; the op then names it)
    valid = isinstance(group_size, int) and not isinstance(group_size, bool) and group_size > 0
    per_row = hidden // group_size if valid else 0
    if scales is None:
        scales = _group_scales(rows, per_row, input.device, column_major_scales)
    elif isinstance(scales, torch.Tensor) and scales.dim() == 2:
        layout = "column" if column_major_scales else "row"
        stride = scales.stride(0 if column_major_scales else 1)
        if stride != 1 and scales.shape[0 if column_major_scales else 1] > 1:
            raise ValueError(
                f"scales: column_major_scales={column_major_scales} expects a {layout}-major "
                f"tensor (stride 1 along dimension {0 if column_major_scales else 1}), got "
                f"strides {tuple(scales.stride())}"
            )
    _per_token_group(input, out, scales, group_size, eps, scale_ue8m0)
    return out, scales

"""FP8 quantization: ``per_tensor_quant_fp8`` (static or dynamic scale) and ``per_token_quant_fp8``.

Both return ``(out, scale)``. Quantized values are bit-identical to PyTorch's
``(x.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)`` for the same fp32 scale, on every
backend (CUDA: hardware conversion after a correctly rounded division; SYCL: software conversion
with round-to-nearest-even, saturation and NaN handling). Dynamic scales are
``max(absmax / fp8_max, 2^-126)`` in fp32: all-zero input gets a finite scale; a NaN in the input
gives a NaN scale (as ``torch.amax`` does). fp8_max is 448 (float8_e4m3fn) or 57344 (float8_e5m2).

The kernel ops (``sgljit::per_tensor_quant_fp8_static``, ``sgljit::per_tensor_quant_fp8_dynamic``,
``sgljit::per_token_quant_fp8``) are destination passing; the public functions allocate and return
the tuple, so ``torch.compile(fullgraph=True)`` and CUDA graphs work. One module per (input dtype,
fp8 dtype) holds all three kernels, on CUDA and on SYCL.

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

__all__ = ["FP8_DTYPES", "WORKSPACE_SIZE", "family", "per_tensor_quant_fp8", "per_token_quant_fp8"]

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
        "scale": Tensor(1, dtype=_FP32, layout="strided", io="out"),
        "workspace": Tensor(WORKSPACE_SIZE, dtype=_FP32, layout="contiguous", io="scratch"),
        "algo": Scalar(int, min=0, max=3),
    },
    reference=reference.per_tensor_dynamic_into,
    doc="""``scale[0] = max(absmax(input) / fp8_max, 2^-126)``, ``out = quantize(input / scale)``.
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
    fp32 ``[1]`` tensor, or written into ``scale_out`` (fp32 ``[1]``) and returned as it. A given
    fp32 scale tensor (shape ``[1]`` or ``[]``): static, returned as is. ``out`` (optional): fp8
    tensor of input's shape, contiguous. Returns ``(out, scale)`` with
    ``out = (input.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)`` bit for bit.
    """
    _check_fp8_dtype(fp8_dtype)
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    if out is None:
        out = torch.empty(input.shape, dtype=fp8_dtype, device=input.device)
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
    _per_tensor_dynamic(x, o, scale, workspace, _DYNAMIC_ALGO)
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
        out = torch.empty(input.shape, dtype=fp8_dtype, device=input.device)
    else:
        _check_out_dtype(out, fp8_dtype)
    if scales is None:
        scales = torch.empty((input.shape[0], 1), dtype=torch.float32, device=input.device)
    _per_token(input, out, scales)
    return out, scales

"""The activation family: ``scaled_silu(input, scale=1.0, *, out=None)``, ``silu(input) * scale``.

Dtypes float16, bfloat16, float32; math in float32, cast once. Rows may be strided views (the last
dimension must be contiguous), e.g. the gate half of a fused gate/up projection. Both kernels are
specialized by dtype only.

An op is declared once (``family.op``): its arguments, reference, kernels, what ``sgljit build``
prebuilds and the cases ``sgljit check`` and the conformance suite run. sgljit derives the torch
custom op, backend dispatch and every argument check from it (see ``sgljit.op``).
"""

import torch

from sgljit.op import FLOATS, Case, Cuda, Family, Scalar, Sycl, Tensor, as_rows

from . import reference

__all__ = ["family", "scaled_silu"]

# The family's kernel files (Cuda/Sycl below) are found relative to this module's folder.
family = Family("activation", __file__)

# ------------------------------------------------------------------------------------------------
# SYCL launch: the host decides the geometry (global size in work-items, work-group size).

_SYCL_WORK_GROUP = 256
_SYCL_MAX_GROUPS = 4096  # a grid-stride loop covers the rest


def _launch_sycl(module, key, input, out, scale: float) -> None:
    fn = module.get_function("scaled_silu", ("ptr", "ptr", "i64", "i64", "i64", "i64", "f32"))
    rows, cols = input.shape
    wg = _SYCL_WORK_GROUP
    groups = min((rows * cols + wg - 1) // wg, _SYCL_MAX_GROUPS)  # 0 for an empty input: no launch
    fn(groups * wg, wg, input, out, rows, cols, input.stride(0), out.stride(0), scale)


# ------------------------------------------------------------------------------------------------
# Check cases: fresh random arguments in the op's order; the error against the float64 reference is
# max |result - expected| / (1 + |expected|).

_TOLERANCES = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 1e-5}


def _case(rows: int, cols: int, dtype: torch.dtype, row_stride: int | None = None) -> Case:
    def make(device: torch.device) -> tuple:
        buffer = torch.randn(rows, row_stride or cols, device=device, dtype=dtype) * 4
        out = torch.empty(rows, cols, device=device, dtype=dtype)
        return buffer[:, :cols], out, 0.75

    shape = f"{rows}x{cols}" + (f" (rows {row_stride} apart)" if row_stride else "")
    return Case(f"{shape} {str(dtype).removeprefix('torch.')}", make, _TOLERANCES[dtype])


# ------------------------------------------------------------------------------------------------
# The op (destination passing: it writes `out` and returns None)

_scaled_silu = family.op(
    "scaled_silu",
    args={
        "input": Tensor("num_tokens", "hidden"),  # float16/bfloat16/float32, unit last stride
        "out": Tensor("num_tokens", "hidden", dtype="input", io="out"),
        "scale": Scalar(float),
    },
    reference=reference.scaled_silu_into,
    cuda=Cuda(
        "csrc/activation.cuh",
        "sgljit_activation::ScaledSilu<{dtype}>::run",  # {dtype}: fp16_t, bf16_t or fp32_t
        key=lambda x, *_: (x.dtype,),  # runs on every call: keep it cheap
        params=("dtype",),  # the names of the key's entries in `symbol`
    ),
    sycl=Sycl(
        "sycl/activation.hpp",
        key=lambda x, *_: {"SGLJIT_T": x.dtype},  # -D macros: -DSGLJIT_T=bf16_t
        launch=_launch_sycl,
    ),
    # What `sgljit build` compiles ahead of time: one entry per module (here: per dtype).
    prebuild={
        "cuda": [{"dtype": dt} for dt in FLOATS],
        "sycl": [{"SGLJIT_T": dt} for dt in FLOATS],
    },
    cases=[
        _case(7, 4096, torch.bfloat16),
        _case(3, 1001, torch.float16),  # an odd size: no element may be left out
        _case(1, 513, torch.float32),
        _case(5, 1000, torch.bfloat16, row_stride=1536),  # strided rows
    ],
)


# ------------------------------------------------------------------------------------------------
# Public function: allocates the output, flattens leading dimensions (as_rows), calls the op.


def scaled_silu(
    input: torch.Tensor, scale: float = 1.0, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``out = silu(input) * scale`` elementwise, ``silu(x) = x * sigmoid(x)``.

    input ``[..., H]`` (float16, bfloat16, float32; rows may be strided, last dimension
    contiguous). Returns ``out`` (allocated if not given; same shape and dtype as input).
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    if out is None:
        out = torch.empty_like(input, memory_format=torch.contiguous_format)
    elif isinstance(out, torch.Tensor) and out.shape != input.shape:
        raise ValueError(
            f"out: expected shape {list(input.shape)} (input's), got {list(out.shape)}"
        )
    _scaled_silu(as_rows(input, "input"), as_rows(out, "out", written=True), scale)
    return out

"""``sgljit.ops.timestep_embedding``: diffusers' sinusoidal timestep embedding, CUDA and SYCL.

    >>> import torch, sgljit
    >>> emb = sgljit.ops.timestep_embedding(torch.tensor([0.0, 999.0]), 8)
    >>> emb.shape, emb.dtype
    (torch.Size([2, 8]), torch.float32)

The fp32 argument of sin/cos is defined bit-exactly in :mod:`sgljit_timestep_embedding.reference`;
the kernels return sin/cos of it within 1e-6 absolute (fp32 output) for ``|arg|`` up to 1e6
(timesteps and scale up to 1000); far beyond, their reduction by 2*pi loses accuracy (SYCL on the
CPU: 1.5e-3 at 1e12, none left at 1e20), where the reference stays exact.

The destination-passing op (``torch.ops.sgljit.timestep_embedding(t, out, flip_sin_to_cos,
downscale_freq_shift, scale, max_period)``) is declared once in ``family``; its CUDA module is
specialized by the output dtype (it reads every timestep dtype), its SYCL module by both dtypes.
"""

import math
import numbers
import sys
from typing import Any

import torch

from sgljit.op import Case, Cuda, Family, Scalar, Sycl, Tensor

from . import reference

__all__ = ["KERNEL_T_DTYPES", "OUT_DTYPES", "family", "timestep_embedding"]

family = Family("timestep_embedding", __file__)

OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Timestep dtypes the kernels read directly; the public function converts any other real dtype to
# fp32 first (exactly what diffusers' ``timesteps.float()`` does).
KERNEL_T_DTYPES = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int32,
    torch.int64,
)
_KERNEL_T = frozenset(KERNEL_T_DTYPES)
_OUT = frozenset(OUT_DTYPES)
_MAX_DIM = 1 << 30  # csrc/timestep_embedding.cuh: dim in [1, 2^30]
_FINITE = sys.float_info.max  # bounds that refuse inf and NaN (NaN fails every comparison)

# const TIn* t, TOut* out, t_stride, rows, dim, row_workers, flip, -ln(max_period), denominator, scale
_SYCL_ARG_KINDS = ("ptr", "ptr", "i64", "i64", "i64", "i64", "i32", "f32", "f32", "f32")
_SYCL_LOCAL_SIZE = 64
_SYCL_TARGET_ITEMS = 1 << 16


# ------------------------------------------------------------------------------------------------
# What the argument specs cannot say (the CUDA run() checks the same, with the same messages)


def _denominator(dim: int, downscale_freq_shift: float) -> float:
    half = dim // 2
    return float(half - downscale_freq_shift) if half > 0 else 1.0


def _check_embedding(out: torch.Tensor, downscale_freq_shift: float) -> None:
    """out's width is the embedding size; the exponent divides by ``dim // 2 - shift``."""
    dim = out.shape[1]
    if not 1 <= dim <= _MAX_DIM:
        raise ValueError(f"out: dim must be in [1, 2^30], got {dim}")
    half = dim // 2
    if half > 0 and half - downscale_freq_shift == 0:
        raise ValueError(
            f"downscale_freq_shift: must differ from dim // 2 = {half} (the exponent is divided by "
            f"dim // 2 - downscale_freq_shift), got {downscale_freq_shift!r}"
        )


def _reference(t, out, flip_sin_to_cos, downscale_freq_shift, scale, max_period) -> None:
    _check_embedding(out, downscale_freq_shift)
    reference.timestep_embedding_into(
        t, out, flip_sin_to_cos, downscale_freq_shift, scale, max_period
    )


# ------------------------------------------------------------------------------------------------
# Specializations. CUDA: one module per output dtype (the keys are built once; an out that is not
# a tensor of an output dtype fails the lookup, and core then checks the arguments in Python and
# names it). SYCL: one module per (timestep dtype, output dtype).


def _cuda_key(t, out, *_) -> tuple:
    return (out.dtype,)


def _sycl_key(t, out, *_) -> dict:
    return {"SGLJIT_TIN": t.dtype, "SGLJIT_T": out.dtype}


def _sycl_launch(module, key, t, out, flip_sin_to_cos, downscale_freq_shift, scale, max_period):
    """A work-item per (group of 16 bytes of columns, row worker); row workers walk the rows."""
    _check_embedding(out, downscale_freq_shift)
    rows, dim = out.shape
    if rows == 0:
        return
    if out.data_ptr() % 16:
        raise ValueError("out: data pointer must be 16-byte aligned")
    vec = 16 // out.element_size()
    groups = max(1, -(-(dim // 2) // vec))
    row_workers = max(1, min(rows, _SYCL_TARGET_ITEMS // groups))
    items = groups * row_workers
    module.get_function("timestep_embedding", _SYCL_ARG_KINDS)(
        -(-items // _SYCL_LOCAL_SIZE) * _SYCL_LOCAL_SIZE,
        _SYCL_LOCAL_SIZE,
        t,
        out,
        t.stride(0),
        rows,
        dim,
        row_workers,
        int(flip_sin_to_cos),
        -math.log(max_period),
        _denominator(dim, downscale_freq_shift),
        float(scale),
    )


# ------------------------------------------------------------------------------------------------
# Check cases: against the float64 reference (sin/cos in fp64 of the bit-exact fp32 argument).
# fp32 outputs within 1e-6 (the accuracy contract); fp16/bf16 within that plus half an epsilon.


def _tol(dtype: torch.dtype) -> float:
    return 1e-6 if dtype == torch.float32 else 1e-6 + torch.finfo(dtype).eps / 2


def _case(
    batch: int,
    dim: int,
    out_dtype: torch.dtype,
    t_dtype: torch.dtype = torch.float32,
    *,
    flip: bool = False,
    shift: float = 0.0,
    scale: float = 1.0,
    max_period: float = 10000.0,
    t_stride: int = 1,
) -> Case:
    def make(device):
        t = torch.rand(batch * t_stride, device=device, dtype=torch.float64) * 1000
        t = t.to(t_dtype)[::t_stride]
        out = torch.empty(batch, dim, dtype=out_dtype, device=device)
        return t, out, flip, shift, scale, max_period

    name = f"{batch} x dim {dim}"
    name += " flip" * flip + (f" shift {shift:g}" if shift else "")
    name += (f" scale {scale:g}" if scale != 1 else "") + (
        f" max_period {max_period:g}" if max_period != 10000 else ""
    )
    t_name = str(t_dtype).removeprefix("torch.")
    name += f", t {t_name}" + (f" stride {t_stride}" if t_stride != 1 else "")
    return Case(f"{name} -> {str(out_dtype).removeprefix('torch.')}", make, _tol(out_dtype))


_CASES = [
    # sgljit check's shapes: the rows kernel, flipped with a shift, an odd dim (flat kernel)
    *(
        _case(13, dim, out, flip=flip, shift=shift)
        for out in (torch.float32, torch.bfloat16)
        for dim, flip, shift in ((256, False, 0.0), (320, True, 1.0), (129, False, 0.0))
    ),
    _case(37, 100, torch.float16, torch.int64, t_stride=3),  # strided integer timesteps; flat
    _case(3, 264, torch.float32, torch.int32, flip=True),  # small batch, half % 8 == 4
    _case(5, 1, torch.float32, torch.float64),  # the zero column only
    _case(64, 1024, torch.float32, torch.bfloat16, flip=True, scale=1000.0, max_period=100.0),
    _case(9, 7, torch.bfloat16, torch.float16, scale=0.5),
]


# ------------------------------------------------------------------------------------------------
# The op (destination passing)

_timestep_embedding = family.op(
    "timestep_embedding",
    args={
        "t": Tensor("batch", dtype=KERNEL_T_DTYPES, layout="strided"),
        "out": Tensor("batch", "dim", dtype=OUT_DTYPES, layout="contiguous", io="out"),
        "flip_sin_to_cos": Scalar(bool),
        "downscale_freq_shift": Scalar(float, min=-_FINITE, max=_FINITE),
        "scale": Scalar(float, min=-_FINITE, max=_FINITE),
        "max_period": Scalar(float, min=math.ulp(0.0), max=_FINITE),  # > 0: its log is taken
    },
    reference=_reference,
    doc="""Write the embedding of timesteps ``t`` ``[B]`` into ``out`` ``[B, dim]`` (contiguous,
    fp32/fp16/bf16; ``t`` of any stride, fp32/fp16/bf16/fp64/int32/int64). ``dim // 2`` must differ
    from ``downscale_freq_shift``. See :func:`timestep_embedding`.""",
    cuda=Cuda(
        "csrc/timestep_embedding.cuh",
        "sgljit_timestep_embedding::TimestepEmbeddingKernel<{out_dtype}>::run",
        key=_cuda_key,
        params=("out_dtype",),
    ),
    sycl=Sycl("sycl/timestep_embedding.hpp", key=_sycl_key, launch=_sycl_launch),
    prebuild={
        # CUDA reads every timestep dtype; SYCL timesteps come as fp32 or int64 in practice.
        "cuda": [{"out_dtype": d} for d in OUT_DTYPES],
        "sycl": [
            {"SGLJIT_TIN": t, "SGLJIT_T": o}
            for t in (torch.float32, torch.int64)
            for o in OUT_DTYPES
        ],
    },
    cases=_CASES,
)


# ------------------------------------------------------------------------------------------------
# Public function


def _positive_dim(dim: Any) -> int:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dim: expected an int, got {type(dim).__name__} {dim!r}")
    if dim <= 0:
        raise ValueError(f"dim: expected a positive embedding size, got {dim}")
    if dim > _MAX_DIM:  # before out [B, dim] is allocated
        raise ValueError(f"dim: must be at most 2^30, got {dim}")
    return int(dim)


def _not_timesteps(t: Any) -> Exception:
    if not isinstance(t, torch.Tensor):
        return TypeError(f"t: expected a torch.Tensor of timesteps, got {type(t).__name__}")
    return ValueError(f"t: expected a 1-D tensor of timesteps [batch], got shape {tuple(t.shape)}")


def _as_fp32(t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):  # a shape and a dtype (a numpy array), no tensor
        raise _not_timesteps(t)
    if t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"t: expected a real floating-point or integer dtype, got {t.dtype}")
    return t.to(torch.float32)  # int8/uint8/int16/fp8/...: exact, as diffusers' .float()


def _check_dtype(dtype: Any) -> None:
    if dtype not in _OUT:
        raise TypeError(
            f"dtype: expected one of torch.float32, torch.float16, torch.bfloat16, got {dtype}"
        )


def _check_out(out: Any, batch: int, dim: int, dtype: torch.dtype | None) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out: expected a torch.Tensor or None, got {type(out).__name__}")
    if out.shape != (batch, dim):
        raise ValueError(
            f"out: expected shape {(batch, dim)} ([batch, dim]), got {tuple(out.shape)}"
        )
    if dtype is not None and out.dtype != dtype:
        raise ValueError(f"out: dtype {out.dtype} differs from dtype={dtype}")


def timestep_embedding(
    t: torch.Tensor,
    dim: int,
    *,
    flip_sin_to_cos: bool = False,
    downscale_freq_shift: float = 0.0,
    scale: float = 1.0,
    max_period: float = 10000,
    dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sinusoidal timestep embedding ``[B, dim]`` of timesteps ``t`` ``[B]``.

    Semantics of diffusers' ``get_timestep_embedding(t, dim, flip_sin_to_cos, downscale_freq_shift,
    scale, max_period)``: ``freq_j = exp(-ln(max_period) * j / (dim // 2 - downscale_freq_shift))``,
    ``arg = scale * t * freq``, output ``[sin(arg) | cos(arg)]`` (``[cos | sin]`` with
    ``flip_sin_to_cos``), one zero column appended when ``dim`` is odd.

    Note: diffusers' *function* defaults to ``downscale_freq_shift=1``; this op (like the serving
    kernels, and diffusers' ``Timesteps`` modules as SD3/Flux/Wan configure them) defaults to 0.
    Pass ``downscale_freq_shift=1`` for the function's default.

    Args:
        t: 1-D timesteps of any real floating-point or integer dtype (converted to fp32).
        dim: embedding size (>= 1).
        flip_sin_to_cos: a bool. downscale_freq_shift, scale: finite numbers; ``dim // 2`` must
            differ from ``downscale_freq_shift``. max_period: a finite positive number.
        dtype: output dtype, ``torch.float32`` (default), ``torch.float16`` or ``torch.bfloat16``.
        out: optional preallocated contiguous output ``[B, dim]`` (its dtype is the output dtype).
            The kernels store 16-byte vectors: in eager calls an ``out`` that is not 16-byte
            aligned is filled through an aligned temporary (one more allocation and copy).
    """
    if type(dim) is not int or not 0 < dim <= _MAX_DIM:
        dim = _positive_dim(dim)
    try:
        batch = t.shape[0]
        t_dtype = t.dtype
    except (AttributeError, IndexError):
        raise _not_timesteps(t) from None
    if t_dtype not in _KERNEL_T:
        t = _as_fp32(t)
    if dtype is not None:
        _check_dtype(dtype)
    if out is None:
        out = torch.empty(
            batch, dim, dtype=torch.float32 if dtype is None else dtype, device=t.device
        )
    else:
        _check_out(out, batch, dim, dtype)
        # the kernels' contract (see the op); a traced graph has no addresses to test
        if not torch.compiler.is_compiling() and out.numel() and out.data_ptr() % 16:
            aligned = torch.empty_like(out, memory_format=torch.contiguous_format)
            _timestep_embedding(
                t, aligned, flip_sin_to_cos, downscale_freq_shift, scale, max_period
            )
            return out.copy_(aligned)
    _timestep_embedding(t, out, flip_sin_to_cos, downscale_freq_shift, scale, max_period)
    return out

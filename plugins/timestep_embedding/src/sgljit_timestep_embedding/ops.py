"""``sgljit.ops.timestep_embedding``: diffusers' sinusoidal timestep embedding, CUDA and SYCL.

    >>> import torch, sgljit
    >>> emb = sgljit.ops.timestep_embedding(torch.tensor([0.0, 999.0]), 8)
    >>> emb.shape, emb.dtype
    (torch.Size([2, 8]), torch.float32)

The fp32 argument of sin/cos is defined bit-exactly in :mod:`sgljit_timestep_embedding.reference`;
the kernels return sin/cos of it within 1e-6 absolute (fp32 output).
"""

import math
import numbers
from pathlib import Path
from typing import Any

import torch

import sgljit
from sgljit.jit_utils import as_dtype
from sgljit.op import kernel_op

from . import reference

__all__ = ["prebuild", "prebuild_specs", "timestep_embedding"]

OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Timestep dtypes the kernels read directly; any other real dtype is converted to fp32 first
# (exactly what diffusers' ``timesteps.float()`` does).
KERNEL_T_DTYPES = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int32,
    torch.int64,
)

_CSRC = Path(__file__).resolve().parent / "csrc"
_SYCL_SOURCE = Path(__file__).resolve().parent / "sycl" / "timestep_embedding.hpp"
# const TIn* t, TOut* out, t_stride, rows, dim, row_workers, flip, -ln(max_period), denominator, scale
_SYCL_ARG_KINDS = ("ptr", "ptr", "i64", "i64", "i64", "i64", "i32", "f32", "f32", "f32")
_SYCL_LOCAL_SIZE = 64
_SYCL_TARGET_ITEMS = 1 << 16


# ------------------------------------------------------------------------------------------------
# The op (destination passing): reference body, CUDA and SYCL implementations
# ------------------------------------------------------------------------------------------------
@kernel_op("timestep_embedding", mutates_args=("out",))
def _timestep_embedding(
    t: torch.Tensor,
    out: torch.Tensor,
    flip_sin_to_cos: bool,
    downscale_freq_shift: float,
    scale: float,
    max_period: float,
) -> None:
    reference.timestep_embedding_into(
        t, out, flip_sin_to_cos, downscale_freq_shift, scale, max_period
    )


def _denominator(dim: int, downscale_freq_shift: float) -> float:
    half = dim // 2
    return float(half - downscale_freq_shift) if half > 0 else 1.0


@_timestep_embedding.register("cuda")
def _(t, out, flip_sin_to_cos, downscale_freq_shift, scale, max_period):
    _cuda_module(out.dtype).timestep_embedding(
        t,
        out,
        bool(flip_sin_to_cos),
        -math.log(max_period),
        _denominator(out.shape[1], downscale_freq_shift),
        float(scale),
    )


@_timestep_embedding.register("sycl")
def _(t, out, flip_sin_to_cos, downscale_freq_shift, scale, max_period):
    rows, dim = out.shape
    if rows == 0:
        return
    vec = 16 // out.element_size()
    groups = max(1, -(-(dim // 2) // vec))
    row_workers = max(1, min(rows, _SYCL_TARGET_ITEMS // groups))
    items = groups * row_workers
    global_size = -(-items // _SYCL_LOCAL_SIZE) * _SYCL_LOCAL_SIZE
    _sycl_kernel(t.dtype, out.dtype)(
        global_size,
        _SYCL_LOCAL_SIZE,
        t,
        out,
        t.stride(0),
        rows,
        dim,
        row_workers,
        int(bool(flip_sin_to_cos)),
        -math.log(max_period),
        _denominator(dim, downscale_freq_shift),
        float(scale),
    )


# ------------------------------------------------------------------------------------------------
# Loaders (one CUDA module per output dtype; one SYCL kernel per (t dtype, output dtype))
# ------------------------------------------------------------------------------------------------
@sgljit.cache_once
def _cuda_module(out_dtype: torch.dtype) -> Any:
    args = sgljit.make_cpp_args(out_dtype)
    return sgljit.load_jit(
        "timestep_embedding",
        args,
        cuda_files=["timestep_embedding.cuh"],
        cuda_wrappers=[
            (
                "timestep_embedding",
                f"sgljit_timestep_embedding::TimestepEmbeddingKernel<{args}>::run",
            )
        ],
        source_dir=_CSRC,
    )


@sgljit.cache_once
def _sycl_kernel(t_dtype: torch.dtype, out_dtype: torch.dtype) -> Any:
    t_type, out_type = sgljit.make_cpp_args(t_dtype, out_dtype)
    module = sgljit.load_jit_sycl(
        "timestep_embedding",
        t_type,
        out_type,
        sycl_files=(str(_SYCL_SOURCE),),
        extra_sycl_cflags=(f"-DSGLJIT_T={out_type}", f"-DSGLJIT_TIN={t_type}"),
    )
    return module.get_function("timestep_embedding", _SYCL_ARG_KINDS)


def prebuild_specs(backend: str = "cuda") -> list[dict[str, Any]]:
    """Specializations a serving fleet needs, as keyword arguments of :func:`prebuild`.

    CUDA: one module per output dtype (it reads every timestep dtype). SYCL: one kernel per
    (timestep dtype, output dtype); timesteps come as fp32 or int64 in practice.
    """
    if backend == "cuda":
        return [{"out_dtype": d} for d in OUT_DTYPES]
    if backend == "sycl":
        return [
            {"t_dtype": t, "out_dtype": o} for t in (torch.float32, torch.int64) for o in OUT_DTYPES
        ]
    raise ValueError(f"backend: expected 'cuda' or 'sycl', got {backend!r}")


def prebuild(backend: str, **spec: Any) -> Any:
    """Build (or fetch from the cache) one specialization listed by :func:`prebuild_specs`.

    Dtypes may be given as ``torch.dtype`` or by name (``"bfloat16"``).
    """
    if backend == "cuda":
        return _cuda_module(as_dtype(spec["out_dtype"], "out_dtype"))
    if backend == "sycl":
        return _sycl_kernel(
            as_dtype(spec["t_dtype"], "t_dtype"), as_dtype(spec["out_dtype"], "out_dtype")
        )
    raise ValueError(f"backend: expected 'cuda' or 'sycl', got {backend!r}")


# ------------------------------------------------------------------------------------------------
# Public function
# ------------------------------------------------------------------------------------------------
def _check_real(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")


def _validate(
    t: Any,
    dim: Any,
    flip_sin_to_cos: Any,
    downscale_freq_shift: Any,
    scale: Any,
    max_period: Any,
    dtype: Any,
    out: Any,
) -> torch.dtype:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t: expected a torch.Tensor of timesteps, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(
            f"t: expected a 1-D tensor of timesteps [batch], got shape {tuple(t.shape)}"
        )
    if t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"t: expected a real floating-point or integer dtype, got {t.dtype}")
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dim: expected an int, got {type(dim).__name__} {dim!r}")
    if dim <= 0:
        raise ValueError(f"dim: expected a positive embedding size, got {dim}")
    if not isinstance(flip_sin_to_cos, bool):
        raise TypeError(f"flip_sin_to_cos: expected a bool, got {type(flip_sin_to_cos).__name__}")
    _check_real("downscale_freq_shift", downscale_freq_shift)
    _check_real("scale", scale)
    _check_real("max_period", max_period)
    if max_period <= 0:
        raise ValueError(f"max_period: expected a positive number, got {max_period!r}")
    half = dim // 2
    if half > 0 and half - downscale_freq_shift == 0:
        raise ValueError(
            f"downscale_freq_shift: must differ from dim // 2 = {half} (the exponent is divided by "
            f"dim // 2 - downscale_freq_shift), got {downscale_freq_shift!r}"
        )
    if dtype is not None and dtype not in OUT_DTYPES:
        raise TypeError(
            f"dtype: expected one of torch.float32, torch.float16, torch.bfloat16, got {dtype}"
        )
    if out is None:
        return torch.float32 if dtype is None else dtype
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out: expected a torch.Tensor or None, got {type(out).__name__}")
    if tuple(out.shape) != (t.shape[0], dim):
        raise ValueError(
            f"out: expected shape {(t.shape[0], dim)} ([batch, dim]), got {tuple(out.shape)}"
        )
    if out.dtype not in OUT_DTYPES:
        raise TypeError(f"out: expected dtype float32, float16 or bfloat16, got {out.dtype}")
    if dtype is not None and out.dtype != dtype:
        raise ValueError(f"out: dtype {out.dtype} differs from dtype={dtype}")
    if out.device != t.device:
        raise ValueError(
            f"out: expected a tensor on {t.device} (t's device), got one on {out.device}"
        )
    if not out.is_contiguous():
        raise ValueError("out: expected a contiguous tensor")
    if not torch.compiler.is_compiling() and out.data_ptr() % 16:  # (the kernels check it too)
        raise ValueError("out: expected a 16-byte aligned data pointer")
    return out.dtype


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
        dtype: output dtype, ``torch.float32`` (default), ``torch.float16`` or ``torch.bfloat16``.
        out: optional preallocated contiguous output ``[B, dim]`` (its dtype is the output dtype).
    """
    out_dtype = _validate(
        t, dim, flip_sin_to_cos, downscale_freq_shift, scale, max_period, dtype, out
    )
    if t.dtype not in KERNEL_T_DTYPES:
        t = t.to(torch.float32)  # int8/uint8/int16/fp8/...: exact, as diffusers' .float()
    if out is None:
        out = torch.empty((t.shape[0], dim), dtype=out_dtype, device=t.device)
    _timestep_embedding(
        t, out, flip_sin_to_cos, float(downscale_freq_shift), float(scale), float(max_period)
    )
    return out


def check_cases(device: torch.device) -> list[dict]:
    """``sgljit check``: against sin/cos in float64 of the fp32 argument (the accuracy contract)."""

    def expected(t: torch.Tensor, dim: int, flip: bool, shift: float) -> torch.Tensor:
        half = dim // 2
        # PyTorch's fp32 formula; exp is evaluated in fp64 and rounded once (the plugin's definition)
        exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32) / (half - shift)
        freqs = exponent.double().exp().float().to(device)
        args = (t.float()[:, None] * freqs[None, :]).double()
        emb = torch.cat([args.cos(), args.sin()] if flip else [args.sin(), args.cos()], -1)
        return torch.nn.functional.pad(emb, (0, dim % 2))

    cases = []
    for out_dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        for dim, flip, shift in ((256, False, 0.0), (320, True, 1.0), (129, False, 0.0)):

            def run(dim=dim, flip=flip, shift=shift, out_dtype=out_dtype):
                t = torch.rand(13, device=device) * 1000
                out = timestep_embedding(
                    t, dim, flip_sin_to_cos=flip, downscale_freq_shift=shift, dtype=out_dtype
                )
                return out, expected(t, dim, flip, shift)

            flags = (
                f"dim {dim}" + (" flip" if flip else "") + (f" shift {shift:g}" if shift else "")
            )
            name = str(out_dtype).removeprefix("torch.")
            cases.append(
                {
                    "op": "timestep_embedding",
                    "shape": f"13 x {flags} -> {name}",
                    "run": run,
                    "tol": tol,
                }
            )
    return cases

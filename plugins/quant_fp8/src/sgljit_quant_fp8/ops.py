"""FP8 quantization: ``per_tensor_quant_fp8`` (static or dynamic scale) and ``per_token_quant_fp8``.

Both return ``(out, scale)``. Quantized values are bit-identical to PyTorch's
``(x.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)`` for the same fp32 scale, on every
backend (CUDA: hardware conversion after a correctly rounded division; SYCL: software conversion
with round-to-nearest-even, saturation and NaN handling). Dynamic scales are
``max(absmax / fp8_max, 2^-126)`` in fp32: all-zero input gets a finite scale; a NaN in the input
gives a NaN scale (as ``torch.amax`` does). fp8_max is 448 (float8_e4m3fn) or 57344 (float8_e5m2).

The kernel ops are destination passing (outputs given); the public functions allocate and return
the tuple, so ``torch.compile(fullgraph=True)`` and CUDA graphs work.
"""

import os
from pathlib import Path

import torch

import sgljit
from sgljit.jit_utils import as_dtype
from sgljit.op import kernel_op

from . import reference

__all__ = [
    "WORKSPACE_SIZE",
    "cuda_module",
    "per_tensor_quant_fp8",
    "per_token_quant_fp8",
    "prebuild",
    "prebuild_specs",
    "sycl_module",
]

_HERE = Path(__file__).resolve().parent
_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8_DTYPES = reference.FP8_DTYPES
# Partial maxima of the dynamic per-tensor scale: one slot per block of the absmax pass (its grid is
# capped by it).
WORKSPACE_SIZE = 1024
# CUDA dynamic per-tensor path: "auto" (up to 64 KB of input one launch of the per-token kernel on the
# tensor as one row; beyond twice the GPU's L2 size "three_kernels": absmax, scale, then the static
# kernel; bf16 from a quarter of the L2 size up to there "fused": one cooperative kernel, sm_90+ with
# 16-byte-aligned data; else "two_kernels": absmax, then a quantize pass that computes the scale
# itself), or one of those always.
_DYNAMIC_MODES = {"auto": 0, "fused": 1, "two_kernels": 2, "three_kernels": 3}


def _dynamic_mode() -> int:
    name = os.environ.get("SGLJIT_QUANT_FP8_DYNAMIC", "auto")
    if name not in _DYNAMIC_MODES:
        raise ValueError(
            f"SGLJIT_QUANT_FP8_DYNAMIC={name!r}: expected one of {', '.join(_DYNAMIC_MODES)}"
        )
    return _DYNAMIC_MODES[name]


# ------------------------------------------------------------------------------------------------
# Module loaders: one specialization per (input dtype, fp8 dtype)


@sgljit.cache_once
def cuda_module(dtype, fp8_dtype):
    """CUDA module exporting ``per_tensor_static(input, scale, out)``,
    ``per_tensor_dynamic(input, out, scale, workspace, algo)`` and
    ``per_token(input, out, scales)`` (see csrc/quant_fp8.cuh)."""
    args = sgljit.make_cpp_args(as_dtype(dtype), as_dtype(fp8_dtype))
    cls = f"sgljit_quant_fp8::QuantFp8<{args}>"
    return sgljit.load_jit(
        "quant_fp8",
        args,
        cuda_files=["quant_fp8.cuh"],
        cuda_wrappers=[
            ("per_tensor_static", f"{cls}::per_tensor_static"),
            ("per_tensor_dynamic", f"{cls}::per_tensor_dynamic"),
            ("per_token", f"{cls}::per_token"),
        ],
        source_dir=_HERE / "csrc",
    )


@sgljit.cache_once
def sycl_module(dtype, fp8_dtype):
    """SYCL module with kernels ``quant_fp8_static``, ``quant_fp8_absmax``, ``quant_fp8_dynamic``
    and ``quant_fp8_per_token`` (see sycl/quant_fp8.hpp)."""
    fp8 = as_dtype(fp8_dtype)
    t, q = sgljit.make_cpp_args(as_dtype(dtype), fp8)
    return sgljit.load_jit_sycl(
        "quant_fp8",
        t,
        q,
        sycl_files=[_HERE / "sycl" / "quant_fp8.hpp"],
        extra_sycl_cflags=[f"-DSGLJIT_T={t}", f"-DQFP8_E5M2={int(fp8 == torch.float8_e5m2)}"],
    )


_LOADERS = {"cuda": cuda_module, "sycl": sycl_module}


def prebuild_specs(backend: str = "cuda") -> list[dict]:
    """Specializations a serving fleet needs on ``backend`` ("cuda" or "sycl"; the same list for
    both): every input dtype with both fp8 formats (one module each holds all three ops), as dicts
    of the loader's arguments; build one with ``prebuild(backend, **spec)``."""
    if backend not in _LOADERS:
        raise ValueError(
            f"prebuild_specs: backend must be one of {sorted(_LOADERS)}, got {backend!r}"
        )
    return [
        {"dtype": dtype, "fp8_dtype": fp8}
        for dtype in ("bfloat16", "float16", "float32")
        for fp8 in ("float8_e4m3fn", "float8_e5m2")
    ]


def prebuild(backend: str, **spec):
    """Build (or fetch from the cache) the module of one ``prebuild_specs()`` entry."""
    loader = _LOADERS.get(backend)
    if loader is None:
        raise ValueError(f"prebuild: backend must be one of {sorted(_LOADERS)}, got {backend!r}")
    return loader(**spec)


# ------------------------------------------------------------------------------------------------
# The kernel ops (destination passing; the function bodies are the reference backend)


@kernel_op("per_tensor_quant_fp8_static", mutates_args=("out",))
def _per_tensor_static(input: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> None:
    reference.quantize_into(input, scale, out)


@_per_tensor_static.register("cuda")
def _(input, scale, out):
    cuda_module(input.dtype, out.dtype).per_tensor_static(input, scale, out)


_SYCL_WG = 256


def _sycl_items(n: int, per_item: int, max_groups: int) -> int:
    """Global size: enough work-groups of _SYCL_WG for ``n`` elements at ``per_item`` each."""
    groups = max(1, min(max_groups, -(-n // (_SYCL_WG * per_item))))
    return groups * _SYCL_WG


@_per_tensor_static.register("sycl")
def _(input, scale, out):
    n = input.numel()
    if n == 0:
        return
    fn = sycl_module(input.dtype, out.dtype).get_function(
        "quant_fp8_static", ("ptr", "ptr", "ptr", "i64")
    )
    fn(_sycl_items(n, 16, 1024), _SYCL_WG, input, scale, out, n)


@kernel_op("per_tensor_quant_fp8_dynamic", mutates_args=("out", "scale", "workspace"))
def _per_tensor_dynamic(
    input: torch.Tensor, out: torch.Tensor, scale: torch.Tensor, workspace: torch.Tensor, algo: int
) -> None:
    """``algo``: 0 = auto (see ``_DYNAMIC_MODES``); CUDA only: 1 = the fused cooperative kernel,
    2 = two kernels, 3 = three kernels. ``workspace``: float32, at least 1 element."""
    scale.copy_(reference.per_tensor_scale(input, out.dtype).view(scale.shape))
    reference.quantize_into(input, scale, out)


@_per_tensor_dynamic.register("cuda")
def _(input, out, scale, workspace, algo):
    cuda_module(input.dtype, out.dtype).per_tensor_dynamic(input, out, scale, workspace, algo)


@_per_tensor_dynamic.register("sycl")
def _(input, out, scale, workspace, algo):
    n = input.numel()
    mod = sycl_module(input.dtype, out.dtype)
    groups = _sycl_items(n, 64, workspace.numel()) // _SYCL_WG
    absmax = mod.get_function("quant_fp8_absmax", ("ptr", "ptr", "i64"))
    quant = mod.get_function("quant_fp8_dynamic", ("ptr", "ptr", "ptr", "ptr", "i64"))
    absmax(groups * _SYCL_WG, _SYCL_WG, input, workspace, n)
    quant(groups * _SYCL_WG, _SYCL_WG, input, out, scale, workspace, n)


@kernel_op("per_token_quant_fp8", mutates_args=("out", "scales"))
def _per_token(input: torch.Tensor, out: torch.Tensor, scales: torch.Tensor) -> None:
    scales.copy_(reference.per_token_scales(input, out.dtype))
    reference.quantize_into(input, scales, out)


@_per_token.register("cuda")
def _(input, out, scales):
    cuda_module(input.dtype, out.dtype).per_token(input, out, scales)


@_per_token.register("sycl")
def _(input, out, scales):
    rows, hidden = input.shape
    if rows == 0:
        return
    fn = sycl_module(input.dtype, out.dtype).get_function(
        "quant_fp8_per_token", ("ptr", "i64", "ptr", "i64", "ptr", "i64")
    )
    wg = 64
    fn(rows * wg, wg, input, input.stride(0), out, out.stride(0), scales, hidden)


# ------------------------------------------------------------------------------------------------
# Validation (errors name the argument) and the public functions


def _check_input(input, ndim: int | None) -> None:
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    if input.dtype not in _INPUT_DTYPES:
        raise TypeError(f"input: dtype must be float16, bfloat16 or float32, got {input.dtype}")
    if ndim is not None and input.dim() != ndim:
        raise ValueError(f"input: expected a 2-D tensor [T, H], got shape {tuple(input.shape)}")


def _check_fp8_dtype(fp8_dtype) -> None:
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(
            f"fp8_dtype: expected torch.float8_e4m3fn or torch.float8_e5m2, got {fp8_dtype!r}"
        )


def _check_out(out, input: torch.Tensor, fp8_dtype: torch.dtype, *, rows_only: bool) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out: expected a torch.Tensor or None, got {type(out).__name__}")
    if out.dtype != fp8_dtype:
        raise TypeError(f"out: dtype must be {fp8_dtype} (fp8_dtype), got {out.dtype}")
    if out.shape != input.shape:
        raise ValueError(
            f"out: shape {tuple(out.shape)} does not match input's {tuple(input.shape)}"
        )
    if out.device != input.device:
        raise ValueError(f"out: expected a tensor on {input.device} (as input), got {out.device}")
    if rows_only:
        if out.shape[-1] > 1 and out.stride(-1) != 1:
            raise ValueError("out: the last dimension must be contiguous (stride 1)")
    elif not out.is_contiguous():
        raise ValueError("out: expected a contiguous tensor")


def _check_scale(scale, input: torch.Tensor) -> None:
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scale: expected a torch.Tensor or None, got {type(scale).__name__}")
    if scale.dtype != torch.float32:
        raise TypeError(f"scale: dtype must be float32, got {scale.dtype}")
    if scale.dim() > 1 or scale.numel() != 1:
        raise ValueError(f"scale: expected shape [1] (or []), got {tuple(scale.shape)}")
    if scale.device != input.device:
        raise ValueError(
            f"scale: expected a tensor on {input.device} (as input), got {scale.device}"
        )


def per_tensor_quant_fp8(
    input: torch.Tensor,
    scale: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``input`` (fp16/bf16/fp32, contiguous, any shape) to ``fp8_dtype`` with one scale.

    ``scale=None``: dynamic, ``scale = max(absmax(input) / fp8_max, 2^-126)``, returned as a new
    fp32 ``[1]`` tensor. A given fp32 scale tensor (shape ``[1]`` or ``[]``): static, returned as
    is. ``out`` (optional): fp8 tensor of input's shape, contiguous. Returns ``(out, scale)`` with
    ``out = (input.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)`` bit for bit.
    """
    _check_input(input, None)
    if not input.is_contiguous():
        raise ValueError("input: expected a contiguous tensor (call .contiguous() first)")
    _check_fp8_dtype(fp8_dtype)
    if out is None:
        out = torch.empty(input.shape, dtype=fp8_dtype, device=input.device)
    else:
        _check_out(out, input, fp8_dtype, rows_only=False)
    if scale is not None:
        _check_scale(scale, input)
        _per_tensor_static(input, scale, out)
        return out, scale
    scale = torch.empty(1, dtype=torch.float32, device=input.device)
    workspace = torch.empty(WORKSPACE_SIZE, dtype=torch.float32, device=input.device)
    _per_tensor_dynamic(input, out, scale, workspace, _dynamic_mode())
    return out, scale


def per_token_quant_fp8(
    input: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize each row of ``input`` ``[T, H]`` (fp16/bf16/fp32; rows may be strided, the last
    dimension contiguous) with its own dynamic scale ``max(absmax(row) / fp8_max, 2^-126)``.

    Returns ``(out [T, H] fp8_dtype, scales [T, 1] fp32)``; ``out`` may be given (fp8, ``[T, H]``,
    last dimension contiguous).
    """
    _check_input(input, 2)
    if input.shape[1] > 1 and input.stride(1) != 1:
        raise ValueError("input: the last dimension must be contiguous (stride 1)")
    _check_fp8_dtype(fp8_dtype)
    if out is None:
        out = torch.empty(input.shape, dtype=fp8_dtype, device=input.device)
    else:
        _check_out(out, input, fp8_dtype, rows_only=True)
    scales = torch.empty((input.shape[0], 1), dtype=torch.float32, device=input.device)
    _per_token(input, out, scales)
    return out, scales


def check_cases(device: torch.device) -> list[dict]:
    """``sgljit check``: bit-exact against PyTorch's own division, clamp and cast (tolerance 0)."""

    def torch_quant(x: torch.Tensor, scale: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
        return reference.quantize(x, scale, fp8).double()

    cases = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
            name = (
                f"{str(dtype).removeprefix('torch.')} -> {str(fp8).removeprefix('torch.float8_')}"
            )

            def dynamic(dtype=dtype, fp8=fp8):
                x = torch.randn(33, 4096, device=device, dtype=dtype) * 3
                out, scale = per_tensor_quant_fp8(x, fp8_dtype=fp8)
                # (true division, as documented: torch's `tensor / python_float` on CUDA multiplies
                # by the reciprocal, which is 1 ulp off for some absmax values)
                expected_scale = reference.per_tensor_scale(x, fp8)
                return (out.double(), scale), (torch_quant(x, expected_scale, fp8), expected_scale)

            def static(dtype=dtype, fp8=fp8):
                x = torch.randn(7, 1000, device=device, dtype=dtype) * 50
                scale = torch.tensor([0.0371], device=device)
                out, _ = per_tensor_quant_fp8(x, scale, fp8_dtype=fp8)
                return out.double(), torch_quant(x, scale, fp8)

            def per_token(dtype=dtype, fp8=fp8):
                x = (
                    torch.randn(9, 2048, device=device, dtype=dtype)
                    * torch.rand(9, 1, device=device, dtype=dtype)
                    * 10
                )
                out, scales = per_token_quant_fp8(x, fp8_dtype=fp8)
                expected_scales = reference.per_token_scales(x, fp8)
                return (out.double(), scales), (
                    torch_quant(x, expected_scales, fp8),
                    expected_scales,
                )

            cases += [
                {
                    "op": "per_tensor_quant_fp8",
                    "shape": f"33x4096 dynamic {name}",
                    "run": dynamic,
                    "tol": 0.0,
                },
                {
                    "op": "per_tensor_quant_fp8",
                    "shape": f"7x1000 static {name}",
                    "run": static,
                    "tol": 0.0,
                },
                {
                    "op": "per_token_quant_fp8",
                    "shape": f"9x2048 {name}",
                    "run": per_token,
                    "tol": 0.0,
                },
            ]
    return cases

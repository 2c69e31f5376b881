"""The RMSNorm family: ``rmsnorm``, ``fused_add_rmsnorm``, ``gemma_rmsnorm``,
``gemma_fused_add_rmsnorm``, ``qknorm`` and ``qknorm_across_heads``.

Dtypes float16, bfloat16, float32; math in float32, cast once. Rows may be strided views (the last
dimension must be contiguous). CUDA kernels are specialized by dtype and row width: every width that
is a multiple of 16 bytes (8 elements of 16-bit types, 4 of float32) up to 4096 vectors per row
(bf16/fp16 32768, fp32 16384) takes the fast path (the row lives in registers); any other width, or
a row that is not 16-byte aligned, takes a correct generic kernel.
"""

import torch

from sgljit.op import Case, Cuda, Family, Scalar, Sycl, Tensor, as_rows

from . import reference

__all__ = [
    "HEAD_DIMS",
    "compiled_width",
    "family",
    "fused_add_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "qknorm",
    "qknorm_across_heads",
    "rmsnorm",
]

family = Family("norm", __file__)
HEAD_DIMS = (64, 128, 256, 512, 1024)
_MAX_VECS_PER_ROW = 4096  # csrc/norm.cuh NormConfig::kMaxVecsPerRow
_FLEET_DTYPES = (torch.bfloat16, torch.float16)
_FLEET_HIDDENS = (
    1024,
    2048,
    2304,
    2560,
    3072,
    3584,
    3840,
    4096,
    5120,
    5376,
    6144,
    7168,
    8192,
    16384,
)
_FLEET_HEAD_DIMS = (64, 128, 256)
_FLEET_ACROSS = ((2048, 512), (4096, 1024), (5120, 1024), (6144, 1024))


def compiled_width(dtype: torch.dtype, hidden: int) -> int:
    """The width a CUDA module is specialized for: ``hidden`` on the fast path, 0 (generic kernel,
    any width) when ``hidden`` is not a whole number of 16-byte vectors or is too wide."""
    vec = 16 // dtype.itemsize
    if hidden > 0 and hidden % vec == 0 and hidden // vec <= _MAX_VECS_PER_ROW:
        return hidden
    return 0


# ------------------------------------------------------------------------------------------------
# Specializations: CUDA by dtype and width; SYCL by dtype, width and access width (one module
# serves every op at a width).


def _rows_key(x, *_):
    return x.dtype, x.shape[-1]


def _rows_params(dtype: torch.dtype, hidden: int) -> dict:
    return {"dtype": dtype, "width": compiled_width(dtype, hidden)}


def _across_key(q, k, *_):
    return q.dtype, q.shape[-1], k.shape[-1]


def _across_params(dtype: torch.dtype, q_width: int, k_width: int) -> dict:
    """Both widths on the fast path, or both generic (0)."""
    wq, wk = compiled_width(dtype, q_width), compiled_width(dtype, k_width)
    return {"dtype": dtype, "width": wq if wq and wk else 0, "width2": wk if wq and wk else 0}


def _sycl_key(dtype: torch.dtype, hidden: int, vec: int) -> dict:
    """Work-items per row: a power of two in [16, 256] (sub-groups of 16)."""
    work_group = min(256, max(16, 1 << (hidden // vec - 1).bit_length()))
    return {"SGLJIT_T": dtype, "NORM_HIDDEN": hidden, "NORM_VEC": vec, "NORM_WG": work_group}


def _sycl_vec(hidden: int, *tensors: torch.Tensor) -> int:
    """16 bytes when the width, every pointer and every row stride allow it, else 1 element."""
    vec = 16 // tensors[0].element_size()
    if hidden % vec:
        return 1
    for t in tensors:
        if t.data_ptr() % 16:
            return 1
        if any(st % vec for st, sz in zip(t.stride()[:-1], t.shape[:-1], strict=True) if sz > 1):
            return 1
    return vec


def _sycl_rows_key(x, y, z, *_):
    """(input, weight, out) or (input, residual, weight): every tensor decides the access width."""
    return _sycl_key(x.dtype, x.shape[-1], _sycl_vec(x.shape[-1], x, y, z))


def _sycl_heads_key(q, k, q_weight, *_):
    return _sycl_key(q.dtype, q.shape[-1], _sycl_vec(q.shape[-1], q, q_weight))


def _launch_rmsnorm(module, key, input, weight, out, eps: float, w_offset: float) -> None:
    fn = module.get_function("rmsnorm", ("ptr", "ptr", "ptr", "i64", "i64", "f32", "f32"))
    wg = key["NORM_WG"]
    fn(input.shape[0] * wg, wg, input, weight, out, input.stride(0), out.stride(0), w_offset, eps)


def _launch_fused(module, key, input, residual, weight, eps: float, w_offset: float) -> None:
    fn = module.get_function("fused_add_rmsnorm", ("ptr", "ptr", "ptr", "i64", "i64", "f32", "f32"))
    wg = key["NORM_WG"]
    fn(
        input.shape[0] * wg,
        wg,
        input,
        residual,
        weight,
        input.stride(0),
        residual.stride(0),
        w_offset,
        eps,
    )


def _launch_heads(module, key, x, weight, eps: float) -> None:
    """In place over [T, heads, D] (a 2-D [T, W] is one head of width W)."""
    x3 = x if x.dim() == 3 else x.unsqueeze(1)
    wg = key["NORM_WG"]
    fn = module.get_function("head_rmsnorm", ("ptr", "ptr", "i64", "i64", "i64", "f32"))
    fn(x3.shape[0] * x3.shape[1] * wg, wg, x3, weight, x3.shape[1], x3.stride(0), x3.stride(1), eps)


def _launch_qk(module, key, q, k, q_weight, k_weight, eps: float) -> None:
    _launch_heads(module, key, q, q_weight, eps)
    k_key = _sycl_heads_key(k, None, k_weight)
    _launch_heads(family.sycl_module("norm", k_key), k_key, k, k_weight, eps)


# ------------------------------------------------------------------------------------------------
# Check cases (float64 reference; tolerances per dtype)

_TOLERANCES = ((torch.bfloat16, 2e-2), (torch.float16, 1e-2), (torch.float32, 1e-5))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _row_cases(fused: bool) -> list[Case]:
    def make(device, tokens, hidden, dtype):
        def rand(*shape):
            return torch.randn(*shape, device=device, dtype=dtype)

        if fused:
            return rand(tokens, hidden), rand(tokens, hidden), rand(hidden), 1e-6
        return (
            rand(tokens, hidden),
            rand(hidden),
            torch.empty(tokens, hidden, device=device, dtype=dtype),
            1e-6,
        )

    return [
        Case(f"{t}x{h} {_dtype_name(dt)}", lambda dev, t=t, h=h, dt=dt: make(dev, t, h, dt), tol)
        for dt, tol in _TOLERANCES
        for t, h in ((7, 4096), (1, 1024), (3, 1000))
    ]


def _qk_cases(across: bool) -> list[Case]:
    def make(device, dtype):
        qkv = torch.randn(5, (8 + 2 * 2) * 128, device=device, dtype=dtype)  # views into one buffer
        q, k = qkv[:, : 8 * 128], qkv[:, 8 * 128 : 10 * 128]
        if not across:
            q, k = q.unflatten(1, (8, 128)), k.unflatten(1, (2, 128))
        return (
            q,
            k,
            torch.randn(q.shape[-1], device=device, dtype=dtype),
            torch.randn(k.shape[-1], device=device, dtype=dtype),
            1e-6,
        )

    shape = "5x(8+2)*128" if across else "5x(8+2)x128"
    return [
        Case(f"{shape} {_dtype_name(dt)}", lambda dev, dt=dt: make(dev, dt), tol)
        for dt, tol in _TOLERANCES
    ]


# ------------------------------------------------------------------------------------------------
# The ops (destination passing)

_ROWS = {
    "input": Tensor("num_tokens", "hidden"),
    "weight": Tensor("hidden", dtype="input", layout="contiguous"),
    "out": Tensor("num_tokens", "hidden", dtype="input", io="out"),
    "eps": Scalar(float, min=0.0),
}
_FUSED = {
    "input": Tensor("num_tokens", "hidden", io="inout"),
    "residual": Tensor("num_tokens", "hidden", dtype="input", io="inout"),
    "weight": Tensor("hidden", dtype="input", layout="contiguous"),
    "eps": Scalar(float, min=0.0),
}
_ROWS_PREBUILD = {
    "cuda": [{"dtype": dt, "width": h} for dt in _FLEET_DTYPES for h in _FLEET_HIDDENS],
    "sycl": [
        _sycl_key(dt, h, 16 // dt.itemsize)
        for dt in _FLEET_DTYPES
        for h in sorted(
            {*_FLEET_HIDDENS, *_FLEET_HEAD_DIMS, *(w for p in _FLEET_ACROSS for w in p)}
        )
    ],
}


def _row_op(name: str, gemma: bool, fused: bool):
    cpp = "FusedAddRMSNorm" if fused else "RMSNorm"
    ref = reference.fused_add_rmsnorm_ if fused else reference.rmsnorm_into
    return family.op(
        name,
        args=_FUSED if fused else _ROWS,
        reference=lambda *args: ref(*args, gemma=gemma),
        doc=ref.__doc__,
        cuda=Cuda(
            "csrc/norm.cuh",
            f"sgljit_norm::{cpp}<{{dtype}}, {{width}}, {str(gemma).lower()}>::run",
            key=_rows_key,
            params=_rows_params,
            module="rows",
        ),
        sycl=Sycl(
            "sycl/norm.hpp",
            key=_sycl_rows_key,
            launch=lambda *args: (_launch_fused if fused else _launch_rmsnorm)(*args, float(gemma)),
            module="norm",
        ),
        # One entry per width builds the module the four row ops share.
        prebuild=_ROWS_PREBUILD if name == "rmsnorm" else None,
        cases=_row_cases(fused),
    )


_rmsnorm = _row_op("rmsnorm", gemma=False, fused=False)
_gemma_rmsnorm = _row_op("gemma_rmsnorm", gemma=True, fused=False)
_fused_add_rmsnorm = _row_op("fused_add_rmsnorm", gemma=False, fused=True)
_gemma_fused_add_rmsnorm = _row_op("gemma_fused_add_rmsnorm", gemma=True, fused=True)

_qknorm = family.op(
    "qknorm",
    args={
        "q": Tensor("num_tokens", "q_heads", "head_dim", io="inout"),
        "k": Tensor("num_tokens", "k_heads", "head_dim", dtype="q", io="inout"),
        "q_weight": Tensor("head_dim", dtype="q", layout="contiguous"),
        "k_weight": Tensor("head_dim", dtype="q", layout="contiguous"),
        "eps": Scalar(float, min=0.0),
    },
    reference=reference.qknorm_,
    cuda=Cuda(
        "csrc/norm.cuh",
        "sgljit_norm::QKNorm<{dtype}, {width}>::run",
        key=_rows_key,
        params=_rows_params,
    ),
    sycl=Sycl("sycl/norm.hpp", key=_sycl_heads_key, launch=_launch_qk, module="norm"),
    prebuild={
        "cuda": [{"dtype": dt, "width": d} for dt in _FLEET_DTYPES for d in _FLEET_HEAD_DIMS]
    },
    cases=_qk_cases(across=False),
)

_qknorm_across_heads = family.op(
    "qknorm_across_heads",
    args={
        "q": Tensor("num_tokens", "q_width", io="inout"),
        "k": Tensor("num_tokens", "k_width", dtype="q", io="inout"),
        "q_weight": Tensor("q_width", dtype="q", layout="contiguous"),
        "k_weight": Tensor("k_width", dtype="q", layout="contiguous"),
        "eps": Scalar(float, min=0.0),
    },
    reference=reference.qknorm_across_heads_,
    cuda=Cuda(
        "csrc/norm.cuh",
        "sgljit_norm::QKNormAcrossHeads<{dtype}, {width}, {width2}>::run",
        key=_across_key,
        params=_across_params,
    ),
    sycl=Sycl("sycl/norm.hpp", key=_sycl_heads_key, launch=_launch_qk, module="norm"),
    prebuild={
        "cuda": [
            {"dtype": dt, "width": wq, "width2": wk}
            for dt in _FLEET_DTYPES
            for wq, wk in _FLEET_ACROSS
        ]
    },
    cases=_qk_cases(across=True),
)


# ------------------------------------------------------------------------------------------------
# Public functions


def rmsnorm(
    input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``out = input * rsqrt(mean(input^2, -1) + eps) * weight`` over the last dimension.

    input ``[..., H]`` (rows may be strided; last dimension contiguous), weight ``[H]``, same
    dtype (float16, bfloat16, float32). Returns ``out`` (allocated if not given).
    """
    if out is None:
        out = torch.empty_like(input, memory_format=torch.contiguous_format)
    _rmsnorm(as_rows(input, "input"), weight, as_rows(out, "out", True), eps)
    return out


def gemma_rmsnorm(
    input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`rmsnorm` with weight ``(1 + weight)`` (Gemma)."""
    if out is None:
        out = torch.empty_like(input, memory_format=torch.contiguous_format)
    _gemma_rmsnorm(as_rows(input, "input"), weight, as_rows(out, "out", True), eps)
    return out


def fused_add_rmsnorm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> None:
    """In place: ``residual <- input + residual`` (rounded to the dtype), then
    ``input <- rmsnorm(residual, weight, eps)``. input, residual ``[..., H]``, weight ``[H]``."""
    _fused_add_rmsnorm(
        as_rows(input, "input", True), as_rows(residual, "residual", True), weight, eps
    )


def gemma_fused_add_rmsnorm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> None:
    """:func:`fused_add_rmsnorm` with weight ``(1 + weight)`` (Gemma)."""
    _gemma_fused_add_rmsnorm(
        as_rows(input, "input", True), as_rows(residual, "residual", True), weight, eps
    )


def qknorm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
) -> None:
    """In place, per head: q ``[T, Hq, D]``, k ``[T, Hk, D]`` (usually strided views into one
    fused qkv buffer; last dimension contiguous), weights ``[D]``, D in {64, 128, 256, 512, 1024}."""
    if isinstance(q, torch.Tensor) and q.shape[-1] not in HEAD_DIMS:
        raise ValueError(
            f"q: head dim (last dimension) {q.shape[-1]} is not supported; expected one of "
            f"{', '.join(map(str, HEAD_DIMS))}"
        )
    _qknorm(q, k, q_weight, k_weight, eps)


def qknorm_across_heads(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
) -> None:
    """In place, over whole rows: q ``[T, Hq*D]``, k ``[T, Hk*D]`` (rows may be strided),
    q_weight ``[Hq*D]``, k_weight ``[Hk*D]``."""
    _qknorm_across_heads(q, k, q_weight, k_weight, eps)

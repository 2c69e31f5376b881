"""The RMSNorm family: ``rmsnorm``, ``fused_add_rmsnorm``, ``gemma_rmsnorm``,
``gemma_fused_add_rmsnorm``, ``qknorm`` and ``qknorm_across_heads``.

Dtypes float16, bfloat16, float32; math in float32, cast once. Rows may be strided views (the last
dimension must be contiguous). CUDA kernels are specialized by dtype and row width: every width that
is a multiple of 16 bytes (8 elements of 16-bit types, 4 of float32) up to 4096 vectors per row (bf16/fp16 32768, fp32 16384) takes
the fast path (the row lives in registers); any other width, or a row that is not 16-byte aligned,
takes a correct generic kernel.
"""

import math
from pathlib import Path

import torch

import sgljit
from sgljit.jit_utils import as_dtype
from sgljit.op import kernel_op

from . import reference

__all__ = [
    "HEAD_DIMS",
    "cuda_function",
    "cuda_module",
    "fused_add_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "prebuild",
    "prebuild_specs",
    "qknorm",
    "qknorm_across_heads",
    "rmsnorm",
    "sycl_module",
]

_HERE = Path(__file__).resolve().parent
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HEAD_DIMS = (64, 128, 256, 512, 1024)
_MAX_VECS_PER_ROW = 4096  # csrc/norm.cuh kMaxVecsPerRow

# ------------------------------------------------------------------------------------------------
# Module loaders

# CUDA modules: "rows" (rmsnorm, fused add and their Gemma forms share a module per dtype and width:
# a model uses several of them at one width), "qknorm" (per head dim), "qknorm_across_heads".
_CUDA_EXPORTS = {
    "rows": {
        "rmsnorm": "sgljit_norm::RMSNorm<{t}, {h}, false>::run",
        "gemma_rmsnorm": "sgljit_norm::RMSNorm<{t}, {h}, true>::run",
        "fused_add_rmsnorm": "sgljit_norm::FusedAddRMSNorm<{t}, {h}, false>::run",
        "gemma_fused_add_rmsnorm": "sgljit_norm::FusedAddRMSNorm<{t}, {h}, true>::run",
    },
    "qknorm": {"qknorm": "sgljit_norm::QKNorm<{t}, {h}>::run"},
    "qknorm_across_heads": {
        "qknorm_across_heads": "sgljit_norm::QKNormAcrossHeads<{t}, {h}, {h2}>::run"
    },
}
_MODULE_OF = {op: kind for kind, exports in _CUDA_EXPORTS.items() for op in exports}


def compiled_width(dtype, hidden: int) -> int:
    """The width a CUDA module is specialized for: ``hidden`` on the fast path, 0 (generic kernel,
    any width) when ``hidden`` is not a whole number of 16-byte vectors or is too wide."""
    vec = 16 // as_dtype(dtype).itemsize
    if hidden > 0 and hidden % vec == 0 and hidden // vec <= _MAX_VECS_PER_ROW:
        return hidden
    return 0


@sgljit.cache_once
def cuda_module(kind: str, dtype, hidden: int, hidden2: int = 0):
    """CUDA module of ``kind`` for rows of ``hidden`` elements: ``"rows"`` exports rmsnorm,
    gemma_rmsnorm, fused_add_rmsnorm and gemma_fused_add_rmsnorm; ``"qknorm"`` (hidden = the head
    dim) exports qknorm; ``"qknorm_across_heads"`` (hidden = q's width, hidden2 = k's) exports
    qknorm_across_heads. Width 0 builds only the generic kernel (any width); pass widths through
    :func:`compiled_width`."""
    if kind not in _CUDA_EXPORTS:
        raise ValueError(
            f"cuda_module: unknown kind {kind!r}; expected one of {sorted(_CUDA_EXPORTS)}"
        )
    t = str(sgljit.make_cpp_args(as_dtype(dtype)))
    hidden, hidden2 = int(hidden), int(hidden2)
    wrappers = [
        (op, target.format(t=t, h=hidden, h2=hidden2)) for op, target in _CUDA_EXPORTS[kind].items()
    ]
    markers = ("norm", kind, t, hidden) + ((hidden2,) if kind == "qknorm_across_heads" else ())
    return sgljit.load_jit(
        *markers, cuda_files=["norm.cuh"], source_dir=_HERE / "csrc", cuda_wrappers=wrappers
    )


@sgljit.cache_once
def cuda_function(op: str, dtype, hidden: int, hidden2: int = 0):
    """The function ``op`` of its :func:`cuda_module` (looked up once)."""
    return getattr(cuda_module(_MODULE_OF[op], dtype, hidden, hidden2), op)


@sgljit.cache_once
def sycl_module(dtype, hidden: int, vec: int):
    """SYCL module with kernels ``rmsnorm``, ``fused_add_rmsnorm`` and ``head_rmsnorm`` for rows
    of ``hidden`` elements, accessed ``vec`` elements at a time (``hidden % vec == 0``)."""
    t = str(sgljit.make_cpp_args(as_dtype(dtype)))
    hidden, vec = int(hidden), int(vec)
    if vec < 1 or hidden % vec:
        raise ValueError(f"sycl_module: hidden {hidden} is not a multiple of vec {vec}")
    return sgljit.load_jit_sycl(
        "norm",
        t,
        hidden,
        vec,
        sycl_files=[_HERE / "sycl" / "norm.hpp"],
        extra_sycl_cflags=[
            f"-DSGLJIT_T={t}",
            f"-DNORM_HIDDEN={hidden}",
            f"-DNORM_VEC={vec}",
            f"-DNORM_WG={_sycl_work_group(hidden // vec)}",
        ],
    )


def _sycl_work_group(num_vec: int) -> int:
    """Work-items per row: a power of two in [16, 256] (sub-groups of 16)."""
    return min(256, max(16, 1 << (num_vec - 1).bit_length()))


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


def prebuild_specs(backend: str) -> list[dict]:
    """Specializations a serving fleet needs on ``backend`` ("cuda" or "sycl"): bf16/fp16, common
    hidden sizes and head dims. Each is ``{"op": ..., "dtype": name, "hidden": ...}`` (plus
    ``hidden2`` for qknorm_across_heads); build one with ``prebuild(backend, **spec)``. One
    ``rmsnorm`` entry builds the module the four row ops share at that width; on SYCL one module
    per (dtype, width) serves every op, so only widths are listed."""
    if backend not in ("cuda", "sycl"):
        raise ValueError(f"prebuild_specs: backend must be 'cuda' or 'sycl', got {backend!r}")
    specs: list[dict] = []
    for dtype in ("bfloat16", "float16"):
        if backend == "sycl":
            widths = sorted(
                {*_FLEET_HIDDENS, *_FLEET_HEAD_DIMS, *(w for pair in _FLEET_ACROSS for w in pair)}
            )
            specs += [dict(op="rmsnorm", dtype=dtype, hidden=h) for h in widths]
            continue
        specs += [dict(op="rmsnorm", dtype=dtype, hidden=h) for h in _FLEET_HIDDENS]
        specs += [dict(op="qknorm", dtype=dtype, hidden=d) for d in _FLEET_HEAD_DIMS]
        specs += [
            dict(op="qknorm_across_heads", dtype=dtype, hidden=wq, hidden2=wk)
            for wq, wk in _FLEET_ACROSS
        ]
    return specs


def _across_widths(dtype, wq: int, wk: int) -> tuple[int, int]:
    """Compiled widths of a qknorm_across_heads module: both fast, or both generic (0)."""
    wq, wk = compiled_width(dtype, wq), compiled_width(dtype, wk)
    return (wq, wk) if wq and wk else (0, 0)


def prebuild(backend: str, op: str, dtype, hidden: int, hidden2: int = 0):
    """Build (or fetch from the cache) the module of one :func:`prebuild_specs` entry."""
    if backend not in ("cuda", "sycl"):
        raise ValueError(f"prebuild: backend must be 'cuda' or 'sycl', got {backend!r}")
    if op not in _MODULE_OF:
        raise ValueError(f"prebuild: unknown op {op!r}; expected one of {sorted(_MODULE_OF)}")
    if backend == "cuda":
        if op == "qknorm_across_heads":
            return cuda_module(_MODULE_OF[op], dtype, *_across_widths(dtype, hidden, hidden2))
        return cuda_module(_MODULE_OF[op], dtype, compiled_width(dtype, hidden))
    vec = 16 // as_dtype(dtype).itemsize
    mods = [sycl_module(dtype, h, vec if h % vec == 0 else 1) for h in (hidden, hidden2) if h]
    for extra in mods[1:]:
        extra.build()
    return mods[0]


# ------------------------------------------------------------------------------------------------
# Helpers


def _rows2d(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 2 else x.view(-1, x.shape[-1])


def _sycl_vec(dtype: torch.dtype, hidden: int, *tensors: torch.Tensor) -> int:
    """16 bytes when the width, every pointer and every row stride allow it, else 1 element."""
    vec = 16 // dtype.itemsize
    if hidden % vec:
        return 1
    for t in tensors:
        if t.data_ptr() % 16:
            return 1
        if any(st % vec for st, sz in zip(t.stride()[:-1], t.shape[:-1], strict=True) if sz > 1):
            return 1
    return vec


def _sycl_norm_rows(x, weight, out, eps: float, w_offset: float) -> None:
    h = x.shape[-1]
    x2, o2 = _rows2d(x), _rows2d(out)
    vec = _sycl_vec(x.dtype, h, x2, o2, weight)
    fn = sycl_module(x.dtype, h, vec).get_function(
        "rmsnorm", ("ptr", "ptr", "ptr", "i64", "i64", "f32", "f32")
    )
    wg = _sycl_work_group(h // vec)
    fn(x2.shape[0] * wg, wg, x2, weight, o2, x2.stride(0), o2.stride(0), w_offset, eps)


def _sycl_fused(x, residual, weight, eps: float, w_offset: float) -> None:
    h = x.shape[-1]
    x2, r2 = _rows2d(x), _rows2d(residual)
    vec = _sycl_vec(x.dtype, h, x2, r2, weight)
    fn = sycl_module(x.dtype, h, vec).get_function(
        "fused_add_rmsnorm", ("ptr", "ptr", "ptr", "i64", "i64", "f32", "f32")
    )
    wg = _sycl_work_group(h // vec)
    fn(x2.shape[0] * wg, wg, x2, r2, weight, x2.stride(0), r2.stride(0), w_offset, eps)


def _sycl_heads(x, weight, eps: float) -> None:
    """In place over [T, heads, D] (a 2-D [T, W] is one head of width W)."""
    x3 = x if x.dim() == 3 else x.unsqueeze(1)
    h = x3.shape[-1]
    vec = _sycl_vec(x.dtype, h, x3, weight)
    fn = sycl_module(x.dtype, h, vec).get_function(
        "head_rmsnorm", ("ptr", "ptr", "i64", "i64", "i64", "f32")
    )
    wg = _sycl_work_group(h // vec)
    rows = x3.shape[0] * x3.shape[1]
    fn(rows * wg, wg, x3, weight, x3.shape[1], x3.stride(0), x3.stride(1), eps)


# ------------------------------------------------------------------------------------------------
# Kernel ops (destination passing; the decorated body is the reference backend)


@kernel_op("rmsnorm", mutates_args=("out",))
def _rmsnorm(input: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float) -> None:
    reference.rmsnorm_into(input, weight, out, eps)


@_rmsnorm.register("cuda")
def _(input, weight, out, eps):
    h = input.shape[-1]
    cuda_function("rmsnorm", input.dtype, compiled_width(input.dtype, h))(
        _rows2d(input), weight, _rows2d(out), eps
    )


@_rmsnorm.register("sycl")
def _(input, weight, out, eps):
    _sycl_norm_rows(input, weight, out, eps, 0.0)


@kernel_op("gemma_rmsnorm", mutates_args=("out",))
def _gemma_rmsnorm(
    input: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float
) -> None:
    reference.rmsnorm_into(input, weight, out, eps, gemma=True)


@_gemma_rmsnorm.register("cuda")
def _(input, weight, out, eps):
    h = input.shape[-1]
    cuda_function("gemma_rmsnorm", input.dtype, compiled_width(input.dtype, h))(
        _rows2d(input), weight, _rows2d(out), eps
    )


@_gemma_rmsnorm.register("sycl")
def _(input, weight, out, eps):
    _sycl_norm_rows(input, weight, out, eps, 1.0)


@kernel_op("fused_add_rmsnorm", mutates_args=("input", "residual"))
def _fused_add_rmsnorm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    reference.fused_add_rmsnorm_(input, residual, weight, eps)


@_fused_add_rmsnorm.register("cuda")
def _(input, residual, weight, eps):
    h = input.shape[-1]
    cuda_function("fused_add_rmsnorm", input.dtype, compiled_width(input.dtype, h))(
        _rows2d(input), _rows2d(residual), weight, eps
    )


@_fused_add_rmsnorm.register("sycl")
def _(input, residual, weight, eps):
    _sycl_fused(input, residual, weight, eps, 0.0)


@kernel_op("gemma_fused_add_rmsnorm", mutates_args=("input", "residual"))
def _gemma_fused_add_rmsnorm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    reference.fused_add_rmsnorm_(input, residual, weight, eps, gemma=True)


@_gemma_fused_add_rmsnorm.register("cuda")
def _(input, residual, weight, eps):
    h = input.shape[-1]
    cuda_function("gemma_fused_add_rmsnorm", input.dtype, compiled_width(input.dtype, h))(
        _rows2d(input), _rows2d(residual), weight, eps
    )


@_gemma_fused_add_rmsnorm.register("sycl")
def _(input, residual, weight, eps):
    _sycl_fused(input, residual, weight, eps, 1.0)


@kernel_op("qknorm", mutates_args=("q", "k"))
def _qknorm(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float
) -> None:
    reference.qknorm_(q, k, q_weight, k_weight, eps)


@_qknorm.register("cuda")
def _(q, k, q_weight, k_weight, eps):
    d = q.shape[-1]
    cuda_function("qknorm", q.dtype, compiled_width(q.dtype, d))(q, k, q_weight, k_weight, eps)


@_qknorm.register("sycl")
def _(q, k, q_weight, k_weight, eps):
    _sycl_heads(q, q_weight, eps)
    _sycl_heads(k, k_weight, eps)


@kernel_op("qknorm_across_heads", mutates_args=("q", "k"))
def _qknorm_across_heads(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float
) -> None:
    reference.qknorm_across_heads_(q, k, q_weight, k_weight, eps)


@_qknorm_across_heads.register("cuda")
def _(q, k, q_weight, k_weight, eps):
    wq, wk = _across_widths(q.dtype, q.shape[-1], k.shape[-1])
    cuda_function("qknorm_across_heads", q.dtype, wq, wk)(q, k, q_weight, k_weight, eps)


@_qknorm_across_heads.register("sycl")
def _(q, k, q_weight, k_weight, eps):
    _sycl_heads(q, q_weight, eps)
    _sycl_heads(k, k_weight, eps)


# ------------------------------------------------------------------------------------------------
# Validation (errors name the argument and what was expected)


def _check_tensor(x, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")


def _check_float(x: torch.Tensor, name: str) -> None:
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype float16, bfloat16 or float32, got {x.dtype}")


def _check_like(x: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if x.dtype != ref.dtype:
        raise ValueError(f"{name}: expected dtype {ref.dtype} (that of {ref_name}), got {x.dtype}")
    if x.device != ref.device:
        raise ValueError(
            f"{name}: expected a tensor on {ref.device} (the device of {ref_name}), got {x.device}"
        )


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps: expected a float, got {type(eps).__name__}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps: expected a finite value >= 0, got {eps}")
    return float(eps)


def _rows_collapse(x: torch.Tensor) -> bool:
    """Whether the leading dimensions collapse into one (a single row stride)."""
    if x.dim() <= 2:  # the common case, and the eager hot path: nothing to check
        return True
    expected = None
    for size, stride in zip(reversed(x.shape[:-1]), reversed(x.stride()[:-1]), strict=True):
        if size == 1:
            continue
        if expected is not None and stride != expected:
            return False
        expected = stride * size
    return True


def _check_rows(x, name: str, ndim: int | None = None) -> None:
    """A float tensor of rows: non-empty, unit stride in its last dimension."""
    _check_tensor(x, name)
    _check_float(x, name)
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(x.shape)}")
    if x.dim() == 0:
        raise ValueError(f"{name}: expected a tensor of shape [..., hidden], got a 0-d tensor")
    if x.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(x.shape)}")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(
            f"{name}: the last dimension must be contiguous (stride 1), got stride {x.stride(-1)}"
        )


def _check_weight(w, name: str, width: int, ref: torch.Tensor, ref_name: str) -> None:
    _check_tensor(w, name)
    _check_like(w, name, ref, ref_name)
    if w.dim() != 1 or w.shape[0] != width:
        raise ValueError(
            f"{name}: expected shape ({width},) (the last dimension of {ref_name}), "
            f"got {tuple(w.shape)}"
        )
    if width > 1 and w.stride(0) != 1:
        raise ValueError(f"{name}: expected a contiguous tensor, got stride {w.stride(0)}")


def _check_in_place_rows(x: torch.Tensor, name: str) -> None:
    if not _rows_collapse(x):
        raise ValueError(
            f"{name}: updated in place, so its leading dimensions must collapse into rows of one "
            f"stride; got shape {tuple(x.shape)} with strides {x.stride()}"
        )


def _prepare_rmsnorm(input, weight, eps, out):
    _check_rows(input, "input")
    _check_weight(weight, "weight", input.shape[-1], input, "input")
    eps = _check_eps(eps)
    if out is None:
        out = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    else:
        _check_rows(out, "out")
        _check_like(out, "out", input, "input")
        if out.shape != input.shape:
            raise ValueError(
                f"out: expected shape {tuple(input.shape)} (that of input), got {tuple(out.shape)}"
            )
        _check_in_place_rows(out, "out")
    if not _rows_collapse(input):
        input = input.contiguous()
    return input, out, eps


def _prepare_fused(input, residual, weight, eps):
    _check_rows(input, "input")
    _check_rows(residual, "residual")
    _check_like(residual, "residual", input, "input")
    if residual.shape != input.shape:
        raise ValueError(
            f"residual: expected shape {tuple(input.shape)} (that of input), "
            f"got {tuple(residual.shape)}"
        )
    _check_weight(weight, "weight", input.shape[-1], input, "input")
    _check_in_place_rows(input, "input")
    _check_in_place_rows(residual, "residual")
    return _check_eps(eps)


def _prepare_qk(q, k, q_weight, k_weight, eps, per_head: bool) -> float:
    ndim = 3 if per_head else 2
    _check_rows(q, "q", ndim)
    _check_rows(k, "k", ndim)
    _check_like(k, "k", q, "q")
    if k.shape[0] != q.shape[0]:
        raise ValueError(
            f"k: expected {q.shape[0]} tokens (dimension 0 of q), got shape {tuple(k.shape)}"
        )
    if per_head:
        d = q.shape[-1]
        if d not in HEAD_DIMS:
            raise ValueError(
                f"q: head dim (last dimension) {d} is not supported; expected one of "
                f"{', '.join(map(str, HEAD_DIMS))}"
            )
        if k.shape[-1] != d:
            raise ValueError(f"k: expected head dim {d} (that of q), got {k.shape[-1]}")
    _check_weight(q_weight, "q_weight", q.shape[-1], q, "q")
    _check_weight(k_weight, "k_weight", k.shape[-1], k, "k")
    return _check_eps(eps)


# ------------------------------------------------------------------------------------------------
# Public ops


def rmsnorm(
    input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``out = input * rsqrt(mean(input^2, -1) + eps) * weight`` over the last dimension.

    input ``[..., H]`` (rows may be strided; last dimension contiguous), weight ``[H]``, same
    dtype (float16, bfloat16, float32). Returns ``out`` (allocated if not given).
    """
    input, out, eps = _prepare_rmsnorm(input, weight, eps, out)
    _rmsnorm(input, weight, out, eps)
    return out


def gemma_rmsnorm(
    input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`rmsnorm` with weight ``(1 + weight)`` (Gemma)."""
    input, out, eps = _prepare_rmsnorm(input, weight, eps, out)
    _gemma_rmsnorm(input, weight, out, eps)
    return out


def fused_add_rmsnorm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> None:
    """In place: ``residual <- input + residual`` (rounded to the dtype), then
    ``input <- rmsnorm(residual, weight, eps)``. input, residual ``[..., H]``, weight ``[H]``."""
    eps = _prepare_fused(input, residual, weight, eps)
    _fused_add_rmsnorm(input, residual, weight, eps)


def gemma_fused_add_rmsnorm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> None:
    """:func:`fused_add_rmsnorm` with weight ``(1 + weight)`` (Gemma)."""
    eps = _prepare_fused(input, residual, weight, eps)
    _gemma_fused_add_rmsnorm(input, residual, weight, eps)


def qknorm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
) -> None:
    """In place, per head: q ``[T, Hq, D]``, k ``[T, Hk, D]`` (usually strided views into one
    fused qkv buffer; last dimension contiguous), weights ``[D]``, D in {64, 128, 256, 512, 1024}."""
    eps = _prepare_qk(q, k, q_weight, k_weight, eps, per_head=True)
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
    eps = _prepare_qk(q, k, q_weight, k_weight, eps, per_head=False)
    _qknorm_across_heads(q, k, q_weight, k_weight, eps)


def check_cases(device: torch.device) -> list[dict]:
    """``sgljit check``: every op on a few shapes, against float64 formulas written out here."""

    def rms64(x: torch.Tensor, w: torch.Tensor, gemma: bool = False) -> torch.Tensor:
        x, w = x.double(), w.double() + (1.0 if gemma else 0.0)
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w

    def rand(*shape: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype)

    cases = []
    for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float16, 1e-2), (torch.float32, 1e-5)):
        name = str(dtype).removeprefix("torch.")
        for tokens, hidden in ((7, 4096), (1, 1024)):

            def plain(tokens=tokens, hidden=hidden, dtype=dtype, gemma=False):
                x, w = rand(tokens, hidden, dtype=dtype), rand(hidden, dtype=dtype)
                y = (gemma_rmsnorm if gemma else rmsnorm)(x, w, 1e-6)
                return y, rms64(x, w, gemma)

            def fused(tokens=tokens, hidden=hidden, dtype=dtype, gemma=False):
                x, r, w = (
                    rand(tokens, hidden, dtype=dtype),
                    rand(tokens, hidden, dtype=dtype),
                    rand(hidden, dtype=dtype),
                )
                total = (x.double() + r.double()).to(dtype)  # the sum is rounded to the dtype first
                (gemma_fused_add_rmsnorm if gemma else fused_add_rmsnorm)(x, r, w, 1e-6)
                return (x, r), (rms64(total, w, gemma), total)

            shape = f"{tokens}x{hidden} {name}"
            cases += [
                {"op": "rmsnorm", "shape": shape, "run": plain, "tol": tol},
                {
                    "op": "gemma_rmsnorm",
                    "shape": shape,
                    "run": lambda f=plain: f(gemma=True),
                    "tol": tol,
                },
                {"op": "fused_add_rmsnorm", "shape": shape, "run": fused, "tol": tol},
                {
                    "op": "gemma_fused_add_rmsnorm",
                    "shape": shape,
                    "run": lambda f=fused: f(gemma=True),
                    "tol": tol,
                },
            ]

        def qk(dtype=dtype, across=False):
            qkv = rand(5, (8 + 2 * 2) * 128, dtype=dtype)  # q, k: strided views into one qkv buffer
            q, k = qkv[:, : 8 * 128], qkv[:, 8 * 128 : 10 * 128]
            if across:
                qw, kw = rand(8 * 128, dtype=dtype), rand(2 * 128, dtype=dtype)
                expected = (rms64(q, qw), rms64(k, kw))
                qknorm_across_heads(q, k, qw, kw, 1e-6)
            else:
                q, k = q.unflatten(1, (8, 128)), k.unflatten(1, (2, 128))
                qw, kw = rand(128, dtype=dtype), rand(128, dtype=dtype)
                expected = (rms64(q, qw), rms64(k, kw))
                qknorm(q, k, qw, kw, 1e-6)
            return (q, k), expected

        cases += [
            {"op": "qknorm", "shape": f"5x(8+2)x128 {name}", "run": qk, "tol": tol},
            {
                "op": "qknorm_across_heads",
                "shape": f"5x(8+2)*128 {name}",
                "run": lambda f=qk: f(across=True),
                "tol": tol,
            },
        ]
    return cases

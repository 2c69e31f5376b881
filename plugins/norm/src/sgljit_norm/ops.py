"""The RMSNorm family: ``rmsnorm``, ``fused_add_rmsnorm``, ``gemma_rmsnorm``,
``gemma_fused_add_rmsnorm``, ``qknorm``, ``qknorm_across_heads``, and RMSNorm -> fp8:
``rmsnorm_quant_fp8`` and ``fused_add_rmsnorm_quant_fp8`` (static or per-token dynamic scale).

Dtypes float16, bfloat16, float32; math in float32, cast once. The weights have the input's dtype
or float32. Rows may be strided views (the last dimension must be contiguous); ``[B, S, H]`` tensors
whose leading dimensions do not collapse into one row stride (a slice of a bigger buffer) are taken
as they are by the ``*_3d`` ops. ``rmsnorm`` and ``fused_add_rmsnorm`` have Hugging Face's rounding
as an option (``round_before_weight``); HF's Gemma norms round as the Gemma ops always do. The
fused adds normalize the rounded sum (what ``residual`` stores); ``float_sum`` normalizes the float32
sum instead, as FlashInfer's kernels do. CUDA
kernels are specialized by dtype, weight dtype and row width: every width that is a multiple of 16
bytes (8 elements of 16-bit types, 4 of float32) up to 4096 vectors per row (bf16/fp16 32768, fp32
16384) takes the fast path (the row lives in registers); any other width, or a row that is not
16-byte aligned, takes a correct generic kernel.

RMSNorm -> fp8 quantizes the float32 normalized value (not rounded to the input dtype first, as
FlashInfer's ``rmsnorm_quant``) with a correctly rounded division by the scale, clamped to the
format's range: ``out = (y / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)``.
"""

import torch

from sgljit import fp8
from sgljit.op import Case, Cuda, Family, Scalar, Sycl, Tensor, as_rows

from . import reference

__all__ = [
    "FP8_DTYPES",
    "HEAD_DIMS",
    "compiled_width",
    "family",
    "fused_add_rmsnorm",
    "fused_add_rmsnorm_quant_fp8",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "qknorm",
    "qknorm_across_heads",
    "rmsnorm",
    "rmsnorm_quant_fp8",
]

family = Family("norm", __file__)
HEAD_DIMS = (64, 128, 256, 512, 1024)
# csrc/norm.cuh NormConfig::kMaxVecsPerRow (norm_quant.cuh's rows too)
_MAX_VECS_PER_ROW = 4096
FP8_DTYPES = reference.FP8_DTYPES
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
# Specializations: CUDA by dtype, weight dtype, width (and the row ops' rounding); SYCL by dtype,
# weight dtype, width, rounding and access width (one module serves every op at a width).


def _rows_key(x, w, *_):
    """rmsnorm-like ops without the rounding option (the Gemma ones): (input, weight, ...)."""
    return x.dtype, x.shape[-1], w.dtype, False, False


def _rows_round_key(x, w, out, eps, round_before_weight):
    return x.dtype, x.shape[-1], w.dtype, round_before_weight, False


def _fused_key(x, r, w, eps, float_sum):
    return x.dtype, x.shape[-1], w.dtype, False, float_sum


def _fused_round_key(x, r, w, eps, float_sum, round_before_weight):
    return x.dtype, x.shape[-1], w.dtype, round_before_weight, float_sum


def _rows_params(
    dtype: torch.dtype, hidden: int, weight: torch.dtype, round: bool, float_sum: bool = False
) -> dict:
    return {
        "dtype": dtype,
        "weight": weight,
        "width": compiled_width(dtype, hidden),
        "round": round,
        "float_sum": float_sum,
    }


def _qk_key(q, k, q_weight, *_):
    return q.dtype, q.shape[-1], q_weight.dtype


def _qk_params(dtype: torch.dtype, head_dim: int, weight: torch.dtype) -> dict:
    return {"dtype": dtype, "weight": weight, "width": compiled_width(dtype, head_dim)}


def _across_key(q, k, q_weight, *_):
    return q.dtype, q.shape[-1], k.shape[-1], q_weight.dtype


def _across_params(
    dtype: torch.dtype, q_width: int, k_width: int, weight: torch.dtype | None = None
) -> dict:
    """Both widths on the fast path, or both generic (0). ``weight``: the input's dtype if None."""
    wq, wk = compiled_width(dtype, q_width), compiled_width(dtype, k_width)
    fast = bool(wq and wk)
    return {
        "dtype": dtype,
        "weight": weight or dtype,
        "width": wq if fast else 0,
        "width2": wk if fast else 0,
    }


def _sycl_key(
    dtype: torch.dtype,
    hidden: int,
    vec: int,
    weight: torch.dtype | None = None,
    round: bool = False,
    float_sum: bool = False,
) -> dict:
    """Work-items per row: a power of two in [16, 256] (sub-groups of 16). ``weight``: the input's
    dtype if None. NORM_SUM only where set (the other keys name the modules they always did)."""
    work_group = min(256, max(16, 1 << (hidden // vec - 1).bit_length()))
    key = {
        "SGLJIT_T": dtype,
        "NORM_W": weight or dtype,
        "NORM_ROUND": round,
        "NORM_HIDDEN": hidden,
        "NORM_VEC": vec,
        "NORM_WG": work_group,
    }
    if float_sum:
        key["NORM_SUM"] = True
    return key


def _sycl_vec(hidden: int, *tensors: torch.Tensor) -> int:
    """16 bytes of the rows' dtype when the width, every pointer (aligned to that many elements of
    its own dtype) and every row stride allow it, else 1 element."""
    vec = 16 // tensors[0].element_size()
    if hidden % vec:
        return 1
    for t in tensors:
        if t.data_ptr() % (vec * t.element_size()):
            return 1
        if any(st % vec for st, sz in zip(t.stride()[:-1], t.shape[:-1], strict=True) if sz > 1):
            return 1
    return vec


def _sycl_rows_key(x, y, z, eps, *flags):
    """(input, weight, out, eps[, round]) or (input, residual, weight, eps, float_sum[, round]):
    every tensor decides the access width."""
    fused = y.dim() != 1
    weight = z if fused else y
    float_sum = bool(flags[0]) if fused else False
    round = bool(flags[-1]) if len(flags) > int(fused) else False
    vec = _sycl_vec(x.shape[-1], x, y, z)
    return _sycl_key(x.dtype, x.shape[-1], vec, weight.dtype, round, float_sum)


def _sycl_heads_key(q, k, q_weight, *_):
    return _sycl_key(q.dtype, q.shape[-1], _sycl_vec(q.shape[-1], q, q_weight), q_weight.dtype)


def _sycl_rows(*tensors: torch.Tensor) -> tuple[int, int, list[int]]:
    """(rows, inner, [s0, s1 of each tensor]): row r at (r // inner) * s0 + (r % inner) * s1."""
    first = tensors[0]
    if first.dim() == 2:
        return first.shape[0], 1, [s for t in tensors for s in (t.stride(0), 0)]
    rows, inner = first.shape[0] * first.shape[1], first.shape[1]
    return rows, inner, [s for t in tensors for s in (t.stride(0), t.stride(1))]


_SYCL_ROWS_ARGS = ("ptr", "ptr", "ptr", "i64", "i64", "i64", "i64", "i64", "f32", "f32")


def _launch_rmsnorm(module, key, input, weight, out, eps: float, *_, w_offset: float) -> None:
    rows, inner, strides = _sycl_rows(input, out)
    wg = key["NORM_WG"]
    fn = module.get_function("rmsnorm", _SYCL_ROWS_ARGS)
    fn(rows * wg, wg, input, weight, out, inner, *strides, w_offset, eps)


def _launch_fused(module, key, input, residual, weight, eps: float, *_, w_offset: float) -> None:
    rows, inner, strides = _sycl_rows(input, residual)
    wg = key["NORM_WG"]
    fn = module.get_function("fused_add_rmsnorm", _SYCL_ROWS_ARGS)
    fn(rows * wg, wg, input, residual, weight, inner, *strides, w_offset, eps)


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
_TOL = dict(_TOLERANCES)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _row_cases(fused: bool, rounding: bool, batched: bool) -> list[Case]:
    """Every dtype at three widths (fast path, one-vector-per-lane, generic), then a float32 weight
    of 16-bit rows and (ops that have it) Hugging Face's rounding. ``batched``: [B, S, H] slices of
    bigger buffers, whose leading dimensions do not collapse into one row stride."""

    def make(device, shape, dtype, weight_dtype, round_before_weight, float_sum):
        def rand(*size):
            return torch.randn(*size, device=device, dtype=dtype)

        def rows():
            if not batched:
                return rand(*shape)
            b, s, h = shape
            return rand(b, s + 2, h)[:, 1 : s + 1]  # rows 1..s of each batch: strides (s+2)h, h

        weight = torch.randn(shape[-1], device=device, dtype=weight_dtype)
        flag = (round_before_weight,) if rounding else ()
        if fused:
            return rows(), rows(), weight, 1e-6, float_sum, *flag
        out = torch.empty(*shape, device=device, dtype=dtype)
        if batched:
            out = torch.empty(shape[0], shape[1] + 3, shape[2], device=device, dtype=dtype)[:, 2:-1]
        return rows(), weight, out, 1e-6, *flag

    shapes = (
        ((2, 3, 4096), (1, 5, 1024), (3, 2, 1000)) if batched else ((7, 4096), (1, 1024), (3, 1000))
    )
    variants = [(dt, dt, False, False, shape, tol) for dt, tol in _TOLERANCES for shape in shapes]
    variants += [
        (dt, torch.float32, False, False, shapes[i], _TOL[dt])
        for dt, i in ((torch.bfloat16, 0), (torch.float16, 2))
    ]
    if rounding:
        variants += [
            (dt, dt, True, False, shapes[i], _TOL[dt])
            for dt, i in ((torch.bfloat16, 0), (torch.float16, 2))
        ]
    if fused:  # FlashInfer's fused add: the float32 sum normalized
        variants += [
            (dt, dt, False, True, shapes[i], _TOL[dt])
            for dt, i in ((torch.bfloat16, 0), (torch.float16, 2))
        ]
    cases = []
    for dt, wdt, rnd, fsum, shape, tol in variants:
        name = f"{'x'.join(map(str, shape))} {_dtype_name(dt)}"
        name += f" weight {_dtype_name(wdt)}" if wdt != dt else ""
        name += " round_before_weight" if rnd else ""
        name += " float_sum" if fsum else ""
        cases.append(
            Case(
                name, lambda dev, a=shape, b=dt, c=wdt, d=rnd, e=fsum: make(dev, a, b, c, d, e), tol
            )
        )
    return cases


def _qk_cases(across: bool) -> list[Case]:
    def make(device, dtype, weight_dtype):
        qkv = torch.randn(5, (8 + 2 * 2) * 128, device=device, dtype=dtype)  # views into one buffer
        q, k = qkv[:, : 8 * 128], qkv[:, 8 * 128 : 10 * 128]
        if not across:
            q, k = q.unflatten(1, (8, 128)), k.unflatten(1, (2, 128))
        return (
            q,
            k,
            torch.randn(q.shape[-1], device=device, dtype=weight_dtype),
            torch.randn(k.shape[-1], device=device, dtype=weight_dtype),
            1e-6,
        )

    shape = "5x(8+2)*128" if across else "5x(8+2)x128"
    variants = [(dt, dt, tol) for dt, tol in _TOLERANCES]
    variants.append((torch.bfloat16, torch.float32, _TOL[torch.bfloat16]))
    return [
        Case(
            f"{shape} {_dtype_name(dt)}" + (f" weight {_dtype_name(wdt)}" if wdt != dt else ""),
            lambda dev, dt=dt, wdt=wdt: make(dev, dt, wdt),
            tol,
        )
        for dt, wdt, tol in variants
    ]


# ------------------------------------------------------------------------------------------------
# The ops (destination passing)

_WEIGHT_DTYPES = ("input", torch.float32)  # the input's dtype or float32


def _row_args(fused: bool, rounding: bool, batched: bool) -> dict:
    rows = ("batch", "num_tokens", "hidden") if batched else ("num_tokens", "hidden")
    if fused:
        args = {
            "input": Tensor(*rows, io="inout"),
            "residual": Tensor(*rows, dtype="input", io="inout"),
            "weight": Tensor("hidden", dtype=_WEIGHT_DTYPES, layout="contiguous"),
            "eps": Scalar(float, min=0.0),
            "float_sum": Scalar(bool),  # FlashInfer's: the float32 sum normalized, not its rounding
        }
    else:
        args = {
            "input": Tensor(*rows),
            "weight": Tensor("hidden", dtype=_WEIGHT_DTYPES, layout="contiguous"),
            "out": Tensor(*rows, dtype="input", io="out", alias="input"),  # in place: out=input
            "eps": Scalar(float, min=0.0),
        }
    if rounding:
        args["round_before_weight"] = Scalar(bool)
    return args


_ROWS_PREBUILD = {
    "cuda": [
        {"dtype": dt, "weight": dt, "width": h, "round": False, "float_sum": False}
        for dt in _FLEET_DTYPES
        for h in _FLEET_HIDDENS
    ],
    "sycl": [
        _sycl_key(dt, h, 16 // dt.itemsize)
        for dt in _FLEET_DTYPES
        for h in sorted(
            {*_FLEET_HIDDENS, *_FLEET_HEAD_DIMS, *(w for p in _FLEET_ACROSS for w in p)}
        )
    ],
}


def _row_op(name: str, gemma: bool, fused: bool, batched: bool = False):
    """One of the row ops; ``batched``: its ``_3d`` form over [B, S, H]. The Gemma ops have no
    rounding option: Hugging Face's Gemma norms round once, at the end, as they do."""
    cpp = "FusedAddRMSNorm" if fused else "RMSNorm"
    float_sum = ", {float_sum}" if fused else ""
    ref = reference.fused_add_rmsnorm_ if fused else reference.rmsnorm_into
    rounding = not gemma
    if rounding:
        key = _fused_round_key if fused else _rows_round_key
    else:
        key = _fused_key if fused else _rows_key
    launch = _launch_fused if fused else _launch_rmsnorm
    return family.op(
        name + ("_3d" if batched else ""),
        args=_row_args(fused, rounding, batched),
        reference=(lambda *args: ref(*args, gemma=True)) if gemma else ref,
        doc=ref.__doc__,
        cuda=Cuda(
            "csrc/norm.cuh",
            f"sgljit_norm::{cpp}<{{dtype}}, {{weight}}, {{width}}, {str(gemma).lower()}, {{round}}"
            f"{float_sum}>::run",
            key=key,
            params=_rows_params,
            module="rows",
        ),
        sycl=Sycl(
            "sycl/norm.hpp",
            key=_sycl_rows_key,
            launch=lambda *args: launch(*args, w_offset=float(gemma)),
            module="norm",
        ),
        # One entry per width builds the module the row ops share.
        prebuild=_ROWS_PREBUILD if name == "rmsnorm" and not batched else None,
        cases=_row_cases(fused, rounding, batched),
    )


_rmsnorm = _row_op("rmsnorm", gemma=False, fused=False)
_gemma_rmsnorm = _row_op("gemma_rmsnorm", gemma=True, fused=False)
_fused_add_rmsnorm = _row_op("fused_add_rmsnorm", gemma=False, fused=True)
_gemma_fused_add_rmsnorm = _row_op("gemma_fused_add_rmsnorm", gemma=True, fused=True)
_rmsnorm_3d = _row_op("rmsnorm", gemma=False, fused=False, batched=True)
_gemma_rmsnorm_3d = _row_op("gemma_rmsnorm", gemma=True, fused=False, batched=True)
_fused_add_rmsnorm_3d = _row_op("fused_add_rmsnorm", gemma=False, fused=True, batched=True)
_gemma_fused_add_rmsnorm_3d = _row_op(
    "gemma_fused_add_rmsnorm", gemma=True, fused=True, batched=True
)

_qknorm = family.op(
    "qknorm",
    args={
        "q": Tensor("num_tokens", "q_heads", "head_dim", io="inout"),
        "k": Tensor("num_tokens", "k_heads", "head_dim", dtype="q", io="inout"),
        "q_weight": Tensor("head_dim", dtype=("q", torch.float32), layout="contiguous"),
        "k_weight": Tensor("head_dim", dtype="q_weight", layout="contiguous"),
        "eps": Scalar(float, min=0.0),
    },
    reference=reference.qknorm_,
    cuda=Cuda(
        "csrc/norm.cuh",
        "sgljit_norm::QKNorm<{dtype}, {weight}, {width}>::run",
        key=_qk_key,
        params=_qk_params,
    ),
    sycl=Sycl("sycl/norm.hpp", key=_sycl_heads_key, launch=_launch_qk, module="norm"),
    prebuild={
        "cuda": [
            {"dtype": dt, "weight": dt, "width": d}
            for dt in _FLEET_DTYPES
            for d in _FLEET_HEAD_DIMS
        ]
    },
    cases=_qk_cases(across=False),
)

_qknorm_across_heads = family.op(
    "qknorm_across_heads",
    args={
        "q": Tensor("num_tokens", "q_width", io="inout"),
        "k": Tensor("num_tokens", "k_width", dtype="q", io="inout"),
        "q_weight": Tensor("q_width", dtype=("q", torch.float32), layout="contiguous"),
        "k_weight": Tensor("k_width", dtype="q_weight", layout="contiguous"),
        "eps": Scalar(float, min=0.0),
    },
    reference=reference.qknorm_across_heads_,
    cuda=Cuda(
        "csrc/norm.cuh",
        "sgljit_norm::QKNormAcrossHeads<{dtype}, {weight}, {width}, {width2}>::run",
        key=_across_key,
        params=_across_params,
    ),
    sycl=Sycl("sycl/norm.hpp", key=_sycl_heads_key, launch=_launch_qk, module="norm"),
    prebuild={
        "cuda": [_across_params(dt, wq, wk) for dt in _FLEET_DTYPES for wq, wk in _FLEET_ACROSS]
    },
    cases=_qk_cases(across=True),
)


# ------------------------------------------------------------------------------------------------
# RMSNorm -> fp8: four kernel ops (plain or fused add, static or per-token scale), one module per
# (input dtype, fp8 dtype, width) exporting all four, on CUDA and on SYCL.

_FP32 = (torch.float32,)
_E4M3, _E5M2 = FP8_DTYPES
_QUANT_TOL = {_E4M3: 0.125, _E5M2: 0.25}  # one fp8 step (see _quant_cases)


def _quant_params(
    dtype: torch.dtype, weight: torch.dtype, fp8_dtype: torch.dtype, hidden: int
) -> dict:
    return {
        "dtype": dtype,
        "weight": weight,
        "fp8_dtype": fp8_dtype,
        "width": compiled_width(dtype, hidden),
    }


def _quant_sycl_key(input, out, *read) -> dict:
    """The norm's SYCL key (access width from input, residual and weight; the weight, last, gives
    its dtype) and the fp8 format."""
    hidden = input.shape[-1]
    vec = _sycl_vec(hidden, *read)
    return {**_sycl_key(input.dtype, hidden, vec, read[-1].dtype), "NQ_FP8": out.dtype}


def _quant_launch(name: str, fused: bool, dynamic: bool):
    """The SYCL launch of a quant op: arguments (tensors..., eps) in the op's order, then the row
    strides of input, [residual,] out."""

    def launch(module, key, *args) -> None:
        *tensors, eps = args
        input, out = tensors[0], tensors[-2 if dynamic else -1]
        rows = input.shape[0]
        if rows == 0:
            return
        strides = [t.stride(0) for t in (input, *tensors[1 : 2 if fused else 1], out)]
        kinds = ("ptr",) * len(tensors) + ("i64",) * len(strides) + ("f32",)
        wg = key["NORM_WG"]
        module.get_function(name, kinds)(rows * wg, wg, *tensors, *strides, eps)

    return launch


def _quant_case(
    tokens, hidden, dtype, fp8_dtype, *, fused, dynamic, pad=0, label="", weight=None
) -> Case:
    """Random rows over several magnitudes; a static scale that saturates some e4m3 values. ``pad``:
    input, residual and out are column slices of wider buffers (strided rows; pad odd: unaligned).
    ``weight``: its dtype (default: the input's)."""

    def make(device):
        def rows(mul):  # rows of different magnitudes, as column slices of a wider buffer
            full = torch.randn(tokens, hidden + pad, device=device) * mul
            return full.mul(torch.rand(tokens, 1, device=device) + 0.1).to(dtype)[:, pad:]

        w = torch.randn(hidden, device=device).to(weight or dtype)
        out = torch.empty(tokens, hidden + pad, device=device, dtype=fp8_dtype)[:, pad:]
        scale = torch.tensor([0.0075], device=device)
        scales = torch.empty(tokens, 1, device=device)
        tail = (out, scales) if dynamic else (scale, out)
        if fused:
            return rows(3.0), rows(2.0), w, *tail, 1e-6
        return rows(3.0), w, *tail, 1e-6

    fp8 = _dtype_name(fp8_dtype).removeprefix("float8_")
    name = f"{tokens}x{hidden}{label} {_dtype_name(dtype)}->{fp8}"
    return Case(name, make, _QUANT_TOL[fp8_dtype])


def _quant_cases(fused: bool, dynamic: bool) -> list[Case]:
    """T=1, odd widths (generic kernel), strided and unaligned rows, both fp8 formats, float32
    weights. Tolerance:
    one fp8 step (max_error of adjacent codes is below 1/8 for e4m3, 1/4 for e5m2): the float32
    normalized value depends in its last bits on the backend's rsqrt and summation order, which
    moves a quotient lying that close to a rounding boundary (or on it: common with 16-bit inputs
    and per-token scales) to the neighbouring code; tests/plugins/test_norm.py bounds how often."""
    kw = {"fused": fused, "dynamic": dynamic}
    return [
        _quant_case(7, 4096, torch.bfloat16, _E4M3, **kw),
        _quant_case(1, 4096, torch.bfloat16, _E5M2, **kw),
        _quant_case(5, 1000, torch.float16, _E4M3, pad=24, label=" strided", **kw),
        _quant_case(3, 37, torch.bfloat16, _E5M2, **kw),
        _quant_case(4, 1001, torch.float32, _E4M3, pad=1, label=" unaligned", **kw),
        _quant_case(
            6, 2048, torch.bfloat16, _E4M3, label=" weight float32", weight=torch.float32, **kw
        ),
        _quant_case(
            2, 1000, torch.float16, _E5M2, label=" weight float32", weight=torch.float32, **kw
        ),
    ]


_QUANT_PREBUILD = {
    "cuda": [
        {"dtype": torch.bfloat16, "weight": torch.bfloat16, "fp8_dtype": _E4M3, "width": h}
        for h in _FLEET_HIDDENS
    ],
    "sycl": [{**_sycl_key(torch.bfloat16, h, 8), "NQ_FP8": _E4M3} for h in _FLEET_HIDDENS],
}


def _quant_op(name: str, ref, *, fused: bool, dynamic: bool):
    args = {"input": Tensor("num_tokens", "hidden")}
    if fused:
        args["residual"] = Tensor("num_tokens", "hidden", dtype="input", io="inout")
    args["weight"] = Tensor("hidden", dtype=_WEIGHT_DTYPES, layout="contiguous")
    out = Tensor("num_tokens", "hidden", dtype=FP8_DTYPES, io="out")
    if dynamic:
        args["out"] = out
        args["scales"] = Tensor("num_tokens", 1, dtype=_FP32, layout="contiguous", io="out")
    else:
        args["scale"] = Tensor(1, dtype=_FP32, layout="strided")
        args["out"] = out
    args["eps"] = Scalar(float, min=0.0)
    out_index, weight_index = list(args).index("out"), list(args).index("weight")
    read = [list(args).index(n) for n in ("input", "residual", "weight") if n in args]

    entry = ("fused_" if fused else "rmsnorm_") + ("per_token" if dynamic else "static")
    return family.op(
        name,
        args=args,
        reference=ref,
        cuda=Cuda(
            "csrc/norm_quant.cuh",
            f"sgljit_norm_quant::NormQuantFp8<{{dtype}}, {{weight}}, {{fp8_dtype}}, {{width}}>::{entry}",
            key=lambda *a: (a[0].dtype, a[weight_index].dtype, a[out_index].dtype, a[0].shape[1]),
            params=_quant_params,
            module="quant",
        ),
        sycl=Sycl(
            "sycl/norm_quant.hpp",
            key=lambda *a: _quant_sycl_key(a[0], a[out_index], *(a[i] for i in read)),
            launch=_quant_launch(name, fused, dynamic),
            module="quant",
        ),
        # One entry per width builds the module the four ops share.
        prebuild=_QUANT_PREBUILD if name == "rmsnorm_quant_fp8_static" else None,
        cases=_quant_cases(fused, dynamic),
    )


_rmsnorm_quant_static = _quant_op(
    "rmsnorm_quant_fp8_static",
    reference.rmsnorm_quant_fp8_static_into,
    fused=False,
    dynamic=False,
)
_rmsnorm_quant_per_token = _quant_op(
    "rmsnorm_quant_fp8_per_token",
    reference.rmsnorm_quant_fp8_per_token_into,
    fused=False,
    dynamic=True,
)
_fused_quant_static = _quant_op(
    "fused_add_rmsnorm_quant_fp8_static",
    reference.fused_add_rmsnorm_quant_fp8_static_,
    fused=True,
    dynamic=False,
)
_fused_quant_per_token = _quant_op(
    "fused_add_rmsnorm_quant_fp8_per_token",
    reference.fused_add_rmsnorm_quant_fp8_per_token_,
    fused=True,
    dynamic=True,
)


# ------------------------------------------------------------------------------------------------
# Public functions


def _apart(t) -> bool:
    """A [B, S, H] tensor whose leading dimensions do not collapse into one row stride."""
    return (
        isinstance(t, torch.Tensor)
        and t.dim() == 3
        and t.shape[0] > 1
        and t.shape[1] > 1
        and t.stride(0) != t.stride(1) * t.shape[1]
    )


def _as_3d(t, shape: torch.Size, name: str, written: bool) -> torch.Tensor:
    """``t`` as ``shape`` ([B, S, H]) for a ``*_3d`` op: itself when 3-D or of another size (the
    op's checks name it), else a view (written: an error naming it when no view exists) or a
    reshape."""
    if not isinstance(t, torch.Tensor) or t.dim() == 3 or t.shape[-1:] != shape[-1:]:
        return t
    if t.numel() != shape.numel():
        return t
    if not written:
        return t.reshape(shape)
    try:
        return t.view(shape)
    except RuntimeError:
        raise ValueError(
            f"{name}: written in place, so it must be a view of shape {list(shape)}; got shape "
            f"{list(t.shape)} with strides {list(t.stride())}"
        ) from None


def _shaped(input, other, other_name: str, input_written: bool) -> tuple[bool, object, object]:
    """For tensors that are not both 2-D: ``(True, input, other)`` as [B, S, H] for the ``*_3d``
    ops when one of them is 3-D with leading dimensions that do not collapse into one row stride,
    else ``(False, input, other)`` as [rows, H] (:func:`sgljit.op.as_rows`). ``other`` is
    written, ``input`` when ``input_written``."""
    try:  # the common case first (a model's [B, S, H] activations): both contiguous, rows views
        if input.is_contiguous() and other.is_contiguous():
            return False, input.view(-1, input.shape[-1]), other.view(-1, other.shape[-1])
    except (AttributeError, IndexError, RuntimeError):  # not tensors, 0-D, no rows: the slow path
        pass
    if _apart(input) or _apart(other):
        shape = (input if _apart(input) else other).shape
        return (
            True,
            _as_3d(input, shape, "input", input_written),
            _as_3d(other, shape, other_name, True),
        )
    return False, as_rows(input, "input", input_written), as_rows(other, other_name, True)


def _empty_like(input) -> torch.Tensor:
    """A contiguous tensor like ``input``; an error naming input when it is not a tensor."""
    try:
        return torch.empty_like(input, memory_format=torch.contiguous_format)
    except TypeError:
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}") from None


def _both_2d(a, b) -> bool:
    try:
        return a.dim() == 2 and b.dim() == 2
    except AttributeError:  # not tensors: the op's checks name them
        return True


def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    out: torch.Tensor | None = None,
    round_before_weight: bool = False,
) -> torch.Tensor:
    """``out = input * rsqrt(mean(input^2, -1) + eps) * weight`` over the last dimension.

    input ``[..., H]`` (rows may be strided; last dimension contiguous; a ``[B, S, H]`` out or input
    may be a slice of a bigger buffer), weight ``[H]`` of input's dtype or float32; dtypes float16,
    bfloat16, float32. ``round_before_weight``: round ``input * rsqrt(...)`` to the dtype before
    the weight multiply, as Hugging Face's LlamaRMSNorm does. Returns ``out`` (allocated if not
    given); ``out`` may be ``input`` (in place).
    """
    if out is None:
        out = _empty_like(input)
    if _both_2d(input, out):
        _rmsnorm(input, weight, out, eps, round_before_weight)
        return out
    batched, x, y = _shaped(input, out, "out", False)
    (_rmsnorm_3d if batched else _rmsnorm)(x, weight, y, eps, round_before_weight)
    return out


def gemma_rmsnorm(
    input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`rmsnorm` with weight ``(1 + weight)``, rounded once at the end (Gemma, as Hugging
    Face's Gemma norms)."""
    if out is None:
        out = _empty_like(input)
    if _both_2d(input, out):
        _gemma_rmsnorm(input, weight, out, eps)
        return out
    batched, x, y = _shaped(input, out, "out", False)
    (_gemma_rmsnorm_3d if batched else _gemma_rmsnorm)(x, weight, y, eps)
    return out


def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    round_before_weight: bool = False,
    float_sum: bool = False,
) -> None:
    """In place: ``residual <- input + residual`` (rounded to the dtype), then
    ``input <- rmsnorm(residual, weight, eps)``. input, residual ``[..., H]`` (``[B, S, H]`` slices
    of bigger buffers too), weight ``[H]`` of input's dtype or float32. ``round_before_weight``:
    as for :func:`rmsnorm`, of the float32 sum ``input + residual`` (sglang's
    ``cast_x_before_out_mul``; the residual stores the sum rounded). ``float_sum``: normalize the
    float32 sum ``input + residual`` rather than the rounded one the residual stores (FlashInfer's
    kernels)."""
    if _both_2d(input, residual):
        _fused_add_rmsnorm(input, residual, weight, eps, float_sum, round_before_weight)
        return
    batched, x, r = _shaped(input, residual, "residual", True)
    (_fused_add_rmsnorm_3d if batched else _fused_add_rmsnorm)(
        x, r, weight, eps, float_sum, round_before_weight
    )


def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    float_sum: bool = False,
) -> None:
    """:func:`fused_add_rmsnorm` with weight ``(1 + weight)`` (Gemma); ``float_sum`` as there."""
    if _both_2d(input, residual):
        _gemma_fused_add_rmsnorm(input, residual, weight, eps, float_sum)
        return
    batched, x, r = _shaped(input, residual, "residual", True)
    (_gemma_fused_add_rmsnorm_3d if batched else _gemma_fused_add_rmsnorm)(
        x, r, weight, eps, float_sum
    )


def qknorm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
) -> None:
    """In place, per head: q ``[T, Hq, D]``, k ``[T, Hk, D]`` (usually strided views into one
    fused qkv buffer; last dimension contiguous), weights ``[D]`` of q's dtype or both float32,
    D in {64, 128, 256, 512, 1024}."""
    if isinstance(q, torch.Tensor) and q.dim() and q.shape[-1] not in HEAD_DIMS:
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
    q_weight ``[Hq*D]``, k_weight ``[Hk*D]`` (q's dtype or both float32)."""
    _qknorm_across_heads(q, k, q_weight, k_weight, eps)


def _fp8_dtype(fp8_dtype, out) -> torch.dtype:
    """fp8_dtype, else out's dtype (its spec check names a wrong one), else float8_e4m3fn."""
    if fp8_dtype is None:
        return out.dtype if isinstance(out, torch.Tensor) else _E4M3
    fp8.check_fp8_dtype(fp8_dtype)
    fp8.check_out_dtype(out, fp8_dtype)
    return fp8_dtype


def _quant_outputs(input, scale, fp8_dtype, out, scales) -> tuple:
    """(out, scale or scales as given / allocated, and their [T, ...] views for the op)."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    fp8_dtype = _fp8_dtype(fp8_dtype, out)
    if out is None:
        out = torch.empty_like(input, dtype=fp8_dtype, memory_format=torch.contiguous_format)
    if scale is not None:
        if scales is not None:
            raise ValueError("scales: only with a dynamic scale (scale=None); got both")
        view = scale.view(1) if isinstance(scale, torch.Tensor) and scale.dim() == 0 else scale
        return out, scale, view
    if scales is None:
        scales = torch.empty(*input.shape[:-1], 1, dtype=torch.float32, device=input.device)
    if isinstance(scales, torch.Tensor) and scales.dim() == 1:
        view = scales.unsqueeze(-1)
    else:
        view = as_rows(scales, "scales", True)
    return out, scales, view


def rmsnorm_quant_fp8(
    input: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    fp8_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm, then fp8 quantization, in one pass: ``y = rmsnorm(input, weight, eps)`` in
    float32 (not rounded to the input dtype), ``out = (y / scale).clamp(-fp8_max,
    fp8_max).to(fp8_dtype)`` (correctly rounded float32 division, round to nearest even).

    input ``[..., H]`` (float16, bfloat16, float32; rows may be strided, the last dimension
    contiguous), weight ``[H]`` of its dtype or float32. ``scale``: a float32 tensor ``[1]`` (or ``[]``), the
    static scale; ``None``: dynamic, one scale per row (token),
    ``max(absmax(y of the row) / fp8_max, 2^-126)``, written to ``scales`` (float32 ``[..., 1]``
    or ``[T]``; allocated if not given). ``fp8_dtype``: torch.float8_e4m3fn (fp8_max 448, the
    default) or torch.float8_e5m2 (57344); without it, ``out``'s dtype. ``out``: fp8 ``[..., H]``
    (rows may be strided). Returns ``(out, scale)`` (the given scale, or the scales).

    NaN and inf: a NaN in a row makes the whole row NaN (dynamic: its scale too); an inf makes
    the row's inv_rms 0, so the row is 0 except NaN where the inf was (as ``rmsnorm``). Values
    beyond the format's range after the division saturate to +-fp8_max; NaN stays NaN.
    """
    out, returned, scale_view = _quant_outputs(input, scale, fp8_dtype, out, scales)
    x, o = as_rows(input, "input"), as_rows(out, "out", True)
    if scale is None:
        _rmsnorm_quant_per_token(x, weight, o, scale_view, eps)
    else:
        _rmsnorm_quant_static(x, weight, scale_view, o, eps)
    return out, returned


def fused_add_rmsnorm_quant_fp8(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    fp8_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual <- input + residual`` in place (rounded to the dtype, as
    :func:`fused_add_rmsnorm`), then ``out`` = :func:`rmsnorm_quant_fp8` of the new residual.
    ``input`` is only read (fused_add_rmsnorm overwrites it with the normalized row; here that
    row goes to ``out`` as fp8). Arguments and result as :func:`rmsnorm_quant_fp8`; residual
    ``[..., H]`` like input.
    """
    out, returned, scale_view = _quant_outputs(input, scale, fp8_dtype, out, scales)
    x, r = as_rows(input, "input"), as_rows(residual, "residual", True)
    o = as_rows(out, "out", True)
    if scale is None:
        _fused_quant_per_token(x, r, weight, o, scale_view, eps)
    else:
        _fused_quant_static(x, r, weight, scale_view, o, eps)
    return out, returned


# LayerNorm's ops are declared on this family in their own module.
from . import layernorm as _layernorm  # noqa: E402, F401

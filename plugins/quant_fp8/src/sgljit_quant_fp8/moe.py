"""Per-token-group quantization over the MoE layouts expert GEMMs read, and with int8 codes.

- ``per_token_group_quant_int8``: the dense ``[T, H]`` op with symmetric int8 codes: ``scale =
  max(absmax(group) / 127, eps)``, codes ``round(x / scale)`` (half to even) clamped to +-127.
- ``per_token_group_quant_masked``: the masked layout of DeepEP-style low-latency MoE, ``input``
  ``[E, T_pad, H]`` with ``masked_m[E]`` tokens valid per expert; rows ``t >= masked_m[e]`` are not
  touched (out and scales keep what they held).
- ``per_token_group_quant_sorted``: the sorted layout of ``moe_align_block_size``: ``input`` ``[M,
  H]`` rows in sorted order; row ``i`` is quantized where ``i < num_tokens_post_padded[0]`` and
  ``sorted_token_ids[i] < num_valid_tokens`` (the padding rows the MoE GEMM never reads are not
  touched).

The layouts take fp8 (e4m3fn, e5m2) or int8 output; the scales are fp32 in any layout whose
elements are distinct (row-major, or column-major as DeepSeek-style GEMMs read them); group sizes
16, 32, 64, 128 and 256. Codes and scales equal :mod:`.reference`'s bit for bit.

One kernel body serves every layout: on CUDA the layout is a template parameter of the dense
kernel (``csrc/group.cuh``; the masked grid is (blocks, E), each expert's blocks striding over its
rows, sized from the ``expected_m`` hint), on SYCL an index map in front of the shared group body
(``sycl/quant_fp8.hpp``).

``masked_m``, ``sorted_token_ids`` and ``num_tokens_post_padded`` are data: the kernels bound them
(a count is clamped to ``[0, T_pad]``, a row past the input is never read or written) instead of
reading them back. Where they live on the CPU (the reference backend, SYCL on the CPU device) the
counts are checked too, for free: a ``masked_m`` value outside ``[0, T_pad]`` raises there.
"""

import torch

from sgljit.op import Case, Cuda, Scalar, Sycl, Tensor, dtype_label

from . import reference
from .ops import FP8_DTYPES, GROUP_SIZES, _group_scales, family

__all__ = [
    "OUT_DTYPES",
    "per_token_group_quant_int8",
    "per_token_group_quant_masked",
    "per_token_group_quant_sorted",
]

OUT_DTYPES = (*FP8_DTYPES, torch.int8)
_E4M3, _E5M2 = FP8_DTYPES
_INT8 = torch.int8
_BF16 = torch.bfloat16
_FP32 = (torch.float32,)
_MIN_EPS = 2.0**-126  # eps: a positive normal fp32 value (as per_token_group_quant_fp8's)
_MAX_EPS = float(torch.finfo(torch.float32).max)
_INT32_MAX = 2**31 - 1


def _check_group_size(group_size: int) -> None:
    if group_size not in GROUP_SIZES:
        raise ValueError(
            f"group_size: expected one of {', '.join(map(str, GROUP_SIZES))}, got {group_size}"
        )


_GROUP_SIZE = Scalar(int, min=min(GROUP_SIZES), max=max(GROUP_SIZES))
_EPS = Scalar(float, min=_MIN_EPS, max=_MAX_EPS)


def _check(input, out, scales, group_size, scale_ue8m0, dim) -> None:
    """What the specs cannot say (csrc/group.cuh checks the same, with the same messages); ``dim``:
    input's token dimension."""
    _check_group_size(group_size)
    hidden = input.shape[dim + 1]
    if hidden % group_size:
        raise ValueError(
            f"group_size: must divide input's last dimension {hidden}, got {group_size}"
        )
    if scales.shape[dim + 1] != hidden // group_size:
        raise ValueError(
            f"scales: dimension {dim + 1} expected {hidden // group_size} (input's last dimension "
            f"/ group_size), got {scales.shape[dim + 1]}"
        )
    if scale_ue8m0 and out.dtype == _INT8:
        raise ValueError("scale_ue8m0: int8 output takes fp32 scales (absmax / 127), not ue8m0")


def _check_masked_m(masked_m, pad) -> None:
    """masked_m's values where reading them costs nothing (a CPU tensor)."""
    if masked_m.device.type == "cpu" and masked_m.numel():
        low, high = int(masked_m.min()), int(masked_m.max())
        if low < 0 or high > pad:
            raise ValueError(
                f"masked_m: expected counts in [0, {pad}] (input's dimension 1), got values "
                f"in [{low}, {high}]"
            )


def _cuda_params(dtype, out_dtype, group_size) -> dict:
    _check_group_size(group_size)
    return {"dtype": dtype, "out_dtype": out_dtype, "group_size": group_size}


def _cuda(entry: str) -> Cuda:
    return Cuda(
        "csrc/group.cuh",
        f"sgljit_quant_fp8::GroupQuantFp8<{{dtype}}, {{out_dtype}}, {{group_size}}>::{entry}",
        key=lambda input, out, *_: (input.dtype, out.dtype, _group_size_of(entry, _)),
        params=_cuda_params,
        module="group_layouts",
    )


# Where group_size sits in each entry's arguments after (input, out).
_GROUP_SIZE_AT = {"run_int8": 1, "run_masked": 2, "run_sorted": 4}


def _group_size_of(entry: str, rest: tuple) -> int:
    return rest[_GROUP_SIZE_AT[entry]]


def _sycl_key(input, out, *_) -> dict:
    """The shared SYCL module of quant_fp8.hpp (fp8: the same module as the dense ops)."""
    key = {"SGLJIT_T": input.dtype, "QFP8_E5M2": int(out.dtype == _E5M2)}
    if out.dtype == _INT8:
        key["QFP8_INT8"] = 1
    return key


_WG = 32  # work-items per group on SYCL (as the dense kernel's)


# ------------------------------------------------------------------------------------------------
# int8, dense


def _int8_reference(input, out, scales, group_size, eps) -> None:
    _check(input, out, scales, group_size, False, 0)
    reference.per_token_group_int8_into(input, out, scales, group_size, eps)


def _launch_int8(module, key, input, out, scales, group_size, eps) -> None:
    _check(input, out, scales, group_size, False, 0)
    rows, hidden = input.shape
    per_row = hidden // group_size
    if rows * per_row == 0:
        return
    # the dense kernel's argument order is the one sgljit.op derives for per_token_group_quant_fp8
    fn = module.get_function(
        "quant_fp8_per_token_group",
        ("ptr", "i64", "ptr", "i64", "ptr", "i64", "i64", "i64", "f32", "i32", "i64", "i64"),
    )
    fn(
        rows * per_row * _WG, _WG, input, input.stride(0), out, out.stride(0), scales,
        scales.stride(0), scales.stride(1), group_size, eps, 0, rows, hidden,
    )  # fmt: skip


def _magnitudes(device, shape, group_size) -> torch.Tensor:
    """fp32 ``[*shape[:-1], H]``: groups over several magnitudes, one tiny (its scale is eps)."""
    *lead, hidden = shape
    per_row = hidden // group_size
    mags = torch.exp2(torch.randint(-8, 9, (*lead, per_row, 1), device=device).float())
    mags.view(-1)[0] = 1e-12
    return (torch.randn(*lead, per_row, group_size, device=device) * mags).view(*lead, hidden)


def _int8_case(rows, hidden, dtype, group_size, *, column_major=False, pad=0) -> Case:
    per_row = hidden // group_size

    def make(device):
        full = torch.randn(rows, hidden + pad, device=device).to(dtype)
        full[:, pad:] = _magnitudes(device, (rows, hidden), group_size).to(dtype)
        out = torch.empty(rows, hidden, device=device, dtype=_INT8)
        scales = _group_scales(rows, per_row, device, column_major)
        return full[:, pad:], out, scales, group_size, 1e-10

    label = (" col-major" if column_major else "") + (" strided" if pad else "")
    return Case(f"{rows}x{hidden} g{group_size}{label} {dtype_label(dtype)}->int8", make, 0.0)


_per_token_group_int8 = family.op(
    "per_token_group_quant_int8",
    args={
        "input": Tensor("num_tokens", "hidden"),
        "out": Tensor("num_tokens", "hidden", dtype=_INT8, io="out"),
        "scales": Tensor("num_tokens", "groups", dtype=_FP32, layout="strided", io="out"),
        "group_size": _GROUP_SIZE,
        "eps": _EPS,
    },
    reference=_int8_reference,
    doc="""Per group of ``group_size`` (16 to 256, a power of two dividing H) consecutive elements
    of a row of ``input`` ``[T, H]``: ``scales[t, g] = max(absmax(group) / 127, eps)`` (fp32),
    ``out`` the int8 codes ``round(x / scale)`` (half to even, clamped to +-127).""",
    cuda=_cuda("run_int8"),
    sycl=Sycl("sycl/quant_fp8.hpp", key=_sycl_key, launch=_launch_int8, module="quant"),
    prebuild={"cuda": [{"dtype": _BF16, "out_dtype": _INT8, "group_size": 128}]},
    cases=[
        _int8_case(9, 2048, _BF16, 128),
        _int8_case(7, 1024, torch.float16, 64, column_major=True),
        _int8_case(5, 512, torch.float32, 16, pad=16),
        _int8_case(3, 1024, _BF16, 256),
    ],
)


# ------------------------------------------------------------------------------------------------
# The masked layout


def _masked_reference(
    input, out, scales, masked_m, group_size, eps, scale_ue8m0, expected_m
) -> None:
    _check(input, out, scales, group_size, scale_ue8m0, 1)
    _check_masked_m(masked_m, input.shape[1])
    reference.per_token_group_masked_into(
        input, out, scales, masked_m, group_size, eps, scale_ue8m0, expected_m
    )


# in: ptr, expert and token strides; out: the same; scales: ptr, 3 strides; masked_m, its int64
# flag; T_pad, groups a row, group size, eps, ue8m0
_MASKED_ARGS = (
    "ptr", "i64", "i64", "ptr", "i64", "i64", "ptr", "i64", "i64", "i64",
    "ptr", "i32", "i64", "i64", "i64", "f32", "i32",
)  # fmt: skip


def _launch_masked(
    module, key, input, out, scales, masked_m, group_size, eps, scale_ue8m0, expected_m
) -> None:
    _check(input, out, scales, group_size, scale_ue8m0, 1)
    experts, pad, hidden = input.shape
    _check_masked_m(masked_m, pad)
    per_row = hidden // group_size
    if experts * pad * per_row == 0:
        return
    fn = module.get_function("quant_group_masked", _MASKED_ARGS)
    fn(
        experts * pad * per_row * _WG, _WG,
        input, input.stride(0), input.stride(1), out, out.stride(0), out.stride(1),
        scales, scales.stride(0), scales.stride(1), scales.stride(2),
        masked_m, int(masked_m.dtype == torch.int64), pad, per_row, group_size, eps,
        int(scale_ue8m0),
    )  # fmt: skip


def _inout(device, shape, dtype) -> torch.Tensor:
    """An output that is also read: random contents (the rows an op leaves must keep them)."""
    if dtype.itemsize == 1:
        t = torch.empty(shape, device=device, dtype=dtype)
        t.view(torch.uint8).copy_(torch.randint(0, 127, shape, device=device, dtype=torch.uint8))
        return t
    return torch.randn(shape, device=device).to(dtype)


def _layout_scales(lead, pad, per_row, device, column_major) -> torch.Tensor:
    """fp32 ``[*lead, pad, per_row]`` with random contents; column-major: tokens contiguous, each
    column padded to a multiple of 4 tokens (16-byte aligned, as TMA loads need)."""
    if column_major:
        aligned = -(-pad // 4) * 4
        full = torch.randn(*lead, per_row, aligned, device=device)
        return full.transpose(-1, -2)[..., :pad, :]
    return torch.randn(*lead, pad, per_row, device=device)


def _masked_case(
    experts, pad, hidden, dtype, out_dtype, group_size, counts, *, column_major=False, ue8m0=False,
    count_dtype=torch.int32, expected_m=-1,
) -> Case:  # fmt: skip
    per_row = hidden // group_size

    def make(device):
        x = _magnitudes(device, (experts, pad, hidden), group_size).to(dtype)
        out = _inout(device, (experts, pad, hidden), out_dtype)
        scales = _layout_scales((experts,), pad, per_row, device, column_major)
        masked_m = torch.tensor(counts, device=device, dtype=count_dtype)
        return x, out, scales, masked_m, group_size, 1e-10, ue8m0, expected_m

    label = (" col-major" if column_major else "") + (" ue8m0" if ue8m0 else "")
    name = (
        f"{experts}x{pad}x{hidden} m={list(counts)} g{group_size}{label} "
        f"{dtype_label(dtype)}->{dtype_label(out_dtype)}"
    )
    return Case(name, make, 0.0)


_per_token_group_masked = family.op(
    "per_token_group_quant_masked",
    args={
        "input": Tensor("num_experts", "tokens_pad", "hidden"),
        "out": Tensor("num_experts", "tokens_pad", "hidden", dtype=OUT_DTYPES, io="inout"),
        "scales": Tensor(
            "num_experts", "tokens_pad", "groups", dtype=_FP32, layout="strided", io="inout"
        ),
        "masked_m": Tensor("num_experts", dtype=(torch.int32, torch.int64), layout="contiguous"),
        "group_size": _GROUP_SIZE,
        "eps": _EPS,
        "scale_ue8m0": Scalar(bool),
        "expected_m": Scalar(int),
    },
    reference=_masked_reference,
    doc="""The masked layout: for each expert ``e`` of ``input`` ``[E, T_pad, H]``, its rows ``t <
    masked_m[e]`` as per_token_group_quant_fp8 (fp8 ``out``) or per_token_group_quant_int8 (int8
    ``out``; no ue8m0) into ``out`` ``[E, T_pad, H]`` and fp32 ``scales`` ``[E, T_pad, H /
    group_size]`` (any layout with distinct elements); the other rows untouched. ``masked_m``: int32
    or int64 ``[E]``, counts in ``[0, T_pad]`` (the kernels clamp them). ``expected_m``: the tokens
    an expert is expected to hold (the grid's size; <= 0: unknown), never the result.""",
    cuda=_cuda("run_masked"),
    sycl=Sycl("sycl/quant_fp8.hpp", key=_sycl_key, launch=_launch_masked, module="quant"),
    prebuild={
        "cuda": [
            {"dtype": _BF16, "out_dtype": _E4M3, "group_size": 128},
            {"dtype": _BF16, "out_dtype": _INT8, "group_size": 128},
        ]
    },
    cases=[
        _masked_case(4, 13, 1024, _BF16, _E4M3, 128, [13, 0, 5, 1]),
        _masked_case(3, 9, 512, _BF16, _E4M3, 128, [2, 9, 4], column_major=True, ue8m0=True),
        _masked_case(2, 6, 256, torch.float16, _E5M2, 16, [6, 3], count_dtype=torch.int64),
        _masked_case(3, 5, 512, torch.float32, _INT8, 256, [1, 5, 0], expected_m=2),
        _masked_case(2, 7, 768, _BF16, _INT8, 64, [7, 2], column_major=True, expected_m=4),
    ],
)


# ------------------------------------------------------------------------------------------------
# The sorted layout


def _check_sorted(input, sorted_token_ids) -> None:
    if sorted_token_ids.shape[0] < input.shape[0]:
        raise ValueError(
            f"sorted_token_ids: expected at least {input.shape[0]} entries (one per row of "
            f"input), got {sorted_token_ids.shape[0]}"
        )


def _sorted_reference(
    input, out, scales, sorted_token_ids, num_tokens_post_padded, num_valid_tokens, group_size,
    eps, scale_ue8m0,
) -> None:  # fmt: skip
    _check(input, out, scales, group_size, scale_ue8m0, 0)
    _check_sorted(input, sorted_token_ids)
    reference.per_token_group_sorted_into(
        input, out, scales, sorted_token_ids, num_tokens_post_padded, num_valid_tokens,
        group_size, eps, scale_ue8m0,
    )  # fmt: skip


# in, out (ptr, row stride), scales (ptr, 2 strides), ids, post, num_valid; groups a row, group
# size, eps, ue8m0
_SORTED_ARGS = (
    "ptr", "i64", "ptr", "i64", "ptr", "i64", "i64", "ptr", "ptr", "i64",
    "i64", "i64", "f32", "i32",
)  # fmt: skip


def _launch_sorted(
    module, key, input, out, scales, sorted_token_ids, num_tokens_post_padded, num_valid_tokens,
    group_size, eps, scale_ue8m0,
) -> None:  # fmt: skip
    _check(input, out, scales, group_size, scale_ue8m0, 0)
    _check_sorted(input, sorted_token_ids)
    rows, hidden = input.shape
    per_row = hidden // group_size
    if rows * per_row == 0:
        return
    fn = module.get_function("quant_group_sorted", _SORTED_ARGS)
    fn(
        rows * per_row * _WG, _WG, input, input.stride(0), out, out.stride(0),
        scales, scales.stride(0), scales.stride(1), sorted_token_ids, num_tokens_post_padded,
        num_valid_tokens, per_row, group_size, eps, int(scale_ue8m0),
    )  # fmt: skip


def sorted_ids(num_tokens: int, top_k: int, experts: int, block: int, generator=None) -> tuple:
    """A ``moe_align_block_size``-style layout of random routing (for tests and benchmarks):
    ``(sorted_token_ids int32 [M], num_tokens_post_padded int32 [1], num_valid_tokens)``. Each
    expert's (token, slot) entries ``t * top_k + k`` padded to a multiple of ``block`` with the
    sentinel ``num_valid_tokens``; ``M`` is the worst case's padded length, past
    ``num_tokens_post_padded`` filled with the sentinel too."""
    valid = num_tokens * top_k
    choice = torch.rand(num_tokens, experts, generator=generator).argsort(dim=1)[:, :top_k]
    flat = choice.reshape(-1)
    rows = []
    for e in range(experts):
        ids = (flat == e).nonzero().view(-1).to(torch.int32)
        padded = -(-ids.numel() // block) * block
        rows.append(torch.cat([ids, torch.full((padded - ids.numel(),), valid, dtype=torch.int32)]))
    used = torch.cat(rows)
    total = valid + experts * (block - 1)
    total = -(-total // block) * block
    ids = torch.full((total,), valid, dtype=torch.int32)
    ids[: used.numel()] = used
    return ids, torch.tensor([used.numel()], dtype=torch.int32), valid


def _sorted_case(
    tokens, top_k, experts, block, hidden, dtype, out_dtype, group_size, *, column_major=False,
    ue8m0=False, extra_ids=0,
) -> Case:  # fmt: skip
    per_row = hidden // group_size

    def make(device):
        gen = torch.Generator().manual_seed(tokens * 1000 + experts)
        ids, post, valid = sorted_ids(tokens, top_k, experts, block, gen)
        if extra_ids:  # more ids than rows (an over-allocated buffer); a negative id is padding
            ids = torch.cat([ids, torch.full((extra_ids,), -3, dtype=torch.int32)])
            ids[1] = -1
        rows = ids.numel() - extra_ids
        x = _magnitudes(device, (rows, hidden), group_size).to(dtype)
        out = _inout(device, (rows, hidden), out_dtype)
        scales = _layout_scales((), rows, per_row, device, column_major)
        return (
            x, out, scales, ids.to(device), post.to(device), valid, group_size, 1e-10, ue8m0
        )  # fmt: skip

    label = (" col-major" if column_major else "") + (" ue8m0" if ue8m0 else "")
    name = (
        f"T={tokens} top{top_k} E={experts} block {block} H={hidden} g{group_size}{label} "
        f"{dtype_label(dtype)}->{dtype_label(out_dtype)}"
    )
    return Case(name, make, 0.0)


_per_token_group_sorted = family.op(
    "per_token_group_quant_sorted",
    args={
        "input": Tensor("num_rows", "hidden"),
        "out": Tensor("num_rows", "hidden", dtype=OUT_DTYPES, io="inout"),
        "scales": Tensor("num_rows", "groups", dtype=_FP32, layout="strided", io="inout"),
        "sorted_token_ids": Tensor(None, dtype=torch.int32, layout="contiguous"),
        "num_tokens_post_padded": Tensor(1, dtype=torch.int32, layout="contiguous"),
        "num_valid_tokens": Scalar(int, min=0, max=_INT32_MAX),
        "group_size": _GROUP_SIZE,
        "eps": _EPS,
        "scale_ue8m0": Scalar(bool),
    },
    reference=_sorted_reference,
    doc="""The sorted MoE layout: row ``i`` of ``input`` ``[M, H]`` as per_token_group_quant_fp8
    (fp8 ``out``) or per_token_group_quant_int8 (int8 ``out``) where ``i <
    num_tokens_post_padded[0]`` and ``sorted_token_ids[i]`` (int32, at least M entries) is in
    ``[0, num_valid_tokens)``; the other rows of ``out`` and ``scales`` untouched.""",
    cuda=_cuda("run_sorted"),
    sycl=Sycl("sycl/quant_fp8.hpp", key=_sycl_key, launch=_launch_sorted, module="quant"),
    prebuild={"cuda": [{"dtype": _BF16, "out_dtype": _E4M3, "group_size": 128}]},
    cases=[
        _sorted_case(7, 2, 4, 4, 1024, _BF16, _E4M3, 128),
        _sorted_case(9, 3, 5, 8, 512, _BF16, _E4M3, 128, column_major=True, ue8m0=True),
        _sorted_case(5, 2, 3, 4, 256, torch.float16, _INT8, 32, extra_ids=5),
        _sorted_case(4, 1, 2, 2, 512, torch.float32, _E5M2, 256),
    ],
)


# ------------------------------------------------------------------------------------------------
# Public functions


def _check_out_dtype(out_dtype) -> None:
    if out_dtype not in OUT_DTYPES:
        raise TypeError(
            "out_dtype: expected torch.float8_e4m3fn, torch.float8_e5m2 or torch.int8, got "
            f"{out_dtype!r}"
        )


def _scales_for(shape, group_size, device, column_major) -> torch.Tensor:
    """fp32 scales for input ``[*lead, T, H]`` (empty), row- or TMA-aligned column-major."""
    *lead, rows, hidden = shape
    valid = isinstance(group_size, int) and not isinstance(group_size, bool) and group_size > 0
    per_row = hidden // group_size if valid else 0  # (the op names a bad group size)
    if column_major:
        aligned = -(-rows // 4) * 4
        full = torch.empty(*lead, per_row, aligned, device=device, dtype=torch.float32)
        return full.transpose(-1, -2)[..., :rows, :]
    return torch.empty(*lead, rows, per_row, device=device, dtype=torch.float32)


def _outputs(input, out, scales, out_dtype, group_size, column_major_scales, dims):
    if not isinstance(input, torch.Tensor) or input.dim() != dims:
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
        want = "[E, T_pad, H]" if dims == 3 else "[T, H]"
        raise ValueError(
            f"input: expected a {dims}-D tensor {want}, got shape {tuple(input.shape)}"
        )
    if out is None:
        out = torch.empty_like(input, dtype=out_dtype, memory_format=torch.contiguous_format)
    elif isinstance(out, torch.Tensor) and out.dtype != out_dtype:
        raise TypeError(f"out: dtype must be {out_dtype} (out_dtype), got {out.dtype}")
    if scales is None:
        scales = _scales_for(input.shape, group_size, input.device, column_major_scales)
    return out, scales


def per_token_group_quant_int8(
    input: torch.Tensor,
    group_size: int = 128,
    *,
    eps: float = 1e-10,
    column_major_scales: bool = False,
    out: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``input`` ``[T, H]`` (fp16/bf16/fp32; rows may be strided, the last dimension
    contiguous) to symmetric int8 with one fp32 scale per group of ``group_size`` (16, 32, 64, 128
    or 256, dividing H) consecutive elements of a row: ``scale = max(absmax(group) / 127, eps)``,
    codes ``round(x / scale)`` (IEEE division, half to even) clamped to +-127.

    Returns ``(out int8 [T, H], scales fp32 [T, H / group_size])``; scales row-major, or with
    ``column_major_scales`` column-major with 16-byte aligned columns. ``out``/``scales`` may be
    given. sglang and vLLM truncate ``x / scale`` toward zero (after a multiply by ``127 /
    absmax``) and clamp to [-128, 127]; vLLM's CUDA int8 kernels round to nearest even as this does.
    """
    out, scales = _outputs(input, out, scales, _INT8, group_size, column_major_scales, 2)
    _per_token_group_int8(input, out, scales, group_size, eps)
    return out, scales


def per_token_group_quant_masked(
    input: torch.Tensor,
    masked_m: torch.Tensor,
    group_size: int = 128,
    *,
    expected_m: int | None = None,
    eps: float = 1e-10,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    column_major_scales: bool = False,
    scale_ue8m0: bool = False,
    out: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group quantization of the masked MoE layout: ``input`` ``[E, T_pad, H]``, expert
    ``e`` holding ``masked_m[e]`` (int32 or int64 ``[E]``, device-side) valid rows.

    Each valid row as :func:`sgljit_quant_fp8.ops.per_token_group_quant_fp8` (``out_dtype`` fp8)
    or :func:`per_token_group_quant_int8` (``torch.int8``; no ``scale_ue8m0``). Returns ``(out
    [E, T_pad, H], scales fp32 [E, T_pad, H / group_size])``; rows ``t >= masked_m[e]`` are not
    written (new buffers hold garbage there). ``expected_m``: the tokens an expert is expected to
    hold, a hint sizing the grid (None: unknown); the result never depends on it.
    ``column_major_scales``: scales column-major per expert, ``[E, G, T_pad rounded up to 4]``
    transposed (what DeepGEMM's masked grouped GEMM reads).
    """
    _check_out_dtype(out_dtype)
    out, scales = _outputs(input, out, scales, out_dtype, group_size, column_major_scales, 3)
    hint = -1 if expected_m is None else int(expected_m)
    _per_token_group_masked(input, out, scales, masked_m, group_size, eps, scale_ue8m0, hint)
    return out, scales


def per_token_group_quant_sorted(
    input: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    num_valid_tokens: int,
    group_size: int = 128,
    *,
    eps: float = 1e-10,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    column_major_scales: bool = False,
    scale_ue8m0: bool = False,
    out: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group quantization of the sorted MoE layout (``moe_align_block_size``'s output):
    ``input`` ``[M, H]`` rows in sorted order, ``sorted_token_ids`` int32 (at least M entries),
    ``num_tokens_post_padded`` int32 ``[1]``, ``num_valid_tokens`` (``topk_ids.numel()``).

    Row ``i`` is quantized (as :func:`per_token_group_quant_masked` describes per row) where ``i <
    num_tokens_post_padded[0]`` and ``sorted_token_ids[i]`` is in ``[0, num_valid_tokens)``; the
    other rows (the padding the MoE GEMM never reads) are not written. Returns ``(out [M, H],
    scales fp32 [M, H / group_size])``.
    """
    _check_out_dtype(out_dtype)
    out, scales = _outputs(input, out, scales, out_dtype, group_size, column_major_scales, 2)
    _per_token_group_sorted(
        input, out, scales, sorted_token_ids, num_tokens_post_padded, num_valid_tokens,
        group_size, eps, scale_ue8m0,
    )  # fmt: skip
    return out, scales

"""The gated activations over MoE-routed rows (sglang's ``run_activation`` with ``expert_ids`` and the
sorted layout): ``gated_act_filtered``.

Row ``r`` of ``input`` ``[T, 2 d]`` is computed into ``out`` ``[T, d]`` (as :func:`silu_and_mul`,
:func:`gelu_and_mul` or :func:`gelu_tanh_and_mul`, bit for bit) only where
``expert_ids[r // expert_step] != -1`` (``expert_step``: 1 for per-token routing, the GEMM's block
size for the sorted layout) and, with the sorted layout of ``moe_align_block_size``, ``r <
num_tokens_post_padded[0]`` and ``sorted_token_ids[r]`` is in ``[0, num_valid_tokens)``. Other rows of
``out`` keep their contents (the kernels load nothing for them).

One kernel body: on CUDA the plain kernel with a row-filter template parameter (``csrc/activation.cuh``,
one module per dtype for the three activations), on SYCL a filtered copy of the same loop
(``sycl/activation.hpp``). The ids are data: the kernels never index past ``expert_ids`` or
``sorted_token_ids`` (whose lengths are checked: at least one entry per ``expert_step`` rows, and per
row).
"""

import torch

from sgljit.op import Case, Cuda, Scalar, Sycl, Tensor, vector_width

from . import reference
from .ops import family

__all__ = ["ACTIVATIONS", "gated_act_filtered"]

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")  # the op's ``act``: 0, 1, 2
_INT32_MAX = 2**31 - 1
_SYCL_WG = 256
_SYCL_MAX_GROUPS = 4096  # a grid-stride loop covers the rest


def _check(input, out, expert_ids, expert_step, sorted_token_ids, sorted) -> None:
    """What the spec cannot say (csrc/activation.cuh's ActFiltered checks the same)."""
    rows = out.shape[0]
    blocks = -(-rows // expert_step)
    if expert_ids.shape[0] < blocks:
        raise ValueError(
            f"expert_ids: expected at least {blocks} entries (one per expert_step rows of input), "
            f"got {expert_ids.shape[0]}"
        )
    if sorted and sorted_token_ids.shape[0] < rows:
        raise ValueError(
            f"sorted_token_ids: expected at least {rows} entries (one per row of input), got "
            f"{sorted_token_ids.shape[0]}"
        )


def _kept(rows, expert_ids, expert_step, sorted_token_ids, post, valid, sorted) -> torch.Tensor:
    index = torch.arange(rows, device=expert_ids.device)
    keep = expert_ids[index // expert_step].to(torch.int64) != -1
    if sorted:
        ids = sorted_token_ids[:rows].to(torch.int64)
        keep &= (index < post.reshape(-1)[0].to(torch.int64)) & (ids >= 0) & (ids < valid)
    return keep


def _reference(
    input, out, expert_ids, expert_step, sorted_token_ids, num_tokens_post_padded,
    num_valid_tokens, act, sorted,
) -> None:  # fmt: skip
    _check(input, out, expert_ids, expert_step, sorted_token_ids, sorted)
    y = reference.act_and_mul(ACTIVATIONS[act], input).to(out.dtype)
    keep = _kept(
        out.shape[0], expert_ids, expert_step, sorted_token_ids, num_tokens_post_padded,
        num_valid_tokens, sorted,
    ).to(out.device)  # fmt: skip
    out.copy_(torch.where(keep.unsqueeze(1), y, out))


_SYCL_ARGS = (
    "ptr", "ptr", "i64", "i64", "i64", "i64", "ptr", "i64", "i64", "ptr", "ptr", "i64", "i32", "i32",
)  # fmt: skip


def _sycl_key(input, out, *_) -> dict:
    return {"SGLJIT_T": input.dtype, "ACT_VEC": vector_width(input.dtype, out.shape[1], input, out)}


def _launch(
    module, key, input, out, expert_ids, expert_step, sorted_token_ids, num_tokens_post_padded,
    num_valid_tokens, act, sorted,
) -> None:  # fmt: skip
    _check(input, out, expert_ids, expert_step, sorted_token_ids, sorted)
    rows, hidden = out.shape
    items = rows * (hidden // key["ACT_VEC"])
    if items == 0:
        return
    groups = min(-(-items // _SYCL_WG), _SYCL_MAX_GROUPS)
    fn = module.get_function("gated_act_filtered", _SYCL_ARGS)
    fn(
        groups * _SYCL_WG, _SYCL_WG, input, out, rows, hidden, input.stride(0), out.stride(0),
        expert_ids, expert_ids.shape[0], expert_step, sorted_token_ids, num_tokens_post_padded,
        num_valid_tokens, int(sorted), act,
    )  # fmt: skip


def _case(rows, hidden, dtype, act, step, *, sorted=False, pad=0) -> Case:
    def make(device):
        g = torch.Generator().manual_seed(rows * 31 + step)
        x = torch.randn(rows, 2 * hidden + pad, generator=g).to(dtype).to(device)[:, pad:]
        out = torch.randn(rows, hidden, generator=g).to(dtype).to(device)
        blocks = -(-rows // step)
        expert_ids = torch.randint(0, 4, (blocks,), generator=g, dtype=torch.int32)
        expert_ids[::3] = -1
        ids = torch.randint(0, rows + 3, (rows + 2,), generator=g, dtype=torch.int32)
        ids[1] = -1
        post = torch.tensor([rows - 2], dtype=torch.int32)
        return (
            x, out, expert_ids.to(device), step, ids.to(device), post.to(device), rows, act, sorted
        )  # fmt: skip

    label = (" sorted" if sorted else "") + (" strided" if pad else "")
    name = f"{rows}x{hidden} {ACTIVATIONS[act]} step {step}{label} {str(dtype)[6:]}"
    return Case(name, make, 2e-2 if dtype != torch.float32 else 1e-5)


_gated_act_filtered = family.op(
    "gated_act_filtered",
    args={
        "input": Tensor("T", "2*d"),
        "out": Tensor("T", "d", dtype="input", io="inout"),
        "expert_ids": Tensor(None, dtype=torch.int32, layout="contiguous"),
        "expert_step": Scalar(int, min=1, max=_INT32_MAX),
        "sorted_token_ids": Tensor(None, dtype=torch.int32, layout="contiguous"),
        "num_tokens_post_padded": Tensor(1, dtype=torch.int32, layout="contiguous"),
        "num_valid_tokens": Scalar(int, min=0, max=_INT32_MAX),
        "act": Scalar(int, min=0, max=len(ACTIVATIONS) - 1),
        "sorted": Scalar(bool),
    },
    reference=_reference,
    doc="""``out[r] = act(gate) * up`` of ``input[r]`` ``[T, 2 d]`` for the rows the routing keeps
    (see the module docstring); ``act``: 0 silu, 1 gelu, 2 gelu_tanh; without ``sorted`` the
    sorted-layout tensors are not read.""",
    cuda=Cuda(
        "csrc/activation.cuh",
        "sgljit_activation::ActFiltered<{dtype}>::run",
        key=lambda input, *_: (input.dtype,),
        params=("dtype",),
        module="act_filtered",
    ),
    sycl=Sycl("sycl/activation.hpp", key=_sycl_key, launch=_launch, module="act"),
    prebuild={"cuda": [{"dtype": torch.bfloat16}]},
    cases=[
        _case(37, 768, torch.bfloat16, 0, 1),
        _case(40, 1024, torch.bfloat16, 0, 8, sorted=True),
        _case(9, 100, torch.float16, 1, 2, pad=3),
        _case(16, 256, torch.float32, 2, 4, sorted=True),
    ],
)


def gated_act_filtered(
    input: torch.Tensor,
    act: str = "silu",
    *,
    expert_ids: torch.Tensor,
    expert_step: int = 1,
    sorted_token_ids: torch.Tensor | None = None,
    num_tokens_post_padded: torch.Tensor | None = None,
    num_valid_tokens: int = 0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``act(gate) * up`` (``act``: ``"silu"``, ``"gelu"`` or ``"gelu_tanh"``) of ``input`` ``[T, 2
    d]`` into ``out`` ``[T, d]`` for the rows MoE routing keeps (module docstring): ``expert_ids``
    int32, ``expert_step``; with ``sorted_token_ids`` (int32, at least T entries) also
    ``num_tokens_post_padded`` (int32 ``[1]``; None: T) and ``num_valid_tokens``. Rows left out keep
    ``out``'s contents (a new ``out`` holds garbage there). Returns ``out``."""
    if act not in ACTIVATIONS:
        raise ValueError(f"act: expected one of {', '.join(ACTIVATIONS)}, got {act!r}")
    if not isinstance(input, torch.Tensor) or input.dim() != 2:
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
        raise ValueError(f"input: expected a 2-D tensor [T, 2 * d], got shape {tuple(input.shape)}")
    if out is None:
        out = input.new_empty(input.shape[0], input.shape[1] // 2)
    sorted_layout = sorted_token_ids is not None
    if sorted_layout and num_tokens_post_padded is None:  # no padded tail: every row counts
        num_tokens_post_padded = torch.full(
            (1,), input.shape[0], dtype=torch.int32, device=input.device
        )
    if not sorted_layout:  # not read: a one-element placeholder
        sorted_token_ids = num_tokens_post_padded = torch.zeros(
            1, dtype=torch.int32, device=input.device
        )
    _gated_act_filtered(
        input, out, expert_ids, expert_step, sorted_token_ids, num_tokens_post_padded,
        num_valid_tokens, ACTIVATIONS.index(act), sorted_layout,
    )  # fmt: skip
    return out

"""``sglang.jit_kernel.activation`` (sglang 0.5.13) on sgljit's activation ops: its public functions
with their signatures and results, so a call site ports by changing the import::

    from sgljit.compat.sglang.activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul

``run_activation(op_name, input, out, expert_ids, expert_step)`` and its three wrappers write
``act(gate) * up`` of ``input`` ``[..., 2 * d]`` into ``out`` ``[..., d]`` (allocated when None) and
return it; both compute in float32 and round once. Beyond sglang: any width (sglang's kernel needs
``d`` a multiple of 16 bytes) and strided rows. With ``expert_ids`` (MoE routing: token ``t`` is left
out where ``expert_ids[t // expert_step] == -1``) the rows left out keep what ``out`` held, as in
sglang; here every row is computed and the kept ones are selected into ``out`` (one more pass over
it, where sglang's kernel skips the rows). ``relu2`` (``max(0, x)^2``, not a gated activation and not
an sgljit op) is computed by PyTorch in float32 and rounded once, as sglang's kernel does.
"""

from __future__ import annotations

import torch

import sgljit

__all__ = [
    "SUPPORTED_ACTIVATIONS",
    "SUPPORTED_UNARY_ACTIVATIONS",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "relu2",
    "run_activation",
    "run_unary_activation",
    "silu_and_mul",
]

SUPPORTED_ACTIVATIONS = {"silu", "gelu", "gelu_tanh"}
SUPPORTED_UNARY_ACTIVATIONS = {"relu2"}


def run_activation(
    op_name: str,
    input: torch.Tensor,
    out: torch.Tensor | None,
    expert_ids: torch.Tensor | None = None,
    expert_step: int = 1,
) -> torch.Tensor:
    """``out = act(input[..., :d]) * input[..., d:]`` for ``op_name`` in ``SUPPORTED_ACTIVATIONS``;
    with ``expert_ids`` (int32), rows of tokens whose ``expert_ids[token // expert_step]`` is -1
    are left as they were."""
    if op_name not in SUPPORTED_ACTIVATIONS:
        raise ValueError(
            f"op_name: expected one of {sorted(SUPPORTED_ACTIVATIONS)}, got {op_name!r}"
        )
    op = getattr(sgljit.ops, f"{op_name}_and_mul")
    if expert_ids is None:
        return op(input, out=out)
    if expert_ids.dtype != torch.int32:
        raise TypeError(f"expert_ids: expected dtype torch.int32, got {expert_ids.dtype}")
    if not isinstance(expert_step, int) or expert_step < 1:
        raise ValueError(f"expert_step: expected a positive int, got {expert_step!r}")
    if out is None:
        out = input.new_empty(*input.shape[:-1], input.shape[-1] // 2)
    computed = op(input)
    tokens = torch.arange(computed[..., 0].numel(), device=input.device) // expert_step
    skipped = (expert_ids[tokens] == -1).view(*computed.shape[:-1], 1)
    out.copy_(torch.where(skipped, out, computed))
    return out


def run_unary_activation(
    op_name: str, input: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``out = act(input)`` elementwise for ``op_name`` in ``SUPPORTED_UNARY_ACTIVATIONS``."""
    if op_name not in SUPPORTED_UNARY_ACTIVATIONS:
        raise ValueError(
            f"op_name: expected one of {sorted(SUPPORTED_UNARY_ACTIVATIONS)}, got {op_name!r}"
        )
    y = torch.relu(input.float()).square()
    if out is None:
        return y.to(input.dtype)
    return out.copy_(y)


def relu2(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Squared ReLU: ``out = max(0, input) ** 2`` (element-wise)."""
    return run_unary_activation("relu2", input, out)


def silu_and_mul(
    input: torch.Tensor,
    out: torch.Tensor | None = None,
    expert_ids: torch.Tensor | None = None,
    expert_step: int = 1,
) -> torch.Tensor:
    return run_activation("silu", input, out, expert_ids, expert_step)


def gelu_and_mul(
    input: torch.Tensor,
    out: torch.Tensor | None = None,
    expert_ids: torch.Tensor | None = None,
    expert_step: int = 1,
) -> torch.Tensor:
    return run_activation("gelu", input, out, expert_ids, expert_step)


def gelu_tanh_and_mul(
    input: torch.Tensor,
    out: torch.Tensor | None = None,
    expert_ids: torch.Tensor | None = None,
    expert_step: int = 1,
) -> torch.Tensor:
    return run_activation("gelu_tanh", input, out, expert_ids, expert_step)

"""PyTorch implementation of the activation family: the CPU path and the test oracle.

``out = silu(input) * scale`` with ``silu(x) = x * sigmoid(x)``, math in float32 and cast once, as
the kernels do. Given float64 tensors (the conformance suite's oracle) the math stays in float64.
"""

import torch

__all__ = ["scaled_silu_into"]


def scaled_silu_into(input: torch.Tensor, out: torch.Tensor, scale: float) -> None:
    """``out = silu(input) * scale`` (out may be any view of the same shape)."""
    x = input.to(torch.promote_types(input.dtype, torch.float32))
    out.copy_(torch.nn.functional.silu(x) * scale)

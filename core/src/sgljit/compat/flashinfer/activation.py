"""``flashinfer.activation``'s gated activations on sgljit's activation ops, with their signatures
and results, so a call site ports by changing the import::

    from sgljit.compat.flashinfer.activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul

Each takes ``input`` ``[..., 2 * d]`` (gate, then up) and writes ``out`` ``[..., d]`` (allocated like
``input`` when not given), returning it. ``enable_pdl`` is accepted and left to sgljit, which launches
with programmatic dependent launch where the GPU has it (``SGLJIT_PDL=0`` turns it off). Beyond
FlashInfer: any width (FlashInfer raises ValueError unless a row is a multiple of 16 bytes), strided
rows and float32 (FlashInfer: float16 and bfloat16). Numerics: both compute ``act(gate) * up`` in
float32 and round once; FlashInfer's SiLU uses the fast ``__expf`` and its tanh form an approximate
tanh, sgljit the accurate ``expf`` and ``tanhf``, so results may differ in the last bit of a 16-bit
output.
"""

from __future__ import annotations

import torch

import sgljit

__all__ = ["gelu_and_mul", "gelu_tanh_and_mul", "silu_and_mul"]


def silu_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """``silu(input[..., :hidden_size]) * input[..., hidden_size:]``."""
    return sgljit.ops.silu_and_mul(input, out=out)


def gelu_tanh_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """``gelu_tanh(input[..., :hidden_size]) * input[..., hidden_size:]`` (GELU's tanh form)."""
    return sgljit.ops.gelu_tanh_and_mul(input, out=out)


def gelu_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """``gelu(input[..., :hidden_size]) * input[..., hidden_size:]`` (GELU's erf form)."""
    return sgljit.ops.gelu_and_mul(input, out=out)

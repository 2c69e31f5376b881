"""Defining an op once: a reference implementation, per-backend kernels, and a torch custom op.

Every kernel op is *destination passing*: it writes into tensors it is given and returns None. That
makes the torch custom op trivial (its fake does nothing), so ``torch.compile(fullgraph=True)`` and
CUDA-graph capture work, while eager calls skip the custom-op dispatcher (it costs several µs)::

    @kernel_op("rmsnorm", mutates_args=("out",))
    def rmsnorm_(input: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float) -> None:
        reference_rmsnorm_into(input, weight, out, eps)          # the body is the reference backend

    @rmsnorm_.register("cuda")
    def _(input, weight, out, eps):
        cuda_module(input.dtype).rmsnorm(input, weight, out, eps)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch

from .backend import select_backend

__all__ = ["KernelOp", "kernel_op"]

NAMESPACE = "sgljit"
# torch.compile's functionalization calls fakes as handler(mode, *args, **kwargs): an op parameter
# named like that breaks inductor ("got multiple values for argument 'mode'").
RESERVED_PARAMETERS = frozenset({"mode", "self"})


class KernelOp:
    """A destination-passing op with one implementation per backend."""

    def __init__(self, name: str, reference: Callable[..., None], mutates_args: Sequence[str]):
        self.name = name
        self.impls: dict[str, Callable[..., None]] = {"reference": reference}
        params = list(inspect.signature(reference).parameters)
        reserved = RESERVED_PARAMETERS & set(params)
        if reserved:
            raise ValueError(
                f"kernel_op {name!r}: parameter name(s) {sorted(reserved)} are reserved by torch.compile; rename them"
            )
        unknown = set(mutates_args) - set(params)
        if unknown:
            raise ValueError(
                f"kernel_op {name!r}: mutates_args {sorted(unknown)} are not parameters"
            )
        self._first_tensor = params[0]

        def dispatch(*args, **kwargs):
            return self._dispatch(*args, **kwargs)

        dispatch.__signature__ = inspect.signature(reference)  # type: ignore[attr-defined]
        dispatch.__name__ = name
        self.custom_op = torch.library.custom_op(
            f"{NAMESPACE}::{name}", mutates_args=tuple(mutates_args)
        )(dispatch)
        self.custom_op.register_fake(lambda *args, **kwargs: None)
        self.__doc__ = reference.__doc__

    def register(self, backend: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
        """Decorator: the implementation of this op on ``backend`` ("cuda" or "sycl")."""

        def decorate(fn: Callable[..., None]) -> Callable[..., None]:
            self.impls[backend] = fn
            return fn

        return decorate

    def _dispatch(self, *args, **kwargs) -> None:
        first = args[0] if args else kwargs[self._first_tensor]
        backend = select_backend(first)
        impl = self.impls.get(backend)
        if impl is None:
            raise NotImplementedError(f"sgljit::{self.name} has no {backend} implementation")
        impl(*args, **kwargs)

    def __call__(self, *args, **kwargs) -> None:
        if torch.compiler.is_compiling():
            self.custom_op(*args, **kwargs)
        else:
            self._dispatch(*args, **kwargs)


def kernel_op(
    name: str, *, mutates_args: Sequence[str]
) -> Callable[[Callable[..., None]], KernelOp]:
    """Decorator turning a reference implementation into a :class:`KernelOp` named ``sgljit::<name>``."""

    def decorate(reference: Callable[..., None]) -> KernelOp:
        return KernelOp(name, reference, mutates_args)

    return decorate

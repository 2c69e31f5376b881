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
        self._params = tuple(params)
        self._written = tuple((params.index(a), a) for a in mutates_args)

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
        self._check_arguments(backend, args, kwargs)
        impl(*args, **kwargs)

    def _check_arguments(self, backend: str, args: tuple, kwargs: dict) -> None:
        """What no kernel can see: a written tensor whose elements share memory (an expanded
        view: concurrent writes race, the result is garbage), and tensors that want a gradient
        from a kernel without a backward."""
        for i, name in self._written:
            t = args[i] if i < len(args) else kwargs.get(name)
            if isinstance(t, torch.Tensor) and not t.is_contiguous() and _may_overlap(t):
                raise ValueError(
                    f"{name}: sgljit::{self.name} writes it, but its elements may share memory "
                    f"(shape {tuple(t.shape)}, strides {t.stride()}: an expanded or otherwise "
                    "self-overlapping view); pass a tensor whose elements are distinct"
                )
        if backend != "reference" and torch.is_grad_enabled():
            Tensor = torch.Tensor
            for i, a in enumerate(args):
                if isinstance(a, Tensor) and a.requires_grad:
                    raise _inference_only(self.name, backend, self._params[i])
            for name, a in kwargs.items():
                if isinstance(a, Tensor) and a.requires_grad:
                    raise _inference_only(self.name, backend, name)

    def __call__(self, *args, **kwargs) -> None:
        if torch.compiler.is_compiling():
            self.custom_op(*args, **kwargs)
        else:
            self._dispatch(*args, **kwargs)


def _may_overlap(t: torch.Tensor) -> bool:
    """False when the strides prove every element has its own address: sorted by stride, each
    dimension steps past everything the smaller ones span (true of every strided slice of a dense
    tensor). True for expanded views (stride 0), and for the rare interleaved layouts this cannot
    prove apart.

    >>> _may_overlap(torch.zeros(1, 8).expand(4, 8)), _may_overlap(torch.zeros(4, 16)[:, 4:12])
    (True, False)
    """
    span = 1
    for stride, size in sorted(
        (st, sz) for st, sz in zip(t.stride(), t.shape, strict=True) if sz > 1
    ):
        if stride < span:
            return True
        span = stride * (size - 1) + span
    return False


def _inference_only(op: str, backend: str, name: str) -> RuntimeError:
    return RuntimeError(
        f"{name}: requires grad, but sgljit::{op} is inference-only on {backend} (its kernels have "
        f"no backward); call it under torch.no_grad() or torch.inference_mode(), or pass "
        f"{name}.detach()"
    )


def kernel_op(
    name: str, *, mutates_args: Sequence[str]
) -> Callable[[Callable[..., None]], KernelOp]:
    """Decorator turning a reference implementation into a :class:`KernelOp` named ``sgljit::<name>``."""

    def decorate(reference: Callable[..., None]) -> KernelOp:
        return KernelOp(name, reference, mutates_args)

    return decorate

"""Defining an op once: its arguments, its reference, its kernels, what to prebuild and check.

An op is *destination passing*: it writes into tensors it is given and returns None. A family (one
plugin) declares each op once; core derives everything else from that declaration — the torch
custom op and its fake (so ``torch.compile(fullgraph=True)`` and CUDA graphs work), backend
dispatch, the C++ argument checks of every CUDA export (generated ``TensorMatcher`` code), the same
checks in Python for the reference and SYCL backends, the module memo, ``sgljit build`` jobs,
``sgljit check`` rows and the conformance suite (:mod:`sgljit.testing`)::

    family = Family("norm", __file__)                       # kernel files live beside this module

    rmsnorm_ = family.op(
        "rmsnorm",
        args={
            "input": Tensor("num_tokens", "hidden"),          # float16/bfloat16/float32, unit last stride
            "weight": Tensor("hidden", dtype="input", layout="contiguous"),
            "out": Tensor("num_tokens", "hidden", dtype="input", io="out"),
            "eps": Scalar(float, min=0.0),
        },
        reference=reference.rmsnorm_into,                     # called with the arguments above
        cuda=Cuda("csrc/norm.cuh", "sgljit_norm::RMSNorm<{dtype}, {width}>::run",
                  key=lambda input, *_: (input.dtype, input.shape[1]), params=("dtype", "width")),
        prebuild={"cuda": [{"dtype": torch.bfloat16, "width": 4096}]},
        cases=[Case("7x4096 bf16", make_rmsnorm_args, tol=2e-2)],
    )

The plugin's public function stays a plain documented function that allocates outputs, reshapes,
and calls ``rmsnorm_(input, weight, out, eps)``. Eager calls skip the custom-op dispatcher (it costs
several µs): on CUDA they go from the key to a memoized tvm-ffi function, whose generated C++ checks
shapes, strides, dtypes, devices and overlap before the kernel's ``run``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from . import backend as _backend
from .jit_utils import as_dtype, forget_on_clear, make_cpp_args

__all__ = [
    "FLOATS",
    "Case",
    "Cuda",
    "Family",
    "Op",
    "Scalar",
    "Sizes",
    "Sycl",
    "Tensor",
    "as_rows",
    "dtype_label",
    "vector_width",
]

NAMESPACE = "sgljit"
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
FLOATS = (torch.float16, torch.bfloat16, torch.float32)
# torch.compile's functionalization calls fakes as handler(mode, *args, **kwargs): an op parameter
# named like that breaks inductor ("got multiple values for argument 'mode'").
RESERVED_PARAMETERS = frozenset({"mode", "self"})
LAYOUTS = ("rows", "contiguous", "strided")
IO = ("in", "out", "inout", "scratch")
# Op name -> the family that declared it. torch.ops.sgljit.<name> is one per process, and a second
# custom op of a name silently replaces the first (the first op's custom op, and torch.compile of
# it, would run the second's code), so a second family declaring a name is refused.
_DECLARED: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A tensor argument. ``shape``: one entry per dimension — a name (sizes of one name must agree
    across the op's tensors), an int, or None (any size); a size related to a name by ``"k*name"``,
    ``"name/k"`` or ``"name/scalar"`` (an int argument of the op, e.g. ``"hidden/group_size"``):
    divisibility and the relation are checked, in C++ and Python with the same messages. A first
    dimension ``"..."`` makes the tensor *rows*: the public function (:meth:`Op.public`) flattens
    any leading dimensions into one (the op sees ``[rows, ...]``, symbol ``rows``). ``dtype``: the dtypes allowed, or the
    name of an earlier tensor argument whose dtype it must have, or both in one tuple: that
    tensor's dtype or one of the dtypes listed (``("input", torch.float32)``). ``layout``: ``"rows"`` (unit
    stride in the last dimension, any other strides), ``"contiguous"`` or ``"strided"``. ``io``:
    ``"in"`` (read), ``"out"`` (every element written, none read), ``"inout"`` (updated in
    place) or ``"scratch"`` (a workspace the kernels write and read back: its contents before and
    after a call mean nothing, so no check compares them). A written tensor's elements must not
    share memory with each other, nor with another argument (the kernels would read or write it
    while writing this one); ``alias`` names the one argument it may instead be, the very same view
    (an op that also runs in place, such as rmsnorm's ``out=input``)."""

    shape: tuple[str | int | None, ...]
    dtype: tuple[torch.dtype | str, ...] | str = FLOATS
    layout: str = "rows"
    io: str = "in"
    alias: str | None = None

    def __init__(self, *shape, dtype=FLOATS, layout="rows", io="in", alias=None):
        if layout not in LAYOUTS or io not in IO:
            raise ValueError(f"Tensor: layout must be one of {LAYOUTS} and io one of {IO}")
        if not shape:
            raise ValueError("Tensor: give at least one dimension (a 0-d tensor is shape (1,))")
        bad = [d for d in shape if not (d is None or isinstance(d, (str, int)))]
        if bad:
            raise TypeError(f"Tensor: each dimension is a name, an int or None, got {bad[0]!r}")
        for i, d in enumerate(shape):
            if isinstance(d, str) and not (i == 0 if d == ROWS else _parse_dim(d) is not None):
                raise ValueError(
                    f"Tensor: dimension {d!r} is not a name, 'k*name', 'name/k' or 'name/scalar' "
                    f"('{ROWS}' only first: any leading dimensions, flattened into rows)"
                )
        if shape[0] == ROWS and len(shape) < 2:
            raise ValueError(f"Tensor: '{ROWS}' needs at least one dimension after it")
        if isinstance(dtype, torch.dtype):  # one dtype
            dtype = (dtype,)
        if alias is not None and io == "in":
            raise ValueError(f"Tensor: alias={alias!r} is for a tensor the op writes, not io='in'")
        dtype = dtype if isinstance(dtype, str) else tuple(dtype)
        if not isinstance(dtype, str) and sum(isinstance(d, str) for d in dtype) > 1:
            raise ValueError(f"Tensor: dtype names at most one tensor, got {dtype}")
        object.__setattr__(self, "shape", tuple(shape))
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "io", io)
        object.__setattr__(self, "alias", alias)

    @property
    def written(self) -> bool:
        return self.io != "in"

    @property
    def same_as(self) -> str | None:
        """The tensor whose dtype this one may have (``dtype`` names it), or None."""
        if isinstance(self.dtype, str):
            return self.dtype
        return next((d for d in self.dtype if isinstance(d, str)), None)

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        """The dtypes ``dtype`` lists (besides the named tensor's)."""
        return (
            ()
            if isinstance(self.dtype, str)
            else tuple(d for d in self.dtype if not isinstance(d, str))
        )


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A Python number argument: ``float``, ``int`` or ``bool``, with optional bounds (inclusive)."""

    type: type
    min: float | None = None
    max: float | None = None
    one_of: tuple | None = None  # the values allowed (checked after min and max)

    def __post_init__(self) -> None:
        if self.type not in (bool, int, float):
            raise TypeError(f"Scalar: type must be bool, int or float, got {self.type!r}")
        if self.min is not None and self.max is not None and not self.min <= self.max:
            raise ValueError(f"Scalar: min {self.min} exceeds max {self.max}")

    def check(self, name: str, value: Any) -> None:
        if self.type is bool:
            ok = isinstance(value, bool)
        elif self.type is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            raise TypeError(f"{name}: expected {self.type.__name__}, got {type(value).__name__}")
        if self.min is not None and not value >= self.min:  # NaN fails too
            raise ValueError(f"{name}: expected a value >= {self.min}, got {value}")
        if self.max is not None and not value <= self.max:
            raise ValueError(f"{name}: expected a value <= {self.max}, got {value}")
        if self.one_of is not None and value not in self.one_of:
            raise ValueError(f"{name}: expected one of {_listed(self.one_of)}, got {value}")


@dataclasses.dataclass(frozen=True)
class Cuda:
    """The CUDA kernel of an op. ``file``: relative to the family's folder. ``symbol``: the C++
    function run after the generated checks, with ``{name}`` placeholders filled from the
    specialization's template parameters. ``key(*args)``: a tuple naming the specialization an
    argument list needs, as cheap as possible (it runs on every call); ``params``: the template
    parameters of a key — the names of its entries, or a function of them returning a dict (run
    once per new key). Ops of a family that name the same ``module`` share its compiled modules
    (each module of that name exports all of them)."""

    file: str
    symbol: str
    key: Callable[..., tuple]
    params: Sequence[str] | Callable[..., Mapping[str, Any]]
    module: str | None = None

    def params_of(self, key: tuple) -> dict[str, Any]:
        if callable(self.params):
            return dict(self.params(*key))
        return dict(zip(self.params, key, strict=True))


@dataclasses.dataclass(frozen=True)
class Sycl:
    """The SYCL kernel of an op. ``key(*args)``: the ``-D`` macros of the module the arguments
    need. Either ``launch(module, key, *args)`` runs it (work sizes, kernel arguments), or core
    derives the launch: kernel ``kernel`` (default: the op's name) gets, in the op's order, each
    tensor's pointer then its strides (all but the unit last one of rows; every one of
    ``"strided"``; none of ``"contiguous"``) as int64, each scalar (float32, int64, or int32 for
    bool), then each size name in order of first appearance (``rows`` for ``"..."``) as int64;
    ``items(sizes, key)`` work-items (``sizes``: the size names and scalars by name) in
    work-groups of ``group``, at most ``max_groups`` groups (the kernel loops over the rest)."""

    file: str
    key: Callable[..., Mapping[str, Any]]
    launch: Callable[..., None] | None = None
    module: str | None = None
    kernel: str | None = None
    items: Callable[[Mapping[str, Any], Mapping[str, Any]], int] | None = None
    group: int = 256
    max_groups: int | None = None

    def __post_init__(self) -> None:
        if (self.launch is None) == (self.items is None):
            raise ValueError("Sycl: give either launch= or items= (a derived launch), not both")


@dataclasses.dataclass(frozen=True)
class Case:
    """A check case: ``make(device)`` returns fresh random arguments of the op on ``device``;
    a backend's written tensors must match the float64 reference within ``tol`` (the error is
    ``max |result - expected| / (1 + |expected|)``)."""

    name: str
    make: Callable[[torch.device], tuple]
    tol: float


@dataclasses.dataclass(frozen=True)
class Sizes:
    """A check case as data, its arguments made from the op's declaration: ``sizes`` gives each
    size name (``rows`` for ``"..."``), ``dtype`` the first tensor's dtype (tensors whose dtype
    names it follow; ``dtypes`` the others, else their first listed), ``values`` the scalars.
    Read tensors are random (over several magnitudes); ``pad`` makes rows and strided tensors
    column slices of buffers ``pad`` elements wider, ``offset`` starts read tensors that many
    elements into their storage (odd: misaligned), ``column_major`` names 2-D tensors laid out
    column-major with 16-byte aligned columns; ``fill(args)`` may then shape the values. ``tol``:
    a number, or one per ``dtype`` (see :class:`Case`)."""

    sizes: Mapping[str, int]
    dtype: torch.dtype
    tol: float | Mapping[torch.dtype, float]
    dtypes: Mapping[str, torch.dtype] = dataclasses.field(default_factory=dict)
    values: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    pad: int = 0
    offset: int = 0
    column_major: tuple[str, ...] = ()
    fill: Callable[[tuple], None] | None = None
    label: str = ""


def _check_declared(name: str, prebuild: Any, cases: Any) -> None:
    """What an op's prebuild= and cases= must be, checked at declaration (not at build time)."""
    for backend, keys in (prebuild or {}).items():
        if backend not in ("cuda", "sycl"):
            raise ValueError(
                f"op {name!r}: prebuild has key {backend!r}; expected 'cuda' or 'sycl'"
            )
        if not isinstance(keys, (list, tuple)) or not all(isinstance(k, Mapping) for k in keys):
            raise TypeError(
                f"op {name!r}: prebuild[{backend!r}] must be a list of dicts (one specialization "
                f"each), got {type(keys).__name__}"
            )
    for case in cases:
        if not isinstance(case, (Case, Sizes)):
            raise TypeError(
                f"op {name!r}: cases holds a {type(case).__name__}; each is a sgljit.op.Case "
                "or a sgljit.op.Sizes"
            )


def _cpp_literal(value: Any) -> str:
    return str(make_cpp_args(value))


class Op:
    """A destination-passing op of a :class:`Family` (see the module docstring)."""

    def __init__(
        self,
        family: Family,
        name: str,
        *,
        args: Mapping[str, Tensor | Scalar],
        reference: Callable[..., None],
        cuda: Cuda | None = None,
        sycl: Sycl | None = None,
        prebuild: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        cases: Sequence[Case | Sizes] = (),
        doc: str | None = None,
        allowed: Mapping[str, Sequence[int]] | None = None,
    ):
        reserved = RESERVED_PARAMETERS & set(args)
        reserved |= {n for n in args if n.startswith("_sgljit_") or not n.isidentifier()}
        if reserved:
            raise ValueError(
                f"op {name!r}: parameter name(s) {sorted(reserved)} are reserved (by torch.compile, "
                "or not plain names for the generated eager path); rename them"
            )
        tensors = [n for n, a in args.items() if isinstance(a, Tensor)]
        if not tensors or next(iter(args)) != tensors[0]:
            raise ValueError(f"op {name!r}: the first argument must be a tensor")
        for n, a in args.items():
            ref = a.same_as if isinstance(a, Tensor) else None
            if ref is not None and (ref not in tensors or tensors.index(ref) >= tensors.index(n)):
                raise ValueError(
                    f"op {name!r}: {n}'s dtype refers to {ref!r}, not an earlier tensor"
                )
        for n, a in args.items():
            if isinstance(a, Tensor) and a.alias is not None and a.alias not in tensors:
                raise ValueError(f"op {name!r}: {n}'s alias {a.alias!r} is not a tensor argument")
        if not any(args[n].written for n in tensors):
            raise ValueError(
                f"op {name!r}: no argument is written; an op writes into tensors it is given "
                "(declare its output io='out', or io='inout' for one updated in place)"
            )
        _check_declared(name, prebuild, cases)
        self.family, self.name = family, name
        self.args = dict(args)
        self.params = tuple(args)
        self.reference, self.cuda, self.sycl = reference, cuda, sycl
        self.prebuild = {b: list(keys) for b, keys in (prebuild or {}).items()}
        self.allowed = {k: tuple(v) for k, v in (allowed or {}).items()}
        self._analyse_sizes()
        self.cases = tuple(c if isinstance(c, Case) else self._case_of(c) for c in cases)
        self.writes = tuple(n for n in tensors if args[n].written)
        # What a call produces: the written tensors but scratch space.
        self.results = tuple(n for n in self.writes if args[n].io != "scratch")
        self.__doc__ = doc or reference.__doc__
        self.signature = inspect.Signature(
            [
                inspect.Parameter(
                    n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=_annotation(a)
                )
                for n, a in args.items()
            ],
            return_annotation=None,
        )
        self._tensor_index = tuple((i, n) for i, n in enumerate(self.params) if n in tensors)
        # Each pair of tensor arguments of which one is written: ((positions), the one an error
        # names, the other, whether the other is written, whether one may be the other's view).
        self._unshared = tuple(
            _unshared_pair(args, first, second)
            for k, second in enumerate(self._tensor_index)
            for first in self._tensor_index[:k]
            if args[first[1]].written or args[second[1]].written
        )
        self._arity = len(self.params)
        # tvm-ffi turns 1 into True: bool arguments are checked before a CUDA call, as elsewhere
        self._bools = tuple(
            (i, n) for i, n in enumerate(self.params) if _annotation(self.args[n]) is bool
        )
        self._cuda_fns: dict = forget_on_clear({})  # key -> the tvm-ffi function of this op

        def dispatch(*a, **kw):  # what the custom op runs (compiled graphs), on any backend
            self._run(self._positional(a, kw))

        owner = _DECLARED.setdefault(name, family.name)
        if owner != family.name:
            raise ValueError(
                f"op {name!r} of family {family.name!r}: family {owner!r} declared it already, "
                f"and torch.ops.{NAMESPACE}.{name} is one per process; rename one of them"
            )
        dispatch.__signature__ = self.signature  # type: ignore[attr-defined]
        dispatch.__name__ = name
        self.custom_op = torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=self.writes)(
            dispatch
        )
        self.custom_op.register_fake(lambda *a, **kw: None)
        self.__class__ = _specialize(self)

    def __repr__(self) -> str:
        return f"<sgljit op {self.family.name}.{self.name}{self.signature}>"

    def __call__(self, *args, **kwargs) -> None:
        # Ops with a CUDA kernel get a generated __call__ instead (see _specialize).
        if kwargs or len(args) != self._arity:
            args = self._positional(args, kwargs)
        if _is_compiling():
            return self.custom_op(*args)
        return self._run(args)

    def _run(self, args: tuple) -> None:
        """Run on the backend the first tensor (or ``use_backend``) selects."""
        first = args[0]
        if not isinstance(first, torch.Tensor):
            raise TypeError(
                f"{self.params[0]}: expected a torch.Tensor, got {type(first).__name__}"
            )
        try:
            backend = _backend.select_backend(first)
        except ValueError as err:  # a forced backend that cannot run these tensors
            raise ValueError(f"{self.params[0]}: {err}") from None
        if _grad_enabled():
            self._refuse_grad(backend, args)
        if backend == "cuda":  # the eager hot path: one key, one lookup, one tvm-ffi call
            for i, name in self._bools:
                if args[i] is not True and args[i] is not False:
                    raise TypeError(f"{name}: expected bool, got {type(args[i]).__name__}")
            try:
                fn = self._cuda_fns[self.cuda.key(*args)]
            except Exception:  # a new specialization, no CUDA kernel, or a key that cannot be read
                fn = self._cuda_miss(args)
            try:
                fn(*args)
            except TypeError as err:  # tvm-ffi names the argument by position only
                raise self._name_type_error(err, args) from None
            return None
        sizes = self.check_arguments(args)
        if backend == "reference":
            self.reference(*args)
        elif self.sycl is None:
            raise NotImplementedError(f"sgljit::{self.name} has no sycl implementation")
        else:
            key = self.sycl.key(*args)
            module = self.family.sycl_module(self.sycl.module or self.name, key)
            if self.sycl.launch is None:
                self._sycl_launch(module, key, args, sizes)
            else:
                self.sycl.launch(module, key, *args)
        return None

    def _positional(self, args: tuple, kwargs: dict) -> tuple:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as err:
            raise TypeError(f"sgljit::{self.name}{self.signature}: {err}") from None
        return bound.args

    def _refuse_grad(self, backend: str, args: tuple) -> None:
        if backend == "reference":  # it keeps the graph, but cannot write a leaf in place
            for i, name in self._tensor_index:
                t = args[i]
                if (
                    self.args[name].written
                    and isinstance(t, torch.Tensor)
                    and t.is_leaf
                    and t.requires_grad
                ):
                    raise RuntimeError(
                        f"{name}: requires grad and is a leaf, and sgljit::{self.name} writes it "
                        f"in place (autograd forbids that); pass {name}.detach(), or a tensor "
                        "computed from it"
                    )
            return
        for i, name in self._tensor_index:
            t = args[i]
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise RuntimeError(
                    f"{name}: requires grad, but sgljit::{self.name} is inference-only on {backend} "
                    f"(its kernels have no backward); call it under torch.no_grad() or "
                    f"torch.inference_mode(), or pass {name}.detach()"
                )

    def _name_type_error(self, err: TypeError, args: tuple) -> TypeError:
        for i, name in enumerate(self.params):
            spec, value = self.args[name], args[i]
            if isinstance(spec, Tensor) and not isinstance(value, torch.Tensor):
                return TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
            if isinstance(spec, Scalar):
                try:
                    spec.check(name, value)
                except (TypeError, ValueError) as named:
                    return TypeError(str(named))
        return err

    # -- checks on backends without C++ host code (the same rules as the generated C++) ---------
    def check_arguments(self, args: Sequence[Any]) -> dict[str, int]:
        """Raise the error a CUDA call would raise for ``args`` (names the argument); returns the
        sizes of the size names."""
        sizes: dict[str, int] = {}
        dtypes: dict[str, torch.dtype] = {}
        related: dict[str, tuple] = {}  # size name -> (value, what bound it, the size it came from)
        deferred: list = []  # sizes divided by a scalar: checked once every argument is read
        device = None
        for name, value in zip(self.params, args, strict=True):
            spec = self.args[name]
            if isinstance(spec, Scalar):
                spec.check(name, value)
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
            _check_tensor(name, spec, value, sizes, dtypes, self._check_shapes[name])
            if device is None:
                device = value.device
            elif value.device != device:
                raise ValueError(
                    f"{name}: expected a tensor on {device} (same as the tensors before it), "
                    f"got one on {value.device}"
                )
            for i, dim in self._relations[name]:
                if isinstance(dim.div, str):
                    deferred.append((name, i, dim, value.shape[i]))
                else:
                    self._relate(name, i, dim, value.shape[i], related)
        for name, i, dim, size in deferred:
            self._relate_by_scalar(name, i, dim, size, args[self.params.index(dim.div)], related)
        sizes.update((k, v[0]) for k, v in related.items())
        if not self._unshared:
            return sizes
        spans = {i: _byte_span(args[i]) for i, _ in self._tensor_index}
        for (i, j), name, other, other_written, alias in self._unshared:
            (a_lo, a_hi), (b_lo, b_hi) = spans[i], spans[j]
            if a_lo >= b_hi or b_lo >= a_hi:  # the cheap test settles nearly every pair
                continue
            a, b = args[i], args[j]
            if shares_memory(a, b) and not (alias and _same_view(a, b)):
                raise ValueError(_shared_message(name, other, other_written))
        return sizes

    # -- sizes the spec relates (k*name, name/k, name/scalar, allowed sets) -----------------------
    def _analyse_sizes(self) -> None:
        ints = {n for n, a in self.args.items() if isinstance(a, Scalar) and a.type is int}
        related = set(self.allowed)
        self._symbols: list[str] = []  # every size name, in order of first appearance
        for n, a in self.args.items():
            for d in a.shape if isinstance(a, Tensor) else ():
                dim = _parse_dim(d) if isinstance(d, str) else None
                if dim is None:
                    continue
                if dim.symbol not in self._symbols:
                    self._symbols.append(dim.symbol)
                if dim.mul != 1 or dim.div != 1:
                    related.add(dim.symbol)
                if isinstance(dim.div, str) and dim.div not in ints:
                    raise ValueError(
                        f"op {self.name!r}: {n}'s dimension {d!r} divides by {dim.div!r}, "
                        "which is not an int argument of the op"
                    )
        unknown = set(self.allowed) - set(self._symbols)
        if unknown:
            raise ValueError(f"op {self.name!r}: allowed names {sorted(unknown)}, no size name")
        self._check_shapes: dict[str, tuple] = {}
        self._relations: dict[str, tuple] = {}
        self._holders: dict[str, str] = {}  # a related name -> the first dimension that is it
        for n, a in self.args.items():
            if not isinstance(a, Tensor):
                continue
            dims = [_parse_dim(d) if isinstance(d, str) else None for d in a.shape]
            self._check_shapes[n] = tuple(
                None if dim is not None and dim.symbol in related else dim.symbol if dim else d
                for d, dim in zip(a.shape, dims, strict=True)
            )
            self._relations[n] = tuple(
                (i, dim) for i, dim in enumerate(dims) if dim is not None and dim.symbol in related
            )
            for i, dim in self._relations[n]:
                if dim.text == dim.symbol:
                    self._holders.setdefault(dim.symbol, f"{n}'s {_where(i, len(a.shape))}")

    def _relate(self, name: str, i: int, dim: _Dim, size: int, related: dict) -> None:
        where = _where(i, len(self.args[name].shape))
        if size % dim.mul:
            raise ValueError(
                f"{name}: {where} must be {_multiple(dim.mul)} ({dim.text}), got {size}"
            )
        value = size // dim.mul * dim.div
        bound = related.get(dim.symbol)
        if bound is None:
            self._check_allowed(name, i, dim.symbol, value)
            related[dim.symbol] = (value, _origin(name, where, dim), size)
        elif bound[0] != value:
            why = (
                f"{bound[1]} {bound[2]}"
                if dim.text == dim.symbol
                else f"{dim.text}, {dim.symbol} = {bound[0]}"
            )
            raise ValueError(
                f"{name}: dimension {i} expected {bound[0] * dim.mul // dim.div} ({why}), got {size}"
            )

    def _relate_by_scalar(self, name, i, dim: _Dim, size: int, by: int, related: dict) -> None:
        if by <= 0:  # the scalar's own bounds name it
            return
        bound = related.get(dim.symbol)
        if bound is None:
            self._check_allowed(name, i, dim.symbol, size * by)
            where = _where(i, len(self.args[name].shape))
            related[dim.symbol] = (size * by, f"{dim.div} times {name}'s {where}", size)
            return
        holder = self._holders.get(dim.symbol, dim.symbol)
        if bound[0] % by:
            raise ValueError(f"{dim.div}: must divide {holder} {bound[0]}, got {by}")
        if size != bound[0] // by:
            raise ValueError(
                f"{name}: dimension {i} expected {bound[0] // by} ({holder} / {dim.div}), "
                f"got {size}"
            )

    def _check_allowed(self, name: str, i: int, symbol: str, value: int) -> None:
        allowed = self.allowed.get(symbol)
        if allowed is not None and value not in allowed:
            raise ValueError(
                f"{name}: dimension {i} expected {symbol} in {{{_listed(allowed)}}}, got {value}"
            )

    def _cpp_relation(self, name: str, i: int, dim: _Dim) -> str:
        """The C++ of :meth:`_relate` (or :meth:`_relate_by_scalar`): the same rule and messages."""
        s, rank = _sym(dim.symbol), len(self.args[name].shape)
        where = _where(i, rank)
        allowed = self.allowed.get(dim.symbol)

        def bind(value: str, origin: str) -> str:
            check = ""
            if allowed:
                test = " || ".join(f"{value} == {a}" for a in allowed)
                check = (
                    f'RuntimeCheck({test}, "{name}: dimension {i} expected {dim.symbol} in '
                    f'{{{_listed(allowed)}}}, got ", {value}); '
                )
            return f'{check}rel_{s} = {value}; from_{s} = "{origin}"; from_size_{s} = size;'

        head = f"  {{\n    const int64_t size = {name}.size({i});\n"
        if isinstance(dim.div, str):
            holder, g = self._holders.get(dim.symbol, dim.symbol), dim.div
            origin = f"{g} times {name}'s {where}"
            return (
                f"{head}    if ({g} > 0) {{\n"
                f"      if (rel_{s} < 0) {{ {bind(f'size * {g}', origin)} }}\n"
                f"      else {{\n"
                f'        RuntimeCheck(rel_{s} % {g} == 0, "{g}: must divide {holder} ", rel_{s}, ", got ", {g});\n'
                f'        RuntimeCheck(size == rel_{s} / {g}, "{name}: dimension {i} expected ", rel_{s} / {g}, '
                f'" ({holder} / {g}), got ", size);\n'
                f"      }}\n    }}\n  }}"
            )
        lines = [head]
        if dim.mul != 1:
            lines.append(
                f'    RuntimeCheck(size % {dim.mul} == 0, "{name}: {where} must be '
                f'{_multiple(dim.mul)} ({dim.text}), got ", size);\n'
            )
        if dim.text == dim.symbol:
            why = f'" (", from_{s}, " ", from_size_{s}, "), got "'
        else:
            why = f'" ({dim.text}, {dim.symbol} = ", rel_{s}, "), got "'
        lines.append(
            f"    const int64_t value = size / {dim.mul} * {dim.div};\n"
            f"    if (rel_{s} < 0) {{ {bind('value', _origin(name, where, dim))} }}\n"
            f'    else RuntimeCheck(rel_{s} == value, "{name}: dimension {i} expected ", '
            f"rel_{s} * {dim.mul} / {dim.div}, {why}, size);\n  }}"
        )
        return "".join(lines)

    # -- derived from the declaration: public function, SYCL launch, check cases -----------------
    def public(self, doc: str = "", *, name: str | None = None, **defaults: Any) -> Callable:
        """The public function of this op: its tensors read positionally, scalars after them
        (``defaults`` gives their defaults), outputs keyword-only ``=None`` and allocated when
        not given (shape from the declaration, dtype of the tensor ``dtype`` names or the first
        listed); rows tensors (``"..."``) flattened into ``[rows, ...]`` views. Returns the
        outputs (one, a tuple, or None). Its docstring: ``doc``, then the arguments as declared."""
        return _public(self, name or self.name, doc, defaults)

    def _sycl_launch(self, module, key: Mapping[str, Any], args: tuple, sizes: dict) -> None:
        kernel = self.sycl
        named = {**sizes, **{n: args[i] for i, n in enumerate(self.params) if n not in sizes}}
        items = kernel.items(named, key)
        if items <= 0:
            return
        groups = -(-items // kernel.group)
        if kernel.max_groups is not None:
            groups = min(groups, kernel.max_groups)
        values: list = []
        for n, a in zip(self.params, args, strict=True):
            spec = self.args[n]
            if isinstance(spec, Scalar):
                values.append(int(a) if spec.type is bool else a)
                continue
            values.append(a)
            values += [a.stride(d) for d in _stride_dims(spec)]
        values += [sizes[s] for s in self._symbols]
        fn = module.get_function(kernel.kernel or self.name, self._sycl_argtypes)
        fn(groups * kernel.group, kernel.group, *values)

    @functools.cached_property
    def _sycl_argtypes(self) -> tuple[str, ...]:
        """The derived SYCL kernel's argument types (fixed by the declaration: worked out once)."""
        types: list[str] = []
        for spec in self.args.values():
            if isinstance(spec, Scalar):
                types.append({float: "f32", int: "i64", bool: "i32"}[spec.type])
            else:
                types += ["ptr"] + ["i64"] * len(_stride_dims(spec))
        return (*types, *["i64"] * len(self._symbols))

    def _case_of(self, case: Sizes) -> Case:
        missing = [
            n for n, a in self.args.items() if isinstance(a, Scalar) and n not in case.values
        ]
        missing += [s for s in self._symbols if s not in case.sizes]
        if missing:
            raise ValueError(f"op {self.name!r}: Sizes {dict(case.sizes)} lacks {missing}")
        tol = case.tol if isinstance(case.tol, (int, float)) else case.tol[case.dtype]
        dtypes = {n: dtype_label(case.dtypes[n]) for n in case.dtypes}
        label = "x".join(str(v) for v in case.sizes.values()) + "".join(
            f" {word}"
            for word, on in (
                (case.label, case.label),
                ("strided", case.pad),
                ("misaligned", case.offset % 2),
                ("col-major", case.column_major),
            )
            if on
        )
        label += f" {dtype_label(case.dtype)}" + "".join(f"->{d}" for d in dtypes.values())
        return Case(label, lambda device: _make_args(self, case, device), tol)

    # -- modules ---------------------------------------------------------------------------------
    def _cuda_miss(self, args: tuple):
        """The CUDA function for ``args`` on a memo miss: the arguments are checked in Python first,
        so nothing is compiled for arguments the op refuses."""
        if self.cuda is None:
            raise NotImplementedError(f"sgljit::{self.name} has no cuda implementation")
        self.check_arguments(args)
        key = self.cuda.key(*args)
        params = self.cuda.params_of(key)
        fn = getattr(self.family.cuda_module(self.cuda.module or self.name, params), self.name)
        self._cuda_fns[key] = fn
        return fn

    def _dtype_symbol(self, name: str) -> str:
        """The tensor whose C++ dtype symbol ``name``'s dtype is (a plain name refers on)."""
        while isinstance(self.args[name].dtype, str):
            name = self.args[name].dtype
        return name

    def cpp_checks(self, function: str, target: str) -> str:
        """C++ of a function ``function`` that checks its arguments as this op declares, then calls
        ``target`` with them."""
        params, lines, symbols = [], [], []
        related = sorted({dim.symbol for rel in self._relations.values() for _, dim in rel})
        for name, spec in self.args.items():
            params.append(f"{_cpp_param(spec)} {name}")
            if isinstance(spec, Tensor):
                shape = self._check_shapes[name]
                symbols += [d for d in shape if isinstance(d, str) and d not in symbols]
        if symbols:
            lines.append(
                "  SymbolicSize " + ", ".join(f'{_sym(s)}{{"{s}"}}' for s in symbols) + ";"
            )
        for r in related:  # a related size: its value, and what bound it (for messages)
            r = _sym(r)
            lines.append(f'  int64_t rel_{r} = -1, from_size_{r} = 0; const char* from_{r} = "";')
        lines.append("  SymbolicDevice device;")
        first = True
        deferred = []
        for name, spec in self.args.items():
            if isinstance(spec, Scalar):
                for bound, op in ((spec.min, ">="), (spec.max, "<=")):
                    if bound is not None:
                        lines.append(
                            f'  RuntimeCheck({name} {op} {bound!r}, "{name}: expected a value {op} '
                            f'{bound}, got ", {name});'
                        )
                if spec.one_of is not None:
                    test = " || ".join(f"{name} == {_cpp_literal(v)}" for v in spec.one_of)
                    lines.append(
                        f'  RuntimeCheck({test}, "{name}: expected one of {_listed(spec.one_of)}, '
                        f'got ", {name});'
                    )
                continue
            dims = ", ".join(
                _sym(d) if isinstance(d, str) else "kAnySize" if d is None else f"int64_t{{{d}}}"
                for d in self._check_shapes[name]
            )
            m = f"TensorMatcher({{{dims}}})"
            if spec.layout == "rows":
                m += ".with_strides({" + "kAnySize, " * (len(spec.shape) - 1) + "1})"
            elif spec.layout == "contiguous":
                m += ".contiguous()"
            types = ", ".join(_cpp_literal(d) for d in spec.dtypes)
            if spec.same_as is None:
                lines.append(f"  SymbolicDType dtype_{name};")
                m += f".with_dtype<{types}>(dtype_{name})"
            elif spec.dtypes:  # the named tensor's dtype or one listed: this tensor's own symbol
                lines.append(f"  SymbolicDType dtype_{name};")
                like = self._dtype_symbol(spec.same_as)
                m += f".with_dtype_or<{types}>(dtype_{like}, dtype_{name})"
            else:
                m += f".with_dtype(dtype_{self._dtype_symbol(spec.same_as)})"
            m += ".with_device(kDLCUDA, device)" if first else ".with_device(device)"
            if spec.written:
                m += ".writable()"
            lines.append(f'  {m}.verify({name}, "{name}");')
            for i, dim in self._relations[name]:
                (deferred if isinstance(dim.div, str) else lines).append(
                    self._cpp_relation(name, i, dim)
                )
            first = False
        lines += deferred
        if self._unshared:
            spans = ", ".join(f"span_{n} = byte_span({n})" for _, n in self._tensor_index)
            lines.append(f"  const ByteSpan {spans};")
        for _, name, other, other_written, alias in self._unshared:
            lines.append(
                f'  check_unshared({name}, span_{name}, "{name}", {other}, span_{other}, "{other}", '
                f"{str(other_written).lower()}, {str(alias).lower()});"
            )
        call = ", ".join(self.params)
        body = "\n".join(lines)
        return f"inline void {function}({', '.join(params)}) {{\n{body}\n  {target}({call});\n}}\n"


# The eager CUDA path of an op, generated per op with its parameters spelled out (as dataclasses
# generates __init__): no argument tuples, loops or signature binding on the hot path. Anything
# unusual (not CUDA, a forced backend, grad, a bool that is not one, a new key, an argument the key
# cannot read) falls back to Op._run, which does the same with every check and names the argument.
_EAGER_TEMPLATE = """
def __call__(self, {params}):
    if _sgljit_is_compiling():
        return _sgljit_custom_op({params})
    try:
        if {first}.is_cuda and _sgljit_forced() in _SGLJIT_CUDA and not (
            _sgljit_grad_enabled() and ({grad})
        ){bools}:
            _sgljit_fn = _sgljit_fns[_sgljit_key({params})]
        else:
            _sgljit_fn = None
    except Exception:
        _sgljit_fn = None
    if _sgljit_fn is None:
        return _sgljit_run(({params},))
    try:
        return _sgljit_fn({params})
    except TypeError as _sgljit_err:  # tvm-ffi names the argument by position only
        raise _sgljit_name_type_error(_sgljit_err, ({params},)) from None
"""


def _specialize(op: Op) -> type:
    """A subclass of :class:`Op` whose ``__call__`` is ``op``'s generated eager path; :class:`Op`
    itself for ops without a CUDA kernel."""
    if op.cuda is None:
        return Op
    tensors = [name for _, name in op._tensor_index]
    source = _EAGER_TEMPLATE.format(
        params=", ".join(op.params),
        first=op.params[0],
        grad=" or ".join(f"{t}.requires_grad" for t in tensors),
        bools="".join(f" and ({b} is True or {b} is False)" for _, b in op._bools),
    )
    scope = {  # prefixed: an op's parameters cannot shadow them
        "_sgljit_is_compiling": _is_compiling,
        "_sgljit_custom_op": op.custom_op,
        "_sgljit_forced": _backend._forced.get,
        "_SGLJIT_CUDA": (None, "cuda"),  # not forced, or forced to what CUDA tensors get anyway
        "_sgljit_grad_enabled": torch.is_grad_enabled,
        "_sgljit_fns": op._cuda_fns,
        "_sgljit_key": op.cuda.key,
        "_sgljit_run": op._run,
        "_sgljit_name_type_error": op._name_type_error,
    }
    exec(compile(source, f"<sgljit op {op.name}>", "exec"), scope)
    call = scope["__call__"]
    call.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            *op.signature.parameters.values(),
        ],
        return_annotation=None,
    )
    return type(f"Op_{op.name}", (Op,), {"__call__": call, "__doc__": Op.__doc__})


def _annotation(spec: Tensor | Scalar) -> Any:
    return torch.Tensor if isinstance(spec, Tensor) else spec.type


def _cpp_param(spec: Tensor | Scalar) -> str:
    if isinstance(spec, Tensor):
        return "tvm::ffi::TensorView"
    return {float: "double", int: "int64_t", bool: "bool"}[spec.type]


def _sym(name: str) -> str:
    return "size_" + "".join(c if c.isalnum() else "_" for c in name)


def _freeze(key: Mapping[str, Any]) -> tuple:
    return tuple(key.items())


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


# -- size names and their relations ---------------------------------------------------------------
ROWS = "..."  # a first dimension: any leading dimensions, flattened into rows (size name "rows")
_EXPR = re.compile(r"(?:(\d+)\*)?([A-Za-z_]\w*)(?:/(\d+|[A-Za-z_]\w*))?")


@dataclasses.dataclass(frozen=True)
class _Dim:
    """A declared dimension as a size name: ``symbol * mul / div`` (``div`` an int or a scalar)."""

    text: str
    symbol: str
    mul: int = 1
    div: int | str = 1


def _parse_dim(text: str) -> _Dim | None:
    if text == ROWS:
        return _Dim("rows", "rows")
    m = _EXPR.fullmatch(text.replace(" ", ""))
    if m is None or (m.group(1) and m.group(3)):
        return None
    mul, symbol, div = m.groups()
    if (mul and int(mul) < 1) or (div and div.isdigit() and int(div) < 1):
        return None
    return _Dim(text, symbol, int(mul or 1), (int(div) if div.isdigit() else div) if div else 1)


def _where(i: int, rank: int) -> str:
    return "last dimension" if i == rank - 1 else f"dimension {i}"


def _multiple(k: int) -> str:
    return "even" if k == 2 else f"a multiple of {k}"


def _origin(name: str, where: str, dim: _Dim) -> str:
    """What bound a size name, for messages: ``half of input's last dimension``."""
    of = f"{name}'s {where}"
    if dim.mul == 2:
        return f"half of {of}"
    if dim.mul != 1:
        return f"1/{dim.mul} of {of}"
    return f"{dim.div} times {of}" if dim.div != 1 else of


def _listed(values: Sequence[Any]) -> str:
    return ", ".join(str(v) for v in values)


def _stride_dims(spec: Tensor) -> range:
    """The dimensions whose strides a derived SYCL launch passes."""
    rank = len(spec.shape)
    return range({"rows": rank - 1, "strided": rank, "contiguous": 0}[spec.layout])


def dtype_label(dtype: torch.dtype) -> str:
    """A dtype as check cases name it: ``bfloat16``, ``e4m3fn``."""
    return str(dtype).removeprefix("torch.").removeprefix("float8_")


def vector_width(dtype: torch.dtype, n: int, *tensors: torch.Tensor, bytes: int = 16) -> int:
    """Elements a work-item moves at once: ``bytes`` of them where ``n`` (a row's width), every
    pointer and every row stride allow it, else 1."""
    vec = bytes // dtype.itemsize
    aligned = all(
        t.data_ptr() % bytes == 0 and (t.shape[0] == 1 or t.stride(0) % vec == 0) for t in tensors
    )
    return vec if n % vec == 0 and aligned else 1


def _size_of(dim: Any, sizes: Mapping[str, int], values: Mapping[str, Any]) -> int:
    if not isinstance(dim, str):
        return 1 if dim is None else dim
    d = _parse_dim(dim)
    v = sizes[d.symbol] * d.mul
    return v // (values[d.div] if isinstance(d.div, str) else d.div)


def _make_args(op: Op, case: Sizes, device: torch.device) -> tuple:
    """Fresh arguments of ``op`` for a :class:`Sizes` case (see there)."""
    args, dtypes = [], {}
    for n, spec in op.args.items():
        if isinstance(spec, Scalar):
            args.append(case.values[n])
            continue
        shape = [_size_of(d, case.sizes, case.values) for d in spec.shape]
        dtype = case.dtypes.get(n) or (
            case.dtype if not dtypes else dtypes.get(spec.same_as) or spec.dtypes[0]
        )
        dtypes[n] = dtype
        read = spec.io in ("in", "inout")
        pad = case.pad if spec.layout != "contiguous" else 0
        offset = case.offset if read else 0
        if n in case.column_major:
            rows, cols = shape
            aligned = -(-rows // 4) * 4  # 16-byte aligned float32 columns (TMA)
            t = torch.empty(cols, aligned, dtype=dtype, device=device).t()[:rows]
        else:
            wide = [*shape[:-1], shape[-1] + pad]
            count = offset + (torch.Size(wide).numel() if wide else 1)
            full = (
                torch.randn(count, device=device) * 3 if read else torch.empty(count, device=device)
            )
            t = full.to(dtype)[offset:].view(wide)[..., pad:]
        args.append(t)
    if case.fill is not None:
        case.fill(tuple(args))
    return tuple(args)


# -- public functions: generated per op (no argument loops on the eager path) ----------------------
def _public(op: Op, name: str, doc: str, defaults: Mapping[str, Any]) -> Callable:
    unknown = set(defaults) - {n for n, a in op.args.items() if isinstance(a, Scalar)}
    if unknown:
        raise ValueError(f"op {op.name!r}: public defaults for {sorted(unknown)}, not scalars")
    tensors = {n: a for n, a in op.args.items() if isinstance(a, Tensor)}
    rows = [n for n, a in tensors.items() if a.shape[0] == ROWS]
    inputs = [n for n, a in op.args.items() if not (isinstance(a, Tensor) and a.io == "out")]
    outs = [n for n, a in tensors.items() if a.io == "out"]
    scope: dict[str, Any] = {"_op": op, "_Tensor": torch.Tensor, "_empty": torch.empty}
    scope.update({f"_default_{n}": v for n, v in defaults.items()})
    params = [f"{n}=_default_{n}" if n in defaults else n for n in inputs]
    params += ["*"] + [f"{n}=None" for n in outs] if outs else []
    lines = []
    # Where each size name can be read from: the first read tensor with a dimension of it.
    source: dict[str, str] = {}
    for n in inputs:
        spec = op.args[n]
        if not isinstance(spec, Tensor):
            continue
        rank = len(spec.shape)
        for i, d in enumerate(spec.shape):
            dim = _parse_dim(d) if isinstance(d, str) and d != ROWS else None
            if dim is None or isinstance(dim.div, str) or dim.symbol in source:
                continue
            at = f"{n}.shape[{i - rank}]"  # from the end: rows tensors have any leading dims
            source[dim.symbol] = f"{at} // {dim.mul} * {dim.div}" if dim.text != dim.symbol else at
    first = rows[0] if rows else next(iter(tensors))
    pattern = "[" + ", ".join("*" if d is None else str(d) for d in tensors[first].shape) + "]"
    lines.append(
        f"    if not isinstance({first}, _Tensor) or {first}.dim() == 0:\n"
        f"        _not_a_tensor({first!r}, {first}, {pattern!r})"
    )
    scope["_not_a_tensor"] = _not_a_tensor
    if rows:
        lines.append(f"    _lead = {first}.shape[:{1 - len(tensors[first].shape)}]")
    for n in outs:
        spec = op.args[n]
        dims = []
        for d in spec.shape[1:] if spec.shape[0] == ROWS else spec.shape:
            dim = _parse_dim(d) if isinstance(d, str) else None
            if dim is None:
                if d is None:
                    raise ValueError(f"op {op.name!r}: {n} has a dimension of any size: pass it")
                dims.append(str(d))
                continue
            if dim.symbol not in source:
                raise ValueError(f"op {op.name!r}: no read tensor gives {n}'s size {d!r}")
            v = f"({source[dim.symbol]}) * {dim.mul}"
            dims.append(
                f"_per({v}, {dim.div})" if isinstance(dim.div, str) else f"{v} // {dim.div}"
            )
        shape = ("*_lead, " if spec.shape[0] == ROWS else "") + ", ".join(dims) + ","
        dtype = f"{spec.same_as}.dtype" if spec.same_as else f"_dtype_{n}"
        scope[f"_dtype_{n}"] = spec.dtypes[0] if spec.dtypes else None
        lines.append(
            f"    if {n} is None:\n"
            f"        {n} = _empty(({shape}), dtype={dtype}, device={first}.device)"
        )
    scope["_per"] = _per
    for n in rows[1:]:
        lines.append(
            f"    if isinstance({n}, _Tensor) and {n}.shape[:{1 - len(tensors[n].shape)}] != _lead:\n"
            f"        _lead_mismatch({n!r}, {n}, _lead, {first!r})"
        )
    scope["_lead_mismatch"] = _lead_mismatch
    scope["_flat"] = _flat
    call = ", ".join(
        f"_flat({n}, {n!r}, {len(tensors[n].shape) - 1}, {tensors[n].written})" if n in rows else n
        for n in op.params
    )
    lines.append(f"    _op({call})")
    results = [n for n in outs]
    lines.append(f"    return {', '.join(results) if results else 'None'}")
    source_code = f"def {name}({', '.join(params)}):\n" + "\n".join(lines) + "\n"
    exec(compile(source_code, f"<sgljit public {name}>", "exec"), scope)
    fn = scope[name]
    fn.__doc__ = _public_doc(op, doc, outs)
    fn.__module__ = op.family.module
    fn.__qualname__ = name
    return fn


def _public_doc(op: Op, doc: str, outs: Sequence[str]) -> str:
    lines = [doc.strip(), ""] if doc else []
    for n, a in op.args.items():
        if isinstance(a, Scalar):
            lines.append(f"- ``{n}``: {a.type.__name__}")
            continue
        dtype = (f"{a.same_as}'s dtype" if isinstance(a.dtype, str) else _dtype_names(a.dtypes)) + (
            f" or {_dtype_names(a.dtypes)}" if a.same_as and a.dtypes else ""
        )
        shape = ", ".join("*" if d is None else str(d) for d in a.shape)
        what = {"out": "written (allocated when not given)", "inout": "updated in place"}
        layout = {"rows": "unit last stride", "contiguous": "contiguous", "strided": "any strides"}
        lines.append(
            f"- ``{n}`` ``[{shape}]``: {dtype}; {layout[a.layout]}"
            + (f"; {what[a.io]}" if a.io in what else "")
        )
    if outs:
        lines.append(f"\nReturns {', '.join(outs)}.")
    return "\n".join(lines)


def _per(size: int, by: Any) -> int:
    """``size // by`` for a positive int ``by``, else 0 (the op's checks then name ``by``)."""
    ok = isinstance(by, int) and not isinstance(by, bool) and by > 0
    return size // by if ok else 0


def _not_a_tensor(name: str, value: Any, pattern: str) -> None:
    what = "a 0-d tensor" if isinstance(value, torch.Tensor) else type(value).__name__
    raise TypeError(f"{name}: expected a torch.Tensor {pattern}, got {what}")


def _lead_mismatch(name: str, t: torch.Tensor, lead: Any, first: str) -> None:
    raise ValueError(
        f"{name}: expected leading dimensions {list(lead)} ({first}'s), got {list(t.shape)}"
    )


def _flat(t: Any, name: str, trailing: int, written: bool) -> Any:
    """A rows tensor as ``[rows, *its trailing dims]``: itself when it has that rank, a view when
    the op writes it (an error naming it when none exists: a copy would take the writes), else a
    reshape. Anything else is returned as it is, for the op's checks to name."""
    if not isinstance(t, torch.Tensor) or t.dim() == trailing + 1 or t.dim() < trailing:
        return t
    shape = (-1, *t.shape[t.dim() - trailing :])
    if 0 in shape[1:]:  # rows of no elements: how many is not in the shape; the checks name it
        return t
    if not written:
        return t.reshape(shape)
    try:
        return t.view(shape)
    except RuntimeError:
        raise ValueError(
            f"{name}: written in place, so its leading dimensions must collapse into rows of one "
            f"stride; got shape {list(t.shape)} with strides {list(t.stride())}"
        ) from None


def _pattern(shape: Sequence[Any], sizes: Mapping[str, int]) -> str:
    return (
        "["
        + ", ".join(
            str(sizes.get(d, d)) if isinstance(d, str) else "*" if d is None else str(d)
            for d in shape
        )
        + "]"
    )


def _check_tensor(
    name: str, spec: Tensor, t: torch.Tensor, sizes: dict, dtypes: dict, shape: tuple
) -> None:
    if t.dim() != len(shape):
        raise ValueError(
            f"{name}: expected {len(shape)}-D tensor of shape {_pattern(shape, sizes)}, "
            f"got {t.dim()}-D tensor"
        )
    for d, (want, got) in enumerate(zip(shape, t.shape, strict=True)):
        if isinstance(want, str):
            bound = sizes.setdefault(want, got)
            if bound != got:
                raise ValueError(
                    f"{name}: dimension {d} expected {bound} ({want}), got {got} "
                    f"(shape pattern {_pattern(shape, sizes)})"
                )
        elif want is not None and want != got:
            raise ValueError(
                f"{name}: dimension {d} expected {want}, got {got} "
                f"(shape pattern {_pattern(shape, sizes)})"
            )
    if spec.layout == "rows" and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name}: stride of dimension {t.dim() - 1} expected 1, got {t.stride(-1)}"
        )
    if spec.layout == "contiguous" and not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")
    if spec.same_as is not None:
        want = dtypes[spec.same_as]
        if t.dtype != want and t.dtype not in spec.dtypes:
            alternatives = f" or one of {{{_dtype_names(spec.dtypes)}}}" if spec.dtypes else ""
            raise ValueError(
                f"{name}: dtype expected {_dtype_names([want])} (same as the tensors before it)"
                f"{alternatives}, got {_dtype_names([t.dtype])}"
            )
    elif t.dtype not in spec.dtype:
        raise ValueError(
            f"{name}: dtype expected one of {{{_dtype_names(spec.dtype)}}}, got {_dtype_names([t.dtype])}"
        )
    dtypes[name] = t.dtype
    if spec.written and may_overlap(t):
        raise ValueError(
            f"{name}: sgljit writes it, but its elements may share memory (shape "
            f"{list(t.shape)}, strides {list(t.stride())}: an expanded or otherwise "
            "self-overlapping view); pass a tensor whose elements are distinct"
        )


def as_rows(t: Any, name: str, written: bool = False) -> Any:
    """``t`` as ``[rows, t.shape[-1]]`` for an op over rows: itself when 2-D; else a view when the
    op writes it (an error naming it when no view exists: a copy would take the writes), or a
    reshape. Anything that is not a tensor of at least one dimension, or whose last dimension is
    empty, is returned as it is, for the op's checks to name.

    >>> as_rows(torch.zeros(2, 3, 4), "x").shape
    torch.Size([6, 4])
    """
    try:
        rank = t.dim()
    except AttributeError:
        return t
    if rank == 2 or rank == 0 or not isinstance(t, torch.Tensor):
        return t
    if t.shape[-1] == 0:  # rows of no elements: how many is not in the shape; the checks name it
        return t
    if not written:
        return t.reshape(-1, t.shape[-1])
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        raise ValueError(
            f"{name}: written in place, so its leading dimensions must collapse into rows of one "
            f"stride; got shape {list(t.shape)} with strides {list(t.stride())}"
        ) from None


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes [begin, end) t's elements lie in; (0, 0) without elements."""
    if not t.numel():
        return 0, 0
    begin = t.data_ptr()
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    return begin, begin + (last + 1) * t.element_size()


def _byte_dims(t: torch.Tensor) -> list[tuple[int, int]]:
    """The dimensions along which t's elements move, as (stride, size) in bytes, outermost first."""
    item = t.element_size()
    dims = [(st * item, n) for n, st in zip(t.shape, t.stride(), strict=True) if n > 1 and st]
    if len(dims) > 1:
        dims.sort(reverse=True)
    return dims


def _may_meet(oa: int, a: list, ea: int, ob: int, b: list, eb: int) -> bool:
    """Whether elements of a (dimensions ``a``, elements of ``ea`` bytes, the first at byte ``oa``)
    and of b may share a byte (sgljit/tensor.h's detail::may_meet, the same rule)."""
    fa = ea + sum((n - 1) * s for s, n in a)
    fb = eb + sum((n - 1) * s for s, n in b)
    if oa + fa <= ob or ob + fb <= oa:
        return False
    if not a or not b or a[0][0] != b[0][0]:
        return True
    (s, na), (_, nb) = a[0], b[0]
    ia, ib = fa - (na - 1) * s, fb - (nb - 1) * s  # the footprint of one step
    if ia > s or ib > s:
        return True
    gap = ob - oa  # b's step j can meet a's step i only where -ib < gap + (j - i) * s < ia
    lo = max(-(na - 1), (-ib - gap) // s + 1)
    hi = min(nb - 1, -((gap - ia) // s) - 1)
    return any(_may_meet(0, a[1:], ea, gap + k * s, b[1:], eb) for k in range(lo, hi + 1))


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors may have bytes of an element in common (sgljit/tensor.h's
    ``shares_memory``, the same rule): False where their byte ranges do not meet, or where, step by
    common outermost stride, each one's elements sit in the gaps between the other's (column slices
    of one buffer, heads of one qkv buffer); True otherwise. False is always right.

    >>> buf = torch.zeros(4, 12)
    >>> shares_memory(buf[:, :4], buf[:, 4:]), shares_memory(buf[1:], buf[:-1])
    (False, True)
    """
    if a.numel() == 0 or b.numel() == 0:
        return False
    return _may_meet(
        a.data_ptr(), _byte_dims(a), a.element_size(), b.data_ptr(), _byte_dims(b), b.element_size()
    )


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.data_ptr() == b.data_ptr()
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


def _unshared_pair(args: Mapping[str, Any], first: tuple[int, str], second: tuple[int, str]):
    """One entry of Op._unshared: the error names the later tensor where it is written, else the
    earlier one."""
    (i, a), (j, b) = first, second
    name, other = (b, a) if args[b].written else (a, b)
    alias = args[a].alias == b or args[b].alias == a
    return (i, j), name, other, args[other].written, alias


def _shared_message(name: str, other: str, other_written: bool) -> str:
    use = "also writes" if other_written else "reads"
    return f"{name}: shares memory with {other}, which sgljit {use}; pass a tensor of its own"


def may_overlap(t: torch.Tensor) -> bool:
    """False when the strides prove every element has its own address: sorted by stride, each
    dimension steps past everything the smaller ones span (true of every strided slice of a dense
    tensor). True for expanded views (stride 0), and for the rare interleaved layouts this cannot
    prove apart.

    >>> may_overlap(torch.zeros(1, 8).expand(4, 8)), may_overlap(torch.zeros(4, 16)[:, 4:12])
    (True, False)
    """
    if t.is_contiguous():
        return False
    span = 1
    for stride, size in sorted(
        (st, sz) for st, sz in zip(t.stride(), t.shape, strict=True) if sz > 1
    ):
        if stride < span:
            return True
        span = stride * (size - 1) + span
    return False


class Family:
    """The ops of one plugin; their kernel files are found relative to ``file``'s folder."""

    def __init__(self, name: str, file: str | Path):
        self.name = name
        self.root = Path(file).resolve().parent
        caller = inspect.currentframe().f_back  # type: ignore[union-attr]
        self.module = caller.f_globals.get("__name__", name)  # public functions' __module__
        self.ops: dict[str, Op] = {}
        # Loaded modules; sgljit.clear_module_cache() forgets them (the disk cache keeps them).
        self._modules: dict = forget_on_clear({})
        self._lock = threading.Lock()

    def op(self, name: str, **spec: Any) -> Op:
        """Declare an op (arguments: see :class:`Op`)."""
        if name in self.ops:
            raise ValueError(f"family {self.name!r} declares op {name!r} twice")
        op = self.ops[name] = Op(self, name, **spec)
        return op

    def _members(self, backend: str, module: str) -> list[Op]:
        return [
            op
            for op in self.ops.values()
            if getattr(op, backend) is not None
            and (getattr(op, backend).module or op.name) == module
        ]

    def cuda_module(self, module: str, key: Mapping[str, Any]):
        """The compiled CUDA module ``module`` for template parameters ``key`` (memoized)."""
        from .cuda import load_jit

        frozen = ("cuda", module, _freeze(key))
        found = self._modules.get(frozen)
        if found is not None:
            return found
        with self._lock:
            if frozen in self._modules:
                return self._modules[frozen]
            values = {k: _cpp_literal(v) for k, v in key.items()}
            members = self._members("cuda", module)
            files = sorted({op.cuda.file for op in members})
            checks, wrappers = [], []
            for op in members:
                function = f"sgljit_checked_{op.name}"
                try:
                    symbol = op.cuda.symbol.format(**values)
                except (KeyError, IndexError) as err:
                    raise ValueError(
                        f"op {op.name!r}: Cuda symbol {op.cuda.symbol!r} has the placeholder "
                        f"{err}, which is not one of its template parameters {sorted(values)}"
                    ) from None
                checks.append(op.cpp_checks(function, symbol))
                wrappers.append((op.name, function))
            found = load_jit(
                self.name,
                module,
                *values.values(),
                cuda_files=files,
                cuda_wrappers=wrappers,
                source_dir=self.root,
                extra_source="\n".join(checks),
            )
            self._modules[frozen] = found
            return found

    def sycl_module(self, module: str, key: Mapping[str, Any]):
        """The SYCL module ``module`` built with ``-D`` macros ``key`` (memoized)."""
        from .sycl import load_jit_sycl

        if not isinstance(key, Mapping):
            raise TypeError(
                f"{self.name}: the Sycl key of module {module!r} returned a "
                f"{type(key).__name__}; it returns a dict of the -D macros (name -> value)"
            )
        frozen = ("sycl", module, _freeze(key))
        found = self._modules.get(frozen)
        if found is None:
            values = {k: _cpp_literal(v) for k, v in key.items()}
            files = sorted({self.root / op.sycl.file for op in self._members("sycl", module)})
            found = self._modules[frozen] = load_jit_sycl(
                self.name,
                module,
                *values.values(),
                sycl_files=files,
                extra_sycl_cflags=[f"-D{k}={v}" for k, v in values.items()],
            )
        return found

    # -- fleet and checks ------------------------------------------------------------------------
    def prebuild_specs(self, backend: str, *, cases: bool = False) -> list[dict]:
        """Every specialization the ops declare for ``backend``, one per module (``sgljit build``):
        ``{"op": name, **key}`` with dtypes by name. ``cases``: also the modules the ops' check
        cases need (what the conformance suite and ``sgljit check`` run; ``sgljit build --cases``),
        their keys computed from the cases' arguments made on the CPU."""
        if backend not in ("cuda", "sycl"):
            raise ValueError(f"prebuild_specs: backend must be 'cuda' or 'sycl', got {backend!r}")
        specs, seen = [], set()

        def add(op: Op, key: Mapping[str, Any]) -> None:
            kernel = getattr(op, backend)
            module = (kernel.module or op.name) if kernel else op.name
            ident = (module, tuple((k, _cpp_literal(v)) for k, v in key.items()))
            if ident not in seen:
                seen.add(ident)
                specs.append({"op": op.name, **{k: _plain(v) for k, v in key.items()}})

        for op in self.ops.values():
            for key in op.prebuild.get(backend, ()):
                add(op, key)
        if cases:
            for op in self.ops.values():
                for key in _case_keys(op, backend):
                    add(op, key)
        return specs

    def prebuild(self, backend: str, op: str, **key: Any):
        """Build (or load from the cache) one :meth:`prebuild_specs` entry; returns the module."""
        if op not in self.ops:
            raise ValueError(f"prebuild: unknown op {op!r}; expected one of {sorted(self.ops)}")
        kernel = getattr(self.ops[op], backend, None)
        if kernel is None:
            raise ValueError(f"prebuild: op {op!r} has no {backend!r} kernel")
        key = {k: _typed(v) for k, v in key.items()}
        if backend == "cuda":
            return self.cuda_module(kernel.module or op, key)
        return self.sycl_module(kernel.module or op, key)

    def check_cases(self, device: torch.device) -> list[dict]:
        """``sgljit check`` rows: every op's cases against the float64 reference."""
        from .testing import run_case

        return [
            {
                "op": op.name,
                "shape": case.name,
                "run": lambda op=op, case=case: run_case(op, case, device),
                "tol": case.tol,
            }
            for op in self.ops.values()
            for case in op.cases
        ]


def _case_keys(op: Op, backend: str) -> list[Mapping[str, Any]]:
    """The module keys of ``op``'s check cases on ``backend`` (arguments made on the CPU: keys read
    dtypes and sizes). A case whose key cannot be computed there (an argument the key refuses) is
    left to build when it runs."""
    kernel = getattr(op, backend)
    if kernel is None:
        return []
    keys = []
    for case in op.cases:
        try:
            args = case.make(torch.device("cpu"))
            key = kernel.key(*args)
            keys.append(kernel.params_of(key) if backend == "cuda" else dict(key))
        except Exception:  # a case the key refuses builds (and fails) when it runs
            continue
    return keys


def _plain(value: Any) -> Any:
    """A prebuild value as JSON-friendly data (dtypes by name)."""
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value


def _typed(value: Any) -> Any:
    """The inverse of :func:`_plain` for dtype names."""
    if isinstance(value, str):
        try:
            return as_dtype(value)
        except TypeError:
            return value
    return value

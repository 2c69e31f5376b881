"""The conformance suite: what every op of every installed plugin must do, derived from its spec.

For each op (see :mod:`sgljit.op`) and each backend this machine can run:

- ``numerics``: every declared :class:`~sgljit.op.Case` on fresh random data, outputs and scratch
  space poisoned first, against the reference run on float64 copies of the inputs (scratch space
  is not compared);
- ``bad_inputs``: arguments generated from the declared argument specs — not a tensor (a list, a
  numpy array), a 0-d tensor, a 1-D empty tensor, an extra dimension, a dtype outside the allowed
  ones, a size that disagrees with another tensor's, a strided last dimension, an expanded
  (overlapping) written tensor, a written tensor sharing memory with another argument, a tensor
  that requires grad, a tensor on another device, a scalar out of range — each must raise an
  error that starts with the argument's name; an empty batch must run or raise such an error,
  never crash. The plugin's public function that calls the op (``sgljit.ops.<name>``, see
  :func:`public_function`) gets the first three in each tensor parameter, its other parameters
  bound by name from the op's first case: it must run or raise an error starting with that name;
- ``torch_compile``: ``torch.compile(fullgraph=True)`` of a call matches the eager result
  (reference and CUDA);
- ``cuda_graph``: a captured call replays on new data (CUDA).

A plugin's tests get all of it with one line::

    from sgljit.testing import conformance
    test_conformance = conformance("norm")      # plugin names; none: every installed plugin
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from .backend import use_backend
from .op import Case, Family, Op, Scalar, Tensor

__all__ = [
    "CHECKS",
    "available_backends",
    "bad_inputs",
    "conformance",
    "families",
    "max_error",
    "public_function",
    "run_case",
    "run_check",
    "synchronize",
]

CHECKS = ("numerics", "bad_inputs", "torch_compile", "cuda_graph")
# Which checks run on which backend: compiling through the SYCL CPU device adds minutes and proves
# nothing the reference's compile does not; graphs exist on CUDA only.
_BACKEND_CHECKS = {
    "reference": ("numerics", "bad_inputs", "torch_compile"),
    "sycl": ("numerics", "bad_inputs"),
    "cuda": CHECKS,
}
_ONE_BYTE_POISON = 0x7F  # NaN in float8_e4m3fn, a large value in int8/uint8


# -- backends and ops ----------------------------------------------------------------------------
def _sycl_on_cpu() -> str | None:
    """None when the SYCL CPU device can build kernels, else why not."""
    try:
        from . import sycl

        sycl.find_runtime()
    except Exception as err:
        return f"SYCL runtime not installed ({type(err).__name__})"
    return None


def available_backends() -> list[tuple[str, torch.device]]:
    """(backend, device) pairs this machine runs: reference on the CPU, SYCL on the SYCL CPU
    device when its runtime is installed (or on an XPU), CUDA on a GPU."""
    found = [("reference", torch.device("cpu"))]
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        found.append(("sycl", torch.device("xpu")))
    elif _sycl_on_cpu() is None:
        found.append(("sycl", torch.device("cpu")))
    if torch.cuda.is_available():
        found.append(("cuda", torch.device("cuda")))
    return found


def families(plugins: Iterable[str] | None = None) -> list[Family]:
    """The :class:`~sgljit.op.Family` of each installed plugin (or of the named ones)."""
    from .plugins import discover, load_target

    wanted = set(plugins) if plugins is not None else None
    found = []
    for plugin in discover():
        if wanted is not None and plugin.name not in wanted:
            continue
        if plugin.error is not None:
            if wanted is not None:  # asked for by name: say why it cannot be checked
                raise LookupError(f"plugin {plugin.distribution} ({plugin.name}): {plugin.error}")
            continue  # sgljit info and sgljit check report it
        target = plugin.manifest.get("family")
        if target:
            family = load_target(target)
            if family.name != plugin.name:
                raise LookupError(
                    f"plugin {plugin.distribution}: its manifest is named {plugin.name!r} but its "
                    f"family ({target}) {family.name!r}; give both the same name"
                )
            found.append(family)
    missing = (wanted or set()) - {f.name for f in found}
    if missing:
        raise LookupError(f"no installed plugin declares a family named {sorted(missing)}")
    return found


# -- numerics ------------------------------------------------------------------------------------
def max_error(result: Any, expected: Any) -> float:
    """``max |result - expected| / (1 + |expected|)`` over tensors (or sequences of them): absolute
    near zero, relative for large values; NaN where one side has NaNs the other has not."""
    if isinstance(result, (tuple, list)):
        return max((max_error(r, e) for r, e in zip(result, expected, strict=True)), default=0.0)
    r, e = result.detach().double().cpu(), expected.detach().double().cpu()
    if r.shape != e.shape:
        return float("inf")
    if r.numel() == 0:
        return 0.0
    if not torch.equal(torch.isnan(r), torch.isnan(e)):
        return float("nan")
    return float(((r - e).abs() / (1 + e.abs())).nan_to_num(0.0).max())


def _oracle_copy(value: Any) -> Any:
    """A CPU copy for the reference: 16/32-bit floats as float64, everything else as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    copy = value.detach().cpu().clone()
    return copy.double() if copy.dtype in (torch.float16, torch.bfloat16, torch.float32) else copy


def _poison(t: torch.Tensor) -> None:
    """Fill an output with values no op writes, so unwritten elements show up as errors."""
    if t.element_size() == 1:
        t.view(torch.uint8).fill_(_ONE_BYTE_POISON)
    elif t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(-1)


def _written(op: Op, args: Sequence[Any]) -> tuple:
    """The tensors a call produces (out and inout; not scratch space, whose contents mean nothing)."""
    return tuple(args[op.params.index(name)] for name in op.results)


def run_case(op: Op, case: Case, device: torch.device) -> tuple[tuple, tuple]:
    """Run ``op`` (through whatever backend is selected) on ``case``'s fresh arguments, outputs
    and scratch space poisoned first; returns (written tensors, the same written by the reference on
    float64 copies)."""
    args = case.make(device)
    if not isinstance(args, tuple) or len(args) != len(op.params):
        raise AssertionError(
            f"{op.name} case {case.name!r}: make() returned {type(args).__name__} of "
            f"{len(args) if isinstance(args, (tuple, list)) else '?'} values; expected a tuple of "
            f"{len(op.params)}, one per argument ({', '.join(op.params)})"
        )
    oracle = tuple(_oracle_copy(a) for a in args)
    for name, value, copy in zip(op.params, args, oracle, strict=True):
        spec = op.args[name]
        if isinstance(spec, Tensor) and spec.io in ("out", "scratch"):
            _poison(value)
            _poison(copy)
    with torch.no_grad():
        op(*args)
        op.reference(*oracle)
    for name in op.results:
        copy = oracle[op.params.index(name)]
        if op.args[name].io == "out" and copy.numel() and _still_poisoned(copy):
            raise AssertionError(
                f"{op.name} case {case.name!r}: the reference left {name} unwritten (it must "
                f"write into the tensor it is given, e.g. {name}.copy_(...), not rebind the name)"
            )
    return _written(op, args), _written(op, oracle)


def _still_poisoned(t: torch.Tensor) -> bool:
    """Whether every element of t still holds _poison's value."""
    if t.element_size() == 1:
        return bool((t.view(torch.uint8) == _ONE_BYTE_POISON).all())
    if t.is_floating_point():
        return bool(t.isnan().all())
    return bool((t == -1).all())


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA, XPU; a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def check_numerics(op: Op, backend: str, device: torch.device) -> None:
    if not op.cases:
        raise AssertionError(f"{op.name} declares no check cases")
    with use_backend(backend):
        for case in op.cases:
            result, expected = run_case(op, case, device)
            synchronize(device)
            error = max_error(result, expected)
            assert error <= case.tol, (
                f"{op.name} {case.name} on {backend}: error {error} > {case.tol}"
            )


# -- bad inputs ----------------------------------------------------------------------------------
_OTHER_DTYPES = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.uint8,
)


def _wrong_dtype(spec: Tensor, actual: torch.dtype, same_as: torch.dtype | None) -> torch.dtype:
    """A dtype ``spec`` refuses; ``same_as``: the dtype of the tensor it names (if it names one)."""
    allowed = (*spec.dtypes, actual, same_as) if spec.same_as is not None else spec.dtypes
    return next(d for d in _OTHER_DTYPES if d not in allowed)


def _blank(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.zeros(tuple(shape), dtype=dtype, device=device)


def bad_inputs(op: Op, device: torch.device, backend: str) -> list[tuple[str, tuple, str]]:
    """(what is wrong, arguments, the argument's name) for every bad input the spec implies,
    each built from the op's first case."""
    base = op.cases[0].make(device)
    found: list[tuple[str, tuple, str]] = []
    bound: set[str] = set()

    def replaced(i: int, value: Any) -> tuple:
        return (*base[:i], value, *base[i + 1 :])

    for i, name in enumerate(op.params):
        spec, t = op.args[name], base[i]
        if isinstance(spec, Scalar):
            if spec.min is not None:
                below = spec.min - 1
                if not below < spec.min:  # a float minimum too large for 1 to change it
                    below = -math.inf
                found.append((f"{name} below its minimum", replaced(i, below), name))
            if spec.max is not None:
                above = spec.max + 1
                if not above > spec.max:
                    above = math.inf
                found.append((f"{name} above its maximum", replaced(i, above), name))
            if spec.type is bool:
                found.append((f"{name} an int, not a bool", replaced(i, 1), name))
            found.append((f"{name} not a number", replaced(i, "1"), name))
            continue
        found.append((f"{name} not a tensor", replaced(i, t.tolist()), name))
        found.append((f"{name} a numpy array", replaced(i, _numpy(t)), name))
        found.append((f"{name} a 0-d tensor", replaced(i, _blank((), t.dtype, device)), name))
        if _refuses_empty(spec, bound):
            found.append(
                (f"{name} a 1-D empty tensor", replaced(i, _blank((0,), t.dtype, device)), name)
            )
        found.append((f"{name} with an extra dimension", replaced(i, t.unsqueeze(0)), name))
        named = base[op.params.index(spec.same_as)].dtype if spec.same_as else None
        wrong = _wrong_dtype(spec, t.dtype, named)
        found.append(
            (f"{name} of dtype {wrong}", replaced(i, _blank(t.shape, wrong, device)), name)
        )
        for d, size in enumerate(spec.shape):
            if isinstance(size, str) and size in bound:
                shape = list(t.shape)
                shape[d] += 1
                found.append(
                    (
                        f"{name} disagreeing on {size}",
                        replaced(i, _blank(shape, t.dtype, device)),
                        name,
                    )
                )
        bound.update(s for s in spec.shape if isinstance(s, str))
        if spec.layout != "strided" and t.shape[-1] > 1:
            wide = _blank((*t.shape[:-1], 2 * t.shape[-1]), t.dtype, device)[..., ::2]
            found.append((f"{name} with a strided last dimension", replaced(i, wide), name))
        if spec.written:
            d = next((d for d, n in enumerate(t.shape) if n > 1), None)
            if d is not None:
                found.append(
                    (f"{name} expanded", replaced(i, t.narrow(d, 0, 1).expand(t.shape)), name)
                )
        if backend != "reference" and t.is_floating_point() and not spec.written:
            found.append(
                (f"{name} requiring grad", replaced(i, t.detach().clone().requires_grad_()), name)
            )
        if device.type == "cuda":
            found.append((f"{name} on the CPU", replaced(i, t.cpu()), name))
    found += _sharing_memory(op, base)
    return found


def _numpy(t: torch.Tensor) -> Any:
    """A numpy array like ``t`` (float32 where numpy has no such dtype): a shape and a dtype, not
    a tensor."""
    return t.detach().cpu().float().numpy() if t.is_floating_point() else t.detach().cpu().numpy()


def _refuses_empty(spec: Tensor, bound: set[str]) -> bool:
    """Whether a 1-D tensor of no elements does not fit ``spec``: of another rank, or of a size an
    earlier tensor set (``bound``) or the spec fixes. (One that sets its own size is an empty
    batch.)"""
    if len(spec.shape) != 1:
        return True
    size = spec.shape[0]
    return size in bound if isinstance(size, str) else isinstance(size, int) and size != 0


def public_function(op: Op) -> tuple[str, Callable[..., Any]] | None:
    """(name, function) of the public function that calls ``op``: the ``sgljit.ops`` entry of the
    op's plugin named as the op, else the longest whose name and ``_`` begin the op's
    (``rmsnorm_quant_fp8`` for ``rmsnorm_quant_fp8_static``); None where no plugin declares one."""
    from .plugins import discover, load_target

    plugin = next((p for p in discover() if p.name == op.family.name and not p.error), None)
    ops = (plugin.manifest or {}).get("ops", {}) if plugin else {}
    names = [n for n in ops if n == op.name or op.name.startswith(n + "_")]
    if not names:
        return None
    name = max(names, key=len)
    return name, load_target(ops[name])


def _public_arguments(op: Op, name: str, fn: Callable[..., Any], base: tuple) -> tuple[dict, dict]:
    """(required, optional): ``fn``'s parameters bound by name to the op's arguments ``base`` (one
    named like a size of the op's tensors gets that size), those without a default and those with
    one; an AssertionError names a required one that cannot be bound."""
    values = dict(zip(op.params, base, strict=True))
    sizes: dict[str, int] = {}
    for arg, value in values.items():
        spec = op.args[arg]
        if isinstance(spec, Tensor):
            for size, got in zip(spec.shape, value.shape, strict=False):
                if isinstance(size, str):
                    sizes.setdefault(size, got)
    required, optional = {}, {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        known = p.name in values or p.name in sizes
        if p.default is inspect.Parameter.empty and not known:
            raise AssertionError(
                f"sgljit.ops.{name}: parameter {p.name!r} is none of {op.name}'s arguments or "
                "sizes, so the conformance suite cannot call it: name it like one, or give it a "
                "default"
            )
        if known:
            value = values[p.name] if p.name in values else sizes[p.name]
            (required if p.default is inspect.Parameter.empty else optional)[p.name] = value
    return required, optional


def _public_bad_inputs(op: Op, device: torch.device) -> list[tuple[str, Callable[[], Any], str]]:
    """(what, call, parameter) for the public function that calls ``op``: its required parameters
    from the op's first case, and each tensor parameter in turn a numpy array, a 0-d tensor and a
    1-D empty tensor."""
    found = public_function(op)
    if found is None:
        return []
    name, fn = found
    required, optional = _public_arguments(op, name, fn, op.cases[0].make(device))
    calls = []
    for param, value in {**required, **optional}.items():
        if not (isinstance(value, torch.Tensor) and isinstance(op.args.get(param), Tensor)):
            continue
        for what, bad in (
            ("a numpy array", _numpy(value)),
            ("a 0-d tensor", _blank((), value.dtype, device)),
            ("a 1-D empty tensor", _blank((0,), value.dtype, device)),
        ):
            args = {**required, param: bad}
            calls.append((f"sgljit.ops.{name} with {param} {what}", lambda a=args: fn(**a), param))
    return calls


def _over_bytes_of(like: torch.Tensor, source: torch.Tensor) -> torch.Tensor | None:
    """A contiguous tensor of like's shape and dtype over the bytes of source's storage from its
    first element on (None: too few, or not aligned for like's dtype)."""
    need, start = (
        like.numel() * like.element_size(),
        source.storage_offset() * source.element_size(),
    )
    storage = source.untyped_storage()
    if need == 0 or source.numel() == 0 or storage.nbytes() - start < need:
        return None
    if start % like.element_size():
        return None
    raw = torch.empty(0, dtype=torch.uint8, device=source.device).set_(storage, start, (need,))
    return raw.view(like.dtype).view(like.shape)


def _sharing_memory(op: Op, base: tuple) -> list[tuple[str, tuple, str]]:
    """For each written tensor, the first other tensor argument it can be made to share memory with
    (a view of one over the other's bytes; not its declared alias): the error names the later of
    the two where it is written, else the written one."""
    found = []
    for i, name in enumerate(op.params):
        spec = op.args[name]
        if not (isinstance(spec, Tensor) and spec.written):
            continue
        for j, other in enumerate(op.params):
            other_spec = op.args[other]
            if j == i or not isinstance(other_spec, Tensor) or other in (spec.alias, name):
                continue
            if other_spec.alias == name:
                continue
            args = list(base)
            view = _over_bytes_of(base[i], base[j])
            if view is not None:
                args[i] = view
            else:
                view = _over_bytes_of(base[j], base[i])
                if view is None:
                    continue
                args[j] = view
            later = op.params[max(i, j)]
            named = later if op.args[later].written else name
            found.append((f"{name} sharing memory with {other}", tuple(args), named))
            break
    return found


def _empty_batch(op: Op, device: torch.device) -> tuple:
    """The first case's arguments with the batch made empty: the leading dimension of the first
    tensor the op writes (its tokens; not a table's rows), in every tensor that shares its name."""
    base = op.cases[0].make(device)
    first = op.args[op.writes[0]]
    symbol = first.shape[0] if isinstance(first.shape[0], str) else None
    out = []
    for name, value in zip(op.params, base, strict=True):
        spec = op.args[name]
        if symbol is not None and isinstance(spec, Tensor):
            for d, size in enumerate(spec.shape):
                if size == symbol:
                    value = value.narrow(d, 0, 0)
        out.append(value)
    return tuple(out)


def check_bad_inputs(op: Op, backend: str, device: torch.device) -> None:
    if not op.cases:
        raise AssertionError(f"{op.name} declares no check cases (bad inputs are made from one)")
    with use_backend(backend), torch.enable_grad():
        with torch.no_grad():  # compile and load the valid specialization first
            op(*op.cases[0].make(device))
        for what, args, name in bad_inputs(op, device, backend):
            try:
                op(*args)
            except (TypeError, ValueError, RuntimeError) as err:
                message = str(err)
                assert message.startswith(f"{name}:"), (
                    f"{op.name} on {backend}, {what}: the error does not start with '{name}:': "
                    f"{type(err).__name__}: {message[:300]}"
                )
            else:
                raise AssertionError(f"{op.name} on {backend}: {what} was accepted")
        for what, call, name in _public_bad_inputs(op, device):
            try:  # running is fine (the public function may take it); a foreign error is not
                with torch.no_grad():
                    call()
            except (TypeError, ValueError, RuntimeError) as err:
                assert str(err).startswith(f"{name}:"), (
                    f"{what} on {backend}: the error does not start with '{name}:': "
                    f"{type(err).__name__}: {str(err)[:300]}"
                )
        try:
            with torch.no_grad():
                op(*_empty_batch(op, device))
            synchronize(device)
        except (TypeError, ValueError) as err:
            named = any(str(err).startswith(f"{p}:") for p in op.params)
            assert named, f"{op.name}: an empty batch raised an error naming no argument: {err}"


# -- torch.compile and CUDA graphs ---------------------------------------------------------------
def _clone(args: Sequence[Any]) -> tuple:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def check_torch_compile(op: Op, backend: str, device: torch.device) -> None:
    if not op.cases:
        raise AssertionError(f"{op.name} declares no check cases")
    case = op.cases[0]
    args = case.make(device)
    eager, compiled_args = _clone(args), _clone(args)

    def call(*a):
        op(*a)

    with use_backend(backend), torch.no_grad():
        op(*eager)
        torch.compile(call, fullgraph=True, dynamic=False)(*compiled_args)
        synchronize(device)
    error = max_error(_written(op, compiled_args), _written(op, eager))
    assert error == 0.0, f"{op.name}: torch.compile result differs from eager by {error}"


def check_cuda_graph(op: Op, backend: str, device: torch.device) -> None:
    if not op.cases:
        raise AssertionError(f"{op.name} declares no check cases")
    case = op.cases[0]
    args = case.make(device)
    with torch.no_grad():
        op(*_clone(args))  # load the module outside capture
        torch.cuda.synchronize()
        static = _clone(args)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            op(*static)
        fresh = case.make(device)
        for s, f in zip(static, fresh, strict=True):
            if isinstance(s, torch.Tensor):
                s.copy_(f)
        graph.replay()
        expected = _clone(fresh)
        op(*expected)
        torch.cuda.synchronize()
    error = max_error(_written(op, static), _written(op, expected))
    assert error == 0.0, f"{op.name}: a graph replay differs from an eager call by {error}"


_RUNNERS: dict[str, Callable[[Op, str, torch.device], None]] = {
    "numerics": check_numerics,
    "bad_inputs": check_bad_inputs,
    "torch_compile": check_torch_compile,
    "cuda_graph": check_cuda_graph,
}


def run_check(op: Op, backend: str, check: str, device: torch.device | None = None) -> None:
    """Run one conformance check of ``op`` on ``backend``; raises AssertionError on a failure."""
    if device is None:
        device = dict(available_backends())[backend]
    _RUNNERS[check](op, backend, device)


def conformance(*plugins: str) -> Any:
    """A pytest test function running every check of every op of ``plugins`` (all installed
    plugins when none are named) on every backend this machine has."""
    import pytest

    marks = {"sycl": [pytest.mark.sycl], "cuda": [pytest.mark.gpu]}
    params = [
        pytest.param(
            op,
            backend,
            device,
            check,
            id=f"{op.name}-{backend}-{check}",
            marks=marks.get(backend, []),
        )
        for family in families(plugins or None)
        for op in family.ops.values()
        for backend, device in available_backends()
        for check in _BACKEND_CHECKS[backend]
        if backend == "reference" or getattr(op, backend) is not None
    ]

    @pytest.mark.parametrize(("op", "backend", "device", "check"), params)
    def test_conformance(op: Op, backend: str, device: torch.device, check: str) -> None:
        with contextlib.suppress(AttributeError):
            torch._dynamo.reset()
        run_check(op, backend, check, device)

    return test_conformance

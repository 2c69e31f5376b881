"""The op spec (sgljit.op): what a declaration derives — dispatch, the custom op, argument checks in
Python and generated C++, prebuild entries and check cases."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import sgljit
from sgljit.op import Case, Cuda, Family, Scalar, Sycl, Tensor
from sgljit.testing import bad_inputs

from ..conftest import run_python

family = Family("test_op", __file__)
calls: list[str] = []


def _scaled_copy(input, out, factor):
    calls.append("reference")
    out.copy_(input * factor)


def _launch(module, key, input, out, factor):
    calls.append(f"sycl {key['SGLJIT_T']}")
    out.copy_(input * factor)


scaled_copy = family.op(
    "test_op_scaled_copy",
    args={
        "input": Tensor("rows", "width"),
        "out": Tensor("rows", "width", dtype="input", io="out"),
        "factor": Scalar(float, min=0.0),
    },
    reference=_scaled_copy,
    sycl=Sycl("scale.hpp", key=lambda input, *_: {"SGLJIT_T": input.dtype}, launch=_launch),
    prebuild={"sycl": [{"SGLJIT_T": torch.float32}, {"SGLJIT_T": torch.float16}]},
    cases=[
        Case("3x5 fp32", lambda dev: (torch.randn(3, 5, device=dev), torch.empty(3, 5), 2.0), 0)
    ],
)
family.sycl_module = lambda module, key: None  # no SYCL build: _launch stands in for the kernel


def test_eager_calls_dispatch_by_backend_without_the_custom_op():
    calls.clear()
    x, out = torch.randn(4, 3), torch.empty(4, 3)
    scaled_copy(x, out, 2.0)
    torch.testing.assert_close(out, x * 2)
    with sgljit.use_backend("sycl"):
        scaled_copy(x, out, factor=3.0)
    torch.testing.assert_close(out, x * 3)
    assert calls == ["reference", "sycl torch.float32"]
    assert hasattr(torch.ops.sgljit, "test_op_scaled_copy")
    assert (
        str(scaled_copy.signature)
        == "(input: torch.Tensor, out: torch.Tensor, factor: float) -> None"
    )


def test_compiles_fullgraph_through_the_custom_op():
    @torch.compile(fullgraph=True)
    def f(x):
        out = torch.empty_like(x)
        scaled_copy(x, out, 4.0)
        return out + 1

    x = torch.randn(2, 16)
    torch.testing.assert_close(f(x), x * 4 + 1)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (
            (torch.randn(4), torch.empty(4), 1.0),
            ValueError,
            r"^input: expected 2-D tensor of shape \[rows, width\], got 1-D",
        ),
        (
            (torch.randn(4, 3), torch.empty(4, 2), 1.0),
            ValueError,
            r"^out: dimension 1 expected 3 \(width\), got 2",
        ),
        (
            (torch.randn(4, 3), torch.empty(4, 3, dtype=torch.float64), 1.0),
            ValueError,
            r"^out: dtype expected float32 \(same as",
        ),
        (
            (torch.randn(4, 3).int(), torch.empty(4, 3), 1.0),
            ValueError,
            r"^input: dtype expected one of \{float16, bfloat16, float32\}, got int32",
        ),
        (
            (torch.randn(4, 6)[:, ::2], torch.empty(4, 3), 1.0),
            ValueError,
            r"^input: stride of dimension 1 expected 1, got 2",
        ),
        (
            (torch.randn(4, 3), torch.empty(1, 3).expand(4, 3), 1.0),
            ValueError,
            r"^out: sgljit writes it, but its elements may share memory",
        ),
        (
            (torch.randn(4, 3), torch.empty(4, 3), -1.0),
            ValueError,
            r"^factor: expected a value >= 0.0, got -1.0",
        ),
        (
            (torch.randn(4, 3), torch.empty(4, 3), "2"),
            TypeError,
            r"^factor: expected float, got str",
        ),
        (([1.0], torch.empty(4, 3), 1.0), TypeError, r"^input: expected a torch.Tensor, got list"),
        ((torch.randn(4, 3), None, 1.0), TypeError, r"^out: expected a torch.Tensor, got NoneType"),
    ],
)
@pytest.mark.parametrize("backend", ["reference", "sycl"])
def test_arguments_are_checked_naming_them(backend, args, error, message):
    with sgljit.use_backend(backend), pytest.raises(error, match=message):
        scaled_copy(*args)


def test_kernels_refuse_inputs_that_require_grad_and_the_reference_keeps_the_graph():
    x = torch.randn(2, 3, requires_grad=True)
    out = torch.empty(2, 3)
    with (
        sgljit.use_backend("sycl"),
        pytest.raises(RuntimeError, match=r"^input: requires grad.*inference-only on sycl"),
    ):
        scaled_copy(x, out, 1.0)
    with sgljit.use_backend("sycl"), torch.no_grad():
        scaled_copy(x, out, 1.0)
    scaled_copy(x, out, 1.0)
    assert out.grad_fn is not None


def test_generated_cpp_checks_mirror_the_spec():
    code = scaled_copy.cpp_checks("checked", "Kernel<4>::run")
    assert 'SymbolicSize size_rows{"rows"}, size_width{"width"};' in code
    assert (
        "TensorMatcher({size_rows, size_width}).with_strides({kAnySize, 1})"
        '.with_dtype<fp16_t, bf16_t, fp32_t>(dtype_input).with_device(kDLCUDA, device).verify(input, "input");'
    ) in code
    assert '.with_dtype(dtype_input).with_device(device).writable().verify(out, "out");' in code
    assert 'RuntimeCheck(factor >= 0.0, "factor: expected a value >= 0.0, got ", factor);' in code
    assert code.rstrip().endswith("Kernel<4>::run(input, out, factor);\n}")


# An op whose weight has the input's dtype or float32, and a second weight of the first's dtype.
scaled_by = family.op(
    "test_op_scaled_by",
    args={
        "input": Tensor("rows", "width"),
        "weight": Tensor("width", dtype=("input", torch.float32)),
        "weight2": Tensor("width", dtype="weight"),
        "out": Tensor("rows", "width", dtype="input", io="out"),
    },
    reference=lambda input, weight, weight2, out: out.copy_(input * weight * weight2),
    cases=[
        Case(
            "3x5 bf16, float32 weights",
            lambda dev: (
                torch.randn(3, 5, device=dev, dtype=torch.bfloat16),
                torch.randn(5, device=dev),
                torch.randn(5, device=dev),
                torch.empty(3, 5, device=dev, dtype=torch.bfloat16),
            ),
            2e-2,
        )
    ],
)


def test_a_dtype_may_be_another_tensors_or_one_listed():
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    x, out = torch.randn(3, 5, dtype=bf16), torch.empty(3, 5, dtype=bf16)
    for wdt in (bf16, fp32):  # the input's dtype or float32
        w = torch.randn(5, dtype=wdt)
        scaled_by(x, w, w, out)
        torch.testing.assert_close(out, (x * w * w).to(bf16))
    with pytest.raises(
        ValueError,
        match=r"^weight: dtype expected bfloat16 \(same as the tensors before it\) or one of "
        r"\{float32\}, got float16$",
    ):
        scaled_by(x, torch.randn(5, dtype=fp16), torch.randn(5, dtype=fp16), out)
    with pytest.raises(ValueError, match=r"^weight2: dtype expected float32 \(same as"):
        scaled_by(x, torch.randn(5), torch.randn(5, dtype=bf16), out)
    assert scaled_by.args["weight"].same_as == "input"
    assert scaled_by.args["weight"].dtypes == (fp32,)
    assert scaled_by.args["weight2"].same_as == "weight" and scaled_by.args["weight2"].dtypes == ()
    code = scaled_by.cpp_checks("checked", "Kernel::run")
    assert (
        "  SymbolicDType dtype_weight;\n  TensorMatcher({size_width}).with_strides({1})"
        ".with_dtype_or<fp32_t>(dtype_input, dtype_weight).with_device(device)"
        '.verify(weight, "weight");'
    ) in code
    assert '.with_dtype(dtype_weight).with_device(device).verify(weight2, "weight2");' in code
    wrong = {what for what, _, _ in bad_inputs(scaled_by, torch.device("cpu"), "reference")}
    # weight: neither the input's dtype (bfloat16) nor float32; weight2: not weight's (float32)
    assert {"weight of dtype torch.float16", "weight2 of dtype torch.float16"} <= wrong
    with pytest.raises(ValueError, match="names at most one tensor"):
        Tensor(4, dtype=("input", "weight"))


def test_bad_inputs_are_generated_from_the_spec():
    found = {what: name for what, _, name in bad_inputs(scaled_copy, torch.device("cpu"), "sycl")}
    assert found == {
        "input not a tensor": "input",
        "input a numpy array": "input",
        "input a 0-d tensor": "input",
        "input a 1-D empty tensor": "input",
        "input with an extra dimension": "input",
        "input of dtype torch.float64": "input",
        "input with a strided last dimension": "input",
        "input requiring grad": "input",
        "out not a tensor": "out",
        "out a numpy array": "out",
        "out a 0-d tensor": "out",
        "out a 1-D empty tensor": "out",
        "out with an extra dimension": "out",
        "out of dtype torch.float16": "out",
        "out disagreeing on rows": "out",
        "out disagreeing on width": "out",
        "out with a strided last dimension": "out",
        "out expanded": "out",
        "out sharing memory with input": "out",
        "factor below its minimum": "factor",
        "factor not a number": "factor",
    }


def test_prebuild_specs_are_one_per_module_with_dtypes_by_name():
    assert family.prebuild_specs("sycl") == [
        {"op": "test_op_scaled_copy", "SGLJIT_T": "float32"},
        {"op": "test_op_scaled_copy", "SGLJIT_T": "float16"},
    ]
    assert family.prebuild_specs("cuda") == []
    with pytest.raises(ValueError, match="has no 'cuda' kernel"):
        family.prebuild("cuda", "test_op_scaled_copy", SGLJIT_T="float32")


def test_declarations_are_checked():
    with pytest.raises(ValueError, match=r"\[.mode.\] are reserved \(by torch.compile"):
        family.op("test_op_reserved", args={"x": Tensor(4), "mode": Scalar(int)}, reference=print)
    with pytest.raises(ValueError, match="the first argument must be a tensor"):
        family.op("test_op_scalar_first", args={"n": Scalar(int), "x": Tensor(4)}, reference=print)
    with pytest.raises(ValueError, match="y's dtype refers to 'z', not an earlier tensor"):
        family.op(
            "test_op_dtype_ref",
            args={"x": Tensor(4), "y": Tensor(4, dtype="z"), "z": Tensor(4)},
            reference=print,
        )
    with pytest.raises(ValueError, match="y's dtype refers to 'w', not an earlier tensor"):
        family.op(
            "test_op_dtype_bad_ref",
            args={"x": Tensor(4), "y": Tensor(4, dtype=("w", torch.float32))},
            reference=print,
        )
    with pytest.raises(ValueError, match="declares op 'test_op_scaled_copy' twice"):
        family.op("test_op_scaled_copy", args={"x": Tensor(4, io="out")}, reference=print)
    with pytest.raises(ValueError, match="family 'test_op' declared it already"):
        Family("test_op_other", __file__).op(
            "test_op_scaled_copy", args={"x": Tensor(4, io="out")}, reference=print
        )


def test_mistakes_in_a_declaration_are_named_when_it_is_made():
    """What a plugin author gets wrong is refused at the declaration, naming the op and the fix,
    not later inside a build, a compile or the conformance suite."""
    out = {"x": Tensor(4), "y": Tensor(4, dtype="x", io="out")}

    def len2(device):
        return (torch.zeros(4, device=device), torch.zeros(4, device=device))

    cases = [
        (ValueError, "no argument is written", {"args": {"x": Tensor(4), "y": Tensor(4)}}),
        (ValueError, "prebuild has key 'SYCL'", {"args": out, "prebuild": {"SYCL": []}}),
        (TypeError, r"prebuild\['sycl'\] must be a list of dicts", {"args": out, "prebuild": {"sycl": {"A": 1}}}),
        (TypeError, "cases holds a function; each is a sgljit.op.Case", {"args": out, "cases": [len2]}),
    ]  # fmt: skip
    for i, (error, message, spec) in enumerate(cases):
        with pytest.raises(error, match=rf"^op 'test_op_mistake{i}': {message}"):
            family.op(f"test_op_mistake{i}", reference=print, **spec)
    assert Tensor(4, dtype=torch.float32).dtype == (torch.float32,)  # one dtype: a tuple of one
    with pytest.raises(TypeError, match="each dimension is a name, an int or None"):
        Tensor(("n", "h"))
    with pytest.raises(TypeError, match="type must be bool, int or float"):
        Scalar("float")
    with pytest.raises(ValueError, match="min 2 exceeds max 1"):
        Scalar(float, min=2, max=1)


def test_the_backend_variable_is_read_once_at_import():
    result = run_python(
        """
        import os, torch, sgljit
        print(sgljit.select_backend(torch.zeros(1)))
        os.environ["SGLJIT_BACKEND"] = "reference"
        print(sgljit.select_backend(torch.zeros(1)))
        with sgljit.use_backend("reference"):
            print(sgljit.select_backend(torch.zeros(1)))
        """,
        env={"SGLJIT_BACKEND": "sycl"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["sycl", "sycl", "reference"]
    bad = run_python("import sgljit", env={"SGLJIT_BACKEND": "tpu"})  # refused at import
    assert "SGLJIT_BACKEND='tpu': expected one of cuda, sycl (or xpu), reference" in bad.stderr
    forced = run_python(
        "import torch, sgljit; sgljit.select_backend(torch.zeros(1))",
        env={"SGLJIT_BACKEND": "cuda"},
    )
    assert "backend 'cuda' was forced (by $SGLJIT_BACKEND) but the tensors are on cpu" in (
        forced.stderr
    )


def test_cuda_dispatch_memoizes_per_specialization_and_checks_before_compiling(monkeypatch):
    """The CUDA path without a GPU: the module loader and backend choice are stand-ins."""
    built, ran = [], []
    fam = Family("test_op_cuda", __file__)

    def tvm_function(input, out, factor, exact):  # what tvm-ffi would call: refuses a str factor
        if not isinstance(factor, float):
            raise TypeError("Mismatched type on argument #2")
        ran.append(tuple(input.shape))

    op = fam.op(
        "test_op_cuda_copy",
        args={
            "input": Tensor("n"),
            "out": Tensor("n", dtype="input", io="out"),
            "factor": Scalar(float),
            "exact": Scalar(bool),
        },
        reference=lambda *a: None,
        cuda=Cuda(
            "k.cuh", "K<{dtype}>::run", key=lambda input, *_: (input.dtype,), params=("dtype",)
        ),
    )
    fam.cuda_module = lambda module, key: (
        built.append(dict(key)) or type("M", (), {op.name: staticmethod(tvm_function)})
    )
    monkeypatch.setattr("sgljit.op._backend.select_backend", lambda t: "cuda")
    x = torch.randn(5)
    with torch.no_grad():
        op(x, torch.empty(5), 1.0, True)
        op(torch.randn(7), torch.empty(7), 2.0, False)
        with pytest.raises(ValueError, match=r"^input: dtype expected one of"):
            op(x.int(), torch.empty(5), 1.0, True)  # refused before any build for int32
        with pytest.raises(TypeError, match=r"^factor: expected float, got str"):
            op(x, torch.empty(5), "1", True)  # tvm-ffi's positional TypeError, renamed
        with pytest.raises(TypeError, match=r"^exact: expected bool, got int"):
            op(x, torch.empty(5), 1.0, 1)  # tvm-ffi would pass 1 as True
    assert built == [{"dtype": torch.float32}]
    assert ran == [(5,), (7,)]


def test_generated_eager_path_keeps_every_check():
    """Ops with a CUDA kernel get a generated __call__ (parameters spelled out); a tensor that says
    it is on CUDA takes it without a GPU. Whatever it cannot decide falls back to the checked path."""

    class OnCuda(torch.Tensor):
        is_cuda = True

    ran = []
    fam = Family("test_op_fast", __file__)

    def tvm_function(input, out, factor, exact):
        if not isinstance(factor, float):
            raise TypeError("Mismatched type on argument #2")
        ran.append((type(input).__name__, factor, exact))

    op = fam.op(
        "test_op_fast_copy",
        args={
            "input": Tensor("n"),
            "out": Tensor("n", dtype="input", io="out"),
            "factor": Scalar(float),
            "exact": Scalar(bool),
        },
        reference=lambda *a: None,
        cuda=Cuda("k.cuh", "K::run", key=lambda input, *_: (input.dtype,), params=("dtype",)),
    )
    fam.cuda_module = lambda module, key: type("M", (), {op.name: staticmethod(tvm_function)})
    assert type(op).__name__ == "Op_test_op_fast_copy" and isinstance(op, sgljit.op.Op)
    assert str(op.signature) == str(inspect.signature(op))
    x, out = torch.randn(3).as_subclass(OnCuda), torch.empty(3).as_subclass(OnCuda)
    with torch.no_grad():
        op(x, out, 1.0, True)  # a miss: the checked path builds, then memoizes
        op(x, out, exact=False, factor=2.0)  # a hit, keywords bound by Python itself
        with pytest.raises(TypeError, match=r"^factor: expected float, got str"):
            op(x, out, "1", True)
        with pytest.raises(TypeError, match=r"^exact: expected bool, got int"):
            op(x, out, 1.0, 1)
        with pytest.raises(TypeError, match=r"^input: expected a torch.Tensor, got list"):
            op([1.0], out, 1.0, True)
    with pytest.raises(RuntimeError, match=r"^input: requires grad"):
        op(torch.randn(3, requires_grad=True).as_subclass(OnCuda), out, 1.0, True)
    assert ran == [("OnCuda", 1.0, True), ("OnCuda", 2.0, False)]
    with pytest.raises(ValueError, match=r"_sgljit_x"):
        fam.op("test_op_fast_bad", args={"_sgljit_x": Tensor(4)}, reference=print)


def test_written_tensors_must_not_share_memory():
    """A written tensor sharing memory with another argument would race with the kernels' reads and
    writes: refused, naming the later tensor where it is written (else the earlier), on every
    backend (Python here, the same rule in the generated C++). Views that share no element (heads
    of one qkv buffer, columns of one buffer) are accepted, and so is the one view a written tensor
    declares as its alias (in place)."""
    op = family.op(
        "test_op_two_outs",
        args={
            "input": Tensor("n", layout="strided"),
            "a": Tensor("n", dtype="input", layout="strided", io="out", alias="input"),
            "b": Tensor("n", dtype="input", layout="strided", io="out"),
        },
        reference=lambda input, a, b: (a.copy_(input.clone()), b.copy_(input)),
        cuda=Cuda("k.cuh", "K::run", key=lambda input, *_: (input.dtype,), params=()),
    )
    x, buf = torch.randn(4), torch.empty(12)
    op(x, buf[:4], buf[4:8])  # adjacent, disjoint
    with pytest.raises(ValueError, match=r"^b: shares memory with a, which sgljit also writes"):
        op(x, buf[:4], buf[2:6])
    pairs = buf.view(4, 3)  # columns: strided, interleaved ranges, distinct elements
    op(x, pairs[:, 0], pairs[:, 1])
    torch.testing.assert_close(pairs[:, 1], x)
    with pytest.raises(ValueError, match=r"^b: shares memory with a, which sgljit also writes"):
        op(x, pairs[:, 1], pairs[:, 1])  # one strided view passed twice
    with pytest.raises(ValueError, match=r"^b: shares memory with input, which sgljit reads"):
        op(buf[:4], buf[8:], buf[1:5])  # a read tensor shifted by one
    column = torch.empty(5, 3)[:, 0]  # strided: a shifted by one element of it overlaps it
    with pytest.raises(ValueError, match=r"^a: shares memory with input, which sgljit reads"):
        op(column[:4], column[1:], buf[8:])
    y = torch.randn(4)
    op(y, y, buf[:4])  # a is declared an alias of input: in place
    with pytest.raises(ValueError, match=r"^a: shares memory with input, which sgljit reads"):
        op(buf[:4], buf[1:5], buf[8:])  # ... but only as the very same view
    cpp = op.cpp_checks("f", "K::run")
    assert "const ByteSpan span_input = byte_span(input), span_a = byte_span(a)" in cpp
    assert 'check_unshared(a, span_a, "a", input, span_input, "input", false, true);' in cpp
    assert 'check_unshared(b, span_b, "b", input, span_input, "input", false, false);' in cpp
    assert 'check_unshared(b, span_b, "b", a, span_a, "a", true, false);' in cpp


def test_the_suite_names_a_reference_that_writes_nothing_and_a_case_of_the_wrong_arity():
    from sgljit.testing import check_numerics

    def rebinds(x, out):
        out = x * 2  # noqa: F841  (the mistake: the name is rebound, the tensor never written)

    def two(device):
        return (torch.randn(4, device=device), torch.empty(4, device=device))

    lazy = family.op(
        "test_op_lazy_reference",
        args={"x": Tensor(4), "out": Tensor(4, dtype="x", io="out")},
        reference=rebinds,
        cases=[Case("4", two, 1e-6)],
    )
    with pytest.raises(AssertionError, match="the reference left out unwritten"):
        check_numerics(lazy, "reference", torch.device("cpu"))
    short = family.op(
        "test_op_short_case",
        args={"x": Tensor(4), "out": Tensor(4, dtype="x", io="out")},
        reference=lambda x, out: out.copy_(x),
        cases=[Case("4", lambda device: (torch.randn(4),), 1e-6)],
    )
    with pytest.raises(AssertionError, match=r"make\(\) returned tuple of 1 values; expected"):
        check_numerics(short, "reference", torch.device("cpu"))


def test_the_empty_batch_empties_the_written_tokens_not_a_table():
    """A gather whose first argument is a table: the batch is out's (and the indices') tokens."""
    from sgljit.testing import _empty_batch

    def rows(device):
        table = torch.randn(5, 3, device=device)
        return table, torch.tensor([4, 0], device=device), torch.empty(2, 3, device=device)

    gather = family.op(
        "test_op_gather",
        args={
            "table": Tensor("vocab", "hidden"),
            "idx": Tensor("num_tokens", dtype=(torch.int64,), layout="contiguous"),
            "out": Tensor("num_tokens", "hidden", dtype="table", io="out"),
        },
        reference=lambda table, idx, out: out.copy_(table[idx]),
        cases=[Case("5x3", rows, 0.0)],
    )
    table, idx, out = _empty_batch(gather, torch.device("cpu"))
    assert table.shape == (5, 3) and idx.shape == (0,) and out.shape == (0, 3)


# Calls of installed plugins' public functions whose own handling ran before the op's checks (a
# numpy array's shape and dtype, torch's reshape of a 1-D empty tensor, the last size of a 0-d
# one): each names the argument, on every backend. The conformance suite makes such inputs for
# every op's public function; these are the ones found first.
BAD_PUBLIC_CALLS = {
    "timestep_embedding(numpy array)": (
        lambda: sgljit.ops.timestep_embedding(np.zeros(3, dtype=np.float32), 32),
        "t",
    ),
    "rmsnorm(1-D empty)": (lambda: sgljit.ops.rmsnorm(torch.empty(0), torch.empty(0)), "input"),
    "gemma_rmsnorm(1-D empty)": (
        lambda: sgljit.ops.gemma_rmsnorm(torch.empty(0), torch.empty(0)),
        "input",
    ),
    "rmsnorm_quant_fp8(1-D empty)": (
        lambda: sgljit.ops.rmsnorm_quant_fp8(torch.empty(0), torch.empty(0)),
        "input",
    ),
    "fused_add_rmsnorm_quant_fp8(1-D empty)": (
        lambda: sgljit.ops.fused_add_rmsnorm_quant_fp8(
            torch.empty(0), torch.empty(0), torch.empty(0)
        ),
        "input",
    ),
    "qknorm(0-d q)": (
        lambda: sgljit.ops.qknorm(
            torch.tensor(1.0), torch.zeros(2, 1, 64), torch.ones(64), torch.ones(64)
        ),
        "q",
    ),
    "apply_rope(0-d cos_sin_cache, rotary_dim)": (
        lambda: sgljit.ops.apply_rope(
            torch.zeros(2, 1, 64),
            None,
            torch.tensor(1.0),
            torch.zeros(2, dtype=torch.int64),
            rotary_dim=64,
        ),
        "cos_sin_cache",
    ),
}


@pytest.mark.parametrize("backend", ["reference", pytest.param("sycl", marks=pytest.mark.sycl)])
@pytest.mark.parametrize("call", list(BAD_PUBLIC_CALLS))
def test_public_functions_name_the_argument_they_cannot_use(backend, call):
    fn, name = BAD_PUBLIC_CALLS[call]
    with sgljit.use_backend(backend), pytest.raises((TypeError, ValueError, RuntimeError)) as info:
        fn()
    assert str(info.value).startswith(f"{name}:"), f"{type(info.value).__name__}: {info.value}"

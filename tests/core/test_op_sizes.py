"""The spec's sizes and what core derives from them (sgljit.op): related sizes (``2*d``,
``d/group_size``), allowed sets, rows tensors flattened by the generated public function, outputs
allocated from the declaration, check cases as data, SYCL launches derived from the arguments;
and the shared fp8 rules (sgljit.fp8)."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

import sgljit
from sgljit import fp8
from sgljit.op import Family, Scalar, Sizes, Sycl, Tensor

family = Family("test_op_sizes", __file__)
launches: list = []


class _Module:
    """Stands in for a SYCL module: records what a derived launch passes."""

    def get_function(self, name, argtypes):
        return lambda *args: launches.append((name, argtypes, args))


def _gate_into(input, out, scales, group_size):
    d = out.shape[1]
    y = input[:, :d] * input[:, d:]
    out.copy_(y)
    scales.copy_(y.reshape(y.shape[0], -1, group_size).abs().amax(-1))


gate = family.op(
    "test_op_sizes_gate",
    args={
        "input": Tensor("...", "2*d"),
        "out": Tensor("...", "d", dtype="input", io="out"),
        "scales": Tensor("...", "d/group_size", dtype=torch.float32, layout="strided", io="out"),
        "group_size": Scalar(int, min=1, one_of=(2, 4)),
    },
    reference=_gate_into,
    sycl=Sycl(
        "gate.hpp",
        key=lambda input, *_: {"SGLJIT_T": input.dtype},
        items=lambda n, key: n["rows"] * n["d"],
        group=8,
        max_groups=3,
    ),
    allowed={"d": (4, 8, 16)},
    cases=[
        Sizes({"rows": 3, "d": 8}, torch.float32, 1e-6, values={"group_size": 4}),
        Sizes({"rows": 2, "d": 4}, torch.float32, 1e-6, values={"group_size": 2}, pad=2, offset=1),
        Sizes(
            {"rows": 5, "d": 16},
            torch.float64,
            1e-6,
            values={"group_size": 4},
            column_major=("scales",),
        ),
    ],
)
family.sycl_module = lambda module, key: _Module()
gate_public = gate.public("``out = gate * up``, with the absmax of each group.", group_size=4)


def _args(rows=3, width=16, d=8, groups=2, group_size=4):
    return (torch.randn(rows, width), torch.empty(rows, d), torch.empty(rows, groups), group_size)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"width": 15}, "input: last dimension must be even (2*d), got 15"),
        (
            {"d": 7},
            "out: dimension 1 expected 8 (half of input's last dimension 16), got 7",
        ),
        ({"group_size": 3}, "group_size: expected one of 2, 4, got 3"),
        (
            {"width": 24, "d": 12, "groups": 3},
            "input: dimension 1 expected d in {4, 8, 16}, got 12",
        ),
        (
            {"groups": 3},
            "scales: dimension 1 expected 2 (out's last dimension / group_size), got 3",
        ),
        (
            {"width": 8, "d": 4, "groups": 2, "group_size": 4},
            "scales: dimension 1 expected 1 (out's last dimension / group_size), got 2",
        ),
    ],
)
def test_related_sizes_are_checked_with_the_messages_of_the_generated_cpp(changes, message):
    """Each message, in Python (the reference and SYCL paths) and as the generated C++ writes it
    (the text before the first value and after the last, on one line)."""
    args = _args(**changes)
    with pytest.raises(ValueError) as err:
        gate(*args)
    assert str(err.value) == message
    cpp = gate.cpp_checks("f", "g")
    first, *_, last = [p for p in re.split(r"\d+", message) if p]
    assert any(first in line and last.rstrip() in line for line in cpp.splitlines()), cpp


def test_a_group_size_that_does_not_divide_is_named():
    x = torch.randn(2, 12)  # d = 6: 6 is not in the allowed set, so declare a looser op here
    op = Family("test_op_sizes_loose", __file__).op(
        "test_op_sizes_loose",
        args={
            "input": Tensor("T", "2*d"),
            "scales": Tensor("T", "d/g", dtype=torch.float32, io="out"),
            "g": Scalar(int, min=1),
        },
        reference=lambda input, scales, g: None,
    )
    with pytest.raises(ValueError, match=r"^g: must divide d 6, got 4$"):
        op(x, torch.empty(2, 1), 4)
    assert 'RuntimeCheck(rel_size_d % g == 0, "g: must divide d ", rel_size_d' in op.cpp_checks(
        "f", "g"
    )


def test_the_public_function_flattens_rows_and_allocates_outputs():
    x = torch.randn(2, 3, 16)
    out, scales = gate_public(x)
    assert out.shape == (2, 3, 8) and scales.shape == (2, 3, 2) and scales.dtype == torch.float32
    torch.testing.assert_close(out, x[..., :8] * x[..., 8:])
    given = torch.empty(2, 3, 8)
    assert gate_public(x, 2, out=given)[0] is given
    assert str(inspect.signature(gate_public)) == "(input, group_size=4, *, out=None, scales=None)"
    assert "``input`` ``[..., 2*d]``" in gate_public.__doc__
    assert gate_public.__module__ == __name__


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: gate_public([1.0]),
            TypeError,
            r"^input: expected a torch.Tensor \[\.\.\., 2\*d\]",
        ),
        (lambda: gate_public(torch.tensor(1.0)), TypeError, r"^input: .*0-d tensor"),
        (
            lambda: gate_public(torch.randn(2, 3, 16), out=torch.empty(3, 2, 8)),
            ValueError,
            r"^out: expected leading dimensions \[2, 3\] \(input's\)",
        ),
        (
            lambda: gate_public(torch.randn(2, 3, 16), out=torch.empty(3, 2, 8).transpose(0, 1)),
            ValueError,
            r"^out: written in place, so its leading dimensions must collapse",
        ),
    ],
)
def test_the_public_function_names_what_it_cannot_use(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_check_cases_are_made_from_sizes():
    plain, strided, column = gate.cases
    assert [c.name for c in gate.cases] == [
        "3x8 float32",
        "2x4 strided misaligned float32",
        "5x16 col-major float64",
    ]
    x, out, scales, g = strided.make(torch.device("cpu"))
    assert x.shape == (2, 8) and x.stride() == (10, 1) and x.data_ptr() % 8 != 0
    assert out.shape == (2, 4) and g == 2
    x, out, scales, g = column.make(torch.device("cpu"))
    assert scales.shape == (5, 4) and scales.stride() == (1, 8) and x.dtype == torch.float64
    assert plain.make(torch.device("cpu"))[0].shape == (3, 16)


def test_the_sycl_launch_is_derived_from_the_arguments():
    launches.clear()
    args = _args(rows=5)
    with sgljit.use_backend("sycl"):
        gate(*args)
    [(name, argtypes, values)] = launches
    assert name == "test_op_sizes_gate"
    assert argtypes == ("ptr", "i64", "ptr", "i64", "ptr", "i64", "i64", "i64", "i64", "i64")
    x, out, scales, g = args
    assert values[0] == 24 and values[1] == 8  # 40 items in groups of 8, at most 3 groups
    assert values[2:] == (x, 16, out, 8, scales, 2, 1, g, 5, 8)


def test_old_declarations_keep_working():
    op = Family("test_op_sizes_old", __file__).op(
        "test_op_sizes_old",
        args={"input": Tensor("rows", "width"), "out": Tensor("rows", "width", io="out")},
        reference=lambda input, out: out.copy_(input),
    )
    x = torch.randn(2, 3)
    out = torch.empty(2, 3)
    op(x, out)
    assert torch.equal(out, x)
    with pytest.raises(ValueError, match=r"^out: dimension 1 expected 3 \(width\), got 4"):
        op(x, torch.empty(2, 4))


def test_fp8_scales_layouts_and_ue8m0():
    assert fp8.group_scales(5, 4, "cpu").stride() == (4, 1)
    assert fp8.group_scales(5, 4, "cpu", column_major=True).stride() == (1, 8)
    with pytest.raises(ValueError, match=r"^scales: column_major_scales=True expects stride 1"):
        fp8.check_scales_layout(torch.empty(5, 4), True)
    s = torch.tensor([0.3, 0.25, 1e-30, float("inf")])
    assert fp8.pow2_ceil(s).tolist()[:2] == [0.5, 0.25] and fp8.pow2_ceil(s)[3].isinf()
    with pytest.raises(TypeError, match=r"^fp8_dtype: expected torch.float8_e4m3fn"):
        fp8.group_outputs(torch.randn(2, 8), 4, torch.int8, False, None, None)
    out, scales = fp8.group_outputs(
        torch.randn(3, 16), 4, torch.float8_e5m2, True, None, None, gated=True
    )
    assert out.shape == (3, 8) and out.dtype == torch.float8_e5m2 and scales.stride() == (1, 4)
    assert fp8.fp8_max(torch.float8_e4m3fn) == 448.0

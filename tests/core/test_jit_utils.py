"""make_cpp_args, cache_once, backend selection and kernel_op dispatch."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import sgljit
from sgljit.op import kernel_op


def test_make_cpp_args():
    args = sgljit.make_cpp_args(
        True, False, 4096, -3, 0.5, 1e-6, torch.float32, torch.float16, torch.bfloat16
    )
    assert list(args) == [
        "true",
        "false",
        "4096",
        "-3",
        "0.5f",
        "1e-06f",
        "fp32_t",
        "fp16_t",
        "bf16_t",
    ]
    assert str(
        sgljit.make_cpp_args(torch.float8_e4m3fn, torch.float8_e5m2, torch.int32, torch.int64)
    ) == ("fp8_e4m3_t, fp8_e5m2_t, int32_t, int64_t")
    with pytest.raises(TypeError, match="complex64"):
        sgljit.make_cpp_args(torch.complex64)
    with pytest.raises(TypeError, match="list"):
        sgljit.make_cpp_args([1])
    with pytest.raises(ValueError, match="inf"):
        sgljit.make_cpp_args(float("inf"))


def test_cache_once_computes_once_across_threads():
    calls = []

    @sgljit.cache_once
    def slow_square(n):
        calls.append(n)
        time.sleep(0.05)
        return n * n

    results = []
    threads = [threading.Thread(target=lambda: results.append(slow_square(7))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [49] * 8
    assert calls == [7]
    assert slow_square(8) == 64 and calls == [7, 8]


def test_cache_once_inside_torch_compile_fullgraph():
    calls = []

    @sgljit.cache_once
    def scale_for(n: int) -> float:
        calls.append(n)
        return float(n) / 2

    @torch.compile(fullgraph=True, backend="eager")
    def f(x):
        return x * scale_for(3)

    x = torch.randn(5)
    torch.testing.assert_close(f(x), x * 1.5)
    torch.testing.assert_close(f(x), x * 1.5)
    assert calls == [3]


def test_select_backend_defaults_and_overrides(monkeypatch):
    cpu = torch.zeros(1)
    assert sgljit.select_backend(cpu) == "reference"
    with sgljit.use_backend("sycl"):
        assert sgljit.select_backend(cpu) == "sycl"
        with sgljit.use_backend("reference"):
            assert sgljit.select_backend(cpu) == "reference"
    with (
        sgljit.use_backend("cuda"),
        pytest.raises(ValueError, match="forced but the tensors are on cpu"),
    ):
        sgljit.select_backend(cpu)
    monkeypatch.setenv("SGLJIT_BACKEND", "sycl")
    assert sgljit.select_backend(cpu) == "sycl"
    monkeypatch.setenv("SGLJIT_BACKEND", "tpu")
    with pytest.raises(ValueError, match="SGLJIT_BACKEND='tpu'"):
        sgljit.select_backend(cpu)
    with pytest.raises(ValueError, match="not one of"), sgljit.use_backend("metal"):
        pass


calls: list[str] = []


@kernel_op("test_scaled_copy", mutates_args=("out",))
def scaled_copy(input: torch.Tensor, out: torch.Tensor, factor: float) -> None:
    calls.append("reference")
    out.copy_(input * factor)


@scaled_copy.register("sycl")
def _(input, out, factor):
    calls.append("sycl")
    out.copy_(input * factor)


def test_kernel_op_dispatches_eagerly_without_the_custom_op():
    calls.clear()
    x, out = torch.randn(4), torch.empty(4)
    scaled_copy(x, out, 2.0)
    torch.testing.assert_close(out, x * 2)
    with sgljit.use_backend("sycl"):
        scaled_copy(x, out, 3.0)
    torch.testing.assert_close(out, x * 3)
    assert calls == ["reference", "sycl"]
    assert hasattr(torch.ops.sgljit, "test_scaled_copy")


def test_kernel_op_compiles_fullgraph_through_the_custom_op():
    @torch.compile(fullgraph=True)
    def f(x):
        out = torch.empty_like(x)
        scaled_copy(x, out, 4.0)
        return out + 1

    x = torch.randn(16)
    torch.testing.assert_close(f(x), x * 4 + 1)


def test_kernel_op_without_backend_says_so():
    with sgljit.use_backend("cuda"), pytest.raises(ValueError, match="forced"):
        scaled_copy(torch.zeros(1), torch.zeros(1), 1.0)
    with pytest.raises(ValueError, match="not parameters"):
        kernel_op("test_bad", mutates_args=("nope",))(lambda x: None)


def test_kernel_op_refuses_parameter_names_torch_compile_reserves():
    def body(input: torch.Tensor, out: torch.Tensor, mode: int) -> None:
        out.copy_(input)

    with pytest.raises(ValueError, match=r"\['mode'\] are reserved by torch.compile"):
        kernel_op("test_reserved", mutates_args=("out",))(body)


def test_as_dtype_accepts_dtypes_and_their_names():
    from sgljit.jit_utils import as_dtype

    assert as_dtype(torch.float16) is torch.float16
    assert as_dtype("bfloat16") is as_dtype("torch.bfloat16") is torch.bfloat16
    with pytest.raises(TypeError, match=r"out_dtype: 'float128' is not a torch dtype"):
        as_dtype("float128", "out_dtype")
    with pytest.raises(TypeError, match=r"dtype: 'cuda' is not a torch dtype"):
        as_dtype("cuda")  # torch.cuda exists but is no dtype

"""make_cpp_args, cache_once and backend selection."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import sgljit


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


def test_select_backend_defaults_and_overrides():
    cpu = torch.zeros(1)
    assert sgljit.select_backend(cpu) == "reference"
    with sgljit.use_backend("sycl"):
        assert sgljit.select_backend(cpu) == "sycl"
        with sgljit.use_backend("reference"):
            assert sgljit.select_backend(cpu) == "reference"
    with (
        sgljit.use_backend("cuda"),
        pytest.raises(ValueError, match=r"forced \(by use_backend\) but the tensors are on cpu"),
    ):
        sgljit.select_backend(cpu)
    with (
        pytest.raises(ValueError, match="use_backend: expected one of"),
        sgljit.use_backend("metal"),
    ):
        pass


def test_as_dtype_accepts_dtypes_and_their_names():
    from sgljit.jit_utils import as_dtype

    assert as_dtype(torch.float16) is torch.float16
    assert as_dtype("bfloat16") is as_dtype("torch.bfloat16") is torch.bfloat16
    with pytest.raises(TypeError, match=r"out_dtype: 'float128' is not a torch dtype"):
        as_dtype("float128", "out_dtype")
    with pytest.raises(TypeError, match=r"dtype: 'cuda' is not a torch dtype"):
        as_dtype("cuda")  # torch.cuda exists but is no dtype

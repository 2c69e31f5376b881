"""load_jit and the module cache, with real compilers (no mocks)."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import sgljit
from sgljit.cache import MANIFEST

from ..conftest import has_nvcc, run_python, run_python_concurrently

KERNELS = Path(__file__).parent / "kernels"


def load_add_one(source_dir=KERNELS, dtype=torch.float32):
    args = sgljit.make_cpp_args(dtype)
    return sgljit.load_jit(
        "add_one",
        *args,
        cpp_files=["add_one.h"],
        cpp_wrappers=[("add_one", f"AddOne<{args}>::run"), ("add_into", "AddInto::run")],
        source_dir=source_dir,
    )


def load_add_one_cuda(name: str, dtype=torch.float32):
    """The CUDA add_one kernel (kernels/add_one.cuh) as module `name`."""
    args = sgljit.make_cpp_args(dtype)
    return sgljit.load_jit(
        name,
        *args,
        cuda_files=["add_one.cuh"],
        cuda_wrappers=[
            ("add_one", f"AddOneCuda<{args}>::run"),
            ("add_one_threads", f"AddOneCuda<{args}>::run_threads"),
        ],
        source_dir=KERNELS,
    )


LOAD_IN_SUBPROCESS = """
import torch, sgljit
args = sgljit.make_cpp_args(torch.float32)
m = sgljit.load_jit("add_one", *args, cpp_files=["add_one.h"],
                    cpp_wrappers=[("add_one", f"AddOne<{args}>::run"), ("add_into", "AddInto::run")],
                    source_dir=r"%s")
x = torch.arange(4, dtype=torch.float32)
m.add_one(x, 1.5)
assert x.tolist() == [1.5 + i + %d for i in range(4)], x
print("OK")
"""


def published(cache_dir: Path, name_prefix: str = "add_one") -> list[Path]:
    """Published variant folders (``<backend>/<arch>/<name>-<key>/<variant>``) of modules so named."""
    return sorted(p.parent for p in cache_dir.glob(f"*/*/{name_prefix}*/*/{MANIFEST}"))


def test_cpu_kernel_runs_on_torch_tensors(cache_dir):
    module = load_add_one()
    x = torch.randn(1000)
    expected = x + 2.0
    module.add_one(x, 2.0)
    torch.testing.assert_close(x, expected)
    assert load_add_one() is module  # in-process memo
    [folder] = published(cache_dir)
    assert folder.parent.parent.name == "host" and folder.parent.parent.parent.name == "cpu"


def test_specializations_are_separate_modules(cache_dir):
    f32, f64 = load_add_one(dtype=torch.float32), load_add_one(dtype=torch.float64)
    assert f32 is not f64
    x = torch.randn(10, dtype=torch.float64)
    expected = x + 1
    f64.add_one(x, 1.0)
    torch.testing.assert_close(x, expected)
    assert len(published(cache_dir)) == 2


def test_tensor_matcher_errors_reach_python(cache_dir):
    module = load_add_one()
    with pytest.raises(ValueError, match=r"x: expected 1-D tensor of shape \[n\], got 2-D"):
        module.add_one(torch.zeros(2, 2), 1.0)
    with pytest.raises(ValueError, match=r"x: dtype expected one of \{float32\}, got float64"):
        module.add_one(torch.zeros(3, dtype=torch.float64), 1.0)
    with pytest.raises(ValueError, match=r"x: expected a contiguous tensor"):
        module.add_one(torch.zeros(8)[::2], 1.0)
    with pytest.raises(ValueError, match=r"dst: dimension 0 expected 4 \(n\), got 5"):
        module.add_into(torch.zeros(4), torch.zeros(5))
    with pytest.raises(
        ValueError,
        match=r"dst: dtype expected float32 \(same as the tensors before it\), got float64",
    ):
        module.add_into(torch.zeros(4), torch.zeros(4, dtype=torch.float64))
    with pytest.raises(
        ValueError, match=r"src: dtype expected one of \{float32, float64\}, got int32"
    ):
        module.add_into(torch.zeros(4, dtype=torch.int32), torch.zeros(4))
    with pytest.raises(ValueError, match=r"dst: stride of dimension 0 expected 1, got 2"):
        module.add_into(torch.zeros(4), torch.zeros(8)[::2])


def load_matcher():
    """kernels/matcher.h: wrappers that only run TensorMatcher on their arguments."""
    return sgljit.load_jit(
        "tensor_matcher",
        cpp_files=["matcher.h"],
        cpp_wrappers=[
            ("rows", "MatchRows::run"),
            ("table", "MatchTable::run"),
            ("contiguous", "MatchContiguous::run"),
            ("on_cuda", "MatchOnCuda::run"),
            ("read_unbound", "ReadUnbound::run"),
            ("writable2", "MatchWritable2::run"),
            ("writable3", "MatchWritable3::run"),
            ("check_lazily", "CheckLazily::run"),
            ("same_or", "MatchSameOr::run"),
            ("unshared", "CheckUnshared::run"),
        ],
        source_dir=KERNELS,
    )


def test_tensor_matcher_messages_are_exact(cache_dir):
    """The whole text of each TensorMatcher failure (symbols shown by name until bound, then by
    value; fixed sizes; `*` for any)."""
    m, z = load_matcher(), torch.zeros
    cases = [
        (m.rows, (z(3), z(3, 4)), "x: expected 2-D tensor of shape [rows, cols], got 1-D tensor"),
        (m.rows, (z(3, 5), z(3, 4, 1)), "y: expected 2-D tensor of shape [3, 4], got 3-D tensor"),
        (
            m.rows,
            (z(3, 5), z(2, 4)),
            "y: dimension 0 expected 3 (rows), got 2 (shape pattern [3, 4])",
        ),
        (m.rows, (z(3, 5), z(3, 5)), "y: dimension 1 expected 4, got 5 (shape pattern [3, 4])"),
        (
            m.rows,
            (z(3, 8)[:, ::2], z(3, 4)),
            "x: stride of dimension 1 expected 1, got 2 (stride pattern [8, 1])",
        ),
        (
            m.rows,
            (z(3, 5), z(3, 8)[:, ::2]),
            "y: stride of dimension 1 expected 1, got 2 (stride pattern [*, 1])",
        ),
        (
            m.rows,
            (z(3, 5, dtype=torch.int32), z(3, 4)),
            "x: dtype expected one of {float32, float64}, got int32",
        ),
        (
            m.rows,
            (z(3, 5), z(3, 4, dtype=torch.float64)),
            "y: dtype expected float32 (same as the tensors before it), got float64",
        ),
        (m.contiguous, (z(4, 4).t(),), "x: expected a contiguous tensor"),
        (
            m.contiguous,
            (z(4, 4, dtype=torch.bfloat16),),
            "x: dtype expected one of {float32}, got bfloat16",
        ),
        (m.on_cuda, (z(4),), "x: expected a tensor on cuda, got one on cpu:0"),
        (
            m.same_or,
            (z(2, dtype=torch.float64), z(2, dtype=torch.int32), z(2)),
            "w: dtype expected float64 (same as the tensors before it) or one of {float32}, "
            "got int32",
        ),
        (
            m.same_or,
            (z(2, dtype=torch.float64), z(2), z(2, dtype=torch.float64)),
            "w2: dtype expected float32 (same as the tensors before it), got float64",
        ),
        (m.read_unbound, (0,), "size 'k' was never bound"),
        (m.read_unbound, (1,), "dtype was never bound"),
        (m.read_unbound, (2,), "device was never bound"),
        (
            m.table,
            (z(3, dtype=torch.float64), z(5, dtype=torch.int32)),
            "table: dtype expected float64 (same as the tensors before it) or one of {float32}, "
            "got int32",
        ),
    ]
    for fn, args, message in cases:
        with pytest.raises(ValueError) as info:
            fn(*args)
        assert str(info.value) == message
    m.rows(z(3, 5), z(3, 4))  # and the same patterns accept what fits
    m.rows(z(3, 8)[:, :5], z(3, 6)[:, 1:5])
    m.contiguous(z(4, 4))
    for table in (torch.float64, torch.float32):
        m.table(z(3, dtype=torch.float64), z(5, dtype=table))
    for x, w in (
        (torch.float64, torch.float64),
        (torch.float64, torch.float32),
        (torch.int32, torch.int32),
    ):
        m.same_or(z(2, dtype=x), z(2, dtype=w), z(2, dtype=w))


def test_sgljit_check_builds_its_message_only_on_failure(cache_dir):
    m = load_matcher()
    assert m.check_lazily(False) == 0
    with pytest.raises(ValueError) as info:
        m.check_lazily(True)
    assert str(info.value) == "check failed: the message"


def shared_elements_message(shape, strides) -> str:
    return (
        f"out: sgljit writes it, but its elements may share memory (shape {list(shape)}, strides "
        f"{list(strides)}: an expanded or otherwise self-overlapping view); pass a tensor whose "
        "elements are distinct"
    )


def test_writable_refuses_views_whose_elements_share_memory(cache_dir):
    m, z = load_matcher(), torch.zeros
    refused = [
        z(1, 8).expand(4, 8),  # expanded: stride 0
        z(32).as_strided((4, 8), (4, 1)),  # rows overlap by half
        z(8, 1).expand(8, 3),
    ]
    for t in refused:
        with pytest.raises(ValueError) as info:
            m.writable2(t)
        assert str(info.value) == shared_elements_message(t.shape, t.stride())
    t = z(4, 1, 8).expand(4, 3, 8)
    with pytest.raises(ValueError) as info:
        m.writable3(t)
    assert str(info.value) == shared_elements_message(t.shape, t.stride())

    accepted = [
        z(4, 8),
        z(4, 16)[:, 4:12],  # sliced
        z(8, 4).t(),  # transposed
        z(8, 16)[::2, ::3],  # stepped
        z(1, 8).expand(1, 8),  # size-1 dimensions are ignored
        z(1, 0).expand(4, 0),  # no elements
        z(64).as_strided((4, 4), (1, 4)),  # column-major
    ]
    for t in accepted:
        m.writable2(t)
    m.writable3(z(2, 3, 4).permute(2, 0, 1))
    m.writable3(z(4, 1, 8).expand(4, 1, 8))


def test_writable_agrees_with_the_python_rule(cache_dir):
    """Over random strided views of one buffer, the C++ check refuses exactly what kernel_op's
    Python check (op.may_overlap) refuses."""
    from sgljit.op import may_overlap

    m, rng, base = load_matcher(), random.Random(0), torch.zeros(4096)
    for _ in range(300):
        shape = [rng.choice([1, 2, 3, 4, 5]) for _ in range(3)]
        strides = [rng.choice([0, 1, 2, 3, 4, 5, 8, 12, 16, 20, 40, 60]) for _ in range(3)]
        t = base.as_strided(shape, strides)
        refused = may_overlap(t)
        if refused:
            with pytest.raises(ValueError, match="may share memory"):
                m.writable3(t)
        else:
            m.writable3(t)


def test_check_unshared_agrees_with_the_python_rule(cache_dir):
    """Over random strided views of one buffer, of two element sizes, the C++ check_unshared refuses
    exactly the pairs op.shares_memory says may share bytes, and never a pair that shares no
    element (counted by writing one and reading the other); one view of a declared alias passes."""
    from sgljit.op import shares_memory

    m, rng = load_matcher(), random.Random(1)
    base = torch.zeros(2048, dtype=torch.float32)

    def view(dtype):
        flat = base.view(dtype)
        shape = [rng.choice([1, 2, 3, 4, 6]) for _ in range(rng.choice([1, 2, 3]))]
        strides = [rng.choice([0, 1, 2, 3, 4, 6, 8, 12, 24, 48, 64]) for _ in shape]
        offset = rng.choice([0, 1, 2, 3, 4, 8, 13, 100])
        return flat.as_strided(shape, strides, offset)

    seen = {True: 0, False: 0}
    for _ in range(1500):
        a, b = view(rng.choice([torch.float32, torch.int16])), view(torch.float32)
        shared = shares_memory(a, b)
        seen[shared] += 1
        if shared:
            with pytest.raises(ValueError, match=r"^b: shares memory with a, which sgljit reads"):
                m.unshared(a, b, False, False)
        else:
            m.unshared(a, b, False, False)
            bytes_b = {b.data_ptr() + i for i in _element_bytes(b)}
            assert not bytes_b & {a.data_ptr() + i for i in _element_bytes(a)}, (
                a.stride(),
                b.stride(),
            )
    assert seen[True] > 100 and seen[False] > 100, seen
    x = torch.zeros(4, 8)
    m.unshared(x, x, False, True)  # one view: in place where the op declares it
    with pytest.raises(ValueError, match=r"^b: shares memory with a, which sgljit also writes"):
        m.unshared(x, x, True, False)
    with pytest.raises(ValueError, match=r"^b: shares memory with a"):
        m.unshared(x, x[:, :4], False, True)  # an alias must be the very same view


def _element_bytes(t: torch.Tensor) -> set[int]:
    """Offsets from t's first byte of every byte of its elements."""
    idx = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride(), strict=True):
        idx = (idx.unsqueeze(-1) + torch.arange(size) * stride * t.element_size()).flatten()
    return {int(i) + k for i in idx.tolist() for k in range(t.element_size())}


def test_fresh_process_reuses_cache_without_compiling(cache_dir):
    first = run_python(LOAD_IN_SUBPROCESS % (KERNELS, 0))
    assert first.returncode == 0, first.stderr
    assert "compiling add_one" in first.stderr
    # No compiler may run on the warm path: hide every compiler and ninja from PATH.
    second = run_python(
        LOAD_IN_SUBPROCESS % (KERNELS, 0), env={"PATH": "/nonexistent", "CXX": "/nonexistent/c++"}
    )
    assert second.returncode == 0, second.stderr
    assert "OK" in second.stdout
    assert "compiling" not in second.stderr
    assert len(published(cache_dir)) == 1


def test_header_edit_rebuilds(cache_dir, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(KERNELS, src)
    assert run_python(LOAD_IN_SUBPROCESS % (src, 0)).returncode == 0
    (src / "offset.h").write_text("#pragma once\ninline constexpr int kOffset = 10;\n")
    result = run_python(LOAD_IN_SUBPROCESS % (src, 10))
    assert result.returncode == 0, result.stderr
    assert "compiling add_one" in result.stderr
    assert re.search(r"not reusing .*offset\.h changed since it was built", result.stderr), (
        result.stderr
    )
    assert len(published(cache_dir)) == 2


def test_compile_error_raises_with_diagnostics_and_caches_nothing(cache_dir, tmp_path):
    src = tmp_path / "broken"
    src.mkdir()
    (src / "broken.h").write_text(
        "struct Broken { static void run() { this_is_not_declared(); } };\n"
    )
    with pytest.raises(sgljit.CompileError) as info:
        sgljit.load_jit(
            "broken",
            cpp_files=["broken.h"],
            cpp_wrappers=[("broken", "Broken::run")],
            source_dir=src,
        )
    err = info.value
    assert "this_is_not_declared" in err.output
    assert "error" in err.output
    assert "broken.cc" in err.command and ("c++" in err.command or "g++" in err.command)
    assert Path(err.source_path).is_file()  # kept for inspection, outside the cache proper
    assert "this_is_not_declared" in str(err)
    assert not published(cache_dir, "broken")
    assert not list(cache_dir.glob("cpu/host/broken-*"))


def test_truncated_module_is_rebuilt_with_a_warning(cache_dir):
    load_add_one()
    [folder] = published(cache_dir)
    so = folder / "add_one_fp32_t.so"
    # A partial copy (a new file: this process has the original mapped, and truncating a mapped
    # file in place would crash it with SIGBUS).
    partial = folder / "partial.tmp"
    partial.write_bytes(so.read_bytes()[:1000])
    os.replace(partial, so)
    result = run_python(LOAD_IN_SUBPROCESS % (KERNELS, 0))
    assert result.returncode == 0, result.stderr
    assert "does not match the sha256" in result.stderr and "rebuilding" in result.stderr
    assert "compiling add_one" in result.stderr
    assert so.stat().st_size > 1000


@pytest.mark.parametrize("text", ["[]", "null", '"manifest"', "{"])
def test_a_manifest_that_is_not_a_json_object_is_rebuilt_with_a_warning(cache_dir, text):
    load_add_one()
    [folder] = published(cache_dir)
    (folder / MANIFEST).write_text(text)
    result = run_python(LOAD_IN_SUBPROCESS % (KERNELS, 0))
    assert result.returncode == 0, result.stderr
    assert "compiling add_one" in result.stderr


def test_killed_build_leaves_nothing_that_loads(cache_dir):
    code = LOAD_IN_SUBPROCESS % (KERNELS, 0)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    # Kill it while the compiler is running (the staging folder exists, nothing is published yet).
    while (
        not list(cache_dir.glob("cpu/host/.staging/*/build.ninja")) and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not published(cache_dir)
    assert not list(cache_dir.glob("cpu/host/add_one*/*.so"))
    result = run_python(code)  # the next process builds it properly
    assert result.returncode == 0, result.stderr
    assert len(published(cache_dir)) == 1


def test_concurrent_cold_builds_compile_once(cache_dir):
    code = LOAD_IN_SUBPROCESS % (KERNELS, 0)
    results = run_python_concurrently(code, [{}] * 8)
    assert all(rc == 0 for rc, _, _ in results), [err for _, _, err in results]
    assert sum("OK" in out for _, out, _ in results) == 8
    assert sum(err.count("compiling add_one") for _, _, err in results) == 1
    assert len(published(cache_dir)) == 1


def test_no_compile_mode_names_module_key_and_build_command(cache_dir, monkeypatch):
    monkeypatch.setenv("SGLJIT_NO_COMPILE", "1")
    with pytest.raises(
        sgljit.NoCompileError, match=r"add_one_fp32_t.*key [0-9a-f]{20}.*without SGLJIT_NO_COMPILE"
    ) as info:
        load_add_one()
    assert "--backend cpu" not in str(info.value)  # the CLI builds cuda and sycl modules only
    assert not published(cache_dir)


def test_bad_arguments(cache_dir):
    with pytest.raises(ValueError, match="give cuda_files and/or cpp_files"):
        sgljit.load_jit("x")
    with pytest.raises(FileNotFoundError, match=r"missing\.h"):
        sgljit.load_jit("x", cpp_files=["missing.h"], source_dir=KERNELS)
    with pytest.raises(ValueError, match="not a C identifier"):
        sgljit.load_jit(
            "x",
            cpp_files=["add_one.h"],
            cpp_wrappers=[("bad-name", "AddInto::run")],
            source_dir=KERNELS,
        )


@pytest.mark.skipif(not has_nvcc(), reason="nvcc not found")
def test_cuda_module_builds_for_requested_arch(cache_dir, monkeypatch):
    monkeypatch.setenv("SGLJIT_CUDA_ARCH", "9.0a")
    module = load_add_one_cuda("add_one_cuda", torch.bfloat16)
    [folder] = published(cache_dir, "add_one_cuda")
    assert folder.parent.parent.name == "9.0a" and folder.parent.parent.parent.name == "cuda"
    ninja = (folder / "build.ninja").read_text()
    assert "code=sm_90a" in ninja
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:
        x = torch.randn(1000, device="cuda", dtype=torch.bfloat16)
        expected = (x.float() + 1.5).bfloat16()
        module.add_one(x, 1.5)
        torch.testing.assert_close(x, expected)
        with pytest.raises(ValueError, match="x: expected a tensor on cuda, got one on cpu"):
            module.add_one(torch.zeros(4, dtype=torch.bfloat16), 1.0)


@pytest.mark.skipif(not has_nvcc(), reason="nvcc not found")
def test_extra_cuda_cflags_from_env_are_built_and_keyed(cache_dir, monkeypatch):
    monkeypatch.setenv("SGLJIT_CUDA_ARCH", "9.0a")
    load_add_one_cuda("add_one_flags")
    monkeypatch.setenv("SGLJIT_EXTRA_CUDA_CFLAGS", "-DSGLJIT_TEST_FLAG=1 -Xptxas=-O3")
    load_add_one_cuda("add_one_flags")
    folders = published(cache_dir, "add_one_flags")
    assert len(folders) == 2, "the extra flags must give a module of its own"
    ninjas = [(f / "build.ninja").read_text() for f in folders]
    assert sum("SGLJIT_TEST_FLAG" in n for n in ninjas) == 1


@pytest.mark.skipif(
    not (torch.cuda.is_available() and has_nvcc()), reason="needs a CUDA GPU and nvcc"
)
def test_pdl_launches_keep_stream_order_in_a_graph(cache_dir):
    """add_one is launched with programmatic dependent launch (on sm_90+): 200 launches on one
    buffer, eager and replayed from a CUDA graph, must each see the previous one's result."""
    module = load_add_one_cuda("add_one_pdl")
    x = torch.randn(1 << 20, device="cuda")
    start = x.clone()
    for _ in range(200):
        module.add_one(x, 1.0)
    torch.testing.assert_close(x, start + 200, rtol=0, atol=1e-3)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        module.add_one(x, 1.0)  # warm-up outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(200):
                module.add_one(x, 1.0)
    torch.cuda.synchronize()
    x.copy_(start)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(x, start + 400, rtol=0, atol=1e-3)


@pytest.mark.skipif(
    not (torch.cuda.is_available() and has_nvcc()), reason="needs a CUDA GPU and nvcc"
)
def test_launch_runs_on_the_current_stream_and_reports_a_failed_launch(cache_dir):
    """LaunchKernel launches on torch's current stream (a side stream, while the default one
    sleeps: the side stream's copy sees the result) and raises naming the kernel when the launch
    fails (2048 threads a block), leaving no error behind for torch's next launch."""
    module = load_add_one_cuda("add_one_launch")
    x = torch.zeros(1 << 20, device="cuda")
    seen = torch.empty(x.shape, pin_memory=True)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # tens of ms on the default stream
    with torch.cuda.stream(stream):
        for threads in (32, 128, 1024):
            module.add_one_threads(x, 1.0, threads)
        seen.copy_(x, non_blocking=True)
    stream.synchronize()
    assert seen.min().item() == seen.max().item() == 3.0
    with pytest.raises(RuntimeError, match="launch of add_one_kernel failed: cuda"):
        module.add_one_threads(x, 1.0, 2048)
    module.add_one(x, 1.0)  # the failed launch left nothing behind
    torch.cuda.synchronize()
    assert x.min().item() == x.max().item() == 4.0


def test_arch_override_is_validated(monkeypatch):
    from sgljit.toolchain import cuda_arch_list

    monkeypatch.setenv("SGLJIT_CUDA_ARCH", "9.0a 10.0a")
    assert cuda_arch_list() == ("9.0a", "10.0a")
    monkeypatch.setenv("SGLJIT_CUDA_ARCH", "sm_90")
    with pytest.raises(sgljit.SgljitError, match="sm_90"):
        cuda_arch_list()


def test_two_source_folders_of_one_module_are_two_modules_in_one_process(cache_dir, tmp_path):
    """The key names the source folder by role, so both folders share it on disk; in a process
    each still gets the build of its own files."""
    other = tmp_path / "other"
    shutil.copytree(KERNELS, other)
    (other / "offset.h").write_text("#pragma once\ninline constexpr int kOffset = 100;\n")
    x, y = torch.zeros(4), torch.zeros(4)
    load_add_one().add_one(x, 1.0)
    load_add_one(other).add_one(y, 1.0)
    assert x.tolist() == [1.0] * 4 and y.tolist() == [101.0] * 4
    variants = published(cache_dir)
    assert len(variants) == 2 and len({v.parent for v in variants}) == 1

"""SYCL backend: load_jit_sycl on the SYCL CPU device (runtime compiler), the icpx plan, the cache.

Runs wherever the runtime wheels are installed (``nox -s tests-xpu``); on a host with an Intel GPU
the numerics tests also run on ``xpu``. Only the icpx plan tests run without the runtime.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import sgljit
from sgljit import sycl

from ..conftest import env_with_site

try:
    sycl.find_runtime()
    HAVE_RUNTIME = True
except sycl.SYCLRuntimeNotFound:
    HAVE_RUNTIME = False

needs_runtime = pytest.mark.skipif(
    not HAVE_RUNTIME, reason=f"needs the SYCL runtime: {sycl.INSTALL_HINT}"
)
DEVICES = ["cpu"] + (["xpu"] if hasattr(torch, "xpu") and torch.xpu.is_available() else [])

# The worked example of include/README.md: a free-function kernel, specialized by -DSGLJIT_T.
SCALE = textwrap.dedent(
    """\
    #include <sgljit/sycl/kernel.hpp>

    using T = sgljit::scalar_t;

    extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
    void scale(const T* x, T* out, float factor, int64_t n) {
      const int64_t i = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
      if (i < n) out[i] = sgljit::from_float<T>(sgljit::to_float(x[i]) * factor);
    }
    """
)

# The same kernel written as a functor (icpx style), reused by a one-line free-function wrapper.
SCALE_FUNCTOR = textwrap.dedent(
    """\
    #include <sgljit/sycl/kernel.hpp>

    using T = sgljit::scalar_t;

    struct ScaleKernel {
      const T* x; T* out; float factor; int64_t n;
      void operator()(sycl::nd_item<1> it) const {
        const int64_t i = it.get_global_id(0);
        if (i < n) out[i] = sgljit::from_float<T>(sgljit::to_float(x[i]) * factor);
      }
    };

    extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
    void scale_functor(const T* x, T* out, float factor, int64_t n) {
      ScaleKernel{x, out, factor, n}(syclext::this_work_item::get_nd_item<1>());
    }
    """
)

# Helpers of kernel.hpp: one work-group per row, 4-wide aligned loads, sub-group + work-group sums.
ROW_STATS = textwrap.dedent(
    """\
    #include <sgljit/sycl/kernel.hpp>

    extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
    SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>))
    void row_stats(const float* x, float* sums, float* maxes, float* sg_sums, int64_t cols) {
      auto it = syclext::this_work_item::get_nd_item<1>();
      const int64_t row = it.get_group(0);
      float s = 0.f, m = -std::numeric_limits<float>::infinity();
      for (int64_t c = it.get_local_id(0) * 4; c < cols; c += it.get_local_range(0) * 4) {
        sgljit::AlignedVector<float, 4> v;
        v.load(x + row * cols + c);
        for (int k = 0; k < 4; ++k) s += v[k], m = sycl::fmax(m, v[k]);
      }
      const float sg = sgljit::sub_group_reduce_sum(s);
      s = sgljit::work_group_reduce_sum(s);
      m = sgljit::work_group_reduce_max(m);
      if (it.get_local_id(0) == 0) sums[row] = s, maxes[row] = m, sg_sums[row] = sg;
    }
    """
)

SCALE_ARGS = ("ptr", "ptr", "f32", "i64")


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    """One module cache for this file (the bridge is built once here, not in the user's cache)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGLJIT_CACHE_DIR", str(tmp_path_factory.mktemp("sycl_cache")))
        yield


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sycl_kernels")
    write(folder, "scale.hpp", SCALE)
    write(folder, "scale_functor.hpp", SCALE_FUNCTOR)
    write(folder, "row_stats.hpp", ROW_STATS)
    return folder


def load_scale(folder: Path, dtype: torch.dtype, file: str = "scale.hpp") -> sycl.SYCLModule:
    t = str(sgljit.make_cpp_args(dtype))
    return sgljit.load_jit_sycl(
        Path(file).stem,
        t,
        sycl_files=[folder / file],
        extra_sycl_cflags=[f"-DSGLJIT_T={t}"],
        route="rtc",
    )


# ------------------------------------------------------------------------------------------------
# Numerics


@needs_runtime
@pytest.mark.sycl
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_scale_matches_torch(kernels, device, dtype):
    fn = load_scale(kernels, dtype).get_function("scale", SCALE_ARGS)
    x = torch.randn(1000, dtype=dtype, device=device)
    out = torch.full_like(x, float("nan"))
    fn(1024, 64, x, out, 2.5, x.numel())
    expected = (x.float() * 2.5).to(dtype)  # fp32 math, one rounding: exactly what the kernel does
    torch.testing.assert_close(out.cpu(), expected.cpu(), rtol=0, atol=0)


@needs_runtime
@pytest.mark.sycl
@pytest.mark.parametrize("device", DEVICES)
def test_scale_functor_wrapper(kernels, device):
    fn = load_scale(kernels, torch.float32, "scale_functor.hpp").get_function(
        "scale_functor", SCALE_ARGS
    )
    x = torch.randn(300, device=device)
    out = torch.empty_like(x)
    fn(320, 32, x, out, -0.5, x.numel())
    torch.testing.assert_close(out.cpu(), (x * -0.5).cpu(), rtol=0, atol=0)


@needs_runtime
@pytest.mark.sycl
def test_kernel_helpers_reductions_and_aligned_vector(kernels):
    mod = sgljit.load_jit_sycl("row_stats", sycl_files=[kernels / "row_stats.hpp"], route="rtc")
    fn = mod.get_function("row_stats", ("ptr", "ptr", "ptr", "ptr", "i64"))
    rows, cols, wg = 5, 4096, 64
    x = torch.randn(rows, cols)
    sums, maxes, sg_sums = torch.empty(rows), torch.empty(rows), torch.empty(rows)
    fn(rows * wg, wg, x, sums, maxes, sg_sums, cols)
    torch.testing.assert_close(sums, x.sum(1), rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(maxes, x.amax(1), rtol=0, atol=0)
    # Work-item 0's sub-group (16 items, each striding 4 floats over 64 items) covers these columns:
    cols_of_sg0 = (torch.arange(cols) // 4) % wg < 16
    torch.testing.assert_close(sg_sums, x[:, cols_of_sg0].sum(1), rtol=1e-5, atol=1e-3)


@needs_runtime
@pytest.mark.sycl
def test_get_function_is_cached_per_signature(kernels):
    mod = load_scale(kernels, torch.float32)
    assert mod.get_function("scale", SCALE_ARGS) is mod.get_function("scale", list(SCALE_ARGS))
    assert mod.get_function("scale", SCALE_ARGS) is not mod.get_function("scale", ("ptr",) * 4)
    # the same specialization loaded again shares the process's compiled bundle (same key)
    assert load_scale(kernels, torch.float32).key == mod.key
    assert mod.build() is mod  # compiles now (already compiled: a no-op)


@needs_runtime
@pytest.mark.sycl
def test_launch_errors_name_the_problem(kernels):
    mod = load_scale(kernels, torch.float32)
    fn = mod.get_function("scale", SCALE_ARGS)
    x = torch.zeros(8)
    with pytest.raises(TypeError, match="takes 4 arguments"):
        fn(8, 8, x, x, 1.0)
    with pytest.raises(ValueError, match="multiple of local_size"):
        fn(10, 4, x, x, 1.0, 8)
    with pytest.raises(ValueError, match="unknown argument kinds"):
        mod.get_function("scale", ("ptr", "float"))
    with pytest.raises(AttributeError, match="no kernel named 'nope'"):
        mod.get_function("nope", ("ptr",))(1, 1, x)


# ------------------------------------------------------------------------------------------------
# Errors


@needs_runtime
@pytest.mark.sycl
def test_compile_error_carries_clang_diagnostics(tmp_path):
    bad = write(
        tmp_path, "bad.hpp", SCALE.replace("int64_t n) {", "int64_t n) { undeclared_thing();")
    )
    mod = sgljit.load_jit_sycl(
        "bad", sycl_files=[bad], extra_sycl_cflags=["-DSGLJIT_T=float"], route="rtc"
    )
    with pytest.raises(sgljit.CompileError) as info:  # at the first launch on a device ...
        mod.get_function("scale", SCALE_ARGS)(8, 8, torch.zeros(8), torch.zeros(8), 1.0, 8)
    with pytest.raises(sgljit.CompileError):  # ... or when asked to build; nothing is kept
        mod.build("cpu")
    err = info.value
    assert "use of undeclared identifier 'undeclared_thing'" in err.output
    assert "bad.hpp" in err.output  # the diagnostic points into the user's file
    assert "-DSGLJIT_T=float" in err.command
    assert "undeclared_thing" in str(err)


def test_missing_runtime_names_the_packages(monkeypatch):
    monkeypatch.setattr(sycl, "_dist_file", lambda dist, suffix: None)
    sycl.find_runtime.cache_clear()
    try:
        with pytest.raises(
            sycl.SYCLRuntimeNotFound, match=r"pip install intel-sycl-rt==2026\.1\.2 intel-opencl-rt"
        ):
            sycl.find_runtime()
    finally:
        sycl.find_runtime.cache_clear()


# ------------------------------------------------------------------------------------------------
# Cache behaviour


@needs_runtime
@pytest.mark.sycl
@pytest.mark.parametrize("reach", ["include_dirs", "-I dir", "-Idir", "-isystem dir"])
def test_header_edit_rebuilds_the_kernel(tmp_path, reach):
    """However the header's folder is named (include_dirs, or flags of one or two words), it is a
    recorded dependency: an edit rebuilds."""
    header = write(tmp_path / "inc", "factor.h", "#define FACTOR 2.0f\n")
    flags = {
        "include_dirs": [],
        "-I dir": ["-I", str(header.parent)],
        "-Idir": [f"-I{header.parent}"],
        "-isystem dir": ["-isystem", str(header.parent)],
    }[reach]
    name = "edit_" + {"include_dirs": "dirs", "-I dir": "I2", "-Idir": "I1"}.get(reach, "isystem")
    src = write(
        tmp_path,
        "k.hpp",
        SCALE.replace(
            "#include <sgljit/sycl/kernel.hpp>",
            '#include <sgljit/sycl/kernel.hpp>\n#include "factor.h"',
        ).replace("* factor)", "* factor * FACTOR)"),
    )

    def run() -> tuple[str, torch.Tensor]:
        mod = sgljit.load_jit_sycl(
            name,
            sycl_files=[src],
            include_dirs=[header.parent] if reach == "include_dirs" else [],
            extra_sycl_cflags=["-DSGLJIT_T=float", *flags],
            route="rtc",
        )
        x, out = torch.ones(16), torch.empty(16)
        mod.get_function("scale", SCALE_ARGS)(16, 16, x, out, 1.0, 16)
        return out

    out1 = run()
    header.write_text("#define FACTOR 3.0f\n")
    sgljit.clear_module_cache()
    out2 = run()
    assert out1.eq(2).all() and out2.eq(3).all()
    # one key, two builds: the header is a recorded dependency
    variants = list(Path(os.environ["SGLJIT_CACHE_DIR"]).glob(f"sycl/opencl-*/{name}-*/*/"))
    assert len({v.parent for v in variants}) == 1 and len(variants) == 2


# Macros the runtime compiler's device compile defines and the host preprocessor does not.
DEVICE_MACROS = (
    "__SYCL_DEVICE_ONLY__",
    "__INTEL_LLVM_COMPILER",
    "SYCL_LANGUAGE_VERSION",
    "__clang__",
)


def recorded(name: str) -> list[str]:
    """The dependencies recorded by the published builds of runtime-compiled module ``name``."""
    cache = Path(os.environ["SGLJIT_CACHE_DIR"])
    manifests = cache.glob(f"sycl/opencl-*/{name}-*/*/{sgljit.cache.MANIFEST}")
    return [path for m in manifests for path, _ in json.loads(m.read_text())["deps"]]


def run_scale(name: str, src: Path, include_dirs=()) -> torch.Tensor:
    """scale(ones, factor 1) of module ``name`` built from ``src`` (float), in a fresh lookup."""
    sgljit.clear_module_cache()
    mod = sgljit.load_jit_sycl(
        name, sycl_files=[src], include_dirs=include_dirs,
        extra_sycl_cflags=["-DSGLJIT_T=float"], route="rtc",
    )  # fmt: skip
    x, out = torch.ones(16), torch.empty(16)
    mod.get_function("scale", SCALE_ARGS)(16, 16, x, out, 1.0, 16)
    return out


@needs_runtime
@pytest.mark.sycl
def test_headers_the_device_compile_includes_under_its_own_macros_are_recorded(tmp_path):
    """Headers included only under a macro the device compile defines (and a host preprocessor
    scan does not) are recorded, from the device compile's own dependency output: editing one
    rebuilds."""
    inc = tmp_path / "inc"
    guards = ""
    for i, macro in enumerate(DEVICE_MACROS):
        write(inc, f"device{i}.h", f"#define FACTOR{i} 1.0f\n")
        guards += (
            f'#if defined({macro})\n#include "device{i}.h"\n#else\n#define FACTOR{i} 0.0f\n#endif\n'
        )
    src = write(
        tmp_path,
        "k.hpp",
        SCALE.replace(
            "#include <sgljit/sycl/kernel.hpp>", "#include <sgljit/sycl/kernel.hpp>\n" + guards
        ).replace("* factor)", "* factor * (FACTOR0 + FACTOR1 + FACTOR2 + FACTOR3))"),
    )
    assert run_scale("device_macros", src, [inc]).eq(4).all()
    deps = recorded("device_macros")
    assert all(f"{{include0}}/device{i}.h" in deps for i in range(4)), deps
    write(inc, "device3.h", "#define FACTOR3 2.0f\n")
    assert run_scale("device_macros", src, [inc]).eq(5).all()


@needs_runtime
@pytest.mark.sycl
def test_a_header_that_appears_where_has_include_found_nothing_rebuilds_the_kernel(tmp_path):
    src = write(
        tmp_path,
        "k.hpp",
        SCALE.replace(
            "#include <sgljit/sycl/kernel.hpp>",
            '#include <sgljit/sycl/kernel.hpp>\n#if __has_include("extra.h")\n#include "extra.h"\n'
            "#else\n#define EXTRA 1.0f\n#endif",
        ).replace("* factor)", "* factor * EXTRA)"),
    )
    assert run_scale("has_include", src).eq(1).all()
    write(tmp_path, "extra.h", "#define EXTRA 3.0f\n")
    assert run_scale("has_include", src).eq(3).all()


@needs_runtime
@pytest.mark.sycl
def test_bridge_rebuilds_when_its_sources_change(tmp_path, monkeypatch):
    """The bridge's key does not hold its folder's path (an installation can move); its recorded
    dependencies decide: a copy loads the same build, an edited header gives a new one."""
    copy = tmp_path / "csrc"
    shutil.copytree(sycl.CSRC_DIR, copy)
    monkeypatch.setenv("SGLJIT_CACHE_DIR", str(tmp_path / "cache"))
    sgljit.clear_module_cache()
    assert sgljit.cache.cache_key(sycl.bridge_spec(copy)) == sgljit.cache.cache_key(
        sycl.bridge_spec()
    )
    sgljit.cache.get_or_build(sycl.bridge_spec(copy))
    sgljit.clear_module_cache()
    sgljit.cache.get_or_build(sycl.bridge_spec())  # the installed sources: same files, same build
    variants = list((tmp_path / "cache").glob("sycl/bridge/sycl_bridge-*/*/"))
    assert len(variants) == 1
    (copy / "sycl_bridge.hpp").write_text((copy / "sycl_bridge.hpp").read_text() + "\n// edit\n")
    sgljit.clear_module_cache()
    sgljit.cache.get_or_build(sycl.bridge_spec(copy))
    assert len(list((tmp_path / "cache").glob("sycl/bridge/sycl_bridge-*/*/"))) == 2


CHILD = textwrap.dedent(
    """\
    import sys, torch, sgljit
    mod = sgljit.load_jit_sycl("scale", "fp32_t", sycl_files=[sys.argv[1]],
                               extra_sycl_cflags=["-DSGLJIT_T=fp32_t"], route="rtc")
    x = torch.arange(1000, dtype=torch.float32)
    out = torch.empty_like(x)
    mod.get_function("scale", ("ptr", "ptr", "f32", "i64"))(1024, 64, x, out, 3.0, x.numel())
    assert torch.equal(out, x * 3), out
    print("child ok")
    """
)


def start_child(script: Path, kernel: Path, cache: Path, **env_vars: str) -> subprocess.Popen:
    env = dict(os.environ, SGLJIT_CACHE_DIR=str(cache), SGLJIT_LOG="info", **env_vars)
    return subprocess.Popen(
        [sys.executable, str(script), str(kernel)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "child ok" in out, err
    return err


@needs_runtime
@pytest.mark.sycl
@pytest.mark.slow
def test_fresh_process_loads_bridge_and_kernels_from_disk(tmp_path, kernels):
    script = write(tmp_path, "child.py", CHILD)
    first = finish(start_child(script, kernels / "scale.hpp", tmp_path / "cache"))
    assert "compiling sycl_bridge" in first and "compiling scale_fp32_t for sycl" in first
    second = finish(
        start_child(script, kernels / "scale.hpp", tmp_path / "cache", SGLJIT_NO_COMPILE="1")
    )
    assert "compiling" not in second, second  # the kernel's device binary came from the cache
    [saved] = (tmp_path / "cache").glob("sycl/opencl-*/scale_fp32_t-*/*/scale_fp32_t.bin")
    assert saved.read_bytes().startswith(b'{"format": "sgljit-sycl-opencl-binary-1"')
    # a module never built is an error naming it and the command that prebuilds it
    other = write(tmp_path / "other", "scale.hpp", SCALE.replace("* factor)", "* factor * 2)"))
    proc = start_child(script, other, tmp_path / "cache", SGLJIT_NO_COMPILE="1")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert (
        "NoCompileError" in err and "scale_fp32_t" in err and "sgljit build --backend sycl" in err
    )


@needs_runtime
@pytest.mark.sycl
@pytest.mark.slow
def test_a_read_only_prebuilt_cache_serves_sycl_modules(tmp_path, kernels):
    """A fleet's prebuilt cache may be read-only: the OpenCL loader's empty vendors folder, which
    sgljit keeps in the cache, then comes from the temporary folder."""
    from .test_cache import read_only

    script, cache = write(tmp_path, "child.py", CHILD), tmp_path / "cache"
    finish(start_child(script, kernels / "scale.hpp", cache))
    # the folder the loader's vendors point at (none was made where OCL_ICD_VENDORS is set)
    shutil.rmtree(cache / "sycl" / "no-opencl-vendors", ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OCL_ICD_")}
    env.update(SGLJIT_CACHE_DIR=str(cache), SGLJIT_LOG="info", SGLJIT_NO_COMPILE="1")
    with read_only(cache):
        proc = subprocess.run(
            [sys.executable, str(script), str(kernels / "scale.hpp")],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert proc.returncode == 0 and "child ok" in proc.stdout, proc.stderr
    assert not (cache / "sycl" / "no-opencl-vendors").exists()


@needs_runtime
@pytest.mark.sycl
@pytest.mark.slow
def test_concurrent_processes_build_the_bridge_once(tmp_path, kernels):
    script = write(tmp_path, "child.py", CHILD)
    procs = [start_child(script, kernels / "scale.hpp", tmp_path / "cache") for _ in range(3)]
    logs = [finish(p) for p in procs]
    assert sum(log.count("compiling sycl_bridge") for log in logs) == 1, logs
    published = list((tmp_path / "cache" / "sycl" / "bridge").glob("sycl_bridge-*"))
    assert len(published) == 1 and not list((tmp_path / "cache").rglob(".staging/*"))


# ------------------------------------------------------------------------------------------------
# icpx route: dry-run plan (icpx itself is only on oneAPI hosts)


def plan(kernels: Path, **kw) -> sycl.IcpxPlan:
    kw.setdefault("extra_sycl_cflags", ["-DSGLJIT_T=bf16_t"])
    return sycl.plan_icpx_build("scale", "bf16_t", sycl_files=[kernels / "scale.hpp"], **kw)


def test_icpx_plan_command_and_generated_launcher(kernels, monkeypatch):
    monkeypatch.setenv("SGLJIT_SYCL_TARGETS", "intel_gpu_pvc,intel_gpu_bmg_g21")
    p = plan(kernels, include_dirs=[kernels], extra_ldflags=["-lm"])
    cmd = list(p.command)
    assert cmd[:2] == ["icpx", "-fsycl"]
    for flag in (
        "-fp-model=precise",
        "-fhonor-nans",
        "-fhonor-infinities",
        "-fno-associative-math",
        "-no-ftz",
    ):
        assert flag in cmd
    assert "-ffast-math" not in cmd
    assert "-fsycl-targets=intel_gpu_pvc,intel_gpu_bmg_g21" in cmd
    assert f"-I{sycl.INCLUDE_DIR}" in cmd and f"-I{kernels.resolve()}" in cmd
    assert cmd.index("-DSGLJIT_T=bf16_t") < cmd.index("module.cpp") < cmd.index("-lm")
    assert cmd[cmd.index("-o") + 1] == "libscale_bf16_t.so"
    assert p.kernels == ("scale",) and p.targets == ("intel_gpu_pvc", "intel_gpu_bmg_g21")
    # kernels get module-unique names (DPC++ kernel names are process-wide) and a by-name getter
    assert "#define scale scale__" in p.source and "#undef scale" in p.source
    assert "SGLJIT_SYCL_API void* sgljit_sycl_kernel_scale(void* queue)" in p.source
    assert "syclexp::get_kernel_id<scale__" in p.source
    assert p.spec.arch == "intel_gpu_pvc+intel_gpu_bmg_g21"


def test_icpx_plan_key(kernels, tmp_path, monkeypatch):
    monkeypatch.setenv("SGLJIT_SYCL_TARGETS", "intel_gpu_pvc")
    base = plan(kernels).key
    assert plan(kernels).key == base
    assert plan(kernels, extra_sycl_cflags=["-DSGLJIT_T=fp16_t"]).key != base
    monkeypatch.setenv("SGLJIT_SYCL_TARGETS", "spir64")
    assert plan(kernels).key != base
    monkeypatch.setenv("SGLJIT_SYCL_TARGETS", "intel_gpu_pvc")
    # headers are recorded dependencies of a build, not part of the key; the key names include
    # folders by role, so a moved installation keeps its key
    inc = write(tmp_path / "inc", "extra.h", "#define X 1\n").parent
    with_inc = plan(kernels, include_dirs=[inc]).key
    assert with_inc != base
    (inc / "extra.h").write_text("#define X 2\n")
    assert plan(kernels, include_dirs=[inc]).key == with_inc
    moved = tmp_path / "moved"
    shutil.copytree(kernels, moved)
    assert (
        sycl.plan_icpx_build(
            "scale",
            "bf16_t",
            sycl_files=[moved / "scale.hpp"],
            extra_sycl_cflags=["-DSGLJIT_T=bf16_t"],
        ).key
        == base
    )
    assert "-MD" in plan(kernels).command  # icpx writes the depfile the cache records


def test_icpx_plan_without_targets_falls_back_to_spir64(kernels, monkeypatch):
    monkeypatch.delenv("SGLJIT_SYCL_TARGETS", raising=False)
    if DEVICES != ["cpu"]:
        pytest.skip("an XPU is present: targets come from the device")
    with pytest.warns(RuntimeWarning, match="spir64"):
        p = plan(kernels)
    assert "-fsycl-targets=spir64" in p.command


@needs_runtime
@pytest.mark.sycl
def test_icpx_generated_unit_compiles_in_the_sycl_front_end(kernels, monkeypatch):
    """icpx is not here, but the runtime compiler is DPC++'s clang: the generated translation unit
    (bridge ABI + renamed kernels + get_kernel_id<kernel> launchers) must compile in it, and the
    kernel must exist under its module-unique name."""
    monkeypatch.setenv("SGLJIT_SYCL_TARGETS", "spir64")
    p = plan(kernels)
    tag_name = next(
        line.split()[2] for line in p.source.splitlines() if line.startswith("#define scale ")
    )
    options = (f"-I{sycl.INCLUDE_DIR}", f"-I{sycl.CSRC_DIR}", f"-I{kernels}", "-DSGLJIT_T=bf16_t")
    rtc = sycl.RtcSource(p.source, options, options, {}, (tag_name,))
    mod = sycl.SYCLModule(p.name, "rtc", "icpx-unit-" + p.key, sycl.bridge(), rtc=rtc)
    x = torch.randn(64, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    mod.get_function(tag_name, SCALE_ARGS)(64, 64, x, out, 2.0, 64)
    torch.testing.assert_close(out, (x.float() * 2).to(torch.bfloat16), rtol=0, atol=0)


def test_find_kernels_follows_the_convention():
    commented = (
        'extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>)) void old('
    )
    src = SCALE_FUNCTOR + f"\n// {commented}\n/* {commented} */\n"
    assert sycl.find_kernels(src) == ("scale_functor",)
    assert sycl.find_kernels(ROW_STATS) == ("row_stats",)  # two property macros


# ------------------------------------------------------------------------------------------------
# Reporting and backend selection


@needs_runtime
@pytest.mark.sycl
def test_describe_reports_the_cpu_device():
    info = sycl.describe()
    assert info["error"] is None and "rtc" in info["routes"]
    assert info["default_route"] == ("icpx" if shutil.which("icpx") else "rtc")
    cpus = [d for d in info["devices"] if d["type"] == "cpu"]
    assert cpus and cpus[0]["can_build_source"], info


def test_cpu_tensors_select_sycl_only_when_forced():
    x = torch.zeros(1)
    assert sgljit.select_backend(x) == "reference"
    with sgljit.use_backend("sycl"):
        assert sgljit.select_backend(x) == "sycl"


@needs_runtime
@pytest.mark.sycl
def test_a_declared_op_runs_its_sycl_kernel_on_cpu_tensors_when_forced(kernels):
    from sgljit.op import Family, Scalar, Sycl, Tensor

    def launch(module, key, x, out, factor):
        fn = module.get_function("scale", SCALE_ARGS)
        fn(-(-x.numel() // 64) * 64, 64, x, out, factor, x.numel())

    family = Family("test_sycl", kernels / "scale.hpp")
    scale_ = family.op(
        "test_sycl_scale",
        args={"x": Tensor("n"), "out": Tensor("n", dtype="x", io="out"), "factor": Scalar(float)},
        reference=lambda x, out, factor: out.copy_(x * factor),
        sycl=Sycl("scale.hpp", key=lambda x, *_: {"SGLJIT_T": x.dtype}, launch=launch),
    )
    x = torch.randn(100)
    out = torch.full_like(x, float("nan"))
    with sgljit.use_backend("sycl"):
        scale_(x, out, 3.0)
        torch.testing.assert_close(out, x * 3.0, rtol=0, atol=0)
        scale_(x, out, 2.0)
    assert len(family._modules) == 1  # one module, built once and memoized


@needs_runtime
@pytest.mark.sycl
@pytest.mark.slow
def test_sgljit_build_keeps_sycl_modules_on_disk(tmp_path, plugin_site):
    """`sgljit build --backend sycl` compiles the declared SYCL specializations into the cache; it
    exports and imports like any cache, and a fresh process with SGLJIT_NO_COMPILE=1 then loads and
    runs them from the imported cache without compiling."""
    env = env_with_site(
        plugin_site,
        SGLJIT_CACHE_DIR=str(tmp_path / "cache"),
        SGLJIT_LOG="info",
    )
    build = subprocess.run(
        [sys.executable, "-m", "sgljit.cli", "build", "--backend", "sycl", "--plugin", "good"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert "1 of 1 built" in build.stdout
    assert list((tmp_path / "cache").glob("sycl/opencl-*/fixture_fill_3-*/*/fixture_fill_3.bin"))
    # export, then import into an empty cache: verified like any module, then used from there
    archive = tmp_path / "sycl-cache.tar.gz"
    for args, cache in ((["export", archive], "cache"), (["import", archive], "imported")):
        moved = subprocess.run(
            [sys.executable, "-m", "sgljit.cli", "cache", *map(str, args)],
            capture_output=True,
            text=True,
            env={**env, "SGLJIT_CACHE_DIR": str(tmp_path / cache)},
        )
        assert moved.returncode == 0, moved.stdout + moved.stderr
    assert "imported 2 modules" in moved.stdout  # the bridge and the kernel module
    env["SGLJIT_CACHE_DIR"] = str(tmp_path / "imported")
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch; from sgljit_fixture_good.ops import sycl_module\n"
            "x = torch.zeros(100)\n"
            "sycl_module(3).get_function('fill', ('ptr', 'i64'))(128, 64, x, 100)\n"
            "assert x.eq(3).all(), x\nprint('OK')",
        ],
        capture_output=True,
        text=True,
        env={**env, "SGLJIT_NO_COMPILE": "1"},
        timeout=300,
    )
    assert run.returncode == 0 and "OK" in run.stdout, run.stderr
    assert "compiling" not in run.stderr

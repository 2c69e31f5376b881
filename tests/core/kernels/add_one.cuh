// A CUDA kernel used by core's tests (compiled in CI without a GPU, run on a GPU when present).
#pragma once
#include <sgljit/cuda.cuh>
#include <sgljit/reduce.cuh>
#include <sgljit/tensor.h>
#include <sgljit/type.cuh>
#include <sgljit/vec.cuh>

template <typename T>
__global__ void add_one_kernel(T* x, int64_t n, float value) {
  sgljit::pdl_wait();  // launched with PDL: the previous kernel's writes to x must be visible
  sgljit::pdl_launch_dependents();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = sgljit::from_float<T>(sgljit::to_float(x[i]) + value);
}

template <typename T>
struct AddOneCuda {
  static void run(tvm::ffi::TensorView x, double value) { run_threads(x, value, 256); }

  // Blocks of `threads` threads: more than a block may hold makes the launch fail.
  static void run_threads(tvm::ffi::TensorView x, double value, int64_t threads) {
    using namespace sgljit;
    SymbolicSize n{"n"};
    auto dt = SymbolicDType::of<T>();
    SymbolicDevice dev;
    TensorMatcher({n}).contiguous().with_dtype(dt).with_device(kDLCUDA, dev).verify(x, "x");
    RuntimeCheck(threads > 0, "threads: expected a positive count, got ", threads);
    LaunchKernel(add_one_kernel<T>, dim3(div_ceil<int64_t>(n.value(), threads)), dim3(unsigned(threads)), 0, dev.value(),
                 "add_one_kernel")
        .pdl()(static_cast<T*>(x.data_ptr()), n.value(), static_cast<float>(value));
  }
};

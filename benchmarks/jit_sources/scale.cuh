// CUDA kernel for the JIT-machinery benchmark: out = x * kScale (float32), validated, launched on
// torch's current stream by sgljit::LaunchKernel (run) or by the runtime's cudaLaunchKernelEx
// (run_runtime_launch: the launch LaunchKernel's driver path is measured against); run_alloc
// allocates out in C++ through tvm-ffi's environment allocator (torch's, during a call on torch
// tensors) and returns it, against torch.empty_like in Python.
#pragma once

#include <sgljit/cuda.cuh>
#include <sgljit/tensor.h>

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstdint>

template <int kScale>
__global__ void scale_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * kScale;
}

template <int kScale>
struct ScaleCuda {
  static void run(tvm::ffi::TensorView x, tvm::ffi::TensorView out) {
    launch(x, out.data_ptr(), checked_len(x, &out));
  }

  static tvm::ffi::Tensor run_alloc(tvm::ffi::TensorView x) {
    const int64_t len = checked_len(x);
    tvm::ffi::Tensor out = tvm::ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, x.shape(), x.dtype(), x.device());
    launch(x, out.data_ptr(), len);
    return out;
  }

  static void run_runtime_launch(tvm::ffi::TensorView x, tvm::ffi::TensorView out) {
    const int64_t len = checked_len(x, &out);
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(blocks(len));
    config.blockDim = dim3(kThreads);
    config.stream = sgljit::get_stream(x.device());
    sgljit::check_cuda(cudaLaunchKernelEx(&config, scale_kernel<kScale>, static_cast<const float*>(x.data_ptr()),
                                          static_cast<float*>(out.data_ptr()), len),
                       "cudaLaunchKernelEx");
  }

 private:
  static constexpr int kThreads = 256;

  // x's length, x a float32 CUDA vector; out, when given, of the same length and device.
  static int64_t checked_len(const tvm::ffi::TensorView& x, const tvm::ffi::TensorView* out = nullptr) {
    sgljit::SymbolicSize n{"n"};
    sgljit::SymbolicDevice dev;
    sgljit::TensorMatcher({n}).with_dtype<float>().with_device(kDLCUDA, dev).verify(x, "x");
    if (out != nullptr) sgljit::TensorMatcher({n}).with_dtype<float>().with_device(dev).verify(*out, "out");
    return n.value();
  }

  static unsigned blocks(int64_t len) { return static_cast<unsigned>(sgljit::div_ceil(len, int64_t{kThreads})); }

  static void launch(const tvm::ffi::TensorView& x, void* out, int64_t len) {
    sgljit::LaunchKernel(scale_kernel<kScale>, dim3(blocks(len)), dim3(kThreads), 0, x.device(), "scale_kernel")(
        static_cast<const float*>(x.data_ptr()), static_cast<float*>(out), len);
  }
};

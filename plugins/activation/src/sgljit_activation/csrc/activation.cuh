// activation: scaled_silu, out = silu(x) * scale with silu(x) = x / (1 + exp(-x)); fp32 math, one cast.
//
// ScaledSilu<T>::run is what the op spec (ops.py, Cuda(...)) names: sgljit generates a function that
// checks the arguments as the spec declares them (shapes, strides, dtypes, device, overlap) and then
// calls run, so run may rely on them: input and out [rows, cols] of T, unit last stride, one device.
// The kernel is a grid-stride loop over the elements, launched on torch's current stream.
#pragma once

#include <sgljit/cuda.cuh>
#include <sgljit/type.cuh>
#include <sgljit/utils.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>

namespace sgljit_activation {

template <typename T>
__global__ void scaled_silu_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t rows, int64_t cols,
                                   int64_t in_stride, int64_t out_stride, float scale) {
  sgljit::pdl_wait();  // first: launched with PDL, the previous kernel may still be running
  sgljit::pdl_launch_dependents();
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const float x = sgljit::to_float(in[r * in_stride + c]);
    out[r * out_stride + c] = sgljit::from_float<T>(x / (1.0f + expf(-x)) * scale);
  }
}

template <typename T>
struct ScaledSilu {
  static constexpr int kThreads = 256;
  static constexpr int kBlocksPerSm = 8;  // enough resident threads to keep memory busy

  static void run(tvm::ffi::TensorView input, tvm::ffi::TensorView out, double scale) {
    const int64_t rows = input.size(0), cols = input.size(1);
    const DLDevice device = input.device();
    const int64_t blocks = std::min<int64_t>(sgljit::div_ceil<int64_t>(rows * cols, kThreads),
                                             int64_t{sgljit::num_sms(device.device_id)} * kBlocksPerSm);
    // An empty grid (rows * cols == 0) launches nothing.
    sgljit::LaunchKernel(scaled_silu_kernel<T>, static_cast<unsigned>(blocks), kThreads, 0, device, "scaled_silu")
        .pdl()(static_cast<const T*>(input.data_ptr()), static_cast<T*>(out.data_ptr()), rows, cols, input.stride(0),
               out.stride(0), static_cast<float>(scale));
  }
};

}  // namespace sgljit_activation

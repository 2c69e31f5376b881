// The dynamic per-tensor op's second kernel of two: every block reduces the absmax pass's (few
// hundred) partial maxima itself, computes the scale (block 0 stores it), then quantizes with a
// persistent grid, walking the tensor backwards so the tail the absmax pass kept in L2 is re-read
// before later misses evict it. Loads 16 bytes, stores packed fp8, evict-first both ways.
#pragma once

#include "common.cuh"

namespace sgljit_quant_fp8 {

using namespace sgljit;

struct DynamicPassConfig {
  static constexpr int kThreads = 512;  // with kMinBlocks: 1024 threads per SM
  static constexpr int kUnroll = 4;     // vectors in flight per thread
  static constexpr int kMinBlocks = 2;  // __launch_bounds__: caps registers at 64, two blocks per SM
};

// Grid-stride over slices of gridDim.x * blockDim.x vectors (one per thread), U slices per iteration
// so U loads are in flight per thread; the vector index is mirrored (v -> nv - 1 - v), so the pass
// starts at the end of the tensor (a warp still covers 32 adjacent vectors, in descending order).

template <typename T, typename Q, int VEC, int U, int kMode>
SGLJIT_DEVICE void quant_slices(const T* in, uint8_t* out, const Divider& div, int64_t numel) {
  using IO = Io<T, VEC>;
  const int64_t nv = numel / VEC;
  const int64_t slice = int64_t(gridDim.x) * blockDim.x;
  const int64_t base = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t num_slices = div_ceil<int64_t>(nv, slice);
  for (int64_t i = 0; i < num_slices; i += U) {
    typename IO::V x[U];
    int64_t v[U];
    bool ok[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t f = (i + k) * slice + base;  // forward order; the vector is nv - 1 - f
      ok[k] = f < nv;
      v[k] = nv - 1 - f;
      if (ok[k]) x[k] = IO::template load<true>(in + v[k] * VEC);
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      if (ok[k]) IO::template quantize_store<Q, kMode>(x[k], div, out + v[k] * VEC);
    }
  }
  const int64_t i = nv * VEC + base;  // the last numel % VEC elements
  if (i < numel) out[i] = to_fp8<Q>(div.template operator()<kMode>(to_float(in[i])));
}

// Reduces partial[0, num_partial) (written by the absmax kernel just before: pdl_wait orders it),
// stores the scale (block 0) and quantizes, from the end of the tensor backwards.
template <typename T, typename Q, int VEC>
__global__
__launch_bounds__(DynamicPassConfig::kThreads, DynamicPassConfig::kMinBlocks) void per_tensor_dynamic_quant_kernel(
    const T* __restrict__ in, uint8_t* __restrict__ out, float* __restrict__ scale,
    const uint32_t* __restrict__ partial, int num_partial, int64_t numel) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ uint32_t red[32];
  const float s = scale_from_partials<Q>(partial, num_partial, red);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
  const Divider div(s);
  if (Divider::fast(s)) {
    quant_slices<T, Q, VEC, DynamicPassConfig::kUnroll, kFastQuotient<T, true>>(in, out, div, numel);
  } else {
    quant_slices<T, Q, VEC, DynamicPassConfig::kUnroll, kDivide>(in, out, div, numel);
  }
}

}  // namespace sgljit_quant_fp8

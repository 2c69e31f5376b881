// The dynamic per-tensor op's absmax pass (partial maxima) and the finalize kernel (partials -> scale).
#pragma once

#include "common.cuh"

#ifndef QUANT_FP8_ABSMAX_UNROLL  // 16-byte loads in flight per thread in the absmax pass
#define QUANT_FP8_ABSMAX_UNROLL 8
#endif
#ifndef QUANT_FP8_ABSMAX_THREADS  // 1024: one block per SM (62 registers), so 132 partial maxima on
#define QUANT_FP8_ABSMAX_THREADS 1024  // the H200; 512 (2 blocks, 264): 16384x4096 bf16 0.6-1 us slower
#endif

namespace sgljit_quant_fp8 {

using namespace sgljit;

// ------------------------------------------------------------------------------------------------
// Per-tensor, dynamic scale: two kernels (absmax -> partial maxima, quantize).

// partial[blockIdx.x] = max |x| bits over this block's vectors of every slice (see quant_slices) and,
// in the last block, the last numel % VEC elements. Slices starting at or after vector `keep_from`
// are loaded with normal L2 priority (kept for the quantize pass), the others evict-first.
template <typename T, int VEC>
__global__ __launch_bounds__(QUANT_FP8_ABSMAX_THREADS) void per_tensor_absmax_kernel(
    const T* __restrict__ in, uint32_t* __restrict__ partial, int64_t numel, int64_t keep_from, bool prefetch) {
  constexpr int U = QUANT_FP8_ABSMAX_UNROLL;
  using IO = Io<T, VEC>;
  const int64_t nv = numel / VEC;
  const int64_t slice = int64_t(gridDim.x) * blockDim.x;
  const int64_t base = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (prefetch) {
    // The grid is resident at once: the first round of loads starts under the previous kernel's
    // tail (see sgljit::prefetch_l2).
#pragma unroll
    for (int k = 0; k < U; ++k) {
      if (k * slice + base < nv) prefetch_l2(in + (k * slice + base) * VEC);
    }
  }
  pdl_wait();
  pdl_launch_dependents();
  __shared__ uint32_t red[32];
  const int64_t num_slices = div_ceil<int64_t>(nv, slice);
  AbsMax<T, VEC> acc;
  for (int64_t i = 0; i < num_slices; i += U) {
    typename IO::V x[U];
    bool ok[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t first = (i + k) * slice, v = first + base;
      ok[k] = v < nv;
      if (ok[k]) {
        if (first >= keep_from) {  // uniform across the grid
          x[k] = IO::template load<false>(in + v * VEC);
        } else {
          x[k] = IO::template load<true>(in + v * VEC);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      if (ok[k]) acc.add(x[k]);
    }
  }
  uint32_t m = acc.bits();
  if (blockIdx.x == gridDim.x - 1) {
    for (int64_t i = nv * VEC + threadIdx.x; i < numel; i += blockDim.x) m = max(m, abs_bits(to_float(in[i])));
  }
  m = block_reduce_max_u32(m, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

// Three kernels (see the top of this file): one block reduces the absmax kernel's partial maxima to
// the scale, so the quantize pass can be the static kernel below (walking backwards) instead of a
// pass whose every block reduces the partials itself.
inline constexpr int kFinalizeThreads = 256;
template <typename Q>
__global__ __launch_bounds__(kFinalizeThreads) void per_tensor_finalize_kernel(const uint32_t* __restrict__ partial,
                                                                               int num_partial, float* __restrict__ scale) {
  // Trigger first: the quantize pass's blocks take SMs as the absmax pass drains and wait there
  // (their pdl_wait returns once this kernel is done) instead of launching after this one's wait.
  // On the H200 0.1-0.4% faster at 16384x4096 and 65536x4096, within noise.
  pdl_launch_dependents();
  pdl_wait();
  __shared__ uint32_t red[32];
  const float s = scale_from_partials<Q>(partial, num_partial, red);
  if (threadIdx.x == 0) *scale = s;
}

}  // namespace sgljit_quant_fp8

// The dynamic per-tensor op's first kernel, the absmax pass, and (three kernels) the finalize kernel.
//
// Absmax pass: a persistent grid (SMs x resident blocks) strides over "slices" (one vector per
// thread of the grid, consecutive slices adjacent in memory) with AbsmaxConfig::kUnroll 16-byte
// loads in flight per thread. bf16/fp16 are reduced packed (see AbsMax). Slices before the last
// AbsmaxConfig::kL2KeepPct % of the L2 size are loaded evict-first, the tail with normal priority,
// so it is still in L2 when the quantize pass (which walks backwards) starts. Each block writes its
// maximum to workspace[block]: no zeroing, no atomics, no inter-block race; the next kernel's
// pdl_wait orders those writes before its reads.
// Finalize: one block reduces the partial maxima to the scale, so the quantize pass of three kernels
// can be the static rows kernel (see rows.cuh).
#pragma once

#include "common.cuh"

namespace sgljit_quant_fp8 {

using namespace sgljit;

struct AbsmaxConfig {
  static constexpr int kThreads = 1024;    // one block per SM: few partial maxima to reduce after
  static constexpr int kUnroll = 8;        // 16-byte loads in flight per thread
  static constexpr int kL2KeepPct = 45;    // the tail kept in L2 for the quantize pass, % of L2
  static constexpr int kL2KeepMaxL2s = 4;  // ... only for tensors up to this many times the L2 size
};

// partial[blockIdx.x] = max |x| bits over this block's vectors of every slice (see quant_slices) and,
// in the last block, the last numel % VEC elements. Slices starting at or after vector `keep_from`
// are loaded with normal L2 priority (kept for the quantize pass), the others evict-first.
template <typename T, int VEC>
__global__ __launch_bounds__(AbsmaxConfig::kThreads) void per_tensor_absmax_kernel(
    const T* __restrict__ in, uint32_t* __restrict__ partial, int64_t numel, int64_t keep_from, bool prefetch) {
  constexpr int U = AbsmaxConfig::kUnroll;
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

// Three kernels: one block reduces the absmax kernel's partial maxima to the scale, so the quantize
// pass can be the static rows kernel (walking backwards) instead of a pass whose every block reduces
// the partials itself.
inline constexpr int kFinalizeThreads = 256;
template <typename Q>
__global__ __launch_bounds__(kFinalizeThreads) void per_tensor_finalize_kernel(const uint32_t* __restrict__ partial,
                                                                               int num_partial, float* __restrict__ scale) {
  // Trigger first: the quantize pass's blocks take SMs as the absmax pass drains and wait there
  // (their pdl_wait returns once this kernel is done) instead of launching after this one's wait.
  pdl_launch_dependents();
  pdl_wait();
  __shared__ uint32_t red[32];
  const float s = scale_from_partials<Q>(partial, num_partial, red);
  if (threadIdx.x == 0) *scale = s;
}

}  // namespace sgljit_quant_fp8

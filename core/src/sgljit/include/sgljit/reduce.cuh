// Warp, lane-group and block reductions: sums and maxima of fp32, maxima of uint32 (|x| as bits,
// see fp8.cuh's abs_bits).
//
// A lane group is kWidth consecutive lanes of a warp, kWidth a power of two <= 32, starting at a
// multiple of kWidth; warp_reduce_* give every lane of the group the group's result. `mask` names the
// lanes that take part: the whole warp (kFullMask) where every lane calls, else group_mask<kWidth>()
// (groups of one warp that return early need not wait for each other).
#pragma once

#include <cstdint>

#include "utils.h"

namespace sgljit {

inline constexpr unsigned kFullMask = 0xffffffffu;

// The lanes of the calling thread's group of kWidth lanes, for shuffles only the group reaches.
template <int kWidth>
SGLJIT_DEVICE unsigned group_mask() {
  if constexpr (kWidth == 32) {
    return kFullMask;
  } else {
    return ((1u << kWidth) - 1u) << (threadIdx.x % 32 / kWidth * kWidth);
  }
}

template <int kWidth = 32>
SGLJIT_DEVICE float warp_reduce_sum(float v, unsigned mask = kFullMask) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(mask, v, offset);
  return v;
}

// N sums at once, a shuffle of each per step: the N shuffles of a step are in flight together.
template <int kWidth, int N>
SGLJIT_DEVICE void warp_reduce_sum(float (&v)[N], unsigned mask) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(mask, v[i], offset);
  }
}

template <int kWidth = 32>
SGLJIT_DEVICE float warp_reduce_max(float v, unsigned mask = kFullMask) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(mask, v, offset));
  return v;
}

// Unsigned max (of abs_bits: a NaN-propagating absmax).
template <int kWidth = 32>
SGLJIT_DEVICE uint32_t warp_reduce_max(uint32_t v, unsigned mask = kFullMask) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(mask, v, offset));
  return v;
}

// All threads of the block get the sum. blockDim.x must be a multiple of 32; `smem` holds 32 floats.
// Safe to call repeatedly with the same `smem`: the trailing barrier protects reuse.
SGLJIT_DEVICE float block_reduce_sum(float v, float* smem) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
  v = warp_reduce_sum(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < num_warps ? smem[lane] : 0.0f;
  v = warp_reduce_sum(v);
  __syncthreads();
  return v;
}

SGLJIT_DEVICE float block_reduce_max(float v, float* smem) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
  v = warp_reduce_max(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < num_warps ? smem[lane] : -INFINITY;
  v = warp_reduce_max(v);
  __syncthreads();
  return v;
}

}  // namespace sgljit

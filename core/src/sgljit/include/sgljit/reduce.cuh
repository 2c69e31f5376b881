// Warp and block reductions over fp32.
#pragma once

#include "utils.h"

namespace sgljit {

inline constexpr unsigned kFullMask = 0xffffffffu;

template <int kWidth = 32>
SGLJIT_DEVICE float warp_reduce_sum(float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

template <int kWidth = 32>
SGLJIT_DEVICE float warp_reduce_max(float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
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

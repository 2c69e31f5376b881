// The dynamic per-tensor op in one cooperative launch with bulk copies (sm_90+; "fused").
//
// The tensor is cut into chunks of FusedConfig::kStageBytes; block b (one per SM) owns chunks
// b, b + G, b + 2G, ... (interleaved, so the grid reads one window of memory at a time, as a
// grid-stride loop does). Phase A reads each owned chunk once: the last `stash_chunks` into a stash
// in shared memory (kept there for phase B), the others through a ring of FusedConfig::kStages bulk
// copies (the last `l2_chunks` of them evict-last, so they are still in L2 for phase B), reducing
// the absmax. The block's max goes to workspace[block]; a grid barrier; every block reduces the
// maxima to the scale. Phase B quantizes the stash, then re-reads the ring's chunks in reverse order
// (the L2-kept ones first). The ring's copies run ahead across the barrier: the first chunks of
// phase B are in flight while the grid waits. Stash and L2 hold what DRAM would otherwise send twice.
#pragma once

#include <cooperative_groups.h>

#include <sgljit/bulk.cuh>

#include "common.cuh"

namespace sgljit_quant_fp8 {

using namespace sgljit;

struct FusedConfig {
  static constexpr int kThreads = 512;                 // one block per SM, 4 vectors of a chunk each
  static constexpr int kStages = 3;                    // ring depth (bulk copies in flight per block)
  static constexpr int kStageBytes = 32768;            // one chunk, one bulk copy
  static constexpr int kChunkVecs = kStageBytes / 16;  // 16-byte vectors
  static constexpr int kL2Pct = 45;                    // % of L2 phase A reads evict-last for phase B
};
static_assert(FusedConfig::kChunkVecs % FusedConfig::kThreads == 0, "a chunk must hold whole vectors per thread");

// Calls f(vector index in the chunk) for this thread's vectors of a chunk of n vectors.
template <typename F>
SGLJIT_DEVICE void for_chunk(int n, F&& f) {
#pragma unroll
  for (int k = 0; k < FusedConfig::kChunkVecs / FusedConfig::kThreads; ++k) {
    const int i = threadIdx.x + k * FusedConfig::kThreads;
    if (i < n) f(i);
  }
}

// Launched cooperatively with FusedConfig::kThreads threads; dynamic shared memory: stash_chunks
// chunks, then the ring (FusedConfig::kStages chunks) if some block owns more chunks than that. Input
// and output 16-byte aligned (the host checks).
template <typename T, typename Q>
__global__ __launch_bounds__(FusedConfig::kThreads, 1) void per_tensor_fused_kernel(
    const T* __restrict__ in, uint8_t* __restrict__ out, float* __restrict__ scale,
    uint32_t* __restrict__ workspace, int64_t numel, int stash_chunks, int l2_chunks) {
  constexpr int VEC = kVecSize<T>;
  constexpr int S = FusedConfig::kStages, CV = FusedConfig::kChunkVecs;
  using IO = Io<T, VEC>;
  static_assert(sizeof(typename IO::V) == 16, "the fused kernel moves 16-byte vectors");
  extern __shared__ uint4 dyn_smem[];
  __shared__ uint64_t full[S];
  __shared__ uint64_t stash_full;
  __shared__ uint32_t red[32];
  uint4* const stash = dyn_smem;
  uint4* const ring = dyn_smem + int64_t(stash_chunks) * CV;

  const int64_t nv = numel / VEC, num_chunks = div_ceil<int64_t>(nv, CV);
  const int G = gridDim.x, b = blockIdx.x, tid = threadIdx.x;
  const bool last_block = b == G - 1;
  // This block's i-th chunk is chunk b + i * G of the tensor: vectors [first(i), first(i) + size(i)).
  const int owned = b < num_chunks ? int((num_chunks - 1 - b) / G + 1) : 0;
  const int stashed = min(stash_chunks, owned), num_a = owned - stashed;
  auto first = [&](int i) { return (b + int64_t(i) * G) * CV; };
  auto size = [&](int i) { return int(min(int64_t(CV), nv - first(i))); };
  // The ring's g-th copy: owned chunk g (phase A, forward), then 2 * num_a - 1 - g (phase B, backward).
  auto chunk_of = [&](int g) { return g < num_a ? g : 2 * num_a - 1 - g; };
  auto issue = [&](int g) {  // thread 0 only
    const int i = chunk_of(g);
    const uint32_t bytes = uint32_t(size(i)) * 16u;
    const bool keep_in_l2 = g < num_a && i >= num_a - l2_chunks;
    mbarrier_expect_tx(&full[g % S], bytes);
    bulk_copy_g2s(ring + (g % S) * CV, in + first(i) * VEC, bytes, &full[g % S],
                  keep_in_l2 ? l2_evict_last() : l2_evict_first());
  };
  // Ring copy g: wait for its stage, hand it to f(stage, owned chunk index), then refill the stage
  // with copy g + S once every thread is done with it.
  auto ring_step = [&](int g, auto&& f) {
    mbarrier_wait(&full[g % S], uint32_t(g / S) & 1u);
    f(ring + (g % S) * CV, chunk_of(g));
    __syncthreads();
    if (tid == 0 && g + S < 2 * num_a) issue(g + S);
  };

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) mbarrier_init(&full[s], 1);
    mbarrier_init(&stash_full, 1);
    mbarrier_fence_init();
  }
  __syncthreads();
  pdl_wait();
  pdl_launch_dependents();
  if (tid == 0) {
    if (stashed > 0) {
      uint32_t bytes = 0;
      for (int r = 0; r < stashed; ++r) bytes += uint32_t(size(num_a + r)) * 16u;
      mbarrier_expect_tx(&stash_full, bytes);
      for (int r = 0; r < stashed; ++r) {
        bulk_copy_g2s(stash + r * CV, in + first(num_a + r) * VEC, uint32_t(size(num_a + r)) * 16u, &stash_full,
                      l2_evict_first());
      }
    }
    for (int g = 0; g < min(S, 2 * num_a); ++g) issue(g);
  }

  // Phase A: absmax.
  AbsMax<T, VEC> acc;
  for (int g = 0; g < num_a; ++g) {
    ring_step(g, [&](const uint4* src, int i) { for_chunk(size(i), [&](int v) { acc.add(src[v]); }); });
  }
  if (stashed > 0) {
    mbarrier_wait(&stash_full, 0);
    for (int r = 0; r < stashed; ++r) {
      for_chunk(size(num_a + r), [&](int i) { acc.add(stash[r * CV + i]); });
    }
  }
  uint32_t m = acc.bits();
  if (last_block) {
    for (int64_t i = nv * VEC + tid; i < numel; i += FusedConfig::kThreads) m = max(m, abs_bits(to_float(in[i])));
  }
  m = block_reduce_max_u32(m, red);
  if (tid == 0) workspace[b] = m;
  cooperative_groups::this_grid().sync();  // also orders the workspace writes before the reads

  const float s = scale_from_partials<Q, FusedConfig::kThreads>(workspace, G, red);
  if (b == 0 && tid == 0) *scale = s;
  const Divider div(s);

  // Phase B: quantize.
  auto phase_b = [&](auto mode) {
    constexpr int kMode = decltype(mode)::value;
    auto quantize = [&](const uint4* src, int i) {
      uint8_t* dst = out + first(i) * VEC;
      for_chunk(size(i), [&](int v) { IO::template quantize_store<Q, kMode>(src[v], div, dst + v * VEC); });
    };
    for (int r = 0; r < stashed; ++r) quantize(stash + r * CV, num_a + r);
    for (int g = num_a; g < 2 * num_a; ++g) ring_step(g, quantize);
    if (last_block) {
      for (int64_t i = nv * VEC + tid; i < numel; i += FusedConfig::kThreads) {
        out[i] = to_fp8<Q>(div.template operator()<kMode>(to_float(in[i])));
      }
    }
  };
  if (Divider::fast(s)) {
    phase_b(std::integral_constant<int, kFastQuotient<T, true>>{});
  } else {
    phase_b(std::integral_constant<int, kDivide>{});
  }
}

}  // namespace sgljit_quant_fp8

// The dynamic per-tensor op in one cooperative launch with bulk copies (sm_90+).
#pragma once

#include <cooperative_groups.h>

#include <sgljit/bulk.cuh>

#include "common.cuh"

namespace sgljit_quant_fp8 {

using namespace sgljit;

// ------------------------------------------------------------------------------------------------
// Per-tensor, dynamic scale, cooperative single launch with bulk copies (sm_90+; "fused").
//
// The tensor is cut into chunks of QUANT_FP8_FUSED_STAGE_BYTES; block b (one per SM) owns chunks
// b, b + G, b + 2G, ... (interleaved, so the grid reads one window of memory at a time, as a
// grid-stride loop does). Phase A reads each owned chunk once: the last `stash_chunks` into a stash
// in shared memory (kept there for phase B), the others through a ring of QUANT_FP8_FUSED_STAGES
// bulk copies (the last `l2_chunks` of them evict-last, so they are still in L2 for phase B),
// reducing the absmax. The block's max goes to workspace[block]; a grid barrier; every block reduces
// the maxima to the scale. Phase B quantizes the stash, then re-reads the ring's chunks in reverse
// order (the L2-kept ones first). The ring's copies run ahead across the barrier: the first chunks of
// phase B are in flight while the grid waits. Stash and L2 hold what DRAM would otherwise send twice.

#ifndef QUANT_FP8_FUSED_THREADS
#define QUANT_FP8_FUSED_THREADS 512
#endif
#ifndef QUANT_FP8_FUSED_STAGES
#define QUANT_FP8_FUSED_STAGES 3
#endif
#ifndef QUANT_FP8_FUSED_STAGE_BYTES
#define QUANT_FP8_FUSED_STAGE_BYTES 32768
#endif
#ifndef QUANT_FP8_FUSED_L2_PCT  // % of L2 phase A reads evict-last (re-read first by phase B)
#define QUANT_FP8_FUSED_L2_PCT 45
#endif
#ifndef QUANT_FP8_FUSED_PDL  // launch the cooperative kernel with PDL too (H200: 2048-8192x4096 bf16
#define QUANT_FP8_FUSED_PDL 1  // 2.6-6% faster)
#endif
// Diagnostics only (never on by default: it overwrites the output): each block records %globaltimer
// at its phase boundaries and, after a last grid barrier, writes the 8 stamps as u64 over the
// output's bytes [64 * block, 64 * block + 64). benchmarks/trace_quant_fused.py reads them.
#ifndef QUANT_FP8_FUSED_TRACE
#define QUANT_FP8_FUSED_TRACE 0
#endif

SGLJIT_DEVICE uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

inline constexpr int kFusedThreads = QUANT_FP8_FUSED_THREADS;
inline constexpr int kFusedStages = QUANT_FP8_FUSED_STAGES;
inline constexpr int kFusedChunkVecs = QUANT_FP8_FUSED_STAGE_BYTES / 16;  // 16-byte vectors
static_assert(kFusedChunkVecs % kFusedThreads == 0, "a chunk must hold whole vectors per thread");

// Calls f(vector index in the chunk) for this thread's vectors of a chunk of n vectors.
template <typename F>
SGLJIT_DEVICE void for_chunk(int n, F&& f) {
#pragma unroll
  for (int k = 0; k < kFusedChunkVecs / kFusedThreads; ++k) {
    const int i = threadIdx.x + k * kFusedThreads;
    if (i < n) f(i);
  }
}

// Launched cooperatively with kFusedThreads threads; dynamic shared memory: stash_chunks chunks, then
// the ring (QUANT_FP8_FUSED_STAGES chunks) if some block owns more chunks than that. Input and output
// 16-byte aligned (the host checks).
template <typename T, typename Q>
__global__ __launch_bounds__(kFusedThreads, 1) void per_tensor_fused_kernel(
    const T* __restrict__ in, uint8_t* __restrict__ out, float* __restrict__ scale,
    uint32_t* __restrict__ workspace, int64_t numel, int stash_chunks, int l2_chunks) {
  constexpr int VEC = kVecSize<T>;
  constexpr int S = kFusedStages, CV = kFusedChunkVecs;
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
  uint64_t trace[8] = {};
  auto mark = [&](int i) {
    if constexpr (QUANT_FP8_FUSED_TRACE) trace[i] = global_ns();
  };
  mark(0);
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
    if (g == 0) mark(1);
  }
  mark(2);
  if (stashed > 0) {
    mbarrier_wait(&stash_full, 0);
    for (int r = 0; r < stashed; ++r) {
      for_chunk(size(num_a + r), [&](int i) { acc.add(stash[r * CV + i]); });
    }
  }
  uint32_t m = acc.bits();
  if (last_block) {
    for (int64_t i = nv * VEC + tid; i < numel; i += kFusedThreads) m = max(m, abs_bits(to_float(in[i])));
  }
  m = block_reduce_max_u32(m, red);
  if (tid == 0) workspace[b] = m;
  mark(3);
  cooperative_groups::this_grid().sync();  // also orders the workspace writes before the reads
  mark(4);

  const float s = scale_from_partials<Q, kFusedThreads>(workspace, G, red);
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
    mark(5);
    for (int g = num_a; g < 2 * num_a; ++g) {
      ring_step(g, quantize);
      if (g == num_a + l2_chunks - 1) mark(6);
    }
    if (last_block) {
      for (int64_t i = nv * VEC + tid; i < numel; i += kFusedThreads) {
        out[i] = to_fp8<Q>(div.template operator()<kMode>(to_float(in[i])));
      }
    }
  };
  if (Divider::fast(s)) {
    phase_b(std::integral_constant<int, kFastQuotient<T, true>>{});
  } else {
    phase_b(std::integral_constant<int, kDivide>{});
  }
  if constexpr (QUANT_FP8_FUSED_TRACE) {
    mark(7);
    cooperative_groups::this_grid().sync();
    if (tid == 0) {
      for (int i = 0; i < 8; ++i) reinterpret_cast<uint64_t*>(out)[b * 8 + i] = trace[i];
    }
  }
}

}  // namespace sgljit_quant_fp8

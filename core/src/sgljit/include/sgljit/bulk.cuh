// Bulk (TMA) copies from global into shared memory, completed on an mbarrier (sm_90+).
//
// One thread asks for a whole contiguous range with one instruction; the copy engine moves it while
// the threads compute, and the bytes in flight are bounded by shared memory instead of by registers
// (a register-held load keeps its destination registers until the data arrives). The pattern:
//
//     __shared__ uint64_t bar;
//     if (threadIdx.x == 0) { mbarrier_init(&bar, 1); mbarrier_fence_init(); }
//     __syncthreads();
//     if (threadIdx.x == 0) {
//       mbarrier_expect_tx(&bar, bytes);                      // arrive, and wait for `bytes`
//       bulk_copy_g2s(smem, src, bytes, &bar, l2_evict_first());
//     }
//     mbarrier_wait(&bar, 0);                                 // phase 0 completes: smem holds src
//
// A barrier completes one phase per expect_tx + the bytes of its copies; the k-th use waits on
// parity k & 1. Before sm_90 there are no bulk copies: these trap, and callers choose another kernel
// on the host (compute capability < 9).
#pragma once

#include <cstdint>

#include "utils.h"

namespace sgljit {

// L2 eviction priorities for a bulk copy's source lines (createpolicy): evict-first for data read for
// the last time, evict-last for data that should still be in L2 when it is read again.
SGLJIT_DEVICE uint64_t l2_evict_first() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

SGLJIT_DEVICE uint64_t l2_evict_last() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

SGLJIT_DEVICE uint32_t smem_address(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// `count` arrivals complete a phase (1 for a barrier only its copies' issuer arrives at).
SGLJIT_DEVICE void mbarrier_init(uint64_t* bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count) : "memory");
#else
  __trap();
#endif
}

// Makes initialized barriers visible to the copy engine; then __syncthreads() for the other threads.
SGLJIT_DEVICE void mbarrier_fence_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Arrives on `bar` and adds `bytes` (< 2^20) to the bytes its current phase waits for.
SGLJIT_DEVICE void mbarrier_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

// Returns once the phase of `bar` with parity `parity` has completed (its copies' data is visible).
SGLJIT_DEVICE void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
#else
  __trap();
#endif
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global `src` to shared `dst`;
// completion is counted on `bar` (see mbarrier_expect_tx). `policy`: l2_evict_first() or _last().
SGLJIT_DEVICE void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_address(dst)),
      "l"(src), "r"(bytes), "r"(smem_address(bar)), "l"(policy)
      : "memory");
#else
  __trap();
#endif
}

}  // namespace sgljit

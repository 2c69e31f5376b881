// RMSNorm family: rmsnorm, fused_add_rmsnorm, their Gemma forms (weight 1 + w), qknorm (per head) and
// qknorm_across_heads (per row of q and of k), in one kernel template.
//
//   y = x * rsqrt(mean(x^2) + eps) * w       computed in fp32, cast once to the element type
//
// Fast path (the row width H is a template argument, H a whole number of 16-byte vectors, at most 4096
// of them; 16-byte aligned rows):
//  * a row is spread over kThreads threads ("a row group"), each holding NORM_VECS_PER_THREAD (fused
//    add: half as many) 16-byte vectors of the row and of the weight in registers, loaded together, so
//    x is read from memory once and a row costs one memory round trip; up to 32 threads the group is a
//    (sub-)warp reduced with shuffles only, beyond it a multi-warp group reduced through shared memory;
//  * one row group per block, grid = row groups: the hardware scheduler overlaps one block's
//    reduction and stores with other blocks' loads, which measured faster than a persistent
//    grid-striding wave with the next row prefetched (NORM_PERSISTENT=1 keeps that variant);
//  * loads are plain 16-byte ld.global.nc: the L1::no_allocate + L2::256B hints (NORM_LOAD=0)
//    measured 5% slower at 65536x4096 on the H200. Stores are plain for rmsnorm and streaming
//    (st.global.cs) for the fused add, which writes two rows per row: there they measured 2-6% faster
//    (65536x4096: 530.1 vs 545.7 us), for rmsnorm 0.7% slower (NORM_STORE);
//  * launched with programmatic dependent launch: the block waits for the previous kernel before its
//    first access, and the launch latency overlaps that kernel's tail. In grids of up to one block
//    per SM (small T) the blocks prefetch their rows and the weight into L2 before waiting (one bulk
//    request per row: 128x4096 2.12 -> 1.72 us on the H200 against a prefetch per thread), so the
//    first DRAM round trip overlaps that tail too (NORM_PREFETCH_L2; safe for data the previous kernel
//    writes, see sgljit::prefetch_l2);
//  * many rows (NORM_MANY_ROWS, 16384) of 4096 16-bit elements (512 vectors) take their own row
//    groups (NORM_MANY_*), each measured on the H200 against the default there:
//      - the fused add (also for rows of 257-511 vectors): 128 threads of 4 vectors per stream
//        instead of 256 of 2: 65536x4096 and 16384x4096 2% faster (even with 8 bytes spilled under
//        the 64-register budget; 80 registers gained nothing); at 1024 rows and below 6-40% slower,
//        for wider rows no faster;
//      - rmsnorm: 256 threads of 2 vectors instead of 128 of 4, under a 1536-thread register budget
//        (6 rows in flight per SM instead of 8): 65536x4096 257.6 -> 254.7 us, 16384x4096 65.6 ->
//        65.0 (a plain copy of those bytes, torch.mul, takes 252.0 and 64.7); equal at 128-4096
//        rows; with a 1024-thread budget (4 rows in flight) 16% slower, for wider rows 3-47% slower.
// A launch may serve two row sets (q and k) with different widths: blocks [0, grid_a) work on set a, the
// rest on set b, each share sized by its number of rows.
//
// Generic path (any H, any alignment): one block per row, scalar accesses, two passes over the row
// (the second pass re-reads the row, from L1/L2). Used when the fast path's conditions do not hold.
#pragma once

#include <sgljit/cuda.cuh>
#include <sgljit/reduce.cuh>
#include <sgljit/tensor.h>
#include <sgljit/type.cuh>
#include <sgljit/utils.h>
#include <sgljit/vec.cuh>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <numeric>
#include <cstdint>
#include <cstring>

namespace sgljit_norm {

using sgljit::AlignedVector;
using sgljit::div_ceil;
using sgljit::from_float;
using sgljit::to_float;

// ------------------------------------------------------------------------------------------------
// Configuration
// ------------------------------------------------------------------------------------------------
constexpr int pow2_ceil(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

// Largest number of 16-byte vectors per row on the fast path (1024 threads x 4 vectors): bf16/fp16
// rows up to 32768 elements, fp32 rows up to 16384.
inline constexpr int kMaxVecsPerRow = 4096;

// Tuning knobs (benchmarks/NOTES.md has the measurements behind the defaults); each can be set with
// SGLJIT_EXTRA_CUDA_CFLAGS="-DNAME=value" to compare alternatives.
#ifndef NORM_PERSISTENT  // 1: one wave of blocks grid-striding over rows; 0: one row group per block
#define NORM_PERSISTENT 0
#endif
#ifndef NORM_VECS_PER_THREAD  // 16-byte vectors of a row a thread aims to hold (halved for the fused add)
#define NORM_VECS_PER_THREAD 4
#endif
#ifndef NORM_LOAD  // 0: ld.global.nc with L1::no_allocate + L2::256B prefetch; 1: plain ld.global.nc
#define NORM_LOAD 1
#endif
#ifndef NORM_STORE  // 0: plain 16-byte stores; 1: st.global.cs (streaming) everywhere; 2: in the fused add
#define NORM_STORE 2
#endif
#ifndef NORM_THREADS_PER_SM  // resident threads per SM the register budget is sized for
#define NORM_THREADS_PER_SM 1024
#endif
#ifndef NORM_WEIGHT_IN_REGS  // 0: read the weight (an L1 hit) after the reduction, to save registers
#define NORM_WEIGHT_IN_REGS 1
#endif
#ifndef NORM_PREFETCH_L2  // 1: blocks of small grids prefetch their rows into L2 before the PDL wait
#define NORM_PREFETCH_L2 1
#endif
#ifndef NORM_PREFETCH_BLOCKS_PER_SM  // "small": at most this many blocks per SM
#define NORM_PREFETCH_BLOCKS_PER_SM 1
#endif
#ifndef NORM_MANY_ROWS  // from this many rows, the NORM_MANY_* row groups (0x7fffffff: never)
#define NORM_MANY_ROWS 16384
#endif
#ifndef NORM_MANY_FUSED_VECS  // the fused add's vectors per thread and stream there
#define NORM_MANY_FUSED_VECS 4
#endif
#ifndef NORM_MANY_FUSED_THREADS_PER_SM  // ... and its register budget (1024: 64 registers)
#define NORM_MANY_FUSED_THREADS_PER_SM 1024
#endif
#ifndef NORM_MANY_PLAIN_VECS  // rmsnorm's vectors per thread there
#define NORM_MANY_PLAIN_VECS 2
#endif
#ifndef NORM_MANY_PLAIN_THREADS_PER_SM  // ... and its register budget (1536: 40 registers)
#define NORM_MANY_PLAIN_THREADS_PER_SM 1536
#endif
#ifndef NORM_MIN_BLOCK  // threads of the smallest block: several row groups share a block below it
#define NORM_MIN_BLOCK 128
#endif
inline constexpr bool kPersistent = NORM_PERSISTENT != 0;

// 16-byte vectors per thread and stream a row aims at: the fused add reads two rows (input and
// residual) per row, so it holds half as many of each; `kMany`: the many-rows configs (see launch_norm).
template <bool kFused, bool kMany = false>
inline constexpr int kVecTarget = kMany ? (kFused ? NORM_MANY_FUSED_VECS : NORM_MANY_PLAIN_VECS)
                                  : kFused ? std::max(1, NORM_VECS_PER_THREAD / 2)
                                           : NORM_VECS_PER_THREAD;

// Threads of a multi-warp row group of n vectors at about `target` vectors a thread: a power of two,
// unless whole warps leave fewer vector slots idle (H=5120: 160 threads x 4 instead of 256 x 3, 11-17%
// faster on the H200; where both leave as many idle, the power of two measured as fast or faster).
constexpr int idle_slots(int n, int threads) { return threads * div_ceil(n, threads) - n; }
constexpr int group_threads(int n, int target) {
  const int pow2 = std::clamp(pow2_ceil(div_ceil(n, target)), 64, 1024);
  const int warps = std::clamp(div_ceil(div_ceil(n, target), 32) * 32, 64, 1024);
  return idle_slots(n, warps) < idle_slots(n, pow2) ? warps : pow2;
}

// How a row of kH elements of T is spread over threads holding about kTarget vectors each.
template <typename T, int kH, int kTarget>
struct RowConfig {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte vector
  static constexpr int kNumVec = kH / kVec;                        // vectors per row
  static constexpr bool kValid = kH > 0 && kH % kVec == 0 && kNumVec <= kMaxVecsPerRow;
  // Up to 32 * kTarget vectors: a power-of-two sub-warp, reduced with shuffles only.
  // Beyond: a multi-warp group of 64..1024 threads (group_threads).
  static constexpr int kThreads =
      !kValid                       ? 1
      : kNumVec <= 32 * kTarget     ? std::min(32, pow2_ceil(kNumVec))
                                    : group_threads(kNumVec, kTarget);
  static constexpr int kVecsPerThread = kValid ? div_ceil(kNumVec, kThreads) : 0;
  // Within the target a thread keeps the weight in registers (loaded with the row, so both are one
  // memory round trip); wider rows (only where 1024 threads are not enough) read the weight from L1
  // after the reduction, to stay within the register budget without spilling.
  static constexpr bool kWeightInRegs = NORM_WEIGHT_IN_REGS && kVecsPerThread <= kTarget;
  // Persistent blocks prefetch their next row into registers while finishing the current one.
  static constexpr bool kPrefetch = kPersistent && kWeightInRegs;
};

// Threads per block: one multi-warp row group, or 4 warps of (sub-)warp groups. Small blocks spread
// few rows over many SMs (latency at small T); at large T an SM holds 8+ of them. Two row sets (q and
// k) share a block: a multiple of both groups.
constexpr int group_block(int threads) {
  return threads >= NORM_MIN_BLOCK ? threads : div_ceil(NORM_MIN_BLOCK, threads) * threads;
}
template <typename T, int kHA, int kHB, int kTarget>
inline constexpr int kBlockThreads =
    kHB > 0 ? std::lcm(group_block(RowConfig<T, kHA, kTarget>::kThreads), group_block(RowConfig<T, kHB, kTarget>::kThreads))
            : group_block(RowConfig<T, kHA, kTarget>::kThreads);

inline constexpr int kGenericThreads = 256;

// A set of rows: row r is at outer index r / inner and inner index r % inner (inner = heads for
// qknorm, 1 otherwise); strides in elements. In-place ops pass out == in.
template <typename T>
struct RowSet {
  const T* in;
  T* out;
  T* res;  // fused add: the residual (read, then overwritten with in + res); unused otherwise
  const T* weight;
  int64_t rows, inner;
  int64_t in_s0, in_s1, out_s0, out_s1, res_s0, res_s1;
};

struct RowOffsets {
  int64_t in, out, res;
};

template <typename T>
SGLJIT_DEVICE RowOffsets row_offsets(const RowSet<T>& s, int64_t row) {
  int64_t o = row, i = 0;
  if (s.inner != 1) {
    o = row / s.inner;
    i = row - o * s.inner;
  }
  return {o * s.in_s0 + i * s.in_s1, o * s.out_s0 + i * s.out_s1, o * s.res_s0 + i * s.res_s1};
}

// 16-byte load of a row through the read-only path (NORM_LOAD=0: with L1::no_allocate + L2::256B hints).
template <typename V>
SGLJIT_DEVICE void load_stream(V& v, const void* ptr) {
  static_assert(sizeof(V) == 16, "load_stream moves 16 bytes");
  uint4 r;
#if NORM_LOAD == 0
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(ptr));
#else
  r = __ldg(static_cast<const uint4*>(ptr));
#endif
  memcpy(&v, &r, sizeof(V));
}

// 16-byte store of a row's output: streaming (st.global.cs, evict-first) for NORM_STORE=1, and for
// the fused add (kFused) with NORM_STORE=2; plain otherwise.
template <bool kFused, typename V>
SGLJIT_DEVICE void store_stream(const V& v, void* ptr) {
  static_assert(sizeof(V) == 16, "store_stream moves 16 bytes");
  if constexpr (NORM_STORE == 1 || (NORM_STORE == 2 && kFused)) {
    uint4 r;
    memcpy(&r, &v, sizeof(V));
    __stcs(static_cast<uint4*>(ptr), r);
  } else {
    *static_cast<V*>(ptr) = v;
  }
}

// Sum over a row group of kThreads threads (all threads of the block call it, every iteration).
template <int kThreads, int kBlock>
SGLJIT_DEVICE float group_sum(float v, float* red) {
  if constexpr (kThreads <= 32) {
    return sgljit::warp_reduce_sum<kThreads>(v);
  } else {
    constexpr int kWarps = kThreads / 32;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = sgljit::warp_reduce_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    // red is double-buffered by the caller, so no second barrier is needed before it is rewritten.
    v = lane < kWarps ? red[(warp / kWarps) * kWarps + lane] : 0.0f;
    return sgljit::warp_reduce_sum(v);
  }
}

// ------------------------------------------------------------------------------------------------
// Fast path
// ------------------------------------------------------------------------------------------------
template <typename T, int kH, int kTarget, int kBlock, bool kGemma, bool kFused>
SGLJIT_DEVICE void norm_rows(const RowSet<T>& s, int64_t first, int64_t step, float eps, float* red) {
  using Cfg = RowConfig<T, kH, kTarget>;
  static_assert(Cfg::kValid, "RowConfig: H must be a multiple of the vector width, at most 4096 vectors");
  constexpr int kVec = Cfg::kVec, kNumVec = Cfg::kNumVec, kTPR = Cfg::kThreads, kVPT = Cfg::kVecsPerThread;
  constexpr bool kPrefetch = Cfg::kPrefetch, kWeightInRegs = Cfg::kWeightInRegs;
  constexpr int kRowsPerBlock = kBlock / kTPR;
  static_assert(kBlock % kTPR == 0, "a block holds whole row groups");
  constexpr bool kExact = kNumVec % kTPR == 0;  // every thread has kVPT vectors
  constexpr int kRedSlots = kBlock / 32;
  using V = AlignedVector<T, kVec>;

  const int sub = threadIdx.x / kTPR, lane = threadIdx.x % kTPR;
  const int64_t groups = div_ceil<int64_t>(s.rows, kRowsPerBlock);
  if (first >= groups) return;  // the same for the whole block

  // Vector j of this thread is vector j * kTPR + lane of the row: consecutive lanes, consecutive 16 bytes.
  auto has = [lane](int j) { return kExact || j * kTPR + lane < kNumVec; };
  auto col = [lane](int j) { return (j * kTPR + lane) * kVec; };

  V w[kWeightInRegs ? kVPT : 1];
  if constexpr (kWeightInRegs) {
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      if (has(j)) w[j].load(s.weight + col(j));
    }
  }

  V x[kVPT], r[kVPT];
  auto load_row = [&](const RowOffsets& o, V* xv, V* rv) {
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      if (has(j)) {
        load_stream(xv[j], s.in + o.in + col(j));
        if constexpr (kFused) load_stream(rv[j], s.res + o.res + col(j));
      }
    }
  };

  int64_t g = first;
  int64_t row = g * kRowsPerBlock + sub;
  bool valid = row < s.rows;
  RowOffsets off{0, 0, 0};
  if (kPrefetch && valid) {
    off = row_offsets(s, row);
    load_row(off, x, r);
  }

  int parity = 0;
  for (; g < groups; g += step) {
    const int64_t g_next = g + step;
    const int64_t row_next = g_next * kRowsPerBlock + sub;
    const bool valid_next = g_next < groups && row_next < s.rows;
    RowOffsets off_next{0, 0, 0};
    V xn[kPrefetch ? kVPT : 1], rn[kPrefetch && kFused ? kVPT : 1];
    if constexpr (kPrefetch) {
      // The next row of this thread's group is in flight while the current one is finished.
      if (valid_next) {
        off_next = row_offsets(s, row_next);
        load_row(off_next, xn, rn);
      }
    } else {
      if (valid) {
        off = row_offsets(s, row);
        load_row(off, x, r);
      }
    }

    float ss = 0.0f;
    if (valid) {
#pragma unroll
      for (int j = 0; j < kVPT; ++j) {
        if (has(j)) {
          if constexpr (kFused) {
#pragma unroll
            for (int e = 0; e < kVec; ++e) x[j][e] = from_float<T>(to_float(x[j][e]) + to_float(r[j][e]));
            store_stream<kFused>(x[j], s.res + off.res + col(j));
          }
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            const float f = to_float(x[j][e]);
            ss += f * f;
          }
        }
      }
    }
    ss = group_sum<kTPR, kBlock>(ss, red + parity * kRedSlots);
    parity ^= 1;
    const float inv_rms = rsqrtf(ss / static_cast<float>(kH) + eps);
    if (valid) {
#pragma unroll
      for (int j = 0; j < kVPT; ++j) {
        if (has(j)) {
          V wv;
          if constexpr (kWeightInRegs) {
            wv = w[j];
          } else {
            wv.load(s.weight + col(j));
          }
          V y;
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            float wf = to_float(wv[e]);
            if constexpr (kGemma) wf += 1.0f;
            y[e] = from_float<T>(to_float(x[j][e]) * inv_rms * wf);
          }
          store_stream<kFused>(y, s.out + off.out + col(j));
        }
      }
    }

    if constexpr (kPrefetch) {
#pragma unroll
      for (int j = 0; j < kVPT; ++j) {
        x[j] = xn[j];
        if constexpr (kFused) r[j] = rn[j];
      }
      off = off_next;
    } else {
      row = row_next;
    }
    valid = valid_next;
  }
}

// Prefetches into L2 the row(s) that row group `g` of set s works on first, one bulk request per row
// from the group's first thread (see sgljit::prefetch_l2_bulk; the fast path's rows are contiguous
// and 16-byte aligned), and the set's weight from its first group.
template <typename T, int kH, int kTarget, int kBlock, bool kFused>
SGLJIT_DEVICE void prefetch_rows(const RowSet<T>& s, int64_t g) {
  using Cfg = RowConfig<T, kH, kTarget>;
  constexpr int kTPR = Cfg::kThreads;
  constexpr uint32_t kRowBytes = Cfg::kNumVec * 16;
  const int64_t row = g * (kBlock / kTPR) + threadIdx.x / kTPR;
  if (threadIdx.x % kTPR != 0 || row >= s.rows) return;
  const RowOffsets o = row_offsets(s, row);
  sgljit::prefetch_l2_bulk(s.in + o.in, kRowBytes);
  if constexpr (kFused) sgljit::prefetch_l2_bulk(s.res + o.res, kRowBytes);
  if (g == 0 && threadIdx.x == 0) sgljit::prefetch_l2_bulk(s.weight, kRowBytes);
}

// kThreadsPerSM: the resident threads per SM the register budget is sized for.
template <typename T, int kBlock, bool kGemma, bool kFused, int kHA, int kHB, int kTarget, int kThreadsPerSM>
__global__ void __launch_bounds__(kBlock, std::max(1, kThreadsPerSM / kBlock))
    norm_kernel(const RowSet<T> a, const RowSet<T> b, const int grid_a, const float eps, const int prefetch_blocks) {
  __shared__ float red[2 * (kBlock / 32)];
  if (NORM_PREFETCH_L2 && static_cast<int>(blockIdx.x) < prefetch_blocks) {
    if (static_cast<int>(blockIdx.x) < grid_a) {
      prefetch_rows<T, kHA, kTarget, kBlock, kFused>(a, blockIdx.x);
    } else if constexpr (kHB > 0) {
      prefetch_rows<T, kHB, kTarget, kBlock, kFused>(b, blockIdx.x - grid_a);
    }
  }
  sgljit::pdl_wait();
  sgljit::pdl_launch_dependents();
  if (static_cast<int>(blockIdx.x) < grid_a) {
    norm_rows<T, kHA, kTarget, kBlock, kGemma, kFused>(a, blockIdx.x, grid_a, eps, red);
  } else {
    if constexpr (kHB > 0) {
      norm_rows<T, kHB, kTarget, kBlock, kGemma, kFused>(b, blockIdx.x - grid_a, gridDim.x - grid_a, eps, red);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Generic path: any width, any alignment
// ------------------------------------------------------------------------------------------------
template <typename T, bool kGemma, bool kFused>
SGLJIT_DEVICE void norm_rows_generic(const RowSet<T>& s, int64_t h, int64_t first, int64_t step, float eps,
                                     float* red) {
  for (int64_t row = first; row < s.rows; row += step) {
    const RowOffsets off = row_offsets(s, row);
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
      float v = to_float(s.in[off.in + c]);
      if constexpr (kFused) {
        const T sum = from_float<T>(v + to_float(s.res[off.res + c]));
        s.res[off.res + c] = sum;
        v = to_float(sum);
      }
      ss += v * v;
    }
    ss = sgljit::block_reduce_sum(ss, red);
    const float inv_rms = rsqrtf(ss / static_cast<float>(h) + eps);
    // The second pass reads what this same thread read (or, fused, wrote) in the first.
    const T* src = kFused ? s.res + off.res : s.in + off.in;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
      float wf = to_float(s.weight[c]);
      if constexpr (kGemma) wf += 1.0f;
      s.out[off.out + c] = from_float<T>(to_float(src[c]) * inv_rms * wf);
    }
  }
}

template <typename T, bool kGemma, bool kFused>
__global__ void __launch_bounds__(kGenericThreads)
    norm_generic_kernel(const RowSet<T> a, const int64_t ha, const RowSet<T> b, const int64_t hb,
                        const int grid_a, const float eps) {
  __shared__ float red[32];
  sgljit::pdl_wait();
  sgljit::pdl_launch_dependents();
  if (static_cast<int>(blockIdx.x) < grid_a) {
    norm_rows_generic<T, kGemma, kFused>(a, ha, blockIdx.x, grid_a, eps, red);
  } else {
    norm_rows_generic<T, kGemma, kFused>(b, hb, blockIdx.x - grid_a, gridDim.x - grid_a, eps, red);
  }
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
bool fast_layout(const RowSet<T>& s, bool fused) {
  constexpr int64_t kVec = 16 / sizeof(T);
  bool ok = aligned16(s.in) && aligned16(s.out) && aligned16(s.weight);
  ok = ok && s.in_s0 % kVec == 0 && s.in_s1 % kVec == 0 && s.out_s0 % kVec == 0 && s.out_s1 % kVec == 0;
  if (fused) ok = ok && aligned16(s.res) && s.res_s0 % kVec == 0 && s.res_s1 % kVec == 0;
  return ok;
}

// Splits `grid` blocks between two sets of ga and gb row groups (gb == 0: one set).
inline void split_grid(int64_t ga, int64_t gb, int64_t cap, int* grid_a, int* grid) {
  if (gb == 0) {
    *grid_a = static_cast<int>(std::min(ga, cap));
    *grid = *grid_a;
    return;
  }
  const int64_t total = std::min(ga + gb, std::max<int64_t>(cap, 2));
  int64_t a = std::clamp<int64_t>((total * ga + (ga + gb) / 2) / (ga + gb), 1, ga);
  int64_t b = std::clamp<int64_t>(total - a, 1, gb);
  *grid_a = static_cast<int>(a);
  *grid = static_cast<int>(a + b);
}

// The fast kernel over sets a and b (row groups of kTarget vectors per thread).
template <typename T, int kHA, int kHB, bool kGemma, bool kFused, int kTarget, int kThreadsPerSM>
void launch_fast(const RowSet<T>& a, const RowSet<T>& b, bool has_b, float eps, DLDevice device, const char* name) {
  constexpr int kBlock = kBlockThreads<T, kHA, kHB, kTarget>;
  constexpr auto kernel = norm_kernel<T, kBlock, kGemma, kFused, kHA, kHB, kTarget, kThreadsPerSM>;
  const int64_t ga = div_ceil<int64_t>(a.rows, kBlock / RowConfig<T, kHA, kTarget>::kThreads);
  int64_t gb = 0;
  if constexpr (kHB > 0) {
    if (has_b) gb = div_ceil<int64_t>(b.rows, kBlock / RowConfig<T, kHB, kTarget>::kThreads);
  }
  // Not persistent: a block per row group, the hardware keeps the SMs fed (grid.x allows 2^31 - 1).
  const int sms = sgljit::num_sms(device.device_id);
  const int64_t cap = kPersistent ? int64_t{sms} * sgljit::resident_blocks<kernel>(device.device_id, kBlock)
                                  : int64_t{0x7fffffff};
  int grid_a = 0, grid = 0;
  split_grid(ga, gb, cap, &grid_a, &grid);
  // The prefetch before the PDL wait measured 6-42% faster for grids of up to one block per SM
  // (1-128 rows of 4096) and up to 54% slower with every block of 1024 rows prefetching (the whole
  // input's prefetches compete with the previous kernel's loads): only small grids use it.
  const int prefetch_blocks = grid <= int64_t{sms} * NORM_PREFETCH_BLOCKS_PER_SM ? grid : 0;
  sgljit::LaunchKernel(kernel, grid, kBlock, 0, device, name).pdl()(a, b, grid_a, eps, prefetch_blocks);
}

// Launches the norm over set a (width ha) and, if has_b, set b (width hb). kHA/kHB: the compiled widths
// (0: generic only). Falls back to the generic kernel when a row is not 16-byte aligned.
template <typename T, int kHA, int kHB, bool kGemma, bool kFused>
void launch_norm(const RowSet<T>& a, int64_t ha, const RowSet<T>& b, int64_t hb, bool has_b, float eps,
                 DLDevice device, const char* name) {
  const bool fast = kHA > 0 && (!has_b || kHB > 0) && fast_layout(a, kFused) && (!has_b || fast_layout(b, kFused));
  // Two row sets share a block size (a multiple of both groups); the rare pairs for which that exceeds
  // 1024 threads take the generic kernel.
  if constexpr (kHA > 0 && kBlockThreads<T, kHA, kHB, kVecTarget<kFused>> <= 1024) {
    if (fast) {
      constexpr int kThreadsPerSM = kHB > 0 ? NORM_THREADS_PER_SM * 3 / 4 : NORM_THREADS_PER_SM;
      // Many rows of the widths the many-rows row groups were measured faster for (see the top of
      // this file): the fused add 257-512 vectors, rmsnorm 512.
      constexpr int kManyThreadsPerSM = kFused ? NORM_MANY_FUSED_THREADS_PER_SM : NORM_MANY_PLAIN_THREADS_PER_SM;
      constexpr int kNumVec = RowConfig<T, kHA, 1>::kNumVec;
      constexpr bool kManyWidth = kFused ? kNumVec > 256 && kNumVec <= 512 : kNumVec == 512;
      using Many = RowConfig<T, kHA, kVecTarget<kFused, true>>;
      if constexpr (kHB == 0 && NORM_MANY_ROWS < 0x7fffffff && kManyWidth && Many::kWeightInRegs) {
        if (a.rows >= NORM_MANY_ROWS) {
          launch_fast<T, kHA, kHB, kGemma, kFused, kVecTarget<kFused, true>, kManyThreadsPerSM>(a, b, has_b, eps,
                                                                                               device, name);
          return;
        }
      }
      launch_fast<T, kHA, kHB, kGemma, kFused, kVecTarget<kFused>, kThreadsPerSM>(a, b, has_b, eps, device, name);
      return;
    }
  }
  constexpr auto kernel = norm_generic_kernel<T, kGemma, kFused>;
  const int64_t resident = int64_t{sgljit::num_sms(device.device_id)} *
                           sgljit::resident_blocks<kernel>(device.device_id, kGenericThreads);
  int grid_a = 0, grid = 0;
  split_grid(a.rows, has_b ? b.rows : 0, resident, &grid_a, &grid);
  sgljit::LaunchKernel(kernel, grid, kGenericThreads, 0, device, name).pdl()(a, ha, has_b ? b : a, has_b ? hb : ha,
                                                                        grid_a, eps);
}

template <typename T>
RowSet<T> rows_2d(const tvm::ffi::TensorView& in, const tvm::ffi::TensorView& out, const tvm::ffi::TensorView* res,
                  const tvm::ffi::TensorView& weight) {
  // The stride of a size-1 dimension is meaningless (and may be anything): make it 0.
  const int64_t n = in.size(0);
  auto s0 = [n](const tvm::ffi::TensorView& t) { return n == 1 ? int64_t{0} : t.stride(0); };
  RowSet<T> s{};
  s.in = static_cast<const T*>(in.data_ptr());
  s.out = static_cast<T*>(out.data_ptr());
  s.res = res ? static_cast<T*>(res->data_ptr()) : nullptr;
  s.weight = static_cast<const T*>(weight.data_ptr());
  s.rows = n;
  s.inner = 1;
  s.in_s0 = s0(in);
  s.out_s0 = s0(out);
  s.res_s0 = res ? s0(*res) : 0;
  return s;
}

template <typename T>
RowSet<T> rows_heads(const tvm::ffi::TensorView& x, const tvm::ffi::TensorView& weight) {
  const int64_t n = x.size(0), heads = x.size(1);
  RowSet<T> s{};
  s.in = static_cast<const T*>(x.data_ptr());
  s.out = static_cast<T*>(x.data_ptr());
  s.res = nullptr;
  s.weight = static_cast<const T*>(weight.data_ptr());
  s.rows = n * heads;
  s.inner = heads;
  s.in_s0 = s.out_s0 = n == 1 ? 0 : x.stride(0);
  s.in_s1 = s.out_s1 = heads == 1 ? 0 : x.stride(1);
  return s;
}

// The entry points. Shapes, strides, dtypes, devices and overlap were checked by the code sgljit.op
// generates from the op's declared arguments (see ops.py); here only what the specialization adds.
inline void check_width(int64_t compiled, int64_t actual, const char* name) {
  sgljit::RuntimeCheck(compiled == 0 || compiled == actual, name, ": this module was compiled for width ", compiled,
                       ", got ", actual);
}

// out = rmsnorm(input) * weight (kGemma: * (1 + weight)). input, out: [T, H] with unit last stride.
template <typename T, int kH, bool kGemma>
struct RMSNorm {
  static void run(tvm::ffi::TensorView input, tvm::ffi::TensorView weight, tvm::ffi::TensorView out, double eps) {
    check_width(kH, input.size(1), "input");
    if (input.size(0) == 0) return;
    const RowSet<T> a = rows_2d<T>(input, out, nullptr, weight);
    launch_norm<T, kH, 0, kGemma, false>(a, input.size(1), a, 0, false, static_cast<float>(eps), input.device(),
                                         kGemma ? "gemma_rmsnorm" : "rmsnorm");
  }
};

// residual <- input + residual (rounded to T); input <- rmsnorm(residual) * weight (in place).
template <typename T, int kH, bool kGemma>
struct FusedAddRMSNorm {
  static void run(tvm::ffi::TensorView input, tvm::ffi::TensorView residual, tvm::ffi::TensorView weight,
                  double eps) {
    check_width(kH, input.size(1), "input");
    if (input.size(0) == 0) return;
    const RowSet<T> a = rows_2d<T>(input, input, &residual, weight);
    launch_norm<T, kH, 0, kGemma, true>(a, input.size(1), a, 0, false, static_cast<float>(eps), input.device(),
                                        kGemma ? "gemma_fused_add_rmsnorm" : "fused_add_rmsnorm");
  }
};

// In place, per head: q [T, Hq, D], k [T, Hk, D] (unit last stride, any other strides), weights [D].
template <typename T, int kD>
struct QKNorm {
  static void run(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView q_weight,
                  tvm::ffi::TensorView k_weight, double eps) {
    const int64_t d = q.size(2);
    check_width(kD, d, "q");
    if (q.size(0) == 0) return;
    const RowSet<T> a = rows_heads<T>(q, q_weight), b = rows_heads<T>(k, k_weight);
    const bool has_b = b.rows > 0;
    if (a.rows == 0) {
      if (has_b) launch_norm<T, kD, 0, false, false>(b, d, b, 0, false, static_cast<float>(eps), q.device(), "qknorm");
      return;
    }
    launch_norm<T, kD, kD, false, false>(a, d, b, d, has_b, static_cast<float>(eps), q.device(), "qknorm");
  }
};

// In place, per row: q [T, Wq], k [T, Wk] (unit last stride), q_weight [Wq], k_weight [Wk].
template <typename T, int kWQ, int kWK>
struct QKNormAcrossHeads {
  static void run(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView q_weight,
                  tvm::ffi::TensorView k_weight, double eps) {
    check_width(kWQ, q.size(1), "q");
    check_width(kWK, k.size(1), "k");
    if (q.size(0) == 0) return;
    const RowSet<T> a = rows_2d<T>(q, q, nullptr, q_weight), b = rows_2d<T>(k, k, nullptr, k_weight);
    launch_norm<T, kWQ, kWK, false, false>(a, q.size(1), b, k.size(1), true, static_cast<float>(eps), q.device(),
                                           "qknorm_across_heads");
  }
};

}  // namespace sgljit_norm

// RMSNorm family: rmsnorm, fused_add_rmsnorm, their Gemma forms (weight 1 + w), qknorm (per head) and
// qknorm_across_heads (per row of q and of k), in one kernel template.
//
//   y = x * rsqrt(mean(x^2) + eps) * w       computed in fp32, cast once to the element type T
//
// The weight has T or float32 (W). kRound (Hugging Face's LlamaRMSNorm): x * rsqrt(...) is rounded to T
// before the weight multiply; the fused add then normalizes the float32 sum input + residual, not its
// rounding (sglang's cast_x_before_out_mul). Rows are [T, H], or [B, S, H] with any outer strides.
//
// Fast path (H a template argument, a whole number of 16-byte vectors, at most kMaxVecsPerRow; aligned rows):
//  * a "row group" of threads holds the row and the weight in registers, a few 16-byte vectors a
//    thread loaded together (one memory round trip a row); a (sub-)warp reduced by shuffles up to 32
//    threads, beyond that a multi-warp group reduced through shared memory;
//  * one row group per block (small groups: several), grid = row groups: the hardware overlaps one
//    block's reduction and stores with other blocks' loads;
//  * 16-byte ld.global.nc loads; plain stores, streaming (st.global.cs) for the fused add's two rows;
//  * programmatic dependent launch; grids of at most kPrefetchBlocksPerSM blocks per SM first prefetch
//    their rows and the weight into L2 (one bulk request a row, see sgljit::prefetch_l2), so the first
//    DRAM round trip overlaps the previous kernel's tail;
//  * rows of at most 32 vectors (qknorm's heads) are packed, 2 vectors of each of 2 rows a thread
//    (RowConfig::kPacked), in grids of kPackMinBlocksPerSM+ blocks per SM or where packing makes the
//    grid small enough to prefetch;
//  * many rows (kManyRows) of the widths NormConfig::many_rows_width names and rmsnorm's few rows
//    (kFewRows) of a power-of-two number of vectors take their own row groups and register budgets.
// One launch may serve two row sets (q and k) of different widths: blocks [0, grid_a) take set a.
// Generic path (any H, any alignment): one block per row, scalar accesses, the row read twice (the
// second time from L1/L2). Tuning constants: NormConfig; the evidence: benchmarks/NOTES.md.
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

namespace sgljit_norm {

using sgljit::AlignedVector;
using sgljit::div_ceil;
using sgljit::from_float;
using sgljit::pow2_ceil;
using sgljit::to_float;

// ------------------------------------------------------------------------------------------------
// Configuration
// ------------------------------------------------------------------------------------------------
struct NormConfig {
  // 16-byte vectors of a row a thread holds (the fused add: half as many of each of its two rows).
  static constexpr int kVecsPerThread = 4;
  // Largest row on the fast path (1024 threads x 4 vectors): bf16/fp16 32768 elements, fp32 16384;
  // norm_quant.cuh's too; ops.py's _MAX_VECS_PER_ROW mirrors it.
  static constexpr int kMaxVecsPerRow = 4096;
  // Resident threads per SM the register budget (__launch_bounds__) is sized for: 64 registers.
  static constexpr int kThreadsPerSM = 1024;
  // Threads of the smallest block: several (sub-)warp row groups share a block below it (group_block;
  // norm_quant.cuh's blocks too).
  static constexpr int kMinBlock = 128;
  // Grids of at most this many blocks per SM prefetch into L2 before the PDL wait; in larger grids
  // the prefetches compete with the previous kernel's loads.
  static constexpr int kPrefetchBlocksPerSM = 1;
  // Packed rows of at most 32 vectors (qknorm's heads) from this many blocks per SM: below it (T <= 128
  // for 32/8 heads x 128) packing was 1.03-1.25x slower, above it 0.80-0.91x (ab-qknorm-pack.md).
  static constexpr int kPackMinBlocksPerSM = 4;
  // From this many rows, rows of the many_rows_width widths take the kMany* row groups.
  static constexpr int kManyRows = 16384;
  // Widths (16-byte vectors) where they win (ab-norm-many.md): rmsnorm 256, 320 and 512 (0.95-0.98x;
  // 192, 288, 384-1088 even or up to 1.23x slower), the fused add 512 (at 448: 0.93x without them).
  static constexpr bool many_rows_width(int vecs, bool fused) {
    return vecs == 512 || (!fused && (vecs == 256 || vecs == 320));
  }
  // ... the fused add there: 128 threads of 4 vectors per stream, 71 registers (at 1024 threads'
  // 64 ptxas spills 12 bytes: 1.008x slower at 4096 x 16384-65536, ab-norm-many-budgets.md).
  static constexpr int kManyFusedVecs = 4;
  static constexpr int kManyFusedThreadsPerSM = 896;
  // ... rmsnorm there: 2 vectors a thread, 40 registers (rows of 512 vectors: 256 threads, 6 rows in
  // flight per SM; of 256 / 320: 128 / 160 threads, 12 / 9).
  static constexpr int kManyPlainVecs = 2;
  static constexpr int kManyPlainThreadsPerSM = 1536;
  // Below this many rows, rmsnorm's rows of 256-2048 vectors, a power of two (2048, 4096, 8192, 16384
  // 16-bit elements) take 2 vectors a thread at 32 registers, a full SM of threads: 0.84-0.99x at
  // 1-1024 rows, 1.00-1.02x at 4096; other widths spill there and lose (ab-norm-few-rows.md).
  static constexpr int kFewRows = 4096;
  static constexpr int kFewVecs = 2;
  static constexpr int kFewThreadsPerSM = 2048;
  // Output stores: streaming (st.global.cs) for the fused add, which writes two rows per row; plain
  // for the others.
  template <bool kFused>
  static constexpr bool kStreamingStores = kFused;
};

// 16-byte vectors per thread and stream a row aims at: the fused add reads two rows (input and
// residual) per row, so it holds half as many of each; `kMany`: the many-rows configs (see launch_norm).
template <bool kFused, bool kMany = false>
inline constexpr int kVecTarget = kMany ? (kFused ? NormConfig::kManyFusedVecs : NormConfig::kManyPlainVecs)
                                  : kFused ? std::max(1, NormConfig::kVecsPerThread / 2)
                                           : NormConfig::kVecsPerThread;

// Threads of a multi-warp row group of n vectors at about `target` vectors a thread: a power of two,
// unless whole warps leave fewer vector slots idle (H=5120: 160 threads x 4 instead of 256 x 3); on a
// tie, the power of two.
constexpr int idle_slots(int n, int threads) { return threads * div_ceil(n, threads) - n; }
constexpr int group_threads(int n, int target) {
  const int pow2 = std::clamp(pow2_ceil(div_ceil(n, target)), 64, 1024);
  const int warps = std::clamp(div_ceil(div_ceil(n, target), 32) * 32, 64, 1024);
  return idle_slots(n, warps) < idle_slots(n, pow2) ? warps : pow2;
}

// How a row of kH elements of T is spread over threads holding about kTarget vectors each (W: the
// weight's element type; kPackable: whether rows of at most 32 vectors may be packed, see kPacked).
template <typename T, int kH, int kTarget, typename W = T, bool kPackable = true>
struct RowConfig {
  static constexpr int kVec = sgljit::kVecSize<T>;  // elements per 16-byte vector
  static constexpr int kNumVec = kH / kVec;        // vectors per row
  static constexpr bool kValid = kH > 0 && kH % kVec == 0 && kNumVec <= NormConfig::kMaxVecsPerRow;
  // Up to 32 * kTarget vectors: a power-of-two sub-warp, reduced with shuffles only. Rows of at most 32
  // vectors (qknorm's heads) at the 4-vector target are packed: a thread holds 2 vectors of each of 2
  // rows (kRows), so 4 loads are in flight as in wider rows (launch_norm packs only large grids).
  // Beyond: a multi-warp group of 64..1024 threads (group_threads).
  static constexpr bool kPacked = kPackable && kValid && kNumVec <= 32 && kTarget >= 4;
  static constexpr int kRows = kPacked ? 2 : 1;
  static constexpr int kThreads =
      !kValid                       ? 1
      : kNumVec <= 32 * kTarget     ? std::min(32, pow2_ceil(div_ceil(kNumVec, kPacked ? 2 : 1)))
                                    : group_threads(kNumVec, kTarget);
  static constexpr int kVecsPerThread = kValid ? div_ceil(kNumVec, kThreads) : 0;
  // Within the target's bytes a thread keeps the weight in registers (loaded with the row, so both are
  // one memory round trip); wider rows (only where 1024 threads are not enough) and float32 weights of
  // 16-bit rows beyond it read the weight from L1 after the reduction, to stay within the register
  // budget without spilling. Rows of at most 32 vectors hold at most 2 weight vectors: registers.
  static constexpr bool kWeightInRegs = kNumVec <= 32 || kVecsPerThread * sizeof(W) <= kTarget * sizeof(T);
  // Rows a block of `block` threads holds: its row groups' rows.
  static constexpr int rows_per_block(int block) { return block / kThreads * kRows; }
};

// Threads per block: one multi-warp row group, or 4 warps of (sub-)warp groups. Small blocks spread
// few rows over many SMs (latency at small T); at large T an SM holds 8+ of them. Two row sets (q and
// k) share a block: a multiple of both groups.
constexpr int group_block(int threads) {
  return threads >= NormConfig::kMinBlock ? threads : div_ceil(NormConfig::kMinBlock, threads) * threads;
}
template <typename T, int kHA, int kHB, int kTarget>
inline constexpr int kBlockThreads =
    kHB > 0 ? std::lcm(group_block(RowConfig<T, kHA, kTarget>::kThreads), group_block(RowConfig<T, kHB, kTarget>::kThreads))
            : group_block(RowConfig<T, kHA, kTarget>::kThreads);

inline constexpr int kGenericThreads = 256;

// A set of rows: row r is at outer index r / inner and inner index r % inner (inner = heads for
// qknorm or S of [B, S, H] rows that do not collapse, 1 otherwise); strides in elements. In-place ops
// pass out == in.
template <typename T, typename W>
struct RowSet {
  const T* in;
  T* out;
  T* res;  // fused add: the residual (read, then overwritten with in + res); unused otherwise
  const W* weight;
  int64_t rows, inner;
  int64_t in_s0, in_s1, out_s0, out_s1, res_s0, res_s1;
};

struct RowOffsets {
  int64_t in, out, res;
};

template <typename T, typename W>
SGLJIT_DEVICE RowOffsets row_offsets(const RowSet<T, W>& s, int64_t row) {
  int64_t o = row, i = 0;
  if (s.inner != 1) {
    o = row / s.inner;
    i = row - o * s.inner;
  }
  return {o * s.in_s0 + i * s.in_s1, o * s.out_s0 + i * s.out_s1, o * s.res_s0 + i * s.res_s1};
}

// Sum over a row group of kThreads threads (all threads of the block call it, every iteration): a
// (sub-)warp's shuffles, or beyond 32 threads the warps' sums through `red` (the block's warps' words,
// not the ones the previous reduction used: callers alternate two sets, so one barrier suffices).
template <int kThreads>
SGLJIT_DEVICE float group_sum(float v, float* red) {
  if constexpr (kThreads <= 32) {
    return sgljit::warp_reduce_sum<kThreads>(v);
  } else {
    constexpr int kWarps = kThreads / 32;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = sgljit::warp_reduce_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < kWarps ? red[(warp / kWarps) * kWarps + lane] : 0.0f;
    return sgljit::warp_reduce_sum(v);
  }
}

// One output element from its weight factor wf (Gemma: w + 1): x * inv_rms * wf in fp32, cast once;
// kRound rounds x * inv_rms to T before the weight multiply.
template <typename T, bool kRound>
SGLJIT_DEVICE T norm_out(float x, float inv_rms, float wf) {
  if constexpr (kRound) return from_float<T>(sgljit::round_to<T>(x * inv_rms) * wf);
  return from_float<T>(x * inv_rms * wf);
}

// ------------------------------------------------------------------------------------------------
// Fast path
// ------------------------------------------------------------------------------------------------
template <typename T, typename W, int kH, int kTarget, int kBlock, bool kGemma, bool kFused, bool kRound,
          bool kFloatSum = false>
SGLJIT_DEVICE void norm_rows(const RowSet<T, W>& s, int64_t first, int64_t step, float eps, float* red) {
  using Cfg = RowConfig<T, kH, kTarget, W>;
  static_assert(Cfg::kValid, "RowConfig: H must be a multiple of the vector width, at most 4096 vectors");
  constexpr int kVec = Cfg::kVec, kNumVec = Cfg::kNumVec, kTPR = Cfg::kThreads, kVPT = Cfg::kVecsPerThread;
  constexpr int kR = Cfg::kRows;
  constexpr bool kWeightInRegs = Cfg::kWeightInRegs;
  constexpr int kRowsPerBlock = Cfg::rows_per_block(kBlock);
  static_assert(kBlock % kTPR == 0, "a block holds whole row groups");
  static_assert(kR == 1 || kTPR <= 32, "row groups of several rows are (sub-)warps");
  constexpr bool kExact = kNumVec % kTPR == 0;  // every thread has kVPT vectors
  constexpr int kRedSlots = kBlock / 32;
  using V = AlignedVector<T, kVec>;
  using WV = AlignedVector<W, kVec>;  // the weight of a vector of the row (32 bytes for float32 of 16-bit T)
  constexpr bool kSum = kFused && (kRound || kFloatSum);  // the float32 sums are normalized: kept beside the row

  const int sub = threadIdx.x / kTPR, lane = threadIdx.x % kTPR;
  const int64_t groups = div_ceil<int64_t>(s.rows, kRowsPerBlock);
  if (first >= groups) return;  // the same for the whole block

  // Vector j of this thread is vector j * kTPR + lane of the row: consecutive lanes, consecutive 16 bytes.
  auto has = [lane](int j) { return kExact || j * kTPR + lane < kNumVec; };
  auto col = [lane](int j) { return (j * kTPR + lane) * kVec; };

  WV w[kWeightInRegs ? kVPT : 1];
  if constexpr (kWeightInRegs) {
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      if (has(j)) w[j].load(s.weight + col(j));
    }
  }

  // Grid = row groups, so a block runs one iteration (more only past grid.x's 2^31 - 1 blocks). The
  // group's kR rows are consecutive.
  V x[kR][kVPT], r[kFused ? kR : 1][kVPT];
  float sums[kSum ? kR : 1][kSum ? kVPT : 1][kSum ? kVec : 1];
  RowOffsets off[kR];
  int parity = 0;
  for (int64_t g = first; g < groups; g += step) {
    const int64_t row0 = (g * (kBlock / kTPR) + sub) * kR;
    auto valid = [&](int i) { return row0 + i < s.rows; };
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      if (valid(i)) {
        off[i] = row_offsets(s, row0 + i);
#pragma unroll
        for (int j = 0; j < kVPT; ++j) {
          if (has(j)) {
            sgljit::load16_readonly(x[i][j], s.in + off[i].in + col(j));
            if constexpr (kFused) sgljit::load16_readonly(r[i][j], s.res + off[i].res + col(j));
          }
        }
      }
    }

    float ss[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      ss[i] = 0.0f;
      if (valid(i)) {
#pragma unroll
        for (int j = 0; j < kVPT; ++j) {
          if (has(j)) {
            if constexpr (kFused) {
#pragma unroll
              for (int e = 0; e < kVec; ++e) {
                const float sum = to_float(x[i][j][e]) + to_float(r[i][j][e]);
                if constexpr (kSum) sums[i][j][e] = sum;
                x[i][j][e] = from_float<T>(sum);
              }
              sgljit::store16<NormConfig::kStreamingStores<kFused>>(s.res + off[i].res + col(j), x[i][j]);
            }
#pragma unroll
            for (int e = 0; e < kVec; ++e) {
              float f;
              if constexpr (kSum) {
                f = sums[i][j][e];
              } else {
                f = to_float(x[i][j][e]);
              }
              ss[i] += f * f;
            }
          }
        }
      }
    }
    if constexpr (kR == 1) {
      ss[0] = group_sum<kTPR>(ss[0], red + parity * kRedSlots);
      parity ^= 1;
    } else {
      sgljit::warp_reduce_sum<kTPR>(ss, sgljit::kFullMask);
    }
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      if (!valid(i)) continue;
      const float inv_rms = rsqrtf(ss[i] / static_cast<float>(kH) + eps);
#pragma unroll
      for (int j = 0; j < kVPT; ++j) {
        if (has(j)) {
          WV wv;
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
            if constexpr (kSum) {
              y[e] = norm_out<T, kRound>(sums[i][j][e], inv_rms, wf);
            } else {
              y[e] = norm_out<T, kRound>(to_float(x[i][j][e]), inv_rms, wf);
            }
          }
          sgljit::store16<NormConfig::kStreamingStores<kFused>>(s.out + off[i].out + col(j), y);
        }
      }
    }
  }
}

// Prefetches into L2 the row(s) that row group `g` of set s works on first, one bulk request per row
// from the group's first thread (see sgljit::prefetch_l2_bulk; the fast path's rows are contiguous
// and 16-byte aligned), and the set's weight from its first group.
template <typename T, typename W, int kH, int kTarget, int kBlock, bool kFused>
SGLJIT_DEVICE void prefetch_rows(const RowSet<T, W>& s, int64_t g) {
  using Cfg = RowConfig<T, kH, kTarget>;
  constexpr int kTPR = Cfg::kThreads;
  constexpr uint32_t kRowBytes = Cfg::kNumVec * 16;
  if (g == 0 && threadIdx.x == 0) sgljit::prefetch_l2_bulk(s.weight, kRowBytes / sizeof(T) * sizeof(W));
  const int64_t row0 = (g * (kBlock / kTPR) + threadIdx.x / kTPR) * Cfg::kRows;
  if (threadIdx.x % kTPR != 0) return;
#pragma unroll
  for (int i = 0; i < Cfg::kRows; ++i) {
    if (row0 + i >= s.rows) return;
    const RowOffsets o = row_offsets(s, row0 + i);
    sgljit::prefetch_l2_bulk(s.in + o.in, kRowBytes);
    if constexpr (kFused) sgljit::prefetch_l2_bulk(s.res + o.res, kRowBytes);
  }
}

// kThreadsPerSM: the resident threads per SM the register budget is sized for.
template <typename T, typename W, int kBlock, bool kGemma, bool kFused, bool kRound, int kHA, int kHB, int kTarget,
          int kThreadsPerSM, bool kFloatSum = false>
__global__ void __launch_bounds__(kBlock, std::max(1, kThreadsPerSM / kBlock))
    norm_kernel(const RowSet<T, W> a, const RowSet<T, W> b, const int grid_a, const float eps,
                const int prefetch_blocks) {
  __shared__ float red[2 * (kBlock / 32)];
  if (static_cast<int>(blockIdx.x) < prefetch_blocks) {
    if (static_cast<int>(blockIdx.x) < grid_a) {
      prefetch_rows<T, W, kHA, kTarget, kBlock, kFused>(a, blockIdx.x);
    } else if constexpr (kHB > 0) {
      prefetch_rows<T, W, kHB, kTarget, kBlock, kFused>(b, blockIdx.x - grid_a);
    }
  }
  sgljit::pdl_wait();
  sgljit::pdl_launch_dependents();
  if (static_cast<int>(blockIdx.x) < grid_a) {
    norm_rows<T, W, kHA, kTarget, kBlock, kGemma, kFused, kRound, kFloatSum>(a, blockIdx.x, grid_a, eps, red);
  } else {
    if constexpr (kHB > 0) {
      norm_rows<T, W, kHB, kTarget, kBlock, kGemma, kFused, kRound, kFloatSum>(b, blockIdx.x - grid_a, gridDim.x - grid_a, eps,
                                                                   red);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Generic path: any width, any alignment
// ------------------------------------------------------------------------------------------------
template <typename T, typename W, bool kGemma, bool kFused, bool kRound, bool kFloatSum = false>
SGLJIT_DEVICE void norm_rows_generic(const RowSet<T, W>& s, int64_t h, int64_t first, int64_t step, float eps,
                                     float* red) {
  // kFused && (kRound || kFloatSum) normalize the float32 sums: the residual is written in the second
  // pass, which adds again (each element is read and written by one thread).
  constexpr bool kSum = kFused && (kRound || kFloatSum);
  for (int64_t row = first; row < s.rows; row += step) {
    const RowOffsets off = row_offsets(s, row);
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
      float v = to_float(s.in[off.in + c]);
      if constexpr (kSum) {
        v += to_float(s.res[off.res + c]);
      } else if constexpr (kFused) {
        const T sum = from_float<T>(v + to_float(s.res[off.res + c]));
        s.res[off.res + c] = sum;
        v = to_float(sum);
      }
      ss += v * v;
    }
    ss = sgljit::block_reduce_sum(ss, red);
    const float inv_rms = rsqrtf(ss / static_cast<float>(h) + eps);
    if constexpr (kSum) {
      for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
        const float sum = to_float(s.in[off.in + c]) + to_float(s.res[off.res + c]);
        s.res[off.res + c] = from_float<T>(sum);
        float wf = to_float(s.weight[c]);
        if constexpr (kGemma) wf += 1.0f;
        s.out[off.out + c] = norm_out<T, kRound>(sum, inv_rms, wf);
      }
    } else {
      // The second pass reads what this same thread read (or, fused, wrote) in the first.
      const T* src = kFused ? s.res + off.res : s.in + off.in;
      for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
        float wf = to_float(s.weight[c]);
        if constexpr (kGemma) wf += 1.0f;
        s.out[off.out + c] = norm_out<T, kRound>(to_float(src[c]), inv_rms, wf);
      }
    }
  }
}

template <typename T, typename W, bool kGemma, bool kFused, bool kRound, bool kFloatSum = false>
__global__ void __launch_bounds__(kGenericThreads)
    norm_generic_kernel(const RowSet<T, W> a, const int64_t ha, const RowSet<T, W> b, const int64_t hb,
                        const int grid_a, const float eps) {
  __shared__ float red[32];
  sgljit::pdl_wait();
  sgljit::pdl_launch_dependents();
  if (static_cast<int>(blockIdx.x) < grid_a) {
    norm_rows_generic<T, W, kGemma, kFused, kRound, kFloatSum>(a, ha, blockIdx.x, grid_a, eps, red);
  } else {
    norm_rows_generic<T, W, kGemma, kFused, kRound, kFloatSum>(b, hb, blockIdx.x - grid_a, gridDim.x - grid_a, eps, red);
  }
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
template <typename T, typename W>
bool fast_layout(const RowSet<T, W>& s, bool fused) {
  using sgljit::is_aligned;
  constexpr int64_t kVec = sgljit::kVecSize<T>;
  // The weight is read kVec elements at a time: 32-byte aligned for a float32 weight of 16-bit rows.
  bool ok = is_aligned(s.in, 16) && is_aligned(s.out, 16) && is_aligned(s.weight, kVec * sizeof(W));
  ok = ok && s.in_s0 % kVec == 0 && s.in_s1 % kVec == 0 && s.out_s0 % kVec == 0 && s.out_s1 % kVec == 0;
  if (fused) ok = ok && is_aligned(s.res, 16) && s.res_s0 % kVec == 0 && s.res_s1 % kVec == 0;
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
template <typename T, typename W, int kHA, int kHB, bool kGemma, bool kFused, bool kRound, int kTarget,
          int kThreadsPerSM, bool kFloatSum = false>
void launch_fast(const RowSet<T, W>& a, const RowSet<T, W>& b, bool has_b, float eps, DLDevice device,
                 const char* name) {
  constexpr int kBlock = kBlockThreads<T, kHA, kHB, kTarget>;
  constexpr auto kernel = norm_kernel<T, W, kBlock, kGemma, kFused, kRound, kHA, kHB, kTarget, kThreadsPerSM, kFloatSum>;
  const int64_t ga = div_ceil<int64_t>(a.rows, RowConfig<T, kHA, kTarget>::rows_per_block(kBlock));
  int64_t gb = 0;
  if constexpr (kHB > 0) {
    if (has_b) gb = div_ceil<int64_t>(b.rows, RowConfig<T, kHB, kTarget>::rows_per_block(kBlock));
  }
  // A block per row group, the hardware keeps the SMs fed (grid.x allows 2^31 - 1).
  int grid_a = 0, grid = 0;
  split_grid(ga, gb, int64_t{0x7fffffff}, &grid_a, &grid);
  // Only small grids prefetch into L2 before the PDL wait (NormConfig::kPrefetchBlocksPerSM).
  const int sms = sgljit::num_sms(device.device_id);
  const int prefetch_blocks = grid <= int64_t{sms} * NormConfig::kPrefetchBlocksPerSM ? grid : 0;
  sgljit::LaunchKernel(kernel, grid, kBlock, 0, device, name).pdl()(a, b, grid_a, eps, prefetch_blocks);
}

// Launches the norm over set a (width ha) and, if has_b, set b (width hb). kHA/kHB: the compiled widths
// (0: generic only). Falls back to the generic kernel when a row is not 16-byte aligned.
// kFloatSum (fused only): the float32 sums are normalized, as with kRound, without its rounding.
template <typename T, typename W, int kHA, int kHB, bool kGemma, bool kFused, bool kRound, bool kFloatSum = false>
void launch_norm(const RowSet<T, W>& a, int64_t ha, const RowSet<T, W>& b, int64_t hb, bool has_b, float eps,
                 DLDevice device, const char* name) {
  const bool fast = kHA > 0 && (!has_b || kHB > 0) && fast_layout(a, kFused) && (!has_b || fast_layout(b, kFused));
  // Two row sets share a block size (a multiple of both groups); the rare pairs for which that exceeds
  // 1024 threads take the generic kernel.
  if constexpr (kHA > 0 && kBlockThreads<T, kHA, kHB, kVecTarget<kFused>> <= 1024) {
    if (fast) {
      constexpr int kThreadsPerSM = kHB > 0 ? NormConfig::kThreadsPerSM * 3 / 4 : NormConfig::kThreadsPerSM;
      // Many rows of the widths the many-rows row groups are for (NormConfig::many_rows_width).
      constexpr int kManyThreadsPerSM =
          kFused ? NormConfig::kManyFusedThreadsPerSM : NormConfig::kManyPlainThreadsPerSM;
      constexpr int kNumVec = RowConfig<T, kHA, 1>::kNumVec;
      constexpr bool kManyWidth = NormConfig::many_rows_width(kNumVec, kFused);
      using Many = RowConfig<T, kHA, kVecTarget<kFused, true>, W>;
      if constexpr (kHB == 0 && kManyWidth && Many::kWeightInRegs) {
        if (a.rows >= NormConfig::kManyRows) {
          launch_fast<T, W, kHA, kHB, kGemma, kFused, kRound, kVecTarget<kFused, true>, kManyThreadsPerSM, kFloatSum>(
              a, b, has_b, eps, device, name);
          return;
        }
      }
      // Fewer rows of a power-of-two number of vectors: rmsnorm's few-rows row groups (rows of up to
      // 1024 threads of kFewVecs; wider ones would spill at that budget).
      if constexpr (!kFused && kHB == 0 && kNumVec > 32 * NormConfig::kVecsPerThread &&
                    kNumVec <= 1024 * NormConfig::kFewVecs && pow2_ceil(kNumVec) == kNumVec) {
        if (a.rows < NormConfig::kFewRows) {
          launch_fast<T, W, kHA, kHB, kGemma, kFused, kRound, NormConfig::kFewVecs, NormConfig::kFewThreadsPerSM,
                      kFloatSum>(
              a, b, has_b, eps, device, name);
          return;
        }
      }
      // Packed rows (RowConfig::kPacked) where their grid has NormConfig::kPackMinBlocksPerSM+ blocks per SM
      // or where packing makes it a prefetching grid; other grids keep one vector of a row a thread
      // (target 1), more threads in flight.
      using Packed = RowConfig<T, kHA, kVecTarget<kFused>>;
      if constexpr (Packed::kPacked) {
        constexpr int64_t kRowsPerBlock = Packed::rows_per_block(kBlockThreads<T, kHA, kHB, kVecTarget<kFused>>);
        const int64_t rows = a.rows + (has_b ? b.rows : 0);
        const int64_t sms = sgljit::num_sms(device.device_id);
        // Packing that brings the grid down to prefetching size (see kPrefetchBlocksPerSM) also pays.
        constexpr int64_t kUnpackedRowsPerBlock = RowConfig<T, kHA, 1>::rows_per_block(kBlockThreads<T, kHA, kHB, 1>);
        const bool to_prefetch = rows <= kRowsPerBlock * NormConfig::kPrefetchBlocksPerSM * sms &&
                                 rows > kUnpackedRowsPerBlock * NormConfig::kPrefetchBlocksPerSM * sms;
        if (!to_prefetch && rows < kRowsPerBlock * NormConfig::kPackMinBlocksPerSM * sms) {
          launch_fast<T, W, kHA, kHB, kGemma, kFused, kRound, 1, kThreadsPerSM, kFloatSum>(a, b, has_b, eps, device,
                                                                                      name);
          return;
        }
      }
      launch_fast<T, W, kHA, kHB, kGemma, kFused, kRound, kVecTarget<kFused>, kThreadsPerSM, kFloatSum>(
          a, b, has_b, eps, device, name);
      return;
    }
  }
  constexpr auto kernel = norm_generic_kernel<T, W, kGemma, kFused, kRound, kFloatSum>;
  const int64_t resident = int64_t{sgljit::num_sms(device.device_id)} *
                           sgljit::resident_blocks<kernel>(device.device_id, kGenericThreads);
  int grid_a = 0, grid = 0;
  split_grid(a.rows, has_b ? b.rows : 0, resident, &grid_a, &grid);
  sgljit::LaunchKernel(kernel, grid, kGenericThreads, 0, device, name).pdl()(a, ha, has_b ? b : a, has_b ? hb : ha,
                                                                        grid_a, eps);
}

// The rows of in: [T, H], or [B, S, H] (out and, for the fused add, res alike; unit last strides). [B, S, H]
// tensors whose leading dimensions all collapse into one row stride are B*S rows of that stride, others
// B x S rows of two strides (row_offsets divides by S). The stride of a size-1 dimension is meaningless
// (and may be anything): it becomes 0.
template <typename T, typename W>
RowSet<T, W> row_set(const tvm::ffi::TensorView& in, const tvm::ffi::TensorView& out, const tvm::ffi::TensorView* res,
                     const tvm::ffi::TensorView& weight) {
  using tvm::ffi::TensorView;
  const bool three = in.ndim() == 3;
  const int64_t n = in.size(0), inner = three ? in.size(1) : 1;
  auto s0 = [n](const TensorView& t) { return n == 1 ? int64_t{0} : t.stride(0); };
  auto s1 = [inner](const TensorView& t) { return inner == 1 ? int64_t{0} : t.stride(1); };
  auto collapses = [n, inner](const TensorView& t) { return n == 1 || inner == 1 || t.stride(0) == inner * t.stride(1); };
  RowSet<T, W> s{};
  s.in = static_cast<const T*>(in.data_ptr());
  s.out = static_cast<T*>(out.data_ptr());
  s.res = res ? static_cast<T*>(res->data_ptr()) : nullptr;
  s.weight = static_cast<const W*>(weight.data_ptr());
  s.rows = n * inner;
  s.inner = 1;
  if (!three || (collapses(in) && collapses(out) && (res == nullptr || collapses(*res)))) {
    auto row = [&](const TensorView& t) { return inner == 1 ? s0(t) : s1(t); };
    s.in_s0 = row(in);
    s.out_s0 = row(out);
    s.res_s0 = res ? row(*res) : 0;
  } else {
    s.inner = inner;
    s.in_s0 = s0(in);
    s.in_s1 = s1(in);
    s.out_s0 = s0(out);
    s.out_s1 = s1(out);
    s.res_s0 = res ? s0(*res) : 0;
    s.res_s1 = res ? s1(*res) : 0;
  }
  return s;
}

// The entry points. Shapes, strides, dtypes, devices and overlap were checked by the code sgljit.op
// generates from the op's declared arguments (see ops.py); here only what the specialization adds.
inline void check_width(int64_t compiled, int64_t actual, const char* name) {
  sgljit::RuntimeCheck(compiled == 0 || compiled == actual, name, ": this module was compiled for width ", compiled,
                       ", got ", actual);
}

// out = rmsnorm(input) * weight (kGemma: * (1 + weight)). input, out: [T, H] or [B, S, H], unit last stride.
// The op's round_before_weight argument (the Gemma ops have none) is kRound: the key chose the module.
template <typename T, typename W, int kH, bool kGemma, bool kRound>
struct RMSNorm {
  static void run(tvm::ffi::TensorView input, tvm::ffi::TensorView weight, tvm::ffi::TensorView out, double eps,
                  bool /*round_before_weight*/ = kRound) {
    if constexpr (kGemma && kRound) {  // modules of the rounding form export the Gemma ops unused
      sgljit::RuntimeCheck(false, "gemma_rmsnorm has no round_before_weight form");
    } else {
      const int64_t h = input.size(input.ndim() - 1);
      check_width(kH, h, "input");
      const RowSet<T, W> a = row_set<T, W>(input, out, nullptr, weight);
      if (a.rows == 0) return;
      launch_norm<T, W, kH, 0, kGemma, false, kRound>(a, h, a, 0, false, static_cast<float>(eps), input.device(),
                                                      kGemma ? "gemma_rmsnorm" : "rmsnorm");
    }
  }
};

// residual <- input + residual (rounded to T); input <- rmsnorm(residual) * weight (in place). input,
// residual: [T, H] or [B, S, H]; round_before_weight as for RMSNorm. kFloatSum (the op's float_sum,
// FlashInfer's): the float32 sum input + residual is normalized (the residual still stores it rounded).
template <typename T, typename W, int kH, bool kGemma, bool kRound, bool kFloatSum = false>
struct FusedAddRMSNorm {
  static void run(tvm::ffi::TensorView input, tvm::ffi::TensorView residual, tvm::ffi::TensorView weight,
                  double eps, bool /*float_sum*/ = kFloatSum, bool /*round_before_weight*/ = kRound) {
    if constexpr (kGemma && kRound) {
      sgljit::RuntimeCheck(false, "gemma_fused_add_rmsnorm has no round_before_weight form");
    } else {
      const int64_t h = input.size(input.ndim() - 1);
      check_width(kH, h, "input");
      const RowSet<T, W> a = row_set<T, W>(input, input, &residual, weight);
      if (a.rows == 0) return;
      launch_norm<T, W, kH, 0, kGemma, true, kRound, kFloatSum>(a, h, a, 0, false, static_cast<float>(eps), input.device(),
                                                     kGemma ? "gemma_fused_add_rmsnorm" : "fused_add_rmsnorm");
    }
  }
};

// In place, per head: q [T, Hq, D], k [T, Hk, D] (unit last stride, any other strides), weights [D].
template <typename T, typename W, int kD>
struct QKNorm {
  static void run(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView q_weight,
                  tvm::ffi::TensorView k_weight, double eps) {
    const int64_t d = q.size(2);
    check_width(kD, d, "q");
    if (q.size(0) == 0) return;
    const RowSet<T, W> a = row_set<T, W>(q, q, nullptr, q_weight), b = row_set<T, W>(k, k, nullptr, k_weight);
    const bool has_b = b.rows > 0;
    if (a.rows == 0) {
      if (has_b) {
        launch_norm<T, W, kD, 0, false, false, false>(b, d, b, 0, false, static_cast<float>(eps), q.device(), "qknorm");
      }
      return;
    }
    launch_norm<T, W, kD, kD, false, false, false>(a, d, b, d, has_b, static_cast<float>(eps), q.device(), "qknorm");
  }
};

// In place, per row: q [T, Wq], k [T, Wk] (unit last stride), q_weight [Wq], k_weight [Wk].
template <typename T, typename W, int kWQ, int kWK>
struct QKNormAcrossHeads {
  static void run(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView q_weight,
                  tvm::ffi::TensorView k_weight, double eps) {
    check_width(kWQ, q.size(1), "q");
    check_width(kWK, k.size(1), "k");
    if (q.size(0) == 0) return;
    const RowSet<T, W> a = row_set<T, W>(q, q, nullptr, q_weight), b = row_set<T, W>(k, k, nullptr, k_weight);
    launch_norm<T, W, kWQ, kWK, false, false, false>(a, q.size(1), b, k.size(1), true, static_cast<float>(eps),
                                                     q.device(), "qknorm_across_heads");
  }
};

}  // namespace sgljit_norm

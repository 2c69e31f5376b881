// The rows kernel: per-token quantization, the static scale's pass over chunks of the tensor, and
// the quantize pass of three kernels (the same, last chunk first).
//
// Per-token: P lanes per row (a power of two, 1..1024; rows of one block side by side), each lane
// holding its vectors j = lane + k * P, k < N, in registers (N = 1..16; a row longer than P * N
// vectors re-reads the remainder): the row is read from global memory once, reduced (shuffles, plus
// shared memory when P > 32), and quantized from registers. The host picks the fewest lanes per row
// that still give about RowsConfig::kTokenThreadsPerSm threads per SM.
// Static scale: the tensor is cut into chunks of 32 * N vectors (N = 1, 4 or kChunkMaxN: the largest
// that still gives about kChunkThreadsPerSm threads per SM), a warp per chunk holding it in
// registers; every load is issued before the scale's, so the two latencies overlap.
// Vectors are carried as raw words (see Io), so all N loads are in flight before the first use.
#pragma once

#include "common.cuh"

namespace sgljit_quant_fp8 {

using namespace sgljit;

struct RowsConfig {
  static constexpr int kTokenMaxVecs = 16;        // per-token: the most vectors a lane holds
  static constexpr int kChunkMaxN = 8;            // static chunks: the most vectors a lane holds
  static constexpr int kTokenThreadsPerSm = 512;  // per-token: the lanes-per-row choice aims at this
  static constexpr int kChunkThreadsPerSm = 512;  // static: the chunk-size choice aims at this
};
static_assert(RowsConfig::kChunkMaxN > 4 && RowsConfig::kChunkMaxN <= RowsConfig::kTokenMaxVecs,
              "RowsConfig::kChunkMaxN: above 4, at most 16");

// N = 16 needs 64 registers of data per thread (bf16/fp16/fp32 alike): at most 512 threads a block.
template <int N>
inline constexpr int kTokenMaxThreads = N >= 16 ? 512 : 1024;

// `zero` is 0, but the compiler cannot know it (the row max's sign bit): x[k] ^ zero keeps the
// conversions of x to fp32 after the row reduction, so they are not all hoisted next to the loads
// (N * VEC live floats: spills or a register-starved occupancy).
template <typename T, typename Q, int VEC, int N, int kMode>
SGLJIT_DEVICE void token_quant(const typename Io<T, VEC>::V (&x)[N], const T* row_in, uint8_t* row_out, int nvr,
                               int lane, int P, const Divider& div, uint32_t zero) {
  using IO = Io<T, VEC>;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const int j = lane + k * P;
    if (j < nvr) IO::template quantize_store<Q, kMode>(IO::opaque(x[k], zero), div, row_out + j * VEC);
  }
  for (int j = lane + N * P; j < nvr; j += P) {
    IO::template quantize_store<Q, kMode>(IO::template load<true>(row_in + j * VEC), div, row_out + j * VEC);
  }
}

// Scales outside Divider::fast (practically never: absmax beyond 2^48 or below 2^-31) re-read the
// row (from L2) instead of sharing the registers: otherwise the compiler hoists the conversions of
// all N vectors out of both paths and spills.
template <typename T, typename Q, int VEC>
SGLJIT_DEVICE void token_quant_slow(const T* row_in, uint8_t* row_out, int nvr, int lane, int P,
                                              const Divider div) {
  using IO = Io<T, VEC>;
  for (int j = lane; j < nvr; j += P) {
    IO::template quantize_store<Q, kDivide>(IO::template load<false>(row_in + j * VEC), div, row_out + j * VEC);
  }
}

// Where a rows kernel's scale comes from.
enum class ScaleFrom {
  kRowMax,    // per-token: each row's own absmax, stored to scales[row]
  kGiven,     // per-tensor static: scales[0], for rows that are chunks of the tensor
  kGivenBackwards,  // the same, last row first (after an absmax pass: its tail is still in L2)
};

template <typename T>
struct RowsArgs {
  const T* in;
  int64_t in_stride;
  uint8_t* out;
  int64_t out_stride;
  float* scales;
  int64_t num_rows;
  int64_t hidden;       // elements of every row but the last
  int64_t last_hidden;  // elements of the last row (per-tensor: the rest of the tensor)
  int P;  // lanes per row
  bool prefetch;  // prefetch the row's first loads into L2 before the PDL wait
};

template <typename T, typename Q, int VEC, int N, ScaleFrom kFrom>
__global__ __launch_bounds__(kTokenMaxThreads<N>) void rows_kernel(const RowsArgs<T> a) {
  using IO = Io<T, VEC>;
  __shared__ uint32_t red[32];
  constexpr bool kChunks = kFrom != ScaleFrom::kRowMax;  // per-tensor: rows of 32 * N vectors, a warp each
  const int P = kChunks ? 32 : a.P;
  const int rows_per_block = blockDim.x / P;
  const int lane = threadIdx.x & (P - 1);
  const int64_t index = int64_t(blockIdx.x) * rows_per_block + threadIdx.x / P;
  const bool valid = index < a.num_rows;
  // Out-of-range lanes and rows load clamped indices (the last vector of the row, the last row):
  // duplicates do not change a max and are not stored, and unpredicated loads are all issued before
  // the first use (guarded ones were interleaved with the max and waited for each other).
  const int64_t clamped = min(index, a.num_rows - 1);
  const int64_t row = kFrom == ScaleFrom::kGivenBackwards ? a.num_rows - 1 - clamped : clamped;
  const int64_t row_len = row == a.num_rows - 1 ? a.last_hidden : a.hidden;
  const int nvr = int(row_len / VEC);  // rows are < 2^31 elements (checked on the host)
  const T* row_in = a.in + row * a.in_stride;
  if (a.prefetch && nvr > 0) {  // (see sgljit::prefetch_l2)
    if constexpr (sizeof(T) * VEC == 16) {
      // The row's first N * P vectors as one bulk request from its first lane.
      if (lane == 0) prefetch_l2_bulk(row_in, uint32_t(min(N * P, nvr)) * 16);
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) prefetch_l2(row_in + min(lane + k * P, nvr - 1) * VEC);
    }
  }
  pdl_wait();
  pdl_launch_dependents();

  // Every chunk but the last is full: its loads and stores at fixed offsets, without clamps or
  // bounds (about a quarter of the quantize pass's instructions).
  const bool full = kChunks && nvr == 32 * N;
  typename IO::V x[N];
  if (full) {
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = IO::template load<true>(row_in + (lane + k * 32) * VEC);
  } else if (nvr > 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = IO::template load<true>(row_in + min(lane + k * P, nvr - 1) * VEC);
  }

  uint32_t m = 0;
  float s;
  if constexpr (kFrom == ScaleFrom::kRowMax) {
    AbsMax<T, VEC> acc;
    if (nvr > 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) acc.add(x[k]);
      for (int j = lane + N * P; j < nvr; j += P) {
        acc.add(IO::template load<false>(row_in + j * VEC));  // re-read below: keep in L2
      }
    }
    for (int64_t e = int64_t(nvr) * VEC + lane; e < row_len; e += P) m = max(m, abs_bits(to_float(row_in[e])));
    m = max(m, acc.bits());
    // Lanes of a row are P consecutive threads, P-aligned: a warp holds whole rows (P <= 32) or a
    // row holds whole warps (P > 32).
    if (P >= 32) {
      m = __reduce_max_sync(kFullMask, m);
    } else {
      for (int off = P / 2; off > 0; off /= 2) m = max(m, __shfl_xor_sync(kFullMask, m, off));
    }
    if (P > 32) {
      const int warps_per_row = P / 32, first = (threadIdx.x / P) * warps_per_row;
      if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
      __syncthreads();
      m = 0;
      for (int w = 0; w < warps_per_row; ++w) m = max(m, red[first + w]);
    }
    s = scale_from_absmax(m, Fp8<Q>::kMax);
    if (valid && lane == 0) a.scales[row] = s;
  } else {  // kGiven, kGivenBackwards
    // The row's loads are already in flight: the scale's latency overlaps them.
    s = __ldcg(a.scales);  // L2: may have been written by the kernel just before (PDL)
  }
  if (!valid) return;

  const Divider div(s);
  uint8_t* row_out = a.out + row * a.out_stride;
  if (Divider::fast(s)) {
    // (a scale computed from these rows' own absmax bounds every quotient by fp8_max)
    constexpr int kMode = kFastQuotient<T, kFrom != ScaleFrom::kGiven>;
    if (full) {
      uint8_t* const dst = row_out + lane * VEC;
#pragma unroll
      for (int k = 0; k < N; ++k) IO::template quantize_store<Q, kMode>(x[k], div, dst + k * 32 * VEC);
      return;
    }
    token_quant<T, Q, VEC, N, kMode>(x, row_in, row_out, nvr, lane, P, div, m >> 31);
  } else {
    token_quant_slow<T, Q, VEC>(row_in, row_out, nvr, lane, P, div);
  }
  for (int64_t e = int64_t(nvr) * VEC + lane; e < row_len; e += P) {  // fewer than VEC elements
    row_out[e] = to_fp8<Q>(div.template operator()<kDivide>(to_float(row_in[e])));
  }
}

}  // namespace sgljit_quant_fp8

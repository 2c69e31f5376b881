// Sinusoidal timestep embedding (diffusers' get_timestep_embedding), SYCL.
//
// Specialized with -DSGLJIT_T=<output type: fp32_t | fp16_t | bf16_t> and
// -DSGLJIT_TIN=<timestep type: fp32_t | fp16_t | bf16_t | double | int32_t | int64_t>.
// Same numerics as the CUDA kernel (csrc/timestep_embedding.cuh) and the reference:
//   freq[j]   = exp(fl32(fl32(-ln(max_period)) * j) / fl32(half - shift)), exp in fp64 rounded once
//   arg[b, j] = fl32(fl32(t[b] * freq[j]) * scale)
//   out[b]    = [sin(arg) | cos(arg)] ([cos | sin] when flip), one zero column when dim is odd
// sin/cos: the same Cody-Waite reduction by 2*pi into [-pi, pi], then sycl::sin / sycl::cos (full
// precision builtins, which take their short path on a reduced argument).
//
// Work-item = (column group of V = 16 bytes / sizeof(out) columns, row worker): it computes its
// V frequencies once in registers, then walks rows worker, worker + row_workers, ...; per row V
// arguments, one 16-byte vector store into each half when the row layout allows (even dim,
// half % V == 0), scalar stores otherwise (odd dims, the ragged last group). Consecutive work-items
// take consecutive groups of one row, so a sub-group writes contiguous memory.
#pragma once

#include <sgljit/sycl/kernel.hpp>

// The argument must be the reference's fp32 value to the bit: no reassociation, no contraction,
// whatever floating-point model the compiler defaults to (icpx defaults to a fast one).
#pragma float_control(precise, on)
#pragma clang fp contract(off)

namespace sgljit_timestep_embedding {

using namespace sgljit;
using out_t = SGLJIT_T;
using t_t = SGLJIT_TIN;
inline constexpr int kVec = kVecSize<out_t>;

inline constexpr float kInv2Pi = 0x1.45f306p-3f;     // fl32(1 / (2*pi))
inline constexpr float kTwoPiHi = 0x1.921fb6p+2f;    // 2*pi = hi + mid + lo + O(4e-23)
inline constexpr float kTwoPiMid = -0x1.777a5cp-23f;
inline constexpr float kTwoPiLo = -0x1.ee59dap-48f;

inline float load_t(const t_t* p) { return static_cast<float>(*p); }

// fp32 mul; the fp32 division done in fp64 and rounded once (equal to the IEEE fp32 quotient);
// exp in fp64, rounded once to fp32.
inline float column_freq(int64_t j, float neg_log_max_period, float denominator) {
  const float numerator = neg_log_max_period * static_cast<float>(j);
  const float exponent = static_cast<float>(static_cast<double>(numerator) / static_cast<double>(denominator));
  return static_cast<float>(sycl::exp(static_cast<double>(exponent)));
}

// x - k*2*pi in [-pi, pi], rounded once (the first fma is exact); see the CUDA kernel.
inline float reduce_two_pi(float x) {
  const float k = sycl::rint(x * kInv2Pi);
  const float r = sycl::fma(-k, kTwoPiHi, x);
  const float tail = sycl::fma(-k, kTwoPiMid, -k * kTwoPiLo);
  return r + tail;
}

}  // namespace sgljit_timestep_embedding

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void timestep_embedding(const sgljit_timestep_embedding::t_t* t, sgljit_timestep_embedding::out_t* out,
                        int64_t t_stride, int64_t rows, int64_t dim, int64_t row_workers, int32_t flip,
                        float neg_log_max_period, float denominator, float scale) {
  using namespace sgljit_timestep_embedding;
  constexpr int V = kVec;
  const int64_t gid = static_cast<int64_t>(syclext::this_work_item::get_nd_item<1>().get_global_id(0));
  const int64_t half = dim / 2;
  const int64_t groups = half > 0 ? div_ceil(half, V) : 1;
  if (gid >= groups * row_workers) return;
  const int64_t group = gid % groups;
  const int64_t worker = gid / groups;
  const int64_t col0 = group * V;
  const int64_t n = sycl::min<int64_t>(V, half - col0);  // columns of this group (<= 0 when half == 0)

  float freq[V];
#pragma unroll
  for (int i = 0; i < V; ++i) freq[i] = i < n ? column_freq(col0 + i, neg_log_max_period, denominator) : 0.f;

  const bool vector_rows = dim % (2 * V) == 0 && n == V;
  const bool pad = (dim & 1) && group == groups - 1;
  const int64_t sin_col = (flip ? half : 0) + col0;
  const int64_t cos_col = (flip ? 0 : half) + col0;

  for (int64_t row = worker; row < rows; row += row_workers) {
    const float tv = load_t(t + row * t_stride);
    out_t* base = out + row * dim;
    if (vector_rows) {
      AlignedVector<out_t, V> vs, vc;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float r = reduce_two_pi((tv * freq[i]) * scale);
        vs[i] = from_float<out_t>(sycl::sin(r));
        vc[i] = from_float<out_t>(sycl::cos(r));
      }
      vs.store(base + sin_col);
      vc.store(base + cos_col);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const float r = reduce_two_pi((tv * freq[i]) * scale);
        base[sin_col + i] = from_float<out_t>(sycl::sin(r));
        base[cos_col + i] = from_float<out_t>(sycl::cos(r));
      }
    }
    if (pad) base[dim - 1] = from_float<out_t>(0.f);
  }
}

// RMSNorm family for SYCL: one work-group per row, the row kept in private memory (read once),
// NORM_VEC-wide aligned accesses, a work-group reduction, sub-groups of 16.
//
//   y = x * rsqrt(mean(x^2) + eps) * (w + w_offset)     fp32 math, one cast; w_offset 1 for Gemma
//
// Specialized with -D macros: SGLJIT_T (element type), NORM_W (the weight's: SGLJIT_T or fp32_t), NORM_ROUND
// (x * rsqrt(...) rounded to SGLJIT_T before the weight multiply, as Hugging Face's LlamaRMSNorm; the fused add
// then normalizes the float32 sum, as sglang's cast_x_before_out_mul), NORM_HIDDEN
// (row width), NORM_VEC (elements per access; NORM_HIDDEN % NORM_VEC == 0, rows and weight aligned to NORM_VEC
// elements), NORM_WG (work-items per row, a multiple of 16). The host launches rows * NORM_WG work-items in
// work-groups of NORM_WG; row r of a set is at (r / inner) * s0 + (r % inner) * s1 elements.
#include <sgljit/sycl/kernel.hpp>

#ifndef NORM_HIDDEN
#error "norm.hpp: compile with -DHIDDEN=<row width>"
#endif
#ifndef NORM_VEC
#define NORM_VEC 1
#endif
#ifndef NORM_WG
#define NORM_WG 64
#endif
#ifndef NORM_W
#define NORM_W SGLJIT_T
#endif
#ifndef NORM_ROUND
#define NORM_ROUND false
#endif

using T = sgljit::scalar_t;
using W = sgljit::NORM_W;  // -DNORM_W=fp32_t names sgljit::fp32_t, as SGLJIT_T does

namespace sgljit_norm {

constexpr int kH = NORM_HIDDEN;
constexpr int kVec = NORM_VEC;
constexpr int kWG = NORM_WG;
static_assert(kH % kVec == 0, "NORM_HIDDEN must be a multiple of NORM_VEC");
static_assert(kWG % 16 == 0, "NORM_WG must be a multiple of the sub-group size");
constexpr int kNumVec = kH / kVec;
constexpr int kPerItem = (kNumVec + kWG - 1) / kWG;
constexpr bool kRound = NORM_ROUND;
using V = sgljit::AlignedVector<T, kVec>;
using WV = sgljit::AlignedVector<W, kVec>;

inline int64_t row_offset(int64_t row, int64_t inner, int64_t s0, int64_t s1) {
  const int64_t o = row / inner;
  return o * s0 + (row - o * inner) * s1;
}

// Normalizes one row. kFused: res <- in + res (rounded to T) first, and the row is that sum. kRounds: NORM_ROUND
// applies (the q/k norms never round).
template <bool kFused, bool kRounds = kRound>
inline void norm_row(const T* in, T* out, T* res, const W* w, float w_offset, float eps) {
  constexpr bool kSum = kFused && kRounds;  // the float32 sums are normalized: kept beside the row
  const int lid = static_cast<int>(syclext::this_work_item::get_nd_item<1>().get_local_id(0));
  V x[kPerItem];
  float sums[kSum ? kPerItem : 1][kSum ? kVec : 1];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerItem; ++j) {
    const int c = j * kWG + lid;
    if (c < kNumVec) {
      x[j].load(in + c * kVec);
      if constexpr (kFused) {
        V r;
        r.load(res + c * kVec);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float sum = sgljit::to_float(x[j][e]) + sgljit::to_float(r[e]);
          if constexpr (kSum) sums[j][e] = sum;
          x[j][e] = sgljit::from_float<T>(sum);
        }
        x[j].store(res + c * kVec);
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float f;
        if constexpr (kSum) {
          f = sums[j][e];
        } else {
          f = sgljit::to_float(x[j][e]);
        }
        ss += f * f;
      }
    }
  }
  ss = sgljit::work_group_reduce_sum(ss);
  const float inv_rms = sycl::rsqrt(ss / static_cast<float>(kH) + eps);
#pragma unroll
  for (int j = 0; j < kPerItem; ++j) {
    const int c = j * kWG + lid;
    if (c < kNumVec) {
      WV wv;
      V y;
      wv.load(w + c * kVec);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float v;
        if constexpr (kSum) {
          v = sums[j][e] * inv_rms;
        } else {
          v = sgljit::to_float(x[j][e]) * inv_rms;
        }
        if constexpr (kRounds) v = sgljit::to_float(sgljit::from_float<T>(v));
        y[e] = sgljit::from_float<T>(v * (sgljit::to_float(wv[e]) + w_offset));
      }
      y.store(out + c * kVec);
    }
  }
}

}  // namespace sgljit_norm

// out[row] = rmsnorm(in[row]).
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>))
void rmsnorm(const T* in, const W* w, T* out, int64_t inner, int64_t in_s0, int64_t in_s1, int64_t out_s0,
             int64_t out_s1, float w_offset, float eps) {
  using sgljit_norm::row_offset;
  const int64_t row = syclext::this_work_item::get_nd_item<1>().get_group(0);
  sgljit_norm::norm_row<false>(in + row_offset(row, inner, in_s0, in_s1), out + row_offset(row, inner, out_s0, out_s1),
                               nullptr, w, w_offset, eps);
}

// res[row] <- x[row] + res[row]; x[row] <- rmsnorm(res[row]).
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>))
void fused_add_rmsnorm(T* x, T* res, const W* w, int64_t inner, int64_t x_s0, int64_t x_s1, int64_t res_s0,
                       int64_t res_s1, float w_offset, float eps) {
  using sgljit_norm::row_offset;
  const int64_t row = syclext::this_work_item::get_nd_item<1>().get_group(0);
  T* p = x + row_offset(row, inner, x_s0, x_s1);
  sgljit_norm::norm_row<true>(p, p, res + row_offset(row, inner, res_s0, res_s1), w, w_offset, eps);
}

// In place over [tokens, heads, NORM_HIDDEN]: work-group r normalizes head r % heads of token r / heads.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>))
void head_rmsnorm(T* x, const W* w, int64_t heads, int64_t token_stride, int64_t head_stride, float eps) {
  const int64_t row = syclext::this_work_item::get_nd_item<1>().get_group(0);
  T* p = x + sgljit_norm::row_offset(row, heads, token_stride, head_stride);
  sgljit_norm::norm_row<false, false>(p, p, nullptr, w, 0.0f, eps);
}

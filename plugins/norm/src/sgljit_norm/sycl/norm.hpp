// RMSNorm family for SYCL: one work-group per row, the row kept in private memory (read once),
// NORM_VEC-wide aligned accesses, a work-group reduction, sub-groups of 16.
//
//   y = x * rsqrt(mean(x^2) + eps) * (w + w_offset)     fp32 math, one cast; w_offset 1 for Gemma
//
// Specialized with -D macros: those of norm_row.hpp, and NORM_ROUND (x * rsqrt(...) rounded to SGLJIT_T
// before the weight multiply, as Hugging Face's LlamaRMSNorm; the fused add then normalizes the float32
// sum, as sglang's cast_x_before_out_mul), NORM_SUM (the fused add normalizes the float32 sum without
// rounding before the weight, as FlashInfer's kernels). The host launches rows * NORM_WG work-items in work-groups of
// NORM_WG; row r of a set is at (r / inner) * s0 + (r % inner) * s1 elements.
#include "norm_row.hpp"

#ifndef NORM_ROUND
#define NORM_ROUND false
#endif
#ifndef NORM_SUM
#define NORM_SUM false
#endif

namespace sgljit_norm {

constexpr bool kRound = NORM_ROUND;
constexpr bool kFloatSum = NORM_SUM;

inline int64_t row_offset(int64_t row, int64_t inner, int64_t s0, int64_t s1) {
  const int64_t o = row / inner;
  return o * s0 + (row - o * inner) * s1;
}

// Normalizes one row. kFused: res <- in + res (rounded to T) first, and the row is that sum. kRounds: NORM_ROUND
// applies (the q/k norms never round).
template <bool kFused, bool kRounds = kRound>
inline void norm_row(const T* in, T* out, T* res, const W* w, float w_offset, float eps) {
  constexpr bool kSum = kFused && (kRounds || kFloatSum);  // the float32 sums are normalized: kept beside the row
  const int lid = static_cast<int>(syclext::this_work_item::get_nd_item<1>().get_local_id(0));
  V x[kSlots];
  float sums[kSum ? kSlots : 1][kSum ? kVec : 1];
  const float inv_rms = load_row<kFused, kSum>(in, res, x, sums, eps);
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

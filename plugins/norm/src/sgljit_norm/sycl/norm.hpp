// RMSNorm family for SYCL: one work-group per row, the row kept in private memory (read once),
// NORM_VEC-wide aligned accesses, a work-group reduction, sub-groups of 16.
//
//   y = x * rsqrt(mean(x^2) + eps) * (w + w_offset)     fp32 math, one cast; w_offset 1 for Gemma
//
// Specialized with -D macros: SGLJIT_T (element type), NORM_HIDDEN (row width), NORM_VEC (elements per access;
// NORM_HIDDEN % NORM_VEC == 0, rows and weight NORM_VEC-aligned), NORM_WG (work-items per row, a multiple of 16).
// The host launches rows * NORM_WG work-items in work-groups of NORM_WG.
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

using T = sgljit::scalar_t;

namespace sgljit_norm {

constexpr int kH = NORM_HIDDEN;
constexpr int kVec = NORM_VEC;
constexpr int kWG = NORM_WG;
static_assert(kH % kVec == 0, "NORM_HIDDEN must be a multiple of NORM_VEC");
static_assert(kWG % 16 == 0, "NORM_WG must be a multiple of the sub-group size");
constexpr int kNumVec = kH / kVec;
constexpr int kPerItem = (kNumVec + kWG - 1) / kWG;
using V = sgljit::AlignedVector<T, kVec>;

// Normalizes one row. kFused: res <- in + res (rounded to T) first, and the row is that sum.
template <bool kFused>
inline void norm_row(const T* in, T* out, T* res, const T* w, float w_offset, float eps) {
  const int lid = static_cast<int>(syclext::this_work_item::get_nd_item<1>().get_local_id(0));
  V x[kPerItem];
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
          x[j][e] = sgljit::from_float<T>(sgljit::to_float(x[j][e]) + sgljit::to_float(r[e]));
        }
        x[j].store(res + c * kVec);
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float f = sgljit::to_float(x[j][e]);
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
      V wv, y;
      wv.load(w + c * kVec);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        y[e] = sgljit::from_float<T>(sgljit::to_float(x[j][e]) * inv_rms * (sgljit::to_float(wv[e]) + w_offset));
      }
      y.store(out + c * kVec);
    }
  }
}

}  // namespace sgljit_norm

// out[row] = rmsnorm(in[row]); rows in_stride / out_stride elements apart.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>))
void rmsnorm(const T* in, const T* w, T* out, int64_t in_stride, int64_t out_stride, float w_offset, float eps) {
  const int64_t row = syclext::this_work_item::get_nd_item<1>().get_group(0);
  sgljit_norm::norm_row<false>(in + row * in_stride, out + row * out_stride, nullptr, w, w_offset, eps);
}

// res[row] <- x[row] + res[row]; x[row] <- rmsnorm(res[row]).
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>))
void fused_add_rmsnorm(T* x, T* res, const T* w, int64_t x_stride, int64_t res_stride, float w_offset, float eps) {
  const int64_t row = syclext::this_work_item::get_nd_item<1>().get_group(0);
  sgljit_norm::norm_row<true>(x + row * x_stride, x + row * x_stride, res + row * res_stride, w, w_offset, eps);
}

// In place over [tokens, heads, NORM_HIDDEN]: work-group r normalizes head r % heads of token r / heads.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>))
void head_rmsnorm(T* x, const T* w, int64_t heads, int64_t token_stride, int64_t head_stride, float eps) {
  const int64_t row = syclext::this_work_item::get_nd_item<1>().get_group(0);
  const int64_t t = row / heads, h = row - t * heads;
  T* p = x + t * token_stride + h * head_stride;
  sgljit_norm::norm_row<false>(p, p, nullptr, w, 0.0f, eps);
}

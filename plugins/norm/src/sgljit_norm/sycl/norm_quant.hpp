// RMSNorm -> fp8 for SYCL (rmsnorm_quant_fp8, fused_add_rmsnorm_quant_fp8; static scale or one
// dynamic scale per row): one work-group per row, the row kept in private memory (read once),
// NORM_VEC-wide aligned loads, work-group reductions, sub-groups of 16; the fp8 bytes are stored one
// by one.
//
//   y = x * rsqrt(mean(x^2) + eps) * w            fp32, not rounded to T
//   out = quantize(y / scale)                      sgljit/sycl/fp8.hpp (IEEE division, clamp, PyTorch's conversion)
//   per token: scale = max(absmax(y of the row) / fp8_max, 2^-126), written to scales[row]
//   fused: res <- in + res (rounded to T) first, and the row is that sum; in is only read.
//
// Specialized with -D macros: those of norm_row.hpp (NORM_HIDDEN 0: no elements, a dynamic scale of
// 2^-126) and NQ_FP8 (fp8_e4m3_t or fp8_e5m2_t). The host launches
// rows * NORM_WG work-items in work-groups of NORM_WG.
#include "norm_row.hpp"

#include <sgljit/sycl/fp8.hpp>

#ifndef NQ_FP8
#error "norm_quant.hpp: compile with -DNQ_FP8=fp8_e4m3_t or fp8_e5m2_t"
#endif

namespace sgljit_norm_quant {

using namespace sgljit_norm;
using Q = sgljit::NQ_FP8;

// One row. kFused: res <- in + res first; kDynamic: the scale from the row (stored to *scale_out),
// else *scale_in.
template <bool kFused, bool kDynamic>
inline void norm_quant_row(const T* in, T* res, const W* w, uint8_t* out, const float* scale_in, float* scale_out,
                           float eps) {
  const auto it = syclext::this_work_item::get_nd_item<1>();
  const int lid = static_cast<int>(it.get_local_id(0));
  V x[kSlots];
  float no_sums[1][1];
  const float inv_rms = load_row<kFused, false>(in, res, x, no_sums, eps);
  auto y = [&](int j, const WV& wv, int e) { return sgljit::to_float(x[j][e]) * inv_rms * sgljit::to_float(wv[e]); };

  float s;
  if constexpr (kDynamic) {
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < kPerItem; ++j) {
      const int c = j * kWG + lid;
      if (c < kNumVec) {
        WV wv;
        wv.load(w + c * kVec);
#pragma unroll
        for (int e = 0; e < kVec; ++e) m = sycl::max(m, sgljit::abs_bits(y(j, wv, e)));
      }
    }
    m = sycl::reduce_over_group(it.get_group(), m, sycl::maximum<uint32_t>());
    s = sgljit::scale_from_absmax<Q>(m);
    if (lid == 0) *scale_out = s;
  } else {
    s = *scale_in;
  }
#pragma unroll
  for (int j = 0; j < kPerItem; ++j) {
    const int c = j * kWG + lid;
    if (c < kNumVec) {
      WV wv;
      wv.load(w + c * kVec);
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[c * kVec + e] = sgljit::quantize<Q>(y(j, wv, e), s);
    }
  }
}

}  // namespace sgljit_norm_quant

// out[row] = quantize(rmsnorm(in[row]) / scale[0]); strides in elements (out: bytes).
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>))
void rmsnorm_quant_fp8_static(const T* in, const W* w, const float* scale, uint8_t* out, int64_t in_stride,
                              int64_t out_stride, float eps) {
  const int64_t row = syclext::this_work_item::get_nd_item<1>().get_group(0);
  sgljit_norm_quant::norm_quant_row<false, false>(in + row * in_stride, nullptr, w, out + row * out_stride, scale,
                                                  nullptr, eps);
}

// scales[row] from the row's absmax; out[row] = quantize(rmsnorm(in[row]) / scales[row]).
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>))
void rmsnorm_quant_fp8_per_token(const T* in, const W* w, uint8_t* out, float* scales, int64_t in_stride,
                                 int64_t out_stride, float eps) {
  const int64_t row = syclext::this_work_item::get_nd_item<1>().get_group(0);
  sgljit_norm_quant::norm_quant_row<false, true>(in + row * in_stride, nullptr, w, out + row * out_stride, nullptr,
                                                 scales + row, eps);
}

// res[row] <- in[row] + res[row]; out[row] = quantize(rmsnorm(res[row]) / scale[0]).
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>))
void fused_add_rmsnorm_quant_fp8_static(const T* in, T* res, const W* w, const float* scale, uint8_t* out,
                                        int64_t in_stride, int64_t res_stride, int64_t out_stride, float eps) {
  const int64_t row = syclext::this_work_item::get_nd_item<1>().get_group(0);
  sgljit_norm_quant::norm_quant_row<true, false>(in + row * in_stride, res + row * res_stride, w,
                                                 out + row * out_stride, scale, nullptr, eps);
}

// res[row] <- in[row] + res[row]; scales[row] and out[row] as rmsnorm_quant_fp8_per_token of res[row].
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>))
void fused_add_rmsnorm_quant_fp8_per_token(const T* in, T* res, const W* w, uint8_t* out, float* scales,
                                           int64_t in_stride, int64_t res_stride, int64_t out_stride, float eps) {
  const int64_t row = syclext::this_work_item::get_nd_item<1>().get_group(0);
  sgljit_norm_quant::norm_quant_row<true, true>(in + row * in_stride, res + row * res_stride, w,
                                                out + row * out_stride, nullptr, scales + row, eps);
}

// LayerNorm -> fp8 for SYCL (layernorm_row.hpp): out = quantize(y / scale[0]) of the fp32 y (not
// rounded to T first), by sgljit/sycl/fp8.hpp (IEEE division, clamp, PyTorch's conversion); the fp8
// bytes are stored one by one. -DLN_FP8=fp8_e4m3_t or fp8_e5m2_t. The host launches rows * NORM_WG
// work-items in work-groups of NORM_WG; strides in elements (out: bytes).
#include "layernorm_row.hpp"

#include <sgljit/sycl/fp8.hpp>

#ifndef LN_FP8
#error "layernorm_quant.hpp: compile with -DLN_FP8=fp8_e4m3_t or fp8_e5m2_t"
#endif

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>))
void layernorm_quant_fp8(const T* in, const W* gamma, const W* beta, const float* scale, uint8_t* out,
                         int64_t in_stride, int64_t out_stride, float eps) {
  using namespace sgljit_layernorm;
  using Q = sgljit::LN_FP8;
  const int64_t row = syclext::this_work_item::get_nd_item<1>().get_group(0);
  uint8_t* o = out + row * out_stride;
  const float s = *scale;
  layernorm_row(in + row * in_stride, gamma, beta, eps, [&](int c, const float (&y)[kVec]) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) o[c * kVec + e] = sgljit::quantize<Q>(y[e], s);
  });
}

// LayerNorm for SYCL (layernorm_row.hpp): out = (x - mean) * rsqrt(var + eps) * gamma + beta, cast once.
// The host launches rows * NORM_WG work-items in work-groups of NORM_WG; strides in elements. out may
// be in (each work-item writes only the vectors it read).
#include "layernorm_row.hpp"

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<16>))
void layernorm(const T* in, const W* gamma, const W* beta, T* out, int64_t in_stride, int64_t out_stride, float eps) {
  using namespace sgljit_layernorm;
  const int64_t row = syclext::this_work_item::get_nd_item<1>().get_group(0);
  T* o = out + row * out_stride;
  layernorm_row(in + row * in_stride, gamma, beta, eps, [&](int c, const float (&y)[kVec]) {
    V v;
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = sgljit::from_float<T>(y[e]);
    v.store(o + c * kVec);
  });
}

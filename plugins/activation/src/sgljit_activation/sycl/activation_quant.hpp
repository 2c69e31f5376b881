// SiLU-and-mul fused with per-token-group fp8 quantization for SYCL (silu_and_mul_quant_fp8): one
// work-group of 32 work-items per group of group_size (32, 64 or 128) columns of y = silu(gate) * up
// (common.hpp's float32 product, never rounded to the input type), kept in private memory between its
// two uses: s = max(absmax(y) / fp8_max, eps) (ue8m0: rounded up to a power of two), stored to
// scales[row * scale_stride_t + g * scale_stride_g]; the codes quantize(y, s) (core's sgljit/sycl/fp8.hpp).
// These are the formulas of sgljit-quant-fp8's SYCL per-token-group kernel, so the result is bit for bit
// its quantization of silu_and_mul's float32 output. Groups are numbered row by row; strides in elements.
//
// Specialized with -D macros: SGLJIT_T (input type), ACT_FP8 (fp8_e4m3_t or fp8_e5m2_t).
#include "common.hpp"

#include <sgljit/sycl/fp8.hpp>

#ifndef ACT_FP8
#error "activation_quant.hpp: compile with -DACT_FP8=fp8_e4m3_t or fp8_e5m2_t"
#endif

namespace sgljit_activation {

using T = sgljit::scalar_t;
using Q = sgljit::ACT_FP8;
constexpr int kGroupItems = 32;                // the work-group (the host launches this many a group)
constexpr int kMaxPerItem = 128 / kGroupItems;  // the largest group size, 128, over the work-group

// 2^ceil(log2(s)) of a positive normal s, exactly (finite s above 2^127: inf); inf and NaN unchanged.
inline float ue8m0_ceil(float s) {
  const uint32_t b = sycl::bit_cast<uint32_t>(s);
  return (b & 0x7fffffu) && b < 0x7f800000u ? sycl::bit_cast<float>((b | 0x7fffffu) + 1u) : s;
}

}  // namespace sgljit_activation

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void silu_and_mul_quant_fp8(const sgljit_activation::T* in, int64_t in_stride, uint8_t* out, int64_t out_stride,
                            float* scales, int64_t scale_stride_t, int64_t scale_stride_g, int64_t group_size,
                            float eps, int32_t ue8m0, int64_t rows, int64_t hidden) {
  using namespace sgljit_activation;
  const int64_t groups_per_row = hidden / group_size;  // (rows: one work-group a group covers them)
  static_cast<void>(rows);
  const auto it = syclext::this_work_item::get_nd_item<1>();
  const int64_t group = it.get_group(0);
  const int64_t row = group / groups_per_row, col = group - row * groups_per_row;
  const T* gate = in + row * in_stride + col * group_size;
  uint8_t* o = out + row * out_stride + col * group_size;
  const int lid = static_cast<int>(it.get_local_id(0));
  float y[kMaxPerItem];
  uint32_t m = 0;
#pragma unroll
  for (int j = 0; j < kMaxPerItem; ++j) {
    const int64_t i = lid + j * kGroupItems;
    if (i < group_size) {
      y[j] = act_and_mul<Act::kSilu>(sgljit::to_float(gate[i]), sgljit::to_float(gate[hidden + i]));
      m = sycl::max(m, sgljit::abs_bits(y[j]));
    }
  }
  m = sycl::reduce_over_group(it.get_group(), m, sycl::maximum<uint32_t>());
  float s = sycl::bit_cast<float>(m) / sgljit::Fp8<Q>::kMax;
  s = s < eps ? eps : s;  // NaN stays NaN
  if (ue8m0) s = ue8m0_ceil(s);
  if (lid == 0) scales[row * scale_stride_t + col * scale_stride_g] = s;
#pragma unroll
  for (int j = 0; j < kMaxPerItem; ++j) {
    const int64_t i = lid + j * kGroupItems;
    if (i < group_size) o[i] = sgljit::quantize<Q>(y[j], s);
  }
}

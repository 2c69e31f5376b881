// FP8 quantization, SYCL: per-tensor static, per-tensor dynamic (two kernels: work-group partial
// maxima into a workspace, then every work-group reduces them and quantizes its range), per-token
// (one work-group per row) and per-token-group (one work-group per group).
//
// Quantized values are (x / scale) (IEEE fp32 division), clamped to +-fp8_max, converted bit for bit
// as PyTorch's conversion; dynamic scales are max(absmax / fp8_max, 2^-126), NaN-propagating;
// per-token-group scales max(absmax / fp8_max, eps), optionally rounded up to a power of two (the
// numerics are core's, sgljit/sycl/fp8.hpp). Output pointers are uint8_t (the fp8 bytes).
//
// Per-token-group over the MoE layouts: one kernel body (group_quant) for every layout, the layout an
// index map of the kernel (dense rows; masked [E, T_pad, H] rows t < masked_m[e], masked_m clamped to
// [0, T_pad]; sorted rows i < num_tokens_post_padded[0] with sorted_token_ids[i] < num_valid_tokens);
// rows left out keep their contents. With -DQFP8_INT8=1 the per-token-group kernels write int8 codes
// (scale absmax / 127, codes rint(x / s) clamped to +-127, NaN to 0); the other kernels stay fp8.
//
// Specialization: -DSGLJIT_T=bf16_t|fp16_t|fp32_t (input), -DQFP8_E5M2=0|1 (e4m3fn or e5m2),
// -DQFP8_INT8=0|1.
#include <sgljit/sycl/fp8.hpp>
#include <sgljit/sycl/kernel.hpp>

#ifndef QFP8_E5M2
#define QFP8_E5M2 0
#endif
#ifndef QFP8_INT8
#define QFP8_INT8 0
#endif

namespace sgljit_quant_fp8 {

using T = sgljit::scalar_t;

using Q = std::conditional_t<QFP8_E5M2 != 0, sgljit::fp8_e5m2_t, sgljit::fp8_e4m3_t>;

inline constexpr float kFp8Max = sgljit::Fp8<Q>::kMax;
inline constexpr float kMinScale = sgljit::kMinScale;

inline uint8_t fp8_from_float(float f) { return sgljit::fp8_from_float<Q>(f); }
inline uint8_t quantize(float x, float scale) { return sgljit::quantize<Q>(x, scale); }
inline uint32_t abs_bits(float x) { return sgljit::abs_bits(x); }
inline float scale_from_absmax(uint32_t bits) { return sgljit::scale_from_absmax<Q>(bits); }

// 2^ceil(log2(s)) for a positive normal s, exactly (finite s above 2^127: inf); inf and NaN unchanged.
inline float pow2_ceil(float s) {
  const uint32_t b = sycl::bit_cast<uint32_t>(s);
  return (b & 0x7fffffu) && b < 0x7f800000u ? sycl::bit_cast<float>((b | 0x7fffffu) + 1u) : s;
}

// The per-token-group code of x for scale s, and the largest code (the scale is absmax / it).
inline constexpr float kGroupMax = QFP8_INT8 ? 127.0f : kFp8Max;
inline uint8_t group_code(float x, float s) {
#if QFP8_INT8
  const float q = sycl::rint(x / s);  // half to even
  const int c = q != q ? 0 : q > 127.0f ? 127 : q < -127.0f ? -127 : int(q);
  return static_cast<uint8_t>(static_cast<int8_t>(c));
#else
  return quantize(x, s);
#endif
}

inline uint32_t group_max(uint32_t v) {
  return sycl::reduce_over_group(syclext::this_work_item::get_work_group<1>(), v,
                                 sycl::maximum<uint32_t>());
}

}  // namespace sgljit_quant_fp8

// out[i] = quantize(in[i] / scale[0]), grid-stride.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void quant_fp8_static(const sgljit_quant_fp8::T* in, const float* scale, int64_t scale_stride, uint8_t* out,
                      int64_t rows, int64_t hidden) {
  using namespace sgljit_quant_fp8;
  static_cast<void>(scale_stride);  // one element
  const int64_t n = rows * hidden;
  auto it = syclext::this_work_item::get_nd_item<1>();
  const float s = scale[0];
  for (int64_t i = it.get_global_id(0); i < n; i += it.get_global_range(0)) {
    out[i] = quantize(sgljit::to_float(in[i]), s);
  }
}

// Work-group g: workspace[g] = absmax bits over its contiguous range of the n elements.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void quant_fp8_absmax(const sgljit_quant_fp8::T* in, float* workspace, int64_t n) {
  using namespace sgljit_quant_fp8;
  auto it = syclext::this_work_item::get_nd_item<1>();
  const int64_t g = it.get_group(0), groups = it.get_group_range(0);
  const int64_t begin = n * g / groups, end = n * (g + 1) / groups;
  uint32_t m = 0;
  for (int64_t i = begin + it.get_local_id(0); i < end; i += it.get_local_range(0)) {
    m = sycl::max(m, abs_bits(sgljit::to_float(in[i])));
  }
  m = group_max(m);
  if (it.get_local_id(0) == 0) workspace[g] = sycl::bit_cast<float>(m);
}

// Every work-group reduces the partial maxima to the scale (group 0 stores it), then quantizes its
// range. Launched with the same number of work-groups as quant_fp8_absmax.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void quant_fp8_dynamic(const sgljit_quant_fp8::T* in, uint8_t* out, float* scale, const float* workspace,
                       int64_t n) {
  using namespace sgljit_quant_fp8;
  auto it = syclext::this_work_item::get_nd_item<1>();
  const int64_t g = it.get_group(0), groups = it.get_group_range(0);
  uint32_t m = 0;
  for (int64_t i = it.get_local_id(0); i < groups; i += it.get_local_range(0)) {
    m = sycl::max(m, sycl::bit_cast<uint32_t>(workspace[i]));
  }
  const float s = scale_from_absmax(group_max(m));
  if (g == 0 && it.get_local_id(0) == 0) scale[0] = s;
  const int64_t begin = n * g / groups, end = n * (g + 1) / groups;
  for (int64_t i = begin + it.get_local_id(0); i < end; i += it.get_local_range(0)) {
    out[i] = quantize(sgljit::to_float(in[i]), s);
  }
}

// One work-group per row of in [rows, hidden] (row strides in elements): scales[row] and the row.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void quant_fp8_per_token(const sgljit_quant_fp8::T* in, int64_t in_stride, uint8_t* out, int64_t out_stride,
                         float* scales, int64_t rows, int64_t hidden) {
  using namespace sgljit_quant_fp8;
  static_cast<void>(rows);  // one work-group a row covers them
  auto it = syclext::this_work_item::get_nd_item<1>();
  const int64_t row = it.get_group(0);
  const T* x = in + row * in_stride;
  uint8_t* o = out + row * out_stride;
  uint32_t m = 0;
  for (int64_t i = it.get_local_id(0); i < hidden; i += it.get_local_range(0)) {
    m = sycl::max(m, abs_bits(sgljit::to_float(x[i])));
  }
  const float s = scale_from_absmax(group_max(m));
  if (it.get_local_id(0) == 0) scales[row] = s;
  for (int64_t i = it.get_local_id(0); i < hidden; i += it.get_local_range(0)) {
    o[i] = quantize(sgljit::to_float(x[i]), s);
  }
}

namespace sgljit_quant_fp8 {

// One work-group quantizes one group of `group_size` elements at x into o; its scale
// s = max(absmax / max code, eps), rounded up to a power of two when `ue8m0`, goes to *scale.
inline void group_quant(const T* x, uint8_t* o, float* scale, int64_t group_size, float eps, int32_t ue8m0) {
  auto it = syclext::this_work_item::get_nd_item<1>();
  uint32_t m = 0;
  for (int64_t i = it.get_local_id(0); i < group_size; i += it.get_local_range(0)) {
    m = sycl::max(m, abs_bits(sgljit::to_float(x[i])));
  }
  float s = sycl::bit_cast<float>(group_max(m)) / kGroupMax;
  s = s < eps ? eps : s;  // NaN stays NaN
  if (ue8m0) s = pow2_ceil(s);
  if (it.get_local_id(0) == 0) *scale = s;
  for (int64_t i = it.get_local_id(0); i < group_size; i += it.get_local_range(0)) {
    o[i] = group_code(sgljit::to_float(x[i]), s);
  }
}

}  // namespace sgljit_quant_fp8

// One work-group per group of `group_size` consecutive elements of a row of in (groups numbered row by
// row, `groups_per_row` a row; row strides in elements), scales[row * scale_stride_t + g * scale_stride_g].
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void quant_fp8_per_token_group(const sgljit_quant_fp8::T* in, int64_t in_stride, uint8_t* out, int64_t out_stride,
                               float* scales, int64_t scale_stride_t, int64_t scale_stride_g, int64_t group_size,
                               float eps, int32_t ue8m0, int64_t rows, int64_t hidden) {
  using namespace sgljit_quant_fp8;
  static_cast<void>(rows);  // one work-group a group covers them
  const int64_t groups_per_row = hidden / group_size;
  const int64_t group = syclext::this_work_item::get_nd_item<1>().get_group(0);
  const int64_t row = group / groups_per_row, col = group - row * groups_per_row;
  group_quant(in + row * in_stride + col * group_size, out + row * out_stride + col * group_size,
              scales + row * scale_stride_t + col * scale_stride_g, group_size, eps, ue8m0);
}

// The masked layout: in, out [E, T_pad, H] and scales [E, T_pad, groups] (strides in elements: expert,
// token; scales also group), one work-group per group of [E * T_pad * groups_per_row]; rows t >=
// masked_m[e] (int32, or int64 where masked_m_64) are left alone.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void quant_group_masked(const sgljit_quant_fp8::T* in, int64_t in_se, int64_t in_st, uint8_t* out, int64_t out_se,
                        int64_t out_st, float* scales, int64_t sc_se, int64_t sc_st, int64_t sc_sg,
                        const int32_t* masked_m, int32_t masked_m_64, int64_t tokens_pad, int64_t groups_per_row,
                        int64_t group_size, float eps, int32_t ue8m0) {
  using namespace sgljit_quant_fp8;
  const int64_t group = syclext::this_work_item::get_nd_item<1>().get_group(0);
  const int64_t per_expert = tokens_pad * groups_per_row;
  const int64_t e = group / per_expert, rest = group - e * per_expert;
  const int64_t t = rest / groups_per_row, col = rest - t * groups_per_row;
  const int64_t count = masked_m_64 ? reinterpret_cast<const int64_t*>(masked_m)[e] : int64_t(masked_m[e]);
  if (t >= sycl::clamp(count, int64_t(0), tokens_pad)) return;  // uniform over the work-group
  group_quant(in + e * in_se + t * in_st + col * group_size, out + e * out_se + t * out_st + col * group_size,
              scales + e * sc_se + t * sc_st + col * sc_sg, group_size, eps, ue8m0);
}

// The sorted layout: as quant_fp8_per_token_group, rows i quantized only where i < num_post[0] and
// sorted_ids[i] < num_valid (unsigned: negative ids are padding).
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void quant_group_sorted(const sgljit_quant_fp8::T* in, int64_t in_stride, uint8_t* out, int64_t out_stride,
                        float* scales, int64_t scale_stride_t, int64_t scale_stride_g, const int32_t* sorted_ids,
                        const int32_t* num_post, int64_t num_valid, int64_t groups_per_row, int64_t group_size,
                        float eps, int32_t ue8m0) {
  using namespace sgljit_quant_fp8;
  const int64_t group = syclext::this_work_item::get_nd_item<1>().get_group(0);
  const int64_t row = group / groups_per_row, col = group - row * groups_per_row;
  if (row >= num_post[0] || int64_t(static_cast<uint32_t>(sorted_ids[row])) >= num_valid) return;
  group_quant(in + row * in_stride + col * group_size, out + row * out_stride + col * group_size,
              scales + row * scale_stride_t + col * scale_stride_g, group_size, eps, ue8m0);
}

// qknorm_rope_theta for SYCL (Intel XPU, or the SYCL CPU device): per-head RMSNorm of q and k, then
// rotary embedding with cos/sin computed from rope_theta (plain, YaRN or Llama 3.1), in place; the numerics and
// pair layout of csrc/qknorm_rope_theta.cuh (y not rounded before the rotation, one rounding at the
// store). A work-group of QKRT_LANES work-items owns one (token, head), q's heads first; lane l holds
// pairs l, l + LANES, ... and the sum of squares is a work-group reduction. head_dim and rotary_dim
// are runtime values.
//
// Specialized with -D macros: SGLJIT_T (element type), QKRT_IDX_T (positions), QKRT_NEOX (0/1),
// QKRT_YARN (0/1: factor != 1), QKRT_LANES (work-items a head, from qknorm_rope_theta.py).
#pragma once

#include <sgljit/sycl/kernel.hpp>

namespace sgljit_qknorm_rope_theta {

using T = sgljit::scalar_t;
using IdxT = QKRT_IDX_T;
constexpr bool kNeox = QKRT_NEOX != 0;
constexpr bool kYarn = QKRT_YARN != 0;
constexpr int kLanes = QKRT_LANES;
constexpr int kMaxPairsPerLane = 512 / kLanes;  // heads up to 1024 wide, as the CUDA kernel

}  // namespace sgljit_qknorm_rope_theta

using qkrt_t = sgljit_qknorm_rope_theta::T;
using qkrt_idx_t = sgljit_qknorm_rope_theta::IdxT;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void qknorm_rope_theta(qkrt_t* q, qkrt_t* k, const qkrt_t* q_weight, const qkrt_t* k_weight,
                       const qkrt_idx_t* positions, int64_t q_heads, int64_t k_heads, int64_t head_dim,
                       int64_t rot, int64_t q_stride_t, int64_t q_stride_h, int64_t k_stride_t,
                       int64_t k_stride_h, float eps, float base, float factor, float low, float high,
                       float attention_factor, float ramp_scale) {
  using namespace sgljit_qknorm_rope_theta;
  const auto it = syclext::this_work_item::get_nd_item<1>();
  const int64_t head = it.get_group(0);
  const int lane = static_cast<int>(it.get_local_id(0));
  const int64_t heads = q_heads + k_heads;
  const int64_t t = head / heads;
  const int64_t h = head - t * heads;
  const bool is_q = h < q_heads;
  T* x = is_q ? q + t * q_stride_t + h * q_stride_h : k + t * k_stride_t + (h - q_heads) * k_stride_h;
  const T* w = is_q ? q_weight : k_weight;
  const int pairs = static_cast<int>(head_dim / 2), rot_pairs = static_cast<int>(rot / 2);

  float a[kMaxPairsPerLane], b[kMaxPairsPerLane];
  float ss = 0.0f;
  for (int m = 0; m < kMaxPairsPerLane; ++m) {
    const int j = lane + kLanes * m;
    if (j >= pairs) break;
    const int i1 = kNeox && j < rot_pairs ? j : 2 * j;
    const int i2 = kNeox && j < rot_pairs ? rot_pairs + j : 2 * j + 1;
    a[m] = sgljit::to_float(x[i1]);
    b[m] = sgljit::to_float(x[i2]);
    ss += a[m] * a[m] + b[m] * b[m];
  }
  ss = sgljit::work_group_reduce_sum(ss);  // every work-item of the group reaches it
  const float inv_rms = sycl::rsqrt(ss / static_cast<float>(head_dim) + eps);
  const float pos = static_cast<float>(positions[t]);
  const float high_nudged = sycl::fabs(low - high) <= 1e-6f ? high + 0.001f : high;

  for (int m = 0; m < kMaxPairsPerLane; ++m) {
    const int j = lane + kLanes * m;
    if (j >= pairs) break;
    const int i1 = kNeox && j < rot_pairs ? j : 2 * j;
    const int i2 = kNeox && j < rot_pairs ? rot_pairs + j : 2 * j + 1;
    float y1 = a[m] * inv_rms * sgljit::to_float(w[i1]);
    float y2 = b[m] * inv_rms * sgljit::to_float(w[i2]);
    if (j < rot_pairs) {
      float f = sycl::pow(base, -2.0f * static_cast<float>(j) / static_cast<float>(rot));
      if constexpr (kYarn) {
        const float u = ramp_scale > 0.0f ? ramp_scale * f : static_cast<float>(j);  // YaRN or Llama 3.1
        const float ramp = sycl::clamp((u - low) / (high_nudged - low), 0.0f, 1.0f);
        f = f / factor * ramp + f * (1.0f - ramp);
      }
      float c;
      const float s = sycl::sincos(pos * f, &c);
      const float z1 = (y1 * c - y2 * s) * attention_factor;
      y2 = (y2 * c + y1 * s) * attention_factor;
      y1 = z1;
    }
    x[i1] = sgljit::from_float<T>(y1);
    x[i2] = sgljit::from_float<T>(y2);
  }
}

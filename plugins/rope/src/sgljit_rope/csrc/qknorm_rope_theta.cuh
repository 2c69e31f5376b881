// qknorm_rope_theta: per-head RMSNorm of q and k then rotary embedding with cos/sin computed from
// rope_theta (plain, YaRN or Llama 3.1) in the kernel, in place (sglang's fused_qk_norm_rope; formulas and
// numerics in qknorm_rope_theta.py's doc). y = x * rsqrt(mean(x^2) + eps) * w in fp32, not rounded;
// rotary pair j (neox: dims j and rot/2 + j; gptj: 2j and 2j + 1) turns by position * f_j and is
// scaled by attention_factor; dims [rot, head_dim) keep y; one rounding at the store.
//
// A warp owns one (token, head), q's heads first; lane l holds pairs l, l + 32, ... of the head's
// head_dim / 2 pairs (the rotary pairs, then the tail's adjacent pairs). The sum of squares is a warp
// reduction over the first read; the second pass reads the same elements again (L1) and stores them:
// a lane writes only what it read, after the reduction, so no lane reads a written element. head_dim
// and rotary_dim are runtime values: one module serves every head size.
#pragma once

#include <sgljit/cuda.cuh>
#include <sgljit/reduce.cuh>
#include <sgljit/tensor.h>
#include <sgljit/type.cuh>
#include <sgljit/utils.h>

#include <cstdint>
#include <limits>

namespace sgljit_rope {

using namespace sgljit;

struct QKNormRopeThetaParams {
  int64_t q_heads, k_heads, head_dim, rot;
  int64_t q_stride_t, q_stride_h, k_stride_t, k_stride_h;
  int64_t num_heads;  // tokens * (q_heads + k_heads)
  float eps, base, factor, low, high, attention_factor, ramp_scale;
};

inline constexpr int kThetaWarps = 4;  // heads a block: 128 threads, many small blocks per SM
// Pairs a lane holds in registers: heads up to 1024 wide (the table form's limit) are 16 pairs a lane.
inline constexpr int kThetaMaxPairsPerLane = 16;

template <bool YARN>
SGLJIT_DEVICE float theta_frequency(int j, const QKNormRopeThetaParams& p) {
  float f = powf(p.base, -2.0f * static_cast<float>(j) / static_cast<float>(p.rot));
  if constexpr (YARN) {
    // The ramp runs over pair indices (YaRN) or over ramp_scale * f (Llama 3.1: context / wavelength).
    const float u = p.ramp_scale > 0.0f ? p.ramp_scale * f : static_cast<float>(j);
    const float high = fabsf(p.low - p.high) <= 1e-6f ? p.high + 0.001f : p.high;
    const float ramp = fminf(fmaxf((u - p.low) / (high - p.low), 0.0f), 1.0f);
    f = f / p.factor * ramp + f * (1.0f - ramp);
  }
  return f;
}

template <typename T, typename IdxT, bool NEOX, bool YARN>
__global__ void __launch_bounds__(32 * kThetaWarps)
    qknorm_rope_theta_kernel(T* __restrict__ q, T* __restrict__ k, const T* __restrict__ q_weight,
                             const T* __restrict__ k_weight, const IdxT* __restrict__ positions,
                             const QKNormRopeThetaParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t head = int64_t{blockIdx.x} * kThetaWarps + (threadIdx.x >> 5);
  if (head >= p.num_heads) return;  // whole warps only: the reduction below has every lane of a warp
  const int64_t heads = p.q_heads + p.k_heads;
  const int64_t t = head / heads;
  const int64_t h = head - t * heads;
  const bool is_q = h < p.q_heads;
  T* x = is_q ? q + t * p.q_stride_t + h * p.q_stride_h : k + t * p.k_stride_t + (h - p.q_heads) * p.k_stride_h;
  const T* w = is_q ? q_weight : k_weight;
  const int pairs = static_cast<int>(p.head_dim / 2), rot_pairs = static_cast<int>(p.rot / 2);

  float a[kThetaMaxPairsPerLane], b[kThetaMaxPairsPerLane];
  float ss = 0.0f;
#pragma unroll
  for (int m = 0; m < kThetaMaxPairsPerLane; ++m) {
    const int j = lane + 32 * m;
    if (j < pairs) {
      const int i1 = NEOX && j < rot_pairs ? j : 2 * j;
      const int i2 = NEOX && j < rot_pairs ? rot_pairs + j : 2 * j + 1;
      a[m] = to_float(x[i1]);
      b[m] = to_float(x[i2]);
      ss += a[m] * a[m] + b[m] * b[m];
    }
  }
  ss = warp_reduce_sum(ss);
  const float inv_rms = rsqrtf(ss / static_cast<float>(p.head_dim) + p.eps);
  const float pos = static_cast<float>(positions[t]);
#pragma unroll
  for (int m = 0; m < kThetaMaxPairsPerLane; ++m) {
    const int j = lane + 32 * m;
    if (j < pairs) {
      const int i1 = NEOX && j < rot_pairs ? j : 2 * j;
      const int i2 = NEOX && j < rot_pairs ? rot_pairs + j : 2 * j + 1;
      float y1 = a[m] * inv_rms * to_float(w[i1]);
      float y2 = b[m] * inv_rms * to_float(w[i2]);
      if (j < rot_pairs) {
        float s, c;
        sincosf(pos * theta_frequency<YARN>(j, p), &s, &c);  // the accurate sincosf: angles reach 1e5
        const float z1 = (y1 * c - y2 * s) * p.attention_factor;
        y2 = (y2 * c + y1 * s) * p.attention_factor;
        y1 = z1;
      }
      x[i1] = from_float<T>(y1);
      x[i2] = from_float<T>(y2);
    }
  }
}

template <typename T, typename IdxT, bool NEOX, bool YARN>
struct QKNormRopeTheta {
  static void run(TensorView q, TensorView k, TensorView q_weight, TensorView k_weight, TensorView positions,
                  double eps, bool is_neox, int64_t rotary_dim, double base, double factor, double low, double high,
                  double attention_factor, double ramp_scale) {
    check_module_dtype<T>(q, "q");
    check_module_dtype<IdxT>(positions, "positions");
    RuntimeCheck(is_neox == NEOX, "is_neox: this module was compiled for is_neox=", NEOX ? "True" : "False");
    RuntimeCheck((factor != 1.0) == YARN, "factor: this module was compiled for ", YARN ? "YaRN (factor != 1)" : "factor 1");
    const int64_t head_dim = q.size(2);
    RuntimeCheck(head_dim % 2 == 0 && head_dim <= 64 * kThetaMaxPairsPerLane, "q: head_dim ", head_dim,
                 " is not supported by qknorm_rope_theta; expected an even head size of at most ",
                 64 * kThetaMaxPairsPerLane);
    RuntimeCheck(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim,
                 "rotary_dim: expected an even number in [2, head_dim=", head_dim, "], got ", rotary_dim);
    QKNormRopeThetaParams p{};
    p.q_heads = q.size(1);
    p.k_heads = k.size(1);
    p.head_dim = head_dim;
    p.rot = rotary_dim;
    p.q_stride_t = q.stride(0);
    p.q_stride_h = q.stride(1);
    p.k_stride_t = k.stride(0);
    p.k_stride_h = k.stride(1);
    p.num_heads = q.size(0) * (p.q_heads + p.k_heads);
    p.eps = static_cast<float>(eps);
    p.base = static_cast<float>(base);
    p.factor = static_cast<float>(factor);
    p.low = static_cast<float>(low);
    p.high = static_cast<float>(high);
    p.attention_factor = static_cast<float>(attention_factor);
    p.ramp_scale = static_cast<float>(ramp_scale);
    if (p.num_heads == 0) return;
    const int64_t blocks = div_ceil<int64_t>(p.num_heads, kThetaWarps);
    RuntimeCheck(blocks <= std::numeric_limits<int32_t>::max(), "q: ", q.size(0), " tokens of ", p.q_heads, " + ",
                 p.k_heads, " heads are more heads than one launch holds");
    LaunchKernel(qknorm_rope_theta_kernel<T, IdxT, NEOX, YARN>, static_cast<int>(blocks), 32 * kThetaWarps, 0,
                 q.device(), "sgljit_rope::qknorm_rope_theta_kernel")(
        static_cast<T*>(q.data_ptr()), static_cast<T*>(k.data_ptr()), static_cast<const T*>(q_weight.data_ptr()),
        static_cast<const T*>(k_weight.data_ptr()), static_cast<const IdxT*>(positions.data_ptr()), p);
  }
};

}  // namespace sgljit_rope

// FP8 quantization numerics shared by kernels that write float8_e4m3fn / float8_e5m2: the formats'
// limits, the correctly rounded division x / scale, the saturating conversion, the dynamic scale.
//
// Contract (what every user of these helpers is bit-identical to, for the same fp32 x and scale):
//     (x / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)          PyTorch, fp32 true division
//
// Division: x / scale must be the correctly rounded fp32 quotient. For scales in [2^-40, 2^40]
// (Divider::fast) it is computed from the correctly rounded reciprocal y = 1/scale by Markstein
// corrections (q0 = x*y, q1 = q0 + (x - s*q0)*y, q2 = q1 + (x - s*q1)*y, fma residuals): any fp32 x
// takes both steps (the last is exact by Markstein's theorem); x of at most 11 significant bits (a
// bf16 or fp16 input) may stop at q1, which for them is already the correctly rounded quotient
// (checked exhaustively: every bf16 and fp16 significand against every fp32 significand of the
// scale; the quant_fp8 tests repeat it on the CPU for a sample of scales). Quotients whose residuals
// could underflow are below 2^-60 (fp8 +-0, sign kept by copysign); |x*y| >= 2^100 saturates either
// way. Other scales use __fdiv_rn. Where only the fp8 code is needed, Bracket gives it without the
// quotient for all but about one value in 2^17 (which then takes Divider's steps).
// Conversion: clamp + round-to-nearest-even = the hardware cvt.rn.satfinite (saturation to +-max is
// the clamp; NaN stays NaN: 0x7F, as torch's conversion of the canonical NaN the GPU produces).
// Dynamic scale: max(absmax / fp8_max, 2^-126) in fp32 (true division); absmax is a max over |x| bit
// patterns (abs_bits) or a NaN-propagating float max (max_abs), so a NaN anywhere gives a NaN scale,
// as torch.amax.
#pragma once

#include <cuda_fp8.h>

#include "type.cuh"
#include "utils.h"

#include <cstdint>

namespace sgljit {

template <typename Q>
struct Fp8;
template <>
struct Fp8<fp8_e4m3_t> {
  static constexpr float kMax = 448.0f;
  static constexpr __nv_fp8_interpretation_t kKind = __NV_E4M3;
};
template <>
struct Fp8<fp8_e5m2_t> {
  static constexpr float kMax = 57344.0f;
  static constexpr __nv_fp8_interpretation_t kKind = __NV_E5M2;
};

// Smallest dynamic scale (2^-126, the smallest normal fp32): absmax / fp8_max below it (an all-zero
// or denormal-only input) is raised to it, so the scale is never 0.
inline constexpr float kMinScale = 1.17549435082228750797e-38f;

// |x| as bits: for non-negative floats the unsigned order is the numeric order, and every NaN is
// above +inf, so a max over these bits is a NaN-propagating absmax.
SGLJIT_DEVICE uint32_t abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

// max(m, |x|), NaN if either is NaN (PTX max.NaN: one FMNMX with |x| as an operand modifier, where
// abs_bits and an integer max take two instructions). Its results are >= 0 or NaN, so their bits
// order as abs_bits' do and reduce as they do.
SGLJIT_DEVICE float max_abs(float m, float x) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(x)));
  return r;
}

// max(absmax / fp8_max, 2^-126) from absmax's bits (a max over abs_bits or max_abs).
SGLJIT_DEVICE float scale_from_absmax(uint32_t bits, float fp8_max) {
  const float s = __fdiv_rn(__uint_as_float(bits), fp8_max);
  return s < kMinScale ? kMinScale : s;  // NaN compares false: stays NaN
}

// How Divider computes x / s: kDivide (__fdiv_rn, any scale); for fast scales, kMarkstein (two
// steps: any fp32 x) and kOneStep (one step: x of at most 11 significant bits; see the top of the
// file), both the correctly rounded quotient; kOneStepBounded and kMarksteinBounded, the same without
// the guard for huge quotients, NaN and inf, where |x / s| <= fp8_max is known (a dynamic scale from
// x's own absmax).
enum Quotient : int { kDivide = 0, kMarkstein = 1, kOneStep = 2, kOneStepBounded = 3, kMarksteinBounded = 4 };

struct Divider {
  float s, y;
  SGLJIT_DEVICE explicit Divider(float scale) : s(scale) { y = __frcp_rn(scale); }
  SGLJIT_DEVICE static bool fast(float scale) { return scale >= 0x1p-40f && scale <= 0x1p40f; }

  // The one step's q1 before its sign is made x's (see operator()).
  SGLJIT_DEVICE float one_step_unsigned(float x) const {
    const float q0 = __fmul_rn(x, y);
    return __fmaf_rn(__fmaf_rn(-q0, s, x), y, q0);
  }

  // x / s as kMode says (see the top of the file).
  template <int kMode>
  SGLJIT_DEVICE float operator()(float x) const {
    if constexpr (kMode == kOneStep || kMode == kOneStepBounded) {
      // (copysign: an exactly cancelling sum would be +0 for a tiny negative x)
      const float q1 = copysignf(one_step_unsigned(x), x);
      if constexpr (kMode == kOneStepBounded) {
        return q1;
      } else {
        const float q0 = __fmul_rn(x, y);
        return fabsf(q0) < 0x1p100f ? q1 : q0;  // NaN, inf, huge: q0
      }
    } else if constexpr (kMode == kMarkstein || kMode == kMarksteinBounded) {
      const float q0 = __fmul_rn(x, y);
      const float r0 = __fmaf_rn(-q0, s, x);
      const float q1 = __fmaf_rn(r0, y, q0);
      const float r1 = __fmaf_rn(-q1, s, x);
      const float q2 = copysignf(__fmaf_rn(r1, y, q1), x);
      if constexpr (kMode == kMarksteinBounded) {
        return q2;
      } else {
        return fabsf(q0) < 0x1p100f ? q2 : q0;  // NaN, inf, huge: q0
      }
    } else {
      return __fdiv_rn(x, s);
    }
  }
};

// The correctly rounded division for fast scales (Divider::fast) of T's values: one Markstein step
// for 16-bit types, two for fp32. kBounded: |x / s| <= fp8_max for every x (a dynamic scale).
template <typename T, bool kBounded>
inline constexpr int kFastQuotient = sizeof(T) == 4 ? kMarkstein : kBounded ? kOneStepBounded : kOneStep;

// The codes of x / s without dividing, for Divider::fast scales. lo < 1/s < hi as real numbers (the
// reciprocal's rounding and the products' are 2^-24 each, the margin 2^-20), so x * lo and x * hi
// enclose x / s; rounding to fp32 and converting to fp8 are monotonic, so where the two products'
// codes agree they are the code of the correctly rounded quotient: for every x, NaN, inf and
// overflow included. They differ only where an fp8 rounding boundary lies within about 2^-20 of the
// quotient (about one quotient in 2^17 on random data; exact ties always); the caller converts those
// through Divider.
struct Bracket {
  float lo, hi;
  SGLJIT_DEVICE explicit Bracket(const Divider& d) : lo(d.y * (1.0f - 0x1p-20f)), hi(d.y * (1.0f + 0x1p-20f)) {}
};

// Two quotients -> two fp8 bytes (low byte = first), clamped and rounded to nearest even.
template <typename Q>
SGLJIT_DEVICE uint16_t to_fp8x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, Fp8<Q>::kKind);
}
template <typename Q>
SGLJIT_DEVICE uint8_t to_fp8(float a) {
  return __nv_cvt_float_to_fp8(a, __NV_SATFINITE, Fp8<Q>::kKind);
}

}  // namespace sgljit

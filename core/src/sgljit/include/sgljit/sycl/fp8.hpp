// FP8 quantization numerics for SYCL kernels (the counterpart of sgljit/fp8.cuh): the formats'
// limits, the conversion fp32 -> fp8 byte, quantize(x, scale), the dynamic scale.
//
// SYCL has no fp8 arithmetic type: fp8_e4m3_t / fp8_e5m2_t are one-byte storage types (the names
// make_cpp_args gives torch.float8_e4m3fn / float8_e5m2, so -DNAME=fp8_e4m3_t picks a format) and
// kernels write the bytes. The conversion is software, bit for bit PyTorch's (c10's float8 casts):
// round to nearest even, subnormals, NaN -> 0x7F | sign; values beyond the range (never seen after
// quantize's clamp) saturate (e4m3fn) or become inf (e5m2), as in PyTorch 2.13.
//   quantize<Q>(x, s) = (x / s).clamp(-fp8_max, fp8_max).to(Q)      (IEEE fp32 division; NaN stays NaN)
//   scale_from_absmax<Q>(bits) = max(absmax / fp8_max, 2^-126)      (NaN-propagating: abs_bits below)
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernel.hpp"

namespace sgljit {

struct fp8_e4m3_t {
  uint8_t bits;
};
struct fp8_e5m2_t {
  uint8_t bits;
};

template <typename Q>
struct Fp8;
template <>
struct Fp8<fp8_e4m3_t> {
  static constexpr float kMax = 448.0f;
};
template <>
struct Fp8<fp8_e5m2_t> {
  static constexpr float kMax = 57344.0f;
};

// Smallest dynamic scale (2^-126, the smallest normal fp32): never 0.
inline constexpr float kMinScale = 1.17549435082228750797e-38f;

namespace detail {
// Round-to-nearest-even of |x| (bits `a`, below the smallest normal of the fp8 format) in units of
// the format's smallest subnormal: value * 2^k = mantissa >> (150 - k - exponent).
inline uint32_t fp8_subnormal_rne(uint32_t a, int k) {
  const int e = static_cast<int>(a >> 23);
  const uint32_t mant = (a & 0x7fffffu) | (e ? 0x800000u : 0u);
  const int shift = 150 - k - (e ? e : 1);
  if (shift >= 32) return 0u;
  const uint32_t r = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  return r + ((rem > half || (rem == half && (r & 1u))) ? 1u : 0u);
}
}  // namespace detail

// fp32 -> fp8 byte, as torch's .to(float8_e4m3fn / float8_e5m2).
template <typename Q>
inline uint8_t fp8_from_float(float f) {
  const uint32_t bits = sycl::bit_cast<uint32_t>(f);
  const uint32_t sign = (bits >> 24) & 0x80u;
  uint32_t a = bits & 0x7fffffffu;
  if constexpr (std::is_same_v<Q, fp8_e5m2_t>) {
    if (a >= 0x47800000u) return static_cast<uint8_t>(sign | (a > 0x7f800000u ? 0x7fu : 0x7cu));  // >= 2^16
    if (a < 0x38800000u) return static_cast<uint8_t>(sign | detail::fp8_subnormal_rne(a, 16));      // < 2^-14
    a += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffffu + ((a >> 21) & 1u);
    return static_cast<uint8_t>(sign | (a >> 21));
  } else {  // e4m3fn
    if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);                     // NaN
    if (a >= 0x43e80000u) return static_cast<uint8_t>(sign | 0x7eu);                    // >= 464, inf: 448
    if (a < 0x3c800000u) return static_cast<uint8_t>(sign | detail::fp8_subnormal_rne(a, 9));  // < 2^-6
    a += (static_cast<uint32_t>(7 - 127) << 23) + 0x7ffffu + ((a >> 20) & 1u);
    return static_cast<uint8_t>(sign | (a >> 20));
  }
}

// (x / scale).clamp(-fp8_max, fp8_max).to(Q) as a byte.
template <typename Q>
inline uint8_t quantize(float x, float scale) {
  float q = x / scale;
  if (!sycl::isnan(q)) q = sycl::fmin(sycl::fmax(q, -Fp8<Q>::kMax), Fp8<Q>::kMax);
  return fp8_from_float<Q>(q);
}

// |x| as bits: unsigned order = numeric order, NaN above inf (a NaN-propagating max).
inline uint32_t abs_bits(float x) { return sycl::bit_cast<uint32_t>(x) & 0x7fffffffu; }

// max(absmax / fp8_max, 2^-126) from absmax's bits (a max over abs_bits).
template <typename Q>
inline float scale_from_absmax(uint32_t bits) {
  const float s = sycl::bit_cast<float>(bits) / Fp8<Q>::kMax;
  return s < kMinScale ? kMinScale : s;  // NaN stays NaN
}

}  // namespace sgljit

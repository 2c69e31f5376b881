// Shared by the quant_fp8 kernels: fp8 formats, the division x / scale, the dynamic scale, vector I/O
// and absmax reductions.
//
// Division: x / scale must be the correctly rounded fp32 quotient (torch divides by the scale
// tensor). For scales in [2^-40, 2^40] (Divider::fast) it is computed from the correctly rounded
// reciprocal y = 1/scale by Markstein corrections (q0 = x*y, q1 = q0 + (x - s*q0)*y,
// q2 = q1 + (x - s*q1)*y, fma residuals): fp32 inputs take both steps (the last is exact by
// Markstein's theorem); bf16 and fp16 inputs (at most 11 significant bits) stop at q1, which for them
// is already the correctly rounded quotient (checked exhaustively, every bf16 and fp16 significand
// against every fp32 significand of the scale; tests/plugins/test_quant_fp8.py repeats it on the CPU
// for a sample of scales). Quotients whose residuals could underflow are below 2^-60 (fp8 +-0, sign
// kept by copysign); |x*y| >= 2^100 saturates either way. Other scales use __fdiv_rn.
// Conversion: clamp + round-to-nearest-even = the hardware cvt.rn.satfinite (saturation to +-max is
// the clamp; NaN stays NaN: 0x7F, as torch's conversion of the canonical NaN the GPU produces).
// Dynamic scale: max(absmax / fp8_max, 2^-126) in fp32 (true division); absmax is a max over |x| bit
// patterns, so a NaN anywhere gives a NaN scale, as torch.amax.
#pragma once

#include <cuda_fp8.h>

#include <sgljit/cuda.cuh>
#include <sgljit/reduce.cuh>
#include <sgljit/type.cuh>
#include <sgljit/vec.cuh>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace sgljit_quant_fp8 {

using namespace sgljit;

// ------------------------------------------------------------------------------------------------
// Numerics

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

SGLJIT_DEVICE float scale_from_absmax(uint32_t bits, float fp8_max) {
  const float s = __fdiv_rn(__uint_as_float(bits), fp8_max);
  return s < kMinScale ? kMinScale : s;  // NaN compares false: stays NaN
}

// How Divider computes x / s: kDivide (__fdiv_rn, any scale); for fast scales, kMarkstein (two
// steps: any fp32 x) and kOneStep (one step: 16-bit x; see the top of the file), both the
// correctly rounded quotient; kOneStepBounded, kOneStep without the guard for huge quotients, NaN and
// inf, where |x / s| <= fp8_max is known (a dynamic scale from x's own absmax).
enum Quotient : int { kDivide = 0, kMarkstein = 1, kOneStep = 2, kOneStepBounded = 3 };

struct Divider {
  float s, y;
  SGLJIT_DEVICE explicit Divider(float scale) : s(scale) { y = __frcp_rn(scale); }
  SGLJIT_DEVICE static bool fast(float scale) { return scale >= 0x1p-40f && scale <= 0x1p40f; }

  // The one step's q1 before its sign is made x's (see operator() and Io::quantize_store).
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
    } else if constexpr (kMode == kMarkstein) {
      const float q0 = __fmul_rn(x, y);
      const float r0 = __fmaf_rn(-q0, s, x);
      const float q1 = __fmaf_rn(r0, y, q0);
      const float r1 = __fmaf_rn(-q1, s, x);
      const float q2 = __fmaf_rn(r1, y, q1);
      return fabsf(q0) < 0x1p100f ? copysignf(q2, x) : q0;  // NaN, inf, huge: q0
    } else {
      return __fdiv_rn(x, s);
    }
  }
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

inline bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// ------------------------------------------------------------------------------------------------
// Vector I/O: VEC elements of T in one transaction (16 bytes when VEC = 16 / sizeof(T)).

template <int kBytes>
struct Raw;
template <>
struct Raw<16> {
  using type = uint4;
};
template <>
struct Raw<8> {
  using type = uint2;
};
template <>
struct Raw<4> {
  using type = unsigned int;
};
template <>
struct Raw<2> {
  using type = unsigned short;
};
template <>
struct Raw<1> {
  using type = unsigned char;
};

// VEC elements of T are carried as their raw bits (uint4 for 16 bytes), never as an array of 16-bit
// class objects: copying those element by element costs byte permutes that wait on the load, which
// serialized the loads in flight. Elements are read out of the 32-bit words with shifts/masks.
template <typename T, int VEC>
struct Io {
  using V = typename Raw<sizeof(T) * VEC>::type;
  using Out = typename Raw<VEC>::type;  // VEC fp8 bytes
  static constexpr int kWords = sizeof(V) >= 4 ? int(sizeof(V) / 4) : 1;

  // kStream: evict-first (data read for the last time, or data we do not want to keep in L2).
  template <bool kStream>
  SGLJIT_DEVICE static V load(const T* p) {
    if constexpr (kStream) {
      return __ldcs(reinterpret_cast<const V*>(p));
    } else {
      return *reinterpret_cast<const V*>(p);
    }
  }

  SGLJIT_DEVICE static void words(const V& v, uint32_t (&w)[kWords]) {
    if constexpr (sizeof(V) >= 4) {
      memcpy(w, &v, sizeof(V));
    } else {
      w[0] = v;
    }
  }

  // Element i (a compile-time constant after unrolling) as fp32.
  SGLJIT_DEVICE static float get(const V& v, int i) {
    if constexpr (sizeof(T) == 4) {
      uint32_t w[kWords];
      words(v, w);
      return __uint_as_float(w[i]);
    } else if constexpr (VEC == 1) {
      T t;
      memcpy(&t, &v, sizeof(T));
      return to_float(t);
    } else {
      uint32_t w[kWords];
      words(v, w);
      const uint32_t word = w[i / 2];
      if constexpr (std::is_same_v<T, bf16_t>) {  // bf16 -> fp32 is the 16 bits on top
        return __uint_as_float(i % 2 ? (word & 0xffff0000u) : (word << 16));
      } else {
        __half2 h;
        memcpy(&h, &word, sizeof(h));
        return i % 2 ? __high2float(h) : __low2float(h);
      }
    }
  }

  // v with every 32-bit word xor-ed with `zero` (0 at run time; see token_quant).
  SGLJIT_DEVICE static V opaque(const V& v, uint32_t zero) {
    if constexpr (sizeof(V) >= 4) {
      uint32_t w[kWords];
      words(v, w);
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] ^= zero;
      V r;
      memcpy(&r, w, sizeof(V));
      return r;
    } else {
      return v;
    }
  }

  SGLJIT_DEVICE static uint32_t absmax(const V& v) {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < VEC; ++i) m = max(m, abs_bits(get(v, i)));
    return m;
  }

  template <typename Q, int kMode>
  SGLJIT_DEVICE static void quantize_store(const V& v, const Divider& div, uint8_t* dst) {
    Out raw;
    // Every output byte's sign is its input's where the quotient is bounded (finite), and the one
    // step's q1 has x's sign except where its sum cancels to +0 for a negative x. So 16-bit inputs in
    // whole output words skip the copysign per element: the sign bits of a word's four inputs,
    // gathered by one byte permute, are OR-ed into it (2 instructions per 4 elements).
    constexpr bool kSignWords = kMode == kOneStepBounded && sizeof(T) == 2 && VEC % 4 == 0;
    auto quotient = [&](int i) {
      if constexpr (kSignWords) {
        return div.one_step_unsigned(get(v, i));
      } else {
        return div.template operator()<kMode>(get(v, i));
      }
    };
    if constexpr (VEC == 1) {
      raw = to_fp8<Q>(quotient(0));
    } else {
      uint16_t pairs[VEC / 2];
#pragma unroll
      for (int i = 0; i < VEC / 2; ++i) pairs[i] = to_fp8x2<Q>(quotient(2 * i), quotient(2 * i + 1));
      memcpy(&raw, pairs, sizeof(raw));
    }
    if constexpr (kSignWords) {
      uint32_t w[kWords], o[VEC / 4];
      words(v, w);
      memcpy(o, &raw, sizeof(o));
#pragma unroll
      for (int i = 0; i < VEC / 4; ++i) o[i] |= __byte_perm(w[2 * i], w[2 * i + 1], 0x7531) & 0x80808080u;  // bytes 1, 3, 5, 7
      memcpy(&raw, o, sizeof(raw));
    }
    __stcs(reinterpret_cast<Out*>(dst), raw);
  }
};

// Running max of |x| as fp32 bits (see abs_bits). 16-bit inputs in vectors are kept packed: clearing
// the sign bits gives |x| exactly, and max.NaN on x2 pairs (one instruction per two elements) orders
// non-negative values as the fp32 bit patterns do and turns any NaN into a NaN, so bits() equals the
// unpacked max over abs_bits(to_float(x)) up to the NaN payload (NaN either way).
template <typename T>
struct Packed2 {
  using type = void;
};
template <>
struct Packed2<fp16_t> {
  using type = __half2;
};
template <>
struct Packed2<bf16_t> {
  using type = __nv_bfloat162;
};

template <typename T, int VEC, bool kPacked = (sizeof(T) == 2 && VEC >= 2)>
struct AbsMax {
  uint32_t m = 0;
  SGLJIT_DEVICE void add(const typename Io<T, VEC>::V& v) { m = max(m, Io<T, VEC>::absmax(v)); }
  SGLJIT_DEVICE uint32_t bits() const { return m; }
};

template <typename T, int VEC>
struct AbsMax<T, VEC, true> {
  using T2 = typename Packed2<T>::type;
  T2 m;
  SGLJIT_DEVICE AbsMax() {
    const uint32_t zero = 0;
    memcpy(&m, &zero, sizeof(m));
  }
  SGLJIT_DEVICE void add(const typename Io<T, VEC>::V& v) {
    uint32_t w[VEC / 2];
    Io<T, VEC>::words(v, w);
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
      const uint32_t a = w[i] & 0x7fff7fffu;
      T2 h;
      memcpy(&h, &a, sizeof(h));
      m = __hmax2_nan(m, h);
    }
  }
  SGLJIT_DEVICE uint32_t bits() const {
    return max(abs_bits(__low2float(m)), abs_bits(__high2float(m)));
  }
};

// Block-wide max of uint32 (blockDim.x a multiple of 32, `smem` 32 words); every thread gets it.
SGLJIT_DEVICE uint32_t block_reduce_max_u32(uint32_t v, uint32_t* smem) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
  v = __reduce_max_sync(kFullMask, v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < num_warps ? smem[lane] : 0u;
  v = __reduce_max_sync(kFullMask, v);
  __syncthreads();
  return v;
}

// The dynamic scale from the absmax pass's partial maxima partial[0, n) (written by an earlier
// kernel or before a grid barrier: read through L2), block-wide; every thread gets it. kThreads: the
// block size where the kernel fixes it, else 0 (blockDim.x).
template <typename Q, int kThreads = 0>
SGLJIT_DEVICE float scale_from_partials(const uint32_t* partial, int n, uint32_t* red) {
  uint32_t m = 0;
  if constexpr (kThreads > 0) {
    for (int i = threadIdx.x; i < n; i += kThreads) m = max(m, __ldcg(partial + i));
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = max(m, __ldcg(partial + i));
  }
  return scale_from_absmax(block_reduce_max_u32(m, red), Fp8<Q>::kMax);
}

// The correctly rounded division for fast scales (Divider::fast) of T's inputs: one Markstein step
// for 16-bit inputs, two for fp32. kBounded: |x / s| <= fp8_max for every input (a dynamic scale).
template <typename T, bool kBounded>
inline constexpr int kFastQuotient =
    sizeof(T) == 4 ? kMarkstein : kBounded ? kOneStepBounded : kOneStep;

}  // namespace sgljit_quant_fp8

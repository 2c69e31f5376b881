// Element types kernels are written against, and conversions through fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "tensor.h"
#include "vec.cuh"

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace sgljit {

using fp16_t = __half;
using bf16_t = __nv_bfloat16;
using fp8_e4m3_t = __nv_fp8_e4m3;
using fp8_e5m2_t = __nv_fp8_e5m2;

SGLJIT_DEFINE_DTYPE_TRAIT(__half, kDLFloat, 16, "float16")
SGLJIT_DEFINE_DTYPE_TRAIT(__nv_bfloat16, kDLBfloat, 16, "bfloat16")
SGLJIT_DEFINE_DTYPE_TRAIT(__nv_fp8_e4m3, kDLFloat8_e4m3fn, 8, "float8_e4m3fn")
SGLJIT_DEFINE_DTYPE_TRAIT(__nv_fp8_e5m2, kDLFloat8_e5m2, 8, "float8_e5m2")

SGLJIT_DEVICE float to_float(float x) { return x; }
SGLJIT_DEVICE float to_float(__half x) { return __half2float(x); }
SGLJIT_DEVICE float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
SGLJIT_DEVICE float to_float(__nv_fp8_e4m3 x) { return static_cast<float>(x); }
SGLJIT_DEVICE float to_float(__nv_fp8_e5m2 x) { return static_cast<float>(x); }

// The bf16 `half` (0: low, 1: high) of a 32-bit word of two, in fp32. A bf16 is the top half of its
// fp32 value: one shift or mask, where extracting the half first takes two instructions (for
// issue-bound kernels: ab-norm-quant-unpack.md).
SGLJIT_DEVICE float bf16_of_word(uint32_t word, int half) {
  return __uint_as_float(half ? (word & 0xffff0000u) : (word << 16));
}

// Element e of a vector in fp32 (bf16 through bf16_of_word).
template <typename T, int N>
SGLJIT_DEVICE float float_at(const AlignedVector<T, N>& v, int e) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    uint32_t word;
    memcpy(&word, &v.data[e & ~1], sizeof(word));
    return bf16_of_word(word, e & 1);
  } else {
    return to_float(v[e]);
  }
}

// Round-to-nearest-even conversion from fp32 (saturating for fp8, as PyTorch's cast is not:
// callers clamp first when they need PyTorch's exact behaviour).
template <typename T>
SGLJIT_DEVICE T from_float(float x);
template <>
SGLJIT_DEVICE float from_float<float>(float x) { return x; }
template <>
SGLJIT_DEVICE __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
SGLJIT_DEVICE __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
SGLJIT_DEVICE __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float x) { return __nv_fp8_e4m3(x); }
template <>
SGLJIT_DEVICE __nv_fp8_e5m2 from_float<__nv_fp8_e5m2>(float x) { return __nv_fp8_e5m2(x); }

// x rounded to T and read back as fp32: the value a kernel that stores x as T hands the next one.
template <typename T>
SGLJIT_DEVICE float round_to(float x) {
  return to_float(from_float<T>(x));
}

}  // namespace sgljit

// Shared by the activation kernels: the gated activations in fp32, 16-byte (or one-element) vector I/O,
// the index division, and the host's checks and launch splitting.
//
// Every kernel computes y = act(gate) * up through act_and_mul below, with round-to-nearest intrinsics
// that the compiler may not contract into FMAs, so the fused fp8 kernel's float32 y is bit for bit the
// float32 output of the plain kernel (ops.py's contract: the fused op equals per_token_group_quant_fp8
// of silu_and_mul computed in float32). Formulas are PyTorch's:
//   silu(x) = x / (1 + exp(-x));  gelu(x) = x/2 * (1 + erf(x / sqrt(2)));
//   gelu_tanh(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))).
#pragma once

#include <sgljit/cuda.cuh>
#include <sgljit/tensor.h>
#include <sgljit/type.cuh>
#include <sgljit/utils.h>
#include <sgljit/vec.cuh>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace sgljit_activation {

using namespace sgljit;
using tvm::ffi::TensorView;

enum class Act : int { kSilu, kGelu, kGeluTanh };

template <Act kAct>
SGLJIT_DEVICE float act(float x) {
  if constexpr (kAct == Act::kSilu) {
    return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x)));
  } else if constexpr (kAct == Act::kGelu) {
    constexpr float kSqrtHalf = 0.70710678118654752f;
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, erff(__fmul_rn(x, kSqrtHalf))));
  } else {
    constexpr float kBeta = 0.79788456080286536f, kKappa = 0.044715f;  // sqrt(2 / pi)
    const float cube = __fmul_rn(__fmul_rn(x, x), x);
    const float inner = __fmul_rn(kBeta, __fadd_rn(x, __fmul_rn(kKappa, cube)));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
  }
}

template <Act kAct>
SGLJIT_DEVICE float act_and_mul(float gate, float up) {
  return __fmul_rn(act<kAct>(gate), up);
}

// x / d by the steps __fdiv_rn takes where its range check passes (a reciprocal estimate, one Newton
// step, a quotient and one correction).
SGLJIT_DEVICE float div_fast_path(float x, float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
  const float q = __fmul_rn(x, r);
  return __fmaf_rn(r, __fmaf_rn(-d, q, x), q);
}

// y[e] = act_and_mul(gate(e), up(e)) for the N elements of a vector. silu's quotient is __fdiv_rn's
// own fast-path steps, branch-free, so a vector's N chains interleave (__fdiv_rn's range check is a
// branch an element that runs them one after the other); same bits: __fdiv_rn itself only for a
// vector holding an x outside [-80, 2^64] or |x| < 2^-60, where those steps could leave its range.
template <Act kAct, int N, typename G, typename U>
SGLJIT_DEVICE void act_and_mul_all(float (&y)[N], G gate, U up) {
  if constexpr (kAct == Act::kSilu) {
    bool slow = false;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float x = gate(e);
      slow |= !(x >= -80.0f && x <= 0x1p64f && fabsf(x) >= 0x1p-60f);  // NaN: slow
      y[e] = __fmul_rn(div_fast_path(x, __fadd_rn(1.0f, expf(-x))), up(e));
    }
    if (slow) {
#pragma unroll
      for (int e = 0; e < N; ++e) y[e] = act_and_mul<kAct>(gate(e), up(e));
    }
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) y[e] = act_and_mul<kAct>(gate(e), up(e));
  }
}

// VEC elements of T carried as raw bits (one load or store instruction), read out as fp32.
template <typename T, int VEC>
struct Vec {
  using Raw = typename RawBytes<sizeof(T) * VEC>::type;
  Raw raw;

  // kStream: evict-first (ld.global.cs), for inputs beyond the L2; else the read-only path.
  template <bool kStream>
  SGLJIT_DEVICE void load(const T* p) {
    if constexpr (kStream) {
      raw = __ldcs(reinterpret_cast<const Raw*>(p));
    } else {
      raw = __ldg(reinterpret_cast<const Raw*>(p));
    }
  }

  SGLJIT_DEVICE float operator[](int i) const {  // i: a compile-time constant after unrolling
    T e[VEC];
    memcpy(e, &raw, sizeof(raw));
    if constexpr (std::is_same_v<T, bf16_t>) {
      if constexpr (VEC >= 2) {
        uint32_t w[sizeof(raw) / 4];
        memcpy(w, &raw, sizeof(raw));
        return bf16_of_word(w[i / 2], i % 2);  // a shift or a mask, not a conversion
      }
    }
    return to_float(e[i]);
  }
};

// VEC fp32 values rounded to T and stored in one instruction (16-bit types two at a time).
template <typename T, int VEC, bool kStream>
SGLJIT_DEVICE void store_rounded(T* p, const float (&y)[VEC]) {
  using Raw = typename RawBytes<sizeof(T) * VEC>::type;
  T e[VEC];
#pragma unroll
  for (int i = 0; i < VEC; i += 2) {
    if constexpr (VEC >= 2 && std::is_same_v<T, bf16_t>) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(y[i], y[i + 1]);
      memcpy(&e[i], &pair, sizeof(pair));
    } else if constexpr (VEC >= 2 && std::is_same_v<T, fp16_t>) {
      const __half2 pair = __floats2half2_rn(y[i], y[i + 1]);
      memcpy(&e[i], &pair, sizeof(pair));
    } else {
      e[i] = from_float<T>(y[i]);
      if (i + 1 < VEC) e[i + 1] = from_float<T>(y[i + 1]);
    }
  }
  Raw raw;
  memcpy(&raw, e, sizeof(raw));
  store_raw<kStream>(p, raw);
}

// n / d for n < 2^31 by a multiply-high and a shift (Granlund and Montgomery): the row of a flat index.
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;  // the identity
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint64_t{1} << s) < d) ++s;
    m = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - d)) / d + 1);
  }
  SGLJIT_DEVICE uint32_t operator()(uint32_t n) const { return (__umulhi(n, m) + n) >> s; }
};

// Indices of a launch are 32-bit: larger inputs take several launches of whole rows (tests lower the
// limit with -DSGLJIT_ACTIVATION_MAX_ITEMS_PER_LAUNCH to reach that path with small inputs).
#ifndef SGLJIT_ACTIVATION_MAX_ITEMS_PER_LAUNCH
#define SGLJIT_ACTIVATION_MAX_ITEMS_PER_LAUNCH ((int64_t{1} << 31) - (int64_t{1} << 20))
#endif
inline constexpr int64_t kMaxItemsPerLaunch = SGLJIT_ACTIVATION_MAX_ITEMS_PER_LAUNCH;

// Calls launch(first_row, rows) over row ranges of at most kMaxItemsPerLaunch items (per_row a row).
template <typename F>
void for_each_launch(int64_t rows, int64_t per_row, F&& launch) {
  RuntimeCheck(per_row <= kMaxItemsPerLaunch, "input: rows wider than ", kMaxItemsPerLaunch,
               " vectors are not supported, got ", per_row);
  const int64_t step = kMaxItemsPerLaunch / per_row;
  for (int64_t r = 0; r < rows; r += step) launch(r, std::min(step, rows - r));
}

// input [T, 2 * d] against out [T, d], with the messages of the checks sgljit.op generates from the
// spec's "2*d" (which run first): the entry points' own guard before any pointer arithmetic on d.
inline void check_halves(const TensorView& input, const TensorView& out) {
  const int64_t width = input.size(1), hidden = out.size(1);
  RuntimeCheck(width % 2 == 0, "input: last dimension must be even (gate and up halves), got ", width);
  RuntimeCheck(hidden * 2 == width, "out: dimension 1 expected ", width / 2, " (half of input's last dimension ",
               width, "), got ", hidden);
}

// The row stride of a [T, W] tensor for the kernels (a size-1 dimension's stride means nothing: 0).
inline int64_t row_stride(const TensorView& t) { return t.size(0) == 1 ? 0 : t.stride(0); }

// Whether rows of T read or written VEC elements at a time stay 16-byte aligned.
template <typename T>
bool vector_aligned(const TensorView& t, int64_t elements) {
  constexpr int64_t kVec = kVecSize<T>;
  return is_aligned(t.data_ptr(), 16) && row_stride(t) % kVec == 0 && elements % kVec == 0;
}

}  // namespace sgljit_activation

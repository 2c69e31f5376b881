// The gated activations in fp32 for SYCL, shared by every kernel of the family (the counterpart of
// csrc/common.cuh): act_and_mul(gate, up) = act(gate) * up with PyTorch's formulas
//   silu(x) = x / (1 + exp(-x));  gelu(x) = x/2 * (1 + erf(x / sqrt(2)));
//   gelu_tanh(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))).
// Contraction into FMAs is off, so the fused fp8 kernel's float32 product is bit for bit the float32
// output of the plain kernel.
#pragma once

#include <sgljit/sycl/kernel.hpp>

namespace sgljit_activation {

enum class Act : int { kSilu, kGelu, kGeluTanh };

template <Act kAct>
inline float act(float x) {
#pragma clang fp contract(off)
  if constexpr (kAct == Act::kSilu) {
    return x / (1.0f + sycl::exp(-x));
  } else if constexpr (kAct == Act::kGelu) {
    return 0.5f * x * (1.0f + sycl::erf(x * 0.70710678118654752f));
  } else {
    const float inner = 0.79788456080286536f * (x + 0.044715f * (x * x * x));
    return 0.5f * x * (1.0f + sycl::tanh(inner));
  }
}

template <Act kAct>
inline float act_and_mul(float gate, float up) {
#pragma clang fp contract(off)
  return act<kAct>(gate) * up;
}

}  // namespace sgljit_activation

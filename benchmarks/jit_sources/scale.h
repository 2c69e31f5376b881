// CPU kernel for the JIT-machinery benchmark: out = x * kScale (float32), validated like a real op.
#pragma once

#include <sgljit/tensor.h>

#include <cstdint>

template <int kScale>
struct ScaleCpu {
  static void run(tvm::ffi::TensorView x, tvm::ffi::TensorView out) {
    sgljit::SymbolicSize n{"n"};
    sgljit::SymbolicDevice dev;
    sgljit::TensorMatcher({n}).with_dtype<float>().with_device(kDLCPU, dev).verify(x, "x");
    sgljit::TensorMatcher({n}).with_dtype<float>().with_device(dev).verify(out, "out");
    const float* in = static_cast<const float*>(x.data_ptr());
    float* o = static_cast<float*>(out.data_ptr());
    const int64_t len = n.value();
    for (int64_t i = 0; i < len; ++i) o[i] = in[i] * kScale;
  }
};

// The cheapest possible export: measures the FFI call itself.
struct Noop {
  static void run(tvm::ffi::TensorView x) { (void)x; }
};

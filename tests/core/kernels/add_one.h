// A CPU kernel used by core's tests: x += value (+ the constant from offset.h).
#pragma once
#include <sgljit/tensor.h>

#include "offset.h"

template <typename T>
struct AddOne {
  static void run(tvm::ffi::TensorView x, double value) {
    using namespace sgljit;
    SymbolicSize n{"n"};
    TensorMatcher({n}).contiguous().with_dtype<T>().with_device(kDLCPU).verify(x, "x");
    T* p = static_cast<T*>(x.data_ptr());
    for (int64_t i = 0; i < n.value(); ++i) p[i] += static_cast<T>(value + kOffset);
  }
};

// Two tensors that must agree in length, dtype and device: exercises symbol binding.
struct AddInto {
  static void run(tvm::ffi::TensorView src, tvm::ffi::TensorView dst) {
    using namespace sgljit;
    SymbolicSize n{"n"};
    auto dt = SymbolicDType::of<float, double>();
    SymbolicDevice dev;
    TensorMatcher({n}).with_strides({1}).with_dtype(dt).with_device(kDLCPU, dev).verify(src, "src");
    TensorMatcher({n}).with_strides({1}).with_dtype(dt).with_device(dev).verify(dst, "dst");
    RuntimeCheck(dt.value().bits == 32, "only float32 is implemented, got ", dtype_name(dt.value()));
    const float* s = static_cast<const float*>(src.data_ptr());
    float* d = static_cast<float*>(dst.data_ptr());
    for (int64_t i = 0; i < n.value(); ++i) d[i] += s[i];
  }
};

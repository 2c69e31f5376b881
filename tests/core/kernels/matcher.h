// CPU wrappers used by core's tests of TensorMatcher: each verifies its arguments and does nothing.
#pragma once
#include <sgljit/tensor.h>

#include <cstdint>

// Two tensors related through symbols (rows, dtype, device); y's width is fixed at 4.
struct MatchRows {
  static void run(tvm::ffi::TensorView x, tvm::ffi::TensorView y) {
    using namespace sgljit;
    SymbolicSize R{"rows"}, C{"cols"}, S{"row_stride"};
    auto dt = SymbolicDType::of<float, double>();
    SymbolicDevice dev;
    TensorMatcher({R, C}).with_strides({S, 1}).with_dtype(dt).with_device(kDLCPU, dev).verify(x, "x");
    TensorMatcher({R, 4}).with_strides({kAnySize, 1}).with_dtype(dt).with_device(dev).verify(y, "y");
  }
};

// A table in x's dtype or float32 (as a rope cos/sin cache beside its input).
struct MatchTable {
  static void run(tvm::ffi::TensorView x, tvm::ffi::TensorView table) {
    using namespace sgljit;
    auto dt = SymbolicDType::of<double, float>();
    TensorMatcher({kAnySize}).with_dtype(dt).verify(x, "x");
    TensorMatcher({kAnySize}).with_dtype_or<float>(dt).verify(table, "table");
  }
};

struct MatchContiguous {
  static void run(tvm::ffi::TensorView x) {
    using namespace sgljit;
    TensorMatcher({kAnySize, kAnySize}).contiguous().with_dtype<float>().verify(x, "x");
  }
};

struct MatchOnCuda {
  static void run(tvm::ffi::TensorView x) {
    using namespace sgljit;
    TensorMatcher({kAnySize}).with_device(kDLCUDA).verify(x, "x");
  }
};

// Reads a symbol of the kind `which` names (0 size, 1 dtype, 2 device) that nothing bound.
struct ReadUnbound {
  static void run(int64_t which) {
    using namespace sgljit;
    SymbolicSize k{"k"};
    SymbolicDType dt;
    SymbolicDevice dev;
    if (which == 0) (void)k.value();
    if (which == 1) (void)dt.value();
    if (which == 2) (void)dev.value();
  }
};

// A tensor the op would write, 2-D or 3-D: its elements must not share memory.
struct MatchWritable2 {
  static void run(tvm::ffi::TensorView out) {
    using namespace sgljit;
    TensorMatcher({kAnySize, kAnySize}).with_dtype<float>().writable().verify(out, "out");
  }
};

struct MatchWritable3 {
  static void run(tvm::ffi::TensorView out) {
    using namespace sgljit;
    TensorMatcher({kAnySize, kAnySize, kAnySize}).with_dtype<float>().writable().verify(out, "out");
  }
};

// w: x's dtype or float32 (with_dtype_or); w2: w's dtype.
struct MatchSameOr {
  static void run(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView w2) {
    using namespace sgljit;
    SymbolicDType dt, wt;
    TensorMatcher({kAnySize}).with_dtype<double, int32_t>(dt).verify(x, "x");
    TensorMatcher({kAnySize}).with_dtype_or<float>(dt, wt).verify(w, "w");
    TensorMatcher({kAnySize}).with_dtype_or<float>(dt).verify(w, "w");  // the form that binds nothing
    TensorMatcher({kAnySize}).with_dtype(wt).verify(w2, "w2");
  }
};

// SGLJIT_CHECK evaluates its message only on failure: returns how many times the message was built.
struct CheckLazily {
  static int64_t run(bool fail) {
    int64_t built = 0;
    auto message = [&] {
      ++built;
      return "the message";
    };
    SGLJIT_CHECK(!fail, "check failed: ", message());
    return built;
  }
};

// check_unshared over two tensors: `b` is written, `a` read (or also written when a_written);
// `alias`: they may be one view.
struct CheckUnshared {
  static void run(tvm::ffi::TensorView a, tvm::ffi::TensorView b, bool a_written, bool alias) {
    using namespace sgljit;
    check_unshared(b, byte_span(b), "b", a, byte_span(a), "a", a_written, alias);
  }
};

// TensorMatcher: one fluent expression validates a tensor's shape, strides, dtype and device.
//
//   SymbolicSize T{"num_tokens"}, H{"hidden"}, S{"row_stride"};
//   auto dt = SymbolicDType::of<fp16_t, bf16_t>();
//   SymbolicDevice dev;
//   TensorMatcher({T, H}).with_strides({S, 1}).with_dtype(dt).with_device(kDLCUDA, dev).verify(x, "input");
//   TensorMatcher({H}).with_dtype(dt).with_device(dev).verify(w, "weight");  // must agree with input
//
// Inside a kernel template, prefer these non-template forms: a member template called on a dependent
// expression would need `.template`. `with_dtype<A, B>()` restricts without binding a symbol.
//
// Symbols bind on first use and must match afterwards, so relations between tensors are one line each.
// A mismatch throws a Python ValueError naming the tensor, the dimension, what was expected and what was found.
#pragma once

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "utils.h"

namespace sgljit {

using tvm::ffi::TensorView;

inline constexpr int64_t kAnySize = -1;

using fp32_t = float;  // the half and fp8 types are CUDA's (type.cuh) or SYCL's (sycl/kernel.hpp)

// The C++ element types kernels are written against. On the CUDA side they alias CUDA's types
// (see type.cuh); here they only carry the DLPack dtype for validation.
template <typename T>
struct DTypeTrait;

#define SGLJIT_DEFINE_DTYPE_TRAIT(TYPE, CODE, BITS, NAME) \
  template <>                                             \
  struct DTypeTrait<TYPE> {                               \
    static constexpr DLDataType value{CODE, BITS, 1};     \
    static constexpr const char* name = NAME;             \
  };

SGLJIT_DEFINE_DTYPE_TRAIT(float, kDLFloat, 32, "float32")
SGLJIT_DEFINE_DTYPE_TRAIT(double, kDLFloat, 64, "float64")
SGLJIT_DEFINE_DTYPE_TRAIT(int8_t, kDLInt, 8, "int8")
SGLJIT_DEFINE_DTYPE_TRAIT(int16_t, kDLInt, 16, "int16")
SGLJIT_DEFINE_DTYPE_TRAIT(int32_t, kDLInt, 32, "int32")
SGLJIT_DEFINE_DTYPE_TRAIT(int64_t, kDLInt, 64, "int64")
SGLJIT_DEFINE_DTYPE_TRAIT(uint8_t, kDLUInt, 8, "uint8")
SGLJIT_DEFINE_DTYPE_TRAIT(bool, kDLBool, 8, "bool")

inline std::string dtype_name(DLDataType t) {
  switch (t.code) {
    case kDLFloat:
      return t.bits == 16 ? "float16" : t.bits == 32 ? "float32" : t.bits == 64 ? "float64" : "float?";
    case kDLBfloat:
      return "bfloat16";
    case kDLInt:
      return "int" + std::to_string(t.bits);
    case kDLUInt:
      return "uint" + std::to_string(t.bits);
    case kDLBool:
      return "bool";
    case kDLFloat8_e4m3fn:
      return "float8_e4m3fn";
    case kDLFloat8_e5m2:
      return "float8_e5m2";
    default:
      return "dtype(code=" + std::to_string(t.code) + ", bits=" + std::to_string(t.bits) + ")";
  }
}

inline bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

inline std::string device_name(DLDevice d) {
  const char* type = d.device_type == kDLCPU            ? "cpu"
                     : d.device_type == kDLCUDA         ? "cuda"
                     : d.device_type == kDLCUDAHost     ? "cuda_host"
                     : d.device_type == kDLOneAPI       ? "xpu"
                     : d.device_type == kDLROCM         ? "rocm"
                                                        : "device";
  return std::string(type) + ":" + std::to_string(d.device_id);
}

// A size that binds on first use: later uses must agree.
class SymbolicSize {
 public:
  explicit SymbolicSize(const char* name) : name_(name) {}
  SymbolicSize(const char* name, int64_t fixed) : name_(name), value_(fixed) {}
  SymbolicSize(const SymbolicSize&) = delete;
  SymbolicSize& operator=(const SymbolicSize&) = delete;

  bool bound() const { return value_.has_value(); }
  int64_t value() const {
    RuntimeCheck(bound(), "size '", name_, "' was never bound");
    return *value_;
  }
  const char* name() const { return name_; }
  void bind(int64_t v) { value_ = v; }

 private:
  const char* name_;
  std::optional<int64_t> value_;
};

class SymbolicDType {
 public:
  SymbolicDType() = default;
  SymbolicDType(const SymbolicDType&) = delete;
  // A dtype symbol that only binds to one of Ts: `auto dt = SymbolicDType::of<fp16_t, bf16_t>();`
  template <typename... Ts>
  static SymbolicDType of() {
    return SymbolicDType(std::vector<DLDataType>{DTypeTrait<Ts>::value...});
  }
  const std::vector<DLDataType>& allowed() const { return allowed_; }
  bool bound() const { return value_.has_value(); }
  DLDataType value() const {
    RuntimeCheck(bound(), "dtype was never bound");
    return *value_;
  }
  void bind(DLDataType v) { value_ = v; }

 private:
  explicit SymbolicDType(std::vector<DLDataType> allowed) : allowed_(std::move(allowed)) {}
  std::vector<DLDataType> allowed_;
  std::optional<DLDataType> value_;
};

class SymbolicDevice {
 public:
  SymbolicDevice() = default;
  SymbolicDevice(const SymbolicDevice&) = delete;
  bool bound() const { return value_.has_value(); }
  DLDevice value() const {
    RuntimeCheck(bound(), "device was never bound");
    return *value_;
  }
  void bind(DLDevice v) { value_ = v; }

 private:
  std::optional<DLDevice> value_;
};

// One dimension (or stride) of a pattern: a fixed number, "anything", or a symbol.
class Dim {
 public:
  Dim(int value) : fixed_(value) {}                 // NOLINT: implicit so {T, 1} reads naturally
  Dim(int64_t value) : fixed_(value) {}             // NOLINT
  Dim(SymbolicSize& symbol) : symbol_(&symbol) {}   // NOLINT

  // Returns an empty string when `actual` fits, else a description of what was expected.
  std::string match(int64_t actual) const {
    if (symbol_ != nullptr) {
      if (!symbol_->bound()) {
        symbol_->bind(actual);
        return {};
      }
      if (symbol_->value() == actual) return {};
      return detail::concat(symbol_->value(), " (", symbol_->name(), ")");
    }
    if (fixed_ == kAnySize || fixed_ == actual) return {};
    return std::to_string(fixed_);
  }
  std::string describe() const {
    if (symbol_ != nullptr) return symbol_->bound() ? std::to_string(symbol_->value()) : symbol_->name();
    return fixed_ == kAnySize ? "*" : std::to_string(fixed_);
  }

 private:
  int64_t fixed_ = kAnySize;
  SymbolicSize* symbol_ = nullptr;
};

class TensorMatcher {
 public:
  TensorMatcher(std::initializer_list<Dim> shape) : shape_(shape) {}

  TensorMatcher&& with_strides(std::initializer_list<Dim> strides) && {
    strides_ = std::vector<Dim>(strides);
    return std::move(*this);
  }
  // Row-major contiguous.
  TensorMatcher&& contiguous() && {
    contiguous_ = true;
    return std::move(*this);
  }
  // Allow any of the listed element types; bind `dtype` to the one found (or require the bound one).
  template <typename... Ts>
  TensorMatcher&& with_dtype(SymbolicDType& dtype) && {
    dtype_ = &dtype;
    allowed_ = {DTypeTrait<Ts>::value...};
    return std::move(*this);
  }
  template <typename... Ts>
  TensorMatcher&& with_dtype() && {
    allowed_ = {DTypeTrait<Ts>::value...};
    return std::move(*this);
  }
  // The tensor's dtype must be the one `dtype` is bound to (binding it on first use); a symbol made
  // with SymbolicDType::of<...>() also restricts which dtypes it binds to.
  TensorMatcher&& with_dtype(SymbolicDType& dtype) && {
    dtype_ = &dtype;
    allowed_ = dtype.allowed();
    return std::move(*this);
  }
  // Device: bind `device` (or require the bound one); a DLDeviceType pins the kind of device.
  // (Plain functions, not templates, so chains need no `.template` inside kernel templates.)
  TensorMatcher&& with_device(SymbolicDevice& device) && {
    device_ = &device;
    return std::move(*this);
  }
  TensorMatcher&& with_device(DLDeviceType type, SymbolicDevice& device) && {
    device_ = &device;
    device_type_ = type;
    return std::move(*this);
  }
  TensorMatcher&& with_device(DLDeviceType type) && {
    device_type_ = type;
    return std::move(*this);
  }

  void verify(const TensorView& t, const char* name) && {
    const int64_t ndim = t.ndim();
    RuntimeCheck(ndim == static_cast<int64_t>(shape_.size()), name, ": expected ", shape_.size(),
                 "-D tensor of shape ", describe(shape_), ", got ", ndim, "-D tensor");
    for (int64_t i = 0; i < ndim; ++i) {
      const std::string expected = shape_[i].match(t.size(i));
      RuntimeCheck(expected.empty(), name, ": dimension ", i, " expected ", expected, ", got ", t.size(i),
                   " (shape pattern ", describe(shape_), ")");
    }
    if (strides_) {
      for (int64_t i = 0; i < ndim; ++i) {
        if (t.size(i) == 1) continue;  // the stride of a size-1 dimension is meaningless
        const std::string expected = (*strides_)[i].match(t.stride(i));
        RuntimeCheck(expected.empty(), name, ": stride of dimension ", i, " expected ", expected, ", got ",
                     t.stride(i), " (stride pattern ", describe(*strides_), ")");
      }
    }
    if (contiguous_) {
      RuntimeCheck(t.IsContiguous(), name, ": expected a contiguous tensor");
    }
    verify_dtype(t.dtype(), name);
    verify_device(t.device(), name);
  }

 private:
  static std::string describe(const std::vector<Dim>& dims) {
    std::string s = "[";
    for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + dims[i].describe();
    return s + "]";
  }

  void verify_dtype(DLDataType actual, const char* name) const {
    if (!allowed_.empty()) {
      bool ok = false;
      std::string list;
      for (const auto& a : allowed_) {
        ok = ok || same_dtype(a, actual);
        list += (list.empty() ? "" : ", ") + dtype_name(a);
      }
      RuntimeCheck(ok, name, ": dtype expected one of {", list, "}, got ", dtype_name(actual));
    }
    if (dtype_ != nullptr) {
      if (!dtype_->bound()) {
        dtype_->bind(actual);
      } else {
        RuntimeCheck(same_dtype(dtype_->value(), actual), name, ": dtype expected ", dtype_name(dtype_->value()),
                     " (same as the tensors before it), got ", dtype_name(actual));
      }
    }
  }

  void verify_device(DLDevice actual, const char* name) const {
    if (device_type_) {
      const std::string want = device_name(DLDevice{*device_type_, 0});
      RuntimeCheck(actual.device_type == *device_type_, name, ": expected a tensor on ",
                   want.substr(0, want.find(':')), ", got one on ", device_name(actual));
    }
    if (device_ != nullptr) {
      if (!device_->bound()) {
        device_->bind(actual);
      } else {
        const DLDevice want = device_->value();
        RuntimeCheck(want.device_type == actual.device_type && want.device_id == actual.device_id, name,
                     ": expected a tensor on ", device_name(want), " (same as the tensors before it), got one on ",
                     device_name(actual));
      }
    }
  }

  std::vector<Dim> shape_;
  std::optional<std::vector<Dim>> strides_;
  bool contiguous_ = false;
  std::vector<DLDataType> allowed_;
  SymbolicDType* dtype_ = nullptr;
  SymbolicDevice* device_ = nullptr;
  std::optional<DLDeviceType> device_type_;
};

}  // namespace sgljit

// TensorMatcher: one fluent expression validates a tensor's shape, strides, dtype and device.
//
//   SymbolicSize T{"num_tokens"}, H{"hidden"}, S{"row_stride"};
//   auto dt = SymbolicDType::of<fp16_t, bf16_t>();
//   SymbolicDevice dev;
//   TensorMatcher({T, H}).with_strides({S, 1}).with_dtype(dt).with_device(kDLCUDA, dev).verify(x, "input");
//   TensorMatcher({H}).with_dtype(dt).with_device(dev).verify(w, "weight");  // must agree with input
//   TensorMatcher({T, H}).with_dtype(dt).with_device(dev).writable().verify(y, "out");  // written: no overlap
//   TensorMatcher({H}).with_dtype_or<fp32_t>(dt).with_device(dev).verify(w2, "weight2");  // dt or float32
//
// Inside a kernel template, prefer these non-template forms: a member template called on a dependent
// expression would need `.template`. `with_dtype<A, B>()` restricts without binding a symbol.
//
// Symbols bind on first use and must match afterwards, so relations between tensors are one line each.
// A mismatch throws a Python ValueError naming the tensor, the dimension, what was expected and what was found.
// A match costs no string work and no heap allocation: messages are built only on a mismatch.
#pragma once

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

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

inline const char* device_type_name(DLDeviceType type) {
  return type == kDLCPU        ? "cpu"
         : type == kDLCUDA     ? "cuda"
         : type == kDLCUDAHost ? "cuda_host"
         : type == kDLOneAPI   ? "xpu"
         : type == kDLROCM     ? "rocm"
                               : "device";
}

inline std::string device_name(DLDevice d) {
  return std::string(device_type_name(d.device_type)) + ":" + std::to_string(d.device_id);
}

// A list of dtypes in static storage: what SymbolicDType::of<...>() and with_dtype<...>() allow.
struct DTypeSpan {
  const DLDataType* ptr = nullptr;
  size_t count = 0;

  const DLDataType* begin() const { return ptr; }
  const DLDataType* end() const { return ptr + count; }
  size_t size() const { return count; }
  bool empty() const { return count == 0; }
  const DLDataType& operator[](size_t i) const { return ptr[i]; }
};

namespace detail {
template <typename... Ts>
struct DTypeArray {
  static constexpr DLDataType values[sizeof...(Ts) + 1] = {DTypeTrait<Ts>::value..., DLDataType{}};
};
template <typename... Ts>
DTypeSpan dtypes_of() {
  return DTypeSpan{DTypeArray<Ts...>::values, sizeof...(Ts)};
}
}  // namespace detail

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
    return SymbolicDType(detail::dtypes_of<Ts...>());
  }
  DTypeSpan allowed() const { return allowed_; }
  bool bound() const { return value_.has_value(); }
  DLDataType value() const {
    RuntimeCheck(bound(), "dtype was never bound");
    return *value_;
  }
  void bind(DLDataType v) { value_ = v; }

 private:
  explicit SymbolicDType(DTypeSpan allowed) : allowed_(allowed) {}
  DTypeSpan allowed_;
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

namespace detail {
class DimList;
}

// One dimension (or stride) of a pattern: a fixed number, "anything", or a symbol.
class Dim {
 public:
  Dim(int value) : fixed_(value), symbol_(nullptr) {}                // NOLINT: implicit so {T, 1} reads naturally
  Dim(int64_t value) : fixed_(value), symbol_(nullptr) {}            // NOLINT
  Dim(SymbolicSize& symbol) : fixed_(kAnySize), symbol_(&symbol) {}  // NOLINT

  // Whether `actual` fits; an unbound symbol binds to it.
  bool match(int64_t actual) const {
    if (symbol_ == nullptr) return fixed_ == kAnySize || fixed_ == actual;
    if (!symbol_->bound()) {
      symbol_->bind(actual);
      return true;
    }
    return symbol_->value() == actual;
  }
  // What match() wanted, for the message after it returned false.
  std::string expected() const {
    if (symbol_ != nullptr) return detail::concat(symbol_->value(), " (", symbol_->name(), ")");
    return std::to_string(fixed_);
  }
  std::string describe() const {
    if (symbol_ != nullptr) return symbol_->bound() ? std::to_string(symbol_->value()) : symbol_->name();
    return fixed_ == kAnySize ? "*" : std::to_string(fixed_);
  }

 private:
  friend class detail::DimList;
  Dim() = default;  // trivial: DimList's slots are written before they are read

  int64_t fixed_;
  SymbolicSize* symbol_;
};

namespace detail {
// A pattern of at most kMaxDims dims, stored inline (no heap on the hot path).
class DimList {
 public:
  static constexpr size_t kMaxDims = 8;

  DimList() = default;
  explicit DimList(std::initializer_list<Dim> dims) { assign(dims); }
  DimList(const DimList& other) { *this = other; }
  DimList& operator=(const DimList& other) {  // copies the slots in use only
    size_ = other.size_;
    for (size_t i = 0; i < size_; ++i) dims_[i] = other.dims_[i];
    return *this;
  }
  void assign(std::initializer_list<Dim> dims) {
    SGLJIT_CHECK(dims.size() <= kMaxDims, "TensorMatcher: a pattern has at most ", kMaxDims, " dimensions, got ",
                 dims.size());
    size_ = 0;
    for (const Dim& d : dims) dims_[size_++] = d;
  }
  size_t size() const { return size_; }
  const Dim& operator[](size_t i) const { return dims_[i]; }
  std::string describe() const {
    std::string s = "[";
    for (size_t i = 0; i < size_; ++i) s += (i ? ", " : "") + dims_[i].describe();
    return s + "]";
  }

 private:
  Dim dims_[kMaxDims];
  size_t size_ = 0;
};
}  // namespace detail

class TensorMatcher {
 public:
  TensorMatcher(std::initializer_list<Dim> shape) : shape_(shape) {}

  TensorMatcher&& with_strides(std::initializer_list<Dim> strides) && {
    strides_.assign(strides);
    has_strides_ = true;
    return std::move(*this);
  }
  // Row-major contiguous.
  TensorMatcher&& contiguous() && {
    contiguous_ = true;
    return std::move(*this);
  }
  // For a tensor the op writes: refuse a view whose elements may share memory (an expanded or
  // otherwise self-overlapping one), where concurrent writes to one address would race.
  TensorMatcher&& writable() && {
    writable_ = true;
    return std::move(*this);
  }
  // Allow any of the listed element types; bind `dtype` to the one found (or require the bound one).
  template <typename... Ts>
  TensorMatcher&& with_dtype(SymbolicDType& dtype) && {
    dtype_ = &dtype;
    allowed_ = detail::dtypes_of<Ts...>();
    return std::move(*this);
  }
  template <typename... Ts>
  TensorMatcher&& with_dtype() && {
    allowed_ = detail::dtypes_of<Ts...>();
    return std::move(*this);
  }
  // The tensor's dtype must be the one `dtype` is bound to (binding it on first use); a symbol made
  // with SymbolicDType::of<...>() also restricts which dtypes it binds to.
  TensorMatcher&& with_dtype(SymbolicDType& dtype) && {
    dtype_ = &dtype;
    allowed_ = dtype.allowed();
    return std::move(*this);
  }
  // The dtype an earlier tensor bound `like` to, or one of Ts (e.g. a weight in the input's dtype or
  // float32: `.with_dtype_or<float>(dt)`); the second form also binds `dtype` to the one found (or
  // requires the bound one), for later tensors to name.
  template <typename... Ts>
  TensorMatcher&& with_dtype_or(const SymbolicDType& like) && {
    like_ = &like;
    allowed_ = detail::dtypes_of<Ts...>();
    return std::move(*this);
  }
  template <typename... Ts>
  TensorMatcher&& with_dtype_or(const SymbolicDType& like, SymbolicDType& dtype) && {
    like_ = &like;
    dtype_ = &dtype;
    allowed_ = detail::dtypes_of<Ts...>();
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

  // Checks `t` against the pattern, binding unbound symbols; throws a ValueError naming `name` on
  // the first mismatch. Messages are built only then.
  void verify(const TensorView& t, const char* name) && {
    const int64_t ndim = t.ndim();
    SGLJIT_CHECK(ndim == static_cast<int64_t>(shape_.size()), name, ": expected ", shape_.size(),
                 "-D tensor of shape ", shape_.describe(), ", got ", ndim, "-D tensor");
    const int64_t* sizes = t.shape().data();
    for (int64_t i = 0; i < ndim; ++i) {
      SGLJIT_CHECK(shape_[i].match(sizes[i]), name, ": dimension ", i, " expected ", shape_[i].expected(), ", got ",
                   sizes[i], " (shape pattern ", shape_.describe(), ")");
    }
    if (has_strides_) {
      SGLJIT_CHECK(strides_.size() == shape_.size(), name, ": stride pattern ", strides_.describe(),
                   " does not have the shape pattern's ", shape_.size(), " dimensions");
      const int64_t* strides = t.strides().data();
      for (int64_t i = 0; i < ndim; ++i) {
        if (sizes[i] == 1) continue;  // the stride of a size-1 dimension is meaningless
        SGLJIT_CHECK(strides_[i].match(strides[i]), name, ": stride of dimension ", i, " expected ",
                     strides_[i].expected(), ", got ", strides[i], " (stride pattern ", strides_.describe(), ")");
      }
    }
    if (contiguous_ || writable_) {
      const bool contiguous = t.IsContiguous();
      SGLJIT_CHECK(contiguous || !contiguous_, name, ": expected a contiguous tensor");
      if (writable_ && !contiguous && !elements_distinct(ndim, sizes, t.strides().data())) {
        throw_shared_elements(ndim, sizes, t.strides().data(), name);
      }
    }
    verify_dtype(t.dtype(), name);
    verify_device(t.device(), name);
  }

 private:
  // Whether the strides prove that every element has its own address (core/src/sgljit/op.py's
  // _may_overlap): ignoring size-1 dimensions and sorted by stride, each stride is at least the span
  // of the dimensions below it. True of every strided slice and permutation of a dense tensor.
  static bool elements_distinct(int64_t ndim, const int64_t* sizes, const int64_t* strides) {
    int64_t st[detail::DimList::kMaxDims], sz[detail::DimList::kMaxDims];
    int64_t n = 0;
    for (int64_t i = 0; i < ndim; ++i) {
      if (sizes[i] == 0) return true;  // no elements (PyTorch calls it contiguous, as _may_overlap does)
      if (sizes[i] == 1) continue;
      int64_t j = n++;  // insertion sort by stride (at most kMaxDims entries)
      for (; j > 0 && st[j - 1] > strides[i]; --j) {
        st[j] = st[j - 1];
        sz[j] = sz[j - 1];
      }
      st[j] = strides[i];
      sz[j] = sizes[i];
    }
    int64_t span = 1;
    for (int64_t i = 0; i < n; ++i) {
      if (st[i] < span) return false;
      span = st[i] * (sz[i] - 1) + span;
    }
    return true;
  }

  [[noreturn]] SGLJIT_COLD static void throw_shared_elements(int64_t ndim, const int64_t* sizes,
                                                             const int64_t* strides, const char* name) {
    auto list = [ndim](const int64_t* v) {
      std::string s = "[";
      for (int64_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    };
    detail::throw_value_error(name, ": sgljit writes it, but its elements may share memory (shape ", list(sizes),
                              ", strides ", list(strides),
                              ": an expanded or otherwise self-overlapping view); pass a tensor whose elements "
                              "are distinct");
  }

  static std::string dtype_list(DTypeSpan dtypes) {
    std::string list;
    for (const DLDataType& a : dtypes) list += (list.empty() ? "" : ", ") + dtype_name(a);
    return list;
  }

  void verify_dtype(DLDataType actual, const char* name) const {
    if (like_ != nullptr) {
      const DLDataType want = like_->value();
      bool ok = same_dtype(want, actual);
      for (const DLDataType& a : allowed_) ok = ok || same_dtype(a, actual);
      SGLJIT_CHECK(ok, name, ": dtype expected ", dtype_name(want), " (same as the tensors before it) or one of {",
                   dtype_list(allowed_), "}, got ", dtype_name(actual));
    } else if (!allowed_.empty()) {
      bool ok = false;
      for (const DLDataType& a : allowed_) ok = ok || same_dtype(a, actual);
      SGLJIT_CHECK(ok, name, ": dtype expected one of {", dtype_list(allowed_), "}, got ", dtype_name(actual));
    }
    if (dtype_ != nullptr) {
      if (!dtype_->bound()) {
        dtype_->bind(actual);
      } else {
        SGLJIT_CHECK(same_dtype(dtype_->value(), actual), name, ": dtype expected ", dtype_name(dtype_->value()),
                     " (same as the tensors before it), got ", dtype_name(actual));
      }
    }
  }

  void verify_device(DLDevice actual, const char* name) const {
    if (device_type_) {
      SGLJIT_CHECK(actual.device_type == *device_type_, name, ": expected a tensor on ",
                   device_type_name(*device_type_), ", got one on ", device_name(actual));
    }
    if (device_ != nullptr) {
      if (!device_->bound()) {
        device_->bind(actual);
      } else {
        const DLDevice want = device_->value();
        SGLJIT_CHECK(want.device_type == actual.device_type && want.device_id == actual.device_id, name,
                     ": expected a tensor on ", device_name(want), " (same as the tensors before it), got one on ",
                     device_name(actual));
      }
    }
  }

  detail::DimList shape_;
  detail::DimList strides_;
  bool has_strides_ = false;
  bool contiguous_ = false;
  bool writable_ = false;
  DTypeSpan allowed_;
  SymbolicDType* dtype_ = nullptr;
  const SymbolicDType* like_ = nullptr;  // with_dtype_or: allowed_ are the alternatives to its dtype
  SymbolicDevice* device_ = nullptr;
  std::optional<DLDeviceType> device_type_;
};

// ------------------------------------------------------------------------------------------------
// Arguments that share memory (core/src/sgljit/op.py's shares_memory and check_arguments: the same rule)
// ------------------------------------------------------------------------------------------------
// The bytes [begin, end) a tensor's elements lie in (begin == end: no elements).
struct ByteSpan {
  uintptr_t begin, end;
};

inline ByteSpan byte_span(const TensorView& t) {
  const int64_t item = (t.dtype().bits * t.dtype().lanes + 7) / 8;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  int64_t last = 0;
  for (int i = 0; i < t.ndim(); ++i) {
    if (t.size(i) == 0) return {begin, begin};
    last += (t.size(i) - 1) * t.stride(i);
  }
  return {begin, begin + static_cast<uintptr_t>((last + 1) * item)};
}

namespace detail {

// The dimensions along which a tensor's elements move (size > 1, stride != 0), in bytes, outermost
// (largest stride) first; `item`: an element's bytes.
struct ByteDims {
  int n = 0;
  int64_t stride[DimList::kMaxDims], size[DimList::kMaxDims];
  int64_t item = 0;
  // Bytes from the first element's start to the last one's end, over dimensions [from, n).
  int64_t extent(int from) const {
    int64_t e = item;
    for (int i = from; i < n; ++i) e += (size[i] - 1) * stride[i];
    return e;
  }
};

// False where t has more moving dimensions than ByteDims holds.
inline bool byte_dims(const TensorView& t, ByteDims* d) {
  d->item = (t.dtype().bits * t.dtype().lanes + 7) / 8;
  for (int i = 0; i < t.ndim(); ++i) {
    const int64_t size = t.size(i), stride = t.stride(i) * d->item;
    if (size == 1 || stride == 0) continue;
    if (d->n == static_cast<int>(DimList::kMaxDims)) return false;
    int j = d->n++;  // insertion sort, largest stride first
    for (; j > 0 && d->stride[j - 1] < stride; --j) {
      d->stride[j] = d->stride[j - 1];
      d->size[j] = d->size[j - 1];
    }
    d->stride[j] = stride;
    d->size[j] = size;
  }
  return true;
}

inline int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// Whether elements of a (dimensions [ia, a.n), first byte at oa) and of b (the same from ib, ob) may
// share a byte. False only where they cannot: their ranges do not meet, or both step by one outermost
// stride s, each step's footprint fits in s, and for each of the (at most two) step distances k at
// which two footprints meet, the footprints one level down do not.
inline bool may_meet(int64_t oa, const ByteDims& a, int ia, int64_t ob, const ByteDims& b, int ib) {
  const int64_t fa = a.extent(ia), fb = b.extent(ib);
  if (oa + fa <= ob || ob + fb <= oa) return false;
  if (ia == a.n || ib == b.n || a.stride[ia] != b.stride[ib]) return true;
  const int64_t s = a.stride[ia], step_a = a.extent(ia + 1), step_b = b.extent(ib + 1);
  if (step_a > s || step_b > s) return true;
  const int64_t gap = ob - oa;  // b's step j can meet a's step i only where -step_b < gap + (j - i) s < step_a
  const int64_t lo = std::max(-(a.size[ia] - 1), floor_div(-step_b - gap, s) + 1);
  const int64_t hi = std::min(b.size[ib] - 1, -floor_div(gap - step_a, s) - 1);
  for (int64_t k = lo; k <= hi; ++k) {
    if (may_meet(0, a, ia + 1, gap + k * s, b, ib + 1)) return true;
  }
  return false;
}

}  // namespace detail

// Whether two tensors (and their byte_spans) may have bytes of an element in common: never where the
// spans do not meet, nor where, step by common outermost stride, each one's elements sit in the gaps
// between the other's (column slices of one buffer, heads of one qkv buffer); otherwise they may.
inline bool shares_memory(const TensorView& a, const ByteSpan& sa, const TensorView& b, const ByteSpan& sb) {
  if (sa.begin == sa.end || sb.begin == sb.end || sa.end <= sb.begin || sb.end <= sa.begin) return false;
  detail::ByteDims da, db;
  if (!detail::byte_dims(a, &da) || !detail::byte_dims(b, &db)) return true;
  return detail::may_meet(0, da, 0, static_cast<int64_t>(sb.begin - sa.begin), db, 0);
}

// Whether a and b are one view: the same address, dtype, shape and strides.
inline bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data_ptr() != b.data_ptr() || !same_dtype(a.dtype(), b.dtype()) || a.ndim() != b.ndim()) return false;
  for (int i = 0; i < a.ndim(); ++i) {
    if (a.size(i) != b.size(i) || a.stride(i) != b.stride(i)) return false;
  }
  return true;
}

// A tensor an op writes (`t`, or `other` where other_written) must share no memory with another
// argument: the kernels would read or write it while writing this one. `alias`: the two may be one
// view (an op that also runs in place). The error names t.
inline void check_unshared(const TensorView& t, const ByteSpan& st, const char* name, const TensorView& other,
                           const ByteSpan& so, const char* other_name, bool other_written, bool alias) {
  SGLJIT_CHECK(!shares_memory(t, st, other, so) || (alias && same_view(t, other)), name, ": shares memory with ",
               other_name, ", which sgljit ", other_written ? "also writes" : "reads", "; pass a tensor of its own");
}

// A module compiled for one element type refuses a tensor of another: "<name>: this module was
// compiled for <noun><Want's dtype>, got <t's dtype>" (noun: "dtype " where an op's messages say so).
template <typename Want>
inline void check_module_dtype(const TensorView& t, const char* name, const char* noun = "") {
  SGLJIT_CHECK(same_dtype(t.dtype(), DTypeTrait<Want>::value), name, ": this module was compiled for ", noun,
               DTypeTrait<Want>::name, ", got ", dtype_name(t.dtype()));
}

}  // namespace sgljit

// Small host/device utilities shared by every kernel family.
#pragma once

#include <tvm/ffi/error.h>

#include <cstdint>
#include <sstream>
#include <utility>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SGLJIT_HOST_DEVICE __host__ __device__
#define SGLJIT_DEVICE __device__ __forceinline__
#else
#define SGLJIT_HOST_DEVICE
#define SGLJIT_DEVICE inline
#endif

namespace sgljit {

template <typename T>
SGLJIT_HOST_DEVICE constexpr T div_ceil(T a, T b) {
  return (a + b - 1) / b;
}

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Throws a Python ValueError when `cond` is false; the message is the concatenation of `msg`.
template <typename... Args>
inline void RuntimeCheck(bool cond, Args&&... msg) {
  if (!cond) {
    TVM_FFI_THROW(ValueError) << detail::concat(std::forward<Args>(msg)...);
  }
}

}  // namespace sgljit

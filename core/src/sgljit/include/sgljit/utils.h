// Small host/device utilities shared by every kernel family.
#pragma once

#include <tvm/ffi/error.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SGLJIT_HOST_DEVICE __host__ __device__
#define SGLJIT_DEVICE __device__ __forceinline__
#else
#define SGLJIT_HOST_DEVICE
#define SGLJIT_DEVICE inline
#endif

// Branch hint and out-of-line attribute for failure paths.
#if defined(__GNUC__) || defined(__clang__)
#define SGLJIT_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define SGLJIT_COLD __attribute__((noinline, cold))
#else
#define SGLJIT_UNLIKELY(x) (x)
#define SGLJIT_COLD
#endif

namespace sgljit {

template <typename T>
SGLJIT_HOST_DEVICE constexpr T div_ceil(T a, T b) {
  return (a + b - 1) / b;
}

// The smallest power of two >= x (1 for x <= 1): lane and thread counts of power-of-two groups.
template <typename T>
SGLJIT_HOST_DEVICE constexpr T pow2_ceil(T x) {
  T p = 1;
  while (p < x) p <<= 1;
  return p;
}

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// The failure path of RuntimeCheck and SGLJIT_CHECK, kept out of the caller's code. Arguments are
// taken by value so string literals decay: one instantiation serves messages of any length.
template <typename... Args>
[[noreturn]] SGLJIT_COLD void throw_value_error(Args... msg) {
  TVM_FFI_THROW(ValueError) << concat(msg...);
  TVM_FFI_UNREACHABLE();  // the throw is in a destructor, which nvcc's front end does not see through
}
}  // namespace detail

// Throws a Python ValueError when `cond` is false; the message is the concatenation of `msg`. The
// arguments are evaluated on every call, so pass cheap ones (literals, numbers, const char*);
// where building one costs (a std::string, dtype_name(), device_name()), use SGLJIT_CHECK.
template <typename... Args>
inline void RuntimeCheck(bool cond, const Args&... msg) {
  if (SGLJIT_UNLIKELY(!cond)) detail::throw_value_error(msg...);
}

}  // namespace sgljit

// SGLJIT_CHECK(cond, msg...): RuntimeCheck that evaluates its message arguments only when `cond`
// is false, so the passing path does no string work.
#define SGLJIT_CHECK(cond, ...)                                                       \
  do {                                                                                \
    if (SGLJIT_UNLIKELY(!(cond))) ::sgljit::detail::throw_value_error(__VA_ARGS__); \
  } while (0)

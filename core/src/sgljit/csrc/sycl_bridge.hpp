// The C ABI Python (ctypes) uses to launch SYCL kernels: pick a queue, set typed arguments,
// parallel_for over an nd-range. Compiled into the runtime-compiler bridge (sycl_bridge.cpp, host
// c++ against the runtime wheel) and into every icpx-built module (generated TU), so both routes
// launch through identical code. Errors never cross the C boundary as exceptions: a function
// returns 0 / nullptr and sgljit_sycl_last_error() says why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <sstream>
#include <string>
#include <sycl/sycl.hpp>

#define SGLJIT_SYCL_API extern "C" __attribute__((visibility("default")))

namespace sgljit_bridge {

inline constexpr int kAbiVersion = 1;

// Argument kinds; Python's sgljit.sycl.ARG_KINDS holds the same numbers.
enum ArgKind : int8_t { kPtr = 0, kI32, kI64, kU32, kU64, kF32, kF64 };

inline std::string& last_error() {
  static thread_local std::string message;
  return message;
}

// 0 = no error, 1 = the kernel source failed to compile (message = clang's diagnostics), 2 = other.
inline int& last_error_kind() {
  static thread_local int kind = 0;
  return kind;
}

template <typename F, typename R>
R guarded(F&& f, R on_error) {
  try {
    last_error_kind() = 0;
    return f();
  } catch (const std::exception& e) {
    last_error() = e.what();
    if (last_error_kind() == 0) last_error_kind() = 2;
  } catch (...) {
    last_error() = "unknown C++ exception";
    last_error_kind() = 2;
  }
  return on_error;
}

template <int D>
sycl::nd_range<D> make_nd_range(const size_t* global, const size_t* local) {
  sycl::range<D> g, l;
  for (int i = 0; i < D; ++i) g[i] = global[i], l[i] = local[i];
  return sycl::nd_range<D>(g, l);
}

}  // namespace sgljit_bridge

SGLJIT_SYCL_API int sgljit_sycl_abi_version() { return sgljit_bridge::kAbiVersion; }
SGLJIT_SYCL_API const char* sgljit_sycl_last_error() { return sgljit_bridge::last_error().c_str(); }
SGLJIT_SYCL_API int sgljit_sycl_last_error_kind() { return sgljit_bridge::last_error_kind(); }

// The process-wide in-order queue on the SYCL CPU device (never destroyed: kernels and bundles
// built for its context stay valid until exit).
SGLJIT_SYCL_API void* sgljit_sycl_cpu_queue() {
  return sgljit_bridge::guarded(
      []() -> void* {
        static auto* q = new sycl::queue(sycl::cpu_selector_v, sycl::property::queue::in_order{});
        return q;
      },
      static_cast<void*>(nullptr));
}

// "backend\ttype\tname\tcan_build_sycl\tsub_group_sizes\n" per device, for `sgljit info`.
SGLJIT_SYCL_API const char* sgljit_sycl_devices() {
  static std::string text;
  return sgljit_bridge::guarded(
      []() -> const char* {
        std::ostringstream out;
        for (auto dev : sycl::device::get_devices()) {
          const char* type = dev.is_cpu() ? "cpu" : dev.is_gpu() ? "gpu" : "other";
          out << dev.get_backend() << '\t' << type << '\t' << dev.get_info<sycl::info::device::name>() << '\t'
              << dev.ext_oneapi_can_build(sycl::ext::oneapi::experimental::source_language::sycl) << '\t';
          for (size_t s : dev.get_info<sycl::info::device::sub_group_sizes>()) out << s << ' ';
          out << '\n';
        }
        text = out.str();
        return text.c_str();
      },
      static_cast<const char*>(nullptr));
}

// Launch `kernel` (a sycl::kernel*) on `queue` (a sycl::queue*, e.g. torch's XPU stream queue).
// values[i] points at the i-th argument's value (for kPtr: at a void* holding the address).
// wait=1 blocks until the kernel finished (CPU tensors: the caller reads the memory right after).
SGLJIT_SYCL_API int sgljit_sycl_launch(void* queue, void* kernel, int ndim, const size_t* global,
                                       const size_t* local, int nargs, const int8_t* kinds,
                                       void* const* values, int wait) {
  using namespace sgljit_bridge;
  return guarded(
      [&]() -> int {
        auto& q = *static_cast<sycl::queue*>(queue);
        const auto& k = *static_cast<const sycl::kernel*>(kernel);
        sycl::event ev = q.submit([&](sycl::handler& h) {
          for (int i = 0; i < nargs; ++i) {
            const void* v = values[i];
            switch (kinds[i]) {
              // Pointers must be set as pointers (USM arguments), not as 8-byte integers.
              case kPtr: h.set_arg(i, *static_cast<void* const*>(v)); break;
              case kI32: h.set_arg(i, *static_cast<const int32_t*>(v)); break;
              case kI64: h.set_arg(i, *static_cast<const int64_t*>(v)); break;
              case kU32: h.set_arg(i, *static_cast<const uint32_t*>(v)); break;
              case kU64: h.set_arg(i, *static_cast<const uint64_t*>(v)); break;
              case kF32: h.set_arg(i, *static_cast<const float*>(v)); break;
              case kF64: h.set_arg(i, *static_cast<const double*>(v)); break;
              default: throw std::invalid_argument("unknown argument kind " + std::to_string(kinds[i]));
            }
          }
          switch (ndim) {
            case 1: h.parallel_for(make_nd_range<1>(global, local), k); break;
            case 2: h.parallel_for(make_nd_range<2>(global, local), k); break;
            case 3: h.parallel_for(make_nd_range<3>(global, local), k); break;
            default: throw std::invalid_argument("nd-range must have 1 to 3 dimensions");
          }
        });
        if (wait) ev.wait_and_throw();
        return 1;
      },
      0);
}

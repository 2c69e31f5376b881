// The runtime-compiler bridge: builds SYCL kernel *source* at run time with the runtime's
// kernel_compiler extension (libsycl-jit), so no oneAPI toolkit is needed. Built once per runtime
// by the host c++ against the runtime wheel's headers and libsycl; Python drives it via ctypes.
#include <string>
#include <vector>

#include "sycl_bridge.hpp"

namespace syclexp = sycl::ext::oneapi::experimental;
using ExecBundle = sycl::kernel_bundle<sycl::bundle_state::executable>;

// Compile `source` for the queue's device with build options (-D, -I, ...). Returns a heap
// ExecBundle* (owned by the caller's process memo; never freed while kernels from it run).
// On a compile error returns nullptr with last_error_kind() == 1 and clang's diagnostics.
SGLJIT_SYCL_API void* sgljit_sycl_build(void* queue, const char* source, int nopts, const char* const* opts) {
  using namespace sgljit_bridge;
  return guarded(
      [&]() -> void* {
        auto& q = *static_cast<sycl::queue*>(queue);
        sycl::device dev = q.get_device();
        if (!dev.ext_oneapi_can_build(syclexp::source_language::sycl))
          throw std::runtime_error("SYCL device '" + dev.get_info<sycl::info::device::name>() +
                                   "' cannot build SYCL source at run time (kernel_compiler)");
        std::vector<std::string> options(opts, opts + nopts);
        auto input = syclexp::create_kernel_bundle_from_source(q.get_context(), syclexp::source_language::sycl,
                                                               std::string(source));
        try {
          return new ExecBundle(syclexp::build(input, std::vector<sycl::device>{dev},
                                               syclexp::properties{syclexp::build_options{options}}));
        } catch (const sycl::exception&) {
          last_error_kind() = 1;  // a compile error: the message carries the diagnostics
          throw;
        }
      },
      static_cast<void*>(nullptr));
}

// The kernel called `name` (an extern "C" free function) in a built bundle, as a heap sycl::kernel*.
SGLJIT_SYCL_API void* sgljit_sycl_get_kernel(void* bundle, const char* name) {
  using namespace sgljit_bridge;
  return guarded(
      [&]() -> void* {
        auto& b = *static_cast<ExecBundle*>(bundle);
        if (!b.ext_oneapi_has_kernel(name))
          throw std::invalid_argument(std::string("no kernel named '") + name + "' in the module");
        return new sycl::kernel(b.ext_oneapi_get_kernel(name));
      },
      static_cast<void*>(nullptr));
}

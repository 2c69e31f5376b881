// The runtime-compiler bridge: builds SYCL kernel *source* at run time with the runtime's
// kernel_compiler extension (libsycl-jit), so no oneAPI toolkit is needed, and saves / reloads the
// built program's device binary (OpenCL devices) so the module cache can keep it on disk. Built
// once per runtime by the host c++ against the runtime wheel's headers and libsycl; Python drives
// it via ctypes.
#include <dlfcn.h>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "sycl_bridge.hpp"

#include <sycl/backend/opencl.hpp>  // get_native / make_kernel for OpenCL (brings CL/cl.h)

namespace syclexp = sycl::ext::oneapi::experimental;
using ExecBundle = sycl::kernel_bundle<sycl::bundle_state::executable>;

namespace {

// The OpenCL entry points used to save and reload device binaries, taken from the libOpenCL that
// the runtime's OpenCL adapter has loaded already (the bridge does not link it: on other backends
// it may not exist, and the wheel's copy does not find its own dependencies when linked directly).
struct OpenCL {
  decltype(&clGetProgramInfo) GetProgramInfo = nullptr;
  decltype(&clCreateProgramWithBinary) CreateProgramWithBinary = nullptr;
  decltype(&clBuildProgram) BuildProgram = nullptr;
  decltype(&clCreateKernel) CreateKernel = nullptr;
  decltype(&clReleaseKernel) ReleaseKernel = nullptr;
  decltype(&clReleaseProgram) ReleaseProgram = nullptr;
  decltype(&clReleaseContext) ReleaseContext = nullptr;
  decltype(&clReleaseDevice) ReleaseDevice = nullptr;

  static const OpenCL& get() {
    static const OpenCL cl = [] {
      OpenCL c;
      void* lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_NOLOAD);
      if (lib == nullptr) throw std::runtime_error("the OpenCL library is not loaded");
      auto sym = [lib](const char* name) {
        void* f = dlsym(lib, name);
        if (f == nullptr) throw std::runtime_error(std::string("OpenCL symbol not found: ") + name);
        return f;
      };
      c.GetProgramInfo = reinterpret_cast<decltype(c.GetProgramInfo)>(sym("clGetProgramInfo"));
      c.CreateProgramWithBinary =
          reinterpret_cast<decltype(c.CreateProgramWithBinary)>(sym("clCreateProgramWithBinary"));
      c.BuildProgram = reinterpret_cast<decltype(c.BuildProgram)>(sym("clBuildProgram"));
      c.CreateKernel = reinterpret_cast<decltype(c.CreateKernel)>(sym("clCreateKernel"));
      c.ReleaseKernel = reinterpret_cast<decltype(c.ReleaseKernel)>(sym("clReleaseKernel"));
      c.ReleaseProgram = reinterpret_cast<decltype(c.ReleaseProgram)>(sym("clReleaseProgram"));
      c.ReleaseContext = reinterpret_cast<decltype(c.ReleaseContext)>(sym("clReleaseContext"));
      c.ReleaseDevice = reinterpret_cast<decltype(c.ReleaseDevice)>(sym("clReleaseDevice"));
      return c;
    }();
    return cl;
  }
};

void check_cl(cl_int err, const char* what) {
  if (err != CL_SUCCESS) throw std::runtime_error(std::string(what) + " failed: OpenCL error " + std::to_string(err));
}

// A module's kernels: built from source (looked up by name in the bundle), or reloaded from a
// saved OpenCL binary (looked up by the raw names recorded at save time).
struct Program {
  std::optional<ExecBundle> bundle;
  sycl::context context;
  cl_program binary = nullptr;  // owned; never released while kernels made from it may run
};

}  // namespace

// Compile `source` for the queue's device with build options (-D, -I, ...). Returns a heap
// Program* (owned by the caller's process memo; never freed while kernels from it run).
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
          auto* program = new Program{std::nullopt, q.get_context()};
          program->bundle.emplace(syclexp::build(input, std::vector<sycl::device>{dev},
                                                 syclexp::properties{syclexp::build_options{options}}));
          return program;
        } catch (const sycl::exception&) {
          last_error_kind() = 1;  // a compile error: the message carries the diagnostics
          throw;
        }
      },
      static_cast<void*>(nullptr));
}

// The name the device binary gives kernel `name` of a source-built program (what a reload looks up).
SGLJIT_SYCL_API const char* sgljit_sycl_raw_kernel_name(void* program, const char* name) {
  using namespace sgljit_bridge;
  static thread_local std::string raw;
  return guarded(
      [&]() -> const char* {
        auto& p = *static_cast<Program*>(program);
        if (!p.bundle) throw std::invalid_argument("not a program built from source");
        if (!p.bundle->ext_oneapi_has_kernel(name))
          throw std::invalid_argument(std::string("no kernel named '") + name + "' in the module");
        raw = p.bundle->ext_oneapi_get_raw_kernel_name(name);
        return raw.c_str();
      },
      static_cast<const char*>(nullptr));
}

// The device binary of a source-built program, to reload in another process without compiling.
// Supported where the device's backend is OpenCL (the SYCL CPU device); elsewhere returns -1 with
// last_error saying so. Call with out == nullptr for the size, then with a buffer of that size.
SGLJIT_SYCL_API int64_t sgljit_sycl_save(void* program, unsigned char* out, int64_t capacity) {
  using namespace sgljit_bridge;
  return guarded(
      [&]() -> int64_t {
        auto& p = *static_cast<Program*>(program);
        if (!p.bundle) throw std::invalid_argument("not a program built from source");
        if (p.bundle->get_backend() != sycl::backend::opencl)
          throw std::runtime_error("device binaries can be kept on disk for OpenCL devices only, not for " +
                                   std::string(sycl::detail::get_backend_name_no_vendor(p.bundle->get_backend())));
        const OpenCL& cl = OpenCL::get();
        std::vector<cl_program> programs = sycl::get_native<sycl::backend::opencl>(*p.bundle);
        size_t size = 0;
        cl_int err = programs.size() == 1 ? CL_SUCCESS : CL_INVALID_PROGRAM;
        if (err == CL_SUCCESS) err = cl.GetProgramInfo(programs[0], CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr);
        if (err == CL_SUCCESS && out != nullptr) {
          if (capacity < static_cast<int64_t>(size)) err = CL_INVALID_VALUE;
          else err = cl.GetProgramInfo(programs[0], CL_PROGRAM_BINARIES, sizeof out, &out, nullptr);
        }
        for (cl_program pr : programs) cl.ReleaseProgram(pr);
        check_cl(err, "reading the program binary");
        if (size == 0) throw std::runtime_error("the device returned an empty program binary");
        return static_cast<int64_t>(size);
      },
      static_cast<int64_t>(-1));
}

// A program reloaded from a binary sgljit_sycl_save wrote, for the queue's device (no compile).
SGLJIT_SYCL_API void* sgljit_sycl_load(void* queue, const unsigned char* data, int64_t size) {
  using namespace sgljit_bridge;
  return guarded(
      [&]() -> void* {
        auto& q = *static_cast<sycl::queue*>(queue);
        if (q.get_backend() != sycl::backend::opencl)
          throw std::runtime_error("saved device binaries load on OpenCL devices only");
        const OpenCL& cl = OpenCL::get();
        sycl::context ctx = q.get_context();
        cl_context cctx = sycl::get_native<sycl::backend::opencl>(ctx);
        cl_device_id cdev = sycl::get_native<sycl::backend::opencl>(q.get_device());
        size_t n = static_cast<size_t>(size);
        cl_int status = CL_SUCCESS, err = CL_SUCCESS;
        cl_program prog = cl.CreateProgramWithBinary(cctx, 1, &cdev, &n, &data, &status, &err);
        if (err == CL_SUCCESS) err = status;
        if (err == CL_SUCCESS) err = cl.BuildProgram(prog, 1, &cdev, "", nullptr, nullptr);
        cl.ReleaseContext(cctx);
        cl.ReleaseDevice(cdev);
        if (err != CL_SUCCESS) {
          if (prog) cl.ReleaseProgram(prog);
          check_cl(err, "loading the saved program binary");
        }
        return new Program{std::nullopt, ctx, prog};
      },
      static_cast<void*>(nullptr));
}

// The kernel called `name` in a program, as a heap sycl::kernel*: the extern "C" name for a
// source-built program, the raw name recorded at save time for a reloaded one.
SGLJIT_SYCL_API void* sgljit_sycl_get_kernel(void* program, const char* name) {
  using namespace sgljit_bridge;
  return guarded(
      [&]() -> void* {
        auto& p = *static_cast<Program*>(program);
        if (p.bundle) {
          if (!p.bundle->ext_oneapi_has_kernel(name))
            throw std::invalid_argument(std::string("no kernel named '") + name + "' in the module");
          return new sycl::kernel(p.bundle->ext_oneapi_get_kernel(name));
        }
        const OpenCL& cl = OpenCL::get();
        cl_int err = CL_SUCCESS;
        cl_kernel k = cl.CreateKernel(p.binary, name, &err);
        check_cl(err, (std::string("finding kernel '") + name + "' in the saved binary").c_str());
        auto* kernel = new sycl::kernel(sycl::make_kernel<sycl::backend::opencl>(k, p.context));
        cl.ReleaseKernel(k);  // the sycl::kernel holds its own reference
        return kernel;
      },
      static_cast<void*>(nullptr));
}

// "backend\tname\tdriver version\tplatform version" of the queue's device: what a saved binary is for.
SGLJIT_SYCL_API const char* sgljit_sycl_device_identity(void* queue) {
  using namespace sgljit_bridge;
  static thread_local std::string text;
  return guarded(
      [&]() -> const char* {
        sycl::device dev = static_cast<sycl::queue*>(queue)->get_device();
        std::ostringstream out;
        out << dev.get_backend() << '\t' << dev.get_info<sycl::info::device::name>() << '\t'
            << dev.get_info<sycl::info::device::driver_version>() << '\t'
            << dev.get_platform().get_info<sycl::info::platform::version>();
        text = out.str();
        return text.c_str();
      },
      static_cast<const char*>(nullptr));
}

// Launching kernels on PyTorch's current stream, with the launch checked.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "tensor.h"
#include "utils.h"

namespace sgljit {

// The stream PyTorch considers current for `device` (tvm-ffi picks it up from torch at call time).
inline cudaStream_t get_stream(DLDevice device) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
}

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError) << what << " failed: " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err);
  }
}

// Number of SMs of a device; cached because cudaDeviceGetAttribute is not free on the hot path.
inline int num_sms(int device_id) {
  static std::array<int, 64> cache{};
  static std::mutex mutex;
  RuntimeCheck(device_id >= 0 && device_id < 64, "device id out of range: ", device_id);
  int& slot = cache[device_id];
  if (slot == 0) {
    std::lock_guard<std::mutex> lock(mutex);
    int value = 0;
    check_cuda(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device_id), "cudaDeviceGetAttribute");
    slot = value;
  }
  return slot;
}

// Programmatic dependent launch (PDL, sm_90+). A kernel launched with PDL may be scheduled while the
// kernel before it on the stream is still running, which hides the launch latency that dominates small
// shapes (one token, one timestep). Such a kernel must call pdl_wait() before its first global memory
// access: it returns once the previous kernel has completed and its writes are visible, so stream order
// is kept. pdl_launch_dependents() lets the next PDL kernel be scheduled early. Both are no-ops before
// sm_90 and when the kernel was launched without PDL.
SGLJIT_DEVICE void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

SGLJIT_DEVICE void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether kernels that call pdl_wait() are launched with PDL on `device_id`: compute capability 9.0 or
// newer, unless SGLJIT_PDL=0 (read once per process).
inline bool pdl_enabled(int device_id) {
  static const bool env_on = [] {
    const char* v = std::getenv("SGLJIT_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  static std::array<int, 64> major{};  // 0: not yet asked
  static std::mutex mutex;
  if (!env_on) return false;
  RuntimeCheck(device_id >= 0 && device_id < 64, "device id out of range: ", device_id);
  int& slot = major[device_id];
  if (slot == 0) {
    std::lock_guard<std::mutex> lock(mutex);
    int value = 0;
    check_cuda(cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, device_id), "cudaDeviceGetAttribute");
    slot = value;
  }
  return slot >= 9;
}

// LaunchKernel(kernel, grid, block, smem, device)(args...): launches on torch's current stream for
// `device` and raises a RuntimeError naming `name` if the launch failed. `.pdl()` launches with
// programmatic dependent launch where pdl_enabled(); only for kernels that call pdl_wait() first.
template <typename... KernelArgs>
class LaunchKernel {
 public:
  LaunchKernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes, DLDevice device,
               const char* name = "kernel")
      : kernel_(kernel), grid_(grid), block_(block), smem_(smem_bytes), device_(device), name_(name) {}

  LaunchKernel& pdl(bool on = true) {
    pdl_ = on && pdl_enabled(device_.device_id);
    return *this;
  }

  template <typename... Args>
  void operator()(Args&&... args) const {
    if (grid_.x == 0 || grid_.y == 0 || grid_.z == 0) return;  // nothing to do; a zero grid is a launch error
    cudaLaunchConfig_t config{};
    config.gridDim = grid_;
    config.blockDim = block_;
    config.dynamicSmemBytes = smem_;
    config.stream = get_stream(device_);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = pdl_ ? 1 : 0;
    cudaError_t err = cudaLaunchKernelEx(&config, kernel_, static_cast<KernelArgs>(args)...);
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err != cudaSuccess) {
      TVM_FFI_THROW(RuntimeError) << "launch of " << name_ << " failed: " << cudaGetErrorName(err) << ": "
                                  << cudaGetErrorString(err);
    }
  }

 private:
  void (*kernel_)(KernelArgs...);
  dim3 grid_, block_;
  size_t smem_;
  DLDevice device_;
  const char* name_;
  bool pdl_ = false;
};

}  // namespace sgljit

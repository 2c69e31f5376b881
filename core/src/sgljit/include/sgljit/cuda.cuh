// Launching kernels on PyTorch's current stream, with the launch checked.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <array>
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

// LaunchKernel(kernel, grid, block, smem, device)(args...): launches on torch's current stream for
// `device` and raises a RuntimeError naming `name` if the launch failed.
template <typename... KernelArgs>
class LaunchKernel {
 public:
  LaunchKernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes, DLDevice device,
               const char* name = "kernel")
      : kernel_(kernel), grid_(grid), block_(block), smem_(smem_bytes), device_(device), name_(name) {}

  template <typename... Args>
  void operator()(Args&&... args) const {
    if (grid_.x == 0 || grid_.y == 0 || grid_.z == 0) return;  // nothing to do; a zero grid is a launch error
    kernel_<<<grid_, block_, smem_, get_stream(device_)>>>(static_cast<KernelArgs>(args)...);
    const cudaError_t err = cudaGetLastError();
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
};

}  // namespace sgljit

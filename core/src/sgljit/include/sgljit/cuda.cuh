// Launching kernels on PyTorch's current stream, with the launch checked.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

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

// An attribute of a device (cudaDevAttr*), asked of the runtime once per (device, attribute) in a
// process, then read without a lock: cudaDeviceGetAttribute is not free on the hot path.
inline int device_attribute(int device_id, cudaDeviceAttr attr) {
  RuntimeCheck(device_id >= 0, "device id out of range: ", device_id);
  constexpr int kDevices = 64, kAttrs = 256;  // beyond these, a locked map
  const int a = static_cast<int>(attr);
  if (device_id < kDevices && a >= 0 && a < kAttrs) {
    // 0 until asked, then (1 << 32) | value; threads that race to fill a slot store the same word.
    static std::atomic<int64_t> table[kDevices][kAttrs];
    std::atomic<int64_t>& slot = table[device_id][a];
    const int64_t cached = slot.load(std::memory_order_relaxed);
    if (SGLJIT_UNLIKELY(cached == 0)) {
      int value = 0;
      check_cuda(cudaDeviceGetAttribute(&value, attr, device_id), "cudaDeviceGetAttribute");
      slot.store((int64_t{1} << 32) | static_cast<uint32_t>(value), std::memory_order_relaxed);
      return value;
    }
    return static_cast<int>(static_cast<uint32_t>(cached));
  }
  static std::map<std::pair<int, int>, int> cache;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = cache.try_emplace({device_id, a}, 0);
  if (inserted) {
    int value = 0;
    const cudaError_t err = cudaDeviceGetAttribute(&value, attr, device_id);
    if (err != cudaSuccess) cache.erase(it);
    check_cuda(err, "cudaDeviceGetAttribute");
    it->second = value;
  }
  return it->second;
}

inline int num_sms(int device_id) { return device_attribute(device_id, cudaDevAttrMultiProcessorCount); }

// The L2 cache's bytes: what decides whether an output is stored streaming or a tail kept for a re-read.
inline int l2_bytes(int device_id) { return device_attribute(device_id, cudaDevAttrL2CacheSize); }

// Runs f() (a runtime call returning cudaError_t) with `device_id` current, then makes the caller's
// device current again; returns the first error.
template <typename F>
cudaError_t on_device(int device_id, F&& f) {
  int current = 0;
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess) err = cudaSetDevice(device_id);
  if (err == cudaSuccess) {
    err = f();
    const cudaError_t restore = cudaSetDevice(current);
    if (err == cudaSuccess) err = restore;
  }
  return err;
}

// Blocks of kKernel resident per SM of `device_id` at `threads` threads per block and `smem` bytes of
// dynamic shared memory (at least 1: grids sized from it never come out empty); asked once per
// (device, threads, smem) in a process. Persistent grids are num_sms() x this.
template <auto kKernel>
int resident_blocks(int device_id, int threads, size_t smem = 0) {
  // Hits are read without a lock from kSlots words, each one whole entry: bit 63 set, blocks in bits
  // 43..62, the key below (device 35..42, threads 24..34, smem 0..23). Misses take the lock, ask the
  // runtime and fill the next free slot; keys that do not fit, or come when every slot is taken, are
  // kept in a map under the lock.
  constexpr int kSlots = 16;
  constexpr uint64_t kKeyMask = (uint64_t{1} << 43) - 1;
  static std::atomic<uint64_t> slots[kSlots];
  const bool packable = device_id >= 0 && device_id < 256 && threads >= 0 && threads < 2048 && smem < (1u << 24);
  const uint64_t key = (uint64_t(device_id) << 35) | (uint64_t(threads) << 24) | uint64_t(smem);
  auto find_slot = [&]() -> int {  // the cached value, or -1
    if (packable) {
      for (const auto& slot : slots) {
        const uint64_t entry = slot.load(std::memory_order_relaxed);
        if (entry == 0) break;
        if ((entry & kKeyMask) == key) return static_cast<int>((entry >> 43) & 0xFFFFF);
      }
    }
    return -1;
  };
  if (const int hit = find_slot(); hit >= 0) return hit;

  static std::map<std::tuple<int, int, size_t>, int> cache;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (const int hit = find_slot(); hit >= 0) return hit;  // filled while this thread waited
  if (auto it = cache.find({device_id, threads, smem}); it != cache.end()) return it->second;
  int blocks = 0;
  check_cuda(on_device(device_id,
                       [&] { return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kKernel, threads, smem); }),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  blocks = std::max(blocks, 1);
  if (packable && blocks < (1 << 20)) {
    for (auto& slot : slots) {
      if (slot.load(std::memory_order_relaxed) == 0) {  // fills happen under the lock
        slot.store((uint64_t{1} << 63) | (uint64_t(blocks) << 43) | key, std::memory_order_relaxed);
        return blocks;
      }
    }
  }
  cache.emplace(std::make_tuple(device_id, threads, smem), blocks);
  return blocks;
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

// Starts fetching the 128-byte line holding `ptr` into L2, returning nothing to the thread. Safe
// before pdl_wait(), even for data the previous kernel writes: L2 is the GPU's point of coherence,
// so those writes still land in the line, and the data itself is only read after the wait. Blocks
// scheduled early by PDL use it to move their first DRAM round trip under the previous kernel's tail.
SGLJIT_DEVICE void prefetch_l2(const void* ptr) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr));
#endif
}

// Starts fetching `bytes` bytes from `ptr` into L2 with one bulk (TMA) request, from one thread;
// `ptr` 16-byte aligned, `bytes` a multiple of 16. The same safety as prefetch_l2. Where every
// thread of a row prefetched its own lines (several requests per 128-byte line, all through the
// load path), one bulk request per row made rmsnorm of 128 rows of 4096 bf16 19% faster on the
// H200. A no-op before sm_90 (no bulk copies there; no PDL either, so nothing to overlap).
SGLJIT_DEVICE void prefetch_l2_bulk(const void* ptr, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(ptr), "r"(bytes) : "memory");
#endif
}

// Whether kernels that call pdl_wait() are launched with PDL on `device_id`: compute capability 9.0 or
// newer, unless SGLJIT_PDL=0 (read once per process).
inline bool pdl_enabled(int device_id) {
  static const bool env_on = [] {
    const char* v = std::getenv("SGLJIT_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return env_on && device_attribute(device_id, cudaDevAttrComputeCapabilityMajor) >= 9;
}

namespace detail {

// The driver's cuLaunchKernelEx, found once through the runtime (nothing links libcuda), or null.
// A launch through it with the kernel's CUfunction in hand costs 0.2-0.6 µs less host time than
// cudaLaunchKernelEx, which looks the function up on every call (H200 host, bench_jit.py's rows).
using DriverLaunch = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
inline DriverLaunch driver_launch() {
#if CUDART_VERSION >= 12050
  static const DriverLaunch fn = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &entry, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();  // not sticky; the runtime launch stays
      return DriverLaunch{nullptr};
    }
    return reinterpret_cast<DriverLaunch>(entry);
  }();
  return fn;
#else
  return nullptr;
#endif
}

// The CUfunction of `kernel` on `device_id`, asked of the runtime once per (kernel, device) in a
// process, or null (then the runtime launches). Hits are read without a lock from an open-addressed
// table whose slots are filled once, under the lock, kernel pointer last.
inline CUfunction driver_function(const void* kernel, int device_id) {
  struct Slot {
    std::atomic<const void*> kernel{nullptr};
    int device = -1;
    CUfunction function = nullptr;
  };
  constexpr size_t kSlots = 256;  // a process's kernels × devices; beyond, the runtime launches
  static Slot slots[kSlots];
  const size_t start = ((reinterpret_cast<uintptr_t>(kernel) >> 4) ^ size_t(device_id) * 0x9E37u) % kSlots;
  auto find = [&]() -> Slot* {  // the slot holding (kernel, device_id), else the first empty one
    for (size_t i = 0; i < kSlots; ++i) {
      Slot& slot = slots[(start + i) % kSlots];
      const void* k = slot.kernel.load(std::memory_order_acquire);
      if (k == nullptr || (k == kernel && slot.device == device_id)) return &slot;
    }
    return nullptr;
  };
  // Checked on a fresh load: an empty slot found without the lock may be filled since, maybe for
  // another kernel.
  auto holds = [&](const Slot* slot) {
    return slot->kernel.load(std::memory_order_acquire) == kernel && slot->device == device_id;
  };
  if (Slot* hit = find(); hit != nullptr && holds(hit)) return hit->function;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  Slot* slot = find();  // slots are filled only under the lock: empty or ours
  if (slot == nullptr) return nullptr;
  if (holds(slot)) return slot->function;  // filled while this thread waited
  cudaFunction_t function = nullptr;
  if (on_device(device_id, [&] { return cudaGetFuncBySymbol(&function, kernel); }) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  slot->device = device_id;
  slot->function = reinterpret_cast<CUfunction>(function);
  slot->kernel.store(kernel, std::memory_order_release);
  return slot->function;
}

}  // namespace detail

// LaunchKernel(kernel, grid, block, smem, device)(args...): launches on torch's current stream for
// `device` and raises a RuntimeError naming `name` if the launch failed. `.pdl()` launches with
// programmatic dependent launch where pdl_enabled(); only for kernels that call pdl_wait() first.
// `.cooperative()` launches cooperatively (grid-wide sync; every block must be resident).
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

  LaunchKernel& cooperative(bool on = true) {
    cooperative_ = on;
    return *this;
  }

  template <typename... Args>
  void operator()(Args&&... args) const {
    if (grid_.x == 0 || grid_.y == 0 || grid_.z == 0) return;  // nothing to do; a zero grid is a launch error
    const cudaStream_t stream = get_stream(device_);
    const detail::DriverLaunch launch = detail::driver_launch();
    if (launch != nullptr) {
      const CUfunction function = detail::driver_function(reinterpret_cast<const void*>(kernel_), device_.device_id);
      if (function != nullptr) {
        std::tuple<KernelArgs...> values{static_cast<KernelArgs>(args)...};
        if (driver_launch_(launch, function, stream, values, std::index_sequence_for<KernelArgs...>{})) return;
      }
    }
    // The runtime's launch: where the driver's is not to be had, and to report a failed launch.
    cudaLaunchConfig_t config{};
    config.gridDim = grid_;
    config.blockDim = block_;
    config.dynamicSmemBytes = smem_;
    config.stream = stream;
    cudaLaunchAttribute attr[2];
    unsigned num_attrs = 0;
    if (pdl_) {
      attr[num_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[num_attrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cooperative_) {
      attr[num_attrs].id = cudaLaunchAttributeCooperative;
      attr[num_attrs++].val.cooperative = 1;
    }
    config.attrs = attr;
    config.numAttrs = num_attrs;
    cudaError_t err = cudaLaunchKernelEx(&config, kernel_, static_cast<KernelArgs>(args)...);
    const cudaError_t last = cudaGetLastError();  // also clears a failed launch's error for torch
    if (err == cudaSuccess) err = last;
    if (err != cudaSuccess) {
      TVM_FFI_THROW(RuntimeError) << "launch of " << name_ << " failed: " << cudaGetErrorName(err) << ": "
                                  << cudaGetErrorString(err);
    }
  }

 private:
  // Whether the driver launched it; a failed launch launched nothing, so the runtime may try again.
  template <size_t... I>
  bool driver_launch_(detail::DriverLaunch launch, CUfunction function, cudaStream_t stream,
                      std::tuple<KernelArgs...>& values, std::index_sequence<I...>) const {
    void* params[sizeof...(KernelArgs) + 1] = {static_cast<void*>(&std::get<I>(values))...};
    CUlaunchConfig config{};
    config.gridDimX = grid_.x, config.gridDimY = grid_.y, config.gridDimZ = grid_.z;
    config.blockDimX = block_.x, config.blockDimY = block_.y, config.blockDimZ = block_.z;
    config.sharedMemBytes = static_cast<unsigned>(smem_);
    config.hStream = reinterpret_cast<CUstream>(stream);
    CUlaunchAttribute attr[2];
    unsigned num_attrs = 0;
    if (pdl_) {
      attr[num_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attr[num_attrs++].value.programmaticStreamSerializationAllowed = 1;
    }
    if (cooperative_) {
      attr[num_attrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attr[num_attrs++].value.cooperative = 1;
    }
    config.attrs = attr;
    config.numAttrs = num_attrs;
    return launch(&config, function, params, nullptr) == CUDA_SUCCESS;
  }

  void (*kernel_)(KernelArgs...);
  dim3 grid_, block_;
  size_t smem_;
  DLDevice device_;
  const char* name_;
  bool pdl_ = false;
  bool cooperative_ = false;
};

}  // namespace sgljit

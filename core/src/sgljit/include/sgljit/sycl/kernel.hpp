// Everything a SYCL kernel source of sgljit includes. One source serves both routes: the runtime
// compiler (kernel_compiler extension, no oneAPI toolkit) and `icpx -fsycl` (AOT on Intel GPUs).
//
// Convention (see include/README.md): kernels are free functions, `extern "C"`, nd-range, one
// property per SYCL_EXT_ONEAPI_FUNCTION_PROPERTY macro; specializations come from -D macros; the
// host decides the launch geometry.
//
//   #include <sgljit/sycl/kernel.hpp>
//   using T = sgljit::scalar_t;                      // -DSGLJIT_T=bf16_t
//   extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
//   void scale(const T* x, T* out, float factor, int64_t n) {
//     const size_t i = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
//     if (i < n) out[i] = sgljit::from_float<T>(sgljit::to_float(x[i]) * factor);
//   }
#pragma once

#include <cstdint>
#include <limits>
#include <sycl/sycl.hpp>

namespace syclexp = sycl::ext::oneapi::experimental;
namespace syclext = sycl::ext::oneapi;

namespace sgljit {

// The element type names core's CUDA headers use (make_cpp_args(torch.bfloat16) == "bf16_t").
using fp32_t = float;
using fp16_t = sycl::half;
using bf16_t = sycl::ext::oneapi::bfloat16;

#ifdef SGLJIT_T
// The element type of this specialization, chosen by the host with -DSGLJIT_T=bf16_t.
using scalar_t = SGLJIT_T;
#endif

inline float to_float(float x) { return x; }
inline float to_float(sycl::half x) { return static_cast<float>(x); }
inline float to_float(sycl::ext::oneapi::bfloat16 x) { return static_cast<float>(x); }

// Round-to-nearest-even conversion from fp32 (what PyTorch's .to(dtype) does).
template <typename T>
inline T from_float(float x) {
  return static_cast<T>(x);
}

inline constexpr int kVecBytes = 16;

// N elements loaded or stored in one transaction; `ptr` must be aligned to sizeof(T) * N.
template <typename T, int N>
struct alignas(sizeof(T) * N) AlignedVector {
  static_assert((N & (N - 1)) == 0, "AlignedVector width must be a power of two");
  T data[N];

  void load(const T* ptr) { *this = *reinterpret_cast<const AlignedVector*>(ptr); }
  void store(T* ptr) const { *reinterpret_cast<AlignedVector*>(ptr) = *this; }
  T& operator[](int i) { return data[i]; }
  const T& operator[](int i) const { return data[i]; }
};

template <typename T, int N>
using aligned_vector = AlignedVector<T, N>;

// Elements of T that fit in one 16-byte transaction.
template <typename T>
inline constexpr int kVecSize = kVecBytes / sizeof(T);

// Reductions over the calling work-item's sub-group / work-group: every member gets the result.
// They must be reached by all work-items of the group (no early return before them).
inline float sub_group_reduce_sum(float v) {
  return sycl::reduce_over_group(syclext::this_work_item::get_sub_group(), v, sycl::plus<float>());
}
inline float sub_group_reduce_max(float v) {
  return sycl::reduce_over_group(syclext::this_work_item::get_sub_group(), v, sycl::maximum<float>());
}
template <int Dims = 1>
inline float work_group_reduce_sum(float v) {
  return sycl::reduce_over_group(syclext::this_work_item::get_work_group<Dims>(), v, sycl::plus<float>());
}
template <int Dims = 1>
inline float work_group_reduce_max(float v) {
  return sycl::reduce_over_group(syclext::this_work_item::get_work_group<Dims>(), v,
                                 sycl::maximum<float>());
}

inline constexpr int64_t div_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace sgljit

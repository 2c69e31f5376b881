// activation for SYCL: scaled_silu, out = silu(x) * scale with silu(x) = x / (1 + exp(-x)); fp32 math,
// one cast. The same math as csrc/activation.cuh.
//
// Written for both build routes (the SYCL runtime compiler and icpx; see sgljit's include/README.md):
// a free function, extern "C", one property per SYCL_EXT_ONEAPI_FUNCTION_PROPERTY; the element type
// comes from -DSGLJIT_T (the spec's Sycl key); the host (ops.py) launches a multiple of the
// work-group size and the kernel grid-strides over the elements. No host code here.
#include <sgljit/sycl/kernel.hpp>

using T = sgljit::scalar_t;

// input and out [rows, cols], rows in_stride / out_stride elements apart.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void scaled_silu(const T* in, T* out, int64_t rows, int64_t cols, int64_t in_stride, int64_t out_stride, float scale) {
  const auto it = syclext::this_work_item::get_nd_item<1>();
  const int64_t n = rows * cols;
  for (int64_t i = it.get_global_id(0); i < n; i += it.get_global_range(0)) {
    const int64_t r = i / cols, c = i - r * cols;
    const float x = sgljit::to_float(in[r * in_stride + c]);
    out[r * out_stride + c] = sgljit::from_float<T>(x / (1.0f + sycl::exp(-x)) * scale);
  }
}

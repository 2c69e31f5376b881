// The SYCL kernel of bench_jit's warm-load measurement: out = x * SCALE.
#include <sgljit/sycl/kernel.hpp>

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void scale(const float* x, float* out, int64_t n) {
  const int64_t i = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
  if (i < n) out[i] = x[i] * SCALE;
}

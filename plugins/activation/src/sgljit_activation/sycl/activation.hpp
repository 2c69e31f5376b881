// Gated activations for SYCL: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul. out [rows, d] =
// act(gate) * up of in [rows, 2d] (gate = in[:, :d], up = in[:, d:]), fp32 math (common.hpp), one
// rounding. Work-item i takes ACT_VEC consecutive outputs of the flat range rows * d / ACT_VEC (16 bytes
// where the host found the rows aligned, else 1 element), grid-stride; row strides in elements.
//
// Specialized with -D macros: SGLJIT_T (element type), ACT_VEC (elements a work-item).
#include "common.hpp"

#ifndef ACT_VEC
#define ACT_VEC 1
#endif

namespace sgljit_activation {

using T = sgljit::scalar_t;
constexpr int kVec = ACT_VEC;
using V = sgljit::AlignedVector<T, kVec>;

template <Act kAct>
inline void act_rows(const T* in, T* out, int64_t rows, int64_t hidden, int64_t in_stride, int64_t out_stride) {
  const auto it = syclext::this_work_item::get_nd_item<1>();
  const int64_t per_row = hidden / kVec, items = rows * per_row;
  for (int64_t i = it.get_global_id(0); i < items; i += it.get_global_range(0)) {
    const int64_t row = i / per_row, col = (i - row * per_row) * kVec;
    V g, u, y;
    g.load(in + row * in_stride + col);
    u.load(in + row * in_stride + hidden + col);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      y[e] = sgljit::from_float<T>(act_and_mul<kAct>(sgljit::to_float(g[e]), sgljit::to_float(u[e])));
    }
    y.store(out + row * out_stride + col);
  }
}

}  // namespace sgljit_activation

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void silu_and_mul(const sgljit_activation::T* in, int64_t in_stride, sgljit_activation::T* out, int64_t out_stride,
                  int64_t rows, int64_t hidden) {
  using namespace sgljit_activation;
  act_rows<Act::kSilu>(in, out, rows, hidden, in_stride, out_stride);
}

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void gelu_and_mul(const sgljit_activation::T* in, int64_t in_stride, sgljit_activation::T* out, int64_t out_stride,
                  int64_t rows, int64_t hidden) {
  using namespace sgljit_activation;
  act_rows<Act::kGelu>(in, out, rows, hidden, in_stride, out_stride);
}

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void gelu_tanh_and_mul(const sgljit_activation::T* in, int64_t in_stride, sgljit_activation::T* out, int64_t out_stride,
                       int64_t rows, int64_t hidden) {
  using namespace sgljit_activation;
  act_rows<Act::kGeluTanh>(in, out, rows, hidden, in_stride, out_stride);
}

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

namespace sgljit_activation {

// Filtered rows (sglang's MoE routing): act_rows where row r is written only if expert_ids[r / expert_step]
// != -1 (an index past expert_count: not written) and, with `sorted`, r < num_post[0] and sorted_ids[r]
// (unsigned) < num_valid; other rows keep out's contents.
template <Act kAct>
inline void act_rows_filtered(const T* in, T* out, int64_t rows, int64_t hidden, int64_t in_stride,
                              int64_t out_stride, const int32_t* expert_ids, int64_t expert_count,
                              int64_t expert_step, const int32_t* sorted_ids, const int32_t* num_post,
                              int64_t num_valid, int32_t sorted) {
  const auto it = syclext::this_work_item::get_nd_item<1>();
  const int64_t per_row = hidden / kVec, items = rows * per_row;
  for (int64_t i = it.get_global_id(0); i < items; i += it.get_global_range(0)) {
    const int64_t row = i / per_row, col = (i - row * per_row) * kVec;
    const int64_t e = row / expert_step;
    if (e >= expert_count || expert_ids[e] == -1) continue;
    if (sorted && (row >= num_post[0] || int64_t(static_cast<uint32_t>(sorted_ids[row])) >= num_valid)) continue;
    V g, u, y;
    g.load(in + row * in_stride + col);
    u.load(in + row * in_stride + hidden + col);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      y[k] = sgljit::from_float<T>(act_and_mul<kAct>(sgljit::to_float(g[k]), sgljit::to_float(u[k])));
    }
    y.store(out + row * out_stride + col);
  }
}

}  // namespace sgljit_activation

// act: 0 silu, 1 gelu, 2 gelu_tanh.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void gated_act_filtered(const sgljit_activation::T* in, sgljit_activation::T* out, int64_t rows, int64_t hidden,
                        int64_t in_stride, int64_t out_stride, const int32_t* expert_ids, int64_t expert_count,
                        int64_t expert_step, const int32_t* sorted_ids, const int32_t* num_post, int64_t num_valid,
                        int32_t sorted, int32_t act) {
  using namespace sgljit_activation;
  if (act == 0) {
    act_rows_filtered<Act::kSilu>(in, out, rows, hidden, in_stride, out_stride, expert_ids, expert_count,
                                  expert_step, sorted_ids, num_post, num_valid, sorted);
  } else if (act == 1) {
    act_rows_filtered<Act::kGelu>(in, out, rows, hidden, in_stride, out_stride, expert_ids, expert_count,
                                  expert_step, sorted_ids, num_post, num_valid, sorted);
  } else {
    act_rows_filtered<Act::kGeluTanh>(in, out, rows, hidden, in_stride, out_stride, expert_ids, expert_count,
                                      expert_step, sorted_ids, num_post, num_valid, sorted);
  }
}

// Rope -> fp8 quantize (optionally -> append into a paged KV cache), as csrc/fp8_kv.cuh computes it (its header says the page-table contract: a token whose entry does
// not resolve to a page of the cache stores nothing). A group of kLanes work-items per item (token,
// one head of one tensor); lanes stride over the head's rotary pairs, then its other elements.
//
// Macros: SGLJIT_T (input dtype), FP8KV_Q (fp8_e4m3_t / fp8_e5m2_t), FP8KV_IDX_T (positions),
// FP8KV_NEOX (0/1). The plain append is sycl/paged_append.hpp.
#pragma once

#include "page_table.hpp"

#include <sgljit/sycl/fp8.hpp>
#include <sgljit/sycl/kernel.hpp>

namespace sgljit_rope_fp8 {

using T = sgljit::scalar_t;
using Q = sgljit::FP8KV_Q;
using IdxT = FP8KV_IDX_T;
constexpr bool kNeox = FP8KV_NEOX != 0;

// x * scale, clamped to the format's finite range, rounded to nearest even (NaN stays NaN).
inline uint8_t quantize(float x) {
  if (!sycl::isnan(x)) x = sycl::fmin(sycl::fmax(x, -sgljit::Fp8<Q>::kMax), sgljit::Fp8<Q>::kMax);
  return sgljit::fp8_from_float<Q>(x);
}

inline void rope_quant_head(const T* x, uint8_t* y, int64_t rot, const float* row, float scale, int lane) {
  const int64_t half = rot / 2;
  for (int64_t i = lane; i < half; i += kLanes) {
    const int64_t i1 = kNeox ? i : 2 * i, i2 = kNeox ? i + half : 2 * i + 1;
    float a = sgljit::to_float(x[i1]), b = sgljit::to_float(x[i2]);
    if (row != nullptr) {
      const float c = row[i], s = row[half + i];
      const float ra = a * c - b * s, rb = b * c + a * s;
      a = ra, b = rb;
    }
    y[i1] = quantize(a * scale);
    y[i2] = quantize(b * scale);
  }
}

inline void quant_head(const T* x, uint8_t* y, int64_t n, float scale, int lane) {
  for (int64_t i = lane; i < n; i += kLanes) y[i] = quantize(sgljit::to_float(x[i]) * scale);
}

}  // namespace sgljit_rope_fp8

using fp8kv_t = sgljit_rope_fp8::T;
using fp8kv_idx_t = sgljit_rope_fp8::IdxT;

// Dense outputs (paged == 0) are pages of one entry: page = token. Strides in elements: sources
// (token, head), destinations (page, entry, head).
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void rope_fp8(const fp8kv_t* q_rope, const fp8kv_t* k_rope, const fp8kv_t* q_nope, const fp8kv_t* k_nope,
              const fp8kv_t* v, const float* cos_sin, const fp8kv_idx_t* positions, uint8_t* q_rope_out,
              uint8_t* q_nope_out, uint8_t* k_rope_out, uint8_t* k_nope_out, uint8_t* v_out,
              const int32_t* kv_indices, const int32_t* kv_indptr, const int32_t* batch_indices,
              const int32_t* page_positions, int64_t num_tokens, int64_t q_heads, int64_t k_heads, int64_t v_heads,
              int64_t rot, int64_t nope, int64_t v_dim, int64_t qr_st, int64_t qr_sh, int64_t kr_st, int64_t kr_sh,
              int64_t qn_st, int64_t qn_sh, int64_t kn_st, int64_t kn_sh, int64_t v_st, int64_t v_sh,
              int64_t qro_st, int64_t qro_sh, int64_t qno_st, int64_t qno_sh, int64_t kro_sp, int64_t kro_se,
              int64_t kro_sh, int64_t kno_sp, int64_t kno_se, int64_t kno_sh, int64_t vo_sp, int64_t vo_se,
              int64_t vo_sh, int64_t cache_stride, int64_t max_pos, int64_t paged, int64_t num_indices,
              int64_t batch, int64_t num_pages, int64_t page_size, float scale_q, float scale_k, float scale_v) {
  using namespace sgljit_rope_fp8;
  const int64_t gid = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
  const int64_t items = q_heads + k_heads + v_heads;
  const int64_t item = gid / kLanes;
  const int lane = static_cast<int>(gid % kLanes);
  const int64_t t = item / items;
  if (t >= num_tokens) return;
  int64_t slot = item - t * items;
  const IdxT pos = positions[t];
  const bool valid = static_cast<int64_t>(pos) >= 0 && static_cast<int64_t>(pos) < max_pos;
  const float* row = valid ? cos_sin + static_cast<int64_t>(pos) * cache_stride : nullptr;
  if (slot < q_heads) {
    rope_quant_head(q_rope + t * qr_st + slot * qr_sh, q_rope_out + t * qro_st + slot * qro_sh, rot, row, scale_q,
                    lane);
    quant_head(q_nope + t * qn_st + slot * qn_sh, q_nope_out + t * qno_st + slot * qno_sh, nope, scale_q, lane);
    return;
  }
  int64_t page = t, entry = 0;
  if (paged) {
    const PageTable table{kv_indices, kv_indptr, batch_indices, page_positions,
                          num_indices, batch,     num_pages,     page_size};
    if (!table.locate(t, page, entry)) return;
  }
  slot -= q_heads;
  if (slot < k_heads) {
    rope_quant_head(k_rope + t * kr_st + slot * kr_sh, k_rope_out + page * kro_sp + entry * kro_se + slot * kro_sh,
                    rot, row, scale_k, lane);
    quant_head(k_nope + t * kn_st + slot * kn_sh, k_nope_out + page * kno_sp + entry * kno_se + slot * kno_sh, nope,
               scale_k, lane);
  } else {
    slot -= k_heads;
    quant_head(v + t * v_st + slot * v_sh, v_out + page * vo_sp + entry * vo_se + slot * vo_sh, v_dim, scale_v, lane);
  }
}


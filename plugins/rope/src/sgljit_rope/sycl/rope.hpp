// Rotary position embedding for SYCL (Intel XPU, or the SYCL CPU device): the same decomposition
// as csrc/rope.cuh. A lane group of LANES = ROPE_ROT / 2 / ROPE_VEC work-items owns a head; lane l
// holds the rotary pairs [l*VEC, l*VEC + VEC): neox (i, i + ROT/2), gptj ("interleaved",
// (2i, 2i + 1)). One work item = (token, chunk of up to 4 heads of one tensor); heads are strided.
// Out-of-range positions leave a token unrotated; out-of-range out_loc store nothing. rope_apply_kv's
// rotate_k also rotates k in place (whether or not its token is stored).
//
// Specialized with -D macros: SGLJIT_T (element type), ROPE_CACHE_T (cos/sin: fp32_t or SGLJIT_T),
// ROPE_IDX_T / ROPE_LOC_T (index types), ROPE_HEAD_DIM, ROPE_ROT, ROPE_NEOX (0/1), ROPE_VEC
// (elements per vector access), ROPE_ROUND_PRODUCTS (0/1: apply_rope's round_products, vLLM's
// rounding: cos, sin and each product rounded to SGLJIT_T before the sum or difference).
#pragma once

#include <sgljit/sycl/kernel.hpp>

#ifndef ROPE_CACHE_T
#define ROPE_CACHE_T fp32_t
#endif
#ifndef ROPE_IDX_T
#define ROPE_IDX_T int64_t
#endif
#ifndef ROPE_LOC_T
#define ROPE_LOC_T int64_t
#endif
#ifndef ROPE_HEAD_DIM
#define ROPE_HEAD_DIM ROPE_ROT
#endif
#ifndef ROPE_ROUND_PRODUCTS
#define ROPE_ROUND_PRODUCTS 0
#endif

namespace sgljit_rope {

using T = sgljit::scalar_t;
using CacheT = sgljit::ROPE_CACHE_T;  // fp32_t or SGLJIT_T's name
using IdxT = ROPE_IDX_T;
using LocT = ROPE_LOC_T;
constexpr int kHeadDim = ROPE_HEAD_DIM;
constexpr int kRot = ROPE_ROT;
constexpr bool kNeox = ROPE_NEOX != 0;
constexpr int kVec = ROPE_VEC;
constexpr bool kRoundProducts = ROPE_ROUND_PRODUCTS != 0;
constexpr int kHalf = kRot / 2;
constexpr int kLanes = kHalf / kVec;
constexpr int kHeads = 4;
static_assert(kRot % 2 == 0 && kHalf % kVec == 0 && kHeadDim % kVec == 0 && kRot <= kHeadDim,
              "bad rope specialization");

using Vec = sgljit::AlignedVector<T, kVec>;

inline int first_offset(int lane) { return kNeox ? lane * kVec : lane * 2 * kVec; }
inline int second_offset(int lane) { return kNeox ? kHalf + lane * kVec : lane * 2 * kVec + kVec; }

inline void load_cos_sin(const CacheT* row, int lane, float* c, float* s) {
  for (int i = 0; i < kVec; ++i) {
    c[i] = sgljit::to_float(row[lane * kVec + i]);
    s[i] = sgljit::to_float(row[kHalf + lane * kVec + i]);
  }
}

// x rounded to T, read back as fp32.
inline float round_to_t(float x) { return sgljit::to_float(sgljit::from_float<T>(x)); }

inline void rotate(Vec& a, Vec& b, const float* c, const float* s) {
  float x[2 * kVec];
  for (int i = 0; i < kVec; ++i) {
    x[i] = sgljit::to_float(a[i]);
    x[kVec + i] = sgljit::to_float(b[i]);
  }
  float y[2 * kVec];
  for (int p = 0; p < kVec; ++p) {
    const int i1 = kNeox ? p : 2 * p;
    const int i2 = kNeox ? kVec + p : 2 * p + 1;
    if constexpr (kRoundProducts) {
      const float cp = round_to_t(c[p]), sp = round_to_t(s[p]);
      y[i1] = round_to_t(x[i1] * cp) - round_to_t(x[i2] * sp);
      y[i2] = round_to_t(x[i2] * cp) + round_to_t(x[i1] * sp);
    } else {
      y[i1] = x[i1] * c[p] - x[i2] * s[p];
      y[i2] = x[i2] * c[p] + x[i1] * s[p];
    }
  }
  for (int i = 0; i < kVec; ++i) {
    a[i] = sgljit::from_float<T>(y[i]);
    b[i] = sgljit::from_float<T>(y[kVec + i]);
  }
}

template <typename I>
inline bool in_range(I v, int64_t n) {
  return static_cast<int64_t>(v) >= 0 && static_cast<int64_t>(v) < n;
}

// Rotates (or, if !valid, passes through) the rotary dims of nheads heads from src into dst, and
// into `back` too (src's heads, in place) when it is given and valid.
inline void rope_heads(const T* src, int64_t src_hs, T* dst, int64_t dst_hs, int nheads, int lane,
                       const CacheT* row, bool valid, T* back = nullptr) {
  const int o1 = first_offset(lane), o2 = second_offset(lane);
  float c[kVec], s[kVec];
  if (valid) load_cos_sin(row, lane, c, s);
  for (int h = 0; h < nheads; ++h) {
    Vec a, b;
    a.load(src + h * src_hs + o1);
    b.load(src + h * src_hs + o2);
    if (valid) rotate(a, b, c, s);
    a.store(dst + h * dst_hs + o1);
    b.store(dst + h * dst_hs + o2);
    if (back != nullptr && valid) {
      a.store(back + h * src_hs + o1);
      b.store(back + h * src_hs + o2);
    }
  }
}

// Copies dims [from, kHeadDim) of nheads heads, kVec at a time, spread over the lane group.
inline void copy_heads(const T* src, int64_t src_hs, T* dst, int64_t dst_hs, int nheads, int lane,
                       int from) {
  const int nvec = (kHeadDim - from) / kVec;
  for (int h = 0; h < nheads; ++h) {
    for (int v = lane; v < nvec; v += kLanes) {
      Vec x;
      x.load(src + h * src_hs + from + v * kVec);
      x.store(dst + h * dst_hs + from + v * kVec);
    }
  }
}

}  // namespace sgljit_rope

using rope_t = sgljit_rope::T;
using rope_cache_t = sgljit_rope::CacheT;
using rope_idx_t = sgljit_rope::IdxT;
using rope_loc_t = sgljit_rope::LocT;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void rope_apply(rope_t* q, rope_t* k, const rope_cache_t* cos_sin, const rope_idx_t* positions, int64_t num_items,
                int64_t chunks, int64_t q_chunks, int64_t q_heads, int64_t k_heads,
                int64_t q_stride_t, int64_t q_stride_h, int64_t k_stride_t, int64_t k_stride_h,
                int64_t cache_stride, int64_t max_pos) {
  using namespace sgljit_rope;
  const int64_t gid = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
  const int64_t item = gid / kLanes;
  const int lane = static_cast<int>(gid % kLanes);
  if (item >= num_items) return;
  const int64_t t = item / chunks;
  const int64_t chunk = item % chunks;
  const bool is_q = chunk < q_chunks;
  const int64_t h0 = (is_q ? chunk : chunk - q_chunks) * kHeads;
  const int64_t left = (is_q ? q_heads : k_heads) - h0;
  const int nheads = static_cast<int>(left < kHeads ? left : kHeads);
  const int64_t hs = is_q ? q_stride_h : k_stride_h;
  T* base = is_q ? q + t * q_stride_t + h0 * hs : k + t * k_stride_t + h0 * hs;
  const IdxT pos = positions[t];
  if (!in_range(pos, max_pos)) return;  // out of range: leave the token unrotated
  rope_heads(base, hs, base, hs, nheads, lane, cos_sin + static_cast<int64_t>(pos) * cache_stride,
             true);
}

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void rope_apply_kv(rope_t* q, rope_t* k, const rope_t* v, rope_t* k_cache, rope_t* v_cache,
                   const rope_cache_t* cos_sin, const rope_idx_t* positions, const rope_loc_t* out_loc,
                   int64_t num_items, int64_t chunks, int64_t q_chunks, int64_t k_chunks, int64_t q_heads,
                   int64_t k_heads, int64_t q_stride_t, int64_t q_stride_h, int64_t k_stride_t, int64_t k_stride_h,
                   int64_t v_stride_t, int64_t v_stride_h, int64_t kc_stride_s, int64_t kc_stride_h,
                   int64_t vc_stride_s, int64_t vc_stride_h, int64_t cache_stride, int64_t max_pos,
                   int64_t num_slots, int64_t rotate_k) {
  using namespace sgljit_rope;
  const int64_t gid = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
  const int64_t item = gid / kLanes;
  const int lane = static_cast<int>(gid % kLanes);
  if (item >= num_items) return;
  const int64_t t = item / chunks;
  const int64_t chunk = item % chunks;
  const IdxT pos = positions[t];
  const bool valid = in_range(pos, max_pos);
  const CacheT* row = cos_sin + (valid ? static_cast<int64_t>(pos) * cache_stride : 0);
  if (chunk < q_chunks) {  // q: rotate in place
    if (!valid) return;
    const int64_t h0 = chunk * kHeads;
    const int nheads = static_cast<int>(q_heads - h0 < kHeads ? q_heads - h0 : kHeads);
    T* base = q + t * q_stride_t + h0 * q_stride_h;
    rope_heads(base, q_stride_h, base, q_stride_h, nheads, lane, row, true);
    return;
  }
  const LocT loc = out_loc[t];
  const bool store = in_range(loc, num_slots);  // out of range: nothing stored for this token
  const int64_t slot = static_cast<int64_t>(loc);
  if (chunk < q_chunks + k_chunks) {  // k: rotated into k_cache, pass-through dims copied
    const int64_t h0 = (chunk - q_chunks) * kHeads;
    const int nheads = static_cast<int>(k_heads - h0 < kHeads ? k_heads - h0 : kHeads);
    T* src = k + t * k_stride_t + h0 * k_stride_h;
    T* back = rotate_k ? src : nullptr;
    if (!store) {
      if (back != nullptr && valid) rope_heads(src, k_stride_h, src, k_stride_h, nheads, lane, row, true);
      return;
    }
    T* dst = k_cache + slot * kc_stride_s + h0 * kc_stride_h;
    rope_heads(src, k_stride_h, dst, kc_stride_h, nheads, lane, row, valid, back);
    copy_heads(src, k_stride_h, dst, kc_stride_h, nheads, lane, kRot);
  } else {  // v: copied into v_cache
    if (!store) return;
    const int64_t h0 = (chunk - q_chunks - k_chunks) * kHeads;
    const int nheads = static_cast<int>(k_heads - h0 < kHeads ? k_heads - h0 : kHeads);
    const T* src = v + t * v_stride_t + h0 * v_stride_h;
    T* dst = v_cache + slot * vc_stride_s + h0 * vc_stride_h;
    copy_heads(src, v_stride_h, dst, vc_stride_h, nheads, lane, 0);
  }
}

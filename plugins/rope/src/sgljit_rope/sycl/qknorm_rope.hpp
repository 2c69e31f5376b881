// qknorm_rope for SYCL (Intel XPU, or the SYCL CPU device): per-head RMSNorm of q and k, rounded to
// the element type, then rotary embedding, in place; the numerics and head layout of
// csrc/qknorm_rope.cuh. A head is QKR_HEAD_DIM / (2 VEC) vector pairs: pair j < ROT / (2 VEC) rotates
// (neox: vectors j and ROT/(2 VEC) + j; gptj: vectors 2j and 2j + 1, whole pairs in each) by cos/sin
// [j*VEC, j*VEC + VEC); the other pairs are the tail's vectors 2j and 2j + 1. A work-group of
// QKR_LANES work-items owns one (token, head), q's heads first; lane l holds pairs l, l + LANES, ...
// and the sum of squares is a work-group reduction. A position outside [0, max_pos) leaves the token
// normalized and unrotated.
//
// Specialized with -D macros: SGLJIT_T (element type), QKR_IDX_T (positions), QKR_HEAD_DIM, QKR_ROT,
// QKR_NEOX (0/1), QKR_VEC (elements per vector access), QKR_LANES (work-items per head, from ops.py).
#pragma once

#include <sgljit/sycl/kernel.hpp>

namespace sgljit_qknorm_rope {

using T = sgljit::scalar_t;
using IdxT = QKR_IDX_T;
constexpr int kHeadDim = QKR_HEAD_DIM;
constexpr int kRot = QKR_ROT;
constexpr bool kNeox = QKR_NEOX != 0;
constexpr int kVec = QKR_VEC;
constexpr int kLanes = QKR_LANES;
constexpr int kPairs = kHeadDim / (2 * kVec);
constexpr int kRotPairs = kRot / (2 * kVec);
constexpr int kPairsPerLane = (kPairs + kLanes - 1) / kLanes;
static_assert(kRot > 0 && kRot <= kHeadDim && kHeadDim % (2 * kVec) == 0 && kRot % (2 * kVec) == 0,
              "bad qknorm_rope specialization");

using Vec = sgljit::AlignedVector<T, kVec>;

inline int pair_first(int j) { return (kNeox && j < kRotPairs ? j : 2 * j) * kVec; }
inline int pair_second(int j) { return (kNeox && j < kRotPairs ? kRotPairs + j : 2 * j + 1) * kVec; }

}  // namespace sgljit_qknorm_rope

using qkr_t = sgljit_qknorm_rope::T;
using qkr_idx_t = sgljit_qknorm_rope::IdxT;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void qknorm_rope(qkr_t* q, qkr_t* k, const qkr_t* q_weight, const qkr_t* k_weight, const float* cos_sin,
                 const qkr_idx_t* positions, int64_t q_heads, int64_t k_heads, int64_t q_stride_t,
                 int64_t q_stride_h, int64_t k_stride_t, int64_t k_stride_h, int64_t cache_stride,
                 int64_t max_pos, float eps) {
  using namespace sgljit_qknorm_rope;
  const auto it = syclext::this_work_item::get_nd_item<1>();
  const int64_t head = it.get_group(0);
  const int lane = static_cast<int>(it.get_local_id(0));
  const int64_t heads = q_heads + k_heads;
  const int64_t t = head / heads;
  const int64_t h = head - t * heads;
  const bool is_q = h < q_heads;
  T* x = is_q ? q + t * q_stride_t + h * q_stride_h : k + t * k_stride_t + (h - q_heads) * k_stride_h;
  const T* w = is_q ? q_weight : k_weight;

  float v[kPairsPerLane][2 * kVec];
  float ss = 0.0f;
  for (int m = 0; m < kPairsPerLane; ++m) {
    const int j = lane + m * kLanes;
    if (j >= kPairs) continue;
    Vec a, b;
    a.load(x + pair_first(j));
    b.load(x + pair_second(j));
    for (int e = 0; e < kVec; ++e) {
      v[m][e] = sgljit::to_float(a[e]);
      v[m][kVec + e] = sgljit::to_float(b[e]);
    }
    for (int e = 0; e < 2 * kVec; ++e) ss += v[m][e] * v[m][e];
  }
  ss = sgljit::work_group_reduce_sum(ss);  // every work-item of the group reaches it
  const float inv_rms = sycl::rsqrt(ss / static_cast<float>(kHeadDim) + eps);
  const IdxT pos = positions[t];
  const bool rotate = static_cast<int64_t>(pos) >= 0 && static_cast<int64_t>(pos) < max_pos;
  const float* row = cos_sin + (rotate ? static_cast<int64_t>(pos) * cache_stride : 0);

  for (int m = 0; m < kPairsPerLane; ++m) {
    const int j = lane + m * kLanes;
    if (j >= kPairs) continue;
    Vec wa, wb;
    wa.load(w + pair_first(j));
    wb.load(w + pair_second(j));
    float y[2 * kVec];
    for (int e = 0; e < kVec; ++e) {  // qknorm's output, rounded to T
      y[e] = sgljit::to_float(sgljit::from_float<T>(v[m][e] * inv_rms * sgljit::to_float(wa[e])));
      y[kVec + e] = sgljit::to_float(sgljit::from_float<T>(v[m][kVec + e] * inv_rms * sgljit::to_float(wb[e])));
    }
    if (rotate && j < kRotPairs) {
      float z[2 * kVec];
      for (int i = 0; i < kVec; ++i) {
        // neox: pair i is (a[i], b[i]); gptj: pair i is elements (2i, 2i + 1) of a ++ b.
        const int i1 = kNeox ? i : 2 * i;
        const int i2 = kNeox ? kVec + i : 2 * i + 1;
        const float c = row[j * kVec + i], s = row[kRot / 2 + j * kVec + i];
        z[i1] = y[i1] * c - y[i2] * s;
        z[i2] = y[i2] * c + y[i1] * s;
      }
      for (int e = 0; e < 2 * kVec; ++e) y[e] = z[e];
    }
    Vec a, b;
    for (int e = 0; e < kVec; ++e) {
      a[e] = sgljit::from_float<T>(y[e]);
      b[e] = sgljit::from_float<T>(y[kVec + e]);
    }
    a.store(x + pair_first(j));
    b.store(x + pair_second(j));
  }
}

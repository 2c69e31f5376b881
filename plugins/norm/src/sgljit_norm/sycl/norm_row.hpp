// One row of the RMSNorm family for SYCL, shared by norm.hpp and norm_quant.hpp: a work-group per row,
// the row kept in private memory (read once), NORM_VEC-wide aligned accesses, a work-group reduction.
//
// Specialized with -D macros: SGLJIT_T (element type), NORM_W (the weight's: SGLJIT_T or fp32_t), NORM_HIDDEN
// (row width), NORM_VEC (elements per access; NORM_HIDDEN % NORM_VEC == 0, rows and weight aligned to NORM_VEC
// elements), NORM_WG (work-items per row, a multiple of 16).
#pragma once

#include <sgljit/sycl/kernel.hpp>

#ifndef NORM_HIDDEN
#error "compile with -DNORM_HIDDEN=<row width>"
#endif
#ifndef NORM_VEC
#define NORM_VEC 1
#endif
#ifndef NORM_WG
#define NORM_WG 64
#endif
#ifndef NORM_W
#define NORM_W SGLJIT_T
#endif

using T = sgljit::scalar_t;
using W = sgljit::NORM_W;  // -DNORM_W=fp32_t names sgljit::fp32_t, as SGLJIT_T does

namespace sgljit_norm {

constexpr int kH = NORM_HIDDEN;
constexpr int kVec = NORM_VEC;
constexpr int kWG = NORM_WG;
static_assert(kH >= 0 && kH % kVec == 0, "NORM_HIDDEN must be a multiple of NORM_VEC");
static_assert(kWG % 16 == 0, "NORM_WG must be a multiple of the sub-group size");
constexpr int kNumVec = kH / kVec;
constexpr int kPerItem = (kNumVec + kWG - 1) / kWG;
constexpr int kSlots = kPerItem > 0 ? kPerItem : 1;  // array sizes (a row of width 0 has none)
using V = sgljit::AlignedVector<T, kVec>;
using WV = sgljit::AlignedVector<W, kVec>;

// Loads this work-item's vectors of a row into x and returns rsqrt(mean(row^2) + eps) over the
// work-group. kFused: res <- in + res (rounded to T) first, and the row is that sum; kSum: the float32
// sums (not their rounding) are the row, kept in `sums`.
template <bool kFused, bool kSum>
inline float load_row(const T* in, T* res, V (&x)[kSlots], float (&sums)[kSum ? kSlots : 1][kSum ? kVec : 1],
                      float eps) {
  const int lid = static_cast<int>(syclext::this_work_item::get_nd_item<1>().get_local_id(0));
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerItem; ++j) {
    const int c = j * kWG + lid;
    if (c < kNumVec) {
      x[j].load(in + c * kVec);
      if constexpr (kFused) {
        V r;
        r.load(res + c * kVec);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float sum = sgljit::to_float(x[j][e]) + sgljit::to_float(r[e]);
          if constexpr (kSum) sums[j][e] = sum;
          x[j][e] = sgljit::from_float<T>(sum);
        }
        x[j].store(res + c * kVec);
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float f;
        if constexpr (kSum) {
          f = sums[j][e];
        } else {
          f = sgljit::to_float(x[j][e]);
        }
        ss += f * f;
      }
    }
  }
  ss = sgljit::work_group_reduce_sum(ss);
  return sycl::rsqrt(ss / static_cast<float>(kH) + eps);
}

}  // namespace sgljit_norm

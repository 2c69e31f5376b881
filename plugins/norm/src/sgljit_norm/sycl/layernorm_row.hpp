// One row of LayerNorm for SYCL, shared by layernorm.hpp and layernorm_quant.hpp: a work-group per row,
// the row kept in private memory (read once), NORM_VEC-wide aligned accesses, two work-group reductions.
//
//   mean = sum(x) / H,  var = sum((x - mean)^2) / H          fp32, two passes over the row held
//   y    = (x - mean) * rsqrt(var + eps) * gamma + beta      fp32 (gamma, beta: NORM_W)
//
// Two passes over the held row rather than sum(x^2) - mean^2: no cancellation where |mean| >> std.
// Specialized with norm_row.hpp's -D macros (NORM_W: the type of gamma and beta).
#pragma once

#include "norm_row.hpp"

namespace sgljit_layernorm {

using namespace sgljit_norm;

// Loads this work-item's vectors of the row into x, then calls out(c, y) for each of its vectors
// (vector index c of the row, y its kVec fp32 values).
template <typename Out>
inline void layernorm_row(const T* in, const W* gamma, const W* beta, float eps, const Out& out) {
  const int lid = static_cast<int>(syclext::this_work_item::get_nd_item<1>().get_local_id(0));
  V x[kSlots];
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerItem; ++j) {
    const int c = j * kWG + lid;
    if (c < kNumVec) {
      x[j].load(in + c * kVec);
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum += sgljit::to_float(x[j][e]);
    }
  }
  const float mean = sgljit::work_group_reduce_sum(sum) / static_cast<float>(kH);
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerItem; ++j) {
    const int c = j * kWG + lid;
    if (c < kNumVec) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float d = sgljit::to_float(x[j][e]) - mean;
        ss += d * d;
      }
    }
  }
  const float rstd = sycl::rsqrt(sgljit::work_group_reduce_sum(ss) / static_cast<float>(kH) + eps);
#pragma unroll
  for (int j = 0; j < kPerItem; ++j) {
    const int c = j * kWG + lid;
    if (c < kNumVec) {
      WV g, b;
      g.load(gamma + c * kVec);
      b.load(beta + c * kVec);
      float y[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        y[e] = (sgljit::to_float(x[j][e]) - mean) * rstd * sgljit::to_float(g[e]) + sgljit::to_float(b[e]);
      }
      out(c, y);
    }
  }
}

}  // namespace sgljit_layernorm

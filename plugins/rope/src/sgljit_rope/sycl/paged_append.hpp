// The plain paged append (csrc/fp8_kv.cuh's AppendPagedKV): k [T, H, Dk] and v [T, H, Dv] copied as
// FP8KV_E (an unsigned type of the element's size) into the paged caches [P, page, H, *] at the
// entries the page table gives (a token whose entry does not resolve to a page stores nothing).
// Its own source: in one module with sycl/fp8_kv.hpp's kernel, fp16 specializations fail to load
// on the CPU device.
#pragma once

#include "page_table.hpp"

#include <sgljit/sycl/kernel.hpp>

using fp8kv_e_t = FP8KV_E;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void append_paged(const fp8kv_e_t* k, const fp8kv_e_t* v, fp8kv_e_t* k_cache, fp8kv_e_t* v_cache,
                  const int32_t* kv_indices, const int32_t* kv_indptr, const int32_t* batch_indices,
                  const int32_t* page_positions, int64_t num_tokens, int64_t heads, int64_t k_dim, int64_t v_dim,
                  int64_t k_st, int64_t k_sh, int64_t v_st, int64_t v_sh, int64_t kc_sp, int64_t kc_se, int64_t kc_sh,
                  int64_t vc_sp, int64_t vc_se, int64_t vc_sh, int64_t num_indices, int64_t batch, int64_t num_pages,
                  int64_t page_size) {
  using namespace sgljit_rope_fp8;
  const int64_t gid = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
  const int64_t item = gid / kLanes;
  const int lane = static_cast<int>(gid % kLanes);
  const int64_t t = item / (2 * heads);
  if (t >= num_tokens) return;
  const int64_t slot = item - t * 2 * heads;
  const PageTable table{kv_indices, kv_indptr, batch_indices, page_positions, num_indices, batch, num_pages, page_size};
  int64_t page, entry;
  if (!table.locate(t, page, entry)) return;
  const bool is_k = slot < heads;
  const int64_t h = is_k ? slot : slot - heads;
  const fp8kv_e_t* x = is_k ? k + t * k_st + h * k_sh : v + t * v_st + h * v_sh;
  fp8kv_e_t* y = is_k ? k_cache + page * kc_sp + entry * kc_se + h * kc_sh : v_cache + page * vc_sp + entry * vc_se + h * vc_sh;
  const int64_t n = is_k ? k_dim : v_dim;
  for (int64_t i = lane; i < n; i += kLanes) y[i] = x[i];
}

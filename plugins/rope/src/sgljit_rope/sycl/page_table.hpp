// The page table of the paged KV cache, as csrc/fp8_kv.cuh's PageTable reads it: a token whose
// entry does not resolve to a page of the cache gets none (its store is skipped). Shared by
// sycl/fp8_kv.hpp and sycl/paged_append.hpp (two sources: in one module, fp16 specializations fail
// to load on the CPU device).
#pragma once

#include <sgljit/sycl/kernel.hpp>

namespace sgljit_rope_fp8 {

constexpr int kLanes = 16;

struct PageTable {
  const int32_t* indices;
  const int32_t* indptr;
  const int32_t* batch_indices;
  const int32_t* positions;
  int64_t num_indices, batch, num_pages, page_size;

  bool locate(int64_t t, int64_t& page, int64_t& entry) const {
    const int64_t b = batch_indices[t], pos = positions[t];
    if (b < 0 || b >= batch || pos < 0) return false;
    const int64_t at = static_cast<int64_t>(indptr[b]) + pos / page_size;
    if (at < 0 || at >= static_cast<int64_t>(indptr[b + 1]) || at >= num_indices) return false;
    page = indices[at];
    if (page < 0 || page >= num_pages) return false;
    entry = pos % page_size;
    return true;
  }
};

}  // namespace sgljit_rope_fp8

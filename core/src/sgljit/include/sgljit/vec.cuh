// Aligned vectors for 16-byte (or narrower) global memory transactions.
#pragma once

#include <cstdint>
#include <cstring>

#include "utils.h"

namespace sgljit {

inline constexpr int kVecBytes = 16;

template <typename T, int N>
struct alignas(sizeof(T) * N) AlignedVector {
  static_assert((N & (N - 1)) == 0, "AlignedVector width must be a power of two");
  T data[N];

  SGLJIT_DEVICE void load(const T* ptr) { *this = *reinterpret_cast<const AlignedVector*>(ptr); }
  SGLJIT_DEVICE void store(T* ptr) const { *reinterpret_cast<AlignedVector*>(ptr) = *this; }
  // Streaming store (st.global.cs, evict-first) of a 16-byte vector: for output that this kernel
  // does not read again and that should not keep L2 lines dirty while the next kernels run.
  SGLJIT_DEVICE void store_streaming(T* ptr) const {
    static_assert(sizeof(AlignedVector) == 16, "store_streaming stores one 16-byte vector");
    uint4 r;
    memcpy(&r, data, sizeof(r));
    __stcs(reinterpret_cast<uint4*>(ptr), r);
  }
  SGLJIT_DEVICE T& operator[](int i) { return data[i]; }
  SGLJIT_DEVICE const T& operator[](int i) const { return data[i]; }
};

// Elements of T that fit in one 16-byte transaction.
template <typename T>
inline constexpr int kVecSize = kVecBytes / sizeof(T);

}  // namespace sgljit

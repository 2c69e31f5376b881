// Aligned vectors and raw words for 16-byte (or narrower) global memory transactions, the
// cache-hinted loads and stores kernels move them with, and the host's alignment test for them.
#pragma once

#include <cstdint>
#include <cstring>

#include "utils.h"

namespace sgljit {

inline constexpr int kVecBytes = 16;

// Whether `p` is a multiple of `bytes` (the host's test before it picks a kernel of wider accesses).
inline bool is_aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// The unsigned word of kBytes bytes: vectors carried as raw bits, so copies and stores are one
// register move or transaction instead of per-element byte permutes.
template <int kBytes>
struct RawBytes;
template <>
struct RawBytes<16> {
  using type = uint4;
};
template <>
struct RawBytes<8> {
  using type = uint2;
};
template <>
struct RawBytes<4> {
  using type = unsigned int;
};
template <>
struct RawBytes<2> {
  using type = unsigned short;
};
template <>
struct RawBytes<1> {
  using type = unsigned char;
};

// 16-byte load through the read-only data path (ld.global.nc): for data the kernel does not write
// before it reads it (a thread may overwrite what it has read).
template <typename V>
SGLJIT_DEVICE void load16_readonly(V& v, const void* ptr) {
  static_assert(sizeof(V) == 16, "load16_readonly moves 16 bytes");
  const uint4 r = __ldg(static_cast<const uint4*>(ptr));
  memcpy(&v, &r, sizeof(V));
}

// 16-byte load the compiler neither moves nor merges (ld.volatile.global): issued where it is written,
// e.g. before a branch that would otherwise sink a plain load below the index load it tests.
SGLJIT_DEVICE void load16_pinned(uint32_t (&r)[4], const void* ptr) {
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "l"(ptr));
}

// 16-byte store as one st.global.v4 (the compiler may split a plain store of words it got from
// load16_pinned into four).
SGLJIT_DEVICE void store16_whole(void* ptr, const uint32_t (&r)[4]) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// Stores a raw word (RawBytes): streaming (st.global.cs, evict-first) or plain. Streaming is for
// output the kernel does not read again and that should not keep L2 lines dirty while the next
// kernels run.
template <bool kStreaming, typename R>
SGLJIT_DEVICE void store_raw(void* ptr, const R& r) {
  if constexpr (kStreaming) {
    __stcs(static_cast<R*>(ptr), r);
  } else {
    *static_cast<R*>(ptr) = r;
  }
}

// Stores a 16-byte value: streaming as one uint4 (see store_raw), or plain as V itself.
template <bool kStreaming, typename V>
SGLJIT_DEVICE void store16(void* ptr, const V& v) {
  static_assert(sizeof(V) == 16, "store16 moves 16 bytes");
  if constexpr (kStreaming) {
    uint4 r;
    memcpy(&r, &v, sizeof(V));
    __stcs(static_cast<uint4*>(ptr), r);
  } else {
    *static_cast<V*>(ptr) = v;
  }
}

template <typename T, int N>
struct alignas(sizeof(T) * N) AlignedVector {
  static_assert((N & (N - 1)) == 0, "AlignedVector width must be a power of two");
  T data[N];

  SGLJIT_DEVICE void load(const T* ptr) { *this = *reinterpret_cast<const AlignedVector*>(ptr); }
  SGLJIT_DEVICE void store(T* ptr) const { *reinterpret_cast<AlignedVector*>(ptr) = *this; }
  // Streaming store of a 16-byte vector (see store_raw).
  SGLJIT_DEVICE void store_streaming(T* ptr) const { store16<true>(ptr, *this); }
  SGLJIT_DEVICE T& operator[](int i) { return data[i]; }
  SGLJIT_DEVICE const T& operator[](int i) const { return data[i]; }
};

// Elements of T that fit in one 16-byte transaction.
template <typename T>
inline constexpr int kVecSize = kVecBytes / sizeof(T);

}  // namespace sgljit

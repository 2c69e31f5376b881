// Shared by the quant_fp8 kernels: vector I/O and absmax reductions. The numerics (fp8 formats, the
// correctly rounded division x / scale as Divider, the saturating conversion, the dynamic scale)
// are core's (sgljit/fp8.cuh), used here through `using namespace sgljit`.
#pragma once

#include <cuda_fp8.h>

#include <sgljit/cuda.cuh>
#include <sgljit/fp8.cuh>
#include <sgljit/reduce.cuh>
#include <sgljit/type.cuh>
#include <sgljit/vec.cuh>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace sgljit_quant_fp8 {

using namespace sgljit;

// ------------------------------------------------------------------------------------------------
// Vector I/O: VEC elements of T in one transaction (16 bytes when VEC = 16 / sizeof(T)).

// VEC elements of T are carried as their raw bits (uint4 for 16 bytes), never as an array of 16-bit
// class objects: copying those element by element costs byte permutes that wait on the load, which
// serialized the loads in flight. Elements are read out of the 32-bit words with shifts/masks.
template <typename T, int VEC>
struct Io {
  using V = typename RawBytes<sizeof(T) * VEC>::type;
  using Out = typename RawBytes<VEC>::type;  // VEC fp8 bytes
  static constexpr int kWords = sizeof(V) >= 4 ? int(sizeof(V) / 4) : 1;

  // kStream: evict-first (data read for the last time, or data we do not want to keep in L2).
  template <bool kStream>
  SGLJIT_DEVICE static V load(const T* p) {
    if constexpr (kStream) {
      return __ldcs(reinterpret_cast<const V*>(p));
    } else {
      return *reinterpret_cast<const V*>(p);
    }
  }

  SGLJIT_DEVICE static void words(const V& v, uint32_t (&w)[kWords]) {
    if constexpr (sizeof(V) >= 4) {
      memcpy(w, &v, sizeof(V));
    } else {
      w[0] = v;
    }
  }

  // Element i (a compile-time constant after unrolling) as fp32.
  SGLJIT_DEVICE static float get(const V& v, int i) {
    if constexpr (sizeof(T) == 4) {
      uint32_t w[kWords];
      words(v, w);
      return __uint_as_float(w[i]);
    } else if constexpr (VEC == 1) {
      T t;
      memcpy(&t, &v, sizeof(T));
      return to_float(t);
    } else {
      uint32_t w[kWords];
      words(v, w);
      const uint32_t word = w[i / 2];
      if constexpr (std::is_same_v<T, bf16_t>) {
        return sgljit::bf16_of_word(word, i % 2);
      } else {
        __half2 h;
        memcpy(&h, &word, sizeof(h));
        return i % 2 ? __high2float(h) : __low2float(h);
      }
    }
  }

  // v with every 32-bit word xor-ed with `zero` (0 at run time; see token_quant).
  SGLJIT_DEVICE static V opaque(const V& v, uint32_t zero) {
    if constexpr (sizeof(V) >= 4) {
      uint32_t w[kWords];
      words(v, w);
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] ^= zero;
      V r;
      memcpy(&r, w, sizeof(V));
      return r;
    } else {
      return v;
    }
  }

  SGLJIT_DEVICE static uint32_t absmax(const V& v) {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < VEC; ++i) m = max(m, abs_bits(get(v, i)));
    return m;
  }

  template <typename Q, int kMode>
  SGLJIT_DEVICE static void quantize_store(const V& v, const Divider& div, uint8_t* dst) {
    Out raw;
    // Every output byte's sign is its input's where the quotient is bounded (finite), and the one
    // step's q1 has x's sign except where its sum cancels to +0 for a negative x. So 16-bit inputs in
    // whole output words skip the copysign per element: the sign bits of a word's four inputs,
    // gathered by one byte permute, are OR-ed into it (2 instructions per 4 elements).
    constexpr bool kSignWords = kMode == kOneStepBounded && sizeof(T) == 2 && VEC % 4 == 0;
    auto quotient = [&](int i) {
      if constexpr (kSignWords) {
        return div.one_step_unsigned(get(v, i));
      } else {
        return div.template operator()<kMode>(get(v, i));
      }
    };
    if constexpr (VEC == 1) {
      raw = to_fp8<Q>(quotient(0));
    } else {
      uint16_t pairs[VEC / 2];
#pragma unroll
      for (int i = 0; i < VEC / 2; ++i) pairs[i] = to_fp8x2<Q>(quotient(2 * i), quotient(2 * i + 1));
      memcpy(&raw, pairs, sizeof(raw));
    }
    if constexpr (kSignWords) {
      uint32_t w[kWords], o[VEC / 4];
      words(v, w);
      memcpy(o, &raw, sizeof(o));
#pragma unroll
      for (int i = 0; i < VEC / 4; ++i) o[i] |= __byte_perm(w[2 * i], w[2 * i + 1], 0x7531) & 0x80808080u;  // bytes 1, 3, 5, 7
      memcpy(&raw, o, sizeof(raw));
    }
    store_raw<true>(dst, raw);
  }
};

// Running max of |x| as fp32 bits (see abs_bits). 16-bit inputs in vectors are kept packed: clearing
// the sign bits gives |x| exactly, and max.NaN on x2 pairs (one instruction per two elements) orders
// non-negative values as the fp32 bit patterns do and turns any NaN into a NaN, so bits() equals the
// unpacked max over abs_bits(to_float(x)) up to the NaN payload (NaN either way).
template <typename T>
struct Packed2 {
  using type = void;
};
template <>
struct Packed2<fp16_t> {
  using type = __half2;
};
template <>
struct Packed2<bf16_t> {
  using type = __nv_bfloat162;
};

template <typename T, int VEC, bool kPacked = (sizeof(T) == 2 && VEC >= 2)>
struct AbsMax {
  uint32_t m = 0;
  SGLJIT_DEVICE void add(const typename Io<T, VEC>::V& v) { m = max(m, Io<T, VEC>::absmax(v)); }
  SGLJIT_DEVICE uint32_t bits() const { return m; }
};

template <typename T, int VEC>
struct AbsMax<T, VEC, true> {
  using T2 = typename Packed2<T>::type;
  T2 m;
  SGLJIT_DEVICE AbsMax() {
    const uint32_t zero = 0;
    memcpy(&m, &zero, sizeof(m));
  }
  SGLJIT_DEVICE void add(const typename Io<T, VEC>::V& v) {
    uint32_t w[VEC / 2];
    Io<T, VEC>::words(v, w);
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
      const uint32_t a = w[i] & 0x7fff7fffu;
      T2 h;
      memcpy(&h, &a, sizeof(h));
      m = __hmax2_nan(m, h);
    }
  }
  SGLJIT_DEVICE uint32_t bits() const {
    return max(abs_bits(__low2float(m)), abs_bits(__high2float(m)));
  }
};

// Block-wide max of uint32 (blockDim.x a multiple of 32, `smem` 32 words); every thread gets it.
SGLJIT_DEVICE uint32_t block_reduce_max_u32(uint32_t v, uint32_t* smem) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
  v = __reduce_max_sync(kFullMask, v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < num_warps ? smem[lane] : 0u;
  v = __reduce_max_sync(kFullMask, v);
  __syncthreads();
  return v;
}

// The dynamic scale from the absmax pass's partial maxima partial[0, n) (written by an earlier
// kernel or before a grid barrier: read through L2), block-wide; every thread gets it. kThreads: the
// block size where the kernel fixes it, else 0 (blockDim.x).
template <typename Q, int kThreads = 0>
SGLJIT_DEVICE float scale_from_partials(const uint32_t* partial, int n, uint32_t* red) {
  uint32_t m = 0;
  if constexpr (kThreads > 0) {
    for (int i = threadIdx.x; i < n; i += kThreads) m = max(m, __ldcg(partial + i));
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = max(m, __ldcg(partial + i));
  }
  return scale_from_absmax(block_reduce_max_u32(m, red), Fp8<Q>::kMax);
}

}  // namespace sgljit_quant_fp8

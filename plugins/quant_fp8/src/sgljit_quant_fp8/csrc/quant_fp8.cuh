// FP8 quantization: per-tensor (static scale, dynamic scale) and per-token (dynamic), CUDA.
//
// Every output byte is bit-identical to PyTorch's
//     (x.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)
// for the same fp32 scale tensor (true division, as torch does for a scale tensor on the device):
//   * x / scale is the correctly rounded fp32 quotient. For scales in [2^-40, 2^40] it is computed
//     from the correctly rounded reciprocal y = 1/scale by Markstein corrections (q0 = x*y,
//     q1 = q0 + (x - s*q0)*y, q2 = q1 + (x - s*q1)*y, fma residuals): fp32 inputs take both (the
//     last step is exact by Markstein's theorem), 1 mul + 4 fma instead of a full IEEE division;
//     bf16 and fp16 inputs (at most 11 significant bits) stop at q1, which for them is already the
//     correctly rounded quotient: checked exhaustively, every bf16 and fp16 significand against
//     every fp32 significand of the scale (in that range the exponents scale every step exactly;
//     tests/plugins/test_quant_fp8.py repeats it on the CPU for a sample of scales). Quotients whose
//     residuals could underflow are below 2^-60 (fp8 +-0, sign kept by copysign); |x*y| >= 2^100
//     saturates either way. Other scales (tiny, huge, <= 0, inf, NaN) use __fdiv_rn. On the H200
//     the one step made the dynamic op's quantize passes faster: 16384x4096 bf16 80.8-81.5 -> 79.0-79.4
//     us (three kernels), the fused kernel 86.1 -> 81.4 (its phase B mostly); per-token 4-11%
//     faster, the static op up to 4% (bf16, 4096 wide).
//   * clamp + round-to-nearest-even = the hardware cvt.rn.satfinite (saturation to +-max is the
//     clamp; NaN stays NaN: 0x7F, as torch's conversion of the canonical NaN the GPU produces).
// Dynamic scale = max(absmax / fp8_max, 2^-126) in fp32 (true division): an all-zero tensor gets a
// finite scale; a NaN anywhere gives a NaN scale (absmax is a max over |x| bit patterns, so NaN wins
// as in torch.amax).
//
// Every kernel starts with sgljit::pdl_wait() (before any global memory access) and then
// pdl_launch_dependents(), and is launched with programmatic dependent launch: the next kernel's
// blocks are scheduled while this one drains, so back-to-back launches (the two kernels of the
// dynamic op, consecutive ops in a CUDA graph) do not pay the launch gap. pdl_wait returns only once
// the previous kernel has completed and flushed, so the dynamic op's partial maxima need no fence.
//
// Per-tensor dynamic, inputs up to QUANT_FP8_ONE_ROW_BYTES (64 KB; "auto" only): the per-token kernel
// below on the whole tensor as one row, one launch and one memory round trip (the two-kernel path
// pays two launches: 3.2 us for 1x4096 bf16 on the H200, torch.compile 2.2, per-token 1x4096 1.9).
//
// Per-tensor dynamic, larger inputs ("two kernels"), both with persistent grids (SMs x resident blocks):
//   1. absmax: grid-stride over "slices" (one vector per thread of the grid, consecutive slices
//      adjacent in memory), QUANT_FP8_ABSMAX_UNROLL 16-byte loads in flight per thread: a read-only
//      stream, so it should run at read bandwidth. bf16/fp16 are reduced packed (|x| by masking the
//      sign bits, then max.NaN on x2 pairs: exact, NaN-propagating, 1 instruction per 2 elements).
//      Slices before the last QUANT_FP8_L2_KEEP_PCT % of L2 are loaded evict-first, the tail with
//      normal priority so it is still in L2 when the quantize pass starts; only for tensors of up to
//      QUANT_FP8_L2_KEEP_MAX_L2S times the L2 size. On the H200 keeping 45% was 5% faster for 64 MB
//      (8192x4096 bf16), 1% for 128 MB and 5% slower for 512 MB. Each block writes its
//      maximum to workspace[block]: no zeroing, no atomics, no inter-block race.
//   2. quantize: every block reduces the (few hundred) partial maxima itself, computes the scale
//      (block 0 stores it), then walks the tensor BACKWARDS (vector v -> nv - 1 - v), so the tail the
//      absmax pass read last is re-read from L2 before later misses evict it. Loads 16 bytes, stores
//      8 packed fp8 bytes per vector, evict-first both ways, QUANT_FP8_QUANT_UNROLL vectors in
//      flight; __launch_bounds__(512, 2) caps it at 64 registers so two blocks fit per SM (left
//      alone, ptxas took 80 for the Markstein division of 4 vectors at once: one block per SM).
//      (The static kernel's layout below, with the partials reduced by every block, measured
//      1-14% slower here on the H200; a block per chunk instead of a persistent grid, 8% slower;
//      with the partials reduced by every warp after its loads are issued, 1-35% slower.)
//
// Per-tensor dynamic, inputs of more than QUANT_FP8_FINALIZE_MIN_L2S times the L2 size ("three
// kernels"): the absmax pass above, a one-block kernel that reduces its partial maxima to the scale,
// then the static kernel below on chunks taken last chunk first (the absmax pass's tail is still in
// L2). On the H200:
// 65536x4096 bf16 320.3 -> 308.0 us, 16384x4096 81.9 -> 80.6; at 8192x4096 (64 MB, about the L2
// size) 1% slower, at 1024x4096 10% (the third launch). Profiled there at
// 16384x4096 (kernels serialized by the profiler): absmax 33.5 us, finalize 2.1, quantize pass 48.7,
// the last reading 111 of its 134 MB from DRAM (the kept tail hits) at 69% of DRAM peak, so the hits
// do not shorten it in proportion. Spreading the kept chunks over the pass (DRAM busy while L2
// serves them) and loading the tail evict-last instead of at normal priority: both within 1%; an
// absmax pass of a block per 64 KB chunk (hardware-balanced) instead of the persistent grid: 0.6%
// faster, noise; a quantize pass of 4 vectors a lane instead of 16: 2-5% slower.
//
// Per-tensor static: the per-token kernel's layout with the scale given: the tensor is cut into
// chunks of 32 * N vectors (N = 1, 4 or 8: the largest that still gives about
// QUANT_FP8_CHUNK_THREADS_PER_SM threads per SM), a warp per chunk holding it in registers; every
// load is issued before the scale's, so the two latencies overlap. On the H200 this measured
// 186.6 us at 65536x4096 bf16 (the persistent grid-stride pass of the dynamic op: 210.9) and
// 1.22 us at 1x4096 (1.77). N = 8 (59 registers, 8 blocks of 128 threads per SM) instead of 16
// (102, 5 blocks): 4096x4096 15.1 -> 14.4 us, 16384x4096 49.6 -> 48.9, the dynamic op's quantize
// pass at 16384x4096 79.2 -> 78.2; 65536x4096 equal. Full chunks (all but the last) are read and
// written at fixed offsets without clamps or bounds (64 registers now, still 8 blocks per SM).
// Vectors are carried as raw words (uint4), not arrays of 16-bit objects: copying those cost byte
// permutes right after each load, and the loads were then issued one at a time.
// The cooperative single-launch kernel (SGLJIT_QUANT_FP8_DYNAMIC=fused, sm_90+, 16-byte aligned;
// otherwise that mode runs two kernels): bulk copies through a ring in shared memory, a stash of
// each block's last chunks kept on chip across the grid barrier, the ring's tail kept in L2. "auto"
// takes it for bf16 from QUANT_FP8_FUSED_MIN_L2_PCT (25) % of the L2 size up to the three-kernel
// sizes: with the one-step division, on the H200, 2048x4096 12.3 us (two kernels 12.5), 4096x4096
// 20.9 (22.6), 8192x4096 40.5 (42.4); launched with PDL as well 11.1, 19.3, 39.0 (without, in the
// same runs: 11.8, 20.1, 40.0); at 1024x4096 8.6 (7.9), 16384x4096 81.4-82.5 (three kernels
// 79.2). With the full division it was 3-13% slower than auto from 1024x4096 to 65536x4096
// bf16 (16384x4096: 85.9-86.4 us vs 80.8-81.3), with 3 stages of 32 KB, its best ring (6 stages of
// 16 KB, 5 or 6 of 32 KB, 1024 threads: slower). Keeping 20% of L2 instead of 45 made 16384x4096
// 83.6 and 65536x4096 317 us (auto: 308), but 8192x4096 3% slower; 0 or 70%: slower.
// Its first forms were slower still: loads into registers, 64 KB in flight per SM (98.5 us at
// 16384x4096), and each block owning one contiguous range instead of every G-th chunk (99.2 us).
// Profiled at 16384x4096 it moves 210 MB in and 66 MB out of DRAM in 88 us (3.1 TB/s): it is held
// back by latency, not by traffic. Two blocks per SM (each half the shared memory, 16 or 32 KB
// stages) and phase B quantizing a stashed chunk after each ring chunk: equal or slower.
// Its phase timestamps (QUANT_FP8_FUSED_TRACE, benchmarks/trace_quant_fused.py) at 16384x4096: phase
// A's ring streams at about 4.4 TB/s, blocks end it 6 us apart, the barrier releases at ~38 us;
// phase B then takes ~44.5 us for 143 MB of DRAM traffic (3.2 TB/s), blocks ending up to 9 us
// apart. Phase B staggered across blocks (on-chip and DRAM chunks read at the same time): blocks
// end together, the median no sooner (equal). Phase B through registers, a warp per 8 KB piece as
// the static kernel reads: 5% slower. Phase B refilling each quantized stash chunk's shared memory
// (up to 6 copies in flight instead of 2): 0.7-3% slower, with either division.
//
// Per-token: P lanes per row (a power of two, 1..1024), each lane keeps N <= 16 vectors of its row in
// registers (N a template parameter; loads at clamped indices, unpredicated, so all N are issued
// before the first use): the row is read from global memory once, reduced (shuffles, plus shared
// memory when P > 32), and quantized from registers. The host picks the fewest lanes per row that still give about
// QUANT_FP8_TOKEN_THREADS_PER_SM threads per SM: small T spreads a row over more lanes (a single
// memory round trip, little serial work per thread), large T uses a warp per row (H = 4096 bf16:
// 16 vectors per lane, no block barrier).
//
// Tuning macros (defaults are the current choice; SGLJIT_EXTRA_CUDA_CFLAGS="-DNAME=VALUE" overrides
// them and is part of the build cache key): QUANT_FP8_ABSMAX_UNROLL, QUANT_FP8_ABSMAX_THREADS,
// QUANT_FP8_QUANT_UNROLL, QUANT_FP8_QUANT_THREADS, QUANT_FP8_QUANT_MIN_BLOCKS, QUANT_FP8_L2_KEEP_PCT,
// QUANT_FP8_TOKEN_THREADS_PER_SM, QUANT_FP8_CHUNK_THREADS_PER_SM, QUANT_FP8_FINALIZE_MIN_L2S,
// QUANT_FP8_ONE_STEP; the fused kernel's QUANT_FP8_FUSED_THREADS, _STAGES, _STAGE_BYTES, _L2_PCT,
// _PDL and _MIN_L2_PCT.
#pragma once

#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include <sgljit/bulk.cuh>
#include <sgljit/cuda.cuh>
#include <sgljit/reduce.cuh>
#include <sgljit/tensor.h>
#include <sgljit/type.cuh>
#include <sgljit/vec.cuh>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>

#ifndef QUANT_FP8_ABSMAX_UNROLL  // 16-byte loads in flight per thread in the absmax pass
#define QUANT_FP8_ABSMAX_UNROLL 8
#endif
#ifndef QUANT_FP8_ABSMAX_THREADS  // 1024: one block per SM (62 registers), so 132 partial maxima on
#define QUANT_FP8_ABSMAX_THREADS 1024  // the H200; 512 (2 blocks, 264): 16384x4096 bf16 0.6-1 us slower
#endif
#ifndef QUANT_FP8_QUANT_UNROLL  // vectors in flight per thread in the dynamic op's quantize pass
#define QUANT_FP8_QUANT_UNROLL 4
#endif
#ifndef QUANT_FP8_QUANT_THREADS
#define QUANT_FP8_QUANT_THREADS 512
#endif
#ifndef QUANT_FP8_QUANT_MIN_BLOCKS  // __launch_bounds__ minimum resident blocks (caps the registers)
#define QUANT_FP8_QUANT_MIN_BLOCKS 2
#endif
#ifndef QUANT_FP8_PREFETCH_L2  // small grids/tensors: prefetch the first loads into L2 before the PDL wait
#define QUANT_FP8_PREFETCH_L2 1
#endif
#ifndef QUANT_FP8_FUSED_MIN_L2_PCT  // dynamic (auto), bf16: the fused kernel from this % of the L2 size
#define QUANT_FP8_FUSED_MIN_L2_PCT 25
#endif
#ifndef QUANT_FP8_FINALIZE_MIN_L2S  // dynamic (auto): tensors of more than this many times the L2
#define QUANT_FP8_FINALIZE_MIN_L2S 2   // size take three kernels (absmax, finalize, static pass)
#endif
#ifndef QUANT_FP8_CHUNK_THREADS_PER_SM  // static: threads per SM the chunk-size choice aims at
#define QUANT_FP8_CHUNK_THREADS_PER_SM 512  // (1024x4096 bf16: 4 vectors a lane, 5.59 -> 5.28 us vs 1024)
#endif
#ifndef QUANT_FP8_CHUNK_MAX_N  // static: the most vectors a lane holds (16: 4% slower at 4096x4096 bf16)
#define QUANT_FP8_CHUNK_MAX_N 8
#endif
#ifndef QUANT_FP8_L2_KEEP_PCT  // the absmax pass's tail kept in L2 for the quantize pass, % of L2
#define QUANT_FP8_L2_KEEP_PCT 45
#endif
#ifndef QUANT_FP8_L2_KEEP_MAX_L2S  // ... for tensors of at most this many times the L2 size
#define QUANT_FP8_L2_KEEP_MAX_L2S 4
#endif
#ifndef QUANT_FP8_ONE_ROW_BYTES  // dynamic per-tensor (auto): inputs up to this size take one launch
#define QUANT_FP8_ONE_ROW_BYTES 65536
#endif
#ifndef QUANT_FP8_ONE_STEP  // bf16/fp16 inputs: one Markstein step (the correctly rounded quotient for them)
#define QUANT_FP8_ONE_STEP 1
#endif
#ifndef QUANT_FP8_TOKEN_THREADS_PER_SM  // per-token: threads per SM the lanes-per-row choice aims at
#define QUANT_FP8_TOKEN_THREADS_PER_SM 512
#endif

namespace sgljit_quant_fp8 {

using namespace sgljit;

// ------------------------------------------------------------------------------------------------
// Numerics

template <typename Q>
struct Fp8;
template <>
struct Fp8<fp8_e4m3_t> {
  static constexpr float kMax = 448.0f;
  static constexpr __nv_fp8_interpretation_t kKind = __NV_E4M3;
};
template <>
struct Fp8<fp8_e5m2_t> {
  static constexpr float kMax = 57344.0f;
  static constexpr __nv_fp8_interpretation_t kKind = __NV_E5M2;
};

// Smallest dynamic scale (2^-126, the smallest normal fp32): absmax / fp8_max below it (an all-zero
// or denormal-only input) is raised to it, so the scale is never 0.
inline constexpr float kMinScale = 1.17549435082228750797e-38f;

// |x| as bits: for non-negative floats the unsigned order is the numeric order, and every NaN is
// above +inf, so a max over these bits is a NaN-propagating absmax.
SGLJIT_DEVICE uint32_t abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

SGLJIT_DEVICE float scale_from_absmax(uint32_t bits, float fp8_max) {
  const float s = __fdiv_rn(__uint_as_float(bits), fp8_max);
  return s < kMinScale ? kMinScale : s;  // NaN compares false: stays NaN
}

// How Divider computes x / s: kDivide (__fdiv_rn, any scale); for fast scales, kMarkstein (two
// steps: any fp32 x) and kOneStep (one step: 16-bit x; see the top of the file), both the
// correctly rounded quotient; kOneStepBounded, kOneStep without the guard for huge quotients, NaN and
// inf, where |x / s| <= fp8_max is known (a dynamic scale from x's own absmax).
enum Quotient : int { kDivide = 0, kMarkstein = 1, kOneStep = 2, kOneStepBounded = 3 };

struct Divider {
  float s, y;
  SGLJIT_DEVICE explicit Divider(float scale) : s(scale) { y = __frcp_rn(scale); }
  SGLJIT_DEVICE static bool fast(float scale) { return scale >= 0x1p-40f && scale <= 0x1p40f; }

  // The one step's q1 before its sign is made x's (see operator() and Io::quantize_store).
  SGLJIT_DEVICE float one_step_unsigned(float x) const {
    const float q0 = __fmul_rn(x, y);
    return __fmaf_rn(__fmaf_rn(-q0, s, x), y, q0);
  }

  // x / s as kMode says (see the top of the file).
  template <int kMode>
  SGLJIT_DEVICE float operator()(float x) const {
    if constexpr (kMode == kOneStep || kMode == kOneStepBounded) {
      // (copysign: an exactly cancelling sum would be +0 for a tiny negative x)
      const float q1 = copysignf(one_step_unsigned(x), x);
      if constexpr (kMode == kOneStepBounded) {
        return q1;
      } else {
        const float q0 = __fmul_rn(x, y);
        return fabsf(q0) < 0x1p100f ? q1 : q0;  // NaN, inf, huge: q0
      }
    } else if constexpr (kMode == kMarkstein) {
      const float q0 = __fmul_rn(x, y);
      const float r0 = __fmaf_rn(-q0, s, x);
      const float q1 = __fmaf_rn(r0, y, q0);
      const float r1 = __fmaf_rn(-q1, s, x);
      const float q2 = __fmaf_rn(r1, y, q1);
      return fabsf(q0) < 0x1p100f ? copysignf(q2, x) : q0;  // NaN, inf, huge: q0
    } else {
      return __fdiv_rn(x, s);
    }
  }
};

// Two quotients -> two fp8 bytes (low byte = first), clamped and rounded to nearest even.
template <typename Q>
SGLJIT_DEVICE uint16_t to_fp8x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, Fp8<Q>::kKind);
}
template <typename Q>
SGLJIT_DEVICE uint8_t to_fp8(float a) {
  return __nv_cvt_float_to_fp8(a, __NV_SATFINITE, Fp8<Q>::kKind);
}

// ------------------------------------------------------------------------------------------------
// Vector I/O: VEC elements of T in one transaction (16 bytes when VEC = 16 / sizeof(T)).

template <int kBytes>
struct Raw;
template <>
struct Raw<16> {
  using type = uint4;
};
template <>
struct Raw<8> {
  using type = uint2;
};
template <>
struct Raw<4> {
  using type = unsigned int;
};
template <>
struct Raw<2> {
  using type = unsigned short;
};
template <>
struct Raw<1> {
  using type = unsigned char;
};

// VEC elements of T are carried as their raw bits (uint4 for 16 bytes), never as an array of 16-bit
// class objects: copying those element by element costs byte permutes that wait on the load, which
// serialized the loads in flight. Elements are read out of the 32-bit words with shifts/masks.
template <typename T, int VEC>
struct Io {
  using V = typename Raw<sizeof(T) * VEC>::type;
  using Out = typename Raw<VEC>::type;  // VEC fp8 bytes
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
      if constexpr (std::is_same_v<T, bf16_t>) {  // bf16 -> fp32 is the 16 bits on top
        return __uint_as_float(i % 2 ? (word & 0xffff0000u) : (word << 16));
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
    // gathered by one byte permute, are OR-ed into it (2 instructions per 4 elements; on the H200,
    // with the full chunks of rows_kernel: dynamic 16384x4096 bf16 78.3 -> 77.2-77.9 us, per-token
    // 0.2-1.2% faster).
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
    __stcs(reinterpret_cast<Out*>(dst), raw);
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

// The correctly rounded division for fast scales (Divider::fast) of T's inputs: one Markstein step
// for 16-bit inputs, two for fp32. kBounded: |x / s| <= fp8_max for every input (a dynamic scale).
template <typename T, bool kBounded>
inline constexpr int kFastQuotient =
    sizeof(T) == 4 || !QUANT_FP8_ONE_STEP ? kMarkstein : kBounded ? kOneStepBounded : kOneStep;

// ------------------------------------------------------------------------------------------------
// Per-tensor quantize pass (the second kernel of the dynamic op): grid-stride over
// slices of gridDim.x * blockDim.x vectors (one per thread), U slices per iteration so U loads are in
// flight per thread; the vector index is mirrored (v -> nv - 1 - v), so the pass starts at the end
// of the tensor (a warp still covers 32 adjacent vectors, in descending order).

template <typename T, typename Q, int VEC, int U, int kMode>
SGLJIT_DEVICE void quant_slices(const T* in, uint8_t* out, const Divider& div, int64_t numel) {
  using IO = Io<T, VEC>;
  const int64_t nv = numel / VEC;
  const int64_t slice = int64_t(gridDim.x) * blockDim.x;
  const int64_t base = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t num_slices = div_ceil<int64_t>(nv, slice);
  for (int64_t i = 0; i < num_slices; i += U) {
    typename IO::V x[U];
    int64_t v[U];
    bool ok[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t f = (i + k) * slice + base;  // forward order; the vector is nv - 1 - f
      ok[k] = f < nv;
      v[k] = nv - 1 - f;
      if (ok[k]) x[k] = IO::template load<true>(in + v[k] * VEC);
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      if (ok[k]) IO::template quantize_store<Q, kMode>(x[k], div, out + v[k] * VEC);
    }
  }
  const int64_t i = nv * VEC + base;  // the last numel % VEC elements
  if (i < numel) out[i] = to_fp8<Q>(div.template operator()<kMode>(to_float(in[i])));
}

// ------------------------------------------------------------------------------------------------
// Per-tensor, dynamic scale: two kernels (absmax -> partial maxima, quantize).

// partial[blockIdx.x] = max |x| bits over this block's vectors of every slice (see quant_slices) and,
// in the last block, the last numel % VEC elements. Slices starting at or after vector `keep_from`
// are loaded with normal L2 priority (kept for the quantize pass), the others evict-first.
template <typename T, int VEC>
__global__ __launch_bounds__(QUANT_FP8_ABSMAX_THREADS) void per_tensor_absmax_kernel(
    const T* __restrict__ in, uint32_t* __restrict__ partial, int64_t numel, int64_t keep_from, bool prefetch) {
  constexpr int U = QUANT_FP8_ABSMAX_UNROLL;
  using IO = Io<T, VEC>;
  const int64_t nv = numel / VEC;
  const int64_t slice = int64_t(gridDim.x) * blockDim.x;
  const int64_t base = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (prefetch) {
    // The grid is resident at once: the first round of loads starts under the previous kernel's
    // tail (see sgljit::prefetch_l2).
#pragma unroll
    for (int k = 0; k < U; ++k) {
      if (k * slice + base < nv) prefetch_l2(in + (k * slice + base) * VEC);
    }
  }
  pdl_wait();
  pdl_launch_dependents();
  __shared__ uint32_t red[32];
  const int64_t num_slices = div_ceil<int64_t>(nv, slice);
  AbsMax<T, VEC> acc;
  for (int64_t i = 0; i < num_slices; i += U) {
    typename IO::V x[U];
    bool ok[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t first = (i + k) * slice, v = first + base;
      ok[k] = v < nv;
      if (ok[k]) {
        if (first >= keep_from) {  // uniform across the grid
          x[k] = IO::template load<false>(in + v * VEC);
        } else {
          x[k] = IO::template load<true>(in + v * VEC);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      if (ok[k]) acc.add(x[k]);
    }
  }
  uint32_t m = acc.bits();
  if (blockIdx.x == gridDim.x - 1) {
    for (int64_t i = nv * VEC + threadIdx.x; i < numel; i += blockDim.x) m = max(m, abs_bits(to_float(in[i])));
  }
  m = block_reduce_max_u32(m, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

// Reduces partial[0, num_partial) (written by the absmax kernel just before: pdl_wait orders it),
// stores the scale (block 0) and quantizes, from the end of the tensor backwards.
template <typename T, typename Q, int VEC>
__global__ __launch_bounds__(QUANT_FP8_QUANT_THREADS, QUANT_FP8_QUANT_MIN_BLOCKS) void per_tensor_dynamic_quant_kernel(
    const T* __restrict__ in, uint8_t* __restrict__ out, float* __restrict__ scale,
    const uint32_t* __restrict__ partial, int num_partial, int64_t numel) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ uint32_t red[32];
  const float s = scale_from_partials<Q>(partial, num_partial, red);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
  const Divider div(s);
  if (Divider::fast(s)) {
    quant_slices<T, Q, VEC, QUANT_FP8_QUANT_UNROLL, kFastQuotient<T, true>>(in, out, div, numel);
  } else {
    quant_slices<T, Q, VEC, QUANT_FP8_QUANT_UNROLL, kDivide>(in, out, div, numel);
  }
}

// ------------------------------------------------------------------------------------------------
// Per-tensor, dynamic scale, cooperative single launch with bulk copies (sm_90+; "fused").
//
// The tensor is cut into chunks of QUANT_FP8_FUSED_STAGE_BYTES; block b (one per SM) owns chunks
// b, b + G, b + 2G, ... (interleaved, so the grid reads one window of memory at a time, as a
// grid-stride loop does). Phase A reads each owned chunk once: the last `stash_chunks` into a stash
// in shared memory (kept there for phase B), the others through a ring of QUANT_FP8_FUSED_STAGES
// bulk copies (the last `l2_chunks` of them evict-last, so they are still in L2 for phase B),
// reducing the absmax. The block's max goes to workspace[block]; a grid barrier; every block reduces
// the maxima to the scale. Phase B quantizes the stash, then re-reads the ring's chunks in reverse
// order (the L2-kept ones first). The ring's copies run ahead across the barrier: the first chunks of
// phase B are in flight while the grid waits. Stash and L2 hold what DRAM would otherwise send twice.

#ifndef QUANT_FP8_FUSED_THREADS
#define QUANT_FP8_FUSED_THREADS 512
#endif
#ifndef QUANT_FP8_FUSED_STAGES
#define QUANT_FP8_FUSED_STAGES 3
#endif
#ifndef QUANT_FP8_FUSED_STAGE_BYTES
#define QUANT_FP8_FUSED_STAGE_BYTES 32768
#endif
#ifndef QUANT_FP8_FUSED_L2_PCT  // % of L2 phase A reads evict-last (re-read first by phase B)
#define QUANT_FP8_FUSED_L2_PCT 45
#endif
#ifndef QUANT_FP8_FUSED_PDL  // launch the cooperative kernel with PDL too (H200: 2048-8192x4096 bf16
#define QUANT_FP8_FUSED_PDL 1  // 2.6-6% faster)
#endif
// Diagnostics only (never on by default: it overwrites the output): each block records %globaltimer
// at its phase boundaries and, after a last grid barrier, writes the 8 stamps as u64 over the
// output's bytes [64 * block, 64 * block + 64). benchmarks/trace_quant_fused.py reads them.
#ifndef QUANT_FP8_FUSED_TRACE
#define QUANT_FP8_FUSED_TRACE 0
#endif

SGLJIT_DEVICE uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

inline constexpr int kFusedThreads = QUANT_FP8_FUSED_THREADS;
inline constexpr int kFusedStages = QUANT_FP8_FUSED_STAGES;
inline constexpr int kFusedChunkVecs = QUANT_FP8_FUSED_STAGE_BYTES / 16;  // 16-byte vectors
static_assert(kFusedChunkVecs % kFusedThreads == 0, "a chunk must hold whole vectors per thread");

// Calls f(vector index in the chunk) for this thread's vectors of a chunk of n vectors.
template <typename F>
SGLJIT_DEVICE void for_chunk(int n, F&& f) {
#pragma unroll
  for (int k = 0; k < kFusedChunkVecs / kFusedThreads; ++k) {
    const int i = threadIdx.x + k * kFusedThreads;
    if (i < n) f(i);
  }
}

// Launched cooperatively with kFusedThreads threads; dynamic shared memory: stash_chunks chunks, then
// the ring (QUANT_FP8_FUSED_STAGES chunks) if some block owns more chunks than that. Input and output
// 16-byte aligned (the host checks).
template <typename T, typename Q>
__global__ __launch_bounds__(kFusedThreads, 1) void per_tensor_fused_kernel(
    const T* __restrict__ in, uint8_t* __restrict__ out, float* __restrict__ scale,
    uint32_t* __restrict__ workspace, int64_t numel, int stash_chunks, int l2_chunks) {
  constexpr int VEC = kVecSize<T>;
  constexpr int S = kFusedStages, CV = kFusedChunkVecs;
  using IO = Io<T, VEC>;
  static_assert(sizeof(typename IO::V) == 16, "the fused kernel moves 16-byte vectors");
  extern __shared__ uint4 dyn_smem[];
  __shared__ uint64_t full[S];
  __shared__ uint64_t stash_full;
  __shared__ uint32_t red[32];
  uint4* const stash = dyn_smem;
  uint4* const ring = dyn_smem + int64_t(stash_chunks) * CV;

  const int64_t nv = numel / VEC, num_chunks = div_ceil<int64_t>(nv, CV);
  const int G = gridDim.x, b = blockIdx.x, tid = threadIdx.x;
  const bool last_block = b == G - 1;
  // This block's i-th chunk is chunk b + i * G of the tensor: vectors [first(i), first(i) + size(i)).
  const int owned = b < num_chunks ? int((num_chunks - 1 - b) / G + 1) : 0;
  const int stashed = min(stash_chunks, owned), num_a = owned - stashed;
  auto first = [&](int i) { return (b + int64_t(i) * G) * CV; };
  auto size = [&](int i) { return int(min(int64_t(CV), nv - first(i))); };
  // The ring's g-th copy: owned chunk g (phase A, forward), then 2 * num_a - 1 - g (phase B, backward).
  auto chunk_of = [&](int g) { return g < num_a ? g : 2 * num_a - 1 - g; };
  auto issue = [&](int g) {  // thread 0 only
    const int i = chunk_of(g);
    const uint32_t bytes = uint32_t(size(i)) * 16u;
    const bool keep_in_l2 = g < num_a && i >= num_a - l2_chunks;
    mbarrier_expect_tx(&full[g % S], bytes);
    bulk_copy_g2s(ring + (g % S) * CV, in + first(i) * VEC, bytes, &full[g % S],
                  keep_in_l2 ? l2_evict_last() : l2_evict_first());
  };
  // Ring copy g: wait for its stage, hand it to f(stage, owned chunk index), then refill the stage
  // with copy g + S once every thread is done with it.
  auto ring_step = [&](int g, auto&& f) {
    mbarrier_wait(&full[g % S], uint32_t(g / S) & 1u);
    f(ring + (g % S) * CV, chunk_of(g));
    __syncthreads();
    if (tid == 0 && g + S < 2 * num_a) issue(g + S);
  };

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) mbarrier_init(&full[s], 1);
    mbarrier_init(&stash_full, 1);
    mbarrier_fence_init();
  }
  __syncthreads();
  uint64_t trace[8] = {};
  auto mark = [&](int i) {
    if constexpr (QUANT_FP8_FUSED_TRACE) trace[i] = global_ns();
  };
  mark(0);
  pdl_wait();
  pdl_launch_dependents();
  if (tid == 0) {
    if (stashed > 0) {
      uint32_t bytes = 0;
      for (int r = 0; r < stashed; ++r) bytes += uint32_t(size(num_a + r)) * 16u;
      mbarrier_expect_tx(&stash_full, bytes);
      for (int r = 0; r < stashed; ++r) {
        bulk_copy_g2s(stash + r * CV, in + first(num_a + r) * VEC, uint32_t(size(num_a + r)) * 16u, &stash_full,
                      l2_evict_first());
      }
    }
    for (int g = 0; g < min(S, 2 * num_a); ++g) issue(g);
  }

  // Phase A: absmax.
  AbsMax<T, VEC> acc;
  for (int g = 0; g < num_a; ++g) {
    ring_step(g, [&](const uint4* src, int i) { for_chunk(size(i), [&](int v) { acc.add(src[v]); }); });
    if (g == 0) mark(1);
  }
  mark(2);
  if (stashed > 0) {
    mbarrier_wait(&stash_full, 0);
    for (int r = 0; r < stashed; ++r) {
      for_chunk(size(num_a + r), [&](int i) { acc.add(stash[r * CV + i]); });
    }
  }
  uint32_t m = acc.bits();
  if (last_block) {
    for (int64_t i = nv * VEC + tid; i < numel; i += kFusedThreads) m = max(m, abs_bits(to_float(in[i])));
  }
  m = block_reduce_max_u32(m, red);
  if (tid == 0) workspace[b] = m;
  mark(3);
  cooperative_groups::this_grid().sync();  // also orders the workspace writes before the reads
  mark(4);

  const float s = scale_from_partials<Q, kFusedThreads>(workspace, G, red);
  if (b == 0 && tid == 0) *scale = s;
  const Divider div(s);

  // Phase B: quantize.
  auto phase_b = [&](auto mode) {
    constexpr int kMode = decltype(mode)::value;
    auto quantize = [&](const uint4* src, int i) {
      uint8_t* dst = out + first(i) * VEC;
      for_chunk(size(i), [&](int v) { IO::template quantize_store<Q, kMode>(src[v], div, dst + v * VEC); });
    };
    for (int r = 0; r < stashed; ++r) quantize(stash + r * CV, num_a + r);
    mark(5);
    for (int g = num_a; g < 2 * num_a; ++g) {
      ring_step(g, quantize);
      if (g == num_a + l2_chunks - 1) mark(6);
    }
    if (last_block) {
      for (int64_t i = nv * VEC + tid; i < numel; i += kFusedThreads) {
        out[i] = to_fp8<Q>(div.template operator()<kMode>(to_float(in[i])));
      }
    }
  };
  if (Divider::fast(s)) {
    phase_b(std::integral_constant<int, kFastQuotient<T, true>>{});
  } else {
    phase_b(std::integral_constant<int, kDivide>{});
  }
  if constexpr (QUANT_FP8_FUSED_TRACE) {
    mark(7);
    cooperative_groups::this_grid().sync();
    if (tid == 0) {
      for (int i = 0; i < 8; ++i) reinterpret_cast<uint64_t*>(out)[b * 8 + i] = trace[i];
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Per-token: P lanes per row (a power of two, 1..1024; rows of one block side by side), each lane
// holding its vectors j = lane + k * P, k < N, in registers (N = 1..16; a row longer than P * N
// vectors re-reads the remainder), max over the row's lanes, scale, quantize from registers.

inline constexpr int kTokenMaxVecs = 16;
inline constexpr int kChunkMaxN = QUANT_FP8_CHUNK_MAX_N;  // per-tensor chunks: 32 * N vectors, N in 1, 4, this
static_assert(kChunkMaxN > 4 && kChunkMaxN <= kTokenMaxVecs, "QUANT_FP8_CHUNK_MAX_N: above 4, at most 16");

// N = 16 needs 64 registers of data per thread (bf16/fp16/fp32 alike): at most 512 threads a block.
template <int N>
inline constexpr int kTokenMaxThreads = N >= 16 ? 512 : 1024;

// `zero` is 0, but the compiler cannot know it (the row max's sign bit): x[k] ^ zero keeps the
// conversions of x to fp32 after the row reduction, so they are not all hoisted next to the loads
// (N * VEC live floats: spills or a register-starved occupancy).
template <typename T, typename Q, int VEC, int N, int kMode>
SGLJIT_DEVICE void token_quant(const typename Io<T, VEC>::V (&x)[N], const T* row_in, uint8_t* row_out, int nvr,
                               int lane, int P, const Divider& div, uint32_t zero) {
  using IO = Io<T, VEC>;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const int j = lane + k * P;
    if (j < nvr) IO::template quantize_store<Q, kMode>(IO::opaque(x[k], zero), div, row_out + j * VEC);
  }
  for (int j = lane + N * P; j < nvr; j += P) {
    IO::template quantize_store<Q, kMode>(IO::template load<true>(row_in + j * VEC), div, row_out + j * VEC);
  }
}

// Scales outside Divider::fast (practically never: absmax beyond 2^48 or below 2^-31) re-read the
// row (from L2) instead of sharing the registers: otherwise the compiler hoists the conversions of
// all N vectors out of both paths and spills.
template <typename T, typename Q, int VEC>
SGLJIT_DEVICE void token_quant_slow(const T* row_in, uint8_t* row_out, int nvr, int lane, int P,
                                              const Divider div) {
  using IO = Io<T, VEC>;
  for (int j = lane; j < nvr; j += P) {
    IO::template quantize_store<Q, kDivide>(IO::template load<false>(row_in + j * VEC), div, row_out + j * VEC);
  }
}

// Three kernels (see the top of this file): one block reduces the absmax kernel's partial maxima to
// the scale, so the quantize pass can be the static kernel below (walking backwards) instead of a
// pass whose every block reduces the partials itself.
inline constexpr int kFinalizeThreads = 256;
template <typename Q>
__global__ __launch_bounds__(kFinalizeThreads) void per_tensor_finalize_kernel(const uint32_t* __restrict__ partial,
                                                                               int num_partial, float* __restrict__ scale) {
  // Trigger first: the quantize pass's blocks take SMs as the absmax pass drains and wait there
  // (their pdl_wait returns once this kernel is done) instead of launching after this one's wait.
  // On the H200 0.1-0.4% faster at 16384x4096 and 65536x4096, within noise.
  pdl_launch_dependents();
  pdl_wait();
  __shared__ uint32_t red[32];
  const float s = scale_from_partials<Q>(partial, num_partial, red);
  if (threadIdx.x == 0) *scale = s;
}

// Where a rows kernel's scale comes from.
enum class ScaleFrom {
  kRowMax,    // per-token: each row's own absmax, stored to scales[row]
  kGiven,     // per-tensor static: scales[0], for rows that are chunks of the tensor
  kGivenBackwards,  // the same, last row first (after an absmax pass: its tail is still in L2)
};

template <typename T>
struct RowsArgs {
  const T* in;
  int64_t in_stride;
  uint8_t* out;
  int64_t out_stride;
  float* scales;
  int64_t num_rows;
  int64_t hidden;       // elements of every row but the last
  int64_t last_hidden;  // elements of the last row (per-tensor: the rest of the tensor)
  int P;  // lanes per row
  bool prefetch;  // prefetch the row's first loads into L2 before the PDL wait
};

template <typename T, typename Q, int VEC, int N, ScaleFrom kFrom>
__global__ __launch_bounds__(kTokenMaxThreads<N>) void rows_kernel(const RowsArgs<T> a) {
  using IO = Io<T, VEC>;
  __shared__ uint32_t red[32];
  constexpr bool kChunks = kFrom != ScaleFrom::kRowMax;  // per-tensor: rows of 32 * N vectors, a warp each
  const int P = kChunks ? 32 : a.P;
  const int rows_per_block = blockDim.x / P;
  const int lane = threadIdx.x & (P - 1);
  const int64_t index = int64_t(blockIdx.x) * rows_per_block + threadIdx.x / P;
  const bool valid = index < a.num_rows;
  // Out-of-range lanes and rows load clamped indices (the last vector of the row, the last row):
  // duplicates do not change a max and are not stored, and unpredicated loads are all issued before
  // the first use (guarded ones were interleaved with the max and waited for each other).
  const int64_t clamped = min(index, a.num_rows - 1);
  const int64_t row = kFrom == ScaleFrom::kGivenBackwards ? a.num_rows - 1 - clamped : clamped;
  const int64_t row_len = row == a.num_rows - 1 ? a.last_hidden : a.hidden;
  const int nvr = int(row_len / VEC);  // rows are < 2^31 elements (checked on the host)
  const T* row_in = a.in + row * a.in_stride;
  if (a.prefetch && nvr > 0) {  // (see sgljit::prefetch_l2)
    if constexpr (sizeof(T) * VEC == 16) {
      // The row's first N * P vectors as one bulk request from its first lane: per-token 128x4096
      // 2.17 -> 2.08 us on the H200, one-row dynamic 1x4096 1.50 -> 1.43. (For the absmax pass's
      // slices, 8 KB per block, bulk requests were 2-3% slower.)
      if (lane == 0) prefetch_l2_bulk(row_in, uint32_t(min(N * P, nvr)) * 16);
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) prefetch_l2(row_in + min(lane + k * P, nvr - 1) * VEC);
    }
  }
  pdl_wait();
  pdl_launch_dependents();

  // Every chunk but the last is full: its loads and stores at fixed offsets, without clamps or
  // bounds (about a quarter of the quantize pass's instructions; static 2048x4096 bf16 8.35 -> 7.80 us
  // on the H200).
  const bool full = kChunks && nvr == 32 * N;
  typename IO::V x[N];
  if (full) {
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = IO::template load<true>(row_in + (lane + k * 32) * VEC);
  } else if (nvr > 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = IO::template load<true>(row_in + min(lane + k * P, nvr - 1) * VEC);
  }

  uint32_t m = 0;
  float s;
  if constexpr (kFrom == ScaleFrom::kRowMax) {
    AbsMax<T, VEC> acc;
    if (nvr > 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) acc.add(x[k]);
      for (int j = lane + N * P; j < nvr; j += P) {
        acc.add(IO::template load<false>(row_in + j * VEC));  // re-read below: keep in L2
      }
    }
    for (int64_t e = int64_t(nvr) * VEC + lane; e < row_len; e += P) m = max(m, abs_bits(to_float(row_in[e])));
    m = max(m, acc.bits());
    // Lanes of a row are P consecutive threads, P-aligned: a warp holds whole rows (P <= 32) or a
    // row holds whole warps (P > 32).
    if (P >= 32) {
      m = __reduce_max_sync(kFullMask, m);
    } else {
      for (int off = P / 2; off > 0; off /= 2) m = max(m, __shfl_xor_sync(kFullMask, m, off));
    }
    if (P > 32) {
      const int warps_per_row = P / 32, first = (threadIdx.x / P) * warps_per_row;
      if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
      __syncthreads();
      m = 0;
      for (int w = 0; w < warps_per_row; ++w) m = max(m, red[first + w]);
    }
    s = scale_from_absmax(m, Fp8<Q>::kMax);
    if (valid && lane == 0) a.scales[row] = s;
  } else {  // kGiven, kGivenBackwards
    // The row's loads are already in flight: the scale's latency overlaps them.
    s = __ldcg(a.scales);  // L2: may have been written by the kernel just before (PDL)
  }
  if (!valid) return;

  const Divider div(s);
  uint8_t* row_out = a.out + row * a.out_stride;
  if (Divider::fast(s)) {
    // (a scale computed from these rows' own absmax bounds every quotient by fp8_max)
    constexpr int kMode = kFastQuotient<T, kFrom != ScaleFrom::kGiven>;
    if (full) {
      uint8_t* const dst = row_out + lane * VEC;
#pragma unroll
      for (int k = 0; k < N; ++k) IO::template quantize_store<Q, kMode>(x[k], div, dst + k * 32 * VEC);
      return;
    }
    token_quant<T, Q, VEC, N, kMode>(x, row_in, row_out, nvr, lane, P, div, m >> 31);
  } else {
    token_quant_slow<T, Q, VEC>(row_in, row_out, nvr, lane, P, div);
  }
  for (int64_t e = int64_t(nvr) * VEC + lane; e < row_len; e += P) {  // fewer than VEC elements
    row_out[e] = to_fp8<Q>(div.template operator()<kDivide>(to_float(row_in[e])));
  }
}

// ------------------------------------------------------------------------------------------------
// Host side

inline int l2_bytes(int device_id) { return device_attribute(device_id, cudaDevAttrL2CacheSize); }

inline void check_dtype(const TensorView& t, const char* name, DLDataType want) {
  SGLJIT_CHECK(same_dtype(t.dtype(), want), name, ": dtype expected ", dtype_name(want), ", got ",
               dtype_name(t.dtype()));
}

inline void check_device(const TensorView& t, const char* name, DLDevice want) {
  SGLJIT_CHECK(t.device().device_type == kDLCUDA, name, ": expected a tensor on cuda, got one on ",
               device_name(t.device()));
  SGLJIT_CHECK(t.device().device_id == want.device_id, name, ": expected a tensor on ",
               device_name(want), " (same as input), got one on ", device_name(t.device()));
}

inline bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Persistent grid for `kKernel`: at most SMs x resident blocks (and `cap`), at least one block, and
// no more blocks than one vector per thread needs.
template <auto kKernel, int kThreads>
int64_t persistent_grid(int device_id, int64_t nv, int64_t cap) {
  const int64_t full = int64_t(num_sms(device_id)) * resident_blocks<kKernel>(device_id, kThreads);
  return std::clamp<int64_t>(div_ceil<int64_t>(nv, kThreads), 1, std::min(full, cap));
}

template <typename T, typename Q>
struct QuantFp8 {
  static constexpr int kVec = kVecSize<T>;  // 16 bytes of input

  // input (contiguous, any shape) and out (contiguous, same numel); checks and returns numel.
  static int64_t check_pair(const TensorView& input, const TensorView& out, DLDevice& dev) {
    check_dtype(input, "input", DTypeTrait<T>::value);
    check_dtype(out, "out", DTypeTrait<Q>::value);
    dev = input.device();
    check_device(input, "input", dev);
    check_device(out, "out", dev);
    RuntimeCheck(input.IsContiguous(), "input: expected a contiguous tensor");
    RuntimeCheck(out.IsContiguous(), "out: expected a contiguous tensor");
    RuntimeCheck(out.numel() == input.numel(), "out: expected ", input.numel(), " elements (as input), got ",
                 out.numel());
    return input.numel();
  }

  static void check_scale(const TensorView& scale, const char* name, DLDevice dev) {
    check_dtype(scale, name, DTypeTrait<float>::value);
    check_device(scale, name, dev);
    RuntimeCheck(scale.numel() == 1, name, ": expected one element, got ", scale.numel());
  }

  // out = quantize(input / scale[0]).
  static void per_tensor_static(TensorView input, TensorView scale, TensorView out) {
    DLDevice dev;
    const int64_t numel = check_pair(input, out, dev);
    check_scale(scale, "scale", dev);
    if (numel == 0) return;
    const T* x = static_cast<const T*>(input.data_ptr());
    uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
    const float* s = static_cast<const float*>(scale.data_ptr());
    float* sm = const_cast<float*>(s);  // only read (ScaleFrom::kGiven)
    if (aligned(x, sizeof(T) * kVec) && aligned(o, kVec)) {
      per_tensor_rows<kVec>(x, o, sm, numel, dev);
    } else {
      per_tensor_rows<1>(x, o, sm, numel, dev);
    }
  }

  // out = quantize(input / s), scale[0] = s = max(absmax(input) / fp8_max, 2^-126).
  // workspace: float32, one element per block (the grid is capped by its size; its content does not
  // matter: it is overwritten).
  // algo: 0 = auto (one row of the per-token kernel up to QUANT_FP8_ONE_ROW_BYTES, three kernels
  // beyond QUANT_FP8_FINALIZE_MIN_L2S times the L2 size, for bf16 the fused kernel from
  // QUANT_FP8_FUSED_MIN_L2_PCT % of the L2 size up to there, else two kernels), 1 = the fused
  // cooperative kernel (two kernels where it cannot run: see fused_available), 2 = two kernels,
  // 3 = three kernels.
  static void per_tensor_dynamic(TensorView input, TensorView out, TensorView scale, TensorView workspace,
                                 int64_t algo) {
    DLDevice dev;
    const int64_t numel = check_pair(input, out, dev);
    check_scale(scale, "scale", dev);
    check_dtype(workspace, "workspace", DTypeTrait<float>::value);
    check_device(workspace, "workspace", dev);
    RuntimeCheck(workspace.IsContiguous() && workspace.numel() > 0,
                 "workspace: expected a non-empty contiguous tensor");
    RuntimeCheck(algo >= 0 && algo <= 3, "algo: expected 0 (auto), 1 (fused), 2 (two kernels) or 3 (three kernels), got ",
                 algo);
    const T* x = static_cast<const T*>(input.data_ptr());
    uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
    // (An empty input takes this path too and gets the scale of an all-zero tensor, 2^-126.)
    if (algo == 0 && numel * int64_t(sizeof(T)) <= QUANT_FP8_ONE_ROW_BYTES) {
      // Small tensors (a decode step's activations): the per-token kernel on the tensor as one row
      // computes the same absmax, scale and values in one launch instead of two (the absmax pass and
      // the quantize pass each cost a launch and a memory round trip).
      float* s = static_cast<float*>(scale.data_ptr());
      if (numel % kVec == 0 && aligned(x, sizeof(T) * kVec) && aligned(o, kVec)) {
        token_launch<kVec>(x, 0, o, 0, s, 1, numel, dev);
      } else {
        token_launch<1>(x, 0, o, 0, s, 1, numel, dev);
      }
      return;
    }
    if (aligned(x, sizeof(T) * kVec) && aligned(o, kVec)) {
      dynamic_launch<kVec>(x, o, scale, workspace, numel, algo, dev);
    } else {
      dynamic_launch<1>(x, o, scale, workspace, numel, algo, dev);
    }
  }

  template <int VEC>
  static void dynamic_launch(const T* x, uint8_t* o, TensorView scale, TensorView workspace, int64_t numel,
                             int64_t algo, DLDevice dev) {
    constexpr int64_t kVecBytesHere = sizeof(T) * VEC;
    float* s = static_cast<float*>(scale.data_ptr());
    uint32_t* ws = static_cast<uint32_t*>(workspace.data_ptr());
    const int64_t nv = numel / VEC;
    const int64_t l2 = l2_bytes(dev.device_id), bytes = numel * int64_t(sizeof(T));
    // auto: bf16 (measured with the one step) from QUANT_FP8_FUSED_MIN_L2_PCT % of the L2 size up
    // to the three-kernel sizes
    const bool fused_auto = std::is_same_v<T, bf16_t> && QUANT_FP8_ONE_STEP && algo == 0 &&
                            bytes > l2 * QUANT_FP8_FUSED_MIN_L2_PCT / 100 && bytes <= l2 * QUANT_FP8_FINALIZE_MIN_L2S;
    if ((algo == 1 || fused_auto) && fused_available<VEC>(x, o, dev.device_id)) {
      fused_launch(x, o, s, ws, workspace.numel(), numel, dev);
      return;
    }
    // Two or three kernels (auto, algo 2 and 3). For tensors up to QUANT_FP8_L2_KEEP_MAX_L2S times
    // L2, the absmax pass reads the last QUANT_FP8_L2_KEEP_PCT % of L2 with normal priority; the
    // quantize pass re-reads that tail first.
    constexpr auto absmax = per_tensor_absmax_kernel<T, VEC>;
    constexpr auto quant = per_tensor_dynamic_quant_kernel<T, Q, VEC>;
    constexpr int kAbsThreads = QUANT_FP8_ABSMAX_THREADS, kQuantThreads = QUANT_FP8_QUANT_THREADS;
    const int64_t grid_a = persistent_grid<absmax, kAbsThreads>(dev.device_id, nv, workspace.numel());
    const int64_t keep_from =
        bytes <= l2 * QUANT_FP8_L2_KEEP_MAX_L2S ? nv - l2 * QUANT_FP8_L2_KEEP_PCT / 100 / kVecBytesHere : nv;
    // The prefetch measured 7.5% faster for 8 MB (1024x4096 bf16), 1-4% slower from 128 MB.
    const bool prefetch = QUANT_FP8_PREFETCH_L2 && bytes <= l2 / 2;
    const bool three = algo == 3 || (algo == 0 && bytes > l2 * QUANT_FP8_FINALIZE_MIN_L2S);
    LaunchKernel(absmax, dim3(grid_a), dim3(kAbsThreads), 0, dev, "per_tensor_quant_fp8 (absmax)")
        .pdl()(x, ws, numel, keep_from, prefetch);
    if (three) {
      LaunchKernel(per_tensor_finalize_kernel<Q>, dim3(1), dim3(kFinalizeThreads), 0, dev,
                   "per_tensor_quant_fp8 (finalize)")
          .pdl()(static_cast<const uint32_t*>(ws), int(grid_a), s);
      per_tensor_rows<VEC, ScaleFrom::kGivenBackwards>(x, o, s, numel, dev);
    } else {
      const int64_t grid_q = persistent_grid<quant, kQuantThreads>(dev.device_id, nv, INT32_MAX);
      LaunchKernel(quant, dim3(grid_q), dim3(kQuantThreads), 0, dev, "per_tensor_quant_fp8 (quantize)")
          .pdl()(x, o, s, ws, int(grid_a), numel);
    }
  }

  // Whether the fused kernel can run: 16-byte vectors (aligned input and output), bulk copies
  // (sm_90+) and cooperative launch.
  template <int VEC>
  static bool fused_available(const T* x, const uint8_t* o, int device_id) {
    return VEC == kVec && aligned(x, 16) && aligned(o, kVec) &&
           device_attribute(device_id, cudaDevAttrComputeCapabilityMajor) >= 9 &&
           device_attribute(device_id, cudaDevAttrCooperativeLaunch) != 0;
  }

  static void fused_launch(const T* x, uint8_t* o, float* s, uint32_t* ws, int64_t ws_size, int64_t numel,
                           DLDevice dev) {
    constexpr auto kernel = per_tensor_fused_kernel<T, Q>;
    constexpr int64_t kChunkBytes = int64_t(kFusedChunkVecs) * 16;
    const int64_t num_chunks = div_ceil<int64_t>(numel / kVec, kFusedChunkVecs);
    // One block per SM with as much dynamic shared memory as it may have (less the static part).
    const int64_t smem_chunks = fused_smem_cap(dev.device_id) / kChunkBytes;
    const int64_t grid = std::clamp<int64_t>(num_chunks, 1, std::min<int64_t>(num_sms(dev.device_id), ws_size));
    const int64_t owned = div_ceil<int64_t>(num_chunks, grid);  // the most chunks a block owns
    // All owned chunks in the stash when they fit; else the stash takes what the ring leaves.
    const bool ring = owned > smem_chunks;
    const int64_t stash_chunks = ring ? std::max<int64_t>(0, smem_chunks - kFusedStages) : owned;
    const int64_t smem = (stash_chunks + (ring ? kFusedStages : 0)) * kChunkBytes;
    RuntimeCheck(!ring || smem_chunks >= kFusedStages, "per_tensor_quant_fp8: not enough shared memory for the fused kernel");
    const int64_t l2_chunks = int64_t(l2_bytes(dev.device_id)) * QUANT_FP8_FUSED_L2_PCT / 100 / grid / kChunkBytes;
    LaunchKernel(kernel, dim3(grid), dim3(kFusedThreads), size_t(smem), dev, "per_tensor_quant_fp8 (dynamic, fused)")
        .cooperative()
        .pdl(QUANT_FP8_FUSED_PDL)(x, o, s, ws, numel, int(stash_chunks), int(l2_chunks));
  }

  // The fused kernel's dynamic shared memory limit on `device_id` (the opt-in maximum less its static
  // shared memory), allowed for the kernel once per device (under a lock; read without one after).
  static int fused_smem_cap(int device_id) {
    static std::atomic<int> cache[64];
    RuntimeCheck(device_id >= 0 && device_id < 64, "device id out of range: ", device_id);
    std::atomic<int>& slot = cache[device_id];
    if (const int cap = slot.load(std::memory_order_acquire); cap != 0) return cap;
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    if (slot.load(std::memory_order_relaxed) == 0) {
      constexpr auto kernel = per_tensor_fused_kernel<T, Q>;
      cudaFuncAttributes attrs{};
      check_cuda(cudaFuncGetAttributes(&attrs, kernel), "cudaFuncGetAttributes");
      const int cap = device_attribute(device_id, cudaDevAttrMaxSharedMemoryPerBlockOptin) - int(attrs.sharedSizeBytes);
      check_cuda(on_device(device_id,
                           [&] { return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, cap); }),
                 "cudaFuncSetAttribute");
      slot.store(cap, std::memory_order_release);
    }
    return slot.load(std::memory_order_relaxed);
  }

  // out[t, :] = quantize(input[t, :] / scales[t]), scales[t] = max(absmax(input[t, :]) / fp8_max, 2^-126).
  // input [T, H] with unit stride along H (any row stride), out [T, H] likewise, scales [T, 1] fp32.
  static void per_token(TensorView input, TensorView out, TensorView scales) {
    SymbolicSize T_{"num_tokens"}, H{"hidden"}, S{"input_row_stride"}, So{"out_row_stride"};
    SymbolicDevice dev;
    TensorMatcher({T_, H}).with_strides({S, 1}).with_dtype<T>().with_device(kDLCUDA, dev).verify(input, "input");
    TensorMatcher({T_, H}).with_strides({So, 1}).with_dtype<Q>().with_device(kDLCUDA, dev).verify(out, "out");
    TensorMatcher({T_, 1}).with_strides({1, 1}).with_dtype<float>().with_device(kDLCUDA, dev).verify(scales, "scales");
    const int64_t rows = T_.value(), hidden = H.value();
    if (rows == 0) return;
    RuntimeCheck(hidden < (int64_t(1) << 31), "input: rows longer than 2^31 - 1 elements are not supported");
    // Strides of size-1 dimensions are not bound by the matcher: take them from the tensors.
    const int64_t in_stride = input.stride(0), out_stride = out.stride(0);
    const T* x = static_cast<const T*>(input.data_ptr());
    uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
    float* s = static_cast<float*>(scales.data_ptr());
    const bool vec_ok = hidden % kVec == 0 && aligned(x, sizeof(T) * kVec) && aligned(o, kVec) &&
                        (rows == 1 || (in_stride % kVec == 0 && out_stride % kVec == 0));
    if (vec_ok) {
      token_launch<kVec>(x, in_stride, o, out_stride, s, rows, hidden, dev.value());
    } else {
      token_launch<1>(x, in_stride, o, out_stride, s, rows, hidden, dev.value());
    }
  }

  template <int VEC>
  static void token_launch(const T* x, int64_t in_stride, uint8_t* o, int64_t out_stride, float* s,
                           int64_t rows, int64_t hidden, DLDevice dev) {
    const int64_t nvr = std::max<int64_t>(hidden / VEC, 1);
    auto pow2_at_least = [](int64_t n) {
      int64_t p = 1;
      while (p < n) p *= 2;
      return p;
    };
    // Lanes per row: a warp (or the whole row if shorter) with up to 16 vectors each, more while the
    // grid has fewer than QUANT_FP8_TOKEN_THREADS_PER_SM threads per SM.
    int64_t P = std::min<int64_t>(32, pow2_at_least(nvr));
    while (P < 1024 && div_ceil<int64_t>(nvr, P) > kTokenMaxVecs) P *= 2;
    const int64_t target = int64_t(num_sms(dev.device_id)) * QUANT_FP8_TOKEN_THREADS_PER_SM;
    while (P < 1024 && P < nvr && rows * P < target) P *= 2;
    int64_t N = pow2_at_least(std::min<int64_t>(div_ceil<int64_t>(nvr, P), kTokenMaxVecs));
    if (P > kTokenMaxThreads<kTokenMaxVecs>) N = std::min<int64_t>(N, kTokenMaxVecs / 2);
    RowsArgs<T> a{};
    a.in = x;
    a.in_stride = in_stride;
    a.out = o;
    a.out_stride = out_stride;
    a.scales = s;
    a.num_rows = rows;
    a.hidden = a.last_hidden = hidden;
    a.P = int(P);
    launch_rows<VEC, ScaleFrom::kRowMax>(a, N, dev, "per_token_quant_fp8");
  }

  // Static scale: the tensor as rows ("chunks") of 32 * N vectors, a warp each, quantized with
  // scales[0]. N (1, 4, kChunkMaxN) is the largest that still gives about
  // QUANT_FP8_CHUNK_THREADS_PER_SM threads per SM.
  template <int VEC, ScaleFrom kFrom = ScaleFrom::kGiven>
  static void per_tensor_rows(const T* x, uint8_t* o, float* s, int64_t numel, DLDevice dev) {
    const int64_t nv = numel / VEC;
    const int64_t warps = int64_t(num_sms(dev.device_id)) * QUANT_FP8_CHUNK_THREADS_PER_SM / 32;
    const int64_t N = nv >= kChunkMaxN * 32 * warps ? kChunkMaxN : nv >= 4 * 32 * warps ? 4 : 1;
    const int64_t chunk = 32 * N * VEC;
    RowsArgs<T> a{};
    a.in = x;
    a.out = o;
    a.in_stride = a.out_stride = a.hidden = chunk;
    a.scales = s;
    a.num_rows = div_ceil<int64_t>(numel, chunk);
    a.last_hidden = numel - (a.num_rows - 1) * chunk;
    a.P = 32;
    launch_rows<VEC, kFrom>(a, N, dev,
                            kFrom == ScaleFrom::kGiven ? "per_tensor_quant_fp8 (static)" : "per_tensor_quant_fp8 (quantize)");
  }

  // Launches rows_kernel with N vectors per lane: per-token instantiates N = 1, 2, 4, 8, 16, the
  // per-tensor chunks only 1, 4 and kChunkMaxN (compile time); N is one of them.
  template <int VEC, ScaleFrom kFrom>
  static void launch_rows(const RowsArgs<T>& a, int64_t N, DLDevice dev, const char* name) {
    if constexpr (kFrom == ScaleFrom::kRowMax) {
      launch_rows_n<VEC, kFrom, kTokenMaxVecs, 1, 2, 4, 8>(a, N, dev, name);
    } else {
      launch_rows_n<VEC, kFrom, kChunkMaxN, 1, 4>(a, N, dev, name);
    }
  }

  // The kernel for the first of kSmallN equal to N, else for N = kLargestN.
  template <int VEC, ScaleFrom kFrom, int kLargestN, int... kSmallN>
  static void launch_rows_n(const RowsArgs<T>& a, int64_t N, DLDevice dev, const char* name) {
    const int threads = std::max(a.P, 128);
    const int64_t grid = div_ceil<int64_t>(a.num_rows, threads / a.P);
    RowsArgs<T> args = a;
    // As in the norm kernels: a prefetch before the PDL wait pays for grids of up to one block per SM.
    args.prefetch = QUANT_FP8_PREFETCH_L2 && grid <= num_sms(dev.device_id);
    auto launch = [&](auto kernel) { LaunchKernel(kernel, dim3(grid), dim3(threads), 0, dev, name).pdl()(args); };
    const bool small = ((N == kSmallN && (launch(rows_kernel<T, Q, VEC, kSmallN, kFrom>), true)) || ...);
    if (!small) launch(rows_kernel<T, Q, VEC, kLargestN, kFrom>);
  }
};

}  // namespace sgljit_quant_fp8

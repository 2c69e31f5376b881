// Rotary position embedding (neox and gptj styles, partial rotary), in place on q and k, and a
// variant that also stores the rotated k and v into a paged KV cache (and, ROTATE_K, rotates k in
// place too). cos/sin come from a float32 table or one in the heads' dtype (CacheT), math in fp32.
//
// Work decomposition. A *lane group* of kLanes = (ROT / 2) / VEC threads owns one head: lane l
// holds VEC rotary pairs in two 16-byte vectors of the head, at l*VEC and ROT/2 + l*VEC, and the
// matching VEC cos and VEC sin values (read 16 bytes at a time at most, converted to fp32). neox: pair p of the lane is (a[p], b[p]), cos/sin index
// l*VEC + p. gptj: pairs are adjacent elements, so each vector holds VEC/2 whole pairs (cos/sin
// indices l*VEC/2 + p for a, ROT/4 + l*VEC/2 + p for b), which keeps every warp access contiguous;
// with VEC == 1 a lane holds one whole pair, elements 2l and 2l + 1.
// A *work item* is (token, chunk of up to kHeads heads of one tensor; apply_rope's small grids one
// head, RopeLaunch::run): the group loads all its
// heads' vectors first (kHeads * 2 independent 16-byte loads in flight per thread), reads the
// token's position and its cos/sin once, then rotates and stores every head. Heads are held as
// 32-bit words (HeadVec), so every load and store stays one 16-byte access.
// q and k chunks (and, for the KV variant, k-store and v-copy chunks) are items of one launch.
// apply_rope launches a block per `kGroups` items and lets the hardware scheduler overlap blocks;
// the KV kernel's grid is persistent: at most as many blocks as fit on the GPU at once, striding
// over items. A thread steps its (token, chunk) by the grid's stride's quotient and remainder,
// host-divided (no 64-bit division per item). Up to 256 tokens (decode) the KV variant takes
// rope_kv_decode_kernel instead: a head per lane group, no index-dependent load but cos/sin.
//
// Programmatic dependent launch: each kernel waits for the previous kernel on the stream
// (pdl_wait) before its first global memory access, then lets the next one be scheduled; small
// shapes (one token) are a launch plus two dependent memory round trips (position, then cos/sin),
// and PDL hides the launch behind the previous kernel's tail; apply_rope's first blocks also
// prefetch their heads and position into L2 before waiting (RopeLaunch::launch says which).
//
// Vectors: the entry points (RopeKernel, RopeKVKernel) run 16-byte vectors where every pointer and
// stride allows them and 1-element vectors otherwise, chosen per call on the host.
//
// Out-of-range indices never touch memory out of bounds: a position outside [0, max_pos) leaves
// the token unrotated; an out_loc outside [0, num_slots) skips the token's cache store.
#pragma once

#include <sgljit/cuda.cuh>
#include <sgljit/tensor.h>
#include <sgljit/type.cuh>
#include <sgljit/utils.h>
#include <sgljit/vec.cuh>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

namespace sgljit_rope {

using namespace sgljit;

// The lane group and work item, shared by both kernels.
template <int ROT, int VEC>
struct Geometry {
  static_assert(ROT % 2 == 0 && (ROT / 2) % VEC == 0, "rotary_dim / 2 must be a multiple of VEC");
  static constexpr int kHalf = ROT / 2;
  static constexpr int kLanes = kHalf / VEC;
  // Lane groups in a block of about `target` threads (at least one).
  static constexpr int groups_for(int target) { return kLanes >= target ? 1 : target / kLanes; }
  // cos/sin (CacheT) are loaded in chunks of at most 16 bytes.
  template <typename CacheT>
  static constexpr int kCosVec = VEC < kVecSize<CacheT> ? VEC : kVecSize<CacheT>;
  // Heads per work item: cos/sin are re-read once per item, but each head holds 2 vectors of
  // registers; 2 heads of 16-byte vectors of 2-byte types, 4 of narrower vectors.
  static constexpr int kHeads = VEC >= 8 ? 2 : 4;
  // gptj with whole pairs per vector (needs an even VEC); cos/sin then come VEC/2 per vector side.
  template <bool NEOX>
  static constexpr bool kSplit = !NEOX && VEC >= 2;
};

// apply_rope's block and register budget.
template <int ROT, int VEC>
struct RopeConfig {
  using G = Geometry<ROT, VEC>;
  static constexpr int kBlockTarget = 128;  // threads per block: more, smaller blocks per SM than 256
  static constexpr int kGroups = G::groups_for(kBlockTarget);
  static constexpr int kBlock = G::kLanes * kGroups;
  // Registers per thread: 56 for 16-byte vectors of 2-byte types (9 blocks of 128 per SM); 64 for
  // fp32, whose 4 heads of 4-element vectors spill under 48.
  static constexpr int kRegs = VEC >= 8 ? 56 : 64;
  // Grids that fit on the GPU at once only under 48 registers (10 blocks per SM) take that kernel
  // instead, so they run in one wave (RopeKernel::run).
  static constexpr int kRegsOneWave = VEC >= 8 ? 48 : kRegs;
  static constexpr int min_blocks_for(int regs) { return 65536 / (regs * kBlock) > 0 ? 65536 / (regs * kBlock) : 1; }
  static constexpr int kMinBlocks = min_blocks_for(kRegs);
  static constexpr int kMinBlocksOneWave = min_blocks_for(kRegsOneWave);
};

// The KV kernel's block and occupancy (three kinds of item: q, k + store, v copy; 72-80 registers).
template <int ROT, int VEC>
struct RopeKVConfig {
  using G = Geometry<ROT, VEC>;
  static constexpr int kBlockTarget = 256;  // threads per block: faster than 128 at large T
  static constexpr int kGroups = G::groups_for(kBlockTarget);
  static constexpr int kBlock = G::kLanes * kGroups;
  static constexpr int kMinBlocks = 768 / kBlock > 0 ? 768 / kBlock : 1;  // 3/8 occupancy
};

// The KV variant's decode kernel (rope_kv_decode_kernel), for up to kMaxTokens tokens: at T=1-256 it
// took 0.57-0.75x the persistent kernel's time (ab-rope-kv-decode.md).
template <int ROT, int VEC>
struct RopeKVDecodeConfig {
  using G = Geometry<ROT, VEC>;
  static constexpr int64_t kMaxTokens = 256;  // decode sizes: latency-bound, the grid is resident at once
  static constexpr int kBlockTarget = 128;    // threads per block: T=1's 48 heads (32/8) on 3 SMs
  static constexpr int kGroups = G::groups_for(kBlockTarget);
  static constexpr int kBlock = G::kLanes * kGroups;
  static constexpr int kHeldVecs = 8;  // copy vectors a lane loads before its index arrives (registers)
};

struct RopeParams {
  int64_t num_tokens;
  int64_t step_tokens;   // the grid's stride in items (gridDim.x * groups), as whole tokens ...
  int32_t step_chunks;   // ... plus chunks (< chunks)
  int32_t chunks;        // chunks per token
  int32_t q_chunks;      // chunks of q heads (the first chunks of a token)
  int32_t k_chunks;      // chunks of k heads (next); the KV variant adds k_chunks v chunks
  int32_t q_heads, k_heads;
  int64_t q_stride_t, q_stride_h;
  int64_t k_stride_t, k_stride_h;
  int64_t v_stride_t, v_stride_h;
  int64_t kc_stride_s, kc_stride_h;  // k_cache slot / head strides
  int64_t vc_stride_s, vc_stride_h;  // v_cache slot / head strides
  int64_t cache_stride;              // cos_sin_cache row stride
  int64_t max_pos;
  int64_t num_slots;
  int32_t prefetch_blocks;  // apply_rope: blocks [0, prefetch_blocks) prefetch before the PDL wait
};

// Element offsets in the head of the lane's two vectors.
template <int ROT, bool NEOX, int VEC>
SGLJIT_DEVICE int first_offset(int lane) {
  return NEOX || Geometry<ROT, VEC>::template kSplit<NEOX> ? lane * VEC : lane * 2 * VEC;
}
template <int ROT, bool NEOX, int VEC>
SGLJIT_DEVICE int second_offset(int lane) {
  return NEOX || Geometry<ROT, VEC>::template kSplit<NEOX> ? ROT / 2 + lane * VEC : lane * 2 * VEC + VEC;
}

// VEC elements of one 16-byte (or narrower) vector of a head (or of a weight: qknorm_rope.cuh), as
// registers. 2-byte types are kept as 32-bit words of two elements: held as VEC 2-byte scalars, a
// vector whose load is conditional takes one register per element.
template <typename T, int VEC>
struct HeadVec {
  static constexpr bool kPacked = sizeof(T) == 2 && VEC % 2 == 0;
  using Word = std::conditional_t<kPacked, uint32_t, T>;
  static constexpr int kWords = kPacked ? VEC / 2 : VEC;
  AlignedVector<Word, kWords> w;

  SGLJIT_DEVICE void load(const T* ptr) { w.load(reinterpret_cast<const Word*>(ptr)); }
  SGLJIT_DEVICE void store(T* ptr) const { w.store(reinterpret_cast<Word*>(ptr)); }
  template <bool kStream>
  SGLJIT_DEVICE void store_out(T* ptr) const {
    if constexpr (kStream && sizeof(w) == 16) {
      w.store_streaming(reinterpret_cast<Word*>(ptr));
    } else {
      store(ptr);
    }
  }

  SGLJIT_DEVICE void to_floats(float* x) const {
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      if constexpr (!kPacked) {
        x[i] = to_float(w[i]);
      } else if constexpr (std::is_same_v<T, bf16_t>) {
        x[2 * i] = sgljit::bf16_of_word(w[i], 0);
        x[2 * i + 1] = sgljit::bf16_of_word(w[i], 1);
      } else {
        __half2 h;
        memcpy(&h, &w[i], sizeof(h));
        const float2 f = __half22float2(h);
        x[2 * i] = f.x;
        x[2 * i + 1] = f.y;
      }
    }
  }
  // Round to nearest even, as from_float<T> (one packing conversion per word).
  SGLJIT_DEVICE void from_floats(const float* y) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      if constexpr (!kPacked) {
        w[i] = from_float<T>(y[i]);
      } else if constexpr (std::is_same_v<T, bf16_t>) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(y[2 * i], y[2 * i + 1]);
        memcpy(&w[i], &h, sizeof(h));
      } else {
        const __half2 h = __floats2half2_rn(y[2 * i], y[2 * i + 1]);
        memcpy(&w[i], &h, sizeof(h));
      }
    }
  }
};

// Rotates the lane's VEC pairs held in (a, b) by cos c[] / sin s[] (fp32 math, rounded once).
// kRoundProducts (vLLM's rotary_embedding, whose kernel computes in T): cos and sin rounded to T, each
// product rounded to T, then the sum or difference.
template <typename T, bool NEOX, int VEC, bool kRoundProducts = false>
SGLJIT_DEVICE void rotate(HeadVec<T, VEC>& a, HeadVec<T, VEC>& b, const float* c, const float* s) {
  float x[2 * VEC];
  a.to_floats(x);
  b.to_floats(x + VEC);
  float y[2 * VEC];
#pragma unroll
  for (int p = 0; p < VEC; ++p) {
    // neox: pair p is (a[p], b[p]); gptj: pair p is elements (2p, 2p + 1) of a ++ b.
    const int i1 = NEOX ? p : 2 * p;
    const int i2 = NEOX ? VEC + p : 2 * p + 1;
    if constexpr (kRoundProducts) {
      const float cp = round_to<T>(c[p]), sp = round_to<T>(s[p]);
      y[i1] = round_to<T>(x[i1] * cp) - round_to<T>(x[i2] * sp);
      y[i2] = round_to<T>(x[i2] * cp) + round_to<T>(x[i1] * sp);
    } else {
      y[i1] = x[i1] * c[p] - x[i2] * s[p];
      y[i2] = x[i2] * c[p] + x[i1] * s[p];
    }
  }
  a.from_floats(y);
  b.from_floats(y + VEC);
}

// cos/sin of the lane's VEC pairs, in the order rotate() takes them.
template <int ROT, bool NEOX, int VEC, typename CacheT>
SGLJIT_DEVICE void load_cos_sin(const CacheT* __restrict__ row, int lane, float* c, float* s) {
  using G = Geometry<ROT, VEC>;
  constexpr int kMax = 16 / int(sizeof(CacheT));  // elements in 16 bytes
  if constexpr (G::template kSplit<NEOX>) {
    // Pairs of vector a at lane*VEC/2, of vector b at ROT/4 + lane*VEC/2 (chunks of <= 16 bytes).
    constexpr int kH = VEC / 2, kW = kH < kMax ? kH : kMax;
#pragma unroll
    for (int i = 0; i < VEC; i += kW) {
      const int idx = (i < kH ? 0 : ROT / 4 - kH) + lane * kH + i;
      AlignedVector<CacheT, kW> cv, sv;
      cv.load(row + idx);
      sv.load(row + G::kHalf + idx);
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        c[i + j] = to_float(cv[j]);
        s[i + j] = to_float(sv[j]);
      }
    }
  } else {
    constexpr int kW = G::template kCosVec<CacheT>;
#pragma unroll
    for (int i = 0; i < VEC; i += kW) {
      AlignedVector<CacheT, kW> cv, sv;
      cv.load(row + lane * VEC + i);
      sv.load(row + G::kHalf + lane * VEC + i);
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        c[i + j] = to_float(cv[j]);
        s[i + j] = to_float(sv[j]);
      }
    }
  }
}

template <typename IdxT>
SGLJIT_DEVICE bool in_range(IdxT v, int64_t n) {
  return static_cast<int64_t>(v) >= 0 && static_cast<int64_t>(v) < n;
}

// The persistent grid's walk over items (token t, chunk c): the first item is the thread's group
// index in the grid (small: one division), then t/c advance by the grid's stride, host-divided.
struct ItemWalk {
  int64_t t;
  int chunk;

  SGLJIT_DEVICE ItemWalk(const RopeParams& p, int lanes, int groups) {
    const int first = blockIdx.x * groups + threadIdx.x / lanes;
    t = first / p.chunks;
    chunk = first - static_cast<int>(t) * p.chunks;
  }
  SGLJIT_DEVICE void next(const RopeParams& p) {
    t += p.step_tokens;
    chunk += p.step_chunks;
    if (chunk >= p.chunks) chunk -= p.chunks, ++t;
  }
};

// Loads the rotary part of `nheads` (<= HEADS) heads from src, rotates it by cos/sin `row` (no
// rotation when row is null), stores it to dst (which may be src) and, kBack, the rotated heads also
// to `back` (src's heads, written in place). All loads are issued first.
template <typename T, int ROT, bool NEOX, int VEC, int HEADS, bool kBack = false, typename CacheT>
SGLJIT_DEVICE void rope_heads(const T* src, int64_t src_hs, T* dst, int64_t dst_hs, int nheads, int lane,
                              const CacheT* __restrict__ row, T* back = nullptr) {
  using Vec = HeadVec<T, VEC>;
  const int off1 = first_offset<ROT, NEOX, VEC>(lane);
  const int off2 = second_offset<ROT, NEOX, VEC>(lane);
  Vec a[HEADS], b[HEADS];
#pragma unroll
  for (int h = 0; h < HEADS; ++h) {
    if (h < nheads) {
      a[h].load(src + h * src_hs + off1);
      b[h].load(src + h * src_hs + off2);
    }
  }
  if (row != nullptr) {
    float c[VEC], s[VEC];
    load_cos_sin<ROT, NEOX, VEC>(row, lane, c, s);
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
      if (h < nheads) rotate<T, NEOX, VEC>(a[h], b[h], c, s);
    }
  }
#pragma unroll
  for (int h = 0; h < HEADS; ++h) {
    if (h < nheads) {
      a[h].store(dst + h * dst_hs + off1);
      b[h].store(dst + h * dst_hs + off2);
      if constexpr (kBack) {
        if (row != nullptr) {
          a[h].store(back + h * src_hs + off1);
          b[h].store(back + h * src_hs + off2);
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// apply_rope: q and k rotated in place, HEADS heads a work item (kRoundProducts: rotate()'s).
template <typename T, typename CacheT, typename IdxT, int ROT, bool NEOX, int VEC, int HEADS, bool kStreamStores,
          int kMinBlocks, bool kRoundProducts = false>
__global__ void __launch_bounds__(RopeConfig<ROT, VEC>::kBlock, kMinBlocks)
    rope_kernel(T* __restrict__ q, T* __restrict__ k, const CacheT* __restrict__ cos_sin,
                const IdxT* __restrict__ positions, const RopeParams p) {
  using G = Geometry<ROT, VEC>;
  using C = RopeConfig<ROT, VEC>;
  const int lane = threadIdx.x % G::kLanes;
  const int off1 = first_offset<ROT, NEOX, VEC>(lane);
  const int off2 = second_offset<ROT, NEOX, VEC>(lane);
  // The heads of item (t, chunk): the first is at base, the next ones hs apart.
  auto item = [&](int64_t t, int chunk, int64_t& hs, int& nheads) {
    const bool is_q = chunk < p.q_chunks;
    const int h0 = (is_q ? chunk : chunk - p.q_chunks) * HEADS;
    nheads = min(HEADS, (is_q ? p.q_heads : p.k_heads) - h0);
    hs = is_q ? p.q_stride_h : p.k_stride_h;
    return is_q ? q + t * p.q_stride_t + h0 * hs : k + t * p.k_stride_t + h0 * hs;
  };
  if (static_cast<int>(blockIdx.x) < p.prefetch_blocks) {
    const ItemWalk w(p, G::kLanes, C::kGroups);
    if (w.t < p.num_tokens) {
      int64_t hs;
      int nheads;
      const T* base = item(w.t, w.chunk, hs, nheads);
#pragma unroll
      for (int h = 0; h < HEADS; ++h) {
        if (h < nheads) {
          prefetch_l2(base + h * hs + off1);
          prefetch_l2(base + h * hs + off2);
        }
      }
      if (lane == 0) prefetch_l2(positions + w.t);
    }
  }
  pdl_wait();  // q, k, positions may be written by the previous kernel
  pdl_launch_dependents();
  for (ItemWalk w(p, G::kLanes, C::kGroups); w.t < p.num_tokens; w.next(p)) {
    const int64_t t = w.t;
    int64_t hs;
    int nheads;
    T* base = item(t, w.chunk, hs, nheads);

    // The heads' loads do not depend on the position: issue them first, so the position's load
    // overlaps them and only the cos/sin load waits for it (one memory round trip less; it is
    // what a single token's latency is made of).
    using Vec = HeadVec<T, VEC>;
    Vec a[HEADS], b[HEADS];
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
      if (h < nheads) {  // (unconditional loads get sunk below the position's check)
        a[h].load(base + h * hs + off1);
        b[h].load(base + h * hs + off2);
      }
    }
    const IdxT pos = positions[t];
    if (!in_range(pos, p.max_pos)) continue;  // out of range: leave the token unrotated
    float c[VEC], s[VEC];
    load_cos_sin<ROT, NEOX, VEC>(cos_sin + static_cast<int64_t>(pos) * p.cache_stride, lane, c, s);
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
      if (h < nheads) {
        rotate<T, NEOX, VEC, kRoundProducts>(a[h], b[h], c, s);
        a[h].template store_out<kStreamStores>(base + h * hs + off1);
        b[h].template store_out<kStreamStores>(base + h * hs + off2);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// apply_rope_with_kv_cache: q rotated in place; rotated k and v stored at k_cache[out_loc[t]],
// v_cache[out_loc[t]]; v is only read, and k too unless ROTATE_K (then rotated in place as well,
// whether or not its token's out_loc is in range).

// Copies elements [FROM, HEAD_DIM) of `nheads` heads, VEC at a time, spread over the lane group;
// (head, vector) pairs go in batches of 4 loads then 4 stores (bounded registers, loads in flight).
template <typename T, int HEAD_DIM, int FROM, int LANES, int VEC, int HEADS>
SGLJIT_DEVICE void copy_heads(const T* __restrict__ src, int64_t src_hs, T* __restrict__ dst, int64_t dst_hs,
                              int nheads, int lane) {
  constexpr int kVecs = (HEAD_DIM - FROM) / VEC;
  if constexpr (kVecs > 0) {
    constexpr int kPerLane = (kVecs + LANES - 1) / LANES;
    constexpr int kTotal = HEADS * kPerLane;
    constexpr int kBatch = 4;
    using Vec = HeadVec<T, VEC>;
#pragma unroll
    for (int f0 = 0; f0 < kTotal; f0 += kBatch) {
      Vec buf[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int f = f0 + i, h = f / kPerLane, v = lane + (f % kPerLane) * LANES;
        if (f < kTotal && h < nheads && (kVecs % LANES == 0 || v < kVecs)) {
          buf[i].load(src + h * src_hs + FROM + v * VEC);
        }
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int f = f0 + i, h = f / kPerLane, v = lane + (f % kPerLane) * LANES;
        if (f < kTotal && h < nheads && (kVecs % LANES == 0 || v < kVecs)) {
          buf[i].store(dst + h * dst_hs + FROM + v * VEC);
        }
      }
    }
  }
}

// The three kinds of work item of the KV kernel.
template <typename T, int ROT, bool NEOX, int VEC, int HEADS, typename CacheT>
SGLJIT_DEVICE void kv_q_item(T* base, int64_t hs, int nheads, int lane, const CacheT* row) {
  rope_heads<T, ROT, NEOX, VEC, HEADS>(base, hs, base, hs, nheads, lane, row);
}

// kBack: the rotated heads also go back into src (k rotated in place).
template <typename T, int HEAD_DIM, int ROT, bool NEOX, int VEC, int HEADS, bool kBack, typename KT, typename CacheT>
SGLJIT_DEVICE void kv_k_item(KT* src, int64_t src_hs, T* dst, int64_t dst_hs, int nheads, int lane,
                             const CacheT* row) {
  if constexpr (kBack) {
    rope_heads<T, ROT, NEOX, VEC, HEADS, true>(src, src_hs, dst, dst_hs, nheads, lane, row, src);
  } else {
    rope_heads<T, ROT, NEOX, VEC, HEADS>(src, src_hs, dst, dst_hs, nheads, lane, row);
  }
  copy_heads<T, HEAD_DIM, ROT, ROT / 2 / VEC, VEC, HEADS>(src, src_hs, dst, dst_hs, nheads, lane);
}

template <typename T, int HEAD_DIM, int LANES, int VEC, int HEADS>
SGLJIT_DEVICE void kv_v_item(const T* src, int64_t src_hs, T* dst, int64_t dst_hs, int nheads, int lane) {
  copy_heads<T, HEAD_DIM, 0, LANES, VEC, HEADS>(src, src_hs, dst, dst_hs, nheads, lane);
}

// KT: const T, or T when k is rotated in place (ROTATE_K).
template <typename T, typename CacheT, typename IdxT, typename LocT, int HEAD_DIM, int ROT, bool NEOX, int VEC,
          bool ROTATE_K, typename KT = std::conditional_t<ROTATE_K, T, const T>>
__global__ void __launch_bounds__(RopeKVConfig<ROT, VEC>::kBlock, RopeKVConfig<ROT, VEC>::kMinBlocks)
    rope_kv_kernel(T* __restrict__ q, KT* __restrict__ k, const T* __restrict__ v, T* __restrict__ k_cache,
                   T* __restrict__ v_cache, const CacheT* __restrict__ cos_sin, const IdxT* __restrict__ positions,
                   const LocT* __restrict__ out_loc, const RopeParams p) {
  using G = Geometry<ROT, VEC>;
  constexpr int H = G::kHeads;
  pdl_wait();  // every input may be written by the previous kernel
  pdl_launch_dependents();
  const int lane = threadIdx.x % G::kLanes;
  for (ItemWalk w(p, G::kLanes, RopeKVConfig<ROT, VEC>::kGroups); w.t < p.num_tokens; w.next(p)) {
    const int64_t t = w.t;
    const int chunk = w.chunk;
    const IdxT pos = positions[t];
    const CacheT* row =
        in_range(pos, p.max_pos) ? cos_sin + static_cast<int64_t>(pos) * p.cache_stride : nullptr;
    if (chunk < p.q_chunks) {  // q: rotate in place (out-of-range position: untouched)
      const int h0 = chunk * H;
      if (row != nullptr) {
        kv_q_item<T, ROT, NEOX, VEC, H>(q + t * p.q_stride_t + h0 * p.q_stride_h, p.q_stride_h,
                                        min(H, p.q_heads - h0), lane, row);
      }
      continue;
    }
    const LocT loc = out_loc[t];
    if (!in_range(loc, p.num_slots)) {  // out of range: no store for this token
      if constexpr (ROTATE_K) {         // (but its k is rotated in place all the same)
        if (row != nullptr && chunk < p.q_chunks + p.k_chunks) {
          const int h0 = (chunk - p.q_chunks) * H;
          kv_q_item<T, ROT, NEOX, VEC, H>(k + t * p.k_stride_t + h0 * p.k_stride_h, p.k_stride_h,
                                          min(H, p.k_heads - h0), lane, row);
        }
      }
      continue;
    }
    const int64_t slot = static_cast<int64_t>(loc);
    if (chunk < p.q_chunks + p.k_chunks) {  // k: rotated into k_cache (unrotated if no row)
      const int h0 = (chunk - p.q_chunks) * H;
      kv_k_item<T, HEAD_DIM, ROT, NEOX, VEC, H, ROTATE_K>(k + t * p.k_stride_t + h0 * p.k_stride_h, p.k_stride_h,
                                                          k_cache + slot * p.kc_stride_s + h0 * p.kc_stride_h,
                                                          p.kc_stride_h, min(H, p.k_heads - h0), lane, row);
    } else {  // v: copied into v_cache
      const int h0 = (chunk - p.q_chunks - p.k_chunks) * H;
      kv_v_item<T, HEAD_DIM, G::kLanes, VEC, H>(v + t * p.v_stride_t + h0 * p.v_stride_h, p.v_stride_h,
                                                v_cache + slot * p.vc_stride_s + h0 * p.vc_stride_h, p.vc_stride_h,
                                                min(H, p.k_heads - h0), lane);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// The KV variant at decode sizes. A lane group owns one head (q, k + store or v
// copy) of one token: the grid is an item per group, not persistent. Before the PDL wait each lane
// prefetches into L2 the lines it will read that do not depend on an index (its head's vectors,
// the token's position and out_loc); after it, the head's vectors, the position and out_loc are
// loaded together, before any of them is used, so the only dependent round trip left is cos/sin
// (k and q) and none for v (the persistent kernel reads position, then out_loc, then the heads).

// Loads a head vector where it is written: ptxas sinks a plain load into the branch that first uses
// it, i.e. after the index that branch tests has arrived (one round trip more); sgljit::load16_pinned
// (16-byte vectors; 1-element vectors, the fallback for odd views, load plainly) is never moved.
template <typename T, int VEC>
SGLJIT_DEVICE void load_early(HeadVec<T, VEC>& v, const T* ptr) {
  if constexpr (sizeof(v.w) == 16) {
    static_assert(sizeof(v.w[0]) == 4, "16-byte vectors of 4-byte words");
    uint32_t r[4];
    load16_pinned(r, ptr);
    memcpy(&v.w[0], &r[0], 4);
    memcpy(&v.w[1], &r[1], 4);
    memcpy(&v.w[2], &r[2], 4);
    memcpy(&v.w[3], &r[3], 4);
  } else {
    v.load(ptr);
  }
}

// Stores a head vector as one 16-byte store where it is one (after load_early, the compiler splits
// some plain 16-byte stores into four: sgljit::store16_whole).
template <typename T, int VEC>
SGLJIT_DEVICE void store_vec(const HeadVec<T, VEC>& v, T* ptr) {
  if constexpr (sizeof(v.w) == 16) {
    uint32_t r[4];
    memcpy(r, &v.w, sizeof(r));
    store16_whole(ptr, r);
  } else {
    v.store(ptr);
  }
}

// The part of a head from element FROM on that is copied as is, VEC elements at a time spread over
// the lane group: the first kHeld vectors of the lane are held in registers (loaded early), the
// rest are copied in batches after the store's slot is known.
template <typename T, int HEAD_DIM, int FROM, int LANES, int VEC, int kHeldMax>
struct HeadCopy {
  using Vec = HeadVec<T, VEC>;
  static constexpr int kVecs = (HEAD_DIM - FROM) / VEC;
  static constexpr int kPerLane = (kVecs + LANES - 1) / LANES;
  static constexpr int kHeld = kPerLane < kHeldMax ? kPerLane : kHeldMax;
  Vec held[kHeld > 0 ? kHeld : 1];

  // Vector i of the lane, and whether it exists (the last round may leave lanes without one).
  static SGLJIT_DEVICE int offset(int lane, int i) { return FROM + (lane + i * LANES) * VEC; }
  static SGLJIT_DEVICE bool exists(int lane, int i) { return kVecs % LANES == 0 || lane + i * LANES < kVecs; }

  static SGLJIT_DEVICE void prefetch(const T* src, int lane) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (exists(lane, i)) prefetch_l2(src + offset(lane, i));
    }
  }
  SGLJIT_DEVICE void load(const T* src, int lane) {
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      if (exists(lane, i)) load_early(held[i], src + offset(lane, i));
    }
  }
  // Stores the held vectors, then copies the rest.
  SGLJIT_DEVICE void store(const T* src, T* dst, int lane) const {
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      if (exists(lane, i)) store_vec(held[i], dst + offset(lane, i));
    }
    constexpr int kBatch = 4;
#pragma unroll
    for (int i0 = kHeld; i0 < kPerLane; i0 += kBatch) {
      Vec buf[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (i0 + j < kPerLane && exists(lane, i0 + j)) buf[j].load(src + offset(lane, i0 + j));
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (i0 + j < kPerLane && exists(lane, i0 + j)) buf[j].store(dst + offset(lane, i0 + j));
      }
    }
  }
};

// KT: const T, or T when k is rotated in place (ROTATE_K). Numerics as rope_kv_kernel's.
template <typename T, typename CacheT, typename IdxT, typename LocT, int HEAD_DIM, int ROT, bool NEOX, int VEC,
          bool ROTATE_K, typename KT = std::conditional_t<ROTATE_K, T, const T>>
__global__ void __launch_bounds__(RopeKVDecodeConfig<ROT, VEC>::kBlock)
    rope_kv_decode_kernel(T* __restrict__ q, KT* __restrict__ k, const T* __restrict__ v, T* __restrict__ k_cache,
                          T* __restrict__ v_cache, const CacheT* __restrict__ cos_sin,
                          const IdxT* __restrict__ positions, const LocT* __restrict__ out_loc, const RopeParams p) {
  using G = Geometry<ROT, VEC>;
  using C = RopeKVDecodeConfig<ROT, VEC>;
  using Vec = HeadVec<T, VEC>;
  using Tail = HeadCopy<T, HEAD_DIM, ROT, G::kLanes, VEC, C::kHeldVecs>;  // k's unrotated part
  using Whole = HeadCopy<T, HEAD_DIM, 0, G::kLanes, VEC, C::kHeldVecs>;   // v
  const int lane = threadIdx.x % G::kLanes;
  const int off1 = first_offset<ROT, NEOX, VEC>(lane);
  const int off2 = second_offset<ROT, NEOX, VEC>(lane);
  // Item (token t, head h of the token's q_heads + 2 * k_heads); the host keeps items under 2^31.
  const uint32_t item = blockIdx.x * uint32_t{C::kGroups} + threadIdx.x / G::kLanes;
  const uint32_t t32 = item / static_cast<uint32_t>(p.chunks);
  const int64_t t = t32;
  if (t >= p.num_tokens) return;
  const int h = static_cast<int>(item - t32 * static_cast<uint32_t>(p.chunks));
  auto row_of = [&](IdxT pos) {
    return in_range(pos, p.max_pos) ? cos_sin + static_cast<int64_t>(pos) * p.cache_stride : nullptr;
  };

  if (h < p.q_heads) {  // q: rotated in place (out-of-range position: untouched)
    T* src = q + t * p.q_stride_t + h * p.q_stride_h;
    prefetch_l2(src + off1);
    prefetch_l2(src + off2);
    if (lane == 0) prefetch_l2(positions + t);
    pdl_wait();  // every input may be written by the previous kernel
    pdl_launch_dependents();
    Vec a, b;
    load_early(a, src + off1);
    load_early(b, src + off2);
    const IdxT pos = positions[t];
    const CacheT* row = row_of(pos);
    if (row == nullptr) return;
    float c[VEC], s[VEC];
    load_cos_sin<ROT, NEOX, VEC>(row, lane, c, s);
    rotate<T, NEOX, VEC>(a, b, c, s);
    store_vec(a, src + off1);
    store_vec(b, src + off2);
  } else if (h < p.q_heads + p.k_heads) {  // k: rotated into k_cache (unrotated if no row)
    const int hk = h - p.q_heads;
    KT* src = k + t * p.k_stride_t + hk * p.k_stride_h;
    prefetch_l2(src + off1);
    prefetch_l2(src + off2);
    Tail::prefetch(src, lane);
    if (lane == 0) {
      prefetch_l2(positions + t);
      prefetch_l2(out_loc + t);
    }
    pdl_wait();
    pdl_launch_dependents();
    Vec a, b;
    Tail tail;
    load_early(a, src + off1);
    load_early(b, src + off2);
    tail.load(src, lane);
    const IdxT pos = positions[t];
    const LocT loc = out_loc[t];
    const CacheT* row = row_of(pos);
    if (row != nullptr) {
      float c[VEC], s[VEC];
      load_cos_sin<ROT, NEOX, VEC>(row, lane, c, s);
      rotate<T, NEOX, VEC>(a, b, c, s);
      if constexpr (ROTATE_K) {  // whether or not the token's out_loc is in range
        store_vec(a, src + off1);
        store_vec(b, src + off2);
      }
    }
    if (!in_range(loc, p.num_slots)) return;  // out of range: no store for this token
    T* dst = k_cache + static_cast<int64_t>(loc) * p.kc_stride_s + hk * p.kc_stride_h;
    store_vec(a, dst + off1);
    store_vec(b, dst + off2);
    tail.store(src, dst, lane);
  } else {  // v: copied into v_cache
    const int hv = h - p.q_heads - p.k_heads;
    const T* src = v + t * p.v_stride_t + hv * p.v_stride_h;
    Whole::prefetch(src, lane);
    if (lane == 0) prefetch_l2(out_loc + t);
    pdl_wait();
    pdl_launch_dependents();
    Whole whole;
    whole.load(src, lane);
    const LocT loc = out_loc[t];
    if (!in_range(loc, p.num_slots)) return;
    whole.store(src, v_cache + static_cast<int64_t>(loc) * p.vc_stride_s + hv * p.vc_stride_h, lane);
  }
}

// ------------------------------------------------------------------------------------------------
// Host side.

// Grid: enough blocks for the work; persistent: at most as many as are resident at once. Sets the
// grid's stride in p (chunks must be set).
template <auto Kernel>
inline int grid_size(int block, int groups, int device_id, RopeParams& p, bool persistent = true) {
  const int64_t needed = div_ceil<int64_t>(p.num_tokens * p.chunks, groups);
  const int64_t cap = persistent ? static_cast<int64_t>(num_sms(device_id)) * resident_blocks<Kernel>(device_id, block)
                                 : int64_t{0x7fffffff};
  const int grid = static_cast<int>(std::min(needed, cap));
  const int64_t stride = static_cast<int64_t>(grid) * groups;
  p.step_tokens = stride / p.chunks;
  p.step_chunks = static_cast<int32_t>(stride % p.chunks);
  return grid;
}

// The blocks of a grid of `grid` blocks of kKernel that prefetch into L2 before the PDL wait (blocks
// [0, result)): every block of a grid of up to one block per SM, the first wave of a grid of more than
// a wave; none where the whole grid is resident at once (there the whole input's prefetches would
// compete with the previous kernel's loads).
template <auto kKernel>
inline int32_t l2_prefetch_blocks(int grid, int block, int device_id) {
  const int sms = num_sms(device_id);
  const int64_t wave = int64_t{sms} * resident_blocks<kKernel>(device_id, block);
  return grid <= sms ? grid : grid > wave ? static_cast<int32_t>(wave) : 0;
}

// The entry points. Shapes, strides (unit last dimension), dtypes, devices and overlap were checked by
// the code sgljit.op generates from the ops' declared arguments (see ops.py); here only what the
// specialization assumes: its dtypes, widths and style, and the alignment of its vectors.
inline void check_style(bool is_neox, bool compiled) {
  RuntimeCheck(is_neox == compiled, "is_neox: this module was compiled for is_neox=", compiled ? "True" : "False");
}

inline void check_head_dim(const TensorView& q, int64_t head_dim) {
  RuntimeCheck(q.size(2) == head_dim, "q: this module was compiled for head_dim ", head_dim, ", got ", q.size(2));
}

inline void check_rotary_width(const TensorView& cos_sin_cache, int64_t rot) {
  RuntimeCheck(cos_sin_cache.size(1) == rot, "cos_sin_cache: this module was compiled for rotary_dim ", rot,
               ", got a cache of width ", cos_sin_cache.size(1));
}

inline void check_rotary(const TensorView& cos_sin_cache, int64_t rot, int64_t head_dim) {
  RuntimeCheck(cos_sin_cache.size(0) > 0, "cos_sin_cache: has no rows (expected [max_pos, rotary_dim] with max_pos >= 1)");
  check_rotary_width(cos_sin_cache, rot);
  RuntimeCheck(rot <= head_dim, "cos_sin_cache: its width ", rot, " (rotary_dim) exceeds head_dim ", head_dim);
}

// The vector width (elements) a module is compiled for: 16 bytes, halved until it divides every
// extent in kExtents (ROT / 2, and the head size where whole heads are copied).
template <typename T, int... kExtents>
constexpr int widest_vec() {
  int vec = kVecSize<T>;
  while (vec > 1 && ((kExtents % vec != 0) || ...)) vec /= 2;
  return vec;
}

// Whether `vec`-element vectors fit every [T, H, D] tensor of `heads` (data pointer, and the strides
// of its first two dimensions where their size is > 1) and Geometry's cos/sin chunks the cache
// (pointer, row stride). The entry points run kVec where they fit, else 1-element vectors: views at
// odd offsets are rare, and two specializations keep compile time down.
template <typename T, typename CacheT>
inline bool vectors_fit(int vec, std::initializer_list<const TensorView*> heads, const TensorView& cache) {
  for (const TensorView* t : heads) {
    if (!is_aligned(t->data_ptr(), vec * sizeof(T))) return false;
    for (int d = 0; d < 2; ++d) {
      if (t->size(d) > 1 && t->stride(d) % vec != 0) return false;
    }
  }
  const int cos_max = kVecSize<CacheT>;
  const int cos_vec = vec < cos_max ? vec : cos_max;
  if (!is_aligned(cache.data_ptr(), cos_vec * sizeof(CacheT))) return false;
  return cache.size(0) <= 1 || cache.stride(0) % cos_vec == 0;
}

// apply_rope's entry point: the module's checks, then kVec-element vectors where they fit.
// kRoundProducts: the op's round_products (rotate()).
template <typename T, typename CacheT, typename IdxT, int ROT, bool NEOX, bool kRoundProducts = false>
struct RopeKernel {
  static constexpr int kVec = widest_vec<T, ROT / 2>();

  static void run(TensorView q, TensorView k, TensorView cos_sin_cache, TensorView positions, bool is_neox,
                  bool round_products);
};

template <typename T, typename CacheT, typename IdxT, int ROT, bool NEOX, int VEC, bool kRoundProducts>
struct RopeLaunch {
  using G = Geometry<ROT, VEC>;
  using C = RopeConfig<ROT, VEC>;

  static void run(TensorView q, TensorView k, TensorView cos_sin_cache, TensorView positions) {
    const int64_t n = q.size(0);
    RopeParams p{};
    p.q_heads = static_cast<int32_t>(q.size(1));
    p.k_heads = static_cast<int32_t>(k.size(1));
    p.num_tokens = n;
    p.q_stride_t = q.stride(0);
    p.q_stride_h = q.stride(1);
    p.k_stride_t = k.stride(0);
    p.k_stride_h = k.stride(1);
    p.cache_stride = cos_sin_cache.stride(0);
    p.max_pos = cos_sin_cache.size(0);
    if (n == 0) return;
    const DLDevice device = q.device();
    // Streaming stores (evict-first) where the rotated heads fit in L2: otherwise the whole output
    // stays in L2 as dirty lines, written back while the next kernels run.
    const int64_t rotated_bytes = n * (p.q_heads + p.k_heads) * int64_t{ROT} * int64_t{sizeof(T)};
    const int64_t l2 = l2_bytes(device.device_id);
    const bool stream = rotated_bytes <= l2;
    const int64_t sms = num_sms(device.device_id);
    using Yes = std::true_type;
    using No = std::false_type;
    using OneHead = std::integral_constant<int, 1>;
    using GeometryHeads = std::integral_constant<int, G::kHeads>;
    auto go = [&](auto heads_c, auto stream_c, auto one_wave_c) {
      constexpr int kHeads = decltype(heads_c)::value;
      constexpr int kMin = decltype(one_wave_c)::value ? C::kMinBlocksOneWave : C::kMinBlocks;
      p.q_chunks = div_ceil(p.q_heads, kHeads);
      p.k_chunks = div_ceil(p.k_heads, kHeads);
      p.chunks = p.q_chunks + p.k_chunks;
      launch<rope_kernel<T, CacheT, IdxT, ROT, NEOX, VEC, kHeads, decltype(stream_c)::value, kMin, kRoundProducts>>(
          q, k, cos_sin_cache, positions, p, device);
    };
    // One head a work item while that grid is at most a block an SM: items then add parallelism, not
    // rounds, and a thread's chain after cos/sin is one head's (H100: 0.86-0.94x the time at T <= 2 and
    // at 14/2 heads x 64, T = 64); beyond, G::kHeads heads share an item's cos/sin (32/8 heads x 128 at
    // T = 64, 2560 heads over 132 x 16 items a block: one head an item took 1.16x). Such grids fit at once.
    if (n * (p.q_heads + p.k_heads) <= sms * C::kGroups) {
      stream ? go(OneHead{}, Yes{}, No{}) : go(OneHead{}, No{}, No{});
      return;
    }
    // The register budget: kRegs, or kRegsOneWave where only that lets the whole grid be resident.
    constexpr auto wide = rope_kernel<T, CacheT, IdxT, ROT, NEOX, VEC, G::kHeads, true, C::kMinBlocks, kRoundProducts>;
    constexpr auto tight =
        rope_kernel<T, CacheT, IdxT, ROT, NEOX, VEC, G::kHeads, true, C::kMinBlocksOneWave, kRoundProducts>;
    const int64_t blocks = div_ceil<int64_t>(n * (div_ceil(p.q_heads, G::kHeads) + div_ceil(p.k_heads, G::kHeads)),
                                             C::kGroups);
    const bool one_wave = C::kMinBlocksOneWave != C::kMinBlocks &&
                          blocks > sms * resident_blocks<wide>(device.device_id, C::kBlock) &&
                          blocks <= sms * resident_blocks<tight>(device.device_id, C::kBlock);
    if (stream) {
      one_wave ? go(GeometryHeads{}, Yes{}, Yes{}) : go(GeometryHeads{}, Yes{}, No{});
    } else {
      one_wave ? go(GeometryHeads{}, No{}, Yes{}) : go(GeometryHeads{}, No{}, No{});
    }
  }

  template <auto kernel>
  static void launch(TensorView q, TensorView k, TensorView cos_sin_cache, TensorView positions, RopeParams p,
                     DLDevice device) {
    const int grid = grid_size<kernel>(C::kBlock, C::kGroups, device.device_id, p, /*persistent=*/false);
    p.prefetch_blocks = l2_prefetch_blocks<kernel>(grid, C::kBlock, device.device_id);
    LaunchKernel(kernel, grid, C::kBlock, 0, device, "sgljit_rope::rope_kernel").pdl()(
        static_cast<T*>(q.data_ptr()), static_cast<T*>(k.data_ptr()),
        static_cast<const CacheT*>(cos_sin_cache.data_ptr()), static_cast<const IdxT*>(positions.data_ptr()), p);
  }
};

template <typename T, typename CacheT, typename IdxT, int ROT, bool NEOX, bool kRoundProducts>
void RopeKernel<T, CacheT, IdxT, ROT, NEOX, kRoundProducts>::run(TensorView q, TensorView k, TensorView cos_sin_cache,
                                                                 TensorView positions, bool is_neox,
                                                                 bool round_products) {
  check_module_dtype<T>(q, "q");
  check_module_dtype<CacheT>(cos_sin_cache, "cos_sin_cache");
  check_module_dtype<IdxT>(positions, "positions");
  check_style(is_neox, NEOX);
  RuntimeCheck(round_products == kRoundProducts, "round_products: this module was compiled for round_products=",
               kRoundProducts ? "True" : "False");
  check_rotary(cos_sin_cache, ROT, q.size(2));
  if (vectors_fit<T, CacheT>(kVec, {&q, &k}, cos_sin_cache)) {
    RopeLaunch<T, CacheT, IdxT, ROT, NEOX, kVec, kRoundProducts>::run(q, k, cos_sin_cache, positions);
  } else {
    RopeLaunch<T, CacheT, IdxT, ROT, NEOX, 1, kRoundProducts>::run(q, k, cos_sin_cache, positions);
  }
}

// ROTATE_K: k is rotated in place too (the op that declares k written).
template <typename T, typename CacheT, typename IdxT, typename LocT, int HEAD_DIM, int ROT, bool NEOX, int VEC,
          bool ROTATE_K>
struct RopeKVLaunch {
  using G = Geometry<ROT, VEC>;
  using C = RopeKVConfig<ROT, VEC>;
  static_assert(HEAD_DIM % VEC == 0 && ROT <= HEAD_DIM, "bad head_dim for this specialization");

  static void run(TensorView q, TensorView k, TensorView v, TensorView k_cache, TensorView v_cache,
                  TensorView cos_sin_cache, TensorView positions, TensorView out_loc) {
    const int64_t n = q.size(0), hq = q.size(1), hk = k.size(1), slots = k_cache.size(0);
    RopeParams p{};
    p.q_heads = static_cast<int32_t>(hq);
    p.k_heads = static_cast<int32_t>(hk);
    p.q_chunks = div_ceil(p.q_heads, G::kHeads);
    p.k_chunks = div_ceil(p.k_heads, G::kHeads);
    p.chunks = p.q_chunks + 2 * p.k_chunks;
    p.num_tokens = n;
    p.q_stride_t = q.stride(0);
    p.q_stride_h = q.stride(1);
    p.k_stride_t = k.stride(0);
    p.k_stride_h = k.stride(1);
    p.v_stride_t = v.stride(0);
    p.v_stride_h = v.stride(1);
    p.kc_stride_s = k_cache.stride(0);
    p.kc_stride_h = k_cache.stride(1);
    p.vc_stride_s = v_cache.stride(0);
    p.vc_stride_h = v_cache.stride(1);
    p.cache_stride = cos_sin_cache.stride(0);
    p.max_pos = cos_sin_cache.size(0);
    p.num_slots = slots;
    if (n == 0) return;
    const DLDevice device = q.device();
    using D = RopeKVDecodeConfig<ROT, VEC>;
    const int64_t items = n * (hq + 2 * hk);  // the decode kernel's items: a head an item
    if (n <= D::kMaxTokens && items < (int64_t{1} << 31)) {
      p.chunks = static_cast<int32_t>(hq + 2 * hk);
      constexpr auto decode = rope_kv_decode_kernel<T, CacheT, IdxT, LocT, HEAD_DIM, ROT, NEOX, VEC, ROTATE_K>;
      const int grid = static_cast<int>(div_ceil<int64_t>(items, D::kGroups));
      LaunchKernel(decode, grid, D::kBlock, 0, device, "sgljit_rope::rope_kv_decode_kernel").pdl()(
          static_cast<T*>(q.data_ptr()), static_cast<T*>(k.data_ptr()), static_cast<const T*>(v.data_ptr()),
          static_cast<T*>(k_cache.data_ptr()), static_cast<T*>(v_cache.data_ptr()),
          static_cast<const CacheT*>(cos_sin_cache.data_ptr()), static_cast<const IdxT*>(positions.data_ptr()),
          static_cast<const LocT*>(out_loc.data_ptr()), p);
      return;
    }
    constexpr auto kernel = rope_kv_kernel<T, CacheT, IdxT, LocT, HEAD_DIM, ROT, NEOX, VEC, ROTATE_K>;
    const int grid = grid_size<kernel>(C::kBlock, C::kGroups, device.device_id, p);
    LaunchKernel(kernel, grid, C::kBlock, 0, device, "sgljit_rope::rope_kv_kernel").pdl()(
        static_cast<T*>(q.data_ptr()), static_cast<T*>(k.data_ptr()), static_cast<const T*>(v.data_ptr()),
        static_cast<T*>(k_cache.data_ptr()), static_cast<T*>(v_cache.data_ptr()),
        static_cast<const CacheT*>(cos_sin_cache.data_ptr()), static_cast<const IdxT*>(positions.data_ptr()),
        static_cast<const LocT*>(out_loc.data_ptr()), p);
  }
};

// apply_rope_with_kv_cache's entry point: the module's checks, then kVec-element vectors where they
// fit every tensor.
template <typename T, typename CacheT, typename IdxT, typename LocT, int HEAD_DIM, int ROT, bool NEOX, bool ROTATE_K>
struct RopeKVKernel {
  static_assert(ROT <= HEAD_DIM, "bad head_dim for this specialization");
  static constexpr int kVec = widest_vec<T, ROT / 2, HEAD_DIM>();

  static void run(TensorView q, TensorView k, TensorView v, TensorView k_cache, TensorView v_cache,
                  TensorView cos_sin_cache, TensorView positions, TensorView out_loc, bool is_neox) {
    check_module_dtype<T>(q, "q");
    check_module_dtype<CacheT>(cos_sin_cache, "cos_sin_cache");
    check_module_dtype<IdxT>(positions, "positions");
    check_module_dtype<LocT>(out_loc, "out_loc");
    check_style(is_neox, NEOX);
    check_head_dim(q, HEAD_DIM);
    check_rotary(cos_sin_cache, ROT, HEAD_DIM);
    if (vectors_fit<T, CacheT>(kVec, {&q, &k, &v, &k_cache, &v_cache}, cos_sin_cache)) {
      RopeKVLaunch<T, CacheT, IdxT, LocT, HEAD_DIM, ROT, NEOX, kVec, ROTATE_K>::run(q, k, v, k_cache, v_cache,
                                                                                 cos_sin_cache, positions, out_loc);
    } else {
      RopeKVLaunch<T, CacheT, IdxT, LocT, HEAD_DIM, ROT, NEOX, 1, ROTATE_K>::run(q, k, v, k_cache, v_cache,
                                                                              cos_sin_cache, positions, out_loc);
    }
  }
};

}  // namespace sgljit_rope

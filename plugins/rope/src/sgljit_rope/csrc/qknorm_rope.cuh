// qknorm_rope: per-head RMSNorm of q and k followed by rotary embedding, in place, one pass over each
// head (Qwen3-class attention: q_norm / k_norm, then rope).
//
// Numerics: the unfused chain qknorm then apply_rope. y = x * rsqrt(mean(x^2) + eps) * w in fp32,
// rounded to the element type (what qknorm stores), then the first ROT dims of y rotated in fp32 and
// rounded again (what apply_rope stores); dims [ROT, HEAD_DIM) keep y. A position outside [0, max_pos)
// leaves its token normalized and unrotated; no index reaches memory out of bounds.
//
// Layout. A head is kPairs = HEAD_DIM / (2 VEC) *vector pairs* of two VEC-element vectors. Pair j <
// kRotPairs = ROT / (2 VEC) rotates: neox, the vectors at j*VEC and ROT/2 + j*VEC (element e of one
// and element e of the other are a rotary pair); gptj, the adjacent vectors at 2j*VEC (whole pairs in
// each). Both styles rotate pair j by cos/sin [j*VEC, j*VEC + VEC). Pair j >= kRotPairs is the tail's
// two vectors at 2j*VEC. A *lane group* of kLanes threads (a power of two <= 32) owns a head; lane l
// holds pairs l, l + kLanes, ..., so every rotation stays in one thread and the sum of squares takes
// log2(kLanes) xor shuffles inside the group (mask: the group's lanes only).
// A *work item* is (token, chunk of up to kHeads heads of q or of k): the group issues its heads'
// loads, then the weight's, the position's and the cos/sin row's, reduces the heads' sums together,
// then normalizes, rounds, rotates and stores each head. One block per kGroups items. Programmatic
// dependent launch as apply_rope (rope.cuh): blocks of grids of at most one block per SM, and of the
// first wave of larger grids, prefetch their heads and position into L2 before the wait; stores are
// streaming (evict-first) while the heads fit in L2.
#pragma once

#include "rope.cuh"  // HeadVec, l2_prefetch_blocks, widest_vec, vectors_fit, the checks

#include <sgljit/cuda.cuh>
#include <sgljit/reduce.cuh>
#include <sgljit/tensor.h>
#include <sgljit/type.cuh>
#include <sgljit/utils.h>
#include <sgljit/vec.cuh>

#include <cstdint>
#include <limits>

namespace sgljit_rope {

using namespace sgljit;

template <typename T, int HEAD_DIM, int ROT, int VEC>
struct QKNormRopeConfig {
  static_assert(ROT > 0 && ROT <= HEAD_DIM && HEAD_DIM % (2 * VEC) == 0 && ROT % (2 * VEC) == 0,
                "head_dim and rotary_dim must be multiples of 2 * VEC, rotary_dim <= head_dim");
  static constexpr int kPairs = HEAD_DIM / (2 * VEC);
  static constexpr int kRotPairs = ROT / (2 * VEC);
  static constexpr int kLanes = kPairs >= 32 ? 32 : pow2_ceil(kPairs);
  static constexpr int kPairsPerLane = (kPairs + kLanes - 1) / kLanes;
  static constexpr bool kEveryLaneFull = kPairs % kLanes == 0;
  // Heads per item: two heads of one pair a lane (4 vectors in flight a thread, as apply_rope's two
  // heads of 16-byte vectors; cos/sin and the weight are read once per item), else one.
  static constexpr int kHeads = kPairsPerLane == 1 ? 2 : 1;
  static constexpr int kBlockTarget = 128;  // threads per block, as apply_rope (many small blocks per SM)
  static constexpr int kGroups = kLanes >= kBlockTarget ? 1 : kBlockTarget / kLanes;
  static constexpr int kBlock = kLanes * kGroups;
  // Registers a thread: 72 (7 blocks of 128 per SM) hold two heads of one pair a lane, the weight and
  // cos/sin without spilling (64 spill); heads of more than 2 pairs a lane (only 1- or 2-element
  // vectors of heads of 512+) get 128.
  static constexpr int kRegs = kPairsPerLane <= 2 ? 72 : 128;
  static constexpr int kMinBlocks = 65536 / (kRegs * kBlock) > 0 ? 65536 / (kRegs * kBlock) : 1;
  // cos/sin are fp32: loaded at most 4 floats (16 bytes) at a time.
  static constexpr int kCosVec = VEC < 4 ? VEC : 4;
};

struct QKNormRopeParams {
  int64_t num_items;  // tokens * chunks
  int32_t chunks;     // chunks of heads per token: q's first, then k's
  int32_t q_chunks;
  int32_t q_heads, k_heads;
  int64_t q_stride_t, q_stride_h;
  int64_t k_stride_t, k_stride_h;
  int64_t cache_stride;  // cos_sin_cache row stride
  int64_t max_pos;
  float eps;
  int32_t prefetch_blocks;  // blocks [0, prefetch_blocks) prefetch their heads before the PDL wait
};

// Element offsets in the head of the two vectors of pair j.
template <int VEC, int ROT_PAIRS, bool NEOX>
SGLJIT_DEVICE int pair_first(int j) {
  return (NEOX && j < ROT_PAIRS ? j : 2 * j) * VEC;
}
template <int VEC, int ROT_PAIRS, bool NEOX>
SGLJIT_DEVICE int pair_second(int j) {
  return (NEOX && j < ROT_PAIRS ? ROT_PAIRS + j : 2 * j + 1) * VEC;
}

template <typename T, typename IdxT, int HEAD_DIM, int ROT, bool NEOX, int VEC, bool kStream>
__global__ void __launch_bounds__(QKNormRopeConfig<T, HEAD_DIM, ROT, VEC>::kBlock,
                                  QKNormRopeConfig<T, HEAD_DIM, ROT, VEC>::kMinBlocks)
    qknorm_rope_kernel(T* __restrict__ q, T* __restrict__ k, const T* __restrict__ q_weight,
                       const T* __restrict__ k_weight, const float* __restrict__ cos_sin,
                       const IdxT* __restrict__ positions, const QKNormRopeParams p) {
  using C = QKNormRopeConfig<T, HEAD_DIM, ROT, VEC>;
  using Vec = HeadVec<T, VEC>;  // (also the weight's vectors)
  constexpr int H = C::kHeads;
  constexpr int M = C::kPairsPerLane;
  const int lane = threadIdx.x % C::kLanes;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * C::kGroups + threadIdx.x / C::kLanes;
  if (item >= p.num_items) return;  // a whole group: no shuffle waits for it
  const int64_t t = item / p.chunks;
  const int chunk = static_cast<int>(item - t * p.chunks);
  const bool is_q = chunk < p.q_chunks;
  const int h0 = (is_q ? chunk : chunk - p.q_chunks) * H;
  const int nheads = min(H, (is_q ? p.q_heads : p.k_heads) - h0);
  const int64_t hs = is_q ? p.q_stride_h : p.k_stride_h;
  T* base = is_q ? q + t * p.q_stride_t + h0 * hs : k + t * p.k_stride_t + h0 * hs;
  const T* weight = is_q ? q_weight : k_weight;
  auto pair_of = [&](int m) { return lane + m * C::kLanes; };
  auto has = [&](int m) { return C::kEveryLaneFull || pair_of(m) < C::kPairs; };

  if (static_cast<int>(blockIdx.x) < p.prefetch_blocks) {
#pragma unroll
    for (int h = 0; h < H; ++h) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (h < nheads && has(m)) {
          prefetch_l2(base + h * hs + pair_first<VEC, C::kRotPairs, NEOX>(pair_of(m)));
          prefetch_l2(base + h * hs + pair_second<VEC, C::kRotPairs, NEOX>(pair_of(m)));
        }
      }
    }
    if (lane == 0) prefetch_l2(positions + t);
  }
  pdl_wait();  // q, k, positions may be written by the previous kernel
  pdl_launch_dependents();

  // Loads: the heads, then what does not depend on them; cos/sin wait for the position only.
  Vec a[H][M], b[H][M];
#pragma unroll
  for (int h = 0; h < H; ++h) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (h < nheads && has(m)) {
        a[h][m].load(base + h * hs + pair_first<VEC, C::kRotPairs, NEOX>(pair_of(m)));
        b[h][m].load(base + h * hs + pair_second<VEC, C::kRotPairs, NEOX>(pair_of(m)));
      }
    }
  }
  Vec wa[M], wb[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    if (has(m)) {
      wa[m].load(weight + pair_first<VEC, C::kRotPairs, NEOX>(pair_of(m)));
      wb[m].load(weight + pair_second<VEC, C::kRotPairs, NEOX>(pair_of(m)));
    }
  }
  const IdxT pos = positions[t];
  // in_range, the cos/sin loads and the rotation are rope.cuh's, spelled out: through its helpers
  // (in_range, load_cos_sin, rotate) this kernel compiles to different, equivalent machine code.
  const bool rotate = static_cast<int64_t>(pos) >= 0 && static_cast<int64_t>(pos) < p.max_pos;
  float c[M][VEC], s[M][VEC];
  if (rotate) {
    const float* row = cos_sin + static_cast<int64_t>(pos) * p.cache_stride;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (pair_of(m) < C::kRotPairs) {
#pragma unroll
        for (int i = 0; i < VEC; i += C::kCosVec) {
          AlignedVector<float, C::kCosVec> cv, sv;
          cv.load(row + pair_of(m) * VEC + i);
          sv.load(row + ROT / 2 + pair_of(m) * VEC + i);
#pragma unroll
          for (int e = 0; e < C::kCosVec; ++e) {
            c[m][i + e] = cv[e];
            s[m][i + e] = sv[e];
          }
        }
      }
    }
  }

  // Sums of squares, reduced over the group for all heads at once.
  float ss[H];
#pragma unroll
  for (int h = 0; h < H; ++h) {
    ss[h] = 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (h < nheads && has(m)) {
        float x[2 * VEC];
        a[h][m].to_floats(x);
        b[h][m].to_floats(x + VEC);
#pragma unroll
        for (int e = 0; e < 2 * VEC; ++e) ss[h] += x[e] * x[e];
      }
    }
  }
  warp_reduce_sum<C::kLanes>(ss, group_mask<C::kLanes>());

#pragma unroll
  for (int h = 0; h < H; ++h) {
    if (h >= nheads) break;
    const float inv_rms = rsqrtf(ss[h] / static_cast<float>(HEAD_DIM) + p.eps);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (!has(m)) continue;
      float x[2 * VEC], w[2 * VEC];
      a[h][m].to_floats(x);
      b[h][m].to_floats(x + VEC);
      wa[m].to_floats(w);
      wb[m].to_floats(w + VEC);
#pragma unroll
      for (int e = 0; e < 2 * VEC; ++e) x[e] = round_to<T>(x[e] * inv_rms * w[e]);  // qknorm's output
      if (rotate && pair_of(m) < C::kRotPairs) {
        float y[2 * VEC];
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          // neox: pair i is (a[i], b[i]); gptj: pair i is elements (2i, 2i + 1) of a ++ b.
          const int i1 = NEOX ? i : 2 * i;
          const int i2 = NEOX ? VEC + i : 2 * i + 1;
          y[i1] = x[i1] * c[m][i] - x[i2] * s[m][i];
          y[i2] = x[i2] * c[m][i] + x[i1] * s[m][i];
        }
#pragma unroll
        for (int e = 0; e < 2 * VEC; ++e) x[e] = y[e];
      }
      a[h][m].from_floats(x);
      b[h][m].from_floats(x + VEC);
      a[h][m].template store_out<kStream>(base + h * hs + pair_first<VEC, C::kRotPairs, NEOX>(pair_of(m)));
      b[h][m].template store_out<kStream>(base + h * hs + pair_second<VEC, C::kRotPairs, NEOX>(pair_of(m)));
    }
  }
}

// One vector width's launch (the entry point below chose it).
template <typename T, typename IdxT, int HEAD_DIM, int ROT, bool NEOX, int VEC>
struct QKNormRopeLaunch {
  using C = QKNormRopeConfig<T, HEAD_DIM, ROT, VEC>;

  static void run(TensorView q, TensorView k, TensorView q_weight, TensorView k_weight, TensorView cos_sin_cache,
                  TensorView positions, double eps) {
    const int64_t n = q.size(0);
    QKNormRopeParams p{};
    p.q_heads = static_cast<int32_t>(q.size(1));
    p.k_heads = static_cast<int32_t>(k.size(1));
    p.q_chunks = div_ceil(p.q_heads, C::kHeads);
    p.chunks = p.q_chunks + div_ceil(p.k_heads, C::kHeads);
    p.num_items = n * p.chunks;
    p.q_stride_t = q.stride(0);
    p.q_stride_h = q.stride(1);
    p.k_stride_t = k.stride(0);
    p.k_stride_h = k.stride(1);
    p.cache_stride = cos_sin_cache.stride(0);
    p.max_pos = cos_sin_cache.size(0);
    p.eps = static_cast<float>(eps);
    if (p.num_items == 0) return;
    const int64_t blocks = div_ceil<int64_t>(p.num_items, C::kGroups);
    RuntimeCheck(blocks <= std::numeric_limits<int32_t>::max(), "q: ", n, " tokens of ", p.q_heads, " + ", p.k_heads,
                 " heads are more work items than one launch holds");
    const DLDevice device = q.device();
    // Streaming stores where the heads fit in L2: otherwise the whole output stays in L2 as dirty lines,
    // written back while the next kernels run.
    const int64_t head_bytes = n * (p.q_heads + p.k_heads) * int64_t{HEAD_DIM} * int64_t{sizeof(T)};
    const bool stream = head_bytes <= l2_bytes(device.device_id);
    if (stream) {
      launch<qknorm_rope_kernel<T, IdxT, HEAD_DIM, ROT, NEOX, VEC, true>>(q, k, q_weight, k_weight, cos_sin_cache,
                                                                          positions, p, static_cast<int>(blocks));
    } else {
      launch<qknorm_rope_kernel<T, IdxT, HEAD_DIM, ROT, NEOX, VEC, false>>(q, k, q_weight, k_weight, cos_sin_cache,
                                                                           positions, p, static_cast<int>(blocks));
    }
  }

  template <auto kernel>
  static void launch(TensorView q, TensorView k, TensorView q_weight, TensorView k_weight, TensorView cos_sin_cache,
                     TensorView positions, QKNormRopeParams p, int grid) {
    const DLDevice device = q.device();
    p.prefetch_blocks = l2_prefetch_blocks<kernel>(grid, C::kBlock, device.device_id);  // as apply_rope's
    LaunchKernel(kernel, grid, C::kBlock, 0, device, "sgljit_rope::qknorm_rope_kernel").pdl()(
        static_cast<T*>(q.data_ptr()), static_cast<T*>(k.data_ptr()), static_cast<const T*>(q_weight.data_ptr()),
        static_cast<const T*>(k_weight.data_ptr()), static_cast<const float*>(cos_sin_cache.data_ptr()),
        static_cast<const IdxT*>(positions.data_ptr()), p);
  }
};

// The entry point. Shapes, strides (unit last dimension), dtypes, devices and overlap were checked by
// the code sgljit.op generates from the op's declared arguments (ops.py); here only what the
// specialization assumes (its dtypes, sizes and style), then kVec-element vectors where every pointer
// and stride allows them (as apply_rope), else 1-element vectors.
template <typename T, typename IdxT, int HEAD_DIM, int ROT, bool NEOX>
struct QKNormRope {
  static constexpr int kVec = widest_vec<T, HEAD_DIM / 2, ROT / 2>();

  static void run(TensorView q, TensorView k, TensorView q_weight, TensorView k_weight, TensorView cos_sin_cache,
                  TensorView positions, double eps, bool is_neox) {
    check_module_dtype<T>(q, "q");
    check_module_dtype<IdxT>(positions, "positions");
    check_style(is_neox, NEOX);
    check_head_dim(q, HEAD_DIM);
    check_rotary_width(cos_sin_cache, ROT);
    constexpr int64_t kVecAlign = kVec * sizeof(T);
    if (vectors_fit<T, float>(kVec, {&q, &k}, cos_sin_cache) && is_aligned(q_weight.data_ptr(), kVecAlign) &&
        is_aligned(k_weight.data_ptr(), kVecAlign)) {
      QKNormRopeLaunch<T, IdxT, HEAD_DIM, ROT, NEOX, kVec>::run(q, k, q_weight, k_weight, cos_sin_cache, positions,
                                                                eps);
    } else {
      QKNormRopeLaunch<T, IdxT, HEAD_DIM, ROT, NEOX, 1>::run(q, k, q_weight, k_weight, cos_sin_cache, positions, eps);
    }
  }
};

}  // namespace sgljit_rope

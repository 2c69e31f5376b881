// Per-token-group FP8 quantization, CUDA: the entry point of per_token_group_quant_fp8 (GroupQuantFp8)
// and its kernel. One module per (input dtype, fp8 dtype, group size G).
//
// Contract: input [T, H] (any row stride, unit last stride), groups of G consecutive elements of a row.
// Per group: s = max(absmax / fp8_max, eps) in fp32 (true division; a NaN in the group gives a NaN
// scale, an inf an inf scale), with ue8m0 rounded up to a power of two on its bits (ue8m0_ceil);
// scales[t, g] = s through both strides (row-major, column-major or any other non-overlapping layout);
// out = quantize(x / s), bit-identical to the reference (the division and conversion of common.cuh).
//
// Design (memory-bound: the input read once, fp8 and scales written once): a group is held by kLanes
// lanes (8 for 16-bit inputs at G = 128), lane l holding its vectors l + k * kLanes, so each load
// instruction of a warp covers whole 128-byte lines; a warp holds 32 / kLanes groups side by side, and
// each lane R groups ("rounds": R = 1, 2 or 4, the largest that still gives about
// GroupConfig::kThreadsPerSm threads per SM), every load issued before the first use. The absmax is
// reduced by log2(kLanes) shuffles. Groups are numbered row by row and a block's are consecutive (one
// contiguous range of a row, or a few rows). Data whose pointer or row stride is not a multiple of 16
// bytes runs the same kernel with one-element vectors. Launched with PDL; grids of up to one block per
// SM prefetch their groups into L2 before the wait (as the rows kernel).
// Column tiles (kTiles): where the scales' token stride is 1 (column-major) and the input exceeds the
// L2 (smaller inputs collect their scale lines in L2 anyway, and there tiles measured slower), a block
// owns a tile of TT tokens x RC group columns (RC = min(R, per_row) rounded down to a power of two,
// TT = groups-per-block x R / RC): round r takes
// column r % RC and tokens (r / RC) x groups-per-block + [0, groups-per-block), consecutive groups of a
// warp being consecutive tokens, so its scale stores hit consecutive floats; blocks run along a tile
// row (column tiles fastest), so a wave still reads whole rows of the input.
//
// MoE layouts (the kernel's Layout parameter; the dense instantiation is the code above): kMasked takes
// input [E, T_pad, H] and quantizes rows t < masked_m[e] of expert e (masked_m clamped to [0, T_pad]: a
// bad count never reaches memory past the expert), grid (blocks, E), each expert's groups a dense range
// its blocks stride over (blocks sized from the expected-m hint); kSorted takes the rows of the sorted
// MoE layout and quantizes row i only where i < num_tokens_post_padded[0] and sorted_token_ids[i] <
// num_valid_tokens (unsigned: negative ids are padding too), loading nothing for the others. Rows left
// out keep their contents (out and scales). Q may be int8_t (symmetric: scale absmax / 127, codes
// round-to-nearest-even of x / s, clamped to +-127).
#pragma once

#include "common.cuh"

#include <sgljit/tensor.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace sgljit_quant_fp8 {

using namespace sgljit;

struct GroupConfig {
  static constexpr int kThreads = 128;       // block size, as the rows kernel's
  static constexpr int kVecsPerLane = 2;     // vectors of one group per lane: 8 lanes for 128 bf16
  static constexpr int kMaxRounds = 4;       // groups per lane: 8 vectors (128 B) in flight, as kChunkMaxN
  // the rounds choice aims at this: a full SM, rounds only beyond (7168 x 1024: 0.91x 512's two rounds)
  static constexpr int kThreadsPerSm = 2048;
  // Group indices are int32: the largest grid's last block may index R * groups-per-block past the end.
  static constexpr int64_t kMaxGroups = INT32_MAX - 4096;
};

enum class Layout { kDense, kMasked, kSorted };

// The largest code of the output type: the scale is absmax / this.
template <typename Q>
inline constexpr float kQuantMax = Fp8<Q>::kMax;
template <>
inline constexpr float kQuantMax<int8_t> = 127.0f;

// The ue8m0 scale of s: 2^ceil(log2(s)) for a positive normal s, exactly (finite s above 2^127: inf);
// inf and NaN unchanged.
SGLJIT_DEVICE float ue8m0_ceil(float s) {
  const uint32_t b = __float_as_uint(s);
  return (b & 0x7fffffu) && b < 0x7f800000u ? __uint_as_float((b | 0x7fffffu) + 1u) : s;
}

// How a group of G elements maps onto lanes for VEC-element vectors.
template <int G, int VEC>
struct GroupShape {
  static constexpr int kVecs = G / VEC;
  static constexpr int kLanes = kVecs / GroupConfig::kVecsPerLane >= 32 ? 32
                                : kVecs / GroupConfig::kVecsPerLane >= 1 ? kVecs / GroupConfig::kVecsPerLane
                                                                         : 1;
  static constexpr int kPerLane = kVecs / kLanes;  // vectors per lane
  static constexpr int kPerBlock = GroupConfig::kThreads / kLanes;  // groups per block and round
  static_assert(G % VEC == 0 && kVecs % kLanes == 0 && (kLanes & (kLanes - 1)) == 0, "GroupShape");
};

template <typename T>
struct GroupArgs {
  const T* in;
  int64_t in_stride;
  uint8_t* out;
  int64_t out_stride;
  float* scales;
  int64_t scale_stride_t, scale_stride_g;
  int num_groups, groups_per_row;
  float eps;
  bool ue8m0;
  bool prefetch;  // prefetch the block's groups into L2 before the PDL wait (16-byte vectors only)
  int tile_log2_cols;  // column tiles: log2(RC), RC group columns a tile
  int col_tiles;       // column tiles: tiles across a row, ceil(groups_per_row / RC)
  int rows;            // T
};

// The MoE layouts' arguments (see the header); the dense kernel's stay GroupArgs alone.
template <typename T>
struct MoeGroupArgs : GroupArgs<T> {
  const void* masked_m;  // [E] int32 or int64 (masked_m_64)
  bool masked_m_64;
  int tokens_pad;
  int64_t in_expert_stride, out_expert_stride, scale_expert_stride;
  const int32_t* sorted_ids;  // at least `rows` entries
  const int32_t* num_post;    // [1]
  uint32_t num_valid;
};

template <typename T, Layout kLayout>
using ArgsOf = std::conditional_t<kLayout == Layout::kDense, GroupArgs<T>, MoeGroupArgs<T>>;

// int8 codes of VEC elements: round-to-nearest-even of x / s (IEEE division), clamped to +-127; NaN
// gives 0 (the conversion's rule).
template <typename T, int VEC>
SGLJIT_DEVICE void quantize_store_int8(const typename Io<T, VEC>::V& v, float s, uint8_t* dst) {
  uint8_t b[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int q = __float2int_rn(__fdiv_rn(Io<T, VEC>::get(v, i), s));
    b[i] = static_cast<uint8_t>(static_cast<int8_t>(max(-127, min(127, q))));
  }
  typename Io<T, VEC>::Out raw;
  memcpy(&raw, b, sizeof(raw));
  store_raw<true>(dst, raw);
}

// Block `block` of a dense range of groups (a's pointers, num_groups and rows): the dense and sorted
// kernels run it once, the masked kernel once per block of its expert.
template <typename T, typename Q, int G, int VEC, int R, bool kTiles, Layout kLayout>
SGLJIT_DEVICE void group_block(const ArgsOf<T, kLayout>& a, const unsigned block) {
  using IO = Io<T, VEC>;
  using S = GroupShape<G, VEC>;
  constexpr int L = S::kLanes, K = S::kPerLane;
  const int lane = threadIdx.x % L;
  const int first = block * (R * S::kPerBlock) + threadIdx.x / L;
  // Out-of-range groups load the last group (clamped, so every load is unpredicated and issued before
  // the first use) and store nothing.
  int row[R], col[R];
  const T* src[R];
  bool live[R];  // in range (column tiles: not a suffix of the rounds where RC < R)
  if constexpr (kTiles) {
    const int lc = a.tile_log2_cols;
    const int bt = block / a.col_tiles, bc = block - bt * a.col_tiles;
    const int t0 = bt * ((R * S::kPerBlock) >> lc) + threadIdx.x / L;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int t = t0 + (r >> lc) * S::kPerBlock, c = (bc << lc) + (r & ((1 << lc) - 1));
      live[r] = t < a.rows && c < a.groups_per_row;
      row[r] = min(t, a.rows - 1);
      col[r] = min(c, a.groups_per_row - 1);
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int gi = min(first + r * S::kPerBlock, a.num_groups - 1);
      row[r] = gi / a.groups_per_row;
      col[r] = gi - row[r] * a.groups_per_row;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) src[r] = a.in + row[r] * a.in_stride + int64_t(col[r]) * G;
  if constexpr (kLayout == Layout::kDense && sizeof(T) * VEC == 16) {
    if (a.prefetch && lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) prefetch_l2_bulk(src[r], G * sizeof(T));
    }
  }
  if constexpr (kLayout != Layout::kMasked) {  // the masked kernel waits before reading masked_m
    pdl_wait();
    pdl_launch_dependents();
  }
  if constexpr (kLayout == Layout::kSorted) {
    // Padding rows load nothing; the ids are read as unsigned, so a negative id is padding.
    const int post = *a.num_post;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      live[r] = first + r * S::kPerBlock < a.num_groups && row[r] < post &&
                static_cast<uint32_t>(a.sorted_ids[row[r]]) < a.num_valid;
    }
  }

  typename IO::V x[R][K];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if constexpr (kLayout == Layout::kSorted) {
      if (!live[r]) continue;
    }
#pragma unroll
    for (int k = 0; k < K; ++k) x[r][k] = IO::template load<true>(src[r] + (lane + k * L) * VEC);
  }
  // A group's lanes shuffle among themselves (they agree on whether it is in range): a round out of
  // range ends the lane's work, and every later round is further out (column tiles: skips the round).
  const unsigned mask = group_mask<L>();
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if constexpr (kTiles || kLayout == Layout::kSorted) {
      if (!live[r]) continue;
    } else {
      if (first + r * S::kPerBlock >= a.num_groups) break;
    }
    AbsMax<T, VEC> acc;
#pragma unroll
    for (int k = 0; k < K; ++k) acc.add(x[r][k]);
    const uint32_t m = warp_reduce_max<L>(acc.bits(), mask);
    float s = __fdiv_rn(__uint_as_float(m), kQuantMax<Q>);
    s = s < a.eps ? a.eps : s;  // NaN compares false: stays NaN
    if (a.ue8m0) s = ue8m0_ceil(s);
    if (lane == 0) a.scales[row[r] * a.scale_stride_t + col[r] * a.scale_stride_g] = s;
    uint8_t* dst = a.out + row[r] * a.out_stride + int64_t(col[r]) * G;
    if constexpr (std::is_same_v<Q, int8_t>) {
#pragma unroll
      for (int k = 0; k < K; ++k) quantize_store_int8<T, VEC>(x[r][k], s, dst + (lane + k * L) * VEC);
      continue;
    }
    using F = std::conditional_t<std::is_same_v<Q, int8_t>, fp8_e4m3_t, Q>;  // Q (int8 never gets here)
    const Divider div(s);
    if (Divider::fast(s)) {
      // s >= absmax / fp8_max bounds every quotient; m's sign bit is 0 (see Io::opaque)
      constexpr int kMode = kFastQuotient<T, true>;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        IO::template quantize_store<F, kMode>(IO::opaque(x[r][k], m >> 31), div, dst + (lane + k * L) * VEC);
      }
    } else {
      // NaN, inf or extreme scales: re-read (from L2) rather than keep the registers live on both paths
      for (int k = 0; k < K; ++k) {
        const int j = (lane + k * L) * VEC;
        IO::template quantize_store<F, kDivide>(IO::template load<false>(src[r] + j), div, dst + j);
      }
    }
  }
}

template <typename T, typename Q, int G, int VEC, int R, bool kTiles, Layout kLayout = Layout::kDense>
__global__ __launch_bounds__(GroupConfig::kThreads) void group_kernel(const ArgsOf<T, kLayout> a) {
  if constexpr (kLayout == Layout::kMasked) {
    using S = GroupShape<G, VEC>;
    pdl_wait();
    const int e = blockIdx.y;
    const int64_t count = a.masked_m_64 ? static_cast<const int64_t*>(a.masked_m)[e]
                                        : int64_t(static_cast<const int32_t*>(a.masked_m)[e]);
    const int m = int(count < 0 ? 0 : count > a.tokens_pad ? a.tokens_pad : count);
    MoeGroupArgs<T> b = a;
    b.in += e * a.in_expert_stride;
    b.out += e * a.out_expert_stride;
    b.scales += e * a.scale_expert_stride;
    b.num_groups = m * a.groups_per_row;
    for (unsigned block = blockIdx.x; int(block * (R * S::kPerBlock)) < b.num_groups; block += gridDim.x) {
      group_block<T, Q, G, VEC, R, false, kLayout>(b, block);
    }
    pdl_launch_dependents();
  } else {
    group_block<T, Q, G, VEC, R, kTiles, kLayout>(a, blockIdx.x);
  }
}

// The entry point. Shapes, strides, dtypes, devices and overlap were checked by the code sgljit.op
// generates from the op's declared arguments (ops.py): input [T, H] and out [T, H] with unit last
// stride, scales fp32 [T, groups] (any strides, elements distinct), 16 <= group_size <= 256, eps a
// positive normal fp32 value. Here what the MoE layouts' specs cannot say (the messages of moe.py's
// _check; the dense op's spec says them too) and what this module adds.
template <typename T, typename Q, int G>
struct GroupQuantFp8 {
  static constexpr int kVec = kVecSize<T>;  // 16 bytes of input

  static void run(TensorView input, TensorView out, TensorView scales, int64_t group_size, double eps,
                  bool scale_ue8m0) {
    check_module_dtype<T>(input, "input", "dtype ");
    check_module_dtype<Q>(out, "out", "dtype ");
    RuntimeCheck(group_size == G, "group_size: this module was compiled for group size ", G, ", got ", group_size);
    const int64_t rows = input.size(0), hidden = input.size(1);
    RuntimeCheck(hidden % G == 0, "group_size: must divide input's last dimension ", hidden, ", got ", G);
    const int64_t per_row = hidden / G;
    RuntimeCheck(scales.size(1) == per_row, "scales: dimension 1 expected ", per_row,
                 " (input's last dimension / group_size), got ", scales.size(1));
    const int64_t groups = rows * per_row;
    if (groups == 0) return;
    RuntimeCheck(groups <= GroupConfig::kMaxGroups, "input: more than ", GroupConfig::kMaxGroups,
                 " groups are not supported, got ", groups);
    GroupArgs<T> a{};
    a.in = static_cast<const T*>(input.data_ptr());
    a.in_stride = input.stride(0);
    a.out = static_cast<uint8_t*>(out.data_ptr());
    a.out_stride = out.stride(0);
    a.scales = static_cast<float*>(scales.data_ptr());
    a.scale_stride_t = scales.stride(0);
    a.scale_stride_g = scales.stride(1);
    a.num_groups = int(groups);
    a.groups_per_row = int(per_row);
    a.eps = static_cast<float>(eps);
    a.ue8m0 = scale_ue8m0;
    const bool vec_ok = is_aligned(a.in, 16) && is_aligned(a.out, kVec) &&
                        (rows == 1 || (a.in_stride % kVec == 0 && a.out_stride % kVec == 0));
    if (vec_ok) {
      launch<kVec>(a, input.device());
    } else {
      launch<1>(a, input.device());
    }
  }

  template <int VEC>
  static void launch(GroupArgs<T> a, DLDevice dev) {
    using S = GroupShape<G, VEC>;
    const int64_t threads = int64_t(a.num_groups) * S::kLanes;  // at one round
    const int64_t target = int64_t(num_sms(dev.device_id)) * GroupConfig::kThreadsPerSm;
    static_assert(GroupConfig::kMaxRounds == 4, "launch: rounds 1, 2, 4");
    const int R = threads >= 4 * target ? 4 : threads >= 2 * target ? 2 : 1;
    const int64_t rows = a.num_groups / a.groups_per_row;
    int64_t grid = div_ceil<int64_t>(a.num_groups, int64_t(R) * S::kPerBlock);
    // Column tiles (see the header); RC the most columns up to R, a power of two dividing it.
    const int64_t in_bytes = a.num_groups * int64_t(G) * int64_t(sizeof(T));
    const bool tiles = a.scale_stride_t == 1 && rows >= S::kPerBlock &&
                       in_bytes > l2_bytes(dev.device_id);
    if (tiles) {
      const int lc = R >= 4 && a.groups_per_row >= 4 ? 2 : R >= 2 && a.groups_per_row >= 2 ? 1 : 0;
      a.rows = int(rows);
      a.tile_log2_cols = lc;
      a.col_tiles = int(div_ceil<int64_t>(a.groups_per_row, int64_t(1) << lc));
      grid = div_ceil<int64_t>(rows, (int64_t(R) * S::kPerBlock) >> lc) * a.col_tiles;
    }
    a.prefetch = grid <= num_sms(dev.device_id);
    auto go = [&](auto kernel) {
      LaunchKernel(kernel, dim3(grid), dim3(GroupConfig::kThreads), 0, dev, "per_token_group_quant_fp8").pdl()(a);
    };
    auto rounds = [&](auto tiles_c) {
      constexpr bool kTiles = decltype(tiles_c)::value;
      if (R == 4) {
        go(group_kernel<T, Q, G, VEC, 4, kTiles>);
      } else if (R == 2) {
        go(group_kernel<T, Q, G, VEC, 2, kTiles>);
      } else {
        go(group_kernel<T, Q, G, VEC, 1, kTiles>);
      }
    };
    tiles ? rounds(std::true_type{}) : rounds(std::false_type{});
  }

  // per_token_group_quant_int8: the dense op with int8 codes (fp32 scales, never ue8m0).
  static void run_int8(TensorView input, TensorView out, TensorView scales, int64_t group_size, double eps) {
    run(input, out, scales, group_size, eps, false);
  }

  // The masked layout: input, out [E, T_pad, H], scales [E, T_pad, groups], masked_m [E] (int32 or int64).
  // expected_m: the tokens an expert is expected to hold (<= 0: unknown), for the grid only.
  static void run_masked(TensorView input, TensorView out, TensorView scales, TensorView masked_m, int64_t group_size,
                         double eps, bool scale_ue8m0, int64_t expected_m) {
    const int64_t experts = input.size(0), pad = input.size(1);
    const int64_t per_row = checked_groups_per_row(input, out, scales, 1, group_size, scale_ue8m0);
    if (experts == 0 || pad * per_row == 0) return;
    RuntimeCheck(pad * per_row <= GroupConfig::kMaxGroups, "input: more than ", GroupConfig::kMaxGroups,
                 " groups an expert are not supported, got ", pad * per_row);
    RuntimeCheck(experts <= 65535, "input: at most 65535 experts (dimension 0) are supported, got ", experts);
    MoeGroupArgs<T> a{};
    fill(a, input, out, scales, 1, per_row, eps, scale_ue8m0);
    a.num_groups = int(pad * per_row);
    a.masked_m = masked_m.data_ptr();
    a.masked_m_64 = masked_m.dtype().bits == 64;
    a.tokens_pad = int(pad);
    a.in_expert_stride = input.stride(0);
    a.out_expert_stride = out.stride(0);
    a.scale_expert_stride = scales.stride(0);
    const bool vec_ok = vectors_ok(a) && a.in_expert_stride % kVec == 0 && a.out_expert_stride % kVec == 0;
    const int64_t expected = expected_m > 0 ? std::min(expected_m, pad) : pad;
    if (vec_ok) {
      launch_masked<kVec>(a, int(experts), expected, input.device());
    } else {
      launch_masked<1>(a, int(experts), expected, input.device());
    }
  }

  // The sorted layout: input, out [M, H], scales [M, groups]; row i is quantized where i <
  // num_tokens_post_padded[0] and sorted_token_ids[i] < num_valid_tokens.
  static void run_sorted(TensorView input, TensorView out, TensorView scales, TensorView sorted_token_ids,
                         TensorView num_tokens_post_padded, int64_t num_valid_tokens, int64_t group_size, double eps,
                         bool scale_ue8m0) {
    const int64_t rows = input.size(0);
    const int64_t per_row = checked_groups_per_row(input, out, scales, 0, group_size, scale_ue8m0);
    RuntimeCheck(sorted_token_ids.size(0) >= rows, "sorted_token_ids: expected at least ", rows,
                 " entries (one per row of input), got ", sorted_token_ids.size(0));
    const int64_t groups = rows * per_row;
    if (groups == 0) return;
    RuntimeCheck(groups <= GroupConfig::kMaxGroups, "input: more than ", GroupConfig::kMaxGroups,
                 " groups are not supported, got ", groups);
    MoeGroupArgs<T> a{};
    fill(a, input, out, scales, 0, per_row, eps, scale_ue8m0);
    a.num_groups = int(groups);
    a.sorted_ids = static_cast<const int32_t*>(sorted_token_ids.data_ptr());
    a.num_post = static_cast<const int32_t*>(num_tokens_post_padded.data_ptr());
    a.num_valid = static_cast<uint32_t>(num_valid_tokens);
    if (vectors_ok(a)) {
      launch_flat<kVec>(a, input.device());
    } else {
      launch_flat<1>(a, input.device());
    }
  }

 private:
  // The checks of run() for the token dimension `dim` of the MoE layouts; the groups a row.
  static int64_t checked_groups_per_row(const TensorView& input, const TensorView& out, const TensorView& scales,
                                        int dim, int64_t group_size, bool scale_ue8m0) {
    check_module_dtype<T>(input, "input", "dtype ");
    check_module_dtype<Q>(out, "out", "dtype ");
    RuntimeCheck(group_size == G, "group_size: this module was compiled for group size ", G, ", got ", group_size);
    const int64_t hidden = input.size(dim + 1);
    RuntimeCheck(hidden % G == 0, "group_size: must divide input's last dimension ", hidden, ", got ", G);
    RuntimeCheck(scales.size(dim + 1) == hidden / G, "scales: dimension ", dim + 1, " expected ", hidden / G,
                 " (input's last dimension / group_size), got ", scales.size(dim + 1));
    RuntimeCheck(!(std::is_same_v<Q, int8_t> && scale_ue8m0),
                 "scale_ue8m0: int8 output takes fp32 scales (absmax / 127), not ue8m0");
    return hidden / G;
  }

  static void fill(GroupArgs<T>& a, const TensorView& input, const TensorView& out, const TensorView& scales, int dim,
                   int64_t per_row, double eps, bool scale_ue8m0) {
    a.in = static_cast<const T*>(input.data_ptr());
    a.in_stride = input.stride(dim);
    a.out = static_cast<uint8_t*>(out.data_ptr());
    a.out_stride = out.stride(dim);
    a.scales = static_cast<float*>(scales.data_ptr());
    a.scale_stride_t = scales.stride(dim);
    a.scale_stride_g = scales.stride(dim + 1);
    a.groups_per_row = int(per_row);
    a.eps = static_cast<float>(eps);
    a.ue8m0 = scale_ue8m0;
  }

  static bool vectors_ok(const GroupArgs<T>& a) {
    return is_aligned(a.in, 16) && is_aligned(a.out, kVec) && a.in_stride % kVec == 0 && a.out_stride % kVec == 0;
  }

  // Rounds as the dense launch (for the groups expected), no column tiles, no prefetch.
  template <int VEC>
  static int rounds_for(int64_t groups, DLDevice dev) {
    const int64_t threads = groups * GroupShape<G, VEC>::kLanes;
    const int64_t target = int64_t(num_sms(dev.device_id)) * GroupConfig::kThreadsPerSm;
    return threads >= 4 * target ? 4 : threads >= 2 * target ? 2 : 1;
  }

  template <int VEC, Layout kLayout, typename Go>
  static void with_rounds(int R, Go go) {
    if (R == 4) {
      go(group_kernel<T, Q, G, VEC, 4, false, kLayout>);
    } else if (R == 2) {
      go(group_kernel<T, Q, G, VEC, 2, false, kLayout>);
    } else {
      go(group_kernel<T, Q, G, VEC, 1, false, kLayout>);
    }
  }

  template <int VEC>
  static void launch_flat(MoeGroupArgs<T> a, DLDevice dev) {
    using S = GroupShape<G, VEC>;
    const int R = rounds_for<VEC>(a.num_groups, dev);
    const int64_t grid = div_ceil<int64_t>(a.num_groups, int64_t(R) * S::kPerBlock);
    with_rounds<VEC, Layout::kSorted>(R, [&](auto kernel) {
      LaunchKernel(kernel, dim3(grid), dim3(GroupConfig::kThreads), 0, dev, "per_token_group_quant (sorted)").pdl()(a);
    });
  }

  // Grid (blocks, E): an expert's blocks cover `expected` tokens, and together at least one wave of the
  // GPU (the counts are on the device); the kernel's blocks stride over the expert's actual groups.
  template <int VEC>
  static void launch_masked(MoeGroupArgs<T> a, int experts, int64_t expected, DLDevice dev) {
    using S = GroupShape<G, VEC>;
    const int R = rounds_for<VEC>(experts * expected * a.groups_per_row, dev);
    const int64_t per_block = int64_t(R) * S::kPerBlock;
    const int64_t most = div_ceil<int64_t>(a.num_groups, per_block);
    const int64_t wave = int64_t(num_sms(dev.device_id)) * (GroupConfig::kThreadsPerSm / GroupConfig::kThreads);
    const int64_t want = std::max(div_ceil<int64_t>(expected * a.groups_per_row, per_block), div_ceil<int64_t>(wave, experts));
    const dim3 grid(unsigned(std::max<int64_t>(1, std::min(most, want))), unsigned(experts));
    with_rounds<VEC, Layout::kMasked>(R, [&](auto kernel) {
      LaunchKernel(kernel, grid, dim3(GroupConfig::kThreads), 0, dev, "per_token_group_quant (masked)").pdl()(a);
    });
  }
};

}  // namespace sgljit_quant_fp8

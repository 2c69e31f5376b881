// SiLU-and-mul fused with per-token-group fp8 quantization, CUDA (SiluAndMulQuantFp8<T, Q, G>::run).
// One module per (input dtype, fp8 dtype, group size G).
//
// Contract: input [T, 2d] (any row stride, unit last stride); y = silu(gate) * up in fp32 exactly as the
// plain silu_and_mul kernel computes it (common.cuh's act_and_mul), never rounded to T; per group of G
// consecutive columns of y: s = max(absmax / fp8_max, eps) (true division; NaN in the group: NaN, inf:
// inf), with ue8m0 rounded up to a power of two on its bits; scales[t, g] = s through both strides;
// out[t, group] = (y / s).clamp(-fp8_max, fp8_max).to(fp8) with the correctly rounded division of core's
// fp8.cuh. These are sgljit-quant-fp8's per_token_group_quant_fp8 formulas and helpers, so the codes and
// scales are bit for bit per_token_group_quant_fp8(silu_and_mul(input in float32)).
//
// Design (memory-bound: gate and up read once, fp8 codes and scales written once; y never leaves
// registers): a group is held by kLanes lanes (8 for 16-bit inputs at G = 128), lane l holding vectors
// l + k * kLanes of its gate and of its up, so each warp load covers whole 128-byte lines; a warp holds
// 32 / kLanes groups side by side, and in large grids each lane QuantConfig::kRounds groups, every load
// issued before the first use. One pass a group: y, its absmax reduced by log2(kLanes) shuffles, the
// scale, the codes. Groups are numbered row by row, a block's consecutive. Inputs beyond the L2 are
// loaded and the codes stored evict-first, as activation.cuh's. Launched with PDL; grids of up to one
// block per SM prefetch their groups into L2 (one bulk request per gate and up range) before the wait.
// Data that is not whole 16-byte vectors (pointer, strides, d) runs the same kernel one element a vector.
#pragma once

#include "common.cuh"

#include <sgljit/fp8.cuh>
#include <sgljit/reduce.cuh>

namespace sgljit_activation {

struct QuantConfig {
  static constexpr int kThreads = 128;           // block size (quant_fp8's group kernel's)
  static constexpr int kVecsPerLane = 2;         // vectors of gate (and of up) a lane holds of one group
  static constexpr int kRounds = 2;              // groups a lane in large grids: 8 loads in flight per lane
  static constexpr int kThreadsPerSm = 1024;     // large grids: rounds only where this many threads per SM remain
  static constexpr int kPrefetchBlocksPerSm = 1;  // grids this small prefetch before the PDL wait
};

// How a group of G columns maps onto lanes for VEC-element vectors.
template <int G, int VEC>
struct GroupShape {
  static constexpr int kVecs = G / VEC;  // of gate, and of up
  static constexpr int kLanes = kVecs / QuantConfig::kVecsPerLane >= 32 ? 32
                                : kVecs / QuantConfig::kVecsPerLane >= 1 ? kVecs / QuantConfig::kVecsPerLane
                                                                         : 1;
  static constexpr int kPerLane = kVecs / kLanes;
  static constexpr int kPerBlock = QuantConfig::kThreads / kLanes;  // groups a block holds a round
  static_assert(G % VEC == 0 && kVecs % kLanes == 0 && (kLanes & (kLanes - 1)) == 0, "GroupShape");
};

// 2^ceil(log2(s)) of a positive normal s, exactly (finite s above 2^127: inf); inf and NaN unchanged
// (quant_fp8's group.cuh rounds ue8m0 scales the same way).
SGLJIT_DEVICE float ue8m0_ceil(float s) {
  const uint32_t b = __float_as_uint(s);
  return (b & 0x7fffffu) && b < 0x7f800000u ? __uint_as_float((b | 0x7fffffu) + 1u) : s;
}

template <typename T>
struct QuantArgs {
  const T* in;
  uint8_t* out;
  float* scales;
  int64_t in_stride, out_stride, scale_stride_t, scale_stride_g;
  int64_t hidden;        // d
  uint32_t groups;       // groups of this launch
  FastDiv per_row;       // groups a row
  float eps;
  bool ue8m0, prefetch;
};

// VEC codes of y / s (kMode: how Divider divides) stored in one instruction.
template <typename Q, int kMode, int VEC, bool kStream>
SGLJIT_DEVICE void store_codes(uint8_t* p, const float (&y)[VEC], const Divider& div) {
  typename RawBytes<VEC>::type raw;
  if constexpr (VEC == 1) {
    raw = to_fp8<Q>(div.template operator()<kMode>(y[0]));
  } else {
    uint16_t pairs[VEC / 2];
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
      pairs[i] = to_fp8x2<Q>(div.template operator()<kMode>(y[2 * i]), div.template operator()<kMode>(y[2 * i + 1]));
    }
    memcpy(&raw, pairs, sizeof(raw));
  }
  store_raw<kStream>(p, raw);
}

// store_codes' kMarksteinBounded codes, the same bits in fewer instructions: two products a value
// (sgljit::Bracket: where the codes of y * lo and y * hi agree they are the code of the correctly
// rounded y / s), Markstein's steps only for a vector whose two codes differ anywhere.
template <typename Q, int VEC, bool kStream>
SGLJIT_DEVICE void store_codes_bracket(uint8_t* p, const float (&y)[VEC], const Divider& div) {
  const Bracket bracket(div);
  uint16_t pairs[VEC / 2];
  uint32_t differ = 0;
#pragma unroll
  for (int i = 0; i < VEC / 2; ++i) {
    pairs[i] = to_fp8x2<Q>(y[2 * i] * bracket.lo, y[2 * i + 1] * bracket.lo);
    differ |= pairs[i] ^ to_fp8x2<Q>(y[2 * i] * bracket.hi, y[2 * i + 1] * bracket.hi);
  }
  if (differ) {
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
      pairs[i] = to_fp8x2<Q>(div.template operator()<kMarksteinBounded>(y[2 * i]),
                             div.template operator()<kMarksteinBounded>(y[2 * i + 1]));
    }
  }
  typename RawBytes<VEC>::type raw;
  memcpy(&raw, pairs, sizeof(raw));
  store_raw<kStream>(p, raw);
}

template <typename T, typename Q, int G, int VEC, int R, bool kStream>
__global__ __launch_bounds__(QuantConfig::kThreads) void silu_and_mul_quant_kernel(const QuantArgs<T> a) {
  using S = GroupShape<G, VEC>;
  constexpr int L = S::kLanes, K = S::kPerLane;
  const int lane = threadIdx.x % L;
  const uint32_t first = blockIdx.x * (R * S::kPerBlock) + threadIdx.x / L;
  uint32_t row[R], col[R];
  const T* gate[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    // out-of-range groups load the last group (loads unpredicated, issued together) and store nothing
    const uint32_t gi = min(first + r * S::kPerBlock, a.groups - 1);
    row[r] = a.per_row(gi);
    col[r] = (gi - row[r] * a.per_row.d) * G;
    gate[r] = a.in + row[r] * a.in_stride + col[r];
  }
  if constexpr (VEC > 1) {
    if (a.prefetch && lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        prefetch_l2_bulk(gate[r], G * sizeof(T));
        prefetch_l2_bulk(gate[r] + a.hidden, G * sizeof(T));
      }
    }
  }
  pdl_wait();
  pdl_launch_dependents();

  Vec<T, VEC> g[R][K], u[R][K];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      g[r][k].template load<kStream>(gate[r] + (lane + k * L) * VEC);
      u[r][k].template load<kStream>(gate[r] + a.hidden + (lane + k * L) * VEC);
    }
  }
  // A group's lanes shuffle among themselves and agree on whether it is in range; a round out of range
  // ends the lane's work (later rounds are further out).
  const unsigned mask = group_mask<L>();
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (first + r * S::kPerBlock >= a.groups) break;
    float y[K][VEC];
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      act_and_mul_all<Act::kSilu>(y[k], [&](int e) { return g[r][k][e]; }, [&](int e) { return u[r][k][e]; });
#pragma unroll
      for (int e = 0; e < VEC; ++e) m = max(m, abs_bits(y[k][e]));
    }
    m = warp_reduce_max<L>(m, mask);
    float s = __fdiv_rn(__uint_as_float(m), Fp8<Q>::kMax);
    s = s < a.eps ? a.eps : s;  // NaN compares false: stays NaN
    if (a.ue8m0) s = ue8m0_ceil(s);
    if (lane == 0) a.scales[row[r] * a.scale_stride_t + (col[r] / G) * a.scale_stride_g] = s;
    uint8_t* dst = a.out + row[r] * a.out_stride + col[r];
    const Divider div(s);
    if (Divider::fast(s)) {  // finite y with s >= absmax / fp8_max: bounded quotients
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if constexpr (VEC > 1) {
          store_codes_bracket<Q, VEC, kStream>(dst + (lane + k * L) * VEC, y[k], div);
        } else {
          store_codes<Q, kMarksteinBounded, VEC, kStream>(dst + (lane + k * L) * VEC, y[k], div);
        }
      }
    } else {  // NaN, inf or extreme scales
#pragma unroll
      for (int k = 0; k < K; ++k) store_codes<Q, kDivide, VEC, kStream>(dst + (lane + k * L) * VEC, y[k], div);
    }
  }
}

// The entry point. Shapes, strides, dtypes, devices and overlap were checked by the code sgljit.op
// generates from the op's declared arguments (ops.py): input [T, W], out [T, d] fp8 with unit last
// stride, scales fp32 [T, groups] (any strides, elements distinct), 32 <= group_size <= 128, eps a
// positive normal fp32 value, d = input's width / 2 and scales' width d / group_size. Here the
// module's own guards (the same messages) and what this module adds.
template <typename T, typename Q, int G>
struct SiluAndMulQuantFp8 {
  static constexpr int kVec = kVecSize<T>;

  static void run(TensorView input, TensorView out, TensorView scales, int64_t group_size, double eps,
                  bool scale_ue8m0) {
    check_module_dtype<T>(input, "input", "dtype ");
    check_module_dtype<Q>(out, "out", "dtype ");
    RuntimeCheck(group_size == G, "group_size: this module was compiled for group size ", G, ", got ", group_size);
    check_halves(input, out);
    const int64_t rows = out.size(0), hidden = out.size(1);
    RuntimeCheck(hidden % G == 0, "group_size: must divide out's last dimension ", hidden, ", got ", G);
    const int64_t per_row = hidden / G;
    RuntimeCheck(scales.size(1) == per_row, "scales: dimension 1 expected ", per_row,
                 " (out's last dimension / group_size), got ", scales.size(1));
    if (rows == 0 || per_row == 0) return;
    QuantArgs<T> a{};
    a.in = static_cast<const T*>(input.data_ptr());
    a.out = static_cast<uint8_t*>(out.data_ptr());
    a.scales = static_cast<float*>(scales.data_ptr());
    a.in_stride = row_stride(input);
    a.out_stride = row_stride(out);
    a.scale_stride_t = rows == 1 ? 0 : scales.stride(0);
    a.scale_stride_g = per_row == 1 ? 0 : scales.stride(1);
    a.hidden = hidden;
    a.eps = static_cast<float>(eps);
    a.ue8m0 = scale_ue8m0;
    // codes are stored kVec bytes at a time: out's rows kVec-byte aligned
    const bool vec_ok = vector_aligned<T>(input, hidden) && is_aligned(a.out, kVec) && a.out_stride % kVec == 0;
    if (vec_ok) {
      launch<kVec>(a, rows, per_row, input.device());
    } else {
      launch<1>(a, rows, per_row, input.device());
    }
  }

  template <int VEC>
  static void launch(QuantArgs<T> a, int64_t rows, int64_t per_row, DLDevice dev) {
    using S = GroupShape<G, VEC>;
    const int64_t sms = num_sms(dev.device_id);
    const bool stream = rows * a.hidden * int64_t{2 * sizeof(T) + 1} > l2_bytes(dev.device_id);
    a.per_row = FastDiv(static_cast<uint32_t>(std::min(per_row, kMaxItemsPerLaunch)));
    const T* in = a.in;
    uint8_t* out = a.out;
    float* scales = a.scales;
    for_each_launch(rows, per_row, [&](int64_t first_row, int64_t n) {
      a.in = in + first_row * a.in_stride;
      a.out = out + first_row * a.out_stride;
      a.scales = scales + first_row * a.scale_stride_t;
      const int64_t groups = n * per_row;
      a.groups = static_cast<uint32_t>(groups);
      const int64_t threads = groups * S::kLanes;  // at one group a lane
      const bool rounds = VEC > 1 && threads >= QuantConfig::kRounds * QuantConfig::kThreadsPerSm * sms;
      const int64_t grid = div_ceil<int64_t>(groups, (rounds ? QuantConfig::kRounds : 1) * S::kPerBlock);
      a.prefetch = grid <= sms * QuantConfig::kPrefetchBlocksPerSm;
      auto go = [&](auto kernel) {
        LaunchKernel(kernel, dim3(grid), dim3(QuantConfig::kThreads), 0, dev, "silu_and_mul_quant_fp8").pdl()(a);
      };
      if constexpr (VEC > 1) {
        if (rounds) {
          stream ? go(silu_and_mul_quant_kernel<T, Q, G, VEC, QuantConfig::kRounds, true>)
                 : go(silu_and_mul_quant_kernel<T, Q, G, VEC, QuantConfig::kRounds, false>);
        } else {
          stream ? go(silu_and_mul_quant_kernel<T, Q, G, VEC, 1, true>)
                 : go(silu_and_mul_quant_kernel<T, Q, G, VEC, 1, false>);
        }
      } else {  // the one-element path: correct, not tuned
        go(silu_and_mul_quant_kernel<T, Q, G, 1, 1, false>);
      }
    });
  }
};

}  // namespace sgljit_activation

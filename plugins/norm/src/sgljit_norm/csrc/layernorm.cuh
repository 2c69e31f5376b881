// LayerNorm (gamma, beta) and LayerNorm -> fp8 with a static per-tensor scale.
//
//   mean = sum(x) / H,  var = sum((x - mean)^2) / H          fp32, two passes over the row in registers
//   y    = (x - mean) * rsqrt(var + eps) * gamma + beta      fp32, cast once to T (gamma, beta: T or fp32)
//   quant: out = (y / scale).clamp(-fp8_max, fp8_max).to(fp8)   correctly rounded division (sgljit/fp8.cuh)
//
// Two passes, not Welford and not sum(x^2) - mean^2: the row is read from memory once and kept in
// registers, so the second pass costs one more group reduction, not a memory round trip; it has no
// cancellation where |mean| >> std (DiT and vision activations), and Welford's per-element division
// and merge steps would cost more issue slots than the extra reduction.
//
// Fast path (H a template argument, a whole number of 16-byte vectors, rows, gamma and beta aligned):
// the norm family's row groups (norm.cuh's RowConfig, unpacked) at LayerNormConfig::kVecsPerThread
// vectors a thread, so gamma and beta stay in registers beside the row (loaded with it: one memory
// round trip a row); one row group per block (small groups: several), grid = row groups; 16-byte
// ld.global.nc loads; programmatic dependent launch, and grids of at most kPrefetchBlocksPerSM blocks
// per SM prefetch their rows, gamma and beta into L2 before the PDL wait. Rows wider than 1024 threads
// of that target hold more vectors a thread and read gamma and beta from L1 after the reductions.
// Generic path (any H, any alignment): one block per row, scalar accesses, three passes over the row
// (the later ones from L1/L2).
// NaN/inf: a NaN or inf in a row makes its mean or variance NaN, so the whole row is NaN.
#pragma once

#include "norm_quant.cuh"  // norm.cuh's RowConfig, group_block, group_sum, check_width; exact_codes

#include <sgljit/cuda.cuh>
#include <sgljit/fp8.cuh>
#include <sgljit/reduce.cuh>
#include <sgljit/tensor.h>
#include <sgljit/type.cuh>
#include <sgljit/utils.h>
#include <sgljit/vec.cuh>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace sgljit_layernorm {

using sgljit::AlignedVector;
using sgljit::div_ceil;
using sgljit::from_float;
using sgljit::to_float;
using sgljit_norm::group_sum;
using tvm::ffi::TensorView;

struct LayerNormConfig {
  // 16-byte vectors of a row a thread aims at: at 2, the row (8 registers) and float32 gamma and beta
  // (32) fit the 64-register budget; at rmsnorm's 4 they would spill or have to be re-read.
  static constexpr int kVecsPerThread = 2;
  // Resident threads per SM the register budget (__launch_bounds__) is sized for: 64 registers.
  static constexpr int kThreadsPerSM = 1024;
  // Grids of at most this many blocks per SM prefetch into L2 before the PDL wait (as rmsnorm's).
  static constexpr int kPrefetchBlocksPerSM = 1;
  // Generic path: threads per block (one block per row).
  static constexpr int kGenericThreads = 256;
};

// The plain LayerNorm's fp8 type: none.
struct NoQuant {};

template <typename T, int kH, typename W>
struct RowShape : sgljit_norm::RowConfig<T, kH, LayerNormConfig::kVecsPerThread, W, /*kPackable=*/false> {
  static constexpr int kBlock = sgljit_norm::group_block(RowShape::kThreads);
  // gamma and beta in registers where a thread holds at most the target's vectors (see the top).
  static constexpr bool kParamsInRegs = RowShape::kVecsPerThread <= LayerNormConfig::kVecsPerThread;
};

// Strides in elements (out: of T, or fp8 bytes).
template <typename T, typename W>
struct LayerNormArgs {
  const T* in;
  const W* gamma;
  const W* beta;
  void* out;
  const float* scale;  // quant: scale[0]
  int64_t rows, hidden;
  int64_t in_stride, out_stride;
  float eps;
};

// The fp8 codes of a vector's y / scale (y(e): element e's y), as norm_quant.cuh writes them: two
// products by the reciprocal's bracket where they agree, Markstein's two steps where they do not, and
// __fdiv_rn for scales outside Divider::fast's range.
template <typename Q, int kVec, typename Y>
SGLJIT_DEVICE void fp8_codes(uint16_t (&codes)[kVec / 2], const sgljit::Divider& div, bool fast,
                             const sgljit::Bracket& bracket, const Y& y) {
  if (fast) {
    uint32_t differ = 0;
#pragma unroll
    for (int e = 0; e < kVec; e += 2) {
      const float y0 = y(e), y1 = y(e + 1);
      codes[e / 2] = sgljit::to_fp8x2<Q>(y0 * bracket.lo, y1 * bracket.lo);
      differ |= codes[e / 2] ^ sgljit::to_fp8x2<Q>(y0 * bracket.hi, y1 * bracket.hi);
    }
    if (differ) sgljit_norm_quant::exact_codes<Q, sgljit::kMarkstein>(codes, div, y);
  } else {
    sgljit_norm_quant::exact_codes<Q, sgljit::kDivide>(codes, div, y);
  }
}

// ------------------------------------------------------------------------------------------------
// Fast path
// ------------------------------------------------------------------------------------------------
template <typename T, typename W, typename Q, int kH>
__global__ void __launch_bounds__(RowShape<T, kH, W>::kBlock,
                                  std::max(1, LayerNormConfig::kThreadsPerSM / RowShape<T, kH, W>::kBlock))
    layernorm_kernel(const LayerNormArgs<T, W> a, const bool prefetch) {
  using Shape = RowShape<T, kH, W>;
  static_assert(Shape::kValid, "RowShape: H must be a multiple of the vector width, at most kMaxVecsPerRow vectors");
  constexpr bool kQuant = !std::is_same_v<Q, NoQuant>;
  constexpr int kVec = Shape::kVec, kNumVec = Shape::kNumVec, kTPR = Shape::kThreads, kVPT = Shape::kVecsPerThread;
  constexpr int kBlock = Shape::kBlock, kRowsPerBlock = kBlock / kTPR, kRedSlots = kBlock / 32;
  constexpr bool kExact = kNumVec % kTPR == 0;  // every thread has kVPT vectors
  constexpr bool kInRegs = Shape::kParamsInRegs;
  using V = AlignedVector<T, kVec>;
  using WV = AlignedVector<W, kVec>;  // 32 bytes for float32 params of 16-bit rows
  __shared__ float red[2 * kRedSlots];

  const int sub = threadIdx.x / kTPR, lane = threadIdx.x % kTPR;
  const int64_t groups = div_ceil<int64_t>(a.rows, kRowsPerBlock);
  // Vector j of this thread is vector j * kTPR + lane of the row: consecutive lanes, consecutive 16 bytes.
  auto has = [lane](int j) { return kExact || j * kTPR + lane < kNumVec; };
  auto col = [lane](int j) { return (j * kTPR + lane) * kVec; };

  if (prefetch && lane == 0) {  // one bulk request per row (see sgljit::prefetch_l2_bulk)
    const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + sub;
    if (row < a.rows) sgljit::prefetch_l2_bulk(a.in + row * a.in_stride, kNumVec * 16);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      sgljit::prefetch_l2_bulk(a.gamma, kNumVec * kVec * sizeof(W));
      sgljit::prefetch_l2_bulk(a.beta, kNumVec * kVec * sizeof(W));
    }
  }
  sgljit::pdl_wait();
  sgljit::pdl_launch_dependents();

  WV g[kInRegs ? kVPT : 1], b[kInRegs ? kVPT : 1];
  if constexpr (kInRegs) {
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      if (has(j)) {
        g[j].load(a.gamma + col(j));
        b[j].load(a.beta + col(j));
      }
    }
  }
  float scale = 0.0f;
  if constexpr (kQuant) scale = __ldg(a.scale);

  int parity = 0;
  // Grid = row groups, so a block runs one iteration (more only past grid.x's 2^31 - 1 blocks).
  for (int64_t grp = blockIdx.x; grp < groups; grp += gridDim.x) {
    const int64_t row = grp * kRowsPerBlock + sub;
    const bool valid = row < a.rows;
    V x[kVPT];
    float sum = 0.0f;
    if (valid) {
      const T* in = a.in + row * a.in_stride;
#pragma unroll
      for (int j = 0; j < kVPT; ++j) {
        if (has(j)) sgljit::load16_readonly(x[j], in + col(j));
      }
#pragma unroll
      for (int j = 0; j < kVPT; ++j) {
        if (has(j)) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) sum += sgljit::float_at(x[j], e);
        }
      }
    }
    sum = group_sum<kTPR>(sum, red + parity * kRedSlots);
    parity ^= 1;
    const float mean = sum / static_cast<float>(kH);
    float ss = 0.0f;
    if (valid) {
#pragma unroll
      for (int j = 0; j < kVPT; ++j) {
        if (has(j)) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            const float d = sgljit::float_at(x[j], e) - mean;
            ss += d * d;
          }
        }
      }
    }
    ss = group_sum<kTPR>(ss, red + parity * kRedSlots);
    parity ^= 1;
    const float rstd = rsqrtf(ss / static_cast<float>(kH) + a.eps);
    if (!valid) continue;

    const sgljit::Divider div(kQuant ? scale : 1.0f);
    const bool fast = sgljit::Divider::fast(scale);
    const sgljit::Bracket bracket(div);
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      if (has(j)) {
        WV gv, bv;
        if constexpr (kInRegs) {
          gv = g[j];
          bv = b[j];
        } else {
          gv.load(a.gamma + col(j));
          bv.load(a.beta + col(j));
        }
        auto y = [&](int e) {
          return (sgljit::float_at(x[j], e) - mean) * rstd * sgljit::float_at(gv, e) + sgljit::float_at(bv, e);
        };
        if constexpr (kQuant) {
          uint16_t codes[kVec / 2];
          fp8_codes<Q, kVec>(codes, div, fast, bracket, y);
          typename sgljit::RawBytes<kVec>::type raw;
          memcpy(&raw, codes, sizeof(raw));
          sgljit::store_raw<false>(static_cast<uint8_t*>(a.out) + row * a.out_stride + col(j), raw);
        } else {
          V o;
#pragma unroll
          for (int e = 0; e < kVec; ++e) o[e] = from_float<T>(y(e));
          sgljit::store16<false>(static_cast<T*>(a.out) + row * a.out_stride + col(j), o);
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Generic path: any width, any alignment
// ------------------------------------------------------------------------------------------------
template <typename T, typename W, typename Q>
__global__ void __launch_bounds__(LayerNormConfig::kGenericThreads)
    layernorm_generic_kernel(const LayerNormArgs<T, W> a) {
  constexpr bool kQuant = !std::is_same_v<Q, NoQuant>;
  __shared__ float red[32];
  sgljit::pdl_wait();
  sgljit::pdl_launch_dependents();
  const int64_t h = a.hidden;
  float scale = 0.0f;
  if constexpr (kQuant) scale = __ldg(a.scale);
  const sgljit::Divider div(kQuant ? scale : 1.0f);
  const bool fast = sgljit::Divider::fast(scale);
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* in = a.in + row * a.in_stride;
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) sum += to_float(in[c]);
    const float mean = sgljit::block_reduce_sum(sum, red) / static_cast<float>(h);
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
      const float d = to_float(in[c]) - mean;
      ss += d * d;
    }
    const float rstd = rsqrtf(sgljit::block_reduce_sum(ss, red) / static_cast<float>(h) + a.eps);
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
      const float y = (to_float(in[c]) - mean) * rstd * to_float(a.gamma[c]) + to_float(a.beta[c]);
      if constexpr (kQuant) {
        const float q = fast ? div.template operator()<sgljit::kMarkstein>(y) : div.template operator()<sgljit::kDivide>(y);
        static_cast<uint8_t*>(a.out)[row * a.out_stride + c] = sgljit::to_fp8<Q>(q);
      } else {
        static_cast<T*>(a.out)[row * a.out_stride + c] = from_float<T>(y);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
template <typename T, typename W, bool kQuant>
bool fast_layout(const LayerNormArgs<T, W>& a) {
  using sgljit::is_aligned;
  constexpr int64_t kVec = sgljit::kVecSize<T>;
  // gamma and beta are read kVec elements at a time: 32-byte aligned for float32 params of 16-bit rows.
  bool ok = is_aligned(a.in, 16) && is_aligned(a.gamma, kVec * sizeof(W)) && is_aligned(a.beta, kVec * sizeof(W));
  ok = ok && is_aligned(a.out, kQuant ? kVec : 16) && a.in_stride % kVec == 0 && a.out_stride % kVec == 0;
  return ok;
}

template <typename T, typename W, typename Q, int kH>
void launch(const LayerNormArgs<T, W>& a, DLDevice device, const char* name) {
  constexpr bool kQuant = !std::is_same_v<Q, NoQuant>;
  using Shape = RowShape<T, kH, W>;
  if constexpr (kH > 0 && Shape::kValid) {
    if (fast_layout<T, W, kQuant>(a)) {
      constexpr auto kernel = layernorm_kernel<T, W, Q, kH>;
      const int64_t groups = div_ceil<int64_t>(a.rows, Shape::kBlock / Shape::kThreads);
      const int grid = static_cast<int>(std::min<int64_t>(groups, 0x7fffffff));
      const bool prefetch = grid <= int64_t{sgljit::num_sms(device.device_id)} * LayerNormConfig::kPrefetchBlocksPerSM;
      sgljit::LaunchKernel(kernel, grid, Shape::kBlock, 0, device, name).pdl()(a, prefetch);
      return;
    }
  }
  constexpr auto kernel = layernorm_generic_kernel<T, W, Q>;
  constexpr int kThreads = LayerNormConfig::kGenericThreads;
  const int64_t resident =
      int64_t{sgljit::num_sms(device.device_id)} * sgljit::resident_blocks<kernel>(device.device_id, kThreads);
  const int grid = static_cast<int>(std::min<int64_t>(a.rows, resident));
  sgljit::LaunchKernel(kernel, grid, kThreads, 0, device, name).pdl()(a);
}

// The entry points. Shapes, strides, dtypes, devices and overlap were checked by the code sgljit.op
// generates from the ops' declared arguments (see layernorm.py): input [T, H] and out [T, H] with unit
// last stride, gamma and beta [H] contiguous of one dtype (T or float32), scale float32 [1], out
// sharing no memory with the others (or, plain, being input itself). Here: what the module was
// compiled for (the width; the fp8 format).
template <typename T, typename W, typename Q, int kH>
struct LayerNorm {
  static void run(const TensorView& input, const TensorView& gamma, const TensorView& beta, const TensorView* scale,
                  const TensorView& out, double eps, const char* name) {
    sgljit_norm::check_width(kH, input.size(1), "input");
    const int64_t n = input.size(0);
    if (n == 0) return;
    // The stride of a size-1 dimension is meaningless (and may be anything): make it 0.
    auto s0 = [n](const TensorView& t) { return n == 1 ? int64_t{0} : t.stride(0); };
    LayerNormArgs<T, W> a{};
    a.in = static_cast<const T*>(input.data_ptr());
    a.gamma = static_cast<const W*>(gamma.data_ptr());
    a.beta = static_cast<const W*>(beta.data_ptr());
    a.out = out.data_ptr();
    a.scale = scale ? static_cast<const float*>(scale->data_ptr()) : nullptr;
    a.rows = n;
    a.hidden = input.size(1);
    a.in_stride = s0(input);
    a.out_stride = s0(out);
    a.eps = static_cast<float>(eps);
    launch<T, W, Q, kH>(a, input.device(), name);
  }

  // out = layernorm(input) * gamma + beta.
  static void plain(TensorView input, TensorView gamma, TensorView beta, TensorView out, double eps) {
    run(input, gamma, beta, nullptr, out, eps, "layernorm");
  }

  // out = quantize((layernorm(input) * gamma + beta) / scale[0]).
  static void quant(TensorView input, TensorView gamma, TensorView beta, TensorView scale, TensorView out,
                    double eps) {
    sgljit::check_module_dtype<Q>(out, "out");
    run(input, gamma, beta, &scale, out, eps, "layernorm_quant_fp8");
  }
};

}  // namespace sgljit_layernorm

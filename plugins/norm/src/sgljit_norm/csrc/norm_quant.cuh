// RMSNorm -> fp8 in one pass: rmsnorm_quant_fp8 and fused_add_rmsnorm_quant_fp8, each with a static
// scale (scale[0]) or a dynamic scale per token (row).
//
//   y      = x * rsqrt(mean(x^2) + eps) * w                    fp32, as rmsnorm; NOT rounded to T (w: T or fp32)
//   out    = (y / scale).clamp(-fp8_max, fp8_max).to(fp8)      correctly rounded division (sgljit/fp8.cuh)
//   scale  = max(absmax(y of the row) / fp8_max, 2^-126)       per token, written to scales[row]
//   fused: residual <- x + residual (rounded to T) first, and the row is that rounded sum; x is only read.
//
// Fast path (H a whole number of 16-byte vectors, at most NormConfig::kMaxVecsPerRow of them;
// input / residual rows 16-byte aligned, the weight to a vector of its type, out rows to a vector's fp8 bytes): the norm
// plugin's row design and row groups (csrc/norm.cuh). A "row group" of threads holds the row (and the weight) in
// registers, every load issued together, so x is read from memory once; up to 32 threads the group is
// a (sub-)warp reduced by shuffles, beyond it a multi-warp group reduced through shared memory
// (double-buffered by parity: one barrier per reduction). One row group per block (small groups:
// several), grid = row groups. Per token adds a second group reduction (max of |y| by
// sgljit::max_abs, reduced as bits); the plain form keeps y in shared memory for the codes (rows of
// up to 48 KB a block; the fused form and wider rows recompute it from the registers). Each
// thread's vector of kVec elements becomes kVec fp8 bytes in one store.
// Launched with programmatic dependent launch; grids of at most kPrefetchBlocksPerSM blocks per SM first
// prefetch their rows and the weight into L2, so the first DRAM round trip overlaps the previous kernel.
// Codes: by sgljit::Bracket (two products by 1/scale's bracket, both converted; equal codes are the
// correctly rounded quotient's), a vector whose codes disagree by Markstein's two steps (y is a full
// fp32 value); scales outside [2^-40, 2^40] by __fdiv_rn (a uniform branch). Chosen by A/B over
// Markstein's steps for every element (benchmarks/results/nvidia-h200/ab-norm-quant-bracket.md).
// Generic path (any H, any alignment): one block per row, scalar accesses, each pass re-reading the row
// (from L1/L2), Markstein's two steps or __fdiv_rn.
// NaN/inf: a NaN in a row makes its sum of squares NaN, so the whole row quantizes to NaN (per token:
// a NaN scale too); an inf makes inv_rms 0: the row is 0 except NaN where the inf was (inf * 0).
#pragma once

#include "norm.cuh"  // RowConfig, group_block, group_sum, check_width

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

namespace sgljit_norm_quant {

using sgljit::AlignedVector;
using sgljit::div_ceil;
using sgljit::Divider;
using sgljit::Fp8;
using sgljit::from_float;
using sgljit::to_float;
using sgljit_norm::group_sum;
using tvm::ffi::TensorView;

// Row groups are rmsnorm's (norm.cuh's RowConfig, unpacked; NormConfig's largest row and smallest
// block); the rest is this kernel's own.
struct NormQuantConfig {
  // 16-byte vectors of a row a thread aims to hold (the fused add: of each of its two rows, input and
  // residual, so half as many): as rmsnorm's row groups.
  static constexpr int kVecsPerThread = 4;
  static constexpr int kFusedVecsPerThread = 2;
  // Resident threads per SM the register budget (__launch_bounds__) is sized for: 64 registers.
  static constexpr int kThreadsPerSM = 1024;
  // Grids of at most this many blocks per SM prefetch into L2 before the PDL wait; in larger grids the
  // prefetches compete with the previous kernel's loads.
  static constexpr int kPrefetchBlocksPerSM = 1;
  // Per token without the add, y (fp32) goes to shared memory in the absmax pass and the codes read
  // it back, where recomputing it from the packed row and weight took about 4 instructions an element
  // (the kernel is issue-bound: 0.92-0.95x from T=1024, ab-norm-quant-held-y.md). Holding y in
  // registers spills. Up to the static shared memory a block may take without an opt-in.
  template <bool kFused, bool kDynamic>
  static constexpr bool holds_y(int bytes) {
    return kDynamic && !kFused && bytes <= 48 * 1024;
  }
  // Generic path: threads per block (one block per row).
  static constexpr int kGenericThreads = 256;
  // Stores (residual and fp8 out): streaming (st.global.cs, evict-first) for the fused add, which
  // writes two rows per row; plain otherwise (as rmsnorm and fused_add_rmsnorm).
  template <bool kFused>
  static constexpr bool kStreamingStores = kFused;
};

// How a row of kH elements of T is spread over a row group of threads holding about kTarget vectors:
// rmsnorm's row groups, one row a group (the weight, of W, in registers within the target), and the
// threads of a block.
template <typename T, int kH, int kTarget, typename W>
struct RowShape : sgljit_norm::RowConfig<T, kH, kTarget, W, /*kPackable=*/false> {
  static constexpr int kBlock = sgljit_norm::group_block(RowShape::kThreads);
};

// The kernels' arguments; strides in elements (out: fp8 bytes). In the fused add `in` is x and `res`
// the residual (read, then overwritten with x + residual); elsewhere res is unused.
template <typename T, typename W>
struct NormQuantArgs {
  const T* in;
  T* res;
  const W* weight;  // of T or float32
  uint8_t* out;
  const float* scale;  // static: scale[0]
  float* scales;       // dynamic: one per row
  int64_t rows, hidden;
  int64_t in_stride, res_stride, out_stride;
  float eps;
};

// A thread's y values in shared memory: float4 slot q of its vector j at held[j * kVec / 4 + q][threadIdx.x],
// so consecutive threads touch consecutive 16 bytes (no bank conflicts). Each thread reads back only
// what it wrote: no barrier.
template <int kVec, int kBlock>
SGLJIT_DEVICE void put_y(float4 (*held)[kBlock], int j, const float (&y)[kVec]) {
#pragma unroll
  for (int q = 0; q < kVec / 4; ++q) {
    held[j * (kVec / 4) + q][threadIdx.x] = make_float4(y[4 * q], y[4 * q + 1], y[4 * q + 2], y[4 * q + 3]);
  }
}

template <int kVec, int kBlock>
SGLJIT_DEVICE void get_y(const float4 (*held)[kBlock], int j, float (&y)[kVec]) {
#pragma unroll
  for (int q = 0; q < kVec / 4; ++q) {
    const float4 f = held[j * (kVec / 4) + q][threadIdx.x];
    y[4 * q] = f.x;
    y[4 * q + 1] = f.y;
    y[4 * q + 2] = f.z;
    y[4 * q + 3] = f.w;
  }
}

// Max of |y| bits over a row group of kThreads threads, as group_sum (norm.cuh) reduces the sums; `red`
// words hold the warps' maxima as float bit patterns.
template <int kThreads>
SGLJIT_DEVICE uint32_t group_max(uint32_t v, float* red) {
  if constexpr (kThreads < 32) {
    return sgljit::warp_reduce_max<kThreads>(v);
  } else if constexpr (kThreads == 32) {
    return __reduce_max_sync(sgljit::kFullMask, v);
  } else {
    constexpr int kWarps = kThreads / 32;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = __reduce_max_sync(sgljit::kFullMask, v);
    if (lane == 0) red[warp] = __uint_as_float(v);
    __syncthreads();
    v = lane < kWarps ? __float_as_uint(red[(warp / kWarps) * kWarps + lane]) : 0u;
    return __reduce_max_sync(sgljit::kFullMask, v);
  }
}

// The codes of y(0) / s ... y(2N - 1) / s by Divider's quotient kMode, in pairs (low byte first).
template <typename Q, int kMode, int N, typename Y>
SGLJIT_DEVICE void exact_codes(uint16_t (&codes)[N], const Divider& div, const Y& y) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    codes[i] = sgljit::to_fp8x2<Q>(div.template operator()<kMode>(y(2 * i)), div.template operator()<kMode>(y(2 * i + 1)));
  }
}

// ------------------------------------------------------------------------------------------------
// Fast path
// ------------------------------------------------------------------------------------------------
template <typename T, typename W, typename Q, int kH, int kTarget, bool kFused, bool kDynamic>
__global__ void __launch_bounds__(RowShape<T, kH, kTarget, W>::kBlock,
                                  std::max(1, NormQuantConfig::kThreadsPerSM / RowShape<T, kH, kTarget, W>::kBlock))
    norm_quant_kernel(const NormQuantArgs<T, W> a, const bool prefetch) {
  using Shape = RowShape<T, kH, kTarget, W>;
  static_assert(Shape::kValid, "RowShape: H must be a multiple of the vector width, at most kMaxVecsPerRow vectors");
  constexpr int kVec = Shape::kVec, kNumVec = Shape::kNumVec, kTPR = Shape::kThreads, kVPT = Shape::kVecsPerThread;
  constexpr int kBlock = Shape::kBlock, kRowsPerBlock = kBlock / kTPR, kRedSlots = kBlock / 32;
  constexpr bool kExact = kNumVec % kTPR == 0;  // every thread has kVPT vectors
  using V = AlignedVector<T, kVec>;
  using WV = AlignedVector<W, kVec>;  // the weight of a vector of the row (32 bytes for float32 of 16-bit T)
  using Out = typename sgljit::RawBytes<kVec>::type;  // kVec fp8 bytes
  __shared__ float red[2 * kRedSlots];
  // Per token without the add: y from the absmax pass, kept for the codes (see NormQuantConfig::holds_y).
  constexpr bool kHoldY = NormQuantConfig::holds_y<kFused, kDynamic>(kBlock * kVPT * kVec * sizeof(float));
  __shared__ float4 held[kHoldY ? kVPT * kVec / 4 : 1][kHoldY ? kBlock : 1];

  const int sub = threadIdx.x / kTPR, lane = threadIdx.x % kTPR;
  const int64_t groups = div_ceil<int64_t>(a.rows, kRowsPerBlock);
  // Vector j of this thread is vector j * kTPR + lane of the row: consecutive lanes, consecutive 16 bytes.
  auto has = [lane](int j) { return kExact || j * kTPR + lane < kNumVec; };
  auto col = [lane](int j) { return (j * kTPR + lane) * kVec; };

  if (prefetch && lane == 0) {  // one bulk request per row (see sgljit::prefetch_l2_bulk)
    const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + sub;
    if (row < a.rows) {
      sgljit::prefetch_l2_bulk(a.in + row * a.in_stride, kNumVec * 16);
      if constexpr (kFused) sgljit::prefetch_l2_bulk(a.res + row * a.res_stride, kNumVec * 16);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) sgljit::prefetch_l2_bulk(a.weight, kNumVec * kVec * sizeof(W));
  }
  sgljit::pdl_wait();
  sgljit::pdl_launch_dependents();

  WV w[Shape::kWeightInRegs ? kVPT : 1];
  if constexpr (Shape::kWeightInRegs) {
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      if (has(j)) w[j].load(a.weight + col(j));
    }
  }
  float static_scale = 0.0f;
  if constexpr (!kDynamic) static_scale = __ldg(a.scale);

  int parity = 0;
  // Grid = row groups, so a block runs one iteration (more only past grid.x's 2^31 - 1 blocks).
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t row = g * kRowsPerBlock + sub;
    const bool valid = row < a.rows;
    const T* in = a.in + row * a.in_stride;
    T* res = a.res + (kFused ? row * a.res_stride : 0);
    V x[kVPT];
    float ss = 0.0f;
    if (valid) {
      V r[kFused ? kVPT : 1];
#pragma unroll
      for (int j = 0; j < kVPT; ++j) {
        if (has(j)) {
          sgljit::load16_readonly(x[j], in + col(j));
          if constexpr (kFused) sgljit::load16_readonly(r[j], res + col(j));
        }
      }
#pragma unroll
      for (int j = 0; j < kVPT; ++j) {
        if (has(j)) {
          if constexpr (kFused) {
#pragma unroll
            for (int e = 0; e < kVec; ++e) x[j][e] = from_float<T>(to_float(x[j][e]) + to_float(r[j][e]));
            sgljit::store16<NormQuantConfig::kStreamingStores<true>>(res + col(j), x[j]);
          }
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            const float f = sgljit::float_at(x[j], e);
            ss += f * f;
          }
        }
      }
    }
    ss = group_sum<kTPR>(ss, red + parity * kRedSlots);
    parity ^= 1;
    const float inv_rms = rsqrtf(ss / static_cast<float>(kH) + a.eps);

    auto weight = [&](int j) {
      if constexpr (Shape::kWeightInRegs) {
        return w[j];
      } else {
        WV wv;
        wv.load(a.weight + col(j));
        return wv;
      }
    };
    // y of element e of this thread's vector j, in the reference's order: (x * inv_rms) * w, fp32.
    auto norm_y = [&](int j, const WV& wv, int e) {
      return sgljit::float_at(x[j], e) * inv_rms * sgljit::float_at(wv, e);
    };
    float s = static_scale;
    if constexpr (kDynamic) {
      float absmax = 0.0f;
      if (valid) {
#pragma unroll
        for (int j = 0; j < kVPT; ++j) {
          if (has(j)) {
            const WV wv = weight(j);
            float yv[kVec];
#pragma unroll
            for (int e = 0; e < kVec; ++e) {
              yv[e] = norm_y(j, wv, e);
              absmax = sgljit::max_abs(absmax, yv[e]);
            }
            if constexpr (kHoldY) put_y(held, j, yv);
          }
        }
      }
      const uint32_t m = group_max<kTPR>(__float_as_uint(absmax), red + parity * kRedSlots);
      parity ^= 1;
      s = sgljit::scale_from_absmax(m, Fp8<Q>::kMax);
      if (valid && lane == 0) a.scales[row] = s;
    }
    if (!valid) continue;

    const Divider div(s);
    uint8_t* out = a.out + row * a.out_stride;
    // Codes as the top of the file says. A dynamic scale from the row's own absmax bounds every
    // quotient by fp8_max: its exact steps need no guard for huge ones.
    constexpr int kExact = kDynamic ? sgljit::kMarksteinBounded : sgljit::kMarkstein;
    const bool fast = Divider::fast(s);
    const sgljit::Bracket bracket(div);
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      if (has(j)) {
        float yv[kHoldY ? kVec : 1];
        WV wv{};
        if constexpr (kHoldY) {
          get_y(held, j, yv);
        } else {
          wv = weight(j);
        }
        auto y = [&](int e) {
          if constexpr (kHoldY) return yv[e];
          else return norm_y(j, wv, e);
        };
        uint16_t codes[kVec / 2];
        if (fast) {
          uint32_t differ = 0;
#pragma unroll
          for (int e = 0; e < kVec; e += 2) {
            const float y0 = y(e), y1 = y(e + 1);
            codes[e / 2] = sgljit::to_fp8x2<Q>(y0 * bracket.lo, y1 * bracket.lo);
            differ |= codes[e / 2] ^ sgljit::to_fp8x2<Q>(y0 * bracket.hi, y1 * bracket.hi);
          }
          if (differ) exact_codes<Q, kExact>(codes, div, y);
        } else {
          exact_codes<Q, sgljit::kDivide>(codes, div, y);
        }
        Out raw;
        memcpy(&raw, codes, sizeof(raw));
        sgljit::store_raw<NormQuantConfig::kStreamingStores<kFused>>(out + col(j), raw);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Generic path: any width, any alignment
// ------------------------------------------------------------------------------------------------
template <typename T, typename W, typename Q, bool kFused, bool kDynamic>
__global__ void __launch_bounds__(NormQuantConfig::kGenericThreads)
    norm_quant_generic_kernel(const NormQuantArgs<T, W> a) {
  __shared__ float red[32];
  sgljit::pdl_wait();
  sgljit::pdl_launch_dependents();
  const int64_t h = a.hidden;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* in = a.in + row * a.in_stride;
    T* res = a.res + (kFused ? row * a.res_stride : 0);
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
      float v = to_float(in[c]);
      if constexpr (kFused) {
        const T sum = from_float<T>(v + to_float(res[c]));
        res[c] = sum;
        v = to_float(sum);
      }
      ss += v * v;
    }
    ss = sgljit::block_reduce_sum(ss, red);
    const float inv_rms = rsqrtf(ss / static_cast<float>(h) + a.eps);
    // Later passes read what this same thread read (or, fused, wrote) in the first.
    const T* src = kFused ? res : in;
    auto y = [&](int64_t c) { return to_float(src[c]) * inv_rms * to_float(a.weight[c]); };
    float s;
    if constexpr (kDynamic) {
      float absmax = 0.0f;
      for (int64_t c = threadIdx.x; c < h; c += blockDim.x) absmax = sgljit::max_abs(absmax, y(c));
      uint32_t m = __reduce_max_sync(sgljit::kFullMask, __float_as_uint(absmax));
      if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = __uint_as_float(m);
      __syncthreads();
      m = 0;
      for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) m = max(m, __float_as_uint(red[i]));
      __syncthreads();  // red is rewritten by the next row's reduction
      s = sgljit::scale_from_absmax(m, Fp8<Q>::kMax);
      if (threadIdx.x == 0) a.scales[row] = s;
    } else {
      s = __ldg(a.scale);
    }
    const Divider div(s);
    const bool fast = Divider::fast(s);
    uint8_t* out = a.out + row * a.out_stride;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
      const float q = fast ? div.template operator()<sgljit::kMarkstein>(y(c)) : div.template operator()<sgljit::kDivide>(y(c));
      out[c] = sgljit::to_fp8<Q>(q);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
template <typename T, typename W, bool kFused>
bool fast_layout(const NormQuantArgs<T, W>& a) {
  using sgljit::is_aligned;
  constexpr int64_t kVec = sgljit::kVecSize<T>;
  bool ok = is_aligned(a.in, 16) && is_aligned(a.weight, kVec * sizeof(W)) && is_aligned(a.out, kVec);
  ok = ok && a.in_stride % kVec == 0 && a.out_stride % kVec == 0;
  if constexpr (kFused) ok = ok && is_aligned(a.res, 16) && a.res_stride % kVec == 0;
  return ok;
}

template <typename T, typename W, typename Q, int kH, bool kFused, bool kDynamic>
void launch(const NormQuantArgs<T, W>& a, DLDevice device, const char* name) {
  constexpr int kTarget = kFused ? NormQuantConfig::kFusedVecsPerThread : NormQuantConfig::kVecsPerThread;
  using Shape = RowShape<T, kH, kTarget, W>;
  if constexpr (kH > 0 && Shape::kValid) {
    if (fast_layout<T, W, kFused>(a)) {
      constexpr auto kernel = norm_quant_kernel<T, W, Q, kH, kTarget, kFused, kDynamic>;
      const int64_t groups = div_ceil<int64_t>(a.rows, Shape::kBlock / Shape::kThreads);
      const int grid = static_cast<int>(std::min<int64_t>(groups, 0x7fffffff));
      const bool prefetch = grid <= int64_t{sgljit::num_sms(device.device_id)} * NormQuantConfig::kPrefetchBlocksPerSM;
      sgljit::LaunchKernel(kernel, grid, Shape::kBlock, 0, device, name).pdl()(a, prefetch);
      return;
    }
  }
  constexpr auto kernel = norm_quant_generic_kernel<T, W, Q, kFused, kDynamic>;
  constexpr int kThreads = NormQuantConfig::kGenericThreads;
  const int64_t resident =
      int64_t{sgljit::num_sms(device.device_id)} * sgljit::resident_blocks<kernel>(device.device_id, kThreads);
  const int grid = static_cast<int>(std::min<int64_t>(a.rows, resident));
  sgljit::LaunchKernel(kernel, grid, kThreads, 0, device, name).pdl()(a);
}

// The entry points. Shapes, strides, dtypes, devices and overlap were checked by the code sgljit.op
// generates from the ops' declared arguments (see ops.py): input, residual [T, H] and out [T, H] fp8 with
// unit last stride, weight [H] contiguous, scale fp32 [1], scales fp32 [T, 1] contiguous, written tensors
// sharing no memory with the others. Here: the width and fp8 format this module was compiled for.
// W: the weight's element type (T or float32; the key chose the module).
template <typename T, typename W, typename Q, int kH>
struct NormQuantFp8 {
  template <bool kFused, bool kDynamic>
  static void run(const TensorView& input, const TensorView* residual, const TensorView& weight, const TensorView& out,
                  const TensorView* scale, const TensorView* scales, double eps, const char* name) {
    sgljit_norm::check_width(kH, input.size(1), "input");
    sgljit::check_module_dtype<Q>(out, "out");
    const int64_t n = input.size(0);
    if (n == 0) return;
    // The stride of a size-1 dimension is meaningless (and may be anything): make it 0.
    auto s0 = [n](const TensorView& t) { return n == 1 ? int64_t{0} : t.stride(0); };
    NormQuantArgs<T, W> a{};
    a.in = static_cast<const T*>(input.data_ptr());
    a.weight = static_cast<const W*>(weight.data_ptr());
    a.out = static_cast<uint8_t*>(out.data_ptr());
    a.rows = n;
    a.hidden = input.size(1);
    a.in_stride = s0(input);
    a.out_stride = s0(out);
    a.eps = static_cast<float>(eps);
    if (residual) {
      a.res = static_cast<T*>(residual->data_ptr());
      a.res_stride = s0(*residual);
    }
    if (scale) a.scale = static_cast<const float*>(scale->data_ptr());
    if (scales) a.scales = static_cast<float*>(scales->data_ptr());
    launch<T, W, Q, kH, kFused, kDynamic>(a, input.device(), name);
  }

  // out = quantize(rmsnorm(input) / scale[0]).
  static void rmsnorm_static(TensorView input, TensorView weight, TensorView scale, TensorView out, double eps) {
    run<false, false>(input, nullptr, weight, out, &scale, nullptr, eps, "rmsnorm_quant_fp8 (static)");
  }

  // out[t] = quantize(rmsnorm(input[t]) / scales[t]), scales[t] from the row's absmax.
  static void rmsnorm_per_token(TensorView input, TensorView weight, TensorView out, TensorView scales, double eps) {
    run<false, true>(input, nullptr, weight, out, nullptr, &scales, eps, "rmsnorm_quant_fp8 (per token)");
  }

  // residual <- input + residual; out = quantize(rmsnorm(residual) / scale[0]).
  static void fused_static(TensorView input, TensorView residual, TensorView weight, TensorView scale, TensorView out,
                           double eps) {
    run<true, false>(input, &residual, weight, out, &scale, nullptr, eps, "fused_add_rmsnorm_quant_fp8 (static)");
  }

  // residual <- input + residual; out[t] = quantize(rmsnorm(residual[t]) / scales[t]).
  static void fused_per_token(TensorView input, TensorView residual, TensorView weight, TensorView out,
                              TensorView scales, double eps) {
    run<true, true>(input, &residual, weight, out, nullptr, &scales, eps, "fused_add_rmsnorm_quant_fp8 (per token)");
  }
};

}  // namespace sgljit_norm_quant

// Sinusoidal timestep embedding (diffusers' get_timestep_embedding), CUDA.
//
//   half = dim / 2
//   freq[j] = exp(fl32(fl32(-ln(max_period)) * j) / fl32(half - downscale_freq_shift))   (fp32 ops)
//   arg[b, j] = fl32(fl32(t[b] * freq[j]) * scale)
//   out[b] = [sin(arg) | cos(arg)]   ([cos | sin] when flip), plus one zero column when dim is odd
//
// The argument is bit-identical to the reference (reference.py): every fp32 operation is an IEEE
// round-to-nearest mul/div written with __fmul_rn/__fdiv_rn (no contraction), and exp is evaluated
// in fp64 and rounded once to fp32 (the correctly rounded fp32 exp), once per column per block.
// An fp32 exp is not exact (CUDA's expf is off by up to 2 ulp, and one ulp of freq moves the
// argument of t = 1000 by ~6e-5), so the fp64 exp stays; what keeps it off the critical path is
// where it runs (below).
//
// Programmatic dependent launch: the frequencies depend only on the kernel's parameters, so each
// block computes them (into registers, or the block's shared table) *before* pdl_wait(), while
// the previous kernel on the stream is still finishing; the first global access (the timestep)
// follows the wait. At B=1 the time is then a launch hidden behind the previous kernel plus one
// chain: load t, sincos, store.
//
// sin/cos: Cody-Waite reduction of the fp32 argument by 2*pi (2*pi split into three fp32 constants,
// fma; r = x - k*2*pi rounded once) into [-pi, pi], then the hardware __sincosf (MUFU), whose
// absolute error on [-pi, pi] is 2^-21.41 (sin) / 2^-21.19 (cos). Total error against sin/cos of the
// fp32 argument in fp64: < 5.5e-7 for |arg| up to 1e6 (see README.md).
//
// Two kernels:
//  * rows: even dim with half % V == 0 (V = 16 bytes / element size). A thread owns V columns of
//    the argument and walks rows: per row it computes V args once and stores one 16-byte vector
//    into the sin half and one into the cos half; consecutive threads write consecutive vectors.
//  * flat: any other dim (odd, or half % V != 0). The output is one flat array; a thread writes V
//    consecutive elements with one 16-byte store (row/column derived per element), scalar tail.
#pragma once

#include <sgljit/cuda.cuh>
#include <sgljit/tensor.h>
#include <sgljit/type.cuh>
#include <sgljit/utils.h>
#include <sgljit/vec.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace sgljit_timestep_embedding {

using namespace sgljit;

// 2*pi = kTwoPiHi + kTwoPiMid + kTwoPiLo + O(4e-23); kInv2Pi = fl32(1 / (2*pi)).
inline constexpr float kInv2Pi = 0x1.45f306p-3f;     // 0.159154937
inline constexpr float kTwoPiHi = 0x1.921fb6p+2f;    // 6.28318548
inline constexpr float kTwoPiMid = -0x1.777a5cp-23f;  // -1.74845553e-07
inline constexpr float kTwoPiLo = -0x1.ee59dap-48f;   // -6.86049804e-15

// Configuration.
inline constexpr int kRowsBlockThreads = 512;  // rows kernel: most threads a block (column groups x rows)
inline constexpr int kFlatBlockThreads = 256;  // flat kernel: threads a block
inline constexpr int kMaxTableColumns = 8192;  // flat kernel: per-block table of half floats in smem

// Batches of at most this many rows take the rows kernel with one column per thread: each thread
// then computes one fp64 exp before the wait instead of V (a 16-byte vector's worth), which is what
// a single timestep's latency is made of.
inline constexpr int kSmallBatch = 4;

// Waits for the previous kernel (PDL), after the frequencies: no global memory access happens before.
SGLJIT_DEVICE void wait_after_freq() {
  pdl_wait();
  pdl_launch_dependents();
}

SGLJIT_DEVICE float load_t(const float* p) { return *p; }
SGLJIT_DEVICE float load_t(const double* p) { return static_cast<float>(*p); }
SGLJIT_DEVICE float load_t(const int32_t* p) { return static_cast<float>(*p); }
SGLJIT_DEVICE float load_t(const int64_t* p) { return static_cast<float>(*p); }
SGLJIT_DEVICE float load_t(const fp16_t* p) { return __half2float(*p); }
SGLJIT_DEVICE float load_t(const bf16_t* p) { return __bfloat162float(*p); }

// freq[j], exactly as the reference computes it (fp32 mul, IEEE fp32 division, exp rounded once).
SGLJIT_DEVICE float column_freq(int j, float neg_log_max_period, float denominator) {
  const float exponent = __fdiv_rn(__fmul_rn(neg_log_max_period, static_cast<float>(j)), denominator);
  return static_cast<float>(exp(static_cast<double>(exponent)));
}

SGLJIT_DEVICE float make_arg(float t, float freq, float scale) { return __fmul_rn(__fmul_rn(t, freq), scale); }

// x - k*2*pi, k = rint(x / (2*pi)), so |r| <= pi (+ 2^-7 rad at |x| = 1e6 where x / (2*pi) rounds).
// Cody-Waite with fma: x - k*hi is exact (|result| <= 4 on a 2^-21 grid, so it fits in 24 bits);
// the two lower parts are applied together, so r is rounded once: error <= ulp(r)/2 + 2^-23 |k mid|
// (<= 1.2e-7 + 3e-9 for |x| <= 1e6).
SGLJIT_DEVICE float reduce_two_pi(float x) {
  const float k = rintf(__fmul_rn(x, kInv2Pi));
  const float r = fmaf(-k, kTwoPiHi, x);
  const float tail = fmaf(-k, kTwoPiMid, __fmul_rn(-k, kTwoPiLo));
  return __fadd_rn(r, tail);
}

struct Params {
  const void* t;
  void* out;
  int64_t t_stride;
  int64_t rows;
  int64_t dim;
  int half;
  int groups;  // rows kernel: half / V
  bool flip;
  bool use_table;  // flat kernel
  float neg_log_max_period;
  float denominator;
  float scale;
};

// grid (x: row blocks, y: column chunks), block (x: groups of V columns, y: rows).
template <typename TIn, typename TOut, int V>
__global__ void __launch_bounds__(kRowsBlockThreads) timestep_embedding_rows_kernel(const Params p) {
  extern __shared__ float s_freq[];  // blockDim.x * V columns of this chunk
  const TIn* __restrict__ t = static_cast<const TIn*>(p.t);
  TOut* __restrict__ out = static_cast<TOut*>(p.out);
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const auto first_t = [&] { return row < p.rows ? load_t(t + row * p.t_stride) : 0.f; };
  float t_next = 0.f;

  const int group = blockIdx.y * blockDim.x + threadIdx.x;
  float freq[V];
  if (blockDim.y == 1) {
    // One row per block iteration (small batches): nothing to share, so each thread computes its V
    // frequencies itself, independent fp64 exps in flight together (latency path).
    if (group >= p.groups) return;
#pragma unroll
    for (int i = 0; i < V; ++i) freq[i] = column_freq(group * V + i, p.neg_log_max_period, p.denominator);
  } else {
    // The block's columns once into shared memory, then V of them into registers per thread.
    const int chunk_col = blockIdx.y * blockDim.x * V;
    const int chunk_cols = min(static_cast<int>(blockDim.x) * V, p.half - chunk_col);
    const int threads = blockDim.x * blockDim.y;
    for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < chunk_cols; i += threads) {
      s_freq[i] = column_freq(chunk_col + i, p.neg_log_max_period, p.denominator);
    }
    __syncthreads();
    if (group >= p.groups) return;
#pragma unroll
    for (int i = 0; i < V; ++i) freq[i] = s_freq[threadIdx.x * V + i];
  }
  wait_after_freq();  // (threads without columns left before it: an exit counts as the trigger)
  t_next = first_t();
  TOut* sin_col = out + (p.flip ? p.half : 0) + group * V;
  TOut* cos_col = out + (p.flip ? 0 : p.half) + group * V;

  for (; row < p.rows; row += row_step) {
    const float tv = t_next;
    const int64_t next = row + row_step;
    if (next < p.rows) t_next = load_t(t + next * p.t_stride);  // prefetch the next row's t
    AlignedVector<TOut, V> vs, vc;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      float s, c;
      __sincosf(reduce_two_pi(make_arg(tv, freq[i], p.scale)), &s, &c);
      vs[i] = from_float<TOut>(s);
      vc[i] = from_float<TOut>(c);
    }
    vs.store(sin_col + row * p.dim);
    vc.store(cos_col + row * p.dim);
  }
}

template <typename TIn>
SGLJIT_DEVICE float flat_element(const Params& p, const TIn* __restrict__ t, const float* s_freq, int64_t row,
                                 int64_t col) {
  const int64_t sin_cos = 2 * static_cast<int64_t>(p.half);
  if (col >= sin_cos) return 0.f;  // the zero column of an odd dim
  const bool second = col >= p.half;
  const int j = static_cast<int>(second ? col - p.half : col);
  const float freq = p.use_table ? s_freq[j] : column_freq(j, p.neg_log_max_period, p.denominator);
  const float r = reduce_two_pi(make_arg(load_t(t + row * p.t_stride), freq, p.scale));
  return (second != p.flip) ? __cosf(r) : __sinf(r);
}

// grid-stride over the flat output in vectors of V elements (16 bytes), then a scalar tail.
template <typename TIn, typename TOut, int V>
__global__ void __launch_bounds__(kFlatBlockThreads) timestep_embedding_flat_kernel(const Params p) {
  extern __shared__ float s_freq[];  // half columns when p.use_table
  const TIn* __restrict__ t = static_cast<const TIn*>(p.t);
  TOut* __restrict__ out = static_cast<TOut*>(p.out);
  if (p.use_table) {
    for (int i = threadIdx.x; i < p.half; i += blockDim.x) {
      s_freq[i] = column_freq(i, p.neg_log_max_period, p.denominator);
    }
    __syncthreads();
  }
  wait_after_freq();
  const int64_t total = p.rows * p.dim;
  const int64_t vectors = total / V;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += step) {
    int64_t row = v * V / p.dim;
    int64_t col = v * V - row * p.dim;
    AlignedVector<TOut, V> o;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      o[i] = from_float<TOut>(flat_element(p, t, s_freq, row, col));
      if (++col == p.dim) col = 0, ++row;
    }
    o.store(out + v * V);
  }
  const int64_t tail = vectors * V + threadIdx.x;
  if (blockIdx.x == 0 && tail < total) {
    const int64_t row = tail / p.dim;
    out[tail] = from_float<TOut>(flat_element(p, t, s_freq, row, tail - row * p.dim));
  }
}

template <typename TIn, typename TOut, int V>
void launch(const Params& p, bool rows_kernel, DLDevice device) {
  const int sms = num_sms(device.device_id);
  if constexpr (V > 1) {
    if (rows_kernel && p.rows <= kSmallBatch && p.half <= 256 * 65535) {
      Params one = p;
      one.groups = p.half;
      launch<TIn, TOut, 1>(one, true, device);
      return;
    }
  }
  if (rows_kernel) {
    // Column chunks of at most 256 groups (balanced), rows fill the block up to 512 threads.
    const int chunks = static_cast<int>(div_ceil(p.groups, 256));
    const int tx = static_cast<int>(div_ceil(p.groups, chunks));
    const int64_t rows_per_sm = div_ceil<int64_t>(p.rows, sms);
    const int ty = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kRowsBlockThreads / tx, rows_per_sm)));
    // Persistent-style grid: at most one wave of resident blocks, rows split evenly between them.
    constexpr auto kernel = timestep_embedding_rows_kernel<TIn, TOut, V>;
    const size_t smem = ty > 1 ? static_cast<size_t>(tx) * V * sizeof(float) : 0;
    const int resident = std::max(1, resident_blocks<kernel>(device.device_id, tx * ty, smem) * sms / chunks);
    const int64_t row_blocks = div_ceil<int64_t>(p.rows, ty);
    const int64_t iters = div_ceil<int64_t>(row_blocks, resident);
    const int64_t grid_x = div_ceil<int64_t>(row_blocks, iters);
    LaunchKernel(kernel, dim3(static_cast<unsigned>(grid_x), chunks), dim3(tx, ty), smem, device,
                 "timestep_embedding_rows_kernel")
        .pdl()(p);
  } else if constexpr (V > 1) {  // (V == 1 is only the small-batch rows kernel)
    const int64_t vectors = std::max<int64_t>(1, p.rows * p.dim / V);
    const int64_t grid = std::min<int64_t>(div_ceil<int64_t>(vectors, kFlatBlockThreads), 8LL * sms);
    const size_t smem = p.use_table ? static_cast<size_t>(p.half) * sizeof(float) : 0;
    LaunchKernel(timestep_embedding_flat_kernel<TIn, TOut, V>, dim3(static_cast<unsigned>(grid)),
                 dim3(kFlatBlockThreads), smem, device, "timestep_embedding_flat_kernel")
        .pdl()(p);
  }
}

// out[B, dim] (contiguous, TOut) = embedding of t[B] (1-D, any stride; fp32/fp16/bf16/fp64/int32/int64).
// Shapes, layout, dtypes, devices and overlap were checked by the code sgljit.op generates from the op's
// declared arguments (see ops.py); here only what the arguments' specs cannot say, and what the
// specialization assumes. Scalars arrive as Python floats; -ln(max_period) and the denominator are
// computed in fp64 and rounded to fp32 here, as PyTorch rounds scalar operands.
template <typename TOut>
struct TimestepEmbeddingKernel {
  static constexpr int V = kVecSize<TOut>;

  static void run(tvm::ffi::TensorView t, tvm::ffi::TensorView out, bool flip_sin_to_cos,
                  double downscale_freq_shift, double scale, double max_period) {
    check_module_dtype<TOut>(out, "out", "dtype ");
    const int64_t rows = out.size(0), dim = out.size(1);
    RuntimeCheck(dim >= 1 && dim <= (int64_t{1} << 30), "out: dim must be in [1, 2^30], got ", dim);
    const int64_t half = dim / 2;
    const double denominator = half > 0 ? static_cast<double>(half) - downscale_freq_shift : 1.0;
    RuntimeCheck(denominator != 0, "downscale_freq_shift: must differ from dim // 2 = ", half,
                 " (the exponent is divided by dim // 2 - downscale_freq_shift), got ", downscale_freq_shift);
    if (rows == 0) return;

    Params p{};
    p.t = t.data_ptr();
    p.out = out.data_ptr();
    p.t_stride = t.stride(0);
    p.rows = rows;
    p.dim = dim;
    p.half = static_cast<int>(half);
    p.flip = flip_sin_to_cos;
    p.neg_log_max_period = static_cast<float>(-std::log(max_period));
    p.denominator = static_cast<float>(denominator);
    p.scale = static_cast<float>(scale);
    const bool aligned = is_aligned(p.out, kVecBytes);
    const bool rows_kernel =
        aligned && dim % 2 == 0 && p.half > 0 && p.half % V == 0 && p.half / V <= 256 * 65535;
    p.groups = rows_kernel ? p.half / V : 0;
    p.use_table = p.half <= kMaxTableColumns;
    RuntimeCheck(aligned, "out: data pointer must be 16-byte aligned");

    const DLDataType dt = t.dtype();
    const DLDevice dev = out.device();
    if (dt.lanes == 1 && dt.code == kDLFloat && dt.bits == 32) {
      launch<float, TOut, V>(p, rows_kernel, dev);
    } else if (dt.lanes == 1 && dt.code == kDLFloat && dt.bits == 16) {
      launch<fp16_t, TOut, V>(p, rows_kernel, dev);
    } else if (dt.lanes == 1 && dt.code == kDLBfloat && dt.bits == 16) {
      launch<bf16_t, TOut, V>(p, rows_kernel, dev);
    } else if (dt.lanes == 1 && dt.code == kDLFloat && dt.bits == 64) {
      launch<double, TOut, V>(p, rows_kernel, dev);
    } else if (dt.lanes == 1 && dt.code == kDLInt && dt.bits == 32) {
      launch<int32_t, TOut, V>(p, rows_kernel, dev);
    } else if (dt.lanes == 1 && dt.code == kDLInt && dt.bits == 64) {
      launch<int64_t, TOut, V>(p, rows_kernel, dev);
    } else {
      RuntimeCheck(false, "t: dtype expected one of {float32, float16, bfloat16, float64, int32, int64}, got ",
                   dtype_name(dt));
    }
  }
};

}  // namespace sgljit_timestep_embedding

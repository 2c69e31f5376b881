// Gated activations, CUDA: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul (ActAndMul<T, kAct>::run).
//
// Contract: input [T, 2d] (any row stride, unit last stride), gate = input[:, :d], up = input[:, d:];
// out [T, d] = act(gate) * up in fp32, rounded once to T (common.cuh's act_and_mul).
//
// Design (memory-bound: 2 reads and 1 write per element, nothing reused): the output is a flat range of
// T * d / VEC items, each one 16-byte vector of out with its gate and up vectors (VEC = 16 / sizeof(T));
// consecutive threads take consecutive items, so every warp load is whole 128-byte lines whatever d is,
// and a row is split over as many blocks as its items need (the row of an item: one multiply-high).
// Large grids give each thread ActConfig::kUnroll items, every load issued before the first use; grids
// that would not give every SM a few blocks take one item a thread in smaller blocks, so one token of a
// 768-wide MoE expert still spreads over several SMs. Inputs and outputs that together exceed the L2 are
// loaded and stored evict-first (ld/st.global.cs): nothing of them is read again before it would be
// evicted, and smaller outputs stay in the L2 for the GEMM that reads them next. Launched with PDL;
// grids of up to one block per SM prefetch their lines into L2 before the wait. Rows whose pointer,
// stride or width is not a whole number of 16-byte vectors run the same kernel one element an item.
#pragma once

#include "common.cuh"

namespace sgljit_activation {

struct ActConfig {
  static constexpr int kThreads = 256;     // block size of large grids: 8 blocks fill an SM's 2048 threads
  static constexpr int kMinThreads = 32;   // small grids: blocks of one warp at least
  static constexpr int kUnroll = 2;        // items a thread in large grids: 4 16-byte loads in flight each
  static constexpr int kLargeBlocksPerSm = 2;     // large grids from this many kThreads x kUnroll blocks per SM
  static constexpr int kPrefetchBlocksPerSm = 1;  // grids this small prefetch before the PDL wait (as norm's)
};

template <typename T>
struct ActArgs {
  const T* in;
  T* out;
  int64_t in_stride, out_stride;  // rows, in elements
  int64_t hidden;                 // d: up starts d elements after gate
  uint32_t items;                 // items of this launch
  FastDiv per_row;                // items a row
  bool prefetch;
};

template <typename T, Act kAct, int VEC, int U, bool kStream>
__global__ void __launch_bounds__(ActConfig::kThreads) act_and_mul_kernel(const ActArgs<T> a) {
  const uint32_t first = blockIdx.x * (blockDim.x * U) + threadIdx.x;
  const T* gate[U];
  T* dst[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    // out-of-range items load the last item (every load unpredicated, issued together) and store nothing
    const uint32_t i = min(first + u * blockDim.x, a.items - 1);
    const uint32_t row = a.per_row(i), col = (i - row * a.per_row.d) * VEC;
    gate[u] = a.in + row * a.in_stride + col;
    dst[u] = a.out + row * a.out_stride + col;
  }
  if (a.prefetch && reinterpret_cast<uintptr_t>(gate[0]) % 128 < sizeof(T) * VEC) {  // one thread a line
    prefetch_l2(gate[0]);
    prefetch_l2(gate[0] + a.hidden);
  }
  pdl_wait();
  pdl_launch_dependents();

  Vec<T, VEC> g[U], up[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    g[u].template load<kStream>(gate[u]);
    up[u].template load<kStream>(gate[u] + a.hidden);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (first + u * blockDim.x >= a.items) break;  // later items are further out
    float y[VEC];
    act_and_mul_all<kAct>(y, [&](int e) { return g[u][e]; }, [&](int e) { return up[u][e]; });
    store_rounded<T, VEC, kStream>(dst[u], y);
  }
}

// The entry point. Shapes, strides, dtypes, devices and overlap were checked by the code sgljit.op
// generates from the op's declared arguments (ops.py): input [T, W] and out [T, d] of T with unit last
// stride. Here what the spec cannot say (W == 2d) and the module's dtype.
template <typename T, Act kAct>
struct ActAndMul {
  static constexpr int kVec = kVecSize<T>;

  static void run(TensorView input, TensorView out) {
    check_module_dtype<T>(input, "input", "dtype ");
    check_halves(input, out);
    const int64_t rows = out.size(0), hidden = out.size(1);
    if (rows == 0 || hidden == 0) return;
    ActArgs<T> a{};
    a.in = static_cast<const T*>(input.data_ptr());
    a.out = static_cast<T*>(out.data_ptr());
    a.in_stride = row_stride(input);
    a.out_stride = row_stride(out);
    a.hidden = hidden;
    // up at gate + d: 16-byte aligned when the input's rows are and d is whole vectors
    if (vector_aligned<T>(input, hidden) && vector_aligned<T>(out, hidden)) {
      launch<kVec>(a, rows, input.device());
    } else {
      launch<1>(a, rows, input.device());
    }
  }

  template <int VEC>
  static void launch(ActArgs<T> a, int64_t rows, DLDevice dev) {
    const int64_t per_row = a.hidden / VEC;
    const int64_t sms = num_sms(dev.device_id);
    const int64_t bytes = rows * a.hidden * int64_t{3 * sizeof(T)};
    const bool stream = bytes > l2_bytes(dev.device_id);
    a.per_row = FastDiv(static_cast<uint32_t>(std::min(per_row, kMaxItemsPerLaunch)));
    const T* in = a.in;
    T* out = a.out;
    for_each_launch(rows, per_row, [&](int64_t first_row, int64_t n) {
      a.in = in + first_row * a.in_stride;
      a.out = out + first_row * a.out_stride;
      const int64_t items = n * per_row;
      a.items = static_cast<uint32_t>(items);
      constexpr int64_t kLarge = int64_t{ActConfig::kThreads} * ActConfig::kUnroll;
      const bool large = VEC > 1 && items >= sms * ActConfig::kLargeBlocksPerSm * kLarge;
      // small grids: the largest power-of-two block that still gives every SM a block
      int64_t threads = ActConfig::kThreads;
      while (!large && threads > ActConfig::kMinThreads && threads * sms > items) threads /= 2;
      const int64_t grid = div_ceil<int64_t>(items, large ? kLarge : threads);
      a.prefetch = VEC > 1 && grid <= sms * ActConfig::kPrefetchBlocksPerSm;
      auto go = [&](auto kernel) {
        LaunchKernel(kernel, dim3(grid), dim3(threads), 0, dev, "act_and_mul").pdl()(a);
      };
      if constexpr (VEC > 1) {
        if (large) {
          stream ? go(act_and_mul_kernel<T, kAct, VEC, ActConfig::kUnroll, true>)
                 : go(act_and_mul_kernel<T, kAct, VEC, ActConfig::kUnroll, false>);
        } else {
          stream ? go(act_and_mul_kernel<T, kAct, VEC, 1, true>) : go(act_and_mul_kernel<T, kAct, VEC, 1, false>);
        }
      } else {  // the one-element path: correct, not tuned
        go(act_and_mul_kernel<T, kAct, 1, 1, false>);
      }
    });
  }
};

}  // namespace sgljit_activation

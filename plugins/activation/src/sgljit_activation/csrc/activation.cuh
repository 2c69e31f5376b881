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
//
// Filtered rows (sglang's MoE routing; the kernel's kFiltered parameter, the plain instantiation being
// the code above): row r is written only where expert_ids[r / expert_step] != -1 (an index past
// expert_ids: not written) and, with the sorted layout, r < num_tokens_post_padded[0] and
// sorted_token_ids[r] (unsigned) < num_valid_tokens; other rows load nothing and keep out's contents.
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

// The row filter's arguments (see the header).
template <typename T>
struct FilteredActArgs : ActArgs<T> {
  const int32_t* expert_ids;
  int64_t expert_count, expert_step;
  const int32_t* sorted_ids;  // with `sorted`: at least one entry a row
  const int32_t* num_post;
  uint32_t num_valid;
  bool sorted;
  int64_t row0;  // the launch's first row (launches cover row ranges)

  SGLJIT_DEVICE bool keep(int64_t row) const {
    const int64_t e = row / expert_step;
    if (e >= expert_count || expert_ids[e] == -1) return false;
    return !sorted || (row < *num_post && static_cast<uint32_t>(sorted_ids[row]) < num_valid);
  }
};

template <typename T, bool kFiltered>
using ActArgsOf = std::conditional_t<kFiltered, FilteredActArgs<T>, ActArgs<T>>;

template <typename T, Act kAct, int VEC, int U, bool kStream, bool kFiltered = false>
__global__ void __launch_bounds__(ActConfig::kThreads) act_and_mul_kernel(const ActArgsOf<T, kFiltered> a) {
  const uint32_t first = blockIdx.x * (blockDim.x * U) + threadIdx.x;
  const T* gate[U];
  T* dst[U];
  [[maybe_unused]] uint32_t rows[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    // out-of-range items load the last item (every load unpredicated, issued together) and store nothing
    const uint32_t i = min(first + u * blockDim.x, a.items - 1);
    const uint32_t row = a.per_row(i), col = (i - row * a.per_row.d) * VEC;
    gate[u] = a.in + row * a.in_stride + col;
    dst[u] = a.out + row * a.out_stride + col;
    if constexpr (kFiltered) rows[u] = row;
  }
  if (a.prefetch && reinterpret_cast<uintptr_t>(gate[0]) % 128 < sizeof(T) * VEC) {  // one thread a line
    prefetch_l2(gate[0]);
    prefetch_l2(gate[0] + a.hidden);
  }
  pdl_wait();
  pdl_launch_dependents();
  [[maybe_unused]] bool keep[U];
  if constexpr (kFiltered) {
#pragma unroll
    for (int u = 0; u < U; ++u) keep[u] = a.keep(a.row0 + rows[u]);
  }

  Vec<T, VEC> g[U], up[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if constexpr (kFiltered) {
      if (!keep[u]) continue;
    }
    g[u].template load<kStream>(gate[u]);
    up[u].template load<kStream>(gate[u] + a.hidden);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (first + u * blockDim.x >= a.items) break;  // later items are further out
    if constexpr (kFiltered) {
      if (!keep[u]) continue;
    }
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

// The filtered rows of the three activations (act: 0 silu, 1 gelu, 2 gelu_tanh), one module per dtype:
// input [T, 2d], out [T, d], expert_ids int32 [>= ceil(T / expert_step)], with `sorted` sorted_token_ids
// int32 [>= T] and num_tokens_post_padded int32 [1] (ignored without).
template <typename T>
struct ActFiltered {
  static constexpr int kVec = kVecSize<T>;

  static void run(TensorView input, TensorView out, TensorView expert_ids, int64_t expert_step,
                  TensorView sorted_token_ids, TensorView num_tokens_post_padded, int64_t num_valid_tokens,
                  int64_t act, bool sorted) {
    check_module_dtype<T>(input, "input", "dtype ");
    check_halves(input, out);
    const int64_t rows = out.size(0), hidden = out.size(1);
    const int64_t blocks = div_ceil<int64_t>(rows, expert_step);
    RuntimeCheck(expert_ids.size(0) >= blocks, "expert_ids: expected at least ", blocks,
                 " entries (one per expert_step rows of input), got ", expert_ids.size(0));
    RuntimeCheck(!sorted || sorted_token_ids.size(0) >= rows, "sorted_token_ids: expected at least ", rows,
                 " entries (one per row of input), got ", sorted_token_ids.size(0));
    if (rows == 0 || hidden == 0) return;
    FilteredActArgs<T> a{};
    a.in = static_cast<const T*>(input.data_ptr());
    a.out = static_cast<T*>(out.data_ptr());
    a.in_stride = row_stride(input);
    a.out_stride = row_stride(out);
    a.hidden = hidden;
    a.expert_ids = static_cast<const int32_t*>(expert_ids.data_ptr());
    a.expert_count = expert_ids.size(0);
    a.expert_step = expert_step;
    a.sorted_ids = static_cast<const int32_t*>(sorted_token_ids.data_ptr());
    a.num_post = static_cast<const int32_t*>(num_tokens_post_padded.data_ptr());
    a.num_valid = static_cast<uint32_t>(num_valid_tokens);
    a.sorted = sorted;
    const bool vec = vector_aligned<T>(input, hidden) && vector_aligned<T>(out, hidden);
    if (act == 0) {
      vec ? launch<Act::kSilu, kVec>(a, rows, input.device()) : launch<Act::kSilu, 1>(a, rows, input.device());
    } else if (act == 1) {
      vec ? launch<Act::kGelu, kVec>(a, rows, input.device()) : launch<Act::kGelu, 1>(a, rows, input.device());
    } else {
      vec ? launch<Act::kGeluTanh, kVec>(a, rows, input.device())
          : launch<Act::kGeluTanh, 1>(a, rows, input.device());
    }
  }

  // One item a thread in blocks of kThreads (the filter decides per row; no prefetch before the wait).
  template <Act kAct, int VEC>
  static void launch(FilteredActArgs<T> a, int64_t rows, DLDevice dev) {
    const int64_t per_row = a.hidden / VEC;
    const bool stream = rows * a.hidden * int64_t{3 * sizeof(T)} > l2_bytes(dev.device_id);
    a.per_row = FastDiv(static_cast<uint32_t>(std::min(per_row, kMaxItemsPerLaunch)));
    const T* in = a.in;
    T* out = a.out;
    for_each_launch(rows, per_row, [&](int64_t first_row, int64_t n) {
      a.in = in + first_row * a.in_stride;
      a.out = out + first_row * a.out_stride;
      a.row0 = first_row;
      a.items = static_cast<uint32_t>(n * per_row);
      const int64_t grid = div_ceil<int64_t>(a.items, ActConfig::kThreads);
      auto go = [&](auto kernel) {
        LaunchKernel(kernel, dim3(grid), dim3(ActConfig::kThreads), 0, dev, "act_and_mul (filtered)").pdl()(a);
      };
      if (stream) {
        go(act_and_mul_kernel<T, kAct, VEC, 1, true, true>);
      } else {
        go(act_and_mul_kernel<T, kAct, VEC, 1, false, true>);
      }
    });
  }
};

}  // namespace sgljit_activation

// FP8 quantization, CUDA: the ops' entry points (QuantFp8) and the choice of kernels.
//
// Contract: every output byte is bit-identical to PyTorch's
//     (x.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)
// for the same fp32 scale (correctly rounded division and cvt.rn.satfinite: see common.cuh). Dynamic
// scales are max(absmax / fp8_max, 2^-126) in fp32: an all-zero tensor gets a finite scale, a NaN
// anywhere a NaN scale (as torch.amax).
//
// Every kernel starts with sgljit::pdl_wait() (before any global memory access), then
// pdl_launch_dependents(), and is launched with programmatic dependent launch: back-to-back kernels
// (the dynamic op's, consecutive ops in a CUDA graph) do not pay the launch gap, and pdl_wait orders
// the dynamic op's partial maxima before their reads without a fence.
//
// Paths:
//   * per_token: the rows kernel (rows.cuh), P lanes per row holding it in registers.
//   * per_tensor_static: the rows kernel over chunks of the tensor, a warp per chunk.
//   * per_tensor_dynamic, by `algo` (0 auto, 1 fused, 2 two kernels, 3 three kernels); auto takes
//     - up to AutoConfig::kOneRowBytes: the per-token kernel on the tensor as one row (one launch);
//     - beyond kFinalizeMinL2s times the L2 size: three kernels: absmax pass, finalize (absmax.cuh),
//       then the static rows kernel on the chunks from last to first (the absmax pass's L2 tail);
//     - bf16 from kFusedMinL2Pct % of the L2 size up to there: the fused cooperative kernel
//       (fused.cuh; sm_90+, 16-byte-aligned data, else two kernels);
//     - else two kernels: the absmax pass, then a quantize pass whose every block reduces the
//       partial maxima itself (dynamic_pass.cuh).
#pragma once

#include "absmax.cuh"
#include "common.cuh"
#include "dynamic_pass.cuh"
#include "fused.cuh"
#include "rows.cuh"

#include <sgljit/tensor.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <type_traits>

namespace sgljit_quant_fp8 {

using namespace sgljit;

// The dynamic op's auto choice (algo 0).
struct AutoConfig {
  static constexpr int64_t kOneRowBytes = 65536;  // up to this: one launch of the per-token kernel
  static constexpr int64_t kFusedMinL2Pct = 25;   // bf16 from this % of the L2 size: the fused kernel
  static constexpr int64_t kFinalizeMinL2s = 2;   // beyond this many L2 sizes: three kernels
};

// Persistent grid for `kKernel`: at most SMs x resident blocks (and `cap`), at least one block, and
// no more blocks than one vector per thread needs.
template <auto kKernel, int kThreads>
int64_t persistent_grid(int device_id, int64_t nv, int64_t cap) {
  const int64_t full = int64_t(num_sms(device_id)) * resident_blocks<kKernel>(device_id, kThreads);
  return std::clamp<int64_t>(div_ceil<int64_t>(nv, kThreads), 1, std::min(full, cap));
}

// The entry points. Shapes, strides, dtypes, devices and overlap were checked by the code sgljit.op
// generates from the ops' declared arguments (see ops.py): input and out contiguous [rows, cols] of
// one shape (per-tensor; the kernels see one flat range) or [T, H] with unit last stride (per-token),
// scale fp32 [1], scales fp32 [T, 1] contiguous, workspace fp32 [WORKSPACE_SIZE] contiguous,
// 0 <= algo <= 3, all on one CUDA device. Here only what the kernels add: the dtypes this module
// was compiled for (the spec allows any input float and either fp8 format; dispatch picks the module).
template <typename T, typename Q>
struct QuantFp8 {
  static constexpr int kVec = kVecSize<T>;  // 16 bytes of input

  static void check_compiled(const TensorView& input, const TensorView& out) {
    check_module_dtype<T>(input, "input", "dtype ");
    check_module_dtype<Q>(out, "out", "dtype ");
  }

  // out = quantize(input / scale[0]).
  static void per_tensor_static(TensorView input, TensorView scale, TensorView out) {
    check_compiled(input, out);
    const DLDevice dev = input.device();
    const int64_t numel = input.numel();
    if (numel == 0) return;
    const T* x = static_cast<const T*>(input.data_ptr());
    uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
    const float* s = static_cast<const float*>(scale.data_ptr());
    float* sm = const_cast<float*>(s);  // only read (ScaleFrom::kGiven)
    if (is_aligned(x, sizeof(T) * kVec) && is_aligned(o, kVec)) {
      per_tensor_rows<kVec>(x, o, sm, numel, dev);
    } else {
      per_tensor_rows<1>(x, o, sm, numel, dev);
    }
  }

  // out = quantize(input / s), scale[0] = s = max(absmax(input) / fp8_max, 2^-126).
  // workspace: float32, one element per block (the grid is capped by its size; its content does not
  // matter: it is overwritten; non-empty by its declared size).
  // algo: 0 = auto (see the top of the file and AutoConfig), 1 = the fused cooperative kernel (two
  // kernels where it cannot run: see fused_available), 2 = two kernels, 3 = three kernels.
  static void per_tensor_dynamic(TensorView input, TensorView out, TensorView scale, TensorView workspace,
                                 int64_t algo) {
    check_compiled(input, out);
    const DLDevice dev = input.device();
    const int64_t numel = input.numel();
    const T* x = static_cast<const T*>(input.data_ptr());
    uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
    // (An empty input takes this path too and gets the scale of an all-zero tensor, 2^-126.)
    if (algo == 0 && numel * int64_t(sizeof(T)) <= AutoConfig::kOneRowBytes) {
      // Small tensors (a decode step's activations): the per-token kernel on the tensor as one row
      // computes the same absmax, scale and values in one launch instead of two (the absmax pass and
      // the quantize pass each cost a launch and a memory round trip).
      float* s = static_cast<float*>(scale.data_ptr());
      if (numel % kVec == 0 && is_aligned(x, sizeof(T) * kVec) && is_aligned(o, kVec)) {
        token_launch<kVec>(x, 0, o, 0, s, 1, numel, dev);
      } else {
        token_launch<1>(x, 0, o, 0, s, 1, numel, dev);
      }
      return;
    }
    if (is_aligned(x, sizeof(T) * kVec) && is_aligned(o, kVec)) {
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
    // auto: bf16 from AutoConfig::kFusedMinL2Pct % of the L2 size up to the three-kernel sizes
    const bool fused_auto = std::is_same_v<T, bf16_t> && algo == 0 && bytes > l2 * AutoConfig::kFusedMinL2Pct / 100 &&
                            bytes <= l2 * AutoConfig::kFinalizeMinL2s;
    if ((algo == 1 || fused_auto) && fused_available<VEC>(x, o, dev.device_id)) {
      fused_launch(x, o, s, ws, workspace.numel(), numel, dev);
      return;
    }
    // Two or three kernels (auto, algo 2 and 3). For tensors up to AbsmaxConfig::kL2KeepMaxL2s times
    // L2, the absmax pass reads the last kL2KeepPct % of L2 with normal priority; the quantize pass
    // re-reads that tail first.
    constexpr auto absmax = per_tensor_absmax_kernel<T, VEC>;
    constexpr auto quant = per_tensor_dynamic_quant_kernel<T, Q, VEC>;
    constexpr int kAbsThreads = AbsmaxConfig::kThreads, kQuantThreads = DynamicPassConfig::kThreads;
    const int64_t grid_a = persistent_grid<absmax, kAbsThreads>(dev.device_id, nv, workspace.numel());
    const int64_t keep_from =
        bytes <= l2 * AbsmaxConfig::kL2KeepMaxL2s ? nv - l2 * AbsmaxConfig::kL2KeepPct / 100 / kVecBytesHere : nv;
    // Small tensors: the first loads prefetched into L2 before the PDL wait (a loss for large ones).
    const bool prefetch = bytes <= l2 / 2;
    const bool three = algo == 3 || (algo == 0 && bytes > l2 * AutoConfig::kFinalizeMinL2s);
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
    return VEC == kVec && is_aligned(x, 16) && is_aligned(o, kVec) &&
           device_attribute(device_id, cudaDevAttrComputeCapabilityMajor) >= 9 &&
           device_attribute(device_id, cudaDevAttrCooperativeLaunch) != 0;
  }

  static void fused_launch(const T* x, uint8_t* o, float* s, uint32_t* ws, int64_t ws_size, int64_t numel,
                           DLDevice dev) {
    constexpr auto kernel = per_tensor_fused_kernel<T, Q>;
    constexpr int64_t kChunkBytes = int64_t(FusedConfig::kChunkVecs) * 16;
    const int64_t num_chunks = div_ceil<int64_t>(numel / kVec, FusedConfig::kChunkVecs);
    // One block per SM with as much dynamic shared memory as it may have (less the static part).
    const int64_t smem_chunks = fused_smem_cap(dev.device_id) / kChunkBytes;
    const int64_t grid = std::clamp<int64_t>(num_chunks, 1, std::min<int64_t>(num_sms(dev.device_id), ws_size));
    const int64_t owned = div_ceil<int64_t>(num_chunks, grid);  // the most chunks a block owns
    // All owned chunks in the stash when they fit; else the stash takes what the ring leaves.
    const bool ring = owned > smem_chunks;
    const int64_t stash_chunks = ring ? std::max<int64_t>(0, smem_chunks - FusedConfig::kStages) : owned;
    const int64_t smem = (stash_chunks + (ring ? FusedConfig::kStages : 0)) * kChunkBytes;
    RuntimeCheck(!ring || smem_chunks >= FusedConfig::kStages,
                 "per_tensor_quant_fp8: not enough shared memory for the fused kernel");
    const int64_t l2_chunks = int64_t(l2_bytes(dev.device_id)) * FusedConfig::kL2Pct / 100 / grid / kChunkBytes;
    LaunchKernel(kernel, dim3(grid), dim3(FusedConfig::kThreads), size_t(smem), dev,
                 "per_tensor_quant_fp8 (dynamic, fused)")
        .cooperative()
        .pdl()(x, o, s, ws, numel, int(stash_chunks), int(l2_chunks));
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
    check_compiled(input, out);
    const DLDevice dev = input.device();
    const int64_t rows = input.size(0), hidden = input.size(1);
    if (rows == 0) return;
    RuntimeCheck(hidden < (int64_t(1) << 31), "input: rows longer than 2^31 - 1 elements are not supported");
    const int64_t in_stride = input.stride(0), out_stride = out.stride(0);
    const T* x = static_cast<const T*>(input.data_ptr());
    uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
    float* s = static_cast<float*>(scales.data_ptr());
    const bool vec_ok = hidden % kVec == 0 && is_aligned(x, sizeof(T) * kVec) && is_aligned(o, kVec) &&
                        (rows == 1 || (in_stride % kVec == 0 && out_stride % kVec == 0));
    if (vec_ok) {
      token_launch<kVec>(x, in_stride, o, out_stride, s, rows, hidden, dev);
    } else {
      token_launch<1>(x, in_stride, o, out_stride, s, rows, hidden, dev);
    }
  }

  template <int VEC>
  static void token_launch(const T* x, int64_t in_stride, uint8_t* o, int64_t out_stride, float* s,
                           int64_t rows, int64_t hidden, DLDevice dev) {
    const int64_t nvr = std::max<int64_t>(hidden / VEC, 1);
    // Lanes per row: a warp (or the whole row if shorter) with up to 16 vectors each, more while the
    // grid has fewer than RowsConfig::kTokenThreadsPerSm threads per SM.
    int64_t P = std::min<int64_t>(32, sgljit::pow2_ceil(nvr));
    while (P < 1024 && div_ceil<int64_t>(nvr, P) > RowsConfig::kTokenMaxVecs) P *= 2;
    const int64_t target = int64_t(num_sms(dev.device_id)) * RowsConfig::kTokenThreadsPerSm;
    while (P < 1024 && P < nvr && rows * P < target) P *= 2;
    int64_t N = sgljit::pow2_ceil(std::min<int64_t>(div_ceil<int64_t>(nvr, P), RowsConfig::kTokenMaxVecs));
    if (P > kTokenMaxThreads<RowsConfig::kTokenMaxVecs>) N = std::min<int64_t>(N, RowsConfig::kTokenMaxVecs / 2);
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
  // scales[0]. N (1, 4, RowsConfig::kChunkMaxN) is the largest that still gives about
  // RowsConfig::kChunkThreadsPerSm threads per SM.
  template <int VEC, ScaleFrom kFrom = ScaleFrom::kGiven>
  static void per_tensor_rows(const T* x, uint8_t* o, float* s, int64_t numel, DLDevice dev) {
    const int64_t nv = numel / VEC;
    const int64_t warps = int64_t(num_sms(dev.device_id)) * RowsConfig::kChunkThreadsPerSm / 32;
    const int64_t N = nv >= RowsConfig::kChunkMaxN * 32 * warps ? RowsConfig::kChunkMaxN : nv >= 4 * 32 * warps ? 4 : 1;
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
  // per-tensor chunks only 1, 4 and RowsConfig::kChunkMaxN (compile time); N is one of them.
  template <int VEC, ScaleFrom kFrom>
  static void launch_rows(const RowsArgs<T>& a, int64_t N, DLDevice dev, const char* name) {
    if constexpr (kFrom == ScaleFrom::kRowMax) {
      launch_rows_n<VEC, kFrom, RowsConfig::kTokenMaxVecs, 1, 2, 4, 8>(a, N, dev, name);
    } else {
      launch_rows_n<VEC, kFrom, RowsConfig::kChunkMaxN, 1, 4>(a, N, dev, name);
    }
  }

  // The kernel for the first of kSmallN equal to N, else for N = kLargestN.
  template <int VEC, ScaleFrom kFrom, int kLargestN, int... kSmallN>
  static void launch_rows_n(const RowsArgs<T>& a, int64_t N, DLDevice dev, const char* name) {
    const int threads = std::max(a.P, 128);
    const int64_t grid = div_ceil<int64_t>(a.num_rows, threads / a.P);
    RowsArgs<T> args = a;
    // As in the norm kernels: a prefetch before the PDL wait pays for grids of up to one block per SM.
    args.prefetch = grid <= num_sms(dev.device_id);
    auto launch = [&](auto kernel) { LaunchKernel(kernel, dim3(grid), dim3(threads), 0, dev, name).pdl()(args); };
    const bool small = ((N == kSmallN && (launch(rows_kernel<T, Q, VEC, kSmallN, kFrom>), true)) || ...);
    if (!small) launch(rows_kernel<T, Q, VEC, kLargestN, kFrom>);
  }
};

}  // namespace sgljit_quant_fp8

// FP8 quantization: per-tensor (static scale, dynamic scale) and per-token (dynamic), CUDA.
//
// Every output byte is bit-identical to PyTorch's
//     (x.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)
// for the same fp32 scale tensor (true division, as torch does for a scale tensor on the device):
//   * x / scale is the correctly rounded fp32 quotient. For scales in [2^-40, 2^40] it is computed
//     from the correctly rounded reciprocal y = 1/scale by Markstein corrections (q0 = x*y,
//     q1 = q0 + (x - s*q0)*y, q2 = q1 + (x - s*q1)*y, fma residuals): fp32 inputs take both (the
//     last step is exact by Markstein's theorem), 1 mul + 4 fma instead of a full IEEE division;
//     bf16 and fp16 inputs (at most 11 significant bits) stop at q1, which for them is already the
//     correctly rounded quotient: checked exhaustively, every bf16 and fp16 significand against
//     every fp32 significand of the scale (in that range the exponents scale every step exactly;
//     tests/plugins/test_quant_fp8.py repeats it on the CPU for a sample of scales). Quotients whose
//     residuals could underflow are below 2^-60 (fp8 +-0, sign kept by copysign); |x*y| >= 2^100
//     saturates either way. Other scales (tiny, huge, <= 0, inf, NaN) use __fdiv_rn. On the H200
//     the one step made the dynamic op's quantize passes faster: 16384x4096 bf16 80.8-81.5 -> 79.0-79.4
//     us (three kernels), the fused kernel 86.1 -> 81.4 (its phase B mostly); per-token 4-11%
//     faster, the static op up to 4% (bf16, 4096 wide).
//   * clamp + round-to-nearest-even = the hardware cvt.rn.satfinite (saturation to +-max is the
//     clamp; NaN stays NaN: 0x7F, as torch's conversion of the canonical NaN the GPU produces).
// Dynamic scale = max(absmax / fp8_max, 2^-126) in fp32 (true division): an all-zero tensor gets a
// finite scale; a NaN anywhere gives a NaN scale (absmax is a max over |x| bit patterns, so NaN wins
// as in torch.amax).
//
// Every kernel starts with sgljit::pdl_wait() (before any global memory access) and then
// pdl_launch_dependents(), and is launched with programmatic dependent launch: the next kernel's
// blocks are scheduled while this one drains, so back-to-back launches (the two kernels of the
// dynamic op, consecutive ops in a CUDA graph) do not pay the launch gap. pdl_wait returns only once
// the previous kernel has completed and flushed, so the dynamic op's partial maxima need no fence.
//
// Per-tensor dynamic, inputs up to QUANT_FP8_ONE_ROW_BYTES (64 KB; "auto" only): the per-token kernel
// below on the whole tensor as one row, one launch and one memory round trip (the two-kernel path
// pays two launches: 3.2 us for 1x4096 bf16 on the H200, torch.compile 2.2, per-token 1x4096 1.9).
//
// Per-tensor dynamic, larger inputs ("two kernels"), both with persistent grids (SMs x resident blocks):
//   1. absmax: grid-stride over "slices" (one vector per thread of the grid, consecutive slices
//      adjacent in memory), QUANT_FP8_ABSMAX_UNROLL 16-byte loads in flight per thread: a read-only
//      stream, so it should run at read bandwidth. bf16/fp16 are reduced packed (|x| by masking the
//      sign bits, then max.NaN on x2 pairs: exact, NaN-propagating, 1 instruction per 2 elements).
//      Slices before the last QUANT_FP8_L2_KEEP_PCT % of L2 are loaded evict-first, the tail with
//      normal priority so it is still in L2 when the quantize pass starts; only for tensors of up to
//      QUANT_FP8_L2_KEEP_MAX_L2S times the L2 size. On the H200 keeping 45% was 5% faster for 64 MB
//      (8192x4096 bf16), 1% for 128 MB and 5% slower for 512 MB. Each block writes its
//      maximum to workspace[block]: no zeroing, no atomics, no inter-block race.
//   2. quantize: every block reduces the (few hundred) partial maxima itself, computes the scale
//      (block 0 stores it), then walks the tensor BACKWARDS (vector v -> nv - 1 - v), so the tail the
//      absmax pass read last is re-read from L2 before later misses evict it. Loads 16 bytes, stores
//      8 packed fp8 bytes per vector, evict-first both ways, QUANT_FP8_QUANT_UNROLL vectors in
//      flight; __launch_bounds__(512, 2) caps it at 64 registers so two blocks fit per SM (left
//      alone, ptxas took 80 for the Markstein division of 4 vectors at once: one block per SM).
//      (The static kernel's layout below, with the partials reduced by every block, measured
//      1-14% slower here on the H200; a block per chunk instead of a persistent grid, 8% slower;
//      with the partials reduced by every warp after its loads are issued, 1-35% slower.)
//
// Per-tensor dynamic, inputs of more than QUANT_FP8_FINALIZE_MIN_L2S times the L2 size ("three
// kernels"): the absmax pass above, a one-block kernel that reduces its partial maxima to the scale,
// then the static kernel below on chunks taken last chunk first (the absmax pass's tail is still in
// L2). On the H200:
// 65536x4096 bf16 320.3 -> 308.0 us, 16384x4096 81.9 -> 80.6; at 8192x4096 (64 MB, about the L2
// size) 1% slower, at 1024x4096 10% (the third launch). Profiled there at
// 16384x4096 (kernels serialized by the profiler): absmax 33.5 us, finalize 2.1, quantize pass 48.7,
// the last reading 111 of its 134 MB from DRAM (the kept tail hits) at 69% of DRAM peak, so the hits
// do not shorten it in proportion. Spreading the kept chunks over the pass (DRAM busy while L2
// serves them) and loading the tail evict-last instead of at normal priority: both within 1%; an
// absmax pass of a block per 64 KB chunk (hardware-balanced) instead of the persistent grid: 0.6%
// faster, noise; a quantize pass of 4 vectors a lane instead of 16: 2-5% slower.
//
// Per-tensor static: the per-token kernel's layout with the scale given: the tensor is cut into
// chunks of 32 * N vectors (N = 1, 4 or 8: the largest that still gives about
// QUANT_FP8_CHUNK_THREADS_PER_SM threads per SM), a warp per chunk holding it in registers; every
// load is issued before the scale's, so the two latencies overlap. On the H200 this measured
// 186.6 us at 65536x4096 bf16 (the persistent grid-stride pass of the dynamic op: 210.9) and
// 1.22 us at 1x4096 (1.77). N = 8 (59 registers, 8 blocks of 128 threads per SM) instead of 16
// (102, 5 blocks): 4096x4096 15.1 -> 14.4 us, 16384x4096 49.6 -> 48.9, the dynamic op's quantize
// pass at 16384x4096 79.2 -> 78.2; 65536x4096 equal. Full chunks (all but the last) are read and
// written at fixed offsets without clamps or bounds (64 registers now, still 8 blocks per SM).
// Vectors are carried as raw words (uint4), not arrays of 16-bit objects: copying those cost byte
// permutes right after each load, and the loads were then issued one at a time.
// The cooperative single-launch kernel (SGLJIT_QUANT_FP8_DYNAMIC=fused, sm_90+, 16-byte aligned;
// otherwise that mode runs two kernels): bulk copies through a ring in shared memory, a stash of
// each block's last chunks kept on chip across the grid barrier, the ring's tail kept in L2. "auto"
// takes it for bf16 from QUANT_FP8_FUSED_MIN_L2_PCT (25) % of the L2 size up to the three-kernel
// sizes: with the one-step division, on the H200, 2048x4096 12.3 us (two kernels 12.5), 4096x4096
// 20.9 (22.6), 8192x4096 40.5 (42.4); launched with PDL as well 11.1, 19.3, 39.0 (without, in the
// same runs: 11.8, 20.1, 40.0); at 1024x4096 8.6 (7.9), 16384x4096 81.4-82.5 (three kernels
// 79.2). With the full division it was 3-13% slower than auto from 1024x4096 to 65536x4096
// bf16 (16384x4096: 85.9-86.4 us vs 80.8-81.3), with 3 stages of 32 KB, its best ring (6 stages of
// 16 KB, 5 or 6 of 32 KB, 1024 threads: slower). Keeping 20% of L2 instead of 45 made 16384x4096
// 83.6 and 65536x4096 317 us (auto: 308), but 8192x4096 3% slower; 0 or 70%: slower.
// Its first forms were slower still: loads into registers, 64 KB in flight per SM (98.5 us at
// 16384x4096), and each block owning one contiguous range instead of every G-th chunk (99.2 us).
// Profiled at 16384x4096 it moves 210 MB in and 66 MB out of DRAM in 88 us (3.1 TB/s): it is held
// back by latency, not by traffic. Two blocks per SM (each half the shared memory, 16 or 32 KB
// stages) and phase B quantizing a stashed chunk after each ring chunk: equal or slower.
// Its phase timestamps (QUANT_FP8_FUSED_TRACE, benchmarks/trace_quant_fused.py) at 16384x4096: phase
// A's ring streams at about 4.4 TB/s, blocks end it 6 us apart, the barrier releases at ~38 us;
// phase B then takes ~44.5 us for 143 MB of DRAM traffic (3.2 TB/s), blocks ending up to 9 us
// apart. Phase B staggered across blocks (on-chip and DRAM chunks read at the same time): blocks
// end together, the median no sooner (equal). Phase B through registers, a warp per 8 KB piece as
// the static kernel reads: 5% slower. Phase B refilling each quantized stash chunk's shared memory
// (up to 6 copies in flight instead of 2): 0.7-3% slower, with either division.
//
// Per-token: P lanes per row (a power of two, 1..1024), each lane keeps N <= 16 vectors of its row in
// registers (N a template parameter; loads at clamped indices, unpredicated, so all N are issued
// before the first use): the row is read from global memory once, reduced (shuffles, plus shared
// memory when P > 32), and quantized from registers. The host picks the fewest lanes per row that still give about
// QUANT_FP8_TOKEN_THREADS_PER_SM threads per SM: small T spreads a row over more lanes (a single
// memory round trip, little serial work per thread), large T uses a warp per row (H = 4096 bf16:
// 16 vectors per lane, no block barrier).
//
// Tuning macros (defaults are the current choice; SGLJIT_EXTRA_CUDA_CFLAGS="-DNAME=VALUE" overrides
// them and is part of the build cache key): QUANT_FP8_ABSMAX_UNROLL, QUANT_FP8_ABSMAX_THREADS,
// QUANT_FP8_QUANT_UNROLL, QUANT_FP8_QUANT_THREADS, QUANT_FP8_QUANT_MIN_BLOCKS, QUANT_FP8_L2_KEEP_PCT,
// QUANT_FP8_TOKEN_THREADS_PER_SM, QUANT_FP8_CHUNK_THREADS_PER_SM, QUANT_FP8_FINALIZE_MIN_L2S,
// QUANT_FP8_ONE_STEP; the fused kernel's QUANT_FP8_FUSED_THREADS, _STAGES, _STAGE_BYTES, _L2_PCT,
// _PDL and _MIN_L2_PCT.
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

#ifndef QUANT_FP8_PREFETCH_L2  // small grids/tensors: prefetch the first loads into L2 before the PDL wait
#define QUANT_FP8_PREFETCH_L2 1
#endif
#ifndef QUANT_FP8_FUSED_MIN_L2_PCT  // dynamic (auto), bf16: the fused kernel from this % of the L2 size
#define QUANT_FP8_FUSED_MIN_L2_PCT 25
#endif
#ifndef QUANT_FP8_FINALIZE_MIN_L2S  // dynamic (auto): tensors of more than this many times the L2
#define QUANT_FP8_FINALIZE_MIN_L2S 2   // size take three kernels (absmax, finalize, static pass)
#endif
#ifndef QUANT_FP8_CHUNK_THREADS_PER_SM  // static: threads per SM the chunk-size choice aims at
#define QUANT_FP8_CHUNK_THREADS_PER_SM 512  // (1024x4096 bf16: 4 vectors a lane, 5.59 -> 5.28 us vs 1024)
#endif
#ifndef QUANT_FP8_L2_KEEP_PCT  // the absmax pass's tail kept in L2 for the quantize pass, % of L2
#define QUANT_FP8_L2_KEEP_PCT 45
#endif
#ifndef QUANT_FP8_L2_KEEP_MAX_L2S  // ... for tensors of at most this many times the L2 size
#define QUANT_FP8_L2_KEEP_MAX_L2S 4
#endif
#ifndef QUANT_FP8_ONE_ROW_BYTES  // dynamic per-tensor (auto): inputs up to this size take one launch
#define QUANT_FP8_ONE_ROW_BYTES 65536
#endif
#ifndef QUANT_FP8_TOKEN_THREADS_PER_SM  // per-token: threads per SM the lanes-per-row choice aims at
#define QUANT_FP8_TOKEN_THREADS_PER_SM 512
#endif

namespace sgljit_quant_fp8 {

using namespace sgljit;

// ------------------------------------------------------------------------------------------------
// Host side

inline int l2_bytes(int device_id) { return device_attribute(device_id, cudaDevAttrL2CacheSize); }

inline bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

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
    SGLJIT_CHECK(same_dtype(input.dtype(), DTypeTrait<T>::value), "input: this module was compiled for dtype ",
                 dtype_name(DTypeTrait<T>::value), ", got ", dtype_name(input.dtype()));
    SGLJIT_CHECK(same_dtype(out.dtype(), DTypeTrait<Q>::value), "out: this module was compiled for dtype ",
                 dtype_name(DTypeTrait<Q>::value), ", got ", dtype_name(out.dtype()));
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
    if (aligned(x, sizeof(T) * kVec) && aligned(o, kVec)) {
      per_tensor_rows<kVec>(x, o, sm, numel, dev);
    } else {
      per_tensor_rows<1>(x, o, sm, numel, dev);
    }
  }

  // out = quantize(input / s), scale[0] = s = max(absmax(input) / fp8_max, 2^-126).
  // workspace: float32, one element per block (the grid is capped by its size; its content does not
  // matter: it is overwritten; non-empty by its declared size).
  // algo: 0 = auto (one row of the per-token kernel up to QUANT_FP8_ONE_ROW_BYTES, three kernels
  // beyond QUANT_FP8_FINALIZE_MIN_L2S times the L2 size, for bf16 the fused kernel from
  // QUANT_FP8_FUSED_MIN_L2_PCT % of the L2 size up to there, else two kernels), 1 = the fused
  // cooperative kernel (two kernels where it cannot run: see fused_available), 2 = two kernels,
  // 3 = three kernels.
  static void per_tensor_dynamic(TensorView input, TensorView out, TensorView scale, TensorView workspace,
                                 int64_t algo) {
    check_compiled(input, out);
    const DLDevice dev = input.device();
    const int64_t numel = input.numel();
    const T* x = static_cast<const T*>(input.data_ptr());
    uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
    // (An empty input takes this path too and gets the scale of an all-zero tensor, 2^-126.)
    if (algo == 0 && numel * int64_t(sizeof(T)) <= QUANT_FP8_ONE_ROW_BYTES) {
      // Small tensors (a decode step's activations): the per-token kernel on the tensor as one row
      // computes the same absmax, scale and values in one launch instead of two (the absmax pass and
      // the quantize pass each cost a launch and a memory round trip).
      float* s = static_cast<float*>(scale.data_ptr());
      if (numel % kVec == 0 && aligned(x, sizeof(T) * kVec) && aligned(o, kVec)) {
        token_launch<kVec>(x, 0, o, 0, s, 1, numel, dev);
      } else {
        token_launch<1>(x, 0, o, 0, s, 1, numel, dev);
      }
      return;
    }
    if (aligned(x, sizeof(T) * kVec) && aligned(o, kVec)) {
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
    // auto: bf16 (measured with the one step) from QUANT_FP8_FUSED_MIN_L2_PCT % of the L2 size up
    // to the three-kernel sizes
    const bool fused_auto = std::is_same_v<T, bf16_t> && QUANT_FP8_ONE_STEP && algo == 0 &&
                            bytes > l2 * QUANT_FP8_FUSED_MIN_L2_PCT / 100 && bytes <= l2 * QUANT_FP8_FINALIZE_MIN_L2S;
    if ((algo == 1 || fused_auto) && fused_available<VEC>(x, o, dev.device_id)) {
      fused_launch(x, o, s, ws, workspace.numel(), numel, dev);
      return;
    }
    // Two or three kernels (auto, algo 2 and 3). For tensors up to QUANT_FP8_L2_KEEP_MAX_L2S times
    // L2, the absmax pass reads the last QUANT_FP8_L2_KEEP_PCT % of L2 with normal priority; the
    // quantize pass re-reads that tail first.
    constexpr auto absmax = per_tensor_absmax_kernel<T, VEC>;
    constexpr auto quant = per_tensor_dynamic_quant_kernel<T, Q, VEC>;
    constexpr int kAbsThreads = QUANT_FP8_ABSMAX_THREADS, kQuantThreads = QUANT_FP8_QUANT_THREADS;
    const int64_t grid_a = persistent_grid<absmax, kAbsThreads>(dev.device_id, nv, workspace.numel());
    const int64_t keep_from =
        bytes <= l2 * QUANT_FP8_L2_KEEP_MAX_L2S ? nv - l2 * QUANT_FP8_L2_KEEP_PCT / 100 / kVecBytesHere : nv;
    // The prefetch measured 7.5% faster for 8 MB (1024x4096 bf16), 1-4% slower from 128 MB.
    const bool prefetch = QUANT_FP8_PREFETCH_L2 && bytes <= l2 / 2;
    const bool three = algo == 3 || (algo == 0 && bytes > l2 * QUANT_FP8_FINALIZE_MIN_L2S);
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
    return VEC == kVec && aligned(x, 16) && aligned(o, kVec) &&
           device_attribute(device_id, cudaDevAttrComputeCapabilityMajor) >= 9 &&
           device_attribute(device_id, cudaDevAttrCooperativeLaunch) != 0;
  }

  static void fused_launch(const T* x, uint8_t* o, float* s, uint32_t* ws, int64_t ws_size, int64_t numel,
                           DLDevice dev) {
    constexpr auto kernel = per_tensor_fused_kernel<T, Q>;
    constexpr int64_t kChunkBytes = int64_t(kFusedChunkVecs) * 16;
    const int64_t num_chunks = div_ceil<int64_t>(numel / kVec, kFusedChunkVecs);
    // One block per SM with as much dynamic shared memory as it may have (less the static part).
    const int64_t smem_chunks = fused_smem_cap(dev.device_id) / kChunkBytes;
    const int64_t grid = std::clamp<int64_t>(num_chunks, 1, std::min<int64_t>(num_sms(dev.device_id), ws_size));
    const int64_t owned = div_ceil<int64_t>(num_chunks, grid);  // the most chunks a block owns
    // All owned chunks in the stash when they fit; else the stash takes what the ring leaves.
    const bool ring = owned > smem_chunks;
    const int64_t stash_chunks = ring ? std::max<int64_t>(0, smem_chunks - kFusedStages) : owned;
    const int64_t smem = (stash_chunks + (ring ? kFusedStages : 0)) * kChunkBytes;
    RuntimeCheck(!ring || smem_chunks >= kFusedStages, "per_tensor_quant_fp8: not enough shared memory for the fused kernel");
    const int64_t l2_chunks = int64_t(l2_bytes(dev.device_id)) * QUANT_FP8_FUSED_L2_PCT / 100 / grid / kChunkBytes;
    LaunchKernel(kernel, dim3(grid), dim3(kFusedThreads), size_t(smem), dev, "per_tensor_quant_fp8 (dynamic, fused)")
        .cooperative()
        .pdl(QUANT_FP8_FUSED_PDL)(x, o, s, ws, numel, int(stash_chunks), int(l2_chunks));
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
    const bool vec_ok = hidden % kVec == 0 && aligned(x, sizeof(T) * kVec) && aligned(o, kVec) &&
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
    auto pow2_at_least = [](int64_t n) {
      int64_t p = 1;
      while (p < n) p *= 2;
      return p;
    };
    // Lanes per row: a warp (or the whole row if shorter) with up to 16 vectors each, more while the
    // grid has fewer than QUANT_FP8_TOKEN_THREADS_PER_SM threads per SM.
    int64_t P = std::min<int64_t>(32, pow2_at_least(nvr));
    while (P < 1024 && div_ceil<int64_t>(nvr, P) > kTokenMaxVecs) P *= 2;
    const int64_t target = int64_t(num_sms(dev.device_id)) * QUANT_FP8_TOKEN_THREADS_PER_SM;
    while (P < 1024 && P < nvr && rows * P < target) P *= 2;
    int64_t N = pow2_at_least(std::min<int64_t>(div_ceil<int64_t>(nvr, P), kTokenMaxVecs));
    if (P > kTokenMaxThreads<kTokenMaxVecs>) N = std::min<int64_t>(N, kTokenMaxVecs / 2);
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
  // scales[0]. N (1, 4, kChunkMaxN) is the largest that still gives about
  // QUANT_FP8_CHUNK_THREADS_PER_SM threads per SM.
  template <int VEC, ScaleFrom kFrom = ScaleFrom::kGiven>
  static void per_tensor_rows(const T* x, uint8_t* o, float* s, int64_t numel, DLDevice dev) {
    const int64_t nv = numel / VEC;
    const int64_t warps = int64_t(num_sms(dev.device_id)) * QUANT_FP8_CHUNK_THREADS_PER_SM / 32;
    const int64_t N = nv >= kChunkMaxN * 32 * warps ? kChunkMaxN : nv >= 4 * 32 * warps ? 4 : 1;
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
  // per-tensor chunks only 1, 4 and kChunkMaxN (compile time); N is one of them.
  template <int VEC, ScaleFrom kFrom>
  static void launch_rows(const RowsArgs<T>& a, int64_t N, DLDevice dev, const char* name) {
    if constexpr (kFrom == ScaleFrom::kRowMax) {
      launch_rows_n<VEC, kFrom, kTokenMaxVecs, 1, 2, 4, 8>(a, N, dev, name);
    } else {
      launch_rows_n<VEC, kFrom, kChunkMaxN, 1, 4>(a, N, dev, name);
    }
  }

  // The kernel for the first of kSmallN equal to N, else for N = kLargestN.
  template <int VEC, ScaleFrom kFrom, int kLargestN, int... kSmallN>
  static void launch_rows_n(const RowsArgs<T>& a, int64_t N, DLDevice dev, const char* name) {
    const int threads = std::max(a.P, 128);
    const int64_t grid = div_ceil<int64_t>(a.num_rows, threads / a.P);
    RowsArgs<T> args = a;
    // As in the norm kernels: a prefetch before the PDL wait pays for grids of up to one block per SM.
    args.prefetch = QUANT_FP8_PREFETCH_L2 && grid <= num_sms(dev.device_id);
    auto launch = [&](auto kernel) { LaunchKernel(kernel, dim3(grid), dim3(threads), 0, dev, name).pdl()(args); };
    const bool small = ((N == kSmallN && (launch(rows_kernel<T, Q, VEC, kSmallN, kFrom>), true)) || ...);
    if (!small) launch(rows_kernel<T, Q, VEC, kLargestN, kFrom>);
  }
};

}  // namespace sgljit_quant_fp8

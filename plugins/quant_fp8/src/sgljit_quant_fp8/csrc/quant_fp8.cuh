// FP8 quantization: per-tensor (static scale, dynamic scale) and per-token (dynamic), CUDA.
//
// Every output byte is bit-identical to PyTorch's
//     (x.float() / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)
// for the same fp32 scale tensor (true division, as torch does for a scale tensor on the device):
//   * x / scale is the correctly rounded fp32 quotient. For scales in [2^-40, 2^40] it is computed
//     from the correctly rounded reciprocal y = 1/scale by two Markstein corrections
//     (q0 = x*y, q1 = q0 + (x - s*q0)*y, q = q1 + (x - s*q1)*y, fma residuals; the last step is
//     exact by Markstein's theorem), which costs 1 mul + 4 fma instead of a full IEEE division.
//     Quotients whose residuals could underflow are below 2^-60 (fp8 +-0, sign kept by copysign);
//     |x*y| >= 2^100 saturates either way. Other scales (tiny, huge, <= 0, inf, NaN) use __fdiv_rn.
//   * clamp + round-to-nearest-even = the hardware cvt.rn.satfinite (saturation to +-max is the
//     clamp; NaN stays NaN: 0x7F, as torch's conversion of the canonical NaN the GPU produces).
// Dynamic scale = max(absmax / fp8_max, 2^-126) in fp32 (true division): an all-zero tensor gets a
// finite scale; a NaN anywhere gives a NaN scale (absmax is a max over |x| bit patterns, so NaN wins
// as in torch.amax).
//
// Per-tensor dynamic: one cooperative persistent kernel (one 1024-thread block per SM): phase A
// reads the block's contiguous chunk once (absmax; the last up to ~220 KB of the chunk are kept in
// shared memory and the ~0.45 * L2 / blocks before it are read with normal priority so they stay in
// L2, the rest streaming), the partial maxima go to a workspace (one slot per block, no zeroing
// needed), one grid barrier, every block reduces the partials, then phase B quantizes the
// L2-resident part, the shared-memory part and finally re-reads the rest. Tensors up to ~29 MB on
// an H200 are read from HBM once. Without cooperative launch: the same two phases as two kernels.
#pragma once

#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include <sgljit/cuda.cuh>
#include <sgljit/reduce.cuh>
#include <sgljit/tensor.h>
#include <sgljit/type.cuh>
#include <sgljit/vec.cuh>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace sgljit_quant_fp8 {

using namespace sgljit;

// ------------------------------------------------------------------------------------------------
// Numerics

template <typename Q>
struct Fp8;
template <>
struct Fp8<fp8_e4m3_t> {
  static constexpr float kMax = 448.0f;
  static constexpr __nv_fp8_interpretation_t kKind = __NV_E4M3;
};
template <>
struct Fp8<fp8_e5m2_t> {
  static constexpr float kMax = 57344.0f;
  static constexpr __nv_fp8_interpretation_t kKind = __NV_E5M2;
};

// Smallest dynamic scale (2^-126, the smallest normal fp32): absmax / fp8_max below it (an all-zero
// or denormal-only input) is raised to it, so the scale is never 0.
inline constexpr float kMinScale = 1.17549435082228750797e-38f;

// |x| as bits: for non-negative floats the unsigned order is the numeric order, and every NaN is
// above +inf, so a max over these bits is a NaN-propagating absmax.
SGLJIT_DEVICE uint32_t abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

SGLJIT_DEVICE float scale_from_absmax(uint32_t bits, float fp8_max) {
  const float s = __fdiv_rn(__uint_as_float(bits), fp8_max);
  return s < kMinScale ? kMinScale : s;  // NaN compares false: stays NaN
}

struct Divider {
  float s, y;
  SGLJIT_DEVICE explicit Divider(float scale) : s(scale) { y = __frcp_rn(scale); }
  SGLJIT_DEVICE static bool fast(float scale) { return scale >= 0x1p-40f && scale <= 0x1p40f; }

  // The correctly rounded fp32 quotient x / s (see the top of the file).
  template <bool kFast>
  SGLJIT_DEVICE float operator()(float x) const {
    if constexpr (kFast) {
      const float q0 = __fmul_rn(x, y);
      const float r0 = __fmaf_rn(-q0, s, x);
      const float q1 = __fmaf_rn(r0, y, q0);
      const float r1 = __fmaf_rn(-q1, s, x);
      const float q2 = __fmaf_rn(r1, y, q1);
      return fabsf(q0) < 0x1p100f ? copysignf(q2, x) : q0;  // NaN, inf, huge: q0
    } else {
      return __fdiv_rn(x, s);
    }
  }
};

// Two quotients -> two fp8 bytes (low byte = first), clamped and rounded to nearest even.
template <typename Q>
SGLJIT_DEVICE uint16_t to_fp8x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, Fp8<Q>::kKind);
}
template <typename Q>
SGLJIT_DEVICE uint8_t to_fp8(float a) {
  return __nv_cvt_float_to_fp8(a, __NV_SATFINITE, Fp8<Q>::kKind);
}

// ------------------------------------------------------------------------------------------------
// Vector I/O: VEC elements of T in one transaction (16 bytes when VEC = 16 / sizeof(T)).

template <int kBytes>
struct Raw;
template <>
struct Raw<16> {
  using type = uint4;
};
template <>
struct Raw<8> {
  using type = uint2;
};
template <>
struct Raw<4> {
  using type = unsigned int;
};
template <>
struct Raw<2> {
  using type = unsigned short;
};
template <>
struct Raw<1> {
  using type = unsigned char;
};

template <typename T, int VEC>
struct Io {
  using V = AlignedVector<T, VEC>;
  using In = typename Raw<sizeof(T) * VEC>::type;
  using Out = typename Raw<VEC>::type;  // VEC fp8 bytes

  // kStream: evict-first (data read for the last time, or data we do not want to keep in L2).
  template <bool kStream>
  SGLJIT_DEVICE static V load(const T* p) {
    In raw;
    if constexpr (kStream) {
      raw = __ldcs(reinterpret_cast<const In*>(p));
    } else {
      raw = *reinterpret_cast<const In*>(p);
    }
    V v;
    memcpy(&v, &raw, sizeof(V));
    return v;
  }

  SGLJIT_DEVICE static uint32_t absmax(const V& v) {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < VEC; ++i) m = max(m, abs_bits(to_float(v[i])));
    return m;
  }

  template <typename Q, bool kFast>
  SGLJIT_DEVICE static void quantize_store(const V& v, const Divider& div, uint8_t* dst) {
    Out raw;
    if constexpr (VEC == 1) {
      raw = to_fp8<Q>(div.template operator()<kFast>(to_float(v[0])));
    } else {
      uint16_t pairs[VEC / 2];
#pragma unroll
      for (int i = 0; i < VEC / 2; ++i) {
        pairs[i] = to_fp8x2<Q>(div.template operator()<kFast>(to_float(v[2 * i])),
                               div.template operator()<kFast>(to_float(v[2 * i + 1])));
      }
      memcpy(&raw, pairs, sizeof(raw));
    }
    __stcs(reinterpret_cast<Out*>(dst), raw);
  }
};

inline constexpr int kUnroll = 4;

// Block-wide max of uint32 (blockDim.x a multiple of 32, `smem` 32 words); every thread gets it.
SGLJIT_DEVICE uint32_t block_reduce_max_u32(uint32_t v, uint32_t* smem) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
  v = __reduce_max_sync(kFullMask, v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < num_warps ? smem[lane] : 0u;
  v = __reduce_max_sync(kFullMask, v);
  __syncthreads();
  return v;
}

// absmax over vectors [begin, end) of `in` (block-strided, kUnroll loads in flight per thread);
// with kStash each vector is also copied to stash[v - begin].
template <typename T, int VEC, bool kStream, bool kStash>
SGLJIT_DEVICE void absmax_range(const T* in, int64_t begin, int64_t end, uint32_t& m,
                                AlignedVector<T, VEC>* stash) {
  using IO = Io<T, VEC>;
  const int64_t step = blockDim.x;
  int64_t v = begin + threadIdx.x;
  for (; v + (kUnroll - 1) * step < end; v += kUnroll * step) {
    typename IO::V x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) x[k] = IO::template load<kStream>(in + (v + k * step) * VEC);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      m = max(m, IO::absmax(x[k]));
      if constexpr (kStash) stash[v + k * step - begin] = x[k];
    }
  }
  for (; v < end; v += step) {
    const typename IO::V x = IO::template load<kStream>(in + v * VEC);
    m = max(m, IO::absmax(x));
    if constexpr (kStash) stash[v - begin] = x;
  }
}

// Quantize vectors [begin, end): from `in` (kFromStash = false) or from stash[v - begin].
template <typename T, typename Q, int VEC, bool kFast, bool kFromStash>
SGLJIT_DEVICE void quant_range(const T* in, uint8_t* out, int64_t begin, int64_t end,
                               const Divider& div, const AlignedVector<T, VEC>* stash) {
  using IO = Io<T, VEC>;
  const int64_t step = blockDim.x;
  int64_t v = begin + threadIdx.x;
  auto fetch = [&](int64_t i) {
    if constexpr (kFromStash) {
      return stash[i - begin];
    } else {
      return IO::template load<true>(in + i * VEC);
    }
  };
  for (; v + (kUnroll - 1) * step < end; v += kUnroll * step) {
    typename IO::V x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) x[k] = fetch(v + k * step);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) IO::template quantize_store<Q, kFast>(x[k], div, out + (v + k * step) * VEC);
  }
  for (; v < end; v += step) IO::template quantize_store<Q, kFast>(fetch(v), div, out + v * VEC);
}

// ------------------------------------------------------------------------------------------------
// Per-tensor, static scale: one pass, grid-stride.

template <typename T, typename Q, int VEC, bool kFast>
SGLJIT_DEVICE void static_body(const T* in, uint8_t* out, const Divider& div, int64_t numel) {
  using IO = Io<T, VEC>;
  const int64_t nv = numel / VEC;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t v = tid;
  for (; v + (kUnroll - 1) * step < nv; v += kUnroll * step) {
    typename IO::V x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) x[k] = IO::template load<true>(in + (v + k * step) * VEC);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) IO::template quantize_store<Q, kFast>(x[k], div, out + (v + k * step) * VEC);
  }
  for (; v < nv; v += step) {
    IO::template quantize_store<Q, kFast>(IO::template load<true>(in + v * VEC), div, out + v * VEC);
  }
  const int64_t i = nv * VEC + tid;  // the last numel % VEC elements
  if (i < numel) out[i] = to_fp8<Q>(div.template operator()<kFast>(to_float(in[i])));
}

template <typename T, typename Q, int VEC>
__global__ void per_tensor_static_kernel(const T* __restrict__ in, uint8_t* __restrict__ out,
                                         const float* __restrict__ scale, int64_t numel) {
  const float s = __ldg(scale);
  const Divider div(s);
  if (Divider::fast(s)) {
    static_body<T, Q, VEC, true>(in, out, div, numel);
  } else {
    static_body<T, Q, VEC, false>(in, out, div, numel);
  }
}

// ------------------------------------------------------------------------------------------------
// Per-tensor, dynamic scale.

inline constexpr int kFusedThreads = 1024;

enum DynamicMode : int {
  kFused = 0,    // phase A, grid barrier, phase B (cooperative launch)
  kPartial = 1,  // phase A only: workspace[block] = the block's absmax bits
  kQuant = 2,    // phase B only, reading the workspace written by a kPartial launch of the same grid
};

template <typename T, typename Q, int VEC, bool kFast>
SGLJIT_DEVICE void phase_b(const T* in, uint8_t* out, const Divider& div, int64_t c0, int64_t l0,
                           int64_t k0, int64_t c1, const AlignedVector<T, VEC>* stash,
                           int64_t numel, bool last_block) {
  quant_range<T, Q, VEC, kFast, false>(in, out, l0, k0, div, nullptr);  // L2-resident part first
  quant_range<T, Q, VEC, kFast, true>(in, out, k0, c1, div, stash);     // kept in shared memory
  quant_range<T, Q, VEC, kFast, false>(in, out, c0, l0, div, nullptr);  // the rest, from HBM
  if (last_block) {
    for (int64_t i = numel / VEC * VEC + threadIdx.x; i < numel; i += blockDim.x) {
      out[i] = to_fp8<Q>(div.template operator()<kFast>(to_float(in[i])));
    }
  }
}

// Block b owns vectors [c0, c1) = [nv*b/G, nv*(b+1)/G): [c0, l0) streamed, [l0, k0) read with
// normal L2 priority (re-read first in phase B), [k0, c1) kept in shared memory (keep_vecs of them).
template <typename T, typename Q, int VEC>
__global__ __launch_bounds__(kFusedThreads, 1) void per_tensor_dynamic_kernel(
    const T* __restrict__ in, uint8_t* __restrict__ out, float* __restrict__ scale,
    uint32_t* __restrict__ workspace, int64_t numel, int64_t keep_vecs, int64_t l2_vecs, int mode) {
  using V = AlignedVector<T, VEC>;
  extern __shared__ uint4 dyn_smem[];
  __shared__ uint32_t red[32];
  V* stash = reinterpret_cast<V*>(dyn_smem);

  const int64_t nv = numel / VEC;
  const int G = gridDim.x, b = blockIdx.x;
  const bool last_block = b == G - 1;
  const int64_t c0 = nv * b / G, c1 = nv * (b + 1) / G;
  const int64_t keep = mode == kFused ? min(keep_vecs, c1 - c0) : 0;
  const int64_t k0 = c1 - keep;
  const int64_t l0 = max(c0, k0 - l2_vecs);

  if (mode != kQuant) {
    uint32_t m = 0;
    absmax_range<T, VEC, true, false>(in, c0, l0, m, nullptr);
    absmax_range<T, VEC, false, false>(in, l0, k0, m, nullptr);
    absmax_range<T, VEC, true, true>(in, k0, c1, m, stash);
    if (last_block) {
      for (int64_t i = nv * VEC + threadIdx.x; i < numel; i += blockDim.x) {
        m = max(m, abs_bits(to_float(in[i])));
      }
    }
    m = block_reduce_max_u32(m, red);
    if (threadIdx.x == 0) workspace[b] = m;
    if (mode == kPartial) return;
    cooperative_groups::this_grid().sync();  // also orders the workspace writes before the reads
  }

  uint32_t m = 0;
  for (int i = threadIdx.x; i < G; i += blockDim.x) m = max(m, __ldcg(workspace + i));
  m = block_reduce_max_u32(m, red);
  const float s = scale_from_absmax(m, Fp8<Q>::kMax);
  if (b == 0 && threadIdx.x == 0) *scale = s;
  const Divider div(s);
  if (Divider::fast(s)) {
    phase_b<T, Q, VEC, true>(in, out, div, c0, l0, k0, c1, stash, numel, last_block);
  } else {
    phase_b<T, Q, VEC, false>(in, out, div, c0, l0, k0, c1, stash, numel, last_block);
  }
}

// ------------------------------------------------------------------------------------------------
// Per-token: P threads per row (a power of two, 32..1024), rows of one block in one pass: each
// thread keeps up to kMaxVecs vectors in registers (a row longer than P * kMaxVecs vectors re-reads
// the remainder), warp + block max, scale, quantize from registers.

inline constexpr int kTokenMaxVecs = 4;

template <typename T, typename Q, int VEC, bool kFast>
SGLJIT_DEVICE void token_quant(const AlignedVector<T, VEC> (&x)[kTokenMaxVecs], const T* row_in,
                               uint8_t* row_out, int64_t nvr, int lane, int P, const Divider& div) {
  using IO = Io<T, VEC>;
#pragma unroll
  for (int k = 0; k < kTokenMaxVecs; ++k) {
    const int64_t j = lane + int64_t(k) * P;
    if (j < nvr) IO::template quantize_store<Q, kFast>(x[k], div, row_out + j * VEC);
  }
  for (int64_t j = lane + int64_t(kTokenMaxVecs) * P; j < nvr; j += P) {
    IO::template quantize_store<Q, kFast>(IO::template load<true>(row_in + j * VEC), div, row_out + j * VEC);
  }
}

template <typename T, typename Q, int VEC>
__global__ __launch_bounds__(1024) void per_token_kernel(const T* __restrict__ in, int64_t in_stride,
                                                         uint8_t* __restrict__ out, int64_t out_stride,
                                                         float* __restrict__ scales, int64_t num_rows,
                                                         int64_t hidden, int P) {
  using IO = Io<T, VEC>;
  __shared__ uint32_t red[32];
  const int rows_per_block = blockDim.x / P;
  const int lane = threadIdx.x % P;
  const int64_t row = int64_t(blockIdx.x) * rows_per_block + threadIdx.x / P;
  const bool valid = row < num_rows;
  const int64_t nvr = hidden / VEC;
  const T* row_in = in + row * in_stride;

  typename IO::V x[kTokenMaxVecs];
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < kTokenMaxVecs; ++k) {
    const int64_t j = lane + int64_t(k) * P;
    if (valid && j < nvr) x[k] = IO::template load<true>(row_in + j * VEC);
  }
#pragma unroll
  for (int k = 0; k < kTokenMaxVecs; ++k) {
    const int64_t j = lane + int64_t(k) * P;
    if (valid && j < nvr) m = max(m, IO::absmax(x[k]));
  }
  for (int64_t j = lane + int64_t(kTokenMaxVecs) * P; valid && j < nvr; j += P) {
    m = max(m, IO::absmax(IO::template load<false>(row_in + j * VEC)));  // re-read below: keep in L2
  }

  m = __reduce_max_sync(kFullMask, m);  // P >= 32: a warp never spans two rows
  if (P > 32) {
    const int warps_per_row = P / 32, first = (threadIdx.x / P) * warps_per_row;
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
    __syncthreads();
    m = 0;
    for (int w = 0; w < warps_per_row; ++w) m = max(m, red[first + w]);
  }
  if (!valid) return;

  const float s = scale_from_absmax(m, Fp8<Q>::kMax);
  if (lane == 0) scales[row] = s;
  const Divider div(s);
  uint8_t* row_out = out + row * out_stride;
  if (Divider::fast(s)) {
    token_quant<T, Q, VEC, true>(x, row_in, row_out, nvr, lane, P, div);
  } else {
    token_quant<T, Q, VEC, false>(x, row_in, row_out, nvr, lane, P, div);
  }
}

// ------------------------------------------------------------------------------------------------
// Host side

struct DeviceInfo {
  int sms = 0, max_smem_optin = 0, l2_bytes = 0, cooperative = 0;
};

inline const DeviceInfo& device_info(int device_id) {
  static std::array<DeviceInfo, 64> cache{};
  static std::mutex mutex;
  RuntimeCheck(device_id >= 0 && device_id < 64, "device id out of range: ", device_id);
  std::lock_guard<std::mutex> lock(mutex);
  DeviceInfo& info = cache[device_id];
  if (info.sms == 0) {
    check_cuda(cudaDeviceGetAttribute(&info.max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                      device_id),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&info.l2_bytes, cudaDevAttrL2CacheSize, device_id),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&info.cooperative, cudaDevAttrCooperativeLaunch, device_id),
               "cudaDeviceGetAttribute");
    info.sms = num_sms(device_id);
  }
  return info;
}

inline void check_dtype(const TensorView& t, const char* name, DLDataType want) {
  RuntimeCheck(same_dtype(t.dtype(), want), name, ": dtype expected ", dtype_name(want), ", got ",
               dtype_name(t.dtype()));
}

inline void check_device(const TensorView& t, const char* name, DLDevice want) {
  RuntimeCheck(t.device().device_type == kDLCUDA, name, ": expected a tensor on cuda, got one on ",
               device_name(t.device()));
  RuntimeCheck(t.device().device_id == want.device_id, name, ": expected a tensor on ",
               device_name(want), " (same as input), got one on ", device_name(t.device()));
}

inline bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

template <typename T, typename Q>
struct QuantFp8 {
  static constexpr int kVec = kVecSize<T>;  // 16 bytes of input

  // input (contiguous, any shape) and out (contiguous, same numel); checks and returns numel.
  static int64_t check_pair(const TensorView& input, const TensorView& out, DLDevice& dev) {
    check_dtype(input, "input", DTypeTrait<T>::value);
    check_dtype(out, "out", DTypeTrait<Q>::value);
    dev = input.device();
    check_device(input, "input", dev);
    check_device(out, "out", dev);
    RuntimeCheck(input.IsContiguous(), "input: expected a contiguous tensor");
    RuntimeCheck(out.IsContiguous(), "out: expected a contiguous tensor");
    RuntimeCheck(out.numel() == input.numel(), "out: expected ", input.numel(), " elements (as input), got ",
                 out.numel());
    return input.numel();
  }

  static void check_scale(const TensorView& scale, const char* name, DLDevice dev) {
    check_dtype(scale, name, DTypeTrait<float>::value);
    check_device(scale, name, dev);
    RuntimeCheck(scale.numel() == 1, name, ": expected one element, got ", scale.numel());
  }

  // out = quantize(input / scale[0]).
  static void per_tensor_static(TensorView input, TensorView scale, TensorView out) {
    DLDevice dev;
    const int64_t numel = check_pair(input, out, dev);
    check_scale(scale, "scale", dev);
    if (numel == 0) return;
    const T* x = static_cast<const T*>(input.data_ptr());
    uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
    const float* s = static_cast<const float*>(scale.data_ptr());
    const int sms = device_info(dev.device_id).sms;
    constexpr int kThreads = 512;
    auto launch = [&](auto kernel, int vec) {
      const int64_t nv = std::max<int64_t>(numel / vec, 1);
      // Two 512-thread blocks fit per SM (<= 64 registers): one resident wave, grid-stride.
      const int64_t blocks = std::min<int64_t>(div_ceil<int64_t>(nv, kThreads * kUnroll), int64_t(sms) * 2);
      LaunchKernel(kernel, dim3(blocks), dim3(kThreads), 0, dev, "per_tensor_quant_fp8 (static)")(x, o, s, numel);
    };
    if (aligned(x, sizeof(T) * kVec) && aligned(o, kVec)) {
      launch(per_tensor_static_kernel<T, Q, kVec>, kVec);
    } else {
      launch(per_tensor_static_kernel<T, Q, 1>, 1);
    }
  }

  // out = quantize(input / s), scale[0] = s = max(absmax(input) / fp8_max, 2^-126).
  // workspace: float32, one element per block (the grid is capped by its size; its content does not
  // matter: it is overwritten).
  // mode: 0 = auto, 1 = the fused cooperative kernel, 2 = two kernels (as without cooperative launch).
  static void per_tensor_dynamic(TensorView input, TensorView out, TensorView scale, TensorView workspace,
                                 int64_t mode) {
    DLDevice dev;
    const int64_t numel = check_pair(input, out, dev);
    check_scale(scale, "scale", dev);
    check_dtype(workspace, "workspace", DTypeTrait<float>::value);
    check_device(workspace, "workspace", dev);
    RuntimeCheck(workspace.IsContiguous() && workspace.numel() > 0,
                 "workspace: expected a non-empty contiguous tensor");
    RuntimeCheck(mode >= 0 && mode <= 2, "mode: expected 0 (auto), 1 (fused) or 2 (two kernels), got ", mode);
    const T* x = static_cast<const T*>(input.data_ptr());
    uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
    if (aligned(x, sizeof(T) * kVec) && aligned(o, kVec)) {
      dynamic_launch<kVec>(x, o, scale, workspace, numel, mode, dev);
    } else {
      dynamic_launch<1>(x, o, scale, workspace, numel, mode, dev);
    }
  }

  template <int VEC>
  static void dynamic_launch(const T* x, uint8_t* o, TensorView scale, TensorView workspace, int64_t numel,
                             int64_t mode, DLDevice dev) {
    auto kernel = per_tensor_dynamic_kernel<T, Q, VEC>;
    constexpr int64_t kVecBytesHere = sizeof(T) * VEC;
    const DeviceInfo& info = device_info(dev.device_id);
    float* s = static_cast<float*>(scale.data_ptr());
    uint32_t* ws = static_cast<uint32_t*>(workspace.data_ptr());
    const int64_t nv = numel / VEC;
    // Up to the opt-in maximum of shared memory (less what the kernel declares statically).
    const int smem_cap = std::max(0, info.max_smem_optin - 1024);
    const int64_t cap_vecs = smem_cap / kVecBytesHere;
    const int blocks_fit = fused_blocks_per_sm<VEC>(dev.device_id, smem_cap);
    const bool fused = mode == 1 || (mode == 0 && info.cooperative && blocks_fit > 0);
    if (fused) {
      RuntimeCheck(info.cooperative && blocks_fit > 0,
                   "per_tensor_quant_fp8: cooperative launch is not available on this device");
      // At least 1024 vectors (one per thread) per block: small tensors use few blocks.
      const int64_t grid = std::clamp<int64_t>(div_ceil<int64_t>(nv, kFusedThreads), 1,
                                               std::min<int64_t>(int64_t(info.sms) * blocks_fit, workspace.numel()));
      const int64_t chunk = div_ceil<int64_t>(nv, grid);
      const int64_t keep_vecs = std::min<int64_t>(cap_vecs, chunk);
      const int64_t l2_vecs = int64_t(info.l2_bytes) * 45 / 100 / grid / kVecBytesHere;
      const size_t smem = size_t(keep_vecs * kVecBytesHere);
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(grid);
      cfg.blockDim = dim3(kFusedThreads);
      cfg.dynamicSmemBytes = smem;
      cfg.stream = get_stream(dev);
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeCooperative;
      attr[0].val.cooperative = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      int m = kFused;
      check_cuda(cudaLaunchKernelEx(&cfg, kernel, x, o, s, ws, numel, keep_vecs, l2_vecs, m),
                 "launch of per_tensor_quant_fp8 (dynamic, fused)");
      return;
    }
    const int occupancy = plain_blocks_per_sm<VEC>(dev.device_id);
    const int64_t grid = std::clamp<int64_t>(div_ceil<int64_t>(nv, kFusedThreads), 1,
                                             std::min<int64_t>(int64_t(info.sms) * std::max(occupancy, 1),
                                                               workspace.numel()));
    const int64_t l2_vecs = int64_t(info.l2_bytes) * 45 / 100 / grid / kVecBytesHere;
    const int64_t keep_vecs = 0;
    LaunchKernel(kernel, dim3(grid), dim3(kFusedThreads), 0, dev, "per_tensor_quant_fp8 (absmax)")(
        x, o, s, ws, numel, keep_vecs, l2_vecs, int(kPartial));
    LaunchKernel(kernel, dim3(grid), dim3(kFusedThreads), 0, dev, "per_tensor_quant_fp8 (quantize)")(
        x, o, s, ws, numel, keep_vecs, l2_vecs, int(kQuant));
  }

  // Blocks of the dynamic kernel that fit on one SM without dynamic shared memory.
  template <int VEC>
  static int plain_blocks_per_sm(int device_id) {
    static std::array<int, 64> cache{};
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    int& slot = cache[device_id];
    if (slot == 0) {
      int current = 0, blocks = 0;
      check_cuda(cudaGetDevice(&current), "cudaGetDevice");
      check_cuda(cudaSetDevice(device_id), "cudaSetDevice");
      check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, per_tensor_dynamic_kernel<T, Q, VEC>,
                                                               kFusedThreads, 0),
                 "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      check_cuda(cudaSetDevice(current), "cudaSetDevice");
      slot = std::max(blocks, 1);
    }
    return slot;
  }

  // Blocks of the fused kernel that fit on one SM with `smem` bytes of dynamic shared memory
  // (after allowing that much once per device).
  template <int VEC>
  static int fused_blocks_per_sm(int device_id, int smem) {
    static std::array<int, 64> cache{};
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    int& slot = cache[device_id];
    if (slot == 0) {
      auto kernel = per_tensor_dynamic_kernel<T, Q, VEC>;
      int current = 0;
      check_cuda(cudaGetDevice(&current), "cudaGetDevice");
      check_cuda(cudaSetDevice(device_id), "cudaSetDevice");
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                 "cudaFuncSetAttribute");
      int blocks = 0;
      check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kFusedThreads, smem),
                 "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      check_cuda(cudaSetDevice(current), "cudaSetDevice");
      slot = blocks > 0 ? blocks : -1;
    }
    return std::max(slot, 0);
  }

  // out[t, :] = quantize(input[t, :] / scales[t]), scales[t] = max(absmax(input[t, :]) / fp8_max, 2^-126).
  // input [T, H] with unit stride along H (any row stride), out [T, H] likewise, scales [T, 1] fp32.
  static void per_token(TensorView input, TensorView out, TensorView scales) {
    SymbolicSize T_{"num_tokens"}, H{"hidden"}, S{"input_row_stride"}, So{"out_row_stride"};
    SymbolicDevice dev;
    TensorMatcher({T_, H}).with_strides({S, 1}).with_dtype<T>().with_device(kDLCUDA, dev).verify(input, "input");
    TensorMatcher({T_, H}).with_strides({So, 1}).with_dtype<Q>().with_device(kDLCUDA, dev).verify(out, "out");
    TensorMatcher({T_, 1}).with_strides({1, 1}).with_dtype<float>().with_device(kDLCUDA, dev).verify(scales, "scales");
    const int64_t rows = T_.value(), hidden = H.value();
    if (rows == 0) return;
    // Strides of size-1 dimensions are not bound by the matcher: take them from the tensors.
    const int64_t in_stride = input.stride(0), out_stride = out.stride(0);
    const T* x = static_cast<const T*>(input.data_ptr());
    uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
    float* s = static_cast<float*>(scales.data_ptr());
    const bool vec_ok = hidden % kVec == 0 && aligned(x, sizeof(T) * kVec) && aligned(o, kVec) &&
                        (rows == 1 || (in_stride % kVec == 0 && out_stride % kVec == 0));
    if (vec_ok) {
      token_launch<kVec>(x, in_stride, o, out_stride, s, rows, hidden, dev.value());
    } else {
      token_launch<1>(x, in_stride, o, out_stride, s, rows, hidden, dev.value());
    }
  }

  template <int VEC>
  static void token_launch(const T* x, int64_t in_stride, uint8_t* o, int64_t out_stride, float* s,
                           int64_t rows, int64_t hidden, DLDevice dev) {
    const int64_t nvr = std::max<int64_t>(hidden / VEC, 1);
    // Threads per row: enough to keep the row in registers, then more while the grid is small.
    int P = 32;
    while (P < 1024 && int64_t(P) * kTokenMaxVecs < nvr) P *= 2;
    const int64_t target = int64_t(device_info(dev.device_id).sms) * 2048;
    while (P < 1024 && P < nvr && rows * P < target) P *= 2;
    const int threads = std::max(P, 256);
    const int rows_per_block = threads / P;
    LaunchKernel(per_token_kernel<T, Q, VEC>, dim3(div_ceil<int64_t>(rows, rows_per_block)), dim3(threads), 0,
                 dev, "per_token_quant_fp8")(x, in_stride, o, out_stride, s, rows, hidden, P);
  }
};

}  // namespace sgljit_quant_fp8

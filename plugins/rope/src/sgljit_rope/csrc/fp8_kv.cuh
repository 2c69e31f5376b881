// Rope -> fp8 quantize, optionally -> append into a paged KV cache, and the plain paged append.
//
// Work decomposition: a warp per *item* (token t, one head of one tensor), four items a block. Items
// of a token: q heads, then k heads, then (paged) v heads. The warp's lanes stride over the head's
// rotary pairs (neox (i, i + R/2), gptj (2i, 2i + 1)) and then over its other elements, kVec
// elements a step where every width, pointer and stride of the call allows it (else one). Math in
// fp32: the rotated value times the scale, rounded to nearest even with saturation to the format's
// finite range (FlashInfer's cast; NaN stays NaN).
//
// Page table (FlashInfer's paged-KV convention): token t belongs to sequence b = batch_indices[t] at
// position p = page_positions[t]; it goes to entry p % page_size of page kv_indices[kv_indptr[b] +
// p / page_size]. Its contents are data the argument checks cannot see, so the kernel makes an
// out-of-bounds write impossible: a token whose b is outside [0, batch), whose p is negative, whose
// index falls outside [kv_indptr[b], kv_indptr[b + 1]) or kv_indices, or whose page is outside the
// cache stores nothing (the host-side validation raises on such tables first where it runs).
// A position outside the cos/sin table leaves the token unrotated (still quantized and stored).
#pragma once

#include <sgljit/cuda.cuh>
#include <sgljit/tensor.h>
#include <sgljit/type.cuh>
#include <sgljit/utils.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

namespace sgljit_rope_fp8 {

using namespace sgljit;

constexpr int kWarpsPerBlock = 4;  // items per block of 128 threads

struct Src {
  const void* ptr;
  int64_t st, sh;  // token and head strides (elements)
};
// A destination head: element (page, entry, head) at page * sp + entry * se + head * sh. Dense
// outputs are pages of one entry: page = token, se unused.
struct Dst {
  void* ptr;
  int64_t sp, se, sh;
};

struct PageTable {
  const int32_t* indices;
  const int32_t* indptr;
  const int32_t* batch_indices;
  const int32_t* positions;
  int64_t num_indices, batch, num_pages, page_size;

  // The (page, entry) of token t, or false where the table does not resolve to a page of the cache.
  SGLJIT_DEVICE bool locate(int64_t t, int64_t& page, int64_t& entry) const {
    const int64_t b = batch_indices[t], pos = positions[t];
    if (b < 0 || b >= batch || pos < 0) return false;
    const int64_t at = static_cast<int64_t>(indptr[b]) + pos / page_size;
    if (at < 0 || at >= static_cast<int64_t>(indptr[b + 1]) || at >= num_indices) return false;
    page = indices[at];
    if (page < 0 || page >= num_pages) return false;
    entry = pos % page_size;
    return true;
  }
};

struct Fp8KVParams {
  int64_t num_tokens;
  int32_t items;  // per token
  int32_t q_heads, k_heads;
  int32_t rot, nope, v_dim;
  Src q_rope, k_rope, q_nope, k_nope, v;
  Dst q_rope_out, q_nope_out, k_rope_out, k_nope_out, v_out;
  float scale_q, scale_k, scale_v;
  int64_t cache_stride, max_pos;
  PageTable table;
};

template <typename IdxT>
SGLJIT_DEVICE bool in_range(IdxT v, int64_t n) {
  return static_cast<int64_t>(v) >= 0 && static_cast<int64_t>(v) < n;
}

template <typename Q>
SGLJIT_DEVICE Q quantize(float x) {
  return from_float<Q>(x);  // __nv_fp8_* from float: round to nearest even, saturating to finite
}

// The rotary part of one head (rot elements; row: the token's cos | sin, null: unrotated), times
// scale, into y. A lane holds V elements a step: neox, V pairs (i, i + rot/2); gptj, V/2 adjacent
// pairs (V == 1: one element of a pair is the lane's, so a lane takes a whole pair).
template <typename T, typename Q, bool NEOX, int V>
SGLJIT_DEVICE void rope_quant_head(const T* __restrict__ x, Q* __restrict__ y, int rot,
                                   const float* __restrict__ row, float scale, int lane) {
  const int half = rot / 2;
  if constexpr (NEOX || V == 1) {
    for (int i = lane * V; i < half; i += 32 * V) {
      AlignedVector<T, V> a, b;
      AlignedVector<Q, V> ya, yb;
      const int i1 = NEOX ? i : 2 * i, i2 = NEOX ? i + half : 2 * i + 1;  // gptj: V == 1
      a.load(x + i1);
      b.load(x + i2);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float u = to_float(a[j]), w = to_float(b[j]);
        if (row != nullptr) {
          const float c = row[i + j], s = row[half + i + j];
          const float ru = u * c - w * s, rw = w * c + u * s;
          u = ru, w = rw;
        }
        ya[j] = quantize<Q>(u * scale);
        yb[j] = quantize<Q>(w * scale);
      }
      ya.store(y + i1);
      yb.store(y + i2);
    }
  } else {
    for (int e = lane * V; e < rot; e += 32 * V) {
      AlignedVector<T, V> a;
      AlignedVector<Q, V> ya;
      a.load(x + e);
#pragma unroll
      for (int j = 0; j < V; j += 2) {
        float u = to_float(a[j]), w = to_float(a[j + 1]);
        if (row != nullptr) {
          const int pair = (e + j) / 2;
          const float c = row[pair], s = row[half + pair];
          const float ru = u * c - w * s, rw = w * c + u * s;
          u = ru, w = rw;
        }
        ya[j] = quantize<Q>(u * scale);
        ya[j + 1] = quantize<Q>(w * scale);
      }
      ya.store(y + e);
    }
  }
}

template <typename T, typename Q, int V>
SGLJIT_DEVICE void quant_head(const T* __restrict__ x, Q* __restrict__ y, int n, float scale, int lane) {
  for (int i = lane * V; i < n; i += 32 * V) {
    AlignedVector<T, V> a;
    AlignedVector<Q, V> ya;
    a.load(x + i);
#pragma unroll
    for (int j = 0; j < V; ++j) ya[j] = quantize<Q>(to_float(a[j]) * scale);
    ya.store(y + i);
  }
}

template <typename T, typename Q, typename IdxT, bool NEOX, bool PAGED, int V>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    rope_fp8_kernel(const Fp8KVParams p, const float* __restrict__ cos_sin, const IdxT* __restrict__ positions) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t t = item / p.items;
  if (t >= p.num_tokens) return;
  int slot = static_cast<int>(item - t * p.items);
  const IdxT pos = positions[t];
  const float* row = in_range(pos, p.max_pos) ? cos_sin + static_cast<int64_t>(pos) * p.cache_stride : nullptr;
  if (slot < p.q_heads) {
    const int64_t h = slot;
    rope_quant_head<T, Q, NEOX, V>(static_cast<const T*>(p.q_rope.ptr) + t * p.q_rope.st + h * p.q_rope.sh,
                                   static_cast<Q*>(p.q_rope_out.ptr) + t * p.q_rope_out.sp + h * p.q_rope_out.sh,
                                   p.rot, row, p.scale_q, lane);
    quant_head<T, Q, V>(static_cast<const T*>(p.q_nope.ptr) + t * p.q_nope.st + h * p.q_nope.sh,
                        static_cast<Q*>(p.q_nope_out.ptr) + t * p.q_nope_out.sp + h * p.q_nope_out.sh, p.nope,
                        p.scale_q, lane);
    return;
  }
  int64_t page = t, entry = 0;
  if constexpr (PAGED) {
    if (!p.table.locate(t, page, entry)) return;
  }
  slot -= p.q_heads;
  if (slot < p.k_heads) {
    const int64_t h = slot;
    const Dst& kr = p.k_rope_out;
    const Dst& kn = p.k_nope_out;
    rope_quant_head<T, Q, NEOX, V>(static_cast<const T*>(p.k_rope.ptr) + t * p.k_rope.st + h * p.k_rope.sh,
                                   static_cast<Q*>(kr.ptr) + page * kr.sp + entry * kr.se + h * kr.sh, p.rot, row,
                                   p.scale_k, lane);
    quant_head<T, Q, V>(static_cast<const T*>(p.k_nope.ptr) + t * p.k_nope.st + h * p.k_nope.sh,
                        static_cast<Q*>(kn.ptr) + page * kn.sp + entry * kn.se + h * kn.sh, p.nope, p.scale_k, lane);
  } else {
    const int64_t h = slot - p.k_heads;
    const Dst& vo = p.v_out;
    quant_head<T, Q, V>(static_cast<const T*>(p.v.ptr) + t * p.v.st + h * p.v.sh,
                        static_cast<Q*>(vo.ptr) + page * vo.sp + entry * vo.se + h * vo.sh, p.v_dim, p.scale_v,
                        lane);
  }
}

inline Src src_of(const TensorView& x) { return {x.data_ptr(), x.stride(0), x.stride(1)}; }
inline Dst dense_of(const TensorView& x) { return {x.data_ptr(), x.stride(0), 0, x.stride(1)}; }
inline Dst paged_of(const TensorView& x) { return {x.data_ptr(), x.stride(0), x.stride(1), x.stride(2)}; }

inline PageTable table_of(const TensorView& kv_indices, const TensorView& kv_indptr, const TensorView& batch_indices,
                          const TensorView& page_positions, const TensorView& cache) {
  const int64_t entries = kv_indptr.size(0);
  RuntimeCheck(entries >= 1, "kv_indptr: expected batch_size + 1 >= 1 entries, got 0");
  return {static_cast<const int32_t*>(kv_indices.data_ptr()),
          static_cast<const int32_t*>(kv_indptr.data_ptr()),
          static_cast<const int32_t*>(batch_indices.data_ptr()),
          static_cast<const int32_t*>(page_positions.data_ptr()),
          kv_indices.size(0),
          entries - 1,
          cache.size(1) > 0 ? cache.size(0) : 0,  // pages of no entries: nothing can be stored
          cache.size(1) > 0 ? cache.size(1) : 1};
}

inline void check_rotary(const TensorView& cos_sin_cache, int64_t rot) {
  RuntimeCheck(rot > 0 && rot % 2 == 0, "cos_sin_cache: its width ", rot, " (rotary_dim) must be a positive even number");
  RuntimeCheck(cos_sin_cache.size(0) > 0, "cos_sin_cache: has no rows (expected [max_pos, rotary_dim] with max_pos >= 1)");
}

inline void check_scale(double scale, const char* name) {
  RuntimeCheck(scale == scale && scale != 1.0 / 0.0 && scale != -1.0 / 0.0, name, ": expected a finite scale, got ", scale);
}

// Whether every head of the call can be read and written kVec elements at a time: widths, pointers
// (kVec elements of T in, of one byte out) and token/head/page/entry strides all multiples of it.
constexpr int kVec = 4;  // 8-byte loads of 2-byte types, 4-byte fp8 stores: two pairs' worth a lane

inline bool vec_fits(const Fp8KVParams& p, int elem_bytes) {
  auto fits = [](int64_t n) { return n % kVec == 0; };
  auto ptr_fits = [](const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; };
  if (!fits(p.rot) || !fits(p.nope) || !fits(p.v_dim) || (p.rot / 2) % kVec != 0) return false;
  const int in_bytes = kVec * elem_bytes;
  // Parts of no width are never read or written (their strides and pointers do not count).
  const std::pair<const Src*, int> srcs[] = {
      {&p.q_rope, p.rot}, {&p.k_rope, p.rot}, {&p.q_nope, p.nope}, {&p.k_nope, p.nope}, {&p.v, p.v_dim}};
  for (const auto& [s, width] : srcs) {
    if (width > 0 && (!ptr_fits(s->ptr, in_bytes) || !fits(s->st) || !fits(s->sh))) return false;
  }
  const std::pair<const Dst*, int> dsts[] = {{&p.q_rope_out, p.rot},  {&p.q_nope_out, p.nope}, {&p.k_rope_out, p.rot},
                                             {&p.k_nope_out, p.nope}, {&p.v_out, p.v_dim}};
  for (const auto& [d, width] : dsts) {
    if (width > 0 && (!ptr_fits(d->ptr, kVec) || !fits(d->sp) || !fits(d->se) || !fits(d->sh))) return false;
  }
  return true;
}

template <typename T, typename Q, typename IdxT, bool NEOX, bool PAGED>
void launch_rope_fp8(Fp8KVParams& p, const TensorView& cos_sin_cache, const TensorView& positions, DLDevice device) {
  p.cache_stride = cos_sin_cache.stride(0);
  p.max_pos = cos_sin_cache.size(0);
  const int64_t items = p.num_tokens * p.items;
  const int64_t blocks = div_ceil<int64_t>(items, kWarpsPerBlock);
  RuntimeCheck(blocks <= 0x7fffffff, "q_rope: too many tokens and heads for one launch (", items, " heads)");
  const auto kernel = vec_fits(p, sizeof(T)) ? rope_fp8_kernel<T, Q, IdxT, NEOX, PAGED, kVec>
                                             : rope_fp8_kernel<T, Q, IdxT, NEOX, PAGED, 1>;
  LaunchKernel(kernel, static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, device,
               "sgljit_rope_fp8::rope_fp8_kernel")(p, static_cast<const float*>(cos_sin_cache.data_ptr()),
                                                   static_cast<const IdxT*>(positions.data_ptr()));
}

template <typename T, typename Q, typename IdxT, bool NEOX>
struct RopeQuantizeFp8 {
  static void run(TensorView q_rope, TensorView k_rope, TensorView q_nope, TensorView k_nope, TensorView cos_sin_cache,
                  TensorView positions, TensorView q_rope_out, TensorView k_rope_out, TensorView q_nope_out,
                  TensorView k_nope_out, double scale_q, double scale_k, bool is_neox) {
    check_module_dtype<T>(q_rope, "q_rope");
    check_module_dtype<Q>(q_rope_out, "q_rope_out");
    check_module_dtype<IdxT>(positions, "positions");
    RuntimeCheck(is_neox == NEOX, "is_neox: this module was compiled for is_neox=", NEOX ? "True" : "False");
    check_rotary(cos_sin_cache, q_rope.size(2));
    check_scale(scale_q, "scale_q");
    check_scale(scale_k, "scale_k");
    Fp8KVParams p{};
    p.num_tokens = q_rope.size(0);
    p.q_heads = static_cast<int32_t>(q_rope.size(1));
    p.k_heads = static_cast<int32_t>(k_rope.size(1));
    p.items = p.q_heads + p.k_heads;
    p.rot = static_cast<int32_t>(q_rope.size(2));
    p.nope = static_cast<int32_t>(q_nope.size(2));
    p.q_rope = src_of(q_rope), p.k_rope = src_of(k_rope), p.q_nope = src_of(q_nope), p.k_nope = src_of(k_nope);
    p.v = p.q_rope;
    p.q_rope_out = dense_of(q_rope_out), p.q_nope_out = dense_of(q_nope_out);
    p.k_rope_out = dense_of(k_rope_out), p.k_nope_out = dense_of(k_nope_out);
    p.v_out = p.k_rope_out;
    p.scale_q = static_cast<float>(scale_q), p.scale_k = static_cast<float>(scale_k), p.scale_v = 1.0f;
    if (p.num_tokens == 0 || p.items == 0) return;
    launch_rope_fp8<T, Q, IdxT, NEOX, false>(p, cos_sin_cache, positions, q_rope.device());
  }
};

template <typename T, typename Q, typename IdxT, bool NEOX>
struct RopeQuantizeFp8AppendPaged {
  static void run(TensorView q_rope, TensorView k_rope, TensorView q_nope, TensorView k_nope, TensorView v,
                  TensorView cos_sin_cache, TensorView positions, TensorView q_rope_out, TensorView q_nope_out,
                  TensorView k_rope_cache, TensorView k_nope_cache, TensorView v_cache, TensorView kv_indices,
                  TensorView kv_indptr, TensorView batch_indices, TensorView page_positions, double scale_q,
                  double scale_k, double scale_v, bool is_neox) {
    check_module_dtype<T>(q_rope, "q_rope");
    check_module_dtype<Q>(q_rope_out, "q_rope_out");
    check_module_dtype<IdxT>(positions, "positions");
    RuntimeCheck(is_neox == NEOX, "is_neox: this module was compiled for is_neox=", NEOX ? "True" : "False");
    check_rotary(cos_sin_cache, q_rope.size(2));
    check_scale(scale_q, "scale_q");
    check_scale(scale_k, "scale_k");
    check_scale(scale_v, "scale_v");
    Fp8KVParams p{};
    p.table = table_of(kv_indices, kv_indptr, batch_indices, page_positions, k_rope_cache);
    p.num_tokens = q_rope.size(0);
    p.q_heads = static_cast<int32_t>(q_rope.size(1));
    p.k_heads = static_cast<int32_t>(k_rope.size(1));
    p.items = p.q_heads + 2 * p.k_heads;
    p.rot = static_cast<int32_t>(q_rope.size(2));
    p.nope = static_cast<int32_t>(q_nope.size(2));
    p.v_dim = static_cast<int32_t>(v.size(2));
    p.q_rope = src_of(q_rope), p.k_rope = src_of(k_rope), p.q_nope = src_of(q_nope), p.k_nope = src_of(k_nope);
    p.v = src_of(v);
    p.q_rope_out = dense_of(q_rope_out), p.q_nope_out = dense_of(q_nope_out);
    p.k_rope_out = paged_of(k_rope_cache), p.k_nope_out = paged_of(k_nope_cache), p.v_out = paged_of(v_cache);
    p.scale_q = static_cast<float>(scale_q), p.scale_k = static_cast<float>(scale_k);
    p.scale_v = static_cast<float>(scale_v);
    if (p.num_tokens == 0 || p.items == 0) return;
    launch_rope_fp8<T, Q, IdxT, NEOX, true>(p, cos_sin_cache, positions, q_rope.device());
  }
};

// ------------------------------------------------------------------------------------------------
// The plain append: k [T, H, Dk] and v [T, H, Dv] copied (as E: an unsigned type of the dtype's size,
// or 16-byte chunks) into the paged caches; items are (token, k head) and (token, v head).
template <typename E>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    append_paged_kernel(const Src k, const Src v, const Dst kc, const Dst vc, const int64_t num_tokens,
                        const int32_t heads, const int32_t k_dim, const int32_t v_dim, const PageTable table) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t t = item / (2 * heads);
  if (t >= num_tokens) return;
  const int slot = static_cast<int>(item - t * 2 * heads);
  int64_t page, entry;
  if (!table.locate(t, page, entry)) return;
  const bool is_k = slot < heads;
  const int64_t h = is_k ? slot : slot - heads;
  const Src& s = is_k ? k : v;
  const Dst& d = is_k ? kc : vc;
  const E* x = static_cast<const E*>(s.ptr) + t * s.st + h * s.sh;
  E* y = static_cast<E*>(d.ptr) + page * d.sp + entry * d.se + h * d.sh;
  const int n = is_k ? k_dim : v_dim;
  for (int i = lane; i < n; i += 32) y[i] = x[i];
}

template <int kBytes>
struct AppendPagedKV {
  using E = std::conditional_t<kBytes == 1, uint8_t, std::conditional_t<kBytes == 2, uint16_t, uint32_t>>;
  static constexpr int kPerChunk = 16 / kBytes;  // elements in a 16-byte chunk

  static void run(TensorView k, TensorView v, TensorView k_cache, TensorView v_cache, TensorView kv_indices,
                  TensorView kv_indptr, TensorView batch_indices, TensorView page_positions) {
    RuntimeCheck(k.dtype().bits == 8 * kBytes, "k: this module was compiled for ", kBytes, "-byte elements");
    const PageTable table = table_of(kv_indices, kv_indptr, batch_indices, page_positions, k_cache);
    const int64_t n = k.size(0), heads = k.size(1);
    const int64_t items = n * 2 * heads;
    if (items == 0) return;
    const int64_t blocks = div_ceil<int64_t>(items, kWarpsPerBlock);
    RuntimeCheck(blocks <= 0x7fffffff, "k: too many tokens and heads for one launch (", items, " heads)");
    Src ks = src_of(k), vs = src_of(v);
    Dst kc = paged_of(k_cache), vc = paged_of(v_cache);
    int64_t k_dim = k.size(2), v_dim = v.size(2);
    // A byte copy: in 16-byte chunks where every width, pointer and stride is a whole number of them.
    auto chunked = [](int64_t n) { return n % kPerChunk == 0; };
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool wide = chunked(k_dim) && chunked(v_dim) && aligned(ks.ptr) && aligned(vs.ptr) && aligned(kc.ptr) &&
                      aligned(vc.ptr) && chunked(ks.st) && chunked(ks.sh) && chunked(vs.st) && chunked(vs.sh) &&
                      chunked(kc.sp) && chunked(kc.se) && chunked(kc.sh) && chunked(vc.sp) && chunked(vc.se) &&
                      chunked(vc.sh);
    auto go = [&](auto kernel) {
      LaunchKernel(kernel, static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, k.device(),
                   "sgljit_rope_fp8::append_paged_kernel")(ks, vs, kc, vc, n, static_cast<int32_t>(heads),
                                                           static_cast<int32_t>(k_dim), static_cast<int32_t>(v_dim),
                                                           table);
    };
    if (wide) {
      for (int64_t* x : {&ks.st, &ks.sh, &vs.st, &vs.sh, &kc.sp, &kc.se, &kc.sh, &vc.sp, &vc.se, &vc.sh, &k_dim, &v_dim}) {
        *x /= kPerChunk;
      }
      go(append_paged_kernel<uint4>);
    } else {
      go(append_paged_kernel<E>);
    }
  }
};

}  // namespace sgljit_rope_fp8

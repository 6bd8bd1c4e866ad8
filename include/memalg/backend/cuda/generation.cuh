// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/generation.cuh — the generation program's kernels (exec/program.hpp:
// ops::kv_append, ops::cached_attention_fwd, ops::argmax); the CUDA twin of
// backend/cpu/generation.hpp (layouts and formulas there).
//
// A layer's key/value cache is kv[B, L, 2·Hkv·D]: for each sequence b and position j, the Hkv key
// heads, then the Hkv value heads. The q = sh.S new tokens of each sequence come as the fused
// qkv[B·q, (H + 2Hkv)·D] of attention.cuh (after the rotary positions), key heads from column H·D,
// value heads right after them — the same 2·Hkv·D columns a cache row holds.
//  * kv_append: kv[b, pos0 + t, :] = qkv[b·q + t, H·D : (H + 2Hkv)·D] for t < q; a vectorised
//    copy (launch_pointwise), one item per element (or per 16 bytes).
//  * cached_attention_forward: out[B·q, H·D]; query t of sequence b (position pos0 + t; head h
//    reads kv head h / (H/Hkv)) attends to cache positions 0 … pos0 + t with scale 1/√D. One warp
//    per (b, h, t), attention.cuh's naive forward over the cache: a first pass over the keys (lane
//    j: keys j, j + 32, …) gives the softmax statistics in float (warp_softmax), a second recomputes
//    each score, p = exp(s − m)/l, and the warp (lanes over the head dimension) accumulates
//    Σ_j p_j v_j in float; out rounded to T once. Nothing is saved (no backward follows). D ≤
//    attention_max_head_dim.
//  * argmax_rows: out[n] = the smallest index of the largest of logits[n, 0..V) (torch.argmax's
//    choice), one block per row: each thread scans a strided part of the row, then a fixed-order
//    warp and block reduction of (value, index) pairs that prefers the larger value, then the
//    smaller index. A NaN counts as the largest value (torch's choice: the first NaN's index; the
//    CPU reference's too), so a step never writes an id outside [0, V).
// Invalid arguments (an invalid shape, q = 0, pos0 + q > L, D too wide, V = 0) throw
// std::invalid_argument before any launch. T is float, bf16 or fp16; every sum is in float.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "memalg/backend/cuda/attention.cuh"
#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/pointwise.cuh"
#include "memalg/backend/cuda/reduce.cuh"

namespace memalg::backend::cuda {

/// Threads per row of argmax_rows.
inline constexpr int argmax_block = 512;

/// Where the cached-attention kernels find their operands: q = sh.S new tokens per sequence in a
/// fused qkv[B·q, (H + 2Hkv)·D], the cache kv[B, L, 2·Hkv·D], the new tokens at positions
/// [pos0, pos0 + q). Host and device, so that the index arithmetic is checked without a GPU.
struct kv_cache_io {
  std::int64_t B = 0, q = 0, H = 0, Hkv = 0, D = 0, L = 0, pos0 = 0;

  MEMALG_HOST_DEVICE constexpr std::int64_t qkv_width() const noexcept { return (H + 2 * Hkv) * D; }
  MEMALG_HOST_DEVICE constexpr std::int64_t cache_width() const noexcept { return 2 * Hkv * D; }
  MEMALG_HOST_DEVICE constexpr std::int64_t out_width() const noexcept { return H * D; }
  MEMALG_HOST_DEVICE constexpr std::int64_t kv_head_of(std::int64_t h) const noexcept { return h / (H / Hkv); }
  /// Cache positions query t of a sequence reads: [0, keys(t)).
  MEMALG_HOST_DEVICE constexpr std::int64_t keys(std::int64_t t) const noexcept { return pos0 + t + 1; }
  MEMALG_HOST_DEVICE constexpr std::int64_t q_index(std::int64_t b, std::int64_t t, std::int64_t h) const noexcept {
    return (b * q + t) * qkv_width() + h * D;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t k_index(std::int64_t b, std::int64_t j, std::int64_t hk) const noexcept {
    return (b * L + j) * cache_width() + hk * D;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t v_index(std::int64_t b, std::int64_t j, std::int64_t hk) const noexcept {
    return (b * L + j) * cache_width() + (Hkv + hk) * D;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t out_index(std::int64_t b, std::int64_t t, std::int64_t h) const noexcept {
    return (b * q + t) * out_width() + h * D;
  }
  /// (b, h, t) rows of the attention: one warp each.
  MEMALG_HOST_DEVICE constexpr std::int64_t query_rows() const noexcept { return B * H * q; }
  MEMALG_HOST_DEVICE constexpr std::int64_t cache_elements() const noexcept { return B * L * cache_width(); }
};

/// The cache io of the q = sh.S new tokens of an attention shape at positions [pos0, pos0 + q) of L.
constexpr kv_cache_io make_kv_cache_io(const attention_shape& sh, std::int64_t pos0, std::int64_t L) noexcept {
  return {sh.B, sh.S, sh.H, sh.Hkv, sh.D, L, pos0};
}

namespace detail {

inline void check_kv_cache(const attention_shape& sh, std::int64_t pos0, std::int64_t L, const char* what) {
  if (!sh.valid())
    throw std::invalid_argument(std::string(what) + ": invalid shape (need positive sizes, H a multiple of Hkv)");
  if (pos0 < 0 || L <= 0 || pos0 + sh.S > L)
    throw std::invalid_argument(std::string(what) + ": the new tokens lie outside the cache's L positions");
}

/// exec::ops::kv_append: W cache elements of one token row per item.
template <class T>
struct kv_append_op {
  T* kv;
  const T* qkv;
  kv_cache_io io;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t row = io.cache_width();
    const std::int64_t e = i * W;
    const std::int64_t n = e / row;  // token row b·q + t of qkv
    const std::int64_t c = e - n * row;
    const std::int64_t b = n / io.q;
    const std::int64_t t = n - b * io.q;
    const packed<T, W> x = load_packed<W>(qkv + n * io.qkv_width() + io.H * io.D + c, 0);
    store_packed<W>(kv + (b * io.L + io.pos0 + t) * row + c, 0, x);
  }
};

// One warp per (b, h, t), t fastest: attention.cuh's naive_forward_kernel with queries from qkv,
// keys and values from the cache and keys 0 … pos0 + t.
template <class T>
__global__ void __launch_bounds__(naive_warps * warp_size)
    cached_attention_forward_kernel(T* out, const T* qkv, const T* kv, kv_cache_io io, float scale) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * naive_warps + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (r >= io.query_rows()) return;  // whole warps leave together
  const std::int64_t t = r % io.q;
  const std::int64_t h = (r / io.q) % io.H;
  const std::int64_t b = r / (io.q * io.H);
  const std::int64_t hk = io.kv_head_of(h);
  const std::int64_t end = io.keys(t);
  const T* qt = qkv + io.q_index(b, t, h);
  softmax_stats st = softmax_empty();
  for (std::int64_t j = lane; j < end; j += warp_size)
    st = softmax_push(st, dot_global(qt, kv + io.k_index(b, j, hk), io.D) * scale);
  st = warp_softmax(st);
  const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;  // end ≥ 1: l ≥ 1 unless the scores are not finite
  float o[naive_dpl];
#pragma unroll
  for (int k = 0; k < naive_dpl; ++k) o[k] = 0.0f;
  for (std::int64_t j0 = 0; j0 < end; j0 += warp_size) {
    const std::int64_t j = j0 + lane;
    float p = 0.0f;
    if (j < end) p = expf(dot_global(qt, kv + io.k_index(b, j, hk), io.D) * scale - st.m) * inv;
    const int count = static_cast<int>(min_i64(warp_size, end - j0));
    for (int jj = 0; jj < count; ++jj) {
      const float pj = __shfl_sync(full_warp_mask, p, jj);
      const T* v = kv + io.v_index(b, j0 + jj, hk);
#pragma unroll
      for (int k = 0; k < naive_dpl; ++k) {
        const std::int64_t d = lane + k * warp_size;
        if (d < io.D) o[k] += pj * to_float(v[d]);
      }
    }
  }
  T* dst = out + io.out_index(b, t, h);
#pragma unroll
  for (int k = 0; k < naive_dpl; ++k) {
    const std::int64_t d = lane + k * warp_size;
    if (d < io.D) dst[d] = from_float<T>(o[k]);
  }
}

/// Whether (x, i) beats (y, j) in an argmax: a NaN beats every number, then the larger value,
/// then (equal values, or two NaNs) the smaller index.
__device__ __forceinline__ bool argmax_better(float x, std::int32_t i, float y, std::int32_t j) {
  const bool xn = isnan(x), yn = isnan(y);
  if (xn || yn) return xn && (!yn || i < j);
  return x > y || (x == y && i < j);
}

__device__ __forceinline__ void argmax_warp(float& v, std::int32_t& i) {
#pragma unroll
  for (int o = warp_size / 2; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(full_warp_mask, v, o);
    const std::int32_t k = __shfl_xor_sync(full_warp_mask, i, o);
    if (argmax_better(w, k, v, i)) {
      v = w;
      i = k;
    }
  }
}

// One block per row (grid-stride over the rows); a thread's (value, index) starts empty (−∞ at
// index INT32_MAX, which any element beats: −∞ == −∞ and a smaller index).
template <class T>
__global__ void __launch_bounds__(argmax_block)
    argmax_rows_kernel(std::int32_t* out, const T* logits, std::int64_t N, std::int64_t V) {
  __shared__ float s_val[argmax_block / warp_size];
  __shared__ std::int32_t s_idx[argmax_block / warp_size];
  const int lane = threadIdx.x % warp_size;
  const int warp = threadIdx.x / warp_size;
  for (std::int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* row = logits + n * V;
    float best = -INFINITY;
    std::int32_t at = INT32_MAX;
    for (std::int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float x = to_float(row[v]);
      if (argmax_better(x, static_cast<std::int32_t>(v), best, at)) {
        best = x;
        at = static_cast<std::int32_t>(v);
      }
    }
    argmax_warp(best, at);
    __syncthreads();  // the previous row's readers of the shared arrays are done
    if (lane == 0) {
      s_val[warp] = best;
      s_idx[warp] = at;
    }
    __syncthreads();
    if (warp == 0) {
      const int warps = static_cast<int>(blockDim.x) / warp_size;
      best = lane < warps ? s_val[lane] : -INFINITY;
      at = lane < warps ? s_idx[lane] : INT32_MAX;
      argmax_warp(best, at);
      if (lane == 0) out[n] = at;
    }
  }
}

}  // namespace detail

/// kv[B, L, 2·Hkv·D]: positions pos0 … pos0 + q − 1 of every sequence written from the key and value
/// heads of qkv[B·q, (H + 2Hkv)·D] (q = sh.S); the rest of the cache is not touched.
template <storage_type T>
void kv_append(T* kv, const T* qkv, const attention_shape& sh, std::int64_t pos0, std::int64_t L,
               cudaStream_t stream = nullptr) {
  detail::check_kv_cache(sh, pos0, L, "kv_append");
  const kv_cache_io io = make_kv_cache_io(sh, pos0, L);
  const std::int64_t row = io.cache_width();
  constexpr int w = max_vec_width(sizeof(T));
  // Vectors stay inside one row of each: the row widths divide by the width, the starts aligned.
  int width = common_vec_width(w, row, kv, qkv + io.H * io.D);
  if (io.qkv_width() % width != 0) width = 1;
  launch_pointwise<w>(sh.B * sh.S * row, width, detail::kv_append_op<T>{kv, qkv, io}, stream, "kv_append");
}

/// out[B·q, H·D]: the query heads of qkv[B·q, (H + 2Hkv)·D] (q = sh.S; sh.causal is ignored: always
/// causal over the cache) attend to kv[B, L, 2·Hkv·D], query t of a sequence reading positions
/// 0 … pos0 + t. The cache must already hold the new tokens (kv_append first).
template <storage_type T>
void cached_attention_forward(T* out, const T* qkv, const T* kv, const attention_shape& sh, std::int64_t pos0,
                              std::int64_t L, cudaStream_t stream = nullptr) {
  detail::check_kv_cache(sh, pos0, L, "cached_attention_forward");
  if (sh.D > attention_max_head_dim)
    throw std::invalid_argument("cached_attention_forward: head width D above attention_max_head_dim");
  const kv_cache_io io = make_kv_cache_io(sh, pos0, L);
  const std::int64_t blocks = ceil_div(io.query_rows(), detail::naive_warps);
  detail::cached_attention_forward_kernel<<<static_cast<unsigned>(blocks), detail::naive_warps * warp_size, 0, stream>>>(
      out, qkv, kv, io, attention_scale(sh.D));
  MEMALG_CUDA_CHECK_LAUNCH("cached_attention_forward_kernel");
}

/// out[n] (int32, device) = the smallest index of the largest of logits[n, 0..V) (a NaN counts as
/// the largest); N may be 0.
template <storage_type T>
void argmax_rows(std::int32_t* out, const T* logits, std::int64_t N, std::int64_t V, cudaStream_t stream = nullptr) {
  if (V <= 0 || V > INT32_MAX || N < 0) throw std::invalid_argument("argmax_rows: need 0 < V ≤ INT32_MAX and N ≥ 0");
  if (N == 0) return;
  const auto blocks = static_cast<unsigned>(min_i64(N, max_grid_stride_blocks));
  detail::argmax_rows_kernel<<<blocks, argmax_block, 0, stream>>>(out, logits, N, V);
  MEMALG_CUDA_CHECK_LAUNCH("argmax_rows_kernel");
}

}  // namespace memalg::backend::cuda

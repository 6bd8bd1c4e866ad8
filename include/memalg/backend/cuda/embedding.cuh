// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/embedding.cuh — token (+ position) embedding, forward and backward.
//
//   forward:  out[n,:] = wte[tok[n],:] + wpe[pos0 + n % s,:]   (wpe may be null; pos0 0 but in a
//             generation step, whose s tokens of a sequence sit at positions pos0 … pos0 + s − 1)
//   backward: dwte[tok[n],:] += dout[n,:], dwpe[n % s,:] += dout[n,:]
// The backward pass is deterministic and rounds each touched row of dwte once: the unique keys
// (token << 32 | row) are bitonic-sorted, which groups the rows of each token in ascending order;
// then one thread per (distinct token, channel) sums its rows in float and adds the sum to dwte.
// The sort needs embedding_backward_workspace_bytes(rows) bytes of workspace, passed in by the
// caller so that the memory plan accounts for it. Token ids must lie in [0, vocab).
//
// Vocabulary-parallel lookup (a tensor-parallel rank's rows [vocab_begin, vocab_begin + rows) of
// wte, as the CPU's embedding_forward_vocab_range / embedding_backward_vocab_range):
//   forward:  out[n,:] = wte_part[tok[n] − vocab_begin,:] for tokens in the range, else 0 (the
//             all-reduce over the group sums the one rank's row)
//   backward: dwte_part[tok[n] − vocab_begin,:] += dout[n,:] for tokens in the range only, with the
//             same sort (out-of-range rows get the padding key and sort last)
//   position_add: x[n,:] += wpe[(row0 + n) % s,:], rounded once (the positions added after that
//             all-reduce, at flat row row0 of the micro-batch under sequence parallelism)
// scale > 0 (Gemma's normalizer √C, a trailing argument; 0: none), as the CPU's: with s = round_T(scale)
// the token's row is round_T(wte[tok]·s) before the position is added, and the backward adds
// round_T(dout·s) to dwte (dwpe still gets dout). The products are __fmul_rn: never contracted.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/pointwise.cuh"

namespace memalg::backend::cuda {

inline constexpr int embedding_backward_block = 128;

/// The embedding scale in the storage type, widened (scale_T = round_T(scale)); 0: no scale.
template <storage_type T>
inline float embedding_storage_scale(float scale) {
  return scale > 0.0f ? to_float(from_float<T>(scale)) : 0.0f;
}

/// Workspace of embedding_backward for `rows` = B·S tokens: the sort keys, padded to a power of two.
MEMALG_HOST_DEVICE constexpr std::size_t embedding_backward_workspace_bytes(std::int64_t rows) noexcept {
  return rows <= 0 ? 0 : static_cast<std::size_t>(next_pow2(rows)) * sizeof(std::uint64_t);
}

namespace detail {

/// x·s rounded to T, widened (the product of two T tensors).
template <class T>
__device__ __forceinline__ float embedding_scaled(T x, float s) {
  return to_float(from_float<T>(__fmul_rn(to_float(x), s)));
}

template <class T>
struct embedding_forward_op {
  T* out;
  const std::int32_t* tokens;
  const T* wte;
  const T* wpe;
  std::int64_t seq;
  std::int64_t channels;
  std::int64_t pos0;
  float scale;  // embedding_storage_scale: 0 none
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t e = i * W;
    const std::int64_t n = e / channels;
    const std::int64_t c = e - n * channels;
    const packed<T, W> t = load_packed<W>(wte + static_cast<std::int64_t>(tokens[n]) * channels + c, 0);
    packed<T, W> y;
    if (scale > 0.0f && wpe != nullptr) {
      const packed<T, W> p = load_packed<W>(wpe + (pos0 + n % seq) * channels + c, 0);
#pragma unroll
      for (int k = 0; k < W; ++k) y.v[k] = from_float<T>(embedding_scaled(t.v[k], scale) + to_float(p.v[k]));
    } else if (scale > 0.0f) {
#pragma unroll
      for (int k = 0; k < W; ++k) y.v[k] = from_float<T>(embedding_scaled(t.v[k], scale));
    } else if (wpe != nullptr) {
      const packed<T, W> p = load_packed<W>(wpe + (pos0 + n % seq) * channels + c, 0);
#pragma unroll
      for (int k = 0; k < W; ++k) y.v[k] = from_float<T>(to_float(t.v[k]) + to_float(p.v[k]));
    } else {
      y = t;
    }
    store_packed<W>(out, i, y);
  }
};

template <class T>
struct embedding_vocab_range_op {
  T* out;
  const std::int32_t* tokens;
  const T* wte_part;
  std::int64_t vocab_begin;
  std::int64_t vocab_rows;
  std::int64_t channels;
  float scale;  // embedding_storage_scale: 0 none
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t e = i * W;
    const std::int64_t n = e / channels;
    const std::int64_t c = e - n * channels;
    const std::int64_t t = static_cast<std::int64_t>(tokens[n]) - vocab_begin;
    packed<T, W> y;
    if (t >= 0 && t < vocab_rows) {
      y = load_packed<W>(wte_part + t * channels + c, 0);
      if (scale > 0.0f) {
#pragma unroll
        for (int k = 0; k < W; ++k) y.v[k] = from_float<T>(embedding_scaled(y.v[k], scale));
      }
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) y.v[k] = from_float<T>(0.0f);
    }
    store_packed<W>(out, i, y);
  }
};

template <class T>
struct position_add_op {
  T* x;
  const T* wpe;
  std::int64_t row0;
  std::int64_t seq;
  std::int64_t channels;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t e = i * W;
    const std::int64_t n = e / channels;
    const std::int64_t c = e - n * channels;
    const packed<T, W> a = load_packed<W>(x, i);
    const packed<T, W> p = load_packed<W>(wpe + ((row0 + n) % seq) * channels + c, 0);
    packed<T, W> y;
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = from_float<T>(to_float(a.v[k]) + to_float(p.v[k]));
    store_packed<W>(x, i, y);
  }
};

inline constexpr std::uint64_t sort_pad_key = ~std::uint64_t{0};

// Key (token − vocab_begin) << 32 | row for tokens in [vocab_begin, vocab_begin + vocab_rows), the
// padding key for the others and past rows (vocab_rows < 0: every token is in range).
__global__ void embedding_keys_kernel(std::uint64_t* keys, const std::int32_t* tokens, std::int64_t rows, std::int64_t padded,
                                      std::int64_t vocab_begin, std::int64_t vocab_rows) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < padded; i += stride) {
    const std::int64_t t = i < rows ? static_cast<std::int64_t>(tokens[i]) - vocab_begin : -1;
    const bool in = i < rows && t >= 0 && (vocab_rows < 0 || t < vocab_rows);
    keys[i] = in ? (static_cast<std::uint64_t>(t) << 32) | static_cast<std::uint64_t>(i) : sort_pad_key;
  }
}

// One compare-exchange of the bitonic network: element i against i ^ j, ascending where i & k == 0.
__device__ __forceinline__ void bitonic_exchange(std::uint64_t* a, std::int64_t i, std::int64_t j, std::int64_t k) {
  const std::int64_t l = i ^ j;
  if (l <= i) return;
  const bool ascending = (i & k) == 0;
  const std::uint64_t x = a[i];
  const std::uint64_t y = a[l];
  if ((x > y) == ascending) {
    a[i] = y;
    a[l] = x;
  }
}

__global__ void bitonic_global_kernel(std::uint64_t* a, std::int64_t n, std::int64_t k, std::int64_t j) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    bitonic_exchange(a, i, j, k);
}

// Merges k ∈ [k_first, k_last] with all strides j < blockDim.x inside the block's segment.
__global__ void __launch_bounds__(bitonic_block)
    bitonic_shared_kernel(std::uint64_t* a, std::int64_t k_first, std::int64_t k_last) {
  __shared__ std::uint64_t s[bitonic_block];
  const std::int64_t seg = static_cast<std::int64_t>(blockIdx.x) * blockDim.x;
  const int t = threadIdx.x;
  s[t] = a[seg + t];
  __syncthreads();
  for (std::int64_t k = k_first; k <= k_last; k *= 2) {
    for (std::int64_t j = min_i64(k, blockDim.x) / 2; j > 0; j /= 2) {
      const int l = t ^ static_cast<int>(j);
      if (l > t) {
        const bool ascending = ((seg + t) & k) == 0;
        const std::uint64_t x = s[t];
        const std::uint64_t y = s[l];
        if ((x > y) == ascending) {
          s[t] = y;
          s[l] = x;
        }
      }
      __syncthreads();
    }
  }
  a[seg + t] = s[t];
}

/// Sorts n (a power of two) keys ascending.
inline void bitonic_sort(std::uint64_t* a, std::int64_t n, cudaStream_t stream) {
  if (n <= 1) return;
  const std::int64_t s = min_i64(n, bitonic_block);
  const unsigned blocks = static_cast<unsigned>(n / s);
  bitonic_shared_kernel<<<blocks, static_cast<unsigned>(s), 0, stream>>>(a, 2, s);
  MEMALG_CUDA_CHECK_LAUNCH("bitonic_shared_kernel");
  for (std::int64_t k = 2 * s; k <= n; k *= 2) {
    for (std::int64_t j = k / 2; j >= s; j /= 2) {
      const launch_1d l = grid_stride_launch(n);
      bitonic_global_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(a, n, k, j);
      MEMALG_CUDA_CHECK_LAUNCH("bitonic_global_kernel");
    }
    bitonic_shared_kernel<<<blocks, static_cast<unsigned>(s), 0, stream>>>(a, k, k);
    MEMALG_CUDA_CHECK_LAUNCH("bitonic_shared_kernel");
  }
}

// Block (x: sorted position, y: channel tile); only the first position of each run of equal
// tokens does work, summing the whole run in ascending row order (each row times scale, rounded
// to T, when scale > 0).
template <class T>
__global__ void __launch_bounds__(embedding_backward_block)
    embedding_backward_wte_kernel(T* dwte, const T* dout, const std::uint64_t* keys, std::int64_t rows,
                                  std::int64_t channels, float scale) {
  const std::int64_t i = blockIdx.x;
  if (keys[i] == sort_pad_key) return;  // a token outside a vocabulary-parallel rank's rows
  const std::uint64_t token = keys[i] >> 32;
  if (i > 0 && (keys[i - 1] >> 32) == token) return;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float acc = 0.0f;
  if (scale > 0.0f) {
    for (std::int64_t j = i; j < rows && (keys[j] >> 32) == token; ++j) {
      const std::int64_t row = static_cast<std::int64_t>(keys[j] & 0xffffffffu);
      acc += embedding_scaled(dout[row * channels + c], scale);
    }
  } else {
    for (std::int64_t j = i; j < rows && (keys[j] >> 32) == token; ++j) {
      const std::int64_t row = static_cast<std::int64_t>(keys[j] & 0xffffffffu);
      acc += to_float(dout[row * channels + c]);
    }
  }
  T* w = dwte + static_cast<std::int64_t>(token) * channels + c;
  *w = from_float<T>(to_float(*w) + acc);
}

template <class T>
__global__ void embedding_backward_wpe_kernel(T* dwpe, const T* dout, std::int64_t rows, std::int64_t seq,
                                              std::int64_t channels) {
  const std::int64_t total = seq * channels;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t c = e % channels;
    float acc = 0.0f;
    for (std::int64_t n = e / channels; n < rows; n += seq) acc += to_float(dout[n * channels + c]);
    dwpe[e] = from_float<T>(to_float(dwpe[e]) + acc);
  }
}

}  // namespace detail

/// out[B·S, C] from tokens[B·S] (int32 ids in [0, V)), wte[V, C] and wpe[pos0 + S, C] (may be
/// null; token s of a sequence reads row pos0 + s, as the CPU's embedding_forward). scale > 0: the
/// token's row times scale, both rounded to T, before the position is added.
template <storage_type T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* wte, const T* wpe, std::int64_t batch,
                       std::int64_t seq, std::int64_t channels, cudaStream_t stream = nullptr, std::int64_t pos0 = 0,
                       float scale = 0.0f) {
  if (pos0 < 0) throw std::invalid_argument("embedding_forward: pos0 must not be negative");
  if (!(scale >= 0.0f)) throw std::invalid_argument("embedding_forward: scale must not be negative");
  const std::int64_t rows = batch * seq;
  constexpr int w = max_vec_width(sizeof(T));
  const int width =
      wpe != nullptr ? common_vec_width(w, channels, out, wte, wpe) : common_vec_width(w, channels, out, wte);
  launch_pointwise<w>(rows * channels, width,
                      detail::embedding_forward_op<T>{out, tokens, wte, wpe, seq, channels, pos0,
                                                      embedding_storage_scale<T>(scale)},
                      stream, "embedding_forward");
}

/// out[N, C]: wte_part[tok − vocab_begin] for tokens in [vocab_begin, vocab_begin + vocab_rows), else 0;
/// scale > 0: times scale, as embedding_forward.
template <storage_type T>
void embedding_forward_vocab_range(T* out, const std::int32_t* tokens, const T* wte_part, std::int64_t vocab_begin,
                                   std::int64_t vocab_rows, std::int64_t rows, std::int64_t channels,
                                   cudaStream_t stream = nullptr, float scale = 0.0f) {
  if (!(scale >= 0.0f)) throw std::invalid_argument("embedding_forward_vocab_range: scale must not be negative");
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(rows * channels, common_vec_width(w, channels, out, wte_part),
                      detail::embedding_vocab_range_op<T>{out, tokens, wte_part, vocab_begin, vocab_rows, channels,
                                                          embedding_storage_scale<T>(scale)},
                      stream, "embedding_forward_vocab_range");
}

/// x[N, C] += wpe[(row0 + n) % seq, :], rounded once per element.
template <storage_type T>
void position_add(T* x, const T* wpe, std::int64_t row0, std::int64_t rows, std::int64_t seq, std::int64_t channels,
                  cudaStream_t stream = nullptr) {
  if (seq <= 0) throw std::invalid_argument("position_add: sequence length must be positive");
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(rows * channels, common_vec_width(w, channels, x, wpe),
                      detail::position_add_op<T>{x, wpe, row0, seq, channels}, stream, "position_add");
}

/// dwte += scatter of dout by token, dwpe += sum over the batch (either may be null). `workspace`
/// holds embedding_backward_workspace_bytes(B·S) bytes, 8-byte aligned (only needed for dwte).
/// scale > 0: dwte gets round_T(dout·round_T(scale)) (the forward's scale); dwpe is unscaled.
template <storage_type T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens, std::int64_t batch,
                        std::int64_t seq, std::int64_t channels, void* workspace, std::size_t workspace_bytes,
                        cudaStream_t stream = nullptr, float scale = 0.0f) {
  if (!(scale >= 0.0f)) throw std::invalid_argument("embedding_backward: scale must not be negative");
  const std::int64_t rows = batch * seq;
  if (rows <= 0 || channels <= 0) return;
  if (rows > INT_MAX) throw std::invalid_argument("embedding_backward: more than INT_MAX token rows");
  if (dwpe != nullptr) {
    const launch_1d l = grid_stride_launch(seq * channels);
    detail::embedding_backward_wpe_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(dwpe, dout, rows, seq,
                                                                                                channels);
    MEMALG_CUDA_CHECK_LAUNCH("embedding_backward_wpe_kernel");
  }
  if (dwte == nullptr) return;
  if (workspace == nullptr || workspace_bytes < embedding_backward_workspace_bytes(rows) ||
      reinterpret_cast<std::uintptr_t>(workspace) % alignof(std::uint64_t) != 0)
    throw std::invalid_argument("embedding_backward: workspace smaller than embedding_backward_workspace_bytes(rows) "
                                "or not 8-byte aligned");
  auto* keys = static_cast<std::uint64_t*>(workspace);
  const std::int64_t padded = next_pow2(rows);
  const launch_1d l = grid_stride_launch(padded);
  detail::embedding_keys_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(keys, tokens, rows, padded, 0, -1);
  MEMALG_CUDA_CHECK_LAUNCH("embedding_keys_kernel");
  detail::bitonic_sort(keys, padded, stream);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(ceil_div(channels, embedding_backward_block)));
  detail::embedding_backward_wte_kernel<<<grid, embedding_backward_block, 0, stream>>>(
      dwte, dout, keys, rows, channels, embedding_storage_scale<T>(scale));
  MEMALG_CUDA_CHECK_LAUNCH("embedding_backward_wte_kernel");
}

/// dwte_part[vocab_rows, C] += the rows of dout[N, C] whose tokens lie in [vocab_begin,
/// vocab_begin + vocab_rows), grouped by token (ascending rows) and rounded once per row;
/// `workspace` as embedding_backward's for N rows; scale as embedding_backward's.
template <storage_type T>
void embedding_backward_vocab_range(T* dwte_part, const T* dout, const std::int32_t* tokens, std::int64_t vocab_begin,
                                    std::int64_t vocab_rows, std::int64_t rows, std::int64_t channels, void* workspace,
                                    std::size_t workspace_bytes, cudaStream_t stream = nullptr, float scale = 0.0f) {
  if (!(scale >= 0.0f)) throw std::invalid_argument("embedding_backward_vocab_range: scale must not be negative");
  if (rows <= 0 || channels <= 0 || vocab_rows <= 0) return;
  if (rows > INT_MAX) throw std::invalid_argument("embedding_backward_vocab_range: more than INT_MAX token rows");
  if (workspace == nullptr || workspace_bytes < embedding_backward_workspace_bytes(rows) ||
      reinterpret_cast<std::uintptr_t>(workspace) % alignof(std::uint64_t) != 0)
    throw std::invalid_argument("embedding_backward_vocab_range: workspace smaller than "
                                "embedding_backward_workspace_bytes(rows) or not 8-byte aligned");
  auto* keys = static_cast<std::uint64_t*>(workspace);
  const std::int64_t padded = next_pow2(rows);
  const launch_1d l = grid_stride_launch(padded);
  detail::embedding_keys_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(keys, tokens, rows, padded,
                                                                                      vocab_begin, vocab_rows);
  MEMALG_CUDA_CHECK_LAUNCH("embedding_keys_kernel");
  detail::bitonic_sort(keys, padded, stream);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(ceil_div(channels, embedding_backward_block)));
  detail::embedding_backward_wte_kernel<<<grid, embedding_backward_block, 0, stream>>>(
      dwte_part, dout, keys, rows, channels, embedding_storage_scale<T>(scale));
  MEMALG_CUDA_CHECK_LAUNCH("embedding_backward_wte_kernel");
}

}  // namespace memalg::backend::cuda

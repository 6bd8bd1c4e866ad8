// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/cross_entropy.cuh — fused softmax + cross-entropy + backward over logits.
//
//   loss[n]     = lse(logits[n,:]) − logits[n, targets[n]]     (float)
//   dlogits[n,:] = (softmax(logits[n,:]) − onehot(targets[n]))·grad_scale      (=)
// with grad_scale = dloss / N for the mean loss over N rows (the chunked LM head passes
// dloss / N_total for each chunk). cross_entropy_forward / cross_entropy_backward mirror the CPU
// backend; cross_entropy_fused does both in one pass. One block per row; the row is read
// twice (statistics, then gradient) with 16-byte loads when the rows are aligned for them.
// dlogits may alias logits (the gradient overwrites the logits in place). A target outside
// [0, V) yields a NaN loss so that the error cannot go unnoticed.
//
// Gemma 2's final logit softcapping (the CPU's logit_softcap and cross_entropy_backward's softcap):
// logit_softcap caps the logits in place, c = round_T(cap·tanh(x / cap)); the loss then reads c, and
// given `softcap` the backward (or fused) kernel multiplies each gradient by 1 − (c / cap)², the
// derivative of the cap, from the c it reads before writing over it (a separate instantiation:
// without a cap the kernel is the plain one).
//
// Vocabulary-parallel cross-entropy (the CPU's vocab_parallel_ce_*, backend/cpu/cross_entropy.hpp):
// this rank holds columns [vocab_begin, vocab_begin + V) of a vocabulary of `vocab`; the caller
// puts its collectives between the three steps, on the same stream:
//   vocab_parallel_ce_max       row_max[n] = max_v logit                    → all-reduce max
//   vocab_parallel_ce_partials  parts[2n] = Σ_v exp(logit − max), parts[2n+1] = the target's logit
//                               on the rank that holds it, else 0          → all-reduce sum
//   vocab_parallel_ce_finish    loss[n] = max + log Σ − logit[target]; logits become
//                               (exp(logit − lse) − onehot)·dloss/N in place
// One block per row. A target outside [0, vocab) makes its row's target part NaN (so its loss).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/pointwise.cuh"
#include "memalg/backend/cuda/reduce.cuh"

namespace memalg::backend::cuda {

inline constexpr int cross_entropy_block = 512;

namespace detail {

template <int W, class T, bool Capped>
__global__ void __launch_bounds__(cross_entropy_block)
    cross_entropy_kernel(float* loss, T* dlogits, const T* logits, const std::int32_t* targets, std::int64_t vocab,
                         float grad_scale, float softcap) {
  __shared__ float scratch[64];
  const std::int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  const int target = targets[row];
  const bool target_ok = target >= 0 && target < vocab;
  // Read the target logit before any thread can overwrite it (dlogits may alias logits); the
  // barrier inside block_softmax orders this read before the writes below.
  const float target_logit = (threadIdx.x == 0 && target_ok) ? to_float(x[target]) : 0.0f;
  const std::int64_t vectors = vocab / W;
  softmax_stats s = softmax_empty();
  for (std::int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const packed<T, W> p = load_packed<W>(x, v);
#pragma unroll
    for (int k = 0; k < W; ++k) s = softmax_push(s, to_float(p.v[k]));
  }
  s = block_softmax(s, scratch);
  const float lse = s.m + logf(s.l);
  if (threadIdx.x == 0 && loss != nullptr) loss[row] = target_ok ? lse - target_logit : __int_as_float(0x7fc00000);
  if (dlogits == nullptr) return;
  T* dx = dlogits + row * vocab;
  for (std::int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const packed<T, W> p = load_packed<W>(x, v);
    packed<T, W> g;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float prob = expf(to_float(p.v[k]) - lse);
      const float onehot = (v * W + k == target) ? 1.0f : 0.0f;
      if constexpr (Capped) {
        const float r = to_float(p.v[k]) / softcap;
        g.v[k] = from_float<T>((prob - onehot) * grad_scale * (1.0f - r * r));
      } else {
        g.v[k] = from_float<T>((prob - onehot) * grad_scale);
      }
    }
    store_packed<W>(dx, v, g);
  }
}

__global__ void __launch_bounds__(1024) mean_kernel(float* out, const float* values, std::int64_t n) {
  __shared__ float scratch[32];
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += values[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *out = s / static_cast<float>(n);
}

/// Max over a 1-D block (as block_sum); every thread gets the result.
__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % warp_size;
  const int warp = threadIdx.x / warp_size;
  const int warps = blockDim.x / warp_size;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// x ← softcap·tanh(x / softcap), rounded to T.
template <class T>
struct logit_softcap_op {
  T* x;
  float softcap;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const packed<T, W> a = load_packed<W>(x, i);
    packed<T, W> y;
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = from_float<T>(softcap * tanhf(to_float(a.v[k]) / softcap));
    store_packed<W>(x, i, y);
  }
};

template <int W, class T>
__global__ void __launch_bounds__(cross_entropy_block)
    vocab_parallel_max_kernel(float* row_max, const T* logits, std::int64_t V) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  const T* x = logits + row * V;
  float m = -INFINITY;
  for (std::int64_t v = threadIdx.x; v < V / W; v += blockDim.x) {
    const packed<T, W> p = load_packed<W>(x, v);
#pragma unroll
    for (int k = 0; k < W; ++k) m = fmaxf(m, to_float(p.v[k]));
  }
  m = block_max(m, scratch);
  if (threadIdx.x == 0) row_max[row] = m;
}

template <int W, class T>
__global__ void __launch_bounds__(cross_entropy_block)
    vocab_parallel_partials_kernel(float* parts, const T* logits, const float* row_max, const std::int32_t* targets,
                                   std::int64_t vocab_begin, std::int64_t V, std::int64_t vocab) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  const T* x = logits + row * V;
  const float m = row_max[row];
  float sum = 0.0f;
  for (std::int64_t v = threadIdx.x; v < V / W; v += blockDim.x) {
    const packed<T, W> p = load_packed<W>(x, v);
#pragma unroll
    for (int k = 0; k < W; ++k) sum += expf(to_float(p.v[k]) - m);
  }
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) {
    const std::int64_t t = targets[row];
    parts[2 * row] = sum;
    parts[2 * row + 1] = t < 0 || t >= vocab ? __int_as_float(0x7fc00000)
                         : t >= vocab_begin && t < vocab_begin + V ? to_float(x[t - vocab_begin])
                                                                    : 0.0f;
  }
}

template <int W, class T>
__global__ void __launch_bounds__(cross_entropy_block)
    vocab_parallel_finish_kernel(float* loss, T* logits, const float* row_max, const float* parts,
                                 const std::int32_t* targets, std::int64_t vocab_begin, std::int64_t V, float g) {
  const std::int64_t row = blockIdx.x;
  const float lse = row_max[row] + logf(parts[2 * row]);
  if (threadIdx.x == 0) loss[row] = lse - parts[2 * row + 1];
  const std::int64_t t = static_cast<std::int64_t>(targets[row]) - vocab_begin;
  T* x = logits + row * V;
  for (std::int64_t v = threadIdx.x; v < V / W; v += blockDim.x) {
    const packed<T, W> p = load_packed<W>(x, v);
    packed<T, W> y;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float prob = expf(to_float(p.v[k]) - lse);
      y.v[k] = from_float<T>((prob - (v * W + k == t ? 1.0f : 0.0f)) * g);
    }
    store_packed<W>(x, v, y);
  }
}

/// Launches kernel<W> or kernel<1> over `rows` blocks, W when the rows of `logits` allow it.
template <class T, class Launch>
void vocab_parallel_launch(const T* logits, std::int64_t V, Launch&& launch) {
  constexpr int w = max_vec_width(sizeof(T));
  if (common_vec_width(w, V, logits) == w) launch(std::integral_constant<int, w>{});
  else launch(std::integral_constant<int, 1>{});
}

}  // namespace detail

/// row_max[n] = the largest of this rank's logits[n, 0..V).
template <storage_type T>
void vocab_parallel_ce_max(float* row_max, const T* logits, std::int64_t rows, std::int64_t V,
                           cudaStream_t stream = nullptr) {
  if (rows <= 0 || V <= 0) return;
  detail::vocab_parallel_launch(logits, V, [&](auto w) {
    detail::vocab_parallel_max_kernel<decltype(w)::value>
        <<<static_cast<unsigned>(rows), cross_entropy_block, 0, stream>>>(row_max, logits, V);
  });
  MEMALG_CUDA_CHECK_LAUNCH("vocab_parallel_max_kernel");
}

/// parts[2n] = Σ_v exp(logit − row_max[n]) over this rank's columns, parts[2n + 1] = the target's
/// logit if this rank holds it (targets index the whole vocabulary of `vocab`), else 0.
template <storage_type T>
void vocab_parallel_ce_partials(float* parts, const T* logits, const float* row_max, const std::int32_t* targets,
                                std::int64_t vocab_begin, std::int64_t rows, std::int64_t V, std::int64_t vocab,
                                cudaStream_t stream = nullptr) {
  if (rows <= 0 || V <= 0) return;
  detail::vocab_parallel_launch(logits, V, [&](auto w) {
    detail::vocab_parallel_partials_kernel<decltype(w)::value><<<static_cast<unsigned>(rows), cross_entropy_block, 0,
                                                                 stream>>>(parts, logits, row_max, targets, vocab_begin,
                                                                           V, vocab);
  });
  MEMALG_CUDA_CHECK_LAUNCH("vocab_parallel_partials_kernel");
}

/// With the reduced row_max and parts: loss[n] per row, and logits replaced in place by their
/// gradient (exp(logit − lse) − onehot)·dloss/rows for this rank's columns.
template <storage_type T>
void vocab_parallel_ce_finish(float* loss, T* logits, const float* row_max, const float* parts,
                              const std::int32_t* targets, std::int64_t vocab_begin, float dloss, std::int64_t rows,
                              std::int64_t V, cudaStream_t stream = nullptr) {
  if (rows <= 0 || V <= 0) return;
  const float g = dloss / static_cast<float>(rows);
  detail::vocab_parallel_launch(static_cast<const T*>(logits), V, [&](auto w) {
    detail::vocab_parallel_finish_kernel<decltype(w)::value><<<static_cast<unsigned>(rows), cross_entropy_block, 0,
                                                               stream>>>(loss, logits, row_max, parts, targets,
                                                                         vocab_begin, V, g);
  });
  MEMALG_CUDA_CHECK_LAUNCH("vocab_parallel_finish_kernel");
}

/// *out = mean(values[0..n)), summed in a fixed order.
inline void mean_reduce(float* out, const float* values, std::int64_t n, cudaStream_t stream = nullptr) {
  if (n <= 0) return;
  detail::mean_kernel<<<1, 1024, 0, stream>>>(out, values, n);
  MEMALG_CUDA_CHECK_LAUNCH("mean_kernel");
}

/// x[0..n) ← softcap·tanh(x / softcap), rounded to T, in place (Gemma 2's final logit softcapping).
template <storage_type T>
void logit_softcap(T* x, std::int64_t n, float softcap, cudaStream_t stream = nullptr) {
  if (!(softcap > 0.0f) || !std::isfinite(softcap))
    throw std::invalid_argument("logit_softcap: the cap must be positive and finite");
  if (n <= 0) return;
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(n, common_vec_width(w, n, x), detail::logit_softcap_op<T>{x, softcap}, stream, "logit_softcap");
}

/// Per-row loss (may be null) and, when dlogits is not null, dlogits = (softmax − onehot)·grad_scale;
/// softcap > 0: the logits are capped ones (logit_softcap) and each gradient is also multiplied by
/// 1 − (logit / softcap)², the gradient of the logits before the cap.
template <storage_type T>
void cross_entropy_scaled(float* loss, T* dlogits, const T* logits, const std::int32_t* targets, std::int64_t rows,
                          std::int64_t vocab, float grad_scale, cudaStream_t stream = nullptr, float softcap = 0.0f) {
  if (!(softcap >= 0.0f)) throw std::invalid_argument("cross_entropy: the softcap must not be negative");
  if (rows <= 0 || vocab <= 0) return;
  constexpr int w = max_vec_width(sizeof(T));
  const int width = dlogits != nullptr ? common_vec_width(w, vocab, logits, dlogits) : common_vec_width(w, vocab, logits);
  const unsigned grid = static_cast<unsigned>(rows);
  if (softcap > 0.0f && dlogits != nullptr) {
    if (width == w)
      detail::cross_entropy_kernel<w, T, true><<<grid, cross_entropy_block, 0, stream>>>(loss, dlogits, logits, targets,
                                                                                         vocab, grad_scale, softcap);
    else
      detail::cross_entropy_kernel<1, T, true><<<grid, cross_entropy_block, 0, stream>>>(loss, dlogits, logits, targets,
                                                                                         vocab, grad_scale, softcap);
  } else if (width == w) {
    detail::cross_entropy_kernel<w, T, false><<<grid, cross_entropy_block, 0, stream>>>(
        loss, dlogits, logits, targets, vocab, grad_scale, 0.0f);
  } else {
    detail::cross_entropy_kernel<1, T, false><<<grid, cross_entropy_block, 0, stream>>>(
        loss, dlogits, logits, targets, vocab, grad_scale, 0.0f);
  }
  MEMALG_CUDA_CHECK_LAUNCH("cross_entropy_kernel");
}

/// loss[n] = lse − logit[target] for N rows; also the mean into *mean_loss when not null.
template <storage_type T>
void cross_entropy_forward(float* loss, const T* logits, const std::int32_t* targets, std::int64_t rows,
                           std::int64_t vocab, float* mean_loss = nullptr, cudaStream_t stream = nullptr) {
  cross_entropy_scaled(loss, static_cast<T*>(nullptr), logits, targets, rows, vocab, 0.0f, stream);
  if (mean_loss != nullptr) mean_reduce(mean_loss, loss, rows, stream);
}

/// dlogits = (softmax − onehot)·dloss/N (may alias logits); softcap > 0: `logits` were capped by
/// logit_softcap(softcap), and dlogits is the gradient of the logits before the cap.
template <storage_type T>
void cross_entropy_backward(T* dlogits, const T* logits, const std::int32_t* targets, float dloss, std::int64_t rows,
                            std::int64_t vocab, cudaStream_t stream = nullptr, float softcap = 0.0f) {
  if (rows <= 0) return;
  cross_entropy_scaled(static_cast<float*>(nullptr), dlogits, logits, targets, rows, vocab,
                       dloss / static_cast<float>(rows), stream, softcap);
}

/// Forward and backward in one pass over the logits (dlogits may alias logits); softcap as
/// cross_entropy_backward's (the loss is that of the capped logits it reads).
template <storage_type T>
void cross_entropy_fused(float* loss, T* dlogits, const T* logits, const std::int32_t* targets, float dloss,
                         std::int64_t rows, std::int64_t vocab, cudaStream_t stream = nullptr, float softcap = 0.0f) {
  if (rows <= 0) return;
  cross_entropy_scaled(loss, dlogits, logits, targets, rows, vocab, dloss / static_cast<float>(rows), stream, softcap);
}

}  // namespace memalg::backend::cuda

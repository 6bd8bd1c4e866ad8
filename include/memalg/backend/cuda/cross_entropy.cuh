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
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/pointwise.cuh"
#include "memalg/backend/cuda/reduce.cuh"

namespace memalg::backend::cuda {

inline constexpr int cross_entropy_block = 512;

namespace detail {

template <int W, class T>
__global__ void __launch_bounds__(cross_entropy_block)
    cross_entropy_kernel(float* loss, T* dlogits, const T* logits, const std::int32_t* targets, std::int64_t vocab,
                         float grad_scale) {
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
      g.v[k] = from_float<T>((prob - onehot) * grad_scale);
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

}  // namespace detail

/// *out = mean(values[0..n)), summed in a fixed order.
inline void mean_reduce(float* out, const float* values, std::int64_t n, cudaStream_t stream = nullptr) {
  if (n <= 0) return;
  detail::mean_kernel<<<1, 1024, 0, stream>>>(out, values, n);
  MEMALG_CUDA_CHECK_LAUNCH("mean_kernel");
}

/// Per-row loss (may be null) and, when dlogits is not null, dlogits = (softmax − onehot)·grad_scale.
template <storage_type T>
void cross_entropy_scaled(float* loss, T* dlogits, const T* logits, const std::int32_t* targets, std::int64_t rows,
                          std::int64_t vocab, float grad_scale, cudaStream_t stream = nullptr) {
  if (rows <= 0 || vocab <= 0) return;
  constexpr int w = max_vec_width(sizeof(T));
  const int width = dlogits != nullptr ? common_vec_width(w, vocab, logits, dlogits) : common_vec_width(w, vocab, logits);
  if (width == w) {
    detail::cross_entropy_kernel<w><<<static_cast<unsigned>(rows), cross_entropy_block, 0, stream>>>(
        loss, dlogits, logits, targets, vocab, grad_scale);
  } else {
    detail::cross_entropy_kernel<1><<<static_cast<unsigned>(rows), cross_entropy_block, 0, stream>>>(
        loss, dlogits, logits, targets, vocab, grad_scale);
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

/// dlogits = (softmax − onehot)·dloss/N (may alias logits).
template <storage_type T>
void cross_entropy_backward(T* dlogits, const T* logits, const std::int32_t* targets, float dloss, std::int64_t rows,
                            std::int64_t vocab, cudaStream_t stream = nullptr) {
  if (rows <= 0) return;
  cross_entropy_scaled(static_cast<float*>(nullptr), dlogits, logits, targets, rows, vocab,
                       dloss / static_cast<float>(rows), stream);
}

/// Forward and backward in one pass over the logits (dlogits may alias logits).
template <storage_type T>
void cross_entropy_fused(float* loss, T* dlogits, const T* logits, const std::int32_t* targets, float dloss,
                         std::int64_t rows, std::int64_t vocab, cudaStream_t stream = nullptr) {
  if (rows <= 0) return;
  cross_entropy_scaled(loss, dlogits, logits, targets, rows, vocab, dloss / static_cast<float>(rows), stream);
}

}  // namespace memalg::backend::cuda

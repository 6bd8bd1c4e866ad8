// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/speech_loss.cuh — masked mel L1 / MSE and the stop-token BCE with logits,
// the kernels of exec::ops::mel_loss and exec::ops::stop_loss; the CUDA twin of
// backend/cpu/speech_loss.hpp (formulas and sources there).
//
// pred / logits are read with a row stride ld (the decoder's fused [mel ‖ stop] rows: ld = M + 1,
// logits = out + M); target[N, M] and stop targets[N] are fp32 (the step's features); mask[N]
// (1 real, 0 padding; null: all real) applies to the mel frames.
//   forward:  *slot = Σ / divisor (float, device); one block, a fixed-order block sum (the same
//             bits on every run).
//   backward: the gradient (=) g·m·ℓ' with g = dloss / divisor: grad[N, M] contiguous (may be pred
//             itself when ld == M), grad[n·ld] for the stop token (may be logits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/reduce.cuh"

namespace memalg::backend::cuda {

inline constexpr int speech_loss_block = 1024;

namespace detail {

template <class T>
__global__ void __launch_bounds__(speech_loss_block)
    mel_loss_sum_kernel(float* slot, bool l1, const T* pred, std::int64_t ld, const float* target,
                        const std::uint8_t* mask, std::int64_t rows, std::int64_t M, float divisor) {
  __shared__ float scratch[32];
  float sum = 0.0f;
  for (std::int64_t e = threadIdx.x; e < rows * M; e += blockDim.x) {
    const std::int64_t n = e / M;
    if (mask != nullptr && mask[n] == 0) continue;
    const float d = to_float(pred[n * ld + (e - n * M)]) - target[e];
    sum += l1 ? fabsf(d) : d * d;
  }
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) *slot = sum / divisor;
}

// grad may be pred itself when ld == M: each element is read before it is written.
template <class T>
__global__ void mel_loss_grad_kernel(T* grad, bool l1, const T* pred, std::int64_t ld, const float* target,
                                     const std::uint8_t* mask, std::int64_t rows, std::int64_t M, float g) {
  const std::int64_t total = rows * M;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t n = e / M;
    const float d = to_float(pred[n * ld + (e - n * M)]) - target[e];
    float v = 0.0f;
    if (mask == nullptr || mask[n] != 0) v = l1 ? g * static_cast<float>((d > 0.0f) - (d < 0.0f)) : g * 2.0f * d;
    grad[e] = from_float<T>(v);
  }
}

template <class T>
__global__ void __launch_bounds__(speech_loss_block)
    stop_loss_sum_kernel(float* slot, const T* logits, std::int64_t ld, const float* targets, std::int64_t rows,
                         float divisor) {
  __shared__ float scratch[32];
  float sum = 0.0f;
  for (std::int64_t n = threadIdx.x; n < rows; n += blockDim.x) {
    const float x = to_float(logits[n * ld]);
    sum += fmaxf(x, 0.0f) - x * targets[n] + log1pf(expf(-fabsf(x)));
  }
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) *slot = sum / divisor;
}

template <class T>
__global__ void stop_loss_grad_kernel(T* grad, const T* logits, std::int64_t ld, const float* targets,
                                      std::int64_t rows, float g) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < rows; n += stride) {
    const float x = to_float(logits[n * ld]);
    grad[n * ld] = from_float<T>(g * (1.0f / (1.0f + expf(-x)) - targets[n]));
  }
}

}  // namespace detail

/// *slot = Σ_n m_n Σ_c ℓ(pred[n·ld + c] − target[n·M + c]) / divisor, ℓ = |·| (l1) or (·)².
template <storage_type T>
void mel_loss_forward(float* slot, bool l1, const T* pred, std::int64_t ld, const float* target,
                      const std::uint8_t* mask, std::int64_t rows, std::int64_t M, float divisor,
                      cudaStream_t stream = nullptr) {
  detail::mel_loss_sum_kernel<<<1, speech_loss_block, 0, stream>>>(slot, l1, pred, ld, target, mask, rows, M, divisor);
  MEMALG_CUDA_CHECK_LAUNCH("mel_loss_sum_kernel");
}

/// grad[n·M + c] (=) g·m_n·ℓ'(d), g = dloss / divisor (sign(0) = 0, as torch.sign).
template <storage_type T>
void mel_loss_backward(T* grad, bool l1, const T* pred, std::int64_t ld, const float* target, const std::uint8_t* mask,
                       std::int64_t rows, std::int64_t M, float g, cudaStream_t stream = nullptr) {
  const launch_1d l = grid_stride_launch(rows * M);
  if (l.grid == 0) return;
  detail::mel_loss_grad_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(grad, l1, pred, ld, target, mask,
                                                                                      rows, M, g);
  MEMALG_CUDA_CHECK_LAUNCH("mel_loss_grad_kernel");
}

/// *slot = Σ_n [max(x, 0) − x·y + log(1 + e^−|x|)] / divisor over every row, x = logits[n·ld],
/// y = targets[n] (BCEWithLogitsLoss's stable form).
template <storage_type T>
void stop_loss_forward(float* slot, const T* logits, std::int64_t ld, const float* targets, std::int64_t rows,
                       float divisor, cudaStream_t stream = nullptr) {
  detail::stop_loss_sum_kernel<<<1, speech_loss_block, 0, stream>>>(slot, logits, ld, targets, rows, divisor);
  MEMALG_CUDA_CHECK_LAUNCH("stop_loss_sum_kernel");
}

/// grad[n·ld] (=) g·(σ(x) − y), g = dloss / divisor.
template <storage_type T>
void stop_loss_backward(T* grad, const T* logits, std::int64_t ld, const float* targets, std::int64_t rows, float g,
                        cudaStream_t stream = nullptr) {
  const launch_1d l = grid_stride_launch(rows);
  if (l.grid == 0) return;
  detail::stop_loss_grad_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(grad, logits, ld, targets, rows,
                                                                                       g);
  MEMALG_CUDA_CHECK_LAUNCH("stop_loss_grad_kernel");
}

}  // namespace memalg::backend::cuda

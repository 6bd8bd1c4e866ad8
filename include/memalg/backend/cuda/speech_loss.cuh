// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/speech_loss.cuh — masked mel L1 / MSE and the stop-token BCE with logits;
// the CUDA twin of backend/cpu/speech_loss.hpp (formulas and sources there).
//
// pred / logits are read with a row stride ld (the decoder's fused [mel ‖ stop] rows: ld =
// n_mels + 1, logits = out + n_mels); target[N, n_mels] and stop targets[N] contiguous;
// frame_mask[N] (1 real, 0 padding; null: all real).
//   forward:  result[2] = {mean loss over the real elements, M = real frames} (float, device);
//             one block, fixed-order block reductions (the same bits on every run).
//   backward: gradient (=) at every position the loss reads, dloss·∂mean/∂x, 0 at padding; reads
//             M from the forward's result[1].
// Stop targets (1 from the last real frame on) and the frame mask come from lengths with the
// helpers stop_targets / frame_mask_from_lengths.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/reduce.cuh"

namespace memalg::backend::cuda {

enum class mel_loss_kind { l1, mse };

inline constexpr int speech_loss_block = 1024;

namespace detail {

__device__ __forceinline__ bool frame_real(const std::uint8_t* mask, std::int64_t n) {
  return mask == nullptr || mask[n] != 0;
}

template <class T>
__global__ void __launch_bounds__(speech_loss_block)
    mel_loss_forward_kernel(float* result, mel_loss_kind kind, const T* pred, std::int64_t ld, const T* target,
                            const std::uint8_t* mask, std::int64_t rows, std::int64_t n_mels) {
  __shared__ float scratch[32];
  float sum = 0.0f;
  float frames = 0.0f;
  for (std::int64_t n = threadIdx.x; n < rows; n += blockDim.x) {
    if (!frame_real(mask, n)) continue;
    frames += 1.0f;
    for (std::int64_t c = 0; c < n_mels; ++c) {
      const float d = to_float(pred[n * ld + c]) - to_float(target[n * n_mels + c]);
      sum += kind == mel_loss_kind::l1 ? fabsf(d) : d * d;
    }
  }
  sum = block_sum(sum, scratch);
  frames = block_sum(frames, scratch);
  if (threadIdx.x == 0) {
    result[0] = frames > 0.0f ? sum / (frames * static_cast<float>(n_mels)) : 0.0f;
    result[1] = frames;
  }
}

template <class T>
__global__ void mel_loss_backward_kernel(T* dpred, mel_loss_kind kind, const T* pred, std::int64_t ld, const T* target,
                                         const std::uint8_t* mask, const float* result, float dloss, std::int64_t rows,
                                         std::int64_t n_mels) {
  const float frames = result[1];
  const float g = frames > 0.0f ? dloss / (frames * static_cast<float>(n_mels)) : 0.0f;
  const std::int64_t total = rows * n_mels;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t n = e / n_mels;
    const std::int64_t c = e - n * n_mels;
    const float d = to_float(pred[n * ld + c]) - to_float(target[e]);
    float v = 0.0f;
    if (frame_real(mask, n))
      v = kind == mel_loss_kind::l1 ? g * static_cast<float>((d > 0.0f) - (d < 0.0f)) : g * 2.0f * d;
    dpred[n * ld + c] = from_float<T>(v);
  }
}

template <class T>
__global__ void __launch_bounds__(speech_loss_block)
    stop_bce_forward_kernel(float* result, const T* logits, std::int64_t ld, const T* targets,
                            const std::uint8_t* mask, std::int64_t rows) {
  __shared__ float scratch[32];
  float sum = 0.0f;
  float frames = 0.0f;
  for (std::int64_t n = threadIdx.x; n < rows; n += blockDim.x) {
    if (!frame_real(mask, n)) continue;
    frames += 1.0f;
    const float x = to_float(logits[n * ld]);
    const float y = to_float(targets[n]);
    sum += fmaxf(x, 0.0f) - x * y + log1pf(expf(-fabsf(x)));
  }
  sum = block_sum(sum, scratch);
  frames = block_sum(frames, scratch);
  if (threadIdx.x == 0) {
    result[0] = frames > 0.0f ? sum / frames : 0.0f;
    result[1] = frames;
  }
}

template <class T>
__global__ void stop_bce_backward_kernel(T* dlogits, const T* logits, std::int64_t ld, const T* targets,
                                         const std::uint8_t* mask, const float* result, float dloss,
                                         std::int64_t rows) {
  const float frames = result[1];
  const float g = frames > 0.0f ? dloss / frames : 0.0f;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < rows; n += stride) {
    const float x = to_float(logits[n * ld]);
    const float y = to_float(targets[n]);
    dlogits[n * ld] = from_float<T>(frame_real(mask, n) ? g * (1.0f / (1.0f + expf(-x)) - y) : 0.0f);
  }
}

template <class T>
__global__ void stop_targets_kernel(T* targets, std::uint8_t* mask, const std::int32_t* lengths, std::int64_t batch,
                                    std::int64_t frames) {
  const std::int64_t total = batch * frames;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t t = e % frames;
    const std::int64_t len = lengths[e / frames];
    if (targets != nullptr) targets[e] = from_float<T>(t + 1 >= len ? 1.0f : 0.0f);
    if (mask != nullptr) mask[e] = t < len ? 1 : 0;
  }
}

}  // namespace detail

/// result[2] = {masked mean L1 or MSE, real frames}; pred row stride ld ≥ n_mels.
template <storage_type T>
void mel_loss_forward(float* result, mel_loss_kind kind, const T* pred, std::int64_t ld, const T* target,
                      const std::uint8_t* frame_mask, std::int64_t rows, std::int64_t n_mels,
                      cudaStream_t stream = nullptr) {
  detail::mel_loss_forward_kernel<<<1, speech_loss_block, 0, stream>>>(result, kind, pred, ld, target, frame_mask,
                                                                       rows, n_mels);
  MEMALG_CUDA_CHECK_LAUNCH("mel_loss_forward_kernel");
}

/// dpred (row stride ld, columns [0, n_mels) written; may alias pred); `result` from the forward.
template <storage_type T>
void mel_loss_backward(T* dpred, mel_loss_kind kind, const T* pred, std::int64_t ld, const T* target,
                       const std::uint8_t* frame_mask, const float* result, float dloss, std::int64_t rows,
                       std::int64_t n_mels, cudaStream_t stream = nullptr) {
  const launch_1d l = grid_stride_launch(rows * n_mels);
  if (l.grid == 0) return;
  detail::mel_loss_backward_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(
      dpred, kind, pred, ld, target, frame_mask, result, dloss, rows, n_mels);
  MEMALG_CUDA_CHECK_LAUNCH("mel_loss_backward_kernel");
}

/// result[2] = {masked mean BCE with logits, real frames}; logits[n·ld].
template <storage_type T>
void stop_bce_forward(float* result, const T* logits, std::int64_t ld, const T* targets,
                      const std::uint8_t* frame_mask, std::int64_t rows, cudaStream_t stream = nullptr) {
  detail::stop_bce_forward_kernel<<<1, speech_loss_block, 0, stream>>>(result, logits, ld, targets, frame_mask, rows);
  MEMALG_CUDA_CHECK_LAUNCH("stop_bce_forward_kernel");
}

/// dlogits[n·ld] = dloss·(σ(x) − y)·m/M (may alias logits); `result` from the forward.
template <storage_type T>
void stop_bce_backward(T* dlogits, const T* logits, std::int64_t ld, const T* targets, const std::uint8_t* frame_mask,
                       const float* result, float dloss, std::int64_t rows, cudaStream_t stream = nullptr) {
  const launch_1d l = grid_stride_launch(rows);
  if (l.grid == 0) return;
  detail::stop_bce_backward_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(
      dlogits, logits, ld, targets, frame_mask, result, dloss, rows);
  MEMALG_CUDA_CHECK_LAUNCH("stop_bce_backward_kernel");
}

/// Stop targets[B·T] (1 from the last real frame on) and frame_mask[B·T] (1 for t < length) from
/// lengths[B] on the device; either output may be null. Lengths are not range-checked here (the
/// CPU helpers check them).
template <storage_type T>
void stop_targets_and_mask(T* targets, std::uint8_t* frame_mask, const std::int32_t* lengths, std::int64_t batch,
                           std::int64_t frames, cudaStream_t stream = nullptr) {
  const launch_1d l = grid_stride_launch(batch * frames);
  if (l.grid == 0) return;
  detail::stop_targets_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(targets, frame_mask, lengths,
                                                                                    batch, frames);
  MEMALG_CUDA_CHECK_LAUNCH("stop_targets_kernel");
}

}  // namespace memalg::backend::cuda

// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/softmax.cuh — row softmax over the last dimension, forward and backward.
//
//   forward:  out[n,:] = softmax(scale·in[n,:])                   (float statistics, one rounding)
//   backward: din[n,:] = scale·out⊙(dout − Σ_c out·dout)          (=)
// One block per row; out may alias in and din may alias dout.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/reduce.cuh"

namespace memalg::backend::cuda {

inline constexpr int softmax_block = 256;

namespace detail {

template <class T>
__global__ void __launch_bounds__(softmax_block)
    softmax_forward_kernel(T* out, const T* in, std::int64_t cols, float scale) {
  __shared__ float scratch[64];
  const T* x = in + static_cast<std::int64_t>(blockIdx.x) * cols;
  T* y = out + static_cast<std::int64_t>(blockIdx.x) * cols;
  softmax_stats s = softmax_empty();
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) s = softmax_push(s, scale * to_float(x[c]));
  s = block_softmax(s, scratch);
  const float inv = 1.0f / s.l;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    y[c] = from_float<T>(expf(scale * to_float(x[c]) - s.m) * inv);
}

template <class T>
__global__ void __launch_bounds__(softmax_block)
    softmax_backward_kernel(T* din, const T* out, const T* dout, std::int64_t cols, float scale) {
  __shared__ float scratch[32];
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * cols;
  float dot = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) dot += to_float(out[base + c]) * to_float(dout[base + c]);
  dot = block_sum(dot, scratch);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    din[base + c] = from_float<T>(scale * to_float(out[base + c]) * (to_float(dout[base + c]) - dot));
}

}  // namespace detail

template <storage_type T>
void softmax_forward(T* out, const T* in, std::int64_t rows, std::int64_t cols, float scale = 1.0f,
                     cudaStream_t stream = nullptr) {
  if (rows <= 0 || cols <= 0) return;
  detail::softmax_forward_kernel<<<static_cast<unsigned>(rows), softmax_block, 0, stream>>>(out, in, cols, scale);
  MEMALG_CUDA_CHECK_LAUNCH("softmax_forward_kernel");
}

/// out: the forward output. din may alias dout.
template <storage_type T>
void softmax_backward(T* din, const T* out, const T* dout, std::int64_t rows, std::int64_t cols, float scale = 1.0f,
                      cudaStream_t stream = nullptr) {
  if (rows <= 0 || cols <= 0) return;
  detail::softmax_backward_kernel<<<static_cast<unsigned>(rows), softmax_block, 0, stream>>>(din, out, dout, cols,
                                                                                           scale);
  MEMALG_CUDA_CHECK_LAUNCH("softmax_backward_kernel");
}

}  // namespace memalg::backend::cuda

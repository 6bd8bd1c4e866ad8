// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/layernorm.cuh — LayerNorm over the last dimension, forward and backward.
//
//   forward:  μ = mean(in), rstd = 1/sqrt(mean((in−μ)²) + eps), out = (in−μ)·rstd·w + b;
//             saves mean[N], rstd[N] (float; may be null for inference)
//   backward: din = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dout·w, x̂ = (in−μ)·rstd     (=)
//             dw += Σ_n dout·x̂, db += Σ_n dout                                          (+=)
// One warp per row, float accumulation; weight gradients by a fixed-order column reduction.
// out may alias in; din may alias dout.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/reduce.cuh"

namespace memalg::backend::cuda {


namespace detail {

template <class T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* in, const T* weight,
                                         const T* bias, std::int64_t rows, std::int64_t cols, float eps) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / warp_size) + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (row >= rows) return;  // whole warps leave together
  const T* x = in + row * cols;
  float sum = 0.0f;
  for (std::int64_t c = lane; c < cols; c += warp_size) sum += to_float(x[c]);
  const float m = warp_sum(sum) / static_cast<float>(cols);
  float var = 0.0f;
  for (std::int64_t c = lane; c < cols; c += warp_size) {
    const float d = to_float(x[c]) - m;
    var += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(var) / static_cast<float>(cols) + eps);
  if (out != nullptr) {  // null: the statistics only (layernorm_stats)
    T* y = out + row * cols;
    for (std::int64_t c = lane; c < cols; c += warp_size) {
      const float b = bias != nullptr ? to_float(bias[c]) : 0.0f;
      y[c] = from_float<T>((to_float(x[c]) - m) * r * to_float(weight[c]) + b);
    }
  }
  if (lane == 0) {
    if (mean != nullptr) mean[row] = m;
    if (rstd != nullptr) rstd[row] = r;
  }
}

template <class T>
__global__ void layernorm_backward_input_kernel(T* din, const T* dout, const T* in, const T* weight,
                                                const float* mean, const float* rstd, std::int64_t rows,
                                                std::int64_t cols) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / warp_size) + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (row >= rows) return;
  const T* x = in + row * cols;
  const T* dy = dout + row * cols;
  const float m = mean[row];
  const float r = rstd[row];
  float sum_g = 0.0f;
  float sum_gx = 0.0f;
  for (std::int64_t c = lane; c < cols; c += warp_size) {
    const float g = to_float(dy[c]) * to_float(weight[c]);
    sum_g += g;
    sum_gx += g * (to_float(x[c]) - m) * r;
  }
  const float mean_g = warp_sum(sum_g) / static_cast<float>(cols);
  const float mean_gx = warp_sum(sum_gx) / static_cast<float>(cols);
  T* dx = din + row * cols;
  for (std::int64_t c = lane; c < cols; c += warp_size) {
    const float g = to_float(dy[c]) * to_float(weight[c]);
    const float xhat = (to_float(x[c]) - m) * r;
    dx[c] = from_float<T>(r * (g - mean_g - xhat * mean_gx));
  }
}

template <class T>
struct layernorm_param_term {
  const T* dout;
  const T* in;
  const float* mean;
  const float* rstd;
  std::int64_t cols;
  __device__ void operator()(std::int64_t n, std::int64_t c, float (&acc)[2]) const {
    const float dy = to_float(dout[n * cols + c]);
    acc[0] += dy * (to_float(in[n * cols + c]) - mean[n]) * rstd[n];
    acc[1] += dy;
  }
};

template <class T>
struct layernorm_param_store {
  T* dweight;
  T* dbias;
  __device__ void operator()(std::int64_t c, const float (&sum)[2]) const {
    if (dweight != nullptr) dweight[c] = from_float<T>(to_float(dweight[c]) + sum[0]);
    if (dbias != nullptr) dbias[c] = from_float<T>(to_float(dbias[c]) + sum[1]);
  }
};

}  // namespace detail

/// LayerNorm of in[rows, cols]; bias, mean and rstd may be null.
template <storage_type T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* in, const T* weight, const T* bias,
                       std::int64_t rows, std::int64_t cols, float eps,
                       cudaStream_t stream = nullptr) {
  const launch_1d l = warp_per_row_launch(rows);
  if (l.grid == 0) return;
  detail::layernorm_forward_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(out, mean, rstd, in, weight,
                                                                                         bias, rows, cols, eps);
  MEMALG_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
}

/// mean[rows] and rstd[rows] of in[rows, cols] only, with layernorm_forward's arithmetic (the same
/// bits): for a backward that recomputes the statistics from the saved input.
template <storage_type T>
void layernorm_stats(float* mean, float* rstd, const T* in, std::int64_t rows, std::int64_t cols,
                     float eps, cudaStream_t stream = nullptr) {
  const launch_1d l = warp_per_row_launch(rows);
  if (l.grid == 0) return;
  detail::layernorm_forward_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(
      static_cast<T*>(nullptr), mean, rstd, in, static_cast<const T*>(nullptr), static_cast<const T*>(nullptr), rows,
      cols, eps);
  MEMALG_CUDA_CHECK_LAUNCH("layernorm_forward_kernel (statistics)");
}

/// din = (written), dweight/dbias += (either may be null). din may alias dout.
template <storage_type T>
void layernorm_backward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight,
                        const float* mean, const float* rstd, std::int64_t rows, std::int64_t cols,
                        cudaStream_t stream = nullptr) {
  // Parameter gradients first: they read dout, which din may overwrite.
  if (dweight != nullptr || dbias != nullptr)
    column_reduce<2>(rows, cols, detail::layernorm_param_term<T>{dout, in, mean, rstd, cols},
                     detail::layernorm_param_store<T>{dweight, dbias}, stream);
  if (din == nullptr) return;
  const launch_1d l = warp_per_row_launch(rows);
  if (l.grid == 0) return;
  detail::layernorm_backward_input_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(
      din, dout, in, weight, mean, rstd, rows, cols);
  MEMALG_CUDA_CHECK_LAUNCH("layernorm_backward_input_kernel");
}

}  // namespace memalg::backend::cuda

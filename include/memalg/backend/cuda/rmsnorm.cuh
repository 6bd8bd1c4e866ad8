// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/rmsnorm.cuh — RMSNorm over the last dimension, forward and backward.
//
//   forward:  rstd = 1/sqrt(mean(in²) + eps), out = in·rstd·w; saves rstd[N] (float, may be null)
//   backward: din = rstd·(g − x̂·mean(g·x̂)), g = dout·w, x̂ = in·rstd                     (=)
//             dw += Σ_n dout·x̂                                                            (+=)
// One warp per row, float accumulation; out may alias in, din may alias dout. w_offset: the scale is
// w_offset + w (1 for Gemma's RMSNorm, as the CPU reference, backend/cpu/rmsnorm.hpp).
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
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* in, const T* weight, std::int64_t rows,
                                       std::int64_t cols, float eps, float w_offset = 0.0f) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / warp_size) + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (row >= rows) return;
  const T* x = in + row * cols;
  float sq = 0.0f;
  for (std::int64_t c = lane; c < cols; c += warp_size) {
    const float v = to_float(x[c]);
    sq += v * v;
  }
  const float r = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(cols) + eps);
  if (out != nullptr) {  // null: rstd only (rmsnorm_stats)
    T* y = out + row * cols;
    for (std::int64_t c = lane; c < cols; c += warp_size)
      y[c] = from_float<T>(to_float(x[c]) * r * (w_offset + to_float(weight[c])));
  }
  if (lane == 0 && rstd != nullptr) rstd[row] = r;
}

template <class T>
__global__ void rmsnorm_backward_input_kernel(T* din, const T* dout, const T* in, const T* weight, const float* rstd,
                                              std::int64_t rows, std::int64_t cols, float w_offset) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / warp_size) + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (row >= rows) return;
  const T* x = in + row * cols;
  const T* dy = dout + row * cols;
  const float r = rstd[row];
  float sum_gx = 0.0f;
  for (std::int64_t c = lane; c < cols; c += warp_size)
    sum_gx += to_float(dy[c]) * (w_offset + to_float(weight[c])) * to_float(x[c]) * r;
  const float mean_gx = warp_sum(sum_gx) / static_cast<float>(cols);
  T* dx = din + row * cols;
  for (std::int64_t c = lane; c < cols; c += warp_size) {
    const float g = to_float(dy[c]) * (w_offset + to_float(weight[c]));
    const float xhat = to_float(x[c]) * r;
    dx[c] = from_float<T>(r * (g - xhat * mean_gx));
  }
}

template <class T>
struct rmsnorm_param_term {
  const T* dout;
  const T* in;
  const float* rstd;
  std::int64_t cols;
  __device__ void operator()(std::int64_t n, std::int64_t c, float (&acc)[1]) const {
    acc[0] += to_float(dout[n * cols + c]) * to_float(in[n * cols + c]) * rstd[n];
  }
};

template <class T>
struct rmsnorm_param_store {
  T* dweight;
  __device__ void operator()(std::int64_t c, const float (&sum)[1]) const {
    dweight[c] = from_float<T>(to_float(dweight[c]) + sum[0]);
  }
};

}  // namespace detail

/// RMSNorm of in[rows, cols]; rstd may be null.
template <storage_type T>
void rmsnorm_forward(T* out, float* rstd, const T* in, const T* weight, std::int64_t rows, std::int64_t cols,
                     float eps, cudaStream_t stream = nullptr, float w_offset = 0.0f) {
  const launch_1d l = warp_per_row_launch(rows);
  if (l.grid == 0) return;
  detail::rmsnorm_forward_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(out, rstd, in, weight, rows,
                                                                                       cols, eps, w_offset);
  MEMALG_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
}

/// rstd[rows] of in[rows, cols] only, with rmsnorm_forward's arithmetic (the same bits): for a
/// backward that recomputes it from the saved input.
template <storage_type T>
void rmsnorm_stats(float* rstd, const T* in, std::int64_t rows, std::int64_t cols, float eps,
                   cudaStream_t stream = nullptr) {
  const launch_1d l = warp_per_row_launch(rows);
  if (l.grid == 0) return;
  detail::rmsnorm_forward_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(
      static_cast<T*>(nullptr), rstd, in, static_cast<const T*>(nullptr), rows, cols, eps);
  MEMALG_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel (statistics)");
}

/// din = (written), dweight += (may be null). din may alias dout.
template <storage_type T>
void rmsnorm_backward(T* din, T* dweight, const T* dout, const T* in, const T* weight, const float* rstd,
                      std::int64_t rows, std::int64_t cols, cudaStream_t stream = nullptr, float w_offset = 0.0f) {
  if (dweight != nullptr)
    column_reduce<1>(rows, cols, detail::rmsnorm_param_term<T>{dout, in, rstd, cols},
                     detail::rmsnorm_param_store<T>{dweight}, stream);
  if (din == nullptr) return;
  const launch_1d l = warp_per_row_launch(rows);
  if (l.grid == 0) return;
  detail::rmsnorm_backward_input_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(din, dout, in, weight,
                                                                                              rstd, rows, cols, w_offset);
  MEMALG_CUDA_CHECK_LAUNCH("rmsnorm_backward_input_kernel");
}

}  // namespace memalg::backend::cuda

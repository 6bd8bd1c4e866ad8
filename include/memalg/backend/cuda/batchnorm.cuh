// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/batchnorm.cuh — BatchNorm1d over (B, S) per channel, training mode, with a
// padding mask; the CUDA twin of backend/cpu/batchnorm.hpp (formulas there).
//
// in[N = B·S, C] token-major, mask[N] (1 real, 0 padding; null: all real), M = Σ mask.
//   forward:  mean[C], rstd[C] (float, saved; biased variance, eps 1e-5); out = m·(γ·x̂ + β), 0 at
//             padding. The backward needs mean, rstd, the input x, γ and the mask.
//   backward: din = m·rstd·(γ·dout − γ·Σ m·dout/M − x̂·γ·Σ m·dout·x̂/M)        (=)
//             dγ += Σ m·dout·x̂, dβ += Σ m·dout                                   (+=)
//             needs a float scratch of batchnorm_backward_scratch_bytes(C) for the two sums.
//   running:  running_mean/var ← (1 − momentum)·running + momentum·(μ, σ²·M/(M − 1)); σ² =
//             1/rstd² − eps; unchanged when M < 2.
// Every per-channel sum is a fixed-order column reduction (reduce.cuh): no atomics, the same bits
// on every run. out may alias in; din may alias dout.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/reduce.cuh"

namespace memalg::backend::cuda {

inline constexpr float batchnorm_eps = 1e-5f;
inline constexpr float batchnorm_momentum = 0.1f;

/// Float scratch of batchnorm_backward: Σ m·dout and Σ m·dout·x̂ per channel, and M.
constexpr std::size_t batchnorm_backward_scratch_bytes(std::int64_t channels) noexcept {
  return static_cast<std::size_t>(2 * channels + 1) * sizeof(float);
}

namespace detail {

__device__ __forceinline__ float mask_weight(const std::uint8_t* mask, std::int64_t n) {
  return mask == nullptr || mask[n] != 0 ? 1.0f : 0.0f;
}

// Pass 1: Σ m·x and M per channel → mean.
template <class T>
struct bn_sum_term {
  const T* in;
  const std::uint8_t* mask;
  std::int64_t cols;
  __device__ void operator()(std::int64_t n, std::int64_t c, float (&acc)[2]) const {
    const float m = mask_weight(mask, n);
    acc[0] += m * to_float(in[n * cols + c]);
    acc[1] += m;
  }
};
struct bn_mean_store {
  float* mean;
  __device__ void operator()(std::int64_t c, const float (&sum)[2]) const {
    mean[c] = sum[1] > 0.0f ? sum[0] / sum[1] : 0.0f;
  }
};

// Pass 2: Σ m·(x − μ)² and M → rstd.
template <class T>
struct bn_var_term {
  const T* in;
  const std::uint8_t* mask;
  const float* mean;
  std::int64_t cols;
  __device__ void operator()(std::int64_t n, std::int64_t c, float (&acc)[2]) const {
    const float m = mask_weight(mask, n);
    const float d = to_float(in[n * cols + c]) - mean[c];
    acc[0] += m * d * d;
    acc[1] += m;
  }
};
struct bn_rstd_store {
  float* rstd;
  float eps;
  __device__ void operator()(std::int64_t c, const float (&sum)[2]) const {
    const float var = sum[1] > 0.0f ? sum[0] / sum[1] : 0.0f;
    rstd[c] = 1.0f / sqrtf(var + eps);
  }
};

template <class T>
__global__ void bn_output_kernel(T* out, const T* in, const T* gamma, const T* beta, const std::uint8_t* mask,
                                 const float* mean, const float* rstd, std::int64_t rows, std::int64_t cols) {
  const std::int64_t total = rows * cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t c = e % cols;
    const std::int64_t n = e / cols;
    float y = 0.0f;
    if (mask_weight(mask, n) != 0.0f)
      y = (to_float(in[e]) - mean[c]) * rstd[c] * to_float(gamma[c]) + to_float(beta[c]);
    out[e] = from_float<T>(y);
  }
}

// Backward sums: Σ m·dout, Σ m·dout·x̂, M.
template <class T>
struct bn_grad_term {
  const T* dout;
  const T* in;
  const std::uint8_t* mask;
  const float* mean;
  const float* rstd;
  std::int64_t cols;
  __device__ void operator()(std::int64_t n, std::int64_t c, float (&acc)[3]) const {
    const float m = mask_weight(mask, n);
    const float dy = m * to_float(dout[n * cols + c]);
    acc[0] += dy;
    acc[1] += dy * (to_float(in[n * cols + c]) - mean[c]) * rstd[c];
    acc[2] += m;
  }
};
template <class T>
struct bn_grad_store {
  T* dgamma;
  T* dbeta;
  float* scratch;  // [2C + 1]: Σ m·dout, Σ m·dout·x̂, then M
  std::int64_t cols;
  __device__ void operator()(std::int64_t c, const float (&sum)[3]) const {
    scratch[c] = sum[0];
    scratch[cols + c] = sum[1];
    if (c == 0) scratch[2 * cols] = sum[2];
    if (dgamma != nullptr) dgamma[c] = from_float<T>(to_float(dgamma[c]) + sum[1]);
    if (dbeta != nullptr) dbeta[c] = from_float<T>(to_float(dbeta[c]) + sum[0]);
  }
};

template <class T>
__global__ void bn_input_grad_kernel(T* din, const T* dout, const T* in, const T* gamma, const std::uint8_t* mask,
                                     const float* mean, const float* rstd, const float* scratch, std::int64_t rows,
                                     std::int64_t cols) {
  const std::int64_t total = rows * cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const float count = scratch[2 * cols];
  const float inv_m = count > 0.0f ? 1.0f / count : 0.0f;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t c = e % cols;
    const std::int64_t n = e / cols;
    float d = 0.0f;
    if (mask_weight(mask, n) != 0.0f) {
      const float g = to_float(gamma[c]);
      const float r = rstd[c];
      const float xh = (to_float(in[e]) - mean[c]) * r;
      d = r * (g * to_float(dout[e]) - g * scratch[c] * inv_m - xh * g * scratch[cols + c] * inv_m);
    }
    din[e] = from_float<T>(d);
  }
}

struct bn_count_term {
  const std::uint8_t* mask;
  __device__ void operator()(std::int64_t n, std::int64_t, float (&acc)[1]) const { acc[0] += mask_weight(mask, n); }
};
template <class T>
struct bn_running_store {
  T* running_mean;
  T* running_var;
  const float* mean;
  const float* rstd;
  float momentum;
  float eps;
  __device__ void operator()(std::int64_t c, const float (&sum)[1]) const {
    const float count = sum[0];
    if (count < 2.0f) return;
    const float var = 1.0f / (rstd[c] * rstd[c]) - eps;
    running_mean[c] = from_float<T>((1.0f - momentum) * to_float(running_mean[c]) + momentum * mean[c]);
    running_var[c] =
        from_float<T>((1.0f - momentum) * to_float(running_var[c]) + momentum * var * (count / (count - 1.0f)));
  }
};

}  // namespace detail

/// mean[C], rstd[C] (float) of in[N, C] over the real rows, as batchnorm_forward computes them
/// (the same passes, the same bits): a backward that keeps only the input recomputes them.
template <storage_type T>
void batchnorm_stats(float* mean, float* rstd, const T* in, const std::uint8_t* mask, std::int64_t rows,
                     std::int64_t cols, float eps = batchnorm_eps, cudaStream_t stream = nullptr) {
  if (rows <= 0 || cols <= 0) return;
  column_reduce<2>(rows, cols, detail::bn_sum_term<T>{in, mask, cols}, detail::bn_mean_store{mean}, stream);
  column_reduce<2>(rows, cols, detail::bn_var_term<T>{in, mask, mean, cols}, detail::bn_rstd_store{rstd, eps}, stream);
}

/// out[N, C] (may alias in), mean[C], rstd[C] (float, saved); mask[N] may be null.
template <storage_type T>
void batchnorm_forward(T* out, float* mean, float* rstd, const T* in, const T* gamma, const T* beta,
                       const std::uint8_t* mask, std::int64_t rows, std::int64_t cols, float eps = batchnorm_eps,
                       cudaStream_t stream = nullptr) {
  if (rows <= 0 || cols <= 0) return;
  batchnorm_stats(mean, rstd, in, mask, rows, cols, eps, stream);
  const launch_1d l = grid_stride_launch(rows * cols);
  detail::bn_output_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(out, in, gamma, beta, mask, mean,
                                                                                 rstd, rows, cols);
  MEMALG_CUDA_CHECK_LAUNCH("bn_output_kernel");
}

/// din[N, C] written (may be null; may alias dout), dgamma[C], dbeta[C] accumulated (either may be
/// null); `scratch` holds batchnorm_backward_scratch_bytes(cols).
template <storage_type T>
void batchnorm_backward(T* din, T* dgamma, T* dbeta, const T* dout, const T* in, const T* gamma, const float* mean,
                        const float* rstd, const std::uint8_t* mask, std::int64_t rows, std::int64_t cols,
                        float* scratch, cudaStream_t stream = nullptr) {
  if (rows <= 0 || cols <= 0) return;
  if (scratch == nullptr) throw std::invalid_argument("batchnorm_backward: scratch is null");
  column_reduce<3>(rows, cols, detail::bn_grad_term<T>{dout, in, mask, mean, rstd, cols},
                   detail::bn_grad_store<T>{dgamma, dbeta, scratch, cols}, stream);
  if (din == nullptr) return;
  const launch_1d l = grid_stride_launch(rows * cols);
  detail::bn_input_grad_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(din, dout, in, gamma, mask,
                                                                                     mean, rstd, scratch, rows, cols);
  MEMALG_CUDA_CHECK_LAUNCH("bn_input_grad_kernel");
}

/// running_mean[C], running_var[C] updated in place from the forward's mean, rstd and mask.
template <storage_type T>
void batchnorm_update_running(T* running_mean, T* running_var, const float* mean, const float* rstd,
                              const std::uint8_t* mask, std::int64_t rows, std::int64_t cols,
                              float momentum = batchnorm_momentum, float eps = batchnorm_eps,
                              cudaStream_t stream = nullptr) {
  if (rows <= 0 || cols <= 0) return;
  column_reduce<1>(rows, cols, detail::bn_count_term{mask},
                   detail::bn_running_store<T>{running_mean, running_var, mean, rstd, momentum, eps}, stream);
}

}  // namespace memalg::backend::cuda

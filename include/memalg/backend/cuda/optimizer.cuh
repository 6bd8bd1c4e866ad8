// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/optimizer.cuh — fused SGD, SGD with momentum and AdamW updates.
//
// Same entry points, hyper-parameters and mathematics as the CPU backend. Each kernel loads the
// working weight (the fp32 master when `master` is not null, else the parameter itself), reads the
// gradient in T multiplied by grad_scale (and by *device_grad_scale when given, so that the
// loss-scale inverse and the clip coefficient can stay on the device), updates it in float and
// stores master and parameter (the latter rounded to T once).
//   sgd:       w = w − lr·(g + λ·w)
//   momentum:  b = μ·b + (g + λ·w);  w = w − lr·b
//   adamw:     m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²;  m̂ = m/(1−β1ᵗ);  v̂ = v/(1−β2ᵗ)
//              w = w − lr·λ·w − lr·m̂/(√v̂ + ε)            (decoupled weight decay, step t ≥ 1)
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/exec/hparams.hpp"

namespace memalg::backend::cuda {

// The kernels' hyper-parameters, defaulting to the runtime's (exec/hparams.hpp).
struct sgd_hparams {
  float lr = exec::default_hparams.lr;
  float weight_decay = exec::default_hparams.weight_decay;
};

struct momentum_hparams {
  float lr = exec::default_hparams.lr;
  float momentum = exec::default_hparams.momentum;
  float weight_decay = exec::default_hparams.weight_decay;
};

struct adamw_hparams {
  float lr = exec::default_hparams.lr;
  float beta1 = exec::default_hparams.beta1;
  float beta2 = exec::default_hparams.beta2;
  float eps = exec::default_hparams.eps;
  float weight_decay = exec::default_hparams.weight_decay;
};

/// 1 − βᵗ in float, as the CPU backend computes it.
inline float bias_correction(float beta, std::int64_t step) {
  return 1.0f - std::pow(beta, static_cast<float>(step));
}

namespace detail {

enum class optimizer_kind { sgd, momentum, adamw };

struct optimizer_args {
  float lr = 0, weight_decay = 0, momentum = 0, beta1 = 0, beta2 = 0, eps = 0, bc1 = 1, bc2 = 1;
  float grad_scale = 1;
  const float* device_grad_scale = nullptr;
};

template <optimizer_kind K, class T>
__global__ void optimizer_kernel(T* param, float* master, float* s1, float* s2, const T* grad, std::int64_t n,
                                 optimizer_args a) {
  const float scale = a.device_grad_scale != nullptr ? a.grad_scale * *a.device_grad_scale : a.grad_scale;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float w = master != nullptr ? master[i] : to_float(param[i]);
    const float g = to_float(grad[i]) * scale;
    if constexpr (K == optimizer_kind::sgd) {
      w = w - a.lr * (g + a.weight_decay * w);
    } else if constexpr (K == optimizer_kind::momentum) {
      const float b = a.momentum * s1[i] + (g + a.weight_decay * w);
      s1[i] = b;
      w = w - a.lr * b;
    } else {
      const float m = a.beta1 * s1[i] + (1.0f - a.beta1) * g;
      const float v = a.beta2 * s2[i] + (1.0f - a.beta2) * g * g;
      s1[i] = m;
      s2[i] = v;
      const float m_hat = m / a.bc1;
      const float v_hat = v / a.bc2;
      w = w - a.lr * a.weight_decay * w - a.lr * m_hat / (sqrtf(v_hat) + a.eps);
    }
    if (master != nullptr) master[i] = w;
    param[i] = from_float<T>(w);
  }
}

template <optimizer_kind K, class T>
void launch_optimizer(T* param, float* master, float* s1, float* s2, const T* grad, std::int64_t n,
                      const optimizer_args& a, cudaStream_t stream) {
  const launch_1d l = grid_stride_launch(n);
  if (l.grid == 0) return;
  optimizer_kernel<K><<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(param, master, s1, s2, grad, n, a);
  MEMALG_CUDA_CHECK_LAUNCH("optimizer_kernel");
}

}  // namespace detail

/// Plain SGD over n elements (master may be null).
template <storage_type T>
void sgd_step(T* param, float* master, const T* grad, std::int64_t n, const sgd_hparams& hp, float grad_scale = 1.0f,
              const float* device_grad_scale = nullptr, cudaStream_t stream = nullptr) {
  detail::optimizer_args a;
  a.lr = hp.lr;
  a.weight_decay = hp.weight_decay;
  a.grad_scale = grad_scale;
  a.device_grad_scale = device_grad_scale;
  detail::launch_optimizer<detail::optimizer_kind::sgd>(param, master, nullptr, nullptr, grad, n, a, stream);
}

/// SGD with momentum; velocity[n] is the fp32 momentum buffer (zero initially).
template <storage_type T>
void momentum_step(T* param, float* master, float* velocity, const T* grad, std::int64_t n, const momentum_hparams& hp,
                   float grad_scale = 1.0f, const float* device_grad_scale = nullptr, cudaStream_t stream = nullptr) {
  if (velocity == nullptr) throw std::invalid_argument("momentum_step: velocity buffer is null");
  detail::optimizer_args a;
  a.lr = hp.lr;
  a.momentum = hp.momentum;
  a.weight_decay = hp.weight_decay;
  a.grad_scale = grad_scale;
  a.device_grad_scale = device_grad_scale;
  detail::launch_optimizer<detail::optimizer_kind::momentum>(param, master, velocity, nullptr, grad, n, a, stream);
}

/// AdamW; m[n], v[n] fp32 moments (zero initially); step is the 1-based count of applied updates.
template <storage_type T>
void adamw_step(T* param, float* master, float* m, float* v, const T* grad, std::int64_t n, const adamw_hparams& hp,
                std::int64_t step, float grad_scale = 1.0f, const float* device_grad_scale = nullptr,
                cudaStream_t stream = nullptr) {
  if (step < 1) throw std::invalid_argument("adamw_step: step must be >= 1 (bias correction)");
  if (m == nullptr || v == nullptr) throw std::invalid_argument("adamw_step: moment buffers are null");
  detail::optimizer_args a;
  a.lr = hp.lr;
  a.beta1 = hp.beta1;
  a.beta2 = hp.beta2;
  a.eps = hp.eps;
  a.weight_decay = hp.weight_decay;
  a.bc1 = bias_correction(hp.beta1, step);
  a.bc2 = bias_correction(hp.beta2, step);
  a.grad_scale = grad_scale;
  a.device_grad_scale = device_grad_scale;
  detail::launch_optimizer<detail::optimizer_kind::adamw>(param, master, m, v, grad, n, a, stream);
}

}  // namespace memalg::backend::cuda

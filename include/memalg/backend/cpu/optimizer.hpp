// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/optimizer.hpp — SGD, SGD with momentum and AdamW parameter updates (reference).
//
// Every step first forms g = grad·grad_scale, where grad_scale = clip_coef / loss_scale folds the
// global-norm clipping and the fp16 loss-scale division into one multiply. The update runs in
// accum_t<T> on the master copy when one is given (mixed precision: fp32 master weights, Micikevicius
// et al. 2018) and the parameter is then rewritten as round(master); without a master the update
// runs on the widened parameter itself. Optimizer states (velocity, m, v) are accum_t<T>.
//
//   sgd:      g += wd·w;  w −= lr·g                                   (PyTorch torch.optim.SGD)
//   momentum: g += wd·w;  buf = μ·buf + g;  w −= lr·buf               (PyTorch, no dampening)
//   adamw:    w −= lr·wd·w (decoupled weight decay, Loshchilov & Hutter 2019);
//             m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²;
//             w −= lr · (m/(1−β1ᵗ)) / (sqrt(v/(1−β2ᵗ)) + eps)       (Kingma & Ba 2015), t ≥ 1
// Weight decay applies to every element passed: call with weight_decay = 0 for tensors that are
// not decayed (biases, norm weights).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "memalg/core/float16.hpp"
#include "memalg/exec/hparams.hpp"

namespace memalg::backend::cpu {

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

namespace detail {
/// Load the working weight (master if present), run `update(w, g, i)`, store master and param.
template <storage_type T, class F>
void optimizer_apply(T* param, accum_t<T>* master, const T* grad, std::size_t n, float grad_scale,
                     F&& update) {
  using A = accum_t<T>;
  const A gs = static_cast<A>(grad_scale);
  for (std::size_t i = 0; i < n; ++i) {
    A w = master ? master[i] : to_float(param[i]);
    const A g = to_float(grad[i]) * gs;
    w = update(w, g, i);
    if (master) master[i] = w;
    param[i] = from_float<T>(w);
  }
}
}  // namespace detail

/// param[n] (and master[n], may be null) updated in place; grad[n].
template <storage_type T>
void sgd_step(T* param, accum_t<T>* master, const T* grad, std::size_t n, const sgd_hparams& hp,
              float grad_scale = 1.0f) {
  using A = accum_t<T>;
  const A lr = hp.lr, wd = hp.weight_decay;
  detail::optimizer_apply(param, master, grad, n, grad_scale,
                          [&](A w, A g, std::size_t) { return w - lr * (g + wd * w); });
}

/// velocity[n] is the momentum buffer (start at zero).
template <storage_type T>
void momentum_step(T* param, accum_t<T>* master, accum_t<T>* velocity, const T* grad, std::size_t n,
                   const momentum_hparams& hp, float grad_scale = 1.0f) {
  using A = accum_t<T>;
  const A lr = hp.lr, mu = hp.momentum, wd = hp.weight_decay;
  detail::optimizer_apply(param, master, grad, n, grad_scale, [&](A w, A g, std::size_t i) {
    velocity[i] = mu * velocity[i] + (g + wd * w);
    return w - lr * velocity[i];
  });
}

/// m[n], v[n] are the first/second moment estimates (start at zero); step is the 1-based count of
/// applied updates (skipped fp16 steps do not count).
template <storage_type T>
void adamw_step(T* param, accum_t<T>* master, accum_t<T>* m, accum_t<T>* v, const T* grad,
                std::size_t n, const adamw_hparams& hp, std::int64_t step, float grad_scale = 1.0f) {
  using A = accum_t<T>;
  if (step < 1) throw std::invalid_argument("adamw_step: step must be >= 1 (bias correction)");
  const A lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps, wd = hp.weight_decay;
  const A c1 = A(1) - std::pow(b1, static_cast<A>(step));
  const A c2 = A(1) - std::pow(b2, static_cast<A>(step));
  detail::optimizer_apply(param, master, grad, n, grad_scale, [&](A w, A g, std::size_t i) {
    m[i] = b1 * m[i] + (A(1) - b1) * g;
    v[i] = b2 * v[i] + (A(1) - b2) * g * g;
    const A mhat = m[i] / c1, vhat = v[i] / c2;
    return w - lr * wd * w - lr * mhat / (std::sqrt(vhat) + eps);
  });
}

}  // namespace memalg::backend::cpu

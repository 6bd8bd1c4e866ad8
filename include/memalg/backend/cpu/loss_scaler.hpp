// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/loss_scaler.hpp — dynamic loss scaling for fp16 training (Micikevicius et al.
// 2018; same state machine as PyTorch's GradScaler).
//
// The loss is multiplied by scale() before the backward so small fp16 gradients do not flush to
// zero. After the backward: if any gradient is inf/NaN the step is skipped and the scale halved;
// otherwise the step is applied (with grads multiplied by 1/scale) and after `growth_interval`
// consecutive finite steps the scale doubles. Defaults: 2¹⁶, ×2 after 2000, ×0.5 (docs/kernels.md).
#pragma once

#include <cmath>
#include <cstddef>
#include <stdexcept>

#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

/// True if any element is inf or NaN.
template <storage_type T>
bool has_nonfinite(const T* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(to_float(x[i]))) return true;
  return false;
}

class dynamic_loss_scaler {
 public:
  explicit dynamic_loss_scaler(float initial_scale = 65536.0f, float growth_factor = 2.0f,
                               float backoff_factor = 0.5f, int growth_interval = 2000)
      : scale_(initial_scale), growth_(growth_factor), backoff_(backoff_factor), interval_(growth_interval) {
    if (!(initial_scale > 0) || !(growth_factor >= 1) || !(backoff_factor > 0 && backoff_factor < 1) ||
        growth_interval < 1)
      throw std::invalid_argument("dynamic_loss_scaler: invalid parameters");
  }

  /// Current multiplier for the loss.
  float scale() const noexcept { return scale_; }
  /// Multiplier that un-scales the gradients (fold into the optimizer's grad_scale).
  float inv_scale() const noexcept { return 1.0f / scale_; }
  /// Consecutive finite steps since the last growth or backoff.
  int good_steps() const noexcept { return good_; }
  /// Steps skipped so far.
  long skipped_steps() const noexcept { return skipped_; }

  /// Record the outcome of one backward; returns true if the optimizer step should be applied.
  bool update(bool found_nonfinite) noexcept {
    if (found_nonfinite) {
      scale_ *= backoff_;
      good_ = 0;
      ++skipped_;
      return false;
    }
    if (++good_ == interval_) {
      scale_ *= growth_;
      good_ = 0;
    }
    return true;
  }

 private:
  float scale_;
  float growth_;
  float backoff_;
  int interval_;
  int good_ = 0;
  long skipped_ = 0;
};

}  // namespace memalg::backend::cpu

// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/speech_loss.hpp — the speech model's losses: masked L1 / MSE between
// predicted and target mel frames, and the stop-token BCE with logits (reference; the kernels of
// exec::ops::mel_loss and exec::ops::stop_loss).
//
// Tacotron 2 (Shen et al. 2018, arXiv 1712.05884, §2.3) trains the mel frames with a regression
// loss (MSE there; L1 in many Transformer TTS recipes) and a "stop token" per frame with a binary
// cross-entropy whose target is 1 from the last real frame on. Frames are rows n = b·T + t;
// mask[N] marks real frames (1) and padding (0); a null mask means every frame is real.
//
//   mel:  pred[N, M] with row stride ld ≥ M (so that the decoder's fused [mel ‖ stop] output,
//         ld = M + 1, is read in place), target[N, M] contiguous (fp32: the step's features):
//           L1:  Σ_n m_n Σ_c |d|,  grad = g·sign(d)·m_n   (sign(0) = 0, as torch.sign: L1Loss's gradient)
//           MSE: Σ_n m_n Σ_c d²,   grad = g·2d·m_n,        d = pred[n·ld + c] − target[n·M + c]
//         grad[N, M] is contiguous and may be pred itself when ld == M (each row is read whole
//         before it is written).
//   stop: logits[N] with stride ld (the stop column of the fused output: logits = out + M),
//         targets[N] in {0, 1} (fp32); PyTorch BCEWithLogitsLoss in its stable form over every row
//           Σ_n max(x, 0) − x·y + log(1 + exp(−|x|)),  grad[n·ld] = g·(σ(x) − y)   (may be logits)
// Each function returns the sum, accumulated in accum_t<T>; the op divides it by its fixed divisor
// (PyTorch's reduction="mean" over the real frames when the divisor is their count) and passes
// g = dloss / divisor.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

/// Σ m·ℓ(pred − target) of the mel frames; grad (=) g·m·ℓ'.
template <storage_type T>
accum_t<T> mel_loss(T* grad, bool l1, const T* pred, std::size_t ld, const float* target, const std::uint8_t* mask,
                    std::size_t N, std::size_t M, accum_t<T> g) {
  using A = accum_t<T>;
  if (ld < M) throw std::invalid_argument("mel_loss: row stride smaller than the row");
  std::vector<A> row(M);
  A sum = 0;
  for (std::size_t n = 0; n < N; ++n) {
    const bool real = !mask || mask[n] != 0;
    for (std::size_t c = 0; c < M; ++c) row[c] = to_float(pred[n * ld + c]) - static_cast<A>(target[n * M + c]);
    for (std::size_t c = 0; c < M; ++c) {
      const A d = row[c];
      A v = 0;
      if (real) {
        sum += l1 ? std::abs(d) : d * d;
        v = l1 ? g * static_cast<A>((d > A(0)) - (d < A(0))) : g * A(2) * d;
      }
      grad[n * M + c] = from_float<T>(v);
    }
  }
  return sum;
}

/// Σ BCE with logits of the stop token over every row; grad[n·ld] (=) g·(σ(x) − y).
template <storage_type T>
accum_t<T> stop_loss(T* grad, const T* logits, std::size_t ld, const float* targets, std::size_t N, accum_t<T> g) {
  using A = accum_t<T>;
  if (ld == 0) throw std::invalid_argument("stop_loss: row stride must be positive");
  A sum = 0;
  for (std::size_t n = 0; n < N; ++n) {
    const A x = to_float(logits[n * ld]), t = static_cast<A>(targets[n]);
    sum += std::max(x, A(0)) - x * t + std::log1p(std::exp(-std::abs(x)));  // BCE with logits, stable form
    grad[n * ld] = from_float<T>(g * (A(1) / (A(1) + std::exp(-x)) - t));
  }
  return sum;
}

}  // namespace memalg::backend::cpu

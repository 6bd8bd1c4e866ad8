// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/speech_loss.hpp — the speech model's losses: masked L1 / MSE between
// predicted and target mel frames, and the stop-token BCE with logits (reference).
//
// Tacotron 2 (Shen et al. 2018, arXiv 1712.05884, §2.3) trains the mel frames with a regression
// loss (MSE there; L1 in many Transformer TTS recipes) and a "stop token" per frame with a binary
// cross-entropy whose target is 1 from the last real frame on. Frames are rows n = b·T + t;
// frame_mask[N] marks real frames (1) and padding (0); a null mask means every frame is real.
//
//   mel:  pred[N, n_mels] with row stride ld ≥ n_mels (so that the decoder's fused
//         [mel ‖ stop] output, ld = n_mels + 1, is read in place), target[N, n_mels] contiguous.
//         Mean over the M·n_mels unmasked elements (M = Σ mask), PyTorch's reduction="mean" over
//         the real frames:
//           L1:  L = Σ m_n |pred − target| / (M·n_mels),   dpred = dloss·sign(pred − target)·m_n/(M·n_mels)
//                (sign(0) = 0, as torch.sign: PyTorch's L1Loss gradient)
//           MSE: L = Σ m_n (pred − target)² / (M·n_mels), dpred = dloss·2(pred − target)·m_n/(M·n_mels)
//   stop: logits[N] with stride ld (the stop column of the fused output: logits = out + n_mels),
//         targets[N] in {0, 1}; PyTorch BCEWithLogitsLoss in its stable form
//           ℓ = max(x, 0) − x·y + log(1 + exp(−|x|)),  L = Σ m_n ℓ_n / M,
//           dlogits = dloss·(σ(x) − y)·m_n / M
// Backward functions write the gradient at every position they read (0 at masked ones and, for
// a strided prediction, only the columns of that loss), scaled by dloss (the gradient of the
// mean loss, as cross_entropy.hpp's). Losses are accumulated and returned in accum_t<T>.
// M = 0 gives loss 0 and zero gradients.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

enum class mel_loss_kind { l1, mse };

namespace detail {
inline std::size_t real_frames(const std::uint8_t* mask, std::size_t N) {
  if (!mask) return N;
  std::size_t m = 0;
  for (std::size_t n = 0; n < N; ++n) m += mask[n] != 0 ? 1 : 0;
  return m;
}
inline void check_ld(std::size_t ld, std::size_t width, const char* what) {
  if (ld < width) throw std::invalid_argument(std::string(what) + ": row stride smaller than the row");
}
}  // namespace detail

/// Masked mean L1 or MSE over pred[N, n_mels] (row stride ld) and target[N, n_mels].
template <storage_type T>
accum_t<T> mel_loss_forward(mel_loss_kind kind, const T* pred, std::size_t ld, const T* target,
                            const std::uint8_t* frame_mask, std::size_t N, std::size_t n_mels) {
  using A = accum_t<T>;
  detail::check_ld(ld, n_mels, "mel_loss_forward");
  const std::size_t M = detail::real_frames(frame_mask, N);
  if (M == 0) return A(0);
  A sum = 0;
  for (std::size_t n = 0; n < N; ++n) {
    if (frame_mask && frame_mask[n] == 0) continue;
    for (std::size_t c = 0; c < n_mels; ++c) {
      const A d = to_float(pred[n * ld + c]) - to_float(target[n * n_mels + c]);
      sum += kind == mel_loss_kind::l1 ? std::abs(d) : d * d;
    }
  }
  return sum / (static_cast<A>(M) * static_cast<A>(n_mels));
}

/// dpred[N, n_mels] (row stride ld, columns [0, n_mels) written; may alias pred).
template <storage_type T>
void mel_loss_backward(mel_loss_kind kind, T* dpred, const T* pred, std::size_t ld, const T* target,
                       const std::uint8_t* frame_mask, accum_t<T> dloss, std::size_t N, std::size_t n_mels) {
  using A = accum_t<T>;
  detail::check_ld(ld, n_mels, "mel_loss_backward");
  const std::size_t M = detail::real_frames(frame_mask, N);
  const A g = M ? dloss / (static_cast<A>(M) * static_cast<A>(n_mels)) : A(0);
  for (std::size_t n = 0; n < N; ++n) {
    const bool real = !frame_mask || frame_mask[n] != 0;
    for (std::size_t c = 0; c < n_mels; ++c) {
      const A d = to_float(pred[n * ld + c]) - to_float(target[n * n_mels + c]);
      A v = 0;
      if (real) v = kind == mel_loss_kind::l1 ? g * static_cast<A>((d > A(0)) - (d < A(0))) : g * A(2) * d;
      dpred[n * ld + c] = from_float<T>(v);
    }
  }
}

/// Stop targets[B·T]: 1 from the last real frame on (t ≥ length_b − 1), 0 before; lengths in [1, T].
template <storage_type T>
void stop_targets(T* targets, const std::int32_t* lengths, std::size_t B, std::size_t frames) {
  for (std::size_t b = 0; b < B; ++b) {
    if (lengths[b] < 1 || static_cast<std::size_t>(lengths[b]) > frames)
      throw std::out_of_range("stop_targets: length outside [1, T]");
    for (std::size_t t = 0; t < frames; ++t)
      targets[b * frames + t] = from_float<T>(t + 1 >= static_cast<std::size_t>(lengths[b]) ? accum_t<T>(1) : accum_t<T>(0));
  }
}

/// frame_mask[B·T]: 1 for t < length_b, 0 for the padding after it; lengths in [0, T].
inline void frame_mask_from_lengths(std::uint8_t* mask, const std::int32_t* lengths, std::size_t B, std::size_t frames) {
  for (std::size_t b = 0; b < B; ++b) {
    if (lengths[b] < 0 || static_cast<std::size_t>(lengths[b]) > frames)
      throw std::out_of_range("frame_mask_from_lengths: length outside [0, T]");
    for (std::size_t t = 0; t < frames; ++t) mask[b * frames + t] = t < static_cast<std::size_t>(lengths[b]) ? 1 : 0;
  }
}

/// Masked mean BCE with logits; logits[n·ld], targets[N].
template <storage_type T>
accum_t<T> stop_bce_forward(const T* logits, std::size_t ld, const T* targets, const std::uint8_t* frame_mask,
                            std::size_t N) {
  using A = accum_t<T>;
  detail::check_ld(ld, 1, "stop_bce_forward");
  const std::size_t M = detail::real_frames(frame_mask, N);
  if (M == 0) return A(0);
  A sum = 0;
  for (std::size_t n = 0; n < N; ++n) {
    if (frame_mask && frame_mask[n] == 0) continue;
    const A x = to_float(logits[n * ld]), y = to_float(targets[n]);
    sum += std::max(x, A(0)) - x * y + std::log1p(std::exp(-std::abs(x)));
  }
  return sum / static_cast<A>(M);
}

/// dlogits[n·ld] written (may alias logits).
template <storage_type T>
void stop_bce_backward(T* dlogits, const T* logits, std::size_t ld, const T* targets, const std::uint8_t* frame_mask,
                       accum_t<T> dloss, std::size_t N) {
  using A = accum_t<T>;
  detail::check_ld(ld, 1, "stop_bce_backward");
  const std::size_t M = detail::real_frames(frame_mask, N);
  const A g = M ? dloss / static_cast<A>(M) : A(0);
  for (std::size_t n = 0; n < N; ++n) {
    const bool real = !frame_mask || frame_mask[n] != 0;
    const A x = to_float(logits[n * ld]), y = to_float(targets[n]);
    dlogits[n * ld] = from_float<T>(real ? g * (A(1) / (A(1) + std::exp(-x)) - y) : A(0));
  }
}

}  // namespace memalg::backend::cpu

// SPDX-License-Identifier: BSL-1.0
// tests/cpu/speech_targets.hpp — a padded speech batch's stop targets and frame mask from its
// utterances' lengths, for the speech-loss tests (CPU and CUDA). The training data builds the same
// from its utterances (memalg/data/shards.hpp, make_batch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>

namespace speech_targets {

/// Stop targets[B·T]: 1 from the last real frame on (t ≥ length_b − 1), 0 before; lengths in [1, T].
template <class T>
void stop_targets(T* targets, const std::int32_t* lengths, std::size_t B, std::size_t frames) {
  for (std::size_t b = 0; b < B; ++b) {
    if (lengths[b] < 1 || static_cast<std::size_t>(lengths[b]) > frames)
      throw std::out_of_range("stop_targets: length outside [1, T]");
    for (std::size_t t = 0; t < frames; ++t)
      targets[b * frames + t] = t + 1 >= static_cast<std::size_t>(lengths[b]) ? T(1) : T(0);
  }
}

/// mask[B·T]: 1 for t < length_b, 0 for the padding after it; lengths in [0, T].
inline void frame_mask_from_lengths(std::uint8_t* mask, const std::int32_t* lengths, std::size_t B, std::size_t frames) {
  for (std::size_t b = 0; b < B; ++b) {
    if (lengths[b] < 0 || static_cast<std::size_t>(lengths[b]) > frames)
      throw std::out_of_range("frame_mask_from_lengths: length outside [0, T]");
    for (std::size_t t = 0; t < frames; ++t) mask[b * frames + t] = t < static_cast<std::size_t>(lengths[b]) ? 1 : 0;
  }
}

}  // namespace speech_targets

// SPDX-License-Identifier: BSL-1.0
// memalg/core/random.hpp — a counter-based random stream shared by every backend.
//
// Dropout masks must be identical on the CPU reference and on the GPU so that the two backends
// can be compared bit for bit. A counter-based generator gives element i of stream `seed` without
// any state: u(seed, i) = top 24 bits of splitmix64(seed + (i + 1) * golden) scaled to [0, 1).
// splitmix64 is Steele, Lea & Flood, "Fast splittable pseudorandom number generators" (OOPSLA 2014).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "memalg/config.hpp"

namespace memalg {

/// splitmix64 finaliser (Steele et al. 2014); a bijection on 64-bit integers.
MEMALG_HOST_DEVICE constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/// Uniform float in [0, 1) for element `index` of stream `seed`; exactly representable (24 bits).
MEMALG_HOST_DEVICE constexpr float uniform01(std::uint64_t seed, std::uint64_t index) noexcept {
  const std::uint64_t bits = splitmix64(seed + (index + 1) * 0x9E3779B97F4A7C15ULL) >> 40;
  return static_cast<float>(bits) * (1.0f / 16777216.0f);
}

/// Dropout keeps element `index` when its uniform draw is at least p (so p = 0 keeps everything).
MEMALG_HOST_DEVICE constexpr bool dropout_keep(std::uint64_t seed, std::uint64_t index, float p) noexcept {
  return uniform01(seed, index) >= p;
}

/// stddev · N(0, 1) for element `index` of tensor `tensor` (Box–Muller on two of the tensor's
/// uniforms), on the host: identical on any split of the tensor (exec/init.hpp).
inline float init_normal(std::uint64_t seed, std::uint64_t tensor, std::uint64_t index, float stddev) {
  const std::uint64_t s = splitmix64(seed ^ (tensor * 0x9E3779B97F4A7C15ULL));
  const float u1 = std::max(uniform01(s, 2 * index), 1e-7f), u2 = uniform01(s, 2 * index + 1);
  return stddev * std::sqrt(-2.0f * std::log(u1)) * std::cos(2.0f * std::numbers::pi_v<float> * u2);
}

}  // namespace memalg

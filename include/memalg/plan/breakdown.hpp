// memalg/plan/breakdown.hpp — bytes per category, the value the memory algebra computes with.
//
// A breakdown forms a commutative monoid under + (sequential composition), scales by a count
// (repeated layers), and shards by a degree with ceiling division (what the most loaded of the
// shards holds). Its `total` is the sum of its categories at one moment; the peak of a rank over a
// training step is a maximum over the timeline's moments (plan/timeline.hpp), never a sum of each
// category's maximum.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "memalg/core/bytes.hpp"

namespace memalg {

enum class category : std::uint8_t {
  weights,
  gradients,
  master_weights,
  optimizer_states,
  activations,
  temporaries,
  comm_buffers,
  reserve,
};
inline constexpr std::size_t category_count = 8;

/// Names as used in JSON output and reports.
constexpr std::string_view category_name(category c) {
  constexpr std::array<std::string_view, category_count> names{
      "weights", "gradients", "master_weights", "optimizer_states", "activations", "temporaries", "comm_buffers",
      "reserve"};
  return names[static_cast<std::size_t>(c)];
}

struct breakdown {
  bytes weights{};
  bytes gradients{};
  bytes master_weights{};
  bytes optimizer_states{};
  bytes activations{};
  bytes temporaries{};
  bytes comm_buffers{};
  bytes reserve{};

  friend constexpr bool operator==(const breakdown& a, const breakdown& b) {
    for (std::size_t i = 0; i < category_count; ++i)
      if (a[category(i)] != b[category(i)]) return false;
    return true;
  }

  constexpr bytes& operator[](category c) {
    switch (c) {
      case category::weights: return weights;
      case category::gradients: return gradients;
      case category::master_weights: return master_weights;
      case category::optimizer_states: return optimizer_states;
      case category::activations: return activations;
      case category::temporaries: return temporaries;
      case category::comm_buffers: return comm_buffers;
      case category::reserve: break;
    }
    return reserve;
  }
  constexpr bytes operator[](category c) const { return const_cast<breakdown&>(*this)[c]; }

  /// Weights + gradients + master weights + optimizer states (ZeRO's "model states").
  constexpr bytes model_states() const { return weights + gradients + master_weights + optimizer_states; }
  constexpr bytes total() const {
    return model_states() + activations + temporaries + comm_buffers + reserve;
  }

  friend constexpr breakdown operator+(breakdown a, const breakdown& b) {
    for (std::size_t i = 0; i < category_count; ++i) a[category(i)] += b[category(i)];
    return a;
  }
  constexpr breakdown& operator+=(const breakdown& b) { return *this = *this + b; }
  friend constexpr breakdown operator*(breakdown a, std::uint64_t n) {
    for (std::size_t i = 0; i < category_count; ++i) a[category(i)] = a[category(i)] * n;
    return a;
  }
  /// What the most loaded of `n` shards of every category holds.
  constexpr breakdown shard(std::uint64_t n) const {
    breakdown r{};
    for (std::size_t i = 0; i < category_count; ++i) r[category(i)] = (*this)[category(i)].shard(n);
    return r;
  }
};

}  // namespace memalg

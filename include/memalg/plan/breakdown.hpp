// SPDX-License-Identifier: BSL-1.0
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
  constexpr bytes model_states() const { return sum(4); }
  constexpr bytes total() const { return sum(category_count); }

  using member = bytes breakdown::*;
  // The arithmetic below loops over the members with the overflow checks written inline: a
  // compile-time search adds breakdowns thousands of times, and in constant evaluation every
  // function call (operator[], a checked add) costs microseconds.
  friend constexpr breakdown operator+(breakdown a, const breakdown& b) { return a += b; }
  constexpr breakdown& operator+=(const breakdown& b) {
    for (const member m : members) {
      if ((b.*m).value > detail::max_count - (this->*m).value) detail::byte_count_overflows_64_bits();
      (this->*m).value += (b.*m).value;
    }
    return *this;
  }
  friend constexpr breakdown operator*(breakdown a, std::uint64_t n) {
    for (const member m : members) {
      if (n != 0 && (a.*m).value > detail::max_count / n) detail::byte_count_overflows_64_bits();
      (a.*m).value *= n;
    }
    return a;
  }
  /// What the most loaded of `n` shards of every category holds.
  constexpr breakdown shard(std::uint64_t n) const {
    if (n == 0) detail::division_by_zero_shard_degree();
    breakdown r = *this;
    for (const member m : members) (r.*m).value = (r.*m).value / n + ((r.*m).value % n != 0 ? 1 : 0);
    return r;
  }

 private:
  /// The members in category order (model states first).
  static constexpr member members[category_count] = {
      &breakdown::weights,     &breakdown::gradients,   &breakdown::master_weights, &breakdown::optimizer_states,
      &breakdown::activations, &breakdown::temporaries, &breakdown::comm_buffers,   &breakdown::reserve};
  constexpr bytes sum(std::size_t first_members) const {
    bytes t{};
    for (std::size_t i = 0; i < first_members; ++i) {
      const std::uint64_t v = (this->*members[i]).value;
      if (v > detail::max_count - t.value) detail::byte_count_overflows_64_bits();
      t.value += v;
    }
    return t;
  }
};

}  // namespace memalg

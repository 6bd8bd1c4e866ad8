// memalg/plan/timeline.hpp — the phases of one training step on one rank, and their peak.
//
//   steady state    model states + reserve (between steps)
//   forward         + ZeRO-3 gathered weights: (1 + prefetch) copies of the largest layer
//   backward        + ZeRO-3 gathered weights and the layer's unsharded gradient
//   optimizer step  model states + reserve
//
// The rank's peak is the maximum over these moments, not a sum of each category's maximum; the
// phase where it occurs is reported. Activations and the other transients join the forward and
// backward phases in plan/activations.hpp.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "memalg/device/device.hpp"
#include "memalg/plan/model_states.hpp"

namespace memalg {

enum class phase : std::uint8_t { steady, forward, backward, optimizer_step };
inline constexpr std::size_t phase_count = 4;

constexpr std::string_view phase_name(phase p) {
  constexpr std::array<std::string_view, phase_count> names{"steady", "forward", "backward", "optimizer_step"};
  return names[static_cast<std::size_t>(p)];
}

struct timeline {
  std::array<breakdown, phase_count> at{};  ///< device bytes at each phase's high-water mark
  breakdown host{};                         ///< host bytes (offloaded states), constant over the step
  std::uint64_t parameters = 0;             ///< parameters on the rank before ZeRO sharding

  constexpr phase peak_phase() const {
    std::size_t best = 0;
    for (std::size_t i = 1; i < phase_count; ++i)
      if (at[i].total() > at[best].total()) best = i;
    return phase(best);
  }
  constexpr const breakdown& peak() const { return at[static_cast<std::size_t>(peak_phase())]; }
};

constexpr timeline stage_timeline(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                  const device_desc& d, std::uint64_t stage) {
  const stage_model_states s = model_states(model, t, m, stage);
  timeline tl{};
  breakdown base = s.device;
  base.reserve = d.reserve;
  for (breakdown& b : tl.at) b = base;
  const bytes gathered = s.gathered_weights * (1 + m.zero3_prefetch);
  tl.at[static_cast<std::size_t>(phase::forward)].temporaries += gathered;
  tl.at[static_cast<std::size_t>(phase::backward)].temporaries += gathered + s.gathered_gradient;
  tl.host = s.host;
  tl.parameters = s.parameters;
  return tl;
}

}  // namespace memalg

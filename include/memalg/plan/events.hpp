// SPDX-License-Identifier: BSL-1.0
// memalg/plan/events.hpp — the moments of one step on one rank, in the order the step runs them.
//
// plan/timeline.hpp reports each phase's high-water mark; this header lists the moments whose
// maximum that mark is, for a picture of the step (`memalg plan --timeline`):
//
//   steady          the model states between steps (timeline.hpp)
//   forward         one moment per entry (a repeated entry: after all its instances), as
//                   activations_on_stage offers them, on top of the forward phase's states
//   backward        the loss's backward (pytorch), then each entry's backward in reverse order
//                   (a repeated entry under pytorch: its first and its last instance; memalg's
//                   runtime: a backward in two parts gives two moments)
//   reduction       backward has ended: its saved tensors are freed and the gradients reduced.
//                   The stacks memalg models reduce inside backward (DDP's buckets, ZeRO-2's
//                   bucket, FSDP's per-unit reduce-scatter), so this is the end of backward: the
//                   backward phase's states and the gradients that exist then, no activations
//   optimizer step  the optimizer phase (timeline.hpp)
//
// Each moment's bytes are its phase's states (the phase's mark less its peak moment, which is
// what timeline.hpp adds to them) plus the moment itself. The largest forward moment equals the
// forward phase, the largest backward one the backward phase: the numbers are the planner's.
// Under a pipeline the sweep is that of the stage's newest micro-batch, on top of the earlier
// micro-batches in flight (activations.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "memalg/plan/evaluate.hpp"

namespace memalg {

enum class step_event_kind : std::uint8_t {
  steady,
  teacher,
  forward,
  loss,
  backward,
  backward_last,
  backward_tail,
  reduction,
  optimizer_step,
};

constexpr std::string_view step_event_kind_name(step_event_kind k) {
  constexpr std::array<std::string_view, 9> names{"steady",   "teacher",       "forward",       "loss",          "backward",
                                                  "backward_last", "backward_tail", "reduction", "optimizer_step"};
  return names[static_cast<std::size_t>(k)];
}

/// One moment of the step: its kind, its phase, its model entry (`no_entry` for the steady state,
/// the reduction and the optimizer step) and the device bytes by category.
struct step_event {
  static constexpr std::size_t no_entry = max_model_entries;
  step_event_kind kind = step_event_kind::steady;
  phase in_phase = phase::steady;
  std::size_t entry = no_entry;
  breakdown bytes_at{};
};

struct step_events {
  static constexpr std::size_t capacity = sweep_log::capacity + 4;
  std::array<step_event, capacity> events{};
  std::size_t size = 0;
  std::size_t peak = 0;  ///< index of the first event with the largest total
  std::uint64_t stage = 0;
  timeline tl{};
  constexpr const step_event* begin() const { return events.data(); }
  constexpr const step_event* end() const { return events.data() + size; }
  constexpr void push(const step_event& e) {
    if (size < capacity) events[size++] = e;
  }
};

namespace detail {
constexpr breakdown minus(breakdown a, const breakdown& b) {
  for (std::size_t k = 0; k < category_count; ++k) a[category(k)] -= b[category(k)];
  return a;
}
constexpr step_event_kind event_kind_of(sweep_step s) {
  switch (s) {
    case sweep_step::teacher: return step_event_kind::teacher;
    case sweep_step::forward: return step_event_kind::forward;
    case sweep_step::loss: return step_event_kind::loss;
    case sweep_step::backward: return step_event_kind::backward;
    case sweep_step::backward_last: return step_event_kind::backward_last;
    case sweep_step::backward_tail: return step_event_kind::backward_tail;
  }
  return step_event_kind::forward;
}
}  // namespace detail

/// The moments of one rank of `stage` (see the header).
constexpr step_events stage_events(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                   const device_desc& d, std::uint64_t stage) {
  step_events out{};
  out.stage = stage;
  const bool with_acts = has_activations(model, t);
  const activation_table acts =
      with_acts ? activation_table_of(model, activation_context_of(t, m, d)) : activation_table{};
  out.tl = stage_timeline(model, t, m, d, stage, with_acts ? &acts : nullptr);
  const timeline& tl = out.tl;
  const auto at = [&](phase p) { return tl.at[static_cast<std::size_t>(p)]; };
  out.push({step_event_kind::steady, phase::steady, step_event::no_entry, at(phase::steady)});
  breakdown after_backward = at(phase::backward);
  if (with_acts) {
    sweep_log log{};
    const stage_activations a = activations_on_stage(model, acts, t, m, stage, &log);
    const breakdown forward_states = detail::minus(at(phase::forward), a.forward);
    const breakdown backward_states = detail::minus(at(phase::backward), a.backward);
    for (std::size_t i = 0; i < log.size; ++i) {
      const sweep_moment& s = log.moments[i];
      const bool fwd = s.step == sweep_step::teacher || s.step == sweep_step::forward;
      breakdown b = fwd ? forward_states : backward_states;
      b.activations += s.activations;
      b.temporaries += s.temporaries;
      b.comm_buffers += s.comm;
      b.gradients += s.gradients;
      out.push({detail::event_kind_of(s.step), fwd ? phase::forward : phase::backward, s.entry, b});
    }
    after_backward = backward_states;
    after_backward.gradients += log.gradients_after_backward;
  } else {
    out.push({step_event_kind::forward, phase::forward, step_event::no_entry, at(phase::forward)});
    out.push({step_event_kind::backward, phase::backward, step_event::no_entry, at(phase::backward)});
  }
  out.push({step_event_kind::reduction, phase::backward, step_event::no_entry, after_backward});
  out.push({step_event_kind::optimizer_step, phase::optimizer_step, step_event::no_entry, at(phase::optimizer_step)});
  for (std::size_t i = 1; i < out.size; ++i)
    if (out.events[i].bytes_at.total() > out.events[out.peak].bytes_at.total()) out.peak = i;
  return out;
}

/// The moments of the rank `evaluate` reports (its most loaded stage, or `stage` when given).
constexpr step_events plan_events(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                  const device_desc& d, const plan_result& r) {
  return stage_events(model, t, m, d, r.most_loaded_stage);
}

}  // namespace memalg

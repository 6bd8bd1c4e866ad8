// memalg/plan/evaluate.hpp — the whole plan as one constexpr function of four literals.
//
// `evaluate(model, training, mesh, device)` is what `plan<>` computes at compile time and what the
// command-line tool computes at run time: the same function, so the two can never disagree.
// It validates the configuration (`plan_error`), evaluates the timeline of every *distinct*
// pipeline stage (the first, the last, and the middle stages with and without an extra layer of
// an uneven split — all other stages equal one of these) and reports the most loaded one.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "memalg/plan/issues.hpp"
#include "memalg/plan/timeline.hpp"

namespace memalg {

struct plan_result {
  std::uint64_t parameters = 0;        ///< of the whole model
  std::uint64_t most_loaded_stage = 0; ///< pipeline stage of the most loaded rank
  timeline most_loaded{};              ///< that rank's timeline
  breakdown per_rank{};                ///< that rank's device bytes at its peak
  breakdown host_per_rank{};           ///< that rank's host bytes
  phase peak_phase = phase::steady;
  bytes limit{};                       ///< floor(capacity × cap)
  bytes usable{};                      ///< limit − reserve
  bool fits = false;

  constexpr bytes peak() const { return per_rank.total(); }
  /// Bytes left below the limit at the peak (zero when it does not fit).
  constexpr bytes headroom() const { return fits ? limit - per_rank.total() : bytes{}; }
  /// Bytes missing (zero when it fits).
  constexpr bytes shortfall() const { return fits ? bytes{} : per_rank.total() - limit; }
};

/// The first reason a configuration cannot be planned (plan_issue::none when it can). Type-level
/// plans turn it into a compile error with the same sentence (detail::plan_check).
constexpr plan_issue find_plan_issue(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                     const device_desc& d) {
  if (!mesh_error(m).empty()) return plan_issue::invalid_mesh;
  if (!device_error(d).empty()) return plan_issue::invalid_device;
  if (model.size == 0 || model.parameters() == 0) return plan_issue::no_parameters;
  if (t.micro_batch == 0) return plan_issue::zero_micro_batch;
  if (t.grad_accum == 0) return plan_issue::zero_grad_accum;
  if (t.recompute == recompute_kind::every_k && t.recompute_every == 0) return plan_issue::invalid_recompute;
  const precision_policy& p = t.precision;
  if (!p.weights.storable || !p.gradients.storable || !p.activations.storable || !p.master_weights.storable)
    return plan_issue::compute_only_storage;
  if (p.weights.is_none() || p.gradients.is_none()) return plan_issue::missing_dtype;
  for (const layer_desc& l : model)
    if (l.expert_params + l.tp_replicated_params > l.params) return plan_issue::inconsistent_layer;
  const std::uint64_t repeated = model.repeated_layers();
  if (m.pp > 1 && repeated != 0 && m.pp * m.virtual_stages > repeated) return plan_issue::pipeline_deeper_than_layers;
  return plan_issue::none;
}

/// The sentence for the command-line tool: the mesh's own reason when the mesh is at fault.
constexpr std::string_view plan_error(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                      const device_desc& d) {
  if (const std::string_view e = mesh_error(m); !e.empty()) return e;
  if (const std::string_view e = device_error(d); !e.empty()) return e;
  return describe(find_plan_issue(model, t, m, d));
}

constexpr plan_result evaluate(const model_desc& model, const training_desc& t, const mesh_desc& m,
                               const device_desc& d) {
  plan_result r{};
  r.parameters = model.parameters();
  r.limit = d.limit();
  r.usable = d.usable();

  // Distinct stages: first, last, and around the remainder boundary of each repeated entry.
  std::array<std::uint64_t, 6> candidates{0, m.pp - 1, 1, m.pp >= 2 ? m.pp - 2 : 0, 0, 0};
  std::size_t n = 4;
  for (const layer_desc& l : model)
    if (l.place == placement::repeated && n + 2 <= candidates.size()) {
      const std::uint64_t rem = l.count % m.pp;
      candidates[n++] = rem == 0 ? 0 : rem - 1;
      candidates[n++] = rem < m.pp ? rem : 0;
    }
  bool first = true;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t stage = candidates[i];
    if (stage >= m.pp) continue;
    const timeline tl = stage_timeline(model, t, m, d, stage);
    if (first || tl.peak().total() > r.per_rank.total()) {
      r.most_loaded_stage = stage;
      r.most_loaded = tl;
      r.per_rank = tl.peak();
      r.host_per_rank = tl.host;
      r.peak_phase = tl.peak_phase();
      first = false;
    }
  }
  r.fits = r.per_rank.total() <= r.limit;
  return r;
}

}  // namespace memalg

// SPDX-License-Identifier: BSL-1.0
// memalg/plan/report.hpp — human-readable tables of a plan (used by the examples and the CLI).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "memalg/plan/evaluate.hpp"

namespace memalg {

namespace detail {
inline std::string pad_right(std::string_view s, std::size_t w) {
  std::string r(s);
  if (r.size() < w) r.append(w - r.size(), ' ');
  return r;
}
inline std::string pad_left(std::string_view s, std::size_t w) {
  std::string r;
  if (s.size() < w) r.append(w - s.size(), ' ');
  r += s;
  return r;
}
}  // namespace detail

/// Per-category table of the most loaded rank (device and host), then the verdict.
inline std::string breakdown_table(const plan_result& r, const device_desc& d) {
  using detail::pad_left;
  using detail::pad_right;
  std::string out;
  out += pad_right("category", 18) + pad_left("device", 14) + pad_left("host", 14) + "\n";
  for (std::size_t i = 0; i < category_count; ++i) {
    const category c = category(i);
    out += pad_right(category_name(c), 18) + pad_left(to_string(r.per_rank[c]), 14) +
           pad_left(to_string(r.host_per_rank[c]), 14) + "\n";
  }
  out += pad_right("total (peak)", 18) + pad_left(to_string(r.per_rank.total()), 14) +
         pad_left(to_string(r.host_per_rank.total()), 14) + "\n";
  out += "peak at phase '" + std::string(phase_name(r.peak_phase)) + "' on pipeline stage " +
         std::to_string(r.most_loaded_stage) + "\n";
  out += "device " + std::string(d.name) + ": capacity " + to_string(d.capacity) + ", limit " + to_string(r.limit) +
         ", usable for tensors " + to_string(r.usable) + "\n";
  if (r.fits)
    out += "fits: yes, headroom " + to_string(r.headroom()) + "\n";
  else
    out += "fits: NO, short by " + to_string(r.shortfall()) + "\n";
  return out;
}

/// Device bytes of the most loaded rank at each phase of the step.
inline std::string phase_table(const plan_result& r) {
  std::string out = detail::pad_right("phase", 18) + detail::pad_left("device", 14) + "\n";
  for (std::size_t i = 0; i < phase_count; ++i)
    out += detail::pad_right(phase_name(phase(i)), 18) + detail::pad_left(to_string(r.most_loaded.at[i].total()), 14) +
           (phase(i) == r.peak_phase ? "  <- peak" : "") + "\n";
  return out;
}

/// Per-layer table of the most loaded rank: for each entry, the instances the rank holds and the
/// bytes of ONE instance (device weights; saved activations of one micro-batch with the recipe's
/// recomputation), then the instances' total. A transformer block is followed by its §4.1
/// sub-layers (Korthikanti et al. 2022) when no recomputation hides them. The last line says how
/// many micro-batches the rank holds in flight.
inline std::string layer_table(const model_desc& model, const training_desc& t, const mesh_desc& m,
                               const plan_result& r, const device_desc& d = device_desc{}) {
  using detail::pad_left;
  using detail::pad_right;
  const layer_rows rows = memalg::layer_table(model, t, m, r.most_loaded_stage, d);
  const activation_context ctx = activation_context_of(t, m, d);
  std::string out = pad_right("layer", 26) + pad_left("count", 7) + pad_left("weights (1)", 14) +
                    pad_left("activations (1)", 17) + pad_left("count x (w + a)", 17) + "\n";
  for (std::size_t i = 0; i < rows.size; ++i) {
    const layer_row& row = rows.rows[i];
    const bytes all = (row.weights + row.activations) * row.count;
    out += pad_right(row.name, 26) + pad_left(std::to_string(row.count), 7) + pad_left(to_string(row.weights), 14) +
           pad_left(to_string(row.activations), 17) + pad_left(to_string(all), 17) + "\n";
    const layer_desc& l = model.entries[i];
    const bool shows_parts = l.kind == layer_kind::transformer_block && l.trainable && row.activations.value != 0 &&
                             (t.recompute == recompute_kind::none || t.recompute == recompute_kind::selective);
    if (!shows_parts) continue;
    const block_parts parts = sublayer_activations(l, ctx);
    const auto part = [&](std::string_view name, const saved_bytes& b) {
      if (b.total().value == 0) return;
      const bytes kept = t.recompute == recompute_kind::selective ? b.weight_grad + b.input_grad : b.total();
      out += pad_right(std::string("  ") + std::string(name), 26) + pad_left("", 7) + pad_left("", 14) +
             pad_left(to_string(kept), 17) + "\n";
    };
    part("attention", parts.attention);
    part("cross_attention", parts.cross_attention);
    part("mlp", parts.mlp);
    part("norms", parts.norms);
  }
  out += "micro-batches in flight on pipeline stage " + std::to_string(r.most_loaded_stage) + ": " +
         std::to_string(r.most_loaded.chunks_in_flight) +
         (m.schedule == pipeline_schedule::interleaved && m.pp > 1
              ? " model-chunk micro-batches of " + std::to_string(m.virtual_stages) + " chunks"
              : std::string{}) +
         "\n";
  return out;
}

/// Everything: the breakdown at the peak, the phases of the step and the per-layer table.
inline std::string report(const model_desc& model, const training_desc& t, const mesh_desc& m, const device_desc& d,
                          const plan_result& r) {
  std::string out = breakdown_table(r, d);
  out += "\n";
  out += phase_table(r);
  if (has_layer_structure(model)) {
    out += "\n";
    out += layer_table(model, t, m, r, d);
  }
  return out;
}

/// The report of a compile-time plan.
template <class Plan>
std::string report() {
  return report(Plan::model, Plan::training, Plan::mesh, Plan::device, Plan::result);
}

}  // namespace memalg

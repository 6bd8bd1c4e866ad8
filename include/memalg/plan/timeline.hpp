// SPDX-License-Identifier: BSL-1.0
// memalg/plan/timeline.hpp — the phases of one training step on one rank, and their peak.
//
//   steady state    model states + reserve (between steps; the gradient buffer is persistent,
//                   as Megatron's and DeepSpeed's contiguous buffers are, so gradient
//                   accumulation costs nothing extra)
//   forward         + saved activations of the micro-batches in flight, growing layer by layer,
//                   with each layer's transients on top: raw attention scores (naive), the logits
//                   at the loss, sequence-parallel all-gathers, context-parallel key/value rings,
//                   pipeline send/receive buffers, ZeRO-3's gathered weights ((1 + prefetch) × the
//                   largest layer)
//   backward        + the saved activations still alive, the loss's logits and their gradient,
//                   score gradients, the recomputed layer(s), ZeRO-3's gathered weights and the
//                   layer's unsharded gradient, ZeRO-2's gradient bucket (one layer's unsharded
//                   gradient before its reduce-scatter, as FSDP's SHARD_GRAD_OP per wrapped unit)
//   optimizer step  model states + the fp32 copy of the gradient shard when gradients are
//                   narrower than the master weights (DeepSpeed stage_1_and_2.py `step`, which
//                   upcasts each partition's fp16 gradient before the update); a fused optimizer
//                   (Apex / DeepSpeed FusedAdam, torch fused=True) needs no other temporaries
//
// The rank's peak is the maximum over these moments, not a sum of each category's maximum; the
// phase where it occurs is reported. A model given by its parameter count alone has no layer
// structure: it keeps the model-state numbers of the ZeRO paper (no activations, no transients
// other than ZeRO-3's gathered layer).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "memalg/device/device.hpp"
#include "memalg/plan/activations.hpp"
#include "memalg/plan/model_states.hpp"
#include "memalg/plan/stacks/megatron.hpp"
#include "memalg/plan/stacks/pytorch.hpp"

namespace memalg {

enum class phase : std::uint8_t { steady, forward, backward, optimizer_step };
inline constexpr std::size_t phase_count = 4;

constexpr std::string_view phase_name(phase p) {
  constexpr std::array<std::string_view, phase_count> names{"steady", "forward", "backward", "optimizer_step"};
  return names[static_cast<std::size_t>(p)];
}

struct timeline {
  std::array<breakdown, phase_count> at{};  ///< device bytes at each phase's high-water mark
  breakdown host{};                         ///< host bytes (offloaded states and activations)
  std::uint64_t parameters = 0;             ///< parameters on the rank before ZeRO sharding
  std::uint64_t chunks_in_flight = 1;       ///< micro-batches (model chunks × micro-batches when interleaved) held
  bytes activations_per_micro_batch{};      ///< saved activations of one micro-batch on the rank

  constexpr phase peak_phase() const {
    std::size_t best = 0;
    for (std::size_t i = 1; i < phase_count; ++i)
      if (at[i].total() > at[best].total()) best = i;
    return phase(best);
  }
  constexpr const breakdown& peak() const { return at[static_cast<std::size_t>(peak_phase())]; }
};

namespace detail {
/// ZeRO-2's gradient bucket and the optimizer step's gradient upcast on `stage`.
struct step_transients {
  bytes gradient_bucket{};
  bytes optimizer_temporaries{};
};
constexpr step_transients stage_step_transients(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                                std::uint64_t stage) {
  step_transients s{};
  const precision_policy& p = t.precision;
  const std::uint64_t dense_group = m.dp * m.cp;
  const std::uint64_t expert_group = dense_group / m.ep;
  const bool bucket = m.zero_stage == 2 && dense_group > 1;
  const bool upcast = !p.master_weights.is_none() && gradient_dtype(t).bits < p.master_weights.bits &&
                      m.offload == offload_kind::none && !t.fused_optimizer;
  if (!bucket && !upcast) return s;
  for (const layer_desc& l : model) {
    if (l.kind == layer_kind::parameters || !l.trainable) continue;
    const std::uint64_t n = instances_on_stage(l, stage, m.pp);
    if (n == 0) continue;
    const rank_elements e = elements_per_rank(l, m);
    if (bucket) s.gradient_bucket = max(s.gradient_bucket, storage_bytes(gradient_dtype(t), e.total()));
    if (upcast) {
      const std::uint64_t shard =
          m.zero_stage >= 1 ? ceil_div(e.dense, dense_group) + ceil_div(e.expert, expert_group) : e.total();
      s.optimizer_temporaries += storage_bytes(p.master_weights, shard) * n;
    }
  }
  return s;
}
}  // namespace detail

/// Does any entry have layer structure (a kind other than `parameters`)?
constexpr bool has_layer_structure(const model_desc& model) {
  for (const layer_desc& l : model)
    if (l.kind != layer_kind::parameters) return true;
  return false;
}

/// The timeline of one rank of `stage`, with the per-entry activations computed once per plan
/// (`acts` null: no activations — a parameter-count model, or no sequence length).
constexpr timeline stage_timeline(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                  const device_desc& d, std::uint64_t stage, const activation_table* acts) {
  const stage_model_states s = model_states(model, t, m, stage);
  timeline tl{};
  breakdown base = s.device;
  base.reserve = d.reserve;
  for (breakdown& b : tl.at) b = base;
  // ZeRO's gathered layer and unsharded gradient: the largest on the stage for the whole phase,
  // or, with memalg's runtime and activations, each entry's own in its moment (activations.hpp).
  const bool per_entry = acts != nullptr && t.stack == stack_kind::memalg;
  const bool torch = t.stack == stack_kind::pytorch;
  bytes gathered = per_entry ? bytes{} : s.gathered_weights * (1 + m.zero3_prefetch);
  bytes gloo_held{};
  if (torch && m.zero_stage >= 3 && has_layer_structure(model)) {
    gathered = detail::fsdp_gathered(model, t, m, stage);
    if (d.host) gloo_held = detail::fsdp_gloo_held(model, t, m, stage);
  }
  breakdown& fwd = tl.at[static_cast<std::size_t>(phase::forward)];
  breakdown& bwd = tl.at[static_cast<std::size_t>(phase::backward)];
  fwd.temporaries += gathered;
  bwd.temporaries += gloo_held;
  if (t.grad_accum > 1) fwd.temporaries += gloo_held;  // (the previous micro-batch's clones)
  // (pytorch with activations: each entry's unsharded gradient in its own moment, activations.hpp)
  bwd.temporaries += gathered + (per_entry || (torch && acts != nullptr) ? bytes{} : s.gathered_gradient);
  if (torch) {
    // Gradients exist from backward on (the sweep adds them moment by moment) and until the
    // optimizer step has run (zero_grad(set_to_none=True)); a model without activations keeps
    // them for its backward.
    tl.at[static_cast<std::size_t>(phase::steady)].gradients = bytes{};
    if (acts != nullptr || t.grad_accum == 1) fwd.gradients = bytes{};  // accumulating: from the first backward on
    if (acts != nullptr) bwd.gradients = bytes{};
    // DDP (and ZeroRedundancyOptimizer over it): flat gradient buckets, resident.
    if (m.dp * m.cp > 1 && m.zero_stage <= 1)
      for (breakdown& b : tl.at) b.comm_buffers += s.device.gradients;
  }
  if (t.stack == stack_kind::megatron) {
    // (stacks/megatron.hpp: the cuBLAS workspaces, under expert parallelism the global buffer the
    // allgather dispatcher gathers into, and the MLA blocks' cached cos and sin, all kept by the
    // process)
    const activation_context c = activation_context_of(t, m);
    const bytes kept = detail::megatron_workspaces(model, d) + detail::megatron_global_buffer(model, c) +
                       detail::megatron_rope_cache(model, c, stage, m.pp);
    for (breakdown& b : tl.at) b.temporaries += kept;
  }
  tl.host = s.host;
  tl.parameters = s.parameters;
  if (acts != nullptr) {
    const stage_activations a = activations_on_stage(model, *acts, t, m, stage);
    fwd += a.forward;
    bwd += a.backward;
    tl.host.activations = a.host;
    tl.chunks_in_flight = a.chunks_in_flight;
    tl.activations_per_micro_batch = a.per_micro_batch;
  }
  if (has_layer_structure(model)) {
    const detail::step_transients st = detail::stage_step_transients(model, t, m, stage);
    if (!per_entry && !torch) bwd.comm_buffers += st.gradient_bucket;
    tl.at[static_cast<std::size_t>(phase::optimizer_step)].temporaries +=
        torch ? detail::torch_optimizer_temporaries(model, t, m, stage) : st.optimizer_temporaries;
  }
  return tl;
}

/// Activations exist only with layer structure and a sequence length; a parameter-count model
/// skips their algebra entirely (which keeps compile-time searches over such models cheap).
constexpr bool has_activations(const model_desc& model, const training_desc& t) {
  return t.sequence != 0 && has_layer_structure(model);
}

constexpr timeline stage_timeline(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                  const device_desc& d, std::uint64_t stage) {
  if (!has_activations(model, t)) return stage_timeline(model, t, m, d, stage, nullptr);
  const activation_table acts = activation_table_of(model, activation_context_of(t, m, d));
  return stage_timeline(model, t, m, d, stage, &acts);
}

}  // namespace memalg

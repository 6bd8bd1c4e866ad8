// SPDX-License-Identifier: BSL-1.0
// memalg/plan/evaluate.hpp — the whole plan as one constexpr function of four literals.
//
// `evaluate(model, training, mesh, device)` is what `plan<>` computes at compile time and what the
// command-line tool computes at run time: the same function, so the two can never disagree.
// It validates the configuration (`plan_error`), evaluates the timeline of the pipeline stages
// that can be the most loaded — the first and the last; every stage in between holds at most what
// the first holds (see detail::candidate_stages) — and reports the most loaded one. Per-entry
// activations are computed once per plan.
#pragma once

#include <array>
#include <cstddef>
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

namespace detail {
constexpr bool has_attention(const layer_desc& l) {
  return l.kind == layer_kind::attention || l.kind == layer_kind::transformer_block;
}
constexpr bool has_ffn(const layer_desc& l) {
  return l.kind == layer_kind::mlp || l.kind == layer_kind::gated_mlp || l.kind == layer_kind::moe ||
         l.kind == layer_kind::transformer_block;
}
constexpr bool has_experts(const layer_desc& l) {
  return l.kind == layer_kind::moe ||
         (l.kind == layer_kind::transformer_block && (l.shape.flags & layer_flags::moe) != 0);
}
constexpr bool zero_dimension(const layer_desc& l) {
  const layer_shape& s = l.shape;
  switch (l.kind) {
    case layer_kind::linear: return s.in == 0 || s.out == 0;
    case layer_kind::conv1d: return s.in == 0 || s.out == 0 || s.kernel == 0;
    case layer_kind::embedding:
    case layer_kind::output: return s.vocab == 0 || s.hidden == 0;
    case layer_kind::position_embedding: return s.positions == 0 || s.hidden == 0;
    case layer_kind::layernorm:
    case layer_kind::rmsnorm:
    case layer_kind::dropout: return s.hidden == 0;
    case layer_kind::attention: return s.hidden == 0 || s.heads == 0 || s.kv_heads == 0 || s.head_dim == 0;
    case layer_kind::mlp:
    case layer_kind::gated_mlp: return s.hidden == 0 || s.ffn == 0;
    case layer_kind::moe: return s.hidden == 0 || s.ffn == 0 || s.experts == 0 || s.top_k == 0;
    case layer_kind::transformer_block:
      return s.hidden == 0 || s.heads == 0 || s.kv_heads == 0 || s.head_dim == 0 || s.ffn == 0 ||
             (has_experts(l) && (s.experts == 0 || s.top_k == 0));
    default: return false;
  }
}
/// Shape checks, in order of importance: a zero dimension, then what tensor, expert and context
/// parallelism need to divide (Megatron-LM asserts the same divisibility), then the sequence.
constexpr plan_issue layer_issue(const model_desc& model, const training_desc& t, const mesh_desc& m) {
  for (const layer_desc& l : model)
    if (zero_dimension(l)) return plan_issue::zero_dimension;
  for (const layer_desc& l : model) {
    if (has_attention(l) && l.shape.heads % l.shape.kv_heads != 0) return plan_issue::kv_heads_do_not_divide_heads;
    if (has_experts(l) && l.shape.top_k > l.shape.experts) return plan_issue::top_k_exceeds_experts;
  }
  for (const layer_desc& l : model)
    if (has_attention(l) && l.shape.heads % m.tp != 0) return plan_issue::tp_does_not_divide_heads;
  for (const layer_desc& l : model)
    if (has_attention(l) && l.shape.kv_heads % m.tp != 0) return plan_issue::tp_does_not_divide_kv_heads;
  for (const layer_desc& l : model)
    if (has_ffn(l) && l.shape.ffn % m.tp != 0) return plan_issue::tp_does_not_divide_ffn;
  for (const layer_desc& l : model)
    if ((l.kind == layer_kind::embedding || l.kind == layer_kind::output) && l.shape.vocab % m.tp != 0)
      return plan_issue::tp_does_not_divide_vocab;
  for (const layer_desc& l : model)
    if (has_experts(l) && l.shape.experts % m.ep != 0) return plan_issue::ep_does_not_divide_experts;
  if (t.sequence != 0)
    for (const layer_desc& l : model) {
      if (l.kind == layer_kind::parameters) continue;
      const std::uint64_t s = l.shape.sequence != 0 ? l.shape.sequence : t.sequence;
      if (l.kind == layer_kind::position_embedding && s > l.shape.positions)
        return plan_issue::sequence_exceeds_positions;
      if (s % m.cp != 0) return plan_issue::cp_does_not_divide_sequence;
      if (m.sequence_parallel && (s / m.cp) % m.tp != 0) return plan_issue::sp_does_not_divide_sequence;
    }
  return plan_issue::none;
}

/// Why the training stack cannot plan the model (one sentence), or empty: the megatron stack's
/// refusals (stacks/megatron.hpp, megatron_unmodelled); a Sinkhorn router, which only Megatron
/// has, under the pytorch stack, whose routers are Hugging Face's.
constexpr std::string_view stack_unmodelled(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                            const device_desc& d) {
  if (t.stack == stack_kind::megatron) return megatron_unmodelled(model, m, d);
  if (t.stack == stack_kind::pytorch)
    for (const layer_desc& l : model) {
      if (l.shape.router_sinkhorn)
        return "a Sinkhorn router is Megatron's (plan it with --stack megatron); the pytorch stack follows Hugging "
               "Face's routers";
      if (l.shape.moe_alltoall)
        return "the all-to-all token dispatcher is Megatron's (plan it with --stack megatron); transformers' expert "
               "parallelism has none";
    }
  return {};
}
}  // namespace detail

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
  if (const plan_issue i = detail::layer_issue(model, t, m); i != plan_issue::none) return i;
  const std::uint64_t repeated = model.repeated_layers();
  if (m.pp > 1 && repeated != 0 && m.pp * m.virtual_stages > repeated) return plan_issue::pipeline_deeper_than_layers;
  if (!detail::stack_unmodelled(model, t, m, d).empty()) return plan_issue::stack_does_not_model;
  return plan_issue::none;
}

/// The sentence for the command-line tool: the mesh's own reason when the mesh is at fault.
constexpr std::string_view plan_error(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                      const device_desc& d) {
  if (const std::string_view e = mesh_error(m); !e.empty()) return e;
  if (const std::string_view e = device_error(d); !e.empty()) return e;
  const plan_issue i = find_plan_issue(model, t, m, d);
  if (i == plan_issue::stack_does_not_model) return detail::stack_unmodelled(model, t, m, d);
  return describe(i);
}

namespace detail {
/// The pipeline stages that can be the most loaded: the first and the last. Every stage i in
/// between holds at most what stage 0 holds, in every phase: no more instances of any repeated
/// entry (earlier stages take the remainder of an uneven split), no more micro-batches in flight
/// (1F1B p − i, interleaved decreasing in i, GPipe equal), and a subset of stage 0's entries
/// (stage 0 adds the first-stage ones).
struct candidate_stages {
  std::uint64_t at[2] = {0, 0};
  std::size_t count = 1;
  constexpr explicit candidate_stages(const mesh_desc& m) {
    if (m.pp > 1) {
      at[1] = m.pp - 1;
      count = 2;
    }
  }
};

constexpr plan_result evaluate_stages(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                      const device_desc& d, const activation_table* acts) {
  plan_result r{};
  r.parameters = model.parameters();
  r.limit = d.limit();
  r.usable = d.usable();
  const candidate_stages stages(m);
  for (std::size_t i = 0; i < stages.count; ++i) {
    const std::uint64_t stage = stages.at[i];
    const timeline tl = stage_timeline(model, t, m, d, stage, acts);
    if (i == 0 || tl.peak().total() > r.per_rank.total()) {  // ties keep stage 0
      r.most_loaded_stage = stage;
      r.most_loaded = tl;
      r.per_rank = tl.peak();
      r.host_per_rank = tl.host;
      r.peak_phase = tl.peak_phase();
    }
  }
  r.fits = r.per_rank.total() <= r.limit;
  return r;
}
}  // namespace detail

/// The peak of the most loaded rank, `evaluate(model, t, m, d).peak()`, without the rest of the
/// plan: what a search ranks configurations by (plan/search.hpp), from the same stage timelines.
constexpr bytes peak_bytes(const model_desc& model, const training_desc& t, const mesh_desc& m, const device_desc& d) {
  const bool activations = has_activations(model, t);
  const activation_table acts =
      activations ? activation_table_of(model, activation_context_of(t, m, d)) : activation_table{};
  const detail::candidate_stages stages(m);
  bytes peak{};
  for (std::size_t i = 0; i < stages.count; ++i) {
    const timeline tl = stage_timeline(model, t, m, d, stages.at[i], activations ? &acts : nullptr);
    for (const breakdown& moment : tl.at) peak = max(peak, moment.total());
  }
  return peak;
}

/// The plan of one pipeline stage's ranks instead of the most loaded one (Megatron-LM logs the
/// last stage; a user may ask for any).
constexpr plan_result evaluate_stage(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                     const device_desc& d, std::uint64_t stage) {
  plan_result r{};
  r.parameters = model.parameters();
  r.limit = d.limit();
  r.usable = d.usable();
  r.most_loaded_stage = stage;
  r.most_loaded = stage_timeline(model, t, m, d, stage);
  r.per_rank = r.most_loaded.peak();
  r.host_per_rank = r.most_loaded.host;
  r.peak_phase = r.most_loaded.peak_phase();
  r.fits = r.per_rank.total() <= r.limit;
  return r;
}

constexpr plan_result evaluate(const model_desc& model, const training_desc& t, const mesh_desc& m,
                               const device_desc& d) {
  if (!has_activations(model, t)) return detail::evaluate_stages(model, t, m, d, nullptr);
  const activation_table acts = activation_table_of(model, activation_context_of(t, m, d));
  return detail::evaluate_stages(model, t, m, d, &acts);
}

}  // namespace memalg

// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/plan.hpp — from a compile-time plan to what a runtime needs to run it, host side
// and backend-neutral.
//
// `runtime_gpt<Config>` is the model the runtimes train, as a model type: the decoder-only
// `transformer_lm` of Config (model/transformer.hpp) as the planner builds it — under tensor
// parallelism the token embedding and the tied output layer are vocabulary-parallel (Megatron's
// layout: the step program's vocabulary-parallel embedding and cross-entropy), the position
// embedding replicated. `runtime_gpt_replicated<Config>` keeps the embeddings and the tied output
// replicated (the named plan `tp2-replicated`, examples/gpt_plans.hpp). A plan over
// either describes exactly what its runtime allocates.
//
// The rules say which plans a runtime implements (find_runtime_issue, find_cpu_runtime_issue; the
// sentences are exec/runtime_issues.hpp's); gpt_config_of is the trainer's configuration of a plan
// and planned_arena its arena: the persistent region at the plan's model states, the stacks at the
// plan's peak less those and the reserve. `gpt_run<Plan, Comm>`, the CPU trainer a plan
// instantiates, binds these to the CPU step backend in backend/cpu/gpt_run.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "memalg/exec/gpt/config.hpp"
#include "memalg/exec/program.hpp"
#include "memalg/exec/gpt/read_model.hpp"
#include "memalg/exec/runtime_issues.hpp"
#include "memalg/model/transformer.hpp"
#include "memalg/plan/plan.hpp"

namespace memalg::exec {

/// The CPU runtime's GPT as a model descriptor: transformer_lm, vocabulary-parallel under tensor
/// parallelism (the planner's default).
constexpr model_desc runtime_gpt_model(const lm_config& c) { return transformer_lm(c); }

/// The fixed trainers' GPT: transformer_lm with replicated embeddings and tied output (their
/// cross-entropy is not distributed).
constexpr model_desc runtime_gpt_replicated_model(const lm_config& c) {
  model_desc m = transformer_lm(c);
  for (std::size_t i = 0; i < m.size; ++i) {
    layer_desc& l = m.entries[i];
    if (l.kind == layer_kind::embedding || l.kind == layer_kind::position_embedding)
      l.tp_replicated_params = l.params;
    if (l.kind == layer_kind::output) l.shape.flags |= layer_flags::vocab_replicated;
  }
  return m;
}

template <class Config>
struct runtime_gpt {
  static constexpr lm_config config = Config::value;
  static constexpr model_desc value = runtime_gpt_model(config);
};
template <class Config>
struct runtime_gpt_replicated {
  static constexpr lm_config config = Config::value;
  static constexpr model_desc value = runtime_gpt_replicated_model(config);
};

/// Whether a model's output layer (and so its tied embedding) is vocabulary-parallel under tp.
constexpr bool vocab_parallel_output(const model_desc& m) {
  for (std::size_t i = 0; i < m.size; ++i)
    if (m.entries[i].kind == layer_kind::output) return (m.entries[i].shape.flags & layer_flags::vocab_replicated) == 0;
  return false;
}

/// The first reason the CPU runtime cannot run a configuration (runtime_issue::none if it can).
constexpr runtime_issue find_runtime_issue(const lm_config& c, const training_desc& t, const mesh_desc& m) {
  const precision_policy& p = t.precision;
  const bool fp32 = p.weights == dtypes::fp32 && p.gradients == dtypes::fp32 && p.master_weights.is_none();
  const bool half = (p.weights == dtypes::bf16 || p.weights == dtypes::fp16) && p.gradients == p.weights &&
                    p.master_weights == dtypes::fp32;
  if (!fp32 && !half) return runtime_issue::precision;
  if (!(p.activations == p.weights)) return runtime_issue::activations;
  if (!(t.optimizer.state_dtype.is_none() || t.optimizer.state_dtype == dtypes::fp32) ||
      !(p.optimizer_states == dtypes::fp32) || t.optimizer.quant_block != 0)
    return runtime_issue::states;
  switch (t.optimizer.kind) {
    case optimizer_kind::sgd:
    case optimizer_kind::momentum:
    case optimizer_kind::adam:
    case optimizer_kind::adamw: break;
    default: return runtime_issue::optimizer;
  }
  if (!t.fused_optimizer) return runtime_issue::unfused;
  if (c.rms_norm || c.gated || !c.bias || !c.tied || c.positions == 0 || c.experts != 0 || c.parallel_residual ||
      c.shared_norm || c.qk_norm || c.sandwich_norms)
    return runtime_issue::architecture;
  if ((c.kv_heads != 0 && c.kv_heads != c.heads) || (c.head_dim != 0 && c.head_dim * c.heads != c.hidden))
    return runtime_issue::heads;
  const dtype logits = c.logits.is_none() ? dtypes::fp32 : c.logits;
  if (!(logits == p.weights)) return runtime_issue::logits;
  if (c.dropout_permille != 0 && !c.flash) return runtime_issue::dropout;
  if (m.pp != 1 || m.cp != 1 || m.ep != 1 || m.sequence_parallel || m.offload != offload_kind::none)
    return runtime_issue::mesh;
  if (m.zero_stage == 3 && m.zero3_prefetch != 0) return runtime_issue::prefetch;
  if (t.offload_activations) return runtime_issue::offload;
  return runtime_issue::none;
}

/// Whether a configuration computes as Gemma 2 does anywhere (lm_config's Gemma 2 fields).
constexpr bool gemma2_arithmetic(const lm_config& c) {
  return c.geglu || c.embed_scale || c.attn_softcap != 0 || c.final_softcap != 0 || c.sliding_window != 0 ||
         c.query_scalar != 0;
}

/// Whether a configuration leaves GPT-2's block (the step program's variants: RMSNorm, SwiGLU, no
/// biases, untied output, rotary positions, grouped-query attention, another head width, parallel
/// residual and a shared norm).
constexpr bool llama_style(const lm_config& c) {
  return c.rms_norm || c.gated || !c.bias || !c.tied || c.positions == 0 || (c.kv_heads != 0 && c.kv_heads != c.heads) ||
         (c.head_dim != 0 && c.head_dim * c.heads != c.hidden) || c.parallel_residual || c.shared_norm || c.qk_norm ||
         c.sandwich_norms || gemma2_arithmetic(c);
}

/// The first reason the CPU runtime (the step program on the CPU step backend) cannot run a
/// configuration (and, but for precision and head width, the CUDA runtime: find_cuda_runtime_issue).
/// GPT-2-style models: find_runtime_issue's rule.
/// Llama-style ones (llama_style): the same rule on the GPT-2 block of their shape (fp32,
/// mixed-bf16 or amp-fp16, on any data- and tensor-parallel mesh it allows), flash attention when
/// the key/value heads are fewer than the heads, rotary positions over an even number of each head's dimensions
/// (positions == 0; rotary_dim 0 for all, else even and at most the head width), parallel residual
/// (GPT-NeoX, GPT-J, Falcon) and a shared norm (Falcon-7B: parallel residual only), no mixture of
/// experts. Under tensor parallelism the vocabulary divides by tp
/// (the vocabulary-parallel embedding), and sequence parallelism (the step program's: GPT-2-style
/// fp32 plans) takes no selective recomputation.
constexpr runtime_issue find_cpu_runtime_issue(const lm_config& c, const training_desc& t, const mesh_desc& m);


/// Pipeline plans (pp > 1) on the CPU runtime: the rest of the rule on the same plan without the
/// pipeline, and then the stage program's
/// limits (exec/gpt/build_program.hpp). The output layer is
/// untied: the planner's stages hold no copy of a tied token embedding on the last stage (nor
/// Megatron's embedding-group all-reduce), so a tied model would not be what the plan counts.
constexpr runtime_issue find_cpu_pipeline_issue(const lm_config& c, const training_desc& t, const mesh_desc& m) {
  mesh_desc one = m;
  one.pp = 1;
  one.world = m.world / m.pp;
  one.schedule = pipeline_schedule::one_f_one_b;
  one.virtual_stages = 1;
  lm_config g = c;
  g.tied = true;  // judged as the GPT-2 block of the same shape
  const runtime_issue rest = find_cpu_runtime_issue(g, t, one);
  if (rest != runtime_issue::none) return rest;
  const precision_policy& p = t.precision;
  const bool fp32 = p.weights == dtypes::fp32 && p.gradients == dtypes::fp32 && p.master_weights.is_none();
  // (Under tensor parallelism the runtime replicates the output layer, which the planner does for
  // a tied one only: runtime_gpt_model.)
  if (!fp32 || c.tied || m.tp > 1 || m.schedule != pipeline_schedule::one_f_one_b || m.virtual_stages != 1 || m.zero_stage > 1 ||
      (t.recompute != recompute_kind::none && t.recompute != recompute_kind::selective))
    return runtime_issue::pipeline;
  return runtime_issue::none;
}

constexpr runtime_issue find_cpu_runtime_issue(const lm_config& c, const training_desc& t, const mesh_desc& m) {
  if (m.pp > 1) return find_cpu_pipeline_issue(c, t, m);
  const precision_policy& p = t.precision;
  const bool fp32 = p.weights == dtypes::fp32 && p.gradients == dtypes::fp32 && p.master_weights.is_none();
  if (!llama_style(c)) {
    mesh_desc without_sp = m;  // the step program implements it; find_runtime_issue (the shared rule) does not
    without_sp.sequence_parallel = false;
    const runtime_issue rest = find_runtime_issue(c, t, without_sp);
    if (rest != runtime_issue::none) return rest;
    if (m.tp > 1 && c.vocab % m.tp != 0) return runtime_issue::vocab;
    if (m.sequence_parallel && (t.recompute == recompute_kind::selective || !fp32)) return runtime_issue::sequence_parallel;
    return runtime_issue::none;
  }
  if (m.sequence_parallel) return runtime_issue::sequence_parallel;
  if (m.tp > 1 && c.vocab % m.tp != 0) return runtime_issue::vocab;
  lm_config g = c;  // the rest of the rule on the GPT-2 block of the same shape
  g.rms_norm = false;
  g.gated = false;
  g.bias = true;
  g.tied = true;
  g.positions = g.positions != 0 ? g.positions : 1;
  g.kv_heads = 0;
  g.head_dim = 0;
  g.parallel_residual = false;
  g.shared_norm = false;
  g.qk_norm = false;
  g.sandwich_norms = false;
  g.geglu = g.embed_scale = false;
  g.attn_softcap = g.final_softcap = g.query_scalar = 0;
  g.sliding_window = 0;
  const runtime_issue rest = find_runtime_issue(g, t, m);
  if (rest != runtime_issue::none) return rest;
  if (c.experts != 0 || (c.shared_norm && !c.parallel_residual) || (c.qk_norm && !c.rms_norm) ||
      (c.sandwich_norms && (!c.rms_norm || c.parallel_residual || c.dropout_permille != 0)) || (c.geglu && !c.gated) ||
      c.attn_softcap < 0 || c.final_softcap < 0 || c.query_scalar < 0 ||
      (c.final_softcap != 0 && m.tp > 1))
    return runtime_issue::architecture;
  const std::uint64_t D = c.head_dim != 0 ? c.head_dim : (c.heads != 0 ? c.hidden / c.heads : 0);
  if (c.positions == 0 && (D % 2 != 0 || c.rotary_dim % 2 != 0 || c.rotary_dim > D)) return runtime_issue::architecture;
  const std::uint64_t kv = c.kv_heads != 0 ? c.kv_heads : c.heads;
  if (D == 0 || kv == 0 || c.heads % kv != 0 || (c.head_dim == 0 && c.hidden % c.heads != 0)) return runtime_issue::heads;
  if (kv != c.heads && !c.flash) return runtime_issue::heads;  // the plan's naive attention expands K/V to the heads
  return runtime_issue::none;
}

namespace detail {
/// The lm_config of a plan's model type: any model whose layer descriptors describe a decoder-only
/// language model (exec/gpt/read_model.hpp: transformer_lm of a config, a preset, the HF import, a
/// model::sequential of layer types), read off the descriptors; runtime_gpt and
/// runtime_gpt_replicated name their config directly (the same fields: tests/host/test_read_model.cpp).
template <class M>
struct config_of {
  static constexpr lm_reading reading = read_decoder_lm(M::value);
  static_assert(runtime_check<reading.ok() ? runtime_issue::none : runtime_issue::model>::value,
                "gpt_run: the plan's model is not a decoder-only language model");
  static constexpr lm_config value = reading.config;
};
template <class C>
struct config_of<runtime_gpt<C>> {
  static constexpr lm_config value = C::value;
};
template <class C>
struct config_of<runtime_gpt_replicated<C>> {
  static constexpr lm_config value = C::value;
};

}  // namespace detail

/// Both runtimes' limit on chunked losses: only on a replicated output layer, without sequence
/// parallelism (the program chunks the unsharded head: exec/gpt/micro_batch.hpp).
template <class Plan>
constexpr runtime_issue find_chunked_loss_issue() {
  constexpr lm_config c = detail::config_of<typename Plan::model_type>::value;
  if (c.loss_chunk != 0 && Plan::mesh.tp > 1 &&
      (Plan::mesh.sequence_parallel || vocab_parallel_output(Plan::model_type::value)))
    return runtime_issue::chunked;
  return runtime_issue::none;
}

/// A runtime's rule for a plan: `rule` (find_cpu_runtime_issue, find_cuda_runtime_issue) on its
/// model, recipe and mesh, then find_chunked_loss_issue.
template <class Plan>
constexpr runtime_issue find_plan_issue(runtime_issue (*rule)(const lm_config&, const training_desc&, const mesh_desc&)) {
  const runtime_issue i = rule(detail::config_of<typename Plan::model_type>::value, Plan::training, Plan::mesh);
  return i != runtime_issue::none ? i : find_chunked_loss_issue<Plan>();
}

/// The CPU runtime's rule for a plan.
template <class Plan>
constexpr runtime_issue find_cpu_plan_issue() {
  return find_plan_issue<Plan>(&find_cpu_runtime_issue);
}

/// The trainer's runtime configuration for a plan over runtime_gpt<Config>.
template <class Plan>
constexpr gpt_config gpt_config_of(const lm_config& c) {
  constexpr training_desc t = Plan::training;
  constexpr mesh_desc m = Plan::mesh;
  gpt_config g{};
  g.vocab = c.vocab;
  g.positions = c.positions;
  g.hidden = c.hidden;
  g.layers = c.layers;
  g.heads = c.heads;
  g.ffn = c.ffn != 0 ? c.ffn : 4 * c.hidden;
  g.flash = c.flash;
  g.dropout = static_cast<float>(c.dropout_permille) / 1000.0f;
  g.micro_batch = t.micro_batch;
  g.sequence = t.sequence;
  g.grad_accum = t.grad_accum;
  g.recompute = t.recompute;
  g.kv_heads = c.kv_heads != 0 ? c.kv_heads : c.heads;
  g.head_dim = c.head_dim != 0 ? c.head_dim : (c.heads != 0 ? c.hidden / c.heads : 0);
  g.rms_norm = c.rms_norm;
  g.norm_eps = c.norm_eps;
  g.gated = c.gated;
  g.bias = c.bias;
  g.qkv_bias = c.qkv_bias && !c.bias;
  g.qk_norm = c.qk_norm;
  g.sandwich_norms = c.sandwich_norms;
  g.geglu = c.geglu;
  g.embed_scale = c.embed_scale;
  g.attn_softcap = static_cast<float>(c.attn_softcap);
  g.final_softcap = static_cast<float>(c.final_softcap);
  g.sliding_window = c.sliding_window;
  g.query_scalar = static_cast<float>(c.query_scalar);
  g.rotary_dim = c.positions == 0 && c.rotary_dim != 0 ? c.rotary_dim : 0;
  g.loss_chunk = c.loss_chunk;
  g.tied = c.tied;
  g.parallel_residual = c.parallel_residual;
  g.shared_norm = c.shared_norm;
  g.recompute_every = t.recompute_every != 0 ? t.recompute_every : 1;
  g.dp = m.dp;
  g.tp = m.tp;
  g.pp = m.pp;
  g.zero_stage = m.zero_stage;
  g.vocab_parallel = m.tp > 1 && vocab_parallel_output(Plan::model_type::value);
  g.sequence_parallel = m.sequence_parallel;
  g.master_weights = !t.precision.master_weights.is_none();
  g.loss_scaling = t.precision.weights == dtypes::fp16;
  g.optimizer = t.optimizer.kind;
  // The step's hyper-parameters are not the plan's (they change no memory): the runtime's
  // defaults here; the training binaries set them from their flags (with_hparams).
  g = with_hparams(g, optimizer_hparams{});
  return g;
}

/// Arena sizes the plan predicts for its most loaded rank.
template <class Plan>
constexpr arena_sizes planned_arena() {
  constexpr breakdown peak = Plan::result.per_rank;
  constexpr breakdown steady = Plan::result.most_loaded.at[0];
  const std::size_t persistent = steady.model_states().value;
  return {persistent, static_cast<std::size_t>((peak.total() - peak.reserve).value) - persistent};
}

/// Arena sizes the plan predicts for the ranks of pipeline stage `stage` (evaluate_stage: that
/// stage's timeline, not the most loaded one).
template <class Plan>
constexpr arena_sizes planned_stage_arena(std::uint64_t stage) {
  const plan_result r = evaluate_stage(Plan::model, Plan::training, Plan::mesh, Plan::device, stage);
  const breakdown peak = r.per_rank;
  const std::size_t persistent = r.most_loaded.at[0].model_states().value;
  return {persistent, static_cast<std::size_t>((peak.total() - peak.reserve).value) - persistent};
}

}  // namespace memalg::exec

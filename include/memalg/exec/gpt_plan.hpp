// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt_plan.hpp — from a compile-time plan to the CPU trainer that runs it.
//
// `runtime_gpt<Config>` is the model the CPU runtime trains, as a model type: the decoder-only
// `transformer_lm` of Config (model/transformer.hpp) with the runtime's one convention that the
// generic builder does not assume — under tensor parallelism the token and position embeddings
// and the tied output layer are replicated, not vocabulary-parallel (the reference cross-entropy
// is not distributed). A plan over that model describes exactly what the trainer allocates.
//
// `gpt_run<Plan, Comm>` cannot be instantiated for a plan that does not fit (require_fits prints
// the numbers) or that the CPU runtime does not implement (a sentence says what). It allocates
// the arena at the plan's size: the persistent region at the plan's model states, the stacks at
// the plan's peak less those and the reserve. Its `trainer` runs the plan's step program on the
// CPU step backend (exec/program_trainer.hpp over backend/cpu/step_backend.hpp); `reference_trainer`
// is the fixed gpt_trainer the program is checked against bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "memalg/backend/cpu/step_backend.hpp"
#include "memalg/exec/gpt_trainer.hpp"
#include "memalg/exec/program_trainer.hpp"
#include "memalg/model/transformer.hpp"
#include "memalg/plan/plan.hpp"

namespace memalg::exec {

/// The CPU runtime's GPT as a model descriptor: transformer_lm with replicated embeddings.
constexpr model_desc runtime_gpt_model(const lm_config& c) {
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

/// Why a runtime cannot run a configuration. One list for both trainers: the CPU one never reports
/// head_width, the CUDA one never multirank (exec/gpt_plan_cuda.hpp).
enum class runtime_issue : int {
  none = 0,
  precision,
  activations,
  states,
  optimizer,
  unfused,
  architecture,
  heads,
  chunked,
  logits,
  dropout,
  mesh,
  prefetch,
  multirank,
  offload,
  head_width,
};

constexpr std::string_view describe(runtime_issue i) {
  switch (i) {
    case runtime_issue::none: return {};
    case runtime_issue::precision: return "the CPU runtime implements fp32, amp-fp16 and mixed-bf16 (gradients in the weight dtype, fp32 master)";
    case runtime_issue::activations: return "the CPU runtime keeps activations in the weight dtype";
    case runtime_issue::states: return "the CPU runtime keeps optimizer states in fp32";
    case runtime_issue::optimizer: return "the CPU runtime implements sgd, momentum, adam and adamw";
    case runtime_issue::unfused: return "the CPU runtime's optimizer is fused: add train::fused_optimizer to the recipe";
    case runtime_issue::architecture: return "the CPU runtime trains GPT-2-style models (LayerNorm, GeLU MLP, biases, tied embeddings, learned positions) and, on one rank in fp32 or mixed-bf16, Llama-style variants (RMSNorm, SwiGLU, no biases, untied output, rotary positions over whole heads)";
    case runtime_issue::heads: return "the CPU runtime's GPT uses multi-head attention with head width hidden / heads (grouped-query attention and other head widths: Llama-style models with flash attention)";
    case runtime_issue::chunked: return "the CPU runtime computes the loss unchunked";
    case runtime_issue::logits: return "the CPU runtime keeps logits in the weight dtype: set lm_config::logits";
    case runtime_issue::dropout: return "dropout needs flash attention in the CPU runtime (its naive attention has no probability dropout)";
    case runtime_issue::mesh: return "the CPU runtime implements data parallelism with ZeRO and tensor parallelism only";
    case runtime_issue::prefetch: return "the CPU runtime gathers one layer at a time under ZeRO-3: use zero<3, 0>";
    case runtime_issue::multirank: return "multi-rank runs reduce in fp32: use the fp32 policy with dp or tp above 1";
    case runtime_issue::offload: return "the CPU runtime keeps activations in its arena";
    case runtime_issue::head_width: return "the CPU runtime takes any head width";  // never reported
  }
  return "unknown";
}

namespace detail {
/// Instantiated with the issue; only the matching assertion fires, with the sentence.
template <runtime_issue I>
struct runtime_check {
  static_assert(I != runtime_issue::precision, "gpt_run: the CPU runtime implements fp32, amp-fp16 and mixed-bf16 (gradients in the weight dtype, fp32 master)");
  static_assert(I != runtime_issue::activations, "gpt_run: the CPU runtime keeps activations in the weight dtype");
  static_assert(I != runtime_issue::states, "gpt_run: the CPU runtime keeps optimizer states in fp32");
  static_assert(I != runtime_issue::optimizer, "gpt_run: the CPU runtime implements sgd, momentum, adam and adamw");
  static_assert(I != runtime_issue::unfused, "gpt_run: the CPU runtime's optimizer is fused: add train::fused_optimizer to the recipe");
  static_assert(I != runtime_issue::architecture, "gpt_run: the CPU runtime trains GPT-2-style models (LayerNorm, GeLU MLP, biases, tied embeddings, learned positions) and, on one rank in fp32 or mixed-bf16, Llama-style variants (RMSNorm, SwiGLU, no biases, untied output, rotary positions over whole heads)");
  static_assert(I != runtime_issue::heads, "gpt_run: the CPU runtime's GPT uses multi-head attention with head width hidden / heads (grouped-query attention and other head widths: Llama-style models with flash attention)");
  static_assert(I != runtime_issue::chunked, "gpt_run: the CPU runtime computes the loss unchunked");
  static_assert(I != runtime_issue::logits, "gpt_run: the CPU runtime keeps logits in the weight dtype: set lm_config::logits");
  static_assert(I != runtime_issue::dropout, "gpt_run: dropout needs flash attention in the CPU runtime (its naive attention has no probability dropout)");
  static_assert(I != runtime_issue::mesh, "gpt_run: the CPU runtime implements data parallelism with ZeRO and tensor parallelism only");
  static_assert(I != runtime_issue::prefetch, "gpt_run: the CPU runtime gathers one layer at a time under ZeRO-3: use zero<3, 0>");
  static_assert(I != runtime_issue::multirank, "gpt_run: multi-rank runs reduce in fp32: use the fp32 policy with dp or tp above 1");
  static_assert(I != runtime_issue::offload, "gpt_run: the CPU runtime keeps activations in its arena");
  static constexpr bool value = I == runtime_issue::none;
};
}  // namespace detail

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
  if (c.rms_norm || c.gated || !c.bias || !c.tied || c.positions == 0 || c.experts != 0) return runtime_issue::architecture;
  if ((c.kv_heads != 0 && c.kv_heads != c.heads) || (c.head_dim != 0 && c.head_dim * c.heads != c.hidden))
    return runtime_issue::heads;
  if (c.loss_chunk != 0) return runtime_issue::chunked;
  const dtype logits = c.logits.is_none() ? dtypes::fp32 : c.logits;
  if (!(logits == p.weights)) return runtime_issue::logits;
  if (c.dropout_permille != 0 && !c.flash) return runtime_issue::dropout;
  if (m.pp != 1 || m.cp != 1 || m.ep != 1 || m.sequence_parallel || m.offload != offload_kind::none)
    return runtime_issue::mesh;
  if (m.zero_stage == 3 && m.zero3_prefetch != 0) return runtime_issue::prefetch;
  if ((m.tp > 1 || m.dp > 1) && !fp32) return runtime_issue::multirank;
  if (t.offload_activations) return runtime_issue::offload;
  return runtime_issue::none;
}

/// Whether a configuration leaves GPT-2's block (the step program's variants: RMSNorm, SwiGLU, no
/// biases, untied output, rotary positions, grouped-query attention, another head width).
constexpr bool llama_style(const lm_config& c) {
  return c.rms_norm || c.gated || !c.bias || !c.tied || c.positions == 0 || (c.kv_heads != 0 && c.kv_heads != c.heads) ||
         (c.head_dim != 0 && c.head_dim * c.heads != c.hidden);
}

/// The first reason the CPU runtime (the step program on the CPU step backend) cannot run a
/// configuration. GPT-2-style models: find_runtime_issue's rule, which the CUDA runtime shares.
/// Llama-style ones (llama_style) on top: fp32 or mixed-bf16 (bf16 weights, gradients,
/// activations and logits, fp32 master and states) on one rank, flash attention when the key/value
/// heads are fewer than the heads, rotary positions over whole heads (positions == 0, rotary_dim 0
/// or the head width), no mixture of experts, parallel residual or shared norm.
constexpr runtime_issue find_cpu_runtime_issue(const lm_config& c, const training_desc& t, const mesh_desc& m) {
  if (!llama_style(c)) return find_runtime_issue(c, t, m);
  lm_config g = c;  // the rest of the rule on the GPT-2 block of the same shape
  g.rms_norm = false;
  g.gated = false;
  g.bias = true;
  g.tied = true;
  g.positions = g.positions != 0 ? g.positions : 1;
  g.kv_heads = 0;
  g.head_dim = 0;
  const runtime_issue rest = find_runtime_issue(g, t, m);
  if (rest != runtime_issue::none && rest != runtime_issue::multirank) return rest;
  if (c.experts != 0 || c.parallel_residual || c.shared_norm) return runtime_issue::architecture;
  const std::uint64_t D = c.head_dim != 0 ? c.head_dim : (c.heads != 0 ? c.hidden / c.heads : 0);
  if (c.positions == 0 && (D % 2 != 0 || (c.rotary_dim != 0 && c.rotary_dim != D))) return runtime_issue::architecture;
  const std::uint64_t kv = c.kv_heads != 0 ? c.kv_heads : c.heads;
  if (D == 0 || kv == 0 || c.heads % kv != 0 || (c.head_dim == 0 && c.hidden % c.heads != 0)) return runtime_issue::heads;
  if (kv != c.heads && !c.flash) return runtime_issue::heads;  // the plan's naive attention expands K/V to the heads
  const precision_policy& p = t.precision;
  if (!(p.weights == dtypes::fp32 || p.weights == dtypes::bf16) || m.dp != 1 || m.tp != 1)
    return runtime_issue::architecture;  // fp16 (loss scaling) and multi-rank runs are GPT-2-only
  return runtime_issue::none;
}

namespace detail {
/// The lm_config of a runtime_gpt model type.
template <class M>
struct config_of;
template <class C>
struct config_of<runtime_gpt<C>> {
  static constexpr lm_config value = C::value;
};

template <class Plan>
struct storage_of {
  using type = float;
};
template <class Plan>
  requires(Plan::training.precision.weights == dtypes::bf16)
struct storage_of<Plan> {
  using type = bf16;
};
template <class Plan>
  requires(Plan::training.precision.weights == dtypes::fp16)
struct storage_of<Plan> {
  using type = fp16;
};
}  // namespace detail

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
  g.gated = c.gated;
  g.bias = c.bias;
  g.tied = c.tied;
  g.recompute_every = t.recompute_every != 0 ? t.recompute_every : 1;
  g.dp = m.dp;
  g.tp = m.tp;
  g.zero_stage = m.zero_stage;
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

/// The trainer a plan instantiates; does not compile for a plan that does not fit or that the CPU
/// runtime does not implement.
template <class Plan, class Comm>
class gpt_run {
 public:
  using plan = Plan;
  using storage = typename detail::storage_of<Plan>::type;
  /// The step program of the plan on the CPU step backend (exec/program_trainer.hpp).
  using trainer = program_trainer<backend::cpu::step_backend<storage, Comm>>;
  /// The fixed CPU trainer the program is checked against, bit for bit (exec/gpt_trainer.hpp);
  /// GPT-2-style plans only (it ignores gpt_config's block variant: see llama_style).
  using reference_trainer = gpt_trainer<storage, Comm>;

  static constexpr lm_config model_config = detail::config_of<typename Plan::model_type>::value;
  static constexpr runtime_issue issue = find_cpu_runtime_issue(model_config, Plan::training, Plan::mesh);
  static_assert(detail::runtime_check<issue>::value, "gpt_run: the CPU runtime does not implement this plan");
  static_assert(require_fits<Plan>());

  static constexpr gpt_config config = gpt_config_of<Plan>(model_config);
  static constexpr arena_sizes arena = planned_arena<Plan>();
};

}  // namespace memalg::exec

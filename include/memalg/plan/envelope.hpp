// SPDX-License-Identifier: BSL-1.0
// memalg/plan/envelope.hpp — where each stack's predictions were checked against measurements of
// the real stack, and whether a configuration lies inside.
//
// A configuration is outside a stack's envelope when it has a categorical value (the model's
// family, the precision, the attention, the recomputation and its checkpoint kind, the optimizer
// and its implementation, a mesh axis's degree) that no measured case of that stack contains, or a
// numeric value (sequence, micro-batch, width, depth, gradient accumulation) outside the measured
// range, or a combination of values whose measured steps did not all settle (pytorch: FSDP2 with
// gradient accumulation) (docs/accuracy.md, "The envelope"). Outside, the
// prediction follows the same cited rules, but nothing measured confirms it. `require_fits` does
// not read the envelope.
//
// * pytorch: the cases of bench/torch/measured.json and bench/torch/measured/*.json (the planner's
//   test planner.measured derives this table from that data and fails when the two differ);
// * megatron: the Megatron-LM functional tests of bench/megatron/golden.json (checked the same way);
// * memalg: the named plans that memalg's runtime trains in CI, whose arenas equal their plans to
//   the byte (examples/train_gpt_cpu.cpp);
// * paper: Korthikanti et al.'s accounting, never validated.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "memalg/model/layer.hpp"
#include "memalg/parallel/mesh.hpp"
#include "memalg/train/recipe.hpp"

namespace memalg {

/// An inclusive range of measured values.
struct measured_range {
  std::uint64_t lo = 0, hi = 0;
  constexpr bool holds(std::uint64_t v) const { return lo <= v && v <= hi; }
};

/// The values a stack's measurements cover. An empty name list means the axis is not measured
/// by name (every value is outside).
struct stack_envelope {
  bool validated = false;
  std::array<std::string_view, 24> families{};     ///< Hugging Face model_type (pytorch)
  bool shapes = false;  ///< measured on model shapes (flags, presets: no Hugging Face family)
  std::array<std::string_view, 8> precisions{};    ///< precision_policy::name
  std::array<std::string_view, 2> attentions{};    ///< "naive", "flash"
  std::array<std::string_view, 8> recomputations{};  ///< none, selective, full, full-reentrant, every
  std::array<std::string_view, 8> optimizers{};    ///< optimizer name / implementation
  std::array<std::string_view, 8> fine_tunings{};  ///< fine_tuning_name: full, lora, qlora-nf4, ...
  std::array<std::string_view, 2> moe_kinds{};     ///< a mixture of experts' router and dispatcher: moe_name
  std::array<std::string_view, 4> qk_norms{};      ///< norms on the query and key: qk_norm_name
  measured_range sequence, micro_batch, hidden, layers, grad_accum;
  measured_range dp, tp, pp, cp, ep;
  std::array<int, 4> zero_stages{-1, -1, -1, -1};  ///< measured ZeRO / FSDP stages (-1: none)
  bool sequence_parallel = false;                   ///< measured with sequence parallelism
  /// Combinations of measured values whose measured steps did not all settle: the harness
  /// skipped a case holding one, with its reason (bench/torch/measured/), so the bound is not
  /// confirmed there. A ZeRO stage on more than one rank, a recomputation (empty: any) and
  /// gradient accumulation above 1; an empty name ends the list.
  struct combination {
    int zero_stage = -1;
    std::string_view recomputation{};
    std::string_view name{};
  };
  std::array<combination, 2> unsettled{};
  /// Families measured on one rank only (the hand-picked cases of the dense families of 2024,
  /// which no committed group of the generated matrix draws under DDP or FSDP2): with more than
  /// one rank they are outside.
  std::array<std::string_view, 16> one_rank_families{};
};

namespace detail {
template <std::size_t N>
constexpr bool listed(const std::array<std::string_view, N>& names, std::string_view v) {
  for (std::string_view n : names)
    if (!n.empty() && n == v) return true;
  return false;
}
}  // namespace detail

/// The recomputation as the envelope names it.
constexpr std::string_view recomputation_name(const training_desc& t) {
  switch (t.recompute) {
    case recompute_kind::none: return "none";
    case recompute_kind::selective: return "selective";
    case recompute_kind::full:
      return t.checkpoint == checkpoint_kind::reentrant && t.stack == stack_kind::pytorch ? "full-reentrant" : "full";
    case recompute_kind::every_k:
      return t.checkpoint == checkpoint_kind::reentrant && t.stack == stack_kind::pytorch ? "every-reentrant" : "every";
  }
  return "none";
}

/// The optimizer as the envelope names it: the name, and under the pytorch stack its
/// implementation (the temporaries differ).
constexpr std::string_view optimizer_envelope_name(const training_desc& t) {
  if (t.stack != stack_kind::pytorch) return t.optimizer.name;
  const std::string_view n = t.optimizer.name;
  if (n == "adamw" || n == "adam") {
    const bool adam = n == "adam";
    switch (t.optimizer_kind) {
      case optimizer_impl::foreach: return adam ? "adam/foreach" : "adamw/foreach";
      case optimizer_impl::for_loop: return adam ? "adam/for-loop" : "adamw/for-loop";
      case optimizer_impl::fused: return adam ? "adam/fused" : "adamw/fused";
    }
  }
  return n;
}

/// The measured envelope of each stack. Keep in step with the data (see the header).
constexpr stack_envelope envelope_of(stack_kind s) {
  stack_envelope e{};
  switch (s) {
    case stack_kind::pytorch:
      e.validated = true;
      e.families = {"gpt2", "llama", "mistral", "mixtral", "qwen2", "gpt_neox", "falcon", "qwen3", "olmo2",
                    "phi3", "starcoder2", "gpt_bigcode", "gemma2", "gemma3",
                    "qwen3_moe", "deepseek_v3", "gpt_oss", "llama4"};
      e.precisions = {"fp32", "bf16", "autocast-bf16"};
      e.attentions = {"naive", "flash"};
      e.recomputations = {"none", "full", "full-reentrant"};
      e.optimizers = {"adamw/foreach", "adamw/for-loop", "adamw/fused", "sgd", "momentum"};
      // (PEFT's LoRA and bitsandbytes' QLoRA: bench/torch/finetune.measured.json)
      e.fine_tunings = {"full", "lora", "qlora-nf4", "qlora-nf4-dq", "qlora-fp4", "frozen parts"};
      e.moe_kinds = {"softmax", "sigmoid"};  // Hugging Face's, as each family's modelling code routes
      e.qk_norms = {"per head", "whole projection", "l2"};  // Qwen3 and Gemma 3, OLMo 2, Llama 4
      e.sequence = {64, 2048};
      e.micro_batch = {1, 8};
      e.hidden = {256, 1024};
      e.layers = {1, 8};
      e.grad_accum = {1, 3};
      e.dp = {1, 2};
      e.tp = e.pp = e.cp = e.ep = {1, 1};
      e.zero_stages = {0, 3, -1, -1};  // DDP, FSDP2
      // FSDP2 over gloo with gradient accumulation: three of the twelve drawn cases (reentrant
      // checkpointing twice, none once) reached no steady state on the CPU, and a fourth only
      // without the profiler's data-flow checks (docs/accuracy.md, "The generated matrix").
      e.unsettled = {{{3, "", "fsdp2 + gradient accumulation"}}};
      e.one_rank_families = {"qwen3", "olmo2", "phi3", "starcoder2", "gpt_bigcode", "gemma2", "gemma3"};
      break;
    case stack_kind::megatron:
      e.validated = true;
      e.shapes = true;
      e.precisions = {"mixed-bf16-fp32-grads"};
      e.attentions = {"flash"};
      e.recomputations = {"none", "every"};
      e.optimizers = {"adam"};
      e.fine_tunings = {"full"};
      e.moe_kinds = {"sinkhorn"};
      e.sequence = {1024, 8192};
      e.micro_batch = {1, 4};
      e.hidden = {512, 4096};
      e.layers = {4, 32};
      e.grad_accum = {1, 4};
      e.dp = {2, 8};
      e.tp = {1, 4};
      e.pp = {1, 4};
      e.cp = e.ep = {1, 1};
      e.zero_stages = {0, 1, -1, -1};
      break;
    case stack_kind::memalg:
      e.validated = true;
      e.shapes = true;
      e.qk_norms = {"per head"};  // the named plans qwen3-*
      e.precisions = {"fp32", "mixed-bf16", "amp-fp16", "mixed-fp16"};
      e.attentions = {"naive", "flash"};
      e.recomputations = {"none", "selective", "full"};
      e.optimizers = {"adamw", "momentum", "sgd"};
      e.fine_tunings = {"full"};
      e.sequence = {16, 64};
      e.micro_batch = {1, 8};
      e.hidden = {32, 128};
      e.layers = {1, 4};
      e.grad_accum = {1, 4};
      e.dp = {1, 4};
      e.tp = {1, 2};
      e.pp = {1, 4};
      e.cp = e.ep = {1, 1};
      e.zero_stages = {0, 1, 2, 3};
      e.sequence_parallel = true;
      break;
    case stack_kind::paper:
      break;  // never validated
  }
  return e;
}

/// Where a configuration leaves its stack's envelope: up to `max_outside` reasons, each an axis
/// and its value ("family: gemma2", "ep: 4", "sequence: 8192 (measured 64..2048)").
struct envelope_check {
  static constexpr std::size_t max_outside = 16;
  bool validated = false;
  std::array<std::string_view, max_outside> axes{};   ///< the axis of each reason
  std::array<std::string_view, max_outside> names{};  ///< a categorical value ("" for numbers)
  std::array<std::uint64_t, max_outside> values{};    ///< a numeric value
  std::array<measured_range, max_outside> ranges{};   ///< its measured range
  std::size_t size = 0;
  constexpr void add(std::string_view axis, std::string_view name, std::uint64_t value = 0, measured_range r = {}) {
    if (size < max_outside) {
      axes[size] = axis;
      names[size] = name;
      values[size] = value;
      ranges[size] = r;
    }
    ++size;
  }
};

/// `family`: the Hugging Face model_type the model was read from ("" for a shape or preset).
/// `hidden` and `layers`: the model's width and blocks (0 when it has none).
constexpr envelope_check check_envelope(const training_desc& t, const mesh_desc& m, std::string_view family,
                                        std::uint64_t hidden, std::uint64_t layers) {
  envelope_check out{};
  const stack_envelope e = envelope_of(t.stack);
  if (!e.validated) {
    out.add("stack", "paper (never validated)");
    return out;
  }
  if (family.empty() ? !e.shapes : !detail::listed(e.families, family))
    out.add("family", family.empty() ? "a shape, not a Hugging Face config" : family);
  if (!detail::listed(e.precisions, t.precision.name)) out.add("precision", t.precision.name);
  // (Attention is a property of the model's blocks; the caller adds it.)
  if (!detail::listed(e.recomputations, recomputation_name(t))) out.add("recompute", recomputation_name(t));
  if (!detail::listed(e.optimizers, optimizer_envelope_name(t))) out.add("optimizer", optimizer_envelope_name(t));
  const auto number = [&](std::string_view axis, std::uint64_t v, measured_range r) {
    if (!r.holds(v)) out.add(axis, "", v, r);
  };
  if (t.sequence != 0) number("sequence", t.sequence, e.sequence);
  if (t.sequence != 0) number("micro-batch", t.micro_batch, e.micro_batch);
  if (hidden != 0) number("hidden", hidden, e.hidden);
  if (layers != 0) number("layers", layers, e.layers);
  number("grad-accum", t.grad_accum, e.grad_accum);
  number("dp", m.dp, e.dp);
  number("tp", m.tp, e.tp);
  number("pp", m.pp, e.pp);
  number("cp", m.cp, e.cp);
  number("ep", m.ep, e.ep);
  bool zero = false;
  for (int z : e.zero_stages) zero = zero || z == m.zero_stage;
  if (!zero) out.add("zero", "", static_cast<std::uint64_t>(m.zero_stage));
  if (m.sequence_parallel && !e.sequence_parallel) out.add("sp", "on");
  for (const stack_envelope::combination& c : e.unsettled)
    if (!c.name.empty() && m.dp * m.cp > 1 && m.zero_stage == c.zero_stage &&
        (c.recomputation.empty() || recomputation_name(t) == c.recomputation) && t.grad_accum > 1)
      out.add("combination", c.name);
  if (m.dp * m.cp * m.tp * m.pp > 1 && detail::listed(e.one_rank_families, family))
    out.add("combination", "this family on more than one rank (measured on one)");
  out.validated = out.size == 0;
  return out;
}

/// The attention of a model's blocks as the envelope names it ("" when it has none).
constexpr std::string_view attention_name(const layer_desc& block) {
  return (block.shape.flags & layer_flags::flash) != 0 ? "flash" : "naive";
}

/// What of the model trains, as the envelope names it: "full" (every entry), "lora" (adapters on
/// a frozen base, model/compose.hpp), "qlora-<storage>" (on a base stored in nf4, nf4-dq, fp4,
/// fp4-dq or int8), "frozen parts" (some entries frozen, no adapters).
constexpr std::string_view fine_tuning_name(const model_desc& model) {
  bool adapters = false, frozen = false;
  std::string_view storage{};
  for (const layer_desc& l : model) {
    if (l.group == layer_group::teacher) continue;
    if (l.kind == layer_kind::custom && l.shape.lora_rank != 0) adapters = true;
    if (!l.trainable) frozen = true;
    if ((l.shape.flags & layer_flags::adapted) != 0 && !l.weight_storage.is_none()) storage = l.weight_storage.name;
  }
  if (!adapters) return frozen ? "frozen parts" : "full";
  if (storage.empty()) return "lora";
  if (storage == "nf4") return "qlora-nf4";
  if (storage == "nf4_dq") return "qlora-nf4-dq";
  if (storage == "fp4") return "qlora-fp4";
  if (storage == "fp4_dq") return "qlora-fp4-dq";
  if (storage == "llm_int8") return "qlora-int8";
  return "qlora";
}

namespace detail {
/// Adds `axis: value` to `c` when the measured `names` lack `value`.
template <std::size_t N>
constexpr void check_listed(envelope_check& c, const std::array<std::string_view, N>& names, std::string_view axis,
                            std::string_view value) {
  if (listed(names, value)) return;
  c.add(axis, value);
  c.validated = false;
}
}  // namespace detail

/// Adds the fine-tuning (fine_tuning_name) when the stack's measurements lack it.
constexpr void check_fine_tuning(envelope_check& c, stack_kind s, std::string_view fine_tuning) {
  const stack_envelope e = envelope_of(s);
  if (e.validated) detail::check_listed(c, e.fine_tunings, "fine-tuning", fine_tuning);
}

/// A mixture of experts' router and token dispatcher as the envelope names them: "sinkhorn"
/// (Megatron's Sinkhorn load balancing), "sigmoid" (sigmoid scores of the chosen experts:
/// DeepSeek-V3's router with its expert bias, in fp32, and Megatron's TopKRouter with
/// --moe-router-score-function sigmoid; Llama 4's) or "softmax" (a softmax top-k: the other
/// Hugging Face routers, Megatron's TopKRouter by default), with " + alltoall" for Megatron's
/// all-to-all dispatcher (the allgather one, Megatron's default, unnamed); "" for a block
/// without experts.
constexpr std::string_view moe_name(const layer_desc& block) {
  const layer_shape& s = block.shape;
  if ((s.flags & layer_flags::moe) == 0) return "";
  if (s.router_sinkhorn) return s.moe_alltoall ? "sinkhorn + alltoall" : "sinkhorn";
  if (s.router_sigmoid || s.dense_experts) return s.moe_alltoall ? "sigmoid + alltoall" : "sigmoid";
  return s.moe_alltoall ? "softmax + alltoall" : "softmax";
}

/// A block's norms on the query and key as the envelope names them: "per head" (Qwen3's, Megatron's
/// qk_layernorm), "whole projection" (OLMo 2's), "l2" (Llama 4's weightless one), or "" for none.
constexpr std::string_view qk_norm_name(const layer_desc& block) {
  if ((block.shape.flags & layer_flags::qk_norm_per_head) != 0) return "per head";
  if ((block.shape.flags & layer_flags::qk_norm_whole) != 0) return "whole projection";
  if (block.shape.l2_qk_norm) return "l2";
  return "";
}

/// Adds `qk_norm` (qk_norm_name; "" for none) when the stack's measurements lack it.
constexpr void check_qk_norm(envelope_check& c, stack_kind s, std::string_view qk_norm) {
  const stack_envelope e = envelope_of(s);
  if (e.validated && !qk_norm.empty()) detail::check_listed(c, e.qk_norms, "qk-norm", qk_norm);
}

/// Adds `moe` (moe_name; "" for none) when the stack's measurements lack it.
constexpr void check_moe(envelope_check& c, stack_kind s, std::string_view moe) {
  const stack_envelope e = envelope_of(s);
  if (e.validated && !moe.empty()) detail::check_listed(c, e.moe_kinds, "moe", moe);
}

/// Adds the attention of `attention` ("naive" / "flash" / "") when the stack's measurements lack it.
constexpr void check_attention(envelope_check& c, stack_kind s, std::string_view attention) {
  const stack_envelope e = envelope_of(s);
  if (e.validated && !attention.empty()) detail::check_listed(c, e.attentions, "attention", attention);
}

}  // namespace memalg

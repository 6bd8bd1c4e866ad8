// SPDX-License-Identifier: BSL-1.0
// memalg/plan/issues.hpp — the reasons a configuration cannot be planned.
//
// One enumeration, one sentence each. The command-line tool prints the sentence; a type-level plan
// instantiates `detail::plan_check<issue>`, whose static_assert carries the same sentence, so a
// bad configuration is a compile error that names the problem under g++, clang and nvcc.
#pragma once

#include <cstdint>
#include <string_view>

namespace memalg {

enum class plan_issue : int {
  none = 0,
  invalid_mesh,
  invalid_device,
  no_parameters,
  zero_micro_batch,
  zero_grad_accum,
  compute_only_storage,
  missing_dtype,
  inconsistent_layer,
  pipeline_deeper_than_layers,
  tp_does_not_divide_heads,
  tp_does_not_divide_kv_heads,
  tp_does_not_divide_ffn,
  tp_does_not_divide_vocab,
  cp_does_not_divide_sequence,
  sp_does_not_divide_sequence,
  zero_dimension,
  invalid_recompute,
  ep_does_not_divide_experts,
  kv_heads_do_not_divide_heads,
  top_k_exceeds_experts,
  sequence_exceeds_positions,
  stack_does_not_model,
};

constexpr std::string_view describe(plan_issue i) {
  switch (i) {
    case plan_issue::none: return {};
    case plan_issue::invalid_mesh: return "the parallel mesh is invalid";
    case plan_issue::invalid_device: return "the device is invalid";
    case plan_issue::no_parameters: return "the model has no parameters";
    case plan_issue::zero_micro_batch: return "the micro-batch must hold at least one sequence";
    case plan_issue::zero_grad_accum: return "gradient accumulation must accumulate at least one micro-batch";
    case plan_issue::compute_only_storage: return "tf32 is a compute format and cannot be a storage dtype";
    case plan_issue::missing_dtype: return "a precision policy needs weight and gradient dtypes";
    case plan_issue::inconsistent_layer: return "a layer's expert and replicated parameters exceed its parameters";
    case plan_issue::pipeline_deeper_than_layers: return "the pipeline has more stages than the model has layers";
    case plan_issue::tp_does_not_divide_heads: return "the tensor-parallel degree does not divide the attention heads";
    case plan_issue::tp_does_not_divide_kv_heads:
      return "the tensor-parallel degree does not divide the key/value heads";
    case plan_issue::tp_does_not_divide_ffn: return "the tensor-parallel degree does not divide the MLP width";
    case plan_issue::tp_does_not_divide_vocab: return "the tensor-parallel degree does not divide the vocabulary";
    case plan_issue::cp_does_not_divide_sequence:
      return "the context-parallel degree does not divide the sequence length";
    case plan_issue::sp_does_not_divide_sequence:
      return "the tensor-parallel degree does not divide the sequence length under sequence parallelism";
    case plan_issue::zero_dimension: return "a layer has a zero dimension";
    case plan_issue::invalid_recompute: return "recompute every:K needs K of at least one layer";
    case plan_issue::ep_does_not_divide_experts: return "the expert-parallel degree does not divide the experts";
    case plan_issue::kv_heads_do_not_divide_heads: return "the key/value heads do not divide the attention heads";
    case plan_issue::top_k_exceeds_experts: return "a mixture of experts routes each token to more experts than it has";
    case plan_issue::sequence_exceeds_positions:
      return "the sequence is longer than the learned position embedding";
    case plan_issue::stack_does_not_model:
      return "the training stack does not model a feature of this model (memalg plan names it)";
  }
  return "unknown issue";
}

namespace detail {
/// Instantiated with the issue a plan has; only the matching assertion fires.
template <plan_issue I>
struct plan_check {
  static_assert(I != plan_issue::invalid_mesh, "plan: the parallel mesh is invalid");
  static_assert(I != plan_issue::invalid_device, "plan: the device is invalid: capacity zero or a memory cap outside (0, 1]");
  static_assert(I != plan_issue::no_parameters, "plan: the model has no parameters");
  static_assert(I != plan_issue::zero_micro_batch, "plan: the micro-batch must hold at least one sequence");
  static_assert(I != plan_issue::zero_grad_accum, "plan: gradient accumulation must accumulate at least one micro-batch");
  static_assert(I != plan_issue::compute_only_storage, "plan: tf32 is a compute format and cannot be a storage dtype");
  static_assert(I != plan_issue::missing_dtype, "plan: a precision policy needs weight and gradient dtypes");
  static_assert(I != plan_issue::inconsistent_layer, "plan: a layer's expert and replicated parameters exceed its parameters");
  static_assert(I != plan_issue::pipeline_deeper_than_layers, "plan: the pipeline has more stages than the model has layers; use fewer pipeline stages");
  static_assert(I != plan_issue::tp_does_not_divide_heads, "plan: the tensor-parallel degree does not divide the attention heads");
  static_assert(I != plan_issue::tp_does_not_divide_kv_heads, "plan: the tensor-parallel degree does not divide the key/value heads");
  static_assert(I != plan_issue::tp_does_not_divide_ffn, "plan: the tensor-parallel degree does not divide the MLP width");
  static_assert(I != plan_issue::tp_does_not_divide_vocab, "plan: the tensor-parallel degree does not divide the vocabulary");
  static_assert(I != plan_issue::cp_does_not_divide_sequence, "plan: the context-parallel degree does not divide the sequence length");
  static_assert(I != plan_issue::sp_does_not_divide_sequence, "plan: the tensor-parallel degree does not divide the sequence length under sequence parallelism");
  static_assert(I != plan_issue::zero_dimension, "plan: a layer has a zero dimension");
  static_assert(I != plan_issue::invalid_recompute, "plan: recompute every:K needs K of at least one layer");
  static_assert(I != plan_issue::ep_does_not_divide_experts, "plan: the expert-parallel degree does not divide the experts");
  static_assert(I != plan_issue::kv_heads_do_not_divide_heads, "plan: the key/value heads do not divide the attention heads");
  static_assert(I != plan_issue::top_k_exceeds_experts, "plan: a mixture of experts routes each token to more experts than it has");
  static_assert(I != plan_issue::sequence_exceeds_positions, "plan: the sequence is longer than the learned position embedding");
  static_assert(I != plan_issue::stack_does_not_model,
                "plan: the training stack does not model a feature of this model (detail::stack_unmodelled names it; "
                "memalg plan prints it)");
  static constexpr bool value = I == plan_issue::none;
};
}  // namespace detail

}  // namespace memalg

// SPDX-License-Identifier: BSL-1.0
// tools/layer_fields.hpp — the numeric fields of layer_desc and layer_shape, as X-macros (internal
// to the tool): `emit` spells each out in the header it writes (cmd_emit.cpp), and the planner's
// tests compare each between a preset and the import of its configuration (test_planner.cpp).
// A new field goes here, or the emitted header plans without it.
#pragma once

// `known_fields` (cmd_emit.cpp) copies exactly these, with the name, kind, placement, flags and
// ε, so the plan of the copy is the plan of the header.
#define MEMALG_EMIT_LAYER_FIELDS(X) \
  X(count) X(params) X(tp_replicated_params) X(expert_params) X(matrix_params) X(matrix_rows_plus_cols) X(gather_params) X(buffer_bytes)
#define MEMALG_EMIT_SHAPE_FIELDS(X)                                                                                   \
  X(hidden) X(heads) X(kv_heads) X(head_dim) X(ffn) X(vocab) X(in) X(out) X(kernel) X(experts) X(top_k)              \
  X(capacity_factor_percent) X(chunk) X(dropout_permille) X(sequence) X(kv_sequence) X(positions) X(rank)           \
  X(saved_per_token) X(rotary_dim) X(rotary_tables) X(window) X(attention_dropout_permille) X(attention_output_dropout_permille)                \
  X(mlp_output_dropout_permille) X(q_lora_rank) X(kv_lora_rank) X(v_head_dim) X(shared_ffn) X(router_fp32) X(router_sigmoid) \
  X(attention_sinks) X(clamped_swiglu) X(router_topk_softmax) X(complex_rotary) X(l2_qk_norm)                     \
  X(attention_temperature) X(dense_experts) X(router_sinkhorn) X(norm_bias) X(rotary_half_table) X(router_aux_loss) X(moe_alltoall) \
  X(lora_rank) X(lora_targets) X(lora_dropout_permille) X(lora_adapter_bits)

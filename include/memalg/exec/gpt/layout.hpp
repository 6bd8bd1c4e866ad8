// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/layout.hpp — how the GPT trainers (CPU and CUDA) lay out their parameters.
//
// Parameters are grouped into units — the token embedding, the position embedding, each block,
// the final norm — each one flat buffer per rank. A block's tensors sit at fixed offsets inside
// its unit; `no_decay` lists the ranges AdamW does not decay (norms, biases) and `replicated` the
// ranges identical on every tensor-parallel rank (norms, biases of row-parallel products,
// embeddings), which the global gradient norm counts once. Both trainers build their units from
// these functions, so the layout the plan is checked against is written once.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memalg/exec/lowering.hpp"  // element_ranges, element_cursor

namespace memalg::exec {

/// Offsets of one block's tensors inside its unit (W = attention width per rank, F = MLP width
/// per rank under tensor parallelism).
struct gpt_block_view {
  std::size_t ln1_w, ln1_b, qkv_w, qkv_b, q_norm_w, k_norm_w, proj_w, proj_b, post_attn_w, ln2_w, ln2_b, fc1_w, fc1_b,
      fc2_w, fc2_b, post_ffn_w, end;
};

/// The general block: query width Wq and key/value width Wkv per rank (qkv is [Wq + 2·Wkv, C],
/// proj [C, Wq]); norm_bias: LayerNorm biases (none for RMSNorm); bias: projection biases; gated:
/// fc1 writes [gate ‖ up] (2F rows); qkv_bias: the qkv projection's bias even without `bias`
/// (Qwen2); shared_norm: one norm feeds attention and MLP (Falcon-7B), so the block has no ln2;
/// qk_norm_dim: the head width of Qwen3's per-head q_norm and k_norm weights after the qkv bias
/// (0: none); sandwich_norms: Gemma's post-attention norm after the out-projection's bias and
/// post-feedforward norm after FC2's (both norms and replicated, as the ranges around them).
/// Absent tensors take no elements (their offsets coincide).
constexpr gpt_block_view gpt_block_layout(std::size_t C, std::size_t Wq, std::size_t Wkv, std::size_t F,
                                          bool norm_bias, bool bias, bool gated, bool qkv_bias = false,
                                          bool shared_norm = false, std::size_t qk_norm_dim = 0,
                                          bool sandwich_norms = false) {
  gpt_block_view v{};
  element_cursor o;
  const std::size_t F1 = gated ? 2 * F : F;
  v.ln1_w = o.take(C);
  v.ln1_b = o.take(norm_bias ? C : 0);
  v.qkv_w = o.take((Wq + 2 * Wkv) * C);
  v.qkv_b = o.take(bias || qkv_bias ? Wq + 2 * Wkv : 0);
  v.q_norm_w = o.take(qk_norm_dim);
  v.k_norm_w = o.take(qk_norm_dim);
  v.proj_w = o.take(C * Wq);
  v.proj_b = o.take(bias ? C : 0);
  v.post_attn_w = o.take(sandwich_norms ? C : 0);
  v.ln2_w = o.take(shared_norm ? 0 : C);
  v.ln2_b = o.take(norm_bias && !shared_norm ? C : 0);
  v.fc1_w = o.take(F1 * C);
  v.fc1_b = o.take(bias ? F1 : 0);
  v.fc2_w = o.take(C * F);
  v.fc2_b = o.take(bias ? C : 0);
  v.post_ffn_w = o.take(sandwich_norms ? C : 0);
  v.end = o.end;
  return v;
}

struct gpt_unit_spec {
  std::string name;
  std::size_t elements = 0;  ///< on this rank before ZeRO sharding
  std::size_t shard = 0;     ///< elements / dp
  element_ranges no_decay;
  element_ranges replicated;
};

/// Sets each unit's shard; throws, naming `who`, when one does not split evenly over dp.
inline std::vector<gpt_unit_spec> detail_split_units(std::string_view who, std::vector<gpt_unit_spec> units,
                                                     std::size_t dp) {
  for (gpt_unit_spec& u : units) {
    if (u.elements % dp != 0)
      throw std::invalid_argument(std::string(who) + ": unit '" + u.name + "' (" + std::to_string(u.elements) +
                                  " elements) does not split evenly over " + std::to_string(dp) +
                                  " data-parallel ranks");
    u.shard = u.elements / dp;
  }
  return units;
}

/// The units of a GPT of `layers` blocks: the token embedding, the position embedding (none when
/// positions == 0: rotary positions), the blocks, a final norm of `final_norm` elements and, when
/// not `tied`, an output layer as a last unit `lm_head` [vocab, hidden]; throws, naming `who`,
/// when a unit does not split evenly over `dp` data-parallel ranks.
inline std::vector<gpt_unit_spec> gpt_units(std::string_view who, std::size_t vocab, std::size_t positions,
                                            std::size_t hidden, std::size_t layers, const gpt_block_view& v,
                                            std::size_t dp, std::size_t final_norm, bool tied) {
  const std::size_t C = hidden;
  std::vector<gpt_unit_spec> units;
  units.push_back({"wte", vocab * C, 0, {}, {{0, vocab * C}}});
  if (positions != 0) units.push_back({"wpe", positions * C, 0, {}, {{0, positions * C}}});
  // Replicated on every tensor-parallel rank: the norms (Qwen3's QK-norms too, whose gradients the
  // step all-reduces over tp), the row-parallel products' biases.
  element_ranges replicated{{v.ln1_w, v.qkv_w}};
  if (v.q_norm_w != v.proj_w) replicated.push_back({v.q_norm_w, v.proj_w});
  replicated.push_back({v.proj_b, v.fc1_w});
  replicated.push_back({v.fc2_b, v.end});
  for (std::size_t l = 0; l < layers; ++l)
    units.push_back({"block" + std::to_string(l), v.end, 0,
                     {{v.ln1_w, v.qkv_w}, {v.qkv_b, v.proj_w}, {v.proj_b, v.fc1_w}, {v.fc1_b, v.fc2_w}, {v.fc2_b, v.end}},
                     replicated});
  units.push_back({"lnf", final_norm, 0, {{0, final_norm}}, {{0, final_norm}}});
  if (!tied) units.push_back({"lm_head", vocab * C, 0, {}, {{0, vocab * C}}});
  return detail_split_units(who, std::move(units), dp);
}


}  // namespace memalg::exec

// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/read_model.hpp — the decoder-only language model a list of layer descriptors
// describes, read the way the GPT runtime needs it.
//
// The planner evaluates a `model_desc` (model/layer.hpp): entries with kinds, counts, placements
// and shapes. The runtime builds its step program from an `lm_config` (model/transformer.hpp).
// `read_decoder_lm` turns the first into the second from the descriptors alone, so that any model
// type whose descriptors have the shape of a decoder-only language model — `transformer_lm` of a
// config, a preset, the HF import, or a `model::sequential` of layer types written by hand — is
// one the runtime can be asked to train, and so that what runs is what was planned:
//
//   embedding [position_embedding] [dropout] repeat<L, transformer_block> (layernorm | rmsnorm) output
//
// with one block shape for all L blocks, rotary positions when there is no position embedding, the embedding dropout equal to the blocks' dropout (the
// runtime has one dropout probability), the final norm of the blocks' kind, an output of the
// embedding's vocabulary and width, every entry trained (no frozen, quantized or teacher parts).
// Anything else is refused with a sentence (`lm_reading::problem`); whether the runtime then
// implements the configuration it read (precision, mesh, block variants) is its own rule
// (exec/gpt/plan.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "memalg/model/layer.hpp"
#include "memalg/model/transformer.hpp"

namespace memalg::exec {

/// The language model read from descriptors, or why there is none.
struct lm_reading {
  lm_config config{};
  std::string_view problem{};  ///< empty when the descriptors describe a decoder-only language model
  constexpr bool ok() const { return problem.empty(); }
};

namespace detail {
constexpr bool has(std::uint32_t flags, std::uint32_t f) { return (flags & f) != 0; }
}  // namespace detail

/// The decoder-only language model `m` describes (see the header comment for the shape it needs).
constexpr lm_reading read_decoder_lm(const model_desc& m) {
  lm_reading r{};
  const auto refuse = [&r](std::string_view why) {
    r.problem = why;
    return r;
  };
  // Entries by index, not by pointer: a pointer compared with nullptr is not a constant
  // expression for GCC under -fsanitize (the test build under AddressSanitizer).
  std::size_t i = 0;
  const auto has = [&](std::size_t k) { return k < m.size; };
  for (const layer_desc& l : m)
    if (!l.trainable || !l.weight_storage.is_none() || l.group != 0)
      return refuse("the runtime trains every layer of the model in the policy's dtypes: no frozen, quantized or teacher layers");

  if (!has(i) || m.entries[i].kind != layer_kind::embedding || m.entries[i].count != 1)
    return refuse("a decoder-only language model starts with one token embedding");
  lm_config& c = r.config;
  c.name = m.name;
  c.vocab = m.entries[i].shape.vocab;
  c.hidden = m.entries[i].shape.hidden;
  ++i;
  if (has(i) && m.entries[i].kind == layer_kind::position_embedding) {
    if (m.entries[i].count != 1 || m.entries[i].shape.hidden != c.hidden)
      return refuse("the position embedding must be one table of the embedding's width");
    c.positions = m.entries[i].shape.positions;
    ++i;
  }
  std::uint64_t embedding_dropout = 0;
  if (has(i) && m.entries[i].kind == layer_kind::dropout) {
    embedding_dropout = m.entries[i].shape.dropout_permille;
    ++i;
  }
  if (!has(i) || m.entries[i].kind != layer_kind::transformer_block || m.entries[i].place != placement::repeated ||
      m.entries[i].count == 0)
    return refuse("after the embeddings the runtime expects the repeated transformer blocks");
  const layer_desc& b = m.entries[i];
  ++i;
  const layer_shape& s = b.shape;
  const std::uint32_t f = s.flags;
  using namespace layer_flags;
  if (detail::has(f, cross_attention) || detail::has(f, moe) || s.experts != 0 || detail::has(f, adapted))
    return refuse("the runtime's blocks are decoder self-attention blocks with a dense MLP (no cross-attention, mixture of experts or adapters)");
  if (detail::has(f, qk_norm_whole) || detail::has(f, norms_after) || detail::has(f, norms_sandwich))
    return refuse("the runtime's blocks put their norms before the sub-layers only, with at most a per-head QK-norm (OLMo 2's and Gemma's blocks are not among them)");
  if (s.window != 0)
    return refuse("the runtime's attention reads every earlier token: no sliding window (Mistral's, Gemma's local layers)");
  if (detail::has(f, qk_norm_per_head) && !detail::has(f, rms_norm))
    return refuse("the runtime's per-head QK-norm is Qwen3's RMSNorm: the blocks must use RMSNorm too");
  if (detail::has(f, softcap)) return refuse("the runtime's attention does not soft-cap its scores (Gemma 2's blocks)");
  if (s.hidden != c.hidden) return refuse("the blocks must have the embedding's width");
  if (s.sequence != 0) return refuse("the blocks run on the recipe's sequence length");
  c.layers = b.count;
  c.heads = s.heads;
  c.kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.ffn = s.ffn;
  c.dropout_permille = s.dropout_permille;
  c.rms_norm = detail::has(f, rms_norm);
  c.norm_eps = s.norm_eps;
  c.gated = detail::has(f, gated);
  c.bias = detail::has(f, bias);
  c.qkv_bias = detail::has(f, qkv_bias) && !c.bias;
  c.qk_norm = detail::has(f, qk_norm_per_head);
  c.flash = detail::has(f, flash);
  c.causal = detail::has(f, causal);
  c.rotary = detail::has(f, rotary);
  c.rotary_dim = s.rotary_dim;
  c.parallel_residual = detail::has(f, parallel_residual);
  c.fused_qkv = detail::has(f, fused_qkv);
  c.gelu_tanh = detail::has(f, gelu_tanh);
  c.shared_norm = detail::has(f, shared_norm);
  c.unfused_attention = detail::has(f, unfused_attention);
  c.softmax_scores_dtype = detail::has(f, softmax_scores_dtype);
  c.softmax_stream_dtype = detail::has(f, softmax_stream_dtype);
  c.residual_dropout = detail::has(f, residual_dropout);
  if (embedding_dropout != c.dropout_permille)
    return refuse("the embedding dropout must equal the blocks' dropout (the runtime has one dropout probability)");
  // Without a position embedding the runtime rotates (lm_config::positions == 0: rotary, as the
  // presets write Llama-family models whether or not they set the pytorch stack's `rotary` flag).
  if (c.positions != 0 && c.rotary) return refuse("a learned position embedding and rotary blocks together");

  if (!has(i) || m.entries[i].count != 1 || m.entries[i].shape.hidden != c.hidden ||
      !(m.entries[i].kind == (c.rms_norm ? layer_kind::rmsnorm : layer_kind::layernorm)))
    return refuse("after the blocks the runtime expects one final norm of the blocks' kind and width");
  if (m.entries[i].kind == layer_kind::layernorm && detail::has(m.entries[i].shape.flags, bias) != c.bias)
    return refuse("the final LayerNorm must have biases exactly when the blocks do");
  if (norm_eps_of(m.entries[i].shape, c.rms_norm) != norm_eps_of(s, c.rms_norm))
    return refuse("the final norm must have the blocks' epsilon (the runtime has one norm epsilon)");
  ++i;
  if (!has(i) || m.entries[i].kind != layer_kind::output || m.entries[i].count != 1 ||
      m.entries[i].shape.hidden != c.hidden || m.entries[i].shape.vocab != c.vocab)
    return refuse("the model must end with an output layer over the embedding's vocabulary and width");
  const layer_shape& o = m.entries[i].shape;
  if (detail::has(o.flags, softcap)) return refuse("the runtime's loss does not soft-cap the logits (Gemma 2's output)");
  c.tied = detail::has(o.flags, tied);
  c.logits = o.logits;
  c.loss_chunk = o.chunk;
  ++i;
  if (i != m.size) return refuse("the runtime's language model ends with its output layer");
  return r;
}

}  // namespace memalg::exec

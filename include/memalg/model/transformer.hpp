// SPDX-License-Identifier: BSL-1.0
// memalg/model/transformer.hpp — the pre-norm transformer block and decoder-only language models.
//
// A block is ONE `layer_desc` (kind transformer_block) whose shape carries everything the
// activation algebra needs, so `repeat<96, block>` is one entry with count 96:
//
//   x = x + dropout(attention(norm(x)))                    (self-attention, causal or not)
//   x = x + dropout(cross_attention(norm(x), encoder))     (decoder blocks of encoder-decoders)
//   x = x + dropout(mlp(norm(x)))                          (GeLU MLP, SwiGLU, or mixture of experts)
//
// as in GPT-2 (Radford et al. 2019), Megatron-LM (Shoeybi et al. 2019), Llama (Touvron et al.
// 2023) and Mixtral (Jiang et al. 2024). Parameters are the sum of its parts (model/layers.hpp).
//
// `transformer_lm(lm_config)` builds a decoder-only language model: token embedding, optional
// learned position embedding, embedding dropout, L blocks, final norm and output layer — the
// structure of GPT-2/GPT-3 and of Llama/Mistral/Mixtral (rotary positions: no parameters).
#pragma once

#include <cstdint>
#include <string_view>

#include "memalg/model/layer.hpp"
#include "memalg/model/layers.hpp"

namespace memalg {

/// Parameters of one block with `s`'s shape (hidden, heads, kv_heads, head_dim, ffn, flags,
/// experts, top_k): two norms (three with cross-attention; one shared by attention and MLP with
/// shared_norm, a LayerNorm then keeping its shift whatever `bias` says: Falcon-7B's
/// input_layernorm is an nn.LayerNorm while its projections have no biases), the attention
/// projections (twice with cross-attention), and the MLP or the experts.
constexpr param_tally transformer_block_params(const layer_shape& s) {
  const bool rms = (s.flags & layer_flags::rms_norm) != 0;
  const bool bias = (s.flags & layer_flags::bias) != 0;
  const bool cross = (s.flags & layer_flags::cross_attention) != 0;
  param_tally p{};
  const param_tally norm = norm_params(s.hidden, rms, bias || s.norm_bias);
  if ((s.flags & layer_flags::shared_norm) != 0) {
    p += norm_params(s.hidden, rms, true);
  } else {
    p += norm;
    p += norm;
  }
  if ((s.flags & layer_flags::norms_sandwich) != 0) {  // Gemma's post-attention and post-feedforward norms
    p += norm;
    p += norm;
  }
  p += attention_params(s);
  // Qwen3's q_norm and k_norm: one RMSNorm weight over head_dim each, shared by the heads and
  // replicated under tensor parallelism (modeling_qwen3.py, Qwen3Attention.__init__).
  if ((s.flags & layer_flags::qk_norm_per_head) != 0) p.add_vector(2 * (s.head_dim != 0 ? s.head_dim : s.hidden / s.heads), true);
  if (cross) {
    p += norm;
    p += attention_params(s);
  }
  if ((s.flags & layer_flags::moe) != 0)
    p += moe_params(s);
  else
    p += mlp_params(s.hidden, s.ffn, (s.flags & layer_flags::gated) != 0, bias);
  return p;
}

/// A pre-norm block. Flags: bias, gated, rms_norm, flash, causal, cross_attention, moe; dropout
/// applies to the attention probabilities and after each sub-layer (GPT-2's attn_pdrop and
/// resid_pdrop; Megatron's attention_dropout and hidden_dropout, taken equal here).
constexpr layer_desc transformer_block_layer(layer_shape s) {
  s = normalized_attention(s);
  return make_layer("block", layer_kind::transformer_block, transformer_block_params(s), s);
}

/// The same block with other dimensions, keeping its name, count, placement and training state
/// (structured pruning: fewer heads, a narrower MLP).
constexpr layer_desc reshaped_block(const layer_desc& l, layer_shape s) {
  layer_desc r = transformer_block_layer(s);
  r.name = l.name;
  r.count = l.count;
  r.place = l.place;
  r.trainable = l.trainable;
  r.weight_storage = l.weight_storage;
  r.group = l.group;
  return r;
}

/// A decoder-only language model.
struct lm_config {
  std::string_view name = "transformer";
  std::uint64_t layers = 0;
  std::uint64_t hidden = 0;
  std::uint64_t heads = 0;
  std::uint64_t kv_heads = 0;   ///< 0: = heads
  std::uint64_t head_dim = 0;   ///< 0: hidden / heads
  std::uint64_t ffn = 0;        ///< 0: 4·hidden
  std::uint64_t vocab = 0;
  std::uint64_t positions = 0;  ///< learned position embedding of this many positions (0: rotary, none)
  bool rms_norm = false;
  double norm_eps = 0;          ///< the norms' ε (0: the kind's default, default_norm_eps)
  bool gated = false;           ///< SwiGLU
  bool tied = true;             ///< output layer shares the token embedding
  bool bias = true;
  bool qkv_bias = false;         ///< without `bias`: biases on q, k, v only (Qwen2)
  bool qk_norm = false;          ///< an RMSNorm over head_dim on each query and key head (Qwen3's q_norm, k_norm)
  /// Gemma's four RMSNorms per block, before and after each sub-layer (h = x + post(attn(pre(x)))),
  /// each and the final norm scaling by 1 + w in fp32 (Gemma2RMSNorm; needs rms_norm)
  bool sandwich_norms = false;
  bool flash = false;
  bool causal = true;
  /// Gemma 2's arithmetic (modeling_gemma2.py), what memalg's runtime computes; none changes a
  /// byte its stack plans (the pytorch stack reads Gemma 2 from its config.json, model/families.hpp):
  bool geglu = false;                ///< with `gated`: GeLU's tanh form on the gate (gelu_pytorch_tanh)
  bool embed_scale = false;          ///< the token embedding times √hidden (the model's normalizer)
  double attn_softcap = 0;           ///< attn_logit_softcapping: scores capped to c·tanh(s/c) (0: none)
  double final_softcap = 0;          ///< final_logit_softcapping: logits capped likewise (0: none)
  std::uint64_t sliding_window = 0;  ///< layers 0, 2, 4, … attend to the last sliding_window positions
  double query_scalar = 0;           ///< query_pre_attn_scalar: scores scaled by its −½ power (0: head width's)
  std::uint64_t dropout_permille = 0;
  std::uint64_t experts = 0;    ///< > 0: the MLP is a mixture of experts
  std::uint64_t top_k = 0;
  std::uint64_t capacity_factor_percent = 0;
  bool router_sinkhorn = false;  ///< MoE: Megatron's Sinkhorn router (layer_shape::router_sinkhorn)
  bool router_aux_loss = false;  ///< MoE: Hugging Face's auxiliary loss reads the router logits (layer_shape::router_aux_loss)
  bool moe_alltoall = false;     ///< MoE: Megatron's all-to-all token dispatcher (layer_shape::moe_alltoall)
  /// Without `bias`: the LayerNorms keep their shift (Megatron's --disable-bias-linear;
  /// layer_shape::norm_bias).
  bool norm_bias = false;
  dtype logits = dtypes::none;  ///< none: fp32
  std::uint64_t loss_chunk = 0; ///< chunked loss: logits rows at a time (0: unchunked)
  // How the modelling code computes (what the pytorch stack saves; layer_flags in model/layer.hpp):
  bool rotary = false;             ///< rotary positions
  std::uint64_t rotary_dim = 0;    ///< rotated dimensions per head (0: all; GPT-NeoX's rotary_pct)
  bool parallel_residual = false;  ///< attention and MLP read the same input (GPT-NeoX, Falcon)
  bool fused_qkv = false;          ///< one projection writes Q, K and V (GPT-2, GPT-NeoX, Falcon)
  bool gelu_tanh = false;          ///< GPT-2's gelu_new, written out as its tanh formula
  bool shared_norm = false;        ///< one norm feeds attention and MLP (Falcon-7B's layout)
  bool unfused_attention = false;  ///< attention keeps its scores even when SDPA is asked (Falcon-7B)
  bool softmax_scores_dtype = false;  ///< eager softmax in the scores' dtype, not fp32 (GPT-2)
  bool softmax_stream_dtype = false;  ///< eager softmax in the residual stream's dtype, not fp32 (Falcon)
  bool residual_dropout = false;   ///< dropout on every sub-layer output and on the embeddings
  /// Each dropout site's own probability (× 1000), as a Hugging Face config gives them: with it,
  /// the four fields below are used and `dropout_permille` and `residual_dropout` are not.
  bool per_site_dropout = false;
  std::uint64_t embedding_dropout_permille = 0;         ///< on the embeddings' sum
  std::uint64_t attention_dropout_permille = 0;         ///< on the attention probabilities
  std::uint64_t attention_output_dropout_permille = 0;  ///< on the attention output (residual branch)
  std::uint64_t mlp_output_dropout_permille = 0;        ///< on the MLP output (residual branch)
};

constexpr layer_shape block_shape(const lm_config& c) {
  layer_shape s{};
  s.hidden = c.hidden;
  s.heads = c.heads;
  s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim;
  s.ffn = c.ffn != 0 ? c.ffn : 4 * c.hidden;
  s.dropout_permille = c.dropout_permille;
  bool residual_dropout = c.residual_dropout;
  if (c.per_site_dropout) {
    s.attention_dropout_permille = c.attention_dropout_permille;
    s.attention_output_dropout_permille = c.attention_output_dropout_permille;
    s.mlp_output_dropout_permille = c.mlp_output_dropout_permille;
    const std::uint64_t out = c.attention_output_dropout_permille > c.mlp_output_dropout_permille
                                  ? c.attention_output_dropout_permille
                                  : c.mlp_output_dropout_permille;
    s.dropout_permille = c.attention_dropout_permille > out ? c.attention_dropout_permille : out;
    residual_dropout = out != 0;
  }
  s.flags = (c.per_site_dropout ? layer_flags::per_site_dropout : 0u) | (c.bias ? layer_flags::bias : 0u) |
            (c.gated ? layer_flags::gated : 0u) | (c.rms_norm ? layer_flags::rms_norm : 0u) | (c.flash ? layer_flags::flash : 0u) |
            (c.causal ? layer_flags::causal : 0u) | (c.rotary ? layer_flags::rotary : 0u) |
            (c.parallel_residual ? layer_flags::parallel_residual : 0u) |
            (c.fused_qkv ? layer_flags::fused_qkv : 0u) | (c.gelu_tanh ? layer_flags::gelu_tanh : 0u) |
            (c.shared_norm ? layer_flags::shared_norm : 0u) |
            (c.unfused_attention ? layer_flags::unfused_attention : 0u) |
            (c.softmax_scores_dtype ? layer_flags::softmax_scores_dtype : 0u) |
            (c.softmax_stream_dtype ? layer_flags::softmax_stream_dtype : 0u) |
            (residual_dropout ? layer_flags::residual_dropout : 0u) |
            (c.qkv_bias ? layer_flags::qkv_bias : 0u) | (c.qk_norm ? layer_flags::qk_norm_per_head : 0u) |
            (c.sandwich_norms ? layer_flags::norms_sandwich | layer_flags::rms_weight_fp32 : 0u);
  s.rotary_dim = c.rotary ? c.rotary_dim : 0;
  s.norm_eps = c.norm_eps;
  s.norm_bias = !c.bias && c.norm_bias;
  if (c.experts != 0) {
    s.flags |= layer_flags::moe;
    s.experts = c.experts;
    s.top_k = c.top_k;
    s.capacity_factor_percent = c.capacity_factor_percent;
    s.router_sinkhorn = c.router_sinkhorn;
    s.router_aux_loss = c.router_aux_loss;
    s.moe_alltoall = c.moe_alltoall;
  }
  return s;
}

/// embedding [+ position embedding] [+ dropout] + L × block + final norm + output.
constexpr model_desc transformer_lm(const lm_config& c) {
  model_desc m{};
  m.name = c.name;
  m.push(embedding_layer(c.vocab, c.hidden));
  if (c.positions != 0) m.push(position_embedding_layer(c.positions, c.hidden));
  const std::uint64_t embedding_dropout = c.per_site_dropout ? c.embedding_dropout_permille : c.dropout_permille;
  if (embedding_dropout != 0) {
    layer_desc d = dropout_layer(c.hidden, embedding_dropout);
    d.name = "embedding_dropout";
    m.push(d);
  }
  layer_desc block = transformer_block_layer(block_shape(c));
  block.count = c.layers;
  block.place = placement::repeated;
  m.push(block);
  layer_desc norm = c.rms_norm ? rmsnorm_layer(c.hidden) : layernorm_layer(c.hidden, c.bias || c.norm_bias);
  norm.shape.norm_eps = c.norm_eps;
  if (c.sandwich_norms) norm.shape.flags |= layer_flags::rms_weight_fp32;  // Gemma's final norm too
  norm.name = "final_norm";
  norm.place = placement::last_stage;
  m.push(norm);
  layer_desc out = output_layer(c.hidden, c.vocab, c.tied ? layer_flags::tied : 0u, c.logits, c.loss_chunk);
  out.place = placement::last_stage;
  m.push(out);
  return m;
}

namespace model {

/// A pre-norm transformer block as a type: `transformer_block<4096, 32, 11008, opt::rmsnorm,
/// opt::swiglu, opt::no_bias, opt::flash>`. Defaults: LayerNorm, GeLU MLP, biases, causal naive
/// attention, no dropout.
template <std::uint64_t Hidden, std::uint64_t Heads, std::uint64_t Ffn, layer_option... Options>
struct transformer_block {
  static_assert(Hidden > 0 && Heads > 0 && Ffn > 0, "model::transformer_block<H, A, F>: dimensions must be at least 1");
  static constexpr layer_options options =
      memalg::model::detail::fold_options<Options...>(layer_flags::bias | layer_flags::causal);
  static constexpr layer_desc descriptor = [] {
    layer_shape s{};
    s.hidden = Hidden;
    s.heads = Heads;
    s.kv_heads = options.kv_heads;
    s.head_dim = options.head_dim;
    s.ffn = Ffn;
    s.flags = options.flags;
    s.dropout_permille = options.dropout_permille;
    s.experts = options.experts;
    s.top_k = options.top_k;
    s.capacity_factor_percent = options.capacity_factor_percent;
    return transformer_block_layer(s);
  }();
  static_assert(descriptor.shape.heads % descriptor.shape.kv_heads == 0,
                "model::transformer_block: the key/value heads must divide the attention heads");
};

/// A decoder-only language model from a type holding `static constexpr lm_config value`.
template <class Config>
struct transformer_lm {
  static constexpr lm_config config = Config::value;
  static constexpr model_desc value = memalg::transformer_lm(config);
};

}  // namespace model
}  // namespace memalg

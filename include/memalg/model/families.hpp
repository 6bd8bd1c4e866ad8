// SPDX-License-Identifier: BSL-1.0
// memalg/model/families.hpp — causal language models of 2024–2026 as their Hugging Face
// implementation builds them, with exactly the parameters it instantiates.
//
// `transformer_lm` (model/transformer.hpp) builds the classic pre-norm block. The families of
// 2024–2026 add parameters it does not have, each read from its modelling file in transformers
// 5.17 (models/<family>/modeling_<family>.py):
//
//   QK-norm        RMSNorm(head_dim) on q and on k, shared by the heads      Qwen3, Qwen3-MoE, Gemma 3
//                  RMSNorm over the whole q (a·d) and k (kv·d) projections   OLMo 2
//   four norms     input, post-attention, pre- and post-feedforward          Gemma 2, Gemma 3
//   attention sinks one learned logit per head (`sinks`)                     gpt-oss
//   MLA            q_a_proj h·qr, q_a_layernorm qr, q_b_proj qr·a·(dn + dr),  DeepSeek-V3 (Kimi K2)
//                  kv_a_proj_with_mqa h·(kvr + dr), kv_a_layernorm kvr,
//                  kv_b_proj kvr·a·(dn + dv), o_proj a·dv·h
//   sparse layers  router E·h (+ E bias: gpt-oss), E experts of width f_e     Qwen3-MoE, DeepSeek-V3,
//                  (gate_up E·h·2f_e, down E·f_e·h, + biases: gpt-oss),      gpt-oss, Llama 4
//                  a shared expert of width f_s (DeepSeek-V3, Llama 4)
//   a vision tower counted as weights (SigLIP for Gemma 3, Llama 4's own)    Gemma 3, Llama 4
//
// Buffers are not parameters (DeepSeek-V3's `e_score_correction_bias`, rotary tables), as
// `model.num_parameters()` counts. tests/data/hf/counts.json holds the counts transformers gives
// for the configurations of tests/data/hf/ (bench/torch/hf_counts.py); the planner's tests check
// the importer, and the presets of model/presets/current.hpp, against them.
//
// Tensor parallelism splits the projections, the experts and the heads' sinks; the norms, the
// QK-norms, the router, the row-parallel output biases and MLA's two down-projections (Megatron
// Core's multi-latent attention keeps linear_q_down_proj and linear_kv_down_proj whole) are
// replicated. Expert parallelism splits the routed experts only: shared experts are dense.
#pragma once

#include <cstdint>

#include "memalg/model/layer.hpp"
#include "memalg/model/layers.hpp"
#include "memalg/model/transformer.hpp"

namespace memalg {

/// Normalisation of queries and keys before the rotary embedding.
enum class qk_norm_kind : std::uint8_t {
  none,
  per_head,  ///< RMSNorm(head_dim) on q and on k, one weight for every head (Qwen3, Gemma 3)
  whole,     ///< RMSNorm over the whole q (a·d) and k (kv·d) projections (OLMo 2)
  l2,        ///< a weightless L2 norm per head on the rotated q and k (Llama 4's rotary layers)
};

/// Multi-head latent attention (DeepSeek-V2, Liu et al. 2024, arXiv 2405.04434; DeepSeek-V3).
struct mla_shape {
  std::uint64_t q_lora_rank = 0;   ///< 0: one q_proj h → a·(dn + dr)
  std::uint64_t kv_lora_rank = 0;  ///< > 0: the attention is MLA
  std::uint64_t qk_nope_dim = 0;   ///< dn: per-head query/key dimensions without rotary
  std::uint64_t qk_rope_dim = 0;   ///< dr: per-head rotary dimensions (the key's shared by heads)
  std::uint64_t v_head_dim = 0;    ///< dv
};

/// The mixture of experts of a model's sparse layers.
struct moe_spec {
  std::uint64_t experts = 0;        ///< routed experts E (0: every layer is dense)
  std::uint64_t top_k = 0;          ///< experts a token is sent to
  std::uint64_t ffn = 0;            ///< f_e: one routed expert's width
  std::uint64_t shared_ffn = 0;     ///< f_s: the shared expert's width (0: none)
  std::uint64_t sparse_layers = 0;  ///< how many layers are sparse; the others have lm.ffn-wide MLPs
  bool router_bias = false;         ///< the router has a bias (gpt-oss)
  bool expert_bias = false;         ///< the experts' projections have biases (gpt-oss)
  bool router_fp32 = false;         ///< the router's logits from fp32 casts (DeepSeek-V3's TopkRouter)
  /// gpt-oss: the experts' clamped SwiGLU (GptOssExperts) and the router's softmax over the
  /// top-k logits (GptOssTopKRouter).
  bool clamped_swiglu = false;
  bool router_topk_softmax = false;
  /// Llama 4: every expert computes every token, its input scaled by the token's routing score
  /// (0 for the experts not chosen; Llama4TextMoe).
  bool dense_experts = false;
  /// `output_router_logits`: the router logits are kept for the auxiliary load-balancing loss
  /// (Mixtral, Qwen3-MoE and gpt-oss compute it; layer_shape::router_aux_loss).
  bool router_aux_loss = false;
  /// DeepSeek-V3: sigmoid scores, an expert bias for the choice, group-limited (DeepseekV3TopkRouter).
  bool router_sigmoid = false;
};

/// A causal language model of a current family: what `lm_config` says, and what it adds.
struct family_lm_config {
  lm_config lm{};                     ///< shapes, norms, the dense MLP (lm.ffn); lm.experts is not read
  qk_norm_kind qk_norm = qk_norm_kind::none;
  std::uint64_t block_norms = 2;      ///< norms per block (Gemma 2 and 3: four)
  /// The block's two norms on the sub-layers' outputs, none before them (OLMo 2; the same
  /// parameters as the pre-norm block's, layer_flags::norms_after for the activations).
  bool norms_after = false;
  /// The rotary cos and sin in fp32 in every precision (OLMo 2; layer_flags::rotary_fp32).
  bool rotary_fp32 = false;
  /// The RMSNorms multiply by their weight in fp32 and cast after (OLMo 2, Gemma 2 and 3;
  /// layer_flags::rms_weight_fp32 on the blocks and the final norm).
  bool rms_weight_fp32 = false;
  bool attention_softcap = false;     ///< eager attention soft-caps its scores (Gemma 2; layer_flags::softcap)
  bool logit_softcap = false;         ///< the logits are soft-capped (Gemma 2; layer_flags::softcap on the output)
  /// Rotary tables the model computes once per step and every block of a kind reads: one per
  /// attention layer type with its own rotary base (Gemma 3: local and global, 2), else 1.
  std::uint64_t rotary_tables = 1;
  /// Local attention (Gemma 2 and 3's sliding_attention layers): `local_layers` of the dense
  /// layers attend within `window` tokens; they become their own block entry (the same
  /// parameters, layer_shape::window), since what SDPA keeps depends on it.
  std::uint64_t window = 0;
  std::uint64_t local_layers = 0;
  /// Local layers among the sparse ones (gpt-oss's, whose every layer is sparse; Llama 4's
  /// chunked layers among its mixture-of-experts layers). `local_layers` counts the dense ones.
  std::uint64_t local_sparse_layers = 0;
  /// Llama 4: the global (full-attention) layers are NoPE layers, without rotary positions and
  /// QK-norm, with attention temperature tuning when `attention_temperature`; the local ones
  /// attend within chunks of `window` tokens, which needs the same mask as a sliding window.
  bool nope_global = false;
  bool attention_temperature = false;
  bool complex_rotary = false;        ///< Llama 4's rotary embedding as a complex product
  bool rotary_half_table = false;     ///< gpt-oss's cos and sin of d/2 (layer_shape::rotary_half_table)
  bool attention_bias = false;        ///< q, k, v and o have biases (gpt-oss; StarCoder2 through lm.bias)
  bool attention_sinks = false;       ///< one learned logit per head (gpt-oss)
  mla_shape mla{};
  moe_spec moe{};
  std::uint64_t vision_params = 0;    ///< a vision tower and its projector, counted as weights
  /// Module buffers of the model besides its parameters, in bytes, held with the token embedding
  /// (GPT-BigCode's n_positions² boolean causal mask; layer_desc::buffer_bytes).
  std::uint64_t buffer_bytes = 0;
};

/// Local (sliding-window) layers among `layers` when every `pattern`-th layer is global and the
/// others local, from the first: Gemma2Config's alternation (pattern 2) and Gemma3TextConfig's
/// `sliding_window_pattern` (6), `(i + 1) % pattern != 0` for a local layer i.
constexpr std::uint64_t local_layers_of_pattern(std::uint64_t layers, std::uint64_t pattern) {
  return pattern == 0 ? layers : layers - layers / pattern;
}

namespace detail {

constexpr param_tally family_attention_params(const family_lm_config& f, const layer_shape& s) {
  const std::uint64_t h = s.hidden, a = s.heads;
  param_tally p{};
  if (f.mla.kv_lora_rank != 0) {
    const mla_shape& m = f.mla;
    const std::uint64_t qk = m.qk_nope_dim + m.qk_rope_dim;
    if (m.q_lora_rank != 0) {
      p.add_matrix(h, m.q_lora_rank, true);
      if (f.attention_bias) p.add_vector(m.q_lora_rank, true);
      p.add_vector(m.q_lora_rank, true);  // q_a_layernorm
      p.add_matrix(m.q_lora_rank, detail::checked_mul(a, qk));
    } else {
      p.add_matrix(h, detail::checked_mul(a, qk));
    }
    p.add_matrix(h, m.kv_lora_rank + m.qk_rope_dim, true);
    if (f.attention_bias) p.add_vector(m.kv_lora_rank + m.qk_rope_dim, true);
    p.add_vector(m.kv_lora_rank, true);  // kv_a_layernorm
    p.add_matrix(m.kv_lora_rank, detail::checked_mul(a, m.qk_nope_dim + m.v_head_dim));
    p.add_matrix(detail::checked_mul(a, m.v_head_dim), h);
    if (f.attention_bias) p.add_vector(h, true);
    return p;
  }
  layer_shape b = s;
  if (f.attention_bias) b.flags |= layer_flags::bias;
  p += attention_params(b);
  const std::uint64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  if (f.qk_norm == qk_norm_kind::per_head) p.add_vector(2 * s.head_dim, true);
  if (f.qk_norm == qk_norm_kind::whole) p.add_vector(q + kv, true);
  if (f.attention_sinks) p.add_vector(a);
  return p;
}

/// One sparse layer's MLP: router, routed experts (expert-parallel), shared expert (dense).
constexpr param_tally family_moe_params(const family_lm_config& f, std::uint64_t hidden, bool gated) {
  const moe_spec& e = f.moe;
  param_tally p{};
  p.add_matrix(hidden, e.experts, true);
  if (e.router_bias) p.add_vector(e.experts, true);
  param_tally experts = mlp_params(hidden, e.ffn, gated, e.expert_bias).times(e.experts);
  experts.replicated = 0;  // expert biases live with their expert
  experts.expert = experts.params;
  p += experts;
  if (e.shared_ffn != 0) p += mlp_params(hidden, e.shared_ffn, gated, false);
  return p;
}

/// One block: its norms, attention and MLP (`sparse`: the mixture of experts).
constexpr param_tally family_block_params(const family_lm_config& f, const layer_shape& s, bool sparse) {
  const bool rms = (s.flags & layer_flags::rms_norm) != 0;
  const bool bias = (s.flags & layer_flags::bias) != 0;
  const bool gated = (s.flags & layer_flags::gated) != 0;
  param_tally p{};
  for (std::uint64_t i = 0; i < f.block_norms; ++i) p += norm_params(s.hidden, rms, bias);
  p += family_attention_params(f, s);
  p += sparse ? family_moe_params(f, s.hidden, gated) : mlp_params(s.hidden, s.ffn, gated, bias);
  return p;
}

constexpr layer_desc family_block(const family_lm_config& f, const layer_desc& generic, bool sparse,
                                  std::uint64_t count) {
  layer_shape s = generic.shape;
  if (f.mla.kv_lora_rank != 0) {  // a·(dn + dr)-wide query and key heads, dr of them rotated
    s.kv_heads = s.heads;
    s.head_dim = f.mla.qk_nope_dim + f.mla.qk_rope_dim;
    s.rotary_dim = f.mla.qk_rope_dim;
    s.q_lora_rank = f.mla.q_lora_rank;
    s.kv_lora_rank = f.mla.kv_lora_rank;
    s.v_head_dim = f.mla.v_head_dim;
  }
  if (sparse) {
    s.flags |= layer_flags::moe;
    s.experts = f.moe.experts;
    s.top_k = f.moe.top_k;
    s.ffn = f.moe.ffn;
    s.shared_ffn = f.moe.shared_ffn;
    s.router_fp32 = f.moe.router_fp32;
    s.router_sigmoid = f.moe.router_sigmoid;
    s.clamped_swiglu = f.moe.clamped_swiglu;
    s.router_topk_softmax = f.moe.router_topk_softmax;
    s.dense_experts = f.moe.dense_experts;
    s.router_aux_loss = f.moe.router_aux_loss;
  }
  s.l2_qk_norm = f.qk_norm == qk_norm_kind::l2;
  s.complex_rotary = f.complex_rotary;
  s.rotary_half_table = f.rotary_half_table;
  s.attention_sinks = f.attention_sinks;
  // (gpt-oss's eager softmax runs in the logits' dtype: `dtype=combined_logits.dtype`)
  if (f.attention_sinks) s.flags |= layer_flags::softmax_scores_dtype;
  // How the family's modelling code computes (what the pytorch stack saves, layer_flags).
  if (f.qk_norm == qk_norm_kind::per_head) s.flags |= layer_flags::qk_norm_per_head;
  if (f.qk_norm == qk_norm_kind::whole) s.flags |= layer_flags::qk_norm_whole;
  if (f.norms_after) s.flags |= layer_flags::norms_after;
  if (f.block_norms == 4) s.flags |= layer_flags::norms_sandwich;
  if (f.rms_weight_fp32) s.flags |= layer_flags::rms_weight_fp32;
  if (f.attention_softcap) s.flags |= layer_flags::softcap;
  if (f.rotary_tables > 1 && (s.flags & layer_flags::rotary) != 0) s.rotary_tables = f.rotary_tables;
  if (f.rotary_fp32 && (s.flags & layer_flags::rotary) != 0) s.flags |= layer_flags::rotary_fp32;
  layer_desc l = make_layer(sparse ? "moe_block" : "block", layer_kind::transformer_block,
                            family_block_params(f, generic.shape, sparse), s);
  if (sparse && f.moe.sparse_layers == generic.count) l.name = "block";
  l.count = count;
  l.place = generic.place;
  return l;
}

}  // namespace detail

/// The model: [vision tower] + embedding [+ positions] [+ dropout] + dense blocks + sparse blocks
/// + final norm + output, each entry with the parameters transformers instantiates.
constexpr model_desc family_lm(const family_lm_config& f) {
  lm_config c = f.lm;
  c.experts = c.top_k = 0;
  const model_desc generic = transformer_lm(c);
  model_desc m{};
  m.name = c.name;
  if (f.vision_params != 0) {
    param_tally v{};
    v.add_vector(f.vision_params, true);
    layer_desc l = make_layer("vision_tower", layer_kind::parameters, v, layer_shape{});
    l.place = placement::first_stage;
    m.push(l);
  }
  const std::uint64_t sparse = f.moe.experts != 0 ? (f.moe.sparse_layers < c.layers ? f.moe.sparse_layers : c.layers) : 0;
  for (const layer_desc& l : generic) {
    if (l.kind != layer_kind::transformer_block) {
      layer_desc e = l;
      if ((f.norms_after || f.rms_weight_fp32) && l.kind == layer_kind::rmsnorm) e.shape.flags |= layer_flags::rms_weight_fp32;
      if (f.logit_softcap && l.kind == layer_kind::output) e.shape.flags |= layer_flags::softcap;
      if (l.kind == layer_kind::embedding) e.buffer_bytes = f.buffer_bytes;
      m.push(e);
      continue;
    }
    // A kind of block (dense or sparse) in two entries when some of its layers attend locally
    // (Gemma's sliding_attention layers among the dense ones; gpt-oss's among its sparse ones;
    // Llama 4's chunked layers among both): the same parameters, layer_shape::window on the
    // local ones.
    // Llama 4's global layers are its NoPE layers: no rotary positions and no QK-norm, the
    // query scaled by the temperature (modeling_llama4.py, Llama4TextAttention: `use_rope`).
    const auto push_blocks = [&](bool is_sparse, std::uint64_t count, std::uint64_t local) {
      if (count > local) {
        layer_desc g = detail::family_block(f, l, is_sparse, count - local);
        if (f.nope_global) {
          g.shape.flags &= ~layer_flags::rotary;
          g.shape.l2_qk_norm = g.shape.complex_rotary = false;
          g.shape.attention_temperature = f.attention_temperature;
        }
        m.push(g);
      }
      if (local == 0) return;
      layer_desc b = detail::family_block(f, l, is_sparse, local);
      b.name = local == count ? b.name : is_sparse && b.name == "moe_block" ? "local_moe_block" : "local_block";
      b.shape.window = f.window;
      m.push(b);
    };
    const std::uint64_t dense = c.layers - sparse;
    const auto local_of = [&](std::uint64_t local, std::uint64_t n) { return f.window == 0 ? 0 : local < n ? local : n; };
    push_blocks(false, dense, local_of(f.local_layers, dense));
    push_blocks(true, sparse, local_of(f.local_sparse_layers, sparse));
  }
  return m;
}

/// Parameters a token's forward pass reads in full: every parameter except the routed experts it
/// is not sent to ((E − k)/E of each sparse layer's experts) and the token (and position)
/// embedding tables, of which a token reads one row, unless the output layer is tied to the token
/// embedding (then the output's matrix product reads all of it). This is the count the compute
/// per token follows (2 FLOPs per active parameter in the forward pass) and the convention of
/// gpt-oss's model card (5.1B active for gpt-oss-120b); Qwen's cards count the input embedding in
/// (3.3B for Qwen3-30B-A3B): `with_embedding` adds it.
constexpr std::uint64_t active_parameters(const model_desc& m, bool with_embedding = false) {
  bool tied = false;
  for (const layer_desc& l : m)
    if (l.kind == layer_kind::output && (l.shape.flags & layer_flags::tied) != 0) tied = true;
  std::uint64_t n = 0;
  for (const layer_desc& l : m) {
    std::uint64_t p = l.params;
    if (l.kind == layer_kind::transformer_block && (l.shape.flags & layer_flags::moe) != 0 && l.shape.experts != 0)
      p -= l.expert_params / l.shape.experts * (l.shape.experts - l.shape.top_k);
    if (!with_embedding && !tied && (l.kind == layer_kind::embedding || l.kind == layer_kind::position_embedding)) p = 0;
    if (!with_embedding && tied && l.kind == layer_kind::position_embedding) p = 0;
    n = detail::checked_add(n, detail::checked_mul(p, l.count));
  }
  return n;
}

// ---- vision towers (weights only) ------------------------------------------------------------

/// A SigLIP vision transformer (transformers' SiglipVisionModel; Zhai et al. 2023): a patch
/// convolution with bias, a learned position per patch, L encoder layers (two LayerNorms, q, k,
/// v, o with biases, a two-layer MLP with biases), a final LayerNorm, and, when `use_head`, the
/// attention-pooling head (probe, nn.MultiheadAttention, LayerNorm, MLP).
struct siglip_vision_shape {
  std::uint64_t hidden = 0, layers = 0, intermediate = 0, channels = 3, patch = 0, image = 0;
  bool use_head = true;
};
constexpr std::uint64_t siglip_vision_params(const siglip_vision_shape& v) {
  using detail::checked_add;
  using detail::checked_mul;
  const std::uint64_t h = v.hidden, f = v.intermediate, side = v.patch != 0 ? v.image / v.patch : 0;
  const std::uint64_t mlp = checked_add(checked_mul(2 * h, f), f + h);
  std::uint64_t n = checked_add(checked_mul(checked_mul(v.channels, v.patch * v.patch), h), h);  // patch_embedding
  n = checked_add(n, checked_mul(side * side, h));                                                // position_embedding
  const std::uint64_t layer = checked_add(checked_add(4 * h, checked_mul(4, checked_mul(h, h) + h)), mlp);
  n = checked_add(n, checked_mul(v.layers, layer));
  n = checked_add(n, 2 * h);  // post_layernorm
  if (v.use_head) n = checked_add(n, checked_add(checked_add(h, checked_mul(4, checked_mul(h, h) + h)), 2 * h + mlp));
  return n;
}

/// Gemma 3's multimodal projector: mm_input_projection_weight (vision h × text h) and
/// mm_soft_emb_norm, an RMSNorm over the vision width (modeling_gemma3.py).
constexpr std::uint64_t gemma3_projector_params(std::uint64_t vision_hidden, std::uint64_t text_hidden) {
  return detail::checked_add(detail::checked_mul(vision_hidden, text_hidden), vision_hidden);
}

/// Llama 4's vision model (modeling_llama4.py, Llama4VisionModel): an unfolded patch projection
/// without bias, a class embedding, a position per patch and the class token, LayerNorms before
/// and after, L encoder layers (q, k, v, o with biases, fc1 and fc2 with biases, two LayerNorms),
/// and the pixel-shuffle adapter (fc1 f → projector_input, fc2 projector_output², no biases); then
/// the multimodal projector (vision_output → text h, no bias).
struct llama4_vision_shape {
  std::uint64_t hidden = 0, layers = 0, intermediate = 0, channels = 3, patch = 0, image = 0;
  std::uint64_t projector_input = 0, projector_output = 0, output = 0;
};
constexpr std::uint64_t llama4_vision_params(const llama4_vision_shape& v, std::uint64_t text_hidden) {
  using detail::checked_add;
  using detail::checked_mul;
  const std::uint64_t h = v.hidden, f = v.intermediate, side = v.patch != 0 ? v.image / v.patch : 0;
  std::uint64_t n = checked_mul(checked_mul(v.channels, v.patch * v.patch), h);  // patch_embedding.linear
  n = checked_add(n, h);                                                         // class_embedding
  n = checked_add(n, checked_mul(side * side + 1, h));                           // positional_embedding_vlm
  n = checked_add(n, 4 * h);                                                     // layernorm_pre, layernorm_post
  const std::uint64_t layer = checked_add(checked_add(checked_mul(4, checked_mul(h, h) + h), checked_mul(2 * h, f) + f + h), 4 * h);
  n = checked_add(n, checked_mul(v.layers, layer));
  n = checked_add(n, checked_add(checked_mul(f, v.projector_input), checked_mul(v.projector_output, v.projector_output)));
  return checked_add(n, checked_mul(v.output, text_hidden));  // multi_modal_projector.linear_1
}

}  // namespace memalg

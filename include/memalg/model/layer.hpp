// SPDX-License-Identifier: BSL-1.0
// memalg/model/layer.hpp — the literal description every model flattens to.
//
// A model is a short list of `layer_desc` entries with multiplicities: `repeat<96, block>` is one
// entry with count 96, not 96 entries, so the arithmetic is O(entries) at compile time whatever
// the depth. Parameter counts are of one instance. The memory algebra (plan/) reads only these
// literals, so the command-line tool, which builds the same structs from flags, computes the same
// numbers as the compile-time plan.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string_view>

#include "memalg/core/dtype.hpp"
#include "memalg/train/optimizer.hpp"

namespace memalg {

/// Which pipeline stages hold an entry.
enum class placement : std::uint8_t {
  spread,       ///< a parameter mass split evenly over the stages (parameter-count models)
  repeated,     ///< `count` instances distributed over the stages, earlier stages take the remainder
  first_stage,  ///< e.g. the token embedding
  last_stage,   ///< e.g. the final norm and the output layer
};

/// What kind of layer an entry is; the activation algebra dispatches on it.
enum class layer_kind : std::uint8_t {
  parameters,  ///< parameters without layer structure (model given by count alone)
  linear,
  embedding,
  position_embedding,
  layernorm,
  rmsnorm,
  attention,
  mlp,
  gated_mlp,
  dropout,
  conv1d,
  moe,
  output,
  transformer_block,
  custom,
};

/// Shape of a layer, read by the activation algebra (zero where it does not apply).
struct layer_shape {
  std::uint64_t hidden = 0;     ///< h: model width
  std::uint64_t heads = 0;      ///< a: query heads
  std::uint64_t kv_heads = 0;   ///< key/value heads (GQA/MQA); == heads for multi-head
  std::uint64_t head_dim = 0;   ///< width of one head (h / a by default)
  std::uint64_t ffn = 0;        ///< f: MLP width
  std::uint64_t vocab = 0;      ///< v: vocabulary
  std::uint64_t in = 0;         ///< linear / conv input features
  std::uint64_t out = 0;        ///< linear / conv output features
  std::uint64_t kernel = 0;     ///< conv kernel width
  std::uint64_t experts = 0;    ///< MoE experts
  std::uint64_t top_k = 0;      ///< MoE experts per token
  std::uint64_t capacity_factor_percent = 0;  ///< MoE capacity factor × 100
  std::uint64_t chunk = 0;      ///< output layer: logits rows per chunk (0 = unchunked)
  std::uint64_t dropout_permille = 0;  ///< dropout probability × 1000 (masks exist when > 0)
  /// Blocks with layer_flags::per_site_dropout: each dropout site's own probability × 1000 (the
  /// attention probabilities; the attention output and the MLP output before their residual
  /// adds). `dropout_permille` is then the largest of them. Read through the functions below.
  std::uint64_t attention_dropout_permille = 0;
  std::uint64_t attention_output_dropout_permille = 0;
  std::uint64_t mlp_output_dropout_permille = 0;
  std::uint32_t flags = 0;      ///< layer-specific switches (layer_flags below)
  dtype logits = dtypes::none;  ///< output layer: logits dtype (none: fp32)
  std::uint64_t sequence = 0;   ///< tokens per sequence of this entry (0: the recipe's sequence)
  std::uint64_t kv_sequence = 0;  ///< cross-attention: key/value tokens (0: the entry's own sequence)
  std::uint64_t positions = 0;  ///< learned position embedding: positions it holds
  std::uint64_t rank = 0;       ///< low-rank adapters: rank r
  std::uint64_t saved_per_token = 0;  ///< custom entries: activation elements saved per token
  std::uint64_t rotary_dim = 0;  ///< rotary blocks: rotated dimensions per head (0: the whole head)
  /// Rotary blocks: the cos and sin tables the model makes once per step for its blocks, one per
  /// attention layer type with its own rotary base (Gemma 3's local and global layers: 2;
  /// Gemma3RotaryEmbedding, modeling_gemma3.py). 0 or 1: one.
  std::uint64_t rotary_tables = 0;
  /// Blocks: the sliding window of local attention, in tokens (each query attends to the last
  /// `window` keys; Gemma's sliding_attention layers); 0: global attention.
  std::uint64_t window = 0;
  /// Blocks with multi-head latent attention (DeepSeek-V2/V3, modeling_deepseek_v3.py): the
  /// query's and the key-value's compressed ranks (q_lora_rank 0: one query projection) and the
  /// value head's width; the query and key heads are `head_dim` = dn + dr wide, `rotary_dim` = dr
  /// of them rotated. kv_lora_rank 0: not MLA.
  std::uint64_t q_lora_rank = 0;
  std::uint64_t kv_lora_rank = 0;
  std::uint64_t v_head_dim = 0;
  /// MoE blocks: the shared experts' MLP width beside the routed experts (DeepSeek-V3,
  /// moe_intermediate_size × n_shared_experts; 0: none), whether the router computes its
  /// logits in fp32 from fp32 casts of its input and weight (DeepseekV3TopkRouter; Megatron's
  /// --moe-router-dtype fp32), and whether it scores the experts with a sigmoid, biased by a
  /// per-expert correction for the choice and limited to groups (DeepseekV3TopkRouter; Megatron's
  /// --moe-router-score-function sigmoid --moe-router-enable-expert-bias).
  std::uint64_t shared_ffn = 0;
  bool router_fp32 = false;
  bool router_sigmoid = false;
  /// gpt-oss (modeling_gpt_oss.py): a learned sink logit per head beside eager attention's scores
  /// (GptOssAttention's `sinks`); the experts' clamped SwiGLU with biases (GptOssExperts,
  /// `_apply_gate`); the router's softmax over its top-k logits only (GptOssTopKRouter).
  bool attention_sinks = false;
  bool clamped_swiglu = false;
  bool router_topk_softmax = false;
  /// Llama 4 (modeling_llama4.py): the rotary embedding as a complex product of fp32 copies of
  /// the query and key (`apply_rotary_emb`, `view_as_complex(xq.float()...)`, one complex64 table
  /// of s × d/2); the weightless L2 norm on the rotated query and key (Llama4TextL2Norm); on the
  /// NoPE layers, attention temperature tuning (the query times a per-position fp32 scale); and
  /// the experts computed over every expert for every token (Llama4TextMoe: the input repeated
  /// once per expert, scaled by the sigmoid of its routing score, batched products over all).
  bool complex_rotary = false;
  bool l2_qk_norm = false;
  /// gpt-oss (GptOssRotaryEmbedding): cos and sin of d/2 frequencies, not concatenated to d
  /// (`emb = freqs`), which its rotation applies to each half (`_apply_rotary_emb`).
  bool rotary_half_table = false;
  bool attention_temperature = false;
  bool dense_experts = false;
  /// MoE blocks: the router balances the load with Sinkhorn's algorithm, Megatron-core's
  /// TopKRouter under `--moe-router-load-balancing-type sinkhorn` (router.py,
  /// `sinkhorn_load_balancing`: the experts are chosen on the Sinkhorn-normalised logits, the
  /// scores are a sigmoid of the logits for top-1 and a softmax otherwise), not a softmax top-k.
  bool router_sinkhorn = false;
  /// MoE blocks: the model keeps the router's logits for Hugging Face's auxiliary
  /// load-balancing loss (`output_router_logits`; `load_balancing_loss_func` in
  /// modeling_mixtral.py, modeling_qwen3_moe.py and modeling_gpt_oss.py).
  bool router_aux_loss = false;
  /// MoE blocks under the megatron stack: Megatron-core's all-to-all token dispatcher
  /// (`--moe-token-dispatcher-type alltoall`, MoEAlltoAllTokenDispatcher in token_dispatcher.py)
  /// instead of its default allgather one.
  bool moe_alltoall = false;
  /// Low-rank adapters (Hu et al. 2021, arXiv 2106.09685; PEFT's LoraLayer). On a block (whose
  /// own weights are frozen, layer_flags::adapted): the rank of its adapters, the projections
  /// that carry one (lora_target bits) and the adapters' dropout × 1000 (PEFT's `lora_dropout`,
  /// one dropout per adapted projection); on the trainable entry that holds the adapters' A and
  /// B matrices (a custom entry, compose.hpp): the same three. `lora_adapter_bits`: the adapters'
  /// dtype, 0 for fp32 (PEFT's `autocast_adapter_dtype`, on by default, keeps them fp32 under a
  /// bf16 or fp16 base).
  std::uint64_t lora_rank = 0;
  std::uint64_t lora_targets = 0;
  std::uint64_t lora_dropout_permille = 0;
  std::uint64_t lora_adapter_bits = 0;
  /// Blocks without `bias`: the norms keep their shift all the same (Megatron's
  /// `--disable-bias-linear` removes the linear layers' biases only; Transformer Engine's
  /// LayerNorm always has one).
  bool norm_bias = false;
  /// Norms and blocks: ε added under the norm's square root (0: the kind's default,
  /// default_norm_eps). Hugging Face configs name it `layer_norm_epsilon`, `layer_norm_eps`,
  /// `rms_norm_eps`.
  double norm_eps = 0;
};

/// ε of a LayerNorm (PyTorch's nn.LayerNorm default, 1e-5) or an RMSNorm (1e-6, Llama's
/// `rms_norm_eps` default, transformers' LlamaConfig) when the model names none.
constexpr double default_norm_eps(bool rms) { return rms ? 1e-6 : 1e-5; }

/// The ε a norm of this shape uses: its own, or its kind's default.
constexpr double norm_eps_of(const layer_shape& s, bool rms) { return s.norm_eps > 0 ? s.norm_eps : default_norm_eps(rms); }

/// The projections of a transformer block that low-rank adapters can target
/// (layer_shape::lora_targets), by Hugging Face's module names: the attention's q_proj, k_proj,
/// v_proj and o_proj (a fused query-key-value projection is `q`), the MLP's gate_proj, up_proj
/// and down_proj (a GeLU MLP's first projection is `up`, its second `down`).
namespace lora_target {
inline constexpr std::uint64_t q = 1u << 0;
inline constexpr std::uint64_t k = 1u << 1;
inline constexpr std::uint64_t v = 1u << 2;
inline constexpr std::uint64_t o = 1u << 3;
inline constexpr std::uint64_t gate = 1u << 4;
inline constexpr std::uint64_t up = 1u << 5;
inline constexpr std::uint64_t down = 1u << 6;
inline constexpr std::uint64_t attention = q | k | v | o;
inline constexpr std::uint64_t mlp = gate | up | down;
/// PEFT's `target_modules="all-linear"`: every linear layer but the output layer.
inline constexpr std::uint64_t all_linear = attention | mlp;
}  // namespace lora_target

/// Bits of `layer_shape::flags`. Which ones a kind reads is documented with its builder
/// (model/layers.hpp, model/transformer.hpp).
namespace layer_flags {
inline constexpr std::uint32_t bias = 1u << 0;             ///< linear layers carry biases
inline constexpr std::uint32_t gated = 1u << 1;            ///< block / MoE: SwiGLU MLP instead of GeLU
inline constexpr std::uint32_t rms_norm = 1u << 2;         ///< block: RMSNorm instead of LayerNorm
inline constexpr std::uint32_t flash = 1u << 3;            ///< attention saves output + log-sum-exp (else naive)
inline constexpr std::uint32_t causal = 1u << 4;           ///< attention is causal (changes no saved bytes)
inline constexpr std::uint32_t tied = 1u << 5;             ///< output layer shares the token embedding
inline constexpr std::uint32_t cross_attention = 1u << 6;  ///< block: decoder block with cross-attention
inline constexpr std::uint32_t adapted = 1u << 7;          ///< frozen base whose inputs trainable adapters need
inline constexpr std::uint32_t activation = 1u << 8;       ///< linear / conv followed by a nonlinearity
inline constexpr std::uint32_t batchnorm = 1u << 9;        ///< conv followed by batch normalisation
inline constexpr std::uint32_t moe = 1u << 10;             ///< block: the MLP is a mixture of experts
/// output layer: the vocabulary is not split by tensor parallelism (every rank computes all
/// logits; the CPU runtime's convention), instead of Megatron's vocabulary-parallel layer
inline constexpr std::uint32_t vocab_replicated = 1u << 11;
// How a block's modelling code computes (what the `pytorch` stack saves; no parameter changes):
inline constexpr std::uint32_t rotary = 1u << 12;             ///< block: rotary positions (rotated Q, K copies)
inline constexpr std::uint32_t parallel_residual = 1u << 13;  ///< block: attention and MLP read one input (GPT-NeoX, Falcon)
inline constexpr std::uint32_t fused_qkv = 1u << 14;          ///< block: one projection writes Q, K and V
inline constexpr std::uint32_t gelu_tanh = 1u << 15;          ///< block: GeLU written out as its tanh formula (GPT-2's gelu_new)
inline constexpr std::uint32_t shared_norm = 1u << 16;        ///< block: one norm feeds attention and MLP (Falcon-7B)
inline constexpr std::uint32_t unfused_attention = 1u << 17;  ///< block: the attention keeps its scores whatever is asked (Falcon-7B)
inline constexpr std::uint32_t residual_dropout = 1u << 18;   ///< block: dropout on each sub-layer's output (GPT-2, GPT-NeoX)
/// block without `bias`: the query, key and value projections still have biases (Qwen2's
/// q_proj/k_proj/v_proj with bias=True, o_proj and the MLP without; modeling_qwen2.py)
inline constexpr std::uint32_t qkv_bias = 1u << 19;
/// linear / conv with `activation`: the nonlinearity is tanh, not ReLU (what memalg's runtime
/// computes; the same bytes either way)
inline constexpr std::uint32_t tanh = 1u << 20;
/// custom entry: an encoder's output that every cross-attention of the decoder reads (set by
/// encoder_decoder)
inline constexpr std::uint32_t encoder_output = 1u << 21;
/// block: each dropout site has its own probability (layer_shape's *_dropout_permille, as a
/// Hugging Face config names them: GPT-2's attn_pdrop and resid_pdrop, GPT-NeoX's and Falcon's
/// attention_dropout and hidden_dropout); without it `dropout_permille` is every site's.
inline constexpr std::uint32_t per_site_dropout = 1u << 22;
/// block: eager attention's softmax runs in the scores' dtype (GPT-2's `softmax(attn_weights)`),
/// not in fp32 with a cast back (Llama's `softmax(..., dtype=torch.float32).to(query.dtype)`).
inline constexpr std::uint32_t softmax_scores_dtype = 1u << 23;
/// block: eager attention's softmax runs in the residual stream's dtype (Falcon's
/// `F.softmax(..., dtype=hidden_states.dtype)`), not in fp32.
inline constexpr std::uint32_t softmax_stream_dtype = 1u << 24;
/// block: an RMSNorm over head_dim on each head of the query and of the key, after their
/// projections and before the rotary embedding (Qwen3's q_norm and k_norm, modeling_qwen3.py;
/// one weight shared by the heads).
inline constexpr std::uint32_t qk_norm_per_head = 1u << 25;
/// block: an RMSNorm over the whole query projection (heads·head_dim) and one over the whole key
/// projection (kv_heads·head_dim), before the view to heads (OLMo 2's q_norm and k_norm,
/// modeling_olmo2.py; its RMSNorm multiplies by the weight in fp32 and casts back after).
inline constexpr std::uint32_t qk_norm_whole = 1u << 26;
/// block: no norm before the sub-layers; a norm on each sub-layer's output before its residual
/// add, `h = x + norm(attn(x)); out = h + norm(mlp(h))` (OLMo 2's post_attention_layernorm and
/// post_feedforward_layernorm, modeling_olmo2.py). With rms_norm, OLMo 2's RMSNorm.
inline constexpr std::uint32_t norms_after = 1u << 27;
/// RMSNorm entry: the norm multiplies by its weight in fp32 and casts the product back, so the
/// normalised input it keeps for the weight's gradient stays fp32 (OLMo 2's Olmo2RMSNorm,
/// `(self.weight * hidden_states).to(input_dtype)`, modeling_olmo2.py; the final norm of a model
/// whose blocks have norms_after).
inline constexpr std::uint32_t rms_weight_fp32 = 1u << 28;
/// block with rotary: the rotary cos and sin tables stay fp32 whatever the activation dtype, and
/// the rotated query and key are cast back (Olmo2RotaryEmbedding returns them without
/// `.to(x.dtype)`; apply_rotary_pos_emb ends with `q_embed.to(q_type)`, modeling_olmo2.py).
inline constexpr std::uint32_t rotary_fp32 = 1u << 29;
/// block: a norm both before and after each sub-layer, `h = x + post(attn(pre(x)))`, the same for
/// the MLP (Gemma 2's and Gemma 3's input_layernorm, post_attention_layernorm,
/// pre_feedforward_layernorm and post_feedforward_layernorm, modeling_gemma2.py). With
/// rms_weight_fp32 on the block, every RMSNorm of it (QK-norms too) multiplies by its weight in
/// fp32 (Gemma2RMSNorm's `output * (1.0 + self.weight.float())`, cast after).
inline constexpr std::uint32_t norms_sandwich = 1u << 30;
/// block: eager attention soft-caps its scores, `tanh(s / c) · c` before the mask (Gemma 2's
/// attn_logit_softcapping; SDPA takes no soft-cap and transformers' SDPA path drops it);
/// output: the logits are soft-capped the same way (final_logit_softcapping, modeling_gemma2.py).
inline constexpr std::uint32_t softcap = 1u << 31;
}  // namespace layer_flags

/// A block's dropout probability (× 1000) at each site: on the attention probabilities, and on
/// the attention and MLP outputs before their residual adds (the latter two only with
/// layer_flags::residual_dropout unless the sites are given one by one).
constexpr std::uint64_t attention_dropout_permille(const layer_shape& s) {
  return (s.flags & layer_flags::per_site_dropout) != 0 ? s.attention_dropout_permille : s.dropout_permille;
}
constexpr std::uint64_t attention_output_dropout_permille(const layer_shape& s) {
  if ((s.flags & layer_flags::per_site_dropout) != 0) return s.attention_output_dropout_permille;
  return (s.flags & layer_flags::residual_dropout) != 0 ? s.dropout_permille : 0;
}
constexpr std::uint64_t mlp_output_dropout_permille(const layer_shape& s) {
  if ((s.flags & layer_flags::per_site_dropout) != 0) return s.mlp_output_dropout_permille;
  return (s.flags & layer_flags::residual_dropout) != 0 ? s.dropout_permille : 0;
}

/// Values of `layer_desc::group`.
namespace layer_group {
inline constexpr std::uint32_t trained = 0;  ///< the model being trained
inline constexpr std::uint32_t teacher = 1;  ///< a frozen teacher: forward only (knowledge distillation)
}  // namespace layer_group

struct layer_desc {
  std::string_view name{};
  layer_kind kind = layer_kind::parameters;
  std::uint64_t count = 1;                  ///< instances
  placement place = placement::repeated;
  std::uint64_t params = 0;                 ///< parameters of one instance
  std::uint64_t tp_replicated_params = 0;   ///< part not split by tensor parallelism (norms, some biases)
  std::uint64_t expert_params = 0;          ///< part split over expert-parallel ranks
  std::uint64_t matrix_params = 0;          ///< part stored as 2-D matrices (Adafactor factors these)
  std::uint64_t matrix_rows_plus_cols = 0;  ///< Σ (rows + columns) over those matrices
  std::uint64_t gather_params = 0;          ///< parameters ZeRO-3 gathers at once for one instance
  bool trainable = true;                    ///< frozen layers have no gradients or optimizer states
  /// Bytes of module buffers one instance holds besides its parameters: resident on every rank
  /// of its stage, never sharded, trained or counted as parameters (GPT-BigCode's causal mask,
  /// `register_buffer("bias", torch.tril(torch.ones(n, n, dtype=torch.bool)))`).
  std::uint64_t buffer_bytes = 0;
  dtype weight_storage = dtypes::none;      ///< overrides the policy's weight dtype (quantized base)
  layer_shape shape{};
  /// Which sub-model the entry belongs to (layer_group): the trained model, or a distillation
  /// teacher that only runs forward.
  std::uint32_t group = 0;
};

/// At most this many entries per model (a transformer needs about six).
inline constexpr std::size_t max_model_entries = 48;

// Not constexpr: reaching it while building a model at compile time is an error naming the problem.
[[noreturn]] inline void too_many_model_entries() {
  throw std::length_error("memalg: a model has more layer entries than max_model_entries");
}

struct model_desc {
  std::string_view name{};
  /// A built-in array rather than std::array: in constant evaluation every std::array subscript
  /// is a function call, and a compile-time search subscripts entries hundreds of thousands of times.
  layer_desc entries[max_model_entries]{};
  std::size_t size = 0;

  constexpr void push(const layer_desc& l) {
    if (size >= max_model_entries) too_many_model_entries();
    entries[size++] = l;
  }
  constexpr const layer_desc* begin() const { return entries; }
  constexpr const layer_desc* end() const { return entries + size; }

  /// Total parameters over every instance of every entry.
  constexpr std::uint64_t parameters() const {
    std::uint64_t n = 0;
    for (const layer_desc& l : *this) n = detail::checked_add(n, detail::checked_mul(l.params, l.count));
    return n;
  }
  constexpr std::uint64_t trainable_parameters() const {
    std::uint64_t n = 0;
    for (const layer_desc& l : *this)
      if (l.trainable) n = detail::checked_add(n, detail::checked_mul(l.params, l.count));
    return n;
  }
  /// Number of repeated instances (what pipeline parallelism splits).
  constexpr std::uint64_t repeated_layers() const {
    std::uint64_t n = 0;
    for (const layer_desc& l : *this)
      if (l.place == placement::repeated) n += l.count;
    return n;
  }
};

template <class M>
concept model_type = requires {
  { M::value } -> std::convertible_to<model_desc>;
};

}  // namespace memalg

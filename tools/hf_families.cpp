// SPDX-License-Identifier: BSL-1.0
// tools/hf_families.cpp — config.json of the families of 2024–2026 read as a layer-level model.
//
// Each family's fields, names and defaults are those of its config class in transformers 5.17
// (models/<family>/configuration_<family>.py); the parameters are counted by family_lm
// (model/families.hpp) from the module shapes of its modelling file. tests/data/hf/counts.json
// holds what transformers itself instantiates from the configurations of tests/data/hf/ on the
// meta device (bench/torch/hf_counts.py); tools/test_planner.cpp checks every count against it.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "hf_reader.hpp"
#include "memalg/model/families.hpp"

namespace memalg::cli::hf {

namespace {

/// The SwiGLU families' `hidden_act` (or Gemma's `hidden_activation`): anything but `expected`
/// is refused, its memory is not modelled.
void require_activation(const reader& r, std::initializer_list<const char*> names, const char* expected,
                        const char* planned) {
  const std::string a = r.string_or(names, expected);
  if (a != expected) r.fail("unknown activation '" + shown(a) + "' in '" + *names.begin() + "' (planned: " + planned + ")");
}

/// Whether a soft-capping field (Gemma's attn_logit_softcapping, final_logit_softcapping) caps:
/// a positive number does, null does not, absent is the config class's default.
bool softcapped(const reader& r, const char* name, bool fallback) {
  const auto it = r.j.find(name);
  if (it == r.j.end()) return fallback;
  if (it->is_null()) return false;
  if (!it->is_number() || !(it->get<double>() > 0))
    r.fail("field '" + std::string(name) + "' must be a positive number or null, not " + it->dump());
  return true;
}

/// Attention layer types (Gemma 2 and 3, gpt-oss): `layer_types` ("sliding_attention" or
/// "full_attention" per layer), else the config class's pattern (Gemma2Config and GptOssConfig:
/// sliding at even indices; Gemma3TextConfig: global every `sliding_window_pattern`-th layer,
/// default 6). Returns how many layers are sliding.
std::uint64_t sliding_layers(const reader& r, std::uint64_t layers, bool gemma3) {
  std::uint64_t sliding = 0;
  const auto it = r.j.find("layer_types");
  if (it != r.j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != layers)
      r.fail("field 'layer_types' must list one type per layer (" + std::to_string(layers) + "), not " + it->dump());
    for (const json& v : *it) {
      const std::string t = v.is_string() ? v.get<std::string>() : "";
      if (t == "sliding_attention") ++sliding;
      else if (t != "full_attention") r.fail("field 'layer_types' may hold 'sliding_attention' and 'full_attention' only, not " + v.dump());
    }
  } else {
    const std::uint64_t pattern = gemma3 ? r.count_or({"sliding_window_pattern"}, 6) : 2;
    if (pattern == 0) r.fail("field 'sliding_window_pattern' must be at least 1");
    sliding = local_layers_of_pattern(layers, pattern);
  }
  return sliding;
}

/// A list of layer indices (Qwen3-MoE's mlp_only_layers, Llama 4's moe_layers): how many lie in
/// [0, layers) and satisfy `keep`.
template <class Keep>
std::uint64_t count_layers(const reader& r, const char* name, std::uint64_t layers, Keep keep) {
  const auto it = r.j.find(name);
  std::uint64_t n = 0;
  for (std::uint64_t i = 0; i < layers; ++i) {
    bool listed = false;
    if (it != r.j.end() && !it->is_null()) {
      if (!it->is_array()) r.fail("field '" + std::string(name) + "' must be a list of layer indices, not " + it->dump());
      for (const json& v : *it) {
        if (!v.is_number_integer()) r.fail("field '" + std::string(name) + "' must be a list of layer indices, not " + it->dump());
        listed = listed || (v.get<std::int64_t>() >= 0 && static_cast<std::uint64_t>(v.get<std::int64_t>()) == i);
      }
    }
    n += keep(i, listed) ? 1 : 0;
  }
  return n;
}

/// The dimensions every family names alike (hidden_size, num_hidden_layers, …), with the
/// config class's head_dim default (`head_dim` 0: hidden / heads).
void read_dimensions(const reader& r, lm_config& c, std::uint64_t head_dim) {
  c.hidden = r.count({"hidden_size"});
  c.layers = r.count({"num_hidden_layers"});
  c.heads = r.count({"num_attention_heads"});
  c.kv_heads = r.count_or({"num_key_value_heads"}, c.heads);
  c.vocab = r.count({"vocab_size"});
  c.ffn = r.count({"intermediate_size"});
  if (r.find({"head_dim"}) != nullptr) c.head_dim = r.count({"head_dim"});
  else if (head_dim != 0) c.head_dim = head_dim;
  else if (c.hidden % c.heads != 0) r.fail("'hidden_size' must be a multiple of 'num_attention_heads'");
  else c.head_dim = c.hidden / c.heads;
  if (c.heads % c.kv_heads != 0) r.fail("'num_key_value_heads' must divide 'num_attention_heads'");
}

/// What every vision tower names alike (SiglipVisionConfig's and Llama4VisionConfig's names and
/// defaults) into `s`.
template <class Shape>
void read_vision_dimensions(const reader& v, Shape& s) {
  s.hidden = v.count({"hidden_size"});
  s.layers = v.count({"num_hidden_layers"});
  s.intermediate = v.count({"intermediate_size"});
  s.channels = v.count_or({"num_channels"}, 3);
  s.patch = v.count({"patch_size"});
  s.image = v.count({"image_size"});
  if (s.image % s.patch != 0) v.fail("'image_size' must be a multiple of 'patch_size'");
}

/// SigLIP, Gemma 3's vision tower, and Gemma 3's projector onto `text_hidden`.
std::uint64_t gemma3_vision_from(const reader& v, std::uint64_t text_hidden) {
  siglip_vision_shape s{};
  read_vision_dimensions(v, s);
  s.use_head = v.flag_or({"vision_use_head"}, true);
  return add(siglip_vision_params(s), gemma3_projector_params(s.hidden, text_hidden));
}

/// Llama 4's vision model and projector onto `text_hidden`.
std::uint64_t llama4_vision_from(const reader& v, std::uint64_t text_hidden) {
  llama4_vision_shape s{};
  read_vision_dimensions(v, s);
  s.projector_input = v.count({"projector_input_dim"});
  s.projector_output = v.count({"projector_output_dim"});
  s.output = v.count({"vision_output_dim"});
  return llama4_vision_params(s, text_hidden);
}

/// A multimodal release's vision tower: `from` applied to its `vision_config`, which it must have.
std::uint64_t vision_params(const json& top, std::string_view source, const hf_model& m, std::uint64_t text_hidden,
                            std::uint64_t (*from)(const reader&, std::uint64_t)) {
  const auto v = top.find("vision_config");
  if (v == top.end() || !v->is_object())
    throw usage_error(std::string(source) + ": missing field 'vision_config' (needed for " + shown(m.architecture) + ")");
  const std::string vision_source = std::string(source) + " (vision_config)";  // the reader keeps a view
  return from(reader{*v, vision_source, m.architecture}, text_hidden);
}

}  // namespace

bool current_family(std::string_view family) {
  for (std::string_view f : {"qwen3", "qwen3_moe", "gemma2", "gemma3", "phi3", "olmo2", "starcoder2", "gpt_bigcode",
                             "deepseek_v3", "gpt_oss", "llama4"})
    if (f == family) return true;
  return false;
}

hf_model read_current_family(const json& top, hf_model m, std::string_view source, const import_options& options) {
  const std::string_view family = m.family;
  // Without `architectures`, AutoModelForCausalLM builds a Gemma3Config (model_type gemma3) as
  // Gemma3ForConditionalGeneration, and a Llama4Config as the text-only Llama4ForCausalLM
  // (transformers 5.17, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES).
  const bool multimodal = m.architecture.ends_with("ForConditionalGeneration") || m.architecture == "gemma3";
  // Multimodal releases keep the language model's fields under text_config (Gemma3Config,
  // Llama4Config); a text-only class may also be given one.
  const json* text = &top;
  std::string text_source(source);
  if (const auto t = top.find("text_config"); t != top.end() && !t->is_null()) {
    if (!t->is_object()) throw usage_error(std::string(source) + ": field 'text_config' must be an object");
    text = &*t;
    text_source += " (text_config)";
  } else if (multimodal) {
    throw usage_error(std::string(source) + ": missing field 'text_config' (needed for " + shown(m.architecture) + ")");
  }
  const reader r{*text, text_source, m.architecture};

  family_lm_config f{};
  lm_config& c = f.lm;
  c.name = family;
  c.flash = options.flash;
  c.causal = true;
  c.rms_norm = true;
  c.gated = true;
  c.bias = false;
  c.rotary = true;
  c.tied = false;
  double eps_default = 1e-6;
  const char* eps_name = "rms_norm_eps";

  if (family == "qwen3" || family == "qwen3_moe") {
    // Qwen3Config / Qwen3MoeConfig: Qwen2's layout without the q, k, v biases, with QK-norm per
    // head (modeling_qwen3.py, q_norm and k_norm over head_dim).
    read_dimensions(r, c, 128);
    require_activation(r, {"hidden_act"}, "silu", "silu, the SwiGLU MLP");
    f.qk_norm = qk_norm_kind::per_head;
    f.attention_bias = r.flag_or({"attention_bias"}, false);
    c.tied = r.flag_or({"tie_word_embeddings"}, false);
    if (family == "qwen3_moe") {
      // A layer is sparse unless listed in mlp_only_layers, when (i + 1) % decoder_sparse_step == 0
      // (Qwen3MoeDecoderLayer).
      f.moe.experts = r.count({"num_experts", "num_local_experts"});
      f.moe.top_k = r.count({"num_experts_per_tok"});
      f.moe.ffn = r.count({"moe_intermediate_size"});
      const std::uint64_t step = r.count_or({"decoder_sparse_step"}, 1);
      f.moe.sparse_layers = count_layers(r, "mlp_only_layers", c.layers,
                                         [&](std::uint64_t i, bool listed) { return !listed && (i + 1) % step == 0; });
    }
  } else if (family == "gemma2" || family == "gemma3") {
    // Gemma2Config / Gemma3TextConfig: four RMSNorms per block, each multiplying by (1 + w) in
    // fp32, GeGLU (hidden_activation), the embedding scaled by √h (no parameter), the output tied;
    // Gemma 2 soft-caps scores and logits by default; Gemma 3 adds QK-norm per head and a rotary
    // table per layer type (local and global bases).
    read_dimensions(r, c, 256);
    require_activation(r, {"hidden_activation", "hidden_act"}, "gelu_pytorch_tanh", "gelu_pytorch_tanh, GeGLU");
    f.block_norms = 4;
    f.rms_weight_fp32 = true;
    f.attention_softcap = softcapped(r, "attn_logit_softcapping", family == "gemma2");
    f.logit_softcap = softcapped(r, "final_logit_softcapping", family == "gemma2");
    f.local_layers = sliding_layers(r, c.layers, family == "gemma3");
    f.window = r.count_or_none({"sliding_window"}, 4096);
    if (f.window == 0 || f.local_layers == 0) f.window = f.local_layers = 0;
    if (family == "gemma3") f.rotary_tables = (f.local_layers != 0 ? 1 : 0) + (f.local_layers < c.layers ? 1 : 0);
    f.attention_bias = r.flag_or({"attention_bias"}, false);
    if (family == "gemma3") f.qk_norm = qk_norm_kind::per_head;
    c.tied = r.flag_or({"tie_word_embeddings"}, true);
    if (family == "gemma3" && multimodal) f.vision_params = vision_params(top, source, m, c.hidden, gemma3_vision_from);
  } else if (family == "phi3") {
    // Phi3Config: Llama's layout with qkv_proj and gate_up_proj fused (the same parameters).
    read_dimensions(r, c, 0);
    require_activation(r, {"hidden_act"}, "silu", "silu, the SwiGLU MLP");
    c.fused_qkv = true;
    c.tied = r.flag_or({"tie_word_embeddings"}, false);
    eps_default = 1e-5;
  } else if (family == "olmo2") {
    // Olmo2Config: norms after attention and after the MLP, QK-norm over the whole projections.
    read_dimensions(r, c, 0);
    require_activation(r, {"hidden_act"}, "silu", "silu, the SwiGLU MLP");
    f.qk_norm = qk_norm_kind::whole;
    f.norms_after = true;
    f.rotary_fp32 = true;  // Olmo2RotaryEmbedding: cos and sin without .to(x.dtype)
    f.attention_bias = r.flag_or({"attention_bias"}, false);
    c.tied = r.flag_or({"tie_word_embeddings"}, false);
    eps_default = 1e-5;
  } else if (family == "starcoder2") {
    // Starcoder2Config: LayerNorms, a GeLU MLP (c_fc, c_proj), biases everywhere with use_bias.
    read_dimensions(r, c, 0);
    c.rms_norm = false;
    c.gated = false;
    c.bias = r.flag_or({"use_bias"}, true);
    c.gelu_tanh = gelu_kind(r, {"hidden_act"}, "gelu_pytorch_tanh");
    c.tied = r.flag_or({"tie_word_embeddings"}, true);
    eps_default = 1e-5;
    eps_name = "norm_epsilon";
  } else if (family == "gpt_bigcode") {
    // GPTBigCodeConfig: GPT-2 with multi-query attention (c_attn h → h + 2·head_dim).
    c.hidden = r.count({"n_embd", "hidden_size"});
    c.layers = r.count({"n_layer", "num_hidden_layers"});
    c.heads = r.count({"n_head", "num_attention_heads"});
    c.vocab = r.count({"vocab_size"});
    c.positions = r.count({"n_positions", "max_position_embeddings"});
    c.ffn = r.count_or({"n_inner"}, 4 * c.hidden);
    if (c.hidden % c.heads != 0) r.fail("'n_embd' must be a multiple of 'n_head'");
    c.head_dim = c.hidden / c.heads;
    c.kv_heads = r.flag_or({"multi_query"}, true) ? 1 : c.heads;
    // GPTBigCodeModel's causal mask is a buffer of n_positions² booleans (modeling_gpt_bigcode.py,
    // `register_buffer("bias", torch.tril(torch.ones((max_positions, max_positions),
    // dtype=torch.bool)), persistent=False)`): 64 MiB at 8192 positions.
    f.buffer_bytes = mul(c.positions, c.positions);
    c.rms_norm = false;
    c.gated = false;
    c.bias = true;
    c.rotary = false;
    c.fused_qkv = true;
    c.gelu_tanh = gelu_kind(r, {"activation_function"}, "gelu_pytorch_tanh");
    c.tied = r.flag_or({"tie_word_embeddings"}, true);
    eps_default = 1e-5;
    eps_name = "layer_norm_epsilon";
  } else if (family == "deepseek_v3") {
    // DeepseekV3Config: multi-head latent attention; the first first_k_dense_replace layers
    // dense (intermediate_size), the others sparse (n_routed_experts of moe_intermediate_size
    // and one shared expert of moe_intermediate_size × n_shared_experts).
    c.hidden = r.count({"hidden_size"});
    c.layers = r.count({"num_hidden_layers"});
    c.heads = r.count({"num_attention_heads"});
    c.kv_heads = c.heads;
    c.vocab = r.count({"vocab_size"});
    c.ffn = r.count({"intermediate_size"});
    require_activation(r, {"hidden_act"}, "silu", "silu, the SwiGLU MLP");
    f.mla.q_lora_rank = r.find({"q_lora_rank"}) != nullptr ? r.count({"q_lora_rank"}) : 0;
    f.mla.kv_lora_rank = r.count({"kv_lora_rank"});
    f.mla.qk_nope_dim = r.count({"qk_nope_head_dim"});
    f.mla.qk_rope_dim = r.count({"qk_rope_head_dim"});
    f.mla.v_head_dim = r.count({"v_head_dim"});
    c.head_dim = f.mla.qk_nope_dim + f.mla.qk_rope_dim;
    f.attention_bias = r.flag_or({"attention_bias"}, false);
    f.moe.experts = r.count({"n_routed_experts", "num_local_experts"});
    f.moe.top_k = r.count({"num_experts_per_tok"});
    f.moe.ffn = r.count({"moe_intermediate_size"});
    f.moe.shared_ffn = mul(f.moe.ffn, r.count_or_none({"n_shared_experts"}, 1));
    f.moe.router_fp32 = true;  // DeepseekV3TopkRouter: F.linear(hidden.type(float32), weight.type(float32))
    f.moe.router_sigmoid = true;  // DeepseekV3TopkRouter: sigmoid, e_score_correction_bias, n_group / topk_group
    const std::uint64_t dense = std::min(r.count_or_none({"first_k_dense_replace"}, 0), c.layers);
    f.moe.sparse_layers = c.layers - dense;
    c.tied = r.flag_or({"tie_word_embeddings"}, false);
    if (r.count_or_none({"num_nextn_predict_layers"}, 0) != 0)
      m.notes.push_back("the multi-token-prediction layers (num_nextn_predict_layers) are not built by transformers "
                        "and are not counted");
  } else if (family == "gpt_oss") {
    // GptOssConfig: biases on q, k, v, o, a sink logit per head; every layer sparse, the router
    // and the experts with biases (modeling_gpt_oss.py).
    read_dimensions(r, c, 64);
    require_activation(r, {"hidden_act"}, "silu", "silu, gpt-oss's clamped SwiGLU");
    f.attention_bias = r.flag_or({"attention_bias"}, true);
    f.attention_sinks = true;
    f.moe.experts = r.count({"num_local_experts", "num_experts"});
    f.moe.top_k = r.count({"num_experts_per_tok", "experts_per_token"});
    f.moe.ffn = c.ffn;
    f.moe.sparse_layers = c.layers;
    f.moe.router_bias = f.moe.expert_bias = true;
    f.moe.clamped_swiglu = f.moe.router_topk_softmax = true;
    // GptOssRMSNorm: `(self.weight * hidden_states).to(input_dtype)`, the product in fp32.
    f.rms_weight_fp32 = true;
    // GptOssRotaryEmbedding returns cos and sin of the d/2 frequencies (`emb = freqs`).
    f.rotary_half_table = true;
    // GptOssConfig's layer_types: sliding_attention at even indices unless listed (Gemma 2's
    // pattern), with a window of sliding_window (128).
    f.local_sparse_layers = sliding_layers(r, c.layers, false);
    f.window = r.count_or_none({"sliding_window"}, 128);
    if (f.window == 0 || f.local_sparse_layers == 0) f.window = f.local_sparse_layers = 0;
    c.tied = r.flag_or({"tie_word_embeddings"}, false);
    eps_default = 1e-5;
  } else {  // llama4
    // Llama4TextConfig: sparse layers (moe_layers, else every interleave_moe_layer_step-th) with
    // num_local_experts of intermediate_size and a shared expert of the same width; dense layers
    // of intermediate_size_mlp; the QK-norm is an L2 norm without weights.
    read_dimensions(r, c, 128);
    require_activation(r, {"hidden_act"}, "silu", "silu, the SwiGLU MLP");
    f.attention_bias = r.flag_or({"attention_bias"}, false);
    f.moe.experts = r.count({"num_local_experts"});
    f.moe.top_k = r.count_or({"num_experts_per_tok"}, 1);
    f.moe.ffn = c.ffn;
    f.moe.shared_ffn = c.ffn;
    f.moe.dense_experts = true;
    c.ffn = r.count({"intermediate_size_mlp"});
    std::vector<bool> sparse(c.layers), rope(c.layers);
    if (r.find({"moe_layers"}) != nullptr) {
      f.moe.sparse_layers = count_layers(r, "moe_layers", c.layers, [&](std::uint64_t i, bool listed) { return sparse[i] = listed; });
    } else {
      const std::uint64_t step = r.count_or({"interleave_moe_layer_step"}, 1);
      if (step == 0) r.fail("field 'interleave_moe_layer_step' must be at least 1");
      f.moe.sparse_layers = count_layers(r, "moe_layers", c.layers, [&](std::uint64_t i, bool) { return sparse[i] = (i + 1) % step == 0; });
    }
    // Which layers rotate (no_rope_layers: 1 for a rotary layer, else every
    // no_rope_layer_interval-th layer is NoPE) and attend in chunks (layer_types, by default
    // "chunked_attention" exactly on the rotary layers; Llama4TextConfig.__post_init__).
    const json* flags = r.find({"no_rope_layers"});
    if (flags != nullptr && !(flags->is_array() && flags->empty())) {
      if (!flags->is_array() || flags->size() != c.layers)
        r.fail("field 'no_rope_layers' must hold a 0 or 1 per layer (" + std::to_string(c.layers) + "), not " + flags->dump());
      for (std::uint64_t i = 0; i < c.layers; ++i) {
        const json& v = (*flags)[i];
        if (!v.is_number_integer() || (v.get<std::int64_t>() != 0 && v.get<std::int64_t>() != 1))
          r.fail("field 'no_rope_layers' must hold a 0 or 1 per layer, not " + flags->dump());
        rope[i] = v.get<std::int64_t>() == 1;
      }
    } else {
      const std::uint64_t interval = r.count_or({"no_rope_layer_interval"}, 4);
      if (interval == 0) r.fail("field 'no_rope_layer_interval' must be at least 1");
      for (std::uint64_t i = 0; i < c.layers; ++i) rope[i] = (i + 1) % interval != 0;
    }
    if (const json* types = r.find({"layer_types"}); types != nullptr) {
      if (!types->is_array() || types->size() != c.layers)
        r.fail("field 'layer_types' must list one type per layer (" + std::to_string(c.layers) + "), not " + types->dump());
      for (std::uint64_t i = 0; i < c.layers; ++i)
        if ((*types)[i] != (rope[i] ? "chunked_attention" : "full_attention"))
          r.fail("field 'layer_types' must be 'chunked_attention' on the rotary layers and 'full_attention' on the "
                 "NoPE ones (no_rope_layers); other combinations are not supported");
    }
    for (std::uint64_t i = 0; i < c.layers; ++i) {
      if (!rope[i]) continue;
      if (sparse[i]) ++f.local_sparse_layers;
      else ++f.local_layers;
    }
    f.nope_global = f.complex_rotary = true;
    f.attention_temperature = r.flag_or({"attn_temperature_tuning"}, true);
    if (r.flag_or({"use_qk_norm"}, true)) f.qk_norm = qk_norm_kind::l2;
    if (const auto chunk = r.j.find("attention_chunk_size"); chunk != r.j.end() && chunk->is_null())
      r.fail("field 'attention_chunk_size' must be a number: Llama 4's model makes its chunked mask whatever the layers");
    f.window = r.count_or({"attention_chunk_size"}, 8192);
    if (f.window == 0) r.fail("field 'attention_chunk_size' must be at least 1");
    c.tied = r.flag_or({"tie_word_embeddings"}, false);
    eps_default = 1e-5;
    if (multimodal) f.vision_params = vision_params(top, source, m, c.hidden, llama4_vision_from);
  }
  if (f.moe.experts != 0 && f.moe.top_k > f.moe.experts)
    r.fail("'num_experts_per_tok' cannot exceed the number of experts");
  c.norm_eps = r.epsilon_or({eps_name}, eps_default);
  // Dropout: attention_dropout on the probabilities in every family; GPT-BigCode as GPT-2
  // (embd_pdrop, attn_pdrop, resid_pdrop); StarCoder2's embedding_dropout and residual_dropout;
  // Phi-3's resid_pdrop (modeling_*.py).
  const auto site = [&](const char* name) { return std::min<std::uint64_t>(r.dropout_permille({name}), 999); };
  c.per_site_dropout = true;
  if (family == "gpt_bigcode") {
    c.embedding_dropout_permille = site("embd_pdrop");
    c.attention_dropout_permille = site("attn_pdrop");
    c.attention_output_dropout_permille = c.mlp_output_dropout_permille = site("resid_pdrop");
  } else {
    c.attention_dropout_permille = site("attention_dropout");
    // (Phi-3's embd_pdrop is read by no module of modeling_phi3.py: it has no embedding dropout.)
    const char* embedding = family == "starcoder2" ? "embedding_dropout" : "";
    const char* residual = family == "starcoder2" ? "residual_dropout" : family == "phi3" ? "resid_pdrop" : "";
    if (*embedding != '\0') c.embedding_dropout_permille = site(embedding);
    if (*residual != '\0') c.attention_output_dropout_permille = c.mlp_output_dropout_permille = site(residual);
  }
  c.dropout_permille = std::max({c.embedding_dropout_permille, c.attention_dropout_permille,
                                 c.attention_output_dropout_permille, c.mlp_output_dropout_permille});
  if (family == "qwen3" && r.flag_or({"use_sliding_window"}, false))
    m.notes.push_back("local attention layers (sliding-window) are planned as full attention");
  if (f.vision_params != 0)
    m.notes.push_back("the vision tower is counted as weights; its activations (images) are not modelled");
  if (f.moe.experts != 0 && r.flag_or({"output_router_logits"}, false)) {
    // Qwen3MoeForCausalLM and GptOssForCausalLM keep every sparse layer's router logits (an
    // OutputRecorder on the router) for load_balancing_loss_func. DeepseekV3Model records no
    // router logits and computes no such loss; Llama4TextModel records each Llama4TextMoe's
    // first output, the layer's output, and Llama4ForCausalLM computes no such loss.
    if (family == "qwen3_moe" || family == "gpt_oss")
      f.moe.router_aux_loss = true;
    else if (family == "deepseek_v3")
      m.notes.push_back("output_router_logits has no effect on DeepSeek-V3 in transformers (no router logits are "
                        "recorded and no auxiliary loss is computed)");
    else
      m.notes.push_back("output_router_logits is on: the outputs of the mixture-of-experts layers it records (Llama 4 "
                        "has no auxiliary loss) are not modelled; the forward may be under-counted");
  }

  m.config = c;
  m.config.experts = f.moe.experts;  // shown; family_lm reads f.moe
  m.config.top_k = f.moe.top_k;
  try {
    m.model = family_lm(f);
  } catch (const std::exception& e) {
    throw usage_error(std::string(source) + ": cannot build the model: " + e.what());
  }
  m.parameters = m.model.parameters();
  m.vision = f.vision_params;
  for (const layer_desc& l : m.model) {
    if (l.kind == layer_kind::embedding || l.kind == layer_kind::position_embedding) m.embedding = add(m.embedding, l.params);
    if (l.kind == layer_kind::output) m.output = l.params;
    if (l.kind == layer_kind::transformer_block) {
      const bool sparse = (l.shape.flags & layer_flags::moe) != 0;
      (sparse ? m.per_sparse_layer : m.per_layer) = l.params;
      // (local and global layers are entries of their own, with the same parameters)
      std::uint64_t& layers = sparse ? m.sparse_layers : m.dense_layers;
      layers = add(layers, l.count);
    }
  }
  if (f.moe.experts != 0) {
    m.active = active_parameters(m.model);
    m.active_with_embedding = active_parameters(m.model, true);
  }
  return m;
}

}  // namespace memalg::cli::hf

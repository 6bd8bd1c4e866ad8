// SPDX-License-Identifier: BSL-1.0
// tools/hf_config.cpp — a Hugging Face `config.json` read as a layer-level model.
//
// The parameter count of each family is computed from the module shapes of its `transformers`
// implementation (modeling_llama.py, modeling_mistral.py, modeling_mixtral.py, modeling_qwen2.py,
// modeling_gpt2.py, modeling_gpt_neox.py, modeling_falcon.py), counting parameters, not buffers,
// as `model.num_parameters()` does; tests/host/test_planner.cpp checks it against the published
// counts of the configs in tests/data/hf/. The model is then built with the transformer builder
// (model/transformer.hpp) — its shapes drive the activation algebra — and its block, final norm
// and output entries are given the family's exact counts where the builder's generic block
// differs (Qwen2's q/k/v-only biases, Falcon's LayerNorm biases and single norm per block).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "hf_reader.hpp"
#include "memalg/model/families.hpp"
#include "planner.hpp"

namespace memalg::cli {

namespace {

using namespace hf;

struct family_entry {
  std::string_view family;
  std::initializer_list<std::string_view> model_types;  // what AutoConfig resolves a config by
  std::initializer_list<std::string_view> heads;        // the family's causal-LM classes
  std::string_view prefix;                               // the family's class names begin so
};
const family_entry families[] = {
    {"llama", {"llama"}, {"LlamaForCausalLM"}, "Llama"},
    {"mistral", {"mistral"}, {"MistralForCausalLM"}, "Mistral"},
    {"mixtral", {"mixtral"}, {"MixtralForCausalLM"}, "Mixtral"},
    {"qwen2", {"qwen2"}, {"Qwen2ForCausalLM"}, "Qwen2"},
    {"gpt2", {"gpt2"}, {"GPT2LMHeadModel"}, "GPT2"},
    {"gpt_neox", {"gpt_neox"}, {"GPTNeoXForCausalLM"}, "GPTNeoX"},
    {"falcon", {"falcon", "RefinedWeb", "RefinedWebModel"}, {"FalconForCausalLM", "RWForCausalLM"}, "Falcon"},
    // The families of 2024–2026 (hf_families.cpp). Gemma 3 and Llama 4 are released as
    // *ForConditionalGeneration with a text_config (the language model) and a vision_config.
    {"qwen3", {"qwen3"}, {"Qwen3ForCausalLM"}, "Qwen3"},
    {"qwen3_moe", {"qwen3_moe"}, {"Qwen3MoeForCausalLM"}, "Qwen3Moe"},
    {"gemma2", {"gemma2"}, {"Gemma2ForCausalLM"}, "Gemma2"},
    {"gemma3", {"gemma3", "gemma3_text"}, {"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"}, "Gemma3"},
    {"phi3", {"phi3"}, {"Phi3ForCausalLM"}, "Phi3"},
    {"olmo2", {"olmo2"}, {"Olmo2ForCausalLM"}, "Olmo2"},
    {"starcoder2", {"starcoder2"}, {"Starcoder2ForCausalLM"}, "Starcoder2"},
    {"gpt_bigcode", {"gpt_bigcode"}, {"GPTBigCodeForCausalLM"}, "GPTBigCode"},
    // Kimi K2 is DeepSeek-V3's architecture under its own model_type (its config names
    // DeepseekV3ForCausalLM).
    {"deepseek_v3", {"deepseek_v3", "kimi_k2"}, {"DeepseekV3ForCausalLM"}, "DeepseekV3"},
    {"gpt_oss", {"gpt_oss"}, {"GptOssForCausalLM"}, "GptOss"},
    {"llama4", {"llama4", "llama4_text"}, {"Llama4ForCausalLM", "Llama4ForConditionalGeneration"}, "Llama4"},
};
std::string supported_list() {
  std::string s;
  for (const family_entry& f : families)
    for (std::string_view h : f.heads) {
      if (!s.empty()) s += ", ";
      s += h;
    }
  return s;
}

/// The family of a model_type, of a causal-LM class, or (`any_head`) of any of the family's own
/// classes: its prefix followed by "For…" or "Model" (LlamaForSequenceClassification, GPT2Model;
/// not Qwen2MoeForCausalLM, another model).
std::string_view family_of(std::string_view name, bool any_head = false) {
  for (const family_entry& f : families) {
    for (std::string_view n : f.model_types)
      if (n == name) return f.family;
    for (std::string_view n : f.heads)
      if (n == name) return f.family;
    if (any_head && name.starts_with(f.prefix)) {
      const std::string_view rest = name.substr(f.prefix.size());
      if (rest.starts_with("For") || rest == "Model") return f.family;
    }
  }
  return {};
}

/// A class that ends in a causal language-model head (what memalg plans): *ForCausalLM, GPT-2's
/// *LMHeadModel, and the image-text-to-text models' *ForConditionalGeneration, whose language model
/// generates text causally (Gemma 3, Llama 4).
bool causal_lm_head(std::string_view arch) {
  if (arch.ends_with("ForCausalLM") || arch.ends_with("LMHeadModel")) return true;
  for (const family_entry& f : families)
    for (std::string_view h : f.heads)
      if (h == arch) return true;
  return false;
}

/// Parameters of one block and of the rest, per family (see the file comment).
struct counts {
  std::uint64_t layer = 0, embedding = 0, final_norm = 0, output = 0;
  std::uint64_t layer_replicated = 0;  ///< norms and row-parallel biases (not split by tensor parallelism)
};

}  // namespace

std::string_view hf_family_of(std::string_view model_type) { return family_of(model_type); }

hf_model parse_hf_config(std::string_view text, std::string_view source, const import_options& options) {
  if (text.size() > max_config_bytes)
    throw usage_error(std::string(source) + ": larger than " + std::to_string(max_config_bytes) +
                      " bytes, not a model configuration");
  json j;
  try {
    // Depth is bounded by nlohmann's iterative parser; comments are not JSON.
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers beyond a double
    std::string what = e.what();
    if (const auto p = what.find("parse error"); p != std::string::npos) what = what.substr(p);
    for (char& c : what)
      if (c == '\n' || c == '\r') c = ' ';
    throw usage_error(std::string(source) + ": not valid JSON: " + what);
  }
  if (!j.is_object()) throw usage_error(std::string(source) + ": expected a JSON object at the top level");

  // Keyed by model_type, as AutoConfig resolves a config (transformers' CONFIG_MAPPING);
  // `architectures` names the head, which must be a causal language model's.
  hf_model m{};
  std::string_view family;
  std::string model_type;
  if (const auto t = j.find("model_type"); t != j.end() && t->is_string()) model_type = t->get<std::string>();
  if (const auto a = j.find("architectures"); a != j.end() && !a->is_null()) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      throw usage_error(std::string(source) + ": field 'architectures' must be a list of class names");
    m.architecture = (*a)[0].get<std::string>();
  }
  const std::string_view by_type = family_of(model_type);
  const std::string_view by_class = family_of(m.architecture, true);
  family = !by_type.empty() ? by_type : by_class;
  if (m.architecture.empty()) m.architecture = model_type;
  if (m.architecture.empty())
    throw usage_error(std::string(source) + ": missing field 'architectures' (or 'model_type'): which model is it?");
  if (family.empty())
    throw usage_error(std::string(source) + ": unsupported architecture '" + shown(m.architecture) + "' (supported: " +
                      supported_list() + ")");
  if (!by_type.empty() && !by_class.empty() && by_type != by_class)
    throw usage_error(std::string(source) + ": model_type '" + shown(model_type) + "' and architectures '" +
                      shown(m.architecture) + "' name different models (Hugging Face resolves by model_type)");
  if (m.architecture != model_type && !causal_lm_head(m.architecture))
    throw usage_error(std::string(source) + ": '" + shown(m.architecture) +
                      "' is not a causal language model's head: only *ForCausalLM (GPT-2: GPT2LMHeadModel; Gemma 3 and Llama 4: *ForConditionalGeneration) is planned");
  m.family = family;
  const reader r{j, source, m.architecture};
  // A quantized checkpoint's stored format is read and said; training is planned in the formats
  // --precision names (the weights are dequantized or trained in those), never silently.
  if (const auto q = j.find("quantization_config"); q != j.end() && !q->is_null()) {
    std::string method = "unnamed";
    if (q->is_object())
      if (const auto k = q->find("quant_method"); k != q->end() && k->is_string()) method = shown(k->get<std::string>());
    // bitsandbytes (transformers' BitsAndBytesConfig: load_in_4bit with bnb_4bit_quant_type,
    // "fp4" by default, and bnb_4bit_use_double_quant; load_in_8bit): the base storage of a
    // QLoRA plan (--lora), which then reads it as --base-storage.
    const auto flag = [&](const char* key) {
      const auto k = q->find(key);
      return k != q->end() && k->is_boolean() && k->get<bool>();
    };
    if (method == "bitsandbytes" && q->is_object()) {
      if (flag("load_in_4bit")) {
        std::string type = "fp4";
        if (const auto k = q->find("bnb_4bit_quant_type"); k != q->end() && k->is_string()) type = k->get<std::string>();
        if (type != "nf4" && type != "fp4")
          throw usage_error(std::string(source) + ": quantization_config's bnb_4bit_quant_type '" + shown(type) +
                            "' is neither nf4 nor fp4");
        m.base_storage = type + (flag("bnb_4bit_use_double_quant") ? "-dq" : "");
      } else if (flag("load_in_8bit")) {
        m.base_storage = "int8";
      }
    }
    m.weight_format = m.base_storage;
    if (q->is_object()) {
      // What `memalg serve` stores: GPTQ's and AWQ's packed int4 with a group's scale and zero
      // (bits, group_size), fp8 checkpoints (per tensor, or weight_block_size blocks with an fp32
      // scale each), gpt-oss's MXFP4 experts.
      const auto number = [&](const char* key, std::int64_t fallback) {
        const auto k = q->find(key);
        return k != q->end() && k->is_number_integer() ? k->get<std::int64_t>() : fallback;
      };
      if (method == "gptq" || method == "awq") {
        const std::int64_t bits = number("bits", 4), group = number(method == "awq" && q->contains("q_group_size") ? "q_group_size" : "group_size", 128);
        if (bits != 4) throw usage_error(std::string(source) + ": quantization_config's bits " + std::to_string(bits) + " is not 4, the width memalg plans");
        m.weight_format = method + "-int4:" + std::to_string(group > 0 ? group : 0);
      } else if (method == "fp8" || method == "fbgemm_fp8") {
        m.weight_format = "fp8";
        if (const auto b = q->find("weight_block_size"); b != q->end() && b->is_array() && b->size() == 2 &&
                                                         (*b)[0].is_number_integer() && (*b)[1].is_number_integer())
          m.weight_format = "fp8-block:" + std::to_string((*b)[0].get<std::int64_t>() * (*b)[1].get<std::int64_t>());
      } else if (method == "mxfp4") {
        m.weight_format = "mxfp4";
      }
    }
    m.notes.push_back("the checkpoint is quantized (quantization_config, quant_method '" + method + "'): " +
                      (m.base_storage.empty() ? std::string("training is planned in the formats --precision names, not in the stored one")
                                              : "with --lora its base is planned stored in " + m.base_storage +
                                                    " (QLoRA); full training in the formats --precision names"));
  }

  if (current_family(family)) {
    if (!model_type.empty() && family_of(model_type) == family && model_type != family &&
        !std::string_view(model_type).ends_with("_text"))
      m.notes.push_back("model_type '" + shown(model_type) + "' is read as " + std::string(family) +
                        ", the architecture it names (" + shown(m.architecture) + ")");
    return read_current_family(j, std::move(m), source, options);
  }
  lm_config c{};
  c.name = family;  // a literal: model_desc keeps a string_view
  c.flash = options.flash;
  c.causal = true;
  counts n{};

  if (family == "llama" || family == "mistral" || family == "mixtral" || family == "qwen2") {
    c.hidden = r.count({"hidden_size"});
    c.layers = r.count({"num_hidden_layers"});
    c.heads = r.count({"num_attention_heads"});
    c.kv_heads = r.count_or({"num_key_value_heads"}, c.heads);
    c.vocab = r.count({"vocab_size"});
    c.ffn = r.count({"intermediate_size"});
    if (r.find({"head_dim"}) != nullptr) c.head_dim = r.count({"head_dim"});
    else if (c.hidden % c.heads != 0) r.fail("'hidden_size' must be a multiple of 'num_attention_heads'");
    else c.head_dim = c.hidden / c.heads;
    if (c.heads % c.kv_heads != 0) r.fail("'num_key_value_heads' must divide 'num_attention_heads'");
    c.rms_norm = true;
    c.gated = true;
    if (const std::string act = r.string_or({"hidden_act"}, "silu"); act != "silu")
      r.fail("unknown activation '" + shown(act) + "' in 'hidden_act' (planned: silu, the SwiGLU MLP)");
    c.bias = false;
    c.rotary = true;  // q_proj, k_proj, v_proj apart; attention_dropout only (no residual dropout)
    c.tied = r.flag_or({"tie_word_embeddings"}, false);
    const bool attention_bias = r.flag_or({"attention_bias"}, false);  // Llama: q, k, v and o biases
    const bool mlp_bias = r.flag_or({"mlp_bias"}, false);
    const std::uint64_t h = c.hidden, q = mul(c.heads, c.head_dim), kv = mul(c.kv_heads, c.head_dim);
    std::uint64_t attention = add(add(mul(h, q), mul(2 * h, kv)), mul(q, h));
    if (family == "qwen2") {  // Qwen2: q, k, v biases only
      attention = add(attention, q + 2 * kv);
      c.qkv_bias = true;
    }
    if (attention_bias) attention = add(attention, q + 2 * kv + h);
    std::uint64_t mlp = mul(3 * h, c.ffn) + (mlp_bias ? 2 * c.ffn + h : 0);
    if (family == "mixtral") {
      c.experts = r.count({"num_local_experts"});
      c.top_k = r.count({"num_experts_per_tok"});
      if (c.top_k > c.experts) r.fail("'num_experts_per_tok' cannot exceed 'num_local_experts'");
      // MixtralForCausalLM keeps every layer's router logits for load_balancing_loss_func.
      c.router_aux_loss = r.flag_or({"output_router_logits"}, false);
      mlp = add(mul(h, c.experts), mul(c.experts, mlp));  // router + experts
    }
    n.layer = add(add(2 * h, attention), mlp);
    n.layer_replicated = 2 * h + (attention_bias ? h : 0) + (mlp_bias ? h : 0);
    n.embedding = mul(c.vocab, h);
    n.final_norm = h;
    n.output = c.tied ? 0 : mul(c.vocab, h);
    if (r.find({"sliding_window"}) != nullptr && r.flag_or({"use_sliding_window"}, family == "mistral"))
      m.notes.push_back("sliding-window attention is planned as full attention (an upper bound for naive "
                        "attention; FlashAttention saves the same)");
  } else if (family == "gpt2") {
    c.hidden = r.count({"n_embd", "hidden_size"});
    c.layers = r.count({"n_layer", "num_hidden_layers"});
    c.heads = r.count({"n_head", "num_attention_heads"});
    c.vocab = r.count({"vocab_size"});
    c.positions = r.count({"n_positions", "max_position_embeddings"});
    c.ffn = r.count_or({"n_inner"}, 4 * c.hidden);
    if (c.hidden % c.heads != 0) r.fail("'n_embd' must be a multiple of 'n_head'");
    c.bias = true;
    c.tied = r.flag_or({"tie_word_embeddings"}, true);
    c.fused_qkv = true;  // c_attn
    c.gelu_tanh = gelu_kind(r, {"activation_function"}, "gelu_new");
    if (r.flag_or({"add_cross_attention"}, false))
      r.fail("'add_cross_attention' is true: GPT-2 with cross-attention blocks (an encoder-decoder's decoder) is not planned");
    c.softmax_scores_dtype = true;  // eager_attention_forward: softmax(attn_weights), no dtype
    c.residual_dropout = true;  // resid_pdrop, embd_pdrop
    const std::uint64_t h = c.hidden, f = c.ffn;
    // ln_1, ln_2 (2h each); c_attn h·3h + 3h; c_proj h·h + h; c_fc h·f + f; c_proj f·h + h.
    n.layer = add(add(add(4 * h, add(mul(h, 3 * h), 3 * h)), add(mul(h, h), h)), add(add(mul(h, f), f), add(mul(f, h), h)));
    n.layer_replicated = 4 * h + 2 * h;
    n.embedding = add(mul(c.vocab, h), mul(c.positions, h));
    n.final_norm = 2 * h;
    n.output = c.tied ? 0 : mul(c.vocab, h);
  } else if (family == "gpt_neox") {
    c.hidden = r.count({"hidden_size"});
    c.layers = r.count({"num_hidden_layers"});
    c.heads = r.count({"num_attention_heads"});
    c.vocab = r.count({"vocab_size"});
    c.ffn = r.count_or({"intermediate_size"}, 4 * c.hidden);
    if (c.hidden % c.heads != 0) r.fail("'hidden_size' must be a multiple of 'num_attention_heads'");
    c.bias = true;
    c.tied = r.flag_or({"tie_word_embeddings"}, false);
    c.fused_qkv = true;  // query_key_value
    c.rotary = true;
    c.rotary_dim = rotary_dims(r, c.hidden / c.heads);
    c.gelu_tanh = gelu_kind(r, {"hidden_act"}, "gelu");
    c.parallel_residual = r.flag_or({"use_parallel_residual"}, true);
    c.residual_dropout = true;  // hidden_dropout: post_attention_dropout, post_mlp_dropout, emb_dropout
    const std::uint64_t h = c.hidden, f = c.ffn;
    // input_layernorm, post_attention_layernorm (2h each); query_key_value h·3h + 3h; dense h·h + h;
    // dense_h_to_4h h·f + f; dense_4h_to_h f·h + h. Rotary positions: no parameters.
    n.layer = add(add(add(4 * h, add(mul(h, 3 * h), 3 * h)), add(mul(h, h), h)), add(add(mul(h, f), f), add(mul(f, h), h)));
    n.layer_replicated = 4 * h + 2 * h;
    n.embedding = mul(c.vocab, h);
    n.final_norm = 2 * h;
    n.output = c.tied ? 0 : mul(c.vocab, h);
  } else {  // falcon
    c.hidden = r.count({"hidden_size", "n_embd"});
    c.layers = r.count({"num_hidden_layers", "n_layer"});
    c.heads = r.count({"num_attention_heads", "n_head"});
    c.vocab = r.count({"vocab_size"});
    if (c.hidden % c.heads != 0) r.fail("'hidden_size' must be a multiple of 'num_attention_heads'");
    if (const std::string act = r.string_or({"activation"}, "gelu"); act != "gelu")
      r.fail("unknown activation '" + shown(act) + "' in 'activation' (planned: gelu)");
    c.head_dim = c.hidden / c.heads;
    const bool new_arch = r.flag_or({"new_decoder_architecture"}, std::string_view(m.architecture) == "RefinedWeb");
    const bool multi_query = r.flag_or({"multi_query"}, true);
    const bool parallel = r.flag_or({"parallel_attn"}, true);
    const bool bias = r.flag_or({"bias"}, false);
    if (r.flag_or({"alibi"}, false)) m.notes.push_back("ALiBi attention biases are not parameters and are not planned");
    c.kv_heads = new_arch ? r.count({"num_kv_heads", "n_head_kv"}) : multi_query ? 1 : c.heads;
    if (c.heads % c.kv_heads != 0) r.fail("'num_kv_heads' must divide 'num_attention_heads'");
    c.ffn = r.count_or({"ffn_hidden_size"}, 4 * c.hidden);
    c.bias = bias;
    c.tied = r.flag_or({"tie_word_embeddings"}, true);
    c.fused_qkv = true;  // query_key_value
    c.rotary = !r.flag_or({"alibi"}, false);
    c.parallel_residual = parallel;
    c.shared_norm = parallel && !new_arch;  // input_layernorm feeds both
    // Falcon-7B's multi-query layout hands SDPA one key and value head for all query heads, a
    // broadcast SDPA's fused CPU kernels do not take (no enable_gqa): the math path keeps the
    // scores (measured, bench/torch: falcon, falcon-eager, pw1-012-falcon). With as many key and
    // value heads as query heads the fused kernel runs (measured: pw1-120-falcon).
    c.unfused_attention = !new_arch && multi_query;
    c.softmax_stream_dtype = true;  // eager: F.softmax(..., dtype=hidden_states.dtype)
    const std::uint64_t h = c.hidden, f = c.ffn, d = c.head_dim;
    // Norms: LayerNorm with bias (2h); ln_attn + ln_mlp in the new architecture, input_layernorm
    // (+ post_attention_layernorm without parallel attention) in the old one.
    const std::uint64_t norms = new_arch ? 2 : parallel ? 1 : 2;
    const std::uint64_t qkv = new_arch ? mul(c.heads + 2 * c.kv_heads, d) : multi_query ? h + 2 * d : 3 * h;
    std::uint64_t layer = add(mul(norms, 2 * h), add(mul(h, qkv), mul(h, h)));
    layer = add(layer, add(mul(h, f), mul(f, h)));
    if (bias) layer = add(layer, qkv + h + f + h);
    n.layer = layer;
    n.layer_replicated = norms * 2 * h + (bias ? 2 * h : 0);
    n.embedding = mul(c.vocab, h);
    n.final_norm = 2 * h;
    n.output = c.tied ? 0 : mul(c.vocab, h);
  }
  // The norms' ε, under the name and with the default of each family's config class
  // (transformers 5.17): GPT2Config `layer_norm_epsilon` 1e-5; LlamaConfig, MistralConfig and
  // Qwen2Config `rms_norm_eps` 1e-6, MixtralConfig 1e-5; GPTNeoXConfig `layer_norm_eps` 1e-5;
  // FalconConfig `layer_norm_epsilon` 1e-5.
  c.norm_eps = family == "gpt2" || family == "falcon" ? r.epsilon_or({"layer_norm_epsilon"}, 1e-5)
               : family == "gpt_neox"                 ? r.epsilon_or({"layer_norm_eps"}, 1e-5)
                                                      : r.epsilon_or({"rms_norm_eps"}, family == "mixtral" ? 1e-5 : 1e-6);
  // Dropout, site by site, as each family's modelling code applies it (transformers 5.17):
  // GPT-2: embd_pdrop on the embeddings' sum, attn_pdrop on the attention probabilities,
  //   resid_pdrop on the attention and MLP outputs (modeling_gpt2.py);
  // Llama, Mistral, Mixtral, Qwen2: attention_dropout on the probabilities only;
  // GPT-NeoX: attention_dropout; hidden_dropout on the embeddings (emb_dropout) and both
  //   outputs (post_attention_dropout, post_mlp_dropout; modeling_gpt_neox.py);
  // Falcon: attention_dropout on the probabilities only with ALiBi and, without parallel
  //   attention, on the attention output (dropout_add); hidden_dropout on the MLP output, or on the
  //   sum of both outputs with parallel attention (one dropout_add); no embedding dropout
  //   (modeling_falcon.py).
  const auto site = [&](const char* name) {
    const std::uint64_t p = r.dropout_permille({name});
    return p >= 1000 ? std::uint64_t{999} : p;
  };
  c.per_site_dropout = true;
  if (family == "gpt2") {
    c.embedding_dropout_permille = site("embd_pdrop");
    c.attention_dropout_permille = site("attn_pdrop");
    c.attention_output_dropout_permille = c.mlp_output_dropout_permille = site("resid_pdrop");
  } else if (family == "gpt_neox") {
    c.attention_dropout_permille = site("attention_dropout");
    c.embedding_dropout_permille = c.attention_output_dropout_permille = c.mlp_output_dropout_permille =
        site("hidden_dropout");
  } else if (family == "falcon") {
    // Without ALiBi neither path drops attention probabilities: SDPA is called with dropout_p=0.0
    // and the eager path applies none ("It is unclear why dropout is not applied here",
    // FalconAttention.forward); attention_dropout then acts on a sequential block's attention
    // output only.
    const std::uint64_t attention = site("attention_dropout");
    c.attention_dropout_permille = r.flag_or({"alibi"}, false) ? attention : 0;
    c.attention_output_dropout_permille = c.parallel_residual ? 0 : attention;
    c.mlp_output_dropout_permille = site("hidden_dropout");
  } else {
    c.attention_dropout_permille = site("attention_dropout");
  }
  c.dropout_permille = std::max({c.embedding_dropout_permille, c.attention_dropout_permille,
                                 c.attention_output_dropout_permille, c.mlp_output_dropout_permille});
  m.config = c;
  m.per_layer = n.layer;
  m.dense_layers = c.layers;
  m.embedding = n.embedding;
  m.output = n.output;
  m.parameters = add(add(add(n.embedding, mul(c.layers, n.layer)), n.final_norm), n.output);

  // The layer-level model: the builder's shapes, the family's exact counts.
  try {
    m.model = transformer_lm(c);
  } catch (const std::exception& e) {
    throw usage_error(std::string(source) + ": cannot build the model: " + e.what());
  }
  for (std::size_t i = 0; i < m.model.size; ++i) {
    layer_desc& l = m.model.entries[i];
    if (l.kind == layer_kind::transformer_block) {
      // Keep the builder's split of the expert part; the replicated part is the family's.
      l.params = n.layer;
      l.tp_replicated_params = n.layer_replicated;
      if (l.expert_params > l.params) l.expert_params = 0;
    } else if ((l.kind == layer_kind::layernorm || l.kind == layer_kind::rmsnorm) && l.place == placement::last_stage) {
      l.params = n.final_norm;
      l.tp_replicated_params = n.final_norm;
    }
  }
  if (c.experts != 0) {
    m.active = active_parameters(m.model);
    m.active_with_embedding = active_parameters(m.model, true);
  }
  if (m.model.parameters() != m.parameters)
    throw std::logic_error("import: the built model has " + std::to_string(m.model.parameters()) +
                           " parameters, the family's count is " + std::to_string(m.parameters));
  return m;
}

hf_model load_hf_config(const std::string& path, const import_options& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw usage_error("cannot read '" + path + "': no such file");
  if (!fs::is_regular_file(st)) throw usage_error("cannot read '" + path + "': not a regular file");
  const auto size = fs::file_size(path, ec);
  if (ec) throw usage_error("cannot read '" + path + "': " + ec.message());
  if (size > max_config_bytes)
    throw usage_error("'" + path + "' is larger than " + std::to_string(max_config_bytes) +
                      " bytes: not a model configuration");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw usage_error("cannot read '" + path + "': " + std::strerror(errno));
  std::string text(static_cast<std::size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  text.resize(static_cast<std::size_t>(in.gcount()));
  return parse_hf_config(text, path, options);
}

nlohmann::json hf_json(const hf_model& m) {
  const lm_config& c = m.config;
  nlohmann::json j;
  j["architecture"] = m.architecture;
  j["family"] = std::string(m.family);
  j["parameters"] = m.parameters;
  j["per_layer"] = m.per_layer;
  j["embedding"] = m.embedding;
  j["output"] = m.output;
  j["dense_layers"] = m.dense_layers;
  j["sparse_layers"] = m.sparse_layers;
  j["per_sparse_layer"] = m.per_sparse_layer;
  j["vision"] = m.vision;
  if (m.active != 0) {
    j["active_parameters"] = m.active;
    j["active_parameters_with_embedding"] = m.active_with_embedding;
  }
  j["layers"] = c.layers;
  j["hidden"] = c.hidden;
  j["heads"] = c.heads;
  j["kv_heads"] = c.kv_heads != 0 ? c.kv_heads : c.heads;
  j["head_dim"] = c.head_dim != 0 ? c.head_dim : c.hidden / c.heads;
  j["ffn"] = c.ffn;
  j["vocab"] = c.vocab;
  j["positions"] = c.positions;
  j["experts"] = c.experts;
  j["top_k"] = c.top_k;
  j["tied_embeddings"] = c.tied;
  j["notes"] = m.notes;
  return j;
}

int run_import(const std::string& path, bool json_output) {
  const hf_model m = load_hf_config(path);
  if (json_output) {
    std::cout << hf_json(m).dump(2) << "\n";
    return 0;
  }
  const lm_config& c = m.config;
  std::cout << "architecture: " << m.architecture << " (" << m.family << ")\n"
            << "parameters:   " << m.parameters << "\n"
            << "  embedding   " << m.embedding << "\n"
            << "  output      " << m.output << (c.tied ? " (tied to the embedding)" : "") << "\n";
  if (m.dense_layers != 0)
    std::cout << "  per layer   " << m.per_layer << " x " << m.dense_layers << (m.sparse_layers != 0 ? " dense" : "")
              << " layers\n";
  if (m.sparse_layers != 0)
    std::cout << "  per layer   " << m.per_sparse_layer << " x " << m.sparse_layers << " layers with a mixture of experts\n";
  if (m.vision != 0) std::cout << "  vision      " << m.vision << " (vision tower and projector, counted as weights)\n";
  if (m.active != 0)
    std::cout << "active:       " << m.active << " per token (every parameter but the routed experts a token is not sent "
              << "to and the input embedding table; " << m.active_with_embedding << " with it)\n";
  std::cout
            << "shape:        hidden " << c.hidden << ", heads " << c.heads << " (key/value " << c.kv_heads
            << ", head " << c.head_dim << "), ffn " << c.ffn << ", vocab " << c.vocab;
  if (c.experts != 0) std::cout << ", experts " << c.experts << " (top " << c.top_k << ")";
  if (c.positions != 0) std::cout << ", learned positions " << c.positions;
  std::cout << "\n";
  for (const std::string& note : m.notes) std::cout << "note: " << note << "\n";
  std::cout << "plan it with: memalg plan --config " << path << " [options]\n";
  return 0;
}

}  // namespace memalg::cli

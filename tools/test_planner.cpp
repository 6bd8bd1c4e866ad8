// SPDX-License-Identifier: BSL-1.0
// Unit tests of the planner sub-commands: Hugging Face import against published parameter counts,
// the sweep against `plan` and against itself exhaustive, the progress line, SVG charts, emit.
#include <sys/stat.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "layer_fields.hpp"
#include "planner.hpp"

using namespace memalg;
using namespace memalg::cli;

#ifndef MEMALG_TEST_DATA
#error "MEMALG_TEST_DATA must name tests/data"
#endif

namespace {

std::string data(const std::string& name) { return std::string(MEMALG_TEST_DATA) + "/hf/" + name; }

/// What importing `text` says: its usage error, or "no error".
std::string message(std::string_view text) {
  try {
    (void)parse_hf_config(text, "config.json");
  } catch (const usage_error& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

/// Minimal XML 1.0 well-formedness check: one root element, properly nested tags, quoted
/// attributes without '<', known entity references only. Returns an empty string or the problem.
std::string xml_problem(const std::string& x) {
  std::vector<std::string> open;
  std::size_t i = 0, roots = 0;
  const auto entity_ok = [](const std::string& in, std::size_t at) {
    const std::size_t end = in.find(';', at);
    if (end == std::string::npos || end - at > 10) return false;
    const std::string e = in.substr(at + 1, end - at - 1);
    if (e == "amp" || e == "lt" || e == "gt" || e == "quot" || e == "apos") return true;
    return e.size() > 1 && e[0] == '#';
  };
  if (x.rfind("<?xml", 0) == 0) i = x.find("?>") + 2;
  while (i < x.size()) {
    if (x[i] == '<') {
      if (x.compare(i, 4, "<!--") == 0) {
        i = x.find("-->", i);
        if (i == std::string::npos) return "unterminated comment";
        i += 3;
        continue;
      }
      const std::size_t end = x.find('>', i);
      if (end == std::string::npos) return "unterminated tag";
      std::string tag = x.substr(i + 1, end - i - 1);
      const bool closing = !tag.empty() && tag[0] == '/';
      const bool empty = !tag.empty() && tag.back() == '/';
      if (closing) tag = tag.substr(1);
      if (empty) tag.pop_back();
      const std::string name = tag.substr(0, tag.find_first_of(" \t\n"));
      if (name.empty()) return "tag without a name";
      // Attributes: name="value" pairs, values without '<', entities known.
      std::size_t a = name.size();
      while (a < tag.size()) {
        while (a < tag.size() && std::isspace(static_cast<unsigned char>(tag[a]))) ++a;
        if (a >= tag.size()) break;
        const std::size_t eq = tag.find('=', a);
        if (eq == std::string::npos || eq + 1 >= tag.size() || (tag[eq + 1] != '"' && tag[eq + 1] != '\''))
          return "unquoted attribute in <" + name + ">";
        const std::size_t close = tag.find(tag[eq + 1], eq + 2);
        if (close == std::string::npos) return "unterminated attribute in <" + name + ">";
        const std::string value = tag.substr(eq + 2, close - eq - 2);
        if (value.find('<') != std::string::npos) return "'<' in an attribute";
        for (std::size_t k = value.find('&'); k != std::string::npos; k = value.find('&', k + 1))
          if (!entity_ok(value, k)) return "bad entity in an attribute";
        a = close + 1;
      }
      if (closing) {
        if (open.empty() || open.back() != name) return "mismatched </" + name + ">";
        open.pop_back();
      } else if (!empty) {
        if (open.empty()) ++roots;
        open.push_back(name);
      } else if (open.empty()) {
        ++roots;
      }
      i = end + 1;
    } else {
      if (x[i] == '&' && !entity_ok(x, i)) return "bad entity in text";
      if (open.empty() && !std::isspace(static_cast<unsigned char>(x[i]))) return "text outside the root";
      ++i;
    }
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  if (roots != 1) return "not exactly one root element";
  return {};
}

std::size_t count_of(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

plan_flags llama_flags() {
  plan_flags f;
  f.config = data("llama-2-7b.json");
  f.seq = "4096";
  return f;
}

}  // namespace

TEST_CASE("Hugging Face configs: exact parameter counts, as published") {
  struct published {
    const char* file;
    const char* family;
    std::uint64_t parameters;
  };
  // Sources: the model cards' and checkpoints' parameter counts (HF `num_parameters()`, the
  // safetensors totals, GGUF `general.parameter_count`), the Pythia paper (Biderman et al. 2023,
  // Table 1); Falcon from the module shapes of modeling_falcon.py (its cards round to 7B, 40B).
  const published models[] = {
      {"llama-2-7b.json", "llama", 6'738'415'616ULL},       {"llama-3-8b.json", "llama", 8'030'261'248ULL},
      {"mistral-7b-v0.1.json", "mistral", 7'241'732'096ULL}, {"mixtral-8x7b-v0.1.json", "mixtral", 46'702'792'704ULL},
      {"qwen2-7b.json", "qwen2", 7'615'616'512ULL},          {"qwen2-0.5b.json", "qwen2", 494'032'768ULL},
      {"gpt2.json", "gpt2", 124'439'808ULL},                 {"pythia-160m.json", "gpt_neox", 162'322'944ULL},
      {"pythia-1b.json", "gpt_neox", 1'011'781'632ULL},      {"falcon-7b.json", "falcon", 6'921'720'704ULL},
      {"falcon-40b.json", "falcon", 41'303'293'952ULL},
  };
  for (const published& p : models) {
    CAPTURE(p.file);
    const hf_model m = load_hf_config(data(p.file));
    CHECK(m.family == p.family);
    CHECK(m.parameters == p.parameters);
    CHECK(m.model.parameters() == p.parameters);
    CHECK(m.embedding + m.per_layer * m.config.layers + m.output <= m.parameters);
  }
}

TEST_CASE("Hugging Face configs: every count equals what transformers 5.17 instantiates") {
  // tests/data/hf/counts.json: bench/torch/hf_counts.py built each configuration's class on the
  // meta device and counted model.num_parameters() (and, for mixtures of experts, the parameters
  // outside the routed experts a token is not sent to; for multimodal classes, the vision tower).
  std::ifstream in(data("counts.json"));
  REQUIRE(in);
  const nlohmann::json counts = nlohmann::json::parse(in)["files"];
  REQUIRE(counts.size() >= 24);
  for (const auto& [file, c] : counts.items()) {
    CAPTURE(file);
    const hf_model m = load_hf_config(data(file));
    CHECK(m.parameters == c["parameters"].get<std::uint64_t>());
    CHECK(m.model.parameters() == m.parameters);
    CHECK(m.vision == c.value("vision", std::uint64_t{0}));
    if (c.contains("active_without_embedding")) {
      CHECK(m.active == c["active_without_embedding"].get<std::uint64_t>());
      CHECK(m.active_with_embedding == c["active_with_embedding"].get<std::uint64_t>());
    } else {
      CHECK(m.active == 0);
    }
  }
}

TEST_CASE("the presets of current families are the imported configurations") {
  const std::pair<const char*, const char*> pairs[] = {
      {"qwen3-8b", "qwen3-8b.json"},         {"qwen3-30b-a3b", "qwen3-30b-a3b.json"},
      {"gemma2-9b", "gemma-2-9b.json"},      {"gemma3-27b", "gemma-3-27b.json"},
      {"phi4", "phi-4.json"},                {"olmo2-7b", "olmo-2-7b.json"},
      {"starcoder2-15b", "starcoder2-15b.json"}, {"starcoderbase-1b", "gpt-bigcode-1b.json"},
      {"deepseek-v3", "deepseek-v3.json"},   {"gpt-oss-20b", "gpt-oss-20b.json"},
      {"gpt-oss-120b", "gpt-oss-120b.json"}, {"llama4-scout", "llama-4-scout.json"},
  };
  for (const auto& [preset, file] : pairs) {
    CAPTURE(preset);
    const presets::named_preset* p = presets::find(preset);
    REQUIRE(p != nullptr);
    REQUIRE(p->family != nullptr);
    const hf_model m = load_hf_config(data(file));
    CHECK(p->model->parameters() == m.parameters);
    CHECK(p->model->size == m.model.size);
    for (std::size_t i = 0; i < m.model.size && i < p->model->size; ++i) {
      CAPTURE(i);
      const layer_desc &a = p->model->entries[i], &b = m.model.entries[i];
      CHECK(a.name == b.name);
      CHECK(a.shape.flags == b.shape.flags);
      CHECK(a.shape.norm_eps == b.shape.norm_eps);
#define MEMALG_SAME(f) CHECK(a.f == b.f);
      MEMALG_EMIT_LAYER_FIELDS(MEMALG_SAME)
#undef MEMALG_SAME
#define MEMALG_SAME(f) CHECK(a.shape.f == b.shape.f);
      MEMALG_EMIT_SHAPE_FIELDS(MEMALG_SAME)
#undef MEMALG_SAME
    }
    if (m.active != 0) CHECK(active_parameters(*p->model) == m.active);
    // Layer-shape flags cannot reshape it; --attention still chooses the attention.
    plan_flags f;
    f.preset = preset;
    f.seq = "1024";
    f.attention = "naive";
    CHECK(make_inputs(f).model.parameters() == m.parameters);
    f.hidden = "1024";
    CHECK_THROWS_WITH_AS(make_inputs(f), doctest::Contains("layer-shape flags do not apply"), usage_error);
  }
}

TEST_CASE("import of current families: text_config, aliases, quantization, refusals") {
  const auto has_note = [](const hf_model& m, std::string_view what) {
    for (const std::string& n : m.notes)
      if (n.find(what) != std::string::npos) return true;
    return false;
  };
  const std::string dims = R"("hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100, "intermediate_size": 32)";
  // Kimi K2 names DeepSeek-V3's architecture under its own model_type.
  const std::string mla = R"("q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "first_k_dense_replace": 1)";
  const hf_model kimi = parse_hf_config(R"({"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], )" + dims + ", " + mla + "}");
  const hf_model v3 = parse_hf_config(R"({"model_type": "deepseek_v3", )" + dims + ", " + mla + "}");
  CHECK(kimi.family == "deepseek_v3");
  CHECK(kimi.parameters == v3.parameters);
  CHECK(has_note(kimi, "model_type 'kimi_k2' is read as deepseek_v3"));
  CHECK(kimi.dense_layers == 1);
  CHECK(kimi.sparse_layers == 3);
  // Local and global layers are separate entries; the import counts both (Gemma 2: alternating).
  CHECK(parse_hf_config(R"({"model_type": "gemma2", )" + dims + "}").dense_layers == 4);
  const hf_model oss4 = parse_hf_config(R"({"model_type": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 2, )" + dims + "}");
  CHECK(oss4.sparse_layers == 4);
  std::size_t local_entries = 0;
  for (const layer_desc& l : oss4.model)
    if (l.kind == layer_kind::transformer_block && l.shape.window == 128) local_entries += l.count;
  CHECK(local_entries == 2);  // GptOssConfig's default layer_types: sliding at even indices
  CHECK(kimi.active < kimi.parameters);
  CHECK(v3.active_with_embedding == v3.active + 100 * 64);  // the untied input embedding table
  // Its blocks carry the latent attention's and the shared expert's shapes, which the pytorch
  // stack's rules read (no note that they are not followed).
  CHECK(!has_note(v3, "do not yet follow"));
  for (const layer_desc& l : v3.model)
    if (l.kind == layer_kind::transformer_block) {
      CHECK(l.shape.kv_lora_rank == 8);
      CHECK(l.shape.q_lora_rank == 16);
      CHECK(l.shape.v_head_dim == 8);
      CHECK(l.shape.head_dim == 12);
      CHECK(l.shape.rotary_dim == 4);
      const bool sparse = (l.shape.flags & layer_flags::moe) != 0;
      CHECK(l.shape.shared_ffn == (sparse ? 16U : 0U));
      CHECK(l.shape.router_fp32 == sparse);
      CHECK(l.shape.router_sigmoid == sparse);
    }
  // Llama 4: sparse layers every interleave_moe_layer_step-th, NoPE layers every
  // no_rope_layer_interval-th (full attention, temperature tuning, no QK-norm), the others
  // rotary with the L2 QK-norm and chunked attention: four kinds of block in 8 layers.
  {
    const std::string l4 = R"({"model_type": "llama4_text", "num_local_experts": 4, "intermediate_size_mlp": 64, "interleave_moe_layer_step": 2, "attention_chunk_size": 256, )";
    std::string dims8 = dims;
    dims8.replace(dims8.find("\"num_hidden_layers\": 4"), 22, "\"num_hidden_layers\": 8");
    const hf_model m = parse_hf_config(l4 + dims8 + "}");
    CHECK(m.family == "llama4");
    CHECK(m.sparse_layers == 4);
    std::uint64_t rope_sparse = 0, rope_dense = 0, nope_sparse = 0, nope_dense = 0;
    for (const layer_desc& l : m.model) {
      if (l.kind != layer_kind::transformer_block) continue;
      const bool sparse = (l.shape.flags & layer_flags::moe) != 0, rope = (l.shape.flags & layer_flags::rotary) != 0;
      CHECK(l.shape.dense_experts == sparse);
      CHECK(l.shape.l2_qk_norm == rope);
      CHECK(l.shape.complex_rotary == rope);
      CHECK(l.shape.attention_temperature == !rope);
      CHECK(l.shape.window == (rope ? 256U : 0U));
      CHECK(l.shape.ffn == (sparse ? 32U : 64U));
      (sparse ? (rope ? rope_sparse : nope_sparse) : (rope ? rope_dense : nope_dense)) += l.count;
    }
    // layers 0-7: sparse 1, 3, 5, 7; NoPE 3, 7
    CHECK(rope_dense == 4);
    CHECK(rope_sparse == 2);
    CHECK(nope_sparse == 2);
    CHECK(nope_dense == 0);
    // no_rope_layers as listed, use_qk_norm and attn_temperature_tuning off.
    const hf_model listed = parse_hf_config(l4 + R"("no_rope_layers": [0, 1, 1, 1, 1, 1, 1, 1], "use_qk_norm": false, "attn_temperature_tuning": false, )" + dims8 + "}");
    std::uint64_t nope = 0;
    for (const layer_desc& l : listed.model)
      if (l.kind == layer_kind::transformer_block) {
        CHECK(!l.shape.l2_qk_norm);
        CHECK(!l.shape.attention_temperature);
        if ((l.shape.flags & layer_flags::rotary) == 0) nope += l.count;
      }
    CHECK(nope == 1);
    CHECK(message(l4 + R"("no_rope_layers": [1, 0], )" + dims8 + "}").find("'no_rope_layers' must hold a 0 or 1 per layer (8)") != std::string::npos);
    CHECK(message(l4 + R"("layer_types": ["full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention"], )" + dims8 + "}").find("'chunked_attention' on the rotary layers") != std::string::npos);
    std::string no_chunk = l4;
    no_chunk.replace(no_chunk.find("256"), 3, "null");
    CHECK(message(no_chunk + dims8 + "}").find("'attention_chunk_size' must be a number") != std::string::npos);
    CHECK(!has_note(m, "do not yet follow"));
    CHECK(!has_note(m, "planned as full attention"));
  }
  // The auxiliary loss's router logits (output_router_logits): read into the sparse blocks of the
  // families whose causal LM computes the loss (Qwen3-MoE, gpt-oss, Mixtral); said for the
  // others, never silently planned without.
  {
    const auto aux_blocks = [](const hf_model& m) {
      std::uint64_t with = 0, sparse = 0;
      for (const layer_desc& l : m.model)
        if (l.kind == layer_kind::transformer_block && (l.shape.flags & layer_flags::moe) != 0) {
          ++sparse;
          with += l.shape.router_aux_loss ? 1 : 0;
        }
      return std::pair{with, sparse};
    };
    const std::string q3 = R"({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8, )";
    const std::string mx = R"({"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2, )";
    const std::string oss = R"({"model_type": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 2, )";
    for (const std::string& head : {q3, mx, oss}) {
      const hf_model on = parse_hf_config(head + R"("output_router_logits": true, )" + dims + "}");
      const hf_model off = parse_hf_config(head + dims + "}");
      CHECK(aux_blocks(on).second > 0);
      CHECK(aux_blocks(on).first == aux_blocks(on).second);
      CHECK(aux_blocks(off).first == 0);
      CHECK(!has_note(on, "output_router_logits"));
    }
    CHECK(has_note(parse_hf_config(R"({"model_type": "deepseek_v3", "output_router_logits": true, )" + dims + ", " + mla + "}"),
                   "output_router_logits has no effect on DeepSeek-V3"));
    const hf_model l4 = parse_hf_config(R"({"model_type": "llama4_text", "num_local_experts": 4, "intermediate_size_mlp": 64, "output_router_logits": true, )" + dims + "}");
    CHECK(has_note(l4, "output_router_logits is on"));
    CHECK(aux_blocks(l4).first == 0);
  }
  // first_k_dense_replace 0: every layer sparse.
  std::string all_sparse = mla;
  all_sparse.replace(all_sparse.find("\"first_k_dense_replace\": 1"), 26, "\"first_k_dense_replace\": 0");
  CHECK(parse_hf_config(R"({"model_type": "deepseek_v3", )" + dims + ", " + all_sparse + "}").sparse_layers == 4);
  // A quantized release (gpt-oss's mxfp4) is said, and planned in the precision asked for.
  const std::string oss = R"("model_type": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 2, )" + dims;
  const hf_model mx = parse_hf_config("{" + oss + R"(, "quantization_config": {"quant_method": "mxfp4"}})");
  CHECK(has_note(mx, "quant_method 'mxfp4'"));
  CHECK(mx.parameters == parse_hf_config("{" + oss + "}").parameters);
  // Multimodal releases: the language model from text_config; the vision tower counted as weights.
  const std::string vision = R"("vision_config": {"hidden_size": 16, "num_hidden_layers": 2, "intermediate_size": 32, "patch_size": 4, "image_size": 16, "vision_use_head": false})";
  const hf_model g3 = parse_hf_config(R"({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": {)" + dims + "}, " + vision + "}");
  const hf_model g3_text = parse_hf_config(R"({"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], )" + dims + "}");
  CHECK(g3.vision > 0);
  CHECK(g3.parameters == g3_text.parameters + g3.vision);
  CHECK(has_note(g3, "vision tower is counted as weights"));
  CHECK(g3_text.vision == 0);
  // Gemma's layer types and soft-capping (what the pytorch stack's rules read): local layers
  // become their own block entry with the window; Gemma 3 has a rotary table per layer type;
  // Gemma 2 soft-caps scores and logits unless the fields say null.
  const auto blocks = [](const hf_model& m) {
    std::vector<const layer_desc*> b;
    for (const layer_desc& l : m.model)
      if (l.kind == layer_kind::transformer_block) b.push_back(&l);
    return b;
  };
  const auto output_flags = [](const hf_model& m) {
    for (const layer_desc& l : m.model)
      if (l.kind == layer_kind::output) return l.shape.flags;
    return std::uint32_t{0};
  };
  const hf_model g2 = parse_hf_config(R"({"model_type": "gemma2", "sliding_window": 64, )" + dims + "}");
  REQUIRE(blocks(g2).size() == 2);
  CHECK(blocks(g2)[0]->shape.window == 0);
  CHECK(blocks(g2)[1]->shape.window == 64);
  CHECK(blocks(g2)[0]->count + blocks(g2)[1]->count == 4);
  CHECK(blocks(g2)[1]->count == 2);  // Gemma2Config: sliding at even indices
  CHECK((blocks(g2)[1]->shape.flags & layer_flags::softcap) != 0);
  CHECK((blocks(g2)[1]->shape.flags & layer_flags::norms_sandwich) != 0);
  CHECK((output_flags(g2) & layer_flags::softcap) != 0);
  CHECK(parse_hf_config(R"({"model_type": "gemma2", )" + dims + "}").parameters == g2.parameters);
  const hf_model g2_uncapped = parse_hf_config(
      R"({"model_type": "gemma2", "attn_logit_softcapping": null, "final_logit_softcapping": null, )" + dims + "}");
  CHECK((blocks(g2_uncapped)[0]->shape.flags & layer_flags::softcap) == 0);
  CHECK((output_flags(g2_uncapped) & layer_flags::softcap) == 0);
  const hf_model g3_types = parse_hf_config(
      R"({"model_type": "gemma3_text", "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"], )" + dims + "}");
  REQUIRE(blocks(g3_types).size() == 2);
  CHECK(blocks(g3_types)[0]->count == 2);
  CHECK(blocks(g3_types)[0]->shape.rotary_tables == 2);
  CHECK((output_flags(g3_types) & layer_flags::softcap) == 0);
  CHECK(blocks(g3_text).size() == 1);  // four layers, one global in six: all local, one rotary table
  CHECK(blocks(g3_text)[0]->shape.rotary_tables <= 1);
  CHECK(message(R"({"model_type": "gemma3_text", "layer_types": ["full_attention"], )" + dims + "}").find("one type per layer") != std::string::npos);
  // Phi-3 drops out each sub-layer's output (resid_pdrop); its embd_pdrop is read by no module
  // (modeling_phi3.py), so it plans no embedding dropout.
  const hf_model phi3 = parse_hf_config(R"({"model_type": "phi3", "embd_pdrop": 0.1, "resid_pdrop": 0.2, )" + dims + "}");
  CHECK(phi3.config.embedding_dropout_permille == 0);
  CHECK(phi3.config.attention_output_dropout_permille == 200);
  CHECK(message(R"({"model_type": "gemma2", "final_logit_softcapping": -1, )" + dims + "}").find("positive number or null") != std::string::npos);
  // Refusals, one line each: a missing part, an unknown activation, a head that is not a causal LM,
  // a model_type that names another model.
  CHECK(message(R"({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], )" + dims + "}").find("missing field 'text_config'") != std::string::npos);
  CHECK(message(R"({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": {)" + dims + "}}").find("missing field 'vision_config'") != std::string::npos);
  CHECK(message(R"({"model_type": "gemma2", "hidden_activation": "relu", )" + dims + "}").find("unknown activation 'relu' in 'hidden_activation'") != std::string::npos);
  CHECK(message(R"({"model_type": "qwen3", "hidden_act": "gelu", )" + dims + "}").find("unknown activation 'gelu'") != std::string::npos);
  CHECK(message(R"({"model_type": "qwen3", "architectures": ["Qwen3ForSequenceClassification"], )" + dims + "}").find("not a causal language model's head") != std::string::npos);
  CHECK(message(R"({"model_type": "qwen3", "architectures": ["Qwen3MoeForCausalLM"], )" + dims + "}").find("name different models") != std::string::npos);
  CHECK(message(R"({"model_type": "qwen3_moe", )" + dims + "}").find("missing field 'num_experts'") != std::string::npos);
  CHECK(message(R"({"model_type": "deepseek_v3", )" + dims + "}").find("missing field 'kv_lora_rank'") != std::string::npos);
  CHECK(message(R"({"model_type": "gpt_oss", "num_local_experts": 2, "num_experts_per_tok": 4, )" + dims + "}").find("cannot exceed") != std::string::npos);
  CHECK(message(R"({"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"], "text_config": {"num_local_experts": 4, "intermediate_size_mlp": 64, )" + dims + R"(}, "vision_config": {"hidden_size": 16}})").find("(vision_config): missing field 'num_hidden_layers'") != std::string::npos);
  CHECK(message(R"({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8, "mlp_only_layers": "all", )" + dims + "}").find("'mlp_only_layers' must be a list") != std::string::npos);
}

TEST_CASE("an imported Llama-2 7B plans like the llama2-7b preset") {
  plan_flags from_config = llama_flags();
  from_config.precision = "mixed-bf16-fp32-grads";
  from_config.dp = "8";
  from_config.zero = "1";
  from_config.recompute = "selective";
  plan_flags from_preset = from_config;
  from_preset.config.clear();
  from_preset.preset = "llama2-7b";
  const plan_inputs a = make_inputs(from_config);
  const plan_inputs b = make_inputs(from_preset);
  CHECK(a.model.parameters() == b.model.parameters());
  const plan_result ra = evaluate(a.model, a.training, a.mesh, a.device);
  const plan_result rb = evaluate(b.model, b.training, b.mesh, b.device);
  CHECK(ra.per_rank == rb.per_rank);
  CHECK(ra.fits);
}

TEST_CASE("GPT-BigCode's causal-mask buffer is resident with the weights, on every rank, not a parameter") {
  // StarCoderBase-1B: 8192 positions, so GPTBigCodeModel's `bias` buffer is 8192² booleans.
  plan_flags f;
  f.config = data("gpt-bigcode-1b.json");
  f.seq = "1024";
  f.micro_batch = "1";
  f.precision = "fp32";
  const plan_inputs one = make_inputs(f);
  const plan_result r1 = evaluate(one.model, one.training, one.mesh, one.device);
  CHECK(r1.per_rank.weights.value == one.model.parameters() * 4 + 8192ULL * 8192ULL);
  f.dp = "4";
  f.zero = "3";
  const plan_inputs sharded = make_inputs(f);
  const plan_result r4 = evaluate(sharded.model, sharded.training, sharded.mesh, sharded.device);
  CHECK(r4.per_rank.weights.value >= 8192ULL * 8192ULL);  // FSDP shards parameters, not buffers
  CHECK(r4.per_rank.weights.value < r1.per_rank.weights.value / 2);
}

TEST_CASE("--attention with --config: flash (SDPA, Hugging Face's default) unless naive is asked for") {
  plan_flags f;
  f.config = data("gpt2.json");
  f.seq = "1024";
  f.micro_batch = "4";
  const auto activations = [](const plan_flags& g) {
    const plan_inputs in = make_inputs(g);
    return evaluate(in.model, in.training, in.mesh, in.device).per_rank.activations;
  };
  const auto flash_entries = [](const plan_flags& g) {
    const plan_inputs in = make_inputs(g);
    std::size_t n = 0;
    for (std::size_t i = 0; i < in.model.size; ++i) n += (in.model.entries[i].shape.flags & layer_flags::flash) != 0;
    return n;
  };
  plan_flags naive = f, flash = f;
  naive.attention = "naive";
  flash.attention = "flash";
  CHECK(flash_entries(f) > 0);               // the import no longer chooses naive for GPT-2
  CHECK(flash_entries(f) == flash_entries(flash));
  CHECK(flash_entries(naive) == 0);
  CHECK(activations(f) == activations(flash));
  CHECK(activations(naive) > activations(flash));  // the naive path saves the s x s scores
  plan_flags bad = f;
  bad.attention = "eager";
  CHECK_THROWS_AS(make_inputs(bad), usage_error);
}

TEST_CASE("import reads the norms' epsilon under each family's name, with its config class's default") {
  const auto eps = [](std::string_view text) { return parse_hf_config(text, "config.json").config.norm_eps; };
  const std::string llama = R"("hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 10, "intermediate_size": 8)";
  CHECK(eps(R"({"architectures": ["LlamaForCausalLM"], )" + llama + "}") == 1e-6);
  CHECK(eps(R"({"architectures": ["LlamaForCausalLM"], "rms_norm_eps": 1e-05, )" + llama + "}") == 1e-5);
  CHECK(eps(R"({"architectures": ["MixtralForCausalLM"], "num_local_experts": 4, "num_experts_per_tok": 2, )" + llama + "}") == 1e-5);
  const std::string gpt2 = R"("n_embd": 64, "n_layer": 2, "n_head": 8, "n_positions": 32, "vocab_size": 10)";
  CHECK(eps(R"({"architectures": ["GPT2LMHeadModel"], )" + gpt2 + "}") == 1e-5);
  CHECK(eps(R"({"architectures": ["GPT2LMHeadModel"], "layer_norm_epsilon": 1e-6, )" + gpt2 + "}") == 1e-6);
  // The plan's model carries it to the norms (the runtime reads it there).
  const hf_model m = parse_hf_config(R"({"architectures": ["LlamaForCausalLM"], "rms_norm_eps": 0.0001, )" + llama + "}", "config.json");
  std::size_t norms = 0;
  for (const layer_desc& l : m.model)
    if (l.kind == layer_kind::transformer_block || l.kind == layer_kind::rmsnorm) {
      ++norms;
      CHECK(l.shape.norm_eps == 1e-4);
    }
  CHECK(norms == 2);
}

TEST_CASE("import says when the checkpoint is quantized, and plans in the precision asked for") {
  const std::string llama = R"("model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 10, "intermediate_size": 8)";
  const hf_model plain = parse_hf_config("{" + llama + "}", "config.json");
  const hf_model fp8 = parse_hf_config("{" + llama + R"(, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}})", "config.json");
  const auto quantized = [](const hf_model& m) {
    for (const std::string& n : m.notes)
      if (n.find("quantized") != std::string::npos) return n;
    return std::string();
  };
  CHECK(quantized(plain).empty());
  CHECK(quantized(fp8).find("quant_method 'fp8'") != std::string::npos);
  CHECK(fp8.parameters == plain.parameters);
}

TEST_CASE("import errors name the field, the architecture or the problem") {
  CHECK(message(R"({"architectures": ["BertForMaskedLM"], "hidden_size": 768})").find("unsupported architecture 'BertForMaskedLM'") != std::string::npos);
  CHECK(message(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096})").find("missing field 'num_hidden_layers'") != std::string::npos);
  CHECK(message(R"({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024})").find("'vocab_size'") != std::string::npos);
  CHECK(message(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": "4096", "num_hidden_layers": 2})").find("'hidden_size' must be a positive integer") != std::string::npos);
  CHECK(message(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": -1})").find("'hidden_size'") != std::string::npos);
  CHECK(message(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 1e300})").find("'hidden_size'") != std::string::npos);
  CHECK(message(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 99999999999})").find("larger than any model dimension") != std::string::npos);
  CHECK(message(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 3, "vocab_size": 10, "intermediate_size": 8})").find("'num_key_value_heads' must divide") != std::string::npos);
  CHECK(message(R"({"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": "yes", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 10, "intermediate_size": 8})").find("'tie_word_embeddings' must be true or false") != std::string::npos);
  CHECK(message(R"({"architectures": 7})").find("'architectures'") != std::string::npos);
  CHECK(message(R"({"hidden_size": 7})").find("missing field 'architectures'") != std::string::npos);
  CHECK(message(R"([1, 2])").find("JSON object") != std::string::npos);
  CHECK(message(R"({"architectures": ["LlamaForCausalLM"], )").find("not valid JSON") != std::string::npos);
  CHECK(message("").find("not valid JSON") != std::string::npos);
  CHECK(message(std::string(100000, '[')).find("not valid JSON") != std::string::npos);
  // Found by fuzz/fuzz_hf_config: a number beyond a double is a parse error, not a crash.
  CHECK(message(R"({"hidden_size": 1e00000000000000000000000000000000000000000000001550057157})").find("not valid JSON") != std::string::npos);
  CHECK(message(R"({"architectures": ["GPT2LMHeadModel"], "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "vocab_size": 50257, "resid_pdrop": 2})").find("'resid_pdrop' must be a probability") != std::string::npos);
  CHECK(message(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 10, "intermediate_size": 8, "rms_norm_eps": 0})").find("'rms_norm_eps' must be a number in (0, 0.1]") != std::string::npos);
  // Resolved by model_type, as AutoConfig does; only a causal language model's head is planned; an
  // activation whose memory is not modelled, and GPT-2's cross-attention, are refused.
  const std::string dims = R"("hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 10, "intermediate_size": 8)";
  CHECK(message(R"({"model_type": "llama", "architectures": ["LlamaForSequenceClassification"], )" + dims + "}").find("'LlamaForSequenceClassification' is not a causal language model's head") != std::string::npos);
  CHECK(message(R"({"architectures": ["LlamaModel"], )" + dims + "}").find("'LlamaModel' is not a causal language model's head") != std::string::npos);
  CHECK(message(R"({"model_type": "gpt2", "architectures": ["GPT2Model"], "n_embd": 64, "n_layer": 2, "n_head": 8, "n_positions": 32, "vocab_size": 10})").find("'GPT2Model' is not a causal") != std::string::npos);
  CHECK(message(R"({"model_type": "llama", "architectures": ["MistralForCausalLM"], )" + dims + "}").find("model_type 'llama' and architectures 'MistralForCausalLM' name different models") != std::string::npos);
  CHECK(message(R"({"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], )" + dims + "}").find("unsupported architecture 'Qwen2MoeForCausalLM'") != std::string::npos);
  CHECK(message(R"({"model_type": "llama", "hidden_act": "gelu", )" + dims + "}").find("unknown activation 'gelu' in 'hidden_act'") != std::string::npos);
  CHECK(message(R"({"model_type": "gpt2", "activation_function": "relu", "n_embd": 64, "n_layer": 2, "n_head": 8, "n_positions": 32, "vocab_size": 10})").find("unknown activation 'relu'") != std::string::npos);
  CHECK(message(R"({"model_type": "falcon", "activation": "relu", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 10})").find("unknown activation 'relu' in 'activation'") != std::string::npos);
  CHECK(message(R"({"model_type": "gpt2", "add_cross_attention": true, "n_embd": 64, "n_layer": 2, "n_head": 8, "n_positions": 32, "vocab_size": 10})").find("'add_cross_attention' is true") != std::string::npos);
  // What still imports: a model_type alone, a class of the family's own naming, GELU variants.
  CHECK(message(R"({"model_type": "llama", )" + dims + "}") == "no error");
  CHECK(message(R"({"model_type": "llama", "architectures": ["MyLlamaForCausalLM"], "hidden_act": "silu", )" + dims + "}") == "no error");
  CHECK(message(R"({"model_type": "gpt2", "activation_function": "gelu_pytorch_tanh", "add_cross_attention": false, "n_embd": 64, "n_layer": 2, "n_head": 8, "n_positions": 32, "vocab_size": 10})") == "no error");
  // An error is one line.
  CHECK(message(R"({"architectures": ["LlamaForCausalLM"], )").find('\n') == std::string::npos);
  CHECK_THROWS_AS(load_hf_config(data("no-such-file.json")), usage_error);
  CHECK_THROWS_AS(load_hf_config(std::string(MEMALG_TEST_DATA)), usage_error);  // a directory
}

TEST_CASE("sweep: the results are memalg plan's numbers, pruned and exhaustive agree") {
  plan_flags model = llama_flags();
  sweep_flags sweep;
  sweep.world = "8";
  sweep.micro_batch = "1,2,4,8";
  sweep.recompute = "none,selective,full";
  sweep.top = "20";
  const sweep_setup s = make_sweep(model, sweep);
  CHECK(s.problem.space.world == 8);
  const sweep_report fast = run_sweep_search(s, false);
  const sweep_report slow = run_sweep_search(s, true);
  CHECK(fast.summary.evaluated == s.problem.space.size());
  CHECK(fast.summary.feasible == slow.summary.feasible);
  CHECK(fast.summary.planned < slow.summary.planned);
  REQUIRE(fast.ranked.size() == 20);
  REQUIRE(slow.ranked.size() == 20);
  for (std::size_t i = 0; i < fast.ranked.size(); ++i) CHECK(fast.ranked[i].result.config.index == slow.ranked[i].result.config.index);

  // Each result's per_rank is what `memalg plan` prints for the same flags.
  const nlohmann::json j = sweep_json(s, fast, false);
  CHECK(j["evaluated"] == s.problem.space.size());
  CHECK(j["feasible"] == fast.summary.feasible);
  REQUIRE(j["results"].size() == 20);
  for (const nlohmann::json& r : j["results"]) {
    const nlohmann::json& c = r["config"];
    plan_flags f = llama_flags();
    f.dp = std::to_string(c["dp"].get<std::uint64_t>());
    f.zero = std::to_string(c["zero"].get<int>());
    f.tp = std::to_string(c["tp"].get<std::uint64_t>());
    f.pp = std::to_string(c["pp"].get<std::uint64_t>());
    f.cp = std::to_string(c["cp"].get<std::uint64_t>());
    f.sp = c["sequence_parallel"].get<bool>();
    f.micro_batch = std::to_string(c["micro_batch"].get<std::uint64_t>());
    f.recompute = c["recompute"].get<std::string>();
    f.offload = c["offload"].get<std::string>();
    const plan_inputs in = make_inputs(f);
    const nlohmann::json plan = plan_json(in, evaluate(in.model, in.training, in.mesh, in.device));
    CHECK(r["per_rank"] == plan["per_rank"]);
    CHECK(r["fits"] == true);
    CHECK(r["communication_per_step"]["total"].is_number_unsigned());
  }
  // Sorted by memory.
  for (std::size_t i = 1; i < j["results"].size(); ++i)
    CHECK(j["results"][i - 1]["per_rank"]["total"].get<std::uint64_t>() <= j["results"][i]["per_rank"]["total"].get<std::uint64_t>());
}

namespace {
/// A result of the sweep's JSON without what spells its configuration: what two spellings of one
/// plan have in common.
nlohmann::json plan_of(nlohmann::json r) {
  for (const char* knob : {"index", "dp", "zero", "tp", "sequence_parallel", "pp", "cp", "ep", "recompute",
                           "recompute_every", "offload"})
    r["config"].erase(knob);
  r.erase("folded");
  return r;
}
void check_pairwise_distinct(const nlohmann::json& results) {
  for (std::size_t i = 0; i < results.size(); ++i)
    for (std::size_t k = i + 1; k < results.size(); ++k) {
      CAPTURE(i);
      CAPTURE(k);
      CHECK(plan_of(results[i]) != plan_of(results[k]));
    }
}
/// The raw ranked list of plan/search.hpp (every configuration, duplicates included).
std::vector<std::uint64_t> raw_top(const sweep_setup& s, std::size_t count) {
  static top_list list;
  top_strategies(s.problem, s.order, count, list);
  std::vector<std::uint64_t> out;
  for (std::size_t i = 0; i < list.size; ++i) out.push_back(list.keys[i].index);
  return out;
}
sweep_entry entry_of_index(const sweep_setup& s, std::uint64_t index) {
  sweep_entry e{};
  e.result = evaluate_candidate(s.problem, index);
  e.mesh = apply_strategy(e.result.config, s.problem.mesh);
  e.training = apply_strategy(e.result.config, s.problem.training);
  return e;
}
}  // namespace

TEST_CASE("sweep: configurations with identical plans are listed once, in their simplest spelling") {
  // Llama-2 7B on 8 GPUs: at dp = 1 (and cp = 1) ZeRO-0, 1 and 2 are one plan — ZeRO shards over
  // dp × cp — which the search ranks as three configurations. (The paper's accounting: under the
  // pytorch stack DDP's gradient buckets make ZeRO-0 a plan of its own.)
  plan_flags model = llama_flags();
  model.stack = "paper";
  sweep_flags sweep;
  sweep.world = "8";
  sweep.micro_batch = "1,2,4,8";
  sweep.recompute = "none,selective,full";
  sweep.global_batch = "64";
  const sweep_setup s = make_sweep(model, sweep);

  const std::vector<std::uint64_t> raw = raw_top(s, 10);
  REQUIRE(raw.size() == 10);
  const sweep_entry zero0 = entry_of_index(s, raw[0]), zero1 = entry_of_index(s, raw[1]),
                    zero2 = entry_of_index(s, raw[2]);
  REQUIRE(zero0.mesh.dp == 1);
  REQUIRE(zero0.mesh.zero_stage == 0);
  REQUIRE(zero1.mesh.zero_stage == 1);
  REQUIRE(zero2.mesh.zero_stage == 2);
  CHECK(same_plan(s, zero0, zero1));
  CHECK(same_plan(s, zero1, zero2));
  CHECK(simpler_spelling(zero0, zero1));
  CHECK_FALSE(simpler_spelling(zero1, zero0));
  // The raw list's fourth, ZeRO-3 on the same mesh, holds ZeRO-3's gathered layers: another plan.
  sweep_entry zero3{};
  for (std::uint64_t i : raw)
    if (entry_of_index(s, i).mesh.zero_stage == 3) zero3 = entry_of_index(s, i);
  REQUIRE(zero3.mesh.zero_stage == 3);
  CHECK_FALSE(same_plan(s, zero0, zero3));

  const sweep_report fast = run_sweep_search(s, false);
  const sweep_report slow = run_sweep_search(s, true);
  CHECK(fast.summary.evaluated == s.problem.space.size());  // every configuration still counted
  CHECK(fast.summary.evaluated == 2304);
  CHECK(fast.summary.feasible == 754);
  CHECK(fast.summary.feasible == slow.summary.feasible);
  REQUIRE(fast.ranked.size() == 10);  // filled with distinct plans
  REQUIRE(slow.ranked.size() == 10);
  for (std::size_t i = 0; i < fast.ranked.size(); ++i) {
    CHECK(fast.ranked[i].result.config.index == slow.ranked[i].result.config.index);
    CHECK(fast.ranked[i].folded == slow.ranked[i].folded);
  }
  // One row where the search ranks three, in its ZeRO-0 spelling; the next row is the next plan.
  CHECK(fast.ranked[0].result.config.index == raw[0]);
  CHECK(fast.ranked[0].folded == 2);
  CHECK(fast.ranked[1].result.config.index == raw[3]);
  CHECK(fast.ranked[1].mesh.pp == 2);
  for (std::size_t i = 1; i < fast.ranked.size(); ++i) CHECK_FALSE(same_plan(s, fast.ranked[0], fast.ranked[i]));
  CHECK(fast.folded > 0);
  CHECK(fast.folded == slow.folded);

  const nlohmann::json j = sweep_json(s, fast, false);
  CHECK(j["evaluated"] == 2304);
  CHECK(j["distinct"] == 10);
  CHECK(j["folded"] == fast.folded);
  REQUIRE(j["results"].size() == 10);
  CHECK(j["results"][0]["config"]["zero"] == 0);
  CHECK(j["results"][0]["config"]["dp"] == 1);
  CHECK(j["results"][0]["folded"] == 2);
  check_pairwise_distinct(j["results"]);
  // Still ranked by memory.
  for (std::size_t i = 1; i < j["results"].size(); ++i)
    CHECK(j["results"][i - 1]["per_rank"]["total"].get<std::uint64_t>() <=
          j["results"][i]["per_rank"]["total"].get<std::uint64_t>());
  // The table says how many were folded.
  CHECK(sweep_table(s, fast).find("folded " + std::to_string(fast.folded) + " more configurations") !=
        std::string::npos);

  // --top 3: three distinct plans, where the search's best three are one.
  sweep.top = "3";
  const sweep_report three = run_sweep_search(make_sweep(model, sweep), false);
  REQUIRE(three.ranked.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(three.ranked[i].result.config.index == fast.ranked[i].result.config.index);
}

TEST_CASE("sweep: where ZeRO shards, every stage is its own plan") {
  plan_flags model;
  model.params = "1.5e9";
  sweep_flags sweep;
  sweep.world = "8";
  sweep.tp = "1";
  sweep.pp = "1";
  sweep.cp = "1";
  const sweep_setup s = make_sweep(model, sweep);
  const sweep_report r = run_sweep_search(s, false);
  CHECK(r.summary.evaluated == 4);
  REQUIRE(r.ranked.size() == 4);
  CHECK(r.folded == 0);
  std::vector<int> stages;
  for (const sweep_entry& e : r.ranked) {
    CHECK(e.mesh.dp == 8);
    CHECK(e.folded == 0);
    stages.push_back(e.mesh.zero_stage);
  }
  std::sort(stages.begin(), stages.end());
  CHECK(stages == std::vector<int>{0, 1, 2, 3});
  check_pairwise_distinct(sweep_json(s, r, false)["results"]);
  CHECK(sweep_table(s, r).find("folded") == std::string::npos);
}

TEST_CASE("sweep: folding agrees with planning everything, also when duplicates overflow the ranked list") {
  // A model by its parameter count: without activations the tensor and pipeline degrees, ZeRO at
  // dp = 1 and a micro-batch listed twice all spell the same plans, so most of the space folds and
  // a ranked list of max_top holds fewer distinct plans than asked for.
  plan_flags model;
  model.params = "7e9";
  sweep_flags sweep;
  sweep.world = "256";
  sweep.micro_batch = "1,2,2,4";
  sweep.recompute = "none,full";
  sweep.offload = "none,optimizer,params";
  sweep.top = "1000";
  const sweep_setup all = make_sweep(model, sweep);
  const sweep_report every = run_sweep_search(all, false);
  const std::uint64_t n = all.problem.space.size();
  CHECK(every.summary.evaluated == n);
  REQUIRE(every.ranked.size() < 1000);  // every distinct plan that fits

  // Brute force: each listed row stands for exactly the configurations that fit with its plan, it
  // is the simplest of them, and together they are every configuration that fits.
  std::vector<sweep_entry> feasible;
  for (std::uint64_t i = 0; i < n; ++i) {
    sweep_entry e = entry_of_index(all, i);
    if (e.result.feasible()) feasible.push_back(e);
  }
  CHECK(feasible.size() == every.summary.feasible);
  std::uint64_t spellings = 0;
  for (const sweep_entry& row : every.ranked) {
    std::uint64_t same = 0;
    for (const sweep_entry& e : feasible) {
      if (e.result.plan.peak() != row.result.plan.peak() || !same_plan(all, e, row)) continue;
      ++same;
      CHECK_FALSE(simpler_spelling(e, row));
    }
    CHECK(same == row.folded + 1);
    spellings += same;
  }
  CHECK(spellings == every.summary.feasible);
  CHECK(every.folded + every.ranked.size() == every.summary.feasible);

  for (const char* order : {"memory", "comm", "batch"})
    for (const char* top : {"1", "10", "100", "1000"}) {
      CAPTURE(order);
      CAPTURE(top);
      sweep.sort = order;
      sweep.top = top;
      const sweep_setup s = make_sweep(model, sweep);
      const sweep_report fast = run_sweep_search(s, false);
      const sweep_report slow = run_sweep_search(s, true);
      CHECK(fast.summary.evaluated == n);
      CHECK(fast.summary.valid == slow.summary.valid);
      CHECK(fast.summary.feasible == slow.summary.feasible);
      CHECK(fast.ranked.size() == std::min<std::size_t>(s.top, every.ranked.size()));
      REQUIRE(fast.ranked.size() == slow.ranked.size());
      for (std::size_t i = 0; i < fast.ranked.size(); ++i) {
        CHECK(fast.ranked[i].result.config.index == slow.ranked[i].result.config.index);
        CHECK(fast.ranked[i].folded == slow.ranked[i].folded);
      }
      CHECK(fast.folded == slow.folded);
      CHECK(fast.folded > 0);
      const nlohmann::json j = sweep_json(s, fast, false);
      CHECK(j["distinct"] == fast.ranked.size());
      if (s.top <= 100) check_pairwise_distinct(j["results"]);
      // The same when the ranges give out at once and the pruned sweep plans everything.
      const std::uint64_t ranges = max_sweep_ranges;
      max_sweep_ranges = 1;
      const sweep_report last = run_sweep_search(s, false);
      max_sweep_ranges = ranges;
      CHECK(last.summary.feasible == fast.summary.feasible);
      REQUIRE(last.ranked.size() == fast.ranked.size());
      for (std::size_t i = 0; i < last.ranked.size(); ++i) {
        CHECK(last.ranked[i].result.config.index == fast.ranked[i].result.config.index);
        CHECK(last.ranked[i].folded == fast.ranked[i].folded);
      }
    }
}

TEST_CASE("sweep: bad dimensions are one sentence each") {
  const plan_flags model = llama_flags();
  const auto bad = [&](auto edit) {
    sweep_flags s;
    s.world = "8";
    edit(s);
    CHECK_THROWS_AS(make_sweep(model, s), usage_error);
  };
  bad([](sweep_flags& s) { s.world.clear(); });
  bad([](sweep_flags& s) { s.world = "0"; });
  bad([](sweep_flags& s) { s.world = "99999999"; });
  bad([](sweep_flags& s) { s.zero = "0,4"; });
  bad([](sweep_flags& s) { s.zero = "0,,1"; });
  bad([](sweep_flags& s) { s.tp = "0"; });
  bad([](sweep_flags& s) { s.tp = "16"; });  // larger than the world
  bad([](sweep_flags& s) { s.sp = "maybe"; });
  bad([](sweep_flags& s) { s.recompute = "sometimes"; });
  bad([](sweep_flags& s) { s.recompute = "every:0"; });
  bad([](sweep_flags& s) { s.offload = "disk"; });
  bad([](sweep_flags& s) { s.sort = "speed"; });
  bad([](sweep_flags& s) { s.top = "0"; });
  bad([](sweep_flags& s) { s.top = "1001"; });
  bad([](sweep_flags& s) { s.progress = "sometimes"; });
  bad([](sweep_flags& s) {
    std::string many;
    for (int i = 1; i <= 33; ++i) many += (i > 1 ? "," : "") + std::to_string(i);
    s.micro_batch = many;
  });
}

TEST_CASE("the progress line appears after a second, on request, and is erased") {
  using clock = progress_line::clock;
  clock::time_point now{};
  std::ostringstream out;
  progress_line line(out, true, std::chrono::seconds(1), [&] { return now; });
  line.update(10, 100);
  CHECK(out.str().empty());  // under a second: silent
  now += std::chrono::milliseconds(1500);
  line.update(50, 100);
  CHECK(out.str().find("50%") != std::string::npos);
  CHECK(line.shown());
  line.finish();
  CHECK(out.str().find("\r\033[K") != std::string::npos);
  std::ostringstream quiet;
  progress_line off(quiet, false, std::chrono::seconds(0), [&] { return now; });
  off.update(1, 2);
  off.finish();
  CHECK(quiet.str().empty());
}

TEST_CASE("SVG charts are well-formed, one bar per configuration, and refuse what they cannot draw") {
  plan_flags f = llama_flags();
  f.dp = "8";
  f.zero = "1";
  const plan_inputs in = make_inputs(f);
  chart c = plan_chart(in, evaluate(in.model, in.training, in.mesh, in.device));
  c.bars.push_back({"a <label> & \"quotes\" 'too'", c.bars[0].bytes, false});
  breakdown huge{};
  huge.activations = bytes{400ULL << 30};
  c.bars.push_back({"over the limit", huge, false});
  const std::string svg = render_svg(c);
  CHECK(xml_problem(svg).empty());
  CAPTURE(xml_problem(svg));
  CHECK(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\"") != std::string::npos);
  CHECK(count_of(svg, "<g>") == 3);
  CHECK(svg.find("&lt;label&gt; &amp; &quot;quotes&quot; &apos;too&apos;") != std::string::npos);
  CHECK(svg.find("capacity 80.00 GiB") != std::string::npos);

  chart empty = c;
  empty.bars.clear();
  CHECK_THROWS_AS(render_svg(empty), usage_error);
  chart many = c;
  many.bars.assign(max_chart_bars + 1, c.bars[0]);
  CHECK_THROWS_AS(render_svg(many), usage_error);
  chart no_device = c;
  no_device.capacity = bytes{};
  CHECK_THROWS_AS(render_svg(no_device), usage_error);

  // A file that cannot be written is an error, and nothing is left behind.
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "memalg_svg_test";
  fs::create_directories(dir);
  CHECK_THROWS_AS(write_svg(c, (dir / "missing" / "chart.svg").string()), usage_error);
  CHECK_FALSE(fs::exists(dir / "missing"));
  CHECK_THROWS_AS(write_svg(c, dir.string()), usage_error);
  CHECK_THROWS_AS(write_svg(empty, (dir / "empty.svg").string()), usage_error);
  CHECK_FALSE(fs::exists(dir / "empty.svg"));
  write_svg(c, (dir / "chart.svg").string());
  std::ifstream in_file(dir / "chart.svg");
  const std::string written((std::istreambuf_iterator<char>(in_file)), std::istreambuf_iterator<char>());
  CHECK(written == svg);
  CHECK_FALSE(fs::exists(dir / "chart.svg.tmp"));
  fs::remove_all(dir);
}

TEST_CASE("emit: type aliases and a static_assert; models with layers as literal entries") {
  plan_flags f;
  f.params = "7.5e9";
  f.precision = "mixed-fp16";
  f.optimizer = "adam";
  f.dp = "64";
  f.zero = "2";
  plan_inputs in = make_inputs(f);
  std::string h = emit_header(in, evaluate(in.model, in.training, in.mesh, in.device), "memalg_plan", "memalg emit");
  CHECK(h.find("using model = memalg::model::parameters<7500000000ULL, 0ULL, 0ULL>;") != std::string::npos);
  CHECK(h.find("using training = memalg::train::recipe<memalg::precision::mixed_fp16, memalg::optim::adam<>>;") !=
        std::string::npos);
  CHECK(h.find("memalg::parallel::data<64, memalg::parallel::zero<2, 1>>") != std::string::npos);
  CHECK(h.find("using device = memalg::device::a100_80gb;") != std::string::npos);
  CHECK(h.find("static_assert(memalg::require_fits<plan>()") != std::string::npos);

  plan_flags g = llama_flags();
  g.micro_batch = "2";
  g.grad_accum = "4";
  g.recompute = "every:4";
  g.dp = "4";
  g.tp = "2";
  g.sp = true;
  g.zero = "3";
  g.memory_cap = "0.9";
  g.reserve_mib = "1024";
  in = make_inputs(g);
  h = emit_header(in, evaluate(in.model, in.training, in.mesh, in.device), "my::plans", "memalg emit");
  CHECK(h.find("struct model {") != std::string::npos);
  CHECK(h.find("l.kind = memalg::layer_kind::transformer_block;") != std::string::npos);
  CHECK(h.find("l.shape.flags = memalg::layer_flags::gated | memalg::layer_flags::rms_norm") != std::string::npos);
  CHECK(h.find("memalg::train::batch<2, 4096>, memalg::train::grad_accum<4>, memalg::train::recompute::every<4>") !=
        std::string::npos);
  CHECK(h.find("memalg::device::capped<memalg::device::with_reserve<memalg::device::a100_80gb, 1073741824ULL>") !=
        std::string::npos);
  CHECK(h.find("namespace my::plans {") != std::string::npos);
  for (const char* bad : {"", "1x", "a::", "::a", "a b", "a;b", "class", "a::int::b", "namespace", "and", "__x", "_Plan"})
    CHECK_THROWS_AS(emit_header(in, evaluate(in.model, in.training, in.mesh, in.device), bad, "x"), usage_error);
  CHECK_NOTHROW(emit_header(in, evaluate(in.model, in.training, in.mesh, in.device), "classes::int_plans", "x"));

  // A device given by its capacity is spelled as one, with its reserve and workspace.
  plan_flags d;
  d.params = "1B";
  d.device_memory = "24GiB";
  in = make_inputs(d);
  h = emit_header(in, evaluate(in.model, in.training, in.mesh, in.device), "memalg_plan", "x");
  CHECK(h.find("using device = memalg::device::of_capacity<25769803776ULL>;") != std::string::npos);
  CHECK(device::of_capacity<25769803776ULL>::value.reserve == in.device.reserve);
  CHECK(device::of_capacity<25769803776ULL>::value.blas_workspace == in.device.blas_workspace);
}

TEST_CASE("output files: only a regular file or a new path, written whole") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "memalg_output_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string file = (dir / "out.txt").string();
  write_output_file(file, "one", "-o");
  write_output_file(file, "two", "-o");  // a regular file is replaced
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "two");
  CHECK(fs::is_regular_file(file));
  // A symbolic link (to a file that exists or not), a named pipe, a directory, an empty name.
  fs::create_symlink(dir / "target.txt", dir / "link");
  CHECK_THROWS_AS(write_output_file((dir / "link").string(), "x", "--svg"), usage_error);
  CHECK_FALSE(fs::exists(dir / "target.txt"));
  CHECK(fs::is_symlink(dir / "link"));
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  CHECK_THROWS_AS(write_output_file((dir / "fifo").string(), "x", "--svg"), usage_error);
  CHECK(fs::is_fifo(dir / "fifo"));
  CHECK_THROWS_AS(write_output_file(dir.string(), "x", "--svg"), usage_error);
  CHECK_THROWS_AS(write_output_file("", "x", "--svg"), usage_error);
  CHECK_THROWS_AS(write_output_file((dir / "missing" / "x").string(), "x", "--svg"), usage_error);
  // Nothing but the named file was left: no temporary files.
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  CHECK(entries == 3);  // out.txt, link, fifo
  fs::remove_all(dir);
}

TEST_CASE("fit: the largest micro-batch and sequence that fit, by the same plan") {
  plan_flags f;
  f.config = data("qwen2-0.5b.json");
  f.seq = "2048";
  f.device_memory = "24GB";
  const plan_inputs base = make_inputs(f);
  const auto fits = [&](std::uint64_t mb, std::uint64_t seq, std::uint64_t accum = 1) {
    plan_inputs in = base;
    in.training.micro_batch = mb;
    in.training.sequence = seq;
    in.training.grad_accum = accum;
    return plan_error(in.model, in.training, in.mesh, in.device).empty() &&
           evaluate(in.model, in.training, in.mesh, in.device).fits;
  };
  fit_request q{};
  q.range = {1, 1ULL << 20};
  const fit_result r = run_fit_search(base, q);
  REQUIRE(r.answer);
  REQUIRE(r.first_not_fitting);
  const std::uint64_t mb = r.answer->in.training.micro_batch;
  CHECK(mb >= 1);
  CHECK(fits(mb, 2048));
  CHECK_FALSE(fits(mb + 1, 2048));
  CHECK(r.first_not_fitting->in.training.micro_batch == mb + 1);
  CHECK(r.answer->plan.peak() == evaluate(base.model, r.answer->in.training, base.mesh, base.device).peak());
  // The library's own binary search agrees.
  CHECK(largest_fitting_micro_batch(base.model, base.training, base.mesh, base.device) == mb);
  CHECK(r.plans <= 25);

  // The longest sequence at micro-batch 1, searched over 1..65536.
  q.search_sequence = true;
  q.range = {1, 65536};
  const fit_result s = run_fit_search(base, q);
  REQUIRE(s.answer);
  const std::uint64_t seq = s.answer->in.training.sequence;
  CHECK(seq > 2048);
  CHECK(fits(1, seq));
  CHECK_FALSE(fits(1, seq + 1));

  // A global batch: the micro-batch divides it, the accumulation reaches it.
  q = fit_request{};
  q.range = {1, 1ULL << 20};
  q.global_batch = 96;
  const fit_result g = run_fit_search(base, q);
  REQUIRE(g.answer);
  const training_desc& t = g.answer->in.training;
  CHECK(t.micro_batch * t.grad_accum == 96);
  CHECK(t.micro_batch <= mb);
  CHECK(fits(t.micro_batch, 2048, t.grad_accum));
  REQUIRE(g.first_not_fitting);
  CHECK(96 % g.first_not_fitting->in.training.micro_batch == 0);
  CHECK(g.first_not_fitting->in.training.micro_batch > t.micro_batch);

  // Nothing fits: the first size is reported with what it is short by.
  plan_flags big = f;
  big.config = data("llama-2-7b.json");
  const fit_result none = run_fit_search(make_inputs(big), fit_request{false, {1, 64}, 0});
  CHECK_FALSE(none.answer);
  REQUIRE(none.first_not_fitting);
  CHECK(none.first_not_fitting->plan.shortfall().value > 0);

  CHECK(parse_range("1..64", "--micro-batch", 1 << 20).hi == 64);
  CHECK(parse_range("8", "--micro-batch", 1 << 20).lo == 8);
  for (const char* bad : {"0..4", "4..2", "1..", "..4", "a..b", "1..99999999"})
    CHECK_THROWS_AS(parse_range(bad, "--micro-batch", 1 << 20), usage_error);
}

TEST_CASE("a preset and the config of the same model: equal, or the output says why") {
  struct case_ {
    const char *preset, *config, *seq, *attention;
  };
  for (const case_& k : {case_{"gpt2-124m", "gpt2.json", "1024", "naive"}, case_{"gpt2-124m", "gpt2.json", "1024", ""},
                         case_{"llama2-7b", "llama-2-7b.json", "4096", "naive"}}) {
    CAPTURE(k.preset);
    CAPTURE(k.attention);
    {
      const char* preset = k.preset;
      const char* config = k.config;
      plan_flags p;
      p.preset = preset;
      p.micro_batch = "1";
      p.seq = k.seq;
      p.attention = k.attention;
      plan_flags c = p;
      c.preset.clear();
      c.config = data(config);
      const plan_inputs a = make_inputs(p), b = make_inputs(c);
      const preset_gap gap = preset_config_gap(p, a);
      const bytes config_peak = evaluate(b.model, b.training, b.mesh, b.device).peak();
      // The reasons given are the whole difference: the preset with them planned is the config's plan.
      CHECK(gap.config_peak == config_peak);
      CHECK(evaluate(a.model, a.training, a.mesh, a.device).peak() != config_peak);
      CHECK_FALSE(gap.reason.empty());
    }
  }
  // Where the peak does not see the difference, the two agree and nothing is said.
  plan_flags p;
  p.preset = "llama2-7b";
  p.seq = "4096";
  plan_flags c = p;
  c.preset.clear();
  c.config = data("llama-2-7b.json");
  const plan_inputs a = make_inputs(p), b = make_inputs(c);
  CHECK(evaluate(a.model, a.training, a.mesh, a.device).peak() == evaluate(b.model, b.training, b.mesh, b.device).peak());
  CHECK(preset_config_gap(p, a).config_peak == evaluate(b.model, b.training, b.mesh, b.device).peak());
}

TEST_CASE("sweep: schedules, ranges, one GPU, and why nothing is valid") {
  plan_flags model = llama_flags();
  sweep_flags s;
  s.world = "8";
  s.pp = "2,4";
  s.micro_batch = "1..4";
  model.pp_schedule = "interleaved:2";
  sweep_setup setup = make_sweep(model, s);
  CHECK(setup.problem.space.micro_batch.size == 4);
  for (const pipeline_choice& c : setup.problem.space.pipeline) {
    CHECK(c.schedule == pipeline_schedule::interleaved);
    CHECK(c.virtual_stages == 2);
  }
  CHECK(run_sweep_search(setup, false).summary.feasible > 0);
  s.pp = "1";
  CHECK_THROWS_AS(make_sweep(model, s), usage_error);  // no pipeline to interleave
  model.pp_schedule = "1f1b";

  s = sweep_flags{};
  s.world = "1";
  setup = make_sweep(model, s);
  CHECK(setup.problem.space.zero_stages.size == 1);  // one GPU: ZeRO has nothing to shard over
  s.zero = "0,3";
  CHECK(make_sweep(model, s).problem.space.zero_stages.size == 2);  // unless asked for

  s = sweep_flags{};
  s.world = "8";
  s.tp = "3";
  setup = make_sweep(model, s);
  sweep_report r = run_sweep_search(setup, false);
  CHECK(r.summary.valid == 0);
  CHECK(r.invalid_reason.find("does not divide --world 8") != std::string::npos);
  CHECK(sweep_table(setup, r).find("tp x pp x cp = 3") != std::string::npos);
  s.tp = "1";
  s.micro_batch = "4";
  s.global_batch = "2";
  setup = make_sweep(model, s);
  r = run_sweep_search(setup, false);
  CHECK(r.summary.valid == 0);
  CHECK(r.invalid_reason.find("--global-batch 2 is not a multiple of dp x micro-batch") != std::string::npos);
  CHECK(sweep_json(setup, r, false)["invalid_reason"] == r.invalid_reason);
}

TEST_CASE("fine-tuning flags: LoRA, QLoRA and frozen parts, and what they refuse") {
  plan_flags f;
  f.config = data("llama-2-7b.json");
  f.seq = "1024";
  f.precision = "bf16";
  const plan_inputs full = make_inputs(f);
  // Llama 2 7B: q, k, v, o are 4096 → 4096, gate and up 4096 → 11008, down 11008 → 4096; A and B
  // of rank r on each: r·(in + out) per projection, 32 blocks.
  f.lora = "16";
  const plan_inputs lora = make_inputs(f);
  CHECK(lora.model.trainable_parameters() == 32ULL * 16 * (4 * 8192 + 3 * 15104));
  CHECK(lora.model.parameters() == full.model.parameters() + lora.model.trainable_parameters());
  CHECK(fine_tuning_name(lora.model) == "lora");
  const plan_result lr = evaluate(lora.model, lora.training, lora.mesh, lora.device);
  // fp32 adapters (PEFT's autocast_adapter_dtype) on a bf16 base: AdamW's two states in fp32.
  CHECK(lr.per_rank.optimizer_states.value == 8 * lora.model.trainable_parameters());
  CHECK(lr.per_rank.total() < evaluate(full.model, full.training, full.mesh, full.device).per_rank.total());
  f.lora_targets = "q_proj,v_proj";
  CHECK(make_inputs(f).model.trainable_parameters() == 32ULL * 16 * 2 * 8192);
  // Dropout on the adapters keeps each one's own output and noise: more activations.
  f.lora_targets = "all-linear";
  f.lora_dropout = "0.05";
  const plan_inputs dropped = make_inputs(f);
  CHECK(evaluate(dropped.model, dropped.training, dropped.mesh, dropped.device).per_rank.activations >
        lr.per_rank.activations);
  // QLoRA: NF4 matrices, fp32 for the rest, checkpointing on unless turned off.
  f.lora_dropout.clear();
  f.base_storage = "nf4";
  const plan_inputs q = make_inputs(f);
  CHECK(q.training.recompute == recompute_kind::full);
  CHECK(fine_tuning_name(q.model) == "qlora-nf4");
  CHECK(evaluate(q.model, q.training, q.mesh, q.device).per_rank.weights < lr.per_rank.weights);
  f.recompute = "none";
  CHECK(make_inputs(f).training.recompute == recompute_kind::none);
  f.recompute.clear();
  f.base_storage = "int8";
  CHECK(envelope_report_of(make_inputs(f)).outside.back() == "fine-tuning: qlora-int8");
  // A config.json's bitsandbytes quantization_config is the base storage of a LoRA plan.
  const std::string tiny = R"("model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 10, "intermediate_size": 8)";
  CHECK(parse_hf_config("{" + tiny + R"(, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true}})")
            .base_storage == "nf4-dq");
  CHECK(parse_hf_config("{" + tiny + R"(, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": true}})")
            .base_storage == "fp4");
  CHECK(parse_hf_config("{" + tiny + R"(, "quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": true}})")
            .base_storage == "int8");
  CHECK(parse_hf_config("{" + tiny + R"(, "quantization_config": {"quant_method": "fp8"}})").base_storage.empty());
  CHECK(message("{" + tiny + R"(, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "int4"}})")
            .find("bnb_4bit_quant_type 'int4'") != std::string::npos);
  {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / "memalg_test_qlora_config";
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json")
        << "{" + tiny + R"(, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4"}})";
    plan_flags c;
    c.config = (dir / "config.json").string();
    c.seq = "64";
    CHECK(fine_tuning_name(make_inputs(c).model) == "full");  // full training in --precision's formats
    c.lora = "4";
    CHECK(fine_tuning_name(make_inputs(c).model) == "qlora-nf4");
    std::filesystem::remove_all(dir);
  }
  // Frozen parts without adapters: the first K blocks, the embedding, the output layer.
  plan_flags z;
  z.config = data("llama-2-7b.json");
  z.seq = "1024";
  z.freeze = "embedding,layers:10";
  const plan_inputs frozen = make_inputs(z);
  const std::uint64_t block = 4ULL * 4096 * 4096 + 3ULL * 4096 * 11008 + 2 * 4096;  // q, k, v, o; gate, up, down; two norms
  CHECK(frozen.model.trainable_parameters() == full.model.parameters() - 10 * block - 32000ULL * 4096);
  CHECK(fine_tuning_name(frozen.model) == "frozen parts");
  // Refusals, one sentence each.
  const auto refused = [](plan_flags g) {
    try {
      (void)make_inputs(g);
    } catch (const usage_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  plan_flags g = z;
  g.freeze = "layers:33";
  CHECK(refused(g).find("more blocks than the model's 32") != std::string::npos);
  g.freeze = "head";
  CHECK(refused(g).find("unknown --freeze part 'head'") != std::string::npos);
  g.freeze.clear();
  g.base_storage = "nf4";
  CHECK(refused(g).find("needs --lora") != std::string::npos);
  g.base_storage.clear();
  g.lora = "8";
  g.freeze = "embedding";
  CHECK(refused(g).find("whole base is frozen") != std::string::npos);
  g.freeze.clear();
  g.lora_targets = "q_proj,lm_head";
  CHECK(refused(g).find("unknown --lora-targets module 'lm_head'") != std::string::npos);
  g.lora_targets = "all-linear";
  g.lora_dropout = "1";
  CHECK(refused(g).find("--lora-dropout") != std::string::npos);
  g.lora_dropout.clear();
  g.base_storage = "nf3";
  CHECK(refused(g).find("unknown --base-storage 'nf3'") != std::string::npos);
  plan_flags p;
  p.params = "7B";
  p.lora = "8";
  CHECK(refused(p).find("not --params") != std::string::npos);
  plan_flags d;
  d.config = data("deepseek-v3.json");
  d.seq = "1024";
  d.lora = "8";
  CHECK(refused(d).find("latent attention") != std::string::npos);
}

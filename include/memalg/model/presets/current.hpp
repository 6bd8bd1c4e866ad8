// SPDX-License-Identifier: BSL-1.0
// memalg/model/presets/current.hpp — one published model of each family of 2024–2026, with the
// dimensions of its Hugging Face config.json and exactly the parameters transformers 5.17
// instantiates (model/families.hpp; tests/data/hf/ holds configurations with these dimensions
// and counts.json what transformers counts for them, which the tests compare):
//
//   qwen3-8b          Qwen/Qwen3-8B                         8 190 735 360
//   qwen3-30b-a3b     Qwen/Qwen3-30B-A3B                   30 532 122 624   active 3 041 867 776
//   gemma2-9b         google/gemma-2-9b                     9 241 705 984
//   gemma3-27b        google/gemma-3-27b-pt                27 432 406 640   (vision 423 060 336)
//   phi4              microsoft/phi-4                      14 659 507 200
//   olmo2-7b          allenai/OLMo-2-1124-7B                7 298 617 344
//   starcoder2-15b    bigcode/starcoder2-15b               15 957 889 024
//   starcoderbase-1b  bigcode/starcoderbase-1b              1 137 207 296
//   deepseek-v3       deepseek-ai/DeepSeek-V3             671 026 404 352   active 36 625 603 584
//   gpt-oss-20b       openai/gpt-oss-20b                   20 914 757 184   active 3 608 307 264
//   gpt-oss-120b      openai/gpt-oss-120b                 116 829 156 672   active 5 132 849 472
//   llama4-scout      meta-llama/Llama-4-Scout-17B-16E    108 641 793 536   active 17 010 341 376
//
// Active parameters as model/families.hpp's active_parameters counts them (without the input
// embedding table). The presets train the language model; the vision towers are weights.
#pragma once

#include "memalg/model/families.hpp"

namespace memalg::presets {

/// A Llama-layout model (RMSNorm, SwiGLU, rotary, no biases, untied, FlashAttention).
constexpr family_lm_config current_config(std::string_view name, std::uint64_t layers, std::uint64_t hidden,
                                          std::uint64_t heads, std::uint64_t kv_heads, std::uint64_t head_dim,
                                          std::uint64_t ffn, std::uint64_t vocab, double eps) {
  family_lm_config f{};
  lm_config& c = f.lm;
  c.name = name;
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.ffn = ffn;
  c.vocab = vocab;
  c.rms_norm = true;
  c.norm_eps = eps;
  c.gated = true;
  c.tied = false;
  c.bias = false;
  c.rotary = true;
  c.flash = true;
  c.per_site_dropout = true;
  return f;
}

constexpr family_lm_config qwen3_config(std::string_view name, std::uint64_t layers, std::uint64_t hidden,
                                        std::uint64_t heads, std::uint64_t kv_heads, std::uint64_t ffn) {
  family_lm_config f = current_config(name, layers, hidden, heads, kv_heads, 128, ffn, 151936, 1e-6);
  f.qk_norm = qk_norm_kind::per_head;
  return f;
}

constexpr family_lm_config gemma_config(std::string_view name, bool gemma3, std::uint64_t layers, std::uint64_t hidden,
                                        std::uint64_t heads, std::uint64_t kv_heads, std::uint64_t head_dim,
                                        std::uint64_t ffn, std::uint64_t vocab) {
  family_lm_config f = current_config(name, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, 1e-6);
  f.lm.tied = true;
  f.block_norms = 4;
  f.rms_weight_fp32 = true;
  f.attention_softcap = f.logit_softcap = !gemma3;  // Gemma2Config's defaults (50 and 30)
  if (gemma3) {
    f.qk_norm = qk_norm_kind::per_head;
    f.rotary_tables = 2;  // local (base 10 000) and global (10^6) layers, one in six global
    f.window = 1024;
    f.local_layers = local_layers_of_pattern(layers, 6);
  } else {
    f.window = 4096;  // every other layer local, from the first
    f.local_layers = local_layers_of_pattern(layers, 2);
  }
  return f;
}

constexpr family_lm_config gpt_oss_config(std::string_view name, std::uint64_t layers, std::uint64_t experts) {
  family_lm_config f = current_config(name, layers, 2880, 64, 8, 64, 2880, 201088, 1e-5);
  f.attention_bias = true;
  f.attention_sinks = true;
  f.moe = {experts, 4, 2880, 0, layers, true, true, false, true, true};
  f.rms_weight_fp32 = true;  // GptOssRMSNorm's product in fp32
  f.rotary_half_table = true;  // GptOssRotaryEmbedding: cos and sin of d/2
  f.window = 128;  // sliding_attention at even indices (GptOssConfig's layer_types)
  f.local_sparse_layers = local_layers_of_pattern(layers, 2);
  return f;
}

/// A preset: the configuration `Make` returns, its language model's lm_config and its model.
template <family_lm_config (*Make)()>
struct family_preset {
  static constexpr family_lm_config family = Make();
  static constexpr lm_config config = family.lm;
  static constexpr model_desc value = family_lm(family);
};

constexpr family_lm_config qwen3_8b_family() { return qwen3_config("qwen3-8b", 36, 4096, 32, 8, 12288); }
using qwen3_8b = family_preset<qwen3_8b_family>;
constexpr family_lm_config qwen3_30b_a3b_family() {
  family_lm_config f = qwen3_config("qwen3-30b-a3b", 48, 2048, 32, 4, 6144);
  f.moe = {128, 8, 768, 0, 48, false, false};
  return f;
}
using qwen3_30b_a3b = family_preset<qwen3_30b_a3b_family>;
constexpr family_lm_config gemma2_9b_family() { return gemma_config("gemma2-9b", false, 42, 3584, 16, 8, 256, 14336, 256000); }
using gemma2_9b = family_preset<gemma2_9b_family>;
constexpr family_lm_config gemma3_27b_family() {
  family_lm_config f = gemma_config("gemma3-27b", true, 62, 5376, 32, 16, 128, 21504, 262208);
  // SigLIP so400m at 896 px, patch 14, without its pooling head, and Gemma 3's projector.
  f.vision_params = siglip_vision_params({1152, 27, 4304, 3, 14, 896, false}) + gemma3_projector_params(1152, 5376);
  return f;
}
using gemma3_27b = family_preset<gemma3_27b_family>;
constexpr family_lm_config phi4_family() {
  family_lm_config f = current_config("phi4", 40, 5120, 40, 10, 128, 17920, 100352, 1e-5);
  f.lm.fused_qkv = true;
  return f;
}
using phi4 = family_preset<phi4_family>;
constexpr family_lm_config olmo2_7b_family() {
  family_lm_config f = current_config("olmo2-7b", 32, 4096, 32, 32, 128, 11008, 100352, 1e-6);
  f.qk_norm = qk_norm_kind::whole;
  f.norms_after = true;
  f.rotary_fp32 = true;
  return f;
}
using olmo2_7b = family_preset<olmo2_7b_family>;
constexpr family_lm_config starcoder2_15b_family() {
  family_lm_config f = current_config("starcoder2-15b", 40, 6144, 48, 4, 128, 24576, 49152, 1e-5);
  f.lm.rms_norm = false;
  f.lm.gated = false;
  f.lm.bias = true;
  return f;
}
using starcoder2_15b = family_preset<starcoder2_15b_family>;
constexpr family_lm_config starcoderbase_1b_family() {
  family_lm_config f = current_config("starcoderbase-1b", 24, 2048, 16, 1, 128, 8192, 49152, 1e-5);
  f.lm.positions = 8192;
  f.buffer_bytes = 8192 * 8192;  // the causal-mask buffer, one bool per pair of positions
  f.lm.rms_norm = false;
  f.lm.gated = false;
  f.lm.bias = true;
  f.lm.tied = true;
  f.lm.rotary = false;
  f.lm.fused_qkv = true;
  // The released config's attn_pdrop, embd_pdrop and resid_pdrop.
  f.lm.embedding_dropout_permille = f.lm.attention_dropout_permille = 100;
  f.lm.attention_output_dropout_permille = f.lm.mlp_output_dropout_permille = 100;
  f.lm.dropout_permille = 100;
  return f;
}
using starcoderbase_1b = family_preset<starcoderbase_1b_family>;
constexpr family_lm_config deepseek_v3_family() {
  family_lm_config f = current_config("deepseek-v3", 61, 7168, 128, 128, 192, 18432, 129280, 1e-6);
  f.mla = {1536, 512, 128, 64, 128};
  f.moe = {256, 8, 2048, 2048, 58, false, false, true};
  f.moe.router_sigmoid = true;
  return f;
}
using deepseek_v3 = family_preset<deepseek_v3_family>;
constexpr family_lm_config gpt_oss_20b_family() { return gpt_oss_config("gpt-oss-20b", 24, 32); }
using gpt_oss_20b = family_preset<gpt_oss_20b_family>;
constexpr family_lm_config gpt_oss_120b_family() { return gpt_oss_config("gpt-oss-120b", 36, 128); }
using gpt_oss_120b = family_preset<gpt_oss_120b_family>;
constexpr family_lm_config llama4_scout_family() {
  family_lm_config f = current_config("llama4-scout", 48, 5120, 40, 8, 128, 16384, 202048, 1e-5);
  f.moe = {16, 1, 8192, 8192, 48, false, false};
  f.moe.dense_experts = true;
  // Llama4TextConfig: every fourth layer NoPE (no_rope_layers), the others rotary with the L2
  // QK-norm and chunked attention (attention_chunk_size 8192), temperature tuning on.
  f.qk_norm = qk_norm_kind::l2;
  f.complex_rotary = f.nope_global = f.attention_temperature = true;
  f.window = 8192;
  f.local_sparse_layers = 36;
  f.vision_params = llama4_vision_params({1408, 34, 5632, 3, 14, 336, 4096, 4096, 4096}, 5120);
  return f;
}
using llama4_scout = family_preset<llama4_scout_family>;

}  // namespace memalg::presets

// SPDX-License-Identifier: BSL-1.0
// memalg/model/presets/llama.hpp — Llama 2 (Touvron et al. 2023, arXiv 2307.09288) and Llama 3
// (Meta 2024; Hugging Face `config.json` of meta-llama/Meta-Llama-3-*).
//
// RMSNorm, SwiGLU MLP, no biases, rotary positions (no parameters), untied output layer, no
// dropout, FlashAttention. Parameters: L(2h + attention + 3hf) + 2vh + h with attention
// h·(a·d) + 2h·(kv·d) + (a·d)·h:
//
//   Llama-2 7B    L 32, h 4096, a 32, kv 32, f 11008, v  32000     6 738 415 616
//   Llama-2 13B   L 40, h 5120, a 40, kv 40, f 13824, v  32000    13 015 864 320
//   Llama-2 70B   L 80, h 8192, a 64, kv  8, f 28672, v  32000    68 976 648 192
//   Llama-3 8B    L 32, h 4096, a 32, kv  8, f 14336, v 128256     8 030 261 248
//   Llama-3 70B   L 80, h 8192, a 64, kv  8, f 28672, v 128256    70 553 706 496
#pragma once

#include "memalg/model/transformer.hpp"

namespace memalg::presets {

constexpr lm_config llama_config(std::string_view name, std::uint64_t layers, std::uint64_t hidden,
                                 std::uint64_t heads, std::uint64_t kv_heads, std::uint64_t ffn, std::uint64_t vocab) {
  lm_config c{};
  c.name = name;
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.ffn = ffn;
  c.vocab = vocab;
  c.rms_norm = true;
  c.norm_eps = 1e-5;  // rms_norm_eps of the published Llama 2, Llama 3, Mistral and Mixtral config.json
  c.gated = true;
  c.tied = false;
  c.bias = false;
  c.flash = true;
  return c;
}

struct llama2_7b { static constexpr lm_config config = llama_config("llama2-7b", 32, 4096, 32, 32, 11008, 32000); static constexpr model_desc value = transformer_lm(config); };
struct llama2_13b { static constexpr lm_config config = llama_config("llama2-13b", 40, 5120, 40, 40, 13824, 32000); static constexpr model_desc value = transformer_lm(config); };
struct llama2_70b { static constexpr lm_config config = llama_config("llama2-70b", 80, 8192, 64, 8, 28672, 32000); static constexpr model_desc value = transformer_lm(config); };
struct llama3_8b { static constexpr lm_config config = llama_config("llama3-8b", 32, 4096, 32, 8, 14336, 128256); static constexpr model_desc value = transformer_lm(config); };
struct llama3_70b { static constexpr lm_config config = llama_config("llama3-70b", 80, 8192, 64, 8, 28672, 128256); static constexpr model_desc value = transformer_lm(config); };

}  // namespace memalg::presets

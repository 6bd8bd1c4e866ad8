// SPDX-License-Identifier: BSL-1.0
// memalg/model/presets/mistral.hpp — Mistral 7B (Jiang et al. 2023, arXiv 2310.06825) and
// Mixtral 8x7B (Jiang et al. 2024, arXiv 2401.04088).
//
// Llama's architecture (RMSNorm, SwiGLU, no biases, rotary, untied, FlashAttention) with grouped
// query attention (8 key/value heads). Mixtral replaces each MLP by 8 SwiGLU experts with top-2
// dropless routing and a replicated router (h·8):
//
//   Mistral 7B     L 32, h 4096, a 32, kv 8, f 14336, v 32000               7 241 732 096
//   Mixtral 8x7B   L 32, h 4096, a 32, kv 8, f 14336, v 32000, E 8, k 2    46 702 792 704
#pragma once

#include "memalg/model/presets/llama.hpp"

namespace memalg::presets {

constexpr lm_config mixtral_config() {
  lm_config c = llama_config("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000);
  c.experts = 8;
  c.top_k = 2;
  return c;
}

struct mistral_7b { static constexpr lm_config config = llama_config("mistral-7b", 32, 4096, 32, 8, 14336, 32000); static constexpr model_desc value = transformer_lm(config); };
struct mixtral_8x7b { static constexpr lm_config config = mixtral_config(); static constexpr model_desc value = transformer_lm(config); };

}  // namespace memalg::presets

// SPDX-License-Identifier: BSL-1.0
// memalg/model/presets/gpt.hpp — GPT-2 (Radford et al. 2019) and GPT-3 175B (Brown et al. 2020).
//
// Hugging Face `GPT2Config` / the papers: LayerNorm, GeLU MLP of 4h, biases everywhere, learned
// position embeddings, output layer tied to the token embedding, vocabulary 50257, dropout 0.1 on
// embeddings, attention probabilities and residuals, unfused ("naive") attention. Parameters per
// block 12h² + 13h; model = L(12h² + 13h) + (v + n_ctx)·h + 2h:
//
//   gpt2 (124M)        L 12, h  768, a 12, n_ctx 1024        124 439 808
//   gpt2-medium (350M) L 24, h 1024, a 16, n_ctx 1024        354 823 168
//   gpt2-large (774M)  L 36, h 1280, a 20, n_ctx 1024        774 030 080
//   gpt2-xl (1.5B)     L 48, h 1600, a 25, n_ctx 1024      1 557 611 200
//   GPT-3 175B         L 96, h 12288, a 96, n_ctx 2048   174 604 259 328  (paper Table 2.1: "175.0B")
//
// Megatron-LM pads the vocabulary to a multiple of 128·t (`--make-vocab-size-divisible-by`); with
// tensor parallelism use `model::padded_vocab<Model, 128 * t>` (50257 → 50304 for t = 1).
#pragma once

#include "memalg/model/transformer.hpp"

namespace memalg::presets {

constexpr lm_config gpt2_config(std::string_view name, std::uint64_t layers, std::uint64_t hidden, std::uint64_t heads,
                                std::uint64_t positions = 1024) {
  lm_config c{};
  c.name = name;
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.vocab = 50257;
  c.positions = positions;
  c.dropout_permille = 100;
  c.tied = true;
  c.bias = true;
  return c;
}

struct gpt2_124m { static constexpr lm_config config = gpt2_config("gpt2-124m", 12, 768, 12); static constexpr model_desc value = transformer_lm(config); };
struct gpt2_350m { static constexpr lm_config config = gpt2_config("gpt2-350m", 24, 1024, 16); static constexpr model_desc value = transformer_lm(config); };
struct gpt2_774m { static constexpr lm_config config = gpt2_config("gpt2-774m", 36, 1280, 20); static constexpr model_desc value = transformer_lm(config); };
struct gpt2_1_5b { static constexpr lm_config config = gpt2_config("gpt2-1.5b", 48, 1600, 25); static constexpr model_desc value = transformer_lm(config); };
struct gpt3_175b { static constexpr lm_config config = gpt2_config("gpt3-175b", 96, 12288, 96, 2048); static constexpr model_desc value = transformer_lm(config); };

}  // namespace memalg::presets

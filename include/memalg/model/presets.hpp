// SPDX-License-Identifier: BSL-1.0
// memalg/model/presets.hpp — every preset, and lookup by name for the command-line tool.
#pragma once

#include <array>
#include <string_view>

#include "memalg/model/layer.hpp"
#include "memalg/model/presets/current.hpp"
#include "memalg/model/presets/gpt.hpp"
#include "memalg/model/presets/llama.hpp"
#include "memalg/model/presets/mistral.hpp"
#include "memalg/model/presets/speech.hpp"

namespace memalg::presets {

struct named_preset {
  std::string_view name{};
  const model_desc* model = nullptr;
  const lm_config* config = nullptr;  ///< decoder-only language models: their configuration
  /// The families of 2024–2026 (presets/current.hpp): built by family_lm, which the layer-shape
  /// flags (read into an lm_config) cannot change.
  const family_lm_config* family = nullptr;
};

/// Names accepted by `memalg plan --preset`.
inline constexpr std::array<named_preset, 25> catalog{{
    {"gpt2-124m", &gpt2_124m::value, &gpt2_124m::config},
    {"gpt2-350m", &gpt2_350m::value, &gpt2_350m::config},
    {"gpt2-774m", &gpt2_774m::value, &gpt2_774m::config},
    {"gpt2-1.5b", &gpt2_1_5b::value, &gpt2_1_5b::config},
    {"gpt3-175b", &gpt3_175b::value, &gpt3_175b::config},
    {"llama2-7b", &llama2_7b::value, &llama2_7b::config},
    {"llama2-13b", &llama2_13b::value, &llama2_13b::config},
    {"llama2-70b", &llama2_70b::value, &llama2_70b::config},
    {"llama3-8b", &llama3_8b::value, &llama3_8b::config},
    {"llama3-70b", &llama3_70b::value, &llama3_70b::config},
    {"mistral-7b", &mistral_7b::value, &mistral_7b::config},
    {"mixtral-8x7b", &mixtral_8x7b::value, &mixtral_8x7b::config},
    {"qwen3-8b", &qwen3_8b::value, &qwen3_8b::config, &qwen3_8b::family},
    {"qwen3-30b-a3b", &qwen3_30b_a3b::value, &qwen3_30b_a3b::config, &qwen3_30b_a3b::family},
    {"gemma2-9b", &gemma2_9b::value, &gemma2_9b::config, &gemma2_9b::family},
    {"gemma3-27b", &gemma3_27b::value, &gemma3_27b::config, &gemma3_27b::family},
    {"phi4", &phi4::value, &phi4::config, &phi4::family},
    {"olmo2-7b", &olmo2_7b::value, &olmo2_7b::config, &olmo2_7b::family},
    {"starcoder2-15b", &starcoder2_15b::value, &starcoder2_15b::config, &starcoder2_15b::family},
    {"starcoderbase-1b", &starcoderbase_1b::value, &starcoderbase_1b::config, &starcoderbase_1b::family},
    {"deepseek-v3", &deepseek_v3::value, &deepseek_v3::config, &deepseek_v3::family},
    {"gpt-oss-20b", &gpt_oss_20b::value, &gpt_oss_20b::config, &gpt_oss_20b::family},
    {"gpt-oss-120b", &gpt_oss_120b::value, &gpt_oss_120b::config, &gpt_oss_120b::family},
    {"llama4-scout", &llama4_scout::value, &llama4_scout::config, &llama4_scout::family},
    {"speech-tts-500m", &speech_tts_500m<>::value, nullptr},
}};

/// The preset called `name`, or nullptr.
constexpr const named_preset* find(std::string_view name) {
  for (const named_preset& p : catalog)
    if (p.name == name) return &p;
  return nullptr;
}

/// Runtime lookup by name; returns false when unknown.
constexpr bool from_name(std::string_view name, model_desc& out) {
  for (const named_preset& p : catalog)
    if (p.name == name) {
      out = *p.model;
      return true;
    }
  return false;
}

}  // namespace memalg::presets

// SPDX-License-Identifier: BSL-1.0
// memalg/model/presets.hpp — every preset, and lookup by name for the command-line tool.
#pragma once

#include <array>
#include <string_view>

#include "memalg/model/layer.hpp"
#include "memalg/model/presets/gpt.hpp"
#include "memalg/model/presets/llama.hpp"
#include "memalg/model/presets/mistral.hpp"
#include "memalg/model/presets/speech.hpp"

namespace memalg::presets {

struct named_preset {
  std::string_view name{};
  const model_desc* model = nullptr;
  const lm_config* config = nullptr;  ///< decoder-only language models: their configuration
};

/// Names accepted by `memalg plan --preset`.
inline constexpr std::array<named_preset, 13> catalog{{
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

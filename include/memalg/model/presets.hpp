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
};

/// Names accepted by `memalg plan --preset`.
inline constexpr std::array<named_preset, 13> catalog{{
    {"gpt2-124m", &gpt2_124m::value},
    {"gpt2-350m", &gpt2_350m::value},
    {"gpt2-774m", &gpt2_774m::value},
    {"gpt2-1.5b", &gpt2_1_5b::value},
    {"gpt3-175b", &gpt3_175b::value},
    {"llama2-7b", &llama2_7b::value},
    {"llama2-13b", &llama2_13b::value},
    {"llama2-70b", &llama2_70b::value},
    {"llama3-8b", &llama3_8b::value},
    {"llama3-70b", &llama3_70b::value},
    {"mistral-7b", &mistral_7b::value},
    {"mixtral-8x7b", &mixtral_8x7b::value},
    {"speech-tts-500m", &speech_tts_500m<>::value},
}};

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

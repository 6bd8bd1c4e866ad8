// SPDX-License-Identifier: BSL-1.0
// memalg/model/parameters.hpp — a model given by its parameter count alone.
//
// Enough for model-state questions (the ZeRO paper's Figure 1 is one): Ψ parameters, of which
// `ExpertParams` belong to mixture-of-experts layers (split by expert parallelism), and optionally
// the size of the largest layer, which ZeRO-3 gathers whole (DeepSpeed's estimator uses it too).
// Without layer structure there are no activations, pipeline stages split the count evenly, and
// Adafactor cannot factor anything (see optimizer.hpp).
#pragma once

#include <cstdint>

#include "memalg/model/layer.hpp"

namespace memalg {

/// Runtime constructor shared by `model::parameters<>` and the command-line tool.
constexpr model_desc parameter_count_model(std::uint64_t params, std::uint64_t expert_params = 0,
                                           std::uint64_t largest_layer = 0) {
  model_desc m{};
  m.name = "parameters";
  layer_desc l{};
  l.name = "parameters";
  l.kind = layer_kind::parameters;
  l.place = placement::spread;
  l.params = params;
  l.expert_params = expert_params;
  l.gather_params = largest_layer;
  m.push(l);
  return m;
}

namespace model {

template <std::uint64_t Params, std::uint64_t ExpertParams = 0, std::uint64_t LargestLayer = 0>
struct parameters {
  static_assert(Params > 0, "model::parameters: a model needs at least one parameter");
  static_assert(ExpertParams <= Params, "model::parameters: expert parameters cannot exceed all parameters");
  static_assert(LargestLayer <= Params, "model::parameters: the largest layer cannot exceed the whole model");
  static constexpr model_desc value = parameter_count_model(Params, ExpertParams, LargestLayer);
};

}  // namespace model
}  // namespace memalg

// SPDX-License-Identifier: BSL-1.0
// examples/speech_seed_plans.hpp — the seed scenario of docs/tutorial-speech.md at CPU scale: the
// plans examples/train_speech_cpu trains, and tests/fail/speech_seed_b64_oom.cpp refuses.
//
// The speech model keeps its layers and shrinks through its dimensions (presets::speech_dims): 32
// wide, 2 + 2 blocks, 32 phonemes and 64 mel frames per utterance of the dataset the project
// makes (80 mel bins). The device is scaled so that the seed's arithmetic holds: 64 utterances
// per rank do not fit, 16 per rank do, as 64 per GPU do not fit an A100 80 GB and 16 do
// (examples/speech_tts.cpp). Every plan is four data-parallel ranks and memalg's own runtime
// (train::stacks::memalg), whose memory the plan predicts to the byte.
#pragma once

#include <memalg/memalg.hpp>

namespace speech_seed {

namespace m = memalg;
using namespace memalg::literals;

inline constexpr m::presets::speech_dims dims = [] {
  m::presets::speech_dims d{};
  d.hidden = 32;
  d.heads = 2;
  d.ffn = 128;
  d.phonemes = 128;
  d.mel_bins = 80;
  d.encoder_layers = 2;
  d.decoder_layers = 2;
  d.prenet = 16;
  d.postnet = 32;
  d.kernel = 5;
  d.text_tokens = 32;
  return d;
}();
/// The variant without batch statistics and dropout: a micro-batch's result does not depend on
/// which utterances share it, so accumulation can be compared with one large batch exactly.
inline constexpr m::presets::speech_dims dims_exact = [] {
  m::presets::speech_dims d = dims;
  d.batchnorm = false;
  d.block_dropout = 0;
  d.net_dropout = 0;
  return d;
}();
inline constexpr std::uint64_t frames = 64;  ///< mel frames per utterance (the recipe's sequence)

using model = m::presets::speech_tts<dims>;
using model_exact = m::presets::speech_tts<dims_exact>;

/// One rank of the scaled device: 36 MiB, no reserve. 64 utterances per rank need more, 16 less.
struct cpu_device {
  static constexpr m::device_desc value{"cpu-36mib", 36_MiB, m::bytes{}};
};
/// A device large enough for 64 utterances per rank (the comparison of accumulation with one batch).
struct cpu_device_large {
  static constexpr m::device_desc value{"cpu-64mib", 64_MiB, m::bytes{}};
};

template <class Model, std::uint64_t MicroBatch, class Precision, class Device, class... Options>
using plan = m::plan<Model,
                     m::train::recipe<Precision, m::optim::adamw<>, m::train::batch<MicroBatch, frames>,
                                      m::train::stacks::memalg, Options...>,
                     m::parallel::mesh<m::parallel::data<4>>, Device>;

/// The seed: 64 utterances per GPU, fp32. Does not fit.
using b64 = plan<model, 64, m::precision::fp32, cpu_device>;
/// 16 per GPU, the data sharded over the 4 ranks: 64 per step.
using b16_shard4 = plan<model, 16, m::precision::fp32, cpu_device>;
/// The same with 4 accumulated micro-batches: 64 per GPU per step, at the memory of 16.
using b16_accum4 = plan<model, 16, m::precision::fp32, cpu_device, m::train::grad_accum<4>>;
/// Mixed precision: bf16 weights, gradients and activations, fp32 master weights and Adam states.
using bf16 = plan<model, 16, m::precision::mixed_bf16, cpu_device>;
/// 64 per GPU on the large device, with batch norm and dropout: what accumulation approximates
/// (batch statistics over 64, not 16; other dropout masks).
using b64_large = plan<model, 64, m::precision::fp32, cpu_device_large>;
/// The comparison pair, without batch statistics and dropout.
using exact_b64 = plan<model_exact, 64, m::precision::fp32, cpu_device_large>;
using exact_b16_accum4 = plan<model_exact, 16, m::precision::fp32, cpu_device, m::train::grad_accum<4>>;

}  // namespace speech_seed

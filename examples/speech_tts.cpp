// SPDX-License-Identifier: BSL-1.0
// examples/speech_tts.cpp — a speech-synthesis model that runs out of memory, and what fixes it.
//
// A ~500M-parameter transformer text-to-speech model (memalg::presets::speech_tts_500m: a phoneme
// encoder and a mel-frame decoder with convolutional pre- and post-nets) is trained in fp32 with
// Adam on 4 × A100 80 GB. Every GPU was given the whole batch of 64 utterances of 1024 mel frames:
// it does not fit, and `require_fits` would stop the build with the numbers (tests/fail/
// speech_batch64_oom.cpp proves it). Sharding the data over the 4 data-parallel ranks leaves 16
// utterances per GPU, which fits; accumulating 4 such micro-batches restores an effective batch of
// 64 per GPU at the memory of 16. docs/tutorial-speech.md walks through it.
#include <memalg/memalg.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

namespace m = memalg;
namespace p = memalg::parallel;

using speech = m::presets::speech_tts_500m<256>;  // 256 phonemes per utterance
inline constexpr std::uint64_t frames = 1024;      // mel frames per utterance (about 11.9 s of audio)

template <std::uint64_t MicroBatch, class Mesh = p::mesh<p::data<4>>, class Precision = m::precision::fp32,
          class Optimizer = m::optim::adam<>, class... Options>
using speech_plan = m::plan<speech, m::train::recipe<Precision, Optimizer, m::train::batch<MicroBatch, frames>, Options...>,
                            Mesh, m::device::a100_80gb>;

// The original run: 64 utterances on every GPU. Does not fit.
using original = speech_plan<64>;
static_assert(!original::fits, "64 utterances of 1024 frames per GPU do not fit in 80 GB");

// Shard the data: 64 utterances per step over 4 ranks = 16 per GPU. Fits — checked at compile time.
using sharded = speech_plan<16>;
static_assert(m::require_fits<sharded>());

// Accumulate 4 micro-batches of 16: an effective 64 per GPU, with the activations of 16. PyTorch
// (the default stack) keeps the gradients from the first micro-batch's backward on, so the peak
// grows by at most the gradients, which the optimizer step holds anyway; a stack with persistent
// gradient buffers (Megatron-LM, DeepSpeed, memalg's runtime) shows exactly the peak of 16.
using accumulated = speech_plan<16, p::mesh<p::data<4>>, m::precision::fp32, m::optim::adam<>, m::train::grad_accum<4>>;
static_assert(m::require_fits<accumulated>());
// (The forward holds the same saved tensors either way; which moment of the backward is the peak
// may differ, as the gradients live longer with accumulation.)
static_assert(accumulated::result.most_loaded.at[static_cast<int>(m::phase::forward)].activations ==
                  sharded::result.most_loaded.at[static_cast<int>(m::phase::forward)].activations,
              "gradient accumulation adds no activations");
static_assert(accumulated::peak - sharded::peak <=
                  accumulated::result.most_loaded.at[static_cast<int>(m::phase::optimizer_step)].gradients,
              "PyTorch's accumulation adds at most the gradients");
static_assert(speech_plan<16, p::mesh<p::data<4>>, m::precision::fp32, m::optim::adam<>, m::train::grad_accum<4>,
                          m::train::stacks::memalg>::peak ==
                  speech_plan<16, p::mesh<p::data<4>>, m::precision::fp32, m::optim::adam<>, m::train::stacks::memalg>::peak,
              "with persistent gradient buffers, gradient accumulation adds no per-GPU memory");

// The dataset size and the learning rate are not even parameters of a plan: the recipe has no
// such fields, so they cannot change per-GPU memory.
template <class T>
concept has_learning_rate = requires(T t) { t.learning_rate; };
template <class T>
concept has_dataset_size = requires(T t) { t.dataset_size; };
static_assert(!has_learning_rate<m::training_desc> && !has_dataset_size<m::training_desc>);

// The alternatives, each starting from the original 64 utterances per GPU unless it changes that.
using mixed_precision = speech_plan<64, p::mesh<p::data<4>>, m::precision::amp_bf16>;
using checkpointing = speech_plan<64, p::mesh<p::data<4>>, m::precision::fp32, m::optim::adam<>, m::train::recompute::full>;
using zero1 = speech_plan<64, p::mesh<p::data<4, p::zero<1>>>>;
using zero2 = speech_plan<64, p::mesh<p::data<4, p::zero<2>>>>;
using zero3 = speech_plan<64, p::mesh<p::data<4, p::zero<3>>>>;
using tensor4 = speech_plan<64, p::mesh<p::tensor<4>>>;
using tensor4_sp = speech_plan<64, p::mesh<p::tensor<4, true>>>;
using adam8bit = speech_plan<64, p::mesh<p::data<4>>, m::precision::fp32, m::optim::adam8bit<>>;
using mixed_checkpointing =
    speech_plan<64, p::mesh<p::data<4>>, m::precision::amp_bf16, m::optim::adam<>, m::train::recompute::full>;

namespace {
template <class Plan>
void row(const char* what, std::uint64_t per_gpu, std::uint64_t global, const char* effective) {
  const m::breakdown& b = Plan::per_rank;
  std::printf("%-40s %4llu %6llu %9s %11s %11s %11s  %s\n", what, static_cast<unsigned long long>(per_gpu),
              static_cast<unsigned long long>(global), effective, m::to_string(b.model_states()).c_str(),
              m::to_string(b.activations).c_str(), m::to_string(Plan::peak).c_str(),
              Plan::fits ? "fits" : ("OOM, short by " + m::to_string(Plan::result.shortfall())).c_str());
}
}  // namespace

int main() {
  std::printf("speech-tts-500m: %llu parameters, fp32 + Adam, 4 x A100 80 GB, %llu mel frames and 256 phonemes "
              "per utterance\n\n",
              static_cast<unsigned long long>(original::result.parameters), static_cast<unsigned long long>(frames));
  std::printf("%-40s %4s %6s %9s %11s %11s %11s  %s\n", "alternative", "GPU", "step", "per GPU", "states",
              "activations", "peak", "verdict");
  row<original>("original: 64 per GPU, data not sharded", 64, 256, "64");
  row<sharded>("smaller batch + data sharding", 16, 64, "16");
  row<accumulated>("  + gradient accumulation x4", 16, 256, "64");
  row<mixed_precision>("mixed precision (amp-bf16)", 64, 256, "64");
  row<checkpointing>("gradient checkpointing (full)", 64, 256, "64");
  row<mixed_checkpointing>("mixed precision + checkpointing", 64, 256, "64");
  row<zero1>("ZeRO-1", 64, 256, "64");
  row<zero2>("ZeRO-2", 64, 256, "64");
  row<zero3>("ZeRO-3", 64, 256, "64");
  row<tensor4>("tensor parallelism x4", 64, 64, "64");
  row<tensor4_sp>("tensor + sequence parallelism x4", 64, 64, "64");
  row<adam8bit>("8-bit Adam", 64, 256, "64");
  std::printf("\n(GPU: utterances per GPU per micro-batch; step: utterances per optimizer step over all GPUs; "
              "per GPU: effective batch per GPU.)\n");
  std::printf("The dataset size and the learning rate are not parameters of the plan: per-GPU memory is the same "
              "for 100 or 100 000 hours of audio and for any learning rate.\n\n");
  std::printf("The chosen plan, 16 utterances per GPU with the data sharded:\n\n%s", m::report<sharded>().c_str());
  return 0;
}

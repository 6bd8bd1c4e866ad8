// SPDX-License-Identifier: BSL-1.0
// examples/current_models.cpp — the models of 2024–2026 as presets: exact parameters, the
// parameters a mixture of experts activates per token, and a plan checked at compile time.
//
// Each preset is one published model with the dimensions of its Hugging Face config.json and the
// parameters transformers 5.17 instantiates (memalg/model/presets/current.hpp); `memalg import`
// reads the same families from a config.json. Fine-tuning Qwen3-8B in full with amp-bf16 AdamW
// needs 16 bytes of model states per parameter, 131 GB: more than an 80 GB H100 holds, so the
// build checks that one GPU does not fit and that ZeRO-3 over 8 does.
#include <memalg/memalg.hpp>

#include <cstdio>

namespace m = memalg;

using training = m::train::recipe<m::precision::amp_bf16, m::optim::adamw<>, m::train::batch<1, 4096>,
                                  m::train::recompute::full>;
template <int Gpus>
using qwen3_on = m::plan<m::presets::qwen3_8b, training,
                         m::parallel::mesh<m::parallel::data<Gpus, m::parallel::zero<Gpus == 1 ? 0 : 3>>>,
                         m::device::h100_80gb>;

static_assert(!qwen3_on<1>::fits, "Qwen3-8B's model states alone exceed one 80 GB GPU");
static_assert(m::require_fits<qwen3_on<8>>(), "ZeRO-3 over 8 GPUs fits Qwen3-8B at sequence 4096");

// Gemma 2 soft-caps its logits (`tanh(logits / 30) · 30`): tanh keeps its output, one more
// logits-sized tensor from the forward to the loss's backward (docs/algebra.md, "Gemma 2 and
// Gemma 3"). At a vocabulary of 256 000 and 4096 tokens that tensor is 2.1 GB in bf16; the peak
// grows by what of it is alive at the peak's moment.
constexpr m::family_lm_config gemma2_uncapped() {
  m::family_lm_config f = m::presets::gemma2_9b_family();
  f.attention_softcap = f.logit_softcap = false;
  return f;
}
template <class Model>
using gemma2_on = m::plan<Model, training, m::parallel::mesh<m::parallel::data<8, m::parallel::zero<3>>>,
                          m::device::h100_80gb>;
static_assert(gemma2_on<m::presets::gemma2_9b>::per_rank.total() >
                  gemma2_on<m::presets::family_preset<gemma2_uncapped>>::per_rank.total(),
              "soft-capped logits keep their tanh output");

// Mixtral 8x7B on Megatron-LM (train::stacks::megatron): Megatron's softmax top-k router with its
// load-balancing loss, and expert parallelism through its default allgather dispatcher, whose
// rows the plan bounds by the worst routing, every token of the expert-parallel group sent to
// this rank's experts (docs/algebra.md, "The megatron stack"; no measurement covers either, so a
// plan says it is outside the envelope). On 32 H100s as 4 pipeline stages of 8 data-parallel
// ranks with the distributed optimizer, a stage's 8 experts per block do not fit on one rank;
// spread over 8 expert-parallel ranks they do, even with the worst routing's tokens.
using megatron_training = m::train::recipe<m::precision::mixed_bf16_fp32_grads, m::optim::adam<>, m::train::batch<1, 4096>,
                                           m::train::recompute::full, m::train::stacks::megatron>;
// A model on H100s under Megatron-LM: Dp data-parallel ranks with the distributed optimizer, Pp
// pipeline stages, Ep expert-parallel ranks.
template <class Model, int Dp, int Pp, int Ep>
using megatron_on = m::plan<Model, megatron_training,
                            m::parallel::mesh<m::parallel::data<Dp, m::parallel::zero<1>>, m::parallel::pipeline<Pp>,
                                              m::parallel::expert<Ep>>,
                            m::device::h100_80gb>;
template <int Ep>
using mixtral_on = megatron_on<m::presets::mixtral_8x7b, 8, 4, Ep>;
static_assert(!mixtral_on<1>::fits, "every expert on every rank: Mixtral 8x7B's stage does not fit");
static_assert(m::require_fits<mixtral_on<8>>(), "one expert per rank and block fits, whatever the routing");

// DeepSeek-V3 on Megatron-LM: multi-head latent attention (MLASelfAttention; its 192-wide query
// and key heads with 128-wide values train in cuDNN's fused attention from Hopper on), the sigmoid
// router with its expert bias in fp32, the shared expert, and the same worst-routing bound on the
// rows of expert parallelism (docs/algebra.md, "The megatron stack"; outside the envelope too).
// On 1024 H100s as 16 pipeline stages of 64 data-parallel ranks with the distributed optimizer,
// all 256 experts per block on every rank do not fit; eight expert-parallel ranks do.
template <int Ep>
using deepseek_on = megatron_on<m::presets::deepseek_v3, 64, 16, Ep>;
static_assert(!deepseek_on<1>::fits, "every expert on every rank: DeepSeek-V3's stage does not fit");
static_assert(m::require_fits<deepseek_on<8>>(), "32 experts per rank and block fit, whatever the routing");

// Active parameters: every parameter but the routed experts a token is not sent to and the input
// embedding table (gpt-oss's convention; model/families.hpp).
static_assert(m::active_parameters(m::presets::gpt_oss_20b::value) < m::presets::gpt_oss_20b::value.parameters() / 5);

namespace {
template <class Preset>
void row(const char* name) {
  constexpr std::uint64_t total = Preset::value.parameters();
  constexpr std::uint64_t active = m::active_parameters(Preset::value);
  constexpr bool experts = [] {
    for (const m::layer_desc& l : Preset::value)
      if ((l.shape.flags & m::layer_flags::moe) != 0) return true;
    return false;
  }();
  std::printf("  %-16s %8.2fB parameters", name, static_cast<double>(total) / 1e9);
  if (experts) std::printf(", %6.2fB active per token", static_cast<double>(active) / 1e9);
  std::printf("\n");
}
}  // namespace

int main() {
  std::printf("presets of current families (exact parameters, as transformers 5.17 instantiates them)\n");
  row<m::presets::qwen3_8b>("qwen3-8b");
  row<m::presets::gemma3_27b>("gemma3-27b");
  row<m::presets::phi4>("phi4");
  row<m::presets::qwen3_30b_a3b>("qwen3-30b-a3b");
  row<m::presets::gpt_oss_20b>("gpt-oss-20b");
  row<m::presets::deepseek_v3>("deepseek-v3");
  row<m::presets::llama4_scout>("llama4-scout");
  std::printf("\nQwen3-8B, amp-bf16 AdamW, sequence 4096, full recomputation, H100 80 GB\n");
  std::printf("  1 GPU:            %s per GPU (does not fit)\n", m::to_string(qwen3_on<1>::per_rank.total()).c_str());
  std::printf("  8 GPUs, ZeRO-3:   %s per GPU\n", m::to_string(qwen3_on<8>::per_rank.total()).c_str());
  std::printf("\nGemma-2-9B, the same training, 8 GPUs, ZeRO-3\n");
  std::printf("  as released (soft-capped logits): %s per GPU\n",
              m::to_string(gemma2_on<m::presets::gemma2_9b>::per_rank.total()).c_str());
  std::printf("  without soft-capping:             %s per GPU\n",
              m::to_string(gemma2_on<m::presets::family_preset<gemma2_uncapped>>::per_rank.total()).c_str());
  std::printf("\nMixtral 8x7B on Megatron-LM, sequence 4096, full recomputation, 32 H100s (pp 4, dp 8, ZeRO-1)\n");
  std::printf("  expert parallelism 1: %s per GPU (does not fit)\n", m::to_string(mixtral_on<1>::per_rank.total()).c_str());
  std::printf("  expert parallelism 8: %s per GPU (the worst routing's rows)\n",
              m::to_string(mixtral_on<8>::per_rank.total()).c_str());
  std::printf("\nDeepSeek-V3 on Megatron-LM, sequence 4096, full recomputation, 1024 H100s (pp 16, dp 64, ZeRO-1)\n");
  std::printf("  expert parallelism 1: %s per GPU (does not fit)\n", m::to_string(deepseek_on<1>::per_rank.total()).c_str());
  std::printf("  expert parallelism 8: %s per GPU (the worst routing's rows)\n",
              m::to_string(deepseek_on<8>::per_rank.total()).c_str());
  return 0;
}

// SPDX-License-Identifier: BSL-1.0
// examples/finetune.cpp — will a fine-tune of Llama 3 8B fit on a 24 GB card? Full fine-tuning,
// LoRA and QLoRA planned at compile time under the pytorch stack's fine-tuning rules
// (docs/tutorial-finetune.md; docs/algebra.md, "Fine-tuning"), the same plans as
//
//   memalg fit --preset llama3-8b --seq 2048 --precision bf16 --device rtx4090 \
//              [--lora 16 --lora-dropout 0.05 [--base-storage nf4-dq] [--recompute full]]
//
// Full fine-tuning needs 16 GB of bf16 weights before any gradient; LoRA on a bf16 base fits
// only with checkpointing; QLoRA's NF4 base leaves room for a larger micro-batch.
#include <memalg/memalg.hpp>

#include <cstdio>

namespace m = memalg;

using llama3 = m::presets::llama3_8b;
// PEFT's LoraConfig(r=16, lora_dropout=0.05, target_modules="all-linear")
using lora = m::model::lora<16, llama3, m::lora_target::all_linear, 50>;
// bitsandbytes' NF4 with double quantization under prepare_model_for_kbit_training (the other
// parameters fp32), the same adapters
using qlora = m::model::qlora<16, llama3, m::model::dt::nf4_double_quant, m::lora_target::all_linear, 50, m::model::dt::fp32>;

template <class Model, std::uint64_t MicroBatch, class Recompute>
using on_rtx4090 =
    m::plan<Model, m::train::recipe<m::precision::bf16, m::optim::adamw<>, m::train::batch<MicroBatch, 2048>, Recompute>,
            m::parallel::mesh<>, m::device::rtx4090>;

static_assert(!on_rtx4090<llama3, 1, m::train::recompute::full>::fits, "full fine-tuning of an 8B model needs more than 24 GB");
static_assert(!on_rtx4090<lora, 1, m::train::recompute::none>::fits, "LoRA without checkpointing keeps every block's tensors");
static_assert(m::require_fits<on_rtx4090<lora, 2, m::train::recompute::full>>(), "LoRA with checkpointing: micro-batch 2");
static_assert(m::require_fits<on_rtx4090<qlora, 4, m::train::recompute::full>>(), "QLoRA with checkpointing: micro-batch 4");
static_assert(!on_rtx4090<qlora, 5, m::train::recompute::full>::fits, "micro-batch 5 is one too many");

namespace {
template <class Plan>
void row(const char* name) {
  std::printf("  %-38s %8.2f GiB  trainable %6.1fM  %s\n", name, static_cast<double>(Plan::per_rank.total().value) / (1 << 30),
              static_cast<double>(Plan::model_type::value.trainable_parameters()) / 1e6, Plan::fits ? "fits" : "does not fit");
}
}  // namespace

int main() {
  std::printf("Llama 3 8B, sequence 2048, bf16, AdamW, on an RTX 4090 (24 GB):\n");
  row<on_rtx4090<llama3, 1, m::train::recompute::full>>("full fine-tuning, mb 1, checkpointed");
  row<on_rtx4090<lora, 1, m::train::recompute::none>>("LoRA r16, mb 1");
  row<on_rtx4090<lora, 2, m::train::recompute::full>>("LoRA r16, mb 2, checkpointed");
  row<on_rtx4090<qlora, 4, m::train::recompute::full>>("QLoRA nf4-dq r16, mb 4, checkpointed");
  return 0;
}

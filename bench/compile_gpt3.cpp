// SPDX-License-Identifier: BSL-1.0
// Compile-time cost of checking a GPT-3 175B plan with activations: Megatron-LM's 1024-GPU
// configuration (Narayanan et al. 2021; Korthikanti et al. 2022): tensor 8 with sequence
// parallelism, pipeline 16 (1F1B), data 8 with the distributed optimizer (ZeRO-1), micro-batch 1 of
// 2048 tokens, 192 micro-batches per step, selective recomputation, bf16 on A100 80 GB. The
// vocabulary is padded to a multiple of 128·8 as Megatron does.
#include <memalg/memalg.hpp>
namespace m = memalg;
using gpt3 = m::model::padded_vocab<m::presets::gpt3_175b, 128 * 8>;
using recipe = m::train::recipe<m::precision::amp_bf16, m::optim::adam<>, m::train::batch<1, 2048>,
                                m::train::grad_accum<192>, m::train::recompute::selective>;
using mesh = m::parallel::mesh<m::parallel::data<8, m::parallel::zero<1>>, m::parallel::tensor<8, true>,
                               m::parallel::pipeline<16>>;
using plan = m::plan<gpt3, recipe, mesh, m::device::a100_80gb>;
static_assert(m::require_fits<plan>());
static_assert(plan::result.most_loaded_stage == 0);
int main() { return plan::fits ? 0 : 1; }

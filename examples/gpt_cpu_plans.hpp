// SPDX-License-Identifier: BSL-1.0
// examples/gpt_cpu_plans.hpp — the named plans of train_gpt_cpu, in one place: the binary runs
// them, and the golden-trajectory tests (tests/mpi/test_golden_named.cpp) replay them.
#pragma once

#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/memalg.hpp>

#include <tuple>

#include "train_common.hpp"

namespace gpt_cpu_plans {

namespace m = memalg;
using namespace memalg::literals;
using train_common::gpt_bytes;

// ---- the plans ------------------------------------------------------------------------------
/// A memory budget for a CPU process: 1 GiB, no device reserve.
struct cpu_budget {
  static constexpr m::device_desc value{"cpu-1gib", 1_GiB, m::bytes{}};
};

struct gpt_fp32 { static constexpr m::lm_config value = gpt_bytes(m::dtypes::fp32); };
struct gpt_bf16 { static constexpr m::lm_config value = gpt_bytes(m::dtypes::bf16); };
struct gpt_fp16_flash { static constexpr m::lm_config value = gpt_bytes(m::dtypes::fp16, true); };
struct gpt_fp32_dropout { static constexpr m::lm_config value = gpt_bytes(m::dtypes::fp32, true, 100); };
/// The same size, Llama-shaped: RMSNorm, SwiGLU, rotary positions, 2 key/value heads for 4, no
/// biases, an untied output layer, flash attention.
struct llama_fp32 {
  static constexpr m::lm_config value = [] {
    m::lm_config c = gpt_bytes(m::dtypes::fp32, true);
    c.name = "llama-bytes";
    c.positions = 0;
    c.rotary = true;
    c.kv_heads = 2;
    c.ffn = 172;
    c.rms_norm = true;
    c.gated = true;
    c.bias = false;
    c.tied = false;
    return c;
  }();
};

/// gpt_fp32 with an untied output layer: the CPU runtime's pipeline stages keep no copy of a tied
/// embedding on the last stage (exec/gpt/plan.hpp, find_cpu_pipeline_issue).
struct gpt_fp32_untied {
  static constexpr m::lm_config value = [] {
    m::lm_config c = gpt_bytes(m::dtypes::fp32);
    c.tied = false;
    return c;
  }();
};

/// llama_fp32 with bf16 logits, for the mixed-bf16 policy (activations and logits in the weight dtype).
struct llama_bf16 {
  static constexpr m::lm_config value = [] {
    m::lm_config c = llama_fp32::value;
    c.logits = m::dtypes::bf16;
    return c;
  }();
};

/// The same size, Qwen2-shaped: as llama_fp32 but with biases on the q, k, v projections only and
/// the output tied to the token embedding (Qwen2-0.5B's layout: modeling_qwen2.py, its config.json).
struct qwen2_fp32 {
  static constexpr m::lm_config value = [] {
    m::lm_config c = llama_fp32::value;
    c.name = "qwen2-bytes";
    c.qkv_bias = true;
    c.tied = true;
    return c;
  }();
};

/// The same size, GPT-NeoX-shaped: parallel residual (y = x + attn(ln1(x)) + mlp(ln2(x))),
/// LayerNorm with biases, GeLU MLP, rotary positions over a quarter of each head (Pythia's
/// rotary_pct 0.25), an untied output layer, flash attention (modeling_gpt_neox.py).
struct neox_fp32 {
  static constexpr m::lm_config value = [] {
    m::lm_config c = gpt_bytes(m::dtypes::fp32, true);
    c.name = "neox-bytes";
    c.positions = 0;
    c.rotary = true;
    c.rotary_dim = 4;
    c.parallel_residual = true;
    c.tied = false;
    return c;
  }();
};

/// The same size, Falcon-7B-shaped: parallel residual through one shared LayerNorm
/// (y = x + attn(ln(x)) + mlp(ln(x))), multi-query attention (one key/value head), rotary
/// positions, no projection biases, tied output, flash attention (modeling_falcon.py with
/// parallel_attn and not new_decoder_architecture).
struct falcon_fp32 {
  static constexpr m::lm_config value = [] {
    m::lm_config c = gpt_bytes(m::dtypes::fp32, true);
    c.name = "falcon-bytes";
    c.positions = 0;
    c.rotary = true;
    c.kv_heads = 1;
    c.parallel_residual = true;
    c.shared_norm = true;
    c.bias = false;
    return c;
  }();
};

template <class Config, class Recipe, class Mesh>
using cpu_plan = m::plan<m::exec::runtime_gpt<Config>, Recipe, Mesh, cpu_budget>;
template <class Precision, class Optimizer, class... Options>
using recipe = m::train::recipe<Precision, Optimizer, m::train::batch<8, 64>, m::train::reference_kernels, Options...>;
using single = m::parallel::mesh<>;

MEMALG_NAMED_PLAN(tiny_fp32, "tiny-fp32", "fp32, AdamW, 1 rank",
                  cpu_plan<gpt_fp32, recipe<m::precision::fp32, m::optim::adamw<>>, single>);
MEMALG_NAMED_PLAN(tiny_bf16, "tiny-bf16", "bf16 weights and gradients, fp32 master weights and AdamW states, 1 rank",
                  cpu_plan<gpt_bf16, recipe<m::precision::mixed_bf16, m::optim::adamw<>>, single>);
MEMALG_NAMED_PLAN(tiny_fp16, "tiny-fp16", "fp16 with fp32 master weights and dynamic loss scaling, flash attention, 1 rank",
                  cpu_plan<gpt_fp16_flash, recipe<m::precision::amp_fp16, m::optim::adamw<>>, single>);
// Momentum SGD needs a larger step than the Adam-family default: this run's own learning rate.
MEMALG_NAMED_PLAN_LR(tiny_recompute, "tiny-recompute",
                     "fp32, momentum SGD (lr 0.05), dropout 0.1, full recomputation, 2 accumulated micro-batches, 1 rank",
                     0.05f,
                     cpu_plan<gpt_fp32_dropout,
                              recipe<m::precision::fp32, m::optim::momentum<>, m::train::recompute::full,
                                     m::train::grad_accum<2>>,
                              single>);
MEMALG_NAMED_PLAN(llama_fp32_plan, "llama-fp32",
                  "fp32 AdamW, Llama-shaped (RMSNorm, SwiGLU, rotary, grouped-query flash attention, no biases, untied output), 1 rank",
                  cpu_plan<llama_fp32, recipe<m::precision::fp32, m::optim::adamw<>>, single>);
MEMALG_NAMED_PLAN(llama_bf16_plan, "llama-bf16",
                  "bf16 weights and gradients, fp32 master weights and AdamW states, Llama-shaped (as llama-fp32), 1 rank",
                  cpu_plan<llama_bf16, recipe<m::precision::mixed_bf16, m::optim::adamw<>>, single>);
MEMALG_NAMED_PLAN(qwen2_fp32_plan, "qwen2-fp32",
                  "fp32 AdamW, Qwen2-shaped (as llama-fp32 with q/k/v biases and a tied output), 1 rank",
                  cpu_plan<qwen2_fp32, recipe<m::precision::fp32, m::optim::adamw<>>, single>);
MEMALG_NAMED_PLAN(neox_fp32_plan, "neox-fp32",
                  "fp32 AdamW, GPT-NeoX-shaped (parallel residual, LayerNorm with biases, GeLU, partial rotary, untied output), 1 rank",
                  cpu_plan<neox_fp32, recipe<m::precision::fp32, m::optim::adamw<>>, single>);
MEMALG_NAMED_PLAN(falcon_fp32_plan, "falcon-fp32",
                  "fp32 AdamW, Falcon-shaped (parallel residual through one shared LayerNorm, multi-query attention, rotary, "
                  "no biases, tied output), 1 rank",
                  cpu_plan<falcon_fp32, recipe<m::precision::fp32, m::optim::adamw<>>, single>);
MEMALG_NAMED_PLAN(dp2_zero1, "dp2-zero1", "fp32 AdamW, 2 data-parallel ranks, ZeRO-1",
                  cpu_plan<gpt_fp32, recipe<m::precision::fp32, m::optim::adamw<>>,
                           m::parallel::mesh<m::parallel::data<2, m::parallel::zero<1>>>>);
MEMALG_NAMED_PLAN(dp4_zero3, "dp4-zero3", "fp32 AdamW, 4 data-parallel ranks, ZeRO-3 (one layer gathered at a time)",
                  cpu_plan<gpt_fp32, recipe<m::precision::fp32, m::optim::adamw<>>,
                           m::parallel::mesh<m::parallel::data<4, m::parallel::zero<3, 0>>>>);
MEMALG_NAMED_PLAN(tp2, "tp2", "fp32 AdamW, 2 tensor-parallel ranks, vocabulary-parallel embedding and loss",
                  cpu_plan<gpt_fp32, recipe<m::precision::fp32, m::optim::adamw<>>,
                           m::parallel::mesh<m::parallel::tensor<2>>>);
MEMALG_NAMED_PLAN(tp2_sp, "tp2-sp", "fp32 AdamW, 2 tensor-parallel ranks with sequence parallelism, vocabulary-parallel",
                  cpu_plan<gpt_fp32, recipe<m::precision::fp32, m::optim::adamw<>>,
                           m::parallel::mesh<m::parallel::tensor<2, true>>>);
MEMALG_NAMED_PLAN(tp2_sp_dropout, "tp2-sp-dropout",
                  "fp32 AdamW, dropout 0.1, flash attention, 2 tensor-parallel ranks with sequence parallelism",
                  cpu_plan<gpt_fp32_dropout, recipe<m::precision::fp32, m::optim::adamw<>>,
                           m::parallel::mesh<m::parallel::tensor<2, true>>>);
MEMALG_NAMED_PLAN(dp2_tp2_zero2, "dp2-tp2-zero2", "fp32 AdamW, 2 data-parallel x 2 tensor-parallel ranks, ZeRO-2",
                  cpu_plan<gpt_fp32, recipe<m::precision::fp32, m::optim::adamw<>>,
                           m::parallel::mesh<m::parallel::data<2, m::parallel::zero<2>>, m::parallel::tensor<2>>>);
MEMALG_NAMED_PLAN(llama_bf16_dp2, "llama-bf16-dp2",
                  "bf16 weights and gradients, fp32 master weights and AdamW states, Llama-shaped (as llama-fp32), "
                  "2 data-parallel ranks, ZeRO-1 (gradients reduced as bf16)",
                  cpu_plan<llama_bf16, recipe<m::precision::mixed_bf16, m::optim::adamw<>>,
                           m::parallel::mesh<m::parallel::data<2, m::parallel::zero<1>>>>);
template <class Precision, class Optimizer, class... Options>
using pipeline_recipe =
    m::train::recipe<Precision, Optimizer, m::train::batch<4, 64>, m::train::grad_accum<4>, m::train::reference_kernels, Options...>;
MEMALG_NAMED_PLAN(pp2, "pp2", "fp32 AdamW, untied output, 2 pipeline stages (1F1B, 4 micro-batches)",
                  cpu_plan<gpt_fp32_untied, pipeline_recipe<m::precision::fp32, m::optim::adamw<>>,
                           m::parallel::mesh<m::parallel::pipeline<2>>>);
MEMALG_NAMED_PLAN(pp2_dp2, "pp2-dp2", "fp32 AdamW, untied output, 2 data-parallel ranks x 2 pipeline stages (1F1B, 4 micro-batches)",
                  cpu_plan<gpt_fp32_untied, pipeline_recipe<m::precision::fp32, m::optim::adamw<>>,
                           m::parallel::mesh<m::parallel::data<2>, m::parallel::pipeline<2>>>);

using plans = std::tuple<tiny_fp32, tiny_bf16, tiny_fp16, tiny_recompute, llama_fp32_plan, llama_bf16_plan, qwen2_fp32_plan,
                         neox_fp32_plan, falcon_fp32_plan, dp2_zero1,
                         dp4_zero3, tp2, tp2_sp, tp2_sp_dropout, dp2_tp2_zero2, llama_bf16_dp2, pp2, pp2_dp2>;

}  // namespace gpt_cpu_plans

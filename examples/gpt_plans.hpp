// SPDX-License-Identifier: BSL-1.0
// examples/gpt_plans.hpp — the named GPT plans of both training binaries, written once: each
// plan's model, recipe and mesh, planned for the device the binary runs on (`on<Device>`: a 1 GiB
// CPU process for train_gpt_cpu, an H200 for train_gpt_cuda). A binary runs the plans its runtime
// implements and that fit its device (`cpu_plans`, `cuda_plans`), and refuses the others with a
// sentence (`cpu_refusal`, `cuda_refusal`: exec::runtime_issue's, or the device's budget). The
// golden-trajectory tests (tests/mpi/test_golden_named.cpp) replay the CPU's.
#pragma once

#include <memalg/exec/gpt/plan.hpp>
#include <memalg/exec/gpt/plan_cuda.hpp>
#include <memalg/exec/runtime_issues.hpp>
#include <memalg/memalg.hpp>

#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "train_common.hpp"

namespace gpt_plans {

namespace m = memalg;
using namespace memalg::literals;
using train_common::gpt_bytes;

// ---- the models -------------------------------------------------------------------------------
struct gpt_fp32 { static constexpr m::lm_config value = gpt_bytes(m::dtypes::fp32); };
struct gpt_bf16 { static constexpr m::lm_config value = gpt_bytes(m::dtypes::bf16); };
struct gpt_bf16_flash { static constexpr m::lm_config value = gpt_bytes(m::dtypes::bf16, true); };
struct gpt_fp16_flash { static constexpr m::lm_config value = gpt_bytes(m::dtypes::fp16, true); };
struct gpt_fp32_dropout { static constexpr m::lm_config value = gpt_bytes(m::dtypes::fp32, true, 100); };

/// gpt_fp32 with an untied output layer: pipeline stages keep no copy of a tied embedding on the
/// last stage (exec/gpt/plan.hpp, find_cpu_pipeline_issue).
struct gpt_fp32_untied {
  static constexpr m::lm_config value = [] {
    m::lm_config c = gpt_bytes(m::dtypes::fp32);
    c.tied = false;
    return c;
  }();
};

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

/// The same size, Qwen3-shaped: as llama_fp32 with an RMSNorm over each query and key head before
/// the rotary positions (q_norm, k_norm), heads wider than hidden / heads (32 for 64 / 4, as
/// Qwen3-0.6B's 128 for 1024 / 16), ε 1e-6 and the output tied to the token embedding (Qwen3-0.6B's
/// layout: modeling_qwen3.py, its config.json).
struct qwen3_fp32 {
  static constexpr m::lm_config value = [] {
    m::lm_config c = llama_fp32::value;
    c.name = "qwen3-bytes";
    c.qk_norm = true;
    c.head_dim = 32;
    c.norm_eps = 1e-6;
    c.tied = true;
    return c;
  }();
};

/// qwen3_fp32 with bf16 logits, for the mixed-bf16 policy.
struct qwen3_bf16 {
  static constexpr m::lm_config value = [] {
    m::lm_config c = qwen3_fp32::value;
    c.logits = m::dtypes::bf16;
    return c;
  }();
};

/// The same size, Gemma-2-shaped (modeling_gemma2.py, Gemma 2's config.json): RMSNorms before and
/// after each sub-layer scaling by 1 + w, GeGLU (gelu_pytorch_tanh on the gate), rotary positions,
/// 4 heads of 32 for a width of 64 with 2 key/value heads, query_pre_attn_scalar 24 (not the head
/// width, as Gemma 2 27B's 144 for 128), attention scores capped at 50 and logits at 30, local
/// attention over the last 16 positions on layers 0 and 2, the embedding times √64, no biases, a
/// tied output, ε 1e-6, flash attention.
struct gemma2_fp32 {
  static constexpr m::lm_config value = [] {
    m::lm_config c = llama_fp32::value;
    c.name = "gemma2-bytes";
    c.head_dim = 32;
    c.norm_eps = 1e-6;
    c.sandwich_norms = true;
    c.geglu = true;
    c.embed_scale = true;
    c.attn_softcap = 50.0;
    c.final_softcap = 30.0;
    c.sliding_window = 16;
    c.query_scalar = 24.0;
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

/// GPT-2 small's shape (Radford et al. 2019; 124M parameters with the vocabulary padded to
/// 50304 = 393·128, as llm.c pads it), bf16 logits, flash attention.
struct gpt2_124m {
  static constexpr m::lm_config value = [] {
    m::lm_config c{};
    c.name = "gpt2-124m";
    c.layers = 12;
    c.hidden = 768;
    c.heads = 12;
    c.vocab = 50304;
    c.positions = 1024;
    c.logits = m::dtypes::bf16;
    c.flash = true;
    return c;
  }();
};

// ---- the devices ------------------------------------------------------------------------------
/// A memory budget for a CPU process: 1 GiB, no device reserve.
struct cpu_budget {
  static constexpr m::device_desc value{"cpu-1gib", 1_GiB, m::bytes{}};
};
/// train_gpt_cuda's plans target the H200 the benchmark runs on; its device reserve (context
/// estimate + 32 MiB cuBLASLt workspace) is what the measured overhead layers are compared with.
using gpu_device = m::device::h200;

// ---- the plans --------------------------------------------------------------------------------
/// The step program's layout: under tensor parallelism the token embedding and the tied output
/// layer are vocabulary-parallel (Megatron's).
template <class Config, class Recipe, class Mesh, class Device>
using vocab_plan = m::plan<m::exec::runtime_gpt<Config>, Recipe, Mesh, Device>;
/// Embeddings and the output layer replicated on every tensor-parallel rank.
template <class Config, class Recipe, class Mesh, class Device>
using replicated_plan = m::plan<m::exec::runtime_gpt_replicated<Config>, Recipe, Mesh, Device>;
template <class Precision, class Optimizer, class Batch, class... Options>
using recipe_of = m::train::recipe<Precision, Optimizer, Batch, m::train::reference_kernels, Options...>;
template <class Precision, class Optimizer, class... Options>
using recipe = recipe_of<Precision, Optimizer, m::train::batch<8, 64>, Options...>;
template <class Precision, class Optimizer, class... Options>
using pipeline_recipe = m::train::recipe<Precision, Optimizer, m::train::batch<4, 64>, m::train::grad_accum<4>,
                                         m::train::reference_kernels, Options...>;
using single = m::parallel::mesh<>;
using fp32_adamw = recipe<m::precision::fp32, m::optim::adamw<>>;

/// Every named plan, planned for `Device`.
template <class Device>
struct on {
  MEMALG_NAMED_PLAN(tiny_fp32, "tiny-fp32", "fp32, AdamW, 1 rank", vocab_plan<gpt_fp32, fp32_adamw, single, Device>);
  MEMALG_NAMED_PLAN(tiny_bf16, "tiny-bf16", "bf16 weights and gradients, fp32 master weights and AdamW states, 1 rank",
                    vocab_plan<gpt_bf16, recipe<m::precision::mixed_bf16, m::optim::adamw<>>, single, Device>);
  MEMALG_NAMED_PLAN(tiny_fp16, "tiny-fp16",
                    "fp16 with fp32 master weights and dynamic loss scaling, flash attention, 1 rank",
                    vocab_plan<gpt_fp16_flash, recipe<m::precision::amp_fp16, m::optim::adamw<>>, single, Device>);
  MEMALG_NAMED_PLAN(tiny_selective, "tiny-selective",
                    "mixed-bf16, flash attention, selective recomputation, 2 accumulated micro-batches, 1 rank",
                    vocab_plan<gpt_bf16_flash,
                               recipe<m::precision::mixed_bf16, m::optim::adamw<>, m::train::recompute::selective,
                                      m::train::grad_accum<2>>,
                               single, Device>);
  // Momentum SGD needs a larger step than the Adam-family default: this run's own learning rate.
  MEMALG_NAMED_PLAN_LR(tiny_recompute, "tiny-recompute",
                       "fp32, momentum SGD (lr 0.05), dropout 0.1, full recomputation, 2 accumulated micro-batches, "
                       "1 rank",
                       0.05f,
                       vocab_plan<gpt_fp32_dropout,
                                  recipe<m::precision::fp32, m::optim::momentum<>, m::train::recompute::full,
                                         m::train::grad_accum<2>>,
                                  single, Device>);
  MEMALG_NAMED_PLAN(llama_fp32_plan, "llama-fp32",
                    "fp32 AdamW, Llama-shaped (RMSNorm, SwiGLU, rotary, grouped-query flash attention, no biases, "
                    "untied output), 1 rank",
                    vocab_plan<llama_fp32, fp32_adamw, single, Device>);
  MEMALG_NAMED_PLAN(llama_bf16_plan, "llama-bf16",
                    "bf16 weights and gradients, fp32 master weights and AdamW states, Llama-shaped (as llama-fp32), "
                    "1 rank",
                    vocab_plan<llama_bf16, recipe<m::precision::mixed_bf16, m::optim::adamw<>>, single, Device>);
  MEMALG_NAMED_PLAN(qwen2_fp32_plan, "qwen2-fp32",
                    "fp32 AdamW, Qwen2-shaped (as llama-fp32 with q/k/v biases and a tied output), 1 rank",
                    vocab_plan<qwen2_fp32, fp32_adamw, single, Device>);
  MEMALG_NAMED_PLAN(qwen3_fp32_plan, "qwen3-fp32",
                    "fp32 AdamW, Qwen3-shaped (as llama-fp32 with per-head QK-norm, 32-wide heads and a tied output), "
                    "1 rank",
                    vocab_plan<qwen3_fp32, fp32_adamw, single, Device>);
  MEMALG_NAMED_PLAN(qwen3_bf16_plan, "qwen3-bf16",
                    "bf16 weights and gradients, fp32 master weights and AdamW states, Qwen3-shaped (as qwen3-fp32), "
                    "1 rank",
                    vocab_plan<qwen3_bf16, recipe<m::precision::mixed_bf16, m::optim::adamw<>>, single, Device>);
  MEMALG_NAMED_PLAN(gemma2_fp32_plan, "gemma2-fp32",
                    "fp32 AdamW, Gemma-2-shaped (norms before and after each sub-layer, GeGLU, attention and logit "
                    "softcapping, alternating sliding windows, scaled tied embedding), 1 rank",
                    vocab_plan<gemma2_fp32, fp32_adamw, single, Device>);
  MEMALG_NAMED_PLAN(neox_fp32_plan, "neox-fp32",
                    "fp32 AdamW, GPT-NeoX-shaped (parallel residual, LayerNorm with biases, GeLU, partial rotary, "
                    "untied output), 1 rank",
                    vocab_plan<neox_fp32, fp32_adamw, single, Device>);
  MEMALG_NAMED_PLAN(falcon_fp32_plan, "falcon-fp32",
                    "fp32 AdamW, Falcon-shaped (parallel residual through one shared LayerNorm, multi-query attention, "
                    "rotary, no biases, tied output), 1 rank",
                    vocab_plan<falcon_fp32, fp32_adamw, single, Device>);
  MEMALG_NAMED_PLAN(dp2_zero1, "dp2-zero1", "fp32 AdamW, 2 data-parallel ranks, ZeRO-1",
                    vocab_plan<gpt_fp32, fp32_adamw, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<1>>>,
                               Device>);
  MEMALG_NAMED_PLAN(dp2_zero2_bf16, "dp2-zero2-bf16",
                    "mixed-bf16 AdamW, 2 data-parallel ranks, ZeRO-2 (gradients reduced as bf16)",
                    vocab_plan<gpt_bf16, recipe<m::precision::mixed_bf16, m::optim::adamw<>>,
                               m::parallel::mesh<m::parallel::data<2, m::parallel::zero<2>>>, Device>);
  MEMALG_NAMED_PLAN(dp4_zero3, "dp4-zero3", "fp32 AdamW, 4 data-parallel ranks, ZeRO-3 (one layer gathered at a time)",
                    vocab_plan<gpt_fp32, fp32_adamw, m::parallel::mesh<m::parallel::data<4, m::parallel::zero<3, 0>>>,
                               Device>);
  MEMALG_NAMED_PLAN(tp2, "tp2", "fp32 AdamW, 2 tensor-parallel ranks, vocabulary-parallel embedding and loss",
                    vocab_plan<gpt_fp32, fp32_adamw, m::parallel::mesh<m::parallel::tensor<2>>, Device>);
  MEMALG_NAMED_PLAN(tp2_replicated, "tp2-replicated",
                    "fp32 AdamW, 2 tensor-parallel ranks, embeddings and output layer replicated on both",
                    replicated_plan<gpt_fp32, fp32_adamw, m::parallel::mesh<m::parallel::tensor<2>>, Device>);
  MEMALG_NAMED_PLAN(tp2_sp, "tp2-sp",
                    "fp32 AdamW, 2 tensor-parallel ranks with sequence parallelism, vocabulary-parallel",
                    vocab_plan<gpt_fp32, fp32_adamw, m::parallel::mesh<m::parallel::tensor<2, true>>, Device>);
  MEMALG_NAMED_PLAN(tp2_sp_dropout, "tp2-sp-dropout",
                    "fp32 AdamW, dropout 0.1, flash attention, 2 tensor-parallel ranks with sequence parallelism",
                    vocab_plan<gpt_fp32_dropout, fp32_adamw, m::parallel::mesh<m::parallel::tensor<2, true>>, Device>);
  MEMALG_NAMED_PLAN(dp2_tp2_zero2, "dp2-tp2-zero2", "fp32 AdamW, 2 data-parallel x 2 tensor-parallel ranks, ZeRO-2",
                    vocab_plan<gpt_fp32, fp32_adamw,
                               m::parallel::mesh<m::parallel::data<2, m::parallel::zero<2>>, m::parallel::tensor<2>>,
                               Device>);
  MEMALG_NAMED_PLAN(llama_bf16_dp2, "llama-bf16-dp2",
                    "bf16 weights and gradients, fp32 master weights and AdamW states, Llama-shaped (as llama-fp32), "
                    "2 data-parallel ranks, ZeRO-1 (gradients reduced as bf16)",
                    vocab_plan<llama_bf16, recipe<m::precision::mixed_bf16, m::optim::adamw<>>,
                               m::parallel::mesh<m::parallel::data<2, m::parallel::zero<1>>>, Device>);
  MEMALG_NAMED_PLAN(qwen3_tp2, "qwen3-tp2",
                    "fp32 AdamW, Qwen3-shaped (as qwen3-fp32), 2 tensor-parallel ranks, vocabulary-parallel embedding "
                    "and loss, the QK-norms' gradients summed over them",
                    vocab_plan<qwen3_fp32, fp32_adamw, m::parallel::mesh<m::parallel::tensor<2>>, Device>);
  MEMALG_NAMED_PLAN(gpt2_124m_plan, "gpt2-124m",
                    "GPT-2 124M shape (vocab 50304, 12x768, 12 heads, seq 1024), mixed-bf16 AdamW, flash, 16x1024 "
                    "tokens, 1 rank",
                    vocab_plan<gpt2_124m, recipe_of<m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<16, 1024>>,
                               single, Device>);
  MEMALG_NAMED_PLAN(pp2, "pp2", "fp32 AdamW, untied output, 2 pipeline stages (1F1B, 4 micro-batches)",
                    vocab_plan<gpt_fp32_untied, pipeline_recipe<m::precision::fp32, m::optim::adamw<>>,
                               m::parallel::mesh<m::parallel::pipeline<2>>, Device>);
  MEMALG_NAMED_PLAN(pp2_dp2, "pp2-dp2",
                    "fp32 AdamW, untied output, 2 data-parallel ranks x 2 pipeline stages (1F1B, 4 micro-batches)",
                    vocab_plan<gpt_fp32_untied, pipeline_recipe<m::precision::fp32, m::optim::adamw<>>,
                               m::parallel::mesh<m::parallel::data<2>, m::parallel::pipeline<2>>, Device>);

  using all = std::tuple<tiny_fp32, tiny_bf16, tiny_fp16, tiny_selective, tiny_recompute, llama_fp32_plan, llama_bf16_plan,
                         qwen2_fp32_plan, qwen3_fp32_plan, qwen3_bf16_plan, gemma2_fp32_plan, neox_fp32_plan,
                         falcon_fp32_plan, dp2_zero1,
                         dp2_zero2_bf16, dp4_zero3, tp2, tp2_replicated, tp2_sp, tp2_sp_dropout, dp2_tp2_zero2,
                         llama_bf16_dp2, qwen3_tp2, gpt2_124m_plan, pp2, pp2_dp2>;
};

// ---- who runs what ----------------------------------------------------------------------------
/// Why the CPU runtime does not run a named plan, one sentence ("" when it runs it).
template <class Named>
constexpr std::string_view cpu_refusal() {
  using plan = typename Named::plan;
  if constexpr (!plan::fits) return "it does not fit the CPU process's 1 GiB budget";
  else return m::exec::describe(m::exec::find_cpu_plan_issue<plan>());
}
/// Why the CUDA runtime does not run a named plan, one sentence ("" when it runs it).
template <class Named>
constexpr std::string_view cuda_refusal() {
  using plan = typename Named::plan;
  if constexpr (!plan::fits) return "it does not fit the H200 the plans target";
  else return m::exec::describe_cuda(m::exec::find_cuda_plan_issue<plan>());
}

namespace detail {
template <class Named>
struct cpu_runs : std::bool_constant<cpu_refusal<Named>().empty()> {};
template <class Named>
struct cuda_runs : std::bool_constant<cuda_refusal<Named>().empty()> {};
template <template <class> class Runs, class Tuple>
struct keep;
template <template <class> class Runs, class... Named>
struct keep<Runs, std::tuple<Named...>> {
  using type = decltype(std::tuple_cat(std::conditional_t<Runs<Named>::value, std::tuple<Named>, std::tuple<>>{}...));
};
}  // namespace detail

using cpu_table = on<cpu_budget>::all;
using cuda_table = on<gpu_device>::all;
/// The plans train_gpt_cpu runs, in the table's order.
using cpu_plans = detail::keep<detail::cpu_runs, cpu_table>::type;
/// The plans train_gpt_cuda runs, in the table's order.
using cuda_plans = detail::keep<detail::cuda_runs, cuda_table>::type;

/// The usage error for `--plan name` when the binary does not run it: the table's plan it refuses,
/// with the sentence, or a name the table does not hold.
inline std::string cpu_unknown_plan(std::string_view name) {
  std::string why = "unknown plan '" + std::string(name) + "' (see --list-plans)";
  train_common::for_plan<cpu_table>(name, [&]<class Named>(Named*) {
    why = "plan '" + std::string(name) + "' does not run on the CPU: " + std::string(cpu_refusal<Named>());
  });
  return why;
}
inline std::string cuda_unknown_plan(std::string_view name) {
  std::string why = "unknown plan '" + std::string(name) + "' (see --list-plans)";
  train_common::for_plan<cuda_table>(name, [&]<class Named>(Named*) {
    why = "plan '" + std::string(name) + "' does not run on CUDA: " + std::string(cuda_refusal<Named>());
  });
  return why;
}

}  // namespace gpt_plans

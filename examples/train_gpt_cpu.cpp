// SPDX-License-Identifier: BSL-1.0
// examples/train_gpt_cpu.cpp — the CPU reference training binary.
//
// A small GPT trained byte-level on a text every Debian system ships (the GPL-3 among the common
// licenses). Each named plan is a compile-time `memalg::plan`: the build fails if one would not fit
// its memory budget, and the trainer it instantiates allocates one arena of exactly the planned
// size. Multi-rank plans run under MPI:  mpirun -np 4 train_gpt_cpu --plan dp2-tp2-zero2
// (pipeline plans too: mpirun -np 2 train_gpt_cpu --plan pp2; every stage's arena is its own plan's)
//
//   train_gpt_cpu --list-plans
//   train_gpt_cpu --plan tiny-fp32 --steps 50 [--seed 1] [--checkpoint DIR [--resume]] [--json]
//
// `--steps` is the step the run ends at; with `--resume` it continues from the checkpoint's step.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>
#if MEMALG_HAVE_MPI
#include <memalg/backend/cpu/mpi_communicator.hpp>
#endif

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "train_common.hpp"

namespace m = memalg;
using namespace memalg::literals;
using namespace train_common;

namespace {

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
/// embedding on the last stage (exec/gpt_plan.hpp, find_cpu_pipeline_issue).
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

#undef MEMALG_NAMED_PLAN
#undef MEMALG_NAMED_PLAN_LR

using plans = std::tuple<tiny_fp32, tiny_bf16, tiny_fp16, tiny_recompute, llama_fp32_plan, llama_bf16_plan, qwen2_fp32_plan,
                         neox_fp32_plan, falcon_fp32_plan, dp2_zero1,
                         dp4_zero3, tp2, tp2_sp, tp2_sp_dropout, dp2_tp2_zero2, llama_bf16_dp2, pp2, pp2_dp2>;

// ---- command line ---------------------------------------------------------------------------
const std::string help_text = std::string(
    "usage: train_gpt_cpu [--list-plans] [--plan NAME] [--steps N] [--seed S] [--checkpoint DIR "
    "[--resume]] [--data FILE] [--json]\n"
    "                     [--lr X] [--weight-decay X] [--beta1 X] [--beta2 X] [--eps X] [--momentum X] [--clip X]\n"
    "  --steps N         the step the run ends at (with --resume: continue from the checkpoint)\n") +
    hparams_help + "  multi-rank plans run under MPI: mpirun -np <ranks> train_gpt_cpu --plan NAME\n";

options parse(int argc, char** argv) {
  return parse_options<options>(argc, argv, help_text.c_str(),
                                [](options& o, std::string_view a, const auto& value) { return parse_hparam(o, a, value); });
}

// ---- one plan -------------------------------------------------------------------------------
template <class Named, class Comm>
int train(const options& o, Comm& world, Comm& dp, Comm& tp, Comm& pp, std::size_t dp_rank) {
  using run = m::exec::gpt_run<typename Named::plan, Comm>;
  using plan = typename Named::plan;
  const std::vector<std::int32_t> text = read_bytes(o.data);
  const m::exec::optimizer_hparams hp = hparams_for<Named>(o);
  const m::exec::gpt_config config = m::exec::with_hparams(run::config, hp);
  // A pipeline stage's arena and peak are its own stage's plan (the most loaded stage's otherwise).
  constexpr bool pipelined = run::config.pp > 1;
  const std::size_t stage = static_cast<std::size_t>(pp.rank());
  const m::exec::arena_sizes arena = pipelined ? run::stage_arena(stage) : run::arena;
  const m::breakdown stage_peak =
      pipelined ? m::evaluate_stage(plan::model, plan::training, plan::mesh, plan::device, stage).per_rank
                : plan::result.per_rank;
  auto make = [&]() {
    if constexpr (pipelined) return std::make_unique<typename run::trainer>(config, arena, dp, tp, pp);
    else return std::make_unique<typename run::trainer>(config, arena, dp, tp);
  };
  const auto owned = make();
  typename run::trainer& trainer = *owned;
  const checkpoint_place ckpt = checkpoint_of(o, Named::name, world.rank(), world.size());
  std::uint64_t start = 0;
  if (o.resume) {
    auto sections = trainer.state_sections();
    start = m::exec::load_checkpoint(ckpt.file, ckpt.fingerprint, sections);
    trainer.restore_counters();
  }
  require_steps_after(start, o);

  std::vector<std::int32_t> tok, tgt;
  float first = 0, last = 0;
  std::uint64_t tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t s = start; s < o.steps; ++s) {
    batch_for(text, run::config, o.seed, s, dp_rank, tok, tgt);
    const float loss = trainer.train_step(tok, tgt);
    tokens += tok.size() * run::config.dp;  // every data-parallel rank trains on its own tokens
    if (s == start) first = loss;
    last = loss;
    if (!o.json && world.rank() == 0 && ((s + 1) % 10 == 0 || s == start || s + 1 == o.steps))
      std::printf("step %4llu/%llu  loss %.4f\n", static_cast<unsigned long long>(s + 1),
                  static_cast<unsigned long long>(o.steps), static_cast<double>(loss));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!o.checkpoint.empty()) {
    trainer.store_counters();
    auto sections = trainer.state_sections();
    m::exec::save_checkpoint(ckpt.file, ckpt.fingerprint, o.steps, sections);
  }
  // Memory, in bytes (docs/runtime.md, "Reading the memory report"): the plan's arena, the
  // live-bytes meter's high-water mark over the steps this process ran (this rank's), the bytes
  // allocated, and the program's own layout of a step.
  const auto& mem = trainer.memory();
  const std::size_t predicted_arena = arena.persistent + arena.stack;
  const std::size_t measured_arena = trainer.backend().measured_high_water();
  const std::size_t predicted_peak = static_cast<std::size_t>(stage_peak.total().value);
  // The plan's budget on a CPU process is the arena alone (no device reserve to measure).
  const std::size_t measured_peak = measured_arena + static_cast<std::size_t>(stage_peak.reserve.value);
  // The layout must be the plan's to the byte. The live bytes may be fewer (where the layout holds
  // tensors no op reads again at its peak: docs/runtime.md), never more.
  const bool fits = mem.capacity() == predicted_arena && mem.high_water() == predicted_arena &&
                    measured_arena <= predicted_arena;
  if (!fits)
    std::fprintf(stderr,
                 "train_gpt_cpu: rank %d: the arena differs from the plan's %zu bytes: measured high-water of live "
                 "bytes %zu, allocated %zu, laid out %zu\n",
                 world.rank(), predicted_arena, measured_arena, mem.capacity(), mem.high_water());
  else if (measured_arena < predicted_arena && !o.json)
    std::fprintf(stderr,
                 "train_gpt_cpu: note: rank %d: the live bytes peak %zu bytes below the plan's arena: at its peak the "
                 "layout holds tensors no op reads again\n",
                 world.rank(), predicted_arena - measured_arena);
  if (world.rank() == 0) {
    if (o.json) {
      std::printf("{\"plan\": \"%s\", \"steps\": %llu, \"loss_first\": %.6f, \"loss_last\": %.6f, \"tokens_per_s\": %.1f, "
                  "\"hparams\": {\"lr\": %g, \"weight_decay\": %g, \"beta1\": %g, \"beta2\": %g, \"eps\": %g, "
                  "\"momentum\": %g, \"clip\": %g}, "
                  "\"memory\": {\"predicted_arena\": %zu, \"measured_arena\": %zu, \"arena_capacity\": %zu, "
                  "\"layout_high_water\": %zu, \"predicted_peak\": %zu, \"measured_peak\": %zu}}\n",
                  Named::name.data(), static_cast<unsigned long long>(o.steps - start), static_cast<double>(first),
                  static_cast<double>(last), static_cast<double>(tokens) / seconds, static_cast<double>(hp.lr),
                  static_cast<double>(hp.weight_decay), static_cast<double>(hp.beta1), static_cast<double>(hp.beta2),
                  static_cast<double>(hp.eps), static_cast<double>(hp.momentum), static_cast<double>(hp.max_grad_norm),
                  predicted_arena, measured_arena, mem.capacity(), mem.high_water(), predicted_peak, measured_peak);
    } else {
      std::printf("\nplan %s: %s\n", Named::name.data(), Named::description.data());
      std::printf("loss %.4f -> %.4f over %llu steps, %.0f tokens/s (lr %g)\n", static_cast<double>(first),
                  static_cast<double>(last), static_cast<unsigned long long>(o.steps - start),
                  static_cast<double>(tokens) / seconds, static_cast<double>(hp.lr));
      std::printf("arena: predicted %zu B, measured high-water of live bytes %zu B (%s); allocated %zu B, laid out %zu B\n",
                  predicted_arena, measured_arena,
                  measured_arena == predicted_arena ? "equal" : measured_arena < predicted_arena ? "below" : "ABOVE",
                  mem.capacity(), mem.high_water());
    }
  }
  return fits ? 0 : 4;
}

template <class Comm, class Split>
int dispatch(const options& o, Comm& world, Split&& split) {
  int result = -1;
  const bool found = for_plan<plans>(o.plan, [&]<class Named>(Named*) {
    constexpr m::mesh_desc mesh = Named::plan::mesh;
    require_world(o.plan, mesh.world, static_cast<std::uint64_t>(world.size()));
    // Megatron's rank order: tensor-parallel fastest, then data-parallel, then the pipeline stage.
    const int T = static_cast<int>(mesh.tp), D = static_cast<int>(mesh.dp);
    const int tp_rank = world.rank() % T, dp_rank = (world.rank() / T) % D, pp_rank = world.rank() / (T * D);
    auto [dp, tp, pp] = split(dp_rank, tp_rank, pp_rank);
    result = train<Named>(o, world, dp, tp, pp, static_cast<std::size_t>(dp_rank));
  });
  if (!found) throw usage_error("unknown plan '" + o.plan + "' (see --list-plans)");
  return result;
}

}  // namespace

int main(int argc, char** argv) {
#if MEMALG_HAVE_MPI
  m::backend::cpu::mpi_environment mpi(&argc, &argv);
#endif
  return guarded_main("train_gpt_cpu", [&] {
    const options o = parse(argc, argv);
    if (o.list) {
      list_plans<plans>();
      return 0;
    }
#if MEMALG_HAVE_MPI
    m::backend::cpu::mpi_communicator world;
    return dispatch(o, world, [&](int dp_rank, int tp_rank, int pp_rank) {
      // dp group: same tp rank and stage; tp group: same dp rank and stage; pp group: same dp and tp rank.
      const int D = 1 << 16;
      return std::tuple{world.split(pp_rank * D + tp_rank, world.rank()), world.split(pp_rank * D + dp_rank, world.rank()),
                        world.split(dp_rank * D + tp_rank, world.rank())};
    });
#else
    m::backend::cpu::local_communicator world;
    return dispatch(o, world, [](int, int, int) {
      return std::tuple{m::backend::cpu::local_communicator{}, m::backend::cpu::local_communicator{},
                        m::backend::cpu::local_communicator{}};
    });
#endif
  });
}

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

#include "gpt_plans.hpp"
#include "train_common.hpp"

namespace m = memalg;
using namespace memalg::literals;
using namespace train_common;
using plans = gpt_plans::cpu_plans;

namespace {

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
  // interpreter's live-bytes meter's high-water mark over the steps this process ran (this
  // rank's; exec/meter.hpp), the bytes allocated, and the program's own layout of a step.
  const auto& mem = trainer.memory();
  const std::size_t predicted_arena = arena.persistent + arena.stack;
  const std::size_t measured_arena = trainer.meter().high_water();
  const std::size_t predicted_peak = static_cast<std::size_t>(stage_peak.total().value);
  // The plan's budget on a CPU process is the arena alone (no device reserve to measure).
  const std::size_t measured_peak = measured_arena + static_cast<std::size_t>(stage_peak.reserve.value);
  // The layout must be the plan's to the byte. The live bytes may be fewer (where the layout holds
  // tensors no op reads again at its peak: docs/runtime.md), never more.
  const bool fits = mem.high_water() == predicted_arena && measured_arena <= predicted_arena;
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
  if (!found) throw usage_error(gpt_plans::cpu_unknown_plan(o.plan));
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

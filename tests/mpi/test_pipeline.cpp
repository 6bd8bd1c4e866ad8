// SPDX-License-Identifier: BSL-1.0
// Pipeline plans (1F1B over MPI ranks) against one rank on the same global batch.
//
// Each plan is examples/train_gpt_cpu.cpp's model (GPT-2-style, untied output) planned under the
// memalg stack; every rank trains its stage of it for 8 steps through gpt_run's trainer (the step
// program on the CPU step backend, stage arena from the stage's plan), and rank 0 trains the
// one-rank plan of the same global batch (micro-batch dp·B, the same 4 micro-batches). Checks, on
// every rank: the losses agree with the one-rank run within 1e-5 relative, they fall, and the
// arena and its high-water mark are the stage's plan (evaluate_stage) to the byte.
//
// Run with 2 ranks (pp2, and the Llama-shaped model in two stages) or 4 (pp2-dp2, and pp4 whose
// middle stages receive and send).
#include <mpi.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "memalg/backend/cpu/local_communicator.hpp"
#include "memalg/backend/cpu/mpi_communicator.hpp"
#include "memalg/backend/cpu/gpt_run.hpp"
#include "memalg/core/random.hpp"
#include "memalg/memalg.hpp"

namespace cpu = memalg::backend::cpu;
namespace m = memalg;
using namespace memalg::literals;

namespace {
constexpr int steps = 8;
constexpr double tolerance = 1e-5;

struct budget {
  static constexpr m::device_desc value{"cpu-1gib", 1_GiB, m::bytes{}};
};
struct gpt_untied {  // examples/train_common.hpp's gpt_bytes, untied
  static constexpr m::lm_config value = [] {
    m::lm_config c{};
    c.layers = 4;
    c.hidden = 64;
    c.heads = 4;
    c.vocab = 256;
    c.positions = 64;
    c.logits = m::dtypes::fp32;
    c.tied = false;
    return c;
  }();
};
/// examples/train_gpt_cpu.cpp's llama-fp32: RMSNorm, SwiGLU, rotary positions, 2 key/value heads
/// for 4, flash attention, no biases, untied output.
struct llama {
  static constexpr m::lm_config value = [] {
    m::lm_config c = gpt_untied::value;
    c.positions = 0;
    c.rotary = true;
    c.kv_heads = 2;
    c.ffn = 172;
    c.rms_norm = true;
    c.gated = true;
    c.bias = false;
    c.flash = true;
    return c;
  }();
};
template <class Mesh, std::uint64_t B, class Model = gpt_untied>
using plan_of = m::plan<m::exec::runtime_gpt<Model>,
                        m::train::recipe<m::precision::fp32, m::optim::adamw<>, m::train::batch<B, 64>,
                                         m::train::grad_accum<4>, m::train::reference_kernels>,
                        Mesh, budget>;

/// Sequence g of the global batch: a bigram walk from a start drawn for g (learnable, so losses fall).
void sequence(std::uint64_t g, std::size_t S, std::vector<std::int32_t>& tok, std::vector<std::int32_t>& tgt) {
  std::uint32_t t = static_cast<std::uint32_t>(m::splitmix64(g * 0x9E3779B97F4A7C15ULL + 7) % 64);
  for (std::size_t i = 0; i < S; ++i) {
    const std::uint32_t next = (t * 5 + 3 + static_cast<std::uint32_t>(i % 2)) % 64;
    tok.push_back(static_cast<std::int32_t>(t));
    tgt.push_back(static_cast<std::int32_t>(next));
    t = next;
  }
}
/// Data-parallel rank d's ids of step s: micro-batch k's sequence b is global sequence
/// ((s·m + k)·dp + d)·B + b, so one rank with micro-batch dp·B reads the same sequences.
void batch(const m::exec::gpt_config& c, std::uint64_t s, std::size_t d, std::vector<std::int32_t>& tok,
           std::vector<std::int32_t>& tgt) {
  tok.clear();
  tgt.clear();
  for (std::size_t k = 0; k < c.grad_accum; ++k)
    for (std::size_t b = 0; b < c.micro_batch; ++b) sequence(((s * c.grad_accum + k) * c.dp + d) * c.micro_batch + b, c.sequence, tok, tgt);
}

template <class Plan>
std::vector<float> one_rank_losses() {
  using run = m::exec::gpt_run<Plan, cpu::local_communicator>;
  cpu::local_communicator dp, tp;
  typename run::trainer trainer(run::config, run::arena, dp, tp);
  std::vector<float> out;
  std::vector<std::int32_t> tok, tgt;
  for (int s = 0; s < steps; ++s) {
    batch(run::config, static_cast<std::uint64_t>(s), 0, tok, tgt);
    out.push_back(trainer.train_step(tok, tgt));
  }
  return out;
}

/// Empty if the plan's run on this rank passes, else why not.
template <class Plan, class Reference>
std::string check(const char* name, cpu::mpi_communicator& world) {
  using run = m::exec::gpt_run<Plan, cpu::mpi_communicator>;
  constexpr m::mesh_desc mesh = Plan::mesh;
  static_assert(mesh.tp == 1 && mesh.pp > 1);
  static_assert(Reference::mesh.world == 1 && Reference::training.micro_batch == mesh.dp * Plan::training.micro_batch);
  const int me = world.rank(), D = static_cast<int>(mesh.dp);
  const int dp_rank = me % D, stage = me / D;  // Megatron's order: data-parallel ranks first, then stages
  cpu::mpi_communicator dp = world.split(stage, me), pp = world.split(dp_rank, me), tp = world.split(me, me);
  const m::exec::arena_sizes arena = run::stage_arena(static_cast<std::size_t>(stage));
  typename run::trainer trainer(run::config, arena, dp, tp, pp);
  std::vector<float> got;
  std::vector<std::int32_t> tok, tgt;
  for (int s = 0; s < steps; ++s) {
    batch(run::config, static_cast<std::uint64_t>(s), static_cast<std::size_t>(dp_rank), tok, tgt);
    got.push_back(trainer.train_step(tok, tgt));
  }
  std::vector<float> want(steps);
  if (me == 0) want = one_rank_losses<Reference>();
  MPI_Bcast(want.data(), steps, MPI_FLOAT, 0, MPI_COMM_WORLD);

  std::string why;
  const auto fail = [&](const std::string& w) {
    if (why.empty()) why = w;
  };
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    const double rel = std::fabs(static_cast<double>(got[s]) - want[s]) / std::fabs(static_cast<double>(want[s]));
    worst = rel > worst ? rel : worst;
    if (!(rel <= tolerance))
      fail("step " + std::to_string(s + 1) + ": loss " + std::to_string(got[s]) + ", one rank " + std::to_string(want[s]));
  }
  if (!(got.back() < got.front())) fail("the loss did not fall");
  const m::breakdown peak = m::evaluate_stage(Plan::model, Plan::training, mesh, Plan::device, static_cast<std::size_t>(stage)).per_rank;
  if (trainer.memory().high_water() != (peak.total() - peak.reserve).value)
    fail("high-water " + std::to_string(trainer.memory().high_water()) + " B, the stage's plan " +
         std::to_string((peak.total() - peak.reserve).value) + " B");
  if (trainer.memory().capacity() != arena.persistent + arena.stack) fail("the arena is not the stage's plan");
  std::printf("rank %d (%s, stage %d, dp rank %d): loss %.6f -> %.6f, worst relative difference from one rank %.2e, "
              "high-water %zu B = plan: %s\n",
              me, name, stage, dp_rank, static_cast<double>(got.front()), static_cast<double>(got.back()), worst,
              trainer.memory().high_water(), why.empty() ? "ok" : ("FAILED: " + why).c_str());
  return why;
}

using pp2 = plan_of<m::parallel::mesh<m::parallel::pipeline<2>>, 4>;
using pp4 = plan_of<m::parallel::mesh<m::parallel::pipeline<4>>, 4>;
using pp2_dp2 = plan_of<m::parallel::mesh<m::parallel::data<2>, m::parallel::pipeline<2>>, 4>;
using one_rank_b4 = plan_of<m::parallel::mesh<>, 4>;
using one_rank_b8 = plan_of<m::parallel::mesh<>, 8>;
using llama_pp2 = plan_of<m::parallel::mesh<m::parallel::pipeline<2>>, 4, llama>;
using llama_one_rank = plan_of<m::parallel::mesh<>, 4, llama>;
using llama_pp2_dp2 = plan_of<m::parallel::mesh<m::parallel::data<2>, m::parallel::pipeline<2>>, 4, llama>;
using llama_one_rank_b8 = plan_of<m::parallel::mesh<>, 8, llama>;
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failures = 0;
  {
    cpu::mpi_communicator world;
    const int me = world.rank();
    try {
      if (world.size() == 2) {
        failures += !check<pp2, one_rank_b4>("pp2", world).empty();
        failures += !check<llama_pp2, llama_one_rank>("llama-pp2", world).empty();
      } else if (world.size() == 4) {
        failures += !check<pp2_dp2, one_rank_b8>("pp2-dp2", world).empty();
        failures += !check<pp4, one_rank_b4>("pp4", world).empty();
        failures += !check<llama_pp2_dp2, llama_one_rank_b8>("llama-pp2-dp2", world).empty();
      } else {
        if (me == 0) std::fprintf(stderr, "test_pipeline: run with 2 or 4 ranks\n");
        failures = 1;
      }
    } catch (const std::exception& e) {  // a throw on one rank only would hang the others: abort
      std::fprintf(stderr, "rank %d: %s\n", me, e.what());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}

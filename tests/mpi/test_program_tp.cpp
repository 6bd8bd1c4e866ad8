// SPDX-License-Identifier: BSL-1.0
// Tensor-parallel plans of the step program as real MPI jobs, against one rank: vocabulary-parallel
// embedding and cross-entropy (tp2), with sequence parallelism (tp2-sp), with dropout under
// sequence parallelism (tp2-sp-dropout) — the plans of examples/train_gpt_cpu.cpp — and, with 4
// ranks, dp2×tp2 under ZeRO-2 and ZeRO-1 with sequence parallelism. 8 fp32 steps on the same global
// batch: the losses must agree with the one-rank run within a relative 1e-5 and fall, and on every
// rank the arena and its high-water mark must be the plan's. The one-rank run is where the
// vocabulary-parallel and the replicated layouts coincide. Dropout masks depend only on the
// seed and the global element index, so the runs with dropout agree too. The batches are
// train_gpt_cpu's (batch_for over its default text): what differs from one rank is the order of
// fp32 sums (vocabulary shards, tensor-parallel partial sums), about 1e-6 relative here.
//
// Run with 2 or 4 ranks.
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
#include "train_common.hpp"  // examples/: the plans' model (gpt_bytes) and their batches (batch_for)

namespace cpu = memalg::backend::cpu;
namespace m = memalg;
using namespace memalg::literals;

namespace {
constexpr int steps = 8;
constexpr double tolerance = 1e-5;

struct budget {
  static constexpr m::device_desc value{"cpu-1gib", 1_GiB, m::bytes{}};
};
struct gpt_fp32 { static constexpr m::lm_config value = train_common::gpt_bytes(m::dtypes::fp32); };
struct gpt_fp32_dropout { static constexpr m::lm_config value = train_common::gpt_bytes(m::dtypes::fp32, true, 100); };
template <class Config, std::size_t Batch, class Mesh>
using cpu_plan =
    m::plan<m::exec::runtime_gpt<Config>,
            m::train::recipe<m::precision::fp32, m::optim::adamw<>, m::train::batch<Batch, 64>, m::train::reference_kernels>,
            Mesh, budget>;

template <class Plan, class Comm>
std::vector<float> losses(typename m::exec::gpt_run<Plan, Comm>::trainer& t, std::size_t dp_rank) {
  using run = m::exec::gpt_run<Plan, Comm>;
  // The text the named plans train on (train_gpt_cpu's default --data), as the example tests do.
  static const std::vector<std::int32_t> data = train_common::read_bytes(train_common::options{}.data);
  std::vector<float> out;
  std::vector<std::int32_t> tok, tgt;
  for (int s = 0; s < steps; ++s) {
    train_common::batch_for(data, run::config, 1, static_cast<std::uint64_t>(s), dp_rank, tok, tgt);
    out.push_back(t.train_step(tok, tgt));
  }
  return out;
}

/// Whether this rank's step laid out in `sizes` less 16 bytes of stack is refused: a plan that is
/// the step's exact peak must be.
bool short_plan_refused(const m::exec::gpt_config& c, m::exec::arena_sizes sizes, m::exec::rank_coords rank) {
  try {
    (void)m::exec::build_program(c, {sizes.persistent, sizes.stack - 16}, rank);
  } catch (const m::exec::arena_error&) {
    return true;
  }
  return false;
}

/// Plan on the world against Reference (the same model and global batch, one rank) on rank 0.
template <class Plan, class Reference>
bool check(const char* name, cpu::mpi_communicator& world) {
  using run = m::exec::gpt_run<Plan, cpu::mpi_communicator>;
  constexpr m::mesh_desc mesh = Plan::mesh;
  static_assert(Reference::mesh.world == 1 && Reference::training.micro_batch == mesh.dp * Plan::training.micro_batch);
  const int me = world.rank();
  const int tp_rank = me % static_cast<int>(mesh.tp), dp_rank = me / static_cast<int>(mesh.tp);  // Megatron order
  cpu::mpi_communicator tp = world.split(dp_rank, me);
  cpu::mpi_communicator dp = world.split(tp_rank, me);
  typename run::trainer trainer(run::config, run::arena, dp, tp);
  const std::vector<float> got = losses<Plan, cpu::mpi_communicator>(trainer, static_cast<std::size_t>(dp_rank));

  std::vector<float> want(steps, 0.0f);
  if (me == 0) {
    using ref = m::exec::gpt_run<Reference, cpu::local_communicator>;
    cpu::local_communicator ldp, ltp;
    typename ref::trainer one(ref::config, ref::arena, ldp, ltp);
    want = losses<Reference, cpu::local_communicator>(one, 0);
  }
  world.broadcast(want.data(), want.size(), 0);

  double worst = 0;
  for (int s = 0; s < steps; ++s)
    worst = std::max(worst, std::fabs(static_cast<double>(got[s]) - want[s]) / std::fabs(static_cast<double>(want[s])));
  const m::breakdown& plan = Plan::result.per_rank;
  const bool memory = trainer.memory().high_water() == (plan.total() - plan.reserve).value &&
                      trainer.meter().high_water() == (plan.total() - plan.reserve).value &&
                      short_plan_refused(run::config, run::arena, {static_cast<std::size_t>(dp_rank), static_cast<std::size_t>(tp_rank)});
  const bool ok = worst <= tolerance && got.back() < got.front() && memory;
  if (me == 0 || !ok)
    std::printf("rank %d: %s loss %.6f -> %.6f (1 rank: %.6f -> %.6f), max relative difference %.2e, high-water %zu "
                "measured %zu (plan %llu): %s\n",
                me, name, static_cast<double>(got.front()), static_cast<double>(got.back()),
                static_cast<double>(want.front()), static_cast<double>(want.back()), worst, trainer.memory().high_water(),
                trainer.meter().high_water(),
                static_cast<unsigned long long>((plan.total() - plan.reserve).value), ok ? "ok" : "FAILED");
  return ok;
}

namespace p = m::parallel;
using one_rank = cpu_plan<gpt_fp32, 8, p::mesh<>>;
using one_rank_dropout = cpu_plan<gpt_fp32_dropout, 8, p::mesh<>>;
using one_rank_16 = cpu_plan<gpt_fp32, 16, p::mesh<>>;
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failures = 0;
  {
    cpu::mpi_communicator world;
    const int me = world.rank();
    const auto run = [&](auto&& f) {
      try {
        if (!f()) ++failures;
      } catch (const std::exception& e) {  // a throw on one rank only would hang the others: abort
        std::fprintf(stderr, "rank %d: %s\n", me, e.what());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    };
    if (world.size() == 2) {
      run([&] { return check<cpu_plan<gpt_fp32, 8, p::mesh<p::tensor<2>>>, one_rank>("tp2", world); });
      run([&] { return check<cpu_plan<gpt_fp32, 8, p::mesh<p::tensor<2, true>>>, one_rank>("tp2-sp", world); });
      run([&] {
        return check<cpu_plan<gpt_fp32_dropout, 8, p::mesh<p::tensor<2, true>>>, one_rank_dropout>("tp2-sp-dropout", world);
      });
    } else if (world.size() == 4) {
      run([&] {
        return check<cpu_plan<gpt_fp32, 8, p::mesh<p::data<2, p::zero<2>>, p::tensor<2>>>, one_rank_16>("dp2-tp2-zero2",
                                                                                                        world);
      });
      run([&] {
        return check<cpu_plan<gpt_fp32, 8, p::mesh<p::data<2, p::zero<1>>, p::tensor<2, true>>>, one_rank_16>(
            "dp2-tp2-sp-zero1", world);
      });
    } else {
      if (me == 0) std::fprintf(stderr, "run with 2 or 4 ranks\n");
      ++failures;
    }
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}

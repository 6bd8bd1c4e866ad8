// SPDX-License-Identifier: BSL-1.0
// The arena's measured high-water mark of live bytes against the plan, on every rank of real MPI jobs.
//
// For each multi-rank plan of tests/host/runtime_plans.hpp's memory_matrix_multi whose world is
// this job's size (2 ranks: dp2 ZeRO-1/2/3 and tp2; 4 ranks: dp2×tp2; each under no, selective
// and full recomputation), every rank trains two steps with gpt_run's trainer (the step program
// on the CPU step backend over MPI) and its live-bytes meter must reach exactly the plan's
// per-rank peak (under selective recomputation too), with no live value outside the
// layout's stacks. (tests/host/test_measured_arena.cpp checks the one-rank plans and every rank's
// layout of these.)
//
// Run with 2 or 4 ranks.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <tuple>
#include <vector>

#include "../host/runtime_plans.hpp"
#include "memalg/backend/cpu/mpi_communicator.hpp"
#include "memalg/exec/gpt/plan.hpp"

namespace cpu = memalg::backend::cpu;
namespace m = memalg;

namespace {
/// Checks one plan on this rank; returns whether the meter reached the plan.
template <class Plan>
bool check(cpu::mpi_communicator& world) {
  constexpr m::mesh_desc mesh = Plan::mesh;
  using run = m::exec::gpt_run<Plan, cpu::mpi_communicator>;
  const int me = world.rank();
  const int tp_rank = me % static_cast<int>(mesh.tp), dp_rank = me / static_cast<int>(mesh.tp);  // Megatron order
  cpu::mpi_communicator tp = world.split(dp_rank, me);
  cpu::mpi_communicator dp = world.split(tp_rank, me);
  typename run::trainer t(run::config, run::arena, dp, tp);
  const std::size_t n = run::config.grad_accum * run::config.micro_batch * run::config.sequence;
  for (int s = 0; s < 2; ++s) t.train_step(memalg_test::ids(n, s + dp_rank), memalg_test::ids(n, s + dp_rank + 1));
  const std::size_t predicted =
      static_cast<std::size_t>((Plan::result.per_rank.total() - Plan::result.per_rank.reserve).value);
  const std::size_t measured = t.meter().high_water();
  const bool ok = measured == predicted && t.meter().unplaced_ops() == 0;
  if (me == 0 || !ok)
    std::printf("rank %d: dp=%llu tp=%llu zero=%d recompute=%d: measured %zu, predicted %zu, unplaced ops %zu%s\n", me,
                static_cast<unsigned long long>(mesh.dp), static_cast<unsigned long long>(mesh.tp), mesh.zero_stage,
                static_cast<int>(Plan::training.recompute), measured, predicted,
                t.meter().unplaced_ops(),
                ok ? "" : ": FAILED");
  return ok;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failures = 0, checked = 0;
  {
    cpu::mpi_communicator world;
    try {
      std::apply(
          [&](auto*... plans) {
            (
                [&]<class Plan>(Plan*) {
                  if (static_cast<std::uint64_t>(world.size()) != Plan::mesh.world) return;
                  ++checked;
                  if (!check<Plan>(world)) ++failures;
                }(plans),
                ...);
          },
          [] {
            return []<class... P>(std::tuple<P...>*) { return std::tuple<P*...>{}; }(
                static_cast<memalg_test::memory_matrix_multi*>(nullptr));
          }());
    } catch (const std::exception& e) {  // a throw on one rank only would hang the others: abort
      std::fprintf(stderr, "rank %d: %s\n", world.rank(), e.what());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (checked == 0) {
      if (world.rank() == 0) std::fprintf(stderr, "no plan of the matrix has %d ranks\n", world.size());
      failures = 1;
    }
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}

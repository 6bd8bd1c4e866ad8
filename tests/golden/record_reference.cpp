// SPDX-License-Identifier: BSL-1.0
// Records the golden trajectories of the fixed reference trainer (backend/cpu/gpt_trainer.hpp)
// before it is retired: run it as `mpirun -np N memalg_record_reference > tests/data/golden/npN.txt`
// for N = 1, 2, 4 (tests/data/golden/README.md).
//   np 1: the single-rank test matrix (tests/host/runtime_plans.hpp) and the 1-rank named plans
//   np 2, 4: the parallel layouts (parallel.hpp) and the named plans of that many ranks
#include <mpi.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include <memalg/backend/cpu/gpt_trainer.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/backend/cpu/mpi_communicator.hpp>

#include "../host/runtime_plans.hpp"
#include "golden.hpp"
#include "named.hpp"
#include "parallel.hpp"

namespace m = memalg;
namespace cpu = memalg::backend::cpu;
namespace g = memalg_golden;

namespace {

/// A tuple of null pointers to a tuple's types, to visit the types with std::apply.
template <class Tuple>
struct pointers;
template <class... P>
struct pointers<std::tuple<P...>> {
  static constexpr std::tuple<P*...> value{};
};

template <class Trainer>
g::record finish(Trainer& t, g::record r) {
  r.weights = g::weights_digest(t);
  t.store_counters();
  r.sections = g::sections_digest(t.state_sections());
  return r;
}

void matrix(std::vector<std::string>& lines) {
  std::size_t index = 0;
  std::apply(
      [&]<class... Plans>(Plans*...) {
        (
            [&]<class Plan>(Plan*) {
              using run = m::exec::gpt_run<Plan, cpu::local_communicator>;
              const m::exec::gpt_config c = m::exec::with_hparams(run::config, g::matrix_hparams);
              cpu::local_communicator dp, tp;
              typename run::reference_trainer t(c, run::arena, dp, tp);
              const std::size_t n = c.micro_batch * c.sequence * c.grad_accum;
              g::record r;
              r.key = g::key_of("matrix." + std::to_string(index++), 0, 1);
              for (int s = 0; s < g::matrix_steps; ++s) {
                r.loss.push_back(g::bits(t.train_step(memalg_test::ids(n, s), memalg_test::ids(n, s + 1))));
                r.norm.push_back(g::bits(t.last_grad_norm()));
              }
              lines.push_back(g::format(finish(t, r)));
            }(static_cast<Plans*>(nullptr)),
            ...);
      },
      pointers<memalg_test::runtime_matrix>::value);
}

void parallel(cpu::mpi_communicator& world, std::vector<std::string>& lines) {
  const int me = world.rank();
  for (const g::parallel_layout& l : g::parallel_layouts(static_cast<std::size_t>(world.size()))) {
    const int tp_rank = me % static_cast<int>(l.tp), dp_rank = me / static_cast<int>(l.tp);  // Megatron order
    cpu::mpi_communicator tp = world.split(dp_rank, me);
    cpu::mpi_communicator dp = world.split(tp_rank, me);
    const m::exec::gpt_config c = l.config();
    const std::size_t n = c.grad_accum * c.micro_batch * c.sequence;
    m::exec::gpt_trainer<float, cpu::mpi_communicator> t(c, g::parallel_arena, dp, tp);
    g::record r;
    r.key = g::key_of(l.name(), me, world.size());
    for (int s = 0; s < g::parallel_steps; ++s) {
      r.loss.push_back(g::bits(t.train_step(g::parallel_ids(s, me, n, false), g::parallel_ids(s, me, n, true))));
      r.norm.push_back(g::bits(t.last_grad_norm()));
    }
    lines.push_back(g::format(finish(t, r)));
  }
}

void named(cpu::mpi_communicator& world, std::vector<std::string>& lines) {
  const std::vector<std::int32_t> text = train_common::read_bytes("/usr/share/common-licenses/GPL-3");
  std::apply(
      [&]<class... Named>(Named*...) {
        (
            [&]<class N>(N*) {
              using run = m::exec::gpt_run<typename N::plan, cpu::mpi_communicator>;
              if (!g::recorded_named(N::name) || run::config.dp * run::config.tp * run::config.pp != static_cast<std::size_t>(world.size()))
                return;
              const int T = static_cast<int>(run::config.tp), D = static_cast<int>(run::config.dp);
              const int tp_rank = world.rank() % T, dp_rank = (world.rank() / T) % D;
              cpu::mpi_communicator dp = world.split(tp_rank, world.rank());
              cpu::mpi_communicator tp = world.split(dp_rank, world.rank());
              const m::exec::gpt_config c = g::named_config<N>(run::config);
              typename run::reference_trainer t(c, run::arena, dp, tp);
              lines.push_back(g::format(g::run_named(t, c, text, static_cast<std::size_t>(dp_rank),
                                                     g::key_of("named." + std::string(N::name), world.rank(), world.size()))));
            }(static_cast<Named*>(nullptr)),
            ...);
      },
      pointers<gpt_cpu_plans::plans>::value);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    cpu::mpi_communicator world;
    std::vector<std::string> lines;
    if (world.size() == 1) matrix(lines);
    else parallel(world, lines);
    named(world, lines);
    std::string mine;
    for (const std::string& l : lines) mine += l + "\n";
    // Rank 0 prints every rank's lines in rank order.
    if (world.rank() == 0) {
      std::printf("# golden trajectories of the reference trainer, %d rank(s) (tests/data/golden/README.md)\n", world.size());
      if (world.size() == 1) std::printf("%s\n", g::describe("matrix", g::matrix_hparams, g::matrix_steps).c_str());
      else std::printf("%s\n", g::describe("parallel", g::parallel_hparams, g::parallel_steps).c_str());
      std::printf("%s (momentum SGD: lr %g)\n", g::describe("named", g::named_hparams, g::named_steps).c_str(),
                  static_cast<double>(g::named_momentum_lr));
      std::fputs(mine.c_str(), stdout);
      for (int r = 1; r < world.size(); ++r) {
        int len = 0;
        MPI_Recv(&len, 1, MPI_INT, r, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        std::string buf(static_cast<std::size_t>(len), '\0');
        MPI_Recv(buf.data(), len, MPI_CHAR, r, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        std::fputs(buf.c_str(), stdout);
      }
    } else {
      int len = static_cast<int>(mine.size());
      MPI_Send(&len, 1, MPI_INT, 0, 0, MPI_COMM_WORLD);
      MPI_Send(mine.data(), len, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
    }
  }
  MPI_Finalize();
  return 0;
}

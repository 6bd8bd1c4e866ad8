// SPDX-License-Identifier: BSL-1.0
// train_gpt_cpu's named plans against their golden trajectories (tests/data/golden/npN.txt,
// recorded from the retired reference trainer), as the binary runs them: its data, its rank order,
// the plan's arena; the golden hyper-parameters written out (tests/golden/golden.hpp). Every
// recorded plan of this world size must reproduce its record bit for bit on every rank: each step's
// loss and gradient norm, the final weights and the checkpoint sections.
//
// Run with 1, 2 or 4 ranks.
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/mpi_communicator.hpp>

#include "../golden/golden.hpp"
#include "../golden/named.hpp"

namespace m = memalg;
namespace cpu = memalg::backend::cpu;
namespace g = memalg_golden;

namespace {
template <class Tuple>
struct pointers;
template <class... P>
struct pointers<std::tuple<P...>> {
  static constexpr std::tuple<P*...> value{};
};
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failures = 0, checked = 0;
  {
    cpu::mpi_communicator world;
    const int me = world.rank();
    const std::map<std::string, g::record> golden = g::load(g::path(("np" + std::to_string(world.size()) + ".txt").c_str()));
    const std::vector<std::int32_t> text = train_common::read_bytes("/usr/share/common-licenses/GPL-3");
    std::apply(
        [&]<class... Named>(Named*...) {
          (
              [&]<class N>(N*) {
                using run = m::exec::gpt_run<typename N::plan, cpu::mpi_communicator>;
                if constexpr (run::config.pp == 1) {
                  if (!g::recorded_named(N::name) ||
                      run::config.dp * run::config.tp != static_cast<std::size_t>(world.size()))
                    return;
                  const int T = static_cast<int>(run::config.tp), D = static_cast<int>(run::config.dp);
                  const int tp_rank = me % T, dp_rank = (me / T) % D;
                  cpu::mpi_communicator dp = world.split(tp_rank, me);
                  cpu::mpi_communicator tp = world.split(dp_rank, me);
                  const m::exec::gpt_config c = g::named_config<N>(run::config);
                  std::string why;
                  try {
                    typename run::trainer t(c, run::arena, dp, tp);
                    const g::record got = g::run_named(t, c, text, static_cast<std::size_t>(dp_rank),
                                                       g::key_of("named." + std::string(N::name), me, world.size()));
                    const auto it = golden.find(got.key);
                    why = it == golden.end() ? "no golden record " + got.key : g::compare(got, it->second);
                    // The arena is the plan's to the byte.
                    if (why.empty() && t.memory().high_water() != run::arena.persistent + run::arena.stack)
                      why = "the program's high-water mark is not the plan's arena";
                  } catch (const std::exception& e) {  // a throw on one rank only would hang the others
                    std::fprintf(stderr, "rank %d: %s: %s\n", me, N::name.data(), e.what());
                    MPI_Abort(MPI_COMM_WORLD, 1);
                  }
                  ++checked;
                  if (!why.empty()) ++failures;
                  if (me == 0 || !why.empty())
                    std::printf("rank %d: %s: %s\n", me, N::name.data(),
                                why.empty() ? "the golden trajectory, bit for bit" : ("FAILED: " + why).c_str());
                }
              }(static_cast<Named*>(nullptr)),
              ...);
        },
        pointers<gpt_plans::cpu_plans>::value);
    if (checked == 0) {
      std::fprintf(stderr, "rank %d: no recorded named plan of %d rank(s)\n", me, world.size());
      ++failures;
    }
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}

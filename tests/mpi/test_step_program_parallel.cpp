// SPDX-License-Identifier: BSL-1.0
// The step program on the CPU step backend against the golden trajectories, rank by rank, as real
// MPI jobs: bit-identical.
//
// The layouts of tests/golden/parallel.hpp: data parallel with ZeRO-0/1/2/3 (ZeRO-3 also with full
// recomputation, ZeRO-2 with every-2), tensor parallel over the whole world (also with selective
// recomputation) and, with 4 ranks, dp2×tp2 under ZeRO-1, ZeRO-3 and ZeRO-2 with full
// recomputation. Dropout, gradient clipping and accumulation are on, so the dropout streams, the
// global norm over shards and the last-micro-batch reductions all matter. Each step's loss and
// gradient norm, every unit's final weights (gathered under ZeRO-3) and the rank's checkpoint
// sections must be the ones the retired reference trainer recorded (tests/data/golden/npN.txt):
// the same kernels and collectives in the same order on the same bytes.
//
// Run with 2 or 4 ranks.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "../golden/golden.hpp"
#include "../golden/parallel.hpp"
#include "memalg/backend/cpu/mpi_communicator.hpp"
#include "memalg/backend/cpu/step_backend.hpp"
#include "memalg/exec/gpt/build_program.hpp"
#include "memalg/exec/run.hpp"

namespace cpu = memalg::backend::cpu;
namespace g = memalg_golden;
using namespace memalg;

namespace {

/// Empty if the program reproduces the golden record, else what differs first.
std::string compare(const g::parallel_layout& l, cpu::mpi_communicator& world, const std::map<std::string, g::record>& golden) {
  const int me = world.rank();
  const int tp_rank = me % static_cast<int>(l.tp), dp_rank = me / static_cast<int>(l.tp);  // Megatron order
  cpu::mpi_communicator tp = world.split(dp_rank, me);
  cpu::mpi_communicator dp = world.split(tp_rank, me);
  const exec::gpt_config c = l.config();
  const std::size_t n = c.grad_accum * c.micro_batch * c.sequence;

  const exec::program p =
      exec::build_program(c, g::parallel_arena, {static_cast<std::uint64_t>(dp_rank), static_cast<std::uint64_t>(tp_rank)});
  cpu::step_backend<float, cpu::mpi_communicator> backend(p, dp, tp);
  exec::run_state state;
  g::record got;
  got.key = g::key_of(l.name(), me, world.size());
  for (int s = 0; s < g::parallel_steps; ++s) {
    const std::vector<std::int32_t> tok = g::parallel_ids(s, me, n, false), tgt = g::parallel_ids(s, me, n, true);
    const exec::step_result r = exec::run(p, backend, {tok, tgt}, state);
    got.loss.push_back(g::bits(r.loss));
    got.norm.push_back(g::bits(r.grad_norm));
  }
  // Every rank makes the same collective calls whatever differs (ZeRO-3 gathers in unit_weights),
  // so a difference on one rank is reported, not a hang.
  got.weights = g::weights_digest(backend);
  backend.store_counters(state);
  got.sections = g::sections_digest(backend.state_sections());
  if (got.loss.back() == got.loss.front()) return "the loss did not change";
  const auto it = golden.find(got.key);
  if (it == golden.end()) return "no golden record " + got.key;
  return g::compare(got, it->second);
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failures = 0;
  {
    cpu::mpi_communicator world;
    const int me = world.rank();
    const std::map<std::string, g::record> golden =
        g::load(g::path(("np" + std::to_string(world.size()) + ".txt").c_str()));
    for (const g::parallel_layout& l : g::parallel_layouts(static_cast<std::size_t>(world.size()))) {
      std::string why;
      try {
        why = compare(l, world, golden);
      } catch (const std::exception& e) {  // a throw on one rank only would hang the others: abort
        std::fprintf(stderr, "rank %d: %s: %s\n", me, l.name().c_str(), e.what());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      if (!why.empty()) ++failures;
      if (me == 0 || !why.empty())
        std::printf("rank %d: %s: %s\n", me, l.name().c_str(), why.empty() ? "the golden trajectory, bit for bit" : ("FAILED: " + why).c_str());
    }
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}

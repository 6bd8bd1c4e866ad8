// SPDX-License-Identifier: BSL-1.0
// The step program on the CPU step backend against gpt_trainer, rank by rank, as real MPI jobs: bit-identical.
//
// On every rank both run the same steps on the same (per-rank) ids with the same communicators:
// data parallel with ZeRO-0/1/2/3 (ZeRO-3 also with full recomputation, ZeRO-2 with every-2),
// tensor parallel over the whole world (also with selective recomputation) and, with 4 ranks,
// dp2×tp2 under ZeRO-1 and ZeRO-3. Dropout, gradient clipping and accumulation are on, so the
// dropout streams, the global norm over shards and the last-micro-batch reductions all matter.
// Each step's loss and gradient norm, every unit's final weights (gathered under ZeRO-3) and the
// rank's checkpoint sections must be equal byte for byte: the same kernels and collectives in the
// same order on the same bytes. (tests/mpi/test_trainer_parallel.cpp checks the trainer against
// one rank within a tolerance; this test ties the program to the trainer exactly.)
//
// Run with 2 or 4 ranks.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "memalg/backend/cpu/gpt_trainer.hpp"
#include "memalg/backend/cpu/mpi_communicator.hpp"
#include "memalg/backend/cpu/step_backend.hpp"
#include "memalg/exec/build_program.hpp"
#include "memalg/exec/run.hpp"

namespace cpu = memalg::backend::cpu;
using namespace memalg;

namespace {
constexpr int steps = 4;

exec::gpt_config base_config() {
  exec::gpt_config c{};
  c.vocab = 64;
  c.positions = 16;
  c.hidden = 32;
  c.layers = 2;
  c.heads = 4;
  c.ffn = 128;
  c.sequence = 16;
  c.micro_batch = 2;
  c.grad_accum = 2;
  c.lr = 3e-3f;
  c.weight_decay = 0.01f;
  c.max_grad_norm = 0.5f;  // clipping active
  c.dropout = 0.1f;
  c.flash = true;
  c.recompute_every = 2;
  return c;
}

/// This rank's ids of step s (different on every rank and every step).
std::vector<std::int32_t> ids(int step, int rank, std::size_t n, bool targets) {
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::int32_t>((i * 7 + static_cast<std::size_t>(step) * 13 + static_cast<std::size_t>(rank) * 29 +
                                      (targets ? 5 : 0) + i / 5) %
                                     64);
  return v;
}

template <class V>
bool same_bits(const V& a, const V& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
}

struct layout {
  std::size_t dp, tp;
  int zero;
  recompute_kind recompute;
};

/// Empty if the two agree, else what differs first.
std::string compare(const layout& l, cpu::mpi_communicator& world) {
  const int me = world.rank();
  const int tp_rank = me % static_cast<int>(l.tp), dp_rank = me / static_cast<int>(l.tp);  // Megatron order
  cpu::mpi_communicator tp = world.split(dp_rank, me);
  cpu::mpi_communicator dp = world.split(tp_rank, me);
  exec::gpt_config c = base_config();
  c.dp = l.dp;
  c.tp = l.tp;
  c.zero_stage = l.zero;
  c.recompute = l.recompute;
  const exec::arena_sizes sizes{std::size_t{1} << 22, std::size_t{1} << 22};
  const std::size_t n = c.grad_accum * c.micro_batch * c.sequence;

  exec::gpt_trainer<float, cpu::mpi_communicator> trainer(c, sizes, dp, tp);
  std::vector<float> want_loss, want_norm;
  for (int s = 0; s < steps; ++s) {
    want_loss.push_back(trainer.train_step(ids(s, me, n, false), ids(s, me, n, true)));
    want_norm.push_back(trainer.last_grad_norm());
  }

  const exec::program p =
      exec::build_program(c, sizes, {static_cast<std::uint64_t>(dp_rank), static_cast<std::uint64_t>(tp_rank)});
  cpu::step_backend<float, cpu::mpi_communicator> backend(p, dp, tp);
  exec::run_state state;
  std::vector<float> got_loss, got_norm;
  for (int s = 0; s < steps; ++s) {
    const std::vector<std::int32_t> tok = ids(s, me, n, false), tgt = ids(s, me, n, true);
    const exec::step_result r = exec::run(p, backend, {tok, tgt}, state);
    got_loss.push_back(r.loss);
    got_norm.push_back(r.grad_norm);
  }

  // Every rank makes the same collective calls whatever differs (ZeRO-3 gathers in unit_weights),
  // so a difference on one rank is reported, not a hang.
  std::string why;
  const auto fail = [&](std::string w) {
    if (why.empty()) why = std::move(w);
  };
  if (!same_bits(got_loss, want_loss)) fail("losses differ");
  if (!same_bits(got_norm, want_norm)) fail("gradient norms differ");
  if (want_loss.back() == want_loss.front()) fail("the loss did not change");
  if (backend.step_count() != trainer.step_count()) fail("step counts differ");
  if (backend.unit_count() != trainer.unit_count()) return "unit counts differ";  // the same on every rank
  for (std::size_t u = 0; u < trainer.unit_count(); ++u) {
    const std::vector<float> a = backend.unit_weights(u), b = trainer.unit_weights(u);
    if (!same_bits(a, b)) fail("weights of unit " + std::to_string(u) + " differ");
  }
  trainer.store_counters();
  backend.store_counters(state);
  const auto want = trainer.state_sections();
  const auto got = backend.state_sections();
  if (got.size() != want.size()) return "checkpoint section counts differ";
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (got[i].name != want[i].name || got[i].data.size() != want[i].data.size())
      fail("checkpoint section " + want[i].name + " differs in name or size");
    else if (want[i].name != "loss_scaler" &&  // unused in fp32 (and a struct with padding)
             std::memcmp(got[i].data.data(), want[i].data.data(), want[i].data.size()) != 0)
      fail("checkpoint section " + want[i].name + " differs");
  }
  return why;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failures = 0;
  {
    cpu::mpi_communicator world;
    const std::size_t P = static_cast<std::size_t>(world.size());
    const int me = world.rank();
    std::vector<layout> layouts;
    for (int z = 0; z <= 3; ++z) layouts.push_back({P, 1, z, recompute_kind::none});
    layouts.push_back({P, 1, 3, recompute_kind::full});
    layouts.push_back({P, 1, 2, recompute_kind::every_k});
    layouts.push_back({1, P, 0, recompute_kind::none});
    layouts.push_back({1, P, 0, recompute_kind::selective});
    if (P == 4) {
      layouts.push_back({2, 2, 1, recompute_kind::none});
      layouts.push_back({2, 2, 3, recompute_kind::none});
      layouts.push_back({2, 2, 2, recompute_kind::full});
    }
    for (const layout& l : layouts) {
      std::string why;
      try {
        why = compare(l, world);
      } catch (const std::exception& e) {  // a throw on one rank only would hang the others: abort
        std::fprintf(stderr, "rank %d: dp=%zu tp=%zu zero=%d recompute=%d: %s\n", me, l.dp, l.tp, l.zero,
                     static_cast<int>(l.recompute), e.what());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      if (!why.empty()) ++failures;
      if (me == 0 || !why.empty())
        std::printf("rank %d: dp=%zu tp=%zu zero=%d recompute=%d: %s\n", me, l.dp, l.tp, l.zero,
                    static_cast<int>(l.recompute), why.empty() ? "bit-identical" : ("FAILED: " + why).c_str());
    }
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}

// SPDX-License-Identifier: BSL-1.0
// The step program (GPT-2-style blocks, replicated embeddings) with the same model and data on
// one rank and on data parallel (ZeRO-0/1/2/3), tensor parallel and
// both combined, as real MPI jobs: the loss trajectories must agree within a relative 2e-5 over
// 8 steps (fp32; the ranks sum gradients in another order than one rank does, which changes the
// last bits — a wrong reduction, shard or split changes the loss in the first digits).
//
// Run with 2 or 4 ranks. Every configuration whose dp·tp equals the world size is checked; rank 0
// also runs the single-rank reference with the whole global batch on local communicators.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "memalg/backend/cpu/step_backend.hpp"
#include "memalg/backend/cpu/local_communicator.hpp"
#include "memalg/backend/cpu/mpi_communicator.hpp"
#include "memalg/exec/program_trainer.hpp"

namespace cpu = memalg::backend::cpu;
using namespace memalg;

namespace {
constexpr int steps = 8;
constexpr double tolerance = 2e-5;

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
  c.max_grad_norm = 0.5f;  // clipping active: the global norm must be right across shards
  c.dropout = 0.1f;
  c.flash = true;
  return c;
}

/// Sequences of the whole global batch of step s: (step, micro-batch, sequence) → token ids.
std::vector<std::int32_t> global_tokens(int step, std::size_t sequences, std::size_t seq, bool targets) {
  std::vector<std::int32_t> t(sequences * seq);
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::int32_t>((i * 7 + static_cast<std::size_t>(step) * 13 + (targets ? 5 : 0) + i / 5) % 64);
  return t;
}

/// This rank's slice: for each micro-batch k, sequences [dp_rank·B, (dp_rank+1)·B) of that
/// micro-batch's dp·B sequences.
std::vector<std::int32_t> slice(const std::vector<std::int32_t>& global, std::size_t K, std::size_t dp, std::size_t B,
                                std::size_t S, std::size_t dp_rank) {
  std::vector<std::int32_t> out;
  for (std::size_t k = 0; k < K; ++k) {
    const std::size_t begin = (k * dp * B + dp_rank * B) * S;
    out.insert(out.end(), global.begin() + static_cast<long>(begin), global.begin() + static_cast<long>(begin + B * S));
  }
  return out;
}

template <class Comm>
std::vector<float> run(exec::gpt_config c, Comm& dp, Comm& tp, std::size_t dp_rank) {
  exec::program_trainer<cpu::step_backend<float, Comm>> trainer(c, {std::size_t{1} << 23, std::size_t{1} << 23}, dp, tp);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    const std::size_t global_seqs = c.grad_accum * c.dp * c.micro_batch;
    const auto tok = global_tokens(s, global_seqs, c.sequence, false);
    const auto tgt = global_tokens(s, global_seqs, c.sequence, true);
    losses.push_back(trainer.train_step(slice(tok, c.grad_accum, c.dp, c.micro_batch, c.sequence, dp_rank),
                                        slice(tgt, c.grad_accum, c.dp, c.micro_batch, c.sequence, dp_rank)));
  }
  return losses;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failures = 0;
  {
    cpu::mpi_communicator world;
    const int P = world.size(), me = world.rank();
    struct layout {
      std::size_t dp, tp;
      int zero;
      recompute_kind recompute;
    };
    std::vector<layout> layouts;
    for (int z = 0; z <= 3; ++z) layouts.push_back({static_cast<std::size_t>(P), 1, z, recompute_kind::none});
    layouts.push_back({static_cast<std::size_t>(P), 1, 3, recompute_kind::full});
    layouts.push_back({1, static_cast<std::size_t>(P), 0, recompute_kind::none});
    layouts.push_back({1, static_cast<std::size_t>(P), 0, recompute_kind::selective});
    if (P == 4) {
      layouts.push_back({2, 2, 1, recompute_kind::none});
      layouts.push_back({2, 2, 3, recompute_kind::none});
    }
    for (const layout& l : layouts) {
      exec::gpt_config c = base_config();
      c.dp = l.dp;
      c.tp = l.tp;
      c.zero_stage = l.zero;
      c.recompute = l.recompute;
      // Megatron order: tensor-parallel ranks are consecutive.
      const int tp_rank = me % static_cast<int>(l.tp), dp_rank = me / static_cast<int>(l.tp);
      cpu::mpi_communicator tp = world.split(dp_rank, me);
      cpu::mpi_communicator dp = world.split(tp_rank, me);
      const std::vector<float> got = run(c, dp, tp, static_cast<std::size_t>(dp_rank));

      // Reference: one rank, the same global batch (dp·B sequences per micro-batch).
      exec::gpt_config r = base_config();
      r.micro_batch = c.micro_batch * c.dp;
      r.recompute = recompute_kind::none;
      cpu::local_communicator ldp, ltp;
      const std::vector<float> want = run(r, ldp, ltp, 0);
      double worst = 0;
      for (int s = 0; s < steps; ++s)
        worst = std::max(worst, std::fabs(static_cast<double>(got[s]) - want[s]) / std::fabs(static_cast<double>(want[s])));
      const bool ok = worst <= tolerance && got.back() < got.front();
      if (!ok) ++failures;
      if (me == 0 || !ok)
        std::printf("rank %d: dp=%zu tp=%zu zero=%d recompute=%d loss %.6f -> %.6f (1 rank: %.6f -> %.6f), "
                    "max relative difference %.2e: %s\n",
                    me, l.dp, l.tp, l.zero, static_cast<int>(l.recompute), static_cast<double>(got.front()),
                    static_cast<double>(got.back()), static_cast<double>(want.front()),
                    static_cast<double>(want.back()), worst, ok ? "ok" : "FAILED");
    }
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}

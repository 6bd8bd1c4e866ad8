// SPDX-License-Identifier: BSL-1.0
// tests/golden/parallel.hpp — the multi-rank layouts whose golden trajectories are recorded: a small
// GPT with dropout, flash attention, clipping and accumulation, data parallel with ZeRO-0/1/2/3
// (ZeRO-3 also with full recomputation, ZeRO-2 with every-2), tensor parallel over the whole world
// (also with selective recomputation) and, with 4 ranks, dp2×tp2 under ZeRO-1, ZeRO-3 and ZeRO-2 with
// full recomputation. Embeddings replicated (the fixed layout the reference trainer implemented).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <memalg/exec/gpt/config.hpp>

#include "golden.hpp"

namespace memalg_golden {

inline memalg::exec::gpt_config parallel_base_config() {
  memalg::exec::gpt_config c{};
  c.vocab = 64;
  c.positions = 16;
  c.hidden = 32;
  c.layers = 2;
  c.heads = 4;
  c.ffn = 128;
  c.sequence = 16;
  c.micro_batch = 2;
  c.grad_accum = 2;
  c.dropout = 0.1f;
  c.flash = true;
  c.recompute_every = 2;
  c = memalg::exec::with_hparams(c, parallel_hparams);
  c.seed = seed;
  return c;
}

/// This rank's ids of step s (different on every rank and every step).
inline std::vector<std::int32_t> parallel_ids(int step, int rank, std::size_t n, bool targets) {
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::int32_t>((i * 7 + static_cast<std::size_t>(step) * 13 + static_cast<std::size_t>(rank) * 29 +
                                      (targets ? 5 : 0) + i / 5) %
                                     64);
  return v;
}

struct parallel_layout {
  std::size_t dp, tp;
  int zero;
  memalg::recompute_kind recompute;
  memalg::exec::gpt_config config() const {
    memalg::exec::gpt_config c = parallel_base_config();
    c.dp = dp;
    c.tp = tp;
    c.zero_stage = zero;
    c.recompute = recompute;
    return c;
  }
  std::string name() const {
    return "parallel.dp" + std::to_string(dp) + "-tp" + std::to_string(tp) + "-zero" + std::to_string(zero) + "-recompute" +
           std::to_string(static_cast<int>(recompute));
  }
};

inline std::vector<parallel_layout> parallel_layouts(std::size_t P) {
  using memalg::recompute_kind;
  std::vector<parallel_layout> layouts;
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
  return layouts;
}

/// The arena both the trainer and the program ran these layouts in.
inline constexpr memalg::exec::arena_sizes parallel_arena{std::size_t{1} << 22, std::size_t{1} << 22};

}  // namespace memalg_golden

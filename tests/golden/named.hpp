// SPDX-License-Identifier: BSL-1.0
// tests/golden/named.hpp — one run of a train_gpt_cpu named plan, as the binary runs it (its data,
// its rank order), with the golden hyper-parameters written out, reduced to a golden record.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "golden.hpp"
#include "gpt_plans.hpp"
#include "train_common.hpp"

namespace memalg_golden {

/// The named plans recorded from the fixed reference trainer (GPT-2-style blocks, replicated
/// embeddings, no pipeline): the ones it runs.
inline bool recorded_named(std::string_view name) {
  for (std::string_view n : {"tiny-fp32", "tiny-bf16", "tiny-fp16", "tiny-recompute", "dp2-zero1", "dp4-zero3"})
    if (n == name) return true;
  return false;
}

template <class Named>
memalg::exec::gpt_config named_config(const memalg::exec::gpt_config& base) {
  memalg::exec::optimizer_hparams h = named_hparams;
  if (base.optimizer == memalg::optimizer_kind::momentum || base.optimizer == memalg::optimizer_kind::sgd) h.lr = named_momentum_lr;
  memalg::exec::gpt_config c = memalg::exec::with_hparams(base, h);
  c.seed = seed;
  return c;
}

/// Runs `trainer` (built on config `c`) for named_steps on data-parallel rank `dp_rank`'s batches.
template <class Trainer>
record run_named(Trainer& trainer, const memalg::exec::gpt_config& c, const std::vector<std::int32_t>& text,
                 std::size_t dp_rank, const std::string& key) {
  record r;
  r.key = key;
  std::vector<std::int32_t> tok, tgt;
  for (int s = 0; s < named_steps; ++s) {
    train_common::batch_for(text, c, seed, static_cast<std::uint64_t>(s), dp_rank, tok, tgt);
    r.loss.push_back(bits(trainer.train_step(tok, tgt)));
    r.norm.push_back(bits(trainer.last_grad_norm()));
  }
  r.weights = weights_digest(trainer);
  trainer.store_counters();
  r.sections = sections_digest(trainer.state_sections());
  return r;
}

}  // namespace memalg_golden

// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/build_program.hpp — lowers a GPT-family training step to a step program, on the host.
//
// `build_program(cfg, sizes, rank)` issues, through an `arena_layout` of the plan's capacities,
// the pushes and pops of one rank's step — its construction's
// persistent tensors, then one step: forward, loss, backward with recomputation none / selective /
// full / every-K, dropout masks, naive or flash attention, ZeRO-3 gathers and ZeRO-2/3 unsharded
// gradient buffers — and emits the ops in that order. The step is a pure function of the
// configuration (nothing in the arena depends on data), so the program's offsets, high-water mark
// and peak by category are known without running a kernel; a push past the
// plan or a pop out of order throws arena_error here, at build time.
//
// gpt_lowering is composed by concern, each floor deriving from the one below:
//   state.hpp        the configuration, its dimensions, the arena as a rank sees it, the units
//   parallel.hpp     ZeRO, tensor and sequence parallelism
//   blocks.hpp       one block's forward and backward (sequential or parallel residual)
//   micro_batch.hpp  the embeddings, the head and the loss, one micro-batch with recomputation
//   pipeline.hpp     a pipeline stage's 1F1B step
//   build_program.hpp  the step's end (loss, gradient norm, clipping, optimizer) and the program
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <variant>
#include <vector>

#include "memalg/exec/arena_layout.hpp"
#include "memalg/exec/gpt/config.hpp"
#include "memalg/exec/gpt/pipeline.hpp"
#include "memalg/exec/lowering.hpp"
#include "memalg/exec/program.hpp"

namespace memalg::exec {

/// The storage type gpt_run picks for a configuration: fp16 with loss scaling, bf16 with master
/// weights, fp32 otherwise.
constexpr elem default_storage(const gpt_config& c) {
  return c.loss_scaling ? elem::f16 : c.master_weights ? elem::bf16 : elem::f32;
}

namespace detail {

/// One rank's lowering: the step's sections, its end and the program's figures.
class gpt_lowering : gpt_pipeline {
 public:
  gpt_lowering(const gpt_config& c, arena_sizes sizes, rank_coords r, elem storage, std::size_t slot_bytes = 0,
               bool measuring = false)
      : gpt_pipeline(c, sizes, r, storage, slot_bytes, measuring) {}

  /// The bytes one micro-batch's saved tensors take in a stash slot on this stage (pp > 1).
  std::size_t measure_slot() {
    validate();
    build_units();
    allocate_states();
    pipeline_step_layout();
    return slot_used_;
  }

  program build() {
    validate();
    build_units();
    allocate_states();
    if (c_.pp > 1) return build_pipeline();
    lay_out_step(units_, true, c_.grad_accum, [this] { micro_batch(); }, [this] { step_end(); });
    finish();
    return std::move(p_);
  }

 private:
  void finish() {
    finish_program(c_, c_.sequence, r_.dp, c_.dropout);
    p_.tokens_per_micro = tokens();
    p_.targets_per_micro = tokens();
    p_.tp = c_.tp;
    p_.tp_rank = r_.tp;
    p_.loss_scaling = c_.loss_scaling;
    p_.pp = c_.pp;
    p_.pp_rank = r_.pp;
  }
  program build_pipeline() {
    layout_.enable_trace();
    pipeline_step_layout();
    p_.trace = layout_.trace();
    p_.stash_slots = stash_slots();
    p_.stash_slot_bytes = slot_bytes_;
    section_ = &p_.step_end;
    step_end();
    finish();
    return std::move(p_);
  }

  // ---- loss, gradient norm, clipping, optimizer -----------------------------------------------
  using run = element_run;
  static std::vector<run> runs(const element_ranges& ranges, std::size_t lo, std::size_t hi) {
    return element_runs(ranges, lo, hi);
  }
  void step_end() {
    const int z = c_.zero_stage;
    emit_loss_mean(u32(c_.grad_accum), c_.dp);
    // Only the last stage computed a loss (the others' sum is zero): the sum over the stages is it.
    if (c_.pp > 1) emit(ops::all_reduce{scalars::slot(scalars::loss), group::pp, reduce_op::sum});
    // Sequence parallelism: the norms ran on this rank's rows, so their weight gradients are
    // partial sums over tp (Megatron's finalize_model_grads all-reduces the sequence-parallel
    // parameters' gradients over the tensor-parallel group). Qwen3's QK-norms ran on this rank's
    // heads: their gradients are partial sums over tp as well (Megatron-LM's
    // megatron/core/distributed/finalize_model_grads.py, _allreduce_layernorm_grads, all-reduces
    // them when config.qk_layernorm is set, as it does the sequence-parallel norms').
    // Once per step: the sum is linear.
    const bool qk_partial = c_.qk_norm && c_.tp > 1;
    if (sp() || qk_partial) {
      for (std::size_t ui = 0; ui < units_.size(); ++ui) {
        const unit& u = units_[ui];
        element_ranges norms;
        if (ui == lnf_) {
          if (sp()) norms.push_back({0, u.elements});
        } else if (ui >= first_block_ && ui < lnf_) {
          if (sp()) norms.push_back({blk_.ln1_w, blk_.qkv_w});
          if (qk_partial) norms.push_back({blk_.q_norm_w, blk_.proj_w});
          if (sp()) norms.push_back({blk_.ln2_w, blk_.fc1_w});
        }
        const std::size_t lo = z >= 1 ? shard_begin(u) : 0, hi = z >= 1 ? lo + u.shard : u.elements;
        const std::size_t grad_off = z >= 2 ? lo : 0;
        for (const auto& [b, e] : norms) {
          const std::size_t from = std::max(b, lo), to = std::min(e, hi);
          if (from < to) emit(ops::all_reduce{sub(u.grad, from - grad_off, to - from), group::tp, reduce_op::sum});
        }
      }
    }
    // Gradient norm over the owned elements, in unit then element order.
    for (const unit& u : units_) {
      const std::size_t lo = z >= 1 ? shard_begin(u) : 0, hi = z >= 1 ? lo + u.shard : u.elements;
      const std::size_t grad_off = z >= 2 ? lo : 0;
      for (const run& r : runs(u.replicated, lo, hi)) {
        const bool counted = !(r.inside && r_.tp != 0);
        const operand g = sub(u.grad, r.begin - grad_off, r.end - r.begin);
        // Adjacent counted segments of one unit merge: the serial sum is the same.
        if (!section_->empty()) {
          if (auto* prev = std::get_if<ops::sqnorm>(&section_->back().body);
              prev && prev->counted == counted && prev->g.offset + prev->g.bytes() == g.offset) {
            prev->g.count += g.count;
            continue;
          }
        }
        emit(ops::sqnorm{g, counted});
      }
    }
    // The parts summed over tp too, and over the stages (every stage's units) in a pipeline.
    if (c_.pp > 1) emit_clip_scale(z, c_.dp, c_.max_grad_norm, c_.loss_scaling, {group::tp, group::pp});
    else emit_clip_scale(z, c_.dp, c_.max_grad_norm, c_.loss_scaling, {group::tp});
    // One fused update per run of equal decay; ZeRO-1/2 share the updated block.
    emit_updates(units_, z, c_.weight_decay, c_.dp, [this](const unit& u) { return shard_begin(u); });
  }
};

}  // namespace detail

/// One training step for rank `rank`, laid out in `sizes` (the plan's arena).
/// Throws program_error for a configuration the runtime does not implement and arena_error when
/// the step does not fit `sizes` (the plan under-predicts) or breaks the stacks' LIFO order.
inline program build_program(const gpt_config& cfg, arena_sizes sizes, rank_coords rank, elem storage) {
  if (cfg.pp <= 1) return detail::gpt_lowering(cfg, sizes, rank, storage).build();
  // A pipeline stage: first the bytes of one stash slot (a layout of unbounded capacity that
  // executes nothing), then the stage in the plan's sizes with the stash of that many slots.
  const std::size_t unbounded = std::size_t{1} << 40;
  const std::size_t slot = detail::gpt_lowering(cfg, {unbounded, unbounded}, rank, storage, 0, true).measure_slot();
  return detail::gpt_lowering(cfg, sizes, rank, storage, slot).build();
}
/// The same with the storage type gpt_run would pick (default_storage).
inline program build_program(const gpt_config& cfg, arena_sizes sizes, rank_coords rank = {}) {
  return build_program(cfg, sizes, rank, default_storage(cfg));
}

}  // namespace memalg::exec

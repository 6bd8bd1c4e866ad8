// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/pipeline.hpp — a pipeline stage's step (cfg.pp > 1, rank.pp the stage): the
// boundary buffer, the stash of micro-batches in flight, and every micro-batch's forward and
// backward sections in 1F1B order.
//
// gives it (plan/model_states.hpp, instances_on_stage: earlier stages take the remainder), the
// embeddings on the first stage, the final norm and the untied output layer with the loss on the
// last. It keeps one boundary buffer of [N, C] (comm_buffers) for the step, the receive buffer of
// an incoming activation and the send buffer of the last block's output, and a stash of
// min(pp − s, m) slots (plan/activations.hpp, chunks_in_flight), both pushed once for the step.
// Micro-batch i's saved tensors (the activations its forward pushes) live in slot i mod slots from
// its forward to its backward, so 1F1B's non-LIFO lifetimes still go through the checked layout:
// transients push and pop as before within each forward and backward section. The stage input is
// received into the boundary buffer and copied into the slot (the first block's backward reads
// it); the gradient of the stage's output is received into grad_residual and the gradient of its
// input sent from there. The step ends with the loss and the gradient norm's parts summed over
// the pipeline group too (the loss exists on the last stage only).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "memalg/exec/arena_layout.hpp"
#include "memalg/exec/gpt/micro_batch.hpp"
#include "memalg/exec/program.hpp"

namespace memalg::exec::detail {

/// A pipeline stage's forward and backward sections over gpt_micro_batch.
class gpt_pipeline : public gpt_micro_batch {
 protected:
  using gpt_micro_batch::gpt_micro_batch;

  bool first_stage() const { return r_.pp == 0; }
  bool last_stage() const { return r_.pp + 1 == c_.pp; }
  std::size_t stash_slots() const {
    const std::size_t ahead = c_.pp - r_.pp;  // 1F1B: min(pp − s, m) micro-batches in flight
    return ahead < c_.grad_accum ? ahead : c_.grad_accum;
  }

  /// The stage's whole step but step_end: the boundary buffer and the stash, then the forward and
  /// backward sections of every micro-batch in 1F1B order, micro-batch i in slot i mod slots.
  void pipeline_step_layout() {
    const std::size_t N = tokens(), C = c_.hidden, slots = stash_slots();
    const std::vector<pipeline_step> order = one_f_one_b(c_.pp, r_.pp, c_.grad_accum);
    section_ = &p_.step_begin;
    for (unit& u : units_) emit(ops::zero{u.grad});
    boundary_ = push("pipeline_boundary", N * C, T_, category::comm_buffers);
    const std::size_t stash_bytes = measuring_ ? 0 : slots * slot_bytes_;
    const std::size_t stash_at = layout_.push("pipeline_stash", stash_bytes, category::activations, side::saved);
    stash_begin_ = measuring_ ? std::size_t{1} << 60 : stash_at;  // (measuring: a range no tensor has)
    stash_end_ = measuring_ ? ~std::size_t{0} : stash_at + stash_bytes;
    const std::size_t depth = layout_.stack_depth();
    std::vector<stage_state> live(c_.grad_accum);
    bool received = false;  // the previous backward received this forward's input (steady state)
    p_.pipeline.reserve(order.size());
    for (std::size_t e = 0; e < order.size(); ++e) {
      const pipeline_step step = order[e];
      p_.pipeline.push_back({step, {}});
      section_ = &p_.pipeline.back().ops;
      if (step.forward) {
        slot_top_ = stash_begin_ + (step.micro % slots) * slot_bytes_;
        slot_end_ = slot_top_ + slot_bytes_;
        const std::size_t from = slot_top_;
        slot_open_ = true;
        live[step.micro] = stage_forward(received);
        slot_open_ = false;
        slot_used_ = std::max(slot_used_, slot_top_ - from);
        received = false;
      } else {
        // Megatron's send_backward_recv_forward: the next forward's input first, then this gradient.
        received = !first_stage() && e + 1 < order.size() && order[e + 1].forward;
        stage_backward(live[step.micro], received);
        live[step.micro] = {};
      }
      if (layout_.stack_depth() != depth)
        throw arena_error("build_program: tensors left on the arena after a section of the pipeline stage");
    }
    layout_.pop(stash_at);
    layout_.pop(boundary_.offset);
  }

  struct stage_state {
    std::vector<block_saved> blocks;
    std::vector<operand> inputs;  ///< inputs[l]: block l's input; inputs.back() the stage's output
    operand emb_mask, x0, lnf_out;
  };
  /// One micro-batch's forward on this stage: the embeddings or the received input (already in the
  /// boundary buffer when `received`), the blocks, and the final norm (last stage) or the send of
  /// the output.
  stage_state stage_forward(bool received) {
    const std::size_t N = tokens(), C = c_.hidden, L = block_hi_ - block_lo_;
    stage_state st;
    st.blocks.resize(L);
    st.inputs.resize(L + 1);
    if (first_stage()) {
      st.x0 = embed(st.emb_mask);
    } else {
      if (!received) emit(ops::recv{boundary_, u32(r_.pp - 1)});
      st.x0 = push("stage_input", N * C, T_, category::activations);
      emit(ops::copy{st.x0, boundary_});
    }
    st.inputs[0] = st.x0;
    for (std::size_t l = 0; l < L; ++l) {
      const bool sends = l + 1 == L && !last_stage();
      st.blocks[l] = forward_block(l, block_lo_ + l, st.inputs[l], category::activations, sends ? boundary_ : operand{});
      st.inputs[l + 1] = st.blocks[l].x_out;
    }
    if (!last_stage()) {
      emit(ops::send{boundary_, u32(r_.pp + 1)});
      return st;
    }
    st.lnf_out = final_norm(st.inputs[L]);
    return st;
  }
  /// The same micro-batch's backward: the loss and the head (last stage) or the received
  /// gradient, the blocks last to first, then the embeddings or the send of the input's gradient
  /// (after receiving the next forward's input into the boundary buffer when `receive_next`).
  void stage_backward(stage_state& st, bool receive_next) {
    const std::size_t N = tokens(), C = c_.hidden, L = block_hi_ - block_lo_;
    operand slot = transient("grad_slot", N * C, T_, category::temporaries);
    operand dres{};
    if (last_stage()) {
      dres = head_backward(st.lnf_out, st.inputs[L], slot, N);  // (a stage's loss is never chunked)
    } else {
      dres = transient("grad_residual", N * C, T_, category::temporaries);
      emit(ops::recv{dres, u32(r_.pp + 1)});
    }
    for (std::size_t l = L; l-- > 0;) backward_block(l, st.blocks[l], st.inputs[l], dres, slot);
    if (first_stage()) {
      embed_backward(dres, st.emb_mask);
    } else {
      if (receive_next) emit(ops::recv{boundary_, u32(r_.pp - 1)});
      emit(ops::send{dres, u32(r_.pp - 1)});
    }
    pop(dres);
    pop(slot);
  }
};

}  // namespace memalg::exec::detail

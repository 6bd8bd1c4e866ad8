// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/parallel.hpp — the GPT lowering's data and tensor parallelism: ZeRO's gathered
// weights and full gradient buffers, the gradient reductions, and sequence parallelism's
// gathered and reduce-scattered rows.
//
// Under tensor parallelism gpt_config can ask for Megatron's layout (docs/runtime.md, "Tensor
// parallelism in the program"): vocab_parallel — the token embedding's rows, the tied output's
// logits and the cross-entropy split by vocabulary (ops::vocab_parallel_loss), the lookup summed
// over tp before the positions are added — and sequence_parallel — the residual stream on this
// rank's N/tp token rows, all-gathered into a communication buffer before QKV and FC1 (and in
// backward for their weight gradients), the projection's and FC2's partial sums
// reduce-scattered, the norms' gradients all-reduced over tp at step end (Korthikanti et al.
// 2022, §4.2.2).
//
// The one reordering: ZeRO-0/1 gradient reductions, which the trainer runs after all
// micro-batches, are emitted in `micro` with when::last_micro right after each unit's last
// backward (nothing touches the buffer afterwards and the reduction is elementwise, so the result
// is the same; a backend may overlap them with the rest of backward).
#pragma once

#include <cstddef>
#include <cstdint>

#include "memalg/exec/gpt/state.hpp"
#include "memalg/exec/program.hpp"

namespace memalg::exec::detail {

/// ZeRO (use_weights / release / grad_buffer / finish_grad / reduce_after_last_backward) and
/// tensor and sequence parallelism over gpt_state.
class gpt_parallel : public gpt_state {
 protected:
  using gpt_state::gpt_state;

  operand gather(unit& u) {
    operand full = transient(u.name + ".gathered", u.elements, T_, category::temporaries);
    emit(ops::all_gather{u.weight, full, group::dp});
    return full;
  }
  struct weights_in_use {
    operand data, gathered;
  };
  weights_in_use use_weights(unit& u) {
    if (c_.zero_stage < 3) return {u.weight, {}};
    operand g = gather(u);
    return {g, g};
  }
  void release(const weights_in_use& w) {
    if (!w.gathered.null()) pop(w.gathered);
  }
  operand grad_buffer(unit& u) {
    if (c_.zero_stage < 2) return u.grad;
    operand full = transient(u.name + ".grad_full", u.elements, T_, category::temporaries);
    emit(ops::zero{full});
    // This rank's accumulated shard goes into its own block: the reduce-scatter adds it once.
    emit(ops::copy{sub(full, shard_begin(u), u.shard), u.grad});
    return full;
  }
  void finish_grad(unit& u, const operand& full) {
    if (c_.zero_stage < 2) return;
    emit(ops::reduce_scatter{full, u.grad, group::dp});
    pop(full);
  }
  /// ZeRO-0/1: reduce unit u's accumulated gradient after its last backward of the step.
  void reduce_after_last_backward(unit& u) {
    if (c_.zero_stage > 1 || c_.dp == 1) return;
    if (c_.zero_stage == 0) emit(ops::all_reduce{u.grad, group::dp, reduce_op::sum}, when::last_micro);
    else emit(ops::reduce_scatter{u.grad, sub(u.grad, shard_begin(u), u.shard), group::dp}, when::last_micro);
  }
  void tp_sum(const operand& x) {
    if (c_.tp > 1) emit(ops::all_reduce{x, group::tp, reduce_op::sum});
  }
  void dropout_rows(const operand& x, const operand& mask, std::size_t site) {
    emit(ops::dropout_fwd{x, mask, x, u32(c_.micro_batch), u32(c_.sequence * c_.hidden), c_.dropout, u32(site),
                          row0() * c_.hidden});
  }

  // ---- sequence parallelism (Korthikanti et al. 2022, §4.2.2) ---------------------------------
  /// The input of a column-parallel product: this rank's rows all-gathered over tp into a
  /// communication buffer [N, C] (the plan's comm), or the operand itself without SP.
  operand gathered_rows(const operand& x, const char* name) {
    if (!sp()) return x;
    operand g = transient(name, tokens() * c_.hidden, T_, category::comm_buffers);
    emit(ops::all_gather{x, g, group::tp});
    return g;
  }
  void release_rows(const operand& g, const operand& x) {
    if (!(g == x)) pop(g);
  }
  /// The output of a row-parallel product: its [N, C] partial sums in a communication buffer,
  /// reduce-scattered into `out` (this rank's rows) by finish_rows; without SP `out` itself,
  /// all-reduced over tp.
  operand partial_rows(const operand& out, const char* name) {
    if (!sp()) return out;
    return transient(name, tokens() * c_.hidden, T_, category::comm_buffers);
  }
  void finish_rows(const operand& partial, const operand& out) {
    if (!sp()) {
      tp_sum(out);
      return;
    }
    emit(ops::reduce_scatter{partial, out, group::tp});
    pop(partial);
  }
  /// Backward of a column-parallel product whose input `x` is this rank's rows: the weight
  /// gradient from the re-gathered input, then the input gradient [N, C] written over that buffer
  /// and reduce-scattered into `din` (Megatron's LinearWithGradAccumulationAndAsyncCommunication
  /// with sequence_parallel: all-gather, grad input, reduce-scatter). Without SP: linear_bwd into
  /// din, then the all-reduce over tp.
  void column_parallel_bwd(const operand& din, const operand& dw, const operand& dbias, const operand& dout,
                           const operand& x, const operand& w, std::uint32_t IC, std::uint32_t OC) {
    const std::uint32_t n = u32(tokens());
    if (!sp()) {
      emit(ops::linear_bwd{din, dw, dbias, dout, x, w, n, IC, OC});
      tp_sum(din);
      return;
    }
    operand g = gathered_rows(x, "sp_gathered");
    emit(ops::linear_bwd{operand{}, dw, dbias, dout, g, w, n, IC, OC});
    emit(ops::linear_bwd{g, operand{}, operand{}, dout, g, w, n, IC, OC});
    emit(ops::reduce_scatter{g, din, group::tp});
    pop(g);
  }
};

}  // namespace memalg::exec::detail

// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/micro_batch.hpp — one micro-batch of the GPT lowering without a pipeline:
// the embeddings, the blocks with recomputation none / selective / full / every-K, the final norm,
// the output layer and the loss (chunked, vocabulary- or sequence-parallel), and backward through
// all of them. The pipeline's stages (exec/gpt/pipeline.hpp) reuse the embeddings, the final
// norm, the loss and a block's backward from here.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "memalg/exec/arena_layout.hpp"
#include "memalg/exec/gpt/blocks.hpp"
#include "memalg/exec/program.hpp"

namespace memalg::exec::detail {

/// The embeddings, the head and one whole micro-batch over gpt_blocks.
class gpt_micro_batch : public gpt_blocks {
 protected:
  using gpt_blocks::gpt_blocks;

  unit* positions_unit() { return c_.positions != 0 ? &units_[1] : nullptr; }

  /// The token (and learned position) embedding of this rank's rows into a new saved residual,
  /// with its dropout mask below it (`emb_mask`, when dropout is on).
  operand embed(operand& emb_mask) {
    const std::size_t R = rows(), C = c_.hidden;
    const std::uint32_t nr = u32(R), cc = u32(C);
    unit& wte = units_[0];
    unit* wpe = positions_unit();
    if (c_.dropout > 0) emb_mask = push("dropout_mask", R * C, elem::u8, category::activations);
    operand x0 = push("residual", R * C, T_, category::activations);
    {
      auto we = use_weights(wte);
      weights_in_use pe{};
      if (wpe) pe = use_weights(*wpe);
      if (!vp()) {
        emit(ops::embedding_fwd{x0, tok(), we.data, pe.data, u32(c_.micro_batch), u32(c_.sequence), cc, 0, 0, 0,
                                embed_scale()});
      } else {  // this rank's vocabulary rows, summed over tp (reduce-scattered under SP), then the positions
        const operand part = partial_rows(x0, "sp_partial");
        emit(ops::embedding_fwd{part, tok(), we.data, operand{}, u32(c_.micro_batch), u32(c_.sequence), cc,
                                u32(vocab_begin()), u32(vocab_rows()), 0, embed_scale()});
        finish_rows(part, x0);
        if (wpe) emit(ops::position_add{x0, pe.data, row0(), nr, u32(c_.sequence), cc});
      }
      release(pe);
      release(we);
    }
    if (c_.dropout > 0) dropout_rows(x0, emb_mask, 1'000'000);
    return x0;
  }
  /// The embeddings' backward from the residual gradient `dres` (the tied wte gets its second
  /// contribution).
  void embed_backward(const operand& dres, const operand& emb_mask) {
    const std::uint32_t cc = u32(c_.hidden);
    unit& wte = units_[0];
    unit* wpe = positions_unit();
    if (c_.dropout > 0) emit(ops::dropout_bwd{dres, dres, emb_mask, c_.dropout});
    operand gw = grad_buffer(wte);
    operand gp = wpe ? grad_buffer(*wpe) : operand{};
    if (!vp()) {
      emit(ops::embedding_bwd{gw, gp, dres, tok(), u32(c_.micro_batch), u32(c_.sequence), cc, 0, 0, embed_scale()});
    } else {  // every token's gradient (all-gathered under SP): this rank's rows, and the whole wpe
      const operand d = gathered_rows(dres, "sp_gathered");
      emit(ops::embedding_bwd{gw, gp, d, tok(), u32(c_.micro_batch), u32(c_.sequence), cc, u32(vocab_begin()),
                              u32(vocab_rows()), embed_scale()});
      release_rows(d, dres);
    }
    if (wpe) finish_grad(*wpe, gp);
    finish_grad(wte, gw);
    if (wpe) reduce_after_last_backward(*wpe);
    reduce_after_last_backward(wte);
  }

  /// The final norm of the last block's output `x` into a new saved tensor.
  operand final_norm(const operand& x) {
    const std::size_t C = c_.hidden;
    operand lnf_out = push("lnf_out", rows() * C, T_, category::activations);
    auto wl = use_weights(units_[lnf_]);
    emit(ops::norm_fwd{lnf_out, x, sub(wl.data, 0, C), norm_bias() ? sub(wl.data, C, C) : operand{}, u32(rows()), u32(C),
                       c_.rms_norm, norm_eps(), norm_offset()});
    release(wl);
    return lnf_out;
  }
  /// The output layer, the loss and their backward into `slot`, then the final norm's backward
  /// into the residual gradient it returns. `loss_rows`: logits rows projected at a time (all of
  /// them unchunked); a vocabulary- or sequence-parallel output is never chunked.
  operand head_backward(const operand& lnf_out, const operand& x_last, const operand& slot, std::size_t loss_rows) {
    const std::size_t N = tokens(), C = c_.hidden, V = c_.vocab, R = rows();
    const std::uint32_t n = u32(N), cc = u32(C), v = u32(V);
    unit& lnf = units_[lnf_];
    unit& head = c_.tied ? units_[0] : units_[lnf_ + 1];  // the output layer's weights
    {
      auto we = use_weights(head);
      if (!vp() && !sp()) {
        const std::size_t RL = loss_rows;  // chunked: RL rows of logits at a time, in place
        operand logits = transient("logits", RL * V, T_, category::temporaries);
        operand gw = RL == N ? operand{} : grad_buffer(head);
        for (std::size_t r0 = 0; r0 < N; r0 += RL) {
          const std::size_t rows = std::min(RL, N - r0);
          const operand lg = sub(logits, 0, rows * V), h = sub(lnf_out, r0 * C, rows * C);
          emit(ops::linear_fwd{lg, h, we.data, operand{}, u32(rows), cc, v});
          emit(ops::loss{lg, RL == N ? tgt() : tgt(r0, rows), u32(rows), v, u32(c_.grad_accum), scalars::loss_sum,
                         RL == N ? 0u : n, c_.final_softcap});
          if (RL == N) gw = grad_buffer(head);  // unchunked: as the trainer, after the loss
          emit(ops::linear_bwd{sub(slot, r0 * C, rows * C), gw, operand{}, lg, h, we.data, u32(rows), cc, v});
        }
        finish_grad(head, gw);
        pop(logits);
      } else {  // vocabulary- or sequence-parallel output (unchunked: build_program refuses a chunked one)
        const operand in = gathered_rows(lnf_out, "sp_gathered");
        // Under SP the gathered rows are the output layer's input from here on (its weight and
        // input gradients read them): the final norm's output, the saved side's top, goes at once
        // (the plan's forward_released and backward_released, plan/stacks/memalg.hpp).
        if (sp()) pop(lnf_out);
        const std::uint32_t vl = u32(vocab_rows());
        operand logits = transient("logits", N * vocab_rows(), T_, category::temporaries);
        emit(ops::linear_fwd{logits, in, we.data, operand{}, n, cc, vl});
        if (vp()) emit(ops::vocab_parallel_loss{logits, tgt(), n, vl, u32(vocab_begin()), v, u32(c_.grad_accum)});
        else emit(ops::loss{logits, tgt(), n, v, u32(c_.grad_accum)});
        operand gw = grad_buffer(head);
        if (!sp()) {
          emit(ops::linear_bwd{slot, gw, operand{}, logits, lnf_out, we.data, n, cc, vl});
          finish_grad(head, gw);
          pop(logits);
          if (vp()) tp_sum(slot);  // the input gradient is a partial sum over the vocabulary shards
        } else {  // weight gradient from the gathered input, then the input gradient over it, reduce-scattered
          emit(ops::linear_bwd{operand{}, gw, operand{}, logits, in, we.data, n, cc, vl});
          emit(ops::linear_bwd{in, operand{}, operand{}, logits, in, we.data, n, cc, vl});
          finish_grad(head, gw);
          pop(logits);
          emit(ops::reduce_scatter{in, slot, group::tp});
          pop(in);
        }
      }
      release(we);
      if (!c_.tied) reduce_after_last_backward(head);
    }
    operand dres = transient("grad_residual", R * C, T_, category::temporaries);
    auto wn = use_weights(lnf);
    operand gl = grad_buffer(lnf);
    emit(ops::norm_bwd{dres, sub(gl, 0, C), norm_bias() ? sub(gl, C, C) : operand{}, slot, x_last, sub(wn.data, 0, C),
                       u32(R), cc, c_.rms_norm, norm_eps(), norm_offset()});
    finish_grad(lnf, gl);
    release(wn);
    reduce_after_last_backward(lnf);
    return dres;
  }

  /// Block l of this rank's blocks (its unit first_block_ + l) forward, its weights in use only
  /// for it; `x_out` as block_forward's.
  block_saved forward_block(std::size_t l, std::size_t site, const operand& x_in, category kind = category::activations,
                            const operand& x_out = {}) {
    auto w = use_weights(units_[first_block_ + l]);
    block_saved s = block_forward(site, x_in, w.data, kind, x_out);
    release(w);
    return s;
  }
  /// Block l's backward: its weights in use, its gradient buffer, its reduction after the last
  /// micro-batch.
  void backward_block(std::size_t l, block_saved& s, const operand& x_in, const operand& dres, const operand& slot) {
    unit& u = units_[first_block_ + l];
    auto w = use_weights(u);
    operand g = grad_buffer(u);
    block_backward(s, x_in, w.data, g, dres, slot);
    finish_grad(u, g);
    release(w);
    reduce_after_last_backward(u);
  }

  // ---- one micro-batch ------------------------------------------------------------------------
  void micro_batch() {
    const std::size_t C = c_.hidden, L = c_.layers, R = rows();
    operand emb_mask{};
    operand x0 = embed(emb_mask);

    std::vector<block_saved> saved(L);
    std::vector<operand> inputs(L + 1);
    inputs[0] = x0;
    const std::size_t seg = segment();
    const bool recompute_layers = c_.recompute == recompute_kind::full || c_.recompute == recompute_kind::every_k;
    const auto kept = [&](std::size_t l) { return (l + 1) % seg == 0 || l + 1 == L; };
    std::array<operand, 2> pair{};
    const bool need_pair = recompute_layers && seg > 1 && L > 1;
    if (need_pair)
      for (auto& p : pair) p = transient("segment_residual", R * C, T_, category::temporaries);
    for (std::size_t l = 0; l < L; ++l) {
      if (!recompute_layers) {
        saved[l] = forward_block(l, l, inputs[l]);
        inputs[l + 1] = saved[l].x_out;
        continue;
      }
      operand out = kept(l) ? push("checkpoint", R * C, T_, category::activations) : pair[l % 2];
      auto w = use_weights(units_[first_block_ + l]);
      block_saved s = block_forward(l, inputs[l], w.data);
      emit(ops::copy{out, s.x_out});
      pop(s.x_out);
      pop_block_saved(s);
      release(w);
      inputs[l + 1] = out;
    }
    if (need_pair)
      for (std::size_t i = 2; i-- > 0;) pop(pair[i]);

    // Head: final norm, output layer, cross-entropy, and backward through them.
    operand lnf_out = final_norm(inputs[L]);
    operand slot = transient("grad_slot", R * C, T_, category::temporaries);
    operand dres = head_backward(lnf_out, inputs[L], slot, loss_rows());
    if (!sp()) pop(lnf_out);

    // Blocks, last to first; a recomputed segment's forward first.
    for (std::size_t seg_end = L; seg_end > 0;) {
      const std::size_t seg_begin = recompute_layers ? ((seg_end - 1) / seg) * seg : seg_end - 1;
      if (!recompute_layers) {
        const std::size_t l = seg_end - 1;
        pop(saved[l].x_out);
        backward_block(l, saved[l], inputs[l], dres, slot);
        pop_block_saved(saved[l]);
      } else {
        pop(inputs[seg_end]);
        std::vector<block_saved> rebuilt;
        for (std::size_t l = seg_begin; l < seg_end; ++l)
          rebuilt.push_back(
              forward_block(l, l, l == seg_begin ? inputs[l] : rebuilt.back().x_out, category::temporaries));
        for (std::size_t l = seg_end; l-- > seg_begin;) {
          block_saved& s = rebuilt[l - seg_begin];
          pop(s.x_out);
          backward_block(l, s, l == seg_begin ? inputs[l] : rebuilt[l - seg_begin - 1].x_out, dres, slot);
          pop_block_saved(s);
        }
      }
      seg_end = seg_begin;
    }

    embed_backward(dres, emb_mask);
    pop(dres);
    pop(slot);
    pop(x0);
    if (!emb_mask.null()) pop(emb_mask);
    if (layout_.stack_depth() != 0) throw arena_error("build_program: tensors left on the arena after a micro-batch");
  }
};

}  // namespace memalg::exec::detail

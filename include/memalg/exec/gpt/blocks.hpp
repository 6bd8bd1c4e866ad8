// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/blocks.hpp — one transformer block's forward and backward, as the GPT lowering
// emits them: norms, QKV, rotary positions, the attention core (naive or flash, recomputed under
// selective recomputation), the projection, the MLP, dropout and the residual sums.
//
// The blocks take gpt_config's variants: RMSNorm, a SwiGLU MLP (fc1 writes [gate ‖ up]; its
// backward runs in place over d(out), so the MLP backward holds 2·inner as the plan says), rotary
// positions when positions == 0 (in place on qkv and on its gradient: no tensor added),
// grouped-query attention (qkv [N, (H + 2Hkv)·D]), no biases, an untied output layer (a last
// unit `lm_head`), Qwen3's per-head QK-norm (in place on qkv's query and key heads before the
// rotary positions, the heads as they were saved for its backward, which runs in place on dqkv)
// and Gemma's norms after the sub-layers (their inputs saved, each released as soon as its
// backward has read it). A parallel block (GPT-NeoX, GPT-J, Falcon: y = x + attn(ln1(x)) + mlp(ln2(x)),
// or with a shared norm y = x + attn(ln(x)) + mlp(ln(x)) as Falcon-7B) saves no sum after
// attention: its forward holds the attention branch's x + attn in a transient while the MLP runs
// and writes FC2 straight into the output; its backward runs the out-projection's backward first
// (the attention branch's last read of the output gradient, its input gradient kept through the
// MLP branch), so both norms' input gradients add into the residual gradient as in the sequential
// block, and with a shared norm the two branches' gradients of its output are summed before its
// one backward.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memalg/exec/gpt/parallel.hpp"
#include "memalg/exec/program.hpp"

namespace memalg::exec::detail {

/// A block's forward and backward over gpt_parallel (sequential or parallel residual).
class gpt_blocks : public gpt_parallel {
 protected:
  using gpt_parallel::gpt_parallel;

  struct block_saved {
    operand ln1_out, qkv, qk_pre, att, atty, proj_out, x_mid, ln2_out, fc1_out, gelu_out, mlp_out, x_out, lse, mask1, mask2;
    attn_shape sh{};  ///< the block's attention (its layer's window)
  };
  operand w_at(const operand& W, std::size_t at, std::size_t n) const { return sub(W, at, n); }
  /// The MLP's activation: GeLU, or the gated unit's (SwiGLU, Gemma's GeGLU).
  ops::activation_kind gate_kind() const {
    return !c_.gated ? ops::activation_kind::gelu : c_.geglu ? ops::activation_kind::geglu : ops::activation_kind::swiglu;
  }
  /// A bias (or LayerNorm shift) of n elements at `at`, null when the model has none.
  operand b_at(const operand& W, std::size_t at, std::size_t n, bool present) const {
    return present ? sub(W, at, n) : operand{};
  }
  void rope(const operand& x, bool backward, const attn_shape& sh) {
    if (!rotary()) return;
    const std::uint32_t rot = u32(c_.rotary_dim != 0 ? c_.rotary_dim : head_dim());
    if (backward) emit(ops::rotary_bwd{x, sh, rot, c_.rope_theta});
    else emit(ops::rotary_fwd{x, sh, rot, c_.rope_theta});
  }

  /// A row-parallel product of a block (the out-projection, FC2) into `out`, this rank's rows:
  /// in · W[w]ᵀ over `IC` inputs, summed over tp (reduce-scattered under SP), plus the bias at
  /// W[bias], then dropout through `mask` at dropout site `site`.
  void row_parallel_forward(const operand& out, const operand& in, const operand& W, std::size_t w, std::size_t bias,
                            std::size_t IC, const operand& mask, std::size_t site) {
    const std::size_t C = c_.hidden;
    const operand part = partial_rows(out, "sp_partial");
    emit(ops::linear_fwd{part, in, w_at(W, w, C * IC), operand{}, u32(tokens()), u32(IC), u32(C)});
    finish_rows(part, out);
    if (c_.bias) emit(ops::bias_add{out, w_at(W, bias, C), u32(rows()), u32(C)});
    if (c_.dropout > 0) dropout_rows(out, mask, site);
  }
  /// The MLP up to its second product: FC1 of `mlp_in` (all-gathered under SP), the activation,
  /// and the mask of the dropout after FC2, all saved.
  void mlp_inner_forward(block_saved& s, const operand& mlp_in, const operand& W, category kind) {
    const std::size_t N = tokens(), C = c_.hidden, F = local_ffn(), F1 = fc1_rows();
    const gpt_block_view& b = blk_;
    s.fc1_out = push("fc1_out", N * F1, T_, kind);
    {
      const operand in = gathered_rows(mlp_in, "sp_gathered");
      emit(ops::linear_fwd{s.fc1_out, in, w_at(W, b.fc1_w, F1 * C), b_at(W, b.fc1_b, F1, c_.bias), u32(N), u32(C),
                           u32(F1)});
      release_rows(in, mlp_in);
    }
    s.gelu_out = push("gelu_out", N * F, T_, kind);
    emit(ops::activation_fwd{s.gelu_out, s.fc1_out, gate_kind(), u32(N), u32(F)});
    if (c_.dropout > 0) s.mask2 = push("dropout_mask", rows() * C, elem::u8, kind);
  }

  /// `x_out`, when given, receives the block's output instead of a new saved tensor (a pipeline
  /// stage's send buffer).
  block_saved block_forward(std::size_t l, const operand& x_in, const operand& W, category kind = category::activations,
                            const operand& x_out = {}) {
    const std::size_t N = tokens(), C = c_.hidden, Wd = local_width(), F = local_ffn();
    const gpt_block_view& b = blk_;
    const bool drop = c_.dropout > 0;
    const std::uint32_t n = u32(N), cc = u32(C);
    const std::size_t Q = local_qkv();
    const bool rms = c_.rms_norm, nb = block_norm_bias(), bias = c_.bias;
    const std::size_t R = rows();  // residual-stream rows (N / tp under sequence parallelism)
    const std::uint32_t nr = u32(R);
    block_saved s{};
    s.sh = shape(l);
    s.ln1_out = push("ln1_out", R * C, T_, kind);
    emit(ops::norm_fwd{s.ln1_out, x_in, w_at(W, b.ln1_w, C), b_at(W, b.ln1_b, C, nb), nr, cc, rms, norm_eps(), norm_offset()});
    s.qkv = push("qkv", N * Q, T_, kind);
    {
      const operand in = gathered_rows(s.ln1_out, "sp_gathered");
      emit(ops::linear_fwd{s.qkv, in, w_at(W, b.qkv_w, Q * C), b_at(W, b.qkv_b, Q, bias || c_.qkv_bias), n, cc, u32(Q)});
      release_rows(in, s.ln1_out);
    }
    if (c_.qk_norm) {  // Qwen3: each query and key head normed before the rotary positions; backward reads them as they were
      const std::size_t D = head_dim();
      s.qk_pre = push("qk_pre_norm", N * (local_heads() + local_kv_heads()) * D, T_, kind);
      emit(ops::qk_norm_fwd{s.qkv, s.qk_pre, w_at(W, b.q_norm_w, D), w_at(W, b.k_norm_w, D), s.sh, norm_eps()});
    }
    rope(s.qkv, false, s.sh);
    const std::size_t scores = c_.micro_batch * local_heads() * c_.sequence * c_.sequence;
    const std::size_t lse_n = c_.micro_batch * local_heads() * c_.sequence;
    operand att_tmp{}, lse_tmp{};
    if (!c_.flash) {
      if (keeps_core()) s.att = push("attention_probs", scores, T_, kind);
      else att_tmp = transient("attention_probs", scores, T_, category::temporaries);
    } else {
      if (keeps_core()) s.lse = push("attention_lse", lse_n, A_, kind);
      else lse_tmp = transient("attention_lse", lse_n, A_, category::temporaries);
    }
    s.atty = push("attention_out", N * Wd, T_, kind);
    const operand core = !c_.flash ? (keeps_core() ? s.att : att_tmp) : (keeps_core() ? s.lse : lse_tmp);
    emit(ops::attention_fwd{s.atty, core, s.qkv, s.sh});
    if (!lse_tmp.null()) pop(lse_tmp);
    if (!att_tmp.null()) pop(att_tmp);
    if (drop) s.mask1 = push("dropout_mask", R * C, elem::u8, kind);
    if (c_.parallel_residual) {
      // x + attn(ln1(x)) waits in a transient while the MLP branch, which reads x too, runs: no
      // sum after attention is saved (the plan's parallel block, plan/stacks/memalg.hpp).
      operand branch = transient("attention_branch", R * C, T_, category::temporaries);
      row_parallel_forward(branch, s.atty, W, b.proj_w, b.proj_b, Wd, s.mask1, 2 * l);
      emit(ops::residual_add{branch, branch, x_in});
      if (!c_.shared_norm) {
        s.ln2_out = push("ln2_out", R * C, T_, kind);
        emit(ops::norm_fwd{s.ln2_out, x_in, w_at(W, b.ln2_w, C), b_at(W, b.ln2_b, C, nb), nr, cc, rms, norm_eps(), norm_offset()});
      }
      mlp_inner_forward(s, c_.shared_norm ? s.ln1_out : s.ln2_out, W, kind);
      s.x_out = x_out.null() ? push("residual", R * C, T_, kind) : x_out;
      // FC2 straight into the output, then the attention branch added
      row_parallel_forward(s.x_out, s.gelu_out, W, b.fc2_w, b.fc2_b, F, s.mask2, 2 * l + 1);
      emit(ops::residual_add{s.x_out, s.x_out, branch});
      pop(branch);
      return s;
    }
    if (c_.sandwich_norms) {  // Gemma: x + post_norm(attn), the post-norm's input saved for its backward
      s.proj_out = push("proj_out", R * C, T_, kind);
      row_parallel_forward(s.proj_out, s.atty, W, b.proj_w, b.proj_b, Wd, s.mask1, 2 * l);
      s.x_mid = push("residual", R * C, T_, kind);
      post_norm_add(s.x_mid, x_in, s.proj_out, b.post_attn_w, W);
    } else {
      s.x_mid = push("residual", R * C, T_, kind);
      operand proj = transient("proj_out", R * C, T_, category::temporaries);
      row_parallel_forward(proj, s.atty, W, b.proj_w, b.proj_b, Wd, s.mask1, 2 * l);
      emit(ops::residual_add{s.x_mid, x_in, proj});
      pop(proj);
    }
    s.ln2_out = push("ln2_out", R * C, T_, kind);
    emit(ops::norm_fwd{s.ln2_out, s.x_mid, w_at(W, b.ln2_w, C), b_at(W, b.ln2_b, C, nb), nr, cc, rms, norm_eps(), norm_offset()});
    mlp_inner_forward(s, s.ln2_out, W, kind);
    if (c_.sandwich_norms) {  // Gemma: x_mid + post_norm(mlp), the post-norm's input saved
      s.mlp_out = push("mlp_out", R * C, T_, kind);
      row_parallel_forward(s.mlp_out, s.gelu_out, W, b.fc2_w, b.fc2_b, F, s.mask2, 2 * l + 1);
      s.x_out = x_out.null() ? push("residual", R * C, T_, kind) : x_out;
      post_norm_add(s.x_out, s.x_mid, s.mlp_out, b.post_ffn_w, W);
      return s;
    }
    s.x_out = x_out.null() ? push("residual", R * C, T_, kind) : x_out;
    {
      operand fc2 = transient("fc2_out", R * C, T_, category::temporaries);
      row_parallel_forward(fc2, s.gelu_out, W, b.fc2_w, b.fc2_b, F, s.mask2, 2 * l + 1);
      emit(ops::residual_add{s.x_out, s.x_mid, fc2});
      pop(fc2);
    }
    return s;
  }
  void pop_block_saved(const block_saved& s) {
    if (!s.mask2.null()) pop(s.mask2);
    if (!s.mlp_out.null()) pop(s.mlp_out);    // (Gemma's post-feedforward norm input)
    if (!s.gelu_out.null()) pop(s.gelu_out);  // (a sequential block's backward releases the MLP's)
    if (!s.fc1_out.null()) pop(s.fc1_out);
    if (!s.ln2_out.null()) pop(s.ln2_out);  // (a shared norm has none)
    if (!s.x_mid.null()) pop(s.x_mid);      // (a parallel block saves no sum after attention)
    if (!s.proj_out.null()) pop(s.proj_out);  // (Gemma's post-attention norm input)
    if (!s.mask1.null()) pop(s.mask1);
    pop(s.atty);
    if (!s.lse.null()) pop(s.lse);
    if (!s.att.null()) pop(s.att);
    if (!s.qk_pre.null()) pop(s.qk_pre);
    pop(s.qkv);
    pop(s.ln1_out);
  }
  /// The MLP's residual-dropout mask, once its one reader (the backward's dropout) has run: the
  /// block's output is popped before its backward, so the mask is the saved side's top and goes
  /// at once instead of waiting for pop_block_saved (the plan's backward_released,
  /// plan/stacks/memalg.hpp). In a pipeline stage's stash slot it stays (pop releases nothing there).
  void release_mlp_mask(block_saved& s) {
    pop(s.mask2);
    s.mask2 = {};
  }
  /// The attention core's backward into dqkv, from the gradient of its output: under selective
  /// recomputation the core is rebuilt first (the kernel rewrites the output too, into a transient;
  /// flash backward reads the saved output, not the recomputed one; naive needs none), then the
  /// rotary positions are undone on dqkv.
  void attention_core_bwd(const operand& dqkv, const operand& datty, const block_saved& s) {
    const std::size_t N = tokens(), Wd = local_width();
    const std::size_t scores = c_.micro_batch * local_heads() * c_.sequence * c_.sequence;
    const std::size_t lse_n = c_.micro_batch * local_heads() * c_.sequence;
    operand core = c_.flash ? s.lse : s.att;
    operand out_tmp{};
    if (!keeps_core()) {
      core = c_.flash ? transient("attention_lse", lse_n, A_, category::temporaries)
                      : transient("attention_probs", scores, T_, category::temporaries);
      out_tmp = transient("attention_out_recomputed", N * Wd, T_, category::temporaries);
      emit(ops::attention_fwd{out_tmp, core, s.qkv, s.sh});
    }
    emit(ops::attention_bwd{dqkv, datty, s.qkv, c_.flash ? s.atty : operand{}, core, s.sh});
    if (!out_tmp.null()) pop(out_tmp);
    if (!keeps_core()) pop(core);
    rope(dqkv, true, s.sh);
  }
  /// The MLP branch's backward from the residual gradient `dres` (through its dropout mask) into
  /// `slot`, the gradient of the MLP's input `mlp_in` (the second norm's output, or the shared one's).
  /// SwiGLU: d(out) [N, F] is the first half of d(gate ‖ up) [N, 2F], which the backward writes
  /// over it in place (the plan's 2·inner).
  void mlp_backward(block_saved& s, const operand& mlp_in, const operand& W, const operand& G, const operand& dres,
                    const operand& slot) {
    const std::size_t N = tokens(), C = c_.hidden, F = local_ffn(), F1 = fc1_rows();
    const gpt_block_view& b = blk_;
    const std::uint32_t n = u32(N), cc = u32(C), f = u32(F);
    operand dfc2 = dres;
    if (c_.dropout > 0) {
      emit(ops::dropout_bwd{slot, dres, s.mask2, c_.dropout});
      release_mlp_mask(s);
      dfc2 = slot;
    }
    operand dgelu = transient("grad_mlp_inner", N * F1, T_, category::temporaries);
    const operand dact = sub(dgelu, 0, N * F);
    {  // under SP the row-parallel product's output gradient is all-gathered (the reduce-scatter's backward)
      const operand g = gathered_rows(dfc2, "sp_gathered");
      emit(ops::linear_bwd{dact, w_at(G, b.fc2_w, C * F), b_at(G, b.fc2_b, C, c_.bias), g, s.gelu_out,
                           w_at(W, b.fc2_w, C * F), n, f, cc});
      release_rows(g, dfc2);
    }
    if (c_.gated) emit(ops::activation_bwd{dgelu, dact, s.fc1_out, gate_kind(), n, f});
    else emit(ops::activation_bwd{dgelu, dgelu, s.fc1_out});
    column_parallel_bwd(slot, w_at(G, b.fc1_w, F1 * C), b_at(G, b.fc1_b, F1, c_.bias), dgelu, mlp_in,
                        w_at(W, b.fc1_w, F1 * C), cc, u32(F1));
    pop(dgelu);
  }
  /// The out-projection's backward from the residual gradient `dres` (through the attention's
  /// dropout mask, into `slot`): the gradient of the attention output, a new transient.
  operand projection_backward(const block_saved& s, const operand& W, const operand& G, const operand& dres,
                              const operand& slot) {
    const std::size_t N = tokens(), C = c_.hidden, Wd = local_width();
    const gpt_block_view& b = blk_;
    operand datty = transient("grad_attention_out", N * Wd, T_, category::temporaries);
    operand dproj = dres;
    if (c_.dropout > 0) {
      emit(ops::dropout_bwd{slot, dres, s.mask1, c_.dropout});
      dproj = slot;
    }
    const operand g = gathered_rows(dproj, "sp_gathered");
    emit(ops::linear_bwd{datty, w_at(G, b.proj_w, C * Wd), b_at(G, b.proj_b, C, c_.bias), g, s.atty,
                         w_at(W, b.proj_w, C * Wd), u32(N), u32(Wd), u32(C)});
    release_rows(g, dproj);
    return datty;
  }
  /// The QKV backward after the core's: the gradient of the first norm's output into `din`.
  void qkv_backward(const block_saved& s, const operand& datty, const operand& W, const operand& G, const operand& din) {
    const std::size_t N = tokens(), C = c_.hidden, Q = local_qkv();
    const gpt_block_view& b = blk_;
    operand dqkv = transient("grad_qkv", N * Q, T_, category::temporaries);
    attention_core_bwd(dqkv, datty, s);
    if (c_.qk_norm) {  // in place on dqkv's query and key heads, after the rotary positions are undone
      const std::size_t D = head_dim();
      emit(ops::qk_norm_bwd{dqkv, w_at(G, b.q_norm_w, D), w_at(G, b.k_norm_w, D), s.qk_pre, w_at(W, b.q_norm_w, D),
                            w_at(W, b.k_norm_w, D), s.sh, norm_eps()});
    }
    column_parallel_bwd(din, w_at(G, b.qkv_w, Q * C), b_at(G, b.qkv_b, Q, c_.bias || c_.qkv_bias), dqkv, s.ln1_out,
                        w_at(W, b.qkv_w, Q * C), u32(C), u32(Q));
    pop(dqkv);
  }
  /// Gemma's post-norm of a sub-layer's output `y` (saved) added to the residual `x`: out = x + norm(y),
  /// the norm's output a transient.
  void post_norm_add(const operand& out, const operand& x, const operand& y, std::size_t w, const operand& W) {
    const std::size_t C = c_.hidden;
    operand n = transient("post_norm_out", rows() * C, T_, category::temporaries);
    emit(ops::norm_fwd{n, y, w_at(W, w, C), operand{}, u32(rows()), u32(C), true, norm_eps(), norm_offset()});
    emit(ops::residual_add{out, x, n});
    pop(n);
  }
  /// Its backward: the gradient of the sub-layer's output `y` into `into`, from the residual gradient.
  void post_norm_backward(const operand& into, const operand& dres, const operand& y, std::size_t w, const operand& W,
                          const operand& G) {
    const std::size_t C = c_.hidden;
    emit(ops::norm_bwd{into, w_at(G, w, C), operand{}, dres, y, w_at(W, w, C), u32(rows()), u32(C), true, norm_eps(),
                       norm_offset()});
  }
  /// A norm's backward from `slot` (the gradient of its output), its input gradient added into dres.
  void norm_backward_into(const operand& dres, const operand& slot, const operand& x, std::size_t w_at_, std::size_t b_at_,
                          const operand& W, const operand& G) {
    const std::size_t C = c_.hidden;
    operand dnorm = transient("grad_norm_in", rows() * C, T_, category::temporaries);
    emit(ops::norm_bwd{dnorm, w_at(G, w_at_, C), b_at(G, b_at_, C, block_norm_bias()), slot, x, w_at(W, w_at_, C),
                       u32(rows()), u32(C), c_.rms_norm, norm_eps(), norm_offset()});
    emit(ops::residual_add{dres, dres, dnorm});
    pop(dnorm);
  }
  void block_backward(block_saved& s, const operand& x_in, const operand& W, const operand& G, const operand& dres,
                      const operand& slot) {
    if (c_.parallel_residual) {
      parallel_block_backward(s, x_in, W, G, dres, slot);
      return;
    }
    // MLP branch (Gemma: through its post-norm first, its gradient of the MLP's output in the slot,
    // which the MLP's backward reads and then overwrites with its input's gradient)
    const bool post = c_.sandwich_norms;
    if (post) {  // FC2's output, read for the last time, is the saved side's top: released at once
      post_norm_backward(slot, dres, s.mlp_out, blk_.post_ffn_w, W, G);
      pop(s.mlp_out);
      s.mlp_out = {};
    }
    mlp_backward(s, s.ln2_out, W, G, post ? slot : dres, slot);
    norm_backward_into(dres, slot, s.x_mid, blk_.ln2_w, blk_.ln2_b, W, G);
    // The MLP's tensors and the sum after attention are read for the last time: the saved
    // side's top (the mask went before), released before the attention backward (the plan's
    // backward_tail, plan/stacks/memalg.hpp). In a stash slot they stay.
    for (operand* t : {&s.gelu_out, &s.fc1_out, &s.ln2_out, &s.x_mid}) {  // (Gemma's FC2 output went already)
      pop(*t);
      *t = {};
    }
    // attention branch (Gemma: through its post-norm first, as the MLP's)
    if (post) {  // the out-projection's output likewise, before the attention's transients
      post_norm_backward(slot, dres, s.proj_out, blk_.post_attn_w, W, G);
      pop(s.proj_out);
      s.proj_out = {};
    }
    operand datty = projection_backward(s, W, G, post ? slot : dres, slot);
    qkv_backward(s, datty, W, G, slot);
    pop(datty);
    norm_backward_into(dres, slot, x_in, blk_.ln1_w, blk_.ln1_b, W, G);
  }

  /// A parallel block's backward: d(out) reaches both branches unchanged (each through its own
  /// dropout mask). The out-projection's backward runs first, so the MLP branch's norm can add its
  /// input gradient into dres; its output's gradient d(attention_out) waits through the MLP branch.
  /// With a shared norm the MLP's gradient of the norm's output waits in the slot while the QKV
  /// backward writes the attention's into grad_norm_in; their sum goes through the one norm backward.
  void parallel_block_backward(block_saved& s, const operand& x_in, const operand& W, const operand& G,
                               const operand& dres, const operand& slot) {
    const bool shared = c_.shared_norm;
    // attention branch, out-projection
    operand datty = projection_backward(s, W, G, dres, slot);
    // MLP branch: the slot ends holding the gradient of its norm's output
    mlp_backward(s, shared ? s.ln1_out : s.ln2_out, W, G, dres, slot);
    if (!shared) norm_backward_into(dres, slot, x_in, blk_.ln2_w, blk_.ln2_b, W, G);
    // The MLP's tensors and the attention's dropout mask (read by the out-projection's backward)
    // are read for the last time: the saved side's top down to the attention output, released
    // before the core's backward (the plan's backward_tail). In a stash slot they stay.
    for (operand* t : {&s.gelu_out, &s.fc1_out, &s.ln2_out, &s.mask1})
      if (!t->null()) {
        pop(*t);
        *t = {};
      }
    // attention branch, the core and QKV: their input gradient into the slot, or (shared norm)
    // into grad_norm_in beside the MLP's in the slot
    if (!shared) {
      qkv_backward(s, datty, W, G, slot);
      pop(datty);
      norm_backward_into(dres, slot, x_in, blk_.ln1_w, blk_.ln1_b, W, G);
      return;
    }
    const std::size_t C = c_.hidden;
    operand dnorm = transient("grad_norm_in", rows() * C, T_, category::temporaries);
    qkv_backward(s, datty, W, G, dnorm);
    emit(ops::residual_add{slot, slot, dnorm});  // d(ln_out) = the MLP's + the attention's
    emit(ops::norm_bwd{dnorm, w_at(G, blk_.ln1_w, C), b_at(G, blk_.ln1_b, C, block_norm_bias()), slot, x_in,
                       w_at(W, blk_.ln1_w, C), u32(rows()), u32(C), c_.rms_norm, norm_eps(), norm_offset()});
    emit(ops::residual_add{dres, dres, dnorm});
    pop(dnorm);
    pop(datty);
  }
};

}  // namespace memalg::exec::detail

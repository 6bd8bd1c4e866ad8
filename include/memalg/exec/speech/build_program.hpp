// SPDX-License-Identifier: BSL-1.0
// memalg/exec/speech/build_program.hpp — lowers a training step of the speech model to a step program.
//
// The speech model (model/presets/speech.hpp: a phoneme encoder and an autoregressive mel-frame
// decoder, Transformer TTS with Tacotron 2's convolutional pre- and post-nets) as the same
// `program` the GPT runtime runs (exec/program.hpp), built on the host through an arena_layout of
// the plan's capacities: every operand has its offset before a kernel runs, and a push past the
// plan throws here. The layout follows the `memalg` stack's accounting (plan/stacks/memalg.hpp), each
// entry keeping its input:
//
//   encoder   embedding → 3 × [conv1d → batch norm → ReLU → dropout] → blocks (bidirectional
//             self-attention over the real phonemes: a key mask) → final LayerNorm = the encoder
//             output, kept with its gradient accumulator (every cross-attention's key/value
//             projection adds into it: linear_bwd add_din)
//   decoder   the previous target frame (teacher forcing, a zero frame first) → 2 × [linear → ReLU
//             → dropout] → linear → blocks (causal self-attention, cross-attention over the encoder
//             output, MLP) → final LayerNorm → the mel ‖ stop projection, whose output gradient is
//             kept with it: the stop logits become their gradient at once (BCE over every frame),
//             the mel gradient sums the loss of the frames before the post-net and, after it, the
//             loss of the frames after → post-net: 4 × [conv1d → batch norm → tanh → dropout],
//             conv1d → batch norm → dropout, added to the mel frames (Tacotron 2, §2.2: the
//             post-net predicts a residual)
//   loss      L1 (or MSE) of the mel frames before and after the post-net, masked to the real
//             frames, plus the stop-token BCE — each a sum over the micro-batch divided by its
//             padded size (B·S·M, B·S), so grad_accum micro-batches of b sum to one of grad_accum·b
//
// Backward runs the entries in reverse. The gradient arriving at an entry sits on the transient
// side; the entry pushes its input's gradient above it, then the two are released and the input's
// gradient moved down into their place (ops::copy, a memmove): each entry's backward holds its
// output's and its input's gradient, as the plan counts. The blocks add one gradient slot of the
// stream for their stack, as the GPT runtime's do.
//
// The lowering's ground floor (configuration, inputs, units) is exec/speech/state.hpp; what it
// shares with the GPT family (arena, model states, step end) is exec/lowering.hpp.
//
// What is not implemented, refused by program_error: tensor, sequence, pipeline parallelism,
// ZeRO > 0, recomputation, naive attention; the mesh is data parallel with gradients all-reduced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "memalg/exec/arena_layout.hpp"
#include "memalg/exec/lowering.hpp"
#include "memalg/exec/program.hpp"
#include "memalg/exec/speech/config.hpp"
#include "memalg/exec/speech/state.hpp"

namespace memalg::exec {
namespace detail {

/// The speech model's step: its nets, blocks and micro-batch over speech_state.
class speech_lowering : speech_state {
 public:
  speech_lowering(const speech_config& c, arena_sizes sizes, rank_coords r, elem storage)
      : speech_state(c, sizes, r, storage) {}

  program build() {
    validate();
    build_units();
    allocate_states();
    lay_out_step(units_, !c_.evaluate, c_.grad_accum, [this] { micro_batch(); }, [this] { step_end(); });
    finish();
    return std::move(p_);
  }

 private:
  /// The arriving gradient `dout` and the input gradient `din` pushed above it are released and
  /// din moved down into their place: the next entry's arriving gradient. The move (a memmove: the
  /// two places may overlap) runs while both are still on the transient stack, so no op reads
  /// bytes the layout has released.
  operand hand_down(const operand& dout, const operand& din) {
    const operand to{dout.offset + dout.bytes() - din.bytes(), din.count, din.type, din.in};
    if (to.offset != din.offset) emit(ops::copy{to, din});
    pop(din);
    pop(dout);
    operand g = transient("grad_input", din.count, T_);
    if (g != to) throw std::logic_error("build_speech_program: the handed-down gradient is not where it was moved");
    return g;
  }

  // ---- dropout ----------------------------------------------------------------------------------------
  /// mask and out over B sequences of rows_per_seq × width elements.
  void dropout(const operand& out, const operand& m, const operand& in, std::size_t rows_per_seq, std::size_t width,
               float p, std::uint32_t site) {
    emit(ops::dropout_fwd{out, m, in, u32(c_.micro_batch), u32(rows_per_seq * width), p, site});
  }

  // ---- a convolution (or linear) entry: product → [batch norm] → [nonlinearity] → [dropout] ------
  struct net_saved {
    operand x_bn, y, m;  ///< batch norm input, nonlinearity output, dropout mask (null where absent)
  };
  enum class net_kind : std::uint8_t { conv, linear };
  /// Pushes the entry's saved tensors, then its output `out` (the next entry's input; a transient
  /// when `last`: the model's last output, which the loss turns into its gradient).
  net_saved net_forward(net_kind kind, const unit& u, const conv_view& v, const operand& in, std::size_t rows_per_seq,
                        std::size_t IC, std::size_t OC, bool bn, bool act, ops::activation_kind ak, float p,
                        operand& out, std::string_view out_name, bool last, std::uint32_t site) {
    const std::size_t N = c_.micro_batch * rows_per_seq;
    net_saved s{};
    const operand W = u.weight;
    const auto product = [&](const operand& dst) {
      if (kind == net_kind::conv)
        emit(ops::conv1d_fwd{dst, in, sub(W, v.w, OC * IC * c_.kernel), sub(W, v.b, OC), u32(c_.micro_batch),
                             u32(rows_per_seq), u32(IC), u32(OC), u32(c_.kernel)});
      else
        emit(ops::linear_fwd{dst, in, sub(W, 0, OC * IC), sub(W, OC * IC, OC), u32(N), u32(IC), u32(OC)});
    };
    const bool drop = p > 0;
    const operand msk = rows_per_seq == c_.frames ? frame_mask() : phoneme_mask();
    // What each step writes: product → x_bn (saved when bn) → y (saved when act) → out.
    if (bn) s.x_bn = push("batchnorm_in", N * OC, T_);
    if (act) s.y = push("activation_out", N * OC, T_);
    if (drop) s.m = push("dropout_mask", N * OC, elem::u8);
    out = last ? transient(out_name, N * OC, T_) : push(out_name, N * OC, T_);
    // product → x_bn → (batch norm) → y → (nonlinearity, in place) → (dropout) → out. Without
    // dropout the nonlinearity's output is still copied into `out` (an identity dropout): the plan
    // counts the two tensors as two (the entry's own and the next one's input).
    const operand after_bn = act ? s.y : out;
    if (bn) {
      product(s.x_bn);
      emit(ops::batchnorm_fwd{after_bn, s.x_bn, sub(W, v.gamma, OC), sub(W, v.beta, OC), msk, u32(N), u32(OC)});
    } else {
      product(after_bn);
    }
    if (act) emit(ops::activation_fwd{s.y, s.y, ak});
    if (drop) dropout(out, s.m, act ? s.y : out, rows_per_seq, OC, p, site);
    else if (act) emit(ops::copy{out, s.y});
    return s;
  }
  /// Backward of a net entry: dout arrives on the transient side and is consumed in place; returns
  /// the input's gradient (handed down), or nothing when `want_din` is false.
  operand net_backward(net_kind kind, unit& u, const conv_view& v, const net_saved& s, const operand& in,
                       const operand& dout, std::size_t rows_per_seq, std::size_t IC, std::size_t OC, bool bn, bool act,
                       ops::activation_kind ak, float p, bool want_din) {
    const std::size_t N = c_.micro_batch * rows_per_seq;
    const operand W = u.weight, G = u.grad;
    const operand msk = rows_per_seq == c_.frames ? frame_mask() : phoneme_mask();
    // Each of the entry's own tensors is released after its last reader, before the input's
    // gradient is written (the plan's net-entry backward, plan/stacks/memalg.hpp).
    if (p > 0) {
      emit(ops::dropout_bwd{dout, dout, s.m, p});
      pop(s.m);
    }
    if (act) {
      emit(ops::activation_bwd{dout, dout, s.y, ak});
      pop(s.y);
    }
    if (bn) {
      emit(ops::batchnorm_bwd{dout, sub(G, v.gamma, OC), sub(G, v.beta, OC), dout, s.x_bn, sub(W, v.gamma, OC), msk, u32(N),
                              u32(OC)});
      pop(s.x_bn);
    }
    operand din = want_din ? transient("grad_input", N * IC, T_) : operand{};
    if (kind == net_kind::conv)
      emit(ops::conv1d_bwd{din, sub(G, v.w, OC * IC * c_.kernel), sub(G, v.b, OC), dout, in, sub(W, v.w, OC * IC * c_.kernel),
                           u32(c_.micro_batch), u32(rows_per_seq), u32(IC), u32(OC), u32(c_.kernel)});
    else
      emit(ops::linear_bwd{din, sub(G, 0, OC * IC), sub(G, OC * IC, OC), dout, in, sub(W, 0, OC * IC), u32(N), u32(IC),
                           u32(OC)});
    reduce(u);
    if (!want_din) {
      pop(dout);
      return {};
    }
    return hand_down(dout, din);
  }
  static conv_view linear_view(std::size_t IC, std::size_t OC) { return {0, OC * IC, 0, 0, OC * IC + OC}; }

  // ---- transformer blocks ----------------------------------------------------------------------------
  struct block_saved {
    operand ln1_out, qkv, lse, atty, mask1, x_mid;
    operand lnx_out, qx, kvx, lsex, attyx, maskx, x_midx;
    operand ln2_out, fc1_out, gelu_out, mask2, x_out;
  };
  ops::xattn_shape self_shape() const {  // the encoder's: bidirectional over the real phonemes, fused qkv
    return {u32(c_.micro_batch), u32(c_.text_tokens), u32(c_.text_tokens), u32(c_.heads), u32(c_.heads), u32(D()), false, true,
            true};
  }
  attn_shape causal_shape() const {  // the decoder's
    return {u32(c_.micro_batch), u32(c_.frames), u32(c_.heads), u32(c_.heads), u32(D()), true, true};
  }
  ops::xattn_shape cross_shape() const {
    return {u32(c_.micro_batch), u32(c_.frames), u32(c_.text_tokens), u32(c_.heads), u32(c_.heads), u32(D()), false, true,
            false};
  }
  /// One block on S tokens per sequence (the encoder's phonemes or the decoder's frames);
  /// `enc` is the encoder output for a decoder block (cross-attention), null for an encoder block.
  block_saved block_forward(const unit& u, const block_view& b, const operand& x_in, const operand& enc, std::uint32_t site) {
    const bool cross = !enc.null();
    const std::size_t S = cross ? c_.frames : c_.text_tokens, N = c_.micro_batch * S, C = c_.hidden, F = c_.ffn;
    const std::size_t lse_n = c_.micro_batch * c_.heads * S;
    const float p = c_.block_dropout;
    const bool drop = p > 0;
    const operand W = u.weight;
    const std::uint32_t n = u32(N), cc = u32(C);
    block_saved s{};
    // self-attention
    s.ln1_out = push("ln1_out", N * C, T_);
    emit(ops::norm_fwd{s.ln1_out, x_in, sub(W, b.ln1_w, C), sub(W, b.ln1_b, C), n, cc, false, norm_eps()});
    s.qkv = push("qkv", N * 3 * C, T_);
    emit(ops::linear_fwd{s.qkv, s.ln1_out, sub(W, b.qkv_w, 3 * C * C), sub(W, b.qkv_b, 3 * C), n, cc, u32(3 * C)});
    s.lse = push("attention_lse", lse_n, A_);
    s.atty = push("attention_out", N * C, T_);
    if (cross) emit(ops::attention_fwd{s.atty, s.lse, s.qkv, causal_shape()});
    else emit(ops::masked_attention_fwd{s.atty, s.lse, s.qkv, s.qkv, phoneme_mask(), self_shape()});
    if (drop) s.mask1 = push("dropout_mask", N * C, elem::u8);
    s.x_mid = push("residual", N * C, T_);
    residual_branch(s.x_mid, x_in, s.atty, sub(W, b.proj_w, C * C), sub(W, b.proj_b, C), C, s.mask1, S, site);
    operand stream = s.x_mid;
    if (cross) {
      const std::size_t lsex_n = c_.micro_batch * c_.heads * c_.frames;
      s.lnx_out = push("lnx_out", N * C, T_);
      emit(ops::norm_fwd{s.lnx_out, s.x_mid, sub(W, b.lnx_w, C), sub(W, b.lnx_b, C), n, cc, false, norm_eps()});
      s.qx = push("cross_q", N * C, T_);
      emit(ops::linear_fwd{s.qx, s.lnx_out, sub(W, b.q_w, C * C), sub(W, b.q_b, C), n, cc, cc});
      s.kvx = push("cross_kv", Ne() * 2 * C, T_);
      emit(ops::linear_fwd{s.kvx, enc, sub(W, b.kv_w, 2 * C * C), sub(W, b.kv_b, 2 * C), u32(Ne()), cc, u32(2 * C)});
      s.lsex = push("cross_lse", lsex_n, A_);
      s.attyx = push("cross_out", N * C, T_);
      emit(ops::masked_attention_fwd{s.attyx, s.lsex, s.qx, s.kvx, phoneme_mask(), cross_shape()});
      if (drop) s.maskx = push("dropout_mask", N * C, elem::u8);
      s.x_midx = push("residual", N * C, T_);
      residual_branch(s.x_midx, s.x_mid, s.attyx, sub(W, b.projx_w, C * C), sub(W, b.projx_b, C), C, s.maskx, S, site + 1);
      stream = s.x_midx;
    }
    // MLP
    s.ln2_out = push("ln2_out", N * C, T_);
    emit(ops::norm_fwd{s.ln2_out, stream, sub(W, b.ln2_w, C), sub(W, b.ln2_b, C), n, cc, false, norm_eps()});
    s.fc1_out = push("fc1_out", N * F, T_);
    emit(ops::linear_fwd{s.fc1_out, s.ln2_out, sub(W, b.fc1_w, F * C), sub(W, b.fc1_b, F), n, cc, u32(F)});
    s.gelu_out = push("gelu_out", N * F, T_);
    emit(ops::activation_fwd{s.gelu_out, s.fc1_out, ops::activation_kind::gelu, n, u32(F)});
    if (drop) s.mask2 = push("dropout_mask", N * C, elem::u8);
    s.x_out = push("residual", N * C, T_);
    residual_branch(s.x_out, stream, s.gelu_out, sub(W, b.fc2_w, C * F), sub(W, b.fc2_b, C), F, s.mask2, S, site + 2);
    return s;
  }
  /// out = x + dropout(in · wᵀ + bias), through a transient of the stream's width.
  void residual_branch(const operand& out, const operand& x, const operand& in, const operand& w, const operand& bias,
                       std::size_t IC, const operand& m, std::size_t S, std::uint32_t site) {
    const std::size_t N = c_.micro_batch * S, C = c_.hidden;
    operand t = transient("branch_out", N * C, T_);
    emit(ops::linear_fwd{t, in, w, bias, u32(N), u32(IC), u32(C)});
    if (!m.null()) dropout(t, m, t, S, C, c_.block_dropout, site);
    emit(ops::residual_add{out, x, t});
    pop(t);
  }
  void pop_block(const block_saved& s) {
    for (const operand* o : {&s.mask2, &s.gelu_out, &s.fc1_out, &s.ln2_out, &s.x_midx, &s.maskx, &s.attyx, &s.lsex, &s.kvx,
                             &s.qx, &s.lnx_out, &s.x_mid, &s.mask1, &s.atty, &s.lse, &s.qkv, &s.ln1_out})
      if (!o->null()) pop(*o);
  }
  /// Backward through a residual branch out = x + dropout(in · wᵀ + b): dres (the stream's
  /// gradient) flows on; writes d(in) into a transient of `in_n` elements, returned.
  operand branch_backward(const operand& dres, const operand& slot, const operand& m, const operand& in, const operand& w,
                          const operand& dw, const operand& dbias, std::size_t IC, std::size_t N, std::size_t in_n,
                          const char* name) {
    operand g = dres;
    if (!m.null()) {
      emit(ops::dropout_bwd{slot, dres, m, c_.block_dropout});
      g = slot;
    }
    operand din = transient(name, in_n, T_);
    emit(ops::linear_bwd{din, dw, dbias, g, in, w, u32(N), u32(IC), u32(c_.hidden)});
    return din;
  }
  void norm_into(const operand& dres, const operand& dslot, const operand& x, const operand& w, const operand& dw,
                 const operand& db, std::size_t N) {
    operand dn = transient("grad_norm_in", N * c_.hidden, T_);
    emit(ops::norm_bwd{dn, dw, db, dslot, x, w, u32(N), u32(c_.hidden), false, norm_eps()});
    emit(ops::residual_add{dres, dres, dn});
    pop(dn);
  }
  void block_backward(unit& u, const block_view& b, const block_saved& s, const operand& x_in, const operand& enc,
                      const operand& denc, const operand& dres, const operand& slot) {
    const bool cross = !enc.null();
    const std::size_t S = cross ? c_.frames : c_.text_tokens, N = c_.micro_batch * S, C = c_.hidden, F = c_.ffn;
    const operand W = u.weight, G = u.grad;
    const std::uint32_t n = u32(N), cc = u32(C);
    {  // MLP
      operand dgelu = branch_backward(dres, slot, s.mask2, s.gelu_out, sub(W, b.fc2_w, C * F), sub(G, b.fc2_w, C * F),
                                      sub(G, b.fc2_b, C), F, N, N * F, "grad_mlp_inner");
      emit(ops::activation_bwd{dgelu, dgelu, s.fc1_out, ops::activation_kind::gelu, n, u32(F)});
      emit(ops::linear_bwd{slot, sub(G, b.fc1_w, F * C), sub(G, b.fc1_b, F), dgelu, s.ln2_out, sub(W, b.fc1_w, F * C), n, cc,
                           u32(F)});
      pop(dgelu);
      norm_into(dres, slot, cross ? s.x_midx : s.x_mid, sub(W, b.ln2_w, C), sub(G, b.ln2_w, C), sub(G, b.ln2_b, C), N);
    }
    if (cross) {  // cross-attention
      operand datt = branch_backward(dres, slot, s.maskx, s.attyx, sub(W, b.projx_w, C * C), sub(G, b.projx_w, C * C),
                                     sub(G, b.projx_b, C), C, N, N * C, "grad_cross_out");
      operand dq = transient("grad_cross_q", N * C, T_);
      operand dkv = transient("grad_cross_kv", Ne() * 2 * C, T_);
      emit(ops::masked_attention_bwd{dq, dkv, datt, s.qx, s.kvx, s.attyx, s.lsex, phoneme_mask(), cross_shape()});
      emit(ops::linear_bwd{slot, sub(G, b.q_w, C * C), sub(G, b.q_b, C), dq, s.lnx_out, sub(W, b.q_w, C * C), n, cc, cc});
      ops::linear_bwd kv{denc, sub(G, b.kv_w, 2 * C * C), sub(G, b.kv_b, 2 * C), dkv, enc, sub(W, b.kv_w, 2 * C * C),
                         u32(Ne()), cc, u32(2 * C)};
      kv.add_din = true;
      emit(kv);
      pop(dkv);
      pop(dq);
      pop(datt);
      norm_into(dres, slot, s.x_mid, sub(W, b.lnx_w, C), sub(G, b.lnx_w, C), sub(G, b.lnx_b, C), N);
    }
    {  // self-attention
      operand datt = branch_backward(dres, slot, s.mask1, s.atty, sub(W, b.proj_w, C * C), sub(G, b.proj_w, C * C),
                                     sub(G, b.proj_b, C), C, N, N * C, "grad_attention_out");
      operand dqkv = transient("grad_qkv", N * 3 * C, T_);
      if (cross) emit(ops::attention_bwd{dqkv, datt, s.qkv, s.atty, s.lse, causal_shape()});
      else emit(ops::masked_attention_bwd{dqkv, dqkv, datt, s.qkv, s.qkv, s.atty, s.lse, phoneme_mask(), self_shape()});
      emit(ops::linear_bwd{slot, sub(G, b.qkv_w, 3 * C * C), sub(G, b.qkv_b, 3 * C), dqkv, s.ln1_out,
                           sub(W, b.qkv_w, 3 * C * C), n, cc, u32(3 * C)});
      pop(dqkv);
      pop(datt);
      norm_into(dres, slot, x_in, sub(W, b.ln1_w, C), sub(G, b.ln1_w, C), sub(G, b.ln1_b, C), N);
    }
    reduce(u);
  }

  // ---- one micro-batch ----------------------------------------------------------------------------
  void micro_batch() {
    const std::size_t C = c_.hidden, M = c_.mel_bins, P = c_.prenet, Q = c_.postnet, B = c_.micro_batch;
    const std::size_t Te = c_.text_tokens, Fr = c_.frames, ND = Nd(), NE = Ne();
    const std::size_t LE = c_.encoder_layers, LD = c_.decoder_layers;
    const float pn = c_.net_dropout;
    const bool bn = c_.batchnorm;
    using ak = ops::activation_kind;

    // ---- encoder forward
    unit& emb = units_[0];
    operand x = push("embedding_out", NE * C, T_);
    emit(ops::embedding_fwd{x, {0, NE, elem::i32, where::tokens}, emb.weight, operand{}, u32(B), u32(Te), u32(C)});
    std::vector<operand> enc_in{x};
    std::vector<net_saved> enc_net;
    for (std::size_t i = 0; i < enc_conv_.size(); ++i) {
      operand out{};
      enc_net.push_back(net_forward(net_kind::conv, units_[1 + i], enc_conv_[i], enc_in.back(), Te, C, C, bn, true, ak::relu,
                                    pn, out, "conv_out", false, u32(100 + i)));
      enc_in.push_back(out);
    }
    std::vector<block_saved> enc_blocks;
    for (std::size_t l = 0; l < LE; ++l) {
      enc_blocks.push_back(block_forward(units_[enc_block0_ + l], enc_blk_, enc_in.back(), operand{}, u32(1000 + 4 * l)));
      enc_in.push_back(enc_blocks.back().x_out);
    }
    operand enc = push("encoder_output", NE * C, T_);
    {
      const unit& n = units_[enc_norm_];
      emit(ops::norm_fwd{enc, enc_in.back(), sub(n.weight, 0, C), sub(n.weight, C, C), u32(NE), u32(C), false, norm_eps()});
    }
    operand denc = push("encoder_output_grad", NE * C, T_);
    emit(ops::zero{denc});

    // ---- decoder forward
    operand frames = push("decoder_in", ND * M, T_);
    emit(ops::frames_in{frames, feature(io_.mel, ND * M), u32(B), u32(Fr), u32(M), 1});
    const conv_view lv1 = linear_view(M, P), lv2 = linear_view(P, P), lv3 = linear_view(P, C);
    operand in2 = operand{}, in3 = operand{}, x0 = operand{};
    const net_saved pre1 =
        net_forward(net_kind::linear, units_[pre1_], lv1, frames, Fr, M, P, false, true, ak::relu, pn, in2, "prenet_out", false, 200);
    const net_saved pre2 =
        net_forward(net_kind::linear, units_[pre1_ + 1], lv2, in2, Fr, P, P, false, true, ak::relu, pn, in3, "prenet_out", false, 201);
    const net_saved pre3 = net_forward(net_kind::linear, units_[pre1_ + 2], lv3, in3, Fr, P, C, false, false, ak::relu, 0, x0,
                                       "decoder_embedding", false, 202);
    std::vector<operand> dec_in{x0};
    std::vector<block_saved> dec_blocks;
    for (std::size_t l = 0; l < LD; ++l) {
      dec_blocks.push_back(block_forward(units_[dec_block0_ + l], dec_blk_, dec_in.back(), enc, u32(2000 + 4 * l)));
      dec_in.push_back(dec_blocks.back().x_out);
    }
    operand lnf = push("decoder_norm_out", ND * C, T_);
    {
      const unit& n = units_[dec_norm_];
      emit(ops::norm_fwd{lnf, dec_in.back(), sub(n.weight, 0, C), sub(n.weight, C, C), u32(ND), u32(C), false, norm_eps()});
    }
    // The mel ‖ stop projection, its output's gradient kept with it.
    unit& out = units_[out_];
    const operand Wmel = sub(out.weight, 0, M * C), Wstop = sub(out.weight, M * C, C);
    const operand bmel = sub(out.weight, out_b_, M), bstop = sub(out.weight, out_b_ + M, 1);
    const float divisor_mel = static_cast<float>(ND * M), divisor_stop = static_cast<float>(ND);
    const std::uint32_t ga = u32(c_.grad_accum);
    operand dmel = push("mel_grad", ND * M, T_);
    operand dstop = push("stop_grad", ND, T_);
    emit(ops::linear_fwd{dstop, lnf, Wstop, bstop, u32(ND), u32(C), 1});
    emit(ops::stop_loss{dstop, feature(io_.stop, ND), dstop, u32(ND), 1, ga, divisor_stop});
    operand mel = push("mel_before", ND * M, T_);  // the post-net's input
    emit(ops::linear_fwd{mel, lnf, Wmel, bmel, u32(ND), u32(C), u32(M)});
    emit(ops::mel_loss{mel, feature(io_.mel, ND * M), frame_mask(), dmel, u32(ND), u32(M), u32(M), ga, c_.l1, divisor_mel});
    // The post-net.
    std::vector<operand> post_in{mel};
    std::vector<net_saved> post_net;
    const std::size_t K = post_.size();
    operand after{};
    for (std::size_t i = 0; i < K; ++i) {
      const bool last = i + 1 == K;
      const std::size_t IC = i == 0 ? M : Q, OC = last ? M : Q;
      operand o{};
      post_net.push_back(net_forward(net_kind::conv, units_[post0_ + i], post_[i], post_in.back(), Fr, IC, OC, bn, !last, ak::tanh,
                                     pn, o, last ? "mel_after" : "postnet_out", last, u32(300 + i)));
      if (last) after = o;
      else post_in.push_back(o);
    }
    emit(ops::residual_add{after, after, mel});  // the post-net predicts a residual
    emit(ops::mel_loss{after, feature(io_.mel, ND * M), frame_mask(), after, u32(ND), u32(M), u32(M), ga, c_.l1, divisor_mel});
    emit(ops::residual_add{dmel, dmel, after});  // d(mel_before) gets d(mel_after) through the residual
    if (c_.evaluate) return;  // a validation pass: the losses are all it computes

    // ---- decoder backward
    operand g = after;  // d(post-net output) = d(mel_after)
    for (std::size_t i = K; i-- > 0;) {
      const bool last = i + 1 == K;
      const std::size_t IC = i == 0 ? M : Q, OC = last ? M : Q;
      g = net_backward(net_kind::conv, units_[post0_ + i], post_[i], post_net[i], post_in[i], g, Fr, IC, OC, bn, !last, ak::tanh,
                       pn, true);
      pop(post_in[i]);
    }
    emit(ops::residual_add{dmel, dmel, g});
    pop(g);
    operand dx = transient("grad_norm_out", ND * C, T_);
    emit(ops::linear_bwd{dx, sub(out.grad, 0, M * C), sub(out.grad, out_b_, M), dmel, lnf, Wmel, u32(ND), u32(C), u32(M)});
    {
      ops::linear_bwd s{dx, sub(out.grad, M * C, C), sub(out.grad, out_b_ + M, 1), dstop, lnf, Wstop, u32(ND), u32(C), 1};
      s.add_din = true;
      emit(s);
    }
    reduce(out);
    pop(dstop);
    pop(dmel);
    pop(lnf);
    {
      unit& n = units_[dec_norm_];
      operand din = transient("grad_residual", ND * C, T_);
      emit(ops::norm_bwd{din, sub(n.grad, 0, C), sub(n.grad, C, C), dx, dec_in.back(), sub(n.weight, 0, C), u32(ND), u32(C),
                         false, norm_eps()});
      reduce(n);
      g = hand_down(dx, din);
    }
    {
      operand slot = transient("grad_slot", ND * C, T_);
      for (std::size_t l = LD; l-- > 0;) {
        pop(dec_blocks[l].x_out);
        block_backward(units_[dec_block0_ + l], dec_blk_, dec_blocks[l], dec_in[l], enc, denc, g, slot);
        pop_block(dec_blocks[l]);
      }
      pop(slot);
    }
    pop(x0);  // the first block's input
    g = net_backward(net_kind::linear, units_[pre1_ + 2], lv3, pre3, in3, g, Fr, P, C, false, false, ak::relu, 0, true);
    pop(in3);
    g = net_backward(net_kind::linear, units_[pre1_ + 1], lv2, pre2, in2, g, Fr, P, P, false, true, ak::relu, pn, true);
    pop(in2);
    net_backward(net_kind::linear, units_[pre1_], lv1, pre1, frames, g, Fr, M, P, false, true, ak::relu, pn, false);
    pop(frames);

    // ---- encoder backward: the encoder output's gradient moves into the output's place
    emit(ops::copy{enc, denc});
    pop(denc);
    {
      unit& n = units_[enc_norm_];
      operand din = transient("grad_residual", NE * C, T_);
      emit(ops::norm_bwd{din, sub(n.grad, 0, C), sub(n.grad, C, C), enc, enc_in.back(), sub(n.weight, 0, C), u32(NE), u32(C),
                         false, norm_eps()});
      reduce(n);
      pop(enc);
      g = din;
    }
    {
      operand slot = transient("grad_slot", NE * C, T_);
      for (std::size_t l = LE; l-- > 0;) {
        pop(enc_blocks[l].x_out);
        block_backward(units_[enc_block0_ + l], enc_blk_, enc_blocks[l], enc_in[enc_conv_.size() + l], operand{}, operand{}, g,
                       slot);
        pop_block(enc_blocks[l]);
      }
      pop(slot);
    }
    pop(enc_in[enc_conv_.size()]);  // the first block's input
    for (std::size_t i = enc_conv_.size(); i-- > 0;) {
      g = net_backward(net_kind::conv, units_[1 + i], enc_conv_[i], enc_net[i], enc_in[i], g, Te, C, C, bn, true, ak::relu, pn,
                       true);
      pop(enc_in[i]);
    }
    emit(ops::embedding_bwd{emb.grad, operand{}, g, {0, NE, elem::i32, where::tokens}, u32(B), u32(Te), u32(C)});
    reduce(emb);
    pop(g);
  }

  void step_end() {
    emit_loss_mean(u32(c_.grad_accum), c_.dp);
    if (c_.evaluate) return;
    for (const unit& u : units_) emit(ops::sqnorm{u.grad, true});
    emit_clip_scale(0, c_.dp, c_.max_grad_norm, false);
    emit_updates(units_, 0, c_.weight_decay, c_.dp, [](const unit&) { return std::size_t{0}; });
  }
  void finish() {
    finish_program(c_, c_.frames, r_.dp, c_.block_dropout);
    p_.tokens_per_micro = io_.tokens;
    p_.targets_per_micro = 0;
    p_.features_per_micro = io_.features;
    p_.masks_per_micro = io_.masks;
  }
};

}  // namespace detail

/// The step program of the speech model for rank `r` (data parallel only), laid out in `sizes`
/// (the plan's arena). Throws program_error for what the runtime does not implement and
/// arena_error when the step does not fit.
inline program build_speech_program(const speech_config& c, arena_sizes sizes, rank_coords r = {}, elem storage = elem::f32) {
  return detail::speech_lowering(c, sizes, r, storage).build();
}

}  // namespace memalg::exec

// SPDX-License-Identifier: BSL-1.0
// memalg/plan/stacks/paper.hpp — the `paper` stack: the generic accounting of Korthikanti et al.
// 2022 (arXiv 2205.05198, §4.1 and Table 2), per sub-layer and per layer kind. The `memalg` stack
// starts from it (stacks/memalg.hpp); `pytorch` and `megatron` fall back to it for the kinds they
// do not model. Notation: stacks/common.hpp.
//
// Per sub-layer, one instance and one micro-batch (Korthikanti et al. 2022, arXiv 2205.05198,
// §4.1 — with e = 2, p > 0, a·d = h, kv = a, f = 4h these are its numbers exactly):
//
//   norm                        norm input                                   2sbh   (each)
//   attention (self)            QKV input 2sbh · Q, K 4sbh · V 2sbh · out-proj input 2sbh
//                               · residual-dropout mask sbh                  11sbh
//                               naive: softmax 2as²b · its dropout mask as²b · dropout output 2as²b
//                                                                            + 5as²b
//                               flash: log-sum-exp, fp32 per head and token  + 4asb
//   MLP (GeLU)                  fc1 input 2sbh · GeLU input 2sbf · fc2 input 2sbf · mask sbh
//                                                                            19sbh at f = 4h
//   gated MLP (SwiGLU)          input 2sbh · gate and up outputs 4sbf · down input 2sbf · mask sbh
//   mixture of experts          router input 2sbh · router probabilities 4sbE (fp32) · per routed
//                               token (R = k·T dropless, E·⌈C·k·T/E⌉ with capacity factor C):
//                               expert input 2h, its MLP's tensors, expert output 2h · mask sbh
//   cross-attention             as attention with s_kv key/value tokens; the encoder output that
//                               feeds every key/value projection is one entry, saved once
//
// Transients (alive only while one instance runs; `temporaries` / `comm_buffers` of the phase):
// naive attention's raw scores (forward) and the gradients of scores and probabilities (backward,
// 2·as²b/t); FlashAttention-2's fp32 dQ accumulator; the MLP's inner gradients; the logits, their
// upcast and their gradient at the loss; in every backward the gradient arriving at the output and
// the one written for the input; a block's sub-layer output before its residual add; the
// sequence-parallel all-gather of a layer's input (sbh), context parallelism's double-buffered
// key/value ring, expert parallelism's all-to-all receive buffer, a pipeline stage's send/receive
// buffer.
//
// so a block holds sbh(34 + 5as/h) — Table 2, "no parallelism". Tensor parallelism splits what
// lies between the column- and row-parallel projections (Q, K, V, the attention core, out-proj
// input, MLP inner tensors) by t; the rest (10sbh: norm inputs, QKV and fc1 inputs, masks) is
// replicated unless sequence parallelism splits it too: sbh(10 + 24/t + 5as/(ht)) and
// sbh(34/t + 5as/(ht)) (Table 2). GQA: flash saves K and V at kv heads; naive attention saves them
// expanded to a heads (Megatron's and Hugging Face's unfused paths repeat them before the matmul).
#pragma once

#include <cstdint>

#include "memalg/plan/stacks/common.hpp"

namespace memalg {
namespace detail {

/// One attention sub-layer. `kv_seq`: key/value tokens per sequence; `cross`: its key/value
/// projection input is the encoder output (an entry of its own, not counted here).
constexpr attention_bytes attention_sublayer(const act_terms& a, const layer_shape& s, std::uint64_t kv_seq,
                                             bool cross, bool residual_dropout) {
  attention_bytes r{};
  const bool flash = (s.flags & layer_flags::flash) != 0;
  const std::uint64_t b = a.c.micro_batch, T = a.tokens;
  const std::uint64_t q_width = checked_mul(s.heads, s.head_dim);
  const std::uint64_t kv_width = checked_mul(flash ? s.kv_heads : s.heads, s.head_dim);
  const std::uint64_t kv_tokens = checked_mul(b, ceil_div(kv_seq, a.c.cp));
  // Scores per rank: b · a · (s/c) query rows · s_kv keys.
  const std::uint64_t scores = checked_mul(checked_mul(b, s.heads), checked_mul(ceil_div(a.seq, a.c.cp), kv_seq));
  const bool drop = s.dropout_permille != 0;

  r.saved.weight_grad += a.rep(a.values_per_token(s.hidden));  // QKV (cross: Q) projection input
  r.saved.input_grad += a.split(a.values_per_token(q_width));  // Q
  r.saved.input_grad += a.split(a.values(checked_mul(kv_tokens, kv_width))) * 2;  // K, V
  if (flash) {
    r.saved.core += a.split(bytes{checked_mul(checked_mul(T, s.heads), 4)});  // log-sum-exp, fp32
    // FlashAttention-2 accumulates dQ in fp32 during backward (flash_attn `dq_accum`).
    r.backward_temporary = a.split(bytes{checked_mul(checked_mul(T, q_width), 4)});
  } else {
    r.saved.core += a.split(a.values(scores));  // softmax output
    if (drop) {
      r.saved.core += a.split(bytes{scores});      // its dropout mask
      r.saved.core += a.split(a.values(scores));   // dropout output (input of the product with V)
    }
    r.forward_temporary = a.split(a.values(scores));           // raw scores before the softmax
    r.backward_temporary = a.split(a.values(scores)) * 2;      // gradients of probabilities and scores
  }
  r.saved.weight_grad += a.split(a.values_per_token(q_width));  // out-projection input
  if (residual_dropout && drop) r.saved.input_grad += a.rep(bytes{checked_mul(T, s.hidden)});
  (void)cross;
  if (a.c.sp) r.comm += a.values_per_token(s.hidden);  // all-gathered input
  if (a.c.cp > 1)  // ring attention: K and V chunks, double-buffered
    r.comm += a.split(a.values(checked_mul(kv_tokens, checked_mul(s.kv_heads, s.head_dim)))) * 4;
  return r;
}

/// A GeLU or gated MLP over `rows` token rows (T, or the routed tokens of an expert layer).
constexpr mlp_bytes mlp_sublayer(const act_terms& a, std::uint64_t rows, std::uint64_t hidden, std::uint64_t ffn,
                                 bool gated) {
  mlp_bytes r{};
  const std::uint64_t inner = checked_mul(rows, ffn);
  r.saved.weight_grad += a.rep(a.values(checked_mul(rows, hidden)));  // fc1 (gate/up) input
  r.saved.input_grad += a.split(a.values(checked_mul(inner, gated ? 2 : 1)));  // GeLU input / gate and up outputs
  r.saved.weight_grad += a.split(a.values(inner));                     // fc2 (down) input
  r.backward_temporary = a.split(a.values(inner)) * (gated ? 2 : 1);   // gradients of the inner tensors
  if (a.c.sp) r.comm += a.values(checked_mul(rows, hidden));
  return r;
}

constexpr mlp_bytes moe_sublayer(const act_terms& a, const layer_shape& s) {
  const std::uint64_t T = a.tokens, R = routed_tokens(s, T);
  mlp_bytes r = mlp_sublayer(a, R, s.hidden, s.ffn, (s.flags & layer_flags::gated) != 0);
  r.saved.weight_grad += a.rep(a.values_per_token(s.hidden));                    // router input
  r.saved.input_grad += a.rep(bytes{checked_mul(checked_mul(T, s.experts), 4)});  // router probabilities (fp32)
  r.saved.input_grad += a.rep(a.values(checked_mul(R, s.hidden)));               // expert outputs, for the combine
  if (a.c.ep > 1) r.comm += a.rep(a.values(checked_mul(R, s.hidden)));           // all-to-all receive buffer
  return r;
}

constexpr bytes residual_mask(const act_terms& a, const layer_shape& s) {
  return s.dropout_permille != 0 ? a.rep(bytes{checked_mul(a.tokens, s.hidden)}) : bytes{};
}

/// A transformer block's bytes, with its self-attention's and its MLP's (the MLP's with the
/// residual-dropout mask), which the memalg stack's block reads again.
struct paper_block_bytes {
  raw_activations r{};
  attention_bytes self{};
  mlp_bytes mlp{};
};

constexpr paper_block_bytes paper_block(const act_terms& a, const layer_shape& s) {
  paper_block_bytes out{};
  raw_activations& r = out.r;
  const bytes hidden_input = a.rep(a.values_per_token(s.hidden));
  const bytes gradients = hidden_input * 2;
  const bool cross = (s.flags & layer_flags::cross_attention) != 0;
  r.parts.norms.input_grad = hidden_input * (cross ? 3 : 2);
  out.self = attention_sublayer(a, s, a.seq, false, true);
  const attention_bytes& self = out.self;
  r.parts.attention = self.saved;
  bytes fwd = self.forward_temporary, bwd = self.backward_temporary, comm = self.comm;
  if (cross) {
    const attention_bytes x =
        attention_sublayer(a, s, s.kv_sequence != 0 ? s.kv_sequence : a.seq, true, true);
    r.parts.cross_attention = x.saved;
    fwd = max_b(fwd, x.forward_temporary);
    bwd = max_b(bwd, x.backward_temporary);
    comm = max_b(comm, x.comm);
  }
  mlp_bytes m = (s.flags & layer_flags::moe) != 0 ? moe_sublayer(a, s)
                                                 : mlp_sublayer(a, a.tokens, s.hidden, s.ffn,
                                                                (s.flags & layer_flags::gated) != 0);
  m.saved.input_grad += residual_mask(a, s);
  r.parts.mlp = m.saved;
  r.saved = r.parts.total();
  r.forward_temporary = max_b(fwd, hidden_input);  // a sub-layer's output before the residual add
  r.backward_temporary = max_b(bwd, m.backward_temporary) + gradients;
  r.comm = max_b(comm, m.comm);
  r.input = hidden_input;
  r.input_in_saved = true;
  out.mlp = m;
  return out;
}

/// One instance of `l` under the paper's accounting.
constexpr raw_activations paper_activations(const layer_desc& l, const activation_context& c) {
  raw_activations r{};
  const layer_shape& s = l.shape;
  const act_terms a(c, s);
  if (a.tokens == 0) return r;
  const bytes hidden_input = a.rep(a.values_per_token(s.hidden));
  // Every backward holds the gradient arriving at the entry's output and the one it writes for its input.
  const bytes gradients = hidden_input * 2;
  switch (l.kind) {
    case layer_kind::parameters:
      break;
    case layer_kind::embedding:
    case layer_kind::position_embedding:
      // Backward needs only the token ids (ignored: 4–8 bytes per token) and the arriving gradient.
      r.backward_temporary = hidden_input;
      break;
    case layer_kind::layernorm:
    case layer_kind::rmsnorm:
      r.saved.input_grad = hidden_input;  // per-token mean / rstd (4–8 bytes) ignored, as in §4.1
      r.input = hidden_input;
      r.input_in_saved = true;
      r.backward_temporary = gradients;
      break;
    case layer_kind::dropout:
      r.saved.input_grad = s.dropout_permille != 0 ? a.rep(bytes{checked_mul(a.tokens, s.hidden)}) : bytes{};
      r.input = hidden_input;
      r.backward_temporary = gradients;
      break;
    case layer_kind::linear:
    case layer_kind::conv1d: {
      r.saved.weight_grad = a.rep(a.values_per_token(s.in));
      if ((s.flags & layer_flags::batchnorm) != 0) r.saved.input_grad += a.rep(a.values_per_token(s.out));
      if ((s.flags & layer_flags::activation) != 0) r.saved.input_grad += a.rep(a.values_per_token(s.out));
      if (s.dropout_permille != 0) r.saved.input_grad += a.rep(bytes{checked_mul(a.tokens, s.out)});
      r.input = r.saved.weight_grad;
      r.input_in_saved = true;
      r.input_serves_weight_grad = true;
      r.backward_temporary = a.rep(a.values_per_token(s.in)) + a.rep(a.values_per_token(s.out));
      break;
    }
    case layer_kind::attention:
    case layer_kind::mlp:
    case layer_kind::gated_mlp:
    case layer_kind::moe: {
      // A sub-layer as an entry of its own, whose input is its first projection's.
      attention_bytes x{};
      if (l.kind == layer_kind::attention) {
        x = attention_sublayer(a, s, s.kv_sequence != 0 ? s.kv_sequence : a.seq, false, false);
        r.parts.attention = x.saved;
      } else {
        const mlp_bytes m = l.kind == layer_kind::moe
                                ? moe_sublayer(a, s)
                                : mlp_sublayer(a, a.tokens, s.hidden, s.ffn, l.kind == layer_kind::gated_mlp);
        x.saved = r.parts.mlp = m.saved;
        x.backward_temporary = m.backward_temporary;
        x.comm = m.comm;
      }
      r.saved = x.saved;
      r.forward_temporary = x.forward_temporary;
      r.backward_temporary = x.backward_temporary + gradients;
      r.comm = x.comm;
      r.input = hidden_input;
      r.input_in_saved = true;
      r.input_serves_weight_grad = true;
      break;
    }
    case layer_kind::transformer_block:
      return paper_block(a, s).r;
    case layer_kind::output: {
      const dtype logits = s.logits.is_none() ? dtypes::fp32 : s.logits;
      const std::uint64_t vocab =  // vocabulary-parallel unless replicated
          (s.flags & layer_flags::vocab_replicated) != 0 ? s.vocab : ceil_div(s.vocab, c.tp);
      r.saved.weight_grad = hidden_input;  // output-projection input (chunked: the hidden gradient)
      r.input = hidden_input;
      r.input_in_saved = true;
      r.input_serves_weight_grad = true;
      r.logits = storage_bytes(logits, checked_mul(a.tokens, vocab));
      if (s.chunk != 0 && s.chunk < a.tokens) {
        // Chunked loss: one chunk's logits and their gradient at a time, during forward.
        r.forward_temporary = storage_bytes(logits, checked_mul(s.chunk, vocab)) * 2;
      } else {
        // The projection writes activation-dtype logits, upcast to the logits dtype; the loss
        // keeps them, and backward allocates their gradient (PyTorch cross_entropy; Megatron's
        // fused vocab-parallel kernel works in place and needs one copy less).
        r.forward_temporary = r.logits;
        if (logits.bits != c.act.bits) r.forward_temporary += a.values(checked_mul(a.tokens, vocab));
        r.backward_temporary = r.logits * 2;
      }
      r.backward_temporary += hidden_input;  // the gradient it sends back
      if (c.sp) r.comm = a.values_per_token(s.hidden);
      break;
    }
    case layer_kind::custom:
      r.saved.input_grad = a.rep(a.values_per_token(s.saved_per_token));
      r.input = r.saved.input_grad;
      r.input_in_saved = true;
      break;
  }
  return r;
}

}  // namespace detail
}  // namespace memalg

// SPDX-License-Identifier: BSL-1.0
// memalg/plan/activations.hpp — saved activations and transient buffers of every layer, and what a
// pipeline stage holds of them over a step.
//
// Notation: s tokens per sequence (of the entry), b micro-batch, h hidden, a heads, d head width,
// kv key/value heads, f MLP width, v vocabulary, t tensor-parallel degree, c context-parallel
// degree, e bytes of one activation element (the policy's activation dtype). Masks are 1 byte per
// element. T = b·s/c is the tokens one rank processes.
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
// Context parallelism splits the sequence: every term by c, naive scores are (s/c)·s per head.
//
// Recomputation (Table 2 and §5): selective drops the attention core (5as²b naive; the
// log-sum-exp with flash) — sbh(10 + 24/t) and sbh·34/t. Full keeps each layer's input, 2sbh
// (2sbh/t under sequence parallelism, where the input is sequence-split), and rebuilds one layer's
// saved set in backward (a transient). every:K keeps the input of every K-th layer and rebuilds K
// layers at a time (Megatron's uniform method with recompute_num_layers = K; every:1 = full).
// Recomputation applies to repeated entries (the transformer layers), as in Megatron.
//
// Frozen layers: backward needs a frozen layer's tensors only to carry the gradient to trainable
// layers before it. So a frozen entry keeps nothing when no trainable entry precedes it, and
// otherwise drops the inputs of its matrix products (they serve only weight gradients) and keeps
// the rest. QLoRA's frozen base keeps them (its adapters need the same inputs).
//
// A stage holds the saved activations of the micro-batches in flight (Narayanan et al. 2021,
// Korthikanti et al. §4.2.3): 1F1B min(m, p − i) on stage i; GPipe all m; the interleaved
// schedule with v model chunks min(m·v, v·p + p − 2i − 1) chunk-micro-batches of 1/v of the stage
// (Megatron's warm-up count + 1), which on the first stage is p·(1 + (p−1)/(p·v)) — the paper's
// factor. m = gradient-accumulation micro-batches; with p = 1 one micro-batch is in flight
// whatever m is: accumulation adds no activations (its gradient buffer is the persistent one).
// memalg's own runtime holds those micro-batches in a stash of fixed slots for the whole step
// (see activations_on_stage), so under a pipeline its stages hold the whole stash at every moment.
#pragma once

#include <array>
#include <cstdint>

#include "memalg/core/bytes.hpp"
#include "memalg/core/dtype.hpp"
#include "memalg/device/device.hpp"
#include "memalg/model/layer.hpp"
#include "memalg/parallel/mesh.hpp"
#include "memalg/plan/breakdown.hpp"
#include "memalg/plan/model_states.hpp"
#include "memalg/train/recipe.hpp"

namespace memalg {

/// What the activation algebra reads of the recipe and the mesh.
struct activation_context {
  std::uint64_t micro_batch = 1;
  std::uint64_t sequence = 0;
  dtype act = dtypes::bf16;
  std::uint64_t tp = 1;
  std::uint64_t cp = 1;
  std::uint64_t ep = 1;
  bool sp = false;
  stack_kind stack = stack_kind::pytorch;
  recompute_kind recompute = recompute_kind::none;
  dtype weights = dtypes::bf16;  ///< the policy's weight dtype (pytorch: autocast when wider than `act`)
  bool cpu = false;              ///< the device is the host CPU (pytorch: its kernels' choices)
  constexpr bool reference() const { return stack == stack_kind::memalg; }
  constexpr bool pytorch() const { return stack == stack_kind::pytorch; }
  /// torch.autocast: weights wider than the activations (fp32 weights, bf16/fp16 matrix products).
  constexpr bool autocast() const { return weights.bits > act.bits; }
};

constexpr activation_context activation_context_of(const training_desc& t, const mesh_desc& m) {
  activation_context c{};
  c.micro_batch = t.micro_batch;
  c.sequence = t.sequence;
  c.act = t.precision.activations.is_none() ? t.precision.weights : t.precision.activations;
  c.tp = m.tp;
  c.cp = m.cp;
  c.ep = m.ep;
  c.sp = m.sequence_parallel;
  c.stack = t.stack;
  c.recompute = t.recompute;
  c.weights = t.precision.weights;
  return c;
}
constexpr activation_context activation_context_of(const training_desc& t, const mesh_desc& m, const device_desc& d) {
  activation_context c = activation_context_of(t, m);
  c.cpu = d.host;
  return c;
}

/// Saved bytes of one instance, by why backward keeps them.
struct saved_bytes {
  bytes weight_grad{};  ///< inputs of matrix products: needed only for their weight gradients
  bytes input_grad{};   ///< needed to carry the gradient: norm and nonlinearity inputs, masks, Q/K/V
  bytes core{};         ///< attention core that selective recomputation rebuilds
  constexpr bytes total() const { return weight_grad + input_grad + core; }
  friend constexpr saved_bytes operator+(saved_bytes a, const saved_bytes& b) {
    a.weight_grad += b.weight_grad;
    a.input_grad += b.input_grad;
    a.core += b.core;
    return a;
  }
};

/// A block's saved bytes grouped as Korthikanti et al. §4.1 (residual-dropout masks with their
/// sub-layer): attention 11sbh + 5as²b, MLP 19sbh, norms 4sbh.
struct block_parts {
  saved_bytes norms{};
  saved_bytes attention{};
  saved_bytes cross_attention{};
  saved_bytes mlp{};
  constexpr saved_bytes total() const { return norms + attention + cross_attention + mlp; }
};

/// One instance of an entry for one micro-batch.
struct layer_activations {
  bytes saved{};               ///< kept from forward to backward without recomputation
  bytes selective{};           ///< kept under selective recomputation
  bytes input{};               ///< the instance's input: the checkpoint of full / every-K recomputation
  bool input_in_saved = false; ///< the input is itself one of the saved tensors
  bool backward = false;       ///< backward runs through the instance
  bytes forward_temporary{};   ///< alive only inside its forward: raw attention scores, logits
  bytes backward_temporary{};  ///< alive only inside its backward: score gradients, logits and their gradient
  bytes recompute_core{};      ///< the attention core (rebuilt in backward under selective recomputation)
  bytes comm{};                ///< communication buffers while it runs: SP all-gather, CP key/value ring, EP all-to-all
  bytes held_until_loss{};     ///< a teacher's logits, kept until the distillation loss
  bytes loss_temporary{};      ///< pytorch output layer: the loss's backward, before any gradient exists
  bytes backward_released{};   ///< memalg's runtime: saved bytes its backward frees before its transients
  bytes forward_released{};    ///< memalg's runtime: its own saved bytes it frees before its forward's transients
  bytes backward_tail{};       ///< memalg's runtime: a second phase of its backward (none when 0), its transients
  bytes tail_released{};       ///< memalg's runtime: saved bytes freed before that second phase
};

namespace detail {

/// Bytes of the tensors of one entry under one context.
struct act_terms {
  activation_context c{};
  std::uint64_t seq = 0;     ///< the entry's tokens per sequence
  std::uint64_t tokens = 0;  ///< T = b·s/c
  constexpr act_terms(const activation_context& ctx, const layer_shape& s)
      : c(ctx), seq(s.sequence != 0 ? s.sequence : ctx.sequence), tokens(0) {
    tokens = detail::checked_mul(c.micro_batch, ceil_div(seq, c.cp));
  }
  constexpr bytes values(std::uint64_t n) const { return storage_bytes(c.act, n); }
  constexpr bytes values_per_token(std::uint64_t width) const { return values(checked_mul(tokens, width)); }
  /// Outside the tensor-parallel region: replicated, sequence-split under sequence parallelism.
  constexpr bytes rep(bytes b) const { return c.sp ? b.shard(c.tp) : b; }
  /// Inside it: split by the tensor-parallel degree.
  constexpr bytes split(bytes b) const { return b.shard(c.tp); }
};

struct attention_bytes {
  saved_bytes saved{};
  bytes forward_temporary{};
  bytes backward_temporary{};
  bytes comm{};
};

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
  if (a.c.reference()) {
    // memalg's runtime: scores never exist as a whole (its kernels go row by row); backward holds
    // the gradients of the attention output and of Q/K/V, and under selective recomputation the
    // output the rebuilding forward writes again (the core itself is added as rebuilt).
    r.forward_temporary = bytes{};
    r.backward_temporary = a.split(a.values_per_token(q_width)) +
                           a.split(a.values(checked_mul(T, q_width))) +
                           a.split(a.values(checked_mul(kv_tokens, kv_width))) * 2;
    if (a.c.recompute == recompute_kind::selective) r.backward_temporary += a.split(a.values_per_token(q_width));
  }
  if (a.c.sp) r.comm += a.values_per_token(s.hidden);  // all-gathered input
  if (a.c.cp > 1)  // ring attention: K and V chunks, double-buffered
    r.comm += a.split(a.values(checked_mul(kv_tokens, checked_mul(s.kv_heads, s.head_dim)))) * 4;
  return r;
}

struct mlp_bytes {
  saved_bytes saved{};
  bytes backward_temporary{};
  bytes comm{};
};

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

/// Tokens routed to experts: k·T dropless, E·⌈C·k·T/E⌉ with a capacity factor C (GShard,
/// Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021).
constexpr std::uint64_t routed_tokens(const layer_shape& s, std::uint64_t tokens) {
  const std::uint64_t routed = checked_mul(tokens, s.top_k);
  if (s.capacity_factor_percent == 0 || s.experts == 0) return routed;
  return checked_mul(s.experts, ceil_div(checked_mul(routed, s.capacity_factor_percent), checked_mul(100, s.experts)));
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

constexpr bytes max_b(bytes x, bytes y) { return x < y ? y : x; }

/// Everything about one instance before the trainable / frozen rule is applied.
struct raw_activations {
  saved_bytes saved{};
  block_parts parts{};
  bytes input{};
  bool input_in_saved = false;
  bool input_serves_weight_grad = false;  ///< the input is saved only for a weight gradient
  bytes forward_temporary{};
  bytes backward_temporary{};
  bytes comm{};
  bytes logits{};  ///< output layer: the logits of a whole micro-batch (a teacher keeps them)
  bytes loss_temporary{};  ///< pytorch output layer: the loss's backward before any gradient exists
  bool handled = true;     ///< pytorch_activations: false when the kind follows the paper accounting
  bytes backward_released{};  ///< memalg's runtime: saved bytes the backward frees before its transients
  bytes forward_released{};   ///< memalg's runtime: its own saved bytes freed before its forward's transients
  bytes backward_tail{};      ///< memalg's runtime: the transients of a second phase of the backward
  bytes tail_released{};      ///< memalg's runtime: saved bytes freed before that phase
};

/// The `pytorch` stack: the tensors PyTorch's autograd saves for Hugging Face's modelling code,
/// and the transients of its loss (docs/algebra.md, "The pytorch stack", with the autograd
/// formula or modelling file of every term; checked against bench/torch/measured.json). Bytes:
/// `em` the activation dtype (matrix-product outputs, attention, MLP inner tensors), `en` the
/// residual stream and norms (the weight dtype under autocast, else `em`), RMSNorm's input copy
/// fp32 (HF's RMSNorm upcasts), per-token statistics and the log-sum-exp fp32. Kinds other than
/// the embeddings, norms, dropout, transformer blocks and the output follow the paper accounting
/// (`handled` false).
constexpr std::uint64_t bytes_per_element_ceil(const dtype& d) { return d.bits <= 8 ? 1 : ceil_div(d.bits, 8); }
struct torch_bytes {
  std::uint64_t em = 4, en = 4;
  std::uint64_t mask = 1;  ///< a dropout mask's bytes per element: CUDA's bool, the CPU's noise in the input dtype
  bool autocast = false;
};
constexpr torch_bytes torch_bytes_of(const activation_context& c) {
  torch_bytes t{};
  t.em = bytes_per_element_ceil(c.act);
  t.autocast = c.autocast();
  t.en = t.autocast ? bytes_per_element_ceil(c.weights) : t.em;
  t.mask = c.cpu ? t.en : 1;
  return t;
}

/// Saved bytes of one norm beyond its input: RMSNorm keeps its rsqrt (fp32 per token) and
/// x·rstd and w·(x·rstd) (under autocast only x·rstd, fp32; the products' inputs are cast
/// copies); LayerNorm keeps mean and rstd per token and its output (under autocast only the
/// statistics, fp32). `consumers`: projections reading the output, each keeping a cast copy under
/// autocast.
constexpr bytes torch_norm(const act_terms& a, const torch_bytes& t, bool rms, std::uint64_t hidden,
                           std::uint64_t consumers) {
  const std::uint64_t H = checked_mul(a.tokens, hidden);
  bytes r{};
  if (rms) {
    r += bytes{checked_mul(a.tokens, 4)};
    r += t.autocast ? bytes{checked_mul(H, 4)} : bytes{checked_mul(H, 2 * t.em)};
  } else {
    r += bytes{checked_mul(a.tokens, 2 * (t.autocast ? 4 : t.em))};
    if (!t.autocast) r += bytes{checked_mul(H, t.en)};
  }
  if (t.autocast) r += bytes{checked_mul(checked_mul(H, consumers), t.em)};
  return a.rep(r);
}

/// The residual-stream tensor a norm reads, as kept: fp32 for RMSNorm (its upcast copy), else the
/// stream's own dtype.
constexpr std::uint64_t torch_residual_bytes(const torch_bytes& t, bool rms) { return rms ? 4 : t.en; }

/// Attention of a block under the pytorch stack: saved bytes, forward and backward transients.
constexpr attention_bytes torch_attention(const act_terms& a, const torch_bytes& t, const layer_shape& s,
                                          std::uint64_t kv_seq) {
  attention_bytes r{};
  const std::uint64_t b = a.c.micro_batch, T = a.tokens, em = t.em;
  const std::uint64_t q = checked_mul(s.heads, s.head_dim), kv = checked_mul(s.kv_heads, s.head_dim);
  const std::uint64_t Q = checked_mul(T, q), K = checked_mul(checked_mul(b, ceil_div(kv_seq, a.c.cp)), kv);
  const std::uint64_t S = checked_mul(checked_mul(b, s.heads), checked_mul(ceil_div(a.seq, a.c.cp), kv_seq));
  const bool drop = s.dropout_permille != 0;
  const bool rotary = (s.flags & layer_flags::rotary) != 0, fused = (s.flags & layer_flags::fused_qkv) != 0;
  // Eager attention, SDPA's math path (taken with dropout on the CPU, and by Falcon-7B's layout):
  // the fp32 softmax (and its cast when narrower), the query, the expanded key and value (repeat_kv)
  // and the output's contiguous copy for the out-projection; with dropout its mask and output.
  // On CUDA, SDPA's fused kernels apply dropout inside (saving their RNG offsets only).
  const bool unfused = (s.flags & layer_flags::flash) == 0 || (s.flags & layer_flags::unfused_attention) != 0 ||
                       (drop && a.c.cpu);
  if (unfused) {
    bytes saved{checked_mul(S, 4)};
    if (em != 4) saved += bytes{checked_mul(S, em)};
    if (drop) saved += bytes{checked_mul(S, t.mask + em)};  // dropout mask and output
    r.saved.core = a.split(saved);
    r.saved.input_grad = a.split(bytes{checked_mul(checked_mul(Q, 3), em)});  // query, expanded key and value
    r.saved.weight_grad = a.split(bytes{checked_mul(Q, em)});               // out-projection input
    r.forward_temporary = a.split(bytes{checked_mul(S, 4)});                 // raw scores, masked
    r.backward_temporary = a.split(bytes{checked_mul(S, 8)});                // gradients of probabilities and scores
  } else {
    // SDPA (flash / memory-efficient): its query, key and value and output, fp32 log-sum-exp. A
    // fused projection's output is one storage that Q, K and V view; rotary positions save the
    // rotated copies of Q and K (and, when V stays a strided view, the output's contiguous copy).
    std::uint64_t elems = fused ? Q + 2 * K : rotary ? K : Q + 2 * K;
    if (rotary) elems += Q + K;
    if (fused && rotary) elems += Q;
    r.saved.input_grad = a.split(bytes{checked_mul(elems, em)});
    r.saved.weight_grad = a.split(bytes{checked_mul(Q, em)});                          // output
    r.saved.core = a.split(bytes{checked_mul(checked_mul(T, s.heads), 4)});             // log-sum-exp
    r.backward_temporary = a.split(bytes{checked_mul(checked_mul(Q + 2 * K, em), 1)});  // dQ, dK, dV
  }
  if (a.c.sp) r.comm += a.values_per_token(s.hidden);
  return r;
}

/// The MLP of a block under the pytorch stack (per instance): SwiGLU keeps gate, up, SiLU and
/// their product; GPT-2's gelu_new keeps the first projection's output and four elementwise
/// results of its formula; a fused GeLU keeps its input and output. Mixtral's grouped experts
/// (transformers' moe.py) keep the routed copies of their inputs and outputs and the routing
/// tables; the router its fp32 probabilities.
constexpr mlp_bytes torch_mlp(const act_terms& a, const torch_bytes& t, const layer_shape& s) {
  mlp_bytes r{};
  const std::uint64_t T = a.tokens, em = t.em, f = s.ffn, h = s.hidden;
  const bool gated = (s.flags & layer_flags::gated) != 0;
  if ((s.flags & layer_flags::moe) != 0) {
    const std::uint64_t R = routed_tokens(s, T), E = s.experts, k = s.top_k;
    std::uint64_t e = checked_mul(checked_mul(R, f), (gated ? 4 : 2) * em);  // gate-up output, SiLU, product
    e += checked_mul(checked_mul(R, h), 2 * em);                           // routed input and output copies
    e += checked_mul(checked_mul(T, E), 4) + checked_mul(T, 12 * k + 4);   // router softmax, top-k, weights
    e += checked_mul(R, 29) + checked_mul(E, 4);                           // sort, indices, masks, counts
    r.saved.input_grad = a.split(bytes{e});
    r.backward_temporary = a.split(bytes{checked_mul(checked_mul(R, f), 3 * em)});
    return r;
  }
  const std::uint64_t F = checked_mul(T, f);
  const std::uint64_t inner = gated ? 4 : (s.flags & layer_flags::gelu_tanh) != 0 ? 5 : 2;
  r.saved.input_grad = a.split(bytes{checked_mul(F, (inner - 1) * em)});
  r.saved.weight_grad = a.split(bytes{checked_mul(F, em)});  // down-projection input
  r.backward_temporary = a.split(bytes{checked_mul(F, (gated ? 3 : 2) * em)});
  if (a.c.sp) r.comm += a.values_per_token(h);
  return r;
}

constexpr raw_activations pytorch_activations(const layer_desc& l, const activation_context& c) {
  raw_activations r{};
  const layer_shape& s = l.shape;
  const act_terms a(c, s);
  const torch_bytes t = torch_bytes_of(c);
  const std::uint64_t T = a.tokens, H = checked_mul(T, s.hidden);
  const bytes stream = a.rep(bytes{checked_mul(H, t.en)});
  switch (l.kind) {
    case layer_kind::embedding:
    case layer_kind::position_embedding:
      // Backward needs the token ids only; the output is the first block's input (kept there).
      r.backward_temporary = stream;
      break;
    case layer_kind::dropout:
      // CUDA's native_dropout keeps a bool mask; the CPU's dropout its scaled noise in the
      // input's dtype (docs/accuracy.md, "What only CUDA adds").
      if (s.dropout_permille != 0) r.saved.input_grad = a.rep(bytes{checked_mul(H, t.mask)});
      r.input = stream;
      r.backward_temporary = stream * 2;
      break;
    case layer_kind::layernorm:
    case layer_kind::rmsnorm: {
      const bool rms = l.kind == layer_kind::rmsnorm;
      r.saved.input_grad = a.rep(bytes{checked_mul(H, torch_residual_bytes(t, rms))}) + torch_norm(a, t, rms, s.hidden, 1);
      r.input = stream;
      r.input_in_saved = !rms || t.en == 4;
      r.backward_temporary = stream * 2;
      break;
    }
    case layer_kind::transformer_block: {
      const bool rms = (s.flags & layer_flags::rms_norm) != 0, gated = (s.flags & layer_flags::gated) != 0;
      const bool parallel = (s.flags & layer_flags::parallel_residual) != 0;
      const bool shared = (s.flags & layer_flags::shared_norm) != 0;
      const bool cross = (s.flags & layer_flags::cross_attention) != 0;
      const bool fused = (s.flags & layer_flags::fused_qkv) != 0;
      // The residual-stream tensors the block's norms read: its input, and the sum after attention
      // unless attention and MLP read the same input.
      const std::uint64_t residuals = (parallel ? 1 : 2) + (cross ? 1 : 0);
      r.parts.norms.input_grad = a.rep(bytes{checked_mul(checked_mul(H, residuals), torch_residual_bytes(t, rms))});
      const std::uint64_t into_mlp = (s.flags & layer_flags::moe) != 0 ? 2 : gated ? 2 : 1;
      const std::uint64_t into_attention = fused ? 1 : 3;
      if (shared) {
        r.parts.norms.input_grad += torch_norm(a, t, rms, s.hidden, into_attention + into_mlp);
      } else {
        r.parts.norms.input_grad += torch_norm(a, t, rms, s.hidden, into_attention);
        r.parts.norms.input_grad += torch_norm(a, t, rms, s.hidden, into_mlp);
      }
      const attention_bytes self = torch_attention(a, t, s, a.seq);
      r.parts.attention = self.saved;
      bytes fwd = self.forward_temporary, bwd = self.backward_temporary, comm = self.comm;
      if (cross) {
        r.parts.norms.input_grad += torch_norm(a, t, rms, s.hidden, 1);
        const attention_bytes x = torch_attention(a, t, s, s.kv_sequence != 0 ? s.kv_sequence : a.seq);
        r.parts.cross_attention = x.saved;
        fwd = max_b(fwd, x.forward_temporary);
        bwd = max_b(bwd, x.backward_temporary);
        comm = max_b(comm, x.comm);
      }
      const mlp_bytes m = torch_mlp(a, t, s);
      r.parts.mlp = m.saved;
      if (s.dropout_permille != 0 && (s.flags & layer_flags::residual_dropout) != 0)
        r.parts.mlp.input_grad += a.rep(bytes{checked_mul(H, 2 * t.mask)});  // the attention and MLP output dropouts' masks
      if (t.autocast)  // autocast's cached bf16/fp16 copies of the block's weights, saved by its products
        r.parts.mlp.weight_grad +=
            bytes{checked_mul(ceil_div(l.params - l.tp_replicated_params, c.tp) + l.tp_replicated_params, t.em)};
      r.saved = r.parts.total();
      r.input = stream;
      r.input_in_saved = torch_residual_bytes(t, rms) == t.en;
      r.forward_temporary = max_b(fwd, stream);
      r.backward_temporary = max_b(bwd, m.backward_temporary) + stream * 2;
      r.comm = max_b(comm, m.comm);
      break;
    }
    case layer_kind::output: {
      // HF's loss upcasts the logits (`logits.float()`) and PyTorch's cross_entropy keeps the
      // log-softmax (fp32) for its backward, which first writes the NLL gradient and then the
      // log-softmax gradient, both fp32 and logits-sized, before any parameter gradient exists.
      // The projection's backward then holds the logits' gradient (and its cast), the input's.
      const std::uint64_t vocab =
          (s.flags & layer_flags::vocab_replicated) != 0 ? s.vocab : ceil_div(s.vocab, c.tp);
      const std::uint64_t TV = checked_mul(T, vocab);
      const bytes log_softmax{checked_mul(TV, 4)};
      if (t.autocast) {  // the input's cast and the weight's cached copy, saved by the product
        r.saved.weight_grad = a.rep(bytes{checked_mul(H, t.em)}) + bytes{checked_mul(checked_mul(vocab, s.hidden), t.em)};
      }
      r.input = stream;
      r.input_serves_weight_grad = true;
      r.logits = bytes{checked_mul(TV, t.em)};
      r.forward_temporary = r.logits + log_softmax + (t.em != 4 ? log_softmax : bytes{});
      r.loss_temporary = log_softmax * 3;
      r.backward_temporary = log_softmax + (t.em != 4 ? r.logits : bytes{}) + a.rep(bytes{checked_mul(H, t.em)});
      if (c.sp) r.comm = a.values_per_token(s.hidden);
      break;
    }
    default:
      r.handled = false;
      break;
  }
  return r;
}

/// The `megatron` stack: Megatron-core's GPT layers with Transformer Engine (docs/algebra.md, "The
/// megatron stack", with the file of every term; checked against Megatron-LM's golden values,
/// bench/megatron/golden.json). TE's fused LayerNorm-Linear keeps the norm's input and output
/// and fp32 mean / rstd; the fused attention keeps contiguous Q, K, V (K and V at the key/value
/// heads), its output and fp32 softmax statistics, no scores; the bias-dropout-add keeps a bool
/// mask; the MLP the GeLU's input and output (SwiGLU: the gated projection's output and the down
/// projection's input). The loss (vocabulary-parallel cross entropy) holds the bf16 logits and
/// their fp32 copy and works in place. Other kinds follow the paper accounting.
constexpr raw_activations megatron_activations(const layer_desc& l, const activation_context& c) {
  raw_activations r{};
  const layer_shape& s = l.shape;
  const act_terms a(c, s);
  const std::uint64_t em = bytes_per_element_ceil(c.act);
  const std::uint64_t T = a.tokens, H = checked_mul(T, s.hidden);
  const bytes stream = a.rep(bytes{checked_mul(H, em)});
  const bool drop = s.dropout_permille != 0;
  switch (l.kind) {
    case layer_kind::dropout:  // the embeddings' dropout: a bool mask
      if (drop) r.saved.input_grad = a.rep(bytes{H});
      r.input = stream;
      r.backward_temporary = stream * 2;
      break;
    case layer_kind::layernorm:
    case layer_kind::rmsnorm:  // the final norm: its input and fp32 statistics (its output is the output layer's input)
      r.saved.input_grad = stream + a.rep(bytes{checked_mul(T, l.kind == layer_kind::rmsnorm ? 4 : 8)});
      r.input = stream;
      r.input_in_saved = true;
      r.backward_temporary = stream * 2;
      break;
    case layer_kind::transformer_block: {
      if ((s.flags & layer_flags::flash) == 0 || (s.flags & layer_flags::cross_attention) != 0) {
        r.handled = false;  // Megatron's unfused attention and cross-attention: the paper's accounting
        break;
      }
      const bool rms = (s.flags & layer_flags::rms_norm) != 0, gated = (s.flags & layer_flags::gated) != 0;
      const std::uint64_t q = checked_mul(s.heads, s.head_dim), kv = checked_mul(s.kv_heads, s.head_dim);
      // Two LayerNorm-Linear modules (QKV, FC1): input, normalised output, fp32 mean and rstd (rstd only for RMSNorm).
      const bytes norm_linear = stream * 2 + a.rep(bytes{checked_mul(T, rms ? 4 : 8)});
      r.parts.norms.input_grad = norm_linear * 2;
      r.parts.attention.input_grad = a.split(bytes{checked_mul(checked_mul(T, q + 2 * kv), em)});  // Q, K, V
      r.parts.attention.weight_grad = a.split(bytes{checked_mul(checked_mul(T, q), em)});           // output
      r.parts.attention.core = a.split(bytes{checked_mul(checked_mul(T, s.heads), 4)});              // softmax statistics
      if (drop) r.parts.attention.input_grad += a.rep(bytes{H});  // the attention's bias-dropout-add mask
      const std::uint64_t F = checked_mul(T, s.ffn);
      r.parts.mlp.input_grad = a.split(bytes{checked_mul(F, (gated ? 2 : 1) * em)});  // the activation's input
      r.parts.mlp.weight_grad = a.split(bytes{checked_mul(F, em)});                  // the down projection's input
      if (drop) r.parts.mlp.input_grad += a.rep(bytes{H});
      r.saved = r.parts.total();
      r.input = stream;
      r.input_in_saved = true;
      r.forward_temporary = stream;
      r.backward_temporary = a.split(bytes{checked_mul(F, (gated ? 3 : 2) * em)}) + stream * 2;
      if (c.sp) r.comm = a.values_per_token(s.hidden);
      break;
    }
    case layer_kind::output: {
      const std::uint64_t vocab =
          (s.flags & layer_flags::vocab_replicated) != 0 ? s.vocab : ceil_div(s.vocab, c.tp);
      const std::uint64_t TV = checked_mul(T, vocab);
      r.saved.weight_grad = a.rep(bytes{checked_mul(H, em)});  // ColumnParallelLinear's input
      r.input = r.saved.weight_grad;
      r.input_in_saved = true;
      r.input_serves_weight_grad = true;
      r.logits = bytes{checked_mul(TV, em)};
      // The logits and their fp32 copy (cross_entropy.py: the softmax is computed in place in the
      // copy and kept); the dataloader's causal mask [b, 1, s, s] (bool) lives through the
      // forward step. Backward: the fp32 gradient and its cast, the input's gradient.
      const bytes mask{checked_mul(c.micro_batch, checked_mul(a.seq, a.seq))};
      r.forward_temporary = bytes{checked_mul(TV, em + 4)} + mask;
      r.backward_temporary = bytes{checked_mul(TV, em + 4)} + a.rep(bytes{checked_mul(H, em)});
      if (c.sp) r.comm = a.values_per_token(s.hidden);
      break;
    }
    default:
      r.handled = false;
      break;
  }
  return r;
}

constexpr raw_activations raw_layer_activations(const layer_desc& l, const activation_context& c) {
  if (c.stack == stack_kind::megatron) {
    const raw_activations p = megatron_activations(l, c);
    if (p.handled) return p;
  }
  if (c.pytorch()) {
    const raw_activations p = pytorch_activations(l, c);
    if (p.handled) return p;
  }
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
      // Backward needs only the token ids (ignored: 4–8 bytes per token) and the arriving gradient
      // (memalg's runtime still holds both of its gradient buffers there).
      // memalg's runtime also keeps the embeddings' output (the first residual) until its
      // embedding backward has run (backend/cpu/gpt_trainer.hpp pops it last).
      r.backward_temporary = c.reference() ? gradients + hidden_input : hidden_input;
      // memalg's runtime under sequence parallelism: a vocabulary-parallel lookup writes every
      // token's row (zero outside the rank's vocabulary) before its reduce-scatter to the rank's
      // tokens, and its backward all-gathers the arriving gradient back to every token — one
      // [b·s, h] buffer each way (Megatron-LM's VocabParallelEmbedding followed by
      // scatter_to_sequence_parallel_region, whose backward is the all-gather).
      if (c.reference() && c.sp && l.kind == layer_kind::embedding && l.tp_replicated_params != l.params)
        r.comm = a.values_per_token(s.hidden);
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
      if (c.reference()) {
        // memalg's runtime releases the entry's own tensors as its backward reads them for the
        // last time (the dropout mask, the nonlinearity's output, the batch norm's input), before
        // the product's backward writes the input's gradient: the entry's worst moment is its
        // first (all its tensors and the arriving gradient) or its last (the input, the two
        // gradients) — exec/build_speech_program.hpp, net_backward.
        const bytes out = a.rep(a.values_per_token(s.out)), in = a.rep(a.values_per_token(s.in));
        const bytes own = r.saved.total() - r.input;
        r.backward_temporary = own < in ? out + in - own : out;
      }
      break;
    }
    case layer_kind::attention: {
      const attention_bytes at = attention_sublayer(a, s, s.kv_sequence != 0 ? s.kv_sequence : a.seq, false, false);
      r.saved = at.saved;
      r.parts.attention = at.saved;
      r.forward_temporary = at.forward_temporary;
      r.backward_temporary = at.backward_temporary + gradients;
      r.comm = at.comm;
      r.input = hidden_input;
      r.input_in_saved = true;
      r.input_serves_weight_grad = true;
      break;
    }
    case layer_kind::mlp:
    case layer_kind::gated_mlp: {
      const mlp_bytes m = mlp_sublayer(a, a.tokens, s.hidden, s.ffn, l.kind == layer_kind::gated_mlp);
      r.saved = m.saved;
      r.parts.mlp = m.saved;
      r.backward_temporary = m.backward_temporary + gradients;
      r.comm = m.comm;
      r.input = hidden_input;
      r.input_in_saved = true;
      r.input_serves_weight_grad = true;
      break;
    }
    case layer_kind::moe: {
      const mlp_bytes m = moe_sublayer(a, s);
      r.saved = m.saved;
      r.parts.mlp = m.saved;
      r.backward_temporary = m.backward_temporary + gradients;
      r.comm = m.comm;
      r.input = hidden_input;
      r.input_in_saved = true;
      r.input_serves_weight_grad = true;
      break;
    }
    case layer_kind::transformer_block: {
      const bool cross = (s.flags & layer_flags::cross_attention) != 0;
      r.parts.norms.input_grad = hidden_input * (cross ? 3 : 2);
      const attention_bytes self = attention_sublayer(a, s, a.seq, false, true);
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
      // memalg's runtime also writes a norm's input gradient beside the two gradient buffers.
      if (c.reference()) r.backward_temporary = max_b(max_b(bwd, m.backward_temporary), hidden_input) + gradients;
      // Under selective recomputation the rebuilt core lives only inside the attention backward
      // (the stage adds it to the whole entry's backward): for gated (SwiGLU) blocks the attention
      // branch carries it, so an MLP backward that is larger does not count it again.
      if (c.reference() && c.recompute == recompute_kind::selective && (s.flags & layer_flags::gated) != 0 &&
          (s.flags & layer_flags::moe) == 0) {
        const bytes core = self.saved.core;
        r.backward_temporary = max_b(max_b(bwd + core, m.backward_temporary), hidden_input) + gradients - core;
      }
      if (c.reference() && (s.flags & layer_flags::parallel_residual) != 0 && (s.flags & layer_flags::moe) == 0 && !cross) {
        // memalg's parallel block (exec/build_program.hpp): y = x + attn(ln1(x)) + mlp(ln2(x)),
        // or one shared norm. Saved: the input alone of the residual stream (no sum after
        // attention), and with a shared norm one norm output (the QKV input serves FC1 too). Forward
        // holds x + attn in a transient through the MLP branch (the sequential block's sub-layer
        // output, hidden_input). Backward runs the out-projection's first and holds its input
        // gradient d(attention_out) through the MLP branch and the MLP norm's backward; with a
        // shared norm the attention's gradient of the norm output waits beside the slot's through
        // the core's and QKV's backward. Selective recomputation rebuilds the core inside the
        // attention backward only.
        const bool shared = (s.flags & layer_flags::shared_norm) != 0;
        const std::uint64_t q_width = detail::checked_mul(s.heads, s.head_dim);
        const bytes datty = a.split(a.values_per_token(q_width));
        r.parts.norms.input_grad = hidden_input;
        if (shared) r.parts.mlp.weight_grad -= hidden_input;
        r.saved = r.parts.total();
        const bytes core = c.recompute == recompute_kind::selective ? self.saved.core : bytes{};
        const bytes attention_side = bwd + core + (shared ? hidden_input : bytes{});
        const bytes mlp_side = datty + max_b(m.backward_temporary, hidden_input);
        // In two phases: the MLP side, then the attention side (the stage adds a rebuilt core to
        // the second only), which runs after the MLP's tensors and the attention's dropout mask,
        // read for the last time, are released (the MLP's mask went first: the two are alike).
        r.backward_temporary = mlp_side + gradients;
        r.backward_tail = attention_side - core + gradients;
        r.tail_released = r.parts.mlp.total();
      } else if (c.reference() && (s.flags & layer_flags::moe) == 0 && !cross) {
        // memalg's sequential block (exec/build_program.hpp, block_backward) runs its backward in
        // two phases: the MLP branch and ln2 (the MLP's inner gradient, then ln2's input gradient),
        // then the attention branch and ln1 (the attention output's and Q/K/V's gradients, with
        // the core rebuilt under selective recomputation, then ln1's input gradient). Between
        // them it releases what only the first read: the MLP's saved tensors and the sum after
        // attention (ln2's input). The stage adds a rebuilt core to the second phase only.
        const bytes core = c.recompute == recompute_kind::selective ? self.saved.core : bytes{};
        r.backward_temporary = max_b(m.backward_temporary, hidden_input) + gradients;
        r.backward_tail = max_b(bwd + core, hidden_input) - core + gradients;
        r.tail_released = m.saved.total() - residual_mask(a, s) + hidden_input;
      }
      // memalg's runtime releases the MLP's residual-dropout mask as soon as the backward's first
      // op (the dropout) has read it, before any of the block's transients: the block's output
      // went before its backward, so the mask is the top of the saved tensors
      // (exec/build_program.hpp, release_mlp_mask). The stage takes it out of the block's backward.
      if (c.reference() && (s.flags & layer_flags::moe) == 0 && !cross) r.backward_released = residual_mask(a, s);
      r.comm = max_b(comm, m.comm);
      r.input = hidden_input;
      r.input_in_saved = true;
      break;
    }
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
      if (c.reference()) {
        // memalg's runtime: logits in the activation dtype become their gradient in place (a
        // fused classifier, as llm.c's); per-token losses are O(tokens) scratch. Chunked: one
        // chunk's rows at a time (exec/build_program.hpp), each projected, turned into its
        // gradient in place and sent back into the hidden gradient before the next chunk.
        const std::uint64_t rows = s.chunk != 0 && s.chunk < a.tokens ? s.chunk : a.tokens;
        r.forward_temporary = a.values(checked_mul(rows, vocab));
        r.backward_temporary = r.forward_temporary + hidden_input;
      }
      if (c.sp) r.comm = a.values_per_token(s.hidden);
      // memalg's runtime under sequence parallelism: the all-gathered rows are the projection's
      // input for its forward and both its gradients, so its saved input (this rank's rows of the
      // final norm's output) goes once gathered, before the logits exist
      // (exec/build_program.hpp, micro_batch).
      if (c.reference() && c.sp) r.forward_released = r.backward_released = hidden_input;
      break;
    }
    case layer_kind::custom:
      r.saved.input_grad = a.rep(a.values_per_token(s.saved_per_token));
      // memalg's runtime keeps an encoder output's gradient beside it from its forward on: every
      // cross-attention's key/value projection adds into it (exec/build_speech_program.hpp).
      if (c.reference() && (s.flags & layer_flags::encoder_output) != 0) r.saved.input_grad += a.rep(a.values_per_token(s.hidden));
      r.input = r.saved.input_grad;
      r.input_in_saved = true;
      break;
  }
  return r;
}

}  // namespace detail

/// The §4.1 breakdown of a transformer block (or the one part of an attention / MLP entry), for
/// one instance and one micro-batch, before any recomputation.
constexpr block_parts sublayer_activations(const layer_desc& l, const activation_context& c) {
  return detail::raw_layer_activations(l, c).parts;
}

/// Saved and transient bytes of one instance of `l`, one micro-batch. `gradient_flows_in`: some
/// entry before it (in forward order) is trainable, so backward must pass through it.
constexpr layer_activations layer_activation_bytes(const layer_desc& l, const activation_context& c,
                                                   bool gradient_flows_in) {
  const detail::raw_activations r = detail::raw_layer_activations(l, c);
  layer_activations a{};
  a.forward_temporary = r.forward_temporary;
  a.comm = r.comm;
  if (l.group == layer_group::teacher) {
    // Forward only, without autograd: its tensors live one layer at a time; its logits stay
    // until the distillation loss.
    a.forward_temporary = r.saved.total() + r.forward_temporary;
    a.held_until_loss = r.logits;
    return a;
  }
  const bool trains = l.trainable || (l.shape.flags & layer_flags::adapted) != 0;
  if (!trains && !gradient_flows_in) return a;  // no backward through it
  saved_bytes kept = r.saved;
  if (!trains) kept.weight_grad = bytes{};
  a.saved = kept.total();
  a.selective = kept.weight_grad + kept.input_grad;
  a.recompute_core = kept.core;
  a.input = r.input;
  a.input_in_saved = r.input_in_saved && (trains || !r.input_serves_weight_grad);
  a.backward = true;
  a.backward_temporary = r.backward_temporary;
  a.loss_temporary = r.loss_temporary;
  a.backward_released = r.backward_released;
  a.forward_released = r.forward_released;
  a.backward_tail = r.backward_tail;
  a.tail_released = r.tail_released;
  // (a frozen block keeps no inputs of its products: the phase has fewer of them to free)
  if (!trains && a.tail_released > bytes{}) a.tail_released -= r.parts.mlp.weight_grad;
  return a;
}

/// Per-instance activations of every entry, in model order (computed once per plan; stages only
/// multiply them).
struct activation_table {
  layer_activations entries[max_model_entries]{};  ///< a built-in array, as model_desc::entries
  std::size_t size = 0;
  bytes stage_boundary{};  ///< a pipeline send/receive buffer: one hidden-state tensor
};

/// The context is taken by value: g++ memoizes a constexpr call whose arguments are constants, so
/// in a compile-time search the configurations that differ only in what activations do not read
/// (ZeRO stage, pipeline degree, offload) share one table.
constexpr activation_table activation_table_of(const model_desc& model, const activation_context c) {
  activation_table table{};
  bool gradient_flows = false;
  for (std::size_t i = 0; i < model.size; ++i) {
    const layer_desc& l = model.entries[i];
    table.entries[i] = layer_activation_bytes(l, c, gradient_flows);
    if (l.group != layer_group::teacher && (l.trainable && l.params != 0)) gradient_flows = true;
    if ((l.shape.flags & layer_flags::adapted) != 0) gradient_flows = true;
    if (l.kind != layer_kind::parameters && l.shape.hidden != 0 && l.group != layer_group::teacher) {
      const detail::act_terms a(c, l.shape);
      table.stage_boundary = detail::max_b(table.stage_boundary, a.rep(a.values_per_token(l.shape.hidden)));
    }
  }
  table.size = model.size;
  if (c.reference()) {
    // memalg's runtime keeps the embeddings' dropout mask until the embedding backward too.
    bytes mask{};
    for (std::size_t i = 0; i < model.size; ++i) {
      const layer_desc& l = model.entries[i];
      if (l.kind == layer_kind::transformer_block) break;
      if (l.kind == layer_kind::dropout && table.entries[i].backward) mask += table.entries[i].saved;
    }
    for (std::size_t i = 0; i < model.size; ++i) {
      const layer_kind k = model.entries[i].kind;
      if (k == layer_kind::embedding || k == layer_kind::position_embedding) table.entries[i].backward_temporary += mask;
    }
  }
  if (c.reference()) {
    // memalg's runtime on a regression head (the speech decoder, exec/build_speech_program.hpp):
    // a linear layer whose output is wider than the next entry's input (the mel ‖ stop projection
    // before the post-net) keeps its output's gradient from its forward on — the stop logits turn
    // into their gradient at once, the mel gradient sums the losses before and after the post-net;
    // and the model's last layer, when it is no output layer, holds its output (the frames the loss
    // reads) through its forward.
    for (std::size_t i = 0; i + 1 < model.size; ++i) {
      const layer_desc& l = model.entries[i];
      const layer_desc& next = model.entries[i + 1];
      const bool narrower = (next.kind == layer_kind::linear || next.kind == layer_kind::conv1d) && next.shape.in < l.shape.out;
      if (l.kind != layer_kind::linear || !narrower || !table.entries[i].backward) continue;
      const detail::act_terms a(c, l.shape);
      const bytes g = a.rep(a.values_per_token(l.shape.out));
      table.entries[i].saved += g;
      table.entries[i].selective += g;
    }
    if (model.size > 0) {
      const layer_desc& l = model.entries[model.size - 1];
      if ((l.kind == layer_kind::linear || l.kind == layer_kind::conv1d) && l.group != layer_group::teacher) {
        const detail::act_terms a(c, l.shape);
        table.entries[model.size - 1].forward_temporary += a.rep(a.values_per_token(l.shape.out));
      }
    }
  }
  if (c.pytorch()) {
    // Tensors of the whole model that every block's backward reads: rotary embeddings' cos and
    // sin (one sequence, broadcast over the batch), and under checkpointing the materialised
    // causal mask of eager attention, an input every checkpointed block keeps.
    const detail::torch_bytes t = detail::torch_bytes_of(c);
    bytes shared{};
    bool rotary = false, mask = false;
    for (std::size_t i = 0; i < model.size; ++i) {
      const layer_desc& l = model.entries[i];
      if (l.kind != layer_kind::transformer_block || l.group == layer_group::teacher) continue;
      const detail::act_terms a(c, l.shape);
      if ((l.shape.flags & layer_flags::rotary) != 0 && !rotary) {
        rotary = true;
        const std::uint64_t rd = l.shape.rotary_dim != 0 ? l.shape.rotary_dim : l.shape.head_dim;
        shared += bytes{detail::checked_mul(detail::checked_mul(detail::ceil_div(a.seq, c.cp), rd), 2 * t.en)};
      }
      const bool full = c.recompute == recompute_kind::full || c.recompute == recompute_kind::every_k;
      if (full && (l.shape.flags & layer_flags::flash) == 0 && (l.shape.flags & layer_flags::causal) != 0 && !mask) {
        mask = true;
        shared += bytes{detail::checked_mul(detail::checked_mul(c.micro_batch, detail::checked_mul(detail::ceil_div(a.seq, c.cp), a.seq)), t.en)};
      }
    }
    for (std::size_t i = 0; i < model.size; ++i)
      if (model.entries[i].kind == layer_kind::embedding && table.entries[i].backward) {
        table.entries[i].saved += shared;
        table.entries[i].selective += shared;
        break;
      }
  }
  return table;
}
constexpr activation_table activation_table_of(const model_desc& model, const training_desc& t, const mesh_desc& m) {
  return activation_table_of(model, activation_context_of(t, m));
}

/// Chunk-micro-batches whose activations stage `stage` holds at its peak (see the header): with
/// v = 1 this is micro-batches.
constexpr std::uint64_t chunks_in_flight(const mesh_desc& m, std::uint64_t micro_batches, std::uint64_t stage) {
  if (m.pp <= 1) return 1;
  const std::uint64_t mb = micro_batches == 0 ? 1 : micro_batches;
  switch (m.schedule) {
    case pipeline_schedule::gpipe: return mb;
    case pipeline_schedule::one_f_one_b: {
      const std::uint64_t ahead = m.pp - stage;
      return ahead < mb ? ahead : mb;
    }
    case pipeline_schedule::interleaved: {
      const std::uint64_t v = m.virtual_stages;
      const std::uint64_t warmup = 2 * (m.pp - stage - 1) + (v - 1) * m.pp;
      const std::uint64_t total = detail::checked_mul(mb, v);
      return warmup + 1 < total ? warmup + 1 : total;
    }
  }
  return 1;
}

/// Device activation bytes of one stage at its forward and backward high-water marks.
struct stage_activations {
  breakdown forward{};    ///< activations, temporaries and comm_buffers at the forward peak
  breakdown backward{};   ///< the same at the backward peak
  bytes host{};           ///< saved activations offloaded to host memory
  bytes per_micro_batch{};  ///< saved activations of one micro-batch on the stage
  std::uint64_t chunks_in_flight = 1;
};

namespace detail {
/// The largest moment of a sweep so far: its activations, temporaries and communication buffers,
/// and their sum. (Three counts rather than a breakdown: this runs for every entry of every plan,
/// and in a constant expression each of a breakdown's eight members is an object of its own.)
/// One entry's gradients on a rank: what it keeps (the ZeRO-2/3 shard, all instances) and one
/// instance's full gradient (before an FSDP reduce-scatter).
struct entry_gradients {
  bytes shard{};
  bytes full{};
};

struct peak_moment {
  bytes activations{};
  bytes temporaries{};
  bytes comm{};
  bytes gradients{};  ///< pytorch: the gradients that exist at the moment
  bytes total{};
  constexpr void offer(bytes a, bytes t, bytes c, bytes g = bytes{}) {
    const bytes sum = a + t + c + g;
    if (sum > total) *this = peak_moment{a, t, c, g, sum};
  }
  constexpr breakdown as_breakdown() const {
    breakdown b{};
    b.activations = activations;
    b.temporaries = temporaries;
    b.comm_buffers = comm;
    b.gradients = gradients;
    return b;
  }
};
}  // namespace detail

namespace detail {
/// memalg's runtime gathers (ZeRO-3) and reduce-scatters (ZeRO-2/3) one unit at a time: during an
/// entry's forward its own gathered weights are resident, during its backward also its own
/// unsharded gradient. A tied output layer works on the token embedding's weights.
struct unit_transients {
  bytes forward{};
  bytes backward{};
};
constexpr unit_transients entry_unit_transients(const model_desc& model, const layer_desc& l, const training_desc& t,
                                                const mesh_desc& m) {
  unit_transients u{};
  if (t.stack != stack_kind::memalg || m.zero_stage < 2) return u;
  const layer_desc* owner = &l;
  if (l.kind == layer_kind::output && (l.shape.flags & layer_flags::tied) != 0)
    for (const layer_desc& e : model)
      if (e.kind == layer_kind::embedding) owner = &e;
  const precision_policy& p = t.precision;
  if (l.kind == layer_kind::embedding || l.kind == layer_kind::position_embedding) {
    // The runtime runs the token and position embeddings as one unit pair: forward gathers both
    // (ZeRO-3), backward holds both unsharded gradients at once and gathers nothing
    // (backend/cpu/gpt_trainer.hpp: embedding_backward). So either entry's moment holds both.
    for (const layer_desc& e : model) {
      if (e.kind != layer_kind::embedding && e.kind != layer_kind::position_embedding) continue;
      const std::uint64_t n = elements_per_rank(e, m).total();
      const dtype wdt = e.weight_storage.is_none() ? p.weights : e.weight_storage;
      if (m.zero_stage >= 3) u.forward += storage_bytes(wdt, n) * (1 + m.zero3_prefetch);
      if (e.trainable) u.backward += storage_bytes(p.gradients, n);
    }
    return u;
  }
  const std::uint64_t elements = elements_per_rank(*owner, m).total();
  const dtype wdt = owner->weight_storage.is_none() ? p.weights : owner->weight_storage;
  const bytes gathered = m.zero_stage >= 3 ? storage_bytes(wdt, elements) * (1 + m.zero3_prefetch) : bytes{};
  u.forward = gathered;
  u.backward = gathered + (owner->trainable ? storage_bytes(p.gradients, elements) : bytes{});
  return u;
}
}  // namespace detail

/// Does the model's output layer share the token embedding's weights?
constexpr bool tied_embedding(const model_desc& model) {
  for (const layer_desc& l : model)
    if (l.kind == layer_kind::output && (l.shape.flags & layer_flags::tied) != 0) return true;
  return false;
}

/// The forward sweep (saved tensors accumulate entry by entry, each entry's transients on top)
/// and the backward sweep (the loss's buffers first, then entries in reverse, each freeing its
/// saved tensors after its backward) of the newest micro-batch, on top of the earlier micro-batches
/// in flight. Recomputation and offload as in the header.
constexpr stage_activations activations_on_stage(const model_desc& model, const activation_table& table,
                                                 const training_desc& t, const mesh_desc& m, std::uint64_t stage) {
  stage_activations out{};
  detail::peak_moment forward{}, backward{};
  bytes kept[max_model_entries]{};     // per entry on this stage, one micro-batch
  bytes rebuilt[max_model_entries]{};  // recomputed in backward (transient)
  std::uint64_t held[max_model_entries]{};  // instances on this stage
  bytes total{}, largest_instance{}, teacher_logits{};
  const recompute_kind rk = t.recompute;
  for (std::size_t i = 0; i < model.size; ++i) {
    const layer_desc& l = model.entries[i];
    const layer_activations& a = table.entries[i];
    const std::uint64_t n = held[i] = instances_on_stage(l, stage, m.pp);
    if (n == 0 || l.place == placement::spread) continue;
    if (l.group == layer_group::teacher) {
      teacher_logits += a.held_until_loss;
      continue;
    }
    if (!a.backward) continue;
    bytes one = a.saved;
    const bool layer = l.place == placement::repeated;
    const bytes reuse = a.input_in_saved ? a.input : bytes{};
    if (rk == recompute_kind::selective) {
      one = a.selective;
      rebuilt[i] = a.recompute_core;
    }
    if (layer && rk == recompute_kind::full) {
      one = a.input;
      rebuilt[i] = a.saved - reuse;
    }
    if (layer && rk == recompute_kind::every_k) {
      const std::uint64_t k = t.recompute_every == 0 ? 1 : t.recompute_every;
      // Segments of k layers from the first, the last one shorter when k does not divide n.
      // Backward rebuilds them last to first; segment j runs with the inputs of segments 0..j
      // still kept, so the worst moment is the last segment (all inputs kept) or the one before
      // it (one input fewer, k layers rebuilt).
      const std::uint64_t segments = detail::ceil_div(n, k);
      const std::uint64_t last = n - (segments - 1) * k;
      kept[i] = a.input * segments;
      const bytes last_segment = a.saved * last;
      const bytes full_segment = segments > 1 ? a.saved * k - a.input : bytes{};
      rebuilt[i] = detail::max_b(last_segment, full_segment) - reuse;
      one = a.input;
    } else {
      kept[i] = one * n;
    }
    largest_instance = detail::max_b(largest_instance, one);
    total += kept[i];
  }
  out.per_micro_batch = total;
  const std::uint64_t v = m.schedule == pipeline_schedule::interleaved ? m.virtual_stages : 1;
  const std::uint64_t chunks = chunks_in_flight(m, t.grad_accum, stage);
  out.chunks_in_flight = chunks;
  // The stage's saved bytes times chunks/v, rounded up; the newest micro-batch's own share is
  // what the sweeps below add entry by entry.
  const bytes at_end{detail::ceil_div(detail::checked_mul(total.value, chunks), v)};
  const bytes prior = at_end - total;
  const bytes boundary = m.pp > 1 ? table.stage_boundary : bytes{};
  // Offload: the host holds every saved tensor; the device a window of two instances (the one
  // being written and the one in transfer).
  const bool offload = t.offload_activations;
  const bytes window = largest_instance * 2;
  // memalg's runtime under a pipeline (exec/build_program.hpp) keeps the stage's micro-batches in
  // a stash of `chunks` slots pushed once for the step, micro-batch i in slot i mod chunks, each
  // slot holding one micro-batch's saved tensors from its forward to its backward: so every
  // moment holds the whole stash, not only the tensors the newest micro-batch still needs (1F1B
  // keeps at most p − i micro-batches in flight on stage i: Narayanan et al. 2021, §2.2;
  // Megatron-LM's schedules.py, forward_backward_pipelining_without_interleaving, whose
  // input_tensors / output_tensors queues hold num_warmup_microbatches + 1 entries).
  const bool stash = t.stack == stack_kind::memalg && m.pp > 1;
  const auto on_device = [&](bytes saved) {
    if (stash) return at_end;
    return offload && window < saved ? window : saved;
  };
  // ZeRO-2/3 units of memalg's runtime (else nothing: skip the call, as this loop runs per plan).
  const bool units = t.stack == stack_kind::memalg && m.zero_stage >= 2;
  // pytorch: gradients exist from backward on (zero_grad(set_to_none=True)); entry i's appear in
  // its backward. With accumulation they exist from the first micro-batch's backward on, and each
  // backward adds a new gradient into them.
  const bool torch = t.stack == stack_kind::pytorch;
  // (Computed entry by entry where needed: arrays of byte counts cost a constant evaluation more
  // than the arithmetic.)
  const auto grads_of = [&](std::size_t i) {
    detail::entry_gradients g{};
    const layer_desc& l = model.entries[i];
    if (held[i] == 0 || !l.trainable || l.group == layer_group::teacher) return g;
    const rank_elements e = elements_per_rank(l, m);
    const std::uint64_t group = m.dp * m.cp;
    const std::uint64_t shard =
        m.zero_stage >= 2 ? detail::ceil_div(e.dense, group) + detail::ceil_div(e.expert, group / m.ep) : e.total();
    g.shard = storage_bytes(t.precision.gradients, shard) * held[i];
    g.full = storage_bytes(t.precision.gradients, e.total());
    return g;
  };
  bytes all_grads{}, tied_weight_grad{}, tied_grads{};
  std::size_t tied_entry = model.size;
  if (torch) {
    if (t.grad_accum > 1)
      for (std::size_t i = 0; i < model.size; ++i) all_grads += grads_of(i).shard;
    if (tied_embedding(model))
      for (std::size_t i = 0; i < model.size; ++i)
        if (model.entries[i].kind == layer_kind::embedding && held[i] != 0 && model.entries[i].trainable) {
          const detail::entry_gradients g = grads_of(i);
          tied_weight_grad = g.full;
          tied_grads = g.shard;
          tied_entry = i;
          break;
        }
  }
  const bool tied_model = torch && tied_entry < model.size && tied_weight_grad > bytes{};
  const bool accumulating = torch && t.grad_accum > 1;
  const bytes forward_grads = accumulating ? all_grads : bytes{};
  if (offload) out.host = at_end;

  // Teachers run first, between earlier micro-batches' saved tensors and the student's forward.
  for (std::size_t i = 0; i < model.size; ++i) {
    const layer_desc& l = model.entries[i];
    if (l.group != layer_group::teacher || held[i] == 0) continue;
    const layer_activations& a = table.entries[i];
    forward.offer(on_device(prior), a.forward_temporary, a.comm + boundary);
  }
  bytes cumulative{};
  for (std::size_t i = 0; i < model.size; ++i) {
    const layer_desc& l = model.entries[i];
    if (l.group == layer_group::teacher || l.place == placement::spread || held[i] == 0) continue;
    const layer_activations& a = table.entries[i];
    cumulative += kept[i];
    bytes temporary = a.forward_temporary + teacher_logits;
    if (units) temporary += detail::entry_unit_transients(model, l, t, m).forward;
    if (rk == recompute_kind::selective) temporary += a.recompute_core;  // computed, then dropped
    bytes saved = on_device(prior + cumulative);
    if (!stash && !offload) saved -= a.forward_released;  // (memalg's runtime, see raw_layer_activations)
    forward.offer(saved, temporary, a.comm + boundary, forward_grads);
  }
  bytes done{};  // pytorch: gradients of the entries whose backward has run
  for (std::size_t j = model.size; j-- > 0;) {
    const layer_desc& l = model.entries[j];
    if (l.group == layer_group::teacher || l.place == placement::spread || held[j] == 0) continue;
    const layer_activations& a = table.entries[j];
    if (a.backward) {
      bytes temporary = a.backward_temporary + rebuilt[j];
      if (l.kind == layer_kind::output) temporary += teacher_logits;
      if (units) temporary += detail::entry_unit_transients(model, l, t, m).backward;
      bytes gradients{};
      if (torch) {
        const bool tied = l.kind == layer_kind::output && (l.shape.flags & layer_flags::tied) != 0;
        if (l.kind == layer_kind::output && a.loss_temporary > bytes{})  // the loss's backward comes first
          backward.offer(on_device(prior + cumulative), a.loss_temporary + teacher_logits, a.comm + boundary,
                         accumulating ? all_grads : done);
        // A tied output projection writes the embedding's gradient (which exists from then on);
        // the embedding's own backward adds its dense gradient to it out of place (two more of
        // its size for a moment).
        const bool tied_embedding_entry = tied_model && j == tied_entry;
        const detail::entry_gradients g = grads_of(j);
        if (tied && tied_model) temporary += tied_weight_grad;
        if (tied_embedding_entry) temporary += tied_weight_grad * 2;
        if (m.zero_stage >= 2) temporary += g.full;  // FSDP: the unit's full gradient before its reduce-scatter
        const bytes own = tied_embedding_entry ? bytes{} : g.shard;
        // A repeated entry's instances run their backward one after another: the first holds
        // every instance's saved tensors and one instance's gradients, the last one instance's
        // saved tensors and all their gradients; the moments in between lie below one of them.
        const std::uint64_t n = held[j];
        if (n > 1) {
          const bytes one_grad{detail::ceil_div(own.value, n)};
          const bytes one_kept{detail::ceil_div(kept[j].value, n)};
          backward.offer(on_device(prior + cumulative), temporary, a.comm + boundary,
                         (accumulating ? all_grads : done) + one_grad);
          backward.offer(on_device(prior + cumulative - kept[j] + one_kept), temporary, a.comm + boundary,
                         (accumulating ? all_grads : done) + own);
        } else {
          gradients = accumulating ? all_grads + own : done + own;
          backward.offer(on_device(prior + cumulative), temporary, a.comm + boundary, gradients);
        }
        done += own;
        if (tied && tied_model) done += tied_grads;
      } else {
        // memalg's runtime frees some saved bytes as its backward begins (a block's MLP dropout
        // mask, see raw_layer_activations); the whole backward after that holds the rest. Rebuilt
        // by recomputation they are the backward's temporaries; in a pipeline's stash or offloaded
        // they stay where they are.
        // A backward in two phases (backward_tail) frees more before its second, which alone
        // holds a core rebuilt by selective recomputation.
        const bytes saved = on_device(prior + cumulative);
        const bool release = !stash && !offload;
        const bool rebuilt_layer = l.place == placement::repeated &&
                                   (rk == recompute_kind::full || rk == recompute_kind::every_k);
        const auto moment = [&](bytes temps, bytes freed) {
          if (!release) freed = bytes{};
          if (rebuilt_layer) backward.offer(saved, temps - freed, a.comm + boundary, gradients);
          else backward.offer(saved - freed, temps, a.comm + boundary, gradients);
        };
        if (a.backward_tail > bytes{}) {
          moment(rk == recompute_kind::selective ? temporary - rebuilt[j] : temporary, a.backward_released);
          moment(temporary - a.backward_temporary + a.backward_tail, a.backward_released + a.tail_released);
        } else {
          moment(temporary, a.backward_released);
        }
      }
    }
    cumulative -= kept[j];
  }
  out.forward = forward.as_breakdown();
  out.backward = backward.as_breakdown();
  return out;
}

/// One row of the per-layer table: bytes of ONE instance on the most loaded rank.
struct layer_row {
  std::string_view name{};
  layer_kind kind = layer_kind::parameters;
  std::uint64_t count = 0;  ///< instances the rank holds
  bytes weights{};          ///< device weight bytes of one instance
  bytes activations{};      ///< saved bytes of one instance for one micro-batch, recomputation applied
};

struct layer_rows {
  std::array<layer_row, max_model_entries> rows{};
  std::size_t size = 0;
  constexpr const layer_row* begin() const { return rows.data(); }
  constexpr const layer_row* end() const { return rows.data() + size; }
};

/// The per-layer table of `stage` (entries the stage does not hold have count 0).
constexpr layer_rows layer_table(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                 std::uint64_t stage, const device_desc& d = device_desc{}) {
  layer_rows out{};
  const activation_table table = activation_table_of(model, activation_context_of(t, m, d));
  for (std::size_t i = 0; i < model.size; ++i) {
    const layer_desc& l = model.entries[i];
    layer_row& r = out.rows[out.size++];
    r.name = l.name;
    r.kind = l.kind;
    r.count = instances_on_stage(l, stage, m.pp);
    model_desc one{};
    layer_desc single = l;
    single.count = 1;
    if (single.place != placement::spread) single.place = placement::first_stage;
    one.push(single);
    r.weights = model_states(one, t, m, 0).device.weights;
    const layer_activations& a = table.entries[i];
    if (!a.backward) continue;
    const bool layer = l.place == placement::repeated;
    switch (t.recompute) {
      case recompute_kind::none: r.activations = a.saved; break;
      case recompute_kind::selective: r.activations = a.selective; break;
      case recompute_kind::full:
      case recompute_kind::every_k: r.activations = layer ? a.input : a.saved; break;
    }
  }
  return out;
}

}  // namespace memalg

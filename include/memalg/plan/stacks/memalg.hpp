// SPDX-License-Identifier: BSL-1.0
// memalg/plan/stacks/memalg.hpp — the `memalg` stack: the exact profile of memalg's own runtime
// (exec/gpt/build_program.hpp, exec/speech/build_program.hpp, exec/lowering.hpp), which
// docs/runtime.md checks against its measured arena. It is the paper's accounting
// (stacks/paper.hpp) with the runtime's deviations, each below with the code it follows: no
// attention scores (row-by-row kernels), the gradient buffers every backward holds, a block's
// backward in two phases with the tensors released between them, the fused classifier's
// in-place logits, and ZeRO's per-unit gathers and gradients.
#pragma once

#include <cstdint>

#include "memalg/plan/model_states.hpp"
#include "memalg/plan/stacks/common.hpp"
#include "memalg/plan/stacks/paper.hpp"

namespace memalg {
namespace detail {

/// The transients of one attention sub-layer's backward. `kv_seq`: key/value tokens per sequence.
/// memalg's runtime: scores never exist as a whole (its kernels go row by row); backward holds
/// the gradients of the attention output and of Q/K/V, and under selective recomputation the
/// output the rebuilding forward writes again (the core itself is added as rebuilt).
constexpr bytes memalg_attention_backward(const act_terms& a, const layer_shape& s, std::uint64_t kv_seq) {
  const bool flash = (s.flags & layer_flags::flash) != 0;
  const std::uint64_t T = a.tokens;
  const std::uint64_t q_width = checked_mul(s.heads, s.head_dim);
  const std::uint64_t kv_width = checked_mul(flash ? s.kv_heads : s.heads, s.head_dim);
  const std::uint64_t kv_tokens = checked_mul(a.c.micro_batch, ceil_div(kv_seq, a.c.cp));
  bytes r = a.split(a.values_per_token(q_width)) + a.split(a.values(checked_mul(T, q_width))) +
            a.split(a.values(checked_mul(kv_tokens, kv_width))) * 2;
  if (a.c.recompute == recompute_kind::selective) r += a.split(a.values_per_token(q_width));
  return r;
}

/// A transformer block: the paper's saved tensors (stacks/paper.hpp, paper_block), the runtime's
/// transients.
constexpr raw_activations memalg_block(const act_terms& a, const layer_shape& s) {
  const activation_context& c = a.c;
  const paper_block_bytes p = paper_block(a, s);
  raw_activations r = p.r;
  // Qwen3's per-head QK-norm: the query and key heads as they were before it, [T, (a + kv)·d]
  // split over tp, kept for its backward (exec/gpt/blocks.hpp, qk_norm_fwd; its backward runs in
  // place on the Q/K gradient, so no transient).
  if ((s.flags & layer_flags::qk_norm_per_head) != 0) {
    r.parts.norms.input_grad += a.split(a.values_per_token(checked_mul(s.heads + s.kv_heads, s.head_dim)));
    r.saved = r.parts.total();
  }
  // Gemma's norms after the sub-layers (h = x + post(attn(pre(x))), the same for the MLP): the
  // out-projection's and FC2's outputs, each a post-norm's input, are kept for its backward instead
  // of living as transients; the post-norm's output is the forward's transient, and its backward
  // writes the sub-layer output's gradient into the block's second gradient buffer, no transient,
  // after which its input, read for the last time and the saved side's top, is released: FC2's
  // output before the MLP's backward, the out-projection's before the attention's
  // (exec/gpt/blocks.hpp, post_norm_add, post_norm_backward and block_backward).
  const bool sandwich = (s.flags & layer_flags::norms_sandwich) != 0;
  if (sandwich) {
    r.parts.norms.input_grad += a.rep(a.values_per_token(s.hidden)) * 2;
    r.saved = r.parts.total();
  }
  const attention_bytes& self = p.self;
  const mlp_bytes& m = p.mlp;
  const bool cross = (s.flags & layer_flags::cross_attention) != 0;
  const bytes hidden_input = a.rep(a.values_per_token(s.hidden));
  const bytes gradients = hidden_input * 2;
  bytes bwd = memalg_attention_backward(a, s, a.seq);
  if (cross) bwd = max_b(bwd, memalg_attention_backward(a, s, s.kv_sequence != 0 ? s.kv_sequence : a.seq));
  // No scores: forward's transient is a sub-layer's output before the residual add.
  r.forward_temporary = hidden_input;
  // memalg's runtime also writes a norm's input gradient beside the two gradient buffers.
  r.backward_temporary = max_b(max_b(bwd, m.backward_temporary), hidden_input) + gradients;
  // Under selective recomputation the rebuilt core lives only inside the attention backward
  // (the stage adds it to the whole entry's backward): for gated (SwiGLU) blocks the attention
  // branch carries it, so an MLP backward that is larger does not count it again.
  if (c.recompute == recompute_kind::selective && (s.flags & layer_flags::gated) != 0 &&
      (s.flags & layer_flags::moe) == 0) {
    const bytes core = self.saved.core;
    r.backward_temporary = max_b(max_b(bwd + core, m.backward_temporary), hidden_input) + gradients - core;
  }
  if ((s.flags & layer_flags::parallel_residual) != 0 && (s.flags & layer_flags::moe) == 0 && !cross) {
    // memalg's parallel block (exec/gpt/build_program.hpp): y = x + attn(ln1(x)) + mlp(ln2(x)),
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
  } else if ((s.flags & layer_flags::moe) == 0 && !cross) {
    // memalg's sequential block (exec/gpt/build_program.hpp, block_backward) runs its backward in
    // two phases: the MLP branch and ln2 (the MLP's inner gradient, then ln2's input gradient),
    // then the attention branch and ln1 (the attention output's and Q/K/V's gradients, with
    // the core rebuilt under selective recomputation, then ln1's input gradient). Between
    // them it releases what only the first read: the MLP's saved tensors and the sum after
    // attention (ln2's input). The stage adds a rebuilt core to the second phase only.
    const bytes core = c.recompute == recompute_kind::selective ? self.saved.core : bytes{};
    r.backward_temporary = max_b(m.backward_temporary, hidden_input) + gradients;
    r.backward_tail = max_b(bwd + core, hidden_input) - core + gradients;
    r.tail_released = m.saved.total() - residual_mask(a, s) + hidden_input;
    if (sandwich) {
      r.backward_released += hidden_input;  // FC2's output, at the backward's start
      r.tail_released += hidden_input;      // the out-projection's output, at the second phase's
    }
  }
  // memalg's runtime releases the MLP's residual-dropout mask as soon as the backward's first
  // op (the dropout) has read it, before any of the block's transients: the block's output
  // went before its backward, so the mask is the top of the saved tensors
  // (exec/gpt/build_program.hpp, release_mlp_mask). The stage takes it out of the block's backward.
  if ((s.flags & layer_flags::moe) == 0 && !cross) r.backward_released += residual_mask(a, s);
  return r;
}

/// One instance of `l` under the memalg stack.
constexpr raw_activations memalg_activations(const layer_desc& l, const activation_context& c) {
  const layer_shape& s = l.shape;
  const act_terms a(c, s);
  if (a.tokens == 0) return raw_activations{};
  if (l.kind == layer_kind::transformer_block) return memalg_block(a, s);
  raw_activations r = paper_activations(l, c);
  const bytes hidden_input = a.rep(a.values_per_token(s.hidden));
  const bytes gradients = hidden_input * 2;
  switch (l.kind) {
    case layer_kind::embedding:
    case layer_kind::position_embedding:
      // Backward holds both of the runtime's gradient buffers, and the embeddings' output (the
      // first residual) until the embedding backward has run (exec/gpt/build_program.hpp pops it
      // last).
      r.backward_temporary = gradients + hidden_input;
      // Under sequence parallelism a vocabulary-parallel lookup writes every token's row (zero
      // outside the rank's vocabulary) before its reduce-scatter to the rank's tokens, and its
      // backward all-gathers the arriving gradient back to every token — one [b·s, h] buffer each
      // way (Megatron-LM's VocabParallelEmbedding followed by scatter_to_sequence_parallel_region,
      // whose backward is the all-gather).
      if (c.sp && l.kind == layer_kind::embedding && l.tp_replicated_params != l.params)
        r.comm = a.values_per_token(s.hidden);
      break;
    case layer_kind::linear:
    case layer_kind::conv1d: {
      // memalg's runtime releases the entry's own tensors as its backward reads them for the
      // last time (the dropout mask, the nonlinearity's output, the batch norm's input), before
      // the product's backward writes the input's gradient: the entry's worst moment is its
      // first (all its tensors and the arriving gradient) or its last (the input, the two
      // gradients) — exec/speech/build_program.hpp, net_backward.
      const bytes out = a.rep(a.values_per_token(s.out)), in = a.rep(a.values_per_token(s.in));
      const bytes own = r.saved.total() - r.input;
      r.backward_temporary = own < in ? out + in - own : out;
      break;
    }
    case layer_kind::attention:
      r.forward_temporary = bytes{};
      r.backward_temporary =
          memalg_attention_backward(a, s, s.kv_sequence != 0 ? s.kv_sequence : a.seq) + gradients;
      break;
    case layer_kind::output: {
      const std::uint64_t vocab =  // vocabulary-parallel unless replicated
          (s.flags & layer_flags::vocab_replicated) != 0 ? s.vocab : ceil_div(s.vocab, c.tp);
      // memalg's runtime: logits in the activation dtype become their gradient in place (a
      // fused classifier, as llm.c's); per-token losses are O(tokens) scratch. Chunked: one
      // chunk's rows at a time (exec/gpt/build_program.hpp), each projected, turned into its
      // gradient in place and sent back into the hidden gradient before the next chunk.
      const std::uint64_t rows = s.chunk != 0 && s.chunk < a.tokens ? s.chunk : a.tokens;
      r.forward_temporary = a.values(checked_mul(rows, vocab));
      r.backward_temporary = r.forward_temporary + hidden_input;
      // memalg's runtime under sequence parallelism: the all-gathered rows are the projection's
      // input for its forward and both its gradients, so its saved input (this rank's rows of the
      // final norm's output) goes once gathered, before the logits exist
      // (exec/gpt/build_program.hpp, micro_batch).
      if (c.sp) r.forward_released = r.backward_released = hidden_input;
      break;
    }
    case layer_kind::custom:
      // memalg's runtime keeps an encoder output's gradient beside it from its forward on: every
      // cross-attention's key/value projection adds into it (exec/speech/build_program.hpp).
      if ((s.flags & layer_flags::encoder_output) != 0) r.saved.input_grad += a.rep(a.values_per_token(s.hidden));
      r.input = r.saved.input_grad;
      break;
    default:
      break;
  }
  return r;
}

/// Whole-model rules of the runtime, applied to the table of every entry's bytes.
constexpr void memalg_table(const model_desc& model, const activation_context& c, activation_table& table) {
  // The embeddings' dropout mask stays until the embedding backward too.
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
  // On a regression head (the speech decoder, exec/speech/build_program.hpp):
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
    const act_terms a(c, l.shape);
    const bytes g = a.rep(a.values_per_token(l.shape.out));
    table.entries[i].saved += g;
    table.entries[i].selective += g;
  }
  if (model.size > 0) {
    const layer_desc& l = model.entries[model.size - 1];
    if ((l.kind == layer_kind::linear || l.kind == layer_kind::conv1d) && l.group != layer_group::teacher) {
      const act_terms a(c, l.shape);
      table.entries[model.size - 1].forward_temporary += a.rep(a.values_per_token(l.shape.out));
    }
  }
}

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
    // (exec/gpt/build_program.hpp: the embedding backward). So either entry's moment holds both.
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
}  // namespace memalg

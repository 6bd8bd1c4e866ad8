// SPDX-License-Identifier: BSL-1.0
// memalg/plan/stacks/common.hpp — what every training stack's activation accounting reads (the
// context) and writes (the bytes of one instance), and the terms they all count with.
//
// A stack is the software that trains the model; each header beside this one holds one stack's
// rules for the tensors a layer saves and the transients it allocates, with their sources:
//
//   stacks/paper.hpp     Korthikanti et al. 2022 (arXiv 2205.05198), §4.1: the generic sub-layer
//                        algebra, which the other stacks fall back to for kinds they do not model
//   stacks/memalg.hpp    memalg's own runtime: the paper's accounting and its runtime's deviations
//   stacks/pytorch.hpp   PyTorch's autograd under Hugging Face's modelling code
//   stacks/megatron.hpp  Megatron-core with Transformer Engine
//
// plan/activations.hpp chooses the stack's rules, applies recomputation and the frozen-layer rule
// and places the bytes on pipeline stages, the same for every stack.
//
// Notation: s tokens per sequence (of the entry), b micro-batch, h hidden, a heads, d head width,
// kv key/value heads, f MLP width, v vocabulary, t tensor-parallel degree, c context-parallel
// degree, e bytes of one activation element (the policy's activation dtype). Masks are 1 byte per
// element. T = b·s/c is the tokens one rank processes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memalg/core/bytes.hpp"
#include "memalg/core/dtype.hpp"
#include "memalg/device/device.hpp"
#include "memalg/model/layer.hpp"
#include "memalg/parallel/mesh.hpp"
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
  /// pytorch: checkpoints are reentrant, and Hugging Face then makes a frozen embedding's output
  /// require a gradient (enable_input_require_grads, as PEFT's prepare_model_for_kbit_training does)
  bool reentrant = false;
  /// pytorch, set per entry: its input requires a gradient (some entry before it trains, or
  /// `reentrant`); a frozen block's first tensors keep nothing for their gradients otherwise
  bool input_requires_grad = true;
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
  c.reentrant = t.checkpoint == checkpoint_kind::reentrant &&
                (t.recompute == recompute_kind::full || t.recompute == recompute_kind::every_k);
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
  bytes backward_released{};   ///< saved bytes its backward frees before its transients (memalg's runtime; pytorch: OLMo 2's MLP norm)
  bytes forward_released{};    ///< memalg's runtime: its own saved bytes it frees before its forward's transients
  bytes backward_tail{};       ///< memalg's runtime: a second phase of its backward (none when 0), its transients
  bytes tail_released{};       ///< memalg's runtime: saved bytes freed before that second phase
  bytes last_released{};       ///< pytorch: saved bytes a block frees before its third phase (its attention's input projections)
  bytes grad_temporary{};      ///< pytorch: a block's first-phase transients while a weight gradient is new (0: backward_temporary)
  bytes mlp_released{};        ///< pytorch: saved bytes a block frees before its MLP's first projections' backward
  /// pytorch: a block's parameters whose gradients come after its first phase (the attention's),
  /// after its second (the attention's input projections'), and last in its first (the MLP's
  /// first projections') (stacks/pytorch.hpp; computed with the table, once per model)
  std::uint64_t late_attention_params = 0, late_input_params = 0, late_mlp_params = 0;
};

/// Per-instance activations of every entry, in model order (computed once per plan; stages only
/// multiply them).
struct activation_table {
  layer_activations entries[max_model_entries]{};  ///< a built-in array, as model_desc::entries
  std::size_t size = 0;
  bytes stage_boundary{};  ///< a pipeline send/receive buffer: one hidden-state tensor
  bool host = false;       ///< built for the host CPU (activation_context::cpu)
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
  /// pytorch: the core keeps its own output (SDPA's fused kernels), the out-projection's input,
  /// which a frozen out-projection therefore does not free
  bool core_keeps_output = false;
  bytes forward_temporary{};
  bytes backward_temporary{};
  bytes comm{};
};

struct mlp_bytes {
  saved_bytes saved{};
  bytes backward_temporary{};
  bytes grad_temporary{};  ///< pytorch: the transients while a weight gradient is new (0: backward_temporary)
  bytes forward_temporary{};  ///< pytorch: beside the whole block's saved tensors, late in its forward
  bytes comm{};
  /// pytorch, routed experts: the saved bytes freed before the experts' weight gradients (the
  /// other MLPs free all theirs before their first projections' backward).
  bool routed = false;
  bytes routed_released{};
};


/// Tokens routed to experts: k·T dropless, E·⌈C·k·T/E⌉ with a capacity factor C (GShard,
/// Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021).
constexpr std::uint64_t routed_tokens(const layer_shape& s, std::uint64_t tokens) {
  const std::uint64_t routed = checked_mul(tokens, s.top_k);
  if (s.capacity_factor_percent == 0 || s.experts == 0) return routed;
  return checked_mul(s.experts, ceil_div(checked_mul(routed, s.capacity_factor_percent), checked_mul(100, s.experts)));
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
  bytes backward_released{};  ///< saved bytes the backward frees before its transients (memalg's runtime; pytorch: OLMo 2's MLP norm)
  bytes forward_released{};   ///< memalg's runtime: its own saved bytes freed before its forward's transients
  bytes backward_tail{};      ///< memalg's runtime: the transients of a second phase of the backward
  bytes tail_released{};      ///< memalg's runtime: saved bytes freed before that phase
  bytes last_released{};      ///< pytorch: saved bytes a block frees before its third phase
  bytes grad_temporary{};     ///< pytorch: a block's first-phase transients while a weight gradient is new
  bytes mlp_released{};       ///< pytorch: saved bytes a block frees before its MLP's first projections' backward
};


/// Whole bytes of one element (a narrower type takes one).
constexpr std::uint64_t bytes_per_element_ceil(const dtype& d) { return d.bits <= 8 ? 1 : ceil_div(d.bits, 8); }

}  // namespace detail
}  // namespace memalg

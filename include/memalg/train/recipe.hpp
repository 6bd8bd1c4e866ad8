// SPDX-License-Identifier: BSL-1.0
// memalg/train/recipe.hpp — the training recipe: precision policy, optimizer, batch shape,
// gradient accumulation and activation recomputation.
//
// `recipe<Precision, Optimizer, Options...>` folds its options into one literal `training_desc`.
// An option is any type with `static constexpr void apply(training_desc&)`, so new knobs compose
// without touching this header. Things that do not change per-GPU memory — the dataset size, the
// learning rate, the number of epochs — are deliberately not fields: they cannot change a plan.
#pragma once

#include <cstdint>

#include "memalg/train/optimizer.hpp"
#include "memalg/train/precision.hpp"

namespace memalg {

enum class recompute_kind : std::uint8_t { none, selective, full, every_k };

/// How a full (or every-K) recomputation checkpoints a layer under the pytorch stack
/// (torch.utils.checkpoint): `non_reentrant` (saved-tensor hooks; Hugging Face's default since
/// transformers 4.35, `use_reentrant=False`) or `reentrant` (the autograd.Function that reruns the
/// forward inside backward, `use_reentrant=True`). They keep and rebuild different tensors
/// (docs/algebra.md, "Gradient checkpointing"). Other stacks do not read it.
enum class checkpoint_kind : std::uint8_t { non_reentrant, reentrant };

/// The training stack whose allocations the plan follows, beyond the precision policy: which
/// tensors each layer saves and which transients it allocates, when gradients exist and in which
/// buffers, and the optimizer implementation's temporaries (docs/algebra.md, "Stacks").
///
/// * `pytorch`: PyTorch eager with Hugging Face's modelling code, calibrated tensor by tensor
///   against measured steps (bench/torch/measured.json): the saved tensors of HF's blocks, the
///   loss's fp32 log-softmax and its gradients, gradients made in backward after
///   `zero_grad(set_to_none=True)`, DDP's flat bucket, FSDP2's gathered units, foreach / for-loop
///   optimizer temporaries. The default.
/// * `megatron`: Megatron-core with Transformer Engine (fused kernels, fp32 `main_grad` buffers,
///   the distributed optimizer's contiguous buffers), against Megatron-LM's measured golden values.
/// * `memalg`: memalg's own runtime, exact to the byte (attention backward holds the gradients of
///   its output and of Q/K/V; the loss turns the logits into their gradient in place; two
///   hidden-sized gradient buffers live for the whole backward).
/// * `paper`: Korthikanti et al. 2022's accounting (arXiv 2205.05198, Table 2) with unfused
///   PyTorch / Megatron transients (score-sized gradient buffers, a separate logits gradient).
enum class stack_kind : std::uint8_t { pytorch, megatron, memalg, paper };

/// How the optimizer step runs (the pytorch stack's temporaries; docs/algebra.md). `foreach`:
/// torch's multi-tensor path (its default for CUDA tensors): one state-sized temporary for the
/// whole parameter list. `for_loop`: one parameter at a time (its default on the CPU): two
/// temporaries of the largest parameter. `fused`: `fused=True`, no temporaries.
enum class optimizer_impl : std::uint8_t { foreach, for_loop, fused };

struct training_desc {
  precision_policy precision = precision::amp_bf16::value;
  optimizer_desc optimizer = optim::adamw<>::value;
  std::uint64_t micro_batch = 1;        ///< sequences per micro-batch on one data-parallel rank
  std::uint64_t sequence = 0;           ///< tokens per sequence (0: model states only)
  std::uint64_t grad_accum = 1;         ///< micro-batches accumulated per optimizer step
  recompute_kind recompute = recompute_kind::none;
  std::uint64_t recompute_every = 0;    ///< for every_k: checkpoint one layer input every k layers
  checkpoint_kind checkpoint = checkpoint_kind::non_reentrant;  ///< full / every_k under the pytorch stack
  bool offload_activations = false;     ///< saved activations live in host memory between passes
  /// The optimizer step reads narrow gradients directly (fused Adam: Apex, torch fused=True, the
  /// CPU runtime); otherwise a gradient shard is upcast to the master dtype first (DeepSpeed).
  bool fused_optimizer = false;
  stack_kind stack = stack_kind::pytorch;
  optimizer_impl optimizer_kind = optimizer_impl::foreach;
};

namespace train {

/// Sequences per micro-batch and tokens per sequence.
template <std::uint64_t MicroBatch, std::uint64_t Sequence>
struct batch {
  static_assert(MicroBatch > 0, "batch: the micro-batch must hold at least one sequence");
  static_assert(Sequence > 0, "batch: the sequence length must be at least one token");
  static constexpr void apply(training_desc& t) {
    t.micro_batch = MicroBatch;
    t.sequence = Sequence;
  }
};

/// Accumulate K micro-batches per optimizer step: the effective batch grows K-fold, saved
/// activations stay those of one micro-batch (the gradient buffer persists across them).
template <std::uint64_t K>
struct grad_accum {
  static_assert(K > 0, "grad_accum: accumulate at least one micro-batch per step");
  static constexpr void apply(training_desc& t) { t.grad_accum = K; }
};

namespace recompute {
struct none {
  static constexpr void apply(training_desc& t) { t.recompute = recompute_kind::none; }
};
/// Recompute the attention core only (Korthikanti et al. 2022 §5).
struct selective {
  static constexpr void apply(training_desc& t) { t.recompute = recompute_kind::selective; }
};
/// Keep only each layer's input; recompute the layer in backward.
struct full {
  static constexpr void apply(training_desc& t) { t.recompute = recompute_kind::full; }
};
/// Checkpoint the input of every K-th layer; recompute the K layers of a segment in backward.
template <std::uint64_t K>
struct every {
  static_assert(K > 0, "recompute::every: the checkpoint interval must be at least one layer");
  static constexpr void apply(training_desc& t) {
    t.recompute = recompute_kind::every_k;
    t.recompute_every = K;
  }
};
/// torch.utils.checkpoint's reentrant variant (`use_reentrant=True`) for full / every-K
/// recomputation under the pytorch stack; the non-reentrant one is the default.
struct reentrant {
  static constexpr void apply(training_desc& t) { t.checkpoint = checkpoint_kind::reentrant; }
};
}  // namespace recompute

/// The optimizer step needs no upcast copy of the gradients and no temporaries (a fused optimizer:
/// Apex / DeepSpeed FusedAdam, torch's `fused=True`).
struct fused_optimizer {
  static constexpr void apply(training_desc& t) {
    t.fused_optimizer = true;
    t.optimizer_kind = optimizer_impl::fused;
  }
};

/// Plan for the training stack `S` (see stack_kind). memalg's own runtime implies a fused
/// optimizer step.
template <stack_kind S>
struct stack {
  static constexpr void apply(training_desc& t) {
    t.stack = S;
    if (S == stack_kind::memalg) t.fused_optimizer = true;
  }
};
namespace stacks {
using pytorch = stack<stack_kind::pytorch>;
using megatron = stack<stack_kind::megatron>;
using memalg = stack<stack_kind::memalg>;
using paper = stack<stack_kind::paper>;
}  // namespace stacks

/// memalg's runtime: the `memalg` stack.
using reference_kernels = stacks::memalg;

/// The optimizer implementation (see optimizer_impl); `fused` also skips the DeepSpeed-style
/// gradient upcast (fused_optimizer).
template <optimizer_impl I>
struct optimizer_implementation {
  static constexpr void apply(training_desc& t) {
    t.optimizer_kind = I;
    if (I == optimizer_impl::fused) t.fused_optimizer = true;
  }
};

/// Saved activations move to host memory between forward and backward.
struct offload_activations {
  static constexpr void apply(training_desc& t) { t.offload_activations = true; }
};

template <class O>
concept recipe_option = requires(training_desc& t) { O::apply(t); };

template <precision_policy_type Precision, optimizer_type Optimizer, recipe_option... Options>
struct recipe {
  static constexpr training_desc value = [] {
    training_desc t{};
    t.precision = Precision::value;
    t.optimizer = Optimizer::value;
    (Options::apply(t), ...);
    return t;
  }();
};

}  // namespace train

template <class T>
concept training_type = requires {
  { T::value } -> std::convertible_to<training_desc>;
};

}  // namespace memalg

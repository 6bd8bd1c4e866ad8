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

/// Whose kernels the transient buffers follow. `generic`: unfused PyTorch / Megatron conventions
/// (score-sized gradient buffers in attention backward, a separate logits gradient). `reference`:
/// memalg's own runtime (attention backward holds the gradients of its output and of Q/K/V; the
/// loss turns the logits into their gradient in place; two hidden-sized gradient buffers live for
/// the whole backward) — the convention the runtime's arena is checked against, to the byte.
enum class kernel_profile : std::uint8_t { generic, reference };

struct training_desc {
  precision_policy precision = precision::amp_bf16::value;
  optimizer_desc optimizer = optim::adamw<>::value;
  std::uint64_t micro_batch = 1;        ///< sequences per micro-batch on one data-parallel rank
  std::uint64_t sequence = 0;           ///< tokens per sequence (0: model states only)
  std::uint64_t grad_accum = 1;         ///< micro-batches accumulated per optimizer step
  recompute_kind recompute = recompute_kind::none;
  std::uint64_t recompute_every = 0;    ///< for every_k: checkpoint one layer input every k layers
  bool offload_activations = false;     ///< saved activations live in host memory between passes
  /// The optimizer step reads narrow gradients directly (fused Adam: Apex, torch fused=True, the
  /// CPU runtime); otherwise a gradient shard is upcast to the master dtype first (DeepSpeed).
  bool fused_optimizer = false;
  kernel_profile kernels = kernel_profile::generic;
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
}  // namespace recompute

/// The optimizer step needs no upcast copy of the gradients (a fused optimizer).
struct fused_optimizer {
  static constexpr void apply(training_desc& t) { t.fused_optimizer = true; }
};

/// Transient buffers as memalg's runtime allocates them (see kernel_profile); implies a fused
/// optimizer step.
struct reference_kernels {
  static constexpr void apply(training_desc& t) {
    t.kernels = kernel_profile::reference;
    t.fused_optimizer = true;
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

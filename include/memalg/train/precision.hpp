// SPDX-License-Identifier: BSL-1.0
// memalg/train/precision.hpp — mixed-precision policies: which dtype each model state lives in.
//
// A policy is a literal `precision_policy`; a policy *type* is any type with
// `static constexpr memalg::precision_policy value` (so users can define their own). Bytes per
// parameter with Adam (two fp32 states unless the policy says otherwise):
//
//   policy         weights  gradients  master  Adam states  total   source
//   fp32           4        4          -       8            16      Megatron-LM dist_optimizer.md ("fp32 16")
//   amp_fp16       2        2          4       8            16      ZeRO paper §3.1 (2 + 2 + K, K = 12)
//   amp_bf16       2        4 (fp32)   4       8            18      Megatron-LM dist_optimizer.md ("bf16 18")
//   autocast_bf16  4        4          -       8            16      PyTorch autocast: fp32 parameters,
//                                                                   16-bit activations only
//   bf16           2        2          -       4 (bf16)     8       pure bf16 training, no master copy
//   mixed_bf16     2        2          4       8            16      the ZeRO paper's layout in bf16
//                                                                   (DeepSpeed's bf16 mode: bf16
//                                                                   gradients, fp32 master and states)
//   fp8            2 + 2·1  4 (fp32)   4       8            20      Transformer Engine: bf16 parameters,
//                                                                   fp32 main grads and master, plus an
//                                                                   fp8 copy and its transpose cached
//                                                                   for the GEMMs (Float8Tensor)
//   autocast_fp16  4        4          -       8            16      PyTorch autocast in fp16 with
//                                                                   torch.amp.GradScaler (the Trainer's
//                                                                   fp16=True): fp32 parameters, fp16
//                                                                   activations, plus the scaler's
//                                                                   state (8 bytes, below)
//
// The names say what the layouts hold. `mixed_fp16` and `mixed_bf16_fp32_grads` are `amp_fp16` and
// `amp_bf16` under names that do not suggest PyTorch's AMP (autocast); the old names stay for one
// release (the CLI notes that they are deprecated).
//
// Megatron's fp16 row (20 bytes) keeps an extra fp32 gradient copy inside the optimizer; memalg's
// amp_fp16 follows the ZeRO paper's 16 instead (see docs/algebra.md).
#pragma once

#include <cstdint>
#include <string_view>

#include "memalg/core/dtype.hpp"

namespace memalg {

struct precision_policy {
  std::string_view name{};
  dtype weights = dtypes::fp32;           ///< the copy forward and backward read
  dtype gradients = dtypes::fp32;         ///< what backward accumulates into (Megatron's main_grad)
  dtype master_weights = dtypes::none;    ///< fp32 copy the optimizer updates, if any
  dtype optimizer_states = dtypes::fp32;  ///< default dtype of optimizer states
  dtype activations = dtypes::fp32;       ///< dtype of saved activations
  dtype weight_cache = dtypes::none;      ///< low-precision weight copies kept for GEMMs (fp8)
  std::uint32_t weight_cache_copies = 0;  ///< how many such copies (value + transpose = 2)
  /// A dynamic loss scaler's device state (torch.amp.GradScaler: `_scale`, one fp32 element, and
  /// `_growth_tracker`, one int32 element; torch/amp/grad_scaler.py `_lazy_init_scale_growth_tracker`).
  bool loss_scaler = false;
};

namespace precision {

struct fp32 {
  static constexpr precision_policy value{"fp32", dtypes::fp32, dtypes::fp32, dtypes::none, dtypes::fp32, dtypes::fp32};
};
struct amp_fp16 {
  static constexpr precision_policy value{"amp-fp16", dtypes::fp16, dtypes::fp16, dtypes::fp32, dtypes::fp32,
                                          dtypes::fp16};
};
struct amp_bf16 {
  static constexpr precision_policy value{"amp-bf16", dtypes::bf16, dtypes::fp32, dtypes::fp32, dtypes::fp32,
                                          dtypes::bf16};
};
struct autocast_bf16 {
  static constexpr precision_policy value{"autocast-bf16", dtypes::fp32, dtypes::fp32, dtypes::none, dtypes::fp32,
                                          dtypes::bf16};
};
struct bf16 {
  static constexpr precision_policy value{"bf16", dtypes::bf16, dtypes::bf16, dtypes::none, dtypes::bf16, dtypes::bf16};
};
struct mixed_bf16 {
  static constexpr precision_policy value{"mixed-bf16", dtypes::bf16, dtypes::bf16, dtypes::fp32, dtypes::fp32,
                                          dtypes::bf16};
};
struct autocast_fp16 {
  static constexpr precision_policy value{"autocast-fp16", dtypes::fp32, dtypes::fp32, dtypes::none, dtypes::fp32,
                                          dtypes::fp16,    dtypes::none, 0,            true};
};
/// amp_fp16 named for what it holds: fp16 weights and gradients, fp32 master weights and states.
struct mixed_fp16 {
  static constexpr precision_policy value{"mixed-fp16", dtypes::fp16, dtypes::fp16, dtypes::fp32, dtypes::fp32,
                                          dtypes::fp16};
};
/// amp_bf16 named for what it holds: bf16 weights, fp32 gradients (main_grad), master and states.
struct mixed_bf16_fp32_grads {
  static constexpr precision_policy value{"mixed-bf16-fp32-grads", dtypes::bf16, dtypes::fp32, dtypes::fp32,
                                          dtypes::fp32, dtypes::bf16};
};
struct fp8 {
  static constexpr precision_policy value{"fp8",         dtypes::bf16, dtypes::fp32,     dtypes::fp32,
                                          dtypes::fp32,  dtypes::bf16, dtypes::fp8_e4m3, 2};
};

/// Runtime lookup by CLI name; returns false when unknown.
constexpr bool from_name(std::string_view name, precision_policy& out) {
  for (const precision_policy& p :
       {fp32::value, amp_fp16::value, amp_bf16::value, autocast_bf16::value, bf16::value, mixed_bf16::value,
        fp8::value, autocast_fp16::value, mixed_fp16::value, mixed_bf16_fp32_grads::value})
    if (p.name == name) {
      out = p;
      return true;
    }
  return false;
}

}  // namespace precision

template <class P>
concept precision_policy_type = requires {
  { P::value } -> std::convertible_to<precision_policy>;
};

}  // namespace memalg

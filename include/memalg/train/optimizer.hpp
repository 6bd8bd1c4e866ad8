// SPDX-License-Identifier: BSL-1.0
// memalg/train/optimizer.hpp — optimizers and the bytes of their states.
//
// State elements per parameter (Ψ parameters, of which Ψ_m lie in matrices of shape r×c):
//   sgd 0 · momentum 1 · lion 1 (Chen et al. 2023, one moving average) · adam/adamw 2
//   (Kingma & Ba 2015; Loshchilov & Hutter 2019) · adam8bit 2 states of int8 with one fp32 scale
//   per block of 2048 (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization")
//   · adafactor: factored second moment, r + c values per r×c matrix and one per vector element
//   (Shazeer & Stern 2018), no first moment unless `beta1` is enabled (then +Ψ).
// Adafactor needs matrix shapes. A model given by parameter count alone has none, so every
// parameter counts as a vector element: the unfactored upper bound Ψ (documented in docs/algebra.md).
#pragma once

#include <cstdint>
#include <string_view>

#include "memalg/core/dtype.hpp"

namespace memalg {

enum class optimizer_kind : std::uint8_t { sgd, momentum, adam, adamw, adam8bit, adafactor, lion };

struct optimizer_desc {
  std::string_view name{};
  optimizer_kind kind = optimizer_kind::adamw;
  std::uint32_t full_states = 2;        ///< states with one element per parameter
  dtype state_dtype = dtypes::none;     ///< none: the precision policy's optimizer_states dtype
  bool factored_second_moment = false;  ///< Adafactor
  /// Block-quantized states (8-bit Adam): elements per fp32 scale.
  std::uint32_t quant_block = 0;
};

/// Parameter shape summary an optimizer needs (per model, per layer or per shard).
struct param_shape {
  std::uint64_t params = 0;          ///< all parameters
  std::uint64_t matrix_params = 0;   ///< of which in 2-D matrices
  std::uint64_t matrix_rows_plus_cols = 0;  ///< Σ (r + c) over those matrices
};

/// Exact bytes of optimizer state for `shape` with state dtype `state` (already resolved).
constexpr bytes optimizer_state_bytes(const optimizer_desc& o, dtype state, const param_shape& shape) {
  if (o.quant_block != 0) state = blockwise(dtypes::int8, o.quant_block, dtypes::fp32);
  bytes total = storage_bytes(state, shape.params) * o.full_states;
  if (o.factored_second_moment) {
    const std::uint64_t vector_params = shape.params - shape.matrix_params;
    total += storage_bytes(state, shape.matrix_rows_plus_cols + vector_params);
  }
  return total;
}

namespace optim {

template <class StateDtype = void>
struct state_dtype_of {
  static constexpr dtype value = StateDtype::value;
};
template <>
struct state_dtype_of<void> {
  static constexpr dtype value = dtypes::none;
};

/// Tag types naming a state dtype explicitly, e.g. `adam<state<dtypes::bf16>>` is spelled
/// `adam<bf16_states>`.
struct fp32_states { static constexpr dtype value = dtypes::fp32; };
struct bf16_states { static constexpr dtype value = dtypes::bf16; };
struct fp16_states { static constexpr dtype value = dtypes::fp16; };

template <class S = void>
struct sgd {
  static constexpr optimizer_desc value{"sgd", optimizer_kind::sgd, 0, state_dtype_of<S>::value};
};
template <class S = void>
struct momentum {
  static constexpr optimizer_desc value{"momentum", optimizer_kind::momentum, 1, state_dtype_of<S>::value};
};
template <class S = void>
struct adam {
  static constexpr optimizer_desc value{"adam", optimizer_kind::adam, 2, state_dtype_of<S>::value};
};
template <class S = void>
struct adamw {
  static constexpr optimizer_desc value{"adamw", optimizer_kind::adamw, 2, state_dtype_of<S>::value};
};
/// 8-bit Adam: two int8 states, one fp32 absmax per `Block` elements (Dettmers et al. 2022 use 2048).
template <std::uint32_t Block = 2048>
struct adam8bit {
  static_assert(Block > 0, "adam8bit: the quantization block must hold at least one element");
  static constexpr optimizer_desc value{"adam8bit", optimizer_kind::adam8bit, 2, dtypes::int8, false, Block};
};
/// Adafactor without first moment (Shazeer & Stern 2018; Hugging Face default beta1=None).
template <bool WithMomentum = false, class S = void>
struct adafactor {
  static constexpr optimizer_desc value{"adafactor", optimizer_kind::adafactor, WithMomentum ? 1u : 0u,
                                        state_dtype_of<S>::value, true};
};
template <class S = void>
struct lion {
  static constexpr optimizer_desc value{"lion", optimizer_kind::lion, 1, state_dtype_of<S>::value};
};

/// Runtime lookup by CLI name (default state dtype); returns false when unknown.
constexpr bool from_name(std::string_view name, optimizer_desc& out) {
  for (const optimizer_desc& o : {sgd<>::value, momentum<>::value, adam<>::value, adamw<>::value,
                                  adam8bit<>::value, adafactor<>::value, lion<>::value})
    if (o.name == name) {
      out = o;
      return true;
    }
  return false;
}

}  // namespace optim

template <class O>
concept optimizer_type = requires {
  { O::value } -> std::convertible_to<optimizer_desc>;
};

}  // namespace memalg

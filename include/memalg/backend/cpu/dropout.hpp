// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/dropout.hpp — inverted dropout (Srivastava et al. 2014), reference.
//
//   forward:  keep_i = dropout_keep(seed, i, p) (i = flat element index), out_i = keep_i ? in_i/(1−p) : 0,
//             mask_i = keep_i (one byte, 0/1)
//   backward: din_i = mask_i ? dout_i/(1−p) : 0
// The mask comes from the counter-based stream in memalg/core/random.hpp so that the GPU backend
// draws exactly the same mask. p = 1 drops everything (no draw is ≥ 1) and never divides by zero.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memalg/core/float16.hpp"
#include "memalg/core/random.hpp"

namespace memalg::backend::cpu {

/// out[n]; mask[n] may be null (inference-style use without backward); out may alias in.
template <storage_type T>
void dropout_forward(T* out, std::uint8_t* mask, const T* in, std::size_t n, float p,
                     std::uint64_t seed) {
  using A = accum_t<T>;
  const A keep_prob = A(1) - static_cast<A>(p);
  for (std::size_t i = 0; i < n; ++i) {
    const bool keep = dropout_keep(seed, i, p);
    out[i] = from_float<T>(keep ? to_float(in[i]) / keep_prob : A(0));
    if (mask) mask[i] = keep ? 1 : 0;
  }
}

/// din[n] written; din may alias dout.
template <storage_type T>
void dropout_backward(T* din, const T* dout, const std::uint8_t* mask, std::size_t n, float p) {
  using A = accum_t<T>;
  const A keep_prob = A(1) - static_cast<A>(p);
  for (std::size_t i = 0; i < n; ++i) din[i] = from_float<T>(mask[i] ? to_float(dout[i]) / keep_prob : A(0));
}

}  // namespace memalg::backend::cpu

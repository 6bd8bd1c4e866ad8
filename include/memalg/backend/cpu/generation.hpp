// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/generation.hpp — the generation program's kernels (exec/program.hpp,
// ops::kv_append, ops::cached_attention_fwd, ops::argmax), reference.
//
// A layer's key/value cache is kv[B, L, 2·Hkv·D]: for each sequence b and position j, the Hkv key
// heads, then the Hkv value heads. The new tokens' keys and values come from the fused
// qkv[B·q, (H + 2Hkv)·D] of attention.hpp after the rotary positions.
//  * kv_append: positions [pos0, pos0 + q) of every sequence take the q new tokens' heads.
//  * cached_attention_forward: attention.hpp's naive kernel (scores and softmax in accum_t<T>,
//    scaled by 1/√D) with queries from qkv and keys and values from the cache; query t of a
//    sequence sits at position pos0 + t and reads keys 0 … pos0 + t.
//  * argmax: the smallest index of each row's largest value, a NaN counting as larger than any
//    number (torch.argmax's choice), so every row yields an id.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "memalg/backend/cpu/attention.hpp"
#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

namespace detail {
inline void check_cache_args(const attention_shape& sh, std::size_t pos0, std::size_t L) {
  check_attention_shape(sh);
  if (sh.S == 0 || pos0 + sh.S > L) throw std::invalid_argument("kv cache: the new tokens lie outside the cache's L positions");
}
}  // namespace detail

/// kv[B, L, 2·Hkv·D]: rows pos0 … pos0 + q − 1 of each sequence written from qkv[B·q, (H + 2Hkv)·D]
/// (q = sh.S).
template <storage_type T>
void kv_append(T* kv, const T* qkv, const attention_shape& sh, std::size_t pos0, std::size_t L) {
  detail::check_cache_args(sh, pos0, L);
  const std::size_t W = sh.qkv_width(), row = 2 * sh.Hkv * sh.D, k0 = sh.H * sh.D;
  for (std::size_t b = 0; b < sh.B; ++b)
    for (std::size_t t = 0; t < sh.S; ++t) {
      const T* src = qkv + (b * sh.S + t) * W + k0;  // the key heads, then the value heads
      T* dst = kv + (b * L + pos0 + t) * row;
      for (std::size_t c = 0; c < row; ++c) dst[c] = src[c];
    }
}

/// out[B·q, H·D]: the query heads of qkv[B·q, (H + 2Hkv)·D] attend causally over kv[B, L, 2·Hkv·D],
/// query t of a sequence reading positions 0 … pos0 + t.
template <storage_type T>
void cached_attention_forward(T* out, const T* qkv, const T* kv, const attention_shape& sh, std::size_t pos0,
                              std::size_t L) {
  detail::check_cache_args(sh, pos0, L);
  detail::attention_io io{sh.B, sh.S, L, sh.H, sh.Hkv, sh.D, true, nullptr, sh.qkv_width(), 0,
                          2 * sh.Hkv * sh.D, 0, sh.Hkv * sh.D, pos0};
  detail::attention_naive_forward_io(out, static_cast<T*>(nullptr), qkv, kv, io);
}

/// out[n] = the smallest index of the largest of logits[n, 0..V) (the first NaN, if any).
template <storage_type T>
void argmax_rows(std::int32_t* out, const T* logits, std::size_t N, std::size_t V) {
  if (V == 0) throw std::invalid_argument("argmax: rows must be non-empty");
  for (std::size_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    std::size_t best = 0;
    auto top = to_float(row[0]);
    for (std::size_t v = 1; v < V && !std::isnan(top); ++v) {
      const auto x = to_float(row[v]);
      if (std::isnan(x) || x > top) {
        top = x;
        best = v;
      }
    }
    out[n] = static_cast<std::int32_t>(best);
  }
}

}  // namespace memalg::backend::cpu

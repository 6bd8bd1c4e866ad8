// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/embedding.hpp — token + position embedding (reference implementation).
//
//   forward:  out[n, :] = wte[tok[n], :] + wpe[n % S, :]          (wpe may be null)
//   backward: dwte[tok[n], :] += dout[n, :],  dwpe[n % S, :] += dout[n, :]
//
// Several rows can hit the same vocabulary row (and every batch hits the same position row), so the
// backward gathers all contributions to one parameter row in the accumulation type and rounds the
// result to T once, as docs/kernels.md requires, instead of rounding after every addition.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

/// out[B*S, C]; tok[B*S] in [0, V); wte[V, C]; wpe[S, C] or null.
template <storage_type T>
void embedding_forward(T* out, const std::int32_t* tok, const T* wte, const T* wpe, std::size_t B,
                       std::size_t S, std::size_t C) {
  using A = accum_t<T>;
  for (std::size_t n = 0; n < B * S; ++n) {
    if (tok[n] < 0) throw std::out_of_range("embedding_forward: negative token id");
    const T* e = wte + static_cast<std::size_t>(tok[n]) * C;
    const T* p = wpe ? wpe + (n % S) * C : nullptr;
    for (std::size_t c = 0; c < C; ++c) {
      A v = to_float(e[c]);
      if (p) v += to_float(p[c]);
      out[n * C + c] = from_float<T>(v);
    }
  }
}

/// dwte[V, C] += ...; dwpe[S, C] += ... (either may be null to skip it); dout[B*S, C].
template <storage_type T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tok, std::size_t B,
                        std::size_t S, std::size_t C) {
  using A = accum_t<T>;
  const std::size_t N = B * S;
  std::vector<A> acc(C);
  if (dwte) {
    // Visit rows grouped by token id (stable: contributions are added in row order).
    std::vector<std::size_t> order(N);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return tok[a] < tok[b]; });
    for (std::size_t i = 0; i < N;) {
      if (tok[order[i]] < 0) throw std::out_of_range("embedding_backward: negative token id");
      T* row = dwte + static_cast<std::size_t>(tok[order[i]]) * C;
      for (std::size_t c = 0; c < C; ++c) acc[c] = to_float(row[c]);
      std::size_t j = i;
      for (; j < N && tok[order[j]] == tok[order[i]]; ++j) {
        const T* g = dout + order[j] * C;
        for (std::size_t c = 0; c < C; ++c) acc[c] += to_float(g[c]);
      }
      for (std::size_t c = 0; c < C; ++c) row[c] = from_float<T>(acc[c]);
      i = j;
    }
  }
  if (dwpe) {
    for (std::size_t t = 0; t < S; ++t) {
      T* row = dwpe + t * C;
      for (std::size_t c = 0; c < C; ++c) acc[c] = to_float(row[c]);
      for (std::size_t b = 0; b < B; ++b) {
        const T* g = dout + (b * S + t) * C;
        for (std::size_t c = 0; c < C; ++c) acc[c] += to_float(g[c]);
      }
      for (std::size_t c = 0; c < C; ++c) row[c] = from_float<T>(acc[c]);
    }
  }
}

}  // namespace memalg::backend::cpu

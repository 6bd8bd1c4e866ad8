// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/embedding.hpp — token + position embedding (reference implementation).
//
//   forward:  out[n, :] = wte[tok[n], :] + wpe[n % S, :]          (wpe may be null)
//   backward: dwte[tok[n], :] += dout[n, :],  dwpe[n % S, :] += dout[n, :]
//
// Several rows can hit the same vocabulary row (and every batch hits the same position row), so the
// backward gathers all contributions to one parameter row in the accumulation type and rounds the
// result to T once, as docs/kernels.md requires, instead of rounding after every addition.
//
// Vocabulary-parallel (Megatron-LM's VocabParallelEmbedding, Shoeybi et al. 2019, §3): a rank
// holds rows [vocab_begin, vocab_begin + rows) of wte. Its forward writes the rows of in-range
// tokens and zero elsewhere (the sum over the tensor-parallel ranks is the full lookup); its
// backward accumulates the gradients of in-range tokens into its rows only. The replicated
// position embedding is added after that sum (position_add, at row offset row0 of the sequence
// split under sequence parallelism).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

namespace detail {
/// Gemma's normalizer in the storage type (`torch.tensor(hidden_size**0.5, dtype=...)`); 0: none.
template <storage_type T>
accum_t<T> storage_scale(double scale) {
  return scale > 0 ? to_float(from_float<T>(static_cast<accum_t<T>>(scale))) : accum_t<T>(0);
}
/// x · s rounded to T as a product of two T tensors is (x itself without a scale).
template <storage_type T>
accum_t<T> scaled(const T& x, accum_t<T> s) {
  return s > 0 ? to_float(from_float<T>(to_float(x) * s)) : to_float(x);
}
}  // namespace detail

/// out[B*S, C]; tok[B*S] in [0, V); wte[V, C]; wpe[pos0 + S, C] or null (token s of a sequence
/// at position pos0 + s: a generation step's). scale > 0: the token's row times scale (both
/// rounded to T, Gemma's embedding normalizer) before the position is added.
template <storage_type T>
void embedding_forward(T* out, const std::int32_t* tok, const T* wte, const T* wpe, std::size_t B,
                       std::size_t S, std::size_t C, std::size_t pos0 = 0, double scale = 0) {
  using A = accum_t<T>;
  const A sc = detail::storage_scale<T>(scale);
  for (std::size_t n = 0; n < B * S; ++n) {
    if (tok[n] < 0) throw std::out_of_range("embedding_forward: negative token id");
    const T* e = wte + static_cast<std::size_t>(tok[n]) * C;
    const T* p = wpe ? wpe + (pos0 + n % S) * C : nullptr;
    for (std::size_t c = 0; c < C; ++c) {
      A v = detail::scaled(e[c], sc);
      if (p) v += to_float(p[c]);
      out[n * C + c] = from_float<T>(v);
    }
  }
}

/// dwte[V, C] += ...; dwpe[S, C] += ... (either may be null to skip it); dout[B*S, C]. scale > 0:
/// the token embedding's gradient is dout · scale, each product rounded to T (the forward's).
template <storage_type T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tok, std::size_t B,
                        std::size_t S, std::size_t C, double scale = 0) {
  using A = accum_t<T>;
  const A sc = detail::storage_scale<T>(scale);
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
        for (std::size_t c = 0; c < C; ++c) acc[c] += detail::scaled(g[c], sc);
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

/// out[N, C]: wte_part[tok[n] − vocab_begin, :] for tokens in [vocab_begin, vocab_begin + rows),
/// zero for the others. wte_part[rows, C] is this rank's slice of the vocabulary. scale > 0: times
/// scale, as embedding_forward.
template <storage_type T>
void embedding_forward_vocab_range(T* out, const std::int32_t* tok, const T* wte_part, std::size_t vocab_begin,
                                   std::size_t rows, std::size_t N, std::size_t C, double scale = 0) {
  const accum_t<T> sc = detail::storage_scale<T>(scale);
  for (std::size_t n = 0; n < N; ++n) {
    if (tok[n] < 0) throw std::out_of_range("embedding_forward_vocab_range: negative token id");
    const std::size_t t = static_cast<std::size_t>(tok[n]);
    const bool mine = t >= vocab_begin && t < vocab_begin + rows;
    const T* e = mine ? wte_part + (t - vocab_begin) * C : nullptr;
    for (std::size_t c = 0; c < C; ++c) out[n * C + c] = from_float<T>(mine ? detail::scaled(e[c], sc) : accum_t<T>(0));
  }
}

/// dwte_part[rows, C] += the gradients of the tokens in [vocab_begin, vocab_begin + rows), grouped
/// by token and rounded once per row as embedding_backward does; dout[N, C]; scale as there.
template <storage_type T>
void embedding_backward_vocab_range(T* dwte_part, const T* dout, const std::int32_t* tok, std::size_t vocab_begin,
                                    std::size_t rows, std::size_t N, std::size_t C, double scale = 0) {
  using A = accum_t<T>;
  const A sc = detail::storage_scale<T>(scale);
  std::vector<std::size_t> order;
  for (std::size_t n = 0; n < N; ++n) {
    if (tok[n] < 0) throw std::out_of_range("embedding_backward_vocab_range: negative token id");
    const std::size_t t = static_cast<std::size_t>(tok[n]);
    if (t >= vocab_begin && t < vocab_begin + rows) order.push_back(n);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return tok[a] < tok[b]; });
  std::vector<A> acc(C);
  for (std::size_t i = 0; i < order.size();) {
    T* row = dwte_part + (static_cast<std::size_t>(tok[order[i]]) - vocab_begin) * C;
    for (std::size_t c = 0; c < C; ++c) acc[c] = to_float(row[c]);
    std::size_t j = i;
    for (; j < order.size() && tok[order[j]] == tok[order[i]]; ++j) {
      const T* g = dout + order[j] * C;
      for (std::size_t c = 0; c < C; ++c) acc[c] += detail::scaled(g[c], sc);
    }
    for (std::size_t c = 0; c < C; ++c) row[c] = from_float<T>(acc[c]);
    i = j;
  }
}

/// x[N, C] += wpe[(row0 + n) % S, :], rounded once per element: the position embedding of rows
/// that start at flat token row0 of a micro-batch of sequences of S tokens.
template <storage_type T>
void position_add(T* x, const T* wpe, std::size_t row0, std::size_t N, std::size_t S, std::size_t C) {
  for (std::size_t n = 0; n < N; ++n) {
    const T* p = wpe + ((row0 + n) % S) * C;
    for (std::size_t c = 0; c < C; ++c) x[n * C + c] = from_float<T>(to_float(x[n * C + c]) + to_float(p[c]));
  }
}

}  // namespace memalg::backend::cpu

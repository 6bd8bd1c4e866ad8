// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/cross_entropy.hpp — softmax cross-entropy, and the chunked tied lm-head + CE
// (reference).
//
//   forward:  lse_n = log Σ_v exp(logit_nv) (max-subtracted), loss[n] = lse_n − logit[n, target_n]
//             (accum_t<T>: float, double for T = double); returns mean_n loss[n]
//   backward: dlogits = (softmax − onehot(target))·dloss/N   (written; may alias logits)
//
// Chunked lm-head (tied weights, as in GPT-2): logits = hidden·wteᵀ with hidden[N, C], wte[V, C].
// The N×V logits dominate activation memory for large vocabularies, so rows are processed in
// chunks of R: only an R×V logits buffer exists at a time, and the backward recomputes it. Each
// chunk does exactly what the unchunked path (linear_forward → cross_entropy_* → linear_backward)
// does, with logits and dlogits rounded to T, and dwte is accumulated over all chunks in
// accum_t<T> and rounded once — so chunked and unchunked results agree.
//
// Vocabulary-parallel (Megatron-LM's vocab_parallel_cross_entropy, megatron/core/tensor_parallel/
// cross_entropy.py): each tensor-parallel rank holds the logits of columns [vocab_begin,
// vocab_begin + V) of the whole vocabulary. Per row, three all-reduces over the ranks give the
// global max (op max), Σ exp(logit − max) and the target's logit (op sum: the one rank that holds
// the target contributes it, the others zero); then loss = log Σ + max − logit[target] and the
// logits become their gradient in place, (exp(logit − max)/Σ − onehot)·dloss/N. The steps are
// separate functions so that a caller puts its collectives between them:
//   vocab_parallel_ce_max → all-reduce max → vocab_parallel_ce_partials → all-reduce sum of
//   {Σexp, target logit} → vocab_parallel_ce_finish.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "memalg/backend/cpu/linear.hpp"
#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

namespace detail {

template <storage_type T>
accum_t<T> row_lse(const T* logits, std::size_t V) {
  using A = accum_t<T>;
  A mx = to_float(logits[0]);
  for (std::size_t v = 1; v < V; ++v) mx = std::max(mx, to_float(logits[v]));
  A sum = 0;
  for (std::size_t v = 0; v < V; ++v) sum += std::exp(to_float(logits[v]) - mx);
  return mx + std::log(sum);
}

inline std::size_t checked_target(std::int32_t t, std::size_t V) {
  if (t < 0 || static_cast<std::size_t>(t) >= V) throw std::out_of_range("cross_entropy: target outside [0, V)");
  return static_cast<std::size_t>(t);
}

/// Per-row losses only (no mean).
template <storage_type T>
void cross_entropy_rows(accum_t<T>* loss, const T* logits, const std::int32_t* targets,
                        std::size_t N, std::size_t V) {
  for (std::size_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    loss[n] = row_lse(row, V) - to_float(row[checked_target(targets[n], V)]);
  }
}

/// dlogits = (softmax − onehot)·g, g = dloss/N of the whole batch.
template <storage_type T>
void cross_entropy_grad_rows(T* dlogits, const T* logits, const std::int32_t* targets,
                             accum_t<T> g, std::size_t N, std::size_t V) {
  using A = accum_t<T>;
  for (std::size_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    T* drow = dlogits + n * V;
    const std::size_t tgt = checked_target(targets[n], V);
    const A lse = row_lse(row, V);  // before any write: dlogits may alias logits
    for (std::size_t v = 0; v < V; ++v) {
      const A p = std::exp(to_float(row[v]) - lse);
      drow[v] = from_float<T>((p - (v == tgt ? A(1) : A(0))) * g);
    }
  }
}

template <class A>
A mean_of(const A* x, std::size_t N) {
  A s = 0;
  for (std::size_t n = 0; n < N; ++n) s += x[n];
  return N ? s / static_cast<A>(N) : A(0);
}

}  // namespace detail

/// loss[N] per-row losses; returns their mean. logits[N, V], targets[N] in [0, V).
template <storage_type T>
accum_t<T> cross_entropy_forward(accum_t<T>* loss, const T* logits, const std::int32_t* targets,
                                 std::size_t N, std::size_t V) {
  detail::cross_entropy_rows(loss, logits, targets, N, V);
  return detail::mean_of(loss, N);
}

/// dlogits[N, V] written (may alias logits); dloss is the gradient of the mean loss.
template <storage_type T>
void cross_entropy_backward(T* dlogits, const T* logits, const std::int32_t* targets,
                            accum_t<T> dloss, std::size_t N, std::size_t V) {
  detail::cross_entropy_grad_rows(dlogits, logits, targets, dloss / static_cast<accum_t<T>>(N), N, V);
}

/// Per row of this rank's logits[N, V]: the largest logit (to be max-reduced over the ranks).
template <storage_type T>
void vocab_parallel_ce_max(accum_t<T>* row_max, const T* logits, std::size_t N, std::size_t V) {
  for (std::size_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    accum_t<T> mx = to_float(row[0]);
    for (std::size_t v = 1; v < V; ++v) mx = std::max(mx, to_float(row[v]));
    row_max[n] = mx;
  }
}

/// Per row, with the global max: parts[2n] = Σ_v exp(logit − max) over this rank's columns and
/// parts[2n + 1] = the target's logit if this rank holds it, else 0 (both to be sum-reduced).
/// targets are indices into the whole vocabulary of `vocab` columns.
template <storage_type T>
void vocab_parallel_ce_partials(accum_t<T>* parts, const T* logits, const accum_t<T>* row_max,
                                const std::int32_t* targets, std::size_t vocab_begin, std::size_t N, std::size_t V,
                                std::size_t vocab) {
  using A = accum_t<T>;
  for (std::size_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    A sum = 0;
    for (std::size_t v = 0; v < V; ++v) sum += std::exp(to_float(row[v]) - row_max[n]);
    const std::size_t t = detail::checked_target(targets[n], vocab);
    parts[2 * n] = sum;
    parts[2 * n + 1] = t >= vocab_begin && t < vocab_begin + V ? to_float(row[t - vocab_begin]) : A(0);
  }
}

/// With the reduced max and parts: loss[N] per row (returns their mean) and the logits replaced by
/// their gradient for this rank's columns, dloss the gradient of the mean loss.
template <storage_type T>
accum_t<T> vocab_parallel_ce_finish(accum_t<T>* loss, T* logits, const accum_t<T>* row_max, const accum_t<T>* parts,
                                    const std::int32_t* targets, std::size_t vocab_begin, accum_t<T> dloss,
                                    std::size_t N, std::size_t V) {
  using A = accum_t<T>;
  const A g = dloss / static_cast<A>(N);
  for (std::size_t n = 0; n < N; ++n) {
    const A lse = row_max[n] + std::log(parts[2 * n]);
    loss[n] = lse - parts[2 * n + 1];
    T* row = logits + n * V;
    const std::size_t t = static_cast<std::size_t>(targets[n]);
    for (std::size_t v = 0; v < V; ++v) {
      const A p = std::exp(to_float(row[v]) - lse);
      row[v] = from_float<T>((p - (vocab_begin + v == t ? A(1) : A(0))) * g);
    }
  }
  return detail::mean_of(loss, N);
}

/// Chunked tied lm-head + CE forward: loss[N] per row, returns the mean. R = rows per chunk.
template <storage_type T>
accum_t<T> lm_head_ce_forward(accum_t<T>* loss, const T* hidden, const T* wte,
                              const std::int32_t* targets, std::size_t N, std::size_t C,
                              std::size_t V, std::size_t R) {
  if (R == 0) throw std::invalid_argument("lm_head_ce_forward: chunk rows R must be positive");
  std::vector<T> logits(std::min(R, N) * V);  // the only logits buffer: one chunk
  for (std::size_t n0 = 0; n0 < N; n0 += R) {
    const std::size_t rows = std::min(R, N - n0);
    linear_forward(logits.data(), hidden + n0 * C, wte, static_cast<const T*>(nullptr), rows, C, V);
    detail::cross_entropy_rows(loss + n0, logits.data(), targets + n0, rows, V);
  }
  return detail::mean_of(loss, N);
}

/// Chunked tied lm-head + CE backward: dhidden[N, C] written (may be null), dwte[V, C] accumulated
/// (may be null); recomputes each chunk's logits.
template <storage_type T>
void lm_head_ce_backward(T* dhidden, T* dwte, const T* hidden, const T* wte,
                         const std::int32_t* targets, accum_t<T> dloss, std::size_t N,
                         std::size_t C, std::size_t V, std::size_t R) {
  using A = accum_t<T>;
  if (R == 0) throw std::invalid_argument("lm_head_ce_backward: chunk rows R must be positive");
  const A g = dloss / static_cast<A>(N);
  std::vector<T> logits(std::min(R, N) * V);
  std::vector<A> dwte_acc;
  if (dwte) {
    dwte_acc.resize(V * C);
    for (std::size_t k = 0; k < V * C; ++k) dwte_acc[k] = to_float(dwte[k]);
  }
  for (std::size_t n0 = 0; n0 < N; n0 += R) {
    const std::size_t rows = std::min(R, N - n0);
    linear_forward(logits.data(), hidden + n0 * C, wte, static_cast<const T*>(nullptr), rows, C, V);
    detail::cross_entropy_grad_rows(logits.data(), logits.data(), targets + n0, g, rows, V);  // in place
    if (dhidden) detail::linear_input_grad(dhidden + n0 * C, logits.data(), wte, rows, C, V);
    if (dwte) detail::linear_weight_grad_accumulate(dwte_acc.data(), logits.data(), hidden + n0 * C, rows, C, V);
  }
  if (dwte)
    for (std::size_t k = 0; k < V * C; ++k) dwte[k] = from_float<T>(dwte_acc[k]);
}

}  // namespace memalg::backend::cpu

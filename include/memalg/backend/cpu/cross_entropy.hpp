// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/cross_entropy.hpp — softmax cross-entropy (reference).
//
//   forward:  lse_n = log Σ_v exp(logit_nv) (max-subtracted), loss[n] = lse_n − logit[n, target_n]
//             (accum_t<T>: float, double for T = double); returns mean_n loss[n]
//   backward: dlogits = (softmax − onehot(target))·dloss/N   (written; may alias logits)
//
// Gemma 2's final logit softcapping (modeling_gemma2.py, Gemma2ForCausalLM.forward:
// `logits = torch.tanh(logits / cap) * cap`): logit_softcap caps the logits in place, rounded to
// T; the loss then reads the capped logits c, and the backward given `softcap` carries the
// gradient back through the cap, d/dx = (1 − (c/softcap)²)·d/dc, reading c before it writes.
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

/// dlogits = (softmax − onehot)·g, g = dloss/N of the whole batch; softcap > 0: the logits are
/// capped ones and the gradient is carried back through the cap.
template <storage_type T>
void cross_entropy_grad_rows(T* dlogits, const T* logits, const std::int32_t* targets,
                             accum_t<T> g, std::size_t N, std::size_t V, accum_t<T> softcap = 0) {
  using A = accum_t<T>;
  for (std::size_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    T* drow = dlogits + n * V;
    const std::size_t tgt = checked_target(targets[n], V);
    const A lse = row_lse(row, V);  // before any write: dlogits may alias logits
    for (std::size_t v = 0; v < V; ++v) {
      const A c = to_float(row[v]);
      const A p = std::exp(c - lse);
      A d = (p - (v == tgt ? A(1) : A(0))) * g;
      if (softcap > 0) d *= A(1) - (c / softcap) * (c / softcap);
      drow[v] = from_float<T>(d);
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

/// dlogits[N, V] written (may alias logits); dloss is the gradient of the mean loss. softcap > 0:
/// `logits` were capped by logit_softcap(softcap), and dlogits is the gradient of the logits
/// before the cap.
template <storage_type T>
void cross_entropy_backward(T* dlogits, const T* logits, const std::int32_t* targets,
                            accum_t<T> dloss, std::size_t N, std::size_t V, accum_t<T> softcap = 0) {
  detail::cross_entropy_grad_rows(dlogits, logits, targets, dloss / static_cast<accum_t<T>>(N), N, V, softcap);
}

/// x[n] ← softcap·tanh(x / softcap), rounded to T (Gemma 2's final logit softcapping).
template <storage_type T>
void logit_softcap(T* x, std::size_t n, accum_t<T> softcap) {
  if (!(softcap > 0)) throw std::invalid_argument("logit_softcap: the cap must be positive");
  for (std::size_t i = 0; i < n; ++i) x[i] = from_float<T>(softcap * std::tanh(to_float(x[i]) / softcap));
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

}  // namespace memalg::backend::cpu

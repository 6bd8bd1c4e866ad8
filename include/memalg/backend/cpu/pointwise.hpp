// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/pointwise.hpp — the GPT runtime's small host helpers: adds, LayerNorm statistics, dropout rows.
//
// What the CPU step backend (backend/cpu/step_backend.hpp) computes outside the kernels:
//   add(out, a, b)         out = a + b, accumulated in accum_t<T> and rounded once (out may alias a or b)
//   add_bias(x, bias)      x[N, C] += bias[C], rounded once per element
//   layernorm_stats        the row mean and 1/√(var + ε) of layernorm.hpp's forward, for its backward
//   dropout_seed / dropout_rows
//                          one counter-based stream per global sequence, so that masks are the same
//                          on every data-parallel split and in recomputation
// (The parameters' initialisation is the core's, for every backend: exec/init.hpp.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>

#include "memalg/backend/cpu/dropout.hpp"
#include "memalg/backend/cpu/layernorm.hpp"
#include "memalg/core/float16.hpp"
#include "memalg/core/random.hpp"

namespace memalg::backend::cpu {

/// out[i] = a[i] + b[i] for i < n, rounded once; out may alias a or b.
template <storage_type T>
void add(T* out, const T* a, const T* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

/// x[N, C] += bias[C] (row-parallel outputs get their bias once, after the all-reduce).
template <storage_type T>
void add_bias(T* x, const T* bias, std::size_t N, std::size_t C) {
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t i = 0; i < C; ++i) x[n * C + i] = from_float<T>(to_float(x[n * C + i]) + to_float(bias[i]));
}

/// mean[N], rstd[N] of in[N, C], as layernorm_forward computes them (biased variance, ε = eps).
/// LayerNorm's backward recomputes them from the saved input: the plan keeps only the norm's input.
template <storage_type T>
void layernorm_stats(accum_t<T>* mean, accum_t<T>* rstd, const T* in, std::size_t N, std::size_t C, double eps) {
  using A = accum_t<T>;
  for (std::size_t n = 0; n < N; ++n) {
    A m = 0, v = 0;
    for (std::size_t i = 0; i < C; ++i) m += to_float(in[n * C + i]);
    m /= static_cast<A>(C);
    for (std::size_t i = 0; i < C; ++i) {
      const A d = to_float(in[n * C + i]) - m;
      v += d * d;
    }
    mean[n] = m;
    rstd[n] = A(1) / std::sqrt(v / static_cast<A>(C) + static_cast<A>(eps));
  }
}

/// The global index of sequence `sequence` of micro-batch `micro` of step `step` (1-based) on
/// data-parallel rank `dp_rank`: the same sequence gets the same index on any split.
constexpr std::uint64_t dropout_global_sequence(std::uint64_t step, std::uint64_t grad_accum, std::uint64_t micro,
                                                std::uint64_t micro_batch, std::uint64_t dp, std::uint64_t dp_rank,
                                                std::uint64_t sequence) {
  return (step * grad_accum + micro) * micro_batch * dp + dp_rank * micro_batch + sequence;
}
/// The dropout stream of one site (1'000'000 for the embeddings, 2l / 2l + 1 for block l's two
/// residual branches) and one global sequence.
constexpr std::uint64_t dropout_seed(std::uint64_t seed, std::uint64_t site, std::uint64_t global_sequence) {
  return splitmix64(seed + 0x5bd1e995ULL * (site + 1) + splitmix64(global_sequence));
}
/// Dropout of `rows` sequences of `row_len` elements each; row b draws from
/// dropout_seed(seed, site, first_sequence + b). out may alias in.
template <storage_type T>
void dropout_rows(T* out, std::uint8_t* mask, const T* in, std::size_t rows, std::size_t row_len, float p,
                  std::uint64_t seed, std::uint64_t site, std::uint64_t first_sequence) {
  for (std::size_t b = 0; b < rows; ++b)
    dropout_forward(out + b * row_len, mask + b * row_len, in + b * row_len, row_len, p,
                    dropout_seed(seed, site, first_sequence + b));
}

/// The same masks for a contiguous part of those rows: elements [offset, offset + n) of the rows ×
/// row_len elements (a sequence-parallel rank's token rows). Element g of sequence g / row_len
/// draws index g % row_len of that sequence's stream, so every split draws the one-rank mask.
template <storage_type T>
void dropout_rows_range(T* out, std::uint8_t* mask, const T* in, std::size_t n, std::size_t row_len,
                        std::size_t offset, float p, std::uint64_t seed, std::uint64_t site,
                        std::uint64_t first_sequence) {
  using A = accum_t<T>;
  const A keep_prob = A(1) - static_cast<A>(p);
  for (std::size_t k = 0; k < n;) {
    const std::size_t g = offset + k, b = g / row_len;
    const std::uint64_t s = dropout_seed(seed, site, first_sequence + b);
    const std::size_t end = std::min(n, (b + 1) * row_len - offset);  // the rest of this sequence
    for (; k < end; ++k) {
      const bool keep = dropout_keep(s, (offset + k) % row_len, p);
      out[k] = from_float<T>(keep ? to_float(in[k]) / keep_prob : A(0));
      mask[k] = keep ? 1 : 0;
    }
  }
}

}  // namespace memalg::backend::cpu

// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/dropout.cuh — inverted dropout with a counter-based mask.
//
//   forward:  keep = memalg::dropout_keep(seed, offset + i, p); out = keep ? in/(1−p) : 0;
//             mask[i] = keep (one byte, 0/1)
//   backward: din = mask ? dout/(1−p) : 0                                              (=)
// The mask of element i depends only on (seed, offset + i, p), exactly as on the CPU backend, so
// both backends drop the same elements. out may alias in, din may alias dout.
//
// dropout_rows / dropout_rows_range: the CPU backend's (backend/cpu/pointwise.hpp) one stream per
// global sequence, seed cpu::dropout_seed(seed, site, first_sequence + b); the range form is a
// contiguous part [offset, offset + n) of the rows × row_len elements (a sequence-parallel rank's
// token rows): element g draws index g % row_len of sequence g / row_len's stream, so every split
// draws the one-rank mask.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "memalg/backend/cpu/pointwise.hpp"
#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/pointwise.cuh"
#include "memalg/core/random.hpp"

namespace memalg::backend::cuda {

namespace detail {

template <class T>
struct dropout_forward_op {
  T* out;
  std::uint8_t* mask;
  const T* in;
  float p;
  std::uint64_t seed;
  std::uint64_t offset;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const packed<T, W> x = load_packed<W>(in, i);
    packed<T, W> y;
    packed<std::uint8_t, W> m;
    const float keep_prob = 1.0f - p;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const std::uint64_t index = offset + static_cast<std::uint64_t>(i) * W + k;
      const bool keep = memalg::dropout_keep(seed, index, p);
      m.v[k] = keep ? 1 : 0;
      y.v[k] = from_float<T>(keep ? to_float(x.v[k]) / keep_prob : 0.0f);
    }
    store_packed<W>(out, i, y);
    store_packed<W>(mask, i, m);
  }
};

template <class T>
struct dropout_backward_op {
  T* din;
  const std::uint8_t* mask;
  const T* dout;
  float p;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const packed<T, W> g = load_packed<W>(dout, i);
    const packed<std::uint8_t, W> m = load_packed<W>(mask, i);
    packed<T, W> y;
    const float keep_prob = 1.0f - p;
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = from_float<T>(m.v[k] != 0 ? to_float(g.v[k]) / keep_prob : 0.0f);
    store_packed<W>(din, i, y);
  }
};

inline void check_dropout_p(float p) {
  if (!(p >= 0.0f && p < 1.0f)) throw std::invalid_argument("dropout: probability must be in [0, 1)");
}

}  // namespace detail

/// Dropout over n elements; element i draws memalg::dropout_keep(seed, index_offset + i, p).
template <storage_type T>
void dropout_forward(T* out, std::uint8_t* mask, const T* in, std::int64_t n, float p, std::uint64_t seed,
                     std::uint64_t index_offset = 0, cudaStream_t stream = nullptr) {
  detail::check_dropout_p(p);
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(n, common_vec_width(w, n, out, in, mask),
                      detail::dropout_forward_op<T>{out, mask, in, p, seed, index_offset}, stream, "dropout_forward");
}

/// Dropout over elements [offset, offset + n) of rows of row_len elements, sequence b drawing the
/// stream cpu::dropout_seed(seed, site, first_sequence + b) at index (offset + k) % row_len.
template <storage_type T>
void dropout_rows_range(T* out, std::uint8_t* mask, const T* in, std::size_t n, std::size_t row_len, std::size_t offset,
                        float p, std::uint64_t seed, std::uint64_t site, std::uint64_t first_sequence,
                        cudaStream_t stream = nullptr) {
  if (row_len == 0) throw std::invalid_argument("dropout_rows_range: row_len must be positive");
  for (std::size_t k = 0; k < n;) {  // one launch per sequence the part touches
    const std::size_t g = offset + k, b = g / row_len;
    const std::size_t len = std::min(n - k, (b + 1) * row_len - g);
    dropout_forward(out + k, mask + k, in + k, static_cast<std::int64_t>(len), p,
                    cpu::dropout_seed(seed, site, first_sequence + b), g - b * row_len, stream);
    k += len;
  }
}

/// Dropout over rows × row_len elements, one stream per row (the CPU's dropout_rows).
template <storage_type T>
void dropout_rows(T* out, std::uint8_t* mask, const T* in, std::size_t rows, std::size_t row_len, float p,
                  std::uint64_t seed, std::uint64_t site, std::uint64_t first_sequence, cudaStream_t stream = nullptr) {
  dropout_rows_range(out, mask, in, rows * row_len, row_len, 0, p, seed, site, first_sequence, stream);
}

template <storage_type T>
void dropout_backward(T* din, const T* dout, const std::uint8_t* mask, std::int64_t n, float p,
                      cudaStream_t stream = nullptr) {
  detail::check_dropout_p(p);
  constexpr int w = max_vec_width(sizeof(T));
  launch_pointwise<w>(n, common_vec_width(w, n, din, mask, dout), detail::dropout_backward_op<T>{din, mask, dout, p},
                      stream, "dropout_backward");
}

}  // namespace memalg::backend::cuda

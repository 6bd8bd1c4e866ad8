// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/linear.hpp — fully connected layer, PyTorch nn.Linear layout (reference).
//
//   forward:  out[N, OC] = in[N, IC] · W[OC, IC]ᵀ + bias[OC]      (bias may be null)
//   backward: din = dout · W   (written, or accumulated on request),  dW += doutᵀ · in,
//             dbias += Σ_n dout   (accumulated)
//
// Every dot product and every parameter-gradient sum runs in accum_t<T>; the old value of dW/dbias
// is loaded into the same accumulator so the result is rounded to T exactly once.
#pragma once

#include <cstddef>
#include <vector>

#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

namespace detail {

/// acc[OC, IC] += doutᵀ · in over N rows, in row order (shared with the chunked lm-head so that
/// chunked and unchunked gradients are summed in the same order).
template <storage_type T>
void linear_weight_grad_accumulate(accum_t<T>* acc, const T* dout, const T* in, std::size_t N,
                                   std::size_t IC, std::size_t OC) {
  for (std::size_t n = 0; n < N; ++n) {
    for (std::size_t o = 0; o < OC; ++o) {
      const accum_t<T> g = to_float(dout[n * OC + o]);
      for (std::size_t i = 0; i < IC; ++i) acc[o * IC + i] += g * to_float(in[n * IC + i]);
    }
  }
}

/// din[N, IC] = dout[N, OC] · W[OC, IC]; with `accumulate`, din += dout · W (the product summed
/// in accum_t<T>, then added to the old value and rounded once, as a GEMM with β = 1).
template <storage_type T>
void linear_input_grad(T* din, const T* dout, const T* W, std::size_t N, std::size_t IC,
                       std::size_t OC, bool accumulate = false) {
  std::vector<accum_t<T>> row(IC);
  for (std::size_t n = 0; n < N; ++n) {
    for (auto& r : row) r = 0;
    for (std::size_t o = 0; o < OC; ++o) {
      const accum_t<T> g = to_float(dout[n * OC + o]);
      for (std::size_t i = 0; i < IC; ++i) row[i] += g * to_float(W[o * IC + i]);
    }
    if (accumulate)
      for (std::size_t i = 0; i < IC; ++i) din[n * IC + i] = from_float<T>(to_float(din[n * IC + i]) + row[i]);
    else
      for (std::size_t i = 0; i < IC; ++i) din[n * IC + i] = from_float<T>(row[i]);
  }
}

}  // namespace detail

template <storage_type T>
void linear_forward(T* out, const T* in, const T* W, const T* bias, std::size_t N, std::size_t IC,
                    std::size_t OC) {
  using A = accum_t<T>;
  for (std::size_t n = 0; n < N; ++n) {
    for (std::size_t o = 0; o < OC; ++o) {
      A v = bias ? to_float(bias[o]) : A(0);
      for (std::size_t i = 0; i < IC; ++i) v += to_float(in[n * IC + i]) * to_float(W[o * IC + i]);
      out[n * OC + o] = from_float<T>(v);
    }
  }
}

/// din may be null (nothing upstream needs it); dbias may be null (layer without bias).
/// accumulate_din: din += dout · W instead of = (an input several layers read).
template <storage_type T>
void linear_backward(T* din, T* dW, T* dbias, const T* dout, const T* in, const T* W,
                     std::size_t N, std::size_t IC, std::size_t OC, bool accumulate_din = false) {
  using A = accum_t<T>;
  if (din) detail::linear_input_grad(din, dout, W, N, IC, OC, accumulate_din);
  if (dW) {
    std::vector<A> acc(OC * IC);
    for (std::size_t k = 0; k < OC * IC; ++k) acc[k] = to_float(dW[k]);
    detail::linear_weight_grad_accumulate(acc.data(), dout, in, N, IC, OC);
    for (std::size_t k = 0; k < OC * IC; ++k) dW[k] = from_float<T>(acc[k]);
  }
  if (dbias) {
    for (std::size_t o = 0; o < OC; ++o) {
      A v = to_float(dbias[o]);
      for (std::size_t n = 0; n < N; ++n) v += to_float(dout[n * OC + o]);
      dbias[o] = from_float<T>(v);
    }
  }
}

}  // namespace memalg::backend::cpu

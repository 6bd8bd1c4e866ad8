// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/conv1d.hpp — 1-D convolution over the sequence axis, PyTorch
// nn.Conv1d(in, out, kernel, padding="same") semantics in the runtime's token-major layout
// (reference).
//
// Layout: in[B, S, IC] and out[B, S, OC] are token-major (row n = b·S + t, channels contiguous),
// the layout every other kernel of the runtime uses — not PyTorch's channel-major [B, C, S].
// The weight keeps PyTorch's layout W[OC, IC, K], so a state dict loads unchanged; bias[OC].
// padding="same" (PyTorch Conv1d documentation; stride 1, dilation 1): the K − 1 zero-padded
// positions are split with left = ⌊(K − 1)/2⌋ before the sequence and the rest after it, as
// PyTorch does for even kernels too. Like PyTorch it is a cross-correlation:
//
//   forward:  out[b,t,o] = bias[o] + Σ_i Σ_k W[o,i,k]·in[b, t + k − left, i]   (zero outside [0, S))
//   backward: din[b,s,i] = Σ_o Σ_k W[o,i,k]·dout[b, s − k + left, o]           (written)
//             dW[o,i,k] += Σ_b Σ_t dout[b,t,o]·in[b, t + k − left, i]           (accumulated)
//             dbias[o]  += Σ_b Σ_t dout[b,t,o]                                  (accumulated)
//
// Utterances never see each other: the window is clipped at each utterance's [0, S). Padded
// frames at an utterance's end are read as they are; a padded batch computes what each utterance
// alone would when its padded positions hold zeros (batchnorm.hpp's masked output does that).
// Every sum runs in accum_t<T> and is rounded to T once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

struct conv1d_shape {
  std::size_t B;   // batch
  std::size_t S;   // sequence length
  std::size_t IC;  // input channels
  std::size_t OC;  // output channels
  std::size_t K;   // kernel width

  /// Zero positions before the sequence (padding="same", PyTorch's split for even K too).
  constexpr std::size_t left() const noexcept { return (K - 1) / 2; }
  constexpr std::size_t rows() const noexcept { return B * S; }
  constexpr std::size_t weight_elements() const noexcept { return OC * IC * K; }
  /// Input position read by output position t through tap k, or −1 when it is padding.
  constexpr std::int64_t source(std::size_t t, std::size_t k) const noexcept {
    const std::int64_t s = static_cast<std::int64_t>(t + k) - static_cast<std::int64_t>(left());
    return s >= 0 && s < static_cast<std::int64_t>(S) ? s : -1;
  }
};

namespace detail {
inline void check_conv1d_shape(const conv1d_shape& sh) {
  if (sh.K == 0 || sh.IC == 0 || sh.OC == 0) throw std::invalid_argument("conv1d: IC, OC and K must be positive");
}
}  // namespace detail

/// out[B·S, OC]; bias may be null.
template <storage_type T>
void conv1d_forward(T* out, const T* in, const T* W, const T* bias, const conv1d_shape& sh) {
  using A = accum_t<T>;
  detail::check_conv1d_shape(sh);
  for (std::size_t b = 0; b < sh.B; ++b)
    for (std::size_t t = 0; t < sh.S; ++t)
      for (std::size_t o = 0; o < sh.OC; ++o) {
        A v = bias ? to_float(bias[o]) : A(0);
        for (std::size_t k = 0; k < sh.K; ++k) {
          const std::int64_t s = sh.source(t, k);
          if (s < 0) continue;
          const T* x = in + (b * sh.S + static_cast<std::size_t>(s)) * sh.IC;
          for (std::size_t i = 0; i < sh.IC; ++i) v += to_float(W[(o * sh.IC + i) * sh.K + k]) * to_float(x[i]);
        }
        out[(b * sh.S + t) * sh.OC + o] = from_float<T>(v);
      }
}

/// din[B·S, IC] written (may be null), dW[OC, IC, K] and dbias[OC] accumulated (either may be null).
template <storage_type T>
void conv1d_backward(T* din, T* dW, T* dbias, const T* dout, const T* in, const T* W, const conv1d_shape& sh) {
  using A = accum_t<T>;
  detail::check_conv1d_shape(sh);
  if (din) {
    std::vector<A> row(sh.IC);
    for (std::size_t b = 0; b < sh.B; ++b)
      for (std::size_t s = 0; s < sh.S; ++s) {
        for (auto& r : row) r = 0;
        // Output position t reads s through tap k when t + k − left = s.
        for (std::size_t k = 0; k < sh.K; ++k) {
          const std::int64_t t = static_cast<std::int64_t>(s + sh.left()) - static_cast<std::int64_t>(k);
          if (t < 0 || t >= static_cast<std::int64_t>(sh.S)) continue;
          const T* dy = dout + (b * sh.S + static_cast<std::size_t>(t)) * sh.OC;
          for (std::size_t o = 0; o < sh.OC; ++o) {
            const A g = to_float(dy[o]);
            for (std::size_t i = 0; i < sh.IC; ++i) row[i] += g * to_float(W[(o * sh.IC + i) * sh.K + k]);
          }
        }
        for (std::size_t i = 0; i < sh.IC; ++i) din[(b * sh.S + s) * sh.IC + i] = from_float<T>(row[i]);
      }
  }
  if (dW) {
    std::vector<A> acc(sh.weight_elements());
    for (std::size_t e = 0; e < acc.size(); ++e) acc[e] = to_float(dW[e]);
    for (std::size_t b = 0; b < sh.B; ++b)
      for (std::size_t t = 0; t < sh.S; ++t) {
        const T* dy = dout + (b * sh.S + t) * sh.OC;
        for (std::size_t k = 0; k < sh.K; ++k) {
          const std::int64_t s = sh.source(t, k);
          if (s < 0) continue;
          const T* x = in + (b * sh.S + static_cast<std::size_t>(s)) * sh.IC;
          for (std::size_t o = 0; o < sh.OC; ++o) {
            const A g = to_float(dy[o]);
            for (std::size_t i = 0; i < sh.IC; ++i) acc[(o * sh.IC + i) * sh.K + k] += g * to_float(x[i]);
          }
        }
      }
    for (std::size_t e = 0; e < acc.size(); ++e) dW[e] = from_float<T>(acc[e]);
  }
  if (dbias) {
    for (std::size_t o = 0; o < sh.OC; ++o) {
      A v = to_float(dbias[o]);
      for (std::size_t n = 0; n < sh.rows(); ++n) v += to_float(dout[n * sh.OC + o]);
      dbias[o] = from_float<T>(v);
    }
  }
}

}  // namespace memalg::backend::cpu

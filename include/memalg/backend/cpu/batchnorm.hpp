// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/batchnorm.hpp — BatchNorm1d over (B, S) per channel, training mode, with a
// padding mask (reference).
//
// Layout in[N = B·S, C] (token-major); mask[N] marks real positions (1) and padding (0); a null
// mask means every position is real. With M = Σ_n mask_n (PyTorch BatchNorm1d documentation,
// training mode, batch statistics over every position of the batch; here over the real ones):
//
//   forward:  μ_c = Σ_n m_n·x_nc / M,  σ²_c = Σ_n m_n·(x_nc − μ_c)² / M  (biased, as PyTorch
//             normalises), rstd_c = 1/√(σ²_c + eps), eps 1e-5, x̂ = (x − μ)·rstd,
//             out_nc = m_n·(γ_c·x̂_nc + β_c)  — padded positions are written as 0, so the next
//             convolution reads zeros there (conv1d.hpp) and a padded batch computes what each
//             utterance alone would.
//             Saves mean[C], rstd[C] (accum_t<T>). The backward needs those, the input x (to
//             recompute x̂), γ and the mask.
//   backward: g_n = m_n·γ·dout_n,  din_nc = m_n·rstd_c·(g_nc − Σ_k g_kc/M − x̂_nc·Σ_k g_kc·x̂_kc/M)
//             (written; the layer-norm closed form over the real positions of a channel)
//             dγ_c += Σ_n m_n·dout_nc·x̂_nc,  dβ_c += Σ_n m_n·dout_nc          (accumulated)
//   running statistics (a separate kernel, after the forward): with momentum 0.1 (PyTorch),
//             running_mean = (1 − momentum)·running_mean + momentum·μ,
//             running_var  = (1 − momentum)·running_var  + momentum·σ²·M/(M − 1)  (unbiased);
//             σ² is recovered from the saved rstd as 1/rstd² − eps. With M < 2 the running
//             statistics are left unchanged (PyTorch refuses such a batch in training).
// M = 0 (a channel with no real position) gives μ = 0, σ² = 0 and an all-zero output and din.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

inline constexpr double batchnorm_eps = 1e-5;
inline constexpr double batchnorm_momentum = 0.1;

namespace detail {
inline std::size_t mask_count(const std::uint8_t* mask, std::size_t N) {
  if (!mask) return N;
  std::size_t m = 0;
  for (std::size_t n = 0; n < N; ++n) m += mask[n] != 0 ? 1 : 0;
  return m;
}
inline bool is_real(const std::uint8_t* mask, std::size_t n) { return !mask || mask[n] != 0; }
}  // namespace detail

/// mean[C], rstd[C] of in[N, C] over the real positions (the forward's statistics; a backward
/// that did not keep them recomputes them with this, bit for bit).
template <storage_type T>
void batchnorm_stats(accum_t<T>* mean, accum_t<T>* rstd, const T* in, const std::uint8_t* mask, std::size_t N,
                     std::size_t C) {
  using A = accum_t<T>;
  const std::size_t M = detail::mask_count(mask, N);
  const A inv_m = M ? A(1) / static_cast<A>(M) : A(0);
  for (std::size_t c = 0; c < C; ++c) {
    A m = 0;
    for (std::size_t n = 0; n < N; ++n)
      if (detail::is_real(mask, n)) m += to_float(in[n * C + c]);
    m *= inv_m;
    A v = 0;
    for (std::size_t n = 0; n < N; ++n)
      if (detail::is_real(mask, n)) {
        const A d = to_float(in[n * C + c]) - m;
        v += d * d;
      }
    v *= inv_m;
    mean[c] = m;
    rstd[c] = A(1) / std::sqrt(v + static_cast<A>(batchnorm_eps));
  }
}

/// out[N, C]; mean[C], rstd[C] (saved for the backward); gamma[C], beta[C]; mask[N] may be null.
/// out may alias in.
template <storage_type T>
void batchnorm_forward(T* out, accum_t<T>* mean, accum_t<T>* rstd, const T* in, const T* gamma, const T* beta,
                       const std::uint8_t* mask, std::size_t N, std::size_t C) {
  using A = accum_t<T>;
  batchnorm_stats(mean, rstd, in, mask, N, C);  // reads every input before out is written
  for (std::size_t c = 0; c < C; ++c) {
    const A m = mean[c], r = rstd[c];
    const A g = to_float(gamma[c]), b = to_float(beta[c]);
    for (std::size_t n = 0; n < N; ++n)
      out[n * C + c] = from_float<T>(detail::is_real(mask, n) ? (to_float(in[n * C + c]) - m) * r * g + b : A(0));
  }
}

/// din[N, C] written (may be null; may alias dout); dgamma[C], dbeta[C] accumulated (either may be null).
template <storage_type T>
void batchnorm_backward(T* din, T* dgamma, T* dbeta, const T* dout, const T* in, const T* gamma,
                        const accum_t<T>* mean, const accum_t<T>* rstd, const std::uint8_t* mask, std::size_t N,
                        std::size_t C) {
  using A = accum_t<T>;
  const std::size_t M = detail::mask_count(mask, N);
  const A inv_m = M ? A(1) / static_cast<A>(M) : A(0);
  for (std::size_t c = 0; c < C; ++c) {
    const A m = mean[c], r = rstd[c], g = to_float(gamma[c]);
    A sum_dy = 0, sum_dyx = 0;  // Σ m·dout, Σ m·dout·x̂
    for (std::size_t n = 0; n < N; ++n)
      if (detail::is_real(mask, n)) {
        const A dy = to_float(dout[n * C + c]);
        sum_dy += dy;
        sum_dyx += dy * (to_float(in[n * C + c]) - m) * r;
      }
    if (din) {
      const A mean_g = g * sum_dy * inv_m, mean_gx = g * sum_dyx * inv_m;
      for (std::size_t n = 0; n < N; ++n) {
        A d = 0;
        if (detail::is_real(mask, n)) {
          const A xh = (to_float(in[n * C + c]) - m) * r;
          d = r * (g * to_float(dout[n * C + c]) - mean_g - xh * mean_gx);
        }
        din[n * C + c] = from_float<T>(d);
      }
    }
    if (dgamma) dgamma[c] = from_float<T>(to_float(dgamma[c]) + sum_dyx);
    if (dbeta) dbeta[c] = from_float<T>(to_float(dbeta[c]) + sum_dy);
  }
}

/// running_mean[C], running_var[C] (updated in place) from the forward's mean[C], rstd[C] and the
/// same mask; momentum as PyTorch's (0.1 by default).
template <storage_type T>
void batchnorm_update_running(T* running_mean, T* running_var, const accum_t<T>* mean, const accum_t<T>* rstd,
                              const std::uint8_t* mask, std::size_t N, std::size_t C,
                              double momentum = batchnorm_momentum) {
  using A = accum_t<T>;
  const std::size_t M = detail::mask_count(mask, N);
  if (M < 2) return;
  const A mo = static_cast<A>(momentum);
  const A unbias = static_cast<A>(M) / static_cast<A>(M - 1);
  for (std::size_t c = 0; c < C; ++c) {
    const A var = A(1) / (rstd[c] * rstd[c]) - static_cast<A>(batchnorm_eps);
    running_mean[c] = from_float<T>((A(1) - mo) * to_float(running_mean[c]) + mo * mean[c]);
    running_var[c] = from_float<T>((A(1) - mo) * to_float(running_var[c]) + mo * var * unbias);
  }
}

}  // namespace memalg::backend::cpu

// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/rmsnorm.hpp — root-mean-square normalisation (Zhang & Sennrich 2019), reference.
//
//   forward:  rstd = 1/sqrt(mean(x²) + ε), out = x·rstd·w; saves rstd[N] in accum_t<T>
//   backward: with g = w·dout,  din = rstd·(g − x·rstd²·mean(g·x))   (written)
//             dw += Σ_n dout·x·rstd                                   (accumulated)
// The din formula follows from ∂rstd/∂x_j = −rstd³·x_j / C.
// w_offset: the scale is w_offset + w (1 for Gemma's RMSNorm, `output * (1.0 + self.weight.float())`,
// modeling_gemma2.py, whose weights start at zero); dw is the same either way.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

/// out[N, C]; rstd[N] may be null (inference); w[C]; eps: the model's ε (memalg::norm_eps_of).
template <storage_type T>
void rmsnorm_forward(T* out, accum_t<T>* rstd, const T* in, const T* w, std::size_t N,
                     std::size_t C, double eps, double w_offset = 0) {
  using A = accum_t<T>;
  for (std::size_t n = 0; n < N; ++n) {
    const T* x = in + n * C;
    A ss = 0;
    for (std::size_t c = 0; c < C; ++c) ss += to_float(x[c]) * to_float(x[c]);
    const A r = A(1) / std::sqrt(ss / static_cast<A>(C) + static_cast<A>(eps));
    for (std::size_t c = 0; c < C; ++c)
      out[n * C + c] = from_float<T>(to_float(x[c]) * r * (static_cast<A>(w_offset) + to_float(w[c])));
    if (rstd) rstd[n] = r;
  }
}

/// din[N, C] written (may be null); dw[C] accumulated.
template <storage_type T>
void rmsnorm_backward(T* din, T* dw, const T* dout, const T* in, const T* w,
                      const accum_t<T>* rstd, std::size_t N, std::size_t C, double w_offset = 0) {
  using A = accum_t<T>;
  std::vector<A> dw_acc(C);
  for (std::size_t c = 0; c < C; ++c) dw_acc[c] = dw ? to_float(dw[c]) : A(0);
  for (std::size_t n = 0; n < N; ++n) {
    const T* x = in + n * C;
    const T* dy = dout + n * C;
    const A r = rstd[n];
    A gx_mean = 0;
    for (std::size_t c = 0; c < C; ++c)
      gx_mean += (static_cast<A>(w_offset) + to_float(w[c])) * to_float(dy[c]) * to_float(x[c]);
    gx_mean /= static_cast<A>(C);
    for (std::size_t c = 0; c < C; ++c) {
      const A xv = to_float(x[c]), d = to_float(dy[c]);
      dw_acc[c] += d * xv * r;
      if (din) din[n * C + c] = from_float<T>(r * ((static_cast<A>(w_offset) + to_float(w[c])) * d - xv * r * r * gx_mean));
    }
  }
  if (dw)
    for (std::size_t c = 0; c < C; ++c) dw[c] = from_float<T>(dw_acc[c]);
}

}  // namespace memalg::backend::cpu

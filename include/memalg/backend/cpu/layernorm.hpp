// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/layernorm.hpp — layer normalisation over the channel axis (reference).
//
//   forward:  μ = mean(x), rstd = 1/sqrt(var(x) + ε) (biased variance), x̂ = (x − μ)·rstd,
//             out = x̂·w + b; saves mean[N], rstd[N] in accum_t<T>
//   backward: with g = w·dout,  din = rstd·(g − mean(g) − x̂·mean(g·x̂))   (written)
//             dw += Σ_n dout·x̂,  db += Σ_n dout                           (accumulated)
// (Ba, Kiros & Hinton 2016; the backward is the closed form used by llm.c.)
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

/// out[N, C]; mean[N], rstd[N] may be null (inference); w[C], b[C] (b may be null); eps: the
/// model's ε (memalg::norm_eps_of).
template <storage_type T>
void layernorm_forward(T* out, accum_t<T>* mean, accum_t<T>* rstd, const T* in, const T* w,
                       const T* b, std::size_t N, std::size_t C, double eps) {
  using A = accum_t<T>;
  for (std::size_t n = 0; n < N; ++n) {
    const T* x = in + n * C;
    A m = 0;
    for (std::size_t c = 0; c < C; ++c) m += to_float(x[c]);
    m /= static_cast<A>(C);
    A v = 0;
    for (std::size_t c = 0; c < C; ++c) {
      const A d = to_float(x[c]) - m;
      v += d * d;
    }
    v /= static_cast<A>(C);
    const A r = A(1) / std::sqrt(v + static_cast<A>(eps));
    for (std::size_t c = 0; c < C; ++c) {
      A y = (to_float(x[c]) - m) * r * to_float(w[c]);
      if (b) y += to_float(b[c]);
      out[n * C + c] = from_float<T>(y);
    }
    if (mean) mean[n] = m;
    if (rstd) rstd[n] = r;
  }
}

/// din[N, C] written (may be null); dw[C], db[C] accumulated (db may be null).
template <storage_type T>
void layernorm_backward(T* din, T* dw, T* db, const T* dout, const T* in, const T* w,
                        const accum_t<T>* mean, const accum_t<T>* rstd, std::size_t N,
                        std::size_t C) {
  using A = accum_t<T>;
  std::vector<A> dw_acc(C), db_acc(C);
  for (std::size_t c = 0; c < C; ++c) {
    dw_acc[c] = dw ? to_float(dw[c]) : A(0);
    db_acc[c] = db ? to_float(db[c]) : A(0);
  }
  for (std::size_t n = 0; n < N; ++n) {
    const T* x = in + n * C;
    const T* dy = dout + n * C;
    const A m = mean[n], r = rstd[n];
    A g_mean = 0, gx_mean = 0;
    for (std::size_t c = 0; c < C; ++c) {
      const A xh = (to_float(x[c]) - m) * r;
      const A g = to_float(w[c]) * to_float(dy[c]);
      g_mean += g;
      gx_mean += g * xh;
    }
    g_mean /= static_cast<A>(C);
    gx_mean /= static_cast<A>(C);
    for (std::size_t c = 0; c < C; ++c) {
      const A xh = (to_float(x[c]) - m) * r;
      const A d = to_float(dy[c]);
      dw_acc[c] += d * xh;
      db_acc[c] += d;
      if (din) din[n * C + c] = from_float<T>(r * (to_float(w[c]) * d - g_mean - xh * gx_mean));
    }
  }
  for (std::size_t c = 0; c < C; ++c) {
    if (dw) dw[c] = from_float<T>(dw_acc[c]);
    if (db) db[c] = from_float<T>(db_acc[c]);
  }
}

}  // namespace memalg::backend::cpu

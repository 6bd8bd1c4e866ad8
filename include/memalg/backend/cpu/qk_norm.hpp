// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/qk_norm.hpp — RMSNorm over each query and key head of a fused qkv, in place,
// reference (Qwen3's q_norm and k_norm: `self.q_norm(self.q_proj(hidden_states).view(hidden_shape))`,
// an RMSNorm over head_dim whose one weight every head shares, before the rotary embedding;
// transformers' modeling_qwen3.py, Qwen3Attention.forward).
//
// qkv[N, (H + 2·Hkv)·D] is attention.hpp's layout: per row the H query heads, the Hkv key heads,
// then the value heads. Each of a row's first H + Hkv heads is normalised over its D values,
// with rmsnorm.hpp's arithmetic on rows of D:
//   forward:  pre[n, j, :] = x                          (the heads before the norm, [N, (H + Hkv)·D])
//             x ← x·rstd·w,  rstd = 1/sqrt(mean(x²) + ε),  w = wq for a query head, wk for a key head
//   backward: in place on dqkv's query and key heads, from pre and w (rstd recomputed from pre):
//             dx = rstd·(g − x·rstd²·mean(g·x)),  g = w·dy
//             dwq += Σ dy·x·rstd over every query head of every row, dwk the same over the key heads
// The value heads are not touched. The weights' gradients are summed in accum_t<T> and rounded
// once, as rmsnorm_backward rounds its dw.
#pragma once

#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <vector>

#include "memalg/backend/cpu/rmsnorm.hpp"
#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

namespace detail {
inline void check_qk_norm_args(std::size_t H, std::size_t Hkv, std::size_t D, double eps) {
  if (H == 0 || Hkv == 0 || D == 0) throw std::invalid_argument("qk_rmsnorm: heads, key/value heads and head width must be positive");
  if (H % Hkv != 0) throw std::invalid_argument("qk_rmsnorm: the key/value heads must divide the heads");
  if (!(eps > 0)) throw std::invalid_argument("qk_rmsnorm: epsilon must be positive");
}
template <storage_type T>
accum_t<T> head_rstd(const T* x, std::size_t D, double eps) {
  using A = accum_t<T>;
  A ss = 0;
  for (std::size_t c = 0; c < D; ++c) ss += to_float(x[c]) * to_float(x[c]);
  return A(1) / std::sqrt(ss / static_cast<A>(D) + static_cast<A>(eps));
}
}  // namespace detail

/// Normalises the query and key heads of qkv in place; pre[N, (H + Hkv)·D] receives them as they
/// were (null: inference, nothing saved).
template <storage_type T>
void qk_rmsnorm_forward(T* qkv, T* pre, const T* wq, const T* wk, std::size_t N, std::size_t H, std::size_t Hkv,
                        std::size_t D, double eps) {
  detail::check_qk_norm_args(H, Hkv, D, eps);
  const std::size_t row = (H + 2 * Hkv) * D, heads = H + Hkv;
  for (std::size_t n = 0; n < N; ++n) {
    T* q = qkv + n * row;  // the H query heads, then the Hkv key heads: rows of D, normed in place
    if (pre != nullptr)
      for (std::size_t i = 0; i < heads * D; ++i) pre[n * heads * D + i] = q[i];
    rmsnorm_forward(q, static_cast<accum_t<T>*>(nullptr), q, wq, H, D, eps);
    rmsnorm_forward(q + H * D, static_cast<accum_t<T>*>(nullptr), q + H * D, wk, Hkv, D, eps);
  }
}

/// The backward, in place on the query and key heads of dqkv[N, (H + 2·Hkv)·D]; dwq, dwk [D]
/// accumulated (either may be null).
template <storage_type T>
void qk_rmsnorm_backward(T* dqkv, T* dwq, T* dwk, const T* pre, const T* wq, const T* wk, std::size_t N,
                         std::size_t H, std::size_t Hkv, std::size_t D, double eps) {
  using A = accum_t<T>;
  detail::check_qk_norm_args(H, Hkv, D, eps);
  const std::size_t row = (H + 2 * Hkv) * D, heads = H + Hkv;
  std::vector<A> acc_q(D), acc_k(D);
  for (std::size_t c = 0; c < D; ++c) {
    acc_q[c] = dwq ? to_float(dwq[c]) : A(0);
    acc_k[c] = dwk ? to_float(dwk[c]) : A(0);
  }
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t j = 0; j < heads; ++j) {
      const T* x = pre + (n * heads + j) * D;
      T* dy = dqkv + n * row + j * D;
      const T* w = j < H ? wq : wk;
      std::vector<A>& acc = j < H ? acc_q : acc_k;
      const A r = detail::head_rstd(x, D, eps);
      A gx_mean = 0;
      for (std::size_t c = 0; c < D; ++c) gx_mean += to_float(w[c]) * to_float(dy[c]) * to_float(x[c]);
      gx_mean /= static_cast<A>(D);
      for (std::size_t c = 0; c < D; ++c) {  // each dy[c] read before dx[c] overwrites it
        const A xv = to_float(x[c]), d = to_float(dy[c]);
        acc[c] += d * xv * r;
        dy[c] = from_float<T>(r * (to_float(w[c]) * d - xv * r * r * gx_mean));
      }
    }
  for (std::size_t c = 0; c < D; ++c) {
    if (dwq) dwq[c] = from_float<T>(acc_q[c]);
    if (dwk) dwk[c] = from_float<T>(acc_k[c]);
  }
}

}  // namespace memalg::backend::cpu

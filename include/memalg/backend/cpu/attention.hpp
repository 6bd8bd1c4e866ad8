// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/attention.hpp — multi-head scaled dot-product attention with grouped-query
// key/value heads (reference).
//
// Layout: qkv[N = B·S, (H + 2·Hkv)·D]; each token row is [q (H heads) ‖ k (Hkv heads) ‖ v (Hkv
// heads)], each head D wide. Query head h reads key/value head h / (H / Hkv), i.e. consecutive
// query heads share a kv head (GQA, Ainslie et al. 2023; Hkv = H is plain multi-head attention).
// out[N, H·D]. Scores are scaled by 1/√D (Vaswani et al. 2017); `causal` masks keys after the query.
//
// Two algorithms with identical mathematics:
//  * naive: materialises the probabilities att[B, H, S, S] (stored in T, masked entries 0) and
//    reuses them in the backward.
//  * flash: FlashAttention (Dao et al. 2022; backward as in FlashAttention-2, Dao 2023). Keys are
//    visited in blocks of `block` with an online softmax (Milakov & Gimelshein 2018): a running max
//    m and running sum l are rescaled by exp(m_old − m_new) whenever the max grows. Only
//    lse[B, H, S] = m + log(l) (accum_t<T>) is saved; the backward recomputes P = exp(s − lse) and
//    uses D_t = Σ dout_t·out_t in place of Σ_j P_tj·dP_tj.
// The reference processes one query row at a time (a 1-row query tile); the GPU tiles both axes.
// Input gradients are written: dqkv is summed over the query heads of a group in accum_t<T> and
// rounded once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <vector>

#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

struct attention_shape {
  std::size_t B;    // batch
  std::size_t S;    // sequence length
  std::size_t H;    // query heads
  std::size_t Hkv;  // key/value heads, H % Hkv == 0
  std::size_t D;    // head width
  bool causal = true;

  constexpr std::size_t rows() const noexcept { return B * S; }
  constexpr std::size_t qkv_width() const noexcept { return (H + 2 * Hkv) * D; }
  constexpr std::size_t out_width() const noexcept { return H * D; }
  /// Column offsets inside a qkv row of query head h, and of the key / value head it reads.
  constexpr std::size_t q_off(std::size_t h) const noexcept { return h * D; }
  constexpr std::size_t k_off(std::size_t h) const noexcept { return (H + h / (H / Hkv)) * D; }
  constexpr std::size_t v_off(std::size_t h) const noexcept { return (H + Hkv + h / (H / Hkv)) * D; }
  /// Number of keys query t attends to.
  constexpr std::size_t keys(std::size_t t) const noexcept { return causal ? t + 1 : S; }
};

namespace detail {

inline void check_attention_shape(const attention_shape& sh) {
  if (sh.Hkv == 0 || sh.H % sh.Hkv != 0)
    throw std::invalid_argument("attention: H must be a positive multiple of Hkv");
  if (sh.D == 0) throw std::invalid_argument("attention: head width D must be positive");
}

template <storage_type T>
accum_t<T> dot(const T* a, const T* b, std::size_t D) {
  accum_t<T> s = 0;
  for (std::size_t d = 0; d < D; ++d) s += to_float(a[d]) * to_float(b[d]);
  return s;
}

template <class A, storage_type T>
void round_into(T* dst, const std::vector<A>& src) {
  for (std::size_t i = 0; i < src.size(); ++i) dst[i] = from_float<T>(src[i]);
}

}  // namespace detail

// ---- naive -----------------------------------------------------------------------------------

/// out[N, H·D]; att[B, H, S, S] probabilities (may be null when no backward follows).
template <storage_type T>
void attention_naive_forward(T* out, T* att, const T* qkv, const attention_shape& sh) {
  using A = accum_t<T>;
  detail::check_attention_shape(sh);
  const std::size_t W = sh.qkv_width(), S = sh.S, D = sh.D;
  const A scale = A(1) / std::sqrt(static_cast<A>(D));
  std::vector<A> p(S), o(D);
  for (std::size_t b = 0; b < sh.B; ++b)
    for (std::size_t h = 0; h < sh.H; ++h)
      for (std::size_t t = 0; t < S; ++t) {
        const T* q = qkv + (b * S + t) * W + sh.q_off(h);
        const std::size_t nk = sh.keys(t);
        A mx = -std::numeric_limits<A>::infinity();
        for (std::size_t j = 0; j < nk; ++j) {
          p[j] = scale * detail::dot(q, qkv + (b * S + j) * W + sh.k_off(h), D);
          mx = std::max(mx, p[j]);
        }
        A sum = 0;
        for (std::size_t j = 0; j < nk; ++j) {
          p[j] = std::exp(p[j] - mx);
          sum += p[j];
        }
        std::fill(o.begin(), o.end(), A(0));
        for (std::size_t j = 0; j < nk; ++j) {
          p[j] /= sum;
          const T* v = qkv + (b * S + j) * W + sh.v_off(h);
          for (std::size_t d = 0; d < D; ++d) o[d] += p[j] * to_float(v[d]);
        }
        for (std::size_t d = 0; d < D; ++d) out[(b * S + t) * sh.out_width() + h * D + d] = from_float<T>(o[d]);
        if (att) {
          T* row = att + ((b * sh.H + h) * S + t) * S;
          for (std::size_t j = 0; j < S; ++j) row[j] = from_float<T>(j < nk ? p[j] : A(0));
        }
      }
}

/// dqkv[N, (H + 2Hkv)·D] written; uses the probabilities saved by the forward.
template <storage_type T>
void attention_naive_backward(T* dqkv, const T* dout, const T* qkv, const T* att,
                              const attention_shape& sh) {
  using A = accum_t<T>;
  detail::check_attention_shape(sh);
  const std::size_t W = sh.qkv_width(), S = sh.S, D = sh.D;
  const A scale = A(1) / std::sqrt(static_cast<A>(D));
  std::vector<A> acc(sh.rows() * W, A(0)), dp(S);
  for (std::size_t b = 0; b < sh.B; ++b)
    for (std::size_t h = 0; h < sh.H; ++h)
      for (std::size_t t = 0; t < S; ++t) {
        const T* q = qkv + (b * S + t) * W + sh.q_off(h);
        const T* dy = dout + (b * S + t) * sh.out_width() + h * D;
        const T* prow = att + ((b * sh.H + h) * S + t) * S;
        const std::size_t nk = sh.keys(t);
        // dP_tj = dout_t · v_j; dS_tj = P_tj (dP_tj − Σ_k P_tk dP_tk)  (softmax Jacobian)
        A pdp = 0;
        for (std::size_t j = 0; j < nk; ++j) {
          dp[j] = detail::dot(dy, qkv + (b * S + j) * W + sh.v_off(h), D);
          pdp += to_float(prow[j]) * dp[j];
        }
        A* dq = acc.data() + (b * S + t) * W + sh.q_off(h);
        for (std::size_t j = 0; j < nk; ++j) {
          const A pj = to_float(prow[j]);
          const A ds = pj * (dp[j] - pdp) * scale;
          const T* k = qkv + (b * S + j) * W + sh.k_off(h);
          A* dk = acc.data() + (b * S + j) * W + sh.k_off(h);
          A* dv = acc.data() + (b * S + j) * W + sh.v_off(h);
          for (std::size_t d = 0; d < D; ++d) {
            dq[d] += ds * to_float(k[d]);
            dk[d] += ds * to_float(q[d]);
            dv[d] += pj * to_float(dy[d]);
          }
        }
      }
  detail::round_into(dqkv, acc);
}

// ---- flash (online softmax, recompute in backward) -------------------------------------------

/// out[N, H·D]; lse[B, H, S] (may be null when no backward follows); keys in blocks of `block`.
template <storage_type T>
void attention_flash_forward(T* out, accum_t<T>* lse, const T* qkv, const attention_shape& sh,
                             std::size_t block = 64) {
  using A = accum_t<T>;
  detail::check_attention_shape(sh);
  if (block == 0) throw std::invalid_argument("attention_flash_forward: block must be positive");
  const std::size_t W = sh.qkv_width(), S = sh.S, D = sh.D;
  const A scale = A(1) / std::sqrt(static_cast<A>(D));
  std::vector<A> s(block), o(D);
  for (std::size_t b = 0; b < sh.B; ++b)
    for (std::size_t h = 0; h < sh.H; ++h)
      for (std::size_t t = 0; t < S; ++t) {
        const T* q = qkv + (b * S + t) * W + sh.q_off(h);
        const std::size_t nk = sh.keys(t);
        A m = -std::numeric_limits<A>::infinity(), l = 0;
        std::fill(o.begin(), o.end(), A(0));
        for (std::size_t j0 = 0; j0 < nk; j0 += block) {
          const std::size_t j1 = std::min(j0 + block, nk);
          A bm = -std::numeric_limits<A>::infinity();
          for (std::size_t j = j0; j < j1; ++j) {
            s[j - j0] = scale * detail::dot(q, qkv + (b * S + j) * W + sh.k_off(h), D);
            bm = std::max(bm, s[j - j0]);
          }
          const A m_new = std::max(m, bm);
          const A corr = std::exp(m - m_new);  // 0 on the first block (m = −inf)
          l *= corr;
          for (auto& x : o) x *= corr;
          for (std::size_t j = j0; j < j1; ++j) {
            const A pj = std::exp(s[j - j0] - m_new);
            l += pj;
            const T* v = qkv + (b * S + j) * W + sh.v_off(h);
            for (std::size_t d = 0; d < D; ++d) o[d] += pj * to_float(v[d]);
          }
          m = m_new;
        }
        for (std::size_t d = 0; d < D; ++d) out[(b * S + t) * sh.out_width() + h * D + d] = from_float<T>(o[d] / l);
        if (lse) lse[(b * sh.H + h) * S + t] = m + std::log(l);
      }
}

/// dqkv[N, (H + 2Hkv)·D] written; recomputes probabilities from qkv and lse; `out` is the forward
/// output (for D_t = Σ dout_t·out_t). `block` is the key block, as in the forward.
template <storage_type T>
void attention_flash_backward(T* dqkv, const T* dout, const T* qkv, const T* out,
                              const accum_t<T>* lse, const attention_shape& sh,
                              std::size_t block = 64) {
  using A = accum_t<T>;
  detail::check_attention_shape(sh);
  if (block == 0) throw std::invalid_argument("attention_flash_backward: block must be positive");
  const std::size_t W = sh.qkv_width(), S = sh.S, D = sh.D, OW = sh.out_width();
  const A scale = A(1) / std::sqrt(static_cast<A>(D));
  std::vector<A> acc(sh.rows() * W, A(0)), Dt(S);
  for (std::size_t b = 0; b < sh.B; ++b)
    for (std::size_t h = 0; h < sh.H; ++h) {
      for (std::size_t t = 0; t < S; ++t)
        Dt[t] = detail::dot(dout + (b * S + t) * OW + h * D, out + (b * S + t) * OW + h * D, D);
      // FlashAttention-2 order: outer loop over key blocks (dK, dV of a block stay local), inner
      // loop over the query rows that can see the block.
      for (std::size_t j0 = 0; j0 < S; j0 += block) {
        const std::size_t j1 = std::min(j0 + block, S);
        for (std::size_t t = sh.causal ? j0 : 0; t < S; ++t) {
          const T* q = qkv + (b * S + t) * W + sh.q_off(h);
          const T* dy = dout + (b * S + t) * OW + h * D;
          const A lse_t = lse[(b * sh.H + h) * S + t];
          A* dq = acc.data() + (b * S + t) * W + sh.q_off(h);
          const std::size_t je = std::min(j1, sh.keys(t));
          for (std::size_t j = j0; j < je; ++j) {
            const T* k = qkv + (b * S + j) * W + sh.k_off(h);
            const T* v = qkv + (b * S + j) * W + sh.v_off(h);
            const A pj = std::exp(scale * detail::dot(q, k, D) - lse_t);
            const A ds = pj * (detail::dot(dy, v, D) - Dt[t]) * scale;
            A* dk = acc.data() + (b * S + j) * W + sh.k_off(h);
            A* dv = acc.data() + (b * S + j) * W + sh.v_off(h);
            for (std::size_t d = 0; d < D; ++d) {
              dq[d] += ds * to_float(k[d]);
              dk[d] += ds * to_float(q[d]);
              dv[d] += pj * to_float(dy[d]);
            }
          }
        }
      }
    }
  detail::round_into(dqkv, acc);
}

}  // namespace memalg::backend::cpu

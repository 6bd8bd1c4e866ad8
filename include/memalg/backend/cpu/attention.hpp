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
//
// Cross-attention (encoder–decoder models: the speech model's decoder blocks) uses the same code
// on separate tensors: queries q[B·Sq, H·D] from the decoder, keys and values kv[B·Sk, 2·Hkv·D]
// = [k (Hkv heads) ‖ v (Hkv heads)] per row from the encoder (one fused projection of the encoder
// output), out[B·Sq, H·D]; never causal; key_mask[B·Sk] (1 real, 0 padding; null: all real)
// removes padded encoder positions from every softmax. att[B, H, Sq, Sk], lse[B, H, Sq]. A query
// row whose keys are all padding gets out = 0, zero probabilities, lse = −∞ and no gradient.
// Both layouts are described to the shared implementation by an attention_io (row strides and
// head offsets of q, k, v).
//
// Gemma 2's variants (modeling_gemma2.py, eager_attention_forward): `scale` replaces 1/√D
// (query_pre_attn_scalar^−½); `softcap` > 0 caps each scaled score s to c·tanh(s/c) before the
// mask and the softmax (attn_logit_softcapping), so the backward multiplies the score's gradient by
// 1 − tanh²(s/c); `window` > 0 lets query t (at position p) read only keys p − window < j ≤ p
// (sliding_window: its sliding layers' mask, masking_utils.py sliding_window_overlay).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
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
  std::size_t window = 0;  // > 0: each query reads only the last `window` positions up to its own
  double softcap = 0;      // > 0: scores capped to softcap·tanh(score / softcap)
  double scale = 0;        // > 0: the scores' scale instead of 1/√D

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

/// Where one attention call finds q, k and v: row strides and the column of head 0 inside a row
/// (q rows b·Sq + t, key/value rows b·Sk + j). The gradient accumulators share the layout.
struct attention_io {
  std::size_t B, Sq, Sk, H, Hkv, D;
  bool causal;
  const std::uint8_t* key_mask;  // [B·Sk], null: every key is real
  std::size_t q_ld, q_col;       // q rows
  std::size_t kv_ld, k_col, v_col;  // k and v rows
  std::size_t q_pos0 = 0;           // causal: query t sits at key position q_pos0 + t (a cache's)
  std::size_t window = 0;           // > 0: query t reads only keys j with q_pos0 + t − window < j
  double softcap = 0, scale = 0;    // attention_shape's

  std::size_t q_at(std::size_t b, std::size_t t, std::size_t h) const noexcept { return (b * Sq + t) * q_ld + q_col + h * D; }
  std::size_t k_at(std::size_t b, std::size_t j, std::size_t h) const noexcept {
    return (b * Sk + j) * kv_ld + k_col + h / (H / Hkv) * D;
  }
  std::size_t v_at(std::size_t b, std::size_t j, std::size_t h) const noexcept {
    return (b * Sk + j) * kv_ld + v_col + h / (H / Hkv) * D;
  }
  std::size_t out_at(std::size_t b, std::size_t t, std::size_t h) const noexcept { return ((b * Sq + t) * H + h) * D; }
  std::size_t stat_at(std::size_t b, std::size_t h, std::size_t t) const noexcept { return (b * H + h) * Sq + t; }
  /// Keys [0, key_end(t)) may be visible to query t; visible() also applies the key mask.
  std::size_t key_end(std::size_t t) const noexcept { return causal ? std::min(q_pos0 + t + 1, Sk) : Sk; }
  /// Whether query t may read key j: inside its window (if any) and not padding.
  bool visible(std::size_t b, std::size_t t, std::size_t j) const noexcept {
    return (window == 0 || j + window > q_pos0 + t) && (!key_mask || key_mask[b * Sk + j] != 0);
  }
  /// The scores' scale: 1/√D unless the shape gives one.
  template <class A>
  A score_scale() const {
    return scale > 0 ? static_cast<A>(scale) : A(1) / std::sqrt(static_cast<A>(D));
  }
  /// A scaled score s as the softmax reads it: softcap·tanh(s / softcap) with a cap, s without.
  template <class A>
  A capped(A s) const {
    return softcap > 0 ? static_cast<A>(softcap) * std::tanh(s / static_cast<A>(softcap)) : s;
  }
  /// d capped(s) / ds = 1 − tanh²(s / softcap).
  template <class A>
  A cap_slope(A s) const {
    const A t = std::tanh(s / static_cast<A>(softcap));
    return A(1) - t * t;
  }
};

inline attention_io self_attention_io(const attention_shape& sh) {
  attention_io io{sh.B, sh.S, sh.S, sh.H, sh.Hkv, sh.D, sh.causal, nullptr, sh.qkv_width(), 0, sh.qkv_width(),
                  sh.H * sh.D, (sh.H + sh.Hkv) * sh.D};
  io.window = sh.window;
  io.softcap = sh.softcap;
  io.scale = sh.scale;
  return io;
}

/// out and att[B, H, Sq, Sk] (may be null).
template <storage_type T>
void attention_naive_forward_io(T* out, T* att, const T* q, const T* kv, const attention_io& io) {
  using A = accum_t<T>;
  const std::size_t D = io.D;
  const A scale = io.score_scale<A>();
  std::vector<A> p(io.Sk), o(D);
  for (std::size_t b = 0; b < io.B; ++b)
    for (std::size_t h = 0; h < io.H; ++h)
      for (std::size_t t = 0; t < io.Sq; ++t) {
        const T* qt = q + io.q_at(b, t, h);
        const std::size_t nk = io.key_end(t);
        A mx = -std::numeric_limits<A>::infinity();
        for (std::size_t j = 0; j < nk; ++j) {
          if (!io.visible(b, t, j)) continue;
          p[j] = io.capped(scale * detail::dot(qt, kv + io.k_at(b, j, h), D));
          mx = std::max(mx, p[j]);
        }
        A sum = 0;
        for (std::size_t j = 0; j < nk; ++j) {
          if (!io.visible(b, t, j)) continue;
          p[j] = std::exp(p[j] - mx);
          sum += p[j];
        }
        std::fill(o.begin(), o.end(), A(0));
        for (std::size_t j = 0; j < nk; ++j) {
          if (!io.visible(b, t, j)) continue;
          p[j] /= sum;
          const T* v = kv + io.v_at(b, j, h);
          for (std::size_t d = 0; d < D; ++d) o[d] += p[j] * to_float(v[d]);
        }
        for (std::size_t d = 0; d < D; ++d) out[io.out_at(b, t, h) + d] = from_float<T>(o[d]);
        if (att) {
          T* row = att + io.stat_at(b, h, t) * io.Sk;
          for (std::size_t j = 0; j < io.Sk; ++j) row[j] = from_float<T>(j < nk && io.visible(b, t, j) ? p[j] : A(0));
        }
      }
}

/// Accumulates dq into acc_q and dk, dv into acc_kv (layouts of q and kv; they may coincide).
template <storage_type T>
void attention_naive_backward_io(accum_t<T>* acc_q, accum_t<T>* acc_kv, const T* dout, const T* q, const T* kv,
                                 const T* att, const attention_io& io) {
  using A = accum_t<T>;
  const std::size_t D = io.D;
  const A scale = io.score_scale<A>();
  std::vector<A> dp(io.Sk);
  for (std::size_t b = 0; b < io.B; ++b)
    for (std::size_t h = 0; h < io.H; ++h)
      for (std::size_t t = 0; t < io.Sq; ++t) {
        const T* qt = q + io.q_at(b, t, h);
        const T* dy = dout + io.out_at(b, t, h);
        const T* prow = att + io.stat_at(b, h, t) * io.Sk;
        const std::size_t nk = io.key_end(t);
        // dP_tj = dout_t · v_j; dS_tj = P_tj (dP_tj − Σ_k P_tk dP_tk)  (softmax Jacobian)
        A pdp = 0;
        for (std::size_t j = 0; j < nk; ++j) {
          if (!io.visible(b, t, j)) continue;
          dp[j] = detail::dot(dy, kv + io.v_at(b, j, h), D);
          pdp += to_float(prow[j]) * dp[j];
        }
        A* dq = acc_q + io.q_at(b, t, h);
        for (std::size_t j = 0; j < nk; ++j) {
          if (!io.visible(b, t, j)) continue;
          const A pj = to_float(prow[j]);
          const T* k = kv + io.k_at(b, j, h);
          A ds = pj * (dp[j] - pdp) * scale;
          if (io.softcap > 0) ds *= io.cap_slope(scale * detail::dot(qt, k, D));
          A* dk = acc_kv + io.k_at(b, j, h);
          A* dv = acc_kv + io.v_at(b, j, h);
          for (std::size_t d = 0; d < D; ++d) {
            dq[d] += ds * to_float(k[d]);
            dk[d] += ds * to_float(qt[d]);
            dv[d] += pj * to_float(dy[d]);
          }
        }
      }
}

/// out and lse[B, H, Sq] (may be null); keys in blocks of `block`.
template <storage_type T>
void attention_flash_forward_io(T* out, accum_t<T>* lse, const T* q, const T* kv, const attention_io& io,
                                std::size_t block) {
  using A = accum_t<T>;
  const std::size_t D = io.D;
  const A scale = io.score_scale<A>();
  const A ninf = -std::numeric_limits<A>::infinity();
  std::vector<A> s(block), o(D);
  for (std::size_t b = 0; b < io.B; ++b)
    for (std::size_t h = 0; h < io.H; ++h)
      for (std::size_t t = 0; t < io.Sq; ++t) {
        const T* qt = q + io.q_at(b, t, h);
        const std::size_t nk = io.key_end(t);
        A m = ninf, l = 0;
        std::fill(o.begin(), o.end(), A(0));
        for (std::size_t j0 = 0; j0 < nk; j0 += block) {
          const std::size_t j1 = std::min(j0 + block, nk);
          A bm = ninf;
          for (std::size_t j = j0; j < j1; ++j) {
            s[j - j0] = io.visible(b, t, j) ? io.capped(scale * detail::dot(qt, kv + io.k_at(b, j, h), D)) : ninf;
            bm = std::max(bm, s[j - j0]);
          }
          if (bm == ninf) continue;  // every key of the block is padding
          const A m_new = std::max(m, bm);
          const A corr = std::exp(m - m_new);  // 0 on the first block (m = −inf)
          l *= corr;
          for (auto& x : o) x *= corr;
          for (std::size_t j = j0; j < j1; ++j) {
            if (!io.visible(b, t, j)) continue;
            const A pj = std::exp(s[j - j0] - m_new);
            l += pj;
            const T* v = kv + io.v_at(b, j, h);
            for (std::size_t d = 0; d < D; ++d) o[d] += pj * to_float(v[d]);
          }
          m = m_new;
        }
        for (std::size_t d = 0; d < D; ++d) out[io.out_at(b, t, h) + d] = from_float<T>(l > A(0) ? o[d] / l : A(0));
        if (lse) lse[io.stat_at(b, h, t)] = l > A(0) ? m + std::log(l) : ninf;
      }
}

/// Accumulates dq into acc_q and dk, dv into acc_kv; recomputes the probabilities from lse.
template <storage_type T>
void attention_flash_backward_io(accum_t<T>* acc_q, accum_t<T>* acc_kv, const T* dout, const T* q, const T* kv,
                                 const T* out, const accum_t<T>* lse, const attention_io& io, std::size_t block) {
  using A = accum_t<T>;
  const std::size_t D = io.D;
  const A scale = io.score_scale<A>();
  const A ninf = -std::numeric_limits<A>::infinity();
  std::vector<A> Dt(io.Sq);
  for (std::size_t b = 0; b < io.B; ++b)
    for (std::size_t h = 0; h < io.H; ++h) {
      for (std::size_t t = 0; t < io.Sq; ++t)
        Dt[t] = detail::dot(dout + io.out_at(b, t, h), out + io.out_at(b, t, h), D);
      // FlashAttention-2 order: outer loop over key blocks (dK, dV of a block stay local), inner
      // loop over the query rows that can see the block.
      for (std::size_t j0 = 0; j0 < io.Sk; j0 += block) {
        const std::size_t j1 = std::min(j0 + block, io.Sk);
        for (std::size_t t = io.causal ? j0 : 0; t < io.Sq; ++t) {
          const A lse_t = lse[io.stat_at(b, h, t)];
          if (lse_t == ninf) continue;  // no real key: no gradient
          const T* qt = q + io.q_at(b, t, h);
          const T* dy = dout + io.out_at(b, t, h);
          A* dq = acc_q + io.q_at(b, t, h);
          const std::size_t je = std::min(j1, io.key_end(t));
          for (std::size_t j = j0; j < je; ++j) {
            if (!io.visible(b, t, j)) continue;
            const T* k = kv + io.k_at(b, j, h);
            const T* v = kv + io.v_at(b, j, h);
            const A raw = scale * detail::dot(qt, k, D);
            const A pj = std::exp(io.capped(raw) - lse_t);
            A ds = pj * (detail::dot(dy, v, D) - Dt[t]) * scale;
            if (io.softcap > 0) ds *= io.cap_slope(raw);
            A* dk = acc_kv + io.k_at(b, j, h);
            A* dv = acc_kv + io.v_at(b, j, h);
            for (std::size_t d = 0; d < D; ++d) {
              dq[d] += ds * to_float(k[d]);
              dk[d] += ds * to_float(qt[d]);
              dv[d] += pj * to_float(dy[d]);
            }
          }
        }
      }
    }
}

}  // namespace detail

// ---- self-attention on a fused qkv ------------------------------------------------------------

/// out[N, H·D]; att[B, H, S, S] probabilities (may be null when no backward follows).
template <storage_type T>
void attention_naive_forward(T* out, T* att, const T* qkv, const attention_shape& sh) {
  detail::check_attention_shape(sh);
  detail::attention_naive_forward_io(out, att, qkv, qkv, detail::self_attention_io(sh));
}

/// dqkv[N, (H + 2Hkv)·D] written; uses the probabilities saved by the forward.
template <storage_type T>
void attention_naive_backward(T* dqkv, const T* dout, const T* qkv, const T* att, const attention_shape& sh) {
  detail::check_attention_shape(sh);
  std::vector<accum_t<T>> acc(sh.rows() * sh.qkv_width(), accum_t<T>(0));
  detail::attention_naive_backward_io(acc.data(), acc.data(), dout, qkv, qkv, att, detail::self_attention_io(sh));
  detail::round_into(dqkv, acc);
}

/// out[N, H·D]; lse[B, H, S] (may be null when no backward follows); keys in blocks of `block`.
template <storage_type T>
void attention_flash_forward(T* out, accum_t<T>* lse, const T* qkv, const attention_shape& sh,
                             std::size_t block = 64) {
  detail::check_attention_shape(sh);
  if (block == 0) throw std::invalid_argument("attention_flash_forward: block must be positive");
  detail::attention_flash_forward_io(out, lse, qkv, qkv, detail::self_attention_io(sh), block);
}

/// dqkv[N, (H + 2Hkv)·D] written; recomputes probabilities from qkv and lse; `out` is the forward
/// output (for D_t = Σ dout_t·out_t). `block` is the key block, as in the forward.
template <storage_type T>
void attention_flash_backward(T* dqkv, const T* dout, const T* qkv, const T* out,
                              const accum_t<T>* lse, const attention_shape& sh,
                              std::size_t block = 64) {
  detail::check_attention_shape(sh);
  if (block == 0) throw std::invalid_argument("attention_flash_backward: block must be positive");
  std::vector<accum_t<T>> acc(sh.rows() * sh.qkv_width(), accum_t<T>(0));
  detail::attention_flash_backward_io(acc.data(), acc.data(), dout, qkv, qkv, out, lse,
                                      detail::self_attention_io(sh), block);
  detail::round_into(dqkv, acc);
}

// ---- cross-attention: decoder queries over encoder keys/values ---------------------------------

struct cross_attention_shape {
  std::size_t B;    // batch
  std::size_t Sq;   // query (decoder) positions
  std::size_t Sk;   // key/value (encoder) positions
  std::size_t H;    // query heads
  std::size_t Hkv;  // key/value heads, H % Hkv == 0
  std::size_t D;    // head width

  constexpr std::size_t q_rows() const noexcept { return B * Sq; }
  constexpr std::size_t kv_rows() const noexcept { return B * Sk; }
  constexpr std::size_t q_width() const noexcept { return H * D; }
  constexpr std::size_t kv_width() const noexcept { return 2 * Hkv * D; }
  constexpr std::size_t out_width() const noexcept { return H * D; }
};

namespace detail {
inline attention_io cross_attention_io(const cross_attention_shape& sh, const std::uint8_t* key_mask) {
  if (sh.Hkv == 0 || sh.H % sh.Hkv != 0)
    throw std::invalid_argument("cross_attention: H must be a positive multiple of Hkv");
  if (sh.D == 0) throw std::invalid_argument("cross_attention: head width D must be positive");
  return {sh.B, sh.Sq, sh.Sk, sh.H, sh.Hkv, sh.D, false, key_mask, sh.q_width(), 0, sh.kv_width(), 0, sh.Hkv * sh.D};
}
}  // namespace detail

/// out[B·Sq, H·D]; att[B, H, Sq, Sk] (may be null); key_mask[B·Sk] (may be null).
template <storage_type T>
void cross_attention_naive_forward(T* out, T* att, const T* q, const T* kv, const std::uint8_t* key_mask,
                                   const cross_attention_shape& sh) {
  detail::attention_naive_forward_io(out, att, q, kv, detail::cross_attention_io(sh, key_mask));
}

/// dq[B·Sq, H·D] and dkv[B·Sk, 2·Hkv·D] written (dkv summed over the query heads of a group).
template <storage_type T>
void cross_attention_naive_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* att,
                                    const std::uint8_t* key_mask, const cross_attention_shape& sh) {
  const auto io = detail::cross_attention_io(sh, key_mask);
  std::vector<accum_t<T>> acc_q(sh.q_rows() * sh.q_width(), accum_t<T>(0)), acc_kv(sh.kv_rows() * sh.kv_width(), accum_t<T>(0));
  detail::attention_naive_backward_io(acc_q.data(), acc_kv.data(), dout, q, kv, att, io);
  detail::round_into(dq, acc_q);
  detail::round_into(dkv, acc_kv);
}

/// out[B·Sq, H·D]; lse[B, H, Sq] (may be null); keys in blocks of `block`.
template <storage_type T>
void cross_attention_flash_forward(T* out, accum_t<T>* lse, const T* q, const T* kv, const std::uint8_t* key_mask,
                                   const cross_attention_shape& sh, std::size_t block = 64) {
  if (block == 0) throw std::invalid_argument("cross_attention_flash_forward: block must be positive");
  detail::attention_flash_forward_io(out, lse, q, kv, detail::cross_attention_io(sh, key_mask), block);
}

/// dq and dkv written; recomputes the probabilities from q, kv and lse; `out` is the forward output.
template <storage_type T>
void cross_attention_flash_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* out,
                                    const accum_t<T>* lse, const std::uint8_t* key_mask,
                                    const cross_attention_shape& sh, std::size_t block = 64) {
  if (block == 0) throw std::invalid_argument("cross_attention_flash_backward: block must be positive");
  const auto io = detail::cross_attention_io(sh, key_mask);
  std::vector<accum_t<T>> acc_q(sh.q_rows() * sh.q_width(), accum_t<T>(0)), acc_kv(sh.kv_rows() * sh.kv_width(), accum_t<T>(0));
  detail::attention_flash_backward_io(acc_q.data(), acc_kv.data(), dout, q, kv, out, lse, io, block);
  detail::round_into(dq, acc_q);
  detail::round_into(dkv, acc_kv);
}

}  // namespace memalg::backend::cpu

// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/rotary.hpp — rotary position embedding (RoPE, Su et al. 2021), reference.
//
// Hugging Face Llama convention (`rotate_half`, not interleaved pairs), with GPT-NeoX's partial
// rotary (`rotary_pct`): in every head only the first R = rotary_dim of the D dimensions rotate,
// the other D − R pass through unchanged. With half = R/2, i < half, and position p:
//   inv_freq_i = θ^(−2i/R),  φ = p·inv_freq_i,  c = cos φ,  s = sin φ
//   forward:  out_i = x_i·c − x_{i+half}·s,   out_{i+half} = x_{i+half}·c + x_i·s
//             (= x·cos + rotate_half(x)·sin, rotate_half(x) = [−x₂ ‖ x₁], cos/sin = [c ‖ c], [s ‖ s])
//   backward: the transpose rotation (φ → −φ)
//             din_i = dout_i·c + dout_{i+half}·s,   din_{i+half} = dout_{i+half}·c − dout_i·s
// Row n of the N = B·S token rows has position p = n % S (0..S−1 in every sequence, as the wpe
// of embedding.hpp). inv_freq, φ, cos and sin are computed in accum_t<T> (float for float, bf16
// and fp16, as transformers does in fp32; double for double).
//
// Layouts:
//  * rope_*:     x[N, heads, D] rows of heads·D, the layout of attention's q part and of its out.
//  * rope_qkv_*: the fused qkv[N, (H + 2·Hkv)·D] of attention.hpp; the H query heads and the Hkv
//                key heads (contiguous at the start of a row) rotate, the value heads pass through.
// out may alias in (the kernels run in place on an attention input or on its gradient).
#pragma once

#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <vector>

#include "memalg/backend/cpu/attention.hpp"
#include "memalg/core/float16.hpp"

namespace memalg::backend::cpu {

inline constexpr double rope_default_theta = 10000.0;

namespace detail {

inline void check_rope_args(std::size_t S, std::size_t D, std::size_t rotary_dim, double theta) {
  if (S == 0) throw std::invalid_argument("rope: sequence length S must be positive");
  if (rotary_dim % 2 != 0 || rotary_dim > D)
    throw std::invalid_argument("rope: rotary_dim must be even and at most the head width D");
  if (!(theta > 0)) throw std::invalid_argument("rope: theta must be positive");
}

/// Rotates the first `heads` heads (D wide) of each of N rows `stride` apart; rows of the output
/// are `stride` apart too. sign = +1 forward, −1 backward (transpose). Columns after heads·D are
/// not touched.
template <storage_type T>
void rope_apply(T* out, const T* in, std::size_t N, std::size_t S, std::size_t heads, std::size_t D,
                std::size_t rotary_dim, std::size_t stride, double theta, int sign, std::size_t pos0 = 0) {
  using A = accum_t<T>;
  check_rope_args(S, D, rotary_dim, theta);
  const std::size_t half = rotary_dim / 2;
  // cos / sin table [min(S, N)][half], position-major.
  const std::size_t P = S < N ? S : N;
  std::vector<A> cs(P * half), sn(P * half);
  for (std::size_t i = 0; i < half; ++i) {
    const A inv_freq =
        A(1) / std::pow(static_cast<A>(theta), static_cast<A>(2 * i) / static_cast<A>(rotary_dim));
    for (std::size_t p = 0; p < P; ++p) {
      const A phi = static_cast<A>(pos0 + p) * inv_freq;
      cs[p * half + i] = std::cos(phi);
      sn[p * half + i] = static_cast<A>(sign) * std::sin(phi);
    }
  }
  for (std::size_t n = 0; n < N; ++n) {
    const std::size_t p = n % S;
    const A* c = cs.data() + p * half;
    const A* s = sn.data() + p * half;
    for (std::size_t h = 0; h < heads; ++h) {
      const T* x = in + n * stride + h * D;
      T* y = out + n * stride + h * D;
      for (std::size_t i = 0; i < half; ++i) {
        const A x1 = to_float(x[i]), x2 = to_float(x[i + half]);
        y[i] = from_float<T>(x1 * c[i] - x2 * s[i]);
        y[i + half] = from_float<T>(x2 * c[i] + x1 * s[i]);
      }
      if (y != x)
        for (std::size_t d = rotary_dim; d < D; ++d) y[d] = x[d];
    }
  }
}

}  // namespace detail

// ---- dense [N, heads, D] -----------------------------------------------------------------------

/// out[N, heads, D] = RoPE(in); N = B·S rows, position n % S; out may alias in.
template <storage_type T>
void rope_forward(T* out, const T* in, std::size_t N, std::size_t S, std::size_t heads, std::size_t D,
                  std::size_t rotary_dim, double theta = rope_default_theta) {
  detail::rope_apply(out, in, N, S, heads, D, rotary_dim, heads * D, theta, +1);
}

/// din[N, heads, D] written (transpose rotation of dout); din may alias dout.
template <storage_type T>
void rope_backward(T* din, const T* dout, std::size_t N, std::size_t S, std::size_t heads,
                   std::size_t D, std::size_t rotary_dim, double theta = rope_default_theta) {
  detail::rope_apply(din, dout, N, S, heads, D, rotary_dim, heads * D, theta, -1);
}

// ---- fused qkv[N, (H + 2·Hkv)·D] of attention.hpp ---------------------------------------------

/// out[N, (H + 2Hkv)·D]: q and k heads rotated, v copied; position pos0 + n % sh.S (pos0: a
/// generation step's first position); out may alias qkv.
template <storage_type T>
void rope_qkv_forward(T* out, const T* qkv, const attention_shape& sh, std::size_t rotary_dim,
                      double theta = rope_default_theta, std::size_t pos0 = 0) {
  detail::check_attention_shape(sh);
  const std::size_t W = sh.qkv_width(), qk = (sh.H + sh.Hkv) * sh.D;
  detail::rope_apply(out, qkv, sh.rows(), sh.S, sh.H + sh.Hkv, sh.D, rotary_dim, W, theta, +1, pos0);
  if (out != qkv)
    for (std::size_t n = 0; n < sh.rows(); ++n)
      for (std::size_t c = qk; c < W; ++c) out[n * W + c] = qkv[n * W + c];
}

/// dqkv_in[N, (H + 2Hkv)·D] written: dq and dk rotated back, dv copied; may alias dqkv_out.
template <storage_type T>
void rope_qkv_backward(T* dqkv_in, const T* dqkv_out, const attention_shape& sh,
                       std::size_t rotary_dim, double theta = rope_default_theta) {
  detail::check_attention_shape(sh);
  const std::size_t W = sh.qkv_width(), qk = (sh.H + sh.Hkv) * sh.D;
  detail::rope_apply(dqkv_in, dqkv_out, sh.rows(), sh.S, sh.H + sh.Hkv, sh.D, rotary_dim, W, theta, -1);
  if (dqkv_in != dqkv_out)
    for (std::size_t n = 0; n < sh.rows(); ++n)
      for (std::size_t c = qk; c < W; ++c) dqkv_in[n * W + c] = dqkv_out[n * W + c];
}

}  // namespace memalg::backend::cpu

// SPDX-License-Identifier: BSL-1.0
// Llama-family decoder kernels in fp64: RoPE, SwiGLU, grouped-query attention and Qwen3's per-head
// QK-norm against their Hugging Face transformers definitions and finite differences.
// As in test_gradcheck.cpp, each gradient check uses L = Σ out·r with a fixed random r, runs the
// backward with dout = r, and starts written input gradients from NaN.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <vector>

#include "memalg/backend/cpu/activation.hpp"
#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cpu/generation.hpp"
#include "memalg/backend/cpu/qk_norm.hpp"
#include "memalg/backend/cpu/rotary.hpp"
#include "test_util.hpp"

namespace cpu = memalg::backend::cpu;
using namespace memalg_test;
using vec = std::vector<double>;

namespace {

/// transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb, written as there: emb = cat(freqs,
/// freqs), x_rot·cos + rotate_half(x_rot)·sin on the first R dims of each head, the rest passes.
vec hf_rope(const vec& x, std::size_t N, std::size_t S, std::size_t heads, std::size_t D, std::size_t R,
            double theta) {
  const std::size_t half = R / 2;
  vec y = x;
  for (std::size_t n = 0; n < N; ++n) {
    const double pos = static_cast<double>(n % S);
    vec cosv(R), sinv(R);
    for (std::size_t j = 0; j < R; ++j) {
      const double inv_freq = 1.0 / std::pow(theta, static_cast<double>(2 * (j % half)) / static_cast<double>(R));
      cosv[j] = std::cos(pos * inv_freq);
      sinv[j] = std::sin(pos * inv_freq);
    }
    for (std::size_t h = 0; h < heads; ++h) {
      const double* xr = x.data() + (n * heads + h) * D;
      vec rh(R);  // rotate_half: cat(-x2, x1)
      for (std::size_t j = 0; j < half; ++j) {
        rh[j] = -xr[j + half];
        rh[j + half] = xr[j];
      }
      for (std::size_t j = 0; j < R; ++j) y[(n * heads + h) * D + j] = xr[j] * cosv[j] + rh[j] * sinv[j];
    }
  }
  return y;
}

}  // namespace

// ---- RoPE --------------------------------------------------------------------------------------

TEST_CASE("rope: hand-computed rotations") {
  // x = [1, 2, 3, 4], D = R = 4, θ = 10000: inv_freq = [1, 10000^(-1/2) = 0.01].
  // Row 0 has position 0 (identity), row 1 position 1: angles [1, 0.01].
  //   out0 = 1·cos 1 − 3·sin 1,        out1 = 2·cos 0.01 − 4·sin 0.01,
  //   out2 = 3·cos 1 + 1·sin 1,        out3 = 4·cos 0.01 + 2·sin 0.01.
  const vec x = {1, 2, 3, 4, 1, 2, 3, 4};
  vec y(8);
  cpu::rope_forward(y.data(), x.data(), 2, 2, 1, 4, 4, 10000.0);
  const vec expect = {1, 2, 3, 4, -1.9841106485555495, 1.959900667496664, 2.4623779024123156, 4.019799668334994};
  for (std::size_t i = 0; i < 8; ++i) CHECK(y[i] == doctest::Approx(expect[i]).epsilon(1e-14));

  // Partial rotary (GPT-NeoX rotary_pct): D = 6, R = 4, the last two dims pass through exactly.
  const vec xp = {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6};
  vec yp(12);
  cpu::rope_forward(yp.data(), xp.data(), 2, 2, 1, 6, 4);  // default θ = 10000
  for (std::size_t i = 0; i < 6; ++i) CHECK(yp[i] == xp[i]);
  for (std::size_t i = 0; i < 4; ++i) CHECK(yp[6 + i] == doctest::Approx(expect[4 + i]).epsilon(1e-14));
  CHECK(yp[10] == 5);
  CHECK(yp[11] == 6);

  // Llama 3's θ = 500000, D = R = 6, position 3: inv_freq = [1, 500000^(-1/3), 500000^(-2/3)].
  const vec x3 = {1, 2, 3, 4, 5, 6};
  vec y3(6 * 4), in3(6 * 4, 0.0);
  std::copy(x3.begin(), x3.end(), in3.begin() + 18);  // row 3 of a 4-token sequence
  cpu::rope_forward(y3.data(), in3.data(), 4, 4, 1, 6, 6, 500000.0);
  const vec expect3 = {-1.5544725288399142, 1.8096283484358617, 2.9971423380357805,
                       -3.8188499783419143, 5.07200603711562,   6.001427980535418};
  for (std::size_t i = 0; i < 6; ++i) CHECK(y3[18 + i] == doctest::Approx(expect3[i]).epsilon(1e-14));
}

TEST_CASE("rope: equals transformers' rotate_half formulation; in place; qkv; backward inverts") {
  const std::size_t B = 2, S = 5, heads = 3, D = 8;
  const std::size_t N = B * S;
  const vec x = randn(N * heads * D, 1);
  for (const std::size_t R : {std::size_t{8}, std::size_t{4}, std::size_t{2}, std::size_t{0}}) {
    for (const double theta : {10000.0, 500000.0}) {
      CAPTURE(R);
      CAPTURE(theta);
      vec y(x.size());
      cpu::rope_forward(y.data(), x.data(), N, S, heads, D, R, theta);
      CHECK(max_abs_diff(y, hf_rope(x, N, S, heads, D, R, theta)) <= 1e-14);
      vec z = x;  // in place
      cpu::rope_forward(z.data(), z.data(), N, S, heads, D, R, theta);
      CHECK(z == y);
      cpu::rope_backward(z.data(), z.data(), N, S, heads, D, R, theta);  // orthogonal: Rᵀ R = I
      CHECK(max_abs_diff(z, x) <= 1e-14);
    }
  }
  // Fused qkv: q (H heads) and k (Hkv heads) rotate as a dense [N, H + Hkv, D] tensor, v is copied.
  const cpu::attention_shape sh{B, S, 4, 2, 6, true};
  const std::size_t W = sh.qkv_width(), QK = (sh.H + sh.Hkv) * sh.D;
  const vec qkv = randn(sh.rows() * W, 2);
  vec qk(sh.rows() * QK);
  for (std::size_t n = 0; n < sh.rows(); ++n)
    for (std::size_t c = 0; c < QK; ++c) qk[n * QK + c] = qkv[n * W + c];
  const vec qk_rot = hf_rope(qk, sh.rows(), S, sh.H + sh.Hkv, sh.D, 4, 10000.0);
  vec out = nans(qkv.size());
  cpu::rope_qkv_forward(out.data(), qkv.data(), sh, 4);
  for (std::size_t n = 0; n < sh.rows(); ++n) {
    for (std::size_t c = 0; c < QK; ++c) CHECK(out[n * W + c] == doctest::Approx(qk_rot[n * QK + c]).epsilon(1e-14));
    for (std::size_t c = QK; c < W; ++c) CHECK(out[n * W + c] == qkv[n * W + c]);
  }
  vec inplace = qkv;
  cpu::rope_qkv_forward(inplace.data(), inplace.data(), sh, 4);
  CHECK(inplace == out);
}

TEST_CASE("rope: argument checks") {
  vec x(12), y(12);
  CHECK_THROWS_AS(cpu::rope_forward(y.data(), x.data(), 2, 2, 1, 6, 3), std::invalid_argument);  // odd R
  CHECK_THROWS_AS(cpu::rope_forward(y.data(), x.data(), 2, 2, 1, 6, 8), std::invalid_argument);  // R > D
  CHECK_THROWS_AS(cpu::rope_forward(y.data(), x.data(), 2, 0, 1, 6, 4), std::invalid_argument);  // S = 0
  CHECK_THROWS_AS(cpu::rope_backward(y.data(), x.data(), 2, 2, 1, 6, 4, 0.0), std::invalid_argument);
}

TEST_CASE("gradcheck: rope") {
  const std::size_t B = 2, S = 4, heads = 3, D = 6;
  const std::size_t N = B * S;
  for (const std::size_t R : {std::size_t{6}, std::size_t{4}}) {
    CAPTURE(R);
    vec x = randn(N * heads * D, 1), r = randn(N * heads * D, 2);
    auto loss = [&] {
      vec out(x.size());
      cpu::rope_forward(out.data(), x.data(), N, S, heads, D, R, 10.0);  // small θ: large angles
      return dot(out, r);
    };
    vec dx = nans(x.size());
    cpu::rope_backward(dx.data(), r.data(), N, S, heads, D, R, 10.0);
    check_gradient("din", x, dx, loss);
  }
}

TEST_CASE("gradcheck: rope on fused qkv") {
  const cpu::attention_shape sh{2, 3, 4, 2, 6, true};
  vec qkv = randn(sh.rows() * sh.qkv_width(), 1), r = randn(sh.rows() * sh.qkv_width(), 2);
  auto loss = [&] {
    vec out(qkv.size());
    cpu::rope_qkv_forward(out.data(), qkv.data(), sh, 4, 100.0);
    return dot(out, r);
  };
  vec dqkv = nans(qkv.size());
  cpu::rope_qkv_backward(dqkv.data(), r.data(), sh, 4, 100.0);
  check_gradient("dqkv", qkv, dqkv, loss);
}

// ---- Qwen3's QK-norm (Qwen3Attention: q_norm(q_proj(x).view(..., head_dim)), the same for k) ----

namespace {
/// transformers' Qwen3RMSNorm on every query and key head of a fused qkv, written as there:
/// x · rsqrt(mean(x²) + ε), times the weight; the value heads pass.
vec hf_qk_norm(const vec& qkv, std::size_t N, std::size_t H, std::size_t Hkv, std::size_t D, const vec& wq,
               const vec& wk, double eps) {
  vec y = qkv;
  const std::size_t row = (H + 2 * Hkv) * D;
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t j = 0; j < H + Hkv; ++j) {
      double var = 0;
      for (std::size_t c = 0; c < D; ++c) var += qkv[n * row + j * D + c] * qkv[n * row + j * D + c];
      var /= static_cast<double>(D);
      for (std::size_t c = 0; c < D; ++c)
        y[n * row + j * D + c] = (j < H ? wq[c] : wk[c]) * (qkv[n * row + j * D + c] / std::sqrt(var + eps));
    }
  return y;
}
}  // namespace

TEST_CASE("qk_norm: equals transformers' Qwen3RMSNorm per head; keeps the heads as they were; values untouched") {
  const std::size_t N = 3, H = 4, Hkv = 2, D = 5, row = (H + 2 * Hkv) * D;
  const vec x = randn(N * row, 11, 2.0), wq = randn(D, 12), wk = randn(D, 13);
  vec y = x, pre = nans(N * (H + Hkv) * D);
  cpu::qk_rmsnorm_forward(y.data(), pre.data(), wq.data(), wk.data(), N, H, Hkv, D, 1e-6);
  CHECK(max_abs_diff(y, hf_qk_norm(x, N, H, Hkv, D, wq, wk, 1e-6)) < 1e-13);
  for (std::size_t n = 0; n < N; ++n) {
    for (std::size_t i = 0; i < (H + Hkv) * D; ++i) CHECK(pre[n * (H + Hkv) * D + i] == x[n * row + i]);
    for (std::size_t i = (H + Hkv) * D; i < row; ++i) CHECK(y[n * row + i] == x[n * row + i]);
  }
  CHECK_THROWS_AS(cpu::qk_rmsnorm_forward(y.data(), pre.data(), wq.data(), wk.data(), N, H, 3, D, 1e-6),
                  std::invalid_argument);  // 3 does not divide 4
  CHECK_THROWS_AS(cpu::qk_rmsnorm_forward(y.data(), pre.data(), wq.data(), wk.data(), N, H, Hkv, D, 0.0),
                  std::invalid_argument);
}

TEST_CASE("gradcheck: qk_norm (query and key heads, both weights)") {
  const std::size_t N = 3, H = 4, Hkv = 2, D = 5, row = (H + 2 * Hkv) * D;
  const double eps = 1e-6;
  vec x = randn(N * row, 21, 1.5), wq = randn(D, 22), wk = randn(D, 23), r = randn(N * row, 24);
  auto loss = [&] {
    vec y = x;
    cpu::qk_rmsnorm_forward(y.data(), static_cast<double*>(nullptr), wq.data(), wk.data(), N, H, Hkv, D, eps);
    return dot(y, r);
  };
  vec y = x, pre(N * (H + Hkv) * D);
  cpu::qk_rmsnorm_forward(y.data(), pre.data(), wq.data(), wk.data(), N, H, Hkv, D, eps);
  vec g = r;  // in place: the value heads' gradient passes through untouched
  vec dwq(D, 0.0), dwk(D, 0.0);
  cpu::qk_rmsnorm_backward(g.data(), dwq.data(), dwk.data(), pre.data(), wq.data(), wk.data(), N, H, Hkv, D, eps);
  check_gradient("dqkv", x, g, loss);
  check_gradient("dwq", wq, dwq, loss);
  check_gradient("dwk", wk, dwk, loss);
  // dw accumulates into what is there
  vec dwq2(D, 1.0), dwk2(D, 1.0), g2 = r;
  cpu::qk_rmsnorm_backward(g2.data(), dwq2.data(), dwk2.data(), pre.data(), wq.data(), wk.data(), N, H, Hkv, D, eps);
  for (std::size_t c = 0; c < D; ++c) {
    CHECK(dwq2[c] == doctest::Approx(dwq[c] + 1.0).epsilon(1e-12));
    CHECK(dwk2[c] == doctest::Approx(dwk[c] + 1.0).epsilon(1e-12));
  }
}

// ---- SwiGLU (LlamaMLP: act_fn(gate_proj(x)) · up_proj(x), act_fn = silu) ------------------------

TEST_CASE("swiglu: known point") {
  // One row, F = 3: gate = [1, −0.5, 0], up = [2, 3, 1.5], dout = 1.
  // out = g·σ(g)·u;  dgate = u·σ(g)·(1 + g·(1 − σ(g)));  dup = g·σ(g).  σ(1) = 0.7310585786300049.
  const vec in = {1, -0.5, 0, 2, 3, 1.5};
  vec out(3);
  cpu::swiglu_forward(out.data(), in.data(), 1, 3);
  const vec e_out = {1.4621171572600098, -0.566311003197218, 0.0};
  for (std::size_t f = 0; f < 3; ++f) CHECK(out[f] == doctest::Approx(e_out[f]).epsilon(1e-14));
  const vec dout = {1, 1, 1};
  vec din = nans(6);
  cpu::swiglu_backward(din.data(), dout.data(), in.data(), 1, 3);
  const vec e_din = {1.8553410237429737, 0.7801164380920445, 0.75, 0.7310585786300049, -0.1887703343990727, 0.0};
  for (std::size_t i = 0; i < 6; ++i) CHECK(din[i] == doctest::Approx(e_din[i]).epsilon(1e-14));
}

TEST_CASE("gradcheck: swiglu (Llama MLP widths)") {
  const std::size_t N = 2, F = 7;
  vec x = randn(N * 2 * F, 3, 3.0), r = randn(N * F, 4);
  auto loss = [&] {
    vec out(N * F);
    cpu::swiglu_forward(out.data(), x.data(), N, F);
    return dot(out, r);
  };
  vec dx = nans(x.size());
  cpu::swiglu_backward(dx.data(), r.data(), x.data(), N, F);
  check_gradient("d[gate|up]", x, dx, loss);
}

// ---- grouped-query attention ------------------------------------------------------------------

namespace {
// Head width D is independent of any hidden size (Llama 3.2-style H·D != C is just a shape here).
const cpu::attention_shape gqa_shapes[] = {
    {2, 5, 4, 4, 3, true},   // Hkv = H: multi-head
    {2, 5, 4, 2, 3, true},   // GQA, 2 query heads per kv head
    {1, 6, 6, 2, 5, false},  // GQA, 3 per group, bidirectional
    {2, 4, 4, 1, 4, true},   // Hkv = 1: multi-query
    {1, 3, 3, 1, 7, false},  // multi-query, D > S
};
}  // namespace

TEST_CASE("gqa: naive and flash equal transformers' repeat_kv eager attention") {
  for (const auto& sh : gqa_shapes) {
    CAPTURE(sh.H);
    CAPTURE(sh.Hkv);
    CAPTURE(sh.D);
    CAPTURE(sh.causal);
    const vec qkv = randn(sh.rows() * sh.qkv_width(), 7);
    const vec ref = hf_attention(qkv, sh);
    vec out(ref.size()), att(sh.B * sh.H * sh.S * sh.S);
    cpu::attention_naive_forward(out.data(), att.data(), qkv.data(), sh);
    CHECK(max_abs_diff(out, ref) <= 1e-13);
    for (const std::size_t block : {std::size_t{1}, std::size_t{2}, std::size_t{64}}) {
      vec fo(ref.size());
      cpu::attention_flash_forward(fo.data(), static_cast<double*>(nullptr), qkv.data(), sh, block);
      CHECK(max_abs_diff(fo, ref) <= 1e-13);
    }
  }
}

TEST_CASE("gqa: equals multi-head attention on repeated k/v heads; dk, dv sum over the group") {
  for (const auto& sh : gqa_shapes) {
    CAPTURE(sh.H);
    CAPTURE(sh.Hkv);
    const std::size_t W = sh.qkv_width(), D = sh.D, rep = sh.H / sh.Hkv;
    const cpu::attention_shape mha{sh.B, sh.S, sh.H, sh.H, sh.D, sh.causal};
    const std::size_t WM = mha.qkv_width();
    const vec qkv = randn(sh.rows() * W, 11), dout = randn(sh.rows() * sh.out_width(), 12);
    vec qkv_mha(sh.rows() * WM);  // repeat_kv: MHA kv head h is GQA kv head h / rep
    for (std::size_t n = 0; n < sh.rows(); ++n) {
      for (std::size_t c = 0; c < sh.H * D; ++c) qkv_mha[n * WM + c] = qkv[n * W + c];
      for (std::size_t h = 0; h < sh.H; ++h)
        for (std::size_t d = 0; d < D; ++d) {
          qkv_mha[n * WM + mha.k_off(h) + d] = qkv[n * W + sh.k_off(h) + d];
          qkv_mha[n * WM + mha.v_off(h) + d] = qkv[n * W + sh.v_off(h) + d];
        }
    }
    for (const bool flash : {false, true}) {
      CAPTURE(flash);
      auto run = [&](const vec& x, const cpu::attention_shape& s, vec& out, vec& dx) {
        out.assign(s.rows() * s.out_width(), 0.0);
        dx = nans(x.size());
        if (flash) {
          vec lse(s.B * s.H * s.S);
          cpu::attention_flash_forward(out.data(), lse.data(), x.data(), s, 2);
          cpu::attention_flash_backward(dx.data(), dout.data(), x.data(), out.data(), lse.data(), s, 2);
        } else {
          vec att(s.B * s.H * s.S * s.S);
          cpu::attention_naive_forward(out.data(), att.data(), x.data(), s);
          cpu::attention_naive_backward(dx.data(), dout.data(), x.data(), att.data(), s);
        }
      };
      vec out_g, dx_g, out_m, dx_m;
      run(qkv, sh, out_g, dx_g);
      run(qkv_mha, mha, out_m, dx_m);
      CHECK(max_abs_diff(out_g, out_m) <= 1e-13);
      double worst = 0;
      for (std::size_t n = 0; n < sh.rows(); ++n) {
        for (std::size_t c = 0; c < sh.H * D; ++c) worst = std::max(worst, std::abs(dx_g[n * W + c] - dx_m[n * WM + c]));
        for (std::size_t g = 0; g < sh.Hkv; ++g)
          for (std::size_t d = 0; d < D; ++d) {
            double dk = 0, dv = 0;
            for (std::size_t h = g * rep; h < (g + 1) * rep; ++h) {
              dk += dx_m[n * WM + mha.k_off(h) + d];
              dv += dx_m[n * WM + mha.v_off(h) + d];
            }
            worst = std::max(worst, std::abs(dx_g[n * W + (sh.H + g) * D + d] - dk));
            worst = std::max(worst, std::abs(dx_g[n * W + (sh.H + sh.Hkv + g) * D + d] - dv));
          }
      }
      CHECK(worst <= 1e-13);
    }
  }
}

TEST_CASE("gradcheck: gqa / mqa attention") {
  for (const auto& sh : gqa_shapes) {
    CAPTURE(sh.H);
    CAPTURE(sh.Hkv);
    CAPTURE(sh.D);
    CAPTURE(sh.causal);
    vec qkv = randn(sh.rows() * sh.qkv_width(), 1), r = randn(sh.rows() * sh.out_width(), 2);
    auto loss = [&] {
      vec out(sh.rows() * sh.out_width());
      cpu::attention_naive_forward(out.data(), static_cast<double*>(nullptr), qkv.data(), sh);
      return dot(out, r);
    };
    vec out(sh.rows() * sh.out_width()), att(sh.B * sh.H * sh.S * sh.S), lse(sh.B * sh.H * sh.S);
    cpu::attention_naive_forward(out.data(), att.data(), qkv.data(), sh);
    vec dqkv = nans(qkv.size());
    cpu::attention_naive_backward(dqkv.data(), r.data(), qkv.data(), att.data(), sh);
    check_gradient("dqkv naive", qkv, dqkv, loss);
    cpu::attention_flash_forward(out.data(), lse.data(), qkv.data(), sh, 2);
    dqkv = nans(qkv.size());
    cpu::attention_flash_backward(dqkv.data(), r.data(), qkv.data(), out.data(), lse.data(), sh, 2);
    check_gradient("dqkv flash", qkv, dqkv, loss);
  }
}

TEST_CASE("gradcheck: Llama attention core (rope on q, k → grouped-query flash attention)") {
  for (const auto& sh : {cpu::attention_shape{2, 4, 4, 2, 6, true}, cpu::attention_shape{1, 5, 4, 1, 4, true}}) {
    for (const std::size_t R : {sh.D, sh.D - 2}) {
      CAPTURE(sh.Hkv);
      CAPTURE(R);
      vec qkv = randn(sh.rows() * sh.qkv_width(), 3), r = randn(sh.rows() * sh.out_width(), 4);
      auto loss = [&] {
        vec rot(qkv.size()), out(sh.rows() * sh.out_width());
        cpu::rope_qkv_forward(rot.data(), qkv.data(), sh, R, 100.0);
        cpu::attention_flash_forward(out.data(), static_cast<double*>(nullptr), rot.data(), sh, 2);
        return dot(out, r);
      };
      vec rot(qkv.size()), out(sh.rows() * sh.out_width()), lse(sh.B * sh.H * sh.S);
      cpu::rope_qkv_forward(rot.data(), qkv.data(), sh, R, 100.0);
      cpu::attention_flash_forward(out.data(), lse.data(), rot.data(), sh, 2);
      vec dqkv = nans(qkv.size());
      cpu::attention_flash_backward(dqkv.data(), r.data(), rot.data(), out.data(), lse.data(), sh, 2);
      cpu::rope_qkv_backward(dqkv.data(), dqkv.data(), sh, R, 100.0);  // in place
      check_gradient("dqkv", qkv, dqkv, loss);
    }
  }
}

// ---- the generation program's key/value cache ------------------------------------------------

TEST_CASE("kv cache: a prefill then decode steps over the cache equal transformers' attention over the whole sequence") {
  // Sequences of S tokens, in one fused qkv; the generation program appends the first P tokens'
  // keys and values to the cache and attends their queries over it, then each later token's
  // alone, at its position. Every query's output must be the eager attention's of the whole
  // sequence at that row (GQA, MQA and multi-head; fp64).
  for (const auto& full : {cpu::attention_shape{2, 9, 4, 2, 3, true}, cpu::attention_shape{1, 7, 3, 1, 5, true},
                           cpu::attention_shape{2, 6, 2, 2, 4, true}}) {
    CAPTURE(full.H);
    CAPTURE(full.Hkv);
    const std::size_t S = full.S, B = full.B, W = full.qkv_width(), O = full.out_width(), P = 4;
    const vec qkv = randn(full.rows() * W, 21);
    const vec ref = hf_attention(qkv, full);
    vec kv(B * S * 2 * full.Hkv * full.D, std::numeric_limits<double>::quiet_NaN());  // unwritten positions are NaN
    vec out(full.rows() * O);
    for (std::size_t pos0 = 0; pos0 < S;) {
      const std::size_t q = pos0 == 0 ? P : 1;
      const cpu::attention_shape step{B, q, full.H, full.Hkv, full.D, true};
      vec rows(B * q * W), got(B * q * O);
      for (std::size_t b = 0; b < B; ++b)
        for (std::size_t t = 0; t < q; ++t)
          for (std::size_t c = 0; c < W; ++c) rows[(b * q + t) * W + c] = qkv[(b * S + pos0 + t) * W + c];
      cpu::kv_append(kv.data(), rows.data(), step, pos0, S);
      cpu::cached_attention_forward(got.data(), rows.data(), kv.data(), step, pos0, S);
      for (std::size_t b = 0; b < B; ++b)
        for (std::size_t t = 0; t < q; ++t)
          for (std::size_t c = 0; c < O; ++c) out[(b * S + pos0 + t) * O + c] = got[(b * q + t) * O + c];
      pos0 += q;
    }
    CHECK(max_abs_diff(out, ref) <= 1e-13);
  }
  // Positions past the cache are refused.
  vec kv(2 * 4 * 2 * 2 * 3), rows(2 * 2 * (4 + 2 * 2) * 3);
  CHECK_THROWS_AS(cpu::kv_append(kv.data(), rows.data(), cpu::attention_shape{2, 2, 4, 2, 3, true}, 3, 4),
                  std::invalid_argument);
}

TEST_CASE("argmax: the smallest index of the largest logit; a NaN counts as the largest (torch.argmax)") {
  const vec logits = {0.5, 2.0, 2.0, -1.0,  // a tie: the first
                      -3.0, -2.0, -5.0, -2.5, std::numeric_limits<double>::quiet_NaN(), 9.0, std::numeric_limits<double>::quiet_NaN(), 1.0};
  std::int32_t out[3] = {-1, -1, -1};
  cpu::argmax_rows(out, logits.data(), 3, 4);
  CHECK(out[0] == 1);
  CHECK(out[1] == 1);
  CHECK(out[2] == 0);
}

TEST_CASE("rope: 16-bit and float storage round the accum_t result once") {
  // Same inputs in every type; the float path is the fp32 reference of the 16-bit ones.
  const std::size_t N = 6, S = 3, heads = 2, D = 8, R = 6;
  const auto xb = cast<memalg::bf16>(randn(N * heads * D, 5));
  const auto xf = widen(xb);
  std::vector<float> yf(xf.size());
  cpu::rope_forward(yf.data(), xf.data(), N, S, heads, D, R);
  std::vector<memalg::bf16> yb(xb.size());
  cpu::rope_forward(yb.data(), xb.data(), N, S, heads, D, R);
  const auto xh = cast<memalg::fp16>(vec(xf.begin(), xf.end()));
  std::vector<memalg::fp16> yh(xh.size());
  cpu::rope_backward(yh.data(), xh.data(), N, S, heads, D, R);
  const auto xhf = widen(xh);
  std::vector<float> yfb(xhf.size());
  cpu::rope_backward(yfb.data(), xhf.data(), N, S, heads, D, R);
  for (std::size_t i = 0; i < xf.size(); ++i) {
    CHECK(yb[i].bits == memalg::from_float<memalg::bf16>(yf[i]).bits);
    CHECK(yh[i].bits == memalg::from_float<memalg::fp16>(yfb[i]).bits);
  }
}

// SPDX-License-Identifier: BSL-1.0
// The speech model's kernels in fp64: conv1d, masked BatchNorm1d (and its running statistics),
// ReLU / tanh, cross-attention with a key mask, the masked mel L1 / MSE loss and the stop-token
// BCE. Each forward is checked against its definition written out independently (PyTorch's
// formulas, or an equivalent computation through another kernel), each backward against central
// differences. As in test_gradcheck.cpp, gradient checks use L = Σ out·r with a fixed random r,
// parameter gradients start from non-zero values (they must accumulate) and input gradients from
// NaN (they must be written). The last test compares bf16 with fp32 storage.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "memalg/backend/cpu/activation.hpp"
#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cpu/batchnorm.hpp"
#include "memalg/backend/cpu/conv1d.hpp"
#include "memalg/backend/cpu/speech_loss.hpp"
#include "speech_targets.hpp"
#include "test_util.hpp"

namespace cpu = memalg::backend::cpu;
using namespace memalg_test;
using vec = std::vector<double>;
using mask_t = std::vector<std::uint8_t>;

namespace {

/// nn.Conv1d(padding="same") as PyTorch defines it, on the channel-major [B, C, S] layout:
/// pad ⌊(K−1)/2⌋ zeros on the left and the rest on the right, then cross-correlate.
vec torch_conv1d(const vec& x_bcs, const vec& W, const vec& bias, std::size_t B, std::size_t S, std::size_t IC,
                 std::size_t OC, std::size_t K) {
  const std::size_t left = (K - 1) / 2, P = S + K - 1;
  vec out(B * OC * S);
  for (std::size_t b = 0; b < B; ++b) {
    vec padded(IC * P, 0.0);
    for (std::size_t i = 0; i < IC; ++i)
      for (std::size_t s = 0; s < S; ++s) padded[i * P + left + s] = x_bcs[(b * IC + i) * S + s];
    for (std::size_t o = 0; o < OC; ++o)
      for (std::size_t t = 0; t < S; ++t) {
        double v = bias.empty() ? 0.0 : bias[o];
        for (std::size_t i = 0; i < IC; ++i)
          for (std::size_t k = 0; k < K; ++k) v += W[(o * IC + i) * K + k] * padded[i * P + t + k];
        out[(b * OC + o) * S + t] = v;
      }
  }
  return out;
}

/// [B, S, C] ↔ [B, C, S].
vec transpose_bsc(const vec& x, std::size_t B, std::size_t S, std::size_t C, bool to_channel_major) {
  vec y(x.size());
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t s = 0; s < S; ++s)
      for (std::size_t c = 0; c < C; ++c) {
        const std::size_t tm = (b * S + s) * C + c, cm = (b * C + c) * S + s;
        if (to_channel_major) y[cm] = x[tm];
        else y[tm] = x[cm];
      }
  return y;
}

}  // namespace

// ---- conv1d ------------------------------------------------------------------------------------

TEST_CASE("conv1d: forward is nn.Conv1d(padding=\"same\") on the token-major layout") {
  const std::size_t B = 2, S = 7, IC = 3, OC = 4;
  for (const std::size_t K : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{4}, std::size_t{5}}) {
    CAPTURE(K);
    const vec x = randn(B * S * IC, 1), W = randn(OC * IC * K, 2), bias = randn(OC, 3);
    vec out(B * S * OC);
    cpu::conv1d_forward(out.data(), x.data(), W.data(), bias.data(), {B, S, IC, OC, K});
    const vec ref = torch_conv1d(transpose_bsc(x, B, S, IC, true), W, bias, B, S, IC, OC, K);
    CHECK(max_abs_diff(out, transpose_bsc(ref, B, S, OC, false)) < 1e-13);
    vec nob(B * S * OC);
    cpu::conv1d_forward(nob.data(), x.data(), W.data(), static_cast<const double*>(nullptr), {B, S, IC, OC, K});
    CHECK(max_abs_diff(nob, transpose_bsc(torch_conv1d(transpose_bsc(x, B, S, IC, true), W, {}, B, S, IC, OC, K), B,
                                          S, OC, false)) < 1e-13);
  }
  // The speech model's kernel 5: a single 1 at position 0 of a length-5 sequence reaches outputs
  // 0..2 only (left padding 2), through taps 2, 1, 0.
  vec x(5, 0.0), W = {10, 20, 30, 40, 50}, out(5);
  x[0] = 1;
  cpu::conv1d_forward(out.data(), x.data(), W.data(), static_cast<const double*>(nullptr), {1, 5, 1, 1, 5});
  CHECK(out == vec{30, 20, 10, 0, 0});
}

TEST_CASE("gradcheck: conv1d") {
  const std::size_t B = 2, S = 6, IC = 3, OC = 4;
  for (const std::size_t K : {std::size_t{1}, std::size_t{4}, std::size_t{5}}) {
    CAPTURE(K);
    const cpu::conv1d_shape sh{B, S, IC, OC, K};
    vec x = randn(B * S * IC, 1), W = randn(OC * IC * K, 2), bias = randn(OC, 3), r = randn(B * S * OC, 4);
    auto loss = [&] {
      vec out(B * S * OC);
      cpu::conv1d_forward(out.data(), x.data(), W.data(), bias.data(), sh);
      return dot(out, r);
    };
    vec dx = nans(x.size());
    const vec dW0 = randn(W.size(), 5), db0 = randn(OC, 6);
    vec dW = dW0, db = db0;
    cpu::conv1d_backward(dx.data(), dW.data(), db.data(), r.data(), x.data(), W.data(), sh);
    check_gradient("din", x, dx, loss);
    check_gradient("dW", W, minus(dW, dW0), loss);
    check_gradient("dbias", bias, minus(db, db0), loss);
  }
}

// ---- batchnorm ---------------------------------------------------------------------------------

TEST_CASE("batchnorm: forward normalises each channel over the real positions only") {
  const std::size_t N = 12, C = 3;
  const vec x = randn(N * C, 1, 3.0), gamma = {1.5, -0.5, 2.0}, beta = {0.1, 0.2, -0.3};
  mask_t mask(N, 1);
  for (const std::size_t n : {2, 7, 8, 11}) mask[n] = 0;
  vec out(N * C), mean(C), rstd(C);
  cpu::batchnorm_forward(out.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(), mask.data(), N, C);
  for (std::size_t c = 0; c < C; ++c) {
    // Statistics written out directly: the 8 real positions, biased variance.
    double m = 0, v = 0;
    for (std::size_t n = 0; n < N; ++n) m += mask[n] ? x[n * C + c] : 0.0;
    m /= 8;
    for (std::size_t n = 0; n < N; ++n) v += mask[n] ? (x[n * C + c] - m) * (x[n * C + c] - m) : 0.0;
    v /= 8;
    CHECK(mean[c] == doctest::Approx(m).epsilon(1e-14));
    CHECK(rstd[c] == doctest::Approx(1 / std::sqrt(v + 1e-5)).epsilon(1e-14));
    // (out − β)/γ over the real positions has mean 0 and variance v/(v + eps); padding is 0.
    double om = 0, ov = 0;
    for (std::size_t n = 0; n < N; ++n)
      if (mask[n]) om += (out[n * C + c] - beta[c]) / gamma[c];
      else CHECK(out[n * C + c] == 0.0);
    om /= 8;
    for (std::size_t n = 0; n < N; ++n)
      if (mask[n]) ov += std::pow((out[n * C + c] - beta[c]) / gamma[c] - om, 2);
    CHECK(std::abs(om) < 1e-14);
    CHECK(ov / 8 == doctest::Approx(v / (v + 1e-5)).epsilon(1e-12));
  }
  // A padded batch computes what the real rows alone compute.
  vec real_x, real_out(8 * C), m2(C), r2(C);
  for (std::size_t n = 0; n < N; ++n)
    if (mask[n]) real_x.insert(real_x.end(), x.begin() + n * C, x.begin() + (n + 1) * C);
  cpu::batchnorm_forward(real_out.data(), m2.data(), r2.data(), real_x.data(), gamma.data(), beta.data(),
                         static_cast<const std::uint8_t*>(nullptr), 8, C);
  for (std::size_t n = 0, k = 0; n < N; ++n)
    if (mask[n]) {
      for (std::size_t c = 0; c < C; ++c) CHECK(out[n * C + c] == doctest::Approx(real_out[k * C + c]).epsilon(1e-14));
      ++k;
    }
}

TEST_CASE("gradcheck: batchnorm (with and without a padding mask, in place)") {
  const std::size_t N = 10, C = 4;
  mask_t mask(N, 1);
  mask[3] = mask[9] = 0;
  for (const bool masked : {false, true}) {
    CAPTURE(masked);
    const std::uint8_t* mk = masked ? mask.data() : nullptr;
    vec x = randn(N * C, 1, 2.0), gamma = randn(C, 2), beta = randn(C, 3), r = randn(N * C, 4);
    auto loss = [&] {
      vec out(N * C), mean(C), rstd(C);
      cpu::batchnorm_forward(out.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(), mk, N, C);
      return dot(out, r);
    };
    vec out(N * C), mean(C), rstd(C);
    cpu::batchnorm_forward(out.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(), mk, N, C);
    vec dx = r;  // din aliases dout
    const vec dg0 = randn(C, 5), db0 = randn(C, 6);
    vec dg = dg0, db = db0;
    cpu::batchnorm_backward(dx.data(), dg.data(), db.data(), dx.data(), x.data(), gamma.data(), mean.data(),
                            rstd.data(), mk, N, C);
    check_gradient("din", x, dx, loss);
    check_gradient("dgamma", gamma, minus(dg, dg0), loss);
    check_gradient("dbeta", beta, minus(db, db0), loss);
    if (masked) CHECK(dx[3 * C] == 0.0);
  }
}

TEST_CASE("batchnorm: running statistics follow PyTorch (momentum 0.1, unbiased variance)") {
  const std::size_t N = 9, C = 2;
  const vec x = randn(N * C, 7, 2.0), gamma(C, 1.0), beta(C, 0.0);
  mask_t mask(N, 1);
  mask[0] = mask[5] = 0;  // M = 7
  vec out(N * C), mean(C), rstd(C);
  cpu::batchnorm_forward(out.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(), mask.data(), N, C);
  vec rm = {0.5, -1.0}, rv = {2.0, 0.25};
  const vec rm0 = rm, rv0 = rv;
  cpu::batchnorm_update_running(rm.data(), rv.data(), mean.data(), rstd.data(), mask.data(), N, C);
  for (std::size_t c = 0; c < C; ++c) {
    double m = 0, ss = 0;
    for (std::size_t n = 0; n < N; ++n) m += mask[n] ? x[n * C + c] / 7 : 0.0;
    for (std::size_t n = 0; n < N; ++n) ss += mask[n] ? (x[n * C + c] - m) * (x[n * C + c] - m) : 0.0;
    CHECK(rm[c] == doctest::Approx(0.9 * rm0[c] + 0.1 * m).epsilon(1e-13));
    CHECK(rv[c] == doctest::Approx(0.9 * rv0[c] + 0.1 * ss / 6).epsilon(1e-10));  // var from rstd: 1/r² − eps
  }
  mask_t one(N, 0);
  one[4] = 1;  // M = 1: no unbiased variance, left unchanged
  vec rm1 = rm0, rv1 = rv0;
  cpu::batchnorm_update_running(rm1.data(), rv1.data(), mean.data(), rstd.data(), one.data(), N, C);
  CHECK(rm1 == rm0);
  CHECK(rv1 == rv0);
}

// ---- relu / tanh -------------------------------------------------------------------------------

TEST_CASE("gradcheck: relu and tanh (backward from the in-place forward's output)") {
  const std::size_t n = 40;
  vec x = randn(n, 1, 2.0), r = randn(n, 2);
  for (auto& v : x)
    if (std::abs(v) < 1e-3) v = 0.5;  // keep relu away from its kink
  for (const bool use_tanh : {false, true}) {
    CAPTURE(use_tanh);
    auto fwd = [&](vec& y) {
      if (use_tanh) cpu::tanh_forward(y.data(), y.data(), n);
      else cpu::relu_forward(y.data(), y.data(), n);
    };
    auto loss = [&] {
      vec y = x;
      fwd(y);
      return dot(y, r);
    };
    vec y = x;
    fwd(y);  // in place
    for (std::size_t i = 0; i < n; ++i) CHECK(y[i] == (use_tanh ? std::tanh(x[i]) : std::max(x[i], 0.0)));
    vec dx = r;
    if (use_tanh) cpu::tanh_backward(dx.data(), dx.data(), y.data(), n);
    else cpu::relu_backward(dx.data(), dx.data(), y.data(), n);
    check_gradient("din", x, dx, loss);
  }
}

// ---- cross-attention ---------------------------------------------------------------------------

namespace {
const cpu::cross_attention_shape cross_shapes[] = {
    {2, 5, 7, 4, 2, 3},  // GQA, more keys than queries
    {2, 6, 3, 2, 2, 4},  // multi-head, fewer keys
    {1, 4, 5, 3, 1, 2},  // multi-query
};

/// Key mask: batch element b keeps its first Sk − b keys (element 0 unpadded).
mask_t key_mask_for(const cpu::cross_attention_shape& sh) {
  mask_t m(sh.kv_rows(), 1);
  for (std::size_t b = 0; b < sh.B; ++b)
    for (std::size_t j = sh.Sk - std::min(b, sh.Sk - 1); j < sh.Sk; ++j) m[b * sh.Sk + j] = 0;
  return m;
}
}  // namespace

TEST_CASE("cross-attention: unmasked equals bidirectional self-attention on [q ‖ k ‖ v]") {
  const std::size_t B = 2, S = 5, H = 4, Hkv = 2, D = 3;
  const cpu::cross_attention_shape cs{B, S, S, H, Hkv, D};
  const cpu::attention_shape ss{B, S, H, Hkv, D, false};
  const vec q = randn(cs.q_rows() * cs.q_width(), 1), kv = randn(cs.kv_rows() * cs.kv_width(), 2);
  vec qkv(ss.rows() * ss.qkv_width());
  for (std::size_t n = 0; n < ss.rows(); ++n) {
    std::copy_n(q.begin() + n * cs.q_width(), cs.q_width(), qkv.begin() + n * ss.qkv_width());
    std::copy_n(kv.begin() + n * cs.kv_width(), cs.kv_width(), qkv.begin() + n * ss.qkv_width() + cs.q_width());
  }
  vec out_self(ss.rows() * ss.out_width()), out_cross(out_self.size()), out_flash(out_self.size());
  cpu::attention_naive_forward(out_self.data(), static_cast<double*>(nullptr), qkv.data(), ss);
  cpu::cross_attention_naive_forward(out_cross.data(), static_cast<double*>(nullptr), q.data(), kv.data(), nullptr, cs);
  vec lse(B * H * S);
  cpu::cross_attention_flash_forward(out_flash.data(), lse.data(), q.data(), kv.data(), nullptr, cs, 2);
  CHECK(max_abs_diff(out_self, out_cross) < 1e-14);
  CHECK(max_abs_diff(out_self, out_flash) < 1e-13);
}

TEST_CASE("cross-attention: masked keys act as if the encoder sequence were shorter") {
  const cpu::cross_attention_shape sh{1, 4, 6, 2, 1, 3};
  const std::size_t real = 4;
  const vec q = randn(sh.q_rows() * sh.q_width(), 1), kv = randn(sh.kv_rows() * sh.kv_width(), 2);
  mask_t mask(sh.Sk, 0);
  std::fill_n(mask.begin(), real, 1);
  const cpu::cross_attention_shape short_sh{1, 4, real, 2, 1, 3};
  const vec kv_short(kv.begin(), kv.begin() + real * sh.kv_width());
  vec ref(sh.q_rows() * sh.out_width()), naive(ref.size()), flash(ref.size()), att(sh.B * sh.H * sh.Sq * sh.Sk),
      lse(sh.B * sh.H * sh.Sq);
  cpu::cross_attention_naive_forward(ref.data(), static_cast<double*>(nullptr), q.data(), kv_short.data(), nullptr,
                                     short_sh);
  cpu::cross_attention_naive_forward(naive.data(), att.data(), q.data(), kv.data(), mask.data(), sh);
  cpu::cross_attention_flash_forward(flash.data(), lse.data(), q.data(), kv.data(), mask.data(), sh, 3);
  CHECK(max_abs_diff(ref, naive) < 1e-14);
  CHECK(max_abs_diff(ref, flash) < 1e-13);
  for (std::size_t row = 0; row < sh.H * sh.Sq; ++row)
    for (std::size_t j = real; j < sh.Sk; ++j) CHECK(att[row * sh.Sk + j] == 0.0);
  // Every key padded: zero output, lse −∞, and no gradient.
  const mask_t none(sh.Sk, 0);
  cpu::cross_attention_flash_forward(flash.data(), lse.data(), q.data(), kv.data(), none.data(), sh, 3);
  CHECK(std::all_of(flash.begin(), flash.end(), [](double v) { return v == 0.0; }));
  CHECK(std::isinf(lse[0]));
  vec dq = nans(q.size()), dkv = nans(kv.size());
  cpu::cross_attention_flash_backward(dq.data(), dkv.data(), randn(flash.size(), 3).data(), q.data(), kv.data(),
                                      flash.data(), lse.data(), none.data(), sh, 3);
  CHECK(std::all_of(dq.begin(), dq.end(), [](double v) { return v == 0.0; }));
  CHECK(std::all_of(dkv.begin(), dkv.end(), [](double v) { return v == 0.0; }));
}

TEST_CASE("gradcheck: cross-attention naive and flash, with a key mask") {
  for (const auto& sh : cross_shapes) {
    for (const bool masked : {false, true}) {
      CAPTURE(sh.Sq);
      CAPTURE(sh.Sk);
      CAPTURE(sh.H);
      CAPTURE(sh.Hkv);
      CAPTURE(masked);
      const mask_t km = key_mask_for(sh);
      const std::uint8_t* mk = masked ? km.data() : nullptr;
      vec q = randn(sh.q_rows() * sh.q_width(), 1), kv = randn(sh.kv_rows() * sh.kv_width(), 2),
          r = randn(sh.q_rows() * sh.out_width(), 3);
      const std::size_t n_out = sh.q_rows() * sh.out_width(), n_att = sh.B * sh.H * sh.Sq * sh.Sk;
      {
        auto loss = [&] {
          vec out(n_out);
          cpu::cross_attention_naive_forward(out.data(), static_cast<double*>(nullptr), q.data(), kv.data(), mk, sh);
          return dot(out, r);
        };
        vec out(n_out), att(n_att);
        cpu::cross_attention_naive_forward(out.data(), att.data(), q.data(), kv.data(), mk, sh);
        vec dq = nans(q.size()), dkv = nans(kv.size());
        cpu::cross_attention_naive_backward(dq.data(), dkv.data(), r.data(), q.data(), kv.data(), att.data(), mk, sh);
        check_gradient("naive dq", q, dq, loss);
        check_gradient("naive dkv", kv, dkv, loss);
      }
      for (const std::size_t block : {std::size_t{1}, std::size_t{2}, std::size_t{64}}) {
        CAPTURE(block);
        auto loss = [&] {
          vec out(n_out);
          cpu::cross_attention_flash_forward(out.data(), static_cast<double*>(nullptr), q.data(), kv.data(), mk, sh,
                                             block);
          return dot(out, r);
        };
        vec out(n_out), lse(sh.B * sh.H * sh.Sq);
        cpu::cross_attention_flash_forward(out.data(), lse.data(), q.data(), kv.data(), mk, sh, block);
        vec dq = nans(q.size()), dkv = nans(kv.size());
        cpu::cross_attention_flash_backward(dq.data(), dkv.data(), r.data(), q.data(), kv.data(), out.data(),
                                            lse.data(), mk, sh, block);
        check_gradient("flash dq", q, dq, loss);
        check_gradient("flash dkv", kv, dkv, loss);
      }
    }
  }
}

// ---- losses ------------------------------------------------------------------------------------

TEST_CASE("speech losses: forward values from their definitions; mask and stop-target helpers") {
  const std::vector<std::int32_t> lengths = {3, 5};
  const std::size_t B = 2, T = 5, N = B * T, n_mels = 3, ld = n_mels + 1;
  mask_t mask(N);
  speech_targets::frame_mask_from_lengths(mask.data(), lengths.data(), B, T);
  CHECK(mask == mask_t{1, 1, 1, 0, 0, 1, 1, 1, 1, 1});
  std::vector<float> stop(N);
  speech_targets::stop_targets(stop.data(), lengths.data(), B, T);
  CHECK(stop == std::vector<float>{0, 0, 1, 1, 1, 0, 0, 0, 0, 1});
  CHECK_THROWS_AS(speech_targets::stop_targets(stop.data(), std::vector<std::int32_t>{0, 5}.data(), B, T), std::out_of_range);

  const vec out = randn(N * ld, 1), target_d = randn(N * n_mels, 2);  // fused [mel ‖ stop] rows
  const std::vector<float> target(target_d.begin(), target_d.end());  // fp32, as the step's features
  double l1 = 0, l2 = 0, bce = 0;
  for (std::size_t n = 0; n < N; ++n) {
    const double p = 1 / (1 + std::exp(-out[n * ld + n_mels]));  // −[y log p + (1 − y) log(1 − p)], every row
    bce -= stop[n] * std::log(p) + (1 - stop[n]) * std::log(1 - p);
    if (!mask[n]) continue;
    for (std::size_t c = 0; c < n_mels; ++c) {
      const double d = out[n * ld + c] - target[n * n_mels + c];
      l1 += std::abs(d);
      l2 += d * d;
    }
  }
  vec grad(N * ld);
  CHECK(cpu::mel_loss(grad.data(), true, out.data(), ld, target.data(), mask.data(), N, n_mels, 1.0) ==
        doctest::Approx(l1).epsilon(1e-14));
  CHECK(cpu::mel_loss(grad.data(), false, out.data(), ld, target.data(), mask.data(), N, n_mels, 1.0) ==
        doctest::Approx(l2).epsilon(1e-14));
  CHECK(cpu::stop_loss(grad.data() + n_mels, out.data() + n_mels, ld, stop.data(), N, 1.0) ==
        doctest::Approx(bce).epsilon(1e-13));
  // Large logits stay finite (the stable form): x = ±40 with the wrong target costs 40 each.
  const vec big = {40, -40};
  const std::vector<float> wrong = {0, 1};
  vec gbig(2);
  CHECK(cpu::stop_loss(gbig.data(), big.data(), 1, wrong.data(), 2, 1.0) == doctest::Approx(80.0).epsilon(1e-14));
}

TEST_CASE("gradcheck: masked mel L1 / MSE and stop-token BCE on the fused output") {
  const std::vector<std::int32_t> lengths = {4, 6, 2};
  const std::size_t B = 3, T = 6, N = B * T, n_mels = 4, ld = n_mels + 1;
  const double g = 0.7;  // not 1, to check the scaling
  mask_t mask(N);
  speech_targets::frame_mask_from_lengths(mask.data(), lengths.data(), B, T);
  std::vector<float> stop(N);
  speech_targets::stop_targets(stop.data(), lengths.data(), B, T);
  vec out = randn(N * ld, 1, 2.0);
  const vec target_d = randn(N * n_mels, 2);
  const std::vector<float> target(target_d.begin(), target_d.end());
  for (const bool l1 : {true, false}) {
    CAPTURE(l1);
    vec scratch(N * n_mels);
    auto loss = [&] { return g * cpu::mel_loss(scratch.data(), l1, out.data(), ld, target.data(), mask.data(), N, n_mels, 1.0); };
    vec grad_mel = nans(N * n_mels);
    cpu::mel_loss(grad_mel.data(), l1, out.data(), ld, target.data(), mask.data(), N, n_mels, g);
    vec grad(out.size(), 0.0);  // contiguous [N, n_mels] into the fused rows; the stop column is not the mel loss's
    for (std::size_t n = 0; n < N; ++n)
      for (std::size_t c = 0; c < n_mels; ++c) grad[n * ld + c] = grad_mel[n * n_mels + c];
    check_gradient("dpred", out, grad, loss);
  }
  vec scratch(out.size());
  auto loss = [&] { return g * cpu::stop_loss(scratch.data() + n_mels, out.data() + n_mels, ld, stop.data(), N, 1.0); };
  vec grad(out.size(), 0.0);
  for (std::size_t n = 0; n < N; ++n) grad[n * ld + n_mels] = std::numeric_limits<double>::quiet_NaN();
  cpu::stop_loss(grad.data() + n_mels, out.data() + n_mels, ld, stop.data(), N, g);
  check_gradient("dlogits", out, grad, loss);
}

// ---- 16-bit storage ----------------------------------------------------------------------------

TEST_CASE("speech kernels: bf16 storage against fp32") {
  // Inputs are rounded to bf16 and the fp32 path gets the same values widened, so the two differ
  // only by bf16 rounding of results: each kernel rounds its result once (u = 2^-8), so a
  // relative 2-norm difference within 2u is required.
  using memalg::bf16;
  const double u = 0x1p-8;
  auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
  };
  const std::size_t B = 2, S = 9, C = 8, K = 5;
  const auto xh = cast<bf16>(randn(B * S * C, 1)), Wh = cast<bf16>(randn(C * C * K, 2, 0.2)),
             dyh = cast<bf16>(randn(B * S * C, 3)), gh = cast<bf16>(randn(C, 4)), bh = cast<bf16>(randn(C, 5));
  const auto xf = widen(xh), Wf = widen(Wh), dyf = widen(dyh), gf = widen(gh), bf = widen(bh);
  mask_t mask(B * S, 1);
  mask[8] = mask[17] = mask[16] = 0;
  const cpu::conv1d_shape sh{B, S, C, C, K};

  SUBCASE("conv1d") {
    std::vector<bf16> yh(B * S * C), dxh(B * S * C), dWh(C * C * K, memalg::from_float<bf16>(0.0f));
    std::vector<float> yf(B * S * C), dxf(B * S * C), dWf(C * C * K, 0.0f);
    cpu::conv1d_forward(yh.data(), xh.data(), Wh.data(), bh.data(), sh);
    cpu::conv1d_forward(yf.data(), xf.data(), Wf.data(), bf.data(), sh);
    cpu::conv1d_backward(dxh.data(), dWh.data(), static_cast<bf16*>(nullptr), dyh.data(), xh.data(), Wh.data(), sh);
    cpu::conv1d_backward(dxf.data(), dWf.data(), static_cast<float*>(nullptr), dyf.data(), xf.data(), Wf.data(), sh);
    CHECK(rel(widen(yh), yf) <= 2 * u);
    CHECK(rel(widen(dxh), dxf) <= 2 * u);
    CHECK(rel(widen(dWh), dWf) <= 2 * u);
  }
  SUBCASE("batchnorm") {
    std::vector<bf16> yh(B * S * C), dxh(B * S * C);
    std::vector<float> yf(B * S * C), dxf(B * S * C), mh(C), rh(C), mf(C), rf(C);
    cpu::batchnorm_forward(yh.data(), mh.data(), rh.data(), xh.data(), gh.data(), bh.data(), mask.data(), B * S, C);
    cpu::batchnorm_forward(yf.data(), mf.data(), rf.data(), xf.data(), gf.data(), bf.data(), mask.data(), B * S, C);
    cpu::batchnorm_backward(dxh.data(), static_cast<bf16*>(nullptr), static_cast<bf16*>(nullptr), dyh.data(),
                            xh.data(), gh.data(), mh.data(), rh.data(), mask.data(), B * S, C);
    cpu::batchnorm_backward(dxf.data(), static_cast<float*>(nullptr), static_cast<float*>(nullptr), dyf.data(),
                            xf.data(), gf.data(), mf.data(), rf.data(), mask.data(), B * S, C);
    CHECK(mh == mf);  // statistics are float in both
    CHECK(rel(widen(yh), yf) <= 2 * u);
    CHECK(rel(widen(dxh), dxf) <= 2 * u);
  }
  SUBCASE("cross-attention flash") {
    const cpu::cross_attention_shape cs{B, S, 6, 2, 1, 4};
    const auto qh = cast<bf16>(randn(cs.q_rows() * cs.q_width(), 6)),
               kvh = cast<bf16>(randn(cs.kv_rows() * cs.kv_width(), 7));
    const auto qf = widen(qh), kvf = widen(kvh);
    const auto doh = cast<bf16>(randn(cs.q_rows() * cs.out_width(), 8));
    const auto dof = widen(doh);
    const mask_t km = key_mask_for(cs);
    std::vector<bf16> oh(cs.q_rows() * cs.out_width()), dqh(qh.size()), dkvh(kvh.size());
    std::vector<float> of(oh.size()), dqf(qf.size()), dkvf(kvf.size()), lh(B * 2 * S), lf(B * 2 * S);
    cpu::cross_attention_flash_forward(oh.data(), lh.data(), qh.data(), kvh.data(), km.data(), cs);
    cpu::cross_attention_flash_forward(of.data(), lf.data(), qf.data(), kvf.data(), km.data(), cs);
    cpu::cross_attention_flash_backward(dqh.data(), dkvh.data(), doh.data(), qh.data(), kvh.data(), oh.data(),
                                        lh.data(), km.data(), cs);
    cpu::cross_attention_flash_backward(dqf.data(), dkvf.data(), dof.data(), qf.data(), kvf.data(), of.data(),
                                        lf.data(), km.data(), cs);
    CHECK(rel(widen(oh), of) <= 2 * u);
    // The backward reads the bf16-rounded output (D_t = Σ dout·out): one more rounding.
    CHECK(rel(widen(dqh), dqf) <= 4 * u);
    CHECK(rel(widen(dkvh), dkvf) <= 4 * u);
  }
  SUBCASE("losses") {
    std::vector<bf16> dh(B * S * C);
    std::vector<float> df(B * S * C);
    const std::vector<float> target = widen(dyh);
    const float lh = cpu::mel_loss(dh.data(), true, xh.data(), C, target.data(), mask.data(), B * S, C, 1.0f);
    const float lf = cpu::mel_loss(df.data(), true, xf.data(), C, target.data(), mask.data(), B * S, C, 1.0f);
    CHECK(lh == lf);  // same widened inputs, float accumulation in both
    cpu::mel_loss(dh.data(), false, xh.data(), C, target.data(), mask.data(), B * S, C, 1.0f);
    cpu::mel_loss(df.data(), false, xf.data(), C, target.data(), mask.data(), B * S, C, 1.0f);
    CHECK(rel(widen(dh), df) <= 2 * u);
  }
}

// SPDX-License-Identifier: BSL-1.0
// Cross-checks between kernels that must agree (naive vs flash attention, chunked vs unchunked
// lm-head + cross-entropy), the dropout mask contract, and small hand-checked cases.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cpu/cross_entropy.hpp"
#include "memalg/backend/cpu/dropout.hpp"
#include "memalg/backend/cpu/embedding.hpp"
#include "memalg/backend/cpu/linear.hpp"
#include "memalg/core/random.hpp"
#include "test_util.hpp"

namespace cpu = memalg::backend::cpu;
using namespace memalg_test;
using memalg::accum_t;
using memalg::bf16;

namespace {
template <class T>
double max_abs_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(static_cast<double>(memalg::to_float(a[i])) - static_cast<double>(memalg::to_float(b[i]))));
  return m;
}
}  // namespace

TEST_CASE_TEMPLATE("attention: naive and flash agree (forward, lse, backward)", T, double, float) {
  const double tol = std::is_same_v<T, double> ? 1e-12 : 2e-5;
  const cpu::attention_shape shapes[] = {
      {2, 7, 4, 2, 8, true}, {2, 7, 4, 2, 8, false}, {1, 9, 6, 3, 4, true}, {1, 5, 4, 1, 4, false}, {1, 1, 2, 1, 4, true}};
  for (const auto& sh : shapes) {
    for (const std::size_t block : {std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{64}}) {
      CAPTURE(sh.S);
      CAPTURE(sh.H);
      CAPTURE(sh.Hkv);
      CAPTURE(sh.causal);
      CAPTURE(block);
      const auto qkv = cast<T>(randn(sh.rows() * sh.qkv_width(), 10, 1.5));
      const auto dout = cast<T>(randn(sh.rows() * sh.out_width(), 11));
      std::vector<T> out_n(sh.rows() * sh.out_width()), out_f(out_n.size()), att(sh.B * sh.H * sh.S * sh.S);
      std::vector<accum_t<T>> lse(sh.B * sh.H * sh.S);
      cpu::attention_naive_forward(out_n.data(), att.data(), qkv.data(), sh);
      cpu::attention_flash_forward(out_f.data(), lse.data(), qkv.data(), sh, block);
      CHECK(max_abs_diff(out_n, out_f) <= tol);

      // lse against the saved probabilities: the row maximum of att is exp(s_max − lse).
      bool masked_zero = true;
      for (std::size_t b = 0; b < sh.B; ++b)
        for (std::size_t h = 0; h < sh.H; ++h)
          for (std::size_t t = 0; t < sh.S; ++t)
            for (std::size_t j = sh.keys(t); j < sh.S; ++j)
              masked_zero = masked_zero && memalg::to_float(att[((b * sh.H + h) * sh.S + t) * sh.S + j]) == 0;
      CHECK(masked_zero);
      // lse of the first query: only key 0 when causal, so lse = q0·k0/√D.
      if (sh.causal) {
        accum_t<T> s = 0;
        for (std::size_t d = 0; d < sh.D; ++d) s += memalg::to_float(qkv[d]) * memalg::to_float(qkv[sh.k_off(0) + d]);
        CHECK(std::abs(static_cast<double>(lse[0] - s / std::sqrt(static_cast<accum_t<T>>(sh.D)))) <= tol);
      }

      std::vector<T> dn(qkv.size()), df(qkv.size());
      cpu::attention_naive_backward(dn.data(), dout.data(), qkv.data(), att.data(), sh);
      cpu::attention_flash_backward(df.data(), dout.data(), qkv.data(), out_f.data(), lse.data(), sh, block);
      CHECK(max_abs_diff(dn, df) <= 10 * tol);
    }
  }
}

TEST_CASE("attention: rejects H not a multiple of Hkv") {
  const cpu::attention_shape sh{1, 2, 3, 2, 4, true};
  std::vector<float> qkv(2 * sh.qkv_width()), out(2 * sh.out_width());
  CHECK_THROWS_AS(cpu::attention_naive_forward(out.data(), static_cast<float*>(nullptr), qkv.data(), sh), std::invalid_argument);
}

TEST_CASE("cross-entropy: hand-checked values and in-place backward") {
  // Uniform logits over V classes: loss = log V, gradient (1/V − onehot)/N.
  const std::size_t N = 2, V = 4;
  std::vector<float> logits(N * V, 3.0f);
  const std::vector<std::int32_t> tgt = {1, 3};
  std::vector<float> loss(N);
  CHECK(cpu::cross_entropy_forward(loss.data(), logits.data(), tgt.data(), N, V) == doctest::Approx(std::log(4.0)));
  cpu::cross_entropy_backward(logits.data(), logits.data(), tgt.data(), 1.0f, N, V);  // in place
  CHECK(logits[0] == doctest::Approx(0.125));
  CHECK(logits[1] == doctest::Approx(-0.375));
  CHECK(logits[7] == doctest::Approx(-0.375));
  // Large logits do not overflow (max-subtracted).
  std::vector<float> big = {1000.0f, 0.0f};
  const std::vector<std::int32_t> t0 = {0};
  CHECK(cpu::cross_entropy_forward(loss.data(), big.data(), t0.data(), 1, 2) == doctest::Approx(std::log1p(std::exp(-1000.0))));
  const std::vector<std::int32_t> bad = {4};
  CHECK_THROWS_AS(cpu::cross_entropy_forward(loss.data(), logits.data(), bad.data(), 1, V), std::out_of_range);
}

TEST_CASE("dropout: mask comes from memalg::dropout_keep with the flat index") {
  const std::size_t n = 10000;
  const std::uint64_t seed = 7;
  for (const float p : {0.0f, 0.1f, 0.5f, 1.0f}) {
    CAPTURE(p);
    std::vector<float> in(n, 2.0f), out(n), din(n);
    std::vector<std::uint8_t> mask(n);
    cpu::dropout_forward(out.data(), mask.data(), in.data(), n, p, seed);
    std::size_t kept = 0;
    bool consistent = true;
    for (std::size_t i = 0; i < n; ++i) {
      const bool keep = memalg::dropout_keep(seed, i, p);
      kept += keep;
      consistent = consistent && mask[i] == (keep ? 1 : 0) && out[i] == (keep ? 2.0f / (1.0f - p) : 0.0f);
    }
    CHECK(consistent);
    CHECK(std::abs(static_cast<double>(kept) / n - (1.0 - p)) < 0.02);
    std::vector<float> dout(n, 1.0f);
    cpu::dropout_backward(din.data(), dout.data(), mask.data(), n, p);
    for (std::size_t i = 0; i < n; ++i) consistent = consistent && din[i] == (mask[i] ? 1.0f / (1.0f - p) : 0.0f);
    CHECK(consistent);
  }
  // Different seeds give different masks.
  std::vector<float> in(64, 1.0f), a(64), b(64);
  cpu::dropout_forward(a.data(), static_cast<std::uint8_t*>(nullptr), in.data(), 64, 0.5f, 1);
  cpu::dropout_forward(b.data(), static_cast<std::uint8_t*>(nullptr), in.data(), 64, 0.5f, 2);
  CHECK(a != b);
}

TEST_CASE("embedding: hand-checked forward and accumulating backward") {
  const std::size_t B = 2, S = 2, C = 2;
  const std::vector<float> wte = {1, 2, 10, 20, 100, 200}, wpe = {0.5f, 0.25f, -1, -2};
  const std::vector<std::int32_t> tok = {2, 0, 2, 2};
  std::vector<float> out(B * S * C);
  cpu::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, S, C);
  CHECK(out == std::vector<float>{100.5f, 200.25f, 0, 0, 100.5f, 200.25f, 99, 198});
  std::vector<float> dwte(6, 1.0f), dwpe(4, 0.0f);
  const std::vector<float> dout = {1, 1, 2, 2, 3, 3, 4, 4};
  cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, S, C);
  CHECK(dwte == std::vector<float>{3, 3, 1, 1, 9, 9});  // row 2 gets 1 + 3 + 4 on top of 1
  CHECK(dwpe == std::vector<float>{4, 4, 6, 6});
}

TEST_CASE("linear: hand-checked values, accumulation across calls") {
  // in = [[1, 2]], W = [[1, 0], [0, 1], [1, 1]], bias = [0, 1, 2] -> out = [[1, 3, 5]]
  const std::vector<float> in = {1, 2}, W = {1, 0, 0, 1, 1, 1}, bias = {0, 1, 2};
  std::vector<float> out(3);
  cpu::linear_forward(out.data(), in.data(), W.data(), bias.data(), 1, 2, 3);
  CHECK(out == std::vector<float>{1, 3, 5});
  const std::vector<float> dout = {1, 1, 1};
  std::vector<float> din(2, -7.0f), dW(6, 0.0f), db(3, 0.0f);
  for (int k = 0; k < 2; ++k)  // gradient accumulation: two micro-batches
    cpu::linear_backward(din.data(), dW.data(), db.data(), dout.data(), in.data(), W.data(), 1, 2, 3);
  CHECK(din == std::vector<float>{2, 2});  // written, not accumulated
  CHECK(dW == std::vector<float>{2, 4, 2, 4, 2, 4});
  CHECK(db == std::vector<float>{2, 2, 2});
}

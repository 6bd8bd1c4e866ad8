// SPDX-License-Identifier: BSL-1.0
// Finite-difference gradient checks in fp64 (T = double) for every kernel with a backward.
// Each test uses the scalar L = Σ out·r with a fixed random r, runs the backward with dout = r and
// compares every analytic gradient with central differences. Parameter gradients start from
// non-zero values (they must accumulate) and input gradients from NaN (they must be written).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "memalg/backend/cpu/activation.hpp"
#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cpu/cross_entropy.hpp"
#include "memalg/backend/cpu/dropout.hpp"
#include "memalg/backend/cpu/embedding.hpp"
#include "memalg/backend/cpu/layernorm.hpp"
#include "memalg/backend/cpu/linear.hpp"
#include "memalg/backend/cpu/rmsnorm.hpp"
#include "test_util.hpp"

namespace cpu = memalg::backend::cpu;
using namespace memalg_test;
using vec = std::vector<double>;

TEST_CASE("gradcheck: embedding (repeated tokens, with and without wpe)") {
  const std::size_t B = 2, S = 5, C = 3, V = 4;
  const std::vector<std::int32_t> tok = {1, 3, 1, 0, 1, 3, 3, 2, 1, 0};  // repeats on purpose
  vec wte = randn(V * C, 1), wpe = randn(S * C, 2), r = randn(B * S * C, 3);
  for (const bool with_wpe : {true, false}) {
    CAPTURE(with_wpe);
    auto loss = [&] {
      vec out(B * S * C);
      cpu::embedding_forward(out.data(), tok.data(), wte.data(), with_wpe ? wpe.data() : nullptr, B, S, C);
      return dot(out, r);
    };
    const vec dwte0 = randn(V * C, 4), dwpe0 = randn(S * C, 5);
    vec dwte = dwte0, dwpe = dwpe0;
    cpu::embedding_backward(dwte.data(), with_wpe ? dwpe.data() : nullptr, r.data(), tok.data(), B, S, C);
    check_gradient("dwte", wte, minus(dwte, dwte0), loss);
    if (with_wpe) check_gradient("dwpe", wpe, minus(dwpe, dwpe0), loss);
  }
}

TEST_CASE("gradcheck: linear") {
  const std::size_t N = 4, IC = 3, OC = 5;
  vec x = randn(N * IC, 1), W = randn(OC * IC, 2), b = randn(OC, 3), r = randn(N * OC, 4);
  auto loss = [&] {
    vec out(N * OC);
    cpu::linear_forward(out.data(), x.data(), W.data(), b.data(), N, IC, OC);
    return dot(out, r);
  };
  vec dx = nans(N * IC);
  const vec dW0 = randn(OC * IC, 5), db0 = randn(OC, 6);
  vec dW = dW0, db = db0;
  cpu::linear_backward(dx.data(), dW.data(), db.data(), r.data(), x.data(), W.data(), N, IC, OC);
  check_gradient("din", x, dx, loss);
  check_gradient("dW", W, minus(dW, dW0), loss);
  check_gradient("dbias", b, minus(db, db0), loss);
}

TEST_CASE("gradcheck: layernorm") {
  const std::size_t N = 3, C = 6;
  vec x = randn(N * C, 1), w = randn(C, 2), b = randn(C, 3), r = randn(N * C, 4);
  auto loss = [&] {
    vec out(N * C);
    cpu::layernorm_forward(out.data(), static_cast<double*>(nullptr), static_cast<double*>(nullptr), x.data(),
                           w.data(), b.data(), N, C, 1e-5);
    return dot(out, r);
  };
  vec out(N * C), mean(N), rstd(N);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5);
  vec dx = nans(N * C);
  const vec dw0 = randn(C, 5), db0 = randn(C, 6);
  vec dw = dw0, db = db0;
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  check_gradient("din", x, dx, loss);
  check_gradient("dw", w, minus(dw, dw0), loss);
  check_gradient("db", b, minus(db, db0), loss);
}

TEST_CASE("gradcheck: rmsnorm") {
  const std::size_t N = 3, C = 6;
  vec x = randn(N * C, 1), w = randn(C, 2), r = randn(N * C, 4);
  auto loss = [&] {
    vec out(N * C);
    cpu::rmsnorm_forward(out.data(), static_cast<double*>(nullptr), x.data(), w.data(), N, C, 1e-6);
    return dot(out, r);
  };
  vec out(N * C), rstd(N);
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6);
  vec dx = nans(N * C);
  const vec dw0 = randn(C, 5);
  vec dw = dw0;
  cpu::rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C);
  check_gradient("din", x, dx, loss);
  check_gradient("dw", w, minus(dw, dw0), loss);
}

TEST_CASE("rmsnorm with a weight offset: Gemma's (1 + w), its gradients, and w + 1 without the offset") {
  // Gemma2RMSNorm: x · rsqrt(mean(x²) + ε) · (1 + w), weights starting at zero (modeling_gemma2.py).
  const std::size_t N = 3, C = 6;
  vec x = randn(N * C, 11), w = randn(C, 12, 0.1), r = randn(N * C, 14);
  auto loss = [&] {
    vec out(N * C);
    cpu::rmsnorm_forward(out.data(), static_cast<double*>(nullptr), x.data(), w.data(), N, C, 1e-6, 1.0);
    return dot(out, r);
  };
  vec out(N * C), rstd(N), w1(C), out1(N * C), rstd1(N);
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6, 1.0);
  for (std::size_t c = 0; c < C; ++c) w1[c] = 1.0 + w[c];
  cpu::rmsnorm_forward(out1.data(), rstd1.data(), x.data(), w1.data(), N, C, 1e-6);
  for (std::size_t i = 0; i < N * C; ++i) CHECK(out[i] == doctest::Approx(out1[i]).epsilon(1e-15));
  vec dx = nans(N * C);
  const vec dw0 = randn(C, 15);
  vec dw = dw0;
  cpu::rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C, 1.0);
  check_gradient("din", x, dx, loss);
  check_gradient("dw", w, minus(dw, dw0), loss);
}

TEST_CASE("gradcheck: gelu") {
  const std::size_t n = 40;
  vec x = randn(n, 1, 2.0), r = randn(n, 2);
  auto loss = [&] {
    vec out(n);
    cpu::gelu_forward(out.data(), x.data(), n);
    return dot(out, r);
  };
  vec dx = nans(n);
  cpu::gelu_backward(dx.data(), r.data(), x.data(), n);
  check_gradient("din", x, dx, loss);
}

TEST_CASE("gradcheck: swiglu") {
  const std::size_t N = 3, F = 5;
  vec x = randn(N * 2 * F, 1, 2.0), r = randn(N * F, 2);
  auto loss = [&] {
    vec out(N * F);
    cpu::swiglu_forward(out.data(), x.data(), N, F);
    return dot(out, r);
  };
  vec dx = nans(N * 2 * F);
  cpu::swiglu_backward(dx.data(), r.data(), x.data(), N, F);
  check_gradient("din", x, dx, loss);
}

namespace {
const cpu::attention_shape attention_shapes[] = {
    {2, 5, 4, 2, 3, true},   // GQA, causal
    {2, 5, 4, 2, 3, false},  // GQA, bidirectional
    {1, 6, 2, 2, 4, true},   // multi-head (Hkv = H)
    {1, 4, 3, 1, 2, false},  // multi-query (Hkv = 1)
};
}  // namespace

TEST_CASE("gradcheck: attention naive") {
  for (const auto& sh : attention_shapes) {
    CAPTURE(sh.H);
    CAPTURE(sh.Hkv);
    CAPTURE(sh.causal);
    vec qkv = randn(sh.rows() * sh.qkv_width(), 1), r = randn(sh.rows() * sh.out_width(), 2);
    auto loss = [&] {
      vec out(sh.rows() * sh.out_width());
      cpu::attention_naive_forward(out.data(), static_cast<double*>(nullptr), qkv.data(), sh);
      return dot(out, r);
    };
    vec out(sh.rows() * sh.out_width()), att(sh.B * sh.H * sh.S * sh.S);
    cpu::attention_naive_forward(out.data(), att.data(), qkv.data(), sh);
    vec dqkv = nans(qkv.size());
    cpu::attention_naive_backward(dqkv.data(), r.data(), qkv.data(), att.data(), sh);
    check_gradient("dqkv", qkv, dqkv, loss);
  }
}

TEST_CASE("gradcheck: attention flash") {
  for (const auto& sh : attention_shapes) {
    for (const std::size_t block : {std::size_t{1}, std::size_t{2}, std::size_t{64}}) {
      CAPTURE(sh.H);
      CAPTURE(sh.Hkv);
      CAPTURE(sh.causal);
      CAPTURE(block);
      vec qkv = randn(sh.rows() * sh.qkv_width(), 1), r = randn(sh.rows() * sh.out_width(), 2);
      auto loss = [&] {
        vec out(sh.rows() * sh.out_width());
        cpu::attention_flash_forward(out.data(), static_cast<double*>(nullptr), qkv.data(), sh, block);
        return dot(out, r);
      };
      vec out(sh.rows() * sh.out_width()), lse(sh.B * sh.H * sh.S);
      cpu::attention_flash_forward(out.data(), lse.data(), qkv.data(), sh, block);
      vec dqkv = nans(qkv.size());
      cpu::attention_flash_backward(dqkv.data(), r.data(), qkv.data(), out.data(), lse.data(), sh, block);
      check_gradient("dqkv", qkv, dqkv, loss);
    }
  }
}

TEST_CASE("gradcheck: dropout") {
  const std::size_t n = 64;
  const float p = 0.3f;
  const std::uint64_t seed = 42;
  vec x = randn(n, 1), r = randn(n, 2);
  auto loss = [&] {
    vec out(n);
    cpu::dropout_forward(out.data(), static_cast<std::uint8_t*>(nullptr), x.data(), n, p, seed);
    return dot(out, r);
  };
  vec out(n);
  std::vector<std::uint8_t> mask(n);
  cpu::dropout_forward(out.data(), mask.data(), x.data(), n, p, seed);
  vec dx = nans(n);
  cpu::dropout_backward(dx.data(), r.data(), mask.data(), n, p);
  check_gradient("din", x, dx, loss);
}

TEST_CASE("gradcheck: cross-entropy") {
  const std::size_t N = 4, V = 7;
  const double dloss = 0.7;  // not 1, to check the scaling
  vec logits = randn(N * V, 1, 2.0);
  const auto tgt = randint(N, static_cast<std::int32_t>(V), 2);
  auto loss = [&] {
    vec l(N);
    return dloss * cpu::cross_entropy_forward(l.data(), logits.data(), tgt.data(), N, V);
  };
  vec dlogits = nans(N * V);
  cpu::cross_entropy_backward(dlogits.data(), logits.data(), tgt.data(), dloss, N, V);
  check_gradient("dlogits", logits, dlogits, loss);
}


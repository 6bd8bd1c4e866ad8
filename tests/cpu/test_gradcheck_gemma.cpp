// SPDX-License-Identifier: BSL-1.0
// Gemma 2's kernels in fp64 against their Hugging Face transformers definitions
// (modeling_gemma2.py) and finite differences: attention with a sliding window, score softcapping
// and query_pre_attn_scalar's scale (naive and flash, forward and backward), GeGLU
// (gelu_pytorch_tanh on the gate), the scaled token embedding and the final logit softcapping
// before the cross-entropy. As in test_gradcheck.cpp, each gradient check uses L = Σ out·r with a
// fixed random r, runs the backward with dout = r, and starts written input gradients from NaN.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "memalg/backend/cpu/activation.hpp"
#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cpu/cross_entropy.hpp"
#include "memalg/backend/cpu/embedding.hpp"
#include "test_util.hpp"

namespace cpu = memalg::backend::cpu;
using namespace memalg_test;
using vec = std::vector<double>;

namespace {

cpu::attention_shape with(cpu::attention_shape sh, std::size_t window, double softcap, double scale) {
  sh.window = window;
  sh.softcap = softcap;
  sh.scale = scale;
  return sh;
}

// Windows shorter than the sequence (and of one), caps small enough to bend the scores, Gemma 2
// 27B's scale (query_pre_attn_scalar = hidden / heads ≠ head_dim), GQA and multi-head.
const cpu::attention_shape gemma_shapes[] = {
    with({2, 7, 4, 2, 3, true}, 3, 0, 0),      // sliding window only
    with({2, 6, 4, 2, 4, true}, 0, 0.7, 0),    // softcap only
    with({1, 5, 2, 2, 3, true}, 0, 0, 0.25),   // scale only
    with({2, 8, 4, 1, 3, true}, 4, 0.9, 0.4),  // all three, multi-query
    with({1, 6, 3, 3, 5, true}, 1, 2.0, 0.3),  // a window of one: each query reads itself
};

}  // namespace

TEST_CASE("gemma2 attention: naive and flash equal transformers' eager attention with window, softcap and scale") {
  for (const auto& sh : gemma_shapes) {
    CAPTURE(sh.window);
    CAPTURE(sh.softcap);
    CAPTURE(sh.scale);
    const vec qkv = randn(sh.rows() * sh.qkv_width(), 17, 1.5);
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
  // The variants change the result: a window, a cap and a scale each move the output.
  const cpu::attention_shape plain{2, 7, 4, 2, 3, true};
  const vec qkv = randn(plain.rows() * plain.qkv_width(), 18, 1.5);
  const vec base = hf_attention(qkv, plain);
  for (const auto& sh : {with(plain, 3, 0, 0), with(plain, 0, 0.7, 0), with(plain, 0, 0, 0.25)}) {
    vec out(base.size());
    cpu::attention_naive_forward(out.data(), static_cast<double*>(nullptr), qkv.data(), sh);
    CHECK(max_abs_diff(out, base) > 1e-3);
  }
}

TEST_CASE("gradcheck: gemma2 attention (window, softcap, scale; naive and flash)") {
  for (const auto& sh : gemma_shapes) {
    CAPTURE(sh.window);
    CAPTURE(sh.softcap);
    CAPTURE(sh.scale);
    vec qkv = randn(sh.rows() * sh.qkv_width(), 1, 1.5), r = randn(sh.rows() * sh.out_width(), 2);
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
    for (const std::size_t block : {std::size_t{2}, std::size_t{64}}) {
      cpu::attention_flash_forward(out.data(), lse.data(), qkv.data(), sh, block);
      dqkv = nans(qkv.size());
      cpu::attention_flash_backward(dqkv.data(), r.data(), qkv.data(), out.data(), lse.data(), sh, block);
      check_gradient("dqkv flash", qkv, dqkv, loss);
    }
  }
}

TEST_CASE("geglu: equals gelu_pytorch_tanh(gate)·up (transformers' GemmaMLP); gradcheck") {
  // torch's gelu(x, approximate="tanh") = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
  const auto gelu = [](double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2.0 / std::acos(-1.0)) * (x + 0.044715 * x * x * x)));
  };
  const std::size_t N = 3, F = 5;
  vec x = randn(N * 2 * F, 5, 2.0), r = randn(N * F, 6);
  vec out(N * F);
  cpu::geglu_forward(out.data(), x.data(), N, F);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t f = 0; f < F; ++f)
      CHECK(out[n * F + f] == doctest::Approx(gelu(x[n * 2 * F + f]) * x[n * 2 * F + F + f]).epsilon(1e-14));
  auto loss = [&] {
    vec o(N * F);
    cpu::geglu_forward(o.data(), x.data(), N, F);
    return dot(o, r);
  };
  vec dx = nans(x.size());
  cpu::geglu_backward(dx.data(), r.data(), x.data(), N, F);
  check_gradient("d[gate|up]", x, dx, loss);
}

TEST_CASE("embedding scale: rows times the normalizer (Gemma's √hidden); gradcheck of the table") {
  const std::size_t V = 7, C = 4, B = 2, S = 3;
  const double scale = std::sqrt(double(C));
  vec wte = randn(V * C, 8), r = randn(B * S * C, 9);
  const std::vector<std::int32_t> tok = {3, 0, 3, 6, 1, 3};
  vec out(B * S * C);
  cpu::embedding_forward(out.data(), tok.data(), wte.data(), static_cast<const double*>(nullptr), B, S, C, 0, scale);
  for (std::size_t n = 0; n < B * S; ++n)
    for (std::size_t c = 0; c < C; ++c) CHECK(out[n * C + c] == wte[tok[n] * C + c] * scale);
  auto loss = [&] {
    vec o(B * S * C);
    cpu::embedding_forward(o.data(), tok.data(), wte.data(), static_cast<const double*>(nullptr), B, S, C, 0, scale);
    return dot(o, r);
  };
  vec dwte(V * C, 0.0);  // the backward accumulates
  cpu::embedding_backward(dwte.data(), static_cast<double*>(nullptr), r.data(), tok.data(), B, S, C, scale);
  check_gradient("dwte", wte, dwte, loss);
  // The vocabulary-parallel halves give the same rows and gradients.
  vec lo(B * S * C), hi(B * S * C), dlo(4 * C, 0.0), dhi(3 * C, 0.0);
  cpu::embedding_forward_vocab_range(lo.data(), tok.data(), wte.data(), 0, 4, B * S, C, scale);
  cpu::embedding_forward_vocab_range(hi.data(), tok.data(), wte.data() + 4 * C, 4, 3, B * S, C, scale);
  for (std::size_t i = 0; i < out.size(); ++i) CHECK(lo[i] + hi[i] == out[i]);
  cpu::embedding_backward_vocab_range(dlo.data(), r.data(), tok.data(), 0, 4, B * S, C, scale);
  cpu::embedding_backward_vocab_range(dhi.data(), r.data(), tok.data(), 4, 3, B * S, C, scale);
  for (std::size_t i = 0; i < 4 * C; ++i) CHECK(dlo[i] == doctest::Approx(dwte[i]).epsilon(1e-14));
  for (std::size_t i = 0; i < 3 * C; ++i) CHECK(dhi[i] == doctest::Approx(dwte[4 * C + i]).epsilon(1e-14));
}

TEST_CASE("final logit softcapping: the loss of cap·tanh(x/cap) (Gemma2ForCausalLM); gradcheck through the cap") {
  const std::size_t N = 4, V = 9;
  const double cap = 1.5;
  vec x = randn(N * V, 10, 3.0);
  const std::vector<std::int32_t> tgt = {2, 8, 0, 5};
  auto loss = [&] {
    vec c = x, rows(N);
    cpu::logit_softcap(c.data(), c.size(), cap);
    return cpu::cross_entropy_forward(rows.data(), c.data(), tgt.data(), N, V);
  };
  // The reference: mean over rows of lse(c) − c[target], c = tanh(x / cap)·cap.
  double ref = 0;
  for (std::size_t n = 0; n < N; ++n) {
    vec c(V);
    double mx = -1e300;
    for (std::size_t v = 0; v < V; ++v) mx = std::max(mx, c[v] = std::tanh(x[n * V + v] / cap) * cap);
    double z = 0;
    for (double cv : c) z += std::exp(cv - mx);
    ref += (mx + std::log(z) - c[tgt[n]]) / double(N);
  }
  CHECK(loss() == doctest::Approx(ref).epsilon(1e-14));
  vec g = x, rows(N);
  cpu::logit_softcap(g.data(), g.size(), cap);
  cpu::cross_entropy_forward(rows.data(), g.data(), tgt.data(), N, V);
  cpu::cross_entropy_backward(g.data(), g.data(), tgt.data(), 1.0, N, V, cap);  // in place, as the loss op
  check_gradient("dlogits", x, g, loss);
}

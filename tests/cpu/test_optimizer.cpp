// SPDX-License-Identifier: BSL-1.0
// Optimizer steps against hand-computed values, the dynamic loss scaler state machine, gradient
// norm clipping through the single-rank communicator, and the local communicator itself.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "memalg/backend/cpu/grad_norm.hpp"
#include "memalg/backend/cpu/local_communicator.hpp"
#include "memalg/backend/cpu/loss_scaler.hpp"
#include "memalg/backend/cpu/optimizer.hpp"
#include "memalg/core/float16.hpp"

namespace cpu = memalg::backend::cpu;
using memalg::bf16;
using memalg::fp16;

// The hyper-parameters below are powers of two so that every intermediate is exact in float and
// the expected values can be written down exactly.

TEST_CASE("sgd: w -= lr·(g·grad_scale + wd·w)") {
  std::vector<float> w = {1.0f, -2.0f};
  const std::vector<float> g = {0.5f, 1.0f};
  cpu::sgd_step(w.data(), static_cast<float*>(nullptr), g.data(), 2, {.lr = 0.25f, .weight_decay = 0.5f});
  // 1 − 0.25·(0.5 + 0.5) = 0.75;  −2 − 0.25·(1 − 1) = −2
  CHECK(w == std::vector<float>{0.75f, -2.0f});
  cpu::sgd_step(w.data(), static_cast<float*>(nullptr), g.data(), 2, {.lr = 0.25f, .weight_decay = 0.0f}, 0.5f);
  // 0.75 − 0.25·0.25 = 0.6875;  −2 − 0.25·0.5 = −2.125
  CHECK(w == std::vector<float>{0.6875f, -2.125f});
}

TEST_CASE("momentum: buf = μ·buf + g, w -= lr·buf") {
  std::vector<double> w = {1.0}, buf = {0.0};
  const std::vector<double> g = {0.5};
  const cpu::momentum_hparams hp{.lr = 0.25f, .momentum = 0.5f, .weight_decay = 0.0f};
  cpu::momentum_step(w.data(), static_cast<double*>(nullptr), buf.data(), g.data(), 1, hp);
  CHECK(buf[0] == 0.5);
  CHECK(w[0] == 0.875);
  cpu::momentum_step(w.data(), static_cast<double*>(nullptr), buf.data(), g.data(), 1, hp);
  CHECK(buf[0] == 0.75);  // 0.5·0.5 + 0.5
  CHECK(w[0] == 0.6875);  // 0.875 − 0.25·0.75
}

TEST_CASE("adamw: decoupled weight decay and bias correction") {
  const cpu::adamw_hparams hp{.lr = 0.125f, .beta1 = 0.5f, .beta2 = 0.75f, .eps = 0.0f, .weight_decay = 0.5f};
  std::vector<float> w = {1.0f}, m = {0.0f}, v = {0.0f};
  std::vector<float> g = {0.5f};
  cpu::adamw_step(w.data(), static_cast<float*>(nullptr), m.data(), v.data(), g.data(), 1, hp, 1);
  // m = 0.25, v = 0.0625, m̂ = 0.25/0.5 = 0.5, v̂ = 0.0625/0.25 = 0.25
  // w = 1 − 0.125·0.5·1 − 0.125·0.5/sqrt(0.25) = 0.9375 − 0.125 = 0.8125
  CHECK(m[0] == 0.25f);
  CHECK(v[0] == 0.0625f);
  CHECK(w[0] == 0.8125f);
  g[0] = 1.0f;
  cpu::adamw_step(w.data(), static_cast<float*>(nullptr), m.data(), v.data(), g.data(), 1, hp, 2);
  // m = 0.125 + 0.5 = 0.625, v = 0.046875 + 0.25 = 0.296875, m̂ = 0.625/0.75, v̂ = 0.296875/0.4375
  // w = 0.8125·(1 − 0.0625) − 0.125·m̂/sqrt(v̂) = 0.6352652127777325
  CHECK(m[0] == 0.625f);
  CHECK(v[0] == 0.296875f);
  CHECK(w[0] == doctest::Approx(0.6352652127777325).epsilon(1e-6));
  CHECK_THROWS_AS(cpu::adamw_step(w.data(), static_cast<float*>(nullptr), m.data(), v.data(), g.data(), 1, hp, 0),
                  std::invalid_argument);
}

TEST_CASE("adamw: grad_scale folds loss-scale and clip into the gradient") {
  const cpu::adamw_hparams hp{};
  std::vector<double> w1 = {0.3, -0.7}, m1(2), v1(2), w2 = w1, m2(2), v2(2);
  const std::vector<double> g = {0.01, -0.02}, g_scaled = {0.01 * 1024 * 4, -0.02 * 1024 * 4};
  for (std::int64_t t = 1; t <= 3; ++t) {
    cpu::adamw_step(w1.data(), static_cast<double*>(nullptr), m1.data(), v1.data(), g.data(), 2, hp, t);
    // The stored gradient is 4096× the true one (e.g. a loss scale of 4096); grad_scale = 1/4096
    // (a power of two, so exact) recovers the unscaled step.
    cpu::adamw_step(w2.data(), static_cast<double*>(nullptr), m2.data(), v2.data(), g_scaled.data(), 2, hp, t,
                    1.0f / 4096.0f);
  }
  CHECK(w1 == w2);
}

TEST_CASE("optimizer with fp32 master weights keeps updates smaller than a bf16 ulp") {
  // lr·g = 1e-3 is below half a bf16 ulp at 1 (2^-8): without a master the parameter never moves.
  const cpu::sgd_hparams hp{.lr = 1e-3f, .weight_decay = 0.0f};
  std::vector<bf16> p_plain = {memalg::float_to_bf16(1.0f)}, p_master = p_plain;
  std::vector<float> master = {1.0f};
  const std::vector<bf16> g = {memalg::float_to_bf16(1.0f)};
  for (int i = 0; i < 10; ++i) {
    cpu::sgd_step(p_plain.data(), static_cast<float*>(nullptr), g.data(), 1, hp);
    cpu::sgd_step(p_master.data(), master.data(), g.data(), 1, hp);
  }
  CHECK(p_plain[0].bits == memalg::float_to_bf16(1.0f).bits);
  float expect = 1.0f;
  for (int i = 0; i < 10; ++i) expect -= 1e-3f;
  CHECK(master[0] == expect);
  CHECK(p_master[0].bits == memalg::float_to_bf16(expect).bits);  // param = round(master)
  CHECK(memalg::bf16_to_float(p_master[0]) == 0.98828125f);  // 253/256, nearest bf16 to 0.99

  // AdamW with a master: same rule, the parameter is the rounded master.
  std::vector<fp16> hp16 = {memalg::float_to_fp16(0.5f)};
  std::vector<float> master16 = {0.5f}, m = {0}, v = {0};
  const std::vector<fp16> g16 = {memalg::float_to_fp16(0.25f)};
  const cpu::adamw_hparams ahp{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
  cpu::adamw_step(hp16.data(), master16.data(), m.data(), v.data(), g16.data(), 1, ahp, 1);
  CHECK(master16[0] == doctest::Approx(0.5 - 0.001 * 0.01 * 0.5 - 0.001 * 0.25 / (0.25 + 1e-8)).epsilon(1e-6));
  CHECK(hp16[0].bits == memalg::float_to_fp16(master16[0]).bits);
}

TEST_CASE("dynamic loss scaler: growth, backoff and skip") {
  cpu::dynamic_loss_scaler s;
  CHECK(s.scale() == 65536.0f);
  for (int i = 0; i < 1999; ++i) CHECK(s.update(false));
  CHECK(s.scale() == 65536.0f);
  CHECK(s.good_steps() == 1999);
  CHECK(s.update(false));  // the 2000th finite step doubles the scale
  CHECK(s.scale() == 131072.0f);
  CHECK(s.good_steps() == 0);
  for (int i = 0; i < 10; ++i) CHECK(s.update(false));
  CHECK_FALSE(s.update(true));  // overflow: skip the step, halve, restart the count
  CHECK(s.scale() == 65536.0f);
  CHECK(s.good_steps() == 0);
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 32768.0f);
  CHECK(s.skipped_steps() == 2);
  CHECK(s.inv_scale() == 1.0f / 32768.0f);
  for (int i = 0; i < 1999; ++i) s.update(false);
  CHECK(s.scale() == 32768.0f);  // the count restarted after the overflow
  s.update(false);
  CHECK(s.scale() == 65536.0f);

  cpu::dynamic_loss_scaler small(8.0f, 2.0f, 0.5f, 3);
  small.update(false);
  small.update(false);
  small.update(false);
  CHECK(small.scale() == 16.0f);
  CHECK_THROWS_AS(cpu::dynamic_loss_scaler(0.0f), std::invalid_argument);
}

TEST_CASE("has_nonfinite detects inf and NaN in every storage type") {
  std::vector<fp16> h = {memalg::float_to_fp16(1.0f), memalg::float_to_fp16(70000.0f)};  // overflows to inf
  CHECK(cpu::has_nonfinite(h.data(), 2));
  CHECK_FALSE(cpu::has_nonfinite(h.data(), 1));
  std::vector<bf16> b = {memalg::float_to_bf16(1.0f), bf16{0x7fc0}};
  CHECK(cpu::has_nonfinite(b.data(), 2));
  std::vector<float> f = {1.0f, 2.0f};
  CHECK_FALSE(cpu::has_nonfinite(f.data(), 2));
  f[1] = -std::numeric_limits<float>::infinity();
  CHECK(cpu::has_nonfinite(f.data(), 2));
}

TEST_CASE("grad norm and clip coefficient through the local communicator") {
  cpu::local_communicator comm;
  const std::vector<float> g = {3.0f, 4.0f, 12.0f};
  CHECK(cpu::grad_sum_squares(g.data(), 3) == 169.0f);
  const float norm = cpu::global_grad_norm(comm, g.data(), 3);
  CHECK(norm == 13.0f);
  CHECK(cpu::clip_coefficient(norm, 1.0f) == doctest::Approx(1.0 / 13.0));
  CHECK(cpu::clip_coefficient(norm, 100.0f) == 1.0f);
  const std::vector<bf16> gb = {memalg::float_to_bf16(3.0f), memalg::float_to_bf16(4.0f)};
  CHECK(cpu::global_grad_norm(comm, gb.data(), 2) == 5.0f);
}

TEST_CASE("local communicator: every collective is an identity") {
  cpu::local_communicator c;
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  std::vector<double> a = {1, 2, 3}, b(3);
  c.all_reduce(a.data(), 3, memalg::exec::reduce_op::sum);
  c.all_reduce(a.data(), 3, memalg::exec::reduce_op::max);
  CHECK(a == std::vector<double>{1, 2, 3});
  c.reduce_scatter(a.data(), b.data(), 3);
  CHECK(b == a);
  std::fill(b.begin(), b.end(), 0.0);
  c.all_gather(a.data(), b.data(), 3);
  CHECK(b == a);
  c.broadcast(a.data(), 3, 0);
  c.barrier();
  // Ring of one: send to self, then receive.
  const std::vector<float> msg = {5, 6};
  std::vector<float> got(2);
  c.send(msg.data(), 2, 0);
  c.recv(got.data(), 2, 0);
  CHECK(got == msg);
  CHECK_THROWS_AS(c.recv(got.data(), 2, 0), std::runtime_error);  // nothing pending
  CHECK_THROWS_AS(c.send(msg.data(), 2, 1), std::invalid_argument);
  c.send(msg.data(), 2, 0);
  CHECK_THROWS_AS(c.recv(got.data(), 1, 0), std::runtime_error);  // size mismatch
  auto sub = c.split(3, 0);
  CHECK(sub.size() == 1);
}

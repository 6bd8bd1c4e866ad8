// SPDX-License-Identifier: BSL-1.0
// GPU tests of optimizer.cuh and grad_norm.cuh against the CPU reference (in double).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "gpu_test_util.hpp"
#include "memalg/backend/cpu/grad_norm.hpp"
#include "memalg/backend/cpu/optimizer.hpp"
#include "memalg/backend/cuda/grad_norm.cuh"
#include "memalg/backend/cuda/optimizer.cuh"

using namespace gpu_test;
namespace cpu = memalg::backend::cpu;

namespace {

// grad_scale 0.5 on the host times 0.8 read from the device: the CPU gets their float product.
constexpr float host_scale = 0.5f;
constexpr float device_scale = 0.8f;
constexpr float total_scale = host_scale * device_scale;

template <class T>
struct state {
  std::int64_t n;
  bool with_master;
  std::vector<T> param, grad;
  std::vector<double> r_param, r_master, r_s1, r_s2;
  dbuf<T> d_param, d_grad;
  dbuf<float> d_master, d_s1, d_s2, d_scale;

  state(std::int64_t n_, bool master, std::uint32_t seed)
      : n(n_), with_master(master), param(random_values<T>(n_, -1, 1, seed)),
        grad(random_values<T>(n_, -0.5f, 0.5f, seed + 1)), r_param(to_double(param)), r_master(r_param),
        r_s1(n_, 0.0), r_s2(n_, 0.0), d_param(param), d_grad(grad), d_master(n_), d_s1(n_), d_s2(n_),
        d_scale(std::vector<float>{device_scale}) {
    std::vector<float> m(n_);
    for (std::int64_t i = 0; i < n_; ++i) m[i] = cu::to_float(param[i]);
    d_master.upload(m);
    d_s1.zero();
    d_s2.zero();
  }
  float* master() { return with_master ? d_master.get() : nullptr; }
  double* r_master_ptr() { return with_master ? r_master.data() : nullptr; }
  void new_gradient(std::uint32_t seed) {
    grad = random_values<T>(n, -0.5f, 0.5f, seed);
    d_grad.upload(grad);
  }
  void check(const char* what) {
    INFO(what);
    check_close<T>("param", d_param.download(), r_param);
    if (with_master) check_close<float>("master", d_master.download(), r_master);
  }
};

}  // namespace

TEST_CASE_TEMPLATE("optimizers: sgd, momentum and adamw steps match the CPU reference", T, float, cu::bf16, cu::fp16) {
  for (const bool with_master : {true, false}) {
    CAPTURE(with_master);
    const std::int64_t n = 1003;
    {
      state<T> s(n, with_master, 1);
      const cu::sgd_hparams hp{0.05f, 0.1f};
      for (int step = 1; step <= 3; ++step) {
        s.new_gradient(100 + step);
        const auto r_grad = to_double(s.grad);
        cpu::sgd_step(s.r_param.data(), s.r_master_ptr(), r_grad.data(), n, cpu::sgd_hparams{hp.lr, hp.weight_decay},
                      total_scale);
        cu::sgd_step(s.d_param.get(), s.master(), s.d_grad.get(), n, hp, host_scale, s.d_scale.get());
        s.check("sgd");
      }
    }
    {
      state<T> s(n, with_master, 2);
      const cu::momentum_hparams hp{0.05f, 0.9f, 0.1f};
      for (int step = 1; step <= 3; ++step) {
        s.new_gradient(200 + step);
        const auto r_grad = to_double(s.grad);
        cpu::momentum_step(s.r_param.data(), s.r_master_ptr(), s.r_s1.data(), r_grad.data(), n,
                           cpu::momentum_hparams{hp.lr, hp.momentum, hp.weight_decay}, total_scale);
        cu::momentum_step(s.d_param.get(), s.master(), s.d_s1.get(), s.d_grad.get(), n, hp, host_scale,
                          s.d_scale.get());
        s.check("momentum");
        check_close<T>("velocity", s.d_s1.download(), s.r_s1);  // depends on the T-rounded weight without a master
      }
    }
    {
      state<T> s(n, with_master, 3);
      const cu::adamw_hparams hp{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
      for (int step = 1; step <= 3; ++step) {
        s.new_gradient(300 + step);
        const auto r_grad = to_double(s.grad);
        cpu::adamw_step(s.r_param.data(), s.r_master_ptr(), s.r_s1.data(), s.r_s2.data(), r_grad.data(), n,
                        cpu::adamw_hparams{hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay}, step, total_scale);
        cu::adamw_step(s.d_param.get(), s.master(), s.d_s1.get(), s.d_s2.get(), s.d_grad.get(), n, hp, step,
                       host_scale, s.d_scale.get());
        s.check("adamw");
        check_close<float>("m", s.d_s1.download(), s.r_s1);
        check_close<float>("v", s.d_s2.download(), s.r_s2);
      }
    }
  }
}

TEST_CASE_TEMPLATE("grad norm: squared norm over several tensors, clip coefficient, overflow flag", T, float,
                   cu::bf16, cu::fp16) {
  const auto a = random_values<T>(70001, -1, 1, 41);
  const auto b = random_values<T>(123, -3, 3, 42);
  const auto ra = to_double(a), rb = to_double(b);
  const double r_sq = cpu::grad_sum_squares(ra.data(), ra.size()) + cpu::grad_sum_squares(rb.data(), rb.size());
  const double r_norm = std::sqrt(r_sq);
  const float max_norm = 1.0f;

  dbuf<T> d_a(a), d_b(b);
  dbuf<float> scratch(cu::grad_norm_scratch_floats), sq(1), norm(1), coef(1);
  dbuf<int> nonfinite(1);
  sq.zero();
  cu::squared_norm_accumulate(sq.get(), d_a.get(), static_cast<std::int64_t>(a.size()), scratch.get());
  cu::squared_norm_accumulate(sq.get(), d_b.get(), static_cast<std::int64_t>(b.size()), scratch.get());
  cu::clip_from_squared_norm(sq.get(), max_norm, norm.get(), coef.get(), nonfinite.get());
  // The sum of squares is float on the GPU whatever T is.
  check_close<float>("squared norm", sq.download(), std::vector<double>{r_sq});
  check_close<float>("norm", norm.download(), std::vector<double>{r_norm});
  check_close<float>("clip coefficient", coef.download(),
                     std::vector<double>{cpu::clip_coefficient(r_norm, double(max_norm))});
  CHECK(nonfinite.download()[0] == 0);

  // Determinism: the same tensors give the same bits again.
  const float first = sq.download()[0];
  sq.zero();
  cu::squared_norm_accumulate(sq.get(), d_a.get(), static_cast<std::int64_t>(a.size()), scratch.get());
  cu::squared_norm_accumulate(sq.get(), d_b.get(), static_cast<std::int64_t>(b.size()), scratch.get());
  CHECK(sq.download()[0] == first);

  // An infinite gradient raises the flag (the fp16 loss scaler then skips the step).
  auto bad = b;
  bad[5] = cu::from_float<T>(INFINITY);
  d_b.upload(bad);
  sq.zero();
  cu::squared_norm_accumulate(sq.get(), d_b.get(), static_cast<std::int64_t>(b.size()), scratch.get());
  cu::clip_from_squared_norm(sq.get(), max_norm, norm.get(), coef.get(), nonfinite.get());
  CHECK(nonfinite.download()[0] == 1);
}

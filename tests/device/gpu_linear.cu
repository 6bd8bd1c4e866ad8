// SPDX-License-Identifier: BSL-1.0
// GPU tests of gemm.cuh against the CPU reference (run in double).
#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include "gpu_test_util.hpp"
#include "memalg/backend/cpu/activation.hpp"
#include "memalg/backend/cpu/cross_entropy.hpp"
#include "memalg/backend/cpu/linear.hpp"
#include "memalg/backend/cuda/device.cuh"
#include "memalg/backend/cuda/gemm.cuh"

using namespace gpu_test;
namespace cpu = memalg::backend::cpu;

namespace {

struct blas {
  cu::blaslt_handle handle;
  dbuf<unsigned char> workspace{cu::gemm_workspace_bytes()};
  cu::gemm_context context(bool fuse_gelu = false) const {
    return {handle.get(), workspace.get(), workspace.size(), fuse_gelu};
  }
};

// cuBLASLt's fused GeLU evaluates tanh its own way: it is checked against the exact formula
// with at least this tolerance.
constexpr double fused_gelu_tolerance = 2e-3;

}  // namespace

TEST_CASE_TEMPLATE("linear: forward, backward (din =, dW +=, dbias +=) match the CPU reference", T, float, cu::bf16,
                   cu::fp16) {
  const std::int64_t N = 64, IC = 96, OC = 80;
  const auto in = random_values<T>(N * IC, -1, 1, 1);
  const auto w = random_values<T>(OC * IC, -0.5f, 0.5f, 2);
  const auto bias = random_values<T>(OC, -1, 1, 3);
  const auto dout = random_values<T>(N * OC, -1, 1, 4);
  const auto dw0 = random_values<T>(OC * IC, -1, 1, 5);
  const auto db0 = random_values<T>(OC, -1, 1, 6);
  const auto r_in = to_double(in), r_w = to_double(w), r_b = to_double(bias), r_dout = to_double(dout);

  blas b;
  const cu::gemm_context ctx = b.context();
  dbuf<T> d_in(in), d_w(w), d_b(bias), d_out(N * OC), d_dout(dout), d_din(N * IC), d_dw(dw0), d_db(db0);

  std::vector<double> r_out(N * OC);
  cpu::linear_forward(r_out.data(), r_in.data(), r_w.data(), r_b.data(), N, IC, OC);
  cu::linear_forward(ctx, d_out.get(), d_in.get(), d_w.get(), d_b.get(), N, IC, OC);
  check_close<T>("out (bias)", d_out.download(), r_out);

  cpu::linear_forward(r_out.data(), r_in.data(), r_w.data(), static_cast<const double*>(nullptr), N, IC, OC);
  cu::linear_forward(ctx, d_out.get(), d_in.get(), d_w.get(), static_cast<const T*>(nullptr), N, IC, OC);
  check_close<T>("out (no bias)", d_out.download(), r_out);

  std::vector<double> r_din(N * IC), r_dw = to_double(dw0), r_db = to_double(db0);
  cpu::linear_backward(r_din.data(), r_dw.data(), r_db.data(), r_dout.data(), r_in.data(), r_w.data(), N, IC, OC);
  cu::linear_backward(ctx, d_din.get(), d_dw.get(), d_db.get(), d_dout.get(), d_in.get(), d_w.get(), N, IC, OC);
  check_close<T>("din", d_din.download(), r_din);
  check_close<T>("dW", d_dw.download(), r_dw);
  check_close<T>("dbias", d_db.download(), r_db);
}

TEST_CASE_TEMPLATE("linear: GeLU epilogue, unfused and fused, with and without pre-activation", T, float, cu::bf16,
                   cu::fp16) {
  for (const std::int64_t OC : {48, 36}) {  // 36: no cuBLASLt aux output (ld % 8 != 0), falls back
    const std::int64_t N = 32, IC = 64;
    CAPTURE(OC);
    const auto in = random_values<T>(N * IC, -1, 1, 11);
    const auto w = random_values<T>(OC * IC, -0.5f, 0.5f, 12);
    const auto bias = random_values<T>(OC, -1, 1, 13);
    const auto r_in = to_double(in), r_w = to_double(w), r_b = to_double(bias);
    std::vector<double> r_pre(N * OC), r_out(N * OC);
    cpu::linear_forward(r_pre.data(), r_in.data(), r_w.data(), r_b.data(), N, IC, OC);
    cpu::gelu_forward(r_out.data(), r_pre.data(), N * OC);

    blas b;
    dbuf<T> d_in(in), d_w(w), d_b(bias), d_out(N * OC), d_pre(N * OC);
    for (const bool fuse : {false, true}) {
      CAPTURE(fuse);
      const double tol = fuse ? std::max(tolerance<T>(), fused_gelu_tolerance) : tolerance<T>();
      cu::linear_forward(b.context(fuse), d_out.get(), d_in.get(), d_w.get(), d_b.get(), N, IC, OC, nullptr,
                         cu::linear_epilogue::gelu, d_pre.get());
      check_close<T>("pre_gelu", d_pre.download(), r_pre);
      check_close<T>("gelu out", d_out.download(), r_out, tol);
      cu::linear_forward(b.context(fuse), d_out.get(), d_in.get(), d_w.get(), d_b.get(), N, IC, OC, nullptr,
                         cu::linear_epilogue::gelu);
      check_close<T>("gelu out (no aux)", d_out.download(), r_out, tol);
    }
  }
}

TEST_CASE("linear: fp8 forward with per-tensor scales (compute capability >= 8.9)") {
  const std::int64_t N = 32, IC = 64, OC = 48;
  const auto in = random_values<cu::fp8_e4m3>(N * IC, -2, 2, 31);
  const auto w = random_values<cu::fp8_e4m3>(OC * IC, -2, 2, 32);
  const auto w5 = random_values<cu::fp8_e5m2>(OC * IC, -2, 2, 33);
  const auto bias = random_values<cu::bf16>(OC, -1, 1, 34);
  const float in_scale = 0.5f, w_scale = 0.25f;
  blas b;
  dbuf<cu::fp8_e4m3> d_in(in), d_w(w);
  dbuf<cu::fp8_e5m2> d_w5(w5);
  dbuf<cu::bf16> d_b(bias), d_out(N * OC);
  dbuf<float> d_out32(N * OC), d_scales(std::vector<float>{in_scale, w_scale});

  const cu::compute_capability cc = cu::device_compute_capability();
  if (!cu::fp8_gemm_supported(cc.major, cc.minor)) {
    MESSAGE("fp8 GEMM not supported on compute capability " << cc.major << "." << cc.minor
                                                            << ": checking that it is refused");
    CHECK_THROWS_AS(cu::linear_forward_fp8(b.context(), d_out.get(), d_in.get(), d_w.get(), d_scales.get(),
                                           d_scales.get() + 1, d_b.get(), N, IC, OC),
                    std::runtime_error);
    return;
  }
  auto reference = [&](const auto& weights, bool with_bias) {
    std::vector<double> r(N * OC);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t o = 0; o < OC; ++o) {
        double acc = 0;
        for (std::int64_t i = 0; i < IC; ++i) acc += double(cu::to_float(in[n * IC + i])) * cu::to_float(weights[o * IC + i]);
        r[n * OC + o] = in_scale * w_scale * acc + (with_bias ? cu::to_float(bias[o]) : 0.0);
      }
    return r;
  };
  // fp8 tensor cores accumulate in reduced precision between promotions: 1e-3 for the fp32 output.
  cu::linear_forward_fp8(b.context(), d_out.get(), d_in.get(), d_w.get(), d_scales.get(), d_scales.get() + 1,
                         d_b.get(), N, IC, OC);
  check_close<cu::bf16>("fp8 e4m3 -> bf16 (bias)", d_out.download(), reference(w, true));
  cu::linear_forward_fp8(b.context(), d_out32.get(), d_in.get(), d_w.get(), d_scales.get(), d_scales.get() + 1,
                         static_cast<const cu::bf16*>(nullptr), N, IC, OC);
  check_close<float>("fp8 e4m3 -> fp32", d_out32.download(), reference(w, false), 1e-3);
  cu::linear_forward_fp8(b.context(), d_out.get(), d_in.get(), d_w5.get(), d_scales.get(), d_scales.get() + 1,
                         d_b.get(), N, IC, OC);
  check_close<cu::bf16>("fp8 e4m3 x e5m2 -> bf16 (bias)", d_out.download(), reference(w5, true));
  CHECK_THROWS_AS(cu::linear_forward_fp8(b.context(), d_out.get(), d_in.get(), d_w.get(), d_scales.get(),
                                         d_scales.get() + 1, d_b.get(), N, IC, 40),
                  std::invalid_argument);
}

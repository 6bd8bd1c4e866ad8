// SPDX-License-Identifier: BSL-1.0
// GPU tests of activation.cuh, dropout.cuh and cross_entropy.cuh against the CPU
// reference (in double).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_test_util.hpp"
#include "memalg/backend/cpu/activation.hpp"
#include "memalg/backend/cpu/cross_entropy.hpp"
#include "memalg/backend/cpu/dropout.hpp"
#include "memalg/backend/cuda/activation.cuh"
#include "memalg/backend/cuda/cross_entropy.cuh"
#include "memalg/backend/cuda/dropout.cuh"

using namespace gpu_test;
namespace cpu = memalg::backend::cpu;

TEST_CASE_TEMPLATE("gelu: forward and backward match the CPU reference", T, float, cu::bf16, cu::fp16) {
  for (const std::int64_t n : {1000, 1001}) {  // vectorised and scalar paths
    CAPTURE(n);
    const auto in = random_values<T>(n, -4, 4, 1);
    const auto dout = random_values<T>(n, -1, 1, 2);
    const auto r_in = to_double(in), r_dout = to_double(dout);
    std::vector<double> r_out(n), r_din(n);
    cpu::gelu_forward(r_out.data(), r_in.data(), n);
    cpu::gelu_backward(r_din.data(), r_dout.data(), r_in.data(), n);
    dbuf<T> d_in(in), d_out(n), d_dout(dout), d_din(n);
    cu::gelu_forward(d_out.get(), d_in.get(), n);
    check_close<T>("out", d_out.download(), r_out);
    cu::gelu_backward(d_din.get(), d_dout.get(), d_in.get(), n);
    check_close<T>("din", d_din.download(), r_din);
  }
}

TEST_CASE_TEMPLATE("swiglu: forward and backward match the CPU reference", T, float, cu::bf16, cu::fp16) {
  for (const std::int64_t F : {40, 42}) {
    CAPTURE(F);
    const std::int64_t N = 9;
    const auto in = random_values<T>(N * 2 * F, -3, 3, 11);
    const auto dout = random_values<T>(N * F, -1, 1, 12);
    const auto r_in = to_double(in), r_dout = to_double(dout);
    std::vector<double> r_out(N * F), r_din(N * 2 * F);
    cpu::swiglu_forward(r_out.data(), r_in.data(), N, F);
    cpu::swiglu_backward(r_din.data(), r_dout.data(), r_in.data(), N, F);
    dbuf<T> d_in(in), d_out(N * F), d_dout(dout), d_din(N * 2 * F);
    cu::swiglu_forward(d_out.get(), d_in.get(), N, F);
    check_close<T>("out", d_out.download(), r_out);
    cu::swiglu_backward(d_din.get(), d_dout.get(), d_in.get(), N, F);
    check_close<T>("din", d_din.download(), r_din);
  }
}

TEST_CASE_TEMPLATE("swiglu: the in-place backward equals the out-of-place one bit for bit", T, float, cu::bf16, cu::fp16) {
  // The step program's form: dout [N, F] is the first half of din [N, 2F]. Odd, even and tiny row
  // counts exercise every shape of the waves (9: [5,9) [3,5) [2,3) [1,2) [0,1)).
  const std::int64_t F = 40;
  for (const std::int64_t N : {9, 8, 2, 1}) {
    CAPTURE(N);
    const auto in = random_values<T>(N * 2 * F, -3, 3, 31);
    const auto dout = random_values<T>(N * F, -1, 1, 32);
    const auto r_in = to_double(in), r_dout = to_double(dout);
    std::vector<double> r_din(N * 2 * F);
    cpu::swiglu_backward(r_din.data(), r_dout.data(), r_in.data(), N, F);
    dbuf<T> d_in(in), d_dout(dout), d_din(N * 2 * F);
    cu::swiglu_backward(d_din.get(), d_dout.get(), d_in.get(), N, F);
    std::vector<T> both(N * 2 * F, cu::from_float<T>(0.0f));
    std::memcpy(both.data(), dout.data(), dout.size() * sizeof(T));
    dbuf<T> d_both(both);
    cu::swiglu_backward_in_place(d_both.get(), d_in.get(), N, F);
    const std::vector<T> got = d_both.download(), want = d_din.download();
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0);
    check_close<T>("din in place", got, r_din);
  }
}

TEST_CASE_TEMPLATE("dropout: the mask equals the CPU backend's bit for bit", T, float, cu::bf16, cu::fp16) {
  const float p = 0.25f;
  const std::uint64_t seed = 0x5eed1234ULL;
  for (const std::int64_t n : {4096, 999}) {
    CAPTURE(n);
    const auto in = random_values<T>(n, -2, 2, 21);
    const auto dout = random_values<T>(n, -1, 1, 22);
    const auto r_in = to_double(in), r_dout = to_double(dout);
    std::vector<double> r_out(n), r_din(n);
    std::vector<std::uint8_t> r_mask(n);
    cpu::dropout_forward(r_out.data(), r_mask.data(), r_in.data(), n, p, seed);
    cpu::dropout_backward(r_din.data(), r_dout.data(), r_mask.data(), n, p);

    dbuf<T> d_in(in), d_out(n), d_dout(dout), d_din(n);
    dbuf<std::uint8_t> d_mask(n);
    cu::dropout_forward(d_out.get(), d_mask.get(), d_in.get(), n, p, seed);
    CHECK(d_mask.download() == r_mask);
    check_close<T>("out", d_out.download(), r_out);
    cu::dropout_backward(d_din.get(), d_dout.get(), d_mask.get(), n, p);
    check_close<T>("din", d_din.download(), r_din);
  }
}

TEST_CASE_TEMPLATE("cross-entropy: loss, mean and dlogits match the CPU reference", T, float, cu::bf16, cu::fp16) {
  for (const std::int64_t V : {1024, 1001}) {  // vectorised and scalar paths
    CAPTURE(V);
    const std::int64_t N = 33;
    const float dloss = 1.5f;
    const auto logits = random_values<T>(N * V, -4, 4, 41);
    const auto targets = random_ints(N, 0, static_cast<std::int32_t>(V - 1), 42);
    const auto r_logits = to_double(logits);
    std::vector<double> r_loss(N), r_dlogits(N * V);
    const double r_mean = cpu::cross_entropy_forward(r_loss.data(), r_logits.data(), targets.data(), N, V);
    cpu::cross_entropy_backward(r_dlogits.data(), r_logits.data(), targets.data(), double(dloss), N, V);

    dbuf<T> d_logits(logits), d_dlogits(N * V);
    dbuf<std::int32_t> d_t(targets);
    dbuf<float> d_loss(N), d_mean(1);
    cu::cross_entropy_forward(d_loss.get(), d_logits.get(), d_t.get(), N, V, d_mean.get());
    check_close<T>("loss", d_loss.download(), r_loss);
    check_close<T>("mean loss", d_mean.download(), std::vector<double>{r_mean});
    cu::cross_entropy_backward(d_dlogits.get(), d_logits.get(), d_t.get(), dloss, N, V);
    check_close<T>("dlogits", d_dlogits.download(), r_dlogits);
    // Fused, in place over the logits.
    d_loss.zero();
    cu::cross_entropy_fused(d_loss.get(), d_logits.get(), d_logits.get(), d_t.get(), dloss, N, V);
    check_close<T>("loss (fused)", d_loss.download(), r_loss);
    check_close<T>("dlogits (fused, in place)", d_logits.download(), r_dlogits);
  }
}

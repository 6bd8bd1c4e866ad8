// SPDX-License-Identifier: BSL-1.0
// GPU tests of the speech model's kernels — conv1d.cuh, batchnorm.cuh, relu/tanh of
// activation.cuh, attention.cuh's cross-attention, speech_loss.cuh — against the CPU reference (in double).
// Tolerances are gpu_test_util.hpp's (max |gpu − ref| / max |ref|): fp32 1e-5, bf16 2e-2,
// fp16 5e-3; float statistics (BatchNorm mean/rstd, lse, losses) at the fp32 tolerance.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "../cpu/speech_targets.hpp"
#include "gpu_test_util.hpp"
#include "memalg/backend/cpu/activation.hpp"
#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cpu/batchnorm.hpp"
#include "memalg/backend/cpu/conv1d.hpp"
#include "memalg/backend/cpu/speech_loss.hpp"
#include "memalg/backend/cuda/activation.cuh"
#include "memalg/backend/cuda/attention.cuh"
#include "memalg/backend/cuda/batchnorm.cuh"
#include "memalg/backend/cuda/conv1d.cuh"
#include "memalg/backend/cuda/speech_loss.cuh"

using namespace gpu_test;
namespace cpu = memalg::backend::cpu;

namespace {

constexpr double stats_tolerance = 1e-5;

/// Utterance b of a batch keeps its first len − step·b positions (element 0 unpadded).
std::vector<std::uint8_t> padding_mask(std::int64_t B, std::int64_t len, std::int64_t step) {
  std::vector<std::uint8_t> m(static_cast<std::size_t>(B * len), 1);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = len - step * b; t < len; ++t) m[static_cast<std::size_t>(b * len + t)] = 0;
  return m;
}

template <class T>
void check_conv1d(std::int64_t B, std::int64_t S, std::int64_t IC, std::int64_t OC, std::int64_t K, bool bias,
                  std::uint32_t seed) {
  CAPTURE(K);
  CAPTURE(bias);
  const cu::conv1d_shape sh{B, S, IC, OC, K};
  const cpu::conv1d_shape rsh{std::size_t(B), std::size_t(S), std::size_t(IC), std::size_t(OC), std::size_t(K)};
  const auto x = random_values<T>(B * S * IC, -1, 1, seed);
  const auto w = random_values<T>(OC * IC * K, -0.5f, 0.5f, seed + 1);
  const auto b = random_values<T>(OC, -1, 1, seed + 2);
  const auto dy = random_values<T>(B * S * OC, -1, 1, seed + 3);
  const auto dw0 = random_values<T>(OC * IC * K, -1, 1, seed + 4);
  const auto db0 = random_values<T>(OC, -1, 1, seed + 5);
  const auto r_x = to_double(x), r_w = to_double(w), r_b = to_double(b), r_dy = to_double(dy);
  std::vector<double> r_out(B * S * OC), r_dx(B * S * IC), r_dw = to_double(dw0), r_db = to_double(db0);
  cpu::conv1d_forward(r_out.data(), r_x.data(), r_w.data(), bias ? r_b.data() : nullptr, rsh);
  cpu::conv1d_backward(r_dx.data(), r_dw.data(), bias ? r_db.data() : nullptr, r_dy.data(), r_x.data(), r_w.data(), rsh);

  dbuf<T> d_x(x), d_w(w), d_b(b), d_out(B * S * OC), d_dy(dy), d_dx(random_values<T>(B * S * IC, -9, 9, 99)),
      d_dw(dw0), d_db(db0);
  cu::conv1d_forward(d_out.get(), d_x.get(), d_w.get(), bias ? d_b.get() : nullptr, sh);
  check_close<T>("conv1d out", d_out.download(), r_out);
  cu::conv1d_backward(d_dx.get(), d_dw.get(), bias ? d_db.get() : nullptr, d_dy.get(), d_x.get(), d_w.get(), sh);
  check_close<T>("conv1d din", d_dx.download(), r_dx);
  check_close<T>("conv1d dW", d_dw.download(), r_dw);
  if (bias) check_close<T>("conv1d dbias", d_db.download(), r_db);
}

}  // namespace

TEST_CASE_TEMPLATE("conv1d: forward and backward match the CPU reference", T, float, cu::bf16, cu::fp16) {
  check_conv1d<T>(2, 37, 24, 20, 5, true, 1);   // the speech model's kernel
  check_conv1d<T>(3, 11, 7, 9, 4, false, 11);   // even kernel (PyTorch's left = 1), no bias
  check_conv1d<T>(1, 3, 5, 6, 5, true, 21);     // sequence shorter than the kernel
}

TEST_CASE_TEMPLATE("batchnorm: masked forward, backward and running statistics match the CPU reference", T, float,
                   cu::bf16, cu::fp16) {
  const std::int64_t B = 3, S = 41, C = 70, N = B * S;
  for (const bool masked : {false, true}) {
    CAPTURE(masked);
    const auto mask = padding_mask(B, S, 6);
    const std::uint8_t* h_mask = masked ? mask.data() : nullptr;
    const auto x = random_values<T>(N * C, -1.5f, 2.5f, 31);
    const auto g = random_values<T>(C, 0.5f, 1.5f, 32);
    const auto be = random_values<T>(C, -0.5f, 0.5f, 33);
    const auto dy = random_values<T>(N * C, -1, 1, 34);
    const auto dg0 = random_values<T>(C, -1, 1, 35);
    const auto db0 = random_values<T>(C, -1, 1, 36);
    const auto rm0 = random_values<T>(C, -1, 1, 37);
    const auto rv0 = random_values<T>(C, 0.5f, 2, 38);
    const auto r_x = to_double(x), r_g = to_double(g), r_be = to_double(be), r_dy = to_double(dy);
    std::vector<double> r_out(N * C), r_mean(C), r_rstd(C), r_dx(N * C), r_dg = to_double(dg0), r_db = to_double(db0),
        r_rm = to_double(rm0), r_rv = to_double(rv0);
    cpu::batchnorm_forward(r_out.data(), r_mean.data(), r_rstd.data(), r_x.data(), r_g.data(), r_be.data(), h_mask, N, C);
    cpu::batchnorm_backward(r_dx.data(), r_dg.data(), r_db.data(), r_dy.data(), r_x.data(), r_g.data(), r_mean.data(),
                            r_rstd.data(), h_mask, N, C);
    cpu::batchnorm_update_running(r_rm.data(), r_rv.data(), r_mean.data(), r_rstd.data(), h_mask, N, C);

    dbuf<std::uint8_t> d_mask(mask);
    const std::uint8_t* dm = masked ? d_mask.get() : nullptr;
    dbuf<T> d_x(x), d_g(g), d_be(be), d_out(N * C), d_dy(dy), d_dx(N * C), d_dg(dg0), d_db(db0), d_rm(rm0), d_rv(rv0);
    dbuf<float> d_mean(C), d_rstd(C), d_scratch(cu::batchnorm_backward_scratch_bytes(C) / sizeof(float));
    cu::batchnorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_x.get(), d_g.get(), d_be.get(), dm, N, C);
    check_close<T>("bn out", d_out.download(), r_out);
    check_close<T>("bn mean", d_mean.download(), r_mean, stats_tolerance);
    check_close<T>("bn rstd", d_rstd.download(), r_rstd, stats_tolerance);
    cu::batchnorm_backward(d_dx.get(), d_dg.get(), d_db.get(), d_dy.get(), d_x.get(), d_g.get(), d_mean.get(),
                           d_rstd.get(), dm, N, C, d_scratch.get());
    check_close<T>("bn din", d_dx.download(), r_dx);
    check_close<T>("bn dgamma", d_dg.download(), r_dg);
    check_close<T>("bn dbeta", d_db.download(), r_db);
    cu::batchnorm_update_running(d_rm.get(), d_rv.get(), d_mean.get(), d_rstd.get(), dm, N, C);
    check_close<T>("bn running_mean", d_rm.download(), r_rm);
    check_close<T>("bn running_var", d_rv.download(), r_rv);
  }
}

TEST_CASE_TEMPLATE("relu and tanh: in-place forward and backward from the output match the CPU reference", T, float,
                   cu::bf16, cu::fp16) {
  for (const std::int64_t n : {std::int64_t{1024}, std::int64_t{1001}}) {  // vectorised and scalar paths
    CAPTURE(n);
    const auto x = random_values<T>(n, -3, 3, 41);
    const auto dy = random_values<T>(n, -1, 1, 42);
    const auto r_x = to_double(x), r_dy = to_double(dy);
    for (const bool use_tanh : {false, true}) {
      CAPTURE(use_tanh);
      std::vector<double> r_y(n), r_dx(n);
      if (use_tanh) cpu::tanh_forward(r_y.data(), r_x.data(), n);
      else cpu::relu_forward(r_y.data(), r_x.data(), n);
      // The reference's backward reads the GPU's output rounded to T, as the GPU's does.
      dbuf<T> d_y(x), d_dy(dy);
      if (use_tanh) cu::tanh_forward(d_y.get(), d_y.get(), n);
      else cu::relu_forward(d_y.get(), d_y.get(), n);
      const auto y = d_y.download();
      check_close<T>(use_tanh ? "tanh out" : "relu out", y, r_y);
      const auto r_yt = to_double(y);
      if (use_tanh) cpu::tanh_backward(r_dx.data(), r_dy.data(), r_yt.data(), n);
      else cpu::relu_backward(r_dx.data(), r_dy.data(), r_yt.data(), n);
      if (use_tanh) cu::tanh_backward(d_dy.get(), d_dy.get(), d_y.get(), n);
      else cu::relu_backward(d_dy.get(), d_dy.get(), d_y.get(), n);
      check_close<T>(use_tanh ? "tanh din" : "relu din", d_dy.download(), r_dx);
    }
  }
}

namespace {

struct cross_config {
  std::int64_t B, Sq, Sk, H, Hkv, D;
};

// Partial tiles on both axes, more and fewer keys than queries, GQA and MQA, and the 128-wide head.
constexpr cross_config cross_configs[] = {
    {2, 45, 37, 4, 2, 64},
    {1, 33, 70, 2, 2, 128},
    {3, 20, 9, 3, 1, 16},
};

template <class T>
void check_cross_attention(const cross_config& c, bool masked, std::uint32_t seed) {
  CAPTURE(c.Sq);
  CAPTURE(c.Sk);
  CAPTURE(c.H);
  CAPTURE(c.Hkv);
  CAPTURE(c.D);
  CAPTURE(masked);
  const cu::cross_attention_shape sh{c.B, c.Sq, c.Sk, c.H, c.Hkv, c.D};
  const cpu::cross_attention_shape rsh{std::size_t(c.B), std::size_t(c.Sq), std::size_t(c.Sk), std::size_t(c.H),
                                       std::size_t(c.Hkv), std::size_t(c.D)};
  const auto mask = padding_mask(c.B, c.Sk, 3);  // every element keeps at least 3 keys
  const std::uint8_t* h_mask = masked ? mask.data() : nullptr;
  const std::int64_t nq = c.B * c.Sq * sh.q_width(), nkv = c.B * c.Sk * sh.kv_width();
  const auto q = random_values<T>(nq, -2, 2, seed);
  const auto kv = random_values<T>(nkv, -2, 2, seed + 1);
  const auto dout = random_values<T>(nq, -1, 1, seed + 2);
  const auto r_q = to_double(q), r_kv = to_double(kv), r_dout = to_double(dout);
  std::vector<double> r_out(nq), r_att(sh.att_elements()), r_lse(sh.stat_elements()), r_dq(nq), r_dkv(nkv),
      r_out_flash(nq);
  cpu::cross_attention_naive_forward(r_out.data(), r_att.data(), r_q.data(), r_kv.data(), h_mask, rsh);
  cpu::cross_attention_naive_backward(r_dq.data(), r_dkv.data(), r_dout.data(), r_q.data(), r_kv.data(), r_att.data(),
                                      h_mask, rsh);
  cpu::cross_attention_flash_forward(r_out_flash.data(), r_lse.data(), r_q.data(), r_kv.data(), h_mask, rsh);

  dbuf<std::uint8_t> d_mask(mask);
  const std::uint8_t* dm = masked ? d_mask.get() : nullptr;
  dbuf<T> d_q(q), d_kv(kv), d_dout(dout), d_out(nq), d_att(sh.att_elements()), d_dq(nq), d_dkv(nkv);
  dbuf<float> d_lse(sh.stat_elements()),
      d_scratch(cu::cross_attention_naive_backward_scratch_bytes(sh) / sizeof(float));
  cu::cross_attention_naive_forward(d_out.get(), d_att.get(), d_q.get(), d_kv.get(), dm, sh);
  check_close<T>("naive out", d_out.download(), r_out);
  check_close<T>("naive att", d_att.download(), r_att);
  d_dq.upload(random_values<T>(nq, -9, 9, 99));  // must be overwritten
  d_dkv.upload(random_values<T>(nkv, -9, 9, 98));
  cu::cross_attention_naive_backward(d_dq.get(), d_dkv.get(), d_dout.get(), d_q.get(), d_kv.get(), d_att.get(), dm, sh,
                                     d_scratch.get());
  check_close<T>("naive dq", d_dq.download(), r_dq);
  check_close<T>("naive dkv", d_dkv.download(), r_dkv);

  cu::cross_attention_flash_forward(d_out.get(), d_lse.get(), d_q.get(), d_kv.get(), dm, sh);
  check_close<T>("flash out", d_out.download(), r_out);
  check_close<T>("flash lse", d_lse.download(), r_lse, stats_tolerance);
  d_dq.upload(random_values<T>(nq, -9, 9, 97));
  d_dkv.upload(random_values<T>(nkv, -9, 9, 96));
  cu::cross_attention_flash_backward(d_dq.get(), d_dkv.get(), d_dout.get(), d_q.get(), d_kv.get(), d_out.get(),
                                     d_lse.get(), dm, sh);
  check_close<T>("flash dq", d_dq.download(), r_dq);
  check_close<T>("flash dkv", d_dkv.download(), r_dkv);
}

}  // namespace

TEST_CASE_TEMPLATE("cross-attention: naive and flash with a key mask match the CPU reference", T, float, cu::bf16,
                   cu::fp16) {
  std::uint32_t seed = 51;
  for (const cross_config& c : cross_configs)
    for (const bool masked : {false, true}) check_cross_attention<T>(c, masked, seed += 10);
}

TEST_CASE_TEMPLATE("speech losses: masked mel L1/MSE and stop-token BCE match the CPU reference", T, float, cu::bf16,
                   cu::fp16) {
  const std::int64_t B = 3, frames = 50, n_mels = 80, ld = n_mels + 1, N = B * frames;
  const std::vector<std::int32_t> lengths = {50, 31, 7};
  std::vector<std::uint8_t> mask(N);
  speech_targets::frame_mask_from_lengths(mask.data(), lengths.data(), B, frames);
  std::vector<float> stop(N);
  speech_targets::stop_targets(stop.data(), lengths.data(), B, frames);
  const auto out = random_values<T>(N * ld, -3, 3, 61);  // fused [mel ‖ stop] rows
  const auto target_t = random_values<T>(N * n_mels, -3, 3, 62);
  const auto r_out = to_double(out), r_target = to_double(target_t);
  const std::vector<float> target(r_target.begin(), r_target.end());  // fp32 features
  const double g = 0.7 / 88.0;  // dloss / divisor: the mean over the 88 real frames
  const float divisor = 88.0f;

  dbuf<std::uint8_t> d_mask(mask);
  dbuf<T> d_out(out), d_grad(N * ld);
  dbuf<float> d_stop(stop), d_target(target), d_slot(1);

  for (const bool l1 : {true, false}) {
    CAPTURE(l1);
    std::vector<double> r_grad(N * n_mels, 0.0);
    const double r_loss =
        cpu::mel_loss(r_grad.data(), l1, r_out.data(), ld, target.data(), mask.data(), N, n_mels, g) / divisor;
    d_grad.upload(random_values<T>(N * ld, -9, 9, 99));  // must be overwritten
    cu::mel_loss_forward(d_slot.get(), l1, d_out.get(), ld, d_target.get(), d_mask.get(), N, n_mels, divisor);
    cu::mel_loss_backward(d_grad.get(), l1, d_out.get(), ld, d_target.get(), d_mask.get(), N, n_mels,
                          static_cast<float>(g));
    check_close<T>("mel loss", d_slot.download(), {r_loss}, stats_tolerance);
    auto grad = d_grad.download();
    grad.resize(N * n_mels);  // contiguous [N, n_mels]
    check_close<T>("mel grad", grad, r_grad);
  }
  std::vector<double> r_grad(N * ld, 0.0);
  const double r_bce =
      cpu::stop_loss(r_grad.data() + n_mels, r_out.data() + n_mels, ld, stop.data(), N, g) / divisor;
  d_grad.zero();
  cu::stop_loss_forward(d_slot.get(), d_out.get() + n_mels, ld, d_stop.get(), N, divisor);
  cu::stop_loss_backward(d_grad.get() + n_mels, d_out.get() + n_mels, ld, d_stop.get(), N, static_cast<float>(g));
  check_close<T>("stop loss", d_slot.download(), {r_bce}, stats_tolerance);
  check_close<T>("stop grad", d_grad.download(), r_grad);
}

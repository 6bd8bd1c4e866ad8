// SPDX-License-Identifier: BSL-1.0
// The CUDA step backend's handlers of the speech model's ops (exec/program.hpp), each run through
// cuda::step_backend on a small hand-laid program and compared with the CPU reference kernels
// (backend/cpu conv1d, batchnorm, activation, attention's cross_attention_*, speech_loss) in double.
//
// The program is only an arena and the ops' list (so the backend sizes its scratch from them);
// inputs are written into the arena, each op is called as exec::run would call it, and its outputs
// read back. Features and masks come from the step's io at the micro-batch's offset.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include "../cpu/speech_targets.hpp"
#include "gpu_test_util.hpp"
#include "memalg/backend/cpu/activation.hpp"
#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cpu/batchnorm.hpp"
#include "memalg/backend/cpu/conv1d.hpp"
#include "memalg/backend/cpu/speech_loss.hpp"
#include "memalg/backend/cuda/local_communicator.cuh"
#include "memalg/backend/cuda/step_backend.cuh"
#include "memalg/exec/program.hpp"
#include "memalg/exec/run.hpp"

using namespace gpu_test;
namespace cpu = memalg::backend::cpu;
namespace exec = memalg::exec;
namespace ops = memalg::exec::ops;

namespace {

constexpr double stats_tolerance = 1e-5;

/// A program of arena operands and ops, and the step's features and masks per micro-batch.
template <class T>
struct rig {
  exec::program p;
  std::uint64_t top = 0;

  explicit rig(std::size_t grad_accum = 1, std::size_t features = 0, std::size_t masks = 0) {
    p.storage = cu::elem_of<T>();
    p.accum = exec::elem::f32;
    p.grad_accum = grad_accum;
    p.micro_batch = 1;
    p.features_per_micro = features;
    p.masks_per_micro = masks;
  }
  exec::operand arena(std::uint64_t n, exec::elem e = cu::elem_of<T>()) {
    const exec::operand o{top, n, e, exec::where::arena};
    top += (o.bytes() + 255) / 256 * 256;
    return o;
  }
  static exec::operand feature(std::uint64_t offset, std::uint64_t n) {
    return {offset, n, exec::elem::f32, exec::where::features};
  }
  static exec::operand mask(std::uint64_t offset, std::uint64_t n) { return {offset, n, exec::elem::u8, exec::where::masks}; }
  template <class O>
  void add(const O& o) {
    p.micro.push_back(exec::op{o});
  }
  /// The arena's capacity is what the operands took.
  const exec::program& done() {
    p.sizes = {0, top};
    p.high_water = top;
    return p;
  }
};

using backend_of = cu::step_backend<float, cu::local_device_communicator>;
template <class T>
using backend_t = cu::step_backend<T, cu::local_device_communicator>;

template <class T, class B>
void put(B& b, const exec::operand& o, const std::vector<T>& v) {
  REQUIRE(v.size() == o.count);
  b.write(o, std::as_bytes(std::span(v)));
}
template <class T, class B>
std::vector<T> get(B& b, const exec::operand& o) {
  const std::vector<std::byte> bytes = b.read(o);
  std::vector<T> v(o.count);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

/// Utterance b of a batch keeps its first len − step·b positions.
std::vector<std::uint8_t> padding_mask(std::size_t B, std::size_t len, std::size_t step) {
  std::vector<std::uint8_t> m(B * len, 1);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = len - step * b; t < len; ++t) m[b * len + t] = 0;
  return m;
}

/// The step's loss_sum after the ops so far (loss_mean over one micro-batch, then end_step).
template <class B>
float loss_sum(B& b, const exec::program& p, exec::run_state& s) {
  b(ops::loss_mean{1}, s);
  return b.end_step(p, s).loss;
}

}  // namespace

TEST_CASE_TEMPLATE("step backend: conv1d forward and backward match the CPU", T, float, cu::bf16) {
  const std::uint32_t B = 2, S = 13, IC = 6, OC = 5, K = 5;
  rig<T> r;
  const auto in = r.arena(B * S * IC), out = r.arena(B * S * OC), w = r.arena(OC * IC * K), bias = r.arena(OC),
             din = r.arena(B * S * IC), dw = r.arena(OC * IC * K), dbias = r.arena(OC), dout = r.arena(B * S * OC);
  const ops::conv1d_fwd fwd{out, in, w, bias, B, S, IC, OC, K};
  const ops::conv1d_bwd bwd{din, dw, dbias, dout, in, w, B, S, IC, OC, K};
  r.add(fwd);
  r.add(bwd);
  const exec::program& p = r.done();
  cu::local_device_communicator dp, tp;
  backend_t<T> b(p, dp, tp);
  exec::run_state s;
  b.begin_step(p, {}, s);

  const auto x = random_values<T>(in.count, -1, 1, 1), wv = random_values<T>(w.count, -0.5f, 0.5f, 2),
             bv = random_values<T>(OC, -1, 1, 3), dy = random_values<T>(dout.count, -1, 1, 4),
             dw0 = random_values<T>(w.count, -1, 1, 5), db0 = random_values<T>(OC, -1, 1, 6);
  put(b, in, x);
  put(b, w, wv);
  put(b, bias, bv);
  put(b, dout, dy);
  put(b, dw, dw0);
  put(b, dbias, db0);
  put(b, din, random_values<T>(din.count, -9, 9, 7));  // written, not accumulated
  b(fwd, s);
  b(bwd, s);

  const cpu::conv1d_shape rsh{B, S, IC, OC, K};
  const auto r_x = to_double(x), r_w = to_double(wv), r_b = to_double(bv), r_dy = to_double(dy);
  std::vector<double> r_out(out.count), r_dx(din.count), r_dw = to_double(dw0), r_db = to_double(db0);
  cpu::conv1d_forward(r_out.data(), r_x.data(), r_w.data(), r_b.data(), rsh);
  cpu::conv1d_backward(r_dx.data(), r_dw.data(), r_db.data(), r_dy.data(), r_x.data(), r_w.data(), rsh);
  check_close<T>("conv1d out", get<T>(b, out), r_out);
  check_close<T>("conv1d din", get<T>(b, din), r_dx);
  check_close<T>("conv1d dw", get<T>(b, dw), r_dw);
  check_close<T>("conv1d dbias", get<T>(b, dbias), r_db);
}

TEST_CASE_TEMPLATE("step backend: masked batch norm (statistics recomputed in backward) matches the CPU", T, float,
                   cu::bf16) {
  const std::uint32_t B = 3, S = 9, N = B * S, C = 7;
  const std::vector<std::uint8_t> mask = padding_mask(B, S, 3);
  rig<T> r(1, 0, N);
  const auto in = r.arena(N * C), out = r.arena(N * C), gamma = r.arena(C), beta = r.arena(C), d = r.arena(N * C),
             dgamma = r.arena(C), dbeta = r.arena(C);
  const ops::batchnorm_fwd fwd{out, in, gamma, beta, rig<T>::mask(0, N), N, C};
  const ops::batchnorm_bwd bwd{d, dgamma, dbeta, d, in, gamma, rig<T>::mask(0, N), N, C};  // din over dout
  r.add(fwd);
  r.add(bwd);
  const exec::program& p = r.done();
  cu::local_device_communicator dp, tp;
  backend_t<T> b(p, dp, tp);
  exec::run_state s;
  b.begin_step(p, {.tokens = {}, .targets = {}, .features = {}, .masks = mask}, s);

  const auto x = random_values<T>(in.count, -2, 3, 11), g = random_values<T>(C, 0.5f, 1.5f, 12),
             be = random_values<T>(C, -1, 1, 13), dy = random_values<T>(d.count, -1, 1, 14),
             dg0 = random_values<T>(C, -1, 1, 15), db0 = random_values<T>(C, -1, 1, 16);
  put(b, in, x);
  put(b, gamma, g);
  put(b, beta, be);
  put(b, d, dy);
  put(b, dgamma, dg0);
  put(b, dbeta, db0);
  b(fwd, s);
  b(bwd, s);

  const auto r_x = to_double(x), r_g = to_double(g), r_be = to_double(be), r_dy = to_double(dy);
  std::vector<double> r_out(N * C), r_mean(C), r_rstd(C), r_dx(N * C), r_dg = to_double(dg0), r_db = to_double(db0);
  cpu::batchnorm_forward(r_out.data(), r_mean.data(), r_rstd.data(), r_x.data(), r_g.data(), r_be.data(), mask.data(), N, C);
  cpu::batchnorm_backward(r_dx.data(), r_dg.data(), r_db.data(), r_dy.data(), r_x.data(), r_g.data(), r_mean.data(),
                          r_rstd.data(), mask.data(), N, C);
  check_close<T>("bn out", get<T>(b, out), r_out);
  check_close<T>("bn din", get<T>(b, d), r_dx);
  check_close<T>("bn dgamma", get<T>(b, dgamma), r_dg);
  check_close<T>("bn dbeta", get<T>(b, dbeta), r_db);
}

TEST_CASE_TEMPLATE("step backend: relu and tanh in place, backward from the output, match the CPU", T, float, cu::bf16) {
  const std::uint32_t n = 1001;
  for (const auto k : {ops::activation_kind::relu, ops::activation_kind::tanh}) {
    const bool use_tanh = k == ops::activation_kind::tanh;
    CAPTURE(use_tanh);
    rig<T> r;
    const auto y = r.arena(n), d = r.arena(n);
    const ops::activation_fwd fwd{y, y, k, 1, n};
    const ops::activation_bwd bwd{d, d, y, k, 1, n};
    r.add(fwd);
    r.add(bwd);
    const exec::program& p = r.done();
    cu::local_device_communicator dp, tp;
    backend_t<T> b(p, dp, tp);
    exec::run_state s;
    b.begin_step(p, {}, s);
    const auto x = random_values<T>(n, -3, 3, 21), dy = random_values<T>(n, -1, 1, 22);
    put(b, y, x);
    put(b, d, dy);
    b(fwd, s);
    const auto gy = get<T>(b, y);
    b(bwd, s);
    const auto r_x = to_double(x), r_dy = to_double(dy), r_gy = to_double(gy);
    std::vector<double> r_y(n), r_dx(n);
    if (use_tanh) cpu::tanh_forward(r_y.data(), r_x.data(), n);
    else cpu::relu_forward(r_y.data(), r_x.data(), n);
    check_close<T>("activation out", gy, r_y);
    if (use_tanh) cpu::tanh_backward(r_dx.data(), r_dy.data(), r_gy.data(), n);  // from the output, rounded to T
    else cpu::relu_backward(r_dx.data(), r_dy.data(), r_gy.data(), n);
    check_close<T>("activation din", get<T>(b, d), r_dx);
  }
}

namespace {

/// One masked attention op, cross (separate q and kv) or fused (one qkv, causal or not), naive or
/// flash, forward and backward, against the CPU's attention on q and kv taken from the same values.
template <class T>
void check_masked_attention(bool fused, bool flash, std::uint32_t seed, bool causal = false) {
  CAPTURE(fused);
  CAPTURE(flash);
  CAPTURE(causal);
  const std::uint32_t B = 2, Sq = 19, Sk = fused ? Sq : 23, H = 4, Hkv = 2, D = 32;
  const std::size_t qw = H * D, kvw = 2 * Hkv * D, nq = B * Sq * qw, nkv = B * Sk * kvw;
  const std::vector<std::uint8_t> mask = padding_mask(B, Sk, 4);
  rig<T> r(1, 0, B * Sk);
  const ops::xattn_shape sh{B, Sq, Sk, H, Hkv, D, causal, flash, fused};
  const cpu::cross_attention_shape rsh{B, Sq, Sk, H, Hkv, D};
  const std::uint64_t stats = std::uint64_t{B} * H * Sq * (flash ? 1 : Sk);
  exec::operand q, kv, dq, dkv;
  if (fused) {
    q = kv = r.arena(B * Sq * (qw + kvw));
    dq = dkv = r.arena(B * Sq * (qw + kvw));
  } else {
    q = r.arena(nq);
    kv = r.arena(nkv);
    dq = r.arena(nq);
    dkv = r.arena(nkv);
  }
  const auto out = r.arena(nq), dout = r.arena(nq),
             pl = flash ? r.arena(stats, exec::elem::f32) : r.arena(stats);
  const ops::masked_attention_fwd fwd{out, pl, q, kv, rig<T>::mask(0, B * Sk), sh};
  const ops::masked_attention_bwd bwd{dq, dkv, dout, q, kv, out, pl, rig<T>::mask(0, B * Sk), sh};
  // The same forward without probabilities or lse (no backward follows: an evaluation pass).
  const auto out_eval = r.arena(nq);
  const ops::masked_attention_fwd fwd_eval{out_eval, exec::operand{}, q, kv, rig<T>::mask(0, B * Sk), sh};
  r.add(fwd);
  r.add(bwd);
  r.add(fwd_eval);
  const exec::program& p = r.done();
  cu::local_device_communicator dpc, tpc;
  backend_t<T> b(p, dpc, tpc);
  exec::run_state s;
  b.begin_step(p, {.tokens = {}, .targets = {}, .features = {}, .masks = mask}, s);

  const auto hq = random_values<T>(nq, -2, 2, seed), hkv = random_values<T>(nkv, -2, 2, seed + 1),
             hdout = random_values<T>(nq, -1, 1, seed + 2);
  if (fused) {  // rows [q ‖ k ‖ v]
    std::vector<T> qkv(q.count);
    for (std::size_t n = 0; n < B * Sq; ++n) {
      std::copy_n(hq.begin() + n * qw, qw, qkv.begin() + n * (qw + kvw));
      std::copy_n(hkv.begin() + n * kvw, kvw, qkv.begin() + n * (qw + kvw) + qw);
    }
    put(b, q, qkv);
    put(b, dq, random_values<T>(dq.count, -9, 9, seed + 3));  // written, not accumulated
  } else {
    put(b, q, hq);
    put(b, kv, hkv);
    put(b, dq, random_values<T>(nq, -9, 9, seed + 3));
    put(b, dkv, random_values<T>(nkv, -9, 9, seed + 4));
  }
  put(b, dout, hdout);
  b(fwd, s);
  b(bwd, s);
  b(fwd_eval, s);

  const auto r_q = to_double(hq), r_kv = to_double(hkv), r_dout = to_double(hdout);
  std::vector<double> r_out(nq), r_att(std::size_t{B} * H * Sq * Sk), r_lse(std::size_t{B} * H * Sq), r_dq(nq), r_dkv(nkv);
  // The CPU's attention over q and kv apart (the layout the fused qkv is split into), causal when the op is.
  cpu::detail::attention_io rio = cpu::detail::cross_attention_io(rsh, mask.data());
  rio.causal = causal;
  cpu::detail::attention_naive_forward_io(r_out.data(), r_att.data(), r_q.data(), r_kv.data(), rio);
  cpu::detail::attention_naive_backward_io(r_dq.data(), r_dkv.data(), r_dout.data(), r_q.data(), r_kv.data(), r_att.data(),
                                           rio);  // accumulates into the zeros of r_dq, r_dkv
  check_close<T>("attention out", get<T>(b, out), r_out);
  check_close<T>("attention out, no probabilities or lse kept", get<T>(b, out_eval), r_out);
  if (flash) {
    std::vector<double> r_out_flash(nq);
    cpu::detail::attention_flash_forward_io(r_out_flash.data(), r_lse.data(), r_q.data(), r_kv.data(), rio, 64);
    check_close<T>("attention lse", get<float>(b, pl), r_lse, stats_tolerance);
  } else {
    check_close<T>("attention probabilities", get<T>(b, pl), r_att);
  }
  if (fused) {
    const auto g = get<T>(b, dq);
    std::vector<T> gq(nq), gkv(nkv);
    for (std::size_t n = 0; n < B * Sq; ++n) {
      std::copy_n(g.begin() + n * (qw + kvw), qw, gq.begin() + n * qw);
      std::copy_n(g.begin() + n * (qw + kvw) + qw, kvw, gkv.begin() + n * kvw);
    }
    check_close<T>("attention dq (of dqkv)", gq, r_dq);
    check_close<T>("attention dkv (of dqkv)", gkv, r_dkv);
  } else {
    check_close<T>("attention dq", get<T>(b, dq), r_dq);
    check_close<T>("attention dkv", get<T>(b, dkv), r_dkv);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("step backend: masked attention, cross and fused, naive and flash, matches the CPU", T, float,
                   cu::bf16) {
  std::uint32_t seed = 31;
  for (const bool fused : {false, true})
    for (const bool flash : {false, true}) check_masked_attention<T>(fused, flash, seed += 10);
  // A causal fused self-attention with a key mask (the CPU's attention_io, causal).
  for (const bool flash : {false, true}) check_masked_attention<T>(true, flash, seed += 10, true);
}

TEST_CASE("step backend: causal cross-attention (q and kv apart) is refused with a sentence, as on the CPU") {
  const std::uint32_t B = 1, S = 8, H = 2, Hkv = 2, D = 16;
  rig<float> r;
  const auto q = r.arena(B * S * H * D), kv = r.arena(B * S * 2 * Hkv * D), out = r.arena(B * S * H * D),
             lse = r.arena(B * H * S, exec::elem::f32);
  const ops::masked_attention_fwd fwd{out, lse, q, kv, {}, {B, S, S, H, Hkv, D, true, true, false}};
  r.add(fwd);
  const exec::program& p = r.done();
  cu::local_device_communicator dp, tp;
  backend_of b(p, dp, tp);
  exec::run_state s;
  b.begin_step(p, {}, s);
  CHECK_THROWS_AS(b(fwd, s), std::invalid_argument);
}

TEST_CASE_TEMPLATE("step backend: mel and stop losses with a fixed divisor match the CPU's", T, float,
                   cu::bf16) {
  // The decoder's fused rows [mel ‖ stop] (ld = M + 1), three utterances of 50, 31 and 7 frames.
  const std::uint32_t B = 3, S = 50, M = 20, ld = M + 1, N = B * S, grad_accum = 2;
  const std::vector<std::int32_t> lengths = {50, 31, 7};
  std::vector<std::uint8_t> mask(N);
  speech_targets::frame_mask_from_lengths(mask.data(), lengths.data(), B, S);
  std::vector<float> features(N * M + N);  // mel targets, then stop targets
  const auto mel_target = random_values<float>(N * M, -3, 3, 62);
  std::copy(mel_target.begin(), mel_target.end(), features.begin());
  speech_targets::stop_targets(features.data() + N * M, lengths.data(), B, S);
  const float divisor = static_cast<float>(N * M), stop_divisor = static_cast<float>(N);

  for (const bool l1 : {true, false}) {
    CAPTURE(l1);
    rig<T> r(1, features.size(), N);
    const auto out = r.arena(N * ld), grad = r.arena(N * M), in_place = r.arena(N * M);
    const exec::operand stop_logits{out.offset + M * sizeof(T), (N - 1) * ld + 1, out.type, exec::where::arena};
    const ops::mel_loss mel{out, rig<T>::feature(0, N * M), rig<T>::mask(0, N), grad, N, M, ld, grad_accum, l1, divisor};
    // ld == M: the gradient over the prediction itself.
    const ops::mel_loss mel_in_place{in_place, rig<T>::feature(0, N * M), rig<T>::mask(0, N), in_place, N, M, M, grad_accum,
                                     l1, divisor};
    const ops::stop_loss stop{stop_logits, rig<T>::feature(N * M, N), stop_logits, N, ld, grad_accum, stop_divisor};
    r.add(mel);
    r.add(mel_in_place);
    r.add(stop);
    const exec::program& p = r.done();
    cu::local_device_communicator dp, tp;
    backend_t<T> b(p, dp, tp);
    exec::run_state s;
    b.begin_step(p, {.tokens = {}, .targets = {}, .features = features, .masks = mask}, s);
    const auto hout = random_values<T>(N * ld, -3, 3, 61), hpred = random_values<T>(N * M, -3, 3, 63);
    put(b, out, hout);
    put(b, in_place, hpred);
    put(b, grad, random_values<T>(N * M, -9, 9, 64));
    b(mel, s);
    b(mel_in_place, s);
    b(stop, s);

    const auto r_out = to_double(hout), r_pred = to_double(hpred);
    const float* r_target = mel_target.data();
    const float* r_stop = features.data() + N * M;
    const double dloss = 1.0 / grad_accum;
    // The CPU backend's kernels (cpu/speech_loss.hpp) in double: Σ / divisor, gradients by dloss / divisor.
    std::vector<double> r_dout(N * ld, 0.0), r_dpred(N * M, 0.0), r_grad(N * M);
    const double r_mel = cpu::mel_loss(r_grad.data(), l1, r_out.data(), ld, r_target, mask.data(), N, M, dloss / divisor) / divisor;
    const double r_mel2 = cpu::mel_loss(r_dpred.data(), l1, r_pred.data(), M, r_target, mask.data(), N, M, dloss / divisor) / divisor;
    const double r_bce = cpu::stop_loss(r_dout.data() + M, r_out.data() + M, ld, r_stop, N, dloss / stop_divisor) / stop_divisor;
    check_close<T>("mel grad", get<T>(b, grad), r_grad);
    check_close<T>("mel grad in place", get<T>(b, in_place), r_dpred);
    const auto g_out = get<T>(b, out);
    std::vector<T> g_stop(N);
    std::vector<double> r_gstop(N);
    for (std::size_t n = 0; n < N; ++n) {
      g_stop[n] = g_out[n * ld + M];
      r_gstop[n] = r_dout[n * ld + M];
      CHECK(cu::to_float(g_out[n * ld]) == cu::to_float(hout[n * ld]));  // the mel columns are the loss's input
    }
    check_close<T>("stop grad", g_stop, r_gstop);
    check_close<T>("loss_sum = mel + mel + stop", std::vector<float>{loss_sum(b, p, s)}, {r_mel + r_mel2 + r_bce},
                   stats_tolerance);
  }
}

TEST_CASE_TEMPLATE("step backend: frames_in and mask_rows read the micro-batch's features and masks", T, float,
                   cu::bf16) {
  const std::uint32_t B = 2, S = 7, M = 5, shift = 1, grad_accum = 2, C = 9;
  const std::size_t per = std::size_t{B} * S * M;
  const auto features = random_values<float>(grad_accum * per, -3, 3, 71);
  std::vector<std::uint8_t> masks(grad_accum * B * S);
  for (std::size_t i = 0; i < masks.size(); ++i) masks[i] = (i * 7 + 3) % 5 != 0;
  rig<T> r(grad_accum, per, B * S);
  const auto frames = r.arena(per), x = r.arena(B * S * C);
  const ops::frames_in fin{frames, rig<T>::feature(0, per), B, S, M, shift};
  const ops::mask_rows mr{x, rig<T>::mask(0, B * S), B * S, C};
  r.add(fin);
  r.add(mr);
  const exec::program& p = r.done();
  cu::local_device_communicator dp, tp;
  backend_t<T> b(p, dp, tp);
  exec::run_state s;
  const std::vector<float> short_features(per);
  CHECK_THROWS_AS(b.begin_step(p, {.tokens = {}, .targets = {}, .features = short_features, .masks = masks}, s),
                  std::invalid_argument);
  b.begin_step(p, {.tokens = {}, .targets = {}, .features = features, .masks = masks}, s);
  const auto hx = random_values<T>(x.count, -2, 2, 72);
  for (std::uint64_t micro = 0; micro < grad_accum; ++micro) {
    CAPTURE(micro);
    s.micro = micro;
    put(b, x, hx);
    b(fin, s);
    b(mr, s);
    const auto g = get<T>(b, frames);
    const auto gx = get<T>(b, x);
    std::size_t wrong = 0;
    for (std::size_t n = 0; n < std::size_t{B} * S; ++n) {
      const std::size_t t = n % S;
      for (std::size_t m = 0; m < M; ++m) {
        const float want = t >= shift ? cu::to_float(cu::from_float<T>(features[micro * per + (n - shift) * M + m])) : 0.0f;
        wrong += cu::to_float(g[n * M + m]) != want;
      }
      for (std::size_t c = 0; c < C; ++c)
        wrong += cu::to_float(gx[n * C + c]) != (masks[micro * B * S + n] ? cu::to_float(hx[n * C + c]) : 0.0f);
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE_TEMPLATE("step backend: linear_bwd with add_din accumulates din (beta = 1)", T, float, cu::bf16) {
  const std::uint32_t N = 16, IC = 12, OC = 8;
  rig<T> r;
  const auto in = r.arena(N * IC), w = r.arena(OC * IC), dout = r.arena(N * OC), din = r.arena(N * IC),
             dw = r.arena(OC * IC), dbias = r.arena(OC);
  ops::linear_bwd bwd{din, dw, dbias, dout, in, w, N, IC, OC, true};
  r.add(bwd);
  const exec::program& p = r.done();
  cu::local_device_communicator dp, tp;
  backend_t<T> b(p, dp, tp);
  exec::run_state s;
  b.begin_step(p, {}, s);
  const auto hin = random_values<T>(in.count, -1, 1, 81), hw = random_values<T>(w.count, -1, 1, 82),
             hdout = random_values<T>(dout.count, -1, 1, 83), din0 = random_values<T>(din.count, -1, 1, 84),
             dw0 = random_values<T>(dw.count, -1, 1, 85), db0 = random_values<T>(OC, -1, 1, 86);
  put(b, in, hin);
  put(b, w, hw);
  put(b, dout, hdout);
  put(b, din, din0);
  put(b, dw, dw0);
  put(b, dbias, db0);
  b(bwd, s);
  std::vector<double> r_din = to_double(din0), r_dw = to_double(dw0), r_db = to_double(db0);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t o = 0; o < OC; ++o) {
      const double g = cu::to_float(hdout[n * OC + o]);
      r_db[o] += g;
      for (std::size_t i = 0; i < IC; ++i) {
        r_din[n * IC + i] += g * cu::to_float(hw[o * IC + i]);
        r_dw[o * IC + i] += g * cu::to_float(hin[n * IC + i]);
      }
    }
  check_close<T>("din += dout·W", get<T>(b, din), r_din);
  check_close<T>("dW", get<T>(b, dw), r_dw);
  check_close<T>("dbias", get<T>(b, dbias), r_db);
}

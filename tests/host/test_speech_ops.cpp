// SPDX-License-Identifier: BSL-1.0
// The speech model's step-program ops on the CPU step backend, against the kernels and hand loops.
//
// Each case builds a bare program (no units, a stack region only), places the op's operands in
// the backend's arena, stages fp32 features and u8 masks as a step would, runs the op through
// the backend's call operator and compares what it wrote with a direct call of the CPU kernel
// (bit for bit) or with a double-precision loop of the op's formula (exec/program.hpp). Every
// case also checks the interpreter's live-bytes meter (exec/meter.hpp), fed each op the backend
// ran, as exec::run feeds it: the op's arena operands, placed one after another, are all live at
// the op, so the measured high water is where the last of them ends.
#include <doctest/doctest.h>

#include <memalg/backend/cpu/activation.hpp>
#include <memalg/backend/cpu/attention.hpp>
#include <memalg/backend/cpu/batchnorm.hpp>
#include <memalg/backend/cpu/conv1d.hpp>
#include <memalg/backend/cpu/linear.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/backend/cpu/step_backend.hpp>
#include <memalg/exec/meter.hpp>
#include <memalg/exec/null_backend.hpp>
#include <memalg/exec/program.hpp>
#include <memalg/exec/run.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

namespace m = memalg;
namespace cpu = memalg::backend::cpu;
namespace ex = memalg::exec;
namespace ops = memalg::exec::ops;
using comm = cpu::local_communicator;

namespace {

/// Deterministic values in [−1, 1) (a small LCG), distinct per seed.
std::vector<float> values(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// A bare program, its CPU backend of storage type T and its meter: operands are placed one after
/// another in a stack region of 1 MiB (64-byte aligned), inputs written, the op run inside one step.
template <class T>
struct rig_t {
  static constexpr ex::elem storage = cpu::elem_of<T>();
  comm dp, tp;
  ex::program p;
  std::unique_ptr<cpu::step_backend<T, comm>> b;
  std::unique_ptr<ex::live_bytes_meter> meter;
  ex::run_state s;
  std::vector<float> features;
  std::vector<std::uint8_t> masks;
  std::size_t used = 0, top = 0;  ///< next free offset; end of the last operand in 16-byte granules

  explicit rig_t(std::size_t features_per_micro = 0, std::size_t masks_per_micro = 0, std::size_t grad_accum = 1,
                 bool loss_scaling = false) {
    p.storage = storage;
    p.accum = ex::elem::f32;
    p.sizes = {0, std::size_t{1} << 20};
    p.grad_accum = grad_accum;
    p.features_per_micro = features_per_micro;
    p.masks_per_micro = masks_per_micro;
    p.loss_scaling = loss_scaling;
    b = std::make_unique<cpu::step_backend<T, comm>>(p, dp, tp);
    meter = std::make_unique<ex::live_bytes_meter>(p);
  }
  ex::operand alloc(std::size_t n, ex::elem e = storage) {
    const ex::operand o{used, n, e, ex::where::arena};
    top = (used + n * ex::elem_size(e) + 15) / 16 * 16;
    used += (n * ex::elem_size(e) + 63) / 64 * 64;
    return o;
  }
  /// The values rounded to T, placed in the arena.
  ex::operand put(const std::vector<float>& v) {
    const ex::operand o = alloc(v.size());
    std::vector<T> t(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) t[i] = m::from_float<T>(v[i]);
    b->write(o, std::as_bytes(std::span(t)));
    return o;
  }
  /// A storage-type (or f32) operand read back as floats.
  std::vector<float> get(const ex::operand& o) {
    const std::vector<std::byte> raw = b->read(o);
    std::vector<float> v(o.count);
    if (o.type == ex::elem::f32) {
      std::memcpy(v.data(), raw.data(), raw.size());
      return v;
    }
    std::vector<T> t(o.count);
    std::memcpy(t.data(), raw.data(), raw.size());
    for (std::size_t i = 0; i < t.size(); ++i) v[i] = static_cast<float>(m::to_float(t[i]));
    return v;
  }
  void begin(std::uint64_t micro = 0) {
    b->begin_step(p, {{}, {}, features, masks}, s);
    meter->begin_step();
    s.micro = micro;
  }
  template <class Op>
  void operator()(const Op& o) {
    (*b)(o, s);
    meter->record(o);
  }
  /// Ends the step; returns scalars::loss after a loss_mean over one micro-batch (= loss_sum).
  float end() {
    (*this)(ops::loss_mean{1});
    const float loss = b->end_step(p, s).loss;
    meter->end_step();
    return loss;
  }
};
using rig = rig_t<float>;

/// v rounded to T and back.
template <class T>
std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = static_cast<float>(m::to_float(m::from_float<T>(x)));
  return v;
}

ex::operand feat(std::uint64_t offset, std::uint64_t count) { return {offset, count, ex::elem::f32, ex::where::features}; }
ex::operand msk(std::uint64_t offset, std::uint64_t count) { return {offset, count, ex::elem::u8, ex::where::masks}; }

// ---- a double-precision attention with a key mask: the reference of the masked attention ops ----
struct ref_attention {
  std::size_t B, Sq, Sk, H, Hkv, D;
  bool causal;
  const std::uint8_t* key_mask;
  // element index of q, k, v (q rows b·Sq + t with row stride q_ld at column q_col + h·D, ...)
  std::size_t q_ld, q_col, kv_ld, k_col, v_col;
  std::size_t qi(std::size_t b, std::size_t t, std::size_t h) const { return (b * Sq + t) * q_ld + q_col + h * D; }
  std::size_t ki(std::size_t b, std::size_t j, std::size_t h) const { return (b * Sk + j) * kv_ld + k_col + h / (H / Hkv) * D; }
  std::size_t vi(std::size_t b, std::size_t j, std::size_t h) const { return (b * Sk + j) * kv_ld + v_col + h / (H / Hkv) * D; }
  std::size_t oi(std::size_t b, std::size_t t, std::size_t h) const { return ((b * Sq + t) * H + h) * D; }
  bool sees(std::size_t b, std::size_t t, std::size_t j) const {
    return (!causal || j <= t) && (!key_mask || key_mask[b * Sk + j] != 0);
  }
  /// P[t, j] of (b, h): softmax over the visible keys of scale·q·k.
  std::vector<double> probs(const std::vector<float>& q, const std::vector<float>& kv, std::size_t b, std::size_t h,
                            std::size_t t) const {
    std::vector<double> p(Sk, 0.0);
    double mx = -std::numeric_limits<double>::infinity(), sum = 0;
    for (std::size_t j = 0; j < Sk; ++j)
      if (sees(b, t, j)) {
        double d = 0;
        for (std::size_t e = 0; e < D; ++e) d += double(q[qi(b, t, h) + e]) * kv[ki(b, j, h) + e];
        p[j] = d / std::sqrt(double(D));
        mx = std::max(mx, p[j]);
      }
    for (std::size_t j = 0; j < Sk; ++j)
      if (sees(b, t, j)) sum += (p[j] = std::exp(p[j] - mx));
    for (std::size_t j = 0; j < Sk; ++j) p[j] = sees(b, t, j) ? p[j] / sum : 0.0;
    return p;
  }
  std::vector<double> forward(const std::vector<float>& q, const std::vector<float>& kv) const {
    std::vector<double> out(B * Sq * H * D, 0.0);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t t = 0; t < Sq; ++t) {
          const std::vector<double> p = probs(q, kv, b, h, t);
          for (std::size_t j = 0; j < Sk; ++j)
            for (std::size_t e = 0; e < D; ++e) out[oi(b, t, h) + e] += p[j] * kv[vi(b, j, h) + e];
        }
    return out;
  }
  /// dq into dq (layout of q), dk and dv into dkv (layout of kv); they may be one vector.
  void backward(std::vector<double>& dq, std::vector<double>& dkv, const std::vector<float>& dout,
                const std::vector<float>& q, const std::vector<float>& kv) const {
    const double scale = 1.0 / std::sqrt(double(D));
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t t = 0; t < Sq; ++t) {
          const std::vector<double> p = probs(q, kv, b, h, t);
          std::vector<double> dp(Sk, 0.0);
          double pdp = 0;
          for (std::size_t j = 0; j < Sk; ++j) {
            for (std::size_t e = 0; e < D; ++e) dp[j] += double(dout[oi(b, t, h) + e]) * kv[vi(b, j, h) + e];
            pdp += p[j] * dp[j];
          }
          for (std::size_t j = 0; j < Sk; ++j) {
            if (!sees(b, t, j)) continue;
            const double ds = p[j] * (dp[j] - pdp) * scale;
            for (std::size_t e = 0; e < D; ++e) {
              dq[qi(b, t, h) + e] += ds * kv[ki(b, j, h) + e];
              dkv[ki(b, j, h) + e] += ds * q[qi(b, t, h) + e];
              dkv[vi(b, j, h) + e] += p[j] * dout[oi(b, t, h) + e];
            }
          }
        }
  }
};

template <class V>
void check_close(const std::vector<float>& got, const V& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(double(got[i]) == doctest::Approx(double(want[i])).epsilon(tol).scale(1.0));
  }
}

}  // namespace

TEST_CASE("null_backend and cpu::step_backend handle every op of the program, the speech model's too") {
  static_assert(ex::step_backend<ex::null_backend>);
  static_assert(ex::step_backend<cpu::step_backend<float, comm>>);
  static_assert(ex::step_backend<cpu::step_backend<m::bf16, comm>>);
  static_assert(ex::step_backend<cpu::step_backend<m::fp16, comm>>);
  // run() walks a speech program's micro-batches with its features and masks on the null backend.
  ex::program p;
  p.grad_accum = 2;
  p.features_per_micro = 6;
  p.masks_per_micro = 3;
  p.micro.push_back({ops::mask_rows{{}, msk(0, 3), 3, 2}});
  p.micro.push_back({ops::frames_in{{}, feat(0, 6), 1, 3, 2, 1}});
  ex::null_backend nb(p);
  ex::run_state s;
  const std::vector<float> f(12, 0.0f);
  const std::vector<std::uint8_t> mk(6, 1);
  ex::run(p, nb, {{}, {}, f, mk}, s);
  CHECK(nb.executed() == 4);
  CHECK_THROWS_AS(ex::run(p, nb, {{}, {}, std::span(f).first(6), mk}, s), std::invalid_argument);
}

TEST_CASE("begin_step checks the features and masks of a step") {
  rig r(6, 3, 2);
  r.features.assign(12, 0.0f);
  r.masks.assign(6, 1);
  CHECK_NOTHROW(r.begin());
  r.features.resize(6);
  CHECK_THROWS_AS(r.begin(), std::invalid_argument);
  r.features.resize(12);
  r.masks.resize(7);
  CHECK_THROWS_AS(r.begin(), std::invalid_argument);
  rig gpt;  // no features nor masks: empty spans are what it takes
  CHECK_NOTHROW(gpt.begin());
}

TEST_CASE("frames_in: out[b, t] = src[b, t − shift] of this micro-batch's features, zero before") {
  const std::uint32_t B = 2, S = 4, M = 3, shift = 1;
  const std::size_t per = std::size_t{B} * S * M;
  rig r(per, 0, 2);
  r.features = values(2 * per, 1);
  const ex::operand out = r.alloc(per);
  for (std::uint64_t micro : {0u, 1u}) {
    CAPTURE(micro);
    r.begin(micro);
    r(ops::frames_in{out, feat(0, per), B, S, M, shift});
    const std::vector<float> got = r.get(out);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < S; ++t)
        for (std::size_t c = 0; c < M; ++c) {
          const float want = t < shift ? 0.0f : r.features[micro * per + (b * S + t - shift) * M + c];
          CHECK(got[(b * S + t) * M + c] == want);
        }
    // An operand past the micro-batch's features, or not a features operand, is refused.
    CHECK_THROWS_AS(r(ops::frames_in{out, feat(1, per), B, S, M, shift}), std::invalid_argument);
    CHECK_THROWS_AS(r(ops::frames_in{out, feat(per, per), B, S, M, shift}), std::invalid_argument);
    CHECK_THROWS_AS(r(ops::frames_in{out, ex::operand{0, per, ex::elem::f32, ex::where::tokens}, B, S, M, shift}),
                    std::invalid_argument);
    r.end();
  }
  CHECK(r.meter->high_water() == r.top);
}

TEST_CASE("mask_rows zeroes the padded rows; a mask past the micro-batch's masks throws") {
  const std::uint32_t N = 5, C = 3;
  rig r(0, 2 * N, 1);
  r.masks = {1, 0, 1, 1, 0, /* second block */ 0, 0, 1, 0, 1};
  const std::vector<float> x0 = values(N * C, 2);
  const ex::operand x = r.put(x0);
  r.begin();
  r(ops::mask_rows{x, msk(N, N), N, C});
  const std::vector<float> got = r.get(x);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t c = 0; c < C; ++c) CHECK(got[n * C + c] == (r.masks[N + n] ? x0[n * C + c] : 0.0f));
  CHECK_THROWS_AS(r(ops::mask_rows{x, msk(N + 1, N), N, C}), std::invalid_argument);
  CHECK_THROWS_AS(r(ops::mask_rows{x, msk(0, N - 1), N, C}), std::invalid_argument);  // not [N]
  CHECK_THROWS_AS(r(ops::mask_rows{x, ex::operand{0, N, ex::elem::u8, ex::where::arena}, N, C}), std::invalid_argument);
  r.end();
  CHECK(r.meter->high_water() == r.top);
}

TEST_CASE("relu and tanh in place: forward from x, backward from the output y") {
  const std::size_t n = 37;
  for (auto k : {ops::activation_kind::relu, ops::activation_kind::tanh}) {
    CAPTURE(static_cast<int>(k));
    rig r;
    const std::vector<float> x0 = values(n, 3), dy0 = values(n, 4);
    const ex::operand x = r.put(x0), dy = r.put(dy0);
    r.begin();
    r(ops::activation_fwd{x, x, k, 0, 0});
    r(ops::activation_bwd{dy, dy, x, k, 0, 0});  // din over dout, y in `in`
    r.end();
    std::vector<float> y(n), dx(n);
    if (k == ops::activation_kind::relu) {
      cpu::relu_forward(y.data(), x0.data(), n);
      cpu::relu_backward(dx.data(), dy0.data(), y.data(), n);
    } else {
      cpu::tanh_forward(y.data(), x0.data(), n);
      cpu::tanh_backward(dx.data(), dy0.data(), y.data(), n);
    }
    CHECK(same_bits(r.get(x), y));
    CHECK(same_bits(r.get(dy), dx));
    for (std::size_t i = 0; i < n; ++i) {  // and what the kernels compute is the formula
      const double want_y = k == ops::activation_kind::relu ? std::max(0.0, double(x0[i])) : std::tanh(double(x0[i]));
      const double want_dx = k == ops::activation_kind::relu ? (x0[i] > 0 ? dy0[i] : 0.0) : dy0[i] * (1 - want_y * want_y);
      CHECK(y[i] == doctest::Approx(want_y).epsilon(1e-6));
      CHECK(dx[i] == doctest::Approx(want_dx).epsilon(1e-5).scale(1.0));
    }
    CHECK(r.meter->high_water() == r.top);
  }
}

TEST_CASE("linear_bwd with add_din accumulates the input gradient; without it overwrites") {
  const std::uint32_t N = 3, IC = 4, OC = 5;
  const std::vector<float> dout0 = values(N * OC, 5), in0 = values(N * IC, 6), w0 = values(OC * IC, 7),
                           din0 = values(N * IC, 8);
  for (bool add : {false, true}) {
    CAPTURE(add);
    rig r;
    const ex::operand din = r.put(din0), dw = r.put(std::vector<float>(OC * IC, 0.5f)), db = r.put(std::vector<float>(OC, 0.25f)),
                      dout = r.put(dout0), in = r.put(in0), w = r.put(w0);
    r.begin();
    ops::linear_bwd op{din, dw, db, dout, in, w, N, IC, OC};
    op.add_din = add;
    r(op);
    r.end();
    std::vector<float> product(N * IC), dw_want(OC * IC, 0.5f), db_want(OC, 0.25f);
    cpu::linear_backward(product.data(), dw_want.data(), db_want.data(), dout0.data(), in0.data(), w0.data(), N, IC, OC);
    std::vector<float> want = product;
    if (add)
      for (std::size_t i = 0; i < want.size(); ++i) want[i] = din0[i] + product[i];  // one rounding of old + Σ
    CHECK(same_bits(r.get(din), want));
    CHECK(same_bits(r.get(dw), dw_want));
    CHECK(same_bits(r.get(db), db_want));
    for (std::size_t n = 0; n < N; ++n)
      for (std::size_t i = 0; i < IC; ++i) {
        double v = add ? din0[n * IC + i] : 0.0;
        for (std::size_t o = 0; o < OC; ++o) v += double(dout0[n * OC + o]) * w0[o * IC + i];
        CHECK(want[n * IC + i] == doctest::Approx(v).epsilon(1e-5).scale(1.0));
      }
    CHECK(r.meter->high_water() == r.top);
  }
}

TEST_CASE("conv1d forward and backward are backend/cpu/conv1d.hpp's") {
  for (std::uint32_t K : {3u, 4u}) {
    CAPTURE(K);
    const std::uint32_t B = 2, S = 5, IC = 3, OC = 4;
    const cpu::conv1d_shape sh{B, S, IC, OC, K};
    const std::vector<float> in0 = values(B * S * IC, 9), w0 = values(OC * IC * K, 10), b0 = values(OC, 11),
                             dout0 = values(B * S * OC, 12), dw0 = values(OC * IC * K, 13), db0 = values(OC, 14);
    rig r;
    const ex::operand out = r.alloc(B * S * OC), in = r.put(in0), w = r.put(w0), bias = r.put(b0), din = r.alloc(B * S * IC),
                      dw = r.put(dw0), db = r.put(db0), dout = r.put(dout0);
    r.begin();
    r(ops::conv1d_fwd{out, in, w, bias, B, S, IC, OC, K});
    r(ops::conv1d_bwd{din, dw, db, dout, in, w, B, S, IC, OC, K});
    CHECK_THROWS_AS(r(ops::conv1d_fwd{out, in, w, bias, B, S, IC + 1, OC, K}), std::invalid_argument);
    r.end();
    std::vector<float> out_want(B * S * OC), din_want(B * S * IC), dw_want = dw0, db_want = db0;
    cpu::conv1d_forward(out_want.data(), in0.data(), w0.data(), b0.data(), sh);
    cpu::conv1d_backward(din_want.data(), dw_want.data(), db_want.data(), dout0.data(), in0.data(), w0.data(), sh);
    CHECK(same_bits(r.get(out), out_want));
    CHECK(same_bits(r.get(din), din_want));
    CHECK(same_bits(r.get(dw), dw_want));
    CHECK(same_bits(r.get(db), db_want));
    CHECK(r.meter->high_water() == r.top);
  }
}

TEST_CASE("batchnorm forward and backward with a mask: statistics recomputed from the input") {
  const std::uint32_t N = 7, C = 3;
  rig r(0, N);
  r.masks = {1, 1, 0, 1, 1, 0, 1};
  const std::vector<float> in0 = values(N * C, 15), g0 = values(C, 16), be0 = values(C, 17), dout0 = values(N * C, 18),
                           dg0 = values(C, 19), dbe0 = values(C, 20);
  const ex::operand ln_out = r.alloc(N * C);  // below the others: the meter's top is batch norm's
  const ex::operand out = r.alloc(N * C), in = r.put(in0), gamma = r.put(g0), beta = r.put(be0), dg = r.put(dg0),
                    dbe = r.put(dbe0), dout = r.put(dout0);
  r.begin();
  r(ops::batchnorm_fwd{out, in, gamma, beta, msk(0, N), N, C});
  r(ops::norm_fwd{ln_out, in, gamma, beta, N, C, false, 1e-5});  // the LayerNorm scratch in between must not matter
  r(ops::batchnorm_bwd{dout, dg, dbe, dout, in, gamma, msk(0, N), N, C});  // din over dout
  r.end();
  std::vector<float> out_want(N * C), mean(C), rstd(C), din_want(N * C), dg_want = dg0, dbe_want = dbe0;
  cpu::batchnorm_forward(out_want.data(), mean.data(), rstd.data(), in0.data(), g0.data(), be0.data(), r.masks.data(), N, C);
  cpu::batchnorm_backward(din_want.data(), dg_want.data(), dbe_want.data(), dout0.data(), in0.data(), g0.data(), mean.data(),
                          rstd.data(), r.masks.data(), N, C);
  CHECK(same_bits(r.get(out), out_want));
  CHECK(same_bits(r.get(dout), din_want));
  CHECK(same_bits(r.get(dg), dg_want));
  CHECK(same_bits(r.get(dbe), dbe_want));
  // The formula: real rows normalised over the real rows only, padded ones 0.
  for (std::size_t c = 0; c < C; ++c) {
    double mu = 0, var = 0, M = 0;
    for (std::size_t n = 0; n < N; ++n)
      if (r.masks[n]) mu += in0[n * C + c], M += 1;
    mu /= M;
    for (std::size_t n = 0; n < N; ++n)
      if (r.masks[n]) var += (in0[n * C + c] - mu) * (in0[n * C + c] - mu);
    var /= M;
    for (std::size_t n = 0; n < N; ++n) {
      const double want = r.masks[n] ? (in0[n * C + c] - mu) / std::sqrt(var + 1e-5) * g0[c] + be0[c] : 0.0;
      CHECK(out_want[n * C + c] == doctest::Approx(want).epsilon(1e-5).scale(1.0));
    }
  }
  CHECK(r.meter->high_water() == r.top);
}

TEST_CASE("masked attention: fused self-attention and cross-attention, naive and flash, with a key mask") {
  const std::uint32_t B = 2, H = 4, Hkv = 2, D = 3;
  for (bool fused : {false, true})
    for (bool flash : {false, true})
      for (bool causal : {false, true}) {
        if (causal && !fused) continue;  // cross-attention is never causal
        CAPTURE(fused);
        CAPTURE(flash);
        CAPTURE(causal);
        const std::uint32_t Sq = fused ? 5 : 4, Sk = 5;
        ops::xattn_shape sh{B, Sq, Sk, H, Hkv, D, causal, flash, fused};
        // Batch 0 keeps keys 0, 1, 3; batch 1 all but the last. The mask lies after 3 other entries.
        rig r(0, 3 + B * Sk);
        r.masks = {1, 1, 1, /* keys */ 1, 1, 0, 1, 0, /* */ 1, 1, 1, 1, 0};
        const std::uint8_t* km = r.masks.data() + 3;
        const std::size_t qkv_w = (H + 2 * Hkv) * D;
        const std::vector<float> q0 = values(fused ? B * Sq * qkv_w : B * Sq * H * D, 21),
                                 kv0 = fused ? q0 : values(B * Sk * 2 * Hkv * D, 22), dout0 = values(B * Sq * H * D, 23);
        const ex::operand q = r.put(q0), kv = fused ? q : r.put(kv0), out = r.alloc(B * Sq * H * D),
                          stat = r.alloc(flash ? B * H * Sq : std::size_t{B} * H * Sq * Sk), dout = r.put(dout0),
                          dq = r.alloc(q0.size()), dkv = fused ? dq : r.alloc(kv0.size());
        r.begin();
        r(ops::masked_attention_fwd{out, stat, q, kv, msk(3, B * Sk), sh});
        r(ops::masked_attention_bwd{dq, dkv, dout, q, kv, out, stat, msk(3, B * Sk), sh});
        CHECK_THROWS_AS(r(ops::masked_attention_fwd{out, stat, q, kv, msk(4, B * Sk), sh}), std::invalid_argument);
        r.end();
        const std::vector<float> got_out = r.get(out), got_dq = r.get(dq), got_dkv = r.get(dkv);

        // Against the double-precision reference.
        const ref_attention ref = fused ? ref_attention{B, Sq, Sk, H, Hkv, D, causal, km, qkv_w, 0, qkv_w, H * D, (H + Hkv) * D}
                                        : ref_attention{B, Sq, Sk, H, Hkv, D, false, km, H * D, 0, 2 * Hkv * D, 0, Hkv * D};
        check_close(got_out, ref.forward(q0, kv0), 1e-5);
        std::vector<double> rdq(q0.size(), 0.0), rdkv(kv0.size(), 0.0);
        ref.backward(rdq, fused ? rdq : rdkv, dout0, q0, kv0);
        check_close(got_dq, rdq, 1e-5);
        if (!fused) check_close(got_dkv, rdkv, 1e-5);
        if (fused) {  // the padded keys of batch 0 (rows 2 and 4) get no key or value gradient
          for (std::size_t j : {2u, 4u})
            for (std::size_t c = H * D; c < qkv_w; ++c) CHECK(got_dq[j * qkv_w + c] == 0.0f);
        }

        // Against the kernels' own entry points.
        if (!fused) {
          const cpu::cross_attention_shape cs{B, Sq, Sk, H, Hkv, D};
          std::vector<float> o(B * Sq * H * D), st(r.get(stat).size()), g_q(q0.size()), g_kv(kv0.size());
          if (flash) {
            cpu::cross_attention_flash_forward(o.data(), st.data(), q0.data(), kv0.data(), km, cs);
            cpu::cross_attention_flash_backward(g_q.data(), g_kv.data(), dout0.data(), q0.data(), kv0.data(), o.data(), st.data(),
                                                km, cs);
          } else {
            cpu::cross_attention_naive_forward(o.data(), st.data(), q0.data(), kv0.data(), km, cs);
            cpu::cross_attention_naive_backward(g_q.data(), g_kv.data(), dout0.data(), q0.data(), kv0.data(), st.data(), km, cs);
          }
          CHECK(same_bits(got_out, o));
          CHECK(same_bits(r.get(stat), st));
          CHECK(same_bits(got_dq, g_q));
          CHECK(same_bits(got_dkv, g_kv));
        }
        CHECK(r.meter->high_water() == r.top);
      }
}

TEST_CASE("masked attention, fused without a key mask, is the self-attention kernels'") {
  const std::uint32_t B = 2, S = 6, H = 2, Hkv = 1, D = 4;
  const cpu::attention_shape ash{B, S, H, Hkv, D, true};
  for (bool flash : {false, true}) {
    CAPTURE(flash);
    rig r;
    const std::vector<float> qkv0 = values(B * S * ash.qkv_width(), 24), dout0 = values(B * S * H * D, 25);
    const ex::operand qkv = r.put(qkv0), out = r.alloc(B * S * H * D), stat = r.alloc(flash ? B * H * S : B * H * S * S),
                      dout = r.put(dout0), dqkv = r.alloc(qkv0.size());
    const ops::xattn_shape sh{B, S, S, H, Hkv, D, true, flash, true};
    r.begin();
    r(ops::masked_attention_fwd{out, stat, qkv, qkv, {}, sh});
    r(ops::masked_attention_bwd{dqkv, dqkv, dout, qkv, qkv, out, stat, {}, sh});
    CHECK_THROWS_AS(r(ops::masked_attention_fwd{out, stat, qkv, dout, {}, sh}), std::invalid_argument);  // fused: one qkv
    r.end();
    std::vector<float> o(B * S * H * D), st(r.get(stat).size()), g(qkv0.size());
    if (flash) {
      cpu::attention_flash_forward(o.data(), st.data(), qkv0.data(), ash);
      cpu::attention_flash_backward(g.data(), dout0.data(), qkv0.data(), o.data(), st.data(), ash);
    } else {
      cpu::attention_naive_forward(o.data(), st.data(), qkv0.data(), ash);
      cpu::attention_naive_backward(g.data(), dout0.data(), qkv0.data(), st.data(), ash);
    }
    CHECK(same_bits(r.get(out), o));
    CHECK(same_bits(r.get(stat), st));
    CHECK(same_bits(r.get(dqkv), g));
  }
}

TEST_CASE("mel_loss: masked L1 / MSE over a fixed divisor, with the loss scale and grad_accum") {
  const std::uint32_t N = 6, M = 3, grad_accum = 2;
  for (bool l1 : {true, false})
    for (std::uint32_t ld : {M, M + 1})
      for (bool scaling : {false, true}) {
        CAPTURE(l1);
        CAPTURE(ld);
        CAPTURE(scaling);
        rig r(N * M, N, 1, scaling);
        r.features = values(N * M, 26);
        r.masks = {1, 1, 0, 1, 0, 1};
        const std::vector<float> pred0 = values(N * ld, 27);
        const ex::operand pred = r.put(pred0), grad = ld == M ? pred : r.alloc(N * M);  // in place when contiguous
        const float divisor = 24.0f;  // the padded micro-batch's count, not the real 12
        r.begin();
        const double dloss = double(r.s.loss_scale) / grad_accum;
        if (scaling) CHECK(r.s.loss_scale > 1.0f);
        ops::mel_loss op{pred, feat(0, N * M), msk(0, N), grad, N, M, ld, grad_accum, l1, divisor};
        r(op);
        const float loss = r.end();
        double want = 0;
        std::vector<double> g(N * M, 0.0);
        for (std::size_t n = 0; n < N; ++n)
          for (std::size_t c = 0; c < M; ++c) {
            if (!r.masks[n]) continue;
            const double d = double(pred0[n * ld + c]) - r.features[n * M + c];
            want += l1 ? std::abs(d) : d * d;
            g[n * M + c] = dloss * (l1 ? (d > 0) - (d < 0) : 2 * d) / divisor;
          }
        CHECK(loss == doctest::Approx(want / divisor).epsilon(1e-6));
        check_close(r.get(grad), g, 1e-6);
        CHECK(r.meter->high_water() == r.top);
      }
  // No real frame: loss 0 and a zero gradient.
  rig r(4, 2);
  r.features = values(4, 28);
  r.masks = {0, 0};
  const ex::operand pred = r.put(values(4, 29));
  r.begin();
  r(ops::mel_loss{pred, feat(0, 4), msk(0, 2), pred, 2, 2, 2, 1, false, 4.0f});
  CHECK(r.end() == 0.0f);
  CHECK(r.get(pred) == std::vector<float>(4, 0.0f));
}

TEST_CASE("stop_loss: BCE with logits over every frame, strided logits, a fixed divisor") {
  const std::uint32_t N = 7, ld = 4, grad_accum = 3;
  rig r(2 * N, 0, 1, true);
  std::vector<float> f(2 * N);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = i % 3 == 0 ? 1.0f : 0.0f;
  r.features = f;
  std::vector<float> logits0 = values(N * ld, 30);
  for (float& x : logits0) x *= 6.0f;  // both tails of the softplus
  const ex::operand logits = r.put(logits0);
  const float divisor = 10.0f;
  r.begin();
  const double dloss = double(r.s.loss_scale) / grad_accum;
  r(ops::stop_loss{logits, feat(N, N), logits, N, ld, grad_accum, divisor});  // targets: the second block
  const float loss = r.end();
  const std::vector<float> got = r.get(logits);
  double want = 0;
  for (std::size_t n = 0; n < N; ++n) {
    const double x = logits0[n * ld], y = f[N + n];
    want += std::max(x, 0.0) - x * y + std::log1p(std::exp(-std::abs(x)));
    CHECK(got[n * ld] == doctest::Approx(dloss * (1 / (1 + std::exp(-x)) - y) / divisor).epsilon(1e-5));
    for (std::size_t c = 1; c < ld; ++c) CHECK(got[n * ld + c] == logits0[n * ld + c]);  // other columns untouched
  }
  CHECK(loss == doctest::Approx(want / divisor).epsilon(1e-6));
  CHECK(r.meter->high_water() == r.top);
}

TEST_CASE_TEMPLATE("16-bit storage: frames_in rounds the fp32 features, the losses read them in fp32", T, m::bf16, m::fp16) {
  const std::uint32_t N = 6, M = 4;
  rig_t<T> r(N * M, N, 1);
  r.features = values(N * M, 31);
  r.masks = {1, 0, 1, 1, 1, 0};
  const ex::operand frames = r.alloc(N * M);
  const std::vector<float> pred0 = rounded<T>(values(N * M, 32));
  const ex::operand pred = r.put(pred0);
  r.begin();
  r(ops::frames_in{frames, feat(0, N * M), 2, 3, M, 1});
  r(ops::mel_loss{pred, feat(0, N * M), msk(0, N), pred, N, M, M, 1, false, 48.0f});
  const float loss = r.end();
  const std::vector<float> got = r.get(frames), want = rounded<T>(r.features), grad = r.get(pred);
  double sum = 0;
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t t = 0; t < 3; ++t)
      for (std::size_t c = 0; c < M; ++c)
        CHECK(got[(b * 3 + t) * M + c] == (t == 0 ? 0.0f : want[(b * 3 + t - 1) * M + c]));
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t c = 0; c < M; ++c) {
      const double d = double(pred0[n * M + c]) - r.features[n * M + c];  // the target unrounded
      if (r.masks[n]) sum += d * d;
      CHECK(grad[n * M + c] == doctest::Approx(r.masks[n] ? 2 * d / 48.0 : 0.0).epsilon(1e-2).scale(1e-3));
    }
  CHECK(loss == doctest::Approx(sum / 48.0).epsilon(1e-6));
  CHECK(r.meter->high_water() == r.top);
}

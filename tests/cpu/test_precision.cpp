// SPDX-License-Identifier: BSL-1.0
// 16-bit storage paths against the fp32 path.
//
// Inputs are first rounded to the 16-bit type and the fp32 path is fed the same (exactly widened)
// values, so the two paths differ only by how results are stored:
//  * a single kernel accumulates in float and rounds its result once, so its bf16/fp16 output is
//    the fp32 output rounded to nearest: we require at most 1 ulp of the 16-bit type between the
//    16-bit result and round(fp32 result) (0 ulp in practice; 1 ulp leaves room for a compiler
//    that contracts a*b+c differently in the two instantiations).
//  * a small model (embedding → layernorm → qkv linear → flash attention → linear → gelu →
//    tied output layer + CE, forward and backward) stores ~10 intermediates in the 16-bit type. Each
//    store adds a relative error of at most u (bf16: u = 2^-8 ≈ 3.9e-3; fp16: u = 2^-11 ≈ 4.9e-4),
//    so we require a loss within 10u relative and gradients within 10u in the relative 2-norm
//    ‖g16 − g32‖ / ‖g32‖.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "memalg/backend/cpu/cpu.hpp"
#include "test_util.hpp"

namespace cpu = memalg::backend::cpu;
using namespace memalg_test;
using memalg::bf16;
using memalg::fp16;

namespace {

int ordered(std::uint16_t b) { return (b & 0x8000u) ? -static_cast<int>(b & 0x7fffu) : static_cast<int>(b); }

/// Largest ulp distance between a 16-bit result and the fp32 result rounded to the 16-bit type.
template <class H>
int max_ulps(const std::vector<H>& h, const std::vector<float>& f) {
  REQUIRE(h.size() == f.size());
  int worst = 0;
  for (std::size_t i = 0; i < h.size(); ++i)
    worst = std::max(worst, std::abs(ordered(h[i].bits) - ordered(memalg::from_float<H>(f[i]).bits)));
  return worst;
}

/// Round-trips double data through H, so both paths see the same values.
template <class H>
std::pair<std::vector<H>, std::vector<float>> same_data(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  auto h = cast<H>(randn(n, seed, scale));
  return {h, widen(h)};
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

template <class H>
constexpr double unit_roundoff = std::is_same_v<H, bf16> ? 0x1p-8 : 0x1p-11;

}  // namespace

TEST_CASE_TEMPLATE("single kernels: 16-bit result is the fp32 result rounded once", H, bf16, fp16) {
  const std::size_t N = 6, C = 8, OC = 5, F = 4, V = 11;

  SUBCASE("linear") {
    auto [x, xf] = same_data<H>(N * C, 1);
    auto [W, Wf] = same_data<H>(OC * C, 2);
    auto [b, bf] = same_data<H>(OC, 3);
    auto [dy, dyf] = same_data<H>(N * OC, 4);
    auto [dW, dWf] = same_data<H>(OC * C, 5);
    auto [db, dbf] = same_data<H>(OC, 6);
    std::vector<H> y(N * OC), dx(N * C);
    std::vector<float> yf(N * OC), dxf(N * C);
    cpu::linear_forward(y.data(), x.data(), W.data(), b.data(), N, C, OC);
    cpu::linear_forward(yf.data(), xf.data(), Wf.data(), bf.data(), N, C, OC);
    CHECK(max_ulps(y, yf) <= 1);
    cpu::linear_backward(dx.data(), dW.data(), db.data(), dy.data(), x.data(), W.data(), N, C, OC);
    cpu::linear_backward(dxf.data(), dWf.data(), dbf.data(), dyf.data(), xf.data(), Wf.data(), N, C, OC);
    CHECK(max_ulps(dx, dxf) <= 1);
    CHECK(max_ulps(dW, dWf) <= 1);
    CHECK(max_ulps(db, dbf) <= 1);
  }
  SUBCASE("layernorm and rmsnorm") {
    auto [x, xf] = same_data<H>(N * C, 1, 3.0);
    auto [w, wf] = same_data<H>(C, 2);
    auto [b, bf] = same_data<H>(C, 3);
    auto [dy, dyf] = same_data<H>(N * C, 4);
    std::vector<H> y(N * C), dx(N * C), dw(C), db(C);
    std::vector<float> yf(N * C), dxf(N * C), dwf(C), dbf(C), mean(N), rstd(N), meanf(N), rstdf(N);
    cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5);
    cpu::layernorm_forward(yf.data(), meanf.data(), rstdf.data(), xf.data(), wf.data(), bf.data(), N, C, 1e-5);
    CHECK(max_ulps(y, yf) <= 1);
    CHECK(mean == meanf);
    CHECK(rstd == rstdf);
    cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
    cpu::layernorm_backward(dxf.data(), dwf.data(), dbf.data(), dyf.data(), xf.data(), wf.data(), meanf.data(), rstdf.data(), N, C);
    CHECK(max_ulps(dx, dxf) <= 1);
    CHECK(max_ulps(dw, dwf) <= 1);
    CHECK(max_ulps(db, dbf) <= 1);
    cpu::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6);
    cpu::rmsnorm_forward(yf.data(), rstdf.data(), xf.data(), wf.data(), N, C, 1e-6);
    CHECK(max_ulps(y, yf) <= 1);
    // dw accumulates: restart both paths from the same (zero) gradient.
    std::fill(dw.begin(), dw.end(), memalg::from_float<H>(0.0f));
    std::fill(dwf.begin(), dwf.end(), 0.0f);
    cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
    cpu::rmsnorm_backward(dxf.data(), dwf.data(), dyf.data(), xf.data(), wf.data(), rstdf.data(), N, C);
    CHECK(max_ulps(dx, dxf) <= 1);
    CHECK(max_ulps(dw, dwf) <= 1);
  }
  SUBCASE("gelu, swiglu, dropout") {
    auto [x, xf] = same_data<H>(N * 2 * F, 1, 2.0);
    auto [dy, dyf] = same_data<H>(N * 2 * F, 2);
    std::vector<H> y(N * 2 * F), dx(N * 2 * F);
    std::vector<float> yf(N * 2 * F), dxf(N * 2 * F);
    cpu::gelu_forward(y.data(), x.data(), y.size());
    cpu::gelu_forward(yf.data(), xf.data(), yf.size());
    CHECK(max_ulps(y, yf) <= 1);
    cpu::gelu_backward(dx.data(), dy.data(), x.data(), dx.size());
    cpu::gelu_backward(dxf.data(), dyf.data(), xf.data(), dxf.size());
    CHECK(max_ulps(dx, dxf) <= 1);
    y.resize(N * F);
    yf.resize(N * F);
    cpu::swiglu_forward(y.data(), x.data(), N, F);
    cpu::swiglu_forward(yf.data(), xf.data(), N, F);
    CHECK(max_ulps(y, yf) <= 1);
    cpu::swiglu_backward(dx.data(), dy.data(), x.data(), N, F);
    cpu::swiglu_backward(dxf.data(), dyf.data(), xf.data(), N, F);
    CHECK(max_ulps(dx, dxf) <= 1);
    std::vector<std::uint8_t> mask(N * F), maskf(N * F);
    cpu::dropout_forward(y.data(), mask.data(), x.data(), N * F, 0.25f, 9);
    cpu::dropout_forward(yf.data(), maskf.data(), xf.data(), N * F, 0.25f, 9);
    CHECK(mask == maskf);
    CHECK(max_ulps(y, yf) <= 1);
  }
  SUBCASE("attention forward, cross-entropy, embedding") {
    const cpu::attention_shape sh{2, 5, 4, 2, 4, true};
    auto [qkv, qkvf] = same_data<H>(sh.rows() * sh.qkv_width(), 1);
    std::vector<H> o(sh.rows() * sh.out_width()), att(sh.B * sh.H * sh.S * sh.S);
    std::vector<float> of(o.size()), attf(att.size()), lse(sh.B * sh.H * sh.S), lsef(lse.size());
    cpu::attention_naive_forward(o.data(), att.data(), qkv.data(), sh);
    cpu::attention_naive_forward(of.data(), attf.data(), qkvf.data(), sh);
    CHECK(max_ulps(o, of) <= 1);
    CHECK(max_ulps(att, attf) <= 1);
    cpu::attention_flash_forward(o.data(), lse.data(), qkv.data(), sh, 2);
    cpu::attention_flash_forward(of.data(), lsef.data(), qkvf.data(), sh, 2);
    CHECK(max_ulps(o, of) <= 1);
    CHECK(lse == lsef);

    auto [logits, logitsf] = same_data<H>(N * V, 2, 2.0);
    const auto tgt = randint(N, static_cast<std::int32_t>(V), 3);
    std::vector<float> loss(N), lossf(N);
    CHECK(cpu::cross_entropy_forward(loss.data(), logits.data(), tgt.data(), N, V) ==
          cpu::cross_entropy_forward(lossf.data(), logitsf.data(), tgt.data(), N, V));
    std::vector<H> dl(N * V);
    std::vector<float> dlf(N * V);
    cpu::cross_entropy_backward(dl.data(), logits.data(), tgt.data(), 1.0f, N, V);
    cpu::cross_entropy_backward(dlf.data(), logitsf.data(), tgt.data(), 1.0f, N, V);
    CHECK(max_ulps(dl, dlf) <= 1);

    auto [wte, wtef] = same_data<H>(V * C, 4);
    auto [dy, dyf] = same_data<H>(N * C, 5);
    std::vector<H> e(N * C), dwte(V * C, memalg::from_float<H>(0.5f));
    std::vector<float> ef(N * C), dwtef(V * C, 0.5f);
    const std::vector<std::int32_t> tok = {3, 3, 1, 3, 0, 1};
    cpu::embedding_forward(e.data(), tok.data(), wte.data(), static_cast<const H*>(nullptr), 2, 3, C);
    cpu::embedding_forward(ef.data(), tok.data(), wtef.data(), static_cast<const float*>(nullptr), 2, 3, C);
    CHECK(max_ulps(e, ef) <= 1);
    cpu::embedding_backward(dwte.data(), static_cast<H*>(nullptr), dy.data(), tok.data(), 2, 3, C);
    cpu::embedding_backward(dwtef.data(), static_cast<float*>(nullptr), dyf.data(), tok.data(), 2, 3, C);
    CHECK(max_ulps(dwte, dwtef) <= 1);
  }
}

namespace {

struct pipeline_result {
  float loss;
  std::vector<float> dwte, dwqkv, dwo, dlnw, dlnb;
};

/// A one-block model, forward and backward, entirely in storage type T.
template <class T>
pipeline_result run_pipeline(const std::vector<T>& wte, const std::vector<T>& lnw, const std::vector<T>& lnb,
                             const std::vector<T>& wqkv, const std::vector<T>& wo,
                             const std::vector<std::int32_t>& tok, const std::vector<std::int32_t>& tgt,
                             const cpu::attention_shape& sh, std::size_t C, std::size_t V) {
  const std::size_t N = sh.rows(), Q = sh.qkv_width(), O = sh.out_width();
  std::vector<T> x(N * C), ln(N * C), qkv(N * Q), att(N * O), h(N * C), g(N * C);
  std::vector<float> mean(N), rstd(N), lse(sh.B * sh.H * sh.S), loss(N);
  cpu::embedding_forward(x.data(), tok.data(), wte.data(), static_cast<const T*>(nullptr), sh.B, sh.S, C);
  cpu::layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), lnw.data(), lnb.data(), N, C, 1e-5);
  cpu::linear_forward(qkv.data(), ln.data(), wqkv.data(), static_cast<const T*>(nullptr), N, C, Q);
  cpu::attention_flash_forward(att.data(), lse.data(), qkv.data(), sh, 4);
  cpu::linear_forward(h.data(), att.data(), wo.data(), static_cast<const T*>(nullptr), N, O, C);
  cpu::gelu_forward(g.data(), h.data(), N * C);
  std::vector<T> logits(N * V);  // the tied output layer and the loss, as the step program runs them
  cpu::linear_forward(logits.data(), g.data(), wte.data(), static_cast<const T*>(nullptr), N, C, V);
  const float L = cpu::cross_entropy_forward(loss.data(), logits.data(), tgt.data(), N, V);

  const T zero = memalg::from_float<T>(0.0f);
  std::vector<T> dwte(V * C, zero), dwqkv(Q * C, zero), dwo(C * O, zero), dlnw(C, zero), dlnb(C, zero);
  std::vector<T> dg(N * C), dh(N * C), datt(N * O), dqkv(N * Q), dln(N * C), dx(N * C);
  cpu::cross_entropy_backward(logits.data(), logits.data(), tgt.data(), 1.0f, N, V);  // in place
  cpu::linear_backward(dg.data(), dwte.data(), static_cast<T*>(nullptr), logits.data(), g.data(), wte.data(), N, C, V);
  cpu::gelu_backward(dh.data(), dg.data(), h.data(), N * C);
  cpu::linear_backward(datt.data(), dwo.data(), static_cast<T*>(nullptr), dh.data(), att.data(), wo.data(), N, O, C);
  cpu::attention_flash_backward(dqkv.data(), datt.data(), qkv.data(), att.data(), lse.data(), sh, 4);
  cpu::linear_backward(dln.data(), dwqkv.data(), static_cast<T*>(nullptr), dqkv.data(), ln.data(), wqkv.data(), N, C, Q);
  cpu::layernorm_backward(dx.data(), dlnw.data(), dlnb.data(), dln.data(), x.data(), lnw.data(), mean.data(),
                          rstd.data(), N, C);
  cpu::embedding_backward(dwte.data(), static_cast<T*>(nullptr), dx.data(), tok.data(), sh.B, sh.S, C);
  return {L, widen(dwte), widen(dwqkv), widen(dwo), widen(dlnw), widen(dlnb)};
}

}  // namespace

TEST_CASE_TEMPLATE("small model: 16-bit path within 10u of the fp32 path", H, bf16, fp16) {
  const cpu::attention_shape sh{2, 8, 4, 2, 4, true};
  const std::size_t C = 16, V = 23;
  const auto tok = randint(sh.rows(), static_cast<std::int32_t>(V), 1);
  const auto tgt = randint(sh.rows(), static_cast<std::int32_t>(V), 2);
  auto [wte, wtef] = same_data<H>(V * C, 3);
  auto [lnw, lnwf] = same_data<H>(C, 4);
  auto [lnb, lnbf] = same_data<H>(C, 5, 0.1);
  auto [wqkv, wqkvf] = same_data<H>(sh.qkv_width() * C, 6, 0.5);
  auto [wo, wof] = same_data<H>(C * sh.out_width(), 7, 0.5);

  const auto r16 = run_pipeline(wte, lnw, lnb, wqkv, wo, tok, tgt, sh, C, V);
  const auto r32 = run_pipeline(wtef, lnwf, lnbf, wqkvf, wof, tok, tgt, sh, C, V);
  const double tol = 10 * unit_roundoff<H>;
  const double loss_err = std::abs(double(r16.loss) - r32.loss) / std::abs(double(r32.loss));
  const double e_wte = rel_l2(r16.dwte, r32.dwte), e_wqkv = rel_l2(r16.dwqkv, r32.dwqkv),
               e_wo = rel_l2(r16.dwo, r32.dwo), e_lnw = rel_l2(r16.dlnw, r32.dlnw), e_lnb = rel_l2(r16.dlnb, r32.dlnb);
  MESSAGE("relative errors (tol " << tol << "): loss " << loss_err << ", dwte " << e_wte << ", dwqkv " << e_wqkv
                                  << ", dwo " << e_wo << ", dlnw " << e_lnw << ", dlnb " << e_lnb);
  CHECK(loss_err <= tol);
  CHECK(e_wte <= tol);
  CHECK(e_wqkv <= tol);
  CHECK(e_wo <= tol);
  CHECK(e_lnw <= tol);
  CHECK(e_lnb <= tol);
}

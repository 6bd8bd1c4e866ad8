// SPDX-License-Identifier: BSL-1.0
// GPU tests of layernorm.cuh, rmsnorm.cuh, qk_norm.cuh and embedding.cuh against the CPU reference (in double).
#include <doctest/doctest.h>

#include <vector>

#include "gpu_test_util.hpp"
#include "memalg/backend/cpu/embedding.hpp"
#include "memalg/backend/cpu/layernorm.hpp"
#include "memalg/backend/cpu/qk_norm.hpp"
#include "memalg/backend/cpu/rmsnorm.hpp"
#include "memalg/backend/cuda/embedding.cuh"
#include "memalg/backend/cuda/layernorm.cuh"
#include "memalg/backend/cuda/qk_norm.cuh"
#include "memalg/backend/cuda/rmsnorm.cuh"

using namespace gpu_test;
namespace cpu = memalg::backend::cpu;

// Saved statistics are float on the GPU whatever T is; they are checked at fp32 tolerance.
constexpr double stats_tolerance = 1e-5;

TEST_CASE_TEMPLATE("layernorm: forward and backward match the CPU reference", T, float, cu::bf16, cu::fp16) {
  const std::int64_t N = 37, C = 200;
  const auto in = random_values<T>(N * C, -1.5f, 2.5f, 1);
  const auto w = random_values<T>(C, 0.5f, 1.5f, 2);
  const auto b = random_values<T>(C, -0.5f, 0.5f, 3);
  const auto dout = random_values<T>(N * C, -1, 1, 4);
  const auto dw0 = random_values<T>(C, -1, 1, 5);
  const auto db0 = random_values<T>(C, -1, 1, 6);
  const auto r_in = to_double(in), r_w = to_double(w), r_b = to_double(b), r_dout = to_double(dout);

  std::vector<double> r_out(N * C), r_mean(N), r_rstd(N), r_din(N * C), r_dw = to_double(dw0), r_db = to_double(db0);
  cpu::layernorm_forward(r_out.data(), r_mean.data(), r_rstd.data(), r_in.data(), r_w.data(), r_b.data(), N, C, 1e-5);
  cpu::layernorm_backward(r_din.data(), r_dw.data(), r_db.data(), r_dout.data(), r_in.data(), r_w.data(),
                          r_mean.data(), r_rstd.data(), N, C);

  dbuf<T> d_in(in), d_w(w), d_b(b), d_out(N * C), d_dout(dout), d_din(N * C), d_dw(dw0), d_db(db0);
  dbuf<float> d_mean(N), d_rstd(N);
  cu::layernorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_in.get(), d_w.get(), d_b.get(), N, C, 1e-5f);
  check_close<T>("out", d_out.download(), r_out);
  check_close<T>("mean", d_mean.download(), r_mean, stats_tolerance);
  check_close<T>("rstd", d_rstd.download(), r_rstd, stats_tolerance);
  {  // the statistics alone (a backward that recomputes them): the forward's bits
    dbuf<float> s_mean(N), s_rstd(N);
    cu::layernorm_stats(s_mean.get(), s_rstd.get(), d_in.get(), N, C, 1e-5f);
    CHECK(s_mean.download() == d_mean.download());
    CHECK(s_rstd.download() == d_rstd.download());
  }
  cu::layernorm_backward(d_din.get(), d_dw.get(), d_db.get(), d_dout.get(), d_in.get(), d_w.get(), d_mean.get(),
                         d_rstd.get(), N, C);
  check_close<T>("din", d_din.download(), r_din);
  check_close<T>("dw", d_dw.download(), r_dw);
  check_close<T>("db", d_db.download(), r_db);
}

TEST_CASE_TEMPLATE("rmsnorm: forward and backward match the CPU reference", T, float, cu::bf16, cu::fp16) {
  const std::int64_t N = 29, C = 136;
  const auto in = random_values<T>(N * C, -2, 2, 11);
  const auto w = random_values<T>(C, 0.5f, 1.5f, 12);
  const auto dout = random_values<T>(N * C, -1, 1, 13);
  const auto dw0 = random_values<T>(C, -1, 1, 14);
  const auto r_in = to_double(in), r_w = to_double(w), r_dout = to_double(dout);

  std::vector<double> r_out(N * C), r_rstd(N), r_din(N * C), r_dw = to_double(dw0);
  cpu::rmsnorm_forward(r_out.data(), r_rstd.data(), r_in.data(), r_w.data(), N, C, 1e-6);
  cpu::rmsnorm_backward(r_din.data(), r_dw.data(), r_dout.data(), r_in.data(), r_w.data(), r_rstd.data(), N, C);

  dbuf<T> d_in(in), d_w(w), d_out(N * C), d_dout(dout), d_din(N * C), d_dw(dw0);
  dbuf<float> d_rstd(N);
  cu::rmsnorm_forward(d_out.get(), d_rstd.get(), d_in.get(), d_w.get(), N, C, 1e-6f);
  check_close<T>("out", d_out.download(), r_out);
  check_close<T>("rstd", d_rstd.download(), r_rstd, stats_tolerance);
  {  // rstd alone (a backward that recomputes it): the forward's bits
    dbuf<float> s_rstd(N);
    cu::rmsnorm_stats(s_rstd.get(), d_in.get(), N, C, 1e-6f);
    CHECK(s_rstd.download() == d_rstd.download());
  }
  cu::rmsnorm_backward(d_din.get(), d_dw.get(), d_dout.get(), d_in.get(), d_w.get(), d_rstd.get(), N, C);
  check_close<T>("din", d_din.download(), r_din);
  check_close<T>("dw", d_dw.download(), r_dw);

  // Gemma's RMSNorm: the scale is 1 + w (w_offset 1), the same arithmetic otherwise.
  std::vector<double> o_out(N * C), o_rstd(N), o_din(N * C), o_dw = to_double(dw0);
  cpu::rmsnorm_forward(o_out.data(), o_rstd.data(), r_in.data(), r_w.data(), N, C, 1e-6, 1.0);
  cpu::rmsnorm_backward(o_din.data(), o_dw.data(), r_dout.data(), r_in.data(), r_w.data(), o_rstd.data(), N, C, 1.0);
  dbuf<T> e_out(N * C), e_din(N * C), e_dw(dw0);
  cu::rmsnorm_forward(e_out.get(), d_rstd.get(), d_in.get(), d_w.get(), N, C, 1e-6f, nullptr, 1.0f);
  check_close<T>("out (1 + w)", e_out.download(), o_out);
  cu::rmsnorm_backward(e_din.get(), e_dw.get(), d_dout.get(), d_in.get(), d_w.get(), d_rstd.get(), N, C, nullptr, 1.0f);
  check_close<T>("din (1 + w)", e_din.download(), o_din);
  check_close<T>("dw (1 + w)", e_dw.download(), o_dw);
}

TEST_CASE_TEMPLATE("qk_norm: forward and backward in place on the query and key heads match the CPU reference", T, float,
                   cu::bf16, cu::fp16) {
  // Qwen3-like heads: 4 query heads over 2 key/value heads, 128 wide (wider than a warp).
  const std::int64_t N = 37, H = 4, Hkv = 2, D = 128, row = (H + 2 * Hkv) * D, pre_n = N * (H + Hkv) * D;
  const auto qkv = random_values<T>(N * row, -2, 2, 21);
  const auto wq = random_values<T>(D, 0.5f, 1.5f, 22), wk = random_values<T>(D, 0.5f, 1.5f, 23);
  const auto dqkv = random_values<T>(N * row, -1, 1, 24);
  const auto dwq0 = random_values<T>(D, -1, 1, 25), dwk0 = random_values<T>(D, -1, 1, 26);
  std::vector<double> r_qkv = to_double(qkv), r_pre(pre_n), r_dqkv = to_double(dqkv), r_dwq = to_double(dwq0),
                      r_dwk = to_double(dwk0);
  const std::vector<double> r_wq = to_double(wq), r_wk = to_double(wk);
  cpu::qk_rmsnorm_forward(r_qkv.data(), r_pre.data(), r_wq.data(), r_wk.data(), N, H, Hkv, D, 1e-6);
  cpu::qk_rmsnorm_backward(r_dqkv.data(), r_dwq.data(), r_dwk.data(), r_pre.data(), r_wq.data(), r_wk.data(), N, H, Hkv, D,
                           1e-6);

  dbuf<T> d_qkv(qkv), d_pre(pre_n), d_wq(wq), d_wk(wk), d_dqkv(dqkv), d_dwq(dwq0), d_dwk(dwk0);
  dbuf<float> d_rstd(N * (H + Hkv));
  cu::qk_rmsnorm_forward(d_qkv.get(), d_pre.get(), d_wq.get(), d_wk.get(), N, H, Hkv, D, 1e-6f);
  check_close<T>("qkv", d_qkv.download(), r_qkv);  // the value heads untouched: exactly the input there
  check_close<T>("pre", d_pre.download(), r_pre);
  cu::qk_rmsnorm_backward(d_dqkv.get(), d_dwq.get(), d_dwk.get(), d_pre.get(), d_wq.get(), d_wk.get(), d_rstd.get(), N, H,
                          Hkv, D, 1e-6f);
  check_close<T>("dqkv", d_dqkv.download(), r_dqkv);
  check_close<T>("dwq", d_dwq.download(), r_dwq);
  check_close<T>("dwk", d_dwk.download(), r_dwk);
}

namespace {

template <class T>
void check_embedding(std::int64_t B, std::int64_t S, std::int64_t C, std::int64_t V, bool with_wpe,
                     std::uint32_t seed) {
  CAPTURE(B);
  CAPTURE(S);
  CAPTURE(C);
  CAPTURE(with_wpe);
  const std::int64_t N = B * S;
  auto tokens = random_ints(N, 0, static_cast<std::int32_t>(V - 1), seed);
  for (std::int64_t n = 0; n < N; n += 3) tokens[n] = 7;  // one very frequent token
  const auto wte = random_values<T>(V * C, -1, 1, seed + 1);
  const auto wpe = random_values<T>(S * C, -1, 1, seed + 2);
  const auto dout = random_values<T>(N * C, -1, 1, seed + 3);
  const auto dwte0 = random_values<T>(V * C, -1, 1, seed + 4);
  const auto dwpe0 = random_values<T>(S * C, -1, 1, seed + 5);
  const auto r_wte = to_double(wte), r_wpe = to_double(wpe), r_dout = to_double(dout);

  std::vector<double> r_out(N * C), r_dwte = to_double(dwte0), r_dwpe = to_double(dwpe0);
  const double* r_wpe_p = with_wpe ? r_wpe.data() : nullptr;
  cpu::embedding_forward(r_out.data(), tokens.data(), r_wte.data(), r_wpe_p, B, S, C);
  cpu::embedding_backward(r_dwte.data(), with_wpe ? r_dwpe.data() : nullptr, r_dout.data(), tokens.data(), B, S, C);

  dbuf<T> d_wte(wte), d_wpe(wpe), d_out(N * C), d_dout(dout), d_dwte(dwte0), d_dwpe(dwpe0);
  dbuf<std::int32_t> d_tok(tokens);
  dbuf<unsigned char> workspace(cu::embedding_backward_workspace_bytes(N));
  cu::embedding_forward(d_out.get(), d_tok.get(), d_wte.get(), with_wpe ? d_wpe.get() : nullptr, B, S, C);
  check_close<T>("out", d_out.download(), r_out);
  cu::embedding_backward(d_dwte.get(), with_wpe ? d_dwpe.get() : nullptr, d_dout.get(), d_tok.get(), B, S, C,
                         workspace.get(), workspace.size());
  check_close<T>("dwte", d_dwte.download(), r_dwte);
  if (with_wpe) check_close<T>("dwpe", d_dwpe.download(), r_dwpe);
}

}  // namespace

TEST_CASE_TEMPLATE("embedding: forward and deterministic backward match the CPU reference", T, float, cu::bf16,
                   cu::fp16) {
  check_embedding<T>(3, 17, 72, 50, true, 21);    // vectorised forward
  check_embedding<T>(3, 17, 70, 50, false, 31);   // scalar forward, no positions
  check_embedding<T>(4, 600, 16, 1000, true, 41); // 2400 tokens: multi-block bitonic sort
}

TEST_CASE("embedding: backward is bit-reproducible") {
  const std::int64_t B = 2, S = 700, C = 24, V = 64;
  const auto tokens = random_ints(B * S, 0, V - 1, 51);
  const auto dout = random_values<float>(B * S * C, -1, 1, 52);
  dbuf<std::int32_t> d_tok(tokens);
  dbuf<float> d_dout(dout), d_dwte(V * C);
  dbuf<unsigned char> workspace(cu::embedding_backward_workspace_bytes(B * S));
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    d_dwte.zero();
    cu::embedding_backward(d_dwte.get(), static_cast<float*>(nullptr), d_dout.get(), d_tok.get(), B, S, C,
                           workspace.get(), workspace.size());
    const auto got = d_dwte.download();
    if (run == 0) first = got;
    else CHECK(got == first);
  }
}

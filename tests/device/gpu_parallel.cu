// SPDX-License-Identifier: BSL-1.0
// GPU tests of the tensor- and sequence-parallel kernels the step program's tp plans use, against
// the CPU reference (in double): the vocabulary-parallel lookup (embedding.cuh), position_add,
// the sequence-parallel dropout range (dropout.cuh, masks bit for bit), and the vocabulary-parallel
// cross-entropy (cross_entropy.cuh), its collectives played on the host between the kernels over
// two simulated ranks, also checked against the one-rank cross-entropy of the whole vocabulary.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu_test_util.hpp"
#include "memalg/backend/cpu/cross_entropy.hpp"
#include "memalg/backend/cpu/embedding.hpp"
#include "memalg/backend/cpu/pointwise.hpp"
#include "memalg/backend/cuda/cross_entropy.cuh"
#include "memalg/backend/cuda/dropout.cuh"
#include "memalg/backend/cuda/embedding.cuh"

using namespace gpu_test;
namespace cpu = memalg::backend::cpu;

TEST_CASE_TEMPLATE("vocabulary-parallel embedding: lookup and backward of one rank's rows match the CPU", T, float,
                   cu::bf16, cu::fp16) {
  const std::int64_t N = 45, C = 24, V = 40;
  auto tokens = random_ints(N, 0, V - 1, 51);
  for (std::int64_t n = 0; n < N; n += 4) tokens[n] = 13;  // a frequent token inside the second rank's rows
  const auto wte = random_values<T>(V * C, -1, 1, 52);
  const auto dout = random_values<T>(N * C, -1, 1, 53);
  const std::int64_t rows = V / 2;
  for (const std::int64_t begin : {std::int64_t{0}, rows}) {
    CAPTURE(begin);
    const std::vector<T> part(wte.begin() + begin * C, wte.begin() + (begin + rows) * C);
    const auto dpart0 = random_values<T>(rows * C, -1, 1, 54 + static_cast<std::uint32_t>(begin));
    const auto r_part = to_double(part), r_dout = to_double(dout);
    std::vector<double> r_out(N * C), r_dpart = to_double(dpart0);
    cpu::embedding_forward_vocab_range(r_out.data(), tokens.data(), r_part.data(), begin, rows, N, C);
    cpu::embedding_backward_vocab_range(r_dpart.data(), r_dout.data(), tokens.data(), begin, rows, N, C);
    std::int64_t outside = 0;  // rows the reference zeroes: the kernel must too
    for (std::int64_t n = 0; n < N; ++n) outside += tokens[n] < begin || tokens[n] >= begin + rows;
    REQUIRE(outside > 0);
    REQUIRE(outside < N);

    dbuf<T> d_part(part), d_out(N * C), d_dout(dout), d_dpart(dpart0);
    dbuf<std::int32_t> d_tok(tokens);
    dbuf<unsigned char> workspace(cu::embedding_backward_workspace_bytes(N));
    cu::embedding_forward_vocab_range(d_out.get(), d_tok.get(), d_part.get(), begin, rows, N, C);
    const std::vector<T> out = d_out.download();
    check_close<T>("out", out, r_out);
    for (std::int64_t n = 0; n < N; ++n)
      if (tokens[n] < begin || tokens[n] >= begin + rows) CHECK(cu::to_float(out[n * C]) == 0.0f);
    cu::embedding_backward_vocab_range(d_dpart.get(), d_dout.get(), d_tok.get(), begin, rows, N, C, workspace.get(),
                                       workspace.size());
    check_close<T>("dwte part", d_dpart.download(), r_dpart);
  }
}

TEST_CASE_TEMPLATE("position_add: a sequence-parallel part's rows match the CPU", T, float, cu::bf16, cu::fp16) {
  const std::int64_t S = 12, C = 16, N = 9;
  for (const std::int64_t row0 : {std::int64_t{0}, std::int64_t{9}, std::int64_t{27}}) {  // wraps past S
    CAPTURE(row0);
    const auto x = random_values<T>(N * C, -1, 1, 61);
    const auto wpe = random_values<T>(S * C, -1, 1, 62);
    std::vector<double> r_x = to_double(x);
    const auto r_wpe = to_double(wpe);
    cpu::position_add(r_x.data(), r_wpe.data(), row0, N, S, C);
    dbuf<T> d_x(x), d_wpe(wpe);
    cu::position_add(d_x.get(), d_wpe.get(), row0, N, S, C);
    check_close<T>("x", d_x.download(), r_x);
  }
}

TEST_CASE_TEMPLATE("sequence-parallel dropout: every part's mask equals the CPU's and the one-rank mask", T, float,
                   cu::bf16, cu::fp16) {
  const std::size_t rows = 3, row_len = 40, n = rows * row_len;
  const float p = 0.3f;
  const std::uint64_t seed = 0xabcdef12ULL, site = 5, first = 17;
  const auto in = random_values<T>(n, -2, 2, 71);
  dbuf<T> d_in(in), d_whole(n);
  dbuf<std::uint8_t> d_whole_mask(n);
  cu::dropout_rows(d_whole.get(), d_whole_mask.get(), d_in.get(), rows, row_len, p, seed, site, first);
  const std::vector<std::uint8_t> whole = d_whole_mask.download();
  std::vector<double> r_out(n);
  std::vector<std::uint8_t> r_mask(n);
  const auto r_in = to_double(in);
  cpu::dropout_rows(r_out.data(), r_mask.data(), r_in.data(), rows, row_len, p, seed, site, first);
  CHECK(whole == r_mask);
  std::size_t kept = 0;
  for (const std::uint8_t m : whole) kept += m;
  CHECK(kept > 0);
  CHECK(kept < n);
  // Parts across sequence boundaries, of odd sizes (the scalar path) and of one element.
  for (const std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{37}, std::size_t{79}}) {
    for (const std::size_t len : {std::size_t{1}, std::size_t{30}, std::size_t{41}}) {
      if (offset + len > n) continue;
      CAPTURE(offset);
      CAPTURE(len);
      const std::vector<T> part(in.begin() + static_cast<std::ptrdiff_t>(offset),
                                in.begin() + static_cast<std::ptrdiff_t>(offset + len));
      std::vector<double> rp_out(len);
      std::vector<std::uint8_t> rp_mask(len);
      const auto rp_in = to_double(part);
      cpu::dropout_rows_range(rp_out.data(), rp_mask.data(), rp_in.data(), len, row_len, offset, p, seed, site, first);
      dbuf<T> d_part(part), d_out(len);
      dbuf<std::uint8_t> d_mask(len);
      cu::dropout_rows_range(d_out.get(), d_mask.get(), d_part.get(), len, row_len, offset, p, seed, site, first);
      const std::vector<std::uint8_t> got = d_mask.download();
      CHECK(got == rp_mask);
      CHECK(std::equal(got.begin(), got.end(), whole.begin() + static_cast<std::ptrdiff_t>(offset)));
      check_close<T>("out", d_out.download(), rp_out);
    }
  }
}

TEST_CASE_TEMPLATE("vocabulary-parallel cross-entropy over two ranks matches the CPU and the whole-vocabulary loss", T,
                   float, cu::bf16) {
  const std::int64_t N = 11, vocab = 90, V = vocab / 2;
  const auto logits = random_values<T>(N * vocab, -4, 4, 81);
  auto targets = random_ints(N, 0, vocab - 1, 82);
  targets[0] = 3;                                    // on rank 0
  targets[1] = static_cast<std::int32_t>(vocab - 1);  // on rank 1
  const float dloss = 0.5f;
  // Each rank's columns of the logits.
  std::vector<std::vector<T>> part(2);
  for (int r = 0; r < 2; ++r)
    for (std::int64_t n = 0; n < N; ++n)
      part[r].insert(part[r].end(), logits.begin() + n * vocab + r * V, logits.begin() + n * vocab + (r + 1) * V);

  dbuf<T> d_logits0(part[0]), d_logits1(part[1]);
  dbuf<T>* d_logits[2] = {&d_logits0, &d_logits1};
  dbuf<std::int32_t> d_tgt(targets);
  dbuf<float> d_max0(N), d_max1(N), d_parts0(2 * N), d_parts1(2 * N), d_loss(N);
  dbuf<float>* d_max[2] = {&d_max0, &d_max1};
  dbuf<float>* d_parts[2] = {&d_parts0, &d_parts1};
  // max, then the all-reduce max on the host
  for (int r = 0; r < 2; ++r) cu::vocab_parallel_ce_max(d_max[r]->get(), d_logits[r]->get(), N, V);
  const std::vector<float> m0 = d_max0.download(), m1 = d_max1.download();
  std::vector<float> mx(N);
  for (std::int64_t n = 0; n < N; ++n) mx[n] = std::max(m0[n], m1[n]);
  d_max0.upload(mx);
  d_max1.upload(mx);
  // partials, then the all-reduce sum on the host
  for (int r = 0; r < 2; ++r)
    cu::vocab_parallel_ce_partials(d_parts[r]->get(), d_logits[r]->get(), d_max[r]->get(), d_tgt.get(), r * V, N, V,
                                   vocab);
  const std::vector<float> q0 = d_parts0.download(), q1 = d_parts1.download();
  std::vector<float> sum(2 * N);
  for (std::int64_t i = 0; i < 2 * N; ++i) sum[i] = q0[i] + q1[i];
  d_parts0.upload(sum);
  d_parts1.upload(sum);

  // The CPU reference in double, the same steps.
  std::vector<double> r_max[2] = {std::vector<double>(N), std::vector<double>(N)};
  std::vector<double> r_parts[2] = {std::vector<double>(2 * N), std::vector<double>(2 * N)};
  std::vector<std::vector<double>> r_logits = {to_double(part[0]), to_double(part[1])};
  for (int r = 0; r < 2; ++r) cpu::vocab_parallel_ce_max(r_max[r].data(), r_logits[r].data(), N, V);
  std::vector<double> r_mx(N), r_sum(2 * N);
  for (std::int64_t n = 0; n < N; ++n) r_mx[n] = std::max(r_max[0][n], r_max[1][n]);
  for (int r = 0; r < 2; ++r)
    cpu::vocab_parallel_ce_partials(r_parts[r].data(), r_logits[r].data(), r_mx.data(), targets.data(), r * V, N, V,
                                    vocab);
  for (std::int64_t i = 0; i < 2 * N; ++i) r_sum[i] = r_parts[0][i] + r_parts[1][i];
  check_close<float>("row max", mx, r_mx);
  check_close<float>("partials", sum, r_sum);

  // The whole vocabulary on one rank (the CPU's plain cross-entropy) gives the same loss and gradient.
  const auto r_whole = to_double(logits);
  std::vector<double> w_loss(N), w_grad(N * vocab);
  cpu::cross_entropy_forward(w_loss.data(), r_whole.data(), targets.data(), N, vocab);
  cpu::cross_entropy_backward(w_grad.data(), r_whole.data(), targets.data(), static_cast<double>(dloss), N, vocab);

  std::vector<double> r_loss(N), r_grad_whole(N * vocab);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    cu::vocab_parallel_ce_finish(d_loss.get(), d_logits[r]->get(), d_max[r]->get(), d_parts[r]->get(), d_tgt.get(), r * V,
                                 dloss, N, V);
    const double mean = cpu::vocab_parallel_ce_finish(r_loss.data(), r_logits[r].data(), r_mx.data(), r_sum.data(),
                                                      targets.data(), r * V, static_cast<double>(dloss), N, V);
    const std::vector<float> loss = d_loss.download();
    check_close<float>("loss", loss, r_loss);
    check_close<float>("loss vs whole vocabulary", loss, w_loss);
    double got_mean = 0;
    for (const float l : loss) got_mean += l;
    CHECK(std::abs(got_mean / N - mean) <= 1e-5 * std::abs(mean));
    check_close<T>("dlogits", d_logits[r]->download(), r_logits[r]);
    std::vector<double> w_part;
    for (std::int64_t n = 0; n < N; ++n)
      w_part.insert(w_part.end(), w_grad.begin() + n * vocab + r * V, w_grad.begin() + n * vocab + (r + 1) * V);
    check_close<T>("dlogits vs whole vocabulary", d_logits[r]->download(), w_part);
  }
}

TEST_CASE("vocabulary-parallel cross-entropy: a target outside the vocabulary gives a NaN loss") {
  const std::int64_t N = 2, V = 8;
  const auto logits = random_values<float>(N * V, -1, 1, 91);
  const std::vector<std::int32_t> targets = {1, static_cast<std::int32_t>(V)};  // the second is outside [0, V)
  dbuf<float> d_logits(logits), d_max(N), d_parts(2 * N), d_loss(N);
  dbuf<std::int32_t> d_tgt(targets);
  cu::vocab_parallel_ce_max(d_max.get(), d_logits.get(), N, V);
  cu::vocab_parallel_ce_partials(d_parts.get(), d_logits.get(), d_max.get(), d_tgt.get(), 0, N, V, V);
  cu::vocab_parallel_ce_finish(d_loss.get(), d_logits.get(), d_max.get(), d_parts.get(), d_tgt.get(), 0, 1.0f, N, V);
  const std::vector<float> loss = d_loss.download();
  CHECK(std::isfinite(loss[0]));
  CHECK(std::isnan(loss[1]));
}

// SPDX-License-Identifier: BSL-1.0
// The tensor-parallel kernels of the step program in fp64 (T = double): the vocabulary-parallel
// embedding and cross-entropy (Megatron-LM's VocabParallelEmbedding and vocab_parallel_cross_entropy)
// and the sequence-parallel position add and dropout. Each runs on every shard of a simulated
// tensor-parallel group — the collectives between the steps are sums and maxima over the shards,
// done here — and is held to the unsharded kernel (values) and to central differences of the
// loss as a function of the whole, unsharded tensor (gradients), as tests/cpu/test_gradcheck.cpp.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "memalg/backend/cpu/cross_entropy.hpp"
#include "memalg/backend/cpu/embedding.hpp"
#include "memalg/backend/cpu/pointwise.hpp"
#include "test_util.hpp"

namespace cpu = memalg::backend::cpu;
using namespace memalg_test;
using vec = std::vector<double>;

TEST_CASE("gradcheck: vocabulary-parallel embedding against the unsharded one") {
  const std::size_t B = 2, S = 5, C = 3, V = 12;
  const std::vector<std::int32_t> tok = {1, 11, 1, 0, 7, 3, 11, 2, 6, 0};  // repeats and every shard hit
  vec wte = randn(V * C, 1), wpe = randn(S * C, 2), r = randn(B * S * C, 3);
  for (const std::size_t tp : {std::size_t{2}, std::size_t{3}, std::size_t{4}}) {
    CAPTURE(tp);
    const std::size_t rows = V / tp;
    // forward: each shard's lookup, summed over the group (the all-reduce), then the positions
    const auto forward = [&] {
      vec sum(B * S * C, 0.0), part(B * S * C);
      for (std::size_t k = 0; k < tp; ++k) {
        cpu::embedding_forward_vocab_range(part.data(), tok.data(), wte.data() + k * rows * C, k * rows, rows, B * S, C);
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
      }
      cpu::position_add(sum.data(), wpe.data(), 0, B * S, S, C);
      return sum;
    };
    vec want(B * S * C);
    cpu::embedding_forward(want.data(), tok.data(), wte.data(), wpe.data(), B, S, C);
    CHECK(max_abs_diff(forward(), want) == 0.0);  // one non-zero term per element: the sum is exact
    auto loss = [&] { return dot(forward(), r); };
    // backward: each shard accumulates its rows; wpe from the whole gradient on any rank
    const vec dwte0 = randn(V * C, 4), dwpe0 = randn(S * C, 5);
    vec dwte = dwte0, dwpe = dwpe0;
    for (std::size_t k = 0; k < tp; ++k)
      cpu::embedding_backward_vocab_range(dwte.data() + k * rows * C, r.data(), tok.data(), k * rows, rows, B * S, C);
    cpu::embedding_backward(static_cast<double*>(nullptr), dwpe.data(), r.data(), tok.data(), B, S, C);
    check_gradient("dwte", wte, minus(dwte, dwte0), loss);
    check_gradient("dwpe", wpe, minus(dwpe, dwpe0), loss);
    vec full = dwte0;
    cpu::embedding_backward(full.data(), static_cast<double*>(nullptr), r.data(), tok.data(), B, S, C);
    CHECK(max_abs_diff(dwte, full) == 0.0);  // the same sums in the same order, row by row
  }
}

TEST_CASE("gradcheck: sequence-parallel position add takes the rows' own positions") {
  const std::size_t B = 3, S = 4, C = 2, N = B * S;
  const vec wpe = randn(S * C, 1), x = randn(N * C, 2);
  vec whole = x;
  cpu::position_add(whole.data(), wpe.data(), 0, N, S, C);
  for (const std::size_t tp : {std::size_t{2}, std::size_t{3}, std::size_t{4}, std::size_t{6}}) {
    CAPTURE(tp);
    const std::size_t n = N / tp;
    for (std::size_t k = 0; k < tp; ++k) {
      vec part(x.begin() + static_cast<long>(k * n * C), x.begin() + static_cast<long>((k + 1) * n * C));
      cpu::position_add(part.data(), wpe.data(), k * n, n, S, C);
      CHECK(max_abs_diff(part, vec(whole.begin() + static_cast<long>(k * n * C),
                                   whole.begin() + static_cast<long>((k + 1) * n * C))) == 0.0);
    }
  }
}

TEST_CASE("gradcheck: vocabulary-parallel cross-entropy against the unsharded one") {
  const std::size_t N = 5, V = 12;
  const double dloss = 0.7;
  vec logits = randn(N * V, 1, 2.0);
  const auto tgt = randint(N, static_cast<std::int32_t>(V), 2);
  for (const std::size_t tp : {std::size_t{2}, std::size_t{3}, std::size_t{4}}) {
    CAPTURE(tp);
    const std::size_t cols = V / tp;
    // The shards' logits [N, cols] of the logical [N, V].
    const auto shard = [&](const vec& full, std::size_t k) {
      vec s(N * cols);
      for (std::size_t n = 0; n < N; ++n)
        for (std::size_t v = 0; v < cols; ++v) s[n * cols + v] = full[n * V + k * cols + v];
      return s;
    };
    // Megatron's three reductions between the steps: max, then the sums of {Σexp, target logit}.
    // Returns the mean loss; grad (if given) receives the whole [N, V] gradient.
    const auto sharded = [&](const vec& full, vec* grad) {
      std::vector<vec> parts(tp);
      vec row_max(N, -INFINITY), m(N), sums(2 * N, 0.0), p(2 * N);
      for (std::size_t k = 0; k < tp; ++k) {
        parts[k] = shard(full, k);
        cpu::vocab_parallel_ce_max(m.data(), parts[k].data(), N, cols);
        for (std::size_t n = 0; n < N; ++n) row_max[n] = std::max(row_max[n], m[n]);
      }
      for (std::size_t k = 0; k < tp; ++k) {
        cpu::vocab_parallel_ce_partials(p.data(), parts[k].data(), row_max.data(), tgt.data(), k * cols, N, cols, V);
        for (std::size_t i = 0; i < 2 * N; ++i) sums[i] += p[i];
      }
      double mean = 0;
      vec losses(N);
      for (std::size_t k = 0; k < tp; ++k) {
        mean = cpu::vocab_parallel_ce_finish(losses.data(), parts[k].data(), row_max.data(), sums.data(), tgt.data(),
                                             k * cols, dloss, N, cols);
        if (grad)
          for (std::size_t n = 0; n < N; ++n)
            for (std::size_t v = 0; v < cols; ++v) (*grad)[n * V + k * cols + v] = parts[k][n * cols + v];
      }
      return mean;
    };
    vec l(N);
    const double want = cpu::cross_entropy_forward(l.data(), logits.data(), tgt.data(), N, V);
    vec grad = nans(N * V);
    CHECK(std::abs(sharded(logits, &grad) - want) < 1e-12);
    vec want_grad(N * V);
    cpu::cross_entropy_backward(want_grad.data(), logits.data(), tgt.data(), dloss, N, V);
    CHECK(max_abs_diff(grad, want_grad) < 1e-14);
    auto loss = [&] { return dloss * sharded(logits, nullptr); };
    check_gradient("dlogits", logits, grad, loss);
  }
}

TEST_CASE("gradcheck: sequence-parallel dropout draws the one-rank mask on every split") {
  const std::size_t B = 3, S = 4, C = 5, row_len = S * C, n = B * row_len;
  const float p = 0.3f;
  const std::uint64_t seed = 42, site = 7, first = 11;
  vec x = randn(n, 1), r = randn(n, 2);
  vec whole(n);
  std::vector<std::uint8_t> whole_mask(n);
  cpu::dropout_rows(whole.data(), whole_mask.data(), x.data(), B, row_len, p, seed, site, first);
  for (const std::size_t tp : {std::size_t{2}, std::size_t{3}, std::size_t{4}, std::size_t{6}}) {
    CAPTURE(tp);
    const std::size_t part = n / tp;  // token rows split contiguously, not at sequence boundaries
    vec out(n), dx = nans(n);
    std::vector<std::uint8_t> mask(n);
    for (std::size_t k = 0; k < tp; ++k) {
      const std::size_t at = k * part;
      cpu::dropout_rows_range(out.data() + at, mask.data() + at, x.data() + at, part, row_len, at, p, seed, site, first);
      cpu::dropout_backward(dx.data() + at, r.data() + at, mask.data() + at, part, p);
    }
    CHECK(mask == whole_mask);
    CHECK(max_abs_diff(out, whole) == 0.0);
    auto loss = [&] {
      vec o(n);
      std::vector<std::uint8_t> mk(n);
      for (std::size_t k = 0; k < tp; ++k)
        cpu::dropout_rows_range(o.data() + k * part, mk.data() + k * part, x.data() + k * part, part, row_len, k * part, p,
                                seed, site, first);
      return dot(o, r);
    };
    check_gradient("din", x, dx, loss);
  }
  std::size_t kept = 0;
  for (std::uint8_t k : whole_mask) kept += k;
  CHECK(kept > 0);
  CHECK(kept < n);
}

// SPDX-License-Identifier: BSL-1.0
// Host tests of the speech kernels' CUDA layouts (cross_attention.cuh, conv1d.cuh, batchnorm.cuh)
// against the CPU reference's: the GPU tests compare the two element by element, so both must
// address the same element for the same (batch, position, head, dim). No GPU needed.
#include <doctest/doctest.h>

#include <cstdint>
#include <set>

#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cpu/conv1d.hpp"
#include "memalg/backend/cuda/batchnorm.cuh"
#include "memalg/backend/cuda/conv1d.cuh"
#include "memalg/backend/cuda/cross_attention.cuh"

namespace cu = memalg::backend::cuda;
namespace cpu = memalg::backend::cpu;

TEST_CASE("cross-attention: CUDA indices are the CPU reference's layout") {
  const cu::cross_attention_shape g{2, 5, 7, 6, 2, 3};
  const cpu::cross_attention_shape c{2, 5, 7, 6, 2, 3};
  const auto io = cpu::detail::cross_attention_io(c, nullptr);
  CHECK(g.q_width() == static_cast<std::int64_t>(c.q_width()));
  CHECK(g.kv_width() == static_cast<std::int64_t>(c.kv_width()));
  std::set<std::int64_t> kv_seen;
  for (std::int64_t b = 0; b < g.B; ++b)
    for (std::int64_t h = 0; h < g.H; ++h) {
      const std::int64_t hk = g.kv_head_of(h);
      for (std::int64_t i = 0; i < g.Sq; ++i) {
        CHECK(g.q_index(b, i, h, 0) == static_cast<std::int64_t>(io.q_at(b, i, h)));
        CHECK(g.out_index(b, i, h, 0) == static_cast<std::int64_t>(io.out_at(b, i, h)));
        CHECK(g.stat_index(b, h, i) == static_cast<std::int64_t>(io.stat_at(b, h, i)));
      }
      for (std::int64_t j = 0; j < g.Sk; ++j) {
        CHECK(g.k_index(b, j, hk, 0) == static_cast<std::int64_t>(io.k_at(b, j, h)));
        CHECK(g.v_index(b, j, hk, 0) == static_cast<std::int64_t>(io.v_at(b, j, h)));
        for (std::int64_t d = 0; d < g.D; ++d) {
          kv_seen.insert(g.k_index(b, j, hk, d));
          kv_seen.insert(g.v_index(b, j, hk, d));
        }
      }
    }
  // k and v of every kv head cover the kv tensor exactly once.
  CHECK(kv_seen.size() == static_cast<std::size_t>(g.B * g.Sk * g.kv_width()));
  CHECK(*kv_seen.rbegin() == g.B * g.Sk * g.kv_width() - 1);
  CHECK(cu::cross_attention_naive_backward_scratch_bytes(g) == static_cast<std::size_t>(g.B * g.H * g.Sq) * sizeof(float));
  CHECK(g.att_elements() == g.B * g.H * g.Sq * g.Sk);
  CHECK_FALSE(cu::cross_attention_shape{1, 2, 3, 3, 2, 8}.valid());  // H not a multiple of Hkv
}

TEST_CASE("conv1d: CUDA padding split and sizes are the CPU reference's") {
  for (std::int64_t k = 1; k <= 8; ++k) {
    CAPTURE(k);
    const cu::conv1d_shape g{2, 9, 3, 4, k};
    const cpu::conv1d_shape c{2, 9, 3, 4, static_cast<std::size_t>(k)};
    CHECK(g.left() == static_cast<std::int64_t>(c.left()));
    CHECK(g.left() + (k - 1 - g.left()) == k - 1);  // left + right = K − 1, right ≥ left
    CHECK(k - 1 - g.left() >= g.left());
    CHECK(g.weight_elements() == static_cast<std::int64_t>(c.weight_elements()));
  }
  CHECK_FALSE(cu::conv1d_shape{1, 4, 3, 0, 5}.valid());
  CHECK(cu::batchnorm_backward_scratch_bytes(512) == (2 * 512 + 1) * sizeof(float));
}

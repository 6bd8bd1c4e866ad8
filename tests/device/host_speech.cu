// SPDX-License-Identifier: BSL-1.0
// Host tests of the speech kernels' CUDA layouts (attention.cuh's attention_io, conv1d.cuh, batchnorm.cuh)
// against the CPU reference's: the GPU tests compare the two element by element, so both must
// address the same element for the same (batch, position, head, dim). No GPU needed.
#include <doctest/doctest.h>

#include <cstdint>
#include <set>

#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cpu/conv1d.hpp"
#include "memalg/backend/cuda/attention.cuh"
#include "memalg/backend/cuda/batchnorm.cuh"
#include "memalg/backend/cuda/conv1d.cuh"

namespace cu = memalg::backend::cuda;
namespace cpu = memalg::backend::cpu;

/// The CUDA attention_io addresses every element the CPU's does (the GPU tests compare them
/// element by element), and its k and v heads cover the key/value columns exactly once.
void check_io(const cu::attention_io& g, const cpu::detail::attention_io& c, std::int64_t kv_elements) {
  CHECK(g.out_width() == static_cast<std::int64_t>(c.H * c.D));
  std::set<std::int64_t> kv_seen;
  for (std::int64_t b = 0; b < g.B; ++b)
    for (std::int64_t h = 0; h < g.H; ++h) {
      const std::int64_t hk = g.kv_head_of(h);
      for (std::int64_t i = 0; i < g.Sq; ++i) {
        CHECK(g.q_index(b, i, h, 0) == static_cast<std::int64_t>(c.q_at(b, i, h)));
        CHECK(g.out_index(b, i, h, 0) == static_cast<std::int64_t>(c.out_at(b, i, h)));
        CHECK(g.stat_index(b, h, i) == static_cast<std::int64_t>(c.stat_at(b, h, i)));
        CHECK(g.keys(i) == static_cast<std::int64_t>(c.key_end(i)));
      }
      for (std::int64_t j = 0; j < g.Sk; ++j) {
        CHECK(g.k_index(b, j, hk, 0) == static_cast<std::int64_t>(c.k_at(b, j, h)));
        CHECK(g.v_index(b, j, hk, 0) == static_cast<std::int64_t>(c.v_at(b, j, h)));
        CHECK(g.real_key(b, j) == c.visible(b, 0, j));  // (no window: the query does not matter)
        for (std::int64_t d = 0; d < g.D; ++d) {
          kv_seen.insert(g.k_index(b, j, hk, d));
          kv_seen.insert(g.v_index(b, j, hk, d));
        }
      }
    }
  CHECK(kv_seen.size() == static_cast<std::size_t>(g.B * g.Sk * g.Hkv * 2 * g.D));
  CHECK(*kv_seen.rbegin() == kv_elements - 1);  // v ends each row of kv (or of the fused qkv)
  CHECK(g.att_index(g.B - 1, g.H - 1, g.Sq - 1, g.Sk - 1) == g.B * g.H * g.Sq * g.Sk - 1);
}

TEST_CASE("attention io: CUDA indices are the CPU reference's layout, cross and fused self-attention") {
  const std::uint8_t key_mask[2 * 7] = {1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0};
  SUBCASE("cross-attention: q and kv apart, a key mask") {
    const cu::cross_attention_shape g{2, 5, 7, 6, 2, 3};
    const cpu::cross_attention_shape c{2, 5, 7, 6, 2, 3};
    const cu::attention_io io = cu::cross_attention_io(g, key_mask);
    check_io(io, cpu::detail::cross_attention_io(c, key_mask), g.B * g.Sk * g.kv_width());
    CHECK(io.k_col + io.Hkv * io.D == io.v_col);
    CHECK(io.v_col + io.Hkv * io.D == io.kv_ld);  // k ‖ v fill the kv row
    CHECK(cu::cross_attention_naive_backward_scratch_bytes(g) == static_cast<std::size_t>(g.B * g.H * g.Sq) * sizeof(float));
    CHECK(g.att_elements() == g.B * g.H * g.Sq * g.Sk);
    CHECK_FALSE(cu::cross_attention_shape{1, 2, 3, 3, 2, 8}.valid());  // H not a multiple of Hkv
  }
  SUBCASE("fused self-attention: one qkv, causal or not, a key mask") {
    for (const bool causal : {false, true}) {
      CAPTURE(causal);
      const cu::attention_shape g{2, 7, 6, 2, 3, causal};
      const cpu::attention_shape c{2, 7, 6, 2, 3, causal};
      cpu::detail::attention_io cio = cpu::detail::self_attention_io(c);
      cio.key_mask = key_mask;
      const cu::attention_io io = cu::self_attention_io(g, key_mask);
      check_io(io, cio, g.qkv_elements());
      for (std::int64_t b = 0; b < g.B; ++b)  // the io's indices are attention_shape's
        for (std::int64_t i = 0; i < g.S; ++i) {
          CHECK(io.q_index(b, i, 5, 2) == g.q_index(b, i, 5, 2));
          CHECK(io.k_index(b, i, 1, 2) == g.k_index(b, i, 1, 2));
          CHECK(io.v_index(b, i, 1, 2) == g.v_index(b, i, 1, 2));
        }
    }
    // Causal attention needs as many keys as queries.
    cu::attention_io io = cu::self_attention_io(cu::attention_shape{1, 4, 2, 2, 8, true});
    CHECK(io.valid());
    io.Sk = 5;
    CHECK_FALSE(io.valid());
  }
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

// SPDX-License-Identifier: BSL-1.0
// Host tests of the CUDA backend's launch arithmetic (launch.cuh and the size helpers built on it):
// grid sizes, vector widths, attention layouts, flash tiling, workspaces. No GPU needed.
#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "memalg/backend/cuda/attention.cuh"
#include "memalg/backend/cuda/embedding.cuh"
#include "memalg/backend/cuda/grad_norm.cuh"
#include "memalg/backend/cuda/launch.cuh"

namespace cu = memalg::backend::cuda;

TEST_CASE("integer helpers") {
  CHECK(cu::ceil_div(0, 4) == 0);
  CHECK(cu::ceil_div(1, 4) == 1);
  CHECK(cu::ceil_div(8, 4) == 2);
  CHECK(cu::ceil_div(9, 4) == 3);
  CHECK(cu::round_up(9, 8) == 16);
  CHECK(cu::round_up(16, 8) == 16);
  CHECK(cu::is_pow2(1));
  CHECK(cu::is_pow2(1024));
  CHECK_FALSE(cu::is_pow2(0));
  CHECK_FALSE(cu::is_pow2(12));
  CHECK(cu::bits_for(0) == 0);
  CHECK(cu::bits_for(1) == 0);
  CHECK(cu::bits_for(2) == 1);
  CHECK(cu::bits_for(50257) == 16);
  CHECK(cu::bits_for(65536) == 16);
  CHECK(cu::bits_for(65537) == 17);
  CHECK(cu::next_pow2(0) == 1);
  CHECK(cu::next_pow2(1) == 1);
  CHECK(cu::next_pow2(1000) == 1024);
  CHECK(cu::next_pow2(1024) == 1024);
  static_assert(cu::ceil_div(7, 2) == 4, "usable in constant expressions");
}

TEST_CASE("grid-stride and warp-per-row launches") {
  CHECK(cu::grid_stride_launch(0).grid == 0);
  CHECK(cu::grid_stride_launch(1).grid == 1);
  CHECK(cu::grid_stride_launch(256).grid == 1);
  CHECK(cu::grid_stride_launch(257).grid == 2);
  CHECK(cu::grid_stride_launch(257).block == 256);
  CHECK(cu::grid_stride_launch(std::int64_t{1} << 40).grid == cu::max_grid_stride_blocks);
  // Every item is reached: grid·block threads striding by grid·block cover [0, items).
  for (const std::int64_t items : {1, 255, 256, 1000, 70000}) {
    const cu::launch_1d l = cu::grid_stride_launch(items, 128);
    CHECK(l.grid * l.block >= (items < cu::max_grid_stride_blocks * 128 ? items : 0));
  }
  const cu::launch_1d rows = cu::warp_per_row_launch(37, 8);
  CHECK(rows.block == 256);
  CHECK(rows.grid == 5);  // 40 warps for 37 rows
  CHECK(cu::warp_per_row_launch(0).grid == 0);
  CHECK(cu::column_reduce_blocks(0) == 0);
  CHECK(cu::column_reduce_blocks(200) == 7);
  CHECK(cu::column_reduce_blocks(256) == 8);
}

TEST_CASE("vectorised loads: widths, alignment") {
  CHECK(cu::max_vec_width(4) == 4);
  CHECK(cu::max_vec_width(2) == 8);
  CHECK(cu::max_vec_width(1) == 16);
  CHECK(cu::max_vec_width(16) == 1);
  CHECK(cu::alignment_of(0) == 256);
  CHECK(cu::alignment_of(4096) == 256);
  CHECK(cu::alignment_of(0x1004) == 4);
  CHECK(cu::alignment_of(0x1010) == 16);
  CHECK(cu::alignment_of(0x1010, 8) == 8);
  CHECK(cu::alignment_of(1) == 1);
  // float: 4 per 16-byte load
  CHECK(cu::vec_width(4, 1024, 0x1000, 4) == 4);
  CHECK(cu::vec_width(4, 1022, 0x1000, 4) == 2);   // count only splits into pairs
  CHECK(cu::vec_width(4, 1001, 0x1000, 4) == 1);
  CHECK(cu::vec_width(4, 1024, 0x1008, 4) == 2);   // 8-byte aligned address
  CHECK(cu::vec_width(4, 1024, 0x1004, 4) == 1);
  // bf16: 8 per load
  CHECK(cu::vec_width(8, 768, 0x2000, 2) == 8);
  CHECK(cu::vec_width(8, 768, 0x2008, 2) == 4);
  // several arrays: the width all of them support (a 1-byte mask needs W-byte alignment)
  alignas(64) static float a[64];
  alignas(64) static std::uint8_t m[64];
  CHECK(cu::common_vec_width(4, 64, &a[0], &m[0]) == 4);
  CHECK(cu::common_vec_width(4, 64, &a[0], &m[2]) == 2);
  CHECK(cu::common_vec_width(4, 64, &a[1], &m[0]) == 1);
  CHECK(cu::common_vec_width(4, 63, &a[0], &m[0]) == 1);
}

TEST_CASE("attention layout: q, k, v regions tile qkv exactly; GQA head mapping") {
  for (const bool causal : {true, false}) {
    const cu::attention_shape sh{2, 5, 6, 2, 3, causal};
    REQUIRE(sh.valid());
    CHECK(sh.group() == 3);
    CHECK(sh.kv_head_of(0) == 0);
    CHECK(sh.kv_head_of(2) == 0);
    CHECK(sh.kv_head_of(3) == 1);
    CHECK(sh.kv_head_of(5) == 1);
    CHECK(sh.qkv_width() == (6 + 4) * 3);
    CHECK(sh.keys(2) == (causal ? 3 : 5));
    std::vector<int> hits(static_cast<std::size_t>(sh.qkv_elements()), 0);
    for (std::int64_t b = 0; b < sh.B; ++b)
      for (std::int64_t i = 0; i < sh.S; ++i)
        for (std::int64_t d = 0; d < sh.D; ++d) {
          for (std::int64_t h = 0; h < sh.H; ++h) ++hits[static_cast<std::size_t>(sh.q_index(b, i, h, d))];
          for (std::int64_t hk = 0; hk < sh.Hkv; ++hk) {
            ++hits[static_cast<std::size_t>(sh.k_index(b, i, hk, d))];
            ++hits[static_cast<std::size_t>(sh.v_index(b, i, hk, d))];
          }
        }
    for (const int h : hits) REQUIRE(h == 1);
    std::set<std::int64_t> outs, atts;
    for (std::int64_t b = 0; b < sh.B; ++b)
      for (std::int64_t h = 0; h < sh.H; ++h)
        for (std::int64_t i = 0; i < sh.S; ++i) {
          for (std::int64_t d = 0; d < sh.D; ++d) outs.insert(sh.out_index(b, i, h, d));
          for (std::int64_t j = 0; j < sh.S; ++j) atts.insert(sh.att_index(b, h, i, j));
        }
    CHECK(static_cast<std::int64_t>(outs.size()) == sh.out_elements());
    CHECK(*outs.rbegin() == sh.out_elements() - 1);
    CHECK(static_cast<std::int64_t>(atts.size()) == sh.att_elements());
    CHECK(*atts.rbegin() == sh.att_elements() - 1);
  }
  CHECK_FALSE(cu::attention_shape{1, 4, 3, 2, 8, true}.valid());
  CHECK(cu::attention_naive_backward_scratch_bytes(cu::attention_shape{2, 10, 4, 2, 8, true}) == 2 * 4 * 10 * 4);
}

TEST_CASE("flash tiling: the tiles visited are exactly those holding a visible (query, key) pair") {
  for (const bool causal : {true, false}) {
    for (std::int64_t seq = 1; seq <= 130; ++seq) {
      CAPTURE(seq);
      CAPTURE(causal);
      const std::int64_t qt_n = cu::flash_q_tiles(seq), kt_n = cu::flash_kv_tiles(seq);
      REQUIRE(qt_n * cu::flash_br >= seq);
      REQUIRE((qt_n - 1) * cu::flash_br < seq);
      std::int64_t pairs = 0;
      for (std::int64_t qt = 0; qt < qt_n; ++qt)
        for (std::int64_t kt = 0; kt < kt_n; ++kt) {
          bool visible = false;
          for (std::int64_t i = qt * cu::flash_br; i < std::min<std::int64_t>((qt + 1) * cu::flash_br, seq); ++i)
            for (std::int64_t j = kt * cu::flash_bc; j < std::min<std::int64_t>((kt + 1) * cu::flash_bc, seq); ++j)
              visible = visible || cu::attends(i, j, causal);
          const bool by_q = kt < cu::flash_kv_tile_end(qt, seq, causal);   // forward, dQ
          const bool by_kv = qt >= cu::flash_q_tile_begin(kt, causal);    // dK, dV
          REQUIRE(by_q == visible);
          REQUIRE(by_kv == visible);
          pairs += visible ? 1 : 0;
        }
      CHECK(cu::flash_tile_pairs(seq, causal) == pairs);
    }
  }
  CHECK(cu::flash_tile_pairs(128, false) == 16);
  CHECK(cu::flash_tile_pairs(128, true) == 10);
}

TEST_CASE("flash shared memory fits every supported GPU for every head width") {
  CHECK(cu::flash_forward_smem_bytes(64) == (32 + 64) * 65 * 4);
  CHECK(cu::flash_backward_smem_bytes(64) == (2 * 64 * 65 + 64) * 4);
  // sm_80 allows 163 KiB of opt-in shared memory per block, sm_90 227 KiB.
  for (std::int64_t d = 1; d <= cu::flash_max_head_dim; ++d) {
    CHECK(cu::flash_forward_smem_bytes(d) <= 163 * 1024);
    CHECK(cu::flash_backward_smem_bytes(d) <= 163 * 1024);
  }
  CHECK(cu::flash_threads == 1024);
  CHECK(cu::flash_max_head_dim % cu::warp_size == 0);
  CHECK(cu::attention_max_head_dim % cu::warp_size == 0);
}

TEST_CASE("bitonic sort launch plan and embedding workspace") {
  CHECK(cu::bitonic_launches(1) == 0);
  CHECK(cu::bitonic_launches(2) == 1);
  CHECK(cu::bitonic_launches(1024) == 1);
  CHECK(cu::bitonic_launches(2048) == 3);   // block pass, then k=2048: j=1024 global + block pass
  CHECK(cu::bitonic_launches(4096) == 6);   // + k=4096: j=2048, 1024 global + block pass
  CHECK(cu::embedding_backward_workspace_bytes(0) == 0);
  CHECK(cu::embedding_backward_workspace_bytes(1) == 8);
  CHECK(cu::embedding_backward_workspace_bytes(2400) == 4096 * 8);
  CHECK(cu::embedding_backward_workspace_bytes(4096) == 4096 * 8);
}

TEST_CASE("GEMM workspace and fp8 rules") {
  CHECK(cu::default_gemm_workspace_bytes(7) == 4 * cu::mib);
  CHECK(cu::default_gemm_workspace_bytes(8) == 4 * cu::mib);
  CHECK(cu::default_gemm_workspace_bytes(9) == 32 * cu::mib);
  CHECK(cu::default_gemm_workspace_bytes(10) == 32 * cu::mib);
  CHECK(cu::fp8_gemm_supported(9, 0));
  CHECK(cu::fp8_gemm_supported(8, 9));
  CHECK_FALSE(cu::fp8_gemm_supported(8, 0));
  CHECK_FALSE(cu::fp8_gemm_supported(8, 6));
  CHECK(cu::fp8_gemm_dims_ok(16, 768, 2304));
  CHECK_FALSE(cu::fp8_gemm_dims_ok(16, 768, 50257));
  CHECK_FALSE(cu::fp8_gemm_dims_ok(0, 16, 16));
}

TEST_CASE("norm reduction: partial blocks depend on the element count only; clip coefficient") {
  CHECK(cu::norm_partial_blocks(0) == 1);
  CHECK(cu::norm_partial_blocks(1) == 1);
  CHECK(cu::norm_partial_blocks(cu::norm_block * 8) == 1);
  CHECK(cu::norm_partial_blocks(cu::norm_block * 8 + 1) == 2);
  CHECK(cu::norm_partial_blocks(std::int64_t{1} << 40) == cu::norm_max_blocks);
  CHECK(cu::grad_norm_scratch_floats == static_cast<std::size_t>(cu::norm_max_blocks));
  CHECK(cu::clip_coefficient(0.5f, 1.0f) == 1.0f);
  CHECK(cu::clip_coefficient(4.0f, 1.0f) == doctest::Approx(1.0f / (4.0f + 1e-6f)));
  CHECK(cu::clip_coefficient(4.0f, 0.0f) == 1.0f);  // clipping disabled
}

TEST_CASE("arena placement checks") {
  using cu::arena_fit;
  CHECK(cu::arena_check(1024, 0, 256, 4, 4) == arena_fit::ok);
  CHECK(cu::arena_check(1024, 0, 257, 4, 4) == arena_fit::out_of_range);
  CHECK(cu::arena_check(1024, 1020, 1, 4, 4) == arena_fit::ok);
  CHECK(cu::arena_check(1024, 1024, 0, 4, 4) == arena_fit::ok);
  CHECK(cu::arena_check(1024, 1028, 0, 4, 4) == arena_fit::out_of_range);
  CHECK(cu::arena_check(1024, 2, 1, 4, 4) == arena_fit::misaligned);
  CHECK(cu::arena_check(1024, 0, 1, 4, 3) == arena_fit::bad_alignment);
  CHECK(cu::arena_check(1024, 512, SIZE_MAX / 2, 4, 4) == arena_fit::out_of_range);  // no overflow
  CHECK(cu::workspace_round(1) == 256);
  CHECK(cu::workspace_round(256) == 256);
  CHECK(cu::workspace_round(0) == 0);
}

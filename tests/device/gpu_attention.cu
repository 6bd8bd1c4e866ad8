// SPDX-License-Identifier: BSL-1.0
// GPU tests of attention.cuh (naive and flash, forward and backward, GQA, causal or not) against the
// CPU reference (in double).
#include <doctest/doctest.h>

#include <vector>

#include "gpu_test_util.hpp"
#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cuda/attention.cuh"

using namespace gpu_test;
namespace cpu = memalg::backend::cpu;

namespace {

struct config {
  std::int64_t B, S, H, Hkv, D;
  bool causal;
};

// Partial tiles (S not a multiple of 32), GQA groups of 2 and 3 (MQA), head widths below, at and
// above one warp, and the 128-wide head that needs more than 48 KiB of shared memory.
constexpr config configs[] = {
    {2, 67, 4, 2, 64, true},
    {1, 45, 3, 1, 40, false},
    {1, 33, 2, 2, 128, true},
    {2, 20, 2, 1, 16, false},
};

template <class T>
void check_attention(const config& c, std::uint32_t seed) {
  CAPTURE(c.B);
  CAPTURE(c.S);
  CAPTURE(c.H);
  CAPTURE(c.Hkv);
  CAPTURE(c.D);
  CAPTURE(c.causal);
  const cu::attention_shape sh{c.B, c.S, c.H, c.Hkv, c.D, c.causal};
  const cpu::attention_shape rsh{std::size_t(c.B), std::size_t(c.S), std::size_t(c.H), std::size_t(c.Hkv),
                                 std::size_t(c.D), c.causal};
  const auto qkv = random_values<T>(sh.qkv_elements(), -2, 2, seed);
  const auto dout = random_values<T>(sh.out_elements(), -1, 1, seed + 1);
  const auto r_qkv = to_double(qkv), r_dout = to_double(dout);

  std::vector<double> r_out(sh.out_elements()), r_att(sh.att_elements()), r_lse(sh.stat_elements()),
      r_dqkv(sh.qkv_elements());
  cpu::attention_naive_forward(r_out.data(), r_att.data(), r_qkv.data(), rsh);
  cpu::attention_naive_backward(r_dqkv.data(), r_dout.data(), r_qkv.data(), r_att.data(), rsh);
  std::vector<double> r_out_flash(sh.out_elements());
  cpu::attention_flash_forward(r_out_flash.data(), r_lse.data(), r_qkv.data(), rsh);

  dbuf<T> d_qkv(qkv), d_dout(dout), d_out(sh.out_elements()), d_att(sh.att_elements()), d_dqkv(sh.qkv_elements());
  dbuf<float> d_lse(sh.stat_elements()), d_scratch(cu::attention_naive_backward_scratch_bytes(sh) / sizeof(float));

  {
    cu::attention_naive_forward(d_out.get(), d_att.get(), d_qkv.get(), sh);
    check_close<T>("naive out", d_out.download(), r_out);
    check_close<T>("naive att", d_att.download(), r_att);
    d_dqkv.upload(random_values<T>(sh.qkv_elements(), -9, 9, 99));  // must be overwritten
    cu::attention_naive_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_att.get(), sh, d_scratch.get());
    check_close<T>("naive dqkv", d_dqkv.download(), r_dqkv);
  }
  if (c.D <= cu::flash_max_head_dim) {
    cu::attention_flash_forward(d_out.get(), d_lse.get(), d_qkv.get(), sh);
    check_close<T>("flash out", d_out.download(), r_out);
    check_close<T>("flash lse", d_lse.download(), r_lse);
    d_dqkv.upload(random_values<T>(sh.qkv_elements(), -9, 9, 98));
    cu::attention_flash_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), sh);
    check_close<T>("flash dqkv", d_dqkv.download(), r_dqkv);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("attention: naive and flash, forward and backward, match the CPU reference", T, float, cu::bf16,
                   cu::fp16) {
  std::uint32_t seed = 1;
  for (const config& c : configs) check_attention<T>(c, seed += 10);
}

TEST_CASE("attention: shapes the kernels cannot run are refused") {
  dbuf<float> buf(1024), lse(64);
  const cu::attention_shape too_wide{1, 2, 1, 1, cu::flash_max_head_dim + 8, true};
  CHECK_THROWS_AS(cu::attention_flash_forward(buf.get(), lse.get(), buf.get(), too_wide), std::invalid_argument);
  const cu::attention_shape bad_group{1, 2, 3, 2, 8, true};
  CHECK_THROWS_AS(cu::attention_naive_forward(buf.get(), buf.get(), buf.get(), bad_group), std::invalid_argument);
}

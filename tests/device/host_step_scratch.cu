// SPDX-License-Identifier: BSL-1.0
// Host tests of the CUDA step backend's scratch (step_backend.cuh: step_scratch_of,
// step_backend_scratch_bytes) for the speech program's ops. No GPU needed. Its own executable:
// step_backend.cuh brings in kernels that are not templates (grad_norm.cuh, embedding.cuh,
// cross_entropy.cuh), which one binary may define only once.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "memalg/backend/cuda/step_backend.cuh"
#include "memalg/exec/program.hpp"

namespace cu = memalg::backend::cuda;
namespace exec = memalg::exec;
namespace ops = memalg::exec::ops;

TEST_CASE("step backend scratch: the speech ops' buffers, sized from the ops, also in a pipeline stage's sections") {
  const exec::operand none{};
  const std::uint32_t B = 2, S = 5, H = 4, Hkv = 2, D = 8, C = 7;
  const std::vector<exec::op> body = {
      {ops::norm_bwd{none, none, none, none, none, none, 16, 3}},  // 16 rows of 3
      {ops::batchnorm_fwd{none, none, none, none, none, B * S, C}},
      {ops::batchnorm_bwd{none, none, none, none, none, none, none, B * S, C}},
      // the decoder's cross-attention, naive backward
      {ops::masked_attention_bwd{none, none, none, none, none, none, none, none, {B, 3, S, H, Hkv, D, false, false, false}}},
      // the encoder's fused self-attention, flash (read in place)
      {ops::masked_attention_fwd{none, none, none, none, none, {B, S, S, H, Hkv, D, false, true, true}}},
  };
  exec::program p;
  p.grad_accum = 3;
  p.tokens_per_micro = 10;
  p.targets_per_micro = 0;
  p.features_per_micro = 21;
  p.masks_per_micro = 4;
  p.micro = body;
  const cu::step_scratch_shape s = cu::step_scratch_of(p);
  CHECK(s.stat_rows == 16);  // the norm's rows exceed the batch norm's channels
  CHECK(s.bn_channels == C);
  CHECK(s.row_dots == std::size_t{B} * H * 3);
  CHECK(s.ids == 30);
  CHECK(s.target_ids == 0);
  CHECK(s.features == 63);
  CHECK(s.masks == 12);
  // The fused self-attention reads its qkv in place: without the two attention ops, the same scratch
  // but for the naive backward's row dots.
  exec::program plain = p;
  plain.micro.resize(3);
  CHECK(cu::step_scratch_of(plain).row_dots == 0);
  CHECK(cu::step_backend_scratch_bytes(p) - cu::step_backend_scratch_bytes(plain) ==
        cu::workspace_round(s.row_dots * sizeof(float)));
  // A pipeline stage's program has its ops in sections, none in micro: the same scratch.
  exec::program stage = p;
  stage.micro.clear();
  stage.pipeline = {{{true, 0}, {body.begin(), body.begin() + 2}}, {{false, 0}, {body.begin() + 2, body.end()}}};
  const cu::step_scratch_shape t = cu::step_scratch_of(stage);
  CHECK(t.stat_rows == s.stat_rows);
  CHECK(t.bn_channels == s.bn_channels);
  CHECK(t.row_dots == s.row_dots);
  CHECK(cu::step_backend_scratch_bytes(stage) == cu::step_backend_scratch_bytes(p));
}

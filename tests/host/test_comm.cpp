// SPDX-License-Identifier: BSL-1.0
// The communication-volume model against the ring formulas and the published ratios.
#include <doctest/doctest.h>

#include <ostream>

#include <memalg/memalg.hpp>
#include <memalg/plan/comm.hpp>

using namespace memalg;
using namespace memalg::literals;

namespace memalg {
// Lets doctest print byte counts in failed checks.
inline std::ostream& operator<<(std::ostream& os, const bytes& b) { return os << b.value << " B"; }
}  // namespace memalg

namespace {
mesh_desc make_mesh(std::uint64_t dp, int zero, std::uint64_t tp = 1, std::uint64_t pp = 1, std::uint64_t cp = 1) {
  mesh_desc m{};
  m.dp = dp;
  m.tp = tp;
  m.pp = pp;
  m.cp = cp;
  m.zero_stage = zero;
  m.world = m.product();
  return m;
}
training_desc amp_fp16_adam() {
  training_desc t{};
  t.precision = precision::amp_fp16::value;
  t.optimizer = optim::adam<>::value;
  return t;
}
/// A decoder of `layers` blocks of width h, built by hand (only the fields the model reads).
model_desc blocks(std::uint64_t layers, std::uint64_t h, std::uint64_t heads, std::uint64_t kv_heads) {
  model_desc m{};
  layer_desc b{};
  b.name = "block";
  b.kind = layer_kind::transformer_block;
  b.place = placement::repeated;
  b.count = layers;
  b.params = 12 * h * h;
  b.shape.hidden = h;
  b.shape.heads = heads;
  b.shape.kv_heads = kv_heads;
  b.shape.head_dim = h / heads;
  b.shape.ffn = 4 * h;
  m.push(b);
  return m;
}
}  // namespace

TEST_CASE("ring collectives: 2(n-1)/n, (n-1)/n, chunks padded to ceil(S/n)") {
  CHECK(ring_all_reduce_sent(8_B, 4) == 12_B);      // 2·3·2
  CHECK(ring_all_reduce_sent(10_B, 4) == 18_B);     // 2·3·⌈10/4⌉
  CHECK(ring_reduce_scatter_sent(8_B, 4) == 6_B);
  CHECK(ring_all_gather_sent(8_B, 4) == 6_B);
  CHECK(all_to_all_sent(8_B, 4) == 6_B);
  for (auto f : {ring_all_reduce_sent, ring_reduce_scatter_sent, ring_all_gather_sent, all_to_all_sent})
    CHECK(f(1_GiB, 1) == 0_B);
  // Large n: all-reduce tends to twice the buffer, the others to the buffer (nccl-tests busbw).
  CHECK(ring_all_reduce_sent(1_GiB, 1024).ratio(1_GiB) == doctest::Approx(2.0 * 1023 / 1024));
}

TEST_CASE("ZeRO paper §7.2: stages 0, 1 and 2 move 2Ψ, stage 3 moves 3Ψ (1.5x)") {
  const std::uint64_t psi = 1ULL << 30, n = 64;
  const model_desc model = parameter_count_model(psi);
  const training_desc t = amp_fp16_adam();
  const bytes ring = bytes{2 * psi}.shard(n) * (n - 1);  // one reduce-scatter or all-gather of 2Ψ bytes
  CHECK(communication(model, t, make_mesh(n, 0)).data_parallel == ring * 2);
  CHECK(communication(model, t, make_mesh(n, 1)).data_parallel == ring * 2);
  CHECK(communication(model, t, make_mesh(n, 2)).data_parallel == ring * 2);
  CHECK(communication(model, t, make_mesh(n, 3)).data_parallel == ring * 3);
  // No parallelism beyond data: nothing unknown, nothing else sent.
  const comm_volume v = communication(model, t, make_mesh(n, 3));
  CHECK(v.activations_counted);
  CHECK(v.total() == v.data_parallel);
}

TEST_CASE("gradient accumulation: ZeRO-0/1 reduce once per step, ZeRO-2 per micro-batch, ZeRO-3 gathers per micro-batch") {
  const std::uint64_t psi = 1ULL << 30, n = 8;
  const model_desc model = parameter_count_model(psi);
  training_desc t = amp_fp16_adam();
  t.grad_accum = 4;
  const bytes ring = bytes{2 * psi}.shard(n) * (n - 1);
  CHECK(communication(model, t, make_mesh(n, 0)).data_parallel == ring * 2);
  CHECK(communication(model, t, make_mesh(n, 1)).data_parallel == ring * 2);
  CHECK(communication(model, t, make_mesh(n, 2)).data_parallel == ring * 4 + ring);
  CHECK(communication(model, t, make_mesh(n, 3)).data_parallel == ring * 3 * 4);
}

TEST_CASE("gradients reduce in their own dtype: amp-bf16 keeps fp32 main gradients") {
  const std::uint64_t psi = 1ULL << 30, n = 8;
  training_desc t{};
  t.precision = precision::amp_bf16::value;
  const bytes grads = bytes{4 * psi}, weights = bytes{2 * psi};
  CHECK(communication(parameter_count_model(psi), t, make_mesh(n, 0)).data_parallel ==
        ring_all_reduce_sent(grads, n));
  CHECK(communication(parameter_count_model(psi), t, make_mesh(n, 1)).data_parallel ==
        ring_reduce_scatter_sent(grads, n) + ring_all_gather_sent(weights, n));
}

TEST_CASE("Megatron tensor parallelism: four all-reduces of s·b·h per block per micro-batch (Shoeybi et al. 2019)") {
  const std::uint64_t s = 2048, b = 2, h = 4096, layers = 32, t_degree = 8;
  const model_desc model = blocks(layers, h, 32, 32);
  training_desc t = amp_fp16_adam();
  t.sequence = s;
  t.micro_batch = b;
  t.grad_accum = 3;
  const bytes boundary = bytes{2 * s * b * h};  // fp16 activations
  const comm_volume v = communication(model, t, make_mesh(1, 0, t_degree));
  CHECK(v.activations_counted);
  CHECK(v.tensor_parallel == ring_all_reduce_sent(boundary, t_degree) * (4 * layers * 3));
  CHECK(v.data_parallel == 0_B);
  // Sequence parallelism: all-gather + reduce-scatter, the same bytes.
  mesh_desc sp = make_mesh(1, 0, t_degree);
  sp.sequence_parallel = true;
  CHECK(communication(model, t, sp).tensor_parallel == v.tensor_parallel);
  // Full recomputation repeats the two forward all-reduces.
  t.recompute = recompute_kind::full;
  CHECK(communication(model, t, make_mesh(1, 0, t_degree)).tensor_parallel ==
        ring_all_reduce_sent(boundary, t_degree) * (6 * layers * 3));
  t.recompute = recompute_kind::selective;  // recomputes the attention core only: no extra traffic
  CHECK(communication(model, t, make_mesh(1, 0, t_degree)).tensor_parallel == v.tensor_parallel);
}

TEST_CASE("pipeline: a middle stage sends activations forward and gradients back, per micro-batch") {
  const std::uint64_t s = 1024, b = 1, h = 1024;
  const model_desc model = blocks(8, h, 16, 16);
  training_desc t = amp_fp16_adam();
  t.sequence = s;
  t.micro_batch = b;
  t.grad_accum = 8;
  const bytes boundary = bytes{2 * s * b * h};
  const mesh_desc m = make_mesh(1, 0, 1, 4);
  CHECK(stage_communication(model, t, m, 0).pipeline == boundary * 8);      // forward only
  CHECK(stage_communication(model, t, m, 3).pipeline == boundary * 8);      // backward only
  CHECK(stage_communication(model, t, m, 1).pipeline == boundary * 16);     // both
  CHECK(communication(model, t, m).pipeline == boundary * 16);
  // Interleaved, v chunks per rank: v times as many sends (Narayanan et al. 2021 §2.2).
  mesh_desc v2 = m;
  v2.schedule = pipeline_schedule::interleaved;
  v2.virtual_stages = 2;
  CHECK(stage_communication(model, t, v2, 1).pipeline == boundary * 32);
  CHECK(stage_communication(model, t, v2, 0).pipeline == boundary * (2 + 1) * 8);
  // With sequence parallelism a rank sends its 1/t of the boundary tensor.
  mesh_desc sp = make_mesh(1, 0, 2, 4);
  sp.sequence_parallel = true;
  CHECK(stage_communication(model, t, sp, 1).pipeline == boundary.shard(2) * 16);
}

TEST_CASE("context parallelism: 3(cp-1) key/value chunks per attention per micro-batch") {
  const std::uint64_t s = 8192, b = 1, h = 4096, heads = 32, kv = 8, layers = 4, cp = 4;
  const model_desc model = blocks(layers, h, heads, kv);
  training_desc t = amp_fp16_adam();
  t.sequence = s;
  t.micro_batch = b;
  const comm_volume v = communication(model, t, make_mesh(1, 0, 1, 1, cp));
  const bytes kv_chunk = bytes{2 * (s / cp) * b * kv * (h / heads) * 2};  // K and V, fp16
  CHECK(v.context_parallel == kv_chunk * (3 * (cp - 1) * layers));
}

TEST_CASE("expert parallelism: four all-to-all of the routed tokens per MoE block per micro-batch") {
  const std::uint64_t s = 1024, b = 1, h = 1024, ep = 4;
  model_desc model = blocks(2, h, 16, 16);
  model.entries[0].shape.flags = layer_flags::moe;
  model.entries[0].shape.experts = 8;
  model.entries[0].shape.top_k = 2;
  model.entries[0].expert_params = model.entries[0].params / 2;
  training_desc t = amp_fp16_adam();
  t.sequence = s;
  t.micro_batch = b;
  CHECK(communication(model, t, make_mesh(ep, 0)).expert_parallel == 0_B);  // experts replicated: no all-to-all
  mesh_desc with_ep = make_mesh(ep, 0);
  with_ep.ep = ep;
  CHECK(communication(model, t, with_ep).expert_parallel == all_to_all_sent(bytes{2 * s * b * 2 * h}, ep) * (4 * 2));
  // Expert gradients reduce over the expert data-parallel group dp/ep = 1: nothing.
  const comm_volume e = communication(model, t, with_ep);
  const std::uint64_t dense = model.entries[0].params / 2;
  CHECK(e.data_parallel == ring_all_reduce_sent(bytes{2 * dense * 2}, ep));
}

TEST_CASE("a parameter-count model cannot count activation traffic, and says so") {
  training_desc t = amp_fp16_adam();
  t.sequence = 4096;
  const model_desc model = parameter_count_model(7'000'000'000);
  CHECK(communication(model, t, make_mesh(8, 1)).activations_counted);
  CHECK_FALSE(communication(model, t, make_mesh(2, 1, 4)).activations_counted);
  CHECK_FALSE(communication(model, t, make_mesh(2, 1, 1, 4)).activations_counted);
  // Tensor parallelism still splits the gradients it reduces.
  CHECK(communication(model, t, make_mesh(2, 0, 4)).data_parallel ==
        ring_all_reduce_sent(bytes{7'000'000'000 / 4 * 2}, 2));  // fp16 gradients
}

TEST_CASE("the volume is a constant expression") {
  constexpr comm_volume v = communication(parameter_count_model(1'000'000), training_desc{}, mesh_desc{});
  static_assert(v.total() == bytes{});
  constexpr mesh_desc m = [] {
    mesh_desc x{};
    x.dp = 4;
    x.world = 4;
    return x;
  }();
  static_assert(communication(parameter_count_model(1'000'000), training_desc{}, m).data_parallel ==
                ring_all_reduce_sent(bytes{4'000'000}, 4));
}

// SPDX-License-Identifier: BSL-1.0
// Model-state algebra against its published sources.
#include <doctest/doctest.h>

#include <memalg/memalg.hpp>

using namespace memalg;
using namespace memalg::literals;

namespace {
mesh_desc data_parallel(std::uint64_t n, int zero_stage) {
  mesh_desc m{};
  m.dp = n;
  m.world = n;
  m.zero_stage = zero_stage;
  return m;
}
training_desc recipe(const precision_policy& p, const optimizer_desc& o) {
  training_desc t{};
  t.stack = stack_kind::paper;  // ZeRO's figures; PyTorch's DDP buckets: test_stacks.cpp
  t.precision = p;
  t.optimizer = o;
  return t;
}
bytes states(std::uint64_t params, const training_desc& t, const mesh_desc& m) {
  return evaluate(parameter_count_model(params), t, m, device::h100_80gb::value).per_rank.model_states();
}
}  // namespace

TEST_CASE("ZeRO paper: the stage formulas for several data-parallel degrees (Rajbhandari et al. 2020, §5)") {
  const training_desc t = recipe(precision::amp_fp16::value, optim::adam<>::value);
  const std::uint64_t psi = 7'500'000'000;
  const std::uint64_t k = 12;
  for (std::uint64_t nd : {1ULL, 2ULL, 4ULL, 8ULL, 16ULL, 64ULL, 100ULL, 1024ULL}) {
    CAPTURE(nd);
    const std::uint64_t shard = (psi + nd - 1) / nd;
    CHECK(states(psi, t, data_parallel(nd, 0)).value == (2 + 2 + k) * psi);
    CHECK(states(psi, t, data_parallel(nd, 1)).value == 2 * psi + 2 * psi + k * shard);
    CHECK(states(psi, t, data_parallel(nd, 2)).value == 2 * psi + (2 + k) * shard);
    CHECK(states(psi, t, data_parallel(nd, 3)).value == (2 + 2 + k) * shard);
  }
}

TEST_CASE("ZeRO paper Figure 1: 120, 31.4, 16.6, 1.9 GB") {
  const training_desc t = recipe(precision::amp_fp16::value, optim::adam<>::value);
  const std::uint64_t psi = 7'500'000'000;
  CHECK(to_string(states(psi, t, data_parallel(64, 0)), byte_unit::GB) == "120.00 GB");
  CHECK(to_string(states(psi, t, data_parallel(64, 1)), byte_unit::GB) == "31.41 GB");
  CHECK(to_string(states(psi, t, data_parallel(64, 2)), byte_unit::GB) == "16.64 GB");
  CHECK(to_string(states(psi, t, data_parallel(64, 3)), byte_unit::GB) == "1.88 GB");
}

TEST_CASE("Megatron-LM bytes per parameter, with and without the distributed optimizer") {
  // docs/user-guide/features/dist_optimizer.md: bf16 params + fp32 grads 18 vs 6 + 12/d;
  // fp32 params + fp32 grads 16 vs 8 + 8/d. The distributed optimizer is ZeRO-1.
  const std::uint64_t psi = 1'000'000'000;
  for (std::uint64_t d : {1ULL, 2ULL, 8ULL, 32ULL}) {
    CAPTURE(d);
    const training_desc bf16 = recipe(precision::amp_bf16::value, optim::adam<>::value);
    const training_desc fp32 = recipe(precision::fp32::value, optim::adam<>::value);
    CHECK(states(psi, bf16, data_parallel(d, 0)).value == 18 * psi);
    CHECK(states(psi, bf16, data_parallel(d, 1)).value == 6 * psi + 12 * psi / d);
    CHECK(states(psi, fp32, data_parallel(d, 0)).value == 16 * psi);
    CHECK(states(psi, fp32, data_parallel(d, 1)).value == 8 * psi + 8 * psi / d);
  }
}

TEST_CASE("every precision policy: bytes per parameter with Adam") {
  const std::uint64_t psi = 1000;
  const mesh_desc one = data_parallel(1, 0);
  CHECK(states(psi, recipe(precision::fp32::value, optim::adam<>::value), one).value == 16 * psi);
  CHECK(states(psi, recipe(precision::amp_fp16::value, optim::adam<>::value), one).value == 16 * psi);
  CHECK(states(psi, recipe(precision::amp_bf16::value, optim::adam<>::value), one).value == 18 * psi);
  CHECK(states(psi, recipe(precision::autocast_bf16::value, optim::adam<>::value), one).value == 16 * psi);
  CHECK(states(psi, recipe(precision::bf16::value, optim::adam<>::value), one).value == 8 * psi);
  // fp8: bf16 weights + fp8 value and transpose caches (2 + 2), fp32 main grads, master, Adam.
  CHECK(states(psi, recipe(precision::fp8::value, optim::adam<>::value), one).value == 20 * psi);
  const breakdown b = evaluate(parameter_count_model(psi), recipe(precision::amp_bf16::value, optim::adam<>::value),
                               one, device::h100_80gb::value).per_rank;
  CHECK(b.weights == bytes{2 * psi});
  CHECK(b.gradients == bytes{4 * psi});
  CHECK(b.master_weights == bytes{4 * psi});
  CHECK(b.optimizer_states == bytes{8 * psi});
}

struct fp16_everything {
  static constexpr precision_policy value{"fp16-all", dtypes::fp16, dtypes::fp16, dtypes::none, dtypes::fp16,
                                          dtypes::fp16};
};

TEST_CASE("users can define their own precision policy") {
  using p = plan<model::parameters<1000>, train::recipe<fp16_everything, optim::momentum<>>, parallel::mesh<>,
                 device::l4>;
  CHECK(p::per_rank.model_states() == bytes{(2 + 2 + 2) * 1000});
}

TEST_CASE("every optimizer: state bytes") {
  const std::uint64_t psi = 1'000'000;
  const mesh_desc one = data_parallel(1, 0);
  const auto opt = [&](const optimizer_desc& o) {
    return evaluate(parameter_count_model(psi), recipe(precision::fp32::value, o), one, device::h100_80gb::value)
        .per_rank.optimizer_states.value;
  };
  CHECK(opt(optim::sgd<>::value) == 0);
  CHECK(opt(optim::momentum<>::value) == 4 * psi);
  CHECK(opt(optim::adam<>::value) == 8 * psi);
  CHECK(opt(optim::adamw<>::value) == 8 * psi);
  CHECK(opt(optim::lion<>::value) == 4 * psi);
  // 8-bit Adam: two int8 states plus one fp32 scale per 2048 elements each.
  CHECK(opt(optim::adam8bit<>::value) == 2 * (psi + 4 * ((psi + 2047) / 2048)));
  CHECK(opt(optim::adam8bit<256>::value) == 2 * (psi + 4 * ((psi + 255) / 256)));
  // Adafactor on a parameter-count model cannot factor: one fp32 per parameter (upper bound).
  CHECK(opt(optim::adafactor<>::value) == 4 * psi);
  CHECK(opt(optim::adafactor<true>::value) == 8 * psi);
  // State dtype is configurable.
  CHECK(opt(optim::adam<optim::bf16_states>::value) == 4 * psi);
}

TEST_CASE("Adafactor factors matrices: r + c values per r x c matrix") {
  model_desc m{};
  layer_desc l{};
  l.name = "linear";
  l.kind = layer_kind::linear;
  l.params = 1024 * 4096 + 4096;  // weight + bias
  l.matrix_params = 1024 * 4096;
  l.matrix_rows_plus_cols = 1024 + 4096;
  m.push(l);
  const plan_result r = evaluate(m, recipe(precision::fp32::value, optim::adafactor<>::value), data_parallel(1, 0),
                                 device::h100_80gb::value);
  CHECK(r.per_rank.optimizer_states.value == 4 * (1024 + 4096 + 4096));
}

TEST_CASE("tensor and pipeline parallelism divide the parameters; uneven shards round up") {
  training_desc t = recipe(precision::amp_bf16::value, optim::adam<>::value);
  mesh_desc m{};
  m.tp = 4;
  m.pp = 2;
  m.world = 8;
  CHECK(states(1'000'000'001, t, m).value == 18ULL * 125'000'001ULL);  // ⌈1e9+1 / 8⌉ on the most loaded rank
}

TEST_CASE("expert parallelism splits only the expert parameters") {
  const training_desc t = recipe(precision::bf16::value, optim::sgd<>::value);
  mesh_desc m = data_parallel(8, 0);
  m.ep = 8;
  const bytes w = evaluate(parameter_count_model(1000, 800), t, m, device::h100_80gb::value).per_rank.weights;
  CHECK(w.value == 2 * (200 + 100));
}

TEST_CASE("ZeRO-3 gathers the largest layer: transient bytes appear in forward and backward") {
  const training_desc t = recipe(precision::amp_fp16::value, optim::adam<>::value);
  const mesh_desc m = data_parallel(8, 3);
  const plan_result r = evaluate(parameter_count_model(8'000'000, 0, 1'000'000), t, m, device::h100_80gb::value);
  CHECK(r.peak_phase == phase::backward);
  // (1 + prefetch) gathered fp16 copies + one fp16 unsharded gradient = 3 × 2 MB.
  CHECK(r.per_rank.temporaries.value == 3 * 2'000'000);
  CHECK(r.most_loaded.at[static_cast<int>(phase::steady)].temporaries.value == 0);
}

TEST_CASE("offload moves states to the host and reports them separately") {
  const training_desc t = recipe(precision::amp_fp16::value, optim::adam<>::value);
  mesh_desc m = data_parallel(4, 2);
  m.offload = offload_kind::optimizer;
  const plan_result r = evaluate(parameter_count_model(1'000'000), t, m, device::h100_80gb::value);
  CHECK(r.per_rank.master_weights.value == 0);
  CHECK(r.per_rank.optimizer_states.value == 0);
  CHECK(r.host_per_rank.master_weights.value == 4 * 250'000);
  CHECK(r.host_per_rank.optimizer_states.value == 8 * 250'000);
  m.zero_stage = 3;
  m.offload = offload_kind::params;
  const plan_result p = evaluate(parameter_count_model(1'000'000), t, m, device::h100_80gb::value);
  CHECK(p.per_rank.weights.value == 0);
  CHECK(p.host_per_rank.weights.value == 2 * 250'000);
}

TEST_CASE("invalid meshes are named") {
  mesh_desc m = data_parallel(4, 0);
  m.world = 8;
  CHECK(mesh_error(m) == "the parallel degrees dp*tp*pp*cp must multiply to the world size");
  m = data_parallel(0, 0);
  CHECK(mesh_error(m) == "every parallel degree must be at least 1");
  m = data_parallel(4, 5);
  CHECK(mesh_error(m) == "the ZeRO stage must be 0, 1, 2 or 3");
  m = data_parallel(4, 0);
  m.ep = 3;
  CHECK(mesh_error(m) == "the expert-parallel degree must divide dp*cp");
}

TEST_CASE("devices: catalog capacities, reserve, memory cap") {
  CHECK(device::a100_80gb::value.capacity == 80_GiB);
  CHECK(device::h100_80gb::value.capacity == 81559_MiB);
  CHECK(device::h200::value.capacity == 143771_MiB);
  CHECK(device::mi300x::value.capacity == bytes{205'822'885'888});
  CHECK(device::catalog.size() == 19);
  // The boards added for single-GPU users: driver totals, below their data-sheet GB.
  CHECK(device::t4::value.capacity == 15360_MiB);
  CHECK(device::a10g::value.capacity == 23028_MiB);
  CHECK(device::rtx_a6000::value.capacity == 49140_MiB);
  CHECK(device::rtx5090::value.capacity == 32607_MiB);
  CHECK(device::h100_pcie::value.capacity == 81559_MiB);
  CHECK(device::h100_nvl::value.capacity == 95830_MiB);
  // Capabilities: Volta and Turing lack bf16, Ampere lacks fp8, Hopper has both.
  CHECK_FALSE(device::v100_32gb::value.bf16);
  CHECK_FALSE(device::t4::value.bf16);
  CHECK(device::a100_80gb::value.bf16);
  CHECK_FALSE(device::a100_80gb::value.fp8);
  CHECK(device::h100_80gb::value.fp8);
  CHECK_FALSE(device::cpu::value.fp8);
  CHECK(precision_device_error(device::v100_16gb::value, true, false).find("bfloat16") != std::string_view::npos);
  CHECK(precision_device_error(device::a100_40gb::value, true, true).find("fp8") != std::string_view::npos);
  CHECK(precision_device_error(device::a100_40gb::value, true, false).empty());
  // A device by capacity alone: the catalog's largest default reserve.
  using mine24 = device::of_capacity<24ULL << 30>;
  CHECK(mine24::value.capacity == 24_GiB);
  CHECK(mine24::value.reserve == 544_MiB);
  CHECK(mine24::value.reserve == device::h100_80gb::value.reserve);
  using capped = device::capped<device::a100_80gb, 1, 2>;
  CHECK(capped::value.limit() == 40_GiB);
  CHECK(capped::value.usable() == 40_GiB - device::a100_80gb::value.reserve);
  using mine = device::with_reserve<device::custom<1'000'000, 0>, 1000>;
  CHECK(mine::value.usable() == bytes{999'000});
  device_desc d{};
  CHECK(device::from_name("h200", d));
  CHECK(d.name == "h200");
  CHECK_FALSE(device::from_name("tpu-v5", d));
  // A plan that fits without a cap does not fit with it.
  const training_desc t = recipe(precision::amp_bf16::value, optim::adam<>::value);
  d = device::a100_80gb::value;
  CHECK(evaluate(parameter_count_model(4'000'000'000), t, data_parallel(1, 0), d).fits);
  d.cap_numerator = 1;
  d.cap_denominator = 2;
  CHECK_FALSE(evaluate(parameter_count_model(4'000'000'000), t, data_parallel(1, 0), d).fits);
}

TEST_CASE("bytes: checked arithmetic at run time, formatting") {
  CHECK_THROWS_AS(bytes{~0ULL} + bytes{1}, std::overflow_error);
  CHECK_THROWS_AS(bytes{1ULL << 63} * 2, std::overflow_error);
  CHECK_THROWS_AS(bytes{1} - bytes{2}, std::underflow_error);
  // What is left after a release larger than the amount is nothing, not an underflow.
  CHECK(saturating_sub(bytes{1}, bytes{2}) == bytes{});
  CHECK(saturating_sub(bytes{7}, bytes{2}) == bytes{5});
  CHECK(saturating_sub(bytes{~0ULL}, bytes{~0ULL}) == bytes{});
  static_assert(saturating_sub(3_MiB, 1_MiB) == 2_MiB);
  CHECK(to_string(512_B) == "512 B");
  CHECK(to_string(1536_KiB) == "1.50 MiB");
  CHECK(to_string(3_GiB) == "3.00 GiB");
  CHECK(to_string(1023_GiB) == "1023.00 GiB");
  // Past a TiB the unit grows with the value (8 EiB printed as "8589934592.00 GiB" before).
  CHECK(to_string(1024_GiB) == "1.00 TiB");
  CHECK(to_string(bytes{5ULL << 49}) == "2.50 PiB");
  CHECK(to_string(bytes{8ULL << 60}) == "8.00 EiB");
  CHECK(to_string(bytes{1ULL << 40}, byte_unit::GiB) == "1024.00 GiB");
  CHECK(to_string(31'406'250'000_B, byte_unit::GB) == "31.41 GB");
}

TEST_CASE("dtypes: exact bits, packing, block scales") {
  CHECK(storage_bytes(dtypes::fp32, 10) == 40_B);
  CHECK(storage_bytes(dtypes::bf16, 10) == 20_B);
  CHECK(storage_bytes(dtypes::fp8_e5m2, 10) == 10_B);
  CHECK(storage_bytes(dtypes::int4, 5) == 3_B);
  CHECK(storage_bytes(dtypes::nf4, 128) == bytes{64 + 8});
  // Double quantization: 64 blocks of 64 → 64 one-byte scales + one fp32 second-level scale.
  CHECK(storage_bytes(dtypes::nf4_double_quant, 64 * 64) == bytes{2048 + 64 + 4});
  CHECK(effective_bits(dtypes::nf4) == doctest::Approx(4.5));
  CHECK(effective_bits(dtypes::nf4_double_quant) == doctest::Approx(4.127).epsilon(0.001));
  CHECK(storage_bytes(blockwise(dtypes::int8, 256), 1000) == bytes{1000 + 4 * 4});
  CHECK_FALSE(dtypes::tf32.storable);
  CHECK(dtype_from_name("fp8_e4m3").name == "fp8_e4m3");
  CHECK(dtype_from_name("fp9").is_none());
}

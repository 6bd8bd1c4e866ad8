// SPDX-License-Identifier: BSL-1.0
// The generation program (exec/gpt/build_generation.hpp) against memalg's serving plan
// (plan/serve.hpp, serve_stack::memalg): laid out in the plan's arena, its measured high-water
// mark of live bytes is the plan's to the byte; each decode step over the cache computes what a
// prefill over the prompt and the tokens generated so far computes; refusals carry a sentence.
#include <doctest/doctest.h>

#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/exec/gpt/generation_plan.hpp>
#include <memalg/exec/meter.hpp>
#include <memalg/exec/null_backend.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "../../examples/gpt_plans.hpp"

namespace m = memalg;
namespace ex = memalg::exec;
using local = m::backend::cpu::local_communicator;
using table = gpt_plans::on<gpt_plans::cpu_budget>;

namespace {

template <class Named>
struct generation_case {
  using plan = typename Named::plan;
  using run = ex::gpt_run<plan, local>;
  using backend_t = m::backend::cpu::step_backend<typename run::storage, local>;

  static ex::planned_generation planned(const ex::generation_request& r) {
    return ex::plan_generation(plan::model, r, plan::training.precision.weights, plan::device);
  }
  static ex::program program(const ex::generation_request& r) {
    const ex::planned_generation g = planned(r);
    return ex::build_generation(run::config, r, g.arena, g.cache, backend_t::storage_elem);
  }
  /// Prompt ids in [0, vocab) from a fixed stream.
  static std::vector<std::int32_t> prompt(const ex::generation_request& r, std::uint64_t seed = 7) {
    std::vector<std::int32_t> t(r.batch * r.prompt);
    for (std::size_t i = 0; i < t.size(); ++i)
      t[i] = static_cast<std::int32_t>(m::splitmix64(seed * 1000003 + i) % run::config.vocab);
    return t;
  }
  struct outcome {
    std::vector<std::int32_t> generated;
    std::vector<std::vector<float>> logits;  ///< at each greedy choice, B rows of V
    std::size_t measured = 0;
  };
  /// Runs the program op by op on the CPU backend with the meter; the logits at every argmax.
  static outcome generate(const ex::generation_request& r, const std::vector<std::int32_t>& ids) {
    const ex::program p = program(r);
    local dp, tp;
    backend_t b(p, dp, tp);
    outcome o;
    o.generated.assign(p.generated_per_micro, -1);
    ex::live_bytes_meter meter(p);
    ex::run_state s;
    ++s.step;
    b.begin_step(p, ex::step_io{ids, {}, {}, {}, o.generated}, s);
    std::uint64_t at = 0;
    for (const ex::op& op : p.micro) {
      std::visit(
          [&](const auto& x) {
            b(x, s);
            meter.record(x, at++);
            using O = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<O, ex::ops::argmax>) {
              const std::vector<std::byte> raw = b.read(x.logits);
              std::vector<float> f(x.logits.count);
              for (std::size_t i = 0; i < f.size(); ++i) {
                typename run::storage v;
                std::memcpy(&v, raw.data() + i * sizeof v, sizeof v);
                f[i] = static_cast<float>(m::to_float(v));
              }
              o.logits.push_back(std::move(f));
            }
          },
          op.body);
    }
    b.end_step(p, s);
    meter.end_step();
    o.measured = meter.high_water();
    return o;
  }
};

/// Arena = plan: layout and measured high-water both equal the serving plan's arena.
template <class Named>
void check_arena(const ex::generation_request& r) {
  using G = generation_case<Named>;
  CAPTURE(Named::name);
  CAPTURE(r.batch);
  CAPTURE(r.prompt);
  CAPTURE(r.new_tokens);
  const ex::planned_generation g = G::planned(r);
  const ex::program p = G::program(r);
  CHECK(p.high_water == g.arena_bytes());
  const auto o = G::generate(r, G::prompt(r));
  CHECK(o.measured == g.arena_bytes());
  for (std::int32_t t : o.generated) CHECK((t >= 0 && static_cast<std::size_t>(t) < G::run::config.vocab));
}

/// Decode step k's logits are a prefill's over the prompt and the k tokens generated before it.
template <class Named>
void check_decode_is_prefill(double tolerance) {
  using G = generation_case<Named>;
  CAPTURE(Named::name);
  const ex::generation_request r{2, 20, 6};
  const std::vector<std::int32_t> ids = G::prompt(r);
  const auto full = G::generate(r, ids);
  REQUIRE(full.logits.size() == r.new_tokens);
  for (std::size_t k = 1; k < r.new_tokens; ++k) {
    const ex::generation_request longer{r.batch, r.prompt + k, 1};
    std::vector<std::int32_t> ext;
    for (std::size_t b = 0; b < r.batch; ++b) {
      ext.insert(ext.end(), ids.begin() + static_cast<std::ptrdiff_t>(b * r.prompt),
                 ids.begin() + static_cast<std::ptrdiff_t>((b + 1) * r.prompt));
      for (std::size_t j = 0; j < k; ++j) ext.push_back(full.generated[j * r.batch + b]);
    }
    const auto once = G::generate(longer, ext);
    CAPTURE(k);
    double worst = 0;
    for (std::size_t i = 0; i < once.logits[0].size(); ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(once.logits[0][i] - full.logits[k][i])));
    CHECK(worst <= tolerance);
    for (std::size_t b = 0; b < r.batch; ++b) CHECK(once.generated[b] == full.generated[k * r.batch + b]);
  }
}

}  // namespace

TEST_CASE("generation: the measured arena is the serving plan's, to the byte") {
  for (const ex::generation_request& r : {ex::generation_request{1, 1, 1}, ex::generation_request{3, 17, 5},
                                          ex::generation_request{2, 33, 9}}) {
    check_arena<table::tiny_fp32>(r);
    check_arena<table::tiny_bf16>(r);  // bf16 naive probabilities of 17² need padding
    check_arena<table::tiny_fp16>(r);
    check_arena<table::tiny_recompute>(r);  // dropout and recomputation are training's: generation has neither
    check_arena<table::llama_fp32_plan>(r);
    check_arena<table::llama_bf16_plan>(r);
    check_arena<table::qwen2_fp32_plan>(r);
    check_arena<table::qwen3_fp32_plan>(r);
    check_arena<table::qwen3_bf16_plan>(r);
  }
}

TEST_CASE("generation: a decode step over the cache is a prefill over the tokens so far") {
  // Naive attention with learned positions; flash attention with rotary positions, grouped keys
  // and values, and Qwen3's QK-norms. The decode steps attend over the cache with another kernel
  // than the prefill's, so the logits agree to rounding, the greedy tokens exactly.
  check_decode_is_prefill<table::tiny_fp32>(1e-5);
  check_decode_is_prefill<table::llama_fp32_plan>(1e-5);
  check_decode_is_prefill<table::qwen3_fp32_plan>(1e-5);
}

TEST_CASE("generation: the plan's arena grows with the cache, not with anything a step does not hold") {
  using G = generation_case<table::qwen3_fp32_plan>;
  const auto a = G::planned({2, 16, 8}), b = G::planned({2, 16, 9});
  // One more new token: one more cache position per sequence in every layer, nothing else.
  const std::uint64_t per_position = 2 * 2 * 2 * 32 * 4;  // 2 sequences × (k, v) × 2 heads × 32 wide × fp32
  CHECK(b.arena.persistent - a.arena.persistent == 4 * per_position);  // 4 layers
  CHECK(b.arena.stack == a.arena.stack);
  // The values of the prompt and of the weights change no byte.
  const ex::generation_request r{2, 16, 8};
  CHECK(G::generate(r, G::prompt(r, 1)).measured == G::generate(r, G::prompt(r, 2)).measured);
}

TEST_CASE("generation: the program lies where the serving plan puts it, or is refused") {
  using G = generation_case<table::qwen3_fp32_plan>;
  const ex::generation_request r{2, 16, 4};
  ex::planned_generation g = G::planned(r);
  const ex::program p = G::program(r);
  // Every layer's cache at the plan's offset, after the weights.
  std::size_t layer = 0;
  for (const ex::persistent_tensor& t : p.persistent)
    if (t.name.find(".kv_cache") != std::string::npos) {
      CHECK(t.t.offset == g.cache.offset + layer * g.cache.layer_bytes);
      ++layer;
    }
  CHECK(layer == 4);
  ex::cache_placement moved = g.cache;
  moved.offset += 16;
  CHECK_THROWS_WITH_AS(ex::build_generation(G::run::config, r, g.arena, moved, G::backend_t::storage_elem),
                       doctest::Contains("not where the serving plan puts it"), ex::arena_error);
  ex::arena_sizes small = g.arena;
  small.stack -= 16;
  CHECK_THROWS_AS(ex::build_generation(G::run::config, r, small, g.cache, G::backend_t::storage_elem), ex::arena_error);
  // GPT-2's learned positions end at 64: a prompt and new tokens beyond them are refused.
  using T = generation_case<table::tiny_fp32>;
  const ex::generation_request far{1, 60, 6};
  const ex::planned_generation gf = T::planned(far);
  CHECK_THROWS_WITH_AS(ex::build_generation(T::run::config, far, gf.arena, gf.cache, T::backend_t::storage_elem),
                       doctest::Contains("more positions than the position embedding holds"), ex::program_error);
}

TEST_CASE("generation: memalg's serving stack refuses what its runtime does not run, with a sentence") {
  constexpr m::model_desc qwen3 = table::qwen3_fp32_plan::plan::model;
  m::serving_desc d = ex::generation_serving({1, 8, 4}, m::dtypes::fp32);
  CHECK(m::serving_error(qwen3, d).empty());
  const auto refused = [&](m::serving_desc x, const char* why) {
    CAPTURE(why);
    CHECK(std::string(m::serving_error(qwen3, x)).find(why) != std::string::npos);
    CHECK(!m::evaluate_serving(qwen3, x, m::device::h100_80gb::value).reason.empty());
  };
  m::serving_desc x = d;
  x.tp = 2;
  refused(x, "on one device");
  x = d;
  x.weights = m::dtypes::fp8_e4m3;
  refused(x, "no quantized weights");
  x = d;
  x.cache = m::kv_cache_kind::paged;
  refused(x, "not paged");
  x = d;
  x.prefill_chunk = 4;
  refused(x, "whole prompt");
  x = d;
  x.new_tokens = 0;
  refused(x, "at least one new token");
  x = d;
  x.max_cache_len = 100;
  refused(x, "exactly the tokens fed");
  // A parallel block (GPT-NeoX's) is not what the generation program runs.
  m::serving_desc n = ex::generation_serving({1, 8, 4}, m::dtypes::fp32);
  CHECK(std::string(m::serving_error(table::neox_fp32_plan::plan::model, n)).find("sequential dense blocks") !=
        std::string::npos);
  CHECK_THROWS_WITH_AS(ex::plan_generation(table::neox_fp32_plan::plan::model, {1, 8, 4}, m::dtypes::fp32,
                                           m::device::h100_80gb::value),
                       doctest::Contains("sequential dense blocks"), ex::program_error);
}

TEST_CASE("generation: the program's ops declare what their kernels touch (dry run on the null backend)") {
  using G = generation_case<table::llama_bf16_plan>;
  const ex::generation_request r{4, 40, 10};
  const ex::program p = G::program(r);
  ex::null_backend b(p);
  ex::live_bytes_meter meter(p);
  ex::run_state s;
  std::vector<std::int32_t> ids(r.batch * r.prompt, 1), gen(p.generated_per_micro);
  ex::run(p, b, ex::step_io{ids, {}, {}, {}, gen}, s, meter);
  CHECK(meter.high_water() == G::planned(r).arena_bytes());
  CHECK(meter.unplaced_ops() == 0);
  // The prefill and 9 decode steps, each ending in one greedy choice.
  std::size_t choices = 0;
  for (const ex::op& o : p.micro) choices += std::holds_alternative<ex::ops::argmax>(o.body) ? 1 : 0;
  CHECK(choices == r.new_tokens);
}

// SPDX-License-Identifier: BSL-1.0
// The moments of a step (plan/events.hpp): in the step's order, and the planner's phases as their
// maxima, for every stack, recomputation, pipelines and ZeRO stages.
#include <doctest/doctest.h>

#include <memalg/memalg.hpp>

#include <cstdint>

using namespace memalg;

namespace {
training_desc training(stack_kind s, std::uint64_t b, std::uint64_t seq, recompute_kind rk = recompute_kind::none,
                       std::uint64_t accum = 1) {
  training_desc t = train::recipe<precision::amp_bf16, optim::adamw<>>::value;
  t.stack = s;
  t.micro_batch = b;
  t.sequence = seq;
  t.recompute = rk;
  t.grad_accum = accum;
  return t;
}
constexpr mesh_desc mesh(std::uint64_t dp = 1, std::uint64_t tp = 1, std::uint64_t pp = 1, int zero = 0) {
  mesh_desc m{};
  m.dp = dp;
  m.tp = tp;
  m.pp = pp;
  m.zero_stage = zero;
  m.world = dp * tp * pp;
  return m;
}

/// Every event's phase maxima are the plan's phases, the first largest event is the plan's peak,
/// and the kinds come in the step's order.
void check_events(const model_desc& model, const training_desc& t, const mesh_desc& m, const device_desc& d) {
  const plan_result r = evaluate(model, t, m, d);
  const step_events e = plan_events(model, t, m, d, r);
  REQUIRE(e.size >= 5);
  CHECK(e.stage == r.most_loaded_stage);
  bytes highest[phase_count]{};
  bytes reduction{};
  int order = 0;  // 0 steady, 1 forward, 2 backward, 3 reduction, 4 optimizer step
  for (const step_event& ev : e) {
    const std::size_t p = static_cast<std::size_t>(ev.in_phase);
    int rank = 0;
    switch (ev.kind) {
      case step_event_kind::steady: rank = 0; break;
      case step_event_kind::teacher:
      case step_event_kind::forward: rank = 1; break;
      case step_event_kind::loss:
      case step_event_kind::backward:
      case step_event_kind::backward_last:
      case step_event_kind::backward_tail: rank = 2; break;
      case step_event_kind::reduction: rank = 3; break;
      case step_event_kind::optimizer_step: rank = 4; break;
    }
    CHECK(rank >= order);
    order = rank;
    if (ev.kind == step_event_kind::reduction) reduction = ev.bytes_at.total();
    else highest[p] = max(highest[p], ev.bytes_at.total());
  }
  for (std::size_t p = 0; p < phase_count; ++p) CHECK(highest[p] == r.most_loaded.at[p].total());
  CHECK(reduction <= r.most_loaded.at[static_cast<std::size_t>(phase::backward)].total());
  CHECK(reduction.value > 0);
  CHECK(e.events[e.peak].bytes_at.total() == r.peak());
  CHECK(e.events[e.peak].in_phase == r.peak_phase);
  CHECK(e.events[e.peak].bytes_at == r.per_rank);
}
}  // namespace

TEST_CASE("the step's moments have the plan's phases as their maxima, stack by stack") {
  const model_desc gpt2 = transformer_lm(presets::gpt2_124m::config);
  const device_desc h200 = device::h200::value;
  for (const stack_kind s : {stack_kind::pytorch, stack_kind::memalg, stack_kind::paper, stack_kind::megatron}) {
    CAPTURE(static_cast<int>(s));
    check_events(gpt2, training(s, 8, 1024), mesh(), h200);
    check_events(gpt2, training(s, 8, 1024, recompute_kind::full), mesh(8, 1, 1, 1), h200);
    check_events(gpt2, training(s, 4, 1024, recompute_kind::selective, 4), mesh(2, 1, 2, 0), h200);
    check_events(gpt2, training(s, 4, 1024, recompute_kind::none, 2), mesh(8, 1, 1, 2), h200);
    check_events(gpt2, training(s, 4, 1024), mesh(8, 1, 1, 3), h200);
  }
  const model_desc llama = transformer_lm(presets::llama2_7b::config);
  check_events(llama, training(stack_kind::pytorch, 1, 4096), mesh(8, 1, 1, 1), h200);
  check_events(llama, training(stack_kind::megatron, 1, 4096, recompute_kind::selective), mesh(2, 2, 2, 1), h200);
}

TEST_CASE("pytorch: the loss's backward is its own moment, before the output's, and can be the peak") {
  // Llama 2 7B at 4096 tokens, autocast, ZeRO-1 over 8 ranks (docs/cli.md's picture): the loss's
  // backward holds the fp32 log-softmax and the two logits-sized gradients on all the saved
  // activations.
  const model_desc llama = transformer_lm(presets::llama2_7b::config);
  training_desc t = train::recipe<precision::autocast_bf16, optim::adamw<>>::value;
  t.micro_batch = 1;
  t.sequence = 4096;
  check_events(llama, t, mesh(8, 1, 1, 1), device::a100_80gb::value);
  const plan_result r = evaluate(llama, t, mesh(8, 1, 1, 1), device::a100_80gb::value);
  const step_events e = plan_events(llama, t, mesh(8, 1, 1, 1), device::a100_80gb::value, r);
  std::size_t losses = 0, at = 0;
  for (std::size_t i = 0; i < e.size; ++i)
    if (e.events[i].kind == step_event_kind::loss) {
      ++losses;
      at = i;
    }
  REQUIRE(losses == 1);
  CHECK(e.events[at + 1].kind == step_event_kind::backward);
  CHECK(e.events[at + 1].entry == e.events[at].entry);
  CHECK(llama.entries[e.events[at].entry].kind == layer_kind::output);
  CHECK(e.peak == at);
  // The moments before it in backward: none; after it the output's own backward, lower.
  CHECK(e.events[at - 1].in_phase == phase::forward);
  CHECK(e.events[at + 1].bytes_at.total() < e.events[at].bytes_at.total());
}

TEST_CASE("a model given by its parameter count: the four phases and the reduction") {
  const model_desc m = parameter_count_model(7'000'000'000);
  training_desc t = training(stack_kind::paper, 1, 0);
  check_events(m, t, mesh(8, 1, 1, 1), device::h200::value);
  const step_events e = stage_events(m, t, mesh(8, 1, 1, 1), device::h200::value, 0);
  CHECK(e.size == 5);
}

TEST_CASE("the moments are computed at compile time") {
  constexpr model_desc m = transformer_lm(presets::gpt2_124m::config);
  constexpr training_desc t = [] {
    training_desc x = train::recipe<precision::amp_bf16, optim::adamw<>>::value;
    x.micro_batch = 4;
    x.sequence = 1024;
    return x;
  }();
  constexpr step_events e = stage_events(m, t, mesh(), device::h200::value, 0);
  static_assert(e.size > 2 * m.size);
  static_assert(e.events[e.peak].bytes_at.total() == evaluate(m, t, mesh(), device::h200::value).peak());
  CHECK(e.events[e.peak].in_phase == phase::backward);
}

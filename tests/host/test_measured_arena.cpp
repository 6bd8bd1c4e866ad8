// SPDX-License-Identifier: BSL-1.0
// The arena's measured high-water mark of live bytes against the plan, over a generated matrix.
//
// One rank (runtime_plans.hpp's memory_matrix_single: GPT-2-, Llama-, GPT-NeoX- and Falcon-style,
// fp32 / mixed bf16 / amp fp16, recomputation none / selective / full): the CPU step backend
// executes two steps and its live-bytes meter (backend/cpu/step_backend.hpp), which sees only the
// operands the executed ops read and write, must reach exactly the plan's per-rank peak; so must
// the program's layout (under selective recomputation too: a block's backward releases the MLP's
// tensors before its attention side). Several ranks
// (memory_matrix_multi: dp2 ZeRO-1/2/3, tp2, dp2×tp2): every rank's program is built and run on
// the null backend in this process and its layout must reach the plan; the measured figure of
// those comes from real MPI jobs (tests/mpi/test_measured_arena.cpp).
// Also: the meter counts what an op uses outside the layout, so it is not the layout's figure.
#include <doctest/doctest.h>

#include "runtime_plans.hpp"

#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/backend/cpu/step_backend.hpp>
#include <memalg/exec/gpt/build_program.hpp>
#include <memalg/exec/gpt/plan.hpp>
#include <memalg/exec/null_backend.hpp>
#include <memalg/exec/run.hpp>

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

namespace m = memalg;
using comm = m::backend::cpu::local_communicator;

namespace {
using namespace memalg_test;

template <class Plan>
constexpr std::size_t predicted_arena() {
  return static_cast<std::size_t>((Plan::result.per_rank.total() - Plan::result.per_rank.reserve).value);
}

template <class Plan>
void check_single() {
  using run = m::exec::gpt_run<Plan, comm>;
  comm dp, tp;
  typename run::trainer t(run::config, run::arena, dp, tp);
  const std::size_t n = run::config.grad_accum * run::config.micro_batch * run::config.sequence;
  CHECK(t.backend().measured_high_water() == 0);  // nothing measured before a step
  for (int s = 0; s < 2; ++s) t.train_step(ids(n, s), ids(n, s + 1));
  CAPTURE(t.backend().measured_peak_op());
  CHECK(t.backend().unplaced_ops() == 0);
  CHECK(t.backend().measured_high_water() == predicted_arena<Plan>());
  CHECK(t.memory().high_water() == predicted_arena<Plan>());
  CHECK(short_plan_refused(run::config, run::arena));  // the plan is tight: 16 bytes less is refused
}

template <class Plan>
void check_ranks() {
  using run = m::exec::gpt_run<Plan, m::exec::null_communicator>;
  constexpr m::mesh_desc mesh = Plan::mesh;
  for (std::size_t d = 0; d < mesh.dp; ++d)
    for (std::size_t r = 0; r < mesh.tp; ++r) {
      CAPTURE(d);
      CAPTURE(r);
      const m::exec::program prog = m::exec::build_program(run::config, run::arena, {d, r});
      m::exec::null_backend b(prog);
      m::exec::run_state s;
      const std::vector<std::int32_t> tok = ids(prog.grad_accum * prog.tokens_per_micro, 0), tgt = ids(tok.size(), 1);
      m::exec::run(prog, b, {tok, tgt}, s);
      CHECK(prog.high_water == predicted_arena<Plan>());
    }
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("one rank: the measured arena is the plan's", Plan, measured_single) { check_single<Plan>(); }
TEST_CASE_TEMPLATE_APPLY(measured_single, memory_matrix_single);
// The runtime's own matrix (dropout, accumulation, every-K recomputation, SGD and momentum): the
// meter reaches the plan (with dropout too: a block's MLP dropout mask goes once the dropout
// backward has read it; under selective recomputation too: the MLP's tensors go before the
// attention backward rebuilds the core).
TEST_CASE_TEMPLATE_DEFINE("the runtime's matrix: the measured arena is the plan's", Plan, measured_bound) {
  using run = m::exec::gpt_run<Plan, comm>;
  comm dp, tp;
  typename run::trainer t(run::config, run::arena, dp, tp);
  const std::size_t n = run::config.grad_accum * run::config.micro_batch * run::config.sequence;
  t.train_step(ids(n, 0), ids(n, 1));
  CAPTURE(t.backend().measured_peak_op());
  CHECK(t.backend().measured_high_water() == predicted_arena<Plan>());
  CHECK(t.backend().unplaced_ops() == 0);
}
TEST_CASE_TEMPLATE_APPLY(measured_bound, runtime_matrix);
TEST_CASE_TEMPLATE_DEFINE("several ranks: every rank's program reaches the plan", Plan, measured_multi) { check_ranks<Plan>(); }
TEST_CASE_TEMPLATE_APPLY(measured_multi, memory_matrix_multi);

TEST_CASE("the meter measures the executed ops, not the arena's size nor its layout") {
  using plan = std::tuple_element_t<0, memory_matrix_single>;
  using run = m::exec::gpt_run<plan, comm>;
  std::size_t unplaced = 0;
  const auto measure = [&](const m::exec::program& p) {
    const std::vector<std::int32_t> tok = ids(p.grad_accum * p.tokens_per_micro, 0), tgt = ids(tok.size(), 1);
    comm dp, tp;
    m::backend::cpu::step_backend<float, comm> b(p, dp, tp);
    m::exec::run_state s;
    m::exec::run(p, b, {tok, tgt}, s);
    unplaced = b.unplaced_ops();
    return b.measured_high_water();
  };
  const m::exec::program base = m::exec::build_program(run::config, run::arena);
  REQUIRE(measure(base) == base.high_water);
  CHECK(unplaced == 0);

  // Without the trace the meter cannot tell the stacks apart: one stack from the persistent region
  // up, every live stack value outside what a layout placed, and the transient stack's live values
  // at the arena's end make the whole arena.
  m::exec::program untraced = base;
  untraced.trace.clear();
  CHECK(measure(untraced) == base.sizes.persistent + base.sizes.stack);
  CHECK(unplaced > 0);

  // 4 KiB more of either region: not counted while no op touches them.
  constexpr std::size_t spare = 4096;
  const m::exec::program wide_stack = m::exec::build_program(run::config, {run::arena.persistent, run::arena.stack + spare});
  CHECK(measure(wide_stack) == base.high_water);
  m::exec::program wide_states = m::exec::build_program(run::config, {run::arena.persistent + spare, run::arena.stack});
  CHECK(measure(wide_states) == base.high_water);
  // An op that reads the spare persistent bytes (a norm that does not count them): now they are.
  const m::exec::operand unused{run::arena.persistent, spare / 4, m::exec::elem::f32, m::exec::where::arena};
  wide_states.step_end.insert(wide_states.step_end.begin(), m::exec::op{m::exec::ops::sqnorm{unused, false}});
  CHECK(measure(wide_states) == base.high_water + spare);

  // Without the loss and the backward no activation is read back after the forward: the layout
  // (still the full step's) places far more than the ops keep live.
  m::exec::program forward_only = base;
  std::size_t loss_at = 0;
  while (loss_at < forward_only.micro.size() && !std::holds_alternative<m::exec::ops::loss>(forward_only.micro[loss_at].body))
    ++loss_at;
  REQUIRE(loss_at < forward_only.micro.size());
  forward_only.micro.resize(loss_at);
  const std::size_t forward = measure(forward_only);
  CHECK(forward > base.persistent_bytes);
  CHECK(forward < base.high_water);
}

// SPDX-License-Identifier: BSL-1.0
// The arena's measured high-water mark of live bytes against the plan, over a generated matrix.
//
// One rank (runtime_plans.hpp's memory_matrix_single: GPT-2-, Llama-, GPT-NeoX- and Falcon-style,
// fp32 / mixed bf16 / amp fp16, recomputation none / selective / full): the CPU step backend
// executes two steps and the interpreter's live-bytes meter (exec/meter.hpp), which sees only the
// operands the executed ops declare they read and write, must reach exactly the plan's per-rank
// peak; so must the program's layout (under selective recomputation too: a block's backward
// releases the MLP's tensors before its attention side). Several ranks (memory_matrix_multi: dp2
// ZeRO-1/2/3, tp2, dp2×tp2): every rank's program is built and run on the null backend in this
// process, and its layout and the meter (the same on every backend) must reach the plan; real MPI
// jobs measure them too (tests/mpi/test_measured_arena.cpp).
// Also: the meter counts what an op uses outside the layout, so it is not the layout's figure;
// plans that are wrong (over the ops, under them) are caught; and the CPU backend holds each
// kernel to its op's declared accesses, so that what the meter counts is what the kernels did.
#include <doctest/doctest.h>

#include "runtime_plans.hpp"

#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/backend/cpu/step_backend.hpp>
#include <memalg/exec/gpt/build_program.hpp>
#include <memalg/exec/gpt/plan.hpp>
#include <memalg/exec/meter.hpp>
#include <memalg/exec/null_backend.hpp>
#include <memalg/exec/run.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
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
  CHECK(t.meter().high_water() == 0);  // nothing measured before a step
  for (int s = 0; s < 2; ++s) t.train_step(ids(n, s), ids(n, s + 1));
  CAPTURE(t.meter().peak_op());
  CHECK(t.meter().unplaced_ops() == 0);
  CHECK(t.meter().high_water() == predicted_arena<Plan>());
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
      m::exec::live_bytes_meter meter(prog);
      const std::vector<std::int32_t> tok = ids(prog.grad_accum * prog.tokens_per_micro, 0), tgt = ids(tok.size(), 1);
      m::exec::run(prog, b, {tok, tgt}, s, meter);
      CHECK(prog.high_water == predicted_arena<Plan>());
      CAPTURE(meter.peak_op());
      CHECK(meter.high_water() == predicted_arena<Plan>());
      CHECK(meter.unplaced_ops() == 0);
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
  CAPTURE(t.meter().peak_op());
  CHECK(t.meter().high_water() == predicted_arena<Plan>());
  CHECK(t.meter().unplaced_ops() == 0);
}
TEST_CASE_TEMPLATE_APPLY(measured_bound, runtime_matrix);
TEST_CASE_TEMPLATE_DEFINE("several ranks: every rank's program reaches the plan", Plan, measured_multi) { check_ranks<Plan>(); }
TEST_CASE_TEMPLATE_APPLY(measured_multi, memory_matrix_multi);

TEST_CASE("the meter measures the executed ops, not the arena's size nor its layout") {
  using plan = std::tuple_element_t<0, memory_matrix_single>;
  using run = m::exec::gpt_run<plan, comm>;
  std::size_t unplaced = 0;
  const auto measure_on = [&](const m::exec::program& p, auto& b) {
    const std::vector<std::int32_t> tok = ids(p.grad_accum * p.tokens_per_micro, 0), tgt = ids(tok.size(), 1);
    m::exec::run_state s;
    m::exec::live_bytes_meter meter(p);
    m::exec::run(p, b, {tok, tgt}, s, meter);
    unplaced = meter.unplaced_ops();
    return meter.high_water();
  };
  const auto measure = [&](const m::exec::program& p) {
    comm dp, tp;
    m::backend::cpu::step_backend<float, comm> b(p, dp, tp);
    return measure_on(p, b);
  };
  const m::exec::program base = m::exec::build_program(run::config, run::arena);
  REQUIRE(measure(base) == base.high_water);
  CHECK(unplaced == 0);
  // Every event of the trace says how many of the step's ops come before it, in the order
  // exec::run runs them: never decreasing, never past the step's last op.
  const std::size_t step_ops = base.step_begin.size() + base.grad_accum * base.micro.size() + base.step_end.size();
  std::uint64_t last_at = 0;
  for (const m::exec::arena_event& e : base.trace) {
    if (e.kind == m::exec::arena_layout::event_kind::persistent) continue;
    CHECK(e.at >= last_at);
    CHECK(e.at <= step_ops);
    last_at = e.at;
  }
  CHECK(last_at > 0);
  // Without those times the meter replays the pops on the way to the pushes, as before.
  m::exec::program untimed = base;
  for (m::exec::arena_event& e : untimed.trace) e.at = 0;
  CHECK(measure(untimed) == base.high_water);
  // The same on a backend that executes nothing: the meter reads the ops' declarations.
  m::exec::null_backend null(base);
  CHECK(measure_on(base, null) == base.high_water);

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
  // A plan that over-predicts (4 KiB more of stack than the step needs) is caught: the meter stays
  // at what the ops use, below the plan.
  CHECK(measure(wide_stack) < wide_stack.sizes.persistent + wide_stack.sizes.stack);
  // An op that uses bytes its plan does not hold (a norm over the spare persistent bytes, which
  // the layout never placed) is caught: the meter counts them, above the layout's high water.
  const m::exec::operand unused{run::arena.persistent, spare / 4, m::exec::elem::f32, m::exec::where::arena};
  wide_states.step_end.insert(wide_states.step_end.begin(), m::exec::op{m::exec::ops::sqnorm{unused, false}});
  CHECK(measure(wide_states) == base.high_water + spare);
  CHECK(measure(wide_states) > wide_states.high_water);
  // A plan that under-predicts (its arena 16 bytes short, the ops where the step needs them) is
  // refused: the CPU backend does not take it, and on a backend that checks nothing the meter
  // refuses the first op whose operand lies past the arena.
  m::exec::program shrunk = base;
  shrunk.sizes.stack -= 16;
  {
    comm dp, tp;
    CHECK_THROWS_AS((m::backend::cpu::step_backend<float, comm>(shrunk, dp, tp)), std::invalid_argument);
    m::exec::null_backend nothing(shrunk);
    CHECK_THROWS_WITH_AS(measure_on(shrunk, nothing), doctest::Contains("outside the program's arena"), std::invalid_argument);
  }

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

TEST_CASE("the CPU backend holds each kernel to its op's declared accesses") {
  namespace ex = m::exec;
  const ex::operand a{0, 16, ex::elem::f32, ex::where::arena}, b{64, 16, ex::elem::f32, ex::where::arena};
  const ex::access_list copy = ex::ops::accesses(ex::ops::copy{b, a});  // writes b, reads a
  REQUIRE(copy.size() == 2);
  m::backend::cpu::declared_accesses d;
  d.open(copy);
  CHECK_NOTHROW(d.check(a, ex::access::read));
  CHECK_NOTHROW(d.check(ex::operand{16, 4, ex::elem::f32, ex::where::arena}, ex::access::read));  // within a
  // A kernel that reads an operand declared written only, or that touches bytes no operand names.
  CHECK_THROWS_WITH_AS(d.check(b, ex::access::read), doctest::Contains("reads an operand its op does not declare read"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(d.check(a, ex::access::update), doctest::Contains("updates an operand"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(d.check(ex::operand{60, 2, ex::elem::f32, ex::where::arena}, ex::access::write),
                       doctest::Contains("outside the operands its op declares"), std::invalid_argument);
  // A declared operand the kernel never wrote.
  CHECK_THROWS_WITH_AS(d.require_all_accessed(), doctest::Contains("declares an operand written"), std::invalid_argument);
  d.check(b, ex::access::write);
  CHECK_NOTHROW(d.require_all_accessed());
  d.close();
  CHECK_NOTHROW(d.check(b, ex::access::read));  // outside an op (tests, checkpoints) nothing is checked

  // Through the backend: an optimizer op that names a second state the momentum optimizer does not
  // have is a declaration its kernel does not follow.
  ex::program p;
  p.sizes = {0, 4096};
  p.hp.optimizer = m::optimizer_kind::momentum;
  comm dp, tp;
  m::backend::cpu::step_backend<float, comm> backend(p, dp, tp);
  ex::run_state s;
  const auto at = [](std::uint64_t i) { return ex::operand{i * 64, 16, ex::elem::f32, ex::where::arena}; };
  CHECK_NOTHROW(backend(ex::ops::optimizer_update{at(0), {}, at(1), {}, at(3), 0.0f}, s));
  CHECK_THROWS_WITH_AS(backend(ex::ops::optimizer_update{at(0), {}, at(1), at(2), at(3), 0.0f}, s),
                       doctest::Contains("declares an operand updated"), std::invalid_argument);
  CHECK_NOTHROW(backend(ex::ops::optimizer_update{at(0), {}, at(1), {}, at(3), 0.0f}, s));  // the check closed with the op
}

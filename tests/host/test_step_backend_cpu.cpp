// SPDX-License-Identifier: BSL-1.0
// The step program executed by the CPU step backend against the golden trajectories
// (tests/data/golden/np1.txt, recorded from the retired reference trainer): bit-identical losses,
// gradient norms, weights and states.
//
// For every single-rank plan of the runtime's matrix (fp32, mixed bf16, amp fp16; naive and flash
// attention; dropout; recomputation none / selective / full / every-K; accumulation; sgd,
// momentum, adamw), with the golden hyper-parameters: each step's loss and gradient norm, the
// final weights of every unit and the checkpoint sections must be the recorded ones, and the
// backend must touch exactly the plan's arena. gpt_run's trainer (exec/program_trainer.hpp over
// this backend) must give the same numbers.
#include <doctest/doctest.h>

#include "runtime_plans.hpp"
#include "../golden/golden.hpp"

#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/backend/cpu/step_backend.hpp>
#include <memalg/exec/gpt/build_program.hpp>
#include <memalg/exec/run.hpp>

#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace m = memalg;
using namespace memalg::literals;
using comm = m::backend::cpu::local_communicator;

namespace {
using namespace memalg_test;




/// The index of Plan in runtime_matrix (its golden run is matrix.<index>).
template <class Plan, class Tuple>
struct index_in;
template <class Plan, class... P>
struct index_in<Plan, std::tuple<P...>> {
  static constexpr std::size_t value = [] {
    constexpr bool same[] = {std::is_same_v<Plan, P>...};
    for (std::size_t i = 0; i < sizeof...(P); ++i)
      if (same[i]) return i;
    return sizeof...(P);
  }();
};

template <class Plan>
void check_plan() {
  using run = m::exec::gpt_run<Plan, comm>;
  using T = typename run::storage;
  namespace g = memalg_golden;
  constexpr std::size_t index = index_in<Plan, runtime_matrix>::value;
  static_assert(index < std::tuple_size_v<runtime_matrix>);
  const std::string key = g::key_of("matrix." + std::to_string(index), 0, 1);
  const auto golden = g::load(g::path("np1.txt"));
  REQUIRE_MESSAGE(golden.count(key) == 1, "no golden record " << key);
  const g::record& want = golden.at(key);

  const m::exec::gpt_config config = m::exec::with_hparams(run::config, g::matrix_hparams);
  const std::size_t n = config.micro_batch * config.sequence * config.grad_accum;
  const m::exec::program prog = m::exec::build_program(config, run::arena);
  comm bdp, btp;
  m::backend::cpu::step_backend<T, comm> backend(prog, bdp, btp);
  CHECK(backend.storage() == prog.storage);
  m::exec::run_state state;
  m::exec::live_bytes_meter meter(prog);
  g::record got;
  got.key = key;
  for (int s = 0; s < g::matrix_steps; ++s) {
    const std::vector<std::int32_t> tok = ids(n, s), tgt = ids(n, s + 1);
    const m::exec::step_result r = m::exec::run(prog, backend, {tok, tgt}, state, meter);
    got.loss.push_back(g::bits(r.loss));
    got.norm.push_back(g::bits(r.grad_norm));
    CHECK(r.grad_norm == backend.last_grad_norm());
  }
  for (int s = 1; s < g::matrix_steps; ++s) CHECK(got.loss[s] != got.loss[0]);  // different batches and weights
  got.weights = g::weights_digest(backend);
  backend.store_counters(state);
  got.sections = g::sections_digest(backend.state_sections());
  INFO(g::format(got));
  CHECK(g::compare(got, want) == "");
  CHECK(state.step == static_cast<std::uint64_t>(g::matrix_steps));
  CHECK(backend.step_count() == static_cast<std::size_t>(g::matrix_steps));

  // Memory: the interpreter's live-bytes meter reaches the plan, the plan is tight (16 bytes less
  // is refused), and over a step the ops touch every byte of it.
  const m::breakdown& plan = Plan::result.per_rank;
  CAPTURE(meter.peak_op());
  CHECK(meter.high_water() == (plan.total() - plan.reserve).value);
  CHECK(meter.unplaced_ops() == 0);
  CHECK(short_plan_refused(config, run::arena));
  CHECK(prog.high_water == (plan.total() - plan.reserve).value);
  CHECK(meter.touched_bytes() == (plan.total() - plan.reserve).value);

  // gpt_run's trainer is the program on this backend: the same numbers, and memory() reports the
  // program's layout.
  typename run::trainer facade(config, run::arena, bdp, btp);
  g::record again;
  again.key = key;
  for (int s = 0; s < g::matrix_steps; ++s) {
    again.loss.push_back(g::bits(facade.train_step(ids(n, s), ids(n, s + 1))));
    again.norm.push_back(g::bits(facade.last_grad_norm()));
  }
  again.weights = g::weights_digest(facade);
  facade.store_counters();
  again.sections = g::sections_digest(facade.state_sections());
  CHECK(g::compare(again, want) == "");
  CHECK(facade.meter().high_water() == meter.high_water());
  CHECK(facade.memory().high_water() == prog.high_water);
  CHECK(facade.memory().peak_by_category() == prog.peak_by_category);
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("the CPU step backend reproduces the golden trajectories bit for bit", Plan, step_backend_bitwise) { check_plan<Plan>(); }
TEST_CASE_TEMPLATE_APPLY(step_backend_bitwise, runtime_matrix);

TEST_CASE("the CPU step backend saves and resumes bit-identically") {
  using plan = plan_for<flash_fp16, m::precision::amp_fp16, m::optim::adamw<>, m::train::batch<2, 16>>;
  using run = m::exec::gpt_run<plan, comm>;
  using backend_t = m::backend::cpu::step_backend<typename run::storage, comm>;
  const m::exec::program prog = m::exec::build_program(run::config, run::arena);
  const std::size_t n = prog.grad_accum * prog.tokens_per_micro;
  const auto step = [&](backend_t& b, m::exec::run_state& s, int k) {
    const std::vector<std::int32_t> tok = ids(n, k), tgt = ids(n, k + 1);
    return m::exec::run(prog, b, {tok, tgt}, s).loss;
  };
  comm dp, tp;
  std::vector<float> straight, resumed;
  {
    backend_t b(prog, dp, tp);
    m::exec::run_state s;
    for (int k = 0; k < 6; ++k) straight.push_back(step(b, s, k));
  }
  std::vector<std::vector<std::byte>> saved;
  {
    backend_t b(prog, dp, tp);
    m::exec::run_state s;
    for (int k = 0; k < 3; ++k) resumed.push_back(step(b, s, k));
    b.store_counters(s);
    for (const auto& sec : b.state_sections()) saved.emplace_back(sec.data.begin(), sec.data.end());
  }
  {
    backend_t b(prog, dp, tp);
    auto sections = b.state_sections();
    REQUIRE(sections.size() == saved.size());
    for (std::size_t i = 0; i < saved.size(); ++i) std::memcpy(sections[i].data.data(), saved[i].data(), saved[i].size());
    m::exec::run_state s;
    b.restore_counters(s);
    CHECK(s.step == 3);
    for (int k = 3; k < 6; ++k) resumed.push_back(step(b, s, k));
  }
  REQUIRE(resumed.size() == straight.size());
  CHECK(std::memcmp(resumed.data(), straight.data(), straight.size() * sizeof(float)) == 0);
}

// SPDX-License-Identifier: BSL-1.0
// The step program executed by the CPU step backend against gpt_trainer: bit-identical losses, gradient norms, weights and states.
//
// For every single-rank plan of test_step_program.cpp's matrix (fp32, mixed bf16, amp fp16;
// naive and flash attention; dropout; recomputation none / selective / full / every-K;
// accumulation; sgd, momentum, adamw) both run the same steps on the same ids from the same seed:
// each step's loss and gradient norm, the final weights of every unit and the checkpoint sections
// must be equal byte for byte, and the backend must touch exactly the plan's arena. gpt_run's
// trainer (exec/program_trainer.hpp over this backend) must give the same numbers and memory.
#include <doctest/doctest.h>

#include "runtime_plans.hpp"

#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/backend/cpu/step_backend.hpp>
#include <memalg/exec/build_program.hpp>
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



bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

constexpr int steps = 5;

template <class Plan>
void check_plan() {
  using run = m::exec::gpt_run<Plan, comm>;
  using T = typename run::storage;
  const std::size_t n = run::config.micro_batch * run::config.sequence * run::config.grad_accum;

  comm dp, tp;
  typename run::reference_trainer trainer(run::config, run::arena, dp, tp);
  std::vector<float> want_loss, want_norm;
  for (int s = 0; s < steps; ++s) {
    want_loss.push_back(trainer.train_step(ids(n, s), ids(n, s + 1)));
    want_norm.push_back(trainer.last_grad_norm());
  }

  const m::exec::program prog = m::exec::build_program(run::config, run::arena);
  comm bdp, btp;
  m::backend::cpu::step_backend<T, comm> backend(prog, bdp, btp);
  CHECK(backend.storage() == prog.storage);
  m::exec::run_state state;
  std::vector<float> got_loss, got_norm;
  for (int s = 0; s < steps; ++s) {
    const std::vector<std::int32_t> tok = ids(n, s), tgt = ids(n, s + 1);
    const m::exec::step_result r = m::exec::run(prog, backend, {tok, tgt}, state);
    got_loss.push_back(r.loss);
    got_norm.push_back(r.grad_norm);
    CHECK(r.grad_norm == backend.last_grad_norm());
  }
  CAPTURE(want_loss);
  CAPTURE(got_loss);
  CHECK(same_bits(got_loss, want_loss));
  CHECK(same_bits(got_norm, want_norm));
  for (int s = 1; s < steps; ++s) CHECK(want_loss[s] != want_loss[0]);  // the steps see different batches and weights
  CHECK(backend.skipped_steps() == trainer.skipped_steps());
  CHECK(backend.step_count() == trainer.step_count());

  REQUIRE(backend.unit_count() == trainer.unit_count());
  for (std::size_t u = 0; u < trainer.unit_count(); ++u) {
    CAPTURE(u);
    CHECK(same_bits(backend.unit_weights(u), trainer.unit_weights(u)));
  }

  // Checkpoint sections: the same names and sizes, weights / master / states byte-equal.
  trainer.store_counters();
  backend.store_counters(state);
  const auto want = trainer.state_sections();
  const auto got = backend.state_sections();
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(want[i].name);
    CHECK(got[i].name == want[i].name);
    REQUIRE(got[i].data.size() == want[i].data.size());
    if (want[i].name == "loss_scaler") {  // a struct with padding: compared by value
      m::backend::cpu::dynamic_loss_scaler theirs;
      static_assert(std::is_trivially_copyable_v<m::backend::cpu::dynamic_loss_scaler>);
      std::memcpy(static_cast<void*>(&theirs), want[i].data.data(), sizeof theirs);
      CHECK(backend.loss_scaler().scale() == theirs.scale());
      CHECK(backend.loss_scaler().good_steps() == theirs.good_steps());
      CHECK(backend.loss_scaler().skipped_steps() == theirs.skipped_steps());
      continue;
    }
    CHECK(std::memcmp(got[i].data.data(), want[i].data.data(), want[i].data.size()) == 0);
  }
  CHECK(state.step == static_cast<std::uint64_t>(steps));

  // Memory: the backend holds the plan's arena and, over a step, touches every byte of it.
  const m::breakdown& plan = Plan::result.per_rank;
  CHECK(backend.capacity() == (plan.total() - plan.reserve).value);
  CHECK(prog.high_water == (plan.total() - plan.reserve).value);
  CHECK(backend.touched_bytes() == (plan.total() - plan.reserve).value);

  // gpt_run's trainer is the program on this backend behind gpt_trainer's API: the same numbers,
  // and memory() reports the plan's arena.
  typename run::trainer facade(run::config, run::arena, bdp, btp);
  std::vector<float> facade_loss, facade_norm;
  for (int s = 0; s < steps; ++s) {
    facade_loss.push_back(facade.train_step(ids(n, s), ids(n, s + 1)));
    facade_norm.push_back(facade.last_grad_norm());
  }
  CHECK(same_bits(facade_loss, want_loss));
  CHECK(same_bits(facade_norm, want_norm));
  CHECK(facade.step_count() == trainer.step_count());
  CHECK(facade.skipped_steps() == trainer.skipped_steps());
  REQUIRE(facade.unit_count() == trainer.unit_count());
  for (std::size_t u = 0; u < trainer.unit_count(); ++u) CHECK(same_bits(facade.unit_weights(u), trainer.unit_weights(u)));
  CHECK(facade.memory().capacity() == trainer.memory().capacity());
  CHECK(facade.memory().persistent_used() == trainer.memory().persistent_used());
  CHECK(facade.memory().high_water() == trainer.memory().high_water());
  CHECK(facade.memory().peak_by_category() == trainer.memory().peak_by_category());
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("the CPU step backend runs the program bit for bit like gpt_trainer", Plan, step_backend_bitwise) { check_plan<Plan>(); }
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

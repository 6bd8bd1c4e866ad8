// SPDX-License-Identifier: BSL-1.0
// The training binaries' hyper-parameter flags (examples/train_common.hpp) and what they change.
//
// The shared parser reads --lr, --weight-decay, --beta1, --beta2, --eps, --momentum and --clip
// into exec::optimizer_hparams and refuses bad values with a one-line reason; a named plan's own
// learning rate applies only without --lr. Through exec::with_hparams they reach the step
// program: a learning rate of 0 leaves every weight as it started, and ten times the learning
// rate gives other losses but the same arena, byte for byte (the plan has no learning rate).
#include <doctest/doctest.h>

#include "runtime_plans.hpp"

#include "../../examples/train_common.hpp"

#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/exec/gpt/plan.hpp>
#include <memalg/exec/program.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace m = memalg;
using comm = m::backend::cpu::local_communicator;
using namespace memalg_test;

namespace {
train_common::options parse(std::vector<std::string> args) {
  args.insert(args.begin(), "train");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return train_common::parse_options<train_common::options>(
      static_cast<int>(argv.size()), argv.data(), "",
      [](train_common::options& o, std::string_view a, const auto& value) { return train_common::parse_hparam(o, a, value); });
}

struct plain_plan {};
struct plan_with_lr {
  static constexpr float lr = 0.05f;
};

using adamw_plan = std::tuple_element_t<0, runtime_matrix>;     // fp32 AdamW, naive attention
using momentum_plan = std::tuple_element_t<4, runtime_matrix>;  // fp32 momentum SGD, accumulation

/// Weights of every unit after `steps` steps on fixed batches with hyper-parameters `h`, the
/// losses, and the trainer's memory figures.
template <class Plan>
struct trained {
  std::vector<std::vector<float>> before, after;
  std::vector<float> losses;
  std::size_t measured = 0, high_water = 0;
};
template <class Plan>
trained<Plan> train(const m::exec::optimizer_hparams& h, int steps) {
  using run = m::exec::gpt_run<Plan, comm>;
  comm dp, tp;
  typename run::trainer t(m::exec::with_hparams(run::config, h), run::arena, dp, tp);
  trained<Plan> r;
  for (std::size_t u = 0; u < t.unit_count(); ++u) r.before.push_back(t.unit_weights(u));
  const std::size_t n = run::config.grad_accum * run::config.micro_batch * run::config.sequence;
  for (int s = 0; s < steps; ++s) r.losses.push_back(t.train_step(ids(n, s), ids(n, s + 1)));
  for (std::size_t u = 0; u < t.unit_count(); ++u) r.after.push_back(t.unit_weights(u));
  r.measured = t.meter().high_water();
  r.high_water = t.memory().high_water();
  return r;
}
}  // namespace

TEST_CASE("the hyper-parameter flags fill optimizer_hparams") {
  const train_common::options d = parse({});
  CHECK_FALSE(d.lr_given);
  const train_common::options o = parse({"--lr", "0.25", "--weight-decay", "0.1", "--beta1", "0.5", "--beta2", "0.75",
                                         "--eps", "1e-6", "--momentum", "0", "--clip", "0", "--steps", "3"});
  CHECK(o.lr_given);
  CHECK(o.hparams.lr == 0.25f);
  CHECK(o.hparams.weight_decay == 0.1f);
  CHECK(o.hparams.beta1 == 0.5f);
  CHECK(o.hparams.beta2 == 0.75f);
  CHECK(o.hparams.eps == 1e-6f);
  CHECK(o.hparams.momentum == 0.0f);
  CHECK(o.hparams.max_grad_norm == 0.0f);
  CHECK(o.steps == 3);

  // A named plan's own learning rate is the default, --lr overrides it; other plans keep the flags'.
  CHECK(train_common::hparams_for<plan_with_lr>(d).lr == plan_with_lr::lr);
  CHECK(train_common::hparams_for<plan_with_lr>(o).lr == 0.25f);
  CHECK(train_common::hparams_for<plain_plan>(d).lr == d.hparams.lr);
  CHECK(train_common::hparams_for<plan_with_lr>(d).beta2 == d.hparams.beta2);
}

TEST_CASE("bad hyper-parameters are refused with a one-line reason") {
  using E = train_common::usage_error;
  CHECK_THROWS_WITH_AS(parse({"--lr", "abc"}), "--lr needs a number >= 0, not 'abc'", E);
  CHECK_THROWS_WITH_AS(parse({"--lr", "-1"}), "--lr needs a number >= 0, not '-1'", E);
  CHECK_THROWS_WITH_AS(parse({"--lr", "1e-3x"}), "--lr needs a number >= 0, not '1e-3x'", E);
  CHECK_THROWS_WITH_AS(parse({"--lr", ""}), "--lr needs a number >= 0, not ''", E);
  CHECK_THROWS_WITH_AS(parse({"--lr", "1e99"}), "--lr needs a number >= 0, not '1e99'", E);  // not a float
  CHECK_THROWS_WITH_AS(parse({"--lr"}), "--lr needs a value", E);
  CHECK_THROWS_WITH_AS(parse({"--beta1", "1.5"}), "--beta1 needs a number in [0, 1), not '1.5'", E);
  CHECK_THROWS_WITH_AS(parse({"--beta2", "1"}), "--beta2 needs a number in [0, 1), not '1'", E);
  CHECK_THROWS_WITH_AS(parse({"--momentum", "-0.1"}), "--momentum needs a number in [0, 1), not '-0.1'", E);
  CHECK_THROWS_WITH_AS(parse({"--eps", "0"}), "--eps needs a number > 0, not '0'", E);
  CHECK_THROWS_WITH_AS(parse({"--weight-decay", "nan"}), "--weight-decay needs a number >= 0, not 'nan'", E);
  CHECK_THROWS_WITH_AS(parse({"--clip", "-2"}), "--clip needs a number >= 0 (0: no clipping), not '-2'", E);

  // A binary that does not take the hyper-parameters (its `extra` does not call parse_hparam)
  // refuses them rather than ignoring them.
  std::string flag = "--lr", value = "0.1", name = "train";
  char* argv[] = {name.data(), flag.data(), value.data()};
  CHECK_THROWS_WITH_AS(train_common::parse_options<train_common::options>(
                           3, argv, "", [](train_common::options&, std::string_view, const auto&) { return false; }),
                       "unknown argument '--lr' (see --help)", E);
}

TEST_CASE_TEMPLATE("a learning rate of 0 keeps the weights; ten times it changes the losses, not the memory", Plan,
                   adamw_plan, momentum_plan) {
  m::exec::optimizer_hparams h{};
  h.weight_decay = 0.1f;  // decay scales with the learning rate too
  const trained<Plan> base = train<Plan>(h, 3);
  h.lr = 0.0f;
  const trained<Plan> frozen = train<Plan>(h, 3);
  CHECK(frozen.after == frozen.before);
  CHECK(base.after != base.before);
  CHECK(frozen.losses[0] == base.losses[0]);  // the first step's loss is the initial weights'
  CHECK(frozen.losses.back() != base.losses.back());

  h.lr = 10.0f * m::exec::optimizer_hparams{}.lr;
  const trained<Plan> fast = train<Plan>(h, 3);
  CHECK(fast.losses.back() != base.losses.back());
  CHECK(fast.measured == base.measured);
  CHECK(fast.high_water == base.high_water);
  CHECK(base.measured == static_cast<std::size_t>((Plan::result.per_rank.total() - Plan::result.per_rank.reserve).value));
}

// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/speech_run.hpp — from a compile-time plan of the speech model to the CPU
// trainer that runs it.
//
// `exec::speech_run<Plan, Comm>` cannot be instantiated for a plan that does not fit (require_fits
// prints the numbers) or that the speech runtime does not implement (speech_plan_issue's sentence).
// Its `trainer` runs the plan's step program (exec/speech/build_program.hpp) on the CPU step
// backend in the plan's arena (planned_arena); `program_for` builds that program for one rank.
#pragma once

#include <cstddef>
#include <string_view>

#include "memalg/backend/cpu/gpt_run.hpp"
#include "memalg/backend/cpu/step_backend.hpp"
#include "memalg/exec/gpt/plan.hpp"
#include "memalg/exec/program_trainer.hpp"
#include "memalg/exec/speech/plan.hpp"

namespace memalg::exec {

namespace detail {
template <class Plan>
struct speech_check {
  static constexpr std::string_view issue = speech_plan_issue<Plan>();
  static constexpr bool value = issue.empty();
};
}  // namespace detail

template <class Plan, class Comm>
class speech_run {
 public:
  using plan = Plan;
  using storage = typename detail::storage_of<Plan>::type;
  using trainer = program_trainer<backend::cpu::step_backend<storage, Comm>>;
  static constexpr std::string_view issue = speech_plan_issue<Plan>();
  static_assert(detail::speech_check<Plan>::value, "speech_run: the speech runtime does not implement this plan (see issue)");
  static_assert(require_fits<Plan>());
  static constexpr speech_config config = speech_config_of<Plan>();
  static constexpr arena_sizes arena = planned_arena<Plan>();
  static constexpr elem storage_elem = backend::cpu::step_backend<storage, Comm>::storage_elem;

  /// The step program of data-parallel rank `dp_rank` with the run's hyper-parameters.
  static program program_for(std::size_t dp_rank, const optimizer_hparams& h, std::uint64_t seed) {
    speech_config c = with_hparams(config, h);
    c.seed = seed;
    return build_speech_program(c, arena, rank_coords{dp_rank, 0, 0}, storage_elem);
  }
};

}  // namespace memalg::exec

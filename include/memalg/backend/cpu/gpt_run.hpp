// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/gpt_run.hpp — from a compile-time plan to the CPU trainer that runs it.
//
// `exec::gpt_run<Plan, Comm>` cannot be instantiated for a plan that does not fit (require_fits
// prints the numbers) or that the CPU runtime does not implement (find_cpu_runtime_issue; the
// static_assert carries the sentence of exec/runtime_issues.hpp). It allocates the arena at the
// plan's size (exec/gpt/plan.hpp's planned_arena). Its `trainer` runs the plan's step program on
// the CPU step backend (exec/program_trainer.hpp over backend/cpu/step_backend.hpp). The name stays
// in memalg::exec, where the plan side lives.
#pragma once

#include "memalg/backend/cpu/step_backend.hpp"
#include "memalg/core/float16.hpp"
#include "memalg/exec/gpt/plan.hpp"
#include "memalg/exec/program_trainer.hpp"

namespace memalg::exec {

namespace detail {
/// The CPU runtime's storage type for a plan's weight dtype.
template <class Plan>
struct storage_of {
  using type = float;
};
template <class Plan>
  requires(Plan::training.precision.weights == dtypes::bf16)
struct storage_of<Plan> {
  using type = bf16;
};
template <class Plan>
  requires(Plan::training.precision.weights == dtypes::fp16)
struct storage_of<Plan> {
  using type = fp16;
};
}  // namespace detail

/// The trainer a plan instantiates; does not compile for a plan that does not fit or that the CPU
/// runtime does not implement.
template <class Plan, class Comm>
class gpt_run {
 public:
  using plan = Plan;
  using storage = typename detail::storage_of<Plan>::type;
  /// The step program of the plan on the CPU step backend (exec/program_trainer.hpp).
  using trainer = program_trainer<backend::cpu::step_backend<storage, Comm>>;

  static constexpr lm_config model_config = detail::config_of<typename Plan::model_type>::value;
  static constexpr runtime_issue issue = find_cpu_plan_issue<Plan>();
  static_assert(detail::runtime_check<issue>::value, "gpt_run: the CPU runtime does not implement this plan");
  static_assert(require_fits<Plan>());

  static constexpr gpt_config config = gpt_config_of<Plan>(model_config);
  static_assert(!config.sequence_parallel || config.vocab_parallel,
                "gpt_run: sequence parallelism needs the vocabulary-parallel model (runtime_gpt, not runtime_gpt_replicated)");
  static constexpr arena_sizes arena = planned_arena<Plan>();
  /// The arena of pipeline stage `stage` (`arena` is the most loaded stage's).
  static constexpr arena_sizes stage_arena(std::size_t stage) { return planned_stage_arena<Plan>(stage); }
};

}  // namespace memalg::exec

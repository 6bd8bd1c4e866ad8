// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/gpt_run.cuh — from a compile-time plan to the CUDA training run: the plan's
// step program on the CUDA step backend.
//
// `gpt_run<Plan, Comm>` is exec::gpt_run's counterpart on a GPU: the same plan, the same
// gpt_config and arena sizes, the same step program (exec/gpt/build_program.hpp), trained by
// exec::program_trainer over backend::cuda::step_backend instead of the CPU's. It does not compile
// for a plan that does not fit (require_fits prints the numbers) or that the CUDA runtime does not
// implement (exec::find_cuda_runtime_issue, exec/gpt/plan_cuda.hpp: a sentence says what).
//
// A pipeline plan's rank runs its stage's program (stage_arena, stage_peak; the trainer's
// 5-argument constructor takes the pipeline group).
//
// Comm: a device communicator (step_backend.cuh's device_communicator): nccl_communicator,
// local_device_communicator, or a binary's own group type.
#pragma once

#include <cstddef>

#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/step_backend.cuh"
#include "memalg/exec/gpt/plan_cuda.hpp"
#include "memalg/exec/program_trainer.hpp"

namespace memalg::backend::cuda {

namespace detail {
template <class Plan>
struct plan_storage {
  using type = float;
};
template <class Plan>
  requires(Plan::training.precision.weights == dtypes::bf16)
struct plan_storage<Plan> {
  using type = bf16;
};
}  // namespace detail

/// The CUDA training run a plan instantiates.
template <class Plan, class Comm>
class gpt_run {
 public:
  using plan = Plan;
  using storage = typename detail::plan_storage<Plan>::type;
  using backend = step_backend<storage, Comm>;
  /// The plan's step program on the CUDA step backend.
  using trainer = exec::program_trainer<backend>;

  static constexpr lm_config model_config = exec::detail::config_of<typename Plan::model_type>::value;
  static constexpr exec::cuda_runtime_issue issue =
      exec::find_cuda_plan_issue<Plan>();
  static_assert(exec::detail::cuda_runtime_check<issue>::value, "gpt_run_cuda: the CUDA runtime does not implement this plan");
  static_assert(::memalg::require_fits<Plan>());

  static constexpr exec::gpt_config config = exec::gpt_config_of<Plan>(model_config);
  static constexpr exec::arena_sizes arena = exec::planned_arena<Plan>();
  /// The device peak the plan predicts: the arena plus the device reserve (context + workspace).
  static constexpr std::size_t predicted_device_peak = static_cast<std::size_t>(Plan::result.per_rank.total().value);
  static constexpr std::size_t predicted_reserve = static_cast<std::size_t>(Plan::result.per_rank.reserve.value);
  /// The arena of pipeline stage `stage` (`arena` is the most loaded stage's).
  static constexpr exec::arena_sizes stage_arena(std::size_t stage) { return exec::planned_stage_arena<Plan>(stage); }
  /// The per-rank breakdown the plan predicts for the ranks of pipeline stage `stage`.
  static constexpr breakdown stage_peak(std::size_t stage) {
    return evaluate_stage(Plan::model, Plan::training, Plan::mesh, Plan::device, stage).per_rank;
  }
};

}  // namespace memalg::backend::cuda

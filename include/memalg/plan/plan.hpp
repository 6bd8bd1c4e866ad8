// SPDX-License-Identifier: BSL-1.0
// memalg/plan/plan.hpp — `plan<Model, Training, Mesh, Device>`: the compile-time memory plan.
//
//   using p = memalg::plan<model::parameters<7'500'000'000>, train::recipe<precision::amp_fp16,
//                          optim::adam<>>, parallel::mesh<parallel::data<64, parallel::zero<3>>>,
//                          device::a100_80gb>;
//   static_assert(p::fits);
//   memalg::require_fits<p>();   // fails the build with need, limit and the breakdown
//
// The numbers are `evaluate(...)` (plan/evaluate.hpp) of the four types' literals.
#pragma once

#include <cstdint>

#include "memalg/plan/diagnostics.hpp"
#include "memalg/plan/evaluate.hpp"

namespace memalg {

template <model_type Model, training_type Training, mesh_type Mesh, device_type Device>
struct plan {
  using model_type = Model;
  using training_type = Training;
  using mesh_type = Mesh;
  using device_type = Device;
  static constexpr model_desc model = Model::value;
  static constexpr training_desc training = Training::value;
  static constexpr mesh_desc mesh = Mesh::value;
  static constexpr device_desc device = Device::value;

  static constexpr plan_issue issue = find_plan_issue(model, training, mesh, device);
  static_assert(detail::plan_check<issue>::value, "plan: the configuration is invalid (see the reason above)");

  static constexpr plan_result result =
      issue == plan_issue::none ? evaluate(model, training, mesh, device) : plan_result{};
  static constexpr breakdown per_rank = result.per_rank;
  static constexpr breakdown host_per_rank = result.host_per_rank;
  static constexpr bytes peak = result.peak();
  static constexpr bytes limit = result.limit;
  static constexpr bool fits = result.fits;
};

/// Fails the build when the plan's most loaded rank does not fit, printing the numbers.
template <class Plan>
constexpr bool require_fits() {
  constexpr const plan_result& r = Plan::result;
  constexpr const breakdown& b = r.per_rank;
  return detail::require_fits<
      detail::need_bytes<r.peak().value>, detail::limit_bytes<r.limit.value>,
      detail::on_pipeline_stage<r.most_loaded_stage>, detail::at_phase<static_cast<int>(r.peak_phase)>,
      detail::weights<b.weights.value>, detail::gradients<b.gradients.value>,
      detail::master_weights<b.master_weights.value>, detail::optimizer_states<b.optimizer_states.value>,
      detail::activations<b.activations.value>, detail::temporaries<b.temporaries.value>,
      detail::comm_buffers<b.comm_buffers.value>, detail::reserve<b.reserve.value>>::value;
}

}  // namespace memalg

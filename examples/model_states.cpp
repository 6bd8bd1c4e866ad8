// SPDX-License-Identifier: BSL-1.0
// examples/model_states.cpp — a plan that fits, checked at compile time, and its breakdown.
//
// A 7.5-billion-parameter model (the ZeRO paper's Figure 1) trained with mixed-precision Adam on
// 64 A100 80 GB GPUs. Without ZeRO every GPU would hold 120 GB of model states — it does not fit,
// and `require_fits` would stop the build with the numbers. With ZeRO-2 each GPU holds 16.6 GB.
#include <memalg/memalg.hpp>

#include <cstdio>

namespace m = memalg;

using model = m::model::parameters<7'500'000'000>;
using training = m::train::recipe<m::precision::amp_fp16, m::optim::adam<>>;
using device = m::device::a100_80gb;

template <int ZeroStage>
using plan_for = m::plan<model, training, m::parallel::mesh<m::parallel::data<64, m::parallel::zero<ZeroStage>>>, device>;

using chosen = plan_for<2>;
static_assert(m::require_fits<chosen>(), "ZeRO-2 over 64 GPUs fits a 7.5B model on A100 80 GB");
static_assert(!plan_for<0>::fits, "without ZeRO the model states alone need 120 GB");

int main() {
  std::printf("7.5B parameters, amp-fp16 + Adam, 64 x A100 80 GB\n\n");
  std::printf("model states per GPU (the ZeRO paper's Figure 1: 120, 31.4, 16.6, 1.9 GB)\n");
  std::printf("  ZeRO-0: %s\n", m::to_string(plan_for<0>::per_rank.model_states(), m::byte_unit::GB).c_str());
  std::printf("  ZeRO-1: %s\n", m::to_string(plan_for<1>::per_rank.model_states(), m::byte_unit::GB).c_str());
  std::printf("  ZeRO-2: %s\n", m::to_string(plan_for<2>::per_rank.model_states(), m::byte_unit::GB).c_str());
  std::printf("  ZeRO-3: %s\n\n", m::to_string(plan_for<3>::per_rank.model_states(), m::byte_unit::GB).c_str());
  std::printf("chosen plan (ZeRO-2):\n%s", m::breakdown_table(chosen::result, chosen::device).c_str());
  return 0;
}

// SPDX-License-Identifier: BSL-1.0
// Compile-time cost of including the umbrella header and checking one model-state plan.
#include <memalg/memalg.hpp>
namespace m = memalg;
using plan = m::plan<m::model::parameters<7'500'000'000>, m::train::recipe<m::precision::amp_fp16, m::optim::adam<>>,
                     m::parallel::mesh<m::parallel::data<64, m::parallel::zero<2>>>, m::device::a100_80gb>;
static_assert(m::require_fits<plan>());
int main() { return plan::fits ? 0 : 1; }

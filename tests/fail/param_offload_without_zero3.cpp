// SPDX-License-Identifier: BSL-1.0
// expect: parameter offload needs ZeRO stage 3
#include <memalg/memalg.hpp>
using namespace memalg;
using m = parallel::mesh<parallel::data<8, parallel::zero<2>>, parallel::offload_params>;
constexpr auto world = m::value.world;
int main() { return static_cast<int>(world); }

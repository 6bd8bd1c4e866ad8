// SPDX-License-Identifier: BSL-1.0
// expect: do not multiply to the declared world<N> size
// 3 data-parallel × 2 tensor-parallel ranks are 6, not the 8 the mesh declares.
#include <memalg/memalg.hpp>
using namespace memalg;
using m = parallel::mesh<parallel::world<8>, parallel::data<3>, parallel::tensor<2>>;
constexpr auto world = m::value.world;
int main() { return static_cast<int>(world); }

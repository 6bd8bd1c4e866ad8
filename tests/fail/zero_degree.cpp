// SPDX-License-Identifier: BSL-1.0
// expect: the data-parallel degree must be at least 1
#include <memalg/memalg.hpp>
using namespace memalg;
using m = parallel::mesh<parallel::data<0>>;
constexpr auto world = m::value.world;
int main() { return static_cast<int>(world); }

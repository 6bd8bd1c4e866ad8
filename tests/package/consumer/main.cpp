// SPDX-License-Identifier: BSL-1.0
// A project that only knows `find_package(memalg CONFIG REQUIRED)`. It prints the version of the
// headers it compiled against, then the peak of a plan checked at compile time.
#include <memalg/memalg.hpp>
#include <memalg/version.hpp>

#include <cstdio>

using plan = memalg::plan<memalg::model::parameters<1'000'000'000>,
                          memalg::train::recipe<memalg::precision::amp_bf16, memalg::optim::adamw<>>,
                          memalg::parallel::mesh<memalg::parallel::data<8, memalg::parallel::zero<1>>>,
                          memalg::device::a100_80gb>;
static_assert(memalg::require_fits<plan>());

int main() {
  std::printf("memalg %s: %s\n", MEMALG_VERSION_STRING, memalg::to_string(plan::peak).c_str());
  return plan::fits ? 0 : 1;
}

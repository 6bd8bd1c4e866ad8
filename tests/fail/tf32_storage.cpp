// SPDX-License-Identifier: BSL-1.0
// expect: tf32 is a compute format and cannot be a storage dtype
#include <memalg/memalg.hpp>
using namespace memalg;
struct tf32_weights {
  static constexpr precision_policy value{"tf32", dtypes::tf32, dtypes::fp32, dtypes::none, dtypes::fp32, dtypes::fp32};
};
using p = plan<model::parameters<1000>, train::recipe<tf32_weights, optim::sgd<>>, parallel::mesh<>, device::l4>;
int main() { return p::fits ? 0 : 1; }

// SPDX-License-Identifier: BSL-1.0
// expect: the tensor-parallel degree does not divide the attention heads
// Llama-2 7B has 32 attention heads: 3 tensor-parallel ranks cannot split them.
#include <memalg/memalg.hpp>
using namespace memalg;
using p = plan<presets::llama2_7b, train::recipe<precision::amp_bf16, optim::adamw<>, train::batch<1, 4096>>,
               parallel::mesh<parallel::data<2>, parallel::tensor<3>>, device::h100_80gb>;
constexpr bool fits = p::fits;
int main() { return fits ? 0 : 1; }

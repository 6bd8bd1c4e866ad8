// SPDX-License-Identifier: BSL-1.0
// expect: the pipeline has more stages than the model has layers
// GPT-2 124M has 12 blocks: a 16-stage pipeline would leave stages without a layer.
#include <memalg/memalg.hpp>
using namespace memalg;
using p = plan<presets::gpt2_124m, train::recipe<precision::amp_bf16, optim::adamw<>, train::batch<1, 1024>>,
               parallel::mesh<parallel::pipeline<16>>, device::h100_80gb>;
constexpr bool fits = p::fits;
int main() { return fits ? 0 : 1; }

// SPDX-License-Identifier: BSL-1.0
// expect: the most loaded rank does not fit in device memory
// expect: need_bytes<135541065216
// expect: limit_bytes<85899345920
// Without ZeRO, a 7.5B-parameter model's states alone (120 GB) exceed an A100 80 GB; PyTorch's DDP
// adds its flat gradient buckets (15 GB).
#include <memalg/memalg.hpp>
using namespace memalg;
using p = plan<model::parameters<7'500'000'000>, train::recipe<precision::amp_fp16, optim::adam<>>,
               parallel::mesh<parallel::data<64>>, device::a100_80gb>;
static_assert(require_fits<p>());
int main() {}

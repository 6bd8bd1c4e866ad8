// SPDX-License-Identifier: BSL-1.0
// expect: no configuration of the space fits.*closest_need_bytes<350541065216|closest_need_bytes<350541065216.*no configuration of the space fits
// GPT-3 175B by parameter count on 8 A100 80 GB: no ZeRO stage makes it fit; the search says so
// at compile time, with the closest configuration's need and the limit.
#include <memalg/memalg.hpp>
#include <memalg/plan/search_hana.hpp>
namespace m = memalg;
namespace s = memalg::search;
using found = s::strategy_search<m::model::parameters<175'000'000'000>, m::train::recipe<m::precision::amp_fp16, m::optim::adam<>>,
                                 s::space<8, s::zero_stages<0, 1, 2, 3>>, m::device::a100_80gb>;
using best = found::least_memory;
int main() {}

// SPDX-License-Identifier: BSL-1.0
// Compile-time cost of a 1,000-configuration strategy search on a model given by its parameter
// count (the ZeRO paper's 7.5B; model states only): the same space as compile_search.cpp.
#include <memalg/memalg.hpp>
#include <memalg/plan/search_hana.hpp>

namespace m = memalg;
namespace s = memalg::search;

using training = m::train::recipe<m::precision::amp_fp16, m::optim::adam<>>;
using space = s::space<64, s::zero_stages<0, 1, 2, 3>, s::tensor_sequence_degrees<1, 2, 4, 8, 16>,
                       s::pipeline_degrees<1, 2, 4, 8, 16>, s::context_degrees<1, 2>,
                       s::micro_batches<4096, 1, 2, 4, 8, 16>>;
using found = s::strategy_search<m::model::parameters<7'500'000'000>, training, space, m::device::a100_80gb>;
static_assert(found::size == 1000);
static_assert(m::require_fits<found::least_memory::plan>());
int main() { return found::result.feasible > 0 ? 0 : 1; }

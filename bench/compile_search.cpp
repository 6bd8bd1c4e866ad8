// SPDX-License-Identifier: BSL-1.0
// Compile-time cost of a 1,000-configuration strategy search on a layer-level model (Llama-2 7B,
// activations included): every configuration is decided at compile time, the least-memory one
// becomes a plan type, and require_fits checks it.
//   world 64: ZeRO 0-3 (4) x tensor 1, 2, 4, 8, 16 with sequence parallelism (5) x pipeline 1, 2,
//   4, 8, 16 (5) x context 1, 2 (2) x micro-batch 1, 2, 4, 8, 16 (5) = 1,000 configurations.
#include <memalg/memalg.hpp>
#include <memalg/plan/search_hana.hpp>

namespace m = memalg;
namespace s = memalg::search;

using training = m::train::recipe<m::precision::amp_bf16, m::optim::adamw<>>;
using space = s::space<64, s::zero_stages<0, 1, 2, 3>, s::tensor_sequence_degrees<1, 2, 4, 8, 16>,
                       s::pipeline_degrees<1, 2, 4, 8, 16>, s::context_degrees<1, 2>,
                       s::micro_batches<4096, 1, 2, 4, 8, 16>>;
using found = s::strategy_search<m::presets::llama2_7b, training, space, m::device::a100_80gb>;
static_assert(found::size == 1000);
static_assert(m::require_fits<found::least_memory::plan>());
static_assert(found::least_communication::plan::fits);
int main() { return found::result.feasible > 0 ? 0 : 1; }

// SPDX-License-Identifier: BSL-1.0
// Compile-time strategy search: passes by compiling.
#include <type_traits>

#include <boost/hana/length.hpp>

#include <memalg/memalg.hpp>
#include <memalg/plan/search_hana.hpp>

namespace {
namespace m = memalg;
namespace s = memalg::search;
namespace par = memalg::parallel;
namespace hana = boost::hana;

using model = m::model::parameters<7'500'000'000>;
using training = m::train::recipe<m::precision::amp_fp16, m::optim::adam<>>;

// The ZeRO paper's Figure 1: 7.5B parameters, 64 GPUs, the four stages.
using zero_space = s::space<64, s::zero_stages<0, 1, 2, 3>>;
using zero_search = s::strategy_search<model, training, zero_space, m::device::a100_80gb>;
static_assert(zero_search::size == 4);
static_assert(zero_search::result.feasible == 3);
static_assert(std::is_same_v<zero_search::least_memory::mesh,
                             par::mesh<par::data<64, par::zero<3>>, par::tensor<1>, par::pipeline<1>, par::context<1>,
                                       s::no_offload, par::world<64>>>);
static_assert(std::is_same_v<zero_search::least_communication::zero, par::zero<2>>);
static_assert(zero_search::least_memory::plan::per_rank.model_states().value == 1'875'000'000);
static_assert(m::require_fits<zero_search::least_memory::plan>());
static_assert(zero_search::feasible.size() == 3 && zero_search::feasible[0] == 1);  // ZeRO-1, 2, 3
static_assert(decltype(hana::length(zero_search::feasible_configurations()))::value == 3);

// Every dimension, a fixed expert degree and gradient accumulation, and the chosen types.
using moe = m::model::parameters<40'000'000'000, 30'000'000'000>;
using space = s::space<32, s::zero_stages<1, 3>, s::tensor_sequence_degrees<1, 2, 4>, s::pipeline_degrees<1, 2>,
                       s::context_degrees<1, 2>, s::micro_batches<4096, 1, 2>,
                       s::one_of<m::train::recompute::none, m::train::recompute::full>, s::offloads,
                       s::fixed<par::expert<4>, m::train::grad_accum<8>>>;
using found = s::strategy_search<moe, training, space, m::device::h100_80gb>;
static_assert(found::size == 2 * 3 * 2 * 2 * 2 * 2 * 2);
static_assert(found::result.found());
using best = found::least_memory;
// The plan of the chosen types is the plan the search computed.
static_assert(best::plan::peak.value == found::result.least_memory.key.peak);
static_assert(best::plan::mesh.ep == 4 && best::plan::mesh.world == 32);
static_assert(best::plan::training.grad_accum == 8 && best::plan::training.sequence == 4096);
static_assert(best::plan::mesh.dp == best::choice.dp);
static_assert(found::largest_micro_batch::plan::training.micro_batch == 2);
static_assert(found::least_communication::plan::fits);

// Every configuration the search lists as feasible fits when planned from its types.
template <std::size_t... K>
constexpr bool all_fit(std::index_sequence<K...>) {
  return (found::configuration<found::feasible[K]>::plan::fits && ...);
}
static_assert(all_fit(std::make_index_sequence<found::feasible.size()>{}));

// A global batch: each configuration accumulates 256 / (dp·micro-batch) micro-batches.
using gpt2 = m::presets::gpt2_124m;
using batch_space = s::space<8, s::zero_stages<1>, s::tensor_degrees<1, 2>, s::micro_batches<1024, 4, 8, 16>,
                             s::global_batch<256>>;
using batch_search = s::strategy_search<gpt2, training, batch_space, m::device::a100_40gb>;
static_assert(batch_search::problem.space.global_batch == 256);
using batch_best = batch_search::largest_micro_batch;
static_assert(batch_best::plan::training.grad_accum * batch_best::plan::training.micro_batch * batch_best::plan::mesh.dp ==
              256);
static_assert(batch_best::plan::peak.value == batch_search::result.largest_micro_batch.key.peak);

// The chosen configuration is a type like any other: usable in a plan of its own.
using kept = m::plan<moe, best::training, best::mesh, m::device::h100_80gb>;
static_assert(kept::fits);
}  // namespace

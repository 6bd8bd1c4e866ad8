// SPDX-License-Identifier: BSL-1.0
// Passes by compiling: the model-state algebra checked at compile time, and configurations that
// must not be expressible.
#include <memalg/memalg.hpp>

namespace {
using namespace memalg;
using namespace memalg::literals;

// bytes: checked arithmetic and exact units.
static_assert(1_GiB == bytes{1ULL << 30});
static_assert(1_GB == bytes{1'000'000'000});
static_assert(3_KiB + 1_KiB == 4_KiB);
static_assert((10_B).shard(3) == 4_B);
static_assert(storage_bytes(dtypes::int4, 3) == 2_B);       // sub-byte values pack
static_assert(storage_bytes(dtypes::nf4, 64) == 36_B);      // 32 B + one fp32 absmax
static_assert(storage_bytes(dtypes::fp8_e4m3, 5) == 5_B);

// The ZeRO paper, Figure 1: Ψ = 7.5B, N_d = 64, mixed-precision Adam (K = 12).
using zero_model = model::parameters<7'500'000'000>;
using zero_recipe = train::recipe<precision::amp_fp16, optim::adam<>>;
template <int S>
using zero_plan = plan<zero_model, zero_recipe, parallel::mesh<parallel::data<64, parallel::zero<S>>>, device::a100_80gb>;
static_assert(zero_plan<0>::per_rank.model_states() == bytes{120'000'000'000});
static_assert(zero_plan<1>::per_rank.model_states() == bytes{31'406'250'000});
static_assert(zero_plan<2>::per_rank.model_states() == bytes{16'640'625'000});
static_assert(zero_plan<3>::per_rank.model_states() == bytes{1'875'000'000});
static_assert(!zero_plan<0>::fits && zero_plan<1>::fits);

// A mesh is a type; its world size is checked against the product of its degrees.
using mesh_2x4 = parallel::mesh<parallel::world<8>, parallel::data<2>, parallel::tensor<4>>;
static_assert(mesh_2x4::value.world == 8 && mesh_2x4::value.tp == 4);

// Negative checks: things that must not be expressible as a plan.
template <class M, class T, class Me, class D>
concept plannable = requires { plan<M, T, Me, D>::peak; };
struct not_a_model {};
struct not_a_device {};
static_assert(!plannable<not_a_model, zero_recipe, mesh_2x4, device::h100_80gb>);
static_assert(!plannable<zero_model, zero_recipe, mesh_2x4, not_a_device>);
static_assert(plannable<zero_model, zero_recipe, mesh_2x4, device::h100_80gb>);

// Things that do not change per-GPU memory are not parameters: the dataset size and the learning
// rate have nowhere to go, and gradient accumulation leaves model states unchanged.
using accum_recipe = train::recipe<precision::amp_fp16, optim::adam<>, train::grad_accum<8>>;
static_assert(plan<zero_model, accum_recipe, parallel::mesh<parallel::data<64, parallel::zero<2>>>,
                   device::a100_80gb>::per_rank == zero_plan<2>::per_rank);
}  // namespace

// SPDX-License-Identifier: BSL-1.0
// The design plan/search_hana.hpp avoids, measured for bench/RESULTS.md: the same 1,000
// configurations as compile_search_params.cpp expanded as a Hana cartesian product of strategy
// types, one plan type per configuration, counted with hana::count_if.
#include <boost/hana/cartesian_product.hpp>
#include <boost/hana/count_if.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>

#include <memalg/memalg.hpp>

namespace m = memalg;
namespace p = memalg::parallel;
namespace hana = boost::hana;

using model = m::model::parameters<7'500'000'000>;
using training = m::train::recipe<m::precision::amp_fp16, m::optim::adam<>>;

constexpr auto product = hana::cartesian_product(hana::make_tuple(
    hana::tuple_c<int, 0, 1, 2, 3>, hana::tuple_c<std::uint64_t, 1, 2, 4, 8, 16>,
    hana::tuple_c<std::uint64_t, 1, 2, 4, 8, 16>, hana::tuple_c<std::uint64_t, 1, 2>,
    hana::tuple_c<std::uint64_t, 1, 2, 4, 8, 16>));

template <int Z, std::uint64_t T, std::uint64_t P, std::uint64_t C, std::uint64_t B>
constexpr bool fits() {
  if constexpr (64 % (T * P * C) != 0) {
    return false;
  } else {
    using mesh = p::mesh<p::data<64 / (T * P * C), p::zero<Z>>, p::tensor<T, (T > 1)>, p::pipeline<P>, p::context<C>>;
    using plan = m::plan<model, m::train::recipe<m::precision::amp_fp16, m::optim::adam<>, m::train::batch<B, 4096>>,
                         mesh, m::device::a100_80gb>;
    return plan::fits;
  }
}

constexpr auto feasible = hana::count_if(product, [](auto c) {
  return hana::bool_c<fits<hana::at_c<0>(c).value, hana::at_c<1>(c).value, hana::at_c<2>(c).value,
                           hana::at_c<3>(c).value, hana::at_c<4>(c).value>()>;
});
static_assert(decltype(hana::length(product))::value == 1000);
int main() { return decltype(feasible)::value > 0 ? 0 : 1; }

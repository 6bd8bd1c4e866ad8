// SPDX-License-Identifier: BSL-1.0
// memalg/plan/search_hana.hpp — compile-time strategy search over a space of strategy *types*.
//
//   namespace s = memalg::search;
//   using space = s::space<64,                                            // world size
//                          s::zero_stages<0, 1, 2, 3>,
//                          s::one_of<parallel::tensor<1>, parallel::tensor<2, true>, parallel::tensor<8, true>>,
//                          s::pipeline_degrees<1, 2, 4>,
//                          s::micro_batches<4096, 1, 2, 4, 8>,          // sequence 4096
//                          s::one_of<train::recompute::none, train::recompute::selective>>;
//   using found = s::strategy_search<Model, Recipe, space, device::h100_80gb>;
//   using best  = found::least_memory;          // a configuration: ::mesh, ::training, ::plan
//   static_assert(memalg::require_fits<best::plan>());
//
// Each dimension (`one_of<T...>`) lists strategy types of one kind: `parallel::zero<S>`,
// `parallel::tensor<T, SP>`, `parallel::pipeline<P, Schedule>`, `parallel::context<C>`,
// `train::recompute::…`, `train::batch<B, S>` or the offload types (`no_offload`,
// `parallel::offload_optimizer`, `parallel::offload_params`). The data-parallel degree is
// world/(tp·pp·cp). `fixed<T...>` adds mesh components or recipe options every configuration
// shares (`parallel::expert<8>`, `train::grad_accum<16>`).
//
// The space is *not* expanded into a product of types. Hana turns each dimension's types into
// literal choices once (O(sum of the dimensions), not O(product)); the search is the constexpr
// `find_strategies` of plan/search.hpp over configuration indices — the function `memalg sweep`
// runs — and only the configurations asked for become types again (`hana::at` on each dimension).
// This is what keeps a 1,000-configuration search within a few seconds of g++ (bench/RESULTS.md):
// instantiating a plan type per configuration costs an order of magnitude more.
//
// The search runs in chunks of at most `chunk_size` configurations, each its own constant
// expression (clang stops one constant expression after 2^20 steps; a plan takes thousands),
// merged at the end. Host only: Hana is heavy under nvcc, so the umbrella header does not include this one.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <boost/hana/at.hpp>
#include <boost/hana/basic_tuple.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/transform.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>
#include <boost/hana/unpack.hpp>

#include "memalg/parallel/mesh.hpp"
#include "memalg/plan/plan.hpp"
#include "memalg/plan/search.hpp"
#include "memalg/train/recipe.hpp"

namespace memalg::search {

namespace hana = boost::hana;

/// The offload dimension's "keep everything on the device" choice (a mesh component doing nothing).
struct no_offload {
  static constexpr void apply(mesh_desc&) {}
};

/// The dimensions a space can search.
enum class dimension : std::uint8_t { zero_stage, tensor, pipeline, context, recompute, micro_batch, offload };
inline constexpr std::size_t dimension_count = 7;

/// Which dimension a strategy type belongs to, and its literal value.
template <class T>
struct choice_of {
  static constexpr bool known = false;
};
template <int S, std::uint64_t Prefetch>
struct choice_of<parallel::zero<S, Prefetch>> {
  static_assert(Prefetch == 1, "search: parallel::zero<S, Prefetch> with a prefetch other than 1 is not searchable; "
                               "search the stage and set the prefetch in the plan you keep");
  static constexpr bool known = true;
  static constexpr dimension kind = dimension::zero_stage;
  static constexpr int value = S;
};
template <std::uint64_t T, bool SP>
struct choice_of<parallel::tensor<T, SP>> {
  static constexpr bool known = true;
  static constexpr dimension kind = dimension::tensor;
  static constexpr tensor_choice value{T, SP};
};
template <std::uint64_t P, class Schedule>
struct choice_of<parallel::pipeline<P, Schedule>> {
  static constexpr bool known = true;
  static constexpr dimension kind = dimension::pipeline;
  static constexpr pipeline_choice value{P, Schedule::kind, Schedule::virtual_stages};
};
template <std::uint64_t C>
struct choice_of<parallel::context<C>> {
  static constexpr bool known = true;
  static constexpr dimension kind = dimension::context;
  static constexpr std::uint64_t value = C;
};
template <class Recompute>
  requires(std::is_same_v<Recompute, train::recompute::none> || std::is_same_v<Recompute, train::recompute::selective> ||
           std::is_same_v<Recompute, train::recompute::full>)
struct choice_of<Recompute> {
  static constexpr bool known = true;
  static constexpr dimension kind = dimension::recompute;
  static constexpr recompute_choice value = [] {
    training_desc t{};
    Recompute::apply(t);
    return recompute_choice{t.recompute, t.recompute_every};
  }();
};
template <std::uint64_t K>
struct choice_of<train::recompute::every<K>> {
  static constexpr bool known = true;
  static constexpr dimension kind = dimension::recompute;
  static constexpr recompute_choice value{recompute_kind::every_k, K};
};
template <std::uint64_t B, std::uint64_t S>
struct choice_of<train::batch<B, S>> {
  static constexpr bool known = true;
  static constexpr dimension kind = dimension::micro_batch;
  static constexpr std::uint64_t value = B;
  static constexpr std::uint64_t sequence = S;
};
template <>
struct choice_of<no_offload> {
  static constexpr bool known = true;
  static constexpr dimension kind = dimension::offload;
  static constexpr offload_kind value = offload_kind::none;
};
template <>
struct choice_of<parallel::offload_optimizer> {
  static constexpr bool known = true;
  static constexpr dimension kind = dimension::offload;
  static constexpr offload_kind value = offload_kind::optimizer;
};
template <>
struct choice_of<parallel::offload_params> {
  static constexpr bool known = true;
  static constexpr dimension kind = dimension::offload;
  static constexpr offload_kind value = offload_kind::params;
};

/// One dimension: alternative strategy types of one kind.
template <class First, class... Rest>
struct one_of {
  static_assert(choice_of<First>::known && (choice_of<Rest>::known && ...),
                "search::one_of: every choice must be a strategy type the search knows (parallel::zero, tensor, "
                "pipeline, context, train::recompute::*, train::batch, no_offload, offload_optimizer, offload_params)");
  static constexpr dimension kind = choice_of<First>::kind;
  static_assert(((choice_of<Rest>::kind == kind) && ...),
                "search::one_of: the choices of one dimension must all be of one kind (e.g. all tensor degrees)");
  static constexpr auto types = hana::tuple_t<First, Rest...>;
  static constexpr std::size_t size = 1 + sizeof...(Rest);
};

template <int... Stages>
using zero_stages = one_of<parallel::zero<Stages>...>;
template <std::uint64_t... Degrees>
using tensor_degrees = one_of<parallel::tensor<Degrees>...>;
/// Tensor degrees with sequence parallelism wherever the degree is above 1.
template <std::uint64_t... Degrees>
using tensor_sequence_degrees = one_of<parallel::tensor<Degrees, (Degrees > 1)>...>;
template <std::uint64_t... Degrees>
using pipeline_degrees = one_of<parallel::pipeline<Degrees>...>;
template <std::uint64_t... Degrees>
using context_degrees = one_of<parallel::context<Degrees>...>;
template <std::uint64_t Sequence, std::uint64_t... MicroBatches>
using micro_batches = one_of<train::batch<MicroBatches, Sequence>...>;
using recomputations = one_of<train::recompute::none, train::recompute::selective, train::recompute::full>;
using offloads = one_of<no_offload, parallel::offload_optimizer>;

/// Sequences per optimizer step over all data-parallel ranks: each configuration accumulates
/// N / (dp·micro-batch) micro-batches (plan/search.hpp, search_space::global_batch).
template <std::uint64_t N>
struct global_batch {
  static_assert(N >= 1, "search::global_batch<N>: at least one sequence per step");
  static constexpr std::uint64_t value = N;
};

/// Mesh components or recipe options shared by every configuration of a space.
template <class... Ts>
struct fixed {
  static_assert(!(choice_of<Ts>::known || ...),
                "search::fixed: a searchable strategy type belongs in a one_of dimension, not in fixed<>");
};

namespace detail {
template <class T>
struct is_one_of : std::false_type {};
template <class... Ts>
struct is_one_of<one_of<Ts...>> : std::true_type {};
template <class T>
struct is_global_batch : std::false_type {};
template <std::uint64_t N>
struct is_global_batch<global_batch<N>> : std::true_type {};
template <class T>
constexpr std::uint64_t global_batch_of() {
  if constexpr (is_global_batch<T>::value) return T::value;
  else return 0;
}
template <class T>
struct is_fixed : std::false_type {};
template <class... Ts>
struct is_fixed<fixed<Ts...>> : std::true_type {};

template <class T>
concept mesh_component = requires(mesh_desc& m) { T::apply(m); };

template <class T>
struct fixed_types {
  using type = hana::basic_tuple<>;
};
template <class... Ts>
struct fixed_types<fixed<Ts...>> {
  using type = hana::basic_tuple<Ts...>;
};

/// The dimension of `Kind` among `Dims`, or void.
template <dimension Kind, class... Dims>
struct find_dimension {
  using type = void;
};
template <class D, dimension Kind>
constexpr bool has_kind() {
  if constexpr (is_one_of<D>::value) return D::kind == Kind;
  else return false;
}
template <dimension Kind, class D, class... Dims>
struct find_dimension<Kind, D, Dims...> {
  using type = std::conditional_t<has_kind<D, Kind>(), D, typename find_dimension<Kind, Dims...>::type>;
};
/// `train::recipe<P, O, Own...>` with `Options...` appended (applied last, so they win).
template <class Training, class... Options>
struct extend_recipe {
  static_assert(sizeof(Training) == 0, "strategy_search: Training must be a memalg::train::recipe<Precision, Optimizer, Options...>");
};
template <class P, class O, class... Own, class... Options>
struct extend_recipe<train::recipe<P, O, Own...>, Options...> {
  using type = train::recipe<P, O, Own..., Options...>;
};

template <class... Lists>
struct concat;
template <>
struct concat<> {
  using type = hana::basic_tuple<>;
};
template <class... A>
struct concat<hana::basic_tuple<A...>> {
  using type = hana::basic_tuple<A...>;
};
template <class... A, class... B, class... Rest>
struct concat<hana::basic_tuple<A...>, hana::basic_tuple<B...>, Rest...> {
  using type = typename concat<hana::basic_tuple<A..., B...>, Rest...>::type;
};

/// Splits fixed types into mesh components and recipe options.
template <class List>
struct split_fixed;
template <class... Ts>
struct split_fixed<hana::basic_tuple<Ts...>> {
  using mesh = typename concat<std::conditional_t<mesh_component<Ts>, hana::basic_tuple<Ts>, hana::basic_tuple<>>...>::type;
  using recipe =
      typename concat<std::conditional_t<mesh_component<Ts>, hana::basic_tuple<>, hana::basic_tuple<Ts>>...>::type;
};

template <class Training, class Options>
struct recipe_with;
template <class Training, class... Options>
struct recipe_with<Training, hana::basic_tuple<Options...>> {
  using type = typename extend_recipe<Training, Options...>::type;
};
/// The mesh literal of some components, without the whole-mesh checks (the base of a search is
/// not a mesh on its own: its data-parallel degree is chosen per configuration).
template <class Components>
struct apply_components;
template <class... Components>
struct apply_components<hana::basic_tuple<Components...>> {
  static constexpr mesh_desc value = [] {
    mesh_desc m{};
    (Components::apply(m), ...);
    return m;
  }();
};

template <class Head, class Components, class Tail>
struct mesh_with;
template <class... Head, class... Components, class... Tail>
struct mesh_with<hana::basic_tuple<Head...>, hana::basic_tuple<Components...>, hana::basic_tuple<Tail...>> {
  using type = parallel::mesh<Head..., Components..., Tail...>;
};

/// The type chosen at position `I` of dimension `Dim` (or `Default` when the space has no such dimension).
template <class Dim, std::size_t I, class Default>
struct chosen {
  using type = typename decltype(+hana::at_c<I>(Dim::types))::type;
};
template <std::size_t I, class Default>
struct chosen<void, I, Default> {
  using type = Default;
};
/// Recipe options chosen at position I (none when the space has no such dimension).
template <class Dim, std::size_t I>
struct chosen_option {
  using type = hana::basic_tuple<typename chosen<Dim, I, void>::type>;
};
template <std::size_t I>
struct chosen_option<void, I> {
  using type = hana::basic_tuple<>;
};

// Numbers of a failed search, as template arguments (nvcc and g++ print them).
template <std::uint64_t N> struct configurations_evaluated {};
template <std::uint64_t N> struct configurations_valid {};
template <std::uint64_t N> struct closest_need_bytes {};
template <std::uint64_t N> struct limit_bytes {};
template <std::uint64_t N> struct closest_configuration {};

template <bool Found, class Evaluated, class Valid, class Closest, class Need, class Limit>
struct require_some_fit {
  static_assert(Found,
                "search: no configuration of the space fits on the device (closest_need_bytes > limit_bytes for "
                "the closest one): widen the space (a higher ZeRO stage, more tensor or pipeline parallelism, "
                "recomputation, a smaller micro-batch, offload) or use a larger device");
  static constexpr bool value = Found;
};
}  // namespace detail

/// A space of `World` ranks: dimensions (`one_of<...>`) and at most one `fixed<...>`, in any order.
template <std::uint64_t World, class... Parts>
struct space {
  static_assert(World >= 1, "search::space<World>: the world size must be at least 1");
  static_assert(((detail::is_one_of<Parts>::value || detail::is_fixed<Parts>::value ||
                  detail::is_global_batch<Parts>::value) && ...),
                "search::space: list dimensions as search::one_of<...> (or zero_stages<>, tensor_degrees<>, ...), "
                "shared types as search::fixed<...> and the tokens per step as search::global_batch<N>");
  static_assert((static_cast<int>(detail::is_global_batch<Parts>::value) + ... + 0) <= 1,
                "search::space: at most one global_batch<N>");
  static_assert((static_cast<int>(detail::is_fixed<Parts>::value) + ... + 0) <= 1,
                "search::space: at most one fixed<...>");
  static constexpr std::uint64_t world = World;
  static constexpr std::uint64_t global = (detail::global_batch_of<Parts>() + ... + 0);

  template <dimension Kind>
  using dimension_t = typename detail::find_dimension<Kind, Parts...>::type;
  using fixed_types = typename detail::concat<std::conditional_t<detail::is_fixed<Parts>::value,
                                                                 typename detail::fixed_types<Parts>::type,
                                                                 hana::basic_tuple<>>...>::type;

 private:
  template <class P>
  static constexpr dimension kind_of() {
    if constexpr (detail::is_one_of<P>::value) return P::kind;
    else return dimension::zero_stage;
  }
  static constexpr bool one_each = [] {
    bool ok = true;
    for (std::size_t k = 0; k < dimension_count; ++k) {
      int n = 0;
      ((n += detail::is_one_of<Parts>::value && static_cast<std::size_t>(kind_of<Parts>()) == k ? 1 : 0), ...);
      ok = ok && n <= 1;
    }
    return ok;
  }();
  static_assert(one_each, "search::space: each dimension (ZeRO stage, tensor, pipeline, ...) may appear only once");

  template <dimension Kind, class List>
  static constexpr void fill(List& list) {
    using D = dimension_t<Kind>;
    if constexpr (!std::is_void_v<D>) {
      list = {};
      hana::unpack(D::types, [&](auto... t) { (list.push(choice_of<typename decltype(t)::type>::value), ...); });
    }
  }

 public:
  /// The same space as a literal, for `find_strategies` (absent dimensions: ZeRO-0, degree 1, no
  /// offload, and the recipe's recomputation and micro-batch).
  static constexpr search_space value = [] {
    search_space s{};
    s.world = World;
    s.zero_stages = {0};
    fill<dimension::zero_stage>(s.zero_stages);
    fill<dimension::tensor>(s.tensor);
    fill<dimension::pipeline>(s.pipeline);
    fill<dimension::context>(s.context);
    fill<dimension::recompute>(s.recompute);
    fill<dimension::micro_batch>(s.micro_batch);
    fill<dimension::offload>(s.offload);
    s.global_batch = global;
    return s;
  }();

  /// The sequence length the micro-batch dimension sets (0: none).
  static constexpr std::uint64_t sequence = [] {
    using D = dimension_t<dimension::micro_batch>;
    if constexpr (std::is_void_v<D>) {
      return std::uint64_t{0};
    } else {
      std::uint64_t s = 0;
      bool same = true;
      hana::unpack(D::types, [&](auto... t) {
        ((s = s == 0 ? choice_of<typename decltype(t)::type>::sequence : s,
          same = same && choice_of<typename decltype(t)::type>::sequence == s),
         ...);
      });
      return same ? s : 0;
    }
  }();
  static_assert(std::is_void_v<dimension_t<dimension::micro_batch>> || sequence != 0,
                "search::space: every train::batch<B, S> of the micro-batch dimension must have the same sequence S");
};

template <class T>
struct is_space : std::false_type {};
template <std::uint64_t W, class... P>
struct is_space<space<W, P...>> : std::true_type {};

/// Configurations per constant expression (see the header comment).
inline constexpr std::size_t chunk_size = 32;

/// The search. `Training` must be a `train::recipe<...>` (so chosen options can be appended).
template <model_type Model, class Training, class Space, device_type Device>
struct strategy_search {
  static_assert(is_space<Space>::value, "strategy_search<Model, Training, Space, Device>: Space must be a search::space<...>");
  static_assert(training_type<Training>, "strategy_search: Training must be a train::recipe<...>");

  using fixed_split = detail::split_fixed<typename Space::fixed_types>;

  /// The literal problem: the model, the recipe and mesh with the fixed types applied, the space.
  static constexpr search_problem problem = [] {
    search_problem p{};
    p.model = Model::value;
    p.training = detail::recipe_with<Training, typename fixed_split::recipe>::type::value;
    if (Space::sequence != 0) p.training.sequence = Space::sequence;
    p.mesh = detail::apply_components<typename fixed_split::mesh>::value;
    p.device = Device::value;
    p.space = Space::value;
    return p;
  }();
  static constexpr std::uint64_t size = problem.space.size();
  /// Configurations per chunk: whole micro-batch groups (plan/search.hpp, detail::search_group),
  /// as many as fit in chunk_size — a group cut by a chunk boundary would be planned one by one.
  static constexpr std::uint64_t chunk_span = [] {
    const std::uint64_t group = memalg::detail::group_size(problem.space);
    return group >= chunk_size ? group : chunk_size / group * group;
  }();
  static constexpr std::size_t chunks = static_cast<std::size_t>((size + chunk_span - 1) / chunk_span);

  template <std::size_t C>
  static constexpr search_listing<chunk_size> chunk =
      list_strategies<chunk_size>(problem, C * chunk_span, (C + 1) * chunk_span);

 private:
  template <std::size_t... C>
  static constexpr search_result merged(std::index_sequence<C...>) {
    search_result r{};
    ((r = merge(r, chunk<C>.result)), ...);
    return r;
  }

 public:
  /// Counts and the index of each query's answer.
  static constexpr search_result result = merged(std::make_index_sequence<chunks>{});

  /// Configuration `Index` of the space as types.
  template <std::uint64_t Index>
  struct configuration {
    static_assert(Index < size, "strategy_search::configuration<Index>: Index is outside the space");
    static constexpr strategy choice = strategy_at(problem.space, Index);
    static constexpr choice_digits digits = digits_of(problem.space, Index);

    template <dimension Kind>
    using dim = typename Space::template dimension_t<Kind>;
    using zero = typename detail::chosen<dim<dimension::zero_stage>, digits.zero_stage, parallel::zero<0>>::type;
    using tensor = typename detail::chosen<dim<dimension::tensor>, digits.tensor, parallel::tensor<1>>::type;
    using pipeline = typename detail::chosen<dim<dimension::pipeline>, digits.pipeline, parallel::pipeline<1>>::type;
    using context = typename detail::chosen<dim<dimension::context>, digits.context, parallel::context<1>>::type;
    using offload = typename detail::chosen<dim<dimension::offload>, digits.offload, no_offload>::type;

    /// `parallel::mesh<data<world/(tp·pp·cp), zero<S>>, tensor<…>, pipeline<…>, context<…>, offload, fixed…, world<W>>`.
    using mesh = typename detail::mesh_with<
        hana::basic_tuple<parallel::data<(choice.dp == 0 ? 1 : choice.dp), zero>, tensor, pipeline, context, offload>,
        typename fixed_split::mesh, hana::basic_tuple<parallel::world<Space::world>>>::type;
    /// The gradient accumulation a global batch implies (1 without one; 0 when it does not divide).
    static constexpr std::uint64_t accumulation = apply_strategy(choice, problem.training).grad_accum;
    using accumulate = std::conditional_t<Space::global == 0, hana::basic_tuple<>,
                                          hana::basic_tuple<train::grad_accum<(accumulation == 0 ? 1 : accumulation)>>>;
    /// `Training` with the fixed recipe options, then the chosen micro-batch and recomputation
    /// (and the accumulation of a global batch).
    using training = typename detail::recipe_with<
        Training, typename detail::concat<typename fixed_split::recipe,
                                          typename detail::chosen_option<dim<dimension::micro_batch>, digits.micro_batch>::type,
                                          typename detail::chosen_option<dim<dimension::recompute>, digits.recompute>::type,
                                          accumulate>::type>::type;
    using plan = memalg::plan<Model, training, mesh, Device>;
  };

 private:
  struct nothing_fits {};
  template <std::uint64_t Index>
  static constexpr auto pick() {
    constexpr bool found = Index != no_configuration;
    static_assert(detail::require_some_fit<found, detail::configurations_evaluated<result.evaluated>,
                                           detail::configurations_valid<result.valid>,
                                           detail::closest_configuration<result.closest.key.index>,
                                           detail::closest_need_bytes<result.closest.key.peak>,
                                           detail::limit_bytes<problem.device.limit().value>>::value);
    if constexpr (found) return hana::type_c<configuration<Index>>;
    else return hana::type_c<nothing_fits>;
  }

 public:
  /// The feasible configuration with the least memory on its most loaded rank.
  using least_memory = typename decltype(pick<result.least_memory.index()>())::type;
  /// The feasible configuration whose most communicating rank sends the fewest bytes per step.
  using least_communication = typename decltype(pick<result.least_communication.index()>())::type;
  /// The feasible configuration with the largest micro-batch.
  using largest_micro_batch = typename decltype(pick<result.largest_micro_batch.index()>())::type;

  /// Indices of every feasible configuration, in index order.
  static constexpr std::array<std::uint64_t, result.feasible> feasible = [] {
    std::array<std::uint64_t, result.feasible> out{};
    std::size_t k = 0;
    [&]<std::size_t... C>(std::index_sequence<C...>) {
      ((void)[&] {
        for (std::size_t i = 0; i < chunk<C>.count; ++i) out[k++] = chunk<C>.feasible[i];
      }(), ...);
    }(std::make_index_sequence<chunks>{});
    return out;
  }();

  /// Every feasible configuration as a type, `hana::tuple<hana::type<configuration<I>>...>`
  /// (e.g. to instantiate a kernel per configuration with `hana::for_each`). A function, so that
  /// only a search that asks for them instantiates the types.
  static constexpr auto feasible_configurations() {
    return []<std::size_t... K>(std::index_sequence<K...>) {
      return hana::make_tuple(hana::type_c<configuration<feasible[K]>>...);
    }(std::make_index_sequence<result.feasible>{});
  }
};

}  // namespace memalg::search

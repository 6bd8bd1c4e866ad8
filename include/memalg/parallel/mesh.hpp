// SPDX-License-Identifier: BSL-1.0
// memalg/parallel/mesh.hpp — the parallel mesh: how ranks split the data, the model and its states.
//
//   world = dp · cp · tp · pp       (Megatron-LM's rank order; expert parallelism lives inside dp·cp)
//
// * data<N, zero<S>>: N data-parallel replicas, each on its own shard of the data. ZeRO stage S
//   (Rajbhandari et al. 2020) shards over the data-parallel group: 1 optimizer states and master
//   weights, 2 also gradients, 3 also weights (FSDP full-shard = stage 3; `fsdp` is an alias).
//   Stage 3 gathers one layer's weights at a time; `Prefetch` more layers are gathered ahead.
// * tensor<T, SequenceParallel>: Megatron tensor parallelism (Shoeybi et al. 2019) with optional
//   sequence parallelism (Korthikanti et al. 2022).
// * pipeline<P, Schedule>: P stages (schedules live in parallel/schedule.hpp).
// * context<C>: the sequence split over C ranks (ring attention / Megatron context parallelism).
// * expert<E>: mixture-of-experts weights split over E ranks, which must divide dp·cp.
// * offload<What>: ZeRO-Offload (optimizer states and master weights in host memory; Ren et al.
//   2021) or ZeRO-Infinity parameter offload (weights too; stage 3 only, as in DeepSpeed).
// * world<N>: states the expected world size; a mesh whose degrees do not multiply to it does not
//   compile.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

namespace memalg {

enum class offload_kind : std::uint8_t { none, optimizer, params };
enum class pipeline_schedule : std::uint8_t { one_f_one_b, interleaved, gpipe };

struct mesh_desc {
  std::uint64_t world = 1;
  std::uint64_t dp = 1;
  std::uint64_t tp = 1;
  std::uint64_t pp = 1;
  std::uint64_t cp = 1;
  std::uint64_t ep = 1;
  int zero_stage = 0;
  std::uint64_t zero3_prefetch = 1;  ///< layers gathered ahead of the one in use (stage 3)
  bool sequence_parallel = false;
  offload_kind offload = offload_kind::none;
  pipeline_schedule schedule = pipeline_schedule::one_f_one_b;
  std::uint64_t virtual_stages = 1;  ///< interleaved schedule: model chunks per stage
  constexpr std::uint64_t product() const { return dp * tp * pp * cp; }
};

/// Why a mesh is invalid, or an empty view when it is valid. Shared by the compile-time mesh
/// (whose static_asserts say the same sentences) and the command-line tool.
constexpr std::string_view mesh_error(const mesh_desc& m) {
  if (m.dp == 0 || m.tp == 0 || m.pp == 0 || m.cp == 0 || m.ep == 0 || m.world == 0)
    return "every parallel degree must be at least 1";
  if (m.zero_stage < 0 || m.zero_stage > 3) return "the ZeRO stage must be 0, 1, 2 or 3";
  if (m.product() != m.world) return "the parallel degrees dp*tp*pp*cp must multiply to the world size";
  if ((m.dp * m.cp) % m.ep != 0) return "the expert-parallel degree must divide dp*cp";
  if (m.offload == offload_kind::params && m.zero_stage != 3)
    return "parameter offload needs ZeRO stage 3 (as in DeepSpeed ZeRO-Infinity)";
  if (m.sequence_parallel && m.tp == 1) return "sequence parallelism needs a tensor-parallel degree above 1";
  if (m.virtual_stages == 0) return "an interleaved schedule needs at least one virtual stage";
  if (m.schedule == pipeline_schedule::interleaved && m.pp == 1)
    return "an interleaved pipeline schedule needs a pipeline degree above 1";
  return {};
}

namespace parallel {

template <int Stage, std::uint64_t Prefetch = 1>
struct zero {
  static_assert(Stage >= 0 && Stage <= 3, "zero<Stage>: the ZeRO stage must be 0, 1, 2 or 3");
  static constexpr int stage = Stage;
  static constexpr std::uint64_t prefetch = Prefetch;
};
using fsdp = zero<3>;

/// Mesh components: each folds itself into a mesh_desc.
template <std::uint64_t N, class Zero = zero<0>>
struct data {
  static_assert(N >= 1, "data<N>: the data-parallel degree must be at least 1");
  static constexpr void apply(mesh_desc& m) {
    m.dp = N;
    m.zero_stage = Zero::stage;
    m.zero3_prefetch = Zero::prefetch;
  }
};
template <std::uint64_t T, bool SequenceParallel = false>
struct tensor {
  static_assert(T >= 1, "tensor<T>: the tensor-parallel degree must be at least 1");
  static_assert(!SequenceParallel || T > 1, "tensor<T, true>: sequence parallelism needs a tensor-parallel degree above 1");
  static constexpr void apply(mesh_desc& m) {
    m.tp = T;
    m.sequence_parallel = SequenceParallel;
  }
};
struct one_f_one_b {
  static constexpr pipeline_schedule kind = pipeline_schedule::one_f_one_b;
  static constexpr std::uint64_t virtual_stages = 1;
};
template <std::uint64_t V>
struct interleaved {
  static_assert(V >= 1, "interleaved<V>: at least one virtual stage per rank");
  static constexpr pipeline_schedule kind = pipeline_schedule::interleaved;
  static constexpr std::uint64_t virtual_stages = V;
};
struct gpipe {
  static constexpr pipeline_schedule kind = pipeline_schedule::gpipe;
  static constexpr std::uint64_t virtual_stages = 1;
};
template <std::uint64_t P, class Schedule = one_f_one_b>
struct pipeline {
  static_assert(P >= 1, "pipeline<P>: the pipeline-parallel degree must be at least 1");
  static_assert(Schedule::kind != pipeline_schedule::interleaved || P > 1,
                "pipeline<P, interleaved<V>>: an interleaved schedule needs a pipeline degree above 1");
  static constexpr void apply(mesh_desc& m) {
    m.pp = P;
    m.schedule = Schedule::kind;
    m.virtual_stages = Schedule::virtual_stages;
  }
};
template <std::uint64_t C>
struct context {
  static_assert(C >= 1, "context<C>: the context-parallel degree must be at least 1");
  static constexpr void apply(mesh_desc& m) { m.cp = C; }
};
template <std::uint64_t E>
struct expert {
  static_assert(E >= 1, "expert<E>: the expert-parallel degree must be at least 1");
  static constexpr void apply(mesh_desc& m) { m.ep = E; }
};
struct offload_optimizer {
  static constexpr void apply(mesh_desc& m) { m.offload = offload_kind::optimizer; }
};
struct offload_params {
  static constexpr void apply(mesh_desc& m) { m.offload = offload_kind::params; }
};
template <std::uint64_t N>
struct world {
  static_assert(N >= 1, "world<N>: the world size must be at least 1");
  static constexpr std::uint64_t size = N;
};

namespace detail {
template <class T>
struct is_world : std::false_type {};
template <std::uint64_t N>
struct is_world<world<N>> : std::true_type {};
template <class T>
constexpr void apply_component(mesh_desc& m) {
  if constexpr (!is_world<T>::value) T::apply(m);
}
}  // namespace detail

template <class... Components>
struct mesh {
 private:
  static constexpr mesh_desc build() {
    mesh_desc m{};
    (detail::apply_component<Components>(m), ...);
    std::uint64_t declared = 0;
    ((declared = detail::is_world<Components>::value ? declared_size<Components>() : declared), ...);
    m.world = declared != 0 ? declared : m.product();
    return m;
  }
  template <class C>
  static constexpr std::uint64_t declared_size() {
    if constexpr (detail::is_world<C>::value) return C::size;
    else return 0;
  }

 public:
  static constexpr mesh_desc value = build();
  static_assert(value.product() == value.world,
                "mesh: the parallel degrees dp*tp*pp*cp do not multiply to the declared world<N> size");
  static_assert((value.dp * value.cp) % value.ep == 0, "mesh: the expert-parallel degree must divide dp*cp");
  static_assert(value.offload != offload_kind::params || value.zero_stage == 3,
                "mesh: parameter offload needs ZeRO stage 3 (as in DeepSpeed ZeRO-Infinity)");
};

}  // namespace parallel

template <class M>
concept mesh_type = requires {
  { M::value } -> std::convertible_to<mesh_desc>;
};

}  // namespace memalg

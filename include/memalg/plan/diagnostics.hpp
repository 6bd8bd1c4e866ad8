// SPDX-License-Identifier: BSL-1.0
// memalg/plan/diagnostics.hpp — compile-time out-of-memory diagnostics.
//
// nvcc prints the values of a failed static_assert only as template arguments of the template
// being instantiated, so the check lives in a class template whose arguments *are* the numbers,
// each wrapped in a type named after what it is:
//
//   error: static assertion failed with "memalg: the most loaded rank does not fit in device
//   memory ..."  ... require_fits<need_bytes<96000000000>, limit_bytes<85899345920>,
//   on_pipeline_stage<0>, at_phase<2>, weights<...>, gradients<...>, ...>
//
// g++ and clang print the same instantiation. (C++26 formatted static_assert messages are not
// available in g++ 12 or nvcc 13.)
#pragma once

#include <cstdint>

namespace memalg::detail {

template <std::uint64_t N> struct need_bytes { static constexpr std::uint64_t value = N; };
template <std::uint64_t N> struct limit_bytes { static constexpr std::uint64_t value = N; };
template <std::uint64_t N> struct on_pipeline_stage {};
/// 0 steady, 1 forward, 2 backward, 3 optimizer step.
template <int N> struct at_phase {};
template <std::uint64_t N> struct weights {};
template <std::uint64_t N> struct gradients {};
template <std::uint64_t N> struct master_weights {};
template <std::uint64_t N> struct optimizer_states {};
template <std::uint64_t N> struct activations {};
template <std::uint64_t N> struct temporaries {};
template <std::uint64_t N> struct comm_buffers {};
template <std::uint64_t N> struct reserve {};

template <class Need, class Limit, class Stage, class Phase, class... Breakdown>
struct require_fits {
  static_assert(Need::value <= Limit::value,
                "memalg: the most loaded rank does not fit in device memory (need_bytes > limit_bytes; the "
                "breakdown follows in the template arguments): try a smaller micro-batch with gradient "
                "accumulation, recomputation, a higher ZeRO stage, more tensor or pipeline parallelism, "
                "an 8-bit optimizer, or offload");
  static constexpr bool value = Need::value <= Limit::value;
};

}  // namespace memalg::detail

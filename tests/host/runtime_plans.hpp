// SPDX-License-Identifier: BSL-1.0
// The runtime's test matrix, shared by the runtime-plan, step-program and step-backend tests, and
// the generated matrix of the measured-arena tests (tests/host/test_measured_arena.cpp,
// tests/mpi/test_measured_arena.cpp).
//
// Small GPT-shaped models (naive or flash attention, dropout, fp32 / bf16 / fp16 logits; a
// Llama-shaped one) planned under the memalg stack on a 1 GiB host budget, and the token ids
// every test feeds them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/memalg.hpp>

namespace memalg_test {
namespace m = memalg;
using namespace memalg::literals;

struct budget {
  static constexpr m::device_desc value{"cpu", 1_GiB, m::bytes{}};
};
constexpr m::lm_config small(m::dtype logits, bool flash, std::uint64_t dropout, std::uint64_t layers) {
  m::lm_config c{};
  c.layers = layers;
  c.hidden = 32;
  c.heads = 4;
  c.vocab = 64;
  c.positions = 32;
  c.logits = logits;
  c.flash = flash;
  c.dropout_permille = dropout;
  return c;
}
struct naive32 { static constexpr m::lm_config value = small(m::dtypes::fp32, false, 0, 4); };
struct flash32 { static constexpr m::lm_config value = small(m::dtypes::fp32, true, 100, 5); };
struct naive_bf16 { static constexpr m::lm_config value = small(m::dtypes::bf16, false, 0, 3); };
struct flash_fp16 { static constexpr m::lm_config value = small(m::dtypes::fp16, true, 0, 4); };

template <class Config, class Precision, class Optimizer, class... Options>
using plan_for = m::plan<m::exec::runtime_gpt<Config>,
                         m::train::recipe<Precision, Optimizer, m::train::reference_kernels, Options...>,
                         m::parallel::mesh<>, budget>;

/// The runtime's single-rank test matrix: naive and flash attention, recomputation none /
/// selective / full / every-K, dropout, accumulation, fp32 / mixed bf16 / fp16, AdamW / SGD /
/// momentum (for doctest's TEST_CASE_TEMPLATE_APPLY).
using runtime_matrix = std::tuple<
    plan_for<naive32, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
    plan_for<naive32, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
    plan_for<naive32, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::full>,
    plan_for<naive32, m::precision::fp32, m::optim::sgd<>, m::train::batch<2, 16>, m::train::recompute::every<3>>,
    plan_for<naive32, m::precision::fp32, m::optim::momentum<>, m::train::batch<1, 32>, m::train::grad_accum<3>>,
    plan_for<flash32, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 32>>,
    plan_for<flash32, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 32>, m::train::recompute::selective>,
    plan_for<flash32, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::every<2>,
             m::train::grad_accum<2>>,
    plan_for<naive_bf16, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>>,
    plan_for<naive_bf16, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<4, 16>, m::train::recompute::full>,
    plan_for<flash_fp16, m::precision::amp_fp16, m::optim::adamw<>, m::train::batch<2, 16>>,
    plan_for<flash_fp16, m::precision::amp_fp16, m::optim::momentum<>, m::train::batch<2, 16>,
             m::train::recompute::every<2>>>;

// ---- the measured-arena matrix --------------------------------------------------------------
/// A Llama-shaped model of the same size: RMSNorm, SwiGLU, rotary positions, 2 key/value heads
/// for 4, no biases, an untied output layer, flash attention.
constexpr m::lm_config small_llama(m::dtype logits) {
  m::lm_config c = small(logits, true, 0, 2);
  c.positions = 0;
  c.rotary = true;
  c.kv_heads = 2;
  c.ffn = 88;
  c.rms_norm = true;
  c.gated = true;
  c.bias = false;
  c.tied = false;
  return c;
}
struct llama32 { static constexpr m::lm_config value = small_llama(m::dtypes::fp32); };
struct llama_bf16 { static constexpr m::lm_config value = small_llama(m::dtypes::bf16); };
/// A GPT-NeoX-shaped model of the same size: parallel residual, LayerNorm with biases, GeLU,
/// rotary positions over half of each head (rotary_pct 0.5), an untied output layer, flash
/// attention (with dropout 0.1 where `dropout`).
constexpr m::lm_config small_neox(m::dtype logits, std::uint64_t dropout) {
  m::lm_config c = small(logits, true, dropout, 2);
  c.positions = 0;
  c.rotary = true;
  c.rotary_dim = 4;
  c.parallel_residual = true;
  c.tied = false;
  return c;
}
/// A Falcon-7B-shaped one: parallel residual through one shared LayerNorm, multi-query attention
/// (one key/value head), rotary positions, no projection biases, tied output.
constexpr m::lm_config small_falcon(m::dtype logits, std::uint64_t dropout) {
  m::lm_config c = small_neox(logits, dropout);
  c.rotary_dim = 0;
  c.shared_norm = true;
  c.kv_heads = 1;
  c.bias = false;
  c.tied = true;
  return c;
}
struct neox32 { static constexpr m::lm_config value = small_neox(m::dtypes::fp32, 0); };
struct falcon_bf16 { static constexpr m::lm_config value = small_falcon(m::dtypes::bf16, 0); };

template <class Config, class Precision, class Recompute, class Mesh>
using memory_plan = m::plan<m::exec::runtime_gpt<Config>,
                            m::train::recipe<Precision, m::optim::adamw<>, m::train::reference_kernels,
                                             m::train::batch<2, 16>, Recompute>,
                            Mesh, budget>;
/// One configuration under no, selective and full recomputation.
template <class Config, class Precision, class Mesh>
using over_recomputation = std::tuple<memory_plan<Config, Precision, m::train::recompute::none, Mesh>,
                                      memory_plan<Config, Precision, m::train::recompute::selective, Mesh>,
                                      memory_plan<Config, Precision, m::train::recompute::full, Mesh>>;
template <class... Tuples>
using concat = decltype(std::tuple_cat(std::declval<Tuples>()...));
using single_rank = m::parallel::mesh<>;
using dp2_zero1 = m::parallel::mesh<m::parallel::data<2, m::parallel::zero<1>>>;
using dp2_zero2 = m::parallel::mesh<m::parallel::data<2, m::parallel::zero<2>>>;
using dp2_zero3 = m::parallel::mesh<m::parallel::data<2, m::parallel::zero<3, 0>>>;
using tp2 = m::parallel::mesh<m::parallel::tensor<2>>;
using dp2_tp2 = m::parallel::mesh<m::parallel::data<2, m::parallel::zero<1>>, m::parallel::tensor<2>>;

/// Architecture (GPT-2-style, Llama-style, GPT-NeoX- and Falcon-style parallel blocks) × precision
/// (fp32, mixed bf16, amp fp16 where the runtime implements it) × recomputation (none, selective,
/// full) on one rank: 21 plans, whose
/// measured arena comes from a CPU execution (tests/host/test_measured_arena.cpp).
using memory_matrix_single =
    concat<over_recomputation<naive32, m::precision::fp32, single_rank>,
           over_recomputation<naive_bf16, m::precision::mixed_bf16, single_rank>,
           over_recomputation<flash_fp16, m::precision::amp_fp16, single_rank>,
           over_recomputation<llama32, m::precision::fp32, single_rank>,
           over_recomputation<llama_bf16, m::precision::mixed_bf16, single_rank>,
           over_recomputation<neox32, m::precision::fp32, single_rank>,
           over_recomputation<falcon_bf16, m::precision::mixed_bf16, single_rank>>;
/// GPT-2-style fp32 (the runtime's multi-rank precision) × recomputation × mesh (dp2 ZeRO-1/2/3,
/// tp2, dp2×tp2): 15 plans, laid out per rank on the host and measured under MPI
/// (tests/mpi/test_measured_arena.cpp).
using memory_matrix_multi =
    concat<over_recomputation<naive32, m::precision::fp32, dp2_zero1>, over_recomputation<naive32, m::precision::fp32, dp2_zero2>,
           over_recomputation<naive32, m::precision::fp32, dp2_zero3>, over_recomputation<naive32, m::precision::fp32, tp2>,
           over_recomputation<naive32, m::precision::fp32, dp2_tp2>>;

/// Whether laying out the step of `c` for `rank` in `sizes` less 16 bytes of stack is refused: a
/// plan that is the step's exact peak must be (one that over-predicts is not).
inline bool short_plan_refused(const m::exec::gpt_config& c, m::exec::arena_sizes sizes, m::exec::rank_coords rank = {}) {
  try {
    (void)m::exec::build_program(c, {sizes.persistent, sizes.stack - 16}, rank);
  } catch (const m::exec::arena_error&) {
    return true;
  }
  return false;
}

inline std::vector<std::int32_t> ids(std::size_t n, int salt) {
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>((i * 13 + static_cast<std::size_t>(salt) * 7 + i / 3) % 64);
  return v;
}
/// `steps` losses of `Plan`'s trainer on the ids above (32 tokens a step; with `cycle`, the same
/// `cycle` batches over and over), and its high-water mark.
template <class Plan, class Comm>
std::pair<std::vector<float>, std::size_t> losses_and_peak(int steps, int cycle = 0) {
  using run = m::exec::gpt_run<Plan, Comm>;
  Comm dp, tp;
  typename run::trainer t(run::config, run::arena, dp, tp);
  std::vector<float> out;
  for (int s = 0; s < steps; ++s) {
    const int k = cycle != 0 ? s % cycle : s;
    out.push_back(t.train_step(ids(32, k), ids(32, k + 1)));
  }
  return {out, t.memory().high_water()};
}
}  // namespace memalg_test

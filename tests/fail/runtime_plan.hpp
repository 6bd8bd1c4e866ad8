// SPDX-License-Identifier: BSL-1.0
// What the runtime-refusal fail tests (runtime_*.cpp, cuda_runtime_*.cpp) share: a small GPT on a
// 1 GiB host budget and a plan of it that fits and that both runtimes implement. Each test changes
// one thing a runtime refuses, so the compile error it expects is that runtime's sentence
// (exec/runtime_issues.hpp) and nothing else.
#pragma once

#include <cstdint>

#include <memalg/device/device.hpp>
#include <memalg/exec/gpt/plan.hpp>
#include <memalg/parallel/mesh.hpp>
#include <memalg/train/optimizer.hpp>
#include <memalg/train/precision.hpp>
#include <memalg/train/recipe.hpp>

namespace fail_runtime {
namespace m = memalg;

struct budget {
  static constexpr m::device_desc value{"cpu-1gib", m::bytes{std::uint64_t{1} << 30}, m::bytes{}};
};

/// 2 layers of width 32, 4 heads of 8, a 64-token vocabulary, 32 learned positions, naive
/// attention, fp32 logits: GPT-2's block.
constexpr m::lm_config gpt() {
  m::lm_config c{};
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.vocab = 64;
  c.positions = 32;
  c.logits = m::dtypes::fp32;
  return c;
}
struct gpt_config {
  static constexpr m::lm_config value = gpt();
};

/// The plan of Config under the memalg stack (fused optimizer), 2 sequences of 16 tokens.
template <class Config, class Precision = m::precision::fp32, class Optimizer = m::optim::adamw<>,
          class Mesh = m::parallel::mesh<>, class... Options>
using plan = m::plan<m::exec::runtime_gpt<Config>,
                     m::train::recipe<Precision, Optimizer, m::train::batch<2, 16>, m::train::reference_kernels, Options...>,
                     Mesh, budget>;

}  // namespace fail_runtime

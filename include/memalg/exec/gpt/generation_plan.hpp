// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/generation_plan.hpp — from a serving plan to the generation program's arena, and
// a training checkpoint's weights into it; host side and backend-neutral.
//
// The serving plan of memalg's own stack (plan/serve.hpp, serve_stack::memalg) says how large the
// runtime's arena is and where in it the key/value cache lies; `plan_generation` turns that into
// the capacities and the cache placement exec/gpt/build_generation.hpp lays the run out in, so the
// program is checked against the plan before any kernel runs. `load_generation_weights` copies
// the weight sections of a checkpoint the training binaries wrote (exec/checkpoint.hpp) into a
// backend's arena: the units are training's, in training's storage type.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "memalg/device/device.hpp"
#include "memalg/exec/checkpoint.hpp"
#include "memalg/exec/gpt/build_generation.hpp"
#include "memalg/exec/lowering.hpp"
#include "memalg/exec/program.hpp"
#include "memalg/model/layer.hpp"
#include "memalg/plan/serve.hpp"

namespace memalg::exec {

/// The serving request of a generation run on memalg's runtime: the request's batch and lengths,
/// the model in `compute` (a training plan's weight dtype), memalg's stack.
constexpr serving_desc generation_serving(const generation_request& r, dtype compute) {
  serving_desc d{};
  d.batch = r.batch;
  d.prompt = r.prompt;
  d.new_tokens = r.new_tokens;
  d.compute = compute;
  d.stack = serve_stack::memalg;
  return d;
}

/// What the serving plan gives the generation program: its result, the arena's capacities
/// (persistent: the weights and the whole cache; stack: one forward's peak) and the cache's place.
struct planned_generation {
  serve_result plan;
  arena_sizes arena;
  cache_placement cache;
  /// The arena the plan predicts: every byte of it (no device reserve).
  std::size_t arena_bytes() const { return arena.persistent + arena.stack; }
};

/// The serving plan of `request` for model `m` in `compute` on `dev`; program_error with the
/// plan's sentence when memalg's stack does not plan it.
inline planned_generation plan_generation(const model_desc& m, const generation_request& request, dtype compute,
                                          const device_desc& dev) {
  const serve_result r = evaluate_serving(m, generation_serving(request, compute), dev);
  if (!r.reason.empty()) throw program_error("generation: " + std::string(r.reason));
  planned_generation g{r, {}, {}};
  g.arena.persistent = static_cast<std::size_t>((r.at_peak.weights + r.at_peak.kv_cache).value);
  g.arena.stack = static_cast<std::size_t>(r.stack_peak.value);
  g.cache = {static_cast<std::size_t>(r.cache_offset.value), static_cast<std::size_t>(r.cache_layer_bytes.value)};
  return g;
}

/// Copies the weights of checkpoint `c` into the generation program `p`'s arena on backend `b`
/// (b.write(operand, bytes)): every unit's "<unit>.weights" section, which must exist with the
/// unit's size. The checkpoint must come from a one-rank training run of plan `plan` (its
/// fingerprint "<plan> rank 0/1 ...", exec/checkpoint.hpp's callers).
template <class Backend>
void load_generation_weights(Backend& b, const program& p, const checkpoint_contents& c, std::string_view plan) {
  const std::string expected = std::string(plan) + " rank 0/1 ";
  if (c.fingerprint.compare(0, expected.size(), expected) != 0)
    throw checkpoint_error("the checkpoint was written by '" + c.fingerprint + "', not by a one-rank run of plan '" +
                           std::string(plan) + "'");
  for (const persistent_tensor& t : p.checkpoint) {
    const auto* data = c.find(t.name);
    if (data == nullptr) throw checkpoint_error("the checkpoint has no section '" + t.name + "'");
    if (data->size() != t.t.bytes())
      throw checkpoint_error("the checkpoint's section '" + t.name + "' holds " + std::to_string(data->size()) +
                             " bytes, the model's " + std::to_string(t.t.bytes()) + ": another model or storage type");
    b.write(t.t, std::span<const std::byte>(data->data(), data->size()));
  }
}

}  // namespace memalg::exec

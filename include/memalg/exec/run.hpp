// SPDX-License-Identifier: BSL-1.0
// memalg/exec/run.hpp — the step-program interpreter and the concept a backend implements.
//
// A backend executes ops; the program (exec/program.hpp) has already decided every offset. The
// concept asks for one call operator per op type, checked over the whole variant, so a backend
// that forgets an op — or a new op a backend does not know yet — fails to compile at `run`, not at
// run time. `run` walks step_begin once, `micro` once per accumulated micro-batch and step_end
// once, honouring each op's `when`. A pipeline stage's program (pp > 1) has no `micro`: `run`
// walks its sections in schedule order instead, with run_state::micro set to each section's
// micro-batch (so its ids, dropout streams and last-micro-batch reductions are its own).
//
// Given a live_bytes_meter (exec/meter.hpp), `run` hands it every op it executed, after the
// backend did: the meter counts the arena's live bytes from the ops' declared accesses, the same
// on every backend (the null backend's dry run included).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <variant>

#include "memalg/exec/communicator.hpp"
#include "memalg/exec/meter.hpp"
#include "memalg/exec/program.hpp"

namespace memalg::exec {

/// What the interpreter and the backend share during a step.
struct run_state {
  std::uint64_t step = 0, micro = 0, updates = 0;
  bool skip = false;        ///< fp16 overflow: the backend's clip_scale sets it, optimizer ops then skip
  float loss_scale = 1.0f;  ///< the dynamic loss scale (1 without loss scaling)
};

/// This rank's inputs for one step, micro-batch after micro-batch: grad_accum × tokens_per_micro
/// token ids, grad_accum × targets_per_micro target ids, grad_accum × features_per_micro fp32
/// features and grad_accum × masks_per_micro u8 mask entries (the last two for the speech model),
/// and the generated_per_micro token ids a generation program writes (and reads back).
struct step_io {
  std::span<const std::int32_t> tokens, targets;
  std::span<const float> features = {};
  std::span<const std::uint8_t> masks = {};
  std::span<std::int32_t> generated = {};
};

struct step_result {
  float loss = 0, grad_norm = 0;
  bool skipped = false;
};

namespace detail {
template <class B, class V>
struct handles_all : std::false_type {};
template <class B, class... O>
struct handles_all<B, std::variant<O...>>
    : std::bool_constant<(std::invocable<B&, const O&, run_state&> && ...)> {};
}  // namespace detail

/// A backend: one call operator per op (op, run_state&), per-step hooks, and its communicators.
template <class B>
concept step_backend = detail::handles_all<B, op_body>::value &&
                       requires(B& b, const program& p, step_io io, run_state& s) {
                         b.begin_step(p, io, s);  // stage this step's ids
                         { b.end_step(p, s) } -> std::same_as<step_result>;
                         requires communicator<std::remove_reference_t<decltype(b.dp())>>;
                         requires communicator<std::remove_reference_t<decltype(b.tp())>>;
                       };

namespace detail {
template <step_backend B>
step_result run(const program& p, B& b, step_io io, run_state& s, live_bytes_meter* meter) {
  if (io.tokens.size() != p.grad_accum * p.tokens_per_micro || io.targets.size() != p.grad_accum * p.targets_per_micro ||
      io.features.size() != p.grad_accum * p.features_per_micro || io.masks.size() != p.grad_accum * p.masks_per_micro ||
      io.generated.size() != p.grad_accum * p.generated_per_micro)
    throw std::invalid_argument(
        "exec::run: expected grad_accum × the program's tokens, targets, features, masks and generated ids per "
        "micro-batch");
  ++s.step;
  s.skip = false;
  b.begin_step(p, io, s);
  if (meter) meter->begin_step();
  // Every op's place in the order the step runs them, skipped ones too: the trace's events say
  // after how many of them they come (arena_layout::event::at).
  std::uint64_t at = 0;
  const auto exec = [&](const op& o) {
    const std::uint64_t here = at++;
    if (o.cond == when::last_micro && s.micro + 1 != p.grad_accum) return;
    if (o.cond == when::unless_skipped && s.skip) return;
    std::visit(
        [&](const auto& x) {
          b(x, s);
          if (meter) meter->record(x, here);
        },
        o.body);
  };
  for (const op& o : p.step_begin) exec(o);
  if (p.pipeline.empty()) {
    for (s.micro = 0; s.micro < p.grad_accum; ++s.micro)
      for (const op& o : p.micro) exec(o);
  } else {
    for (const pipeline_section& sec : p.pipeline) {
      s.micro = sec.step.micro;
      for (const op& o : sec.ops) exec(o);
    }
  }
  s.micro = p.grad_accum - 1;  // step_end sees the last micro-batch, as the trainer does
  for (const op& o : p.step_end) exec(o);
  const step_result r = b.end_step(p, s);
  if (meter) meter->end_step();
  return r;
}
}  // namespace detail

/// One optimizer step of `p` on backend `b`, its live arena bytes counted by `meter` (a meter of
/// `p`, exec/meter.hpp): every op executed, as its declaration says it uses its operands.
template <step_backend B>
step_result run(const program& p, B& b, step_io io, run_state& s, live_bytes_meter& meter) {
  return detail::run(p, b, io, s, &meter);
}

/// One optimizer step of `p` on backend `b`, unmetered.
template <step_backend B>
step_result run(const program& p, B& b, step_io io, run_state& s) {
  return detail::run(p, b, io, s, nullptr);
}

}  // namespace memalg::exec

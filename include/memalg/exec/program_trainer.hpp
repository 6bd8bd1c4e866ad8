// SPDX-License-Identifier: BSL-1.0
// memalg/exec/program_trainer.hpp — a trainer's API over the step program and any step backend.
//
// `program_trainer<Backend>` builds the step program of a `gpt_config` for this rank
// (exec/gpt/build_program.hpp) in the plan's arena sizes, hands it to `Backend` (which allocates that
// arena and initialises the parameters) and runs one program per `train_step` through
// exec::run. It offers the API a training loop calls — train_step, memory(), state
// sections with store/restore_counters for checkpoints, unit_weights, last_grad_norm,
// step_count, skipped_steps — so `gpt_run<Plan, Comm>::trainer` (backend/cpu/gpt_run.hpp) names it
// over backend::cpu::step_backend and train_gpt_cpu runs the program.
//
// The backend is any exec::step_backend that is constructible from (const program&, Comm& dp,
// Comm& tp), names its storage type as `static constexpr exec::elem storage_elem`, and offers
// the state calls: unit_count, unit_weights, state_sections, store_counters(run_state&),
// restore_counters(run_state&), skipped_steps and capacity. This header includes no backend.
//
// memory() reports the program's layout of the arena: the bytes the backend allocated, the
// persistent region, the high-water mark and its breakdown by category. The layout is laid out
// by the builder (exec/arena_layout.hpp) and does not depend on data, so it is known before any
// kernel runs; the backend checks every operand it resolves against the capacity. meter() is
// what the steps measured: the interpreter's live-bytes meter (exec/meter.hpp), on any backend.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "memalg/exec/gpt/build_program.hpp"
#include "memalg/exec/checkpoint.hpp"
#include "memalg/exec/gpt/config.hpp"
#include "memalg/exec/meter.hpp"
#include "memalg/exec/program.hpp"
#include "memalg/exec/run.hpp"
#include "memalg/plan/breakdown.hpp"

namespace memalg::exec {

/// A step backend program_trainer can drive (see the header comment).
template <class B>
concept trainer_backend =
    step_backend<B> && requires(B& b, const program& p, std::size_t i, run_state& s) {
      { B::storage_elem } -> std::convertible_to<elem>;
      requires std::constructible_from<B, const program&, std::remove_reference_t<decltype(b.dp())>&,
                                       std::remove_reference_t<decltype(b.tp())>&>;
      { b.unit_count() } -> std::convertible_to<std::size_t>;
      { b.unit_weights(i) } -> std::same_as<std::vector<float>>;
      { b.state_sections() } -> std::same_as<std::vector<checkpoint_section>>;
      b.store_counters(s);
      b.restore_counters(s);
      { b.skipped_steps() } -> std::convertible_to<std::size_t>;
      { b.capacity() } -> std::convertible_to<std::size_t>;
    };

/// The memory a program_trainer holds, as its program lays it out.
class program_memory {
 public:
  program_memory() = default;
  program_memory(const program& p, std::size_t capacity)
      : capacity_(capacity),
        persistent_capacity_(p.sizes.persistent),
        persistent_used_(p.persistent_bytes),
        high_water_(p.high_water),
        peak_by_category_(p.peak_by_category),
        peak_tensor_(p.peak_tensor) {}

  /// Bytes the backend allocated for the arena (persistent region + stacks).
  std::size_t capacity() const { return capacity_; }
  std::size_t persistent_capacity() const { return persistent_capacity_; }
  /// Bytes of weights, gradients, master weights and optimizer states.
  std::size_t persistent_used() const { return persistent_used_; }
  /// Persistent bytes + the highest the stacks reach together during a step.
  std::size_t high_water() const { return high_water_; }
  const breakdown& peak_by_category() const { return peak_by_category_; }
  /// The tensor whose allocation sets the high-water mark.
  std::string_view peak_tensor() const { return peak_tensor_; }

 private:
  std::size_t capacity_ = 0, persistent_capacity_ = 0, persistent_used_ = 0, high_water_ = 0;
  breakdown peak_by_category_{};
  std::string peak_tensor_;
};

template <trainer_backend Backend>
class program_trainer {
 public:
  using backend_type = Backend;
  using dp_comm = std::remove_reference_t<decltype(std::declval<Backend&>().dp())>;
  using tp_comm = std::remove_reference_t<decltype(std::declval<Backend&>().tp())>;

  /// Lays out the step of `cfg` for the rank the communicators name, in `sizes` (the plan's arena),
  /// and allocates and initialises it. Throws program_error for a configuration the runtime does
  /// not implement and arena_error when the step does not fit `sizes`. The communicators must
  /// outlive the trainer.
  program_trainer(const gpt_config& cfg, arena_sizes sizes, dp_comm& dp, tp_comm& tp)
      : c_(cfg),
        program_(build_program(cfg, sizes,
                               rank_coords{static_cast<std::size_t>(dp.rank()), static_cast<std::size_t>(tp.rank())},
                               Backend::storage_elem)),
        backend_(program_, dp, tp),
        memory_(program_, backend_.capacity()),
        meter_(program_) {}
  /// A pipeline stage (cfg.pp > 1): `pp` is the group of the stages, its rank this rank's stage;
  /// `sizes` the plan's arena of that stage (gpt_run::stage_arena). The backend must take the
  /// pipeline group as a fourth constructor argument.
  program_trainer(const gpt_config& cfg, arena_sizes sizes, dp_comm& dp, tp_comm& tp, dp_comm& pp)
    requires std::constructible_from<Backend, const program&, dp_comm&, tp_comm&, dp_comm&>
      : c_(cfg),
        program_(build_program(cfg, sizes,
                               rank_coords{static_cast<std::size_t>(dp.rank()), static_cast<std::size_t>(tp.rank()),
                                           static_cast<std::size_t>(pp.rank())},
                               Backend::storage_elem)),
        backend_(program_, dp, tp, pp),
        memory_(program_, backend_.capacity()),
        meter_(program_) {}
  /// Any program built for this rank (e.g. exec/speech/build_program.hpp's), in its own sizes.
  program_trainer(program p, dp_comm& dp, tp_comm& tp)
      : program_(std::move(p)), backend_(program_, dp, tp), memory_(program_, backend_.capacity()), meter_(program_) {}
  program_trainer(const program_trainer&) = delete;
  program_trainer& operator=(const program_trainer&) = delete;

  const gpt_config& config() const { return c_; }
  const program& step_program() const { return program_; }
  Backend& backend() { return backend_; }
  const Backend& backend() const { return backend_; }
  const program_memory& memory() const { return memory_; }
  /// The live-bytes meter of the steps trained so far (exec/meter.hpp): meter().high_water() is
  /// the measured arena.
  const live_bytes_meter& meter() const { return meter_; }
  std::size_t step_count() const { return static_cast<std::size_t>(state_.step); }
  std::size_t skipped_steps() const { return static_cast<std::size_t>(backend_.skipped_steps()); }
  float last_grad_norm() const { return last_.grad_norm; }
  /// Whether the last step was skipped (fp16 overflow).
  bool last_step_skipped() const { return last_.skipped; }

  /// One optimizer step over `grad_accum` micro-batches. `tokens`/`targets` hold this rank's
  /// sequences: grad_accum × micro_batch × sequence ids each. Returns the mean loss over all
  /// data-parallel ranks and micro-batches.
  float train_step(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    last_ = run(program_, backend_, step_io{tokens, targets}, state_, meter_);
    return last_.loss;
  }

  /// One optimizer step over every input the program reads (step_io: ids, features, masks).
  float train_step(const step_io& io) {
    last_ = run(program_, backend_, io, state_, meter_);
    return last_.loss;
  }

  /// The rank's state, for checkpoints: weights (or weight shards), master weights, optimizer
  /// states, the loss scaler and the counters, in a fixed order and names (tests/data/golden holds their digests).
  std::vector<checkpoint_section> state_sections() { return backend_.state_sections(); }
  /// Call after loading a checkpoint into state_sections().
  void restore_counters() { backend_.restore_counters(state_); }
  /// Call before saving state_sections().
  void store_counters() { backend_.store_counters(state_); }

  /// Copy of all weights of unit `i` in logical order (gathered under ZeRO-3: collective), for tests.
  std::vector<float> unit_weights(std::size_t i) { return backend_.unit_weights(i); }
  std::size_t unit_count() const { return backend_.unit_count(); }

 private:
  gpt_config c_;
  program program_;
  Backend backend_;
  program_memory memory_;
  live_bytes_meter meter_;
  run_state state_{};
  step_result last_{};
};

}  // namespace memalg::exec

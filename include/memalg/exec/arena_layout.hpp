// SPDX-License-Identifier: BSL-1.0
// memalg/exec/arena_layout.hpp — the arena's offset bookkeeping, without any memory.
//
// Keeping the bookkeeping apart from any memory lets the step-program builders
// (exec/gpt/build_program.hpp, exec/speech/build_program.hpp) lay out a whole training step on the
// host — every offset, the high-water mark, the peak by category — before any kernel runs; the
// backends allocate the capacities and resolve the offsets.
//
//   [ persistent region | saved stack →            free            ← transient stack ]
//
// Each stack is last-in first-out; a push past the free space throws (the plan under-predicts),
// a pop that is not the top of its side throws (the caller broke the LIFO discipline). Sizes are
// in bytes and must be multiples of `alignment`: nothing is ever padded, so measured = predicted.
//
// An opt-in trace records every push and pop (name, offset, bytes, category, side). Persistent
// tensors are recorded always — a handful per unit, fixed at construction — so a trace enabled
// after an owner has allocated its states still starts with the persistent region's layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "memalg/plan/breakdown.hpp"

namespace memalg::exec {

struct arena_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Arena sizes the plan predicts (persistent model states; saved + transient peak).
struct arena_sizes {
  std::size_t persistent = 0;
  std::size_t stack = 0;
};

class arena_layout {
 public:
  static constexpr std::size_t alignment = 16;

  enum class side : std::uint8_t { saved, transient };
  enum class event_kind : std::uint8_t { persistent, push, pop };

  /// One allocation or release; `where` is meaningless (saved) for persistent tensors.
  struct event {
    std::string name;
    std::size_t offset = 0, bytes = 0;
    category cat = category::activations;
    side where = side::saved;
    event_kind kind = event_kind::push;
    /// The ops laid out before the event (set_clock: a program's ops in the order they run), so
    /// that a replay knows between which two ops it happens.
    std::uint64_t at = 0;
    friend bool operator==(const event&, const event&) = default;
  };

  arena_layout(std::size_t persistent, std::size_t stack)
      : persistent_capacity_(persistent),
        capacity_(persistent + stack),
        saved_top_(persistent),
        transient_bottom_(capacity_) {}

  std::size_t capacity() const { return capacity_; }
  std::size_t persistent_capacity() const { return persistent_capacity_; }
  std::size_t persistent_used() const { return persistent_top_; }
  /// Measured peak: persistent bytes + the highest the stacks ever reached together.
  std::size_t high_water() const { return high_water_; }
  std::size_t live() const {
    return persistent_top_ + (saved_top_ - persistent_capacity_) + (capacity_ - transient_bottom_);
  }
  const breakdown& by_category() const { return by_category_; }
  const breakdown& peak_by_category() const { return peak_by_category_; }
  /// The tensor whose allocation set the high-water mark (for reports).
  std::string_view peak_tensor() const { return peak_tensor_; }
  std::size_t stack_depth() const { return saved_.size() + transient_.size(); }

  /// `count` elements of `elem_size` bytes, checked for overflow and padding.
  static std::size_t checked_bytes(std::string_view name, std::size_t count, std::size_t elem_size) {
    if (elem_size != 0 && count > (~std::size_t{0}) / elem_size)
      throw arena_error("arena: size of '" + std::string(name) + "' overflows");
    const std::size_t size = count * elem_size;
    if (size % alignment != 0)
      throw arena_error("arena: '" + std::string(name) + "' is " + std::to_string(size) + " bytes, not a multiple of " +
                        std::to_string(alignment) + ": choose shapes whose tensors need no padding");
    return size;
  }

  /// Places `size` bytes in the persistent region; returns the offset.
  std::size_t persistent(std::string_view name, std::size_t size, category c) {
    if (size > persistent_capacity_ - persistent_top_)
      throw arena_error("arena: persistent tensor '" + std::string(name) + "' (" + std::to_string(size) +
                        " bytes) does not fit the planned persistent region of " +
                        std::to_string(persistent_capacity_) + " bytes");
    const std::size_t offset = persistent_top_;
    persistent_top_ += size;
    by_category_[c] += bytes{size};
    note_peak(name);
    trace_.push_back({std::string(name), offset, size, c, side::saved, event_kind::persistent});
    return offset;
  }

  /// Pushes `size` bytes on one side; returns the offset. Release with `pop` in reverse order.
  std::size_t push(std::string_view name, std::size_t size, category c, side where = side::saved) {
    if (size > transient_bottom_ - saved_top_)
      throw arena_error("arena: '" + std::string(name) + "' (" + std::to_string(size) +
                        " bytes) exceeds the planned arena of " + std::to_string(capacity_) +
                        " bytes: the plan under-predicts this step");
    std::size_t offset = 0;
    // Names are kept only while tracing: the pop event needs them, nothing else does.
    std::string kept = tracing_ ? std::string(name) : std::string();
    if (where == side::saved) {
      offset = saved_top_;
      saved_top_ += size;
      saved_.push_back({offset, size, c, std::move(kept)});
    } else {
      transient_bottom_ -= size;
      offset = transient_bottom_;
      transient_.push_back({offset, size, c, std::move(kept)});
    }
    by_category_[c] += bytes{size};
    note_peak(name);
    if (tracing_) trace_.push_back({std::string(name), offset, size, c, where, event_kind::push, clock_});
    return offset;
  }

  /// Releases the tensor at `offset`, which must be the top of its side.
  void pop(std::size_t offset) {
    const bool transient = offset >= transient_bottom_ && offset < capacity_ && !transient_.empty() &&
                           offset == transient_.back().offset;
    std::vector<entry>& stack = transient ? transient_ : saved_;
    if (stack.empty() || stack.back().offset != offset)
      throw arena_error("arena: tensors must be released in reverse order of allocation");
    entry& e = stack.back();
    by_category_[e.cat] -= bytes{e.size};
    if (transient)
      transient_bottom_ = e.offset + e.size;
    else
      saved_top_ = e.offset;
    if (tracing_)
      trace_.push_back({std::move(e.name), e.offset, e.size, e.cat, transient ? side::transient : side::saved,
                        event_kind::pop, clock_});
    stack.pop_back();
  }

  /// Forget the recorded peaks (e.g. after a warm-up step).
  void reset_peak() {
    high_water_ = live();
    peak_by_category_ = by_category_;
  }

  /// Record pushes and pops from now on (persistent tensors are recorded always).
  void enable_trace() { tracing_ = true; }
  /// The ops laid out so far: the `at` of the events recorded from now on.
  void set_clock(std::uint64_t ops) { clock_ = ops; }
  bool tracing() const { return tracing_; }
  const std::vector<event>& trace() const { return trace_; }

 private:
  struct entry {
    std::size_t offset, size;
    category cat;
    std::string name;
  };
  void note_peak(std::string_view name) {
    if (live() > high_water_) {
      high_water_ = live();
      peak_by_category_ = by_category_;
      peak_tensor_ = name;  // a copy: callers pass temporaries such as u.name + ".gathered"
    }
  }

  std::size_t persistent_capacity_;
  std::size_t capacity_;
  std::size_t persistent_top_ = 0;
  std::size_t saved_top_;
  std::size_t transient_bottom_;
  std::size_t high_water_ = 0;
  std::vector<entry> saved_;
  std::vector<entry> transient_;
  breakdown by_category_{};
  breakdown peak_by_category_{};
  std::string peak_tensor_;
  bool tracing_ = false;
  std::vector<event> trace_;
  std::uint64_t clock_ = 0;
};

}  // namespace memalg::exec

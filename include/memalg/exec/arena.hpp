// SPDX-License-Identifier: BSL-1.0
// memalg/exec/arena.hpp — one allocation, laid out by the plan.
//
// The executor allocates a single arena of exactly the planned size and places every tensor in it:
//
//   [ persistent: weights, gradients, master weights, optimizer states (offsets fixed) ]
//   [ saved stack →                          free                     ← transient stack ]
//
// Two stacks, each last-in first-out: the *saved* stack grows upward with what forward keeps for
// backward, which backward releases in reverse; the *transient* stack grows downward from the end
// with buffers that live inside one operation or one pass (gradients flowing backward, logits,
// gathered weights). A step is LIFO on each side, so the arena reaches exactly the peak of the
// live bytes, with no fragmentation. Every push and pop is recorded: `high_water()` is the
// measured peak of everything the executor holds, which the tests compare with the plan's
// prediction. A push beyond the arena throws (the plan under-predicted); a pop out of order throws
// (the executor broke the LIFO discipline). The bookkeeping itself lives in exec/arena_layout.hpp.
//
// Tensors are aligned to `alignment` bytes; sizes that are multiples of it waste nothing, so the
// measured figures equal the plan's exactly (the executor refuses shapes that would pad).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string_view>

#include "memalg/exec/arena_layout.hpp"
#include "memalg/plan/breakdown.hpp"

namespace memalg::exec {

/// A typed view into the arena.
template <class T>
struct tensor_ref {
  T* data = nullptr;
  std::size_t count = 0;
  std::size_t offset = 0;
  T* begin() const { return data; }
  T* end() const { return data + count; }
  T& operator[](std::size_t i) const { return data[i]; }
};

/// The bookkeeping is `arena_layout`'s; this class adds the memory and the typed views.
class arena {
 public:
  static constexpr std::size_t alignment = arena_layout::alignment;

  using side = arena_layout::side;

  /// `persistent` + `stack` bytes, allocated once.
  arena(std::size_t persistent, std::size_t stack)
      : layout_(persistent, stack),
        memory_(static_cast<std::byte*>(
            ::operator new(layout_.capacity() == 0 ? 1 : layout_.capacity(), std::align_val_t{alignment}))) {}
  /// The same bookkeeping over `persistent` + `stack` bytes at `memory`, which the caller owns
  /// (the CUDA runtime passes its one device allocation; tensor_ref::data then points into device
  /// memory and must not be dereferenced on the host). `memory` must be aligned to `alignment`.
  arena(std::byte* memory, std::size_t persistent, std::size_t stack)
      : layout_(persistent, stack), memory_(memory), owns_memory_(false) {}
  ~arena() {
    if (owns_memory_) ::operator delete(memory_, std::align_val_t{alignment});
  }
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;

  std::size_t capacity() const { return layout_.capacity(); }
  std::size_t persistent_used() const { return layout_.persistent_used(); }
  /// Measured peak: persistent bytes + the highest the stack ever reached.
  std::size_t high_water() const { return layout_.high_water(); }
  std::size_t live() const { return layout_.live(); }
  const breakdown& by_category() const { return layout_.by_category(); }
  const breakdown& peak_by_category() const { return layout_.peak_by_category(); }
  /// The tensor whose allocation set the high-water mark (for reports).
  std::string_view peak_tensor() const { return layout_.peak_tensor(); }

  /// The offsets, stacks and peaks, and the trace when enabled.
  const arena_layout& layout() const { return layout_; }
  /// Record every push and pop from now on (tests compare this with the step program's trace).
  void enable_trace() { layout_.enable_trace(); }

  /// A tensor that lives for the whole run (weights, gradients, states).
  template <class T>
  tensor_ref<T> persistent(std::string_view name, std::size_t count, category c) {
    const std::size_t offset = layout_.persistent(name, arena_layout::checked_bytes(name, count, sizeof(T)), c);
    return tensor_ref<T>{reinterpret_cast<T*>(memory_ + offset), count, offset};
  }

  /// A tensor with a LIFO lifetime on one side; release with `pop` in reverse order of that side.
  template <class T>
  tensor_ref<T> push(std::string_view name, std::size_t count, category c, side where = side::saved) {
    const std::size_t offset = layout_.push(name, arena_layout::checked_bytes(name, count, sizeof(T)), c, where);
    return tensor_ref<T>{reinterpret_cast<T*>(memory_ + offset), count, offset};
  }
  template <class T>
  tensor_ref<T> transient(std::string_view name, std::size_t count, category c) {
    return push<T>(name, count, c, side::transient);
  }
  template <class T>
  void pop(const tensor_ref<T>& t) {
    layout_.pop(t.offset);
  }
  std::size_t stack_depth() const { return layout_.stack_depth(); }

  /// Forget the recorded peaks (e.g. after a warm-up step).
  void reset_peak() { layout_.reset_peak(); }

 private:
  arena_layout layout_;
  std::byte* memory_;
  bool owns_memory_ = true;
};

}  // namespace memalg::exec

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
// (the executor broke the LIFO discipline).
//
// Tensors are aligned to `alignment` bytes; sizes that are multiples of it waste nothing, so the
// measured figures equal the plan's exactly (the executor refuses shapes that would pad).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "memalg/plan/breakdown.hpp"

namespace memalg::exec {

struct arena_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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

class arena {
 public:
  static constexpr std::size_t alignment = 16;

  enum class side { saved, transient };

  /// `persistent` + `stack` bytes, allocated once.
  arena(std::size_t persistent, std::size_t stack)
      : persistent_capacity_(persistent),
        capacity_(persistent + stack),
        memory_(static_cast<std::byte*>(::operator new(capacity_ == 0 ? 1 : capacity_, std::align_val_t{alignment}))),
        saved_top_(persistent),
        transient_bottom_(capacity_) {}
  /// The same bookkeeping over `persistent` + `stack` bytes at `memory`, which the caller owns
  /// (the CUDA runtime passes its one device allocation; tensor_ref::data then points into device
  /// memory and must not be dereferenced on the host). `memory` must be aligned to `alignment`.
  arena(std::byte* memory, std::size_t persistent, std::size_t stack)
      : persistent_capacity_(persistent),
        capacity_(persistent + stack),
        memory_(memory),
        owns_memory_(false),
        saved_top_(persistent),
        transient_bottom_(capacity_) {}
  ~arena() {
    if (owns_memory_) ::operator delete(memory_, std::align_val_t{alignment});
  }
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;

  std::size_t capacity() const { return capacity_; }
  std::size_t persistent_used() const { return persistent_top_; }
  /// Measured peak: persistent bytes + the highest the stack ever reached.
  std::size_t high_water() const { return high_water_; }
  std::size_t live() const {
    return persistent_top_ + (saved_top_ - persistent_capacity_) + (capacity_ - transient_bottom_);
  }
  const breakdown& by_category() const { return by_category_; }
  const breakdown& peak_by_category() const { return peak_by_category_; }
  /// The tensor whose allocation set the high-water mark (for reports).
  std::string_view peak_tensor() const { return peak_tensor_; }

  /// A tensor that lives for the whole run (weights, gradients, states).
  template <class T>
  tensor_ref<T> persistent(std::string_view name, std::size_t count, category c) {
    const std::size_t size = checked_size<T>(name, count);
    if (size > persistent_capacity_ - persistent_top_)
      throw arena_error("arena: persistent tensor '" + std::string(name) + "' (" + std::to_string(size) +
                        " bytes) does not fit the planned persistent region of " +
                        std::to_string(persistent_capacity_) + " bytes");
    tensor_ref<T> t{reinterpret_cast<T*>(memory_ + persistent_top_), count, persistent_top_};
    persistent_top_ += size;
    by_category_[c] += bytes{size};
    note_peak(name);
    return t;
  }

  /// A tensor with a LIFO lifetime on one side; release with `pop` in reverse order of that side.
  template <class T>
  tensor_ref<T> push(std::string_view name, std::size_t count, category c, side where = side::saved) {
    const std::size_t size = checked_size<T>(name, count);
    if (size > transient_bottom_ - saved_top_)
      throw arena_error("arena: '" + std::string(name) + "' (" + std::to_string(size) +
                        " bytes) exceeds the planned arena of " + std::to_string(capacity_) +
                        " bytes: the plan under-predicts this step");
    std::size_t offset = 0;
    if (where == side::saved) {
      offset = saved_top_;
      saved_top_ += size;
      saved_.push_back({offset, size, c});
    } else {
      transient_bottom_ -= size;
      offset = transient_bottom_;
      transient_.push_back({offset, size, c});
    }
    by_category_[c] += bytes{size};
    note_peak(name);
    return tensor_ref<T>{reinterpret_cast<T*>(memory_ + offset), count, offset};
  }
  template <class T>
  tensor_ref<T> transient(std::string_view name, std::size_t count, category c) {
    return push<T>(name, count, c, side::transient);
  }
  template <class T>
  void pop(const tensor_ref<T>& t) {
    std::vector<entry>& stack = t.offset >= transient_bottom_ && t.offset < capacity_ && !transient_.empty() &&
                                        t.offset == transient_.back().offset
                                    ? transient_
                                    : saved_;
    if (stack.empty() || stack.back().offset != t.offset)
      throw arena_error("arena: tensors must be released in reverse order of allocation");
    by_category_[stack.back().cat] -= bytes{stack.back().size};
    if (&stack == &saved_)
      saved_top_ = stack.back().offset;
    else
      transient_bottom_ = stack.back().offset + stack.back().size;
    stack.pop_back();
  }
  std::size_t stack_depth() const { return saved_.size() + transient_.size(); }

  /// Forget the recorded peaks (e.g. after a warm-up step).
  void reset_peak() {
    high_water_ = live();
    peak_by_category_ = by_category_;
  }

 private:
  struct entry {
    std::size_t offset, size;
    category cat;
  };
  template <class T>
  static std::size_t checked_size(std::string_view name, std::size_t count) {
    if (count > (~std::size_t{0}) / sizeof(T)) throw arena_error("arena: size of '" + std::string(name) + "' overflows");
    const std::size_t size = count * sizeof(T);
    if (size % alignment != 0)
      throw arena_error("arena: '" + std::string(name) + "' is " + std::to_string(size) + " bytes, not a multiple of " +
                        std::to_string(alignment) + ": choose shapes whose tensors need no padding");
    return size;
  }
  void note_peak(std::string_view name) {
    if (live() > high_water_) {
      high_water_ = live();
      peak_by_category_ = by_category_;
      peak_tensor_ = name;
    }
  }

  std::size_t persistent_capacity_;
  std::size_t capacity_;
  std::byte* memory_;
  bool owns_memory_ = true;
  std::size_t persistent_top_ = 0;
  std::size_t saved_top_;
  std::size_t transient_bottom_;
  std::size_t high_water_ = 0;
  std::vector<entry> saved_;
  std::vector<entry> transient_;
  breakdown by_category_{};
  breakdown peak_by_category_{};
  std::string_view peak_tensor_{};
};

}  // namespace memalg::exec

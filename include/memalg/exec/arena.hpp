// memalg/exec/arena.hpp — one allocation, laid out by the plan.
//
// The executor allocates a single arena of exactly the planned size and places every tensor in it:
//
//   [ persistent region: weights, gradients, master weights, optimizer states (offsets fixed) ]
//   [ stack region: activations and transient buffers, pushed and popped last-in first-out    ]
//
// A training step is LIFO by nature — forward pushes what backward needs, backward pops it in
// reverse — so a stack reaches exactly the peak of the live bytes, with no fragmentation. Every
// push and pop is recorded: `high_water()` is the measured peak of everything the executor holds,
// which the tests compare with the plan's prediction. A push beyond the arena throws (the plan
// under-predicted); a pop out of order throws (the executor broke the LIFO discipline).
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

  /// `persistent` + `stack` bytes, allocated once.
  arena(std::size_t persistent, std::size_t stack)
      : persistent_capacity_(persistent),
        capacity_(persistent + stack),
        memory_(static_cast<std::byte*>(::operator new(capacity_ == 0 ? 1 : capacity_, std::align_val_t{alignment}))),
        stack_top_(persistent) {}
  ~arena() { ::operator delete(memory_, std::align_val_t{alignment}); }
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;

  std::size_t capacity() const { return capacity_; }
  std::size_t persistent_used() const { return persistent_top_; }
  /// Measured peak: persistent bytes + the highest the stack ever reached.
  std::size_t high_water() const { return high_water_; }
  std::size_t live() const { return persistent_top_ + (stack_top_ - persistent_capacity_); }
  const breakdown& by_category() const { return by_category_; }
  const breakdown& peak_by_category() const { return peak_by_category_; }

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
    note_peak();
    return t;
  }

  /// A tensor with a LIFO lifetime (activations, transients); release with `pop` in reverse order.
  template <class T>
  tensor_ref<T> push(std::string_view name, std::size_t count, category c) {
    const std::size_t size = checked_size<T>(name, count);
    if (size > capacity_ - stack_top_)
      throw arena_error("arena: '" + std::string(name) + "' (" + std::to_string(size) +
                        " bytes) exceeds the planned arena of " + std::to_string(capacity_) +
                        " bytes: the plan under-predicts this step");
    tensor_ref<T> t{reinterpret_cast<T*>(memory_ + stack_top_), count, stack_top_};
    stack_.push_back({stack_top_, size, c});
    stack_top_ += size;
    by_category_[c] += bytes{size};
    note_peak();
    return t;
  }
  template <class T>
  void pop(const tensor_ref<T>& t) {
    if (stack_.empty() || stack_.back().offset != t.offset)
      throw arena_error("arena: tensors must be released in reverse order of allocation");
    by_category_[stack_.back().cat] -= bytes{stack_.back().size};
    stack_top_ = stack_.back().offset;
    stack_.pop_back();
  }
  std::size_t stack_depth() const { return stack_.size(); }

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
  void note_peak() {
    if (live() > high_water_) {
      high_water_ = live();
      peak_by_category_ = by_category_;
    }
  }

  std::size_t persistent_capacity_;
  std::size_t capacity_;
  std::byte* memory_;
  std::size_t persistent_top_ = 0;
  std::size_t stack_top_;
  std::size_t high_water_ = 0;
  std::vector<entry> stack_;
  breakdown by_category_{};
  breakdown peak_by_category_{};
};

}  // namespace memalg::exec

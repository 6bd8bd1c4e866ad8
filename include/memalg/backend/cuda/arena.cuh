// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/arena.cuh — one device allocation that a memory plan carves up.
//
// device_arena makes a single cudaMalloc of the plan's size (RAII, move-only) and hands out typed
// pointers at the plan's byte offsets, checking each against the arena's bounds and the requested
// alignment (launch.cuh: arena_check). cudaMalloc returns 256-byte aligned memory, so an offset
// aligned to A ≤ 256 gives an A-aligned pointer.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/device.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/memory.cuh"

namespace memalg::backend::cuda {

/// Why arena_check refused a placement, in words.
inline std::string arena_error_message(arena_fit fit, std::size_t capacity, std::size_t offset, std::size_t count,
                                       std::size_t elem_bytes, std::size_t alignment) {
  const std::string where = "device_arena: " + std::to_string(count) + " element(s) of " + std::to_string(elem_bytes) +
                            " bytes at offset " + std::to_string(offset);
  switch (fit) {
    case arena_fit::ok:
      return {};
    case arena_fit::bad_alignment:
      return "device_arena: alignment " + std::to_string(alignment) + " is not a power of two";
    case arena_fit::misaligned:
      return where + " are not aligned to " + std::to_string(alignment) + " bytes";
    case arena_fit::out_of_range:
      return where + " exceed the arena of " + std::to_string(capacity) + " bytes";
  }
  return "device_arena: invalid placement";
}

class device_arena {
 public:
  device_arena() = default;

  /// Allocates `bytes` on `device` (current device when negative).
  explicit device_arena(std::size_t bytes, int device = -1) : bytes_(bytes) {
    const device_guard guard(device);
    device_ = current_device();
    if (bytes == 0) return;
    const cudaError_t e = cudaMalloc(&base_, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      base_ = nullptr;
      const memory_snapshot s = memory_snapshot_of(device_);
      throw std::runtime_error(insufficient_memory_message(bytes, s.free_bytes, s.total_bytes, device_,
                                                           device_name(device_)) +
                               " (cudaMalloc of the arena failed)");
    }
    MEMALG_CUDA_CHECK(e);
  }

  ~device_arena() { release(); }
  device_arena(device_arena&& o) noexcept
      : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), device_(o.device_) {}
  device_arena& operator=(device_arena&& o) noexcept {
    if (this != &o) {
      release();
      base_ = std::exchange(o.base_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      device_ = o.device_;
    }
    return *this;
  }
  device_arena(const device_arena&) = delete;
  device_arena& operator=(const device_arena&) = delete;

  std::byte* data() const noexcept { return static_cast<std::byte*>(base_); }
  std::size_t size() const noexcept { return bytes_; }
  int device() const noexcept { return device_; }
  bool empty() const noexcept { return bytes_ == 0; }

  /// `count` elements of T at byte `offset`, aligned to `alignment` (alignof(T) by default).
  template <class T>
  T* at(std::size_t offset, std::size_t count = 1, std::size_t alignment = alignof(T)) const {
    return static_cast<T*>(bytes_at(offset, count, sizeof(T), alignment));
  }

  /// Untyped form of at().
  void* bytes_at(std::size_t offset, std::size_t count, std::size_t elem_bytes, std::size_t alignment) const {
    const arena_fit fit = arena_check(bytes_, offset, count, elem_bytes, alignment);
    if (fit != arena_fit::ok)
      throw std::out_of_range(arena_error_message(fit, bytes_, offset, count, elem_bytes, alignment));
    return static_cast<std::byte*>(base_) + offset;
  }

  /// Zeroes the whole arena on `stream`.
  void zero(cudaStream_t stream = nullptr) const {
    if (bytes_ != 0) MEMALG_CUDA_CHECK(cudaMemsetAsync(base_, 0, bytes_, stream));
  }

 private:
  void release() noexcept {
    if (base_ == nullptr) return;
    int previous = -1;
    const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
    cudaSetDevice(device_);
    cudaFree(base_);
    if (have_previous) cudaSetDevice(previous);
    base_ = nullptr;
  }

  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
};

}  // namespace memalg::backend::cuda

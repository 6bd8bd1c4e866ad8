// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/memory.cuh — measuring device memory and checking that a plan fits.
//
// What a training process can give its arena is the device capacity minus layers of overhead
// that exist before (and besides) the plan's own tensors:
//   context       used right after the CUDA context is created (cudaFree(0)): the context itself,
//                 driver reservations, and whatever other processes hold on the device
//   libraries     cuBLASLt handles and workspace, kernel modules (loaded lazily on first launch
//                 with CUDA_MODULE_LOADING=LAZY, the default)
//   communicator  NCCL communicator buffers
// overhead_meter records these layers as growth of cudaMemGetInfo's used bytes between steps;
// require_free_memory() refuses to start when the device has less free memory than the plan needs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/device.cuh"

namespace memalg::backend::cuda {

struct memory_snapshot {
  int device = 0;
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  constexpr std::size_t used_bytes() const noexcept { return total_bytes - free_bytes; }
};

/// cudaMemGetInfo on `device` (current device when negative); creates the context if needed.
inline memory_snapshot memory_snapshot_of(int device = -1) {
  const device_guard guard(device);
  memory_snapshot s;
  s.device = current_device();
  MEMALG_CUDA_CHECK(cudaMemGetInfo(&s.free_bytes, &s.total_bytes));
  return s;
}

/// The snapshot right after forcing context creation with cudaFree(0): the context baseline.
inline memory_snapshot context_baseline(int device = -1) {
  const device_guard guard(device);
  MEMALG_CUDA_CHECK(cudaFree(nullptr));
  return memory_snapshot_of(-1);
}

struct overhead_layers {
  std::size_t total = 0;         ///< device capacity
  std::size_t context = 0;       ///< used once the context exists (context, driver, other processes)
  std::size_t libraries = 0;     ///< cuBLASLt handle and workspace, kernel modules
  std::size_t communicator = 0;  ///< NCCL buffers
  std::size_t free = 0;          ///< free at the last measurement: what the arena can have
  constexpr std::size_t overhead() const noexcept { return context + libraries + communicator; }
};

/// Records overhead_layers: construct it first (it creates the context), create the libraries and
/// call measure_libraries(), create the communicator and call measure_communicator().
class overhead_meter {
 public:
  explicit overhead_meter(int device = -1) : last_(context_baseline(device)) {
    layers_.total = last_.total_bytes;
    layers_.context = last_.used_bytes();
    layers_.free = last_.free_bytes;
  }
  /// Used-memory growth since the previous measurement (0 when memory was released).
  std::size_t step() {
    const memory_snapshot now = memory_snapshot_of(last_.device);
    const std::size_t grown = now.used_bytes() > last_.used_bytes() ? now.used_bytes() - last_.used_bytes() : 0;
    last_ = now;
    layers_.free = now.free_bytes;
    return grown;
  }
  std::size_t measure_libraries() { return layers_.libraries += step(); }
  std::size_t measure_communicator() { return layers_.communicator += step(); }
  const overhead_layers& layers() const noexcept { return layers_; }
  const memory_snapshot& last() const noexcept { return last_; }

 private:
  memory_snapshot last_;
  overhead_layers layers_;
};

/// "1.50 GiB" style (binary units, two decimals; plain bytes below 1 KiB).
inline std::string format_bytes(std::size_t bytes) {
  static constexpr const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

/// The message require_free_memory throws.
inline std::string insufficient_memory_message(std::size_t needed, std::size_t free_bytes, std::size_t total_bytes,
                                               int device, const std::string& device_name) {
  std::string s = "not enough GPU memory on device " + std::to_string(device);
  if (!device_name.empty()) s += " (" + device_name + ")";
  s += ": the plan needs " + format_bytes(needed) + " (" + std::to_string(needed) + " bytes) but only " +
       format_bytes(free_bytes) + " of " + format_bytes(total_bytes) + " are free; short by " +
       format_bytes(needed > free_bytes ? needed - free_bytes : 0) +
       ". Reduce the micro-batch or sequence length, enable activation recomputation or sharding, or free the "
       "device.";
  return s;
}

inline std::string device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return prop.name;
}

/// Throws std::runtime_error with a clear message when `device` has fewer than `needed` free bytes.
inline memory_snapshot require_free_memory(std::size_t needed, int device = -1) {
  const memory_snapshot s = memory_snapshot_of(device);
  if (s.free_bytes < needed)
    throw std::runtime_error(insufficient_memory_message(needed, s.free_bytes, s.total_bytes, s.device,
                                                         device_name(s.device)));
  return s;
}

}  // namespace memalg::backend::cuda

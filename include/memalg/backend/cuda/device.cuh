// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/device.cuh — small device queries shared by the kernels and wrappers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "memalg/backend/cuda/check.cuh"

namespace memalg::backend::cuda {

inline int current_device() {
  int d = 0;
  MEMALG_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

/// Makes `device` current for its lifetime and restores the previous device afterwards
/// (device < 0 leaves the current device alone).
class device_guard {
 public:
  explicit device_guard(int device) : previous_(current_device()) {
    if (device >= 0 && device != previous_) MEMALG_CUDA_CHECK(cudaSetDevice(device));
  }
  ~device_guard() { cudaSetDevice(previous_); }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_;
};

struct compute_capability {
  int major = 0;
  int minor = 0;
};

inline compute_capability device_compute_capability(int device = -1) {
  if (device < 0) device = current_device();
  compute_capability cc;
  MEMALG_CUDA_CHECK(cudaDeviceGetAttribute(&cc.major, cudaDevAttrComputeCapabilityMajor, device));
  MEMALG_CUDA_CHECK(cudaDeviceGetAttribute(&cc.minor, cudaDevAttrComputeCapabilityMinor, device));
  return cc;
}

/// Largest dynamic shared memory one block may opt into.
inline std::size_t max_shared_memory_per_block_optin(int device = -1) {
  if (device < 0) device = current_device();
  int bytes = 0;
  MEMALG_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return static_cast<std::size_t>(bytes);
}

/// Number of CUDA devices; 0 (not an error) when there is no device or no driver.
inline int device_count_or_zero() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace memalg::backend::cuda

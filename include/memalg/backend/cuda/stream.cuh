// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/stream.cuh — an owned CUDA stream and event (the step backend's compute stream).
//
// Created explicitly (create()), so that an owner can exist before it touches the device;
// destroyed without checks (destructors must not throw).
#pragma once

#include <cuda_runtime.h>

#include "memalg/backend/cuda/check.cuh"

namespace memalg::backend::cuda {

/// Owns a non-blocking CUDA stream and an event without timing.
class stream_pair {
 public:
  stream_pair() = default;
  void create() {
    MEMALG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MEMALG_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~stream_pair() {
    if (event_ != nullptr) cudaEventDestroy(event_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  stream_pair(const stream_pair&) = delete;
  stream_pair& operator=(const stream_pair&) = delete;
  cudaStream_t stream() const noexcept { return stream_; }
  cudaEvent_t event() const noexcept { return event_; }
  /// Blocks the host until everything enqueued so far has run.
  void synchronize() const {
    if (stream_ != nullptr) MEMALG_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
};

}  // namespace memalg::backend::cuda

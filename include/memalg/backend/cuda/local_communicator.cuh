// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/local_communicator.cuh — a one-rank exec::communicator over device memory.
//
// The group of one rank without NCCL: reductions are the identity, reduce-scatter and all-gather
// copy on the stream set with set_stream (nothing when send and receive are the same buffer,
// which is the in-place case of a group of one), send and receive have no peer and throw.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/exec/communicator.hpp"

namespace memalg::backend::cuda {

class local_device_communicator {
 public:
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  void set_stream(cudaStream_t stream) noexcept { stream_ = stream; }
  cudaStream_t stream() const noexcept { return stream_; }
  template <class T>
  void all_reduce(T*, std::size_t, exec::reduce_op) {}
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t n) {
    copy(recv, send, n);
  }
  template <class T>
  void all_gather(const T* send, T* recv, std::size_t n) {
    copy(recv, send, n);
  }
  template <class T>
  void broadcast(T*, std::size_t, int) {}
  template <class T>
  void send(const T*, std::size_t, int) {
    throw std::logic_error("local_device_communicator: no peer to send to");
  }
  template <class T>
  void recv(T*, std::size_t, int) {
    throw std::logic_error("local_device_communicator: no peer to receive from");
  }
  void barrier() { MEMALG_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  template <class T>
  void copy(T* dst, const T* src, std::size_t n) {
    if (dst != src && n != 0)
      MEMALG_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
  }
  cudaStream_t stream_ = nullptr;
};

static_assert(exec::communicator<local_device_communicator, float>);

}  // namespace memalg::backend::cuda

// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/nccl_communicator.cuh — memalg::exec::communicator over NCCL.
//
// nccl_communicator wraps one NCCL communicator (one rank on one GPU) and the CUDA stream its
// operations are enqueued on; every operation is asynchronous with respect to the host except
// barrier(). Element types: float, bf16 and fp16 (anything with dtype_traits<T>::nccl). Counts are
// in elements, as the concept says: reduce_scatter's n is the per-rank block (send holds size()·n),
// all_gather's n is the per-rank contribution (recv receives size()·n, rank-major).
//
// Construction: from an ncclUniqueId + rank + size (one rank per process or thread, as
// ncclCommInitRank), from an existing ncclComm_t (owned or borrowed), or N at once in one process
// with nccl_communicator::init_all (ncclCommInitAll). When one thread drives several communicators
// it must enclose each round of operations in an nccl_group (ncclGroupStart/End), as NCCL
// requires; barrier() synchronises the host and therefore only suits one rank per thread.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <stdexcept>
#include <utility>
#include <vector>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/device.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/exec/communicator.hpp"

namespace memalg::backend::cuda {

/// Element types NCCL transfers for this backend.
template <class T>
concept nccl_element = storage_type<T>;

inline ncclRedOp_t to_nccl(exec::reduce_op op) {
  switch (op) {
    case exec::reduce_op::sum:
      return ncclSum;
    case exec::reduce_op::max:
      return ncclMax;
  }
  throw std::invalid_argument("nccl_communicator: unknown reduce_op");
}

/// A fresh NCCL unique id (rank 0 creates it and distributes it to the other ranks).
inline ncclUniqueId nccl_unique_id() {
  ncclUniqueId id;
  MEMALG_NCCL_CHECK(ncclGetUniqueId(&id));
  return id;
}

/// ncclGroupStart() now, ncclGroupEnd() at end() or destruction (errors then are swallowed;
/// call end() to see them).
class nccl_group {
 public:
  nccl_group() { MEMALG_NCCL_CHECK(ncclGroupStart()); }
  ~nccl_group() {
    if (open_) ncclGroupEnd();
  }
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;
  void end() {
    if (!open_) return;
    open_ = false;
    MEMALG_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  bool open_ = true;
};

class nccl_communicator {
 public:
  /// Rank `rank` of `size` on `device` (current device when negative); blocks until every rank joined.
  nccl_communicator(const ncclUniqueId& id, int rank, int size, int device = -1, cudaStream_t stream = nullptr)
      : stream_(stream), owns_(true) {
    const device_guard guard(device);
    MEMALG_NCCL_CHECK(ncclCommInitRank(&comm_, size, id, rank));
    init();
  }

  /// Wraps an existing communicator; destroys it on destruction only when `owns`.
  explicit nccl_communicator(ncclComm_t comm, cudaStream_t stream = nullptr, bool owns = false)
      : comm_(comm), stream_(stream), owns_(owns) {
    if (comm_ == nullptr) throw std::invalid_argument("nccl_communicator: null ncclComm_t");
    init();
  }

  /// One communicator per device of `devices` (rank i on devices[i]), all in this process.
  static std::vector<nccl_communicator> init_all(const std::vector<int>& devices) {
    if (devices.empty()) throw std::invalid_argument("nccl_communicator::init_all: no devices");
    std::vector<ncclComm_t> comms(devices.size(), nullptr);
    MEMALG_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()));
    std::vector<nccl_communicator> result;
    result.reserve(comms.size());
    std::size_t taken = 0;
    try {
      for (; taken < comms.size(); ++taken) result.emplace_back(comms[taken], nullptr, true);
    } catch (...) {
      for (std::size_t i = taken + 1; i < comms.size(); ++i) ncclCommDestroy(comms[i]);
      throw;
    }
    return result;
  }

  /// Devices 0 … count−1.
  static std::vector<nccl_communicator> init_all(int count) {
    std::vector<int> devices(static_cast<std::size_t>(count > 0 ? count : 0));
    for (int i = 0; i < count; ++i) devices[static_cast<std::size_t>(i)] = i;
    return init_all(devices);
  }

  nccl_communicator(nccl_communicator&& o) noexcept { swap(o); }
  nccl_communicator& operator=(nccl_communicator&& o) noexcept {
    if (this != &o) {
      nccl_communicator tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  ~nccl_communicator() { release(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  ncclComm_t get() const noexcept { return comm_; }
  cudaStream_t stream() const noexcept { return stream_; }
  /// Later operations go to `stream` (a stream of this communicator's device).
  void set_stream(cudaStream_t stream) noexcept { stream_ = stream; }

  template <nccl_element T>
  void all_reduce(T* buf, std::size_t n, exec::reduce_op op) {
    MEMALG_NCCL_CHECK(ncclAllReduce(buf, buf, n, dtype_traits<T>::nccl, to_nccl(op), comm_, stream_));
  }

  /// send holds size()·n elements; recv (n elements) receives the sum of block rank().
  template <nccl_element T>
  void reduce_scatter(const T* send, T* recv, std::size_t n) {
    MEMALG_NCCL_CHECK(ncclReduceScatter(send, recv, n, dtype_traits<T>::nccl, ncclSum, comm_, stream_));
  }

  /// send holds n elements; recv receives size()·n elements, rank-major.
  template <nccl_element T>
  void all_gather(const T* send, T* recv, std::size_t n) {
    MEMALG_NCCL_CHECK(ncclAllGather(send, recv, n, dtype_traits<T>::nccl, comm_, stream_));
  }

  template <nccl_element T>
  void broadcast(T* buf, std::size_t n, int root) {
    MEMALG_NCCL_CHECK(ncclBroadcast(buf, buf, n, dtype_traits<T>::nccl, root, comm_, stream_));
  }

  template <nccl_element T>
  void send(const T* buf, std::size_t n, int peer) {
    MEMALG_NCCL_CHECK(ncclSend(buf, n, dtype_traits<T>::nccl, peer, comm_, stream_));
  }

  template <nccl_element T>
  void recv(T* buf, std::size_t n, int peer) {
    MEMALG_NCCL_CHECK(ncclRecv(buf, n, dtype_traits<T>::nccl, peer, comm_, stream_));
  }

  /// Returns once every rank has reached the barrier and this rank's earlier operations are done.
  void barrier() {
    all_reduce(barrier_buf_, 1, exec::reduce_op::sum);
    synchronize();
  }

  /// Waits for the operations enqueued so far (on this communicator's device: a null stream means
  /// that device's default stream).
  void synchronize() const {
    const device_guard guard(device_);
    MEMALG_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  // Queries the communicator and allocates the barrier word; on failure releases what this object
  // owns (the destructor does not run when a constructor throws).
  void init() {
    try {
      MEMALG_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
      MEMALG_NCCL_CHECK(ncclCommCount(comm_, &size_));
      MEMALG_NCCL_CHECK(ncclCommCuDevice(comm_, &device_));
      const device_guard guard(device_);
      MEMALG_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
      MEMALG_CUDA_CHECK(cudaMemset(barrier_buf_, 0, sizeof(float)));
    } catch (...) {
      release();
      throw;
    }
  }

  void release() noexcept {
    if (comm_ == nullptr) return;
    if (barrier_buf_ != nullptr) {
      const int previous = current_device_noexcept();
      cudaSetDevice(device_);
      cudaFree(barrier_buf_);
      if (previous >= 0) cudaSetDevice(previous);
      barrier_buf_ = nullptr;
    }
    if (owns_) ncclCommDestroy(comm_);
    comm_ = nullptr;
  }

  static int current_device_noexcept() noexcept {
    int d = -1;
    return cudaGetDevice(&d) == cudaSuccess ? d : -1;
  }

  void swap(nccl_communicator& o) noexcept {
    std::swap(comm_, o.comm_);
    std::swap(stream_, o.stream_);
    std::swap(owns_, o.owns_);
    std::swap(rank_, o.rank_);
    std::swap(size_, o.size_);
    std::swap(device_, o.device_);
    std::swap(barrier_buf_, o.barrier_buf_);
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool owns_ = false;
  int rank_ = 0;
  int size_ = 0;
  int device_ = 0;
  float* barrier_buf_ = nullptr;
};

static_assert(exec::communicator<nccl_communicator, float>);
static_assert(exec::communicator<nccl_communicator, bf16>);
static_assert(exec::communicator<nccl_communicator, fp16>);

}  // namespace memalg::backend::cuda

// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/mpi_communicator.hpp — memalg::exec::communicator over MPI, for float and
// double buffers in host memory.
//
// The communicator works on its own duplicate of the MPI_Comm it is given (MPI_Comm_dup, as MPI
// advises for libraries: our messages cannot match the application's), with the error handler set
// to MPI_ERRORS_RETURN so that every return code can be checked and turned into a
// std::runtime_error naming the call. Sub-groups (data-parallel, tensor-parallel, pipeline) are
// made with split(), i.e. MPI_Comm_split; each communicator owns and frees its MPI_Comm.
//
// The caller initialises MPI (mpi_environment below does it RAII-style) before constructing one.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "memalg/exec/communicator.hpp"

namespace memalg::backend::cpu {

/// Element types the MPI communicator transports.
template <class T>
concept mpi_element = std::is_same_v<T, float> || std::is_same_v<T, double>;

namespace detail {

template <mpi_element T>
MPI_Datatype mpi_datatype() noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return MPI_FLOAT;
  } else {
    return MPI_DOUBLE;
  }
}

inline void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  std::string msg = std::string("memalg mpi_communicator: ") + call + " failed (error " + std::to_string(rc);
  if (MPI_Error_string(rc, text, &len) == MPI_SUCCESS) msg += ": " + std::string(text, static_cast<std::size_t>(len));
  throw std::runtime_error(msg + ")");
}

/// MPI counts are int; refuse (rather than truncate) larger buffers.
inline int mpi_count(std::size_t n, const char* call) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw std::runtime_error(std::string("memalg mpi_communicator: ") + call + ": count exceeds INT_MAX");
  return static_cast<int>(n);
}

}  // namespace detail

/// RAII MPI_Init / MPI_Finalize; does nothing if MPI is already initialised by someone else.
class mpi_environment {
 public:
  mpi_environment(int* argc, char*** argv) {
    int initialised = 0;
    detail::mpi_check(MPI_Initialized(&initialised), "MPI_Initialized");
    if (!initialised) {
      detail::mpi_check(MPI_Init(argc, argv), "MPI_Init");
      owner_ = true;
    }
  }
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  ~mpi_environment() {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (owner_ && !finalised) MPI_Finalize();
  }

 private:
  bool owner_ = false;
};

class mpi_communicator {
 public:
  /// Collective over `comm`: duplicates it. MPI must be initialised.
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD) {
    int initialised = 0;
    detail::mpi_check(MPI_Initialized(&initialised), "MPI_Initialized");
    if (!initialised) throw std::runtime_error("memalg mpi_communicator: MPI is not initialised");
    if (comm == MPI_COMM_NULL) throw std::invalid_argument("memalg mpi_communicator: MPI_COMM_NULL");
    MPI_Comm dup = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup");
    adopt(dup);
  }

  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  mpi_communicator(mpi_communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_) {}
  mpi_communicator& operator=(mpi_communicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      rank_ = o.rank_;
      size_ = o.size_;
    }
    return *this;
  }
  ~mpi_communicator() { release(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  MPI_Comm native() const noexcept { return comm_; }

  /// Collective: ranks passing the same color (>= 0) form one new group, ordered by key (ties by
  /// current rank). E.g. with tensor-parallel width P: split(rank / P, rank) gives the TP group,
  /// split(rank % P, rank) the data-parallel group.
  mpi_communicator split(int color, int key) const {
    if (color < 0) throw std::invalid_argument("memalg mpi_communicator::split: color must be >= 0");
    MPI_Comm sub = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    return mpi_communicator(adopt_tag{}, sub);
  }

  /// In place over all ranks.
  template <mpi_element T>
  void all_reduce(T* buf, std::size_t n, exec::reduce_op op) {
    const MPI_Op mop = op == exec::reduce_op::max ? MPI_MAX : MPI_SUM;
    detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, detail::mpi_count(n, "MPI_Allreduce"),
                                    detail::mpi_datatype<T>(), mop, comm_),
                      "MPI_Allreduce");
  }

  /// send[size()*n]; recv[n] gets the sum of block rank(). send == recv is allowed (in place: the
  /// result lands in the first n elements).
  template <mpi_element T>
  void reduce_scatter(const T* send, T* recv, std::size_t n) {
    const int cnt = detail::mpi_count(n, "MPI_Reduce_scatter_block");
    const void* src = send == recv ? MPI_IN_PLACE : static_cast<const void*>(send);
    detail::mpi_check(MPI_Reduce_scatter_block(src, recv, cnt, detail::mpi_datatype<T>(), MPI_SUM, comm_),
                      "MPI_Reduce_scatter_block");
  }

  /// send[n]; recv[size()*n] rank-major. send == recv + rank()*n is allowed (in place).
  template <mpi_element T>
  void all_gather(const T* send, T* recv, std::size_t n) {
    const int cnt = detail::mpi_count(n, "MPI_Allgather");
    const bool in_place = send == recv + static_cast<std::size_t>(rank_) * n;
    detail::mpi_check(MPI_Allgather(in_place ? MPI_IN_PLACE : static_cast<const void*>(send), cnt,
                                    detail::mpi_datatype<T>(), recv, cnt, detail::mpi_datatype<T>(), comm_),
                      "MPI_Allgather");
  }

  template <mpi_element T>
  void broadcast(T* buf, std::size_t n, int root) {
    check_peer(root, "broadcast");
    detail::mpi_check(MPI_Bcast(buf, detail::mpi_count(n, "MPI_Bcast"), detail::mpi_datatype<T>(), root, comm_),
                      "MPI_Bcast");
  }

  /// Blocking standard-mode send: may wait for the matching recv, so order ring exchanges
  /// (e.g. even ranks send first) to avoid deadlock.
  template <mpi_element T>
  void send(const T* buf, std::size_t n, int peer, int tag = 0) {
    check_peer(peer, "send");
    detail::mpi_check(MPI_Send(buf, detail::mpi_count(n, "MPI_Send"), detail::mpi_datatype<T>(), peer, tag, comm_),
                      "MPI_Send");
  }

  /// Receives exactly n elements from peer; a shorter message is an error.
  template <mpi_element T>
  void recv(T* buf, std::size_t n, int peer, int tag = 0) {
    check_peer(peer, "recv");
    MPI_Status status;
    const int cnt = detail::mpi_count(n, "MPI_Recv");
    detail::mpi_check(MPI_Recv(buf, cnt, detail::mpi_datatype<T>(), peer, tag, comm_, &status), "MPI_Recv");
    int got = 0;
    detail::mpi_check(MPI_Get_count(&status, detail::mpi_datatype<T>(), &got), "MPI_Get_count");
    if (got != cnt)
      throw std::runtime_error("memalg mpi_communicator: MPI_Recv got " + std::to_string(got) + " elements, expected " +
                               std::to_string(cnt));
  }

  void barrier() { detail::mpi_check(MPI_Barrier(comm_), "MPI_Barrier"); }

 private:
  struct adopt_tag {};
  mpi_communicator(adopt_tag, MPI_Comm owned) { adopt(owned); }

  void adopt(MPI_Comm c) {
    comm_ = c;
    detail::mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    detail::mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    detail::mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }

  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size_)
      throw std::invalid_argument(std::string("memalg mpi_communicator::") + what + ": rank " + std::to_string(peer) +
                                  " outside [0, " + std::to_string(size_) + ")");
  }

  void release() noexcept {
    if (comm_ == MPI_COMM_NULL) return;
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised) MPI_Comm_free(&comm_);  // errors cannot be reported from a destructor
    comm_ = MPI_COMM_NULL;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
};

static_assert(exec::communicator<mpi_communicator, float>);
static_assert(exec::communicator<mpi_communicator, double>);

}  // namespace memalg::backend::cpu

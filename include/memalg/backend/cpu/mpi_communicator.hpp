// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/mpi_communicator.hpp — memalg::exec::communicator over MPI, for float,
// double, bf16 and fp16 buffers in host memory.
//
// MPI has no 16-bit floating types, so bf16 and fp16 travel as MPI_UINT16_T and reduce through
// user-defined operations (MPI_Op_create, MPI 4.1 §6.9.5): each combination of two partial sums
// widens both to fp32, adds (or takes the max) and rounds once to the 16-bit type, which is what
// NCCL does for its bf16 and fp16 reductions. No buffer beyond the caller's is needed, so a plan's
// arena stays the whole story. The operations are created with the communicator and freed with it.
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

#include <array>
#include <climits>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "memalg/core/float16.hpp"
#include "memalg/exec/communicator.hpp"

namespace memalg::backend::cpu {

/// Element types the MPI communicator transports.
template <class T>
concept mpi_element = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16> ||
                      std::is_same_v<T, fp16>;

namespace detail {

template <mpi_element T>
MPI_Datatype mpi_datatype() noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return MPI_FLOAT;
  } else if constexpr (std::is_same_v<T, double>) {
    return MPI_DOUBLE;
  } else {
    static_assert(sizeof(T) == 2);
    return MPI_UINT16_T;  // the bits; reductions use the user operations below
  }
}

/// MPI_User_function for a 16-bit type: inout[i] = round(op(float(in[i]), float(inout[i]))).
template <class T, bool Max>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = to_float(a[i]), y = to_float(b[i]);
    b[i] = from_float<T>(Max ? (x > y || x != x ? x : y) : x + y);  // max keeps a NaN
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
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_), ops_(std::exchange(o.ops_, null_ops())) {}
  mpi_communicator& operator=(mpi_communicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      rank_ = o.rank_;
      size_ = o.size_;
      ops_ = std::exchange(o.ops_, null_ops());
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
    detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, detail::mpi_count(n, "MPI_Allreduce"),
                                    detail::mpi_datatype<T>(), reduction<T>(op), comm_),
                      "MPI_Allreduce");
  }

  /// send[size()*n]; recv[n] gets the sum of block rank(). send == recv is allowed (in place: the
  /// result lands in the first n elements).
  template <mpi_element T>
  void reduce_scatter(const T* send, T* recv, std::size_t n) {
    const int cnt = detail::mpi_count(n, "MPI_Reduce_scatter_block");
    const void* src = send == recv ? MPI_IN_PLACE : static_cast<const void*>(send);
    detail::mpi_check(MPI_Reduce_scatter_block(src, recv, cnt, detail::mpi_datatype<T>(),
                                               reduction<T>(exec::reduce_op::sum), comm_),
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
    // commute = 1: the sum of floating values is taken as commutative, as MPI_SUM is
    detail::mpi_check(MPI_Op_create(&detail::reduce_16bit<bf16, false>, 1, &ops_[0]), "MPI_Op_create");
    detail::mpi_check(MPI_Op_create(&detail::reduce_16bit<bf16, true>, 1, &ops_[1]), "MPI_Op_create");
    detail::mpi_check(MPI_Op_create(&detail::reduce_16bit<fp16, false>, 1, &ops_[2]), "MPI_Op_create");
    detail::mpi_check(MPI_Op_create(&detail::reduce_16bit<fp16, true>, 1, &ops_[3]), "MPI_Op_create");
  }

  /// MPI_SUM / MPI_MAX, or the 16-bit types' user operations.
  template <mpi_element T>
  MPI_Op reduction(exec::reduce_op op) const noexcept {
    const bool max = op == exec::reduce_op::max;
    if constexpr (std::is_same_v<T, bf16>) return ops_[max ? 1 : 0];
    else if constexpr (std::is_same_v<T, fp16>) return ops_[max ? 3 : 2];
    else return max ? MPI_MAX : MPI_SUM;
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
    if (!finalised) {  // errors cannot be reported from a destructor
      for (MPI_Op& op : ops_)
        if (op != MPI_OP_NULL) MPI_Op_free(&op);
      MPI_Comm_free(&comm_);
    }
    comm_ = MPI_COMM_NULL;
    ops_ = null_ops();
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  static std::array<MPI_Op, 4> null_ops() noexcept { return {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}; }
  std::array<MPI_Op, 4> ops_ = null_ops();  ///< bf16 sum, max; fp16 sum, max
};

static_assert(exec::communicator<mpi_communicator, float>);
static_assert(exec::communicator<mpi_communicator, double>);
static_assert(exec::communicator<mpi_communicator, bf16>);
static_assert(exec::communicator<mpi_communicator, fp16>);

}  // namespace memalg::backend::cpu

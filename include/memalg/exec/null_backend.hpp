// SPDX-License-Identifier: BSL-1.0
// memalg/exec/null_backend.hpp — a step backend that accepts every op and does nothing.
//
// Runs the interpreter's control flow for any rank of any mesh on any host, with no memory and no
// peers: dry runs of a plan, and tests of `run`. Its communicators have a rank and a size and do
// nothing, so a trainer can also be built for one rank of a multi-rank mesh in one process (its
// arena bookkeeping does not depend on the data).
#pragma once

#include <cstddef>
#include <cstdint>

#include "memalg/exec/communicator.hpp"
#include "memalg/exec/program.hpp"
#include "memalg/exec/run.hpp"

namespace memalg::exec {

/// A group member whose collectives do nothing.
class null_communicator {
 public:
  null_communicator(int rank = 0, int size = 1) : rank_(rank), size_(size) {}
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  template <class T>
  void all_reduce(T*, std::size_t, reduce_op) {}
  template <class T>
  void reduce_scatter(const T*, T*, std::size_t) {}
  template <class T>
  void all_gather(const T*, T*, std::size_t) {}
  template <class T>
  void broadcast(T*, std::size_t, int) {}
  template <class T>
  void send(const T*, std::size_t, int) {}
  template <class T>
  void recv(T*, std::size_t, int) {}
  void barrier() {}

 private:
  int rank_, size_;
};

static_assert(communicator<null_communicator, float>);

/// Executes nothing; counts what the interpreter hands it (tests check the control flow).
class null_backend {
 public:
  null_backend() = default;
  null_backend(const program& p)
      : dp_(static_cast<int>(p.dp_rank), static_cast<int>(p.dp)),
        tp_(static_cast<int>(p.tp_rank), static_cast<int>(p.tp)),
        pp_(static_cast<int>(p.pp_rank), static_cast<int>(p.pp)) {}

  template <class Op>
  void operator()(const Op&, run_state&) {
    ++executed_;
  }
  void begin_step(const program&, step_io, run_state&) {}
  step_result end_step(const program&, run_state& s) { return {0.0f, 0.0f, s.skip}; }

  null_communicator& dp() { return dp_; }
  null_communicator& tp() { return tp_; }
  null_communicator& pp() { return pp_; }
  /// Ops executed so far (over all steps).
  std::uint64_t executed() const { return executed_; }

 private:
  null_communicator dp_, tp_, pp_;
  std::uint64_t executed_ = 0;
};

static_assert(step_backend<null_backend>);

}  // namespace memalg::exec

// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/local_communicator.hpp — the communicator of a group of one rank.
//
// Lets the executor run the same code path without MPI: every collective over a single rank is an
// identity (copy or no-op). send/recv to oneself go through a FIFO so that a ring loop written for
// P ranks also works for P = 1 (send first, then recv).
#pragma once

#include <cstddef>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "memalg/exec/communicator.hpp"

namespace memalg::backend::cpu {

class local_communicator {
 public:
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }

  template <class T>
  void all_reduce(T*, std::size_t, exec::reduce_op) {}

  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t n) {
    copy(send, recv, n);
  }

  template <class T>
  void all_gather(const T* send, T* recv, std::size_t n) {
    copy(send, recv, n);
  }

  template <class T>
  void broadcast(T*, std::size_t, int root) {
    check_peer(root);
  }

  template <class T>
  void send(const T* buf, std::size_t n, int peer) {
    static_assert(std::is_trivially_copyable_v<T>);
    check_peer(peer);
    std::vector<unsigned char> msg(n * sizeof(T));
    if (n) std::memcpy(msg.data(), buf, msg.size());
    queue_.push_back(std::move(msg));
  }

  template <class T>
  void recv(T* buf, std::size_t n, int peer) {
    static_assert(std::is_trivially_copyable_v<T>);
    check_peer(peer);
    if (queue_.empty()) throw std::runtime_error("local_communicator::recv: no message was sent (would deadlock)");
    if (queue_.front().size() != n * sizeof(T))
      throw std::runtime_error("local_communicator::recv: message size does not match the receive size");
    if (n) std::memcpy(buf, queue_.front().data(), queue_.front().size());
    queue_.pop_front();
  }

  void barrier() noexcept {}

  /// Any split of one rank is again one rank.
  local_communicator split(int /*color*/, int /*key*/ = 0) const { return {}; }

 private:
  template <class T>
  static void copy(const T* src, T* dst, std::size_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n && src != dst) std::memmove(dst, src, n * sizeof(T));
  }
  static void check_peer(int peer) {
    if (peer != 0) throw std::invalid_argument("local_communicator: the only rank is 0");
  }

  std::deque<std::vector<unsigned char>> queue_;
};

static_assert(exec::communicator<local_communicator, float>);
static_assert(exec::communicator<local_communicator, double>);

}  // namespace memalg::backend::cpu

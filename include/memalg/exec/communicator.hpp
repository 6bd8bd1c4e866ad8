// SPDX-License-Identifier: BSL-1.0
// memalg/exec/communicator.hpp — the collective-communication concept every backend implements.
//
// The executor is written against this concept only; the CPU backend implements it over MPI (and a
// single-process `local_communicator` for one rank), the CUDA backend over NCCL. Buffers are
// element pointers of the backend's memory space; counts are in elements.
//
//   all_reduce(buf, n, op)             in place over all ranks of the group
//   reduce_scatter(send, recv, n)      send holds size()*n elements, rank r receives the sum of
//                                      block r (elements [r*n, (r+1)*n)) in recv
//   all_gather(send, recv, n)          send holds n elements, recv receives size()*n, rank-major
//   broadcast(buf, n, root)
//   send(buf, n, peer) / recv(buf, n, peer)
//   barrier()
#pragma once

#include <concepts>
#include <cstddef>

namespace memalg::exec {

enum class reduce_op { sum, max };

template <class C, class T = float>
concept communicator = requires(C& c, T* out, const T* in, std::size_t n, int peer) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  c.all_reduce(out, n, reduce_op::sum);
  c.reduce_scatter(in, out, n);
  c.all_gather(in, out, n);
  c.broadcast(out, n, peer);
  c.send(in, n, peer);
  c.recv(out, n, peer);
  c.barrier();
};

}  // namespace memalg::exec

// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/grad_norm.hpp — global gradient-norm clipping (Pascanu et al. 2013).
//
//   local:  Σ g² over the gradient elements this rank owns (accum_t<T>)
//   global: norm = sqrt(all_reduce_sum(local)) through any memalg::exec::communicator
//   clip:   coef = min(1, max_norm / (norm + ε)), ε = exec::clip_epsilon, folded into the optimizer's grad_scale
// Each element must be counted on exactly one rank of the group: with tensor parallelism the
// caller passes only sharded gradients plus replicated ones on a single rank.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "memalg/core/float16.hpp"
#include "memalg/exec/communicator.hpp"
#include "memalg/exec/hparams.hpp"

namespace memalg::backend::cpu {

/// Σ g² over g[n], accumulated in accum_t<T>.
template <storage_type T>
accum_t<T> grad_sum_squares(const T* g, std::size_t n) {
  accum_t<T> s = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const accum_t<T> x = to_float(g[i]);
    s += x * x;
  }
  return s;
}

/// sqrt of the group-wide sum of the ranks' local sums of squares.
template <class A, class Comm>
  requires exec::communicator<Comm, A>
A global_grad_norm(Comm& comm, A local_sum_squares) {
  comm.all_reduce(&local_sum_squares, std::size_t{1}, exec::reduce_op::sum);
  return std::sqrt(local_sum_squares);
}

/// Convenience: global norm of a gradient shard g[n] of storage type T.
template <storage_type T, class Comm>
  requires exec::communicator<Comm, accum_t<T>>
accum_t<T> global_grad_norm(Comm& comm, const T* g, std::size_t n) {
  return global_grad_norm(comm, grad_sum_squares(g, n));
}

/// min(1, max_norm / (norm + exec::clip_epsilon)). A non-finite norm must be handled (step skipped) by the
/// caller before clipping.
template <class A>
A clip_coefficient(A norm, A max_norm) {
  return std::min(A(1), max_norm / (norm + static_cast<A>(exec::clip_epsilon)));
}

}  // namespace memalg::backend::cpu

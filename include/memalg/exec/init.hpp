// SPDX-License-Identifier: BSL-1.0
// memalg/exec/init.hpp — a program's parameters as they start, and a rank's state sections, on
// the host, for every backend.
//
// The program names how each unit starts (program::units, param_init). The values are computed
// here once, on the host, and each backend copies them into its arena: the CPU and CUDA backends
// start from the same bits. The weights are the values rounded to the storage type through its
// accumulation type; master weights are that rounding read back; gradients and optimizer states
// start at zero (the backends clear them).
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include "memalg/core/float16.hpp"
#include "memalg/core/random.hpp"
#include "memalg/exec/checkpoint.hpp"
#include "memalg/exec/program.hpp"

namespace memalg::exec {

/// The logical values of unit `u` on this rank: each init block's constant or its N(0, σ²) draws
/// (memalg::init_normal, by logical index under program::hp.seed), zero elsewhere.
inline std::vector<float> initial_values(const program& p, const param_unit& u) {
  std::vector<float> v(u.elements, 0.0f);
  for (const param_init& b : u.init) {
    if (b.at + b.rows * b.cols > u.elements) throw std::invalid_argument("exec: an initialisation block lies outside its unit");
    for (std::uint64_t r = 0; r < b.rows; ++r)
      for (std::uint64_t c = 0; c < b.cols; ++c)
        v[b.at + r * b.cols + c] = b.k == param_init::kind::normal
                                       ? init_normal(p.hp.seed, b.rng_tensor, (b.row0 + r) * b.row_stride + b.col0 + c, b.stddev)
                                       : b.constant;
  }
  return v;
}

/// The unit's weights in storage type T: its slice of `values` rounded through accum_t<T>.
template <storage_type T>
std::vector<T> initial_weights(const param_unit& u, std::span<const float> values) {
  if (u.weight_begin + u.weight.count > values.size()) throw std::invalid_argument("exec: a unit's weights lie outside it");
  std::vector<T> w(u.weight.count);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = from_float<T>(static_cast<accum_t<T>>(values[u.weight_begin + i]));
  return w;
}

/// The unit's master weights (empty without): the weights' rounding read back in accum_t<T>.
template <storage_type T>
std::vector<accum_t<T>> initial_master(const param_unit& u, std::span<const float> values) {
  if (u.master.null()) return {};
  if (u.master_begin + u.master.count > values.size())
    throw std::invalid_argument("exec: a unit's master weights lie outside it");
  std::vector<accum_t<T>> m(u.master.count);
  for (std::size_t i = 0; i < m.size(); ++i)
    m[i] = to_float(from_float<T>(static_cast<accum_t<T>>(values[u.master_begin + i])));
  return m;
}

/// A rank's checkpoint sections after its persistent tensors' (in the program's checkpoint order):
/// the loss scaler's state and the counters {step, updates}.
template <class Scaler, class Counters>
void add_step_sections(std::vector<checkpoint_section>& s, Scaler& scaler, Counters& counters) {
  s.push_back({"loss_scaler", std::as_writable_bytes(std::span(&scaler, 1))});
  s.push_back({"counters", std::as_writable_bytes(std::span(counters))});
}

}  // namespace memalg::exec

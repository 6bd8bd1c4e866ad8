// SPDX-License-Identifier: BSL-1.0
// Shared helpers of the CPU backend tests: deterministic random data and a central-difference
// gradient check.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "memalg/core/float16.hpp"

namespace memalg_test {

inline std::vector<double> randn(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<std::int32_t> randint(std::size_t n, std::int32_t hi, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<std::int32_t> dist(0, hi - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline std::vector<double> minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) r[i] = a[i] - b[i];
  return r;
}

/// The largest |a − b| over two equally long vectors.
inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

inline std::vector<double> nans(std::size_t n) {
  return std::vector<double>(n, std::numeric_limits<double>::quiet_NaN());
}

/// Central differences (f(x+h) − f(x−h)) / 2h for every element of x, compared with `analytic`.
/// Error measure: |fd − a| / max(1, |fd|, |a|); truncation is O(h²), round-off O(ε·|f|/h).
template <class F>
void check_gradient(const std::string& name, std::vector<double>& x, const std::vector<double>& analytic,
                    F&& loss, double tol = 1e-7, double h = 1e-5) {
  REQUIRE(x.size() == analytic.size());
  double worst = 0;
  std::size_t worst_i = 0;
  double worst_fd = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    x[i] = xi + h;
    const double fp = loss();
    x[i] = xi - h;
    const double fm = loss();
    x[i] = xi;
    const double fd = (fp - fm) / (2 * h);
    const double err = std::abs(fd - analytic[i]) / std::max({1.0, std::abs(fd), std::abs(analytic[i])});
    if (!(err <= worst)) {  // also catches NaN
      worst = std::isnan(err) ? std::numeric_limits<double>::infinity() : err;
      worst_i = i;
      worst_fd = fd;
    }
  }
  INFO(name << ": worst element " << worst_i << " analytic " << analytic[worst_i] << " finite difference " << worst_fd);
  CHECK(worst <= tol);
}

/// Storage-type copies of double data.
template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  std::vector<T> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = memalg::from_float<T>(static_cast<memalg::accum_t<T>>(v[i]));
  return r;
}

/// Widen storage values to float (for comparisons).
template <class T>
std::vector<float> widen(const std::vector<T>& v) {
  std::vector<float> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(memalg::to_float(v[i]));
  return r;
}

}  // namespace memalg_test

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

#include "memalg/backend/cpu/attention.hpp"
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

/// transformers' eager_attention_forward (Llama's; with Gemma2Attention's variants), written as there
/// on the fused qkv layout of attention.hpp: scores = q·kᵀ·scaling (scaling = query_pre_attn_scalar^−½, or 1/√D);
/// with attn_logit_softcapping: scores / cap, tanh, · cap; then the causal mask, narrowed to the
/// last `window` positions on a sliding layer (j > t − window); softmax; · v (repeat_kv: query
/// head h reads kv head h / (H/Hkv)).
inline std::vector<double> hf_attention(const std::vector<double>& qkv, const memalg::backend::cpu::attention_shape& sh) {
  const std::size_t W = sh.qkv_width(), S = sh.S, D = sh.D, rep = sh.H / sh.Hkv;
  const double scaling = sh.scale > 0 ? sh.scale : 1.0 / std::sqrt(double(D));
  std::vector<double> out(sh.rows() * sh.out_width());
  for (std::size_t b = 0; b < sh.B; ++b)
    for (std::size_t h = 0; h < sh.H; ++h) {
      const std::size_t g = h / rep;
      for (std::size_t t = 0; t < S; ++t) {
        std::vector<double> s(S);
        for (std::size_t j = 0; j < S; ++j) {
          double d = 0;
          for (std::size_t c = 0; c < D; ++c)
            d += qkv[(b * S + t) * W + h * D + c] * qkv[(b * S + j) * W + (sh.H + g) * D + c];
          d *= scaling;
          if (sh.softcap > 0) d = std::tanh(d / sh.softcap) * sh.softcap;
          const bool masked = (sh.causal && j > t) || (sh.window > 0 && j + sh.window <= t);
          s[j] = masked ? -std::numeric_limits<double>::infinity() : d;
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (auto& v : s) z += (v = std::exp(v - mx));
        for (std::size_t c = 0; c < D; ++c) {
          double o = 0;
          for (std::size_t j = 0; j < S; ++j) o += s[j] / z * qkv[(b * S + j) * W + (sh.H + sh.Hkv + g) * D + c];
          out[(b * S + t) * sh.out_width() + h * D + c] = o;
        }
      }
    }
  return out;
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

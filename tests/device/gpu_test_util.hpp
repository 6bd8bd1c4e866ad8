// SPDX-License-Identifier: BSL-1.0
// Helpers of the GPU tests: device buffers, random inputs, conversions to the CPU reference's
// double precision, and the relative-error check with a tolerance per storage type.
//
// Every kernel is compared with the CPU reference backend (memalg/backend/cpu) run in double on the
// same inputs (the GPU inputs rounded to T, then widened exactly), so the tolerance only has to
// cover the GPU's float arithmetic and its rounding of the results to T:
//   fp32 1e-5, bf16 2e-2, fp16 5e-3   (max |gpu − ref| / max |ref| over the tensor)
#pragma once

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"

namespace gpu_test {

namespace cu = memalg::backend::cuda;

template <class T>
constexpr double tolerance() {
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  else if constexpr (std::is_same_v<T, cu::bf16>) return 2e-2;
  else return 5e-3;
}

/// Owns `n` elements of device memory.
template <class T>
class dbuf {
 public:
  dbuf() = default;
  explicit dbuf(std::size_t n) : n_(n) {
    if (n_ != 0) MEMALG_CUDA_CHECK(cudaMalloc(&p_, n_ * sizeof(T)));
  }
  explicit dbuf(const std::vector<T>& host) : dbuf(host.size()) { upload(host); }
  ~dbuf() {
    if (p_ != nullptr) cudaFree(p_);
  }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    if (n_ != 0) MEMALG_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    MEMALG_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> host(n_);
    if (n_ != 0) MEMALG_CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  void zero() {
    if (n_ != 0) MEMALG_CUDA_CHECK(cudaMemset(p_, 0, n_ * sizeof(T)));
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// n values uniform in [lo, hi), rounded to T.
template <class T>
std::vector<T> random_values(std::size_t n, float lo, float hi, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = cu::from_float<T>(dist(rng));
  return v;
}

inline std::vector<std::int32_t> random_ints(std::size_t n, std::int32_t lo, std::int32_t hi_inclusive,
                                             std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> dist(lo, hi_inclusive);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// Exact widening of T values to double (the reference's inputs).
template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  std::vector<double> d(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) d[i] = static_cast<double>(cu::to_float(v[i]));
  return d;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

/// max |gpu − ref| / max |ref|.
template <class T>
double rel_error(const std::vector<T>& gpu, const std::vector<double>& ref) {
  REQUIRE(gpu.size() == ref.size());
  double err = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double g = static_cast<double>(cu::to_float(gpu[i]));
    if (!std::isfinite(g)) return INFINITY;
    err = std::max(err, std::abs(g - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return scale > 0.0 ? err / scale : err;
}

/// Checks gpu against ref with tolerance<T>() (or `tol` when given), naming the tensor.
template <class T, class G>
void check_close(const char* what, const std::vector<G>& gpu, const std::vector<double>& ref, double tol = -1.0) {
  const double t = tol > 0.0 ? tol : tolerance<T>();
  const double e = rel_error(gpu, ref);
  INFO(what << " (" << cu::dtype_traits<T>::name << "): relative error " << e << ", tolerance " << t);
  CHECK(e <= t);
}

}  // namespace gpu_test

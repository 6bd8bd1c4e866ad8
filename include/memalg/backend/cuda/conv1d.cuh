// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/conv1d.cuh — 1-D convolution over the sequence axis, nn.Conv1d(in, out,
// kernel, padding="same"), forward and backward; the CUDA twin of backend/cpu/conv1d.hpp.
//
// Layouts as there: in[B·S, IC] and out[B·S, OC] token-major (row b·S + t), W[OC, IC, K]
// (PyTorch's), bias[OC]; left padding ⌊(K − 1)/2⌋, the window clipped at each utterance's ends.
//   forward:  out[b,t,o] = bias[o] + Σ_i Σ_k W[o,i,k]·in[b, t + k − left, i]      one thread per output
//   backward: din (=) one thread per input element; dW, dbias (+=) by the fixed-order column
//             reduction of reduce.cuh over the B·S rows (no atomics: bit-reproducible).
// Scalar kernels with float accumulation (no tensor cores, no im2col GEMM): they are the
// reference-exact path a GEMM formulation can be checked against. Their cost is B·S·OC·IC·K
// multiply-adds per pass without data reuse: fine for tests and small models; at the speech
// model's 1024-wide pre-net an im2col (K shifted views) + cuBLASLt GEMM is the fast path.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/reduce.cuh"

namespace memalg::backend::cuda {

struct conv1d_shape {
  std::int64_t B = 0;   ///< batch
  std::int64_t S = 0;   ///< sequence length
  std::int64_t IC = 0;  ///< input channels
  std::int64_t OC = 0;  ///< output channels
  std::int64_t K = 0;   ///< kernel width

  MEMALG_HOST_DEVICE constexpr std::int64_t left() const noexcept { return (K - 1) / 2; }
  MEMALG_HOST_DEVICE constexpr std::int64_t rows() const noexcept { return B * S; }
  MEMALG_HOST_DEVICE constexpr std::int64_t weight_elements() const noexcept { return OC * IC * K; }
  MEMALG_HOST_DEVICE constexpr bool valid() const noexcept { return B >= 0 && S >= 0 && IC > 0 && OC > 0 && K > 0; }
};

namespace detail {

template <class T>
__global__ void conv1d_forward_kernel(T* out, const T* in, const T* w, const T* bias, conv1d_shape sh) {
  const std::int64_t total = sh.rows() * sh.OC;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t o = e % sh.OC;
    const std::int64_t n = e / sh.OC;
    const std::int64_t t = n % sh.S;
    const std::int64_t b = n / sh.S;
    float v = bias != nullptr ? to_float(bias[o]) : 0.0f;
    for (std::int64_t k = 0; k < sh.K; ++k) {
      const std::int64_t s = t + k - sh.left();
      if (s < 0 || s >= sh.S) continue;
      const T* x = in + (b * sh.S + s) * sh.IC;
      for (std::int64_t i = 0; i < sh.IC; ++i) v += to_float(w[(o * sh.IC + i) * sh.K + k]) * to_float(x[i]);
    }
    out[e] = from_float<T>(v);
  }
}

template <class T>
__global__ void conv1d_input_grad_kernel(T* din, const T* dout, const T* w, conv1d_shape sh) {
  const std::int64_t total = sh.rows() * sh.IC;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t i = e % sh.IC;
    const std::int64_t n = e / sh.IC;
    const std::int64_t s = n % sh.S;
    const std::int64_t b = n / sh.S;
    float v = 0.0f;
    for (std::int64_t k = 0; k < sh.K; ++k) {
      const std::int64_t t = s + sh.left() - k;  // output position reading s through tap k
      if (t < 0 || t >= sh.S) continue;
      const T* dy = dout + (b * sh.S + t) * sh.OC;
      for (std::int64_t o = 0; o < sh.OC; ++o) v += to_float(dy[o]) * to_float(w[(o * sh.IC + i) * sh.K + k]);
    }
    din[e] = from_float<T>(v);
  }
}

// Column c = (o·IC + i)·K + k of dW; row n = b·S + t.
template <class T>
struct conv1d_weight_term {
  const T* dout;
  const T* in;
  conv1d_shape sh;
  __device__ void operator()(std::int64_t n, std::int64_t c, float (&acc)[1]) const {
    const std::int64_t k = c % sh.K;
    const std::int64_t i = (c / sh.K) % sh.IC;
    const std::int64_t o = c / (sh.K * sh.IC);
    const std::int64_t t = n % sh.S;
    const std::int64_t s = t + k - sh.left();
    if (s < 0 || s >= sh.S) return;
    acc[0] += to_float(dout[n * sh.OC + o]) * to_float(in[(n - t + s) * sh.IC + i]);
  }
};

template <class T>
struct conv1d_bias_term {
  const T* dout;
  std::int64_t oc;
  __device__ void operator()(std::int64_t n, std::int64_t c, float (&acc)[1]) const {
    acc[0] += to_float(dout[n * oc + c]);
  }
};

template <class T>
struct accumulate_store {
  T* grad;
  __device__ void operator()(std::int64_t c, const float (&sum)[1]) const {
    grad[c] = from_float<T>(to_float(grad[c]) + sum[0]);
  }
};

inline void check_conv1d_shape(const conv1d_shape& sh, const char* what) {
  if (!sh.valid()) throw std::invalid_argument(std::string(what) + ": IC, OC and K must be positive");
}

}  // namespace detail

/// out[B·S, OC]; bias may be null.
template <storage_type T>
void conv1d_forward(T* out, const T* in, const T* w, const T* bias, const conv1d_shape& sh,
                    cudaStream_t stream = nullptr) {
  detail::check_conv1d_shape(sh, "conv1d_forward");
  const launch_1d l = grid_stride_launch(sh.rows() * sh.OC);
  if (l.grid == 0) return;
  detail::conv1d_forward_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(out, in, w, bias, sh);
  MEMALG_CUDA_CHECK_LAUNCH("conv1d_forward_kernel");
}

/// din[B·S, IC] written (may be null); dw[OC, IC, K], dbias[OC] accumulated (either may be null).
template <storage_type T>
void conv1d_backward(T* din, T* dw, T* dbias, const T* dout, const T* in, const T* w, const conv1d_shape& sh,
                     cudaStream_t stream = nullptr) {
  detail::check_conv1d_shape(sh, "conv1d_backward");
  if (dw != nullptr)
    column_reduce<1>(sh.rows(), sh.weight_elements(), detail::conv1d_weight_term<T>{dout, in, sh},
                     detail::accumulate_store<T>{dw}, stream);
  if (dbias != nullptr)
    column_reduce<1>(sh.rows(), sh.OC, detail::conv1d_bias_term<T>{dout, sh.OC}, detail::accumulate_store<T>{dbias},
                     stream);
  if (din == nullptr) return;
  const launch_1d l = grid_stride_launch(sh.rows() * sh.IC);
  if (l.grid == 0) return;
  detail::conv1d_input_grad_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(din, dout, w, sh);
  MEMALG_CUDA_CHECK_LAUNCH("conv1d_input_grad_kernel");
}

}  // namespace memalg::backend::cuda

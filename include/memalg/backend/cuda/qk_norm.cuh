// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/qk_norm.cuh — RMSNorm over each query and key head of a fused qkv, in place,
// forward and backward (Qwen3's q_norm and k_norm; the CPU reference, backend/cpu/qk_norm.hpp,
// gives the layouts and the formulas).
//
// qkv[N, (H + 2·Hkv)·D]: each row's first H + Hkv heads (queries, then keys) are normalised over
// their D values with w = wq or wk; the value heads are not touched. One warp per head row, float
// accumulation, rmsnorm.cuh's arithmetic:
//   qk_rmsnorm_forward:  pre[n·(H + Hkv) + j, :] = x (may be null), x ← x·rstd·w
//   qk_rmsnorm_backward: dwq, dwk += Σ dy·x·rstd (column reductions over the query and the key
//                        head rows; either may be null), then dx written over dy in place, from
//                        pre and rstd[N·(H + Hkv)] (scratch the caller provides, filled here from
//                        pre with rmsnorm_stats: the forward's bits)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/reduce.cuh"
#include "memalg/backend/cuda/rmsnorm.cuh"

namespace memalg::backend::cuda {

namespace detail {

/// Head row j of all N·(H + Hkv): its place in the fused qkv.
MEMALG_HOST_DEVICE constexpr std::int64_t qk_head_offset(std::int64_t j, std::int64_t heads, std::int64_t row,
                                                         std::int64_t D) noexcept {
  return (j / heads) * row + (j % heads) * D;
}

template <class T>
__global__ void qk_rmsnorm_forward_kernel(T* qkv, T* pre, const T* wq, const T* wk, std::int64_t rows, std::int64_t H,
                                          std::int64_t heads, std::int64_t row, std::int64_t D, float eps) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / warp_size) + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (j >= rows) return;
  T* x = qkv + qk_head_offset(j, heads, row, D);
  const T* w = (j % heads) < H ? wq : wk;
  float sq = 0.0f;
  for (std::int64_t c = lane; c < D; c += warp_size) {
    const float v = to_float(x[c]);
    sq += v * v;
  }
  const float r = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(D) + eps);
  for (std::int64_t c = lane; c < D; c += warp_size) {
    if (pre != nullptr) pre[j * D + c] = x[c];
    x[c] = from_float<T>(to_float(x[c]) * r * to_float(w[c]));
  }
}

template <class T>
__global__ void qk_rmsnorm_backward_input_kernel(T* dqkv, const T* pre, const T* wq, const T* wk, const float* rstd,
                                                 std::int64_t rows, std::int64_t H, std::int64_t heads, std::int64_t row,
                                                 std::int64_t D) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / warp_size) + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (j >= rows) return;
  T* dy = dqkv + qk_head_offset(j, heads, row, D);
  const T* x = pre + j * D;
  const T* w = (j % heads) < H ? wq : wk;
  const float r = rstd[j];
  float sum_gx = 0.0f;
  for (std::int64_t c = lane; c < D; c += warp_size) sum_gx += to_float(dy[c]) * to_float(w[c]) * to_float(x[c]) * r;
  const float mean_gx = warp_sum(sum_gx) / static_cast<float>(D);
  for (std::int64_t c = lane; c < D; c += warp_size) {  // each lane reads its dy[c] before writing it
    const float g = to_float(dy[c]) * to_float(w[c]);
    dy[c] = from_float<T>(r * (g - to_float(x[c]) * r * mean_gx));
  }
}

/// Σ over the `count` heads from head `first` of every token row: dy·x·rstd.
template <class T>
struct qk_norm_param_term {
  const T* dqkv;
  const T* pre;
  const float* rstd;
  std::int64_t first, count, heads, row, D;
  __device__ void operator()(std::int64_t n, std::int64_t c, float (&acc)[1]) const {
    const std::int64_t j = (n / count) * heads + first + n % count;
    acc[0] += to_float(dqkv[qk_head_offset(j, heads, row, D) + c]) * to_float(pre[j * D + c]) * rstd[j];
  }
};

inline void check_qk_norm(std::int64_t H, std::int64_t Hkv, std::int64_t D) {
  if (H <= 0 || Hkv <= 0 || D <= 0 || H % Hkv != 0)
    throw std::invalid_argument("qk_rmsnorm: heads, key/value heads and head width must be positive, Hkv dividing H");
}

}  // namespace detail

/// Normalises the query and key heads of qkv[N, (H + 2Hkv)·D] in place; pre [N·(H + Hkv), D] (may be null).
template <storage_type T>
void qk_rmsnorm_forward(T* qkv, T* pre, const T* wq, const T* wk, std::int64_t N, std::int64_t H, std::int64_t Hkv,
                        std::int64_t D, float eps, cudaStream_t stream = nullptr) {
  detail::check_qk_norm(H, Hkv, D);
  const std::int64_t heads = H + Hkv, rows = N * heads;
  const launch_1d l = warp_per_row_launch(rows);
  if (l.grid == 0) return;
  detail::qk_rmsnorm_forward_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(
      qkv, pre, wq, wk, rows, H, heads, (H + 2 * Hkv) * D, D, eps);
  MEMALG_CUDA_CHECK_LAUNCH("qk_rmsnorm_forward_kernel");
}

/// The backward in place on dqkv's query and key heads; dwq, dwk [D] += (may be null); rstd:
/// scratch of N·(H + Hkv) floats.
template <storage_type T>
void qk_rmsnorm_backward(T* dqkv, T* dwq, T* dwk, const T* pre, const T* wq, const T* wk, float* rstd, std::int64_t N,
                         std::int64_t H, std::int64_t Hkv, std::int64_t D, float eps, cudaStream_t stream = nullptr) {
  detail::check_qk_norm(H, Hkv, D);
  const std::int64_t heads = H + Hkv, rows = N * heads, row = (H + 2 * Hkv) * D;
  if (rows == 0) return;
  rmsnorm_stats(rstd, pre, rows, D, eps, stream);
  // The weights' gradients first: they read dy, which the input gradient then overwrites.
  if (dwq != nullptr)
    column_reduce<1>(N * H, D, detail::qk_norm_param_term<T>{dqkv, pre, rstd, 0, H, heads, row, D},
                     detail::rmsnorm_param_store<T>{dwq}, stream);
  if (dwk != nullptr)
    column_reduce<1>(N * Hkv, D, detail::qk_norm_param_term<T>{dqkv, pre, rstd, H, Hkv, heads, row, D},
                     detail::rmsnorm_param_store<T>{dwk}, stream);
  const launch_1d l = warp_per_row_launch(rows);
  detail::qk_rmsnorm_backward_input_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(
      dqkv, pre, wq, wk, rstd, rows, H, heads, row, D);
  MEMALG_CUDA_CHECK_LAUNCH("qk_rmsnorm_backward_input_kernel");
}

}  // namespace memalg::backend::cuda

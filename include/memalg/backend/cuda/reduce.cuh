// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/reduce.cuh — warp, block and column reductions used by the kernels.
//
// All reductions have a fixed order (butterfly shuffles, fixed block shapes, no atomics), so a
// kernel gives bit-identical results run after run. Butterfly (xor) shuffles leave the same value
// in every lane because each lane adds the same two operands at each step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/launch.cuh"

namespace memalg::backend::cuda {

inline constexpr unsigned full_warp_mask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = warp_size / 2; o > 0; o >>= 1) v += __shfl_xor_sync(full_warp_mask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = warp_size / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(full_warp_mask, v, o));
  return v;
}

/// Running softmax statistics: max m and Σ exp(x − m). m = −∞ with l = 0 is the empty state.
struct softmax_stats {
  float m;
  float l;
};

__device__ __forceinline__ softmax_stats softmax_empty() { return {-INFINITY, 0.0f}; }

__device__ __forceinline__ softmax_stats softmax_push(softmax_stats s, float x) {
  if (x == -INFINITY) return s;
  if (x > s.m) return {x, s.l * expf(s.m - x) + 1.0f};
  return {s.m, s.l + expf(x - s.m)};
}

__device__ __forceinline__ softmax_stats softmax_combine(softmax_stats a, softmax_stats b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return softmax_empty();
  const float la = a.m == -INFINITY ? 0.0f : a.l * expf(a.m - m);
  const float lb = b.m == -INFINITY ? 0.0f : b.l * expf(b.m - m);
  return {m, la + lb};
}

__device__ __forceinline__ softmax_stats warp_softmax(softmax_stats s) {
#pragma unroll
  for (int o = warp_size / 2; o > 0; o >>= 1) {
    softmax_stats other{__shfl_xor_sync(full_warp_mask, s.m, o), __shfl_xor_sync(full_warp_mask, s.l, o)};
    s = softmax_combine(s, other);
  }
  return s;
}

/// Sum over a 1-D block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
/// `scratch` holds 32 floats of shared memory; it may be reused right after the call returns.
__device__ inline float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % warp_size;
  const int warp = threadIdx.x / warp_size;
  const int warps = blockDim.x / warp_size;
  v = warp_sum(v);
  __syncthreads();  // earlier readers of scratch are done
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

/// Softmax statistics over a 1-D block; `scratch` holds 64 floats of shared memory.
__device__ inline softmax_stats block_softmax(softmax_stats s, float* scratch) {
  const int lane = threadIdx.x % warp_size;
  const int warp = threadIdx.x / warp_size;
  const int warps = blockDim.x / warp_size;
  s = warp_softmax(s);
  __syncthreads();
  if (lane == 0) {
    scratch[warp] = s.m;
    scratch[32 + warp] = s.l;
  }
  __syncthreads();
  s = lane < warps ? softmax_stats{scratch[lane], scratch[32 + lane]} : softmax_empty();
  return warp_softmax(s);
}

// ---- column reductions -------------------------------------------------------------------------

/// out_k[c] ⊕= Σ_n f(n, c)_k for K sums at once, rows summed in a fixed order. Block (32, 32):
/// threadIdx.x is the column inside a 32-wide tile, threadIdx.y strides over the rows.
/// `Term` is `void operator()(std::int64_t n, std::int64_t c, float (&acc)[K])` adding into acc,
/// `Store` is `void operator()(std::int64_t c, const float (&sum)[K])`.
template <int K, class Term, class Store>
__global__ void __launch_bounds__(column_reduce_cols * column_reduce_rows)
    column_reduce_kernel(std::int64_t rows, std::int64_t cols, Term term, Store store) {
  __shared__ float partial[K][column_reduce_rows][column_reduce_cols + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * column_reduce_cols + threadIdx.x;
  float acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = 0.0f;
  if (c < cols)
    for (std::int64_t n = threadIdx.y; n < rows; n += column_reduce_rows) term(n, c, acc);
#pragma unroll
  for (int k = 0; k < K; ++k) partial[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float sum[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      sum[k] = 0.0f;
      for (int r = 0; r < column_reduce_rows; ++r) sum[k] += partial[k][r][threadIdx.x];
    }
    store(c, sum);
  }
}

template <int K, class Term, class Store>
void column_reduce(std::int64_t rows, std::int64_t cols, Term term, Store store, cudaStream_t stream) {
  const std::int64_t blocks = column_reduce_blocks(cols);
  if (blocks == 0) return;
  column_reduce_kernel<K><<<static_cast<unsigned>(blocks), dim3(column_reduce_cols, column_reduce_rows), 0, stream>>>(
      rows, cols, term, store);
  MEMALG_CUDA_CHECK_LAUNCH("column_reduce_kernel");
}

}  // namespace memalg::backend::cuda

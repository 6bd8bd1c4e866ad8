// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/pointwise.cuh — vectorised element-wise kernels.
//
// An element-wise operation is a functor with `template <int W> __device__ void operator()(i)`
// processing elements [i·W, (i+1)·W). launch_pointwise picks W = 16 bytes / sizeof(T) when every
// array involved is aligned for it and the element count divides (launch.cuh: common_vec_width),
// and W = 1 otherwise; the grid is a grid-stride launch over n / W vectors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/launch.cuh"

namespace memalg::backend::cuda {

/// W elements of T loaded and stored as one access.
template <class T, int W>
struct alignas(sizeof(T) * W) packed {
  T v[W];
};

template <int W, class T>
__device__ __forceinline__ packed<T, W> load_packed(const T* p, std::int64_t vec) {
  return reinterpret_cast<const packed<T, W>*>(p)[vec];
}

template <int W, class T>
__device__ __forceinline__ void store_packed(T* p, std::int64_t vec, const packed<T, W>& x) {
  reinterpret_cast<packed<T, W>*>(p)[vec] = x;
}

template <int W, class Op>
__global__ void pointwise_kernel(std::int64_t vectors, Op op) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride)
    op.template operator()<W>(i);
}

/// Runs `op` over n elements with vectors of kMaxWidth when `width` says so, else one by one.
template <int kMaxWidth, class Op>
void launch_pointwise(std::int64_t n, int width, Op op, cudaStream_t stream, const char* name) {
  if (n <= 0) return;
  if (width == kMaxWidth && kMaxWidth > 1) {
    const launch_1d l = grid_stride_launch(n / kMaxWidth);
    pointwise_kernel<kMaxWidth><<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(n / kMaxWidth, op);
  } else {
    const launch_1d l = grid_stride_launch(n);
    pointwise_kernel<1><<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(n, op);
  }
  MEMALG_CUDA_CHECK_LAUNCH(name);
}

}  // namespace memalg::backend::cuda

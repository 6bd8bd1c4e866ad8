// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/grad_norm.cuh — global gradient squared norm, clip coefficient, overflow check.
//
// squared_norm_accumulate() adds Σ g² of one gradient tensor to a float on the device in a fixed
// order (a device-independent number of partial blocks, then one block over the partials), so
// the same gradients give the same bits on any GPU. For a sharded model: accumulate every local
// shard, all_reduce(sum) the float over the group, then clip_from_squared_norm() computes
//   norm = sqrt(Σ g²),  coef = min(1, max_norm / (norm + ε)),  nonfinite = !isfinite(norm)
// with ε = exec::clip_epsilon (exec/hparams.hpp)
// on the device; coef can feed the optimizer's device_grad_scale, and nonfinite drives the fp16
// loss scaler (skip the step, halve the scale).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/reduce.cuh"
#include "memalg/exec/hparams.hpp"

namespace memalg::backend::cuda {

/// Floats of scratch squared_norm_accumulate needs.
inline constexpr std::size_t grad_norm_scratch_floats = norm_max_blocks;

/// Clip coefficient of the contract: min(1, max_norm / (norm + exec::clip_epsilon)); max_norm ≤ 0 disables it.
MEMALG_HOST_DEVICE constexpr float clip_coefficient(float norm, float max_norm) noexcept {
  if (!(max_norm > 0.0f)) return 1.0f;
  const float c = max_norm / (norm + exec::clip_epsilon);
  return c < 1.0f ? c : 1.0f;
}

namespace detail {

template <class T>
__global__ void __launch_bounds__(norm_block) squared_norm_partial_kernel(float* partials, const T* g, std::int64_t n) {
  __shared__ float scratch[32];
  float s = 0.0f;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = to_float(g[i]);
    s += x * x;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void __launch_bounds__(norm_max_blocks) squared_norm_finish_kernel(float* out, const float* partials,
                                                                              int count) {
  __shared__ float scratch[32];
  float s = threadIdx.x < count ? partials[threadIdx.x] : 0.0f;
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *out += s;
}

__global__ void clip_kernel(const float* squared_norm, float max_norm, float* norm, float* coefficient,
                            int* nonfinite) {
  const float nrm = sqrtf(*squared_norm);
  if (norm != nullptr) *norm = nrm;
  if (coefficient != nullptr) *coefficient = clip_coefficient(nrm, max_norm);
  if (nonfinite != nullptr) *nonfinite = isfinite(nrm) ? 0 : 1;
}

}  // namespace detail

/// *squared_norm += Σ g[i]² (float accumulation). `scratch` holds grad_norm_scratch_floats floats.
template <storage_type T>
void squared_norm_accumulate(float* squared_norm, const T* g, std::int64_t n, float* scratch,
                             cudaStream_t stream = nullptr) {
  if (n <= 0) return;
  const int blocks = norm_partial_blocks(n);
  detail::squared_norm_partial_kernel<<<blocks, norm_block, 0, stream>>>(scratch, g, n);
  MEMALG_CUDA_CHECK_LAUNCH("squared_norm_partial_kernel");
  detail::squared_norm_finish_kernel<<<1, norm_max_blocks, 0, stream>>>(squared_norm, scratch, blocks);
  MEMALG_CUDA_CHECK_LAUNCH("squared_norm_finish_kernel");
}

/// From the (all-reduced) squared norm: the norm, the clip coefficient and a non-finite flag
/// (each output may be null).
inline void clip_from_squared_norm(const float* squared_norm, float max_norm, float* norm, float* coefficient,
                                   int* nonfinite, cudaStream_t stream = nullptr) {
  detail::clip_kernel<<<1, 1, 0, stream>>>(squared_norm, max_norm, norm, coefficient, nonfinite);
  MEMALG_CUDA_CHECK_LAUNCH("clip_kernel");
}

}  // namespace memalg::backend::cuda

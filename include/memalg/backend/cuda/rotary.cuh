// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/rotary.cuh — rotary position embedding (RoPE, Su et al. 2021), forward and backward.
//
// Same arguments, layouts and mathematics as the CPU reference (backend/cpu/rotary.hpp): Hugging
// Face's `rotate_half` convention with GPT-NeoX's partial rotary, so in every head only the first
// R = rotary_dim of the D dimensions rotate and the other D − R pass through. With half = R/2,
// i < half and position p = pos0 + n % S of token row n (pos0 0 but in a generation step, whose S
// rows of a sequence sit at positions pos0 … pos0 + S − 1; rope_qkv_forward takes it last):
//   inv_freq_i = θ^(−2i/R),  φ = p·inv_freq_i,  c = cos φ,  s = sin φ
//   forward:  out_i = x_i·c − x_{i+half}·s,   out_{i+half} = x_{i+half}·c + x_i·s
//   backward: the transpose rotation (φ → −φ), din written (=)
// inv_freq, φ, cos and sin are computed in float for every storage type (no table: each thread
// evaluates its own pair).
//
// Layouts:
//  * rope_*:     x[N, heads, D] rows of heads·D, the layout of attention's q part and of its out.
//  * rope_qkv_*: the fused qkv[N, (H + 2·Hkv)·D] of attention.cuh; the H query heads and the Hkv
//                key heads rotate, the value heads are copied.
// Grid-stride, one thread per rotated pair (it reads both elements before writing either) or per
// copied element, so out may alias in; nothing is copied when it does. rotary_dim 0 copies (or,
// in place, launches nothing). Invalid arguments (S ≤ 0, odd rotary_dim or rotary_dim > D,
// θ ≤ 0 or NaN, an invalid qkv shape) throw std::invalid_argument before any launch.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"

namespace memalg::backend::cuda {

inline constexpr float rope_default_theta = 10000.0f;

namespace detail {

/// Work of one row: `heads` heads of `slots` items each (`half` rotated pairs, then the copied
/// pass-through dimensions R..D−1 when out != in), then `tail` copied columns after heads·D.
struct rope_row_work {
  std::int64_t heads = 0;
  std::int64_t D = 0;
  std::int64_t rotary_dim = 0;
  std::int64_t slots = 0;  ///< per head: half (+ D − R when copying)
  std::int64_t tail = 0;   ///< columns after heads·D copied per row (0 when in place)
  std::int64_t stride = 0; ///< row stride of in and out
  std::int64_t pos0 = 0;   ///< position of each sequence's first row

  MEMALG_HOST_DEVICE constexpr std::int64_t half() const noexcept { return rotary_dim / 2; }
  MEMALG_HOST_DEVICE constexpr std::int64_t per_row() const noexcept { return heads * slots + tail; }
};

/// The work of rows `stride` wide whose first `heads` heads rotate; `copy` when out != in.
MEMALG_HOST_DEVICE constexpr rope_row_work make_rope_row_work(std::int64_t heads, std::int64_t D,
                                                              std::int64_t rotary_dim, std::int64_t stride,
                                                              bool copy) noexcept {
  rope_row_work w;
  w.heads = heads;
  w.D = D;
  w.rotary_dim = rotary_dim;
  w.slots = rotary_dim / 2 + (copy ? D - rotary_dim : 0);
  w.tail = copy ? stride - heads * D : 0;
  w.stride = stride;
  return w;
}

/// Work item t of the grid: one rotated pair, or one copied element. sign = +1 forward, −1
/// backward (transpose). Host and device, so that the index arithmetic can be exercised without a GPU.
template <class T>
MEMALG_HOST_DEVICE inline void rope_item(T* out, const T* in, std::int64_t t, std::int64_t S, const rope_row_work& w,
                                         float theta, float sign) {
  const std::int64_t per_row = w.per_row();
  const std::int64_t half = w.half();
  const std::int64_t n = t / per_row;
  const std::int64_t r = t - n * per_row;
  const std::int64_t row = n * w.stride;
  if (r >= w.heads * w.slots) {  // column after the rotated heads (v of a fused qkv)
    const std::int64_t c = w.heads * w.D + (r - w.heads * w.slots);
    out[row + c] = in[row + c];
    return;
  }
  const std::int64_t h = r / w.slots;
  const std::int64_t j = r - h * w.slots;
  const std::int64_t base = row + h * w.D;
  if (j >= half) {  // pass-through dimension R + (j − half)
    const std::int64_t d = w.rotary_dim + (j - half);
    out[base + d] = in[base + d];
    return;
  }
  const float inv_freq = 1.0f / powf(theta, static_cast<float>(2 * j) / static_cast<float>(w.rotary_dim));
  const float phi = static_cast<float>(w.pos0 + n % S) * inv_freq;
  float s, c;
  sincosf(phi, &s, &c);
  s *= sign;
  const float x1 = to_float(in[base + j]);
  const float x2 = to_float(in[base + j + half]);
  out[base + j] = from_float<T>(x1 * c - x2 * s);
  out[base + j + half] = from_float<T>(x2 * c + x1 * s);
}

template <class T>
__global__ void rope_kernel(T* out, const T* in, std::int64_t items, std::int64_t S, rope_row_work w, float theta,
                            float sign) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < items; t += stride)
    rope_item(out, in, t, S, w, theta, sign);
}

inline void check_rope_args(std::int64_t N, std::int64_t S, std::int64_t heads, std::int64_t D,
                            std::int64_t rotary_dim, float theta, const char* what, std::int64_t pos0 = 0) {
  if (N < 0 || heads < 0 || D < 0)
    throw std::invalid_argument(std::string(what) + ": N, heads and D must not be negative");
  if (pos0 < 0) throw std::invalid_argument(std::string(what) + ": pos0 must not be negative");
  if (S <= 0) throw std::invalid_argument(std::string(what) + ": sequence length S must be positive");
  if (rotary_dim < 0 || rotary_dim % 2 != 0 || rotary_dim > D)
    throw std::invalid_argument(std::string(what) + ": rotary_dim must be even and at most the head width D");
  if (!(theta > 0.0f)) throw std::invalid_argument(std::string(what) + ": theta must be positive");
}

/// The checks of the CPU reference's check_attention_shape (B may be 0: nothing to do).
inline void check_rope_qkv_shape(const attention_shape& sh, const char* what) {
  if (sh.B < 0 || sh.H < 0) throw std::invalid_argument(std::string(what) + ": B and H must not be negative");
  if (sh.Hkv <= 0 || sh.H % sh.Hkv != 0)
    throw std::invalid_argument(std::string(what) + ": H must be a positive multiple of Hkv");
  if (sh.D <= 0) throw std::invalid_argument(std::string(what) + ": head width D must be positive");
}

/// Rotates the first `heads` heads (D wide) of each of N rows `stride` apart (rows of out are
/// `stride` apart too; row n at position pos0 + n % S) and, when out != in, copies the rest of each row.
template <class T>
void rope_apply(T* out, const T* in, std::int64_t N, std::int64_t S, std::int64_t heads, std::int64_t D,
                std::int64_t rotary_dim, std::int64_t stride, float theta, float sign, cudaStream_t stream,
                const char* what, std::int64_t pos0 = 0) {
  check_rope_args(N, S, heads, D, rotary_dim, theta, what, pos0);
  rope_row_work w = make_rope_row_work(heads, D, rotary_dim, stride, out != in);
  w.pos0 = pos0;
  const std::int64_t items = N * w.per_row();
  const launch_1d l = grid_stride_launch(items);
  if (l.grid == 0) return;
  rope_kernel<<<static_cast<unsigned>(l.grid), l.block, 0, stream>>>(out, in, items, S, w, theta, sign);
  MEMALG_CUDA_CHECK_LAUNCH("rope_kernel");
}

}  // namespace detail

// ---- dense [N, heads, D] -----------------------------------------------------------------------

/// out[N, heads, D] = RoPE(in); N = B·S rows, position n % S; out may alias in.
template <storage_type T>
void rope_forward(T* out, const T* in, std::int64_t N, std::int64_t S, std::int64_t heads, std::int64_t D,
                  std::int64_t rotary_dim, float theta = rope_default_theta, cudaStream_t stream = nullptr) {
  detail::rope_apply(out, in, N, S, heads, D, rotary_dim, heads * D, theta, 1.0f, stream, "rope_forward");
}

/// din[N, heads, D] written (transpose rotation of dout); din may alias dout.
template <storage_type T>
void rope_backward(T* din, const T* dout, std::int64_t N, std::int64_t S, std::int64_t heads, std::int64_t D,
                   std::int64_t rotary_dim, float theta = rope_default_theta, cudaStream_t stream = nullptr) {
  detail::rope_apply(din, dout, N, S, heads, D, rotary_dim, heads * D, theta, -1.0f, stream, "rope_backward");
}

// ---- fused qkv[N, (H + 2·Hkv)·D] of attention.cuh ---------------------------------------------

/// out[N, (H + 2Hkv)·D]: q and k heads rotated, v copied; position pos0 + n % sh.S (pos0: a
/// generation step's first position); out may alias qkv.
template <storage_type T>
void rope_qkv_forward(T* out, const T* qkv, const attention_shape& sh, std::int64_t rotary_dim,
                      float theta = rope_default_theta, cudaStream_t stream = nullptr, std::int64_t pos0 = 0) {
  detail::check_rope_qkv_shape(sh, "rope_qkv_forward");
  detail::rope_apply(out, qkv, sh.rows(), sh.S, sh.H + sh.Hkv, sh.D, rotary_dim, sh.qkv_width(), theta, 1.0f, stream,
                     "rope_qkv_forward", pos0);
}

/// dqkv_in[N, (H + 2Hkv)·D] written: dq and dk rotated back, dv copied; may alias dqkv_out.
template <storage_type T>
void rope_qkv_backward(T* dqkv_in, const T* dqkv_out, const attention_shape& sh, std::int64_t rotary_dim,
                       float theta = rope_default_theta, cudaStream_t stream = nullptr) {
  detail::check_rope_qkv_shape(sh, "rope_qkv_backward");
  detail::rope_apply(dqkv_in, dqkv_out, sh.rows(), sh.S, sh.H + sh.Hkv, sh.D, rotary_dim, sh.qkv_width(), theta,
                     -1.0f, stream, "rope_qkv_backward");
}

}  // namespace memalg::backend::cuda

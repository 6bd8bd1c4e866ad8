// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/cross_attention.cuh — cross-attention of decoder queries over encoder
// keys/values with a key mask, naive and flash-style; the CUDA twin of the cross_attention_*
// functions of backend/cpu/attention.hpp.
//
// Layouts: q[B·Sq, H·D] (decoder rows b·Sq + i), kv[B·Sk, 2·Hkv·D] = [k (Hkv heads) ‖ v (Hkv
// heads)] per encoder row b·Sk + j, out[B·Sq, H·D], att[B, H, Sq, Sk], lse[B, H, Sq]; query head
// h reads key/value head h / (H/Hkv); scale 1/√D; never causal; key_mask[B·Sk] (1 real, 0
// padding; null: all real). A query row without a real key gets out = 0, lse = −∞ and no
// gradient (as on the CPU).
//
// The kernels follow attention.cuh's (same warp and tile roles, same online softmax, the same
// deterministic split of the flash backward into a dQ kernel per query tile and a dK/dV kernel
// per key tile that sums its GQA group itself) and reuse its device helpers (tile loads, dot
// products, row dots, shared-memory set-up) and launch.cuh's tiling. They are separate kernels
// because the fused self-attention layout, the causal mask and the key mask enter their index
// arithmetic. Head width at most flash_max_head_dim (128) for flash, attention_max_head_dim (256)
// for naive; the naive backward needs a float scratch of cross_attention_naive_backward_scratch_bytes.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "memalg/backend/cuda/attention.cuh"
#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/reduce.cuh"

namespace memalg::backend::cuda {

struct cross_attention_shape {
  std::int64_t B = 0;    ///< batch
  std::int64_t Sq = 0;   ///< query (decoder) positions
  std::int64_t Sk = 0;   ///< key/value (encoder) positions
  std::int64_t H = 0;    ///< query heads
  std::int64_t Hkv = 0;  ///< key/value heads, H % Hkv == 0
  std::int64_t D = 0;    ///< head width

  MEMALG_HOST_DEVICE constexpr std::int64_t q_width() const noexcept { return H * D; }
  MEMALG_HOST_DEVICE constexpr std::int64_t kv_width() const noexcept { return 2 * Hkv * D; }
  MEMALG_HOST_DEVICE constexpr std::int64_t group() const noexcept { return H / Hkv; }
  MEMALG_HOST_DEVICE constexpr std::int64_t kv_head_of(std::int64_t h) const noexcept { return h / group(); }
  MEMALG_HOST_DEVICE constexpr bool valid() const noexcept {
    return B > 0 && Sq > 0 && Sk > 0 && H > 0 && Hkv > 0 && D > 0 && H % Hkv == 0;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t q_index(std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t d) const noexcept {
    return (b * Sq + i) * q_width() + h * D + d;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t k_index(std::int64_t b, std::int64_t j, std::int64_t hk, std::int64_t d) const noexcept {
    return (b * Sk + j) * kv_width() + hk * D + d;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t v_index(std::int64_t b, std::int64_t j, std::int64_t hk, std::int64_t d) const noexcept {
    return (b * Sk + j) * kv_width() + (Hkv + hk) * D + d;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t out_index(std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t d) const noexcept {
    return q_index(b, i, h, d);
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t stat_index(std::int64_t b, std::int64_t h, std::int64_t i) const noexcept {
    return (b * H + h) * Sq + i;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t att_index(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const noexcept {
    return stat_index(b, h, i) * Sk + j;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t stat_elements() const noexcept { return B * H * Sq; }
  MEMALG_HOST_DEVICE constexpr std::int64_t att_elements() const noexcept { return stat_elements() * Sk; }
};

constexpr std::size_t cross_attention_naive_backward_scratch_bytes(const cross_attention_shape& s) noexcept {
  return static_cast<std::size_t>(s.stat_elements()) * sizeof(float);
}

namespace detail {

__device__ __forceinline__ bool key_real(const std::uint8_t* key_mask, std::int64_t row) {
  return key_mask == nullptr || key_mask[row] != 0;
}

// ---- naive -------------------------------------------------------------------------------------

// One warp per (b, h, i), as naive_forward_kernel.
template <class T>
__global__ void __launch_bounds__(naive_warps * warp_size)
    cross_naive_forward_kernel(T* out, T* att, const T* q, const T* kv, const std::uint8_t* key_mask,
                               cross_attention_shape sh, float scale) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * naive_warps + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (r >= sh.stat_elements()) return;
  const std::int64_t i = r % sh.Sq;
  const std::int64_t h = (r / sh.Sq) % sh.H;
  const std::int64_t b = r / (sh.Sq * sh.H);
  const std::int64_t hk = sh.kv_head_of(h);
  const T* qi = q + sh.q_index(b, i, h, 0);
  softmax_stats st = softmax_empty();
  for (std::int64_t j = lane; j < sh.Sk; j += warp_size)
    if (key_real(key_mask, b * sh.Sk + j)) st = softmax_push(st, dot_global(qi, kv + sh.k_index(b, j, hk, 0), sh.D) * scale);
  st = warp_softmax(st);
  const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
  T* row = att != nullptr ? att + sh.att_index(b, h, i, 0) : nullptr;
  float o[naive_dpl];
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) o[t] = 0.0f;
  for (std::int64_t j0 = 0; j0 < sh.Sk; j0 += warp_size) {
    const std::int64_t j = j0 + lane;
    float p = 0.0f;
    if (j < sh.Sk && key_real(key_mask, b * sh.Sk + j))
      p = expf(dot_global(qi, kv + sh.k_index(b, j, hk, 0), sh.D) * scale - st.m) * inv;
    if (row != nullptr && j < sh.Sk) row[j] = from_float<T>(p);
    const int count = static_cast<int>(min_i64(warp_size, sh.Sk - j0));
    for (int jj = 0; jj < count; ++jj) {
      const float pj = __shfl_sync(full_warp_mask, p, jj);
      if (pj == 0.0f) continue;  // uniform over the warp: a padded key
      const T* v = kv + sh.v_index(b, j0 + jj, hk, 0);
#pragma unroll
      for (int t = 0; t < naive_dpl; ++t) {
        const std::int64_t d = lane + t * warp_size;
        if (d < sh.D) o[t] += pj * to_float(v[d]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) {
    const std::int64_t d = lane + t * warp_size;
    if (d < sh.D) out[sh.out_index(b, i, h, d)] = from_float<T>(o[t]);
  }
}

// One warp per (b, h, i): ρ_i = Σ_j p_ij (dO_i·v_j) saved, dq_i = scale·Σ_j p_ij (dO_i·v_j − ρ_i) k_j.
template <class T>
__global__ void __launch_bounds__(naive_warps * warp_size)
    cross_naive_backward_q_kernel(T* dq, float* row_dots, const T* dout, const T* q, const T* kv, const T* att,
                                  const std::uint8_t* key_mask, cross_attention_shape sh, float scale) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * naive_warps + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (r >= sh.stat_elements()) return;
  const std::int64_t i = r % sh.Sq;
  const std::int64_t h = (r / sh.Sq) % sh.H;
  const std::int64_t b = r / (sh.Sq * sh.H);
  const std::int64_t hk = sh.kv_head_of(h);
  const T* d_o = dout + sh.out_index(b, i, h, 0);
  const T* row = att + sh.att_index(b, h, i, 0);
  float rho = 0.0f;
  for (std::int64_t j = lane; j < sh.Sk; j += warp_size)
    if (key_real(key_mask, b * sh.Sk + j)) rho += to_float(row[j]) * dot_global(d_o, kv + sh.v_index(b, j, hk, 0), sh.D);
  rho = warp_sum(rho);
  if (lane == 0) row_dots[r] = rho;
  float acc[naive_dpl];
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) acc[t] = 0.0f;
  for (std::int64_t j0 = 0; j0 < sh.Sk; j0 += warp_size) {
    const std::int64_t j = j0 + lane;
    float ds = 0.0f;
    if (j < sh.Sk && key_real(key_mask, b * sh.Sk + j))
      ds = to_float(row[j]) * (dot_global(d_o, kv + sh.v_index(b, j, hk, 0), sh.D) - rho);
    const int count = static_cast<int>(min_i64(warp_size, sh.Sk - j0));
    for (int jj = 0; jj < count; ++jj) {
      const float dsj = __shfl_sync(full_warp_mask, ds, jj);
      const T* k = kv + sh.k_index(b, j0 + jj, hk, 0);
#pragma unroll
      for (int t = 0; t < naive_dpl; ++t) {
        const std::int64_t d = lane + t * warp_size;
        if (d < sh.D) acc[t] += dsj * to_float(k[d]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) {
    const std::int64_t d = lane + t * warp_size;
    if (d < sh.D) dq[sh.q_index(b, i, h, d)] = from_float<T>(scale * acc[t]);
  }
}

// One warp per (b, hk, j): dk_j = scale·Σ_{h∈group} Σ_i p_ij (dO_i·v_j − ρ_i) q_i, dv_j = Σ Σ p_ij dO_i
// (zero for a padded key: its probabilities are zero).
template <class T>
__global__ void __launch_bounds__(naive_warps * warp_size)
    cross_naive_backward_kv_kernel(T* dkv, const float* row_dots, const T* dout, const T* q, const T* kv, const T* att,
                                   const std::uint8_t* key_mask, cross_attention_shape sh, float scale) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * naive_warps + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (r >= sh.B * sh.Hkv * sh.Sk) return;
  const std::int64_t j = r % sh.Sk;
  const std::int64_t hk = (r / sh.Sk) % sh.Hkv;
  const std::int64_t b = r / (sh.Sk * sh.Hkv);
  const T* v = kv + sh.v_index(b, j, hk, 0);
  float dk[naive_dpl];
  float dv[naive_dpl];
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) dk[t] = dv[t] = 0.0f;
  if (key_real(key_mask, b * sh.Sk + j)) {
    for (std::int64_t h = hk * sh.group(); h < (hk + 1) * sh.group(); ++h) {
      for (std::int64_t i0 = 0; i0 < sh.Sq; i0 += warp_size) {
        const std::int64_t i = i0 + lane;
        float p = 0.0f;
        float ds = 0.0f;
        if (i < sh.Sq) {
          p = to_float(att[sh.att_index(b, h, i, j)]);
          ds = p * (dot_global(dout + sh.out_index(b, i, h, 0), v, sh.D) - row_dots[sh.stat_index(b, h, i)]);
        }
        const int count = static_cast<int>(min_i64(warp_size, sh.Sq - i0));
        for (int ii = 0; ii < count; ++ii) {
          const float pi = __shfl_sync(full_warp_mask, p, ii);
          const float dsi = __shfl_sync(full_warp_mask, ds, ii);
          const T* d_o = dout + sh.out_index(b, i0 + ii, h, 0);
          const T* qi = q + sh.q_index(b, i0 + ii, h, 0);
#pragma unroll
          for (int t = 0; t < naive_dpl; ++t) {
            const std::int64_t d = lane + t * warp_size;
            if (d < sh.D) {
              dv[t] += pi * to_float(d_o[d]);
              dk[t] += dsi * to_float(qi[d]);
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) {
    const std::int64_t d = lane + t * warp_size;
    if (d < sh.D) {
      dkv[sh.k_index(b, j, hk, d)] = from_float<T>(scale * dk[t]);
      dkv[sh.v_index(b, j, hk, d)] = from_float<T>(dv[t]);
    }
  }
}

// ---- flash -------------------------------------------------------------------------------------

// Block (q tile, h, b). Warp w owns query row w of the tile; lane j owns key j of the key tile.
template <class T>
__global__ void __launch_bounds__(flash_threads)
    cross_flash_forward_kernel(T* out, float* lse, const T* q, const T* kv, const std::uint8_t* key_mask,
                               cross_attention_shape sh, float scale) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(sh.D);
  const int ld = static_cast<int>(flash_smem_stride(hd));
  float* qs = smem;
  float* ks = qs + flash_br * ld;
  float* vs = ks + flash_bc * ld;
  const std::int64_t qt = blockIdx.x;
  const std::int64_t h = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const std::int64_t hk = sh.kv_head_of(h);
  const int ri = threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  const std::int64_t q0 = qt * flash_br;
  const std::int64_t qpos = q0 + ri;
  load_tile(qs, q + sh.q_index(b, 0, h, 0), sh.q_width(), q0, sh.Sq, hd);

  float m = -INFINITY;
  float l = 0.0f;
  float o[flash_dpl];
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) o[t] = 0.0f;

  const std::int64_t kv_end = flash_kv_tiles(sh.Sk);
  for (std::int64_t kt = 0; kt < kv_end; ++kt) {
    const std::int64_t k0 = kt * flash_bc;
    __syncthreads();
    load_tile(ks, kv + sh.k_index(b, 0, hk, 0), sh.kv_width(), k0, sh.Sk, hd);
    load_tile(vs, kv + sh.v_index(b, 0, hk, 0), sh.kv_width(), k0, sh.Sk, hd);
    __syncthreads();
    if (qpos >= sh.Sq) continue;
    const std::int64_t kpos = k0 + lane;
    const bool valid = kpos < sh.Sk && key_real(key_mask, b * sh.Sk + kpos);
    const float sc = valid ? dot_shared(qs + ri * ld, ks + lane * ld, hd) * scale : -INFINITY;
    const float m_new = fmaxf(m, warp_max(sc));
    if (m_new == -INFINITY) continue;  // no real key in this tile yet
    const float p = valid ? expf(sc - m_new) : 0.0f;
    const float alpha = expf(m - m_new);
    l = l * alpha + warp_sum(p);
    m = m_new;
#pragma unroll
    for (int t = 0; t < flash_dpl; ++t) o[t] *= alpha;
    for (int jj = 0; jj < flash_bc; ++jj) {
      const float pj = __shfl_sync(full_warp_mask, p, jj);
      const float* vrow = vs + jj * ld;
#pragma unroll
      for (int t = 0; t < flash_dpl; ++t) {
        const int d = lane + t * warp_size;
        if (d < hd) o[t] += pj * vrow[d];
      }
    }
  }

  if (qpos >= sh.Sq) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) {
    const int d = lane + t * warp_size;
    if (d < hd) out[sh.out_index(b, qpos, h, d)] = from_float<T>(o[t] * inv);
  }
  if (lane == 0 && lse != nullptr) lse[sh.stat_index(b, h, qpos)] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// dQ: block (q tile, h, b); warp w owns query row w; lane j owns key j of the key tile.
template <class T>
__global__ void __launch_bounds__(flash_threads)
    cross_flash_backward_dq_kernel(T* dq, const T* dout, const T* q, const T* kv, const T* out, const float* lse,
                                   const std::uint8_t* key_mask, cross_attention_shape sh, float scale) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(sh.D);
  const int ld = static_cast<int>(flash_smem_stride(hd));
  float* qs = smem;
  float* dos = qs + flash_br * ld;
  float* ks = dos + flash_br * ld;
  float* vs = ks + flash_bc * ld;
  const std::int64_t qt = blockIdx.x;
  const std::int64_t h = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const std::int64_t hk = sh.kv_head_of(h);
  const int ri = threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  const std::int64_t q0 = qt * flash_br;
  const std::int64_t qpos = q0 + ri;
  load_tile(qs, q + sh.q_index(b, 0, h, 0), sh.q_width(), q0, sh.Sq, hd);
  load_tile(dos, dout + sh.out_index(b, 0, h, 0), sh.q_width(), q0, sh.Sq, hd);
  float rho = 0.0f;
  float row_lse = -INFINITY;
  if (qpos < sh.Sq) {
    rho = row_dot_warp(dout + sh.out_index(b, qpos, h, 0), out + sh.out_index(b, qpos, h, 0), hd, lane);
    row_lse = lse[sh.stat_index(b, h, qpos)];
  }

  float acc[flash_dpl];
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) acc[t] = 0.0f;

  const std::int64_t kv_end = flash_kv_tiles(sh.Sk);
  for (std::int64_t kt = 0; kt < kv_end; ++kt) {
    const std::int64_t k0 = kt * flash_bc;
    __syncthreads();
    load_tile(ks, kv + sh.k_index(b, 0, hk, 0), sh.kv_width(), k0, sh.Sk, hd);
    load_tile(vs, kv + sh.v_index(b, 0, hk, 0), sh.kv_width(), k0, sh.Sk, hd);
    __syncthreads();
    if (qpos >= sh.Sq || row_lse == -INFINITY) continue;  // uniform over the warp
    const std::int64_t kpos = k0 + lane;
    float ds = 0.0f;
    if (kpos < sh.Sk && key_real(key_mask, b * sh.Sk + kpos)) {
      const float p = expf(dot_shared(qs + ri * ld, ks + lane * ld, hd) * scale - row_lse);
      const float dp = dot_shared(dos + ri * ld, vs + lane * ld, hd);
      ds = p * (dp - rho);
    }
    for (int jj = 0; jj < flash_bc; ++jj) {
      const float dsj = __shfl_sync(full_warp_mask, ds, jj);
      const float* krow = ks + jj * ld;
#pragma unroll
      for (int t = 0; t < flash_dpl; ++t) {
        const int d = lane + t * warp_size;
        if (d < hd) acc[t] += dsj * krow[d];
      }
    }
  }

  if (qpos >= sh.Sq) return;
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) {
    const int d = lane + t * warp_size;
    if (d < hd) dq[sh.q_index(b, qpos, h, d)] = from_float<T>(scale * acc[t]);
  }
}

// dK, dV: block (key tile, hk, b); warp w owns key row w; lane i owns query i of the query tile;
// loops over the query heads of the group and every query tile.
template <class T>
__global__ void __launch_bounds__(flash_threads)
    cross_flash_backward_dkv_kernel(T* dkv, const T* dout, const T* q, const T* kv, const T* out, const float* lse,
                                    const std::uint8_t* key_mask, cross_attention_shape sh, float scale) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(sh.D);
  const int ld = static_cast<int>(flash_smem_stride(hd));
  float* ks = smem;
  float* vs = ks + flash_bc * ld;
  float* qs = vs + flash_bc * ld;
  float* dos = qs + flash_br * ld;
  float* lse_s = dos + flash_br * ld;
  float* rho_s = lse_s + flash_br;
  const std::int64_t kt = blockIdx.x;
  const std::int64_t hk = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int rj = threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  const std::int64_t k0 = kt * flash_bc;
  const std::int64_t kpos = k0 + rj;
  const bool key_ok = kpos < sh.Sk && key_real(key_mask, b * sh.Sk + kpos);
  load_tile(ks, kv + sh.k_index(b, 0, hk, 0), sh.kv_width(), k0, sh.Sk, hd);
  load_tile(vs, kv + sh.v_index(b, 0, hk, 0), sh.kv_width(), k0, sh.Sk, hd);

  float dk[flash_dpl];
  float dv[flash_dpl];
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) dk[t] = dv[t] = 0.0f;

  const std::int64_t q_tiles = flash_q_tiles(sh.Sq);
  for (std::int64_t h = hk * sh.group(); h < (hk + 1) * sh.group(); ++h) {
    for (std::int64_t qt = 0; qt < q_tiles; ++qt) {
      const std::int64_t q0 = qt * flash_br;
      __syncthreads();
      load_tile(qs, q + sh.q_index(b, 0, h, 0), sh.q_width(), q0, sh.Sq, hd);
      load_tile(dos, dout + sh.out_index(b, 0, h, 0), sh.q_width(), q0, sh.Sq, hd);
      {
        const std::int64_t qrow = q0 + rj;
        float rho = 0.0f;
        float row_lse = -INFINITY;
        if (qrow < sh.Sq) {
          rho = row_dot_warp(dout + sh.out_index(b, qrow, h, 0), out + sh.out_index(b, qrow, h, 0), hd, lane);
          row_lse = lse[sh.stat_index(b, h, qrow)];
        }
        if (lane == 0) {
          rho_s[rj] = rho;
          lse_s[rj] = row_lse;
        }
      }
      __syncthreads();
      if (!key_ok) continue;  // uniform over the warp
      const std::int64_t qpos = q0 + lane;
      float p = 0.0f;
      float ds = 0.0f;
      if (qpos < sh.Sq && lse_s[lane] != -INFINITY) {
        p = expf(dot_shared(qs + lane * ld, ks + rj * ld, hd) * scale - lse_s[lane]);
        const float dp = dot_shared(dos + lane * ld, vs + rj * ld, hd);
        ds = p * (dp - rho_s[lane]);
      }
      for (int ii = 0; ii < flash_br; ++ii) {
        const float pi = __shfl_sync(full_warp_mask, p, ii);
        const float dsi = __shfl_sync(full_warp_mask, ds, ii);
        const float* dorow = dos + ii * ld;
        const float* qrow = qs + ii * ld;
#pragma unroll
        for (int t = 0; t < flash_dpl; ++t) {
          const int d = lane + t * warp_size;
          if (d < hd) {
            dv[t] += pi * dorow[d];
            dk[t] += dsi * qrow[d];
          }
        }
      }
    }
  }

  if (kpos >= sh.Sk) return;
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) {
    const int d = lane + t * warp_size;
    if (d < hd) {
      dkv[sh.k_index(b, kpos, hk, d)] = from_float<T>(scale * dk[t]);
      dkv[sh.v_index(b, kpos, hk, d)] = from_float<T>(dv[t]);
    }
  }
}

inline void check_cross_attention_shape(const cross_attention_shape& sh, int max_head_dim, const char* what) {
  if (!sh.valid()) throw std::invalid_argument(std::string(what) + ": invalid shape (need positive sizes, H % Hkv == 0)");
  if (sh.D > max_head_dim)
    throw std::invalid_argument(std::string(what) + ": head_dim " + std::to_string(sh.D) + " exceeds " +
                                std::to_string(max_head_dim));
  if (flash_q_tiles(sh.Sq) > 2147483647LL || flash_kv_tiles(sh.Sk) > 2147483647LL || sh.H > max_grid_yz ||
      sh.B > max_grid_yz)
    throw std::invalid_argument(std::string(what) + ": grid too large");
}

}  // namespace detail

/// out[B·Sq, H·D] and att[B, H, Sq, Sk] (probabilities in T; may be null) from q, kv and the key mask.
template <storage_type T>
void cross_attention_naive_forward(T* out, T* att, const T* q, const T* kv, const std::uint8_t* key_mask,
                                   const cross_attention_shape& sh, cudaStream_t stream = nullptr) {
  detail::check_cross_attention_shape(sh, attention_max_head_dim, "cross_attention_naive_forward");
  const unsigned blocks = static_cast<unsigned>(ceil_div(sh.stat_elements(), detail::naive_warps));
  detail::cross_naive_forward_kernel<<<blocks, detail::naive_warps * warp_size, 0, stream>>>(
      out, att, q, kv, key_mask, sh, attention_scale(sh.D));
  MEMALG_CUDA_CHECK_LAUNCH("cross_naive_forward_kernel");
}

/// dq, dkv (=) from dout and the saved att; `scratch` holds cross_attention_naive_backward_scratch_bytes.
template <storage_type T>
void cross_attention_naive_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* att,
                                    const std::uint8_t* key_mask, const cross_attention_shape& sh, float* scratch,
                                    cudaStream_t stream = nullptr) {
  detail::check_cross_attention_shape(sh, attention_max_head_dim, "cross_attention_naive_backward");
  if (scratch == nullptr) throw std::invalid_argument("cross_attention_naive_backward: scratch is null");
  const float scale = attention_scale(sh.D);
  const unsigned q_blocks = static_cast<unsigned>(ceil_div(sh.stat_elements(), detail::naive_warps));
  detail::cross_naive_backward_q_kernel<<<q_blocks, detail::naive_warps * warp_size, 0, stream>>>(
      dq, scratch, dout, q, kv, att, key_mask, sh, scale);
  MEMALG_CUDA_CHECK_LAUNCH("cross_naive_backward_q_kernel");
  const unsigned kv_blocks = static_cast<unsigned>(ceil_div(sh.B * sh.Hkv * sh.Sk, detail::naive_warps));
  detail::cross_naive_backward_kv_kernel<<<kv_blocks, detail::naive_warps * warp_size, 0, stream>>>(
      dkv, scratch, dout, q, kv, att, key_mask, sh, scale);
  MEMALG_CUDA_CHECK_LAUNCH("cross_naive_backward_kv_kernel");
}

/// out[B·Sq, H·D] and lse[B, H, Sq] (float; may be null: no backward follows) from q, kv and the key mask.
template <storage_type T>
void cross_attention_flash_forward(T* out, float* lse, const T* q, const T* kv, const std::uint8_t* key_mask,
                                   const cross_attention_shape& sh, cudaStream_t stream = nullptr) {
  detail::check_cross_attention_shape(sh, flash_max_head_dim, "cross_attention_flash_forward");
  const std::size_t smem = flash_forward_smem_bytes(sh.D);
  detail::prepare_dynamic_smem(detail::cross_flash_forward_kernel<T>, smem, "cross_attention_flash_forward");
  const dim3 grid(static_cast<unsigned>(flash_q_tiles(sh.Sq)), static_cast<unsigned>(sh.H),
                  static_cast<unsigned>(sh.B));
  detail::cross_flash_forward_kernel<T><<<grid, flash_threads, smem, stream>>>(out, lse, q, kv, key_mask, sh,
                                                                              attention_scale(sh.D));
  MEMALG_CUDA_CHECK_LAUNCH("cross_flash_forward_kernel");
}

/// dq, dkv (=) from dout, q, kv and the forward's out and lse.
template <storage_type T>
void cross_attention_flash_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* out,
                                    const float* lse, const std::uint8_t* key_mask, const cross_attention_shape& sh,
                                    cudaStream_t stream = nullptr) {
  detail::check_cross_attention_shape(sh, flash_max_head_dim, "cross_attention_flash_backward");
  const std::size_t smem = flash_backward_smem_bytes(sh.D);
  const float scale = attention_scale(sh.D);
  detail::prepare_dynamic_smem(detail::cross_flash_backward_dq_kernel<T>, smem, "cross_attention_flash_backward");
  detail::prepare_dynamic_smem(detail::cross_flash_backward_dkv_kernel<T>, smem, "cross_attention_flash_backward");
  const dim3 q_grid(static_cast<unsigned>(flash_q_tiles(sh.Sq)), static_cast<unsigned>(sh.H),
                    static_cast<unsigned>(sh.B));
  detail::cross_flash_backward_dq_kernel<T><<<q_grid, flash_threads, smem, stream>>>(dq, dout, q, kv, out, lse,
                                                                                    key_mask, sh, scale);
  MEMALG_CUDA_CHECK_LAUNCH("cross_flash_backward_dq_kernel");
  const dim3 kv_grid(static_cast<unsigned>(flash_kv_tiles(sh.Sk)), static_cast<unsigned>(sh.Hkv),
                     static_cast<unsigned>(sh.B));
  detail::cross_flash_backward_dkv_kernel<T><<<kv_grid, flash_threads, smem, stream>>>(dkv, dout, q, kv, out, lse,
                                                                                      key_mask, sh, scale);
  MEMALG_CUDA_CHECK_LAUNCH("cross_flash_backward_dkv_kernel");
}

}  // namespace memalg::backend::cuda

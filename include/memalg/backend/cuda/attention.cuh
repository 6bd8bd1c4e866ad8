// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/attention.cuh — multi-head attention with GQA, naive and flash-style.
//
// Layouts (launch.cuh: attention_shape, the same fields as the CPU backend's): qkv[N,(H+2Hkv)·D]
// = [q ‖ k ‖ v] with token row n = b·S + i, out[N,H·D], att[B,H,S,S], lse[B,H,S]; query head h
// reads key/value head h / (H/Hkv); scale 1/√D; causal when sh.causal.
//
// naive:  forward writes the probabilities att (T; zero above the diagonal when causal) and
//         out = P·v (from the float probabilities, before rounding); backward (dqkv =) reads att and needs a float scratch of b·H·s row dots
//         (attention_naive_backward_scratch_bytes).
// flash:  forward keeps tiles of q, k, v in shared memory with an online softmax and saves only
//         lse (float); backward recomputes the probabilities from lse in two deterministic
//         kernels, one per query tile for dQ and one per key tile for dK and dV (summing the
//         query heads of its GQA group itself, so no atomics). Needs out and dout: the row dots
//         Σ_d dO·O are computed in both kernels with the same code, hence the same bits.
//
// The flash kernels are scalar (no tensor cores): they reproduce the memory behaviour of flash
// attention (O(s) saved state, O(tile) working set) with float accumulation, and are checked
// against the CPU reference. Head width is limited to flash_max_head_dim (128) for flash and
// attention_max_head_dim (256) for naive.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/device.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/reduce.cuh"

namespace memalg::backend::cuda {

/// Float scratch of the naive backward pass: one row dot per (b, h, i).
constexpr std::size_t attention_naive_backward_scratch_bytes(const attention_shape& s) noexcept {
  return static_cast<std::size_t>(s.stat_elements()) * sizeof(float);
}

/// The softmax scale 1/√D, computed the same way on every backend.
inline float attention_scale(std::int64_t head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

namespace detail {

inline constexpr int naive_warps = 8;
inline constexpr int naive_dpl = attention_max_head_dim / warp_size;  // head-dim elements per lane
inline constexpr int flash_dpl = flash_max_head_dim / warp_size;
static_assert(flash_bc == warp_size && flash_br == warp_size && flash_warps == flash_br,
              "one warp per tile row, one lane per row of the other tile");

template <class T>
__device__ __forceinline__ float dot_global(const T* a, const T* b, std::int64_t n) {
  float s = 0.0f;
  for (std::int64_t d = 0; d < n; ++d) s += to_float(a[d]) * to_float(b[d]);
  return s;
}

__device__ __forceinline__ float dot_shared(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

/// Σ_d dO[d]·O[d] of one row by the whole warp (same code in both flash backward kernels).
template <class T>
__device__ __forceinline__ float row_dot_warp(const T* dout_row, const T* out_row, int head_dim, int lane) {
  float s = 0.0f;
  for (int d = lane; d < head_dim; d += warp_size) s += to_float(dout_row[d]) * to_float(out_row[d]);
  return warp_sum(s);
}

// ---- naive -------------------------------------------------------------------------------------

// One warp per (b, h, i): softmax statistics over the scores; then, 32 keys at a time, lane j
// writes probability p_j to att while the warp (lanes over the head dimension) accumulates
// out = Σ_j p_j v_j from the float probabilities (as the CPU reference does).
template <class T>
__global__ void __launch_bounds__(naive_warps * warp_size)
    naive_forward_kernel(T* out, T* att, const T* qkv, attention_shape sh, float scale) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * naive_warps + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (r >= sh.stat_elements()) return;  // whole warps leave together
  const std::int64_t i = r % sh.S;
  const std::int64_t h = (r / sh.S) % sh.H;
  const std::int64_t b = r / (sh.S * sh.H);
  const std::int64_t hk = sh.kv_head_of(h);
  const std::int64_t end = sh.keys(i);
  const T* q = qkv + sh.q_index(b, i, h, 0);
  softmax_stats st = softmax_empty();
  for (std::int64_t j = lane; j < end; j += warp_size)
    st = softmax_push(st, dot_global(q, qkv + sh.k_index(b, j, hk, 0), sh.D) * scale);
  st = warp_softmax(st);
  const float inv = 1.0f / st.l;
  T* row = att + sh.att_index(b, h, i, 0);
  float o[naive_dpl];
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) o[t] = 0.0f;
  for (std::int64_t j0 = 0; j0 < sh.S; j0 += warp_size) {
    const std::int64_t j = j0 + lane;
    float p = 0.0f;
    if (j < end) p = expf(dot_global(q, qkv + sh.k_index(b, j, hk, 0), sh.D) * scale - st.m) * inv;
    if (j < sh.S) row[j] = from_float<T>(p);
    const int count = static_cast<int>(min_i64(warp_size, end - j0));  // ≤ 0 past the last key
    for (int jj = 0; jj < count; ++jj) {
      const float pj = __shfl_sync(full_warp_mask, p, jj);
      const T* v = qkv + sh.v_index(b, j0 + jj, hk, 0);
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

// One warp per (b, h, i): row dot ρ_i = Σ_j p_ij (dO_i·v_j), saved, then
// dq_i = scale·Σ_j p_ij (dO_i·v_j − ρ_i) k_j.
template <class T>
__global__ void __launch_bounds__(naive_warps * warp_size)
    naive_backward_q_kernel(T* dqkv, float* row_dots, const T* dout, const T* qkv, const T* att, attention_shape sh,
                            float scale) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * naive_warps + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (r >= sh.stat_elements()) return;
  const std::int64_t i = r % sh.S;
  const std::int64_t h = (r / sh.S) % sh.H;
  const std::int64_t b = r / (sh.S * sh.H);
  const std::int64_t hk = sh.kv_head_of(h);
  const std::int64_t end = sh.keys(i);
  const T* d_o = dout + sh.out_index(b, i, h, 0);
  const T* row = att + sh.att_index(b, h, i, 0);
  float rho = 0.0f;
  for (std::int64_t j = lane; j < end; j += warp_size)
    rho += to_float(row[j]) * dot_global(d_o, qkv + sh.v_index(b, j, hk, 0), sh.D);
  rho = warp_sum(rho);
  if (lane == 0) row_dots[r] = rho;
  float dq[naive_dpl];
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) dq[t] = 0.0f;
  for (std::int64_t j0 = 0; j0 < end; j0 += warp_size) {
    const std::int64_t j = j0 + lane;
    float ds = 0.0f;
    if (j < end) ds = to_float(row[j]) * (dot_global(d_o, qkv + sh.v_index(b, j, hk, 0), sh.D) - rho);
    const int count = static_cast<int>(min_i64(warp_size, end - j0));
    for (int jj = 0; jj < count; ++jj) {
      const float dsj = __shfl_sync(full_warp_mask, ds, jj);
      const T* k = qkv + sh.k_index(b, j0 + jj, hk, 0);
#pragma unroll
      for (int t = 0; t < naive_dpl; ++t) {
        const std::int64_t d = lane + t * warp_size;
        if (d < sh.D) dq[t] += dsj * to_float(k[d]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) {
    const std::int64_t d = lane + t * warp_size;
    if (d < sh.D) dqkv[sh.q_index(b, i, h, d)] = from_float<T>(scale * dq[t]);
  }
}

// One warp per (b, hk, j): dk_j = scale·Σ_{h∈group} Σ_i p_ij (dO_i·v_j − ρ_i) q_i,
// dv_j = Σ_{h∈group} Σ_i p_ij dO_i.
template <class T>
__global__ void __launch_bounds__(naive_warps * warp_size)
    naive_backward_kv_kernel(T* dqkv, const float* row_dots, const T* dout, const T* qkv, const T* att,
                             attention_shape sh, float scale) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * naive_warps + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (r >= sh.B * sh.Hkv * sh.S) return;
  const std::int64_t j = r % sh.S;
  const std::int64_t hk = (r / sh.S) % sh.Hkv;
  const std::int64_t b = r / (sh.S * sh.Hkv);
  const T* v = qkv + sh.v_index(b, j, hk, 0);
  float dk[naive_dpl];
  float dv[naive_dpl];
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) dk[t] = dv[t] = 0.0f;
  const std::int64_t first = sh.causal ? j : 0;  // queries that attend to key j
  for (std::int64_t h = hk * sh.group(); h < (hk + 1) * sh.group(); ++h) {
    for (std::int64_t i0 = first; i0 < sh.S; i0 += warp_size) {
      const std::int64_t i = i0 + lane;
      float p = 0.0f;
      float ds = 0.0f;
      if (i < sh.S) {
        p = to_float(att[sh.att_index(b, h, i, j)]);
        ds = p * (dot_global(dout + sh.out_index(b, i, h, 0), v, sh.D) - row_dots[sh.stat_index(b, h, i)]);
      }
      const int count = static_cast<int>(min_i64(warp_size, sh.S - i0));
      for (int ii = 0; ii < count; ++ii) {
        const float pi = __shfl_sync(full_warp_mask, p, ii);
        const float dsi = __shfl_sync(full_warp_mask, ds, ii);
        const T* d_o = dout + sh.out_index(b, i0 + ii, h, 0);
        const T* q = qkv + sh.q_index(b, i0 + ii, h, 0);
#pragma unroll
        for (int t = 0; t < naive_dpl; ++t) {
          const std::int64_t d = lane + t * warp_size;
          if (d < sh.D) {
            dv[t] += pi * to_float(d_o[d]);
            dk[t] += dsi * to_float(q[d]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) {
    const std::int64_t d = lane + t * warp_size;
    if (d < sh.D) {
      dqkv[sh.k_index(b, j, hk, d)] = from_float<T>(scale * dk[t]);
      dqkv[sh.v_index(b, j, hk, d)] = from_float<T>(dv[t]);
    }
  }
}

// ---- flash -------------------------------------------------------------------------------------

// Loads rows [row0, row0 + 32) of one head (element (row, d) at src + row·stride + d) into a
// padded float tile; rows past seq become zeros.
template <class T>
__device__ __forceinline__ void load_tile(float* tile, const T* src, std::int64_t stride, std::int64_t row0,
                                          std::int64_t seq, int head_dim) {
  const int ld = static_cast<int>(flash_smem_stride(head_dim));
  for (int e = threadIdx.x; e < warp_size * head_dim; e += blockDim.x) {
    const int r = e / head_dim;
    const int d = e - r * head_dim;
    const std::int64_t row = row0 + r;
    tile[r * ld + d] = row < seq ? to_float(src[row * stride + d]) : 0.0f;
  }
}

// Block (q tile, h, b). Warp w owns query row w of the tile; lane j owns key j of the key tile.
template <class T>
__global__ void __launch_bounds__(flash_threads)
    flash_forward_kernel(T* out, float* lse, const T* qkv, attention_shape sh, float scale) {
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
  const std::int64_t stride = sh.qkv_width();
  load_tile(qs, qkv + sh.q_index(b, 0, h, 0), stride, q0, sh.S, hd);

  float m = -INFINITY;
  float l = 0.0f;
  float o[flash_dpl];
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) o[t] = 0.0f;

  const std::int64_t kv_end = flash_kv_tile_end(qt, sh.S, sh.causal);
  for (std::int64_t kt = 0; kt < kv_end; ++kt) {
    const std::int64_t k0 = kt * flash_bc;
    __syncthreads();  // previous tile fully consumed
    load_tile(ks, qkv + sh.k_index(b, 0, hk, 0), stride, k0, sh.S, hd);
    load_tile(vs, qkv + sh.v_index(b, 0, hk, 0), stride, k0, sh.S, hd);
    __syncthreads();
    if (qpos >= sh.S) continue;  // uniform over the warp; the barriers above stay matched
    const std::int64_t kpos = k0 + lane;
    const bool valid = kpos < sh.S && attends(qpos, kpos, sh.causal);
    const float sc = valid ? dot_shared(qs + ri * ld, ks + lane * ld, hd) * scale : -INFINITY;
    const float m_new = fmaxf(m, warp_max(sc));
    if (m_new == -INFINITY) continue;  // no key of this tile visible to the row
    const float p = valid ? expf(sc - m_new) : 0.0f;
    const float alpha = expf(m - m_new);  // 0 while m is still −∞
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

  if (qpos >= sh.S) return;
  const float inv = 1.0f / l;
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) {
    const int d = lane + t * warp_size;
    if (d < hd) out[sh.out_index(b, qpos, h, d)] = from_float<T>(o[t] * inv);
  }
  if (lane == 0) lse[sh.stat_index(b, h, qpos)] = m + logf(l);
}

// dQ: block (q tile, h, b); warp w owns query row w of the tile; lane j owns key j of the key tile.
template <class T>
__global__ void __launch_bounds__(flash_threads)
    flash_backward_dq_kernel(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                             attention_shape sh, float scale) {
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
  const std::int64_t stride = sh.qkv_width();
  load_tile(qs, qkv + sh.q_index(b, 0, h, 0), stride, q0, sh.S, hd);
  load_tile(dos, dout + sh.out_index(b, 0, h, 0), sh.out_width(), q0, sh.S, hd);
  float rho = 0.0f;
  float row_lse = 0.0f;
  if (qpos < sh.S) {
    rho = row_dot_warp(dout + sh.out_index(b, qpos, h, 0), out + sh.out_index(b, qpos, h, 0), hd, lane);
    row_lse = lse[sh.stat_index(b, h, qpos)];
  }

  float dq[flash_dpl];
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) dq[t] = 0.0f;

  const std::int64_t kv_end = flash_kv_tile_end(qt, sh.S, sh.causal);
  for (std::int64_t kt = 0; kt < kv_end; ++kt) {
    const std::int64_t k0 = kt * flash_bc;
    __syncthreads();
    load_tile(ks, qkv + sh.k_index(b, 0, hk, 0), stride, k0, sh.S, hd);
    load_tile(vs, qkv + sh.v_index(b, 0, hk, 0), stride, k0, sh.S, hd);
    __syncthreads();
    if (qpos >= sh.S) continue;
    const std::int64_t kpos = k0 + lane;
    float ds = 0.0f;
    if (kpos < sh.S && attends(qpos, kpos, sh.causal)) {
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
        if (d < hd) dq[t] += dsj * krow[d];
      }
    }
  }

  if (qpos >= sh.S) return;
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) {
    const int d = lane + t * warp_size;
    if (d < hd) dqkv[sh.q_index(b, qpos, h, d)] = from_float<T>(scale * dq[t]);
  }
}

// dK, dV: block (key tile, hk, b); warp w owns key row w of the tile; lane i owns query i of the
// query tile. Loops over the query heads of the group and the query tiles that see the key tile.
template <class T>
__global__ void __launch_bounds__(flash_threads)
    flash_backward_dkv_kernel(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                              attention_shape sh, float scale) {
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
  const std::int64_t stride = sh.qkv_width();
  load_tile(ks, qkv + sh.k_index(b, 0, hk, 0), stride, k0, sh.S, hd);
  load_tile(vs, qkv + sh.v_index(b, 0, hk, 0), stride, k0, sh.S, hd);

  float dk[flash_dpl];
  float dv[flash_dpl];
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) dk[t] = dv[t] = 0.0f;

  const std::int64_t q_tiles = flash_q_tiles(sh.S);
  for (std::int64_t h = hk * sh.group(); h < (hk + 1) * sh.group(); ++h) {
    for (std::int64_t qt = flash_q_tile_begin(kt, sh.causal); qt < q_tiles; ++qt) {
      const std::int64_t q0 = qt * flash_br;
      __syncthreads();  // previous query tile fully consumed
      load_tile(qs, qkv + sh.q_index(b, 0, h, 0), stride, q0, sh.S, hd);
      load_tile(dos, dout + sh.out_index(b, 0, h, 0), sh.out_width(), q0, sh.S, hd);
      {
        // Warp w computes the statistics of query row w of the tile (same code as the dQ kernel).
        const std::int64_t qrow = q0 + rj;
        float rho = 0.0f;
        float row_lse = 0.0f;
        if (qrow < sh.S) {
          rho = row_dot_warp(dout + sh.out_index(b, qrow, h, 0), out + sh.out_index(b, qrow, h, 0), hd, lane);
          row_lse = lse[sh.stat_index(b, h, qrow)];
        }
        if (lane == 0) {
          rho_s[rj] = rho;
          lse_s[rj] = row_lse;
        }
      }
      __syncthreads();
      if (kpos >= sh.S) continue;
      const std::int64_t qpos = q0 + lane;
      float p = 0.0f;
      float ds = 0.0f;
      if (qpos < sh.S && attends(qpos, kpos, sh.causal)) {
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

  if (kpos >= sh.S) return;
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) {
    const int d = lane + t * warp_size;
    if (d < hd) {
      dqkv[sh.k_index(b, kpos, hk, d)] = from_float<T>(scale * dk[t]);
      dqkv[sh.v_index(b, kpos, hk, d)] = from_float<T>(dv[t]);
    }
  }
}

inline void check_attention_shape(const attention_shape& sh, int max_head_dim, const char* what) {
  if (!sh.valid()) throw std::invalid_argument(std::string(what) + ": invalid shape (need positive sizes, H % Hkv == 0)");
  if (sh.D > max_head_dim)
    throw std::invalid_argument(std::string(what) + ": head_dim " + std::to_string(sh.D) + " exceeds " +
                                std::to_string(max_head_dim));
}

inline void check_flash_grid(const attention_shape& sh, std::int64_t tiles, const char* what) {
  if (tiles > 2147483647LL || sh.H > max_grid_yz || sh.B > max_grid_yz)
    throw std::invalid_argument(std::string(what) + ": grid too large");
}

template <class Kernel>
void prepare_dynamic_smem(Kernel kernel, std::size_t bytes, const char* what) {
  const std::size_t limit = max_shared_memory_per_block_optin();
  if (bytes > limit)
    throw std::invalid_argument(std::string(what) + ": needs " + std::to_string(bytes) +
                                " bytes of shared memory, the device allows " + std::to_string(limit));
  MEMALG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace detail

/// out[N,H·D] and att[b,H,s,s] (probabilities, in T) from qkv.
template <storage_type T>
void attention_naive_forward(T* out, T* att, const T* qkv, const attention_shape& sh,
                             cudaStream_t stream = nullptr) {
  detail::check_attention_shape(sh, attention_max_head_dim, "attention_naive_forward");
  const unsigned blocks = static_cast<unsigned>(ceil_div(sh.stat_elements(), detail::naive_warps));
  const float scale = attention_scale(sh.D);
  detail::naive_forward_kernel<<<blocks, detail::naive_warps * warp_size, 0, stream>>>(out, att, qkv, sh, scale);
  MEMALG_CUDA_CHECK_LAUNCH("naive_forward_kernel");
}

/// dqkv (=) from dout, qkv and the saved att; `scratch` holds attention_naive_backward_scratch_bytes.
template <storage_type T>
void attention_naive_backward(T* dqkv, const T* dout, const T* qkv, const T* att, const attention_shape& sh,
                              float* scratch, cudaStream_t stream = nullptr) {
  detail::check_attention_shape(sh, attention_max_head_dim, "attention_naive_backward");
  if (scratch == nullptr) throw std::invalid_argument("attention_naive_backward: scratch is null");
  const float scale = attention_scale(sh.D);
  const unsigned q_blocks = static_cast<unsigned>(ceil_div(sh.stat_elements(), detail::naive_warps));
  detail::naive_backward_q_kernel<<<q_blocks, detail::naive_warps * warp_size, 0, stream>>>(dqkv, scratch, dout, qkv,
                                                                                           att, sh, scale);
  MEMALG_CUDA_CHECK_LAUNCH("naive_backward_q_kernel");
  const unsigned kv_blocks = static_cast<unsigned>(ceil_div(sh.B * sh.Hkv * sh.S, detail::naive_warps));
  detail::naive_backward_kv_kernel<<<kv_blocks, detail::naive_warps * warp_size, 0, stream>>>(
      dqkv, scratch, dout, qkv, att, sh, scale);
  MEMALG_CUDA_CHECK_LAUNCH("naive_backward_kv_kernel");
}

/// out[N,H·D] and lse[b,H,s] (float) from qkv.
template <storage_type T>
void attention_flash_forward(T* out, float* lse, const T* qkv, const attention_shape& sh,
                             cudaStream_t stream = nullptr) {
  detail::check_attention_shape(sh, flash_max_head_dim, "attention_flash_forward");
  const std::int64_t tiles = flash_q_tiles(sh.S);
  detail::check_flash_grid(sh, tiles, "attention_flash_forward");
  const std::size_t smem = flash_forward_smem_bytes(sh.D);
  detail::prepare_dynamic_smem(detail::flash_forward_kernel<T>, smem, "attention_flash_forward");
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(sh.H), static_cast<unsigned>(sh.B));
  detail::flash_forward_kernel<T><<<grid, flash_threads, smem, stream>>>(out, lse, qkv, sh,
                                                                        attention_scale(sh.D));
  MEMALG_CUDA_CHECK_LAUNCH("flash_forward_kernel");
}

/// dqkv (=) from dout, qkv and the forward's out and lse.
template <storage_type T>
void attention_flash_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                              const attention_shape& sh, cudaStream_t stream = nullptr) {
  detail::check_attention_shape(sh, flash_max_head_dim, "attention_flash_backward");
  const std::int64_t q_tiles = flash_q_tiles(sh.S);
  const std::int64_t kv_tiles = flash_kv_tiles(sh.S);
  detail::check_flash_grid(sh, q_tiles, "attention_flash_backward");
  const std::size_t smem = flash_backward_smem_bytes(sh.D);
  const float scale = attention_scale(sh.D);
  detail::prepare_dynamic_smem(detail::flash_backward_dq_kernel<T>, smem, "attention_flash_backward");
  detail::prepare_dynamic_smem(detail::flash_backward_dkv_kernel<T>, smem, "attention_flash_backward");
  const dim3 q_grid(static_cast<unsigned>(q_tiles), static_cast<unsigned>(sh.H), static_cast<unsigned>(sh.B));
  detail::flash_backward_dq_kernel<T><<<q_grid, flash_threads, smem, stream>>>(dqkv, dout, qkv, out, lse, sh,
                                                                              scale);
  MEMALG_CUDA_CHECK_LAUNCH("flash_backward_dq_kernel");
  const dim3 kv_grid(static_cast<unsigned>(kv_tiles), static_cast<unsigned>(sh.Hkv),
                     static_cast<unsigned>(sh.B));
  detail::flash_backward_dkv_kernel<T><<<kv_grid, flash_threads, smem, stream>>>(dqkv, dout, qkv, out, lse, sh,
                                                                                scale);
  MEMALG_CUDA_CHECK_LAUNCH("flash_backward_dkv_kernel");
}

}  // namespace memalg::backend::cuda

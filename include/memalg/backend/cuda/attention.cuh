// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/attention.cuh — multi-head attention with GQA, naive and flash-style: causal
// self-attention over a fused qkv and, with the same kernels, attention with a key mask over
// separate q and kv (the speech model's cross-attention and bidirectional encoder self-attention);
// the CUDA twin of backend/cpu/attention.hpp.
//
// Layouts (launch.cuh: attention_shape, the same fields as the CPU backend's): qkv[N,(H+2Hkv)·D]
// = [q ‖ k ‖ v] with token row n = b·S + i, out[N,H·D], att[B,H,S,S], lse[B,H,S]; query head h
// reads key/value head h / (H/Hkv); scale 1/√D; causal when sh.causal. Cross-attention
// (cross_attention_shape): q[B·Sq, H·D] (decoder rows b·Sq + i), kv[B·Sk, 2·Hkv·D] = [k ‖ v] per
// encoder row b·Sk + j, out[B·Sq, H·D], att[B, H, Sq, Sk], lse[B, H, Sq]; never causal.
// Both reach the kernels as an attention_io (the CPU's: row strides and head-0 columns of q, k and
// v, the causal flag and a key mask). key_mask[B·Sk] (1 real, 0 padding; null: all real); a query
// row without a real key gets out = 0, lse = −∞ and no gradient (as on the CPU). Input gradients
// are written in the layout of what they differentiate (dqkv, or dq and dkv).
//
// naive:  forward writes the probabilities att (T; zero for keys a query does not see; may be
//         null) and out = P·v (from the float probabilities, before rounding); backward reads att
//         and needs a float scratch of one row dot per (b, h, i)
//         (attention_naive_backward_scratch_bytes).
// flash:  forward keeps tiles of q, k, v in shared memory with an online softmax and saves only
//         lse (float; may be null when no backward follows); backward recomputes the
//         probabilities from lse in two deterministic kernels, one per query tile for dQ and one
//         per key tile for dK and dV (summing the query heads of its GQA group itself, so no
//         atomics). Needs out and dout: the row dots Σ_d dO·O are computed in both kernels with
//         the same code, hence the same bits.
//
// Gemma 2's variants (attention_variant, the CPU attention_shape's window, softcap and scale):
// `scale` > 0 replaces 1/√D; `softcap` > 0 caps each scaled score s to c·tanh(s/c) before the
// softmax (the backward multiplies the score's gradient by 1 − tanh²(s/c), recomputing s);
// `window` > 0 lets query i read only keys i − window < j (the flash kernels also skip the tiles
// outside the band). Every kernel is instantiated twice: Variant = false is the plain kernel
// (window and softcap compiled out; a scale is only a different float argument), chosen whenever
// window = softcap = 0, so the plain results keep their bits.
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

/// The shape of cross-attention: Sq decoder queries over Sk encoder keys and values.
struct cross_attention_shape {
  std::int64_t B = 0;    ///< batch
  std::int64_t Sq = 0;   ///< query (decoder) positions
  std::int64_t Sk = 0;   ///< key/value (encoder) positions
  std::int64_t H = 0;    ///< query heads
  std::int64_t Hkv = 0;  ///< key/value heads, H % Hkv == 0
  std::int64_t D = 0;    ///< head width

  MEMALG_HOST_DEVICE constexpr std::int64_t q_width() const noexcept { return H * D; }
  MEMALG_HOST_DEVICE constexpr std::int64_t kv_width() const noexcept { return 2 * Hkv * D; }
  MEMALG_HOST_DEVICE constexpr std::int64_t stat_elements() const noexcept { return B * H * Sq; }
  MEMALG_HOST_DEVICE constexpr std::int64_t att_elements() const noexcept { return stat_elements() * Sk; }
  MEMALG_HOST_DEVICE constexpr bool valid() const noexcept {
    return B > 0 && Sq > 0 && Sk > 0 && H > 0 && Hkv > 0 && D > 0 && H % Hkv == 0;
  }
};

/// Where one attention call finds its operands (the CPU backend's detail::attention_io): query rows
/// b·Sq + i of q_ld elements, query head h at column q_col + h·D; key/value rows b·Sk + j of kv_ld
/// elements, key/value head hk at k_col + hk·D and v_col + hk·D; out[B·Sq, H·D]; statistics
/// [B, H, Sq]; probabilities [B, H, Sq, Sk]. A gradient shares the layout of what it differentiates.
struct attention_io {
  std::int64_t B = 0, Sq = 0, Sk = 0, H = 0, Hkv = 0, D = 0;
  bool causal = false;                     ///< query i sees keys j ≤ i (needs Sq == Sk)
  const std::uint8_t* key_mask = nullptr;  ///< [B·Sk], null: every key is real
  std::int64_t q_ld = 0, q_col = 0, kv_ld = 0, k_col = 0, v_col = 0;
  std::int64_t window = 0;  ///< > 0: query i reads only keys j with i − window < j (sliding window)
  float softcap = 0.0f;     ///< > 0: each scaled score s becomes softcap·tanh(s / softcap)
  float scale = 0.0f;       ///< > 0: the scores' scale instead of 1/√D

  MEMALG_HOST_DEVICE constexpr std::int64_t out_width() const noexcept { return H * D; }
  MEMALG_HOST_DEVICE constexpr std::int64_t group() const noexcept { return H / Hkv; }
  MEMALG_HOST_DEVICE constexpr std::int64_t kv_head_of(std::int64_t h) const noexcept { return h / group(); }
  /// Keys query position i may see: [0, keys(i)); the key mask removes more.
  MEMALG_HOST_DEVICE constexpr std::int64_t keys(std::int64_t i) const noexcept {
    return causal ? min_i64(i + 1, Sk) : Sk;
  }
  MEMALG_HOST_DEVICE constexpr bool real_key(std::int64_t b, std::int64_t j) const noexcept {
    return key_mask == nullptr || key_mask[b * Sk + j] != 0;
  }
  /// Whether key j lies inside query i's window (always without a window).
  MEMALG_HOST_DEVICE constexpr bool in_window(std::int64_t i, std::int64_t j) const noexcept {
    return window <= 0 || j + window > i;
  }
  /// The first key query i may read: the start of its window.
  MEMALG_HOST_DEVICE constexpr std::int64_t first_key(std::int64_t i) const noexcept {
    return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
  }
  /// Queries [.., query_end(j)) may read key j: those whose window still holds it.
  MEMALG_HOST_DEVICE constexpr std::int64_t query_end(std::int64_t j) const noexcept {
    return window > 0 ? min_i64(j + window, Sq) : Sq;
  }
  /// Whether any of Gemma 2's variants that change the kernels' code (window, softcap) is on.
  MEMALG_HOST_DEVICE constexpr bool variant() const noexcept { return window > 0 || softcap > 0.0f; }
  MEMALG_HOST_DEVICE constexpr bool valid() const noexcept {
    return B > 0 && Sq > 0 && Sk > 0 && H > 0 && Hkv > 0 && D > 0 && H % Hkv == 0 && (!causal || Sq == Sk);
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t q_index(std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t d) const noexcept {
    return (b * Sq + i) * q_ld + q_col + h * D + d;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t k_index(std::int64_t b, std::int64_t j, std::int64_t hk, std::int64_t d) const noexcept {
    return (b * Sk + j) * kv_ld + k_col + hk * D + d;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t v_index(std::int64_t b, std::int64_t j, std::int64_t hk, std::int64_t d) const noexcept {
    return (b * Sk + j) * kv_ld + v_col + hk * D + d;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t out_index(std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t d) const noexcept {
    return (b * Sq + i) * out_width() + h * D + d;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t stat_index(std::int64_t b, std::int64_t h, std::int64_t i) const noexcept {
    return (b * H + h) * Sq + i;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t att_index(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const noexcept {
    return stat_index(b, h, i) * Sk + j;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t stat_elements() const noexcept { return B * H * Sq; }
};

/// Gemma 2's variants of a self-attention (the CPU attention_shape's fields; all 0: plain attention).
struct attention_variant {
  std::int64_t window = 0;  ///< > 0: query i reads only the last `window` positions up to its own
  float softcap = 0.0f;     ///< > 0: scores capped to softcap·tanh(score / softcap)
  float scale = 0.0f;       ///< > 0: the scores' scale instead of 1/√D
};

/// Self-attention over one qkv[B·S, (H + 2Hkv)·D] (q, kv and the gradients all point at it).
constexpr attention_io self_attention_io(const attention_shape& s, const std::uint8_t* key_mask = nullptr) noexcept {
  return {s.B, s.S, s.S, s.H, s.Hkv, s.D, s.causal, key_mask, s.qkv_width(), 0, s.qkv_width(), s.H * s.D,
          (s.H + s.Hkv) * s.D};
}
/// The same with Gemma 2's variants.
constexpr attention_io self_attention_io(const attention_shape& s, const attention_variant& v,
                                         const std::uint8_t* key_mask = nullptr) noexcept {
  attention_io io = self_attention_io(s, key_mask);
  io.window = v.window;
  io.softcap = v.softcap;
  io.scale = v.scale;
  return io;
}
/// Cross-attention over q[B·Sq, H·D] and kv[B·Sk, 2·Hkv·D].
constexpr attention_io cross_attention_io(const cross_attention_shape& s, const std::uint8_t* key_mask) noexcept {
  return {s.B, s.Sq, s.Sk, s.H, s.Hkv, s.D, false, key_mask, s.q_width(), 0, s.kv_width(), 0, s.Hkv * s.D};
}

/// Float scratch of the naive backward pass: one row dot per (b, h, i).
constexpr std::size_t attention_naive_backward_scratch_bytes(const attention_io& s) noexcept {
  return static_cast<std::size_t>(s.stat_elements()) * sizeof(float);
}
constexpr std::size_t attention_naive_backward_scratch_bytes(const attention_shape& s) noexcept {
  return attention_naive_backward_scratch_bytes(self_attention_io(s));
}
constexpr std::size_t cross_attention_naive_backward_scratch_bytes(const cross_attention_shape& s) noexcept {
  return attention_naive_backward_scratch_bytes(cross_attention_io(s, nullptr));
}

/// The softmax scale 1/√D, computed the same way on every backend.
inline float attention_scale(std::int64_t head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }
/// The scores' scale of one call: io.scale when given, else 1/√D.
inline float attention_scale(const attention_io& io) { return io.scale > 0.0f ? io.scale : attention_scale(io.D); }

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

// Gemma 2's variants, compiled in only where Variant is true (the plain kernels keep their code).
/// Whether key j lies in query i's window.
template <bool Variant>
__device__ __forceinline__ bool in_window(const attention_io& io, std::int64_t i, std::int64_t j) {
  if constexpr (Variant) return io.in_window(i, j);
  else return true;
}
/// Whether query i of sequence b reads key j (j < keys(i) is the caller's): in its window, and real.
template <bool Variant>
__device__ __forceinline__ bool sees(const attention_io& io, std::int64_t b, std::int64_t i, std::int64_t j) {
  if constexpr (Variant) return io.in_window(i, j) && io.real_key(b, j);
  else return io.real_key(b, j);
}
/// A scaled score s as the softmax reads it: softcap·tanh(s / softcap) with a cap, s without.
template <bool Variant>
__device__ __forceinline__ float capped_score(float s, float softcap) {
  if constexpr (Variant) return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
  else return s;
}
/// d capped_score / ds = 1 − tanh²(s / softcap).
__device__ __forceinline__ float cap_slope(float s, float softcap) {
  const float t = tanhf(s / softcap);
  return 1.0f - t * t;
}
/// The first key tile query tile q0.. may read (its first row's window start).
template <bool Variant>
__device__ __forceinline__ std::int64_t flash_kv_tile_begin(const attention_io& io, std::int64_t q0) {
  if constexpr (Variant) return io.first_key(q0) / flash_bc;
  else return 0;
}

// ---- naive -------------------------------------------------------------------------------------

// One warp per (b, h, i): softmax statistics over the scores; then, 32 keys at a time, lane j
// writes probability p_j to att while the warp (lanes over the head dimension) accumulates
// out = Σ_j p_j v_j from the float probabilities (as the CPU reference does).
template <class T, bool Variant>
__global__ void __launch_bounds__(naive_warps * warp_size)
    naive_forward_kernel(T* out, T* att, const T* q, const T* kv, attention_io io, float scale) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * naive_warps + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (r >= io.stat_elements()) return;  // whole warps leave together
  const std::int64_t i = r % io.Sq;
  const std::int64_t h = (r / io.Sq) % io.H;
  const std::int64_t b = r / (io.Sq * io.H);
  const std::int64_t hk = io.kv_head_of(h);
  const std::int64_t end = io.keys(i);
  const std::int64_t first = Variant ? io.first_key(i) : 0;
  const T* qi = q + io.q_index(b, i, h, 0);
  softmax_stats st = softmax_empty();
  for (std::int64_t j = first + lane; j < end; j += warp_size)
    if (sees<Variant>(io, b, i, j)) {
      const float s = dot_global(qi, kv + io.k_index(b, j, hk, 0), io.D) * scale;
      st = softmax_push(st, capped_score<Variant>(s, io.softcap));
    }
  st = warp_softmax(st);
  const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;  // 0: no real key
  T* row = att != nullptr ? att + io.att_index(b, h, i, 0) : nullptr;
  float o[naive_dpl];
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) o[t] = 0.0f;
  for (std::int64_t j0 = 0; j0 < io.Sk; j0 += warp_size) {
    const std::int64_t j = j0 + lane;
    float p = 0.0f;
    if (j < end && sees<Variant>(io, b, i, j)) {
      const float s = dot_global(qi, kv + io.k_index(b, j, hk, 0), io.D) * scale;
      p = expf(capped_score<Variant>(s, io.softcap) - st.m) * inv;
    }
    if (row != nullptr && j < io.Sk) row[j] = from_float<T>(p);
    const int count = static_cast<int>(min_i64(warp_size, end - j0));  // ≤ 0 past the last key
    for (int jj = 0; jj < count; ++jj) {
      const float pj = __shfl_sync(full_warp_mask, p, jj);
      if (pj == 0.0f) continue;  // uniform over the warp: a padded key adds nothing
      const T* v = kv + io.v_index(b, j0 + jj, hk, 0);
#pragma unroll
      for (int t = 0; t < naive_dpl; ++t) {
        const std::int64_t d = lane + t * warp_size;
        if (d < io.D) o[t] += pj * to_float(v[d]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) {
    const std::int64_t d = lane + t * warp_size;
    if (d < io.D) out[io.out_index(b, i, h, d)] = from_float<T>(o[t]);
  }
}

// One warp per (b, h, i): row dot ρ_i = Σ_j p_ij (dO_i·v_j), saved, then
// dq_i = scale·Σ_j p_ij (dO_i·v_j − ρ_i) k_j (times cap_slope(s_ij) with a softcap).
template <class T, bool Variant>
__global__ void __launch_bounds__(naive_warps * warp_size)
    naive_backward_q_kernel(T* dq, float* row_dots, const T* dout, const T* q, const T* kv, const T* att,
                            attention_io io, float scale) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * naive_warps + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (r >= io.stat_elements()) return;
  const std::int64_t i = r % io.Sq;
  const std::int64_t h = (r / io.Sq) % io.H;
  const std::int64_t b = r / (io.Sq * io.H);
  const std::int64_t hk = io.kv_head_of(h);
  const std::int64_t end = io.keys(i);
  const std::int64_t first = Variant ? io.first_key(i) : 0;
  const T* d_o = dout + io.out_index(b, i, h, 0);
  const T* row = att + io.att_index(b, h, i, 0);
  float rho = 0.0f;
  for (std::int64_t j = first + lane; j < end; j += warp_size)
    if (sees<Variant>(io, b, i, j)) rho += to_float(row[j]) * dot_global(d_o, kv + io.v_index(b, j, hk, 0), io.D);
  rho = warp_sum(rho);
  if (lane == 0) row_dots[r] = rho;
  float acc[naive_dpl];
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) acc[t] = 0.0f;
  for (std::int64_t j0 = first; j0 < end; j0 += warp_size) {
    const std::int64_t j = j0 + lane;
    float ds = 0.0f;
    if (j < end && sees<Variant>(io, b, i, j)) {
      ds = to_float(row[j]) * (dot_global(d_o, kv + io.v_index(b, j, hk, 0), io.D) - rho);
      if constexpr (Variant)
        if (io.softcap > 0.0f) {
          const float s = dot_global(q + io.q_index(b, i, h, 0), kv + io.k_index(b, j, hk, 0), io.D) * scale;
          ds *= cap_slope(s, io.softcap);
        }
    }
    const int count = static_cast<int>(min_i64(warp_size, end - j0));
    for (int jj = 0; jj < count; ++jj) {
      const float dsj = __shfl_sync(full_warp_mask, ds, jj);
      const T* k = kv + io.k_index(b, j0 + jj, hk, 0);
#pragma unroll
      for (int t = 0; t < naive_dpl; ++t) {
        const std::int64_t d = lane + t * warp_size;
        if (d < io.D) acc[t] += dsj * to_float(k[d]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) {
    const std::int64_t d = lane + t * warp_size;
    if (d < io.D) dq[io.q_index(b, i, h, d)] = from_float<T>(scale * acc[t]);
  }
}

// One warp per (b, hk, j): dk_j = scale·Σ_{h∈group} Σ_i p_ij (dO_i·v_j − ρ_i) q_i,
// dv_j = Σ_{h∈group} Σ_i p_ij dO_i (zero for a padded key: its probabilities are zero); with a
// window only the queries [j, j + window) that read key j.
template <class T, bool Variant>
__global__ void __launch_bounds__(naive_warps * warp_size)
    naive_backward_kv_kernel(T* dkv, const float* row_dots, const T* dout, const T* q, const T* kv, const T* att,
                             attention_io io, float scale) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * naive_warps + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (r >= io.B * io.Hkv * io.Sk) return;
  const std::int64_t j = r % io.Sk;
  const std::int64_t hk = (r / io.Sk) % io.Hkv;
  const std::int64_t b = r / (io.Sk * io.Hkv);
  const T* v = kv + io.v_index(b, j, hk, 0);
  float dk[naive_dpl];
  float dv[naive_dpl];
#pragma unroll
  for (int t = 0; t < naive_dpl; ++t) dk[t] = dv[t] = 0.0f;
  const std::int64_t first = io.causal ? j : 0;            // queries [first, last) attend to key j
  const std::int64_t last = Variant ? io.query_end(j) : io.Sq;
  if (io.real_key(b, j)) {
    for (std::int64_t h = hk * io.group(); h < (hk + 1) * io.group(); ++h) {
      for (std::int64_t i0 = first; i0 < last; i0 += warp_size) {
        const std::int64_t i = i0 + lane;
        float p = 0.0f;
        float ds = 0.0f;
        if (i < last) {
          p = to_float(att[io.att_index(b, h, i, j)]);
          ds = p * (dot_global(dout + io.out_index(b, i, h, 0), v, io.D) - row_dots[io.stat_index(b, h, i)]);
          if constexpr (Variant)
            if (io.softcap > 0.0f) {
              const float s = dot_global(q + io.q_index(b, i, h, 0), kv + io.k_index(b, j, hk, 0), io.D) * scale;
              ds *= cap_slope(s, io.softcap);
            }
        }
        const int count = static_cast<int>(min_i64(warp_size, last - i0));
        for (int ii = 0; ii < count; ++ii) {
          const float pi = __shfl_sync(full_warp_mask, p, ii);
          const float dsi = __shfl_sync(full_warp_mask, ds, ii);
          const T* d_o = dout + io.out_index(b, i0 + ii, h, 0);
          const T* qi = q + io.q_index(b, i0 + ii, h, 0);
#pragma unroll
          for (int t = 0; t < naive_dpl; ++t) {
            const std::int64_t d = lane + t * warp_size;
            if (d < io.D) {
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
    if (d < io.D) {
      dkv[io.k_index(b, j, hk, d)] = from_float<T>(scale * dk[t]);
      dkv[io.v_index(b, j, hk, d)] = from_float<T>(dv[t]);
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
template <class T, bool Variant>
__global__ void __launch_bounds__(flash_threads)
    flash_forward_kernel(T* out, float* lse, const T* q, const T* kv, attention_io io, float scale) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(io.D);
  const int ld = static_cast<int>(flash_smem_stride(hd));
  float* qs = smem;
  float* ks = qs + flash_br * ld;
  float* vs = ks + flash_bc * ld;
  const std::int64_t qt = blockIdx.x;
  const std::int64_t h = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const std::int64_t hk = io.kv_head_of(h);
  const int ri = threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  const std::int64_t q0 = qt * flash_br;
  const std::int64_t qpos = q0 + ri;
  load_tile(qs, q + io.q_index(b, 0, h, 0), io.q_ld, q0, io.Sq, hd);

  float m = -INFINITY;
  float l = 0.0f;
  float o[flash_dpl];
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) o[t] = 0.0f;

  const std::int64_t kv_end = flash_kv_tile_end(qt, io.Sk, io.causal);
  for (std::int64_t kt = flash_kv_tile_begin<Variant>(io, q0); kt < kv_end; ++kt) {
    const std::int64_t k0 = kt * flash_bc;
    __syncthreads();  // previous tile fully consumed
    load_tile(ks, kv + io.k_index(b, 0, hk, 0), io.kv_ld, k0, io.Sk, hd);
    load_tile(vs, kv + io.v_index(b, 0, hk, 0), io.kv_ld, k0, io.Sk, hd);
    __syncthreads();
    if (qpos >= io.Sq) continue;  // uniform over the warp; the barriers above stay matched
    const std::int64_t kpos = k0 + lane;
    const bool valid = kpos < io.Sk && attends(qpos, kpos, io.causal) && sees<Variant>(io, b, qpos, kpos);
    const float sc = valid ? capped_score<Variant>(dot_shared(qs + ri * ld, ks + lane * ld, hd) * scale, io.softcap)
                           : -INFINITY;
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

  if (qpos >= io.Sq) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // 0: no real key
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) {
    const int d = lane + t * warp_size;
    if (d < hd) out[io.out_index(b, qpos, h, d)] = from_float<T>(o[t] * inv);
  }
  if (lane == 0 && lse != nullptr) lse[io.stat_index(b, h, qpos)] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// dQ: block (q tile, h, b); warp w owns query row w of the tile; lane j owns key j of the key tile.
template <class T, bool Variant>
__global__ void __launch_bounds__(flash_threads)
    flash_backward_dq_kernel(T* dq, const T* dout, const T* q, const T* kv, const T* out, const float* lse,
                             attention_io io, float scale) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(io.D);
  const int ld = static_cast<int>(flash_smem_stride(hd));
  float* qs = smem;
  float* dos = qs + flash_br * ld;
  float* ks = dos + flash_br * ld;
  float* vs = ks + flash_bc * ld;
  const std::int64_t qt = blockIdx.x;
  const std::int64_t h = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const std::int64_t hk = io.kv_head_of(h);
  const int ri = threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  const std::int64_t q0 = qt * flash_br;
  const std::int64_t qpos = q0 + ri;
  load_tile(qs, q + io.q_index(b, 0, h, 0), io.q_ld, q0, io.Sq, hd);
  load_tile(dos, dout + io.out_index(b, 0, h, 0), io.out_width(), q0, io.Sq, hd);
  float rho = 0.0f;
  float row_lse = -INFINITY;
  if (qpos < io.Sq) {
    rho = row_dot_warp(dout + io.out_index(b, qpos, h, 0), out + io.out_index(b, qpos, h, 0), hd, lane);
    row_lse = lse[io.stat_index(b, h, qpos)];
  }

  float acc[flash_dpl];
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) acc[t] = 0.0f;

  const std::int64_t kv_end = flash_kv_tile_end(qt, io.Sk, io.causal);
  for (std::int64_t kt = flash_kv_tile_begin<Variant>(io, q0); kt < kv_end; ++kt) {
    const std::int64_t k0 = kt * flash_bc;
    __syncthreads();
    load_tile(ks, kv + io.k_index(b, 0, hk, 0), io.kv_ld, k0, io.Sk, hd);
    load_tile(vs, kv + io.v_index(b, 0, hk, 0), io.kv_ld, k0, io.Sk, hd);
    __syncthreads();
    if (qpos >= io.Sq || row_lse == -INFINITY) continue;  // uniform over the warp
    const std::int64_t kpos = k0 + lane;
    float ds = 0.0f;
    if (kpos < io.Sk && attends(qpos, kpos, io.causal) && sees<Variant>(io, b, qpos, kpos)) {
      const float s = dot_shared(qs + ri * ld, ks + lane * ld, hd) * scale;
      const float p = expf(capped_score<Variant>(s, io.softcap) - row_lse);
      const float dp = dot_shared(dos + ri * ld, vs + lane * ld, hd);
      ds = p * (dp - rho);
      if constexpr (Variant)
        if (io.softcap > 0.0f) ds *= cap_slope(s, io.softcap);
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

  if (qpos >= io.Sq) return;
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) {
    const int d = lane + t * warp_size;
    if (d < hd) dq[io.q_index(b, qpos, h, d)] = from_float<T>(scale * acc[t]);
  }
}

// dK, dV: block (key tile, hk, b); warp w owns key row w of the tile; lane i owns query i of the
// query tile. Loops over the query heads of the group and the query tiles that see the key tile
// (with a window, only those up to the last query whose window holds the tile's last key).
template <class T, bool Variant>
__global__ void __launch_bounds__(flash_threads)
    flash_backward_dkv_kernel(T* dkv, const T* dout, const T* q, const T* kv, const T* out, const float* lse,
                              attention_io io, float scale) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(io.D);
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
  const bool key_ok = kpos < io.Sk && io.real_key(b, kpos);
  load_tile(ks, kv + io.k_index(b, 0, hk, 0), io.kv_ld, k0, io.Sk, hd);
  load_tile(vs, kv + io.v_index(b, 0, hk, 0), io.kv_ld, k0, io.Sk, hd);

  float dk[flash_dpl];
  float dv[flash_dpl];
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) dk[t] = dv[t] = 0.0f;

  const std::int64_t q_tiles = Variant ? flash_q_tiles(io.query_end(min_i64(k0 + flash_bc, io.Sk) - 1))
                                       : flash_q_tiles(io.Sq);
  for (std::int64_t h = hk * io.group(); h < (hk + 1) * io.group(); ++h) {
    for (std::int64_t qt = flash_q_tile_begin(kt, io.causal); qt < q_tiles; ++qt) {
      const std::int64_t q0 = qt * flash_br;
      __syncthreads();  // previous query tile fully consumed
      load_tile(qs, q + io.q_index(b, 0, h, 0), io.q_ld, q0, io.Sq, hd);
      load_tile(dos, dout + io.out_index(b, 0, h, 0), io.out_width(), q0, io.Sq, hd);
      {
        // Warp w computes the statistics of query row w of the tile (same code as the dQ kernel).
        const std::int64_t qrow = q0 + rj;
        float rho = 0.0f;
        float row_lse = -INFINITY;
        if (qrow < io.Sq) {
          rho = row_dot_warp(dout + io.out_index(b, qrow, h, 0), out + io.out_index(b, qrow, h, 0), hd, lane);
          row_lse = lse[io.stat_index(b, h, qrow)];
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
      if (qpos < io.Sq && attends(qpos, kpos, io.causal) && in_window<Variant>(io, qpos, kpos) &&
          lse_s[lane] != -INFINITY) {
        const float s = dot_shared(qs + lane * ld, ks + rj * ld, hd) * scale;
        p = expf(capped_score<Variant>(s, io.softcap) - lse_s[lane]);
        const float dp = dot_shared(dos + lane * ld, vs + rj * ld, hd);
        ds = p * (dp - rho_s[lane]);
        if constexpr (Variant)
          if (io.softcap > 0.0f) ds *= cap_slope(s, io.softcap);
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

  if (kpos >= io.Sk) return;
#pragma unroll
  for (int t = 0; t < flash_dpl; ++t) {
    const int d = lane + t * warp_size;
    if (d < hd) {
      dkv[io.k_index(b, kpos, hk, d)] = from_float<T>(scale * dk[t]);
      dkv[io.v_index(b, kpos, hk, d)] = from_float<T>(dv[t]);
    }
  }
}

inline void check_attention_io(const attention_io& io, int max_head_dim, const char* what) {
  if (!io.valid())
    throw std::invalid_argument(std::string(what) +
                                ": invalid shape (need positive sizes, H % Hkv == 0, Sq == Sk when causal)");
  if (io.D > max_head_dim)
    throw std::invalid_argument(std::string(what) + ": head_dim " + std::to_string(io.D) + " exceeds " +
                                std::to_string(max_head_dim));
  if (io.window < 0 || !(io.softcap >= 0.0f) || !(io.scale >= 0.0f) || !std::isfinite(io.softcap) ||
      !std::isfinite(io.scale))
    throw std::invalid_argument(std::string(what) + ": window, softcap and scale must be finite and not negative");
  if (flash_q_tiles(io.Sq) > 2147483647LL || flash_kv_tiles(io.Sk) > 2147483647LL || io.H > max_grid_yz ||
      io.B > max_grid_yz)
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

// ---- over an attention_io: the kernels' entry points --------------------------------------------

/// out[B·Sq, H·D] and att[B, H, Sq, Sk] (probabilities in T; may be null).
template <storage_type T>
void attention_naive_forward(T* out, T* att, const T* q, const T* kv, const attention_io& io,
                             cudaStream_t stream = nullptr) {
  detail::check_attention_io(io, attention_max_head_dim, "attention_naive_forward");
  const unsigned blocks = static_cast<unsigned>(ceil_div(io.stat_elements(), detail::naive_warps));
  const float scale = attention_scale(io);
  if (io.variant())
    detail::naive_forward_kernel<T, true><<<blocks, detail::naive_warps * warp_size, 0, stream>>>(out, att, q, kv, io,
                                                                                                 scale);
  else
    detail::naive_forward_kernel<T, false><<<blocks, detail::naive_warps * warp_size, 0, stream>>>(out, att, q, kv, io,
                                                                                                  scale);
  MEMALG_CUDA_CHECK_LAUNCH("naive_forward_kernel");
}

/// dq and dkv (=) from dout and the saved att; `scratch` holds attention_naive_backward_scratch_bytes.
template <storage_type T>
void attention_naive_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* att,
                              const attention_io& io, float* scratch, cudaStream_t stream = nullptr) {
  detail::check_attention_io(io, attention_max_head_dim, "attention_naive_backward");
  if (scratch == nullptr) throw std::invalid_argument("attention_naive_backward: scratch is null");
  const float scale = attention_scale(io);
  const bool variant = io.variant();
  const unsigned q_blocks = static_cast<unsigned>(ceil_div(io.stat_elements(), detail::naive_warps));
  if (variant)
    detail::naive_backward_q_kernel<T, true><<<q_blocks, detail::naive_warps * warp_size, 0, stream>>>(
        dq, scratch, dout, q, kv, att, io, scale);
  else
    detail::naive_backward_q_kernel<T, false><<<q_blocks, detail::naive_warps * warp_size, 0, stream>>>(
        dq, scratch, dout, q, kv, att, io, scale);
  MEMALG_CUDA_CHECK_LAUNCH("naive_backward_q_kernel");
  const unsigned kv_blocks = static_cast<unsigned>(ceil_div(io.B * io.Hkv * io.Sk, detail::naive_warps));
  if (variant)
    detail::naive_backward_kv_kernel<T, true><<<kv_blocks, detail::naive_warps * warp_size, 0, stream>>>(
        dkv, scratch, dout, q, kv, att, io, scale);
  else
    detail::naive_backward_kv_kernel<T, false><<<kv_blocks, detail::naive_warps * warp_size, 0, stream>>>(
        dkv, scratch, dout, q, kv, att, io, scale);
  MEMALG_CUDA_CHECK_LAUNCH("naive_backward_kv_kernel");
}

namespace detail {
template <class T, bool Variant>
void flash_forward(T* out, float* lse, const T* q, const T* kv, const attention_io& io, cudaStream_t stream) {
  const std::size_t smem = flash_forward_smem_bytes(io.D);
  prepare_dynamic_smem(flash_forward_kernel<T, Variant>, smem, "attention_flash_forward");
  const dim3 grid(static_cast<unsigned>(flash_q_tiles(io.Sq)), static_cast<unsigned>(io.H), static_cast<unsigned>(io.B));
  flash_forward_kernel<T, Variant><<<grid, flash_threads, smem, stream>>>(out, lse, q, kv, io, attention_scale(io));
  MEMALG_CUDA_CHECK_LAUNCH("flash_forward_kernel");
}

template <class T, bool Variant>
void flash_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* out, const float* lse,
                    const attention_io& io, cudaStream_t stream) {
  const std::size_t smem = flash_backward_smem_bytes(io.D);
  const float scale = attention_scale(io);
  prepare_dynamic_smem(flash_backward_dq_kernel<T, Variant>, smem, "attention_flash_backward");
  prepare_dynamic_smem(flash_backward_dkv_kernel<T, Variant>, smem, "attention_flash_backward");
  const dim3 q_grid(static_cast<unsigned>(flash_q_tiles(io.Sq)), static_cast<unsigned>(io.H),
                    static_cast<unsigned>(io.B));
  flash_backward_dq_kernel<T, Variant><<<q_grid, flash_threads, smem, stream>>>(dq, dout, q, kv, out, lse, io, scale);
  MEMALG_CUDA_CHECK_LAUNCH("flash_backward_dq_kernel");
  const dim3 kv_grid(static_cast<unsigned>(flash_kv_tiles(io.Sk)), static_cast<unsigned>(io.Hkv),
                     static_cast<unsigned>(io.B));
  flash_backward_dkv_kernel<T, Variant><<<kv_grid, flash_threads, smem, stream>>>(dkv, dout, q, kv, out, lse, io,
                                                                                  scale);
  MEMALG_CUDA_CHECK_LAUNCH("flash_backward_dkv_kernel");
}
}  // namespace detail

/// out[B·Sq, H·D] and lse[B, H, Sq] (float; may be null: no backward follows).
template <storage_type T>
void attention_flash_forward(T* out, float* lse, const T* q, const T* kv, const attention_io& io,
                             cudaStream_t stream = nullptr) {
  detail::check_attention_io(io, flash_max_head_dim, "attention_flash_forward");
  if (io.variant()) detail::flash_forward<T, true>(out, lse, q, kv, io, stream);
  else detail::flash_forward<T, false>(out, lse, q, kv, io, stream);
}

/// dq and dkv (=) from dout, q, kv and the forward's out and lse.
template <storage_type T>
void attention_flash_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* out, const float* lse,
                              const attention_io& io, cudaStream_t stream = nullptr) {
  detail::check_attention_io(io, flash_max_head_dim, "attention_flash_backward");
  if (io.variant()) detail::flash_backward<T, true>(dq, dkv, dout, q, kv, out, lse, io, stream);
  else detail::flash_backward<T, false>(dq, dkv, dout, q, kv, out, lse, io, stream);
}

// ---- self-attention over a fused qkv --------------------------------------------------------------

/// out[N,H·D] and att[b,H,s,s] (probabilities, in T) from qkv.
template <storage_type T>
void attention_naive_forward(T* out, T* att, const T* qkv, const attention_shape& sh, cudaStream_t stream = nullptr) {
  attention_naive_forward(out, att, qkv, qkv, self_attention_io(sh), stream);
}

/// dqkv (=) from dout, qkv and the saved att; `scratch` holds attention_naive_backward_scratch_bytes.
template <storage_type T>
void attention_naive_backward(T* dqkv, const T* dout, const T* qkv, const T* att, const attention_shape& sh,
                              float* scratch, cudaStream_t stream = nullptr) {
  attention_naive_backward(dqkv, dqkv, dout, qkv, qkv, att, self_attention_io(sh), scratch, stream);
}

/// out[N,H·D] and lse[b,H,s] (float) from qkv.
template <storage_type T>
void attention_flash_forward(T* out, float* lse, const T* qkv, const attention_shape& sh, cudaStream_t stream = nullptr) {
  attention_flash_forward(out, lse, qkv, qkv, self_attention_io(sh), stream);
}

/// dqkv (=) from dout, qkv and the forward's out and lse.
template <storage_type T>
void attention_flash_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                              const attention_shape& sh, cudaStream_t stream = nullptr) {
  attention_flash_backward(dqkv, dqkv, dout, qkv, qkv, out, lse, self_attention_io(sh), stream);
}

// ---- self-attention with Gemma 2's variants (window, softcap, scale) ------------------------------

/// As attention_naive_forward over qkv, with the variants v.
template <storage_type T>
void attention_naive_forward(T* out, T* att, const T* qkv, const attention_shape& sh, const attention_variant& v,
                             cudaStream_t stream = nullptr) {
  attention_naive_forward(out, att, qkv, qkv, self_attention_io(sh, v), stream);
}

/// As attention_naive_backward over qkv, with the variants v (the forward's).
template <storage_type T>
void attention_naive_backward(T* dqkv, const T* dout, const T* qkv, const T* att, const attention_shape& sh,
                              const attention_variant& v, float* scratch, cudaStream_t stream = nullptr) {
  attention_naive_backward(dqkv, dqkv, dout, qkv, qkv, att, self_attention_io(sh, v), scratch, stream);
}

/// As attention_flash_forward over qkv, with the variants v.
template <storage_type T>
void attention_flash_forward(T* out, float* lse, const T* qkv, const attention_shape& sh, const attention_variant& v,
                             cudaStream_t stream = nullptr) {
  attention_flash_forward(out, lse, qkv, qkv, self_attention_io(sh, v), stream);
}

/// As attention_flash_backward over qkv, with the variants v (the forward's).
template <storage_type T>
void attention_flash_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                              const attention_shape& sh, const attention_variant& v, cudaStream_t stream = nullptr) {
  attention_flash_backward(dqkv, dqkv, dout, qkv, qkv, out, lse, self_attention_io(sh, v), stream);
}

// ---- cross-attention over q and kv, with a key mask -------------------------------------------------

/// out[B·Sq, H·D] and att[B, H, Sq, Sk] (probabilities in T; may be null) from q, kv and the key mask.
template <storage_type T>
void cross_attention_naive_forward(T* out, T* att, const T* q, const T* kv, const std::uint8_t* key_mask,
                                   const cross_attention_shape& sh, cudaStream_t stream = nullptr) {
  attention_naive_forward(out, att, q, kv, cross_attention_io(sh, key_mask), stream);
}

/// dq, dkv (=) from dout and the saved att; `scratch` holds cross_attention_naive_backward_scratch_bytes.
template <storage_type T>
void cross_attention_naive_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* att,
                                    const std::uint8_t* key_mask, const cross_attention_shape& sh, float* scratch,
                                    cudaStream_t stream = nullptr) {
  attention_naive_backward(dq, dkv, dout, q, kv, att, cross_attention_io(sh, key_mask), scratch, stream);
}

/// out[B·Sq, H·D] and lse[B, H, Sq] (float; may be null: no backward follows) from q, kv and the key mask.
template <storage_type T>
void cross_attention_flash_forward(T* out, float* lse, const T* q, const T* kv, const std::uint8_t* key_mask,
                                   const cross_attention_shape& sh, cudaStream_t stream = nullptr) {
  attention_flash_forward(out, lse, q, kv, cross_attention_io(sh, key_mask), stream);
}

/// dq, dkv (=) from dout, q, kv and the forward's out and lse.
template <storage_type T>
void cross_attention_flash_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* out,
                                    const float* lse, const std::uint8_t* key_mask, const cross_attention_shape& sh,
                                    cudaStream_t stream = nullptr) {
  attention_flash_backward(dq, dkv, dout, q, kv, out, lse, cross_attention_io(sh, key_mask), stream);
}

}  // namespace memalg::backend::cuda

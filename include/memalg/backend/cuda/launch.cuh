// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/launch.cuh — launch configurations and index arithmetic of the CUDA kernels.
//
// Everything here is constexpr, marked for host and device and free of CUDA headers, so that the
// grid sizes, tile counts, tensor layouts and alignment rules the kernels rely on are unit-tested
// on a machine without a GPU (tests/device/host_launch.cu). Kernels call these same functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memalg/config.hpp"

namespace memalg::backend::cuda {

// ---- basic integer arithmetic ------------------------------------------------------------------

inline constexpr int warp_size = 32;
/// Grid-x blocks of the grid-stride kernels are capped here; the kernels loop over the rest.
inline constexpr std::int64_t max_grid_stride_blocks = 65536;
/// Largest gridDim.y / gridDim.z.
inline constexpr std::int64_t max_grid_yz = 65535;

/// ⌈a / b⌉ for a ≥ 0, b > 0.
MEMALG_HOST_DEVICE constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) noexcept {
  return (a + b - 1) / b;
}

/// Smallest multiple of b that is ≥ a (a ≥ 0, b > 0).
MEMALG_HOST_DEVICE constexpr std::int64_t round_up(std::int64_t a, std::int64_t b) noexcept {
  return ceil_div(a, b) * b;
}

MEMALG_HOST_DEVICE constexpr bool is_pow2(std::uint64_t x) noexcept { return x != 0 && (x & (x - 1)) == 0; }

/// Number of bits needed to represent every value in [0, n) (0 for n ≤ 1); radix sorts of token
/// ids use it as their end bit.
MEMALG_HOST_DEVICE constexpr int bits_for(std::uint64_t n) noexcept {
  int bits = 0;
  while (bits < 64 && (std::uint64_t{1} << bits) < n) ++bits;
  return bits;
}

MEMALG_HOST_DEVICE constexpr std::int64_t min_i64(std::int64_t a, std::int64_t b) noexcept { return a < b ? a : b; }
MEMALG_HOST_DEVICE constexpr std::int64_t max_i64(std::int64_t a, std::int64_t b) noexcept { return a < b ? b : a; }

// ---- 1-D launches ------------------------------------------------------------------------------

struct launch_1d {
  std::int64_t grid = 0;   ///< blocks (0: nothing to launch)
  int block = 0;           ///< threads per block
};

/// Grid-stride launch over `items` work items (elements, or vectors of elements): one thread per
/// item up to max_grid_stride_blocks blocks, the kernel loops over the remainder.
MEMALG_HOST_DEVICE constexpr launch_1d grid_stride_launch(std::int64_t items, int block = 256) noexcept {
  if (items <= 0) return {0, block};
  return {min_i64(ceil_div(items, block), max_grid_stride_blocks), block};
}

/// One warp per row, `warps_per_block` rows per block.
MEMALG_HOST_DEVICE constexpr launch_1d warp_per_row_launch(std::int64_t rows, int warps_per_block = 8) noexcept {
  if (rows <= 0) return {0, warps_per_block * warp_size};
  return {ceil_div(rows, warps_per_block), warps_per_block * warp_size};
}

/// Column reductions (bias, norm-weight gradients): 32 columns per block, 32 row lanes.
inline constexpr int column_reduce_cols = 32;
inline constexpr int column_reduce_rows = 32;
MEMALG_HOST_DEVICE constexpr std::int64_t column_reduce_blocks(std::int64_t cols) noexcept {
  return cols <= 0 ? 0 : ceil_div(cols, column_reduce_cols);
}

// ---- vectorised loads --------------------------------------------------------------------------

/// Elements of `elem_bytes` each in one 16-byte load (at least 1).
MEMALG_HOST_DEVICE constexpr int max_vec_width(std::size_t elem_bytes) noexcept {
  return elem_bytes == 0 || elem_bytes >= 16 ? 1 : static_cast<int>(16 / elem_bytes);
}

/// Largest power of two dividing `addr`, capped at `cap` (a null address counts as `cap`-aligned).
MEMALG_HOST_DEVICE constexpr std::size_t alignment_of(std::uintptr_t addr, std::size_t cap = 256) noexcept {
  if (addr == 0) return cap;
  std::size_t a = 1;
  while (a < cap && addr % (a * 2) == 0) a *= 2;
  return a;
}

/// Largest power-of-two width w ≤ max_width such that `count` elements split into whole vectors of
/// w and the array at `addr` is aligned to w·elem_bytes.
MEMALG_HOST_DEVICE constexpr int vec_width(int max_width, std::int64_t count, std::uintptr_t addr,
                                           std::size_t elem_bytes) noexcept {
  int w = max_width;
  while (w > 1 && (count % w != 0 || addr % (static_cast<std::size_t>(w) * elem_bytes) != 0)) w /= 2;
  return w < 1 ? 1 : w;
}

/// vec_width over several arrays: the width every one of them supports.
template <class... P>
inline int common_vec_width(int max_width, std::int64_t count, const P*... ptrs) noexcept {
  int w = max_width;
  ((w = vec_width(w, count, reinterpret_cast<std::uintptr_t>(ptrs), sizeof(P))), ...);
  return w;
}

// ---- attention layouts -------------------------------------------------------------------------

/// Shape and index arithmetic of attention (same fields as the CPU backend's attention_shape):
/// qkv[N,(H+2Hkv)·D] = [q ‖ k ‖ v], out[N,H·D], att[B,H,S,S] and lse[B,H,S], token row n = b·S + i;
/// query head h reads key/value head h / (H/Hkv).
struct attention_shape {
  std::int64_t B = 0;    ///< batch
  std::int64_t S = 0;    ///< sequence length
  std::int64_t H = 0;    ///< query heads
  std::int64_t Hkv = 0;  ///< key/value heads, H % Hkv == 0
  std::int64_t D = 0;    ///< head width
  bool causal = true;

  MEMALG_HOST_DEVICE constexpr std::int64_t rows() const noexcept { return B * S; }
  MEMALG_HOST_DEVICE constexpr std::int64_t qkv_width() const noexcept { return (H + 2 * Hkv) * D; }
  MEMALG_HOST_DEVICE constexpr std::int64_t out_width() const noexcept { return H * D; }
  MEMALG_HOST_DEVICE constexpr std::int64_t group() const noexcept { return H / Hkv; }
  /// Key/value head serving query head h (GQA; MHA when Hkv == H, MQA when Hkv == 1).
  MEMALG_HOST_DEVICE constexpr std::int64_t kv_head_of(std::int64_t h) const noexcept { return h / group(); }
  /// Keys query position i attends to: [0, keys(i)).
  MEMALG_HOST_DEVICE constexpr std::int64_t keys(std::int64_t i) const noexcept { return causal ? i + 1 : S; }
  MEMALG_HOST_DEVICE constexpr bool valid() const noexcept {
    return B > 0 && S > 0 && H > 0 && Hkv > 0 && D > 0 && H % Hkv == 0;
  }

  MEMALG_HOST_DEVICE constexpr std::int64_t q_index(std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t d) const noexcept {
    return (b * S + i) * qkv_width() + h * D + d;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t k_index(std::int64_t b, std::int64_t j, std::int64_t hk, std::int64_t d) const noexcept {
    return (b * S + j) * qkv_width() + (H + hk) * D + d;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t v_index(std::int64_t b, std::int64_t j, std::int64_t hk, std::int64_t d) const noexcept {
    return (b * S + j) * qkv_width() + (H + Hkv + hk) * D + d;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t out_index(std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t d) const noexcept {
    return (b * S + i) * out_width() + h * D + d;
  }
  /// Row (b, h, i) of the [B,H,S] statistics (lse, the softmax-backward row dots).
  MEMALG_HOST_DEVICE constexpr std::int64_t stat_index(std::int64_t b, std::int64_t h, std::int64_t i) const noexcept {
    return (b * H + h) * S + i;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t att_index(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const noexcept {
    return stat_index(b, h, i) * S + j;
  }
  MEMALG_HOST_DEVICE constexpr std::int64_t qkv_elements() const noexcept { return rows() * qkv_width(); }
  MEMALG_HOST_DEVICE constexpr std::int64_t out_elements() const noexcept { return rows() * out_width(); }
  MEMALG_HOST_DEVICE constexpr std::int64_t stat_elements() const noexcept { return B * H * S; }
  MEMALG_HOST_DEVICE constexpr std::int64_t att_elements() const noexcept { return stat_elements() * S; }
};

/// Whether query position i attends to key position j.
MEMALG_HOST_DEVICE constexpr bool attends(std::int64_t i, std::int64_t j, bool causal) noexcept {
  return !causal || j <= i;
}

/// Largest head width the attention kernels accept (per-lane register arrays are sized by it).
inline constexpr int attention_max_head_dim = 256;
inline constexpr int flash_max_head_dim = 128;

// ---- flash attention tiling --------------------------------------------------------------------

/// Tiles of the flash kernels: br query rows × bc key rows, one warp per tile row. Both equal the
/// warp width: lane j owns key j of the tile in the forward and dQ kernels (warp w: query row w),
/// lane i owns query i of the tile in the dK/dV kernel (warp w: key row w).
inline constexpr int flash_br = 32;
inline constexpr int flash_bc = 32;
inline constexpr int flash_warps = 32;
inline constexpr int flash_threads = flash_warps * warp_size;

MEMALG_HOST_DEVICE constexpr std::int64_t flash_q_tiles(std::int64_t seq, int br = flash_br) noexcept {
  return ceil_div(seq, br);
}
MEMALG_HOST_DEVICE constexpr std::int64_t flash_kv_tiles(std::int64_t seq, int bc = flash_bc) noexcept {
  return ceil_div(seq, bc);
}
/// Key tiles query tile `q_tile` visits: [0, end). Causal: up to the tile holding its last row.
MEMALG_HOST_DEVICE constexpr std::int64_t flash_kv_tile_end(std::int64_t q_tile, std::int64_t seq, bool causal,
                                                            int br = flash_br, int bc = flash_bc) noexcept {
  const std::int64_t all = flash_kv_tiles(seq, bc);
  if (!causal) return all;
  const std::int64_t last_row = min_i64((q_tile + 1) * br, seq) - 1;
  return min_i64(last_row / bc + 1, all);
}
/// Query tiles that see key tile `kv_tile`: [begin, flash_q_tiles). Causal: from the tile holding
/// the key tile's first row.
MEMALG_HOST_DEVICE constexpr std::int64_t flash_q_tile_begin(std::int64_t kv_tile, bool causal, int br = flash_br,
                                                             int bc = flash_bc) noexcept {
  return causal ? (kv_tile * bc) / br : 0;
}
/// Row stride of a shared-memory tile of head width d, padded by one float so that lanes reading
/// one column of consecutive rows hit distinct banks.
MEMALG_HOST_DEVICE constexpr std::int64_t flash_smem_stride(std::int64_t head_dim) noexcept { return head_dim + 1; }
/// Dynamic shared memory of the forward kernel: q, k and v tiles in float.
MEMALG_HOST_DEVICE constexpr std::size_t flash_forward_smem_bytes(std::int64_t head_dim) noexcept {
  return static_cast<std::size_t>((flash_br + 2 * flash_bc) * flash_smem_stride(head_dim)) * sizeof(float);
}
/// Dynamic shared memory of each backward kernel: q, dO, k, v tiles plus lse and the row dots.
MEMALG_HOST_DEVICE constexpr std::size_t flash_backward_smem_bytes(std::int64_t head_dim) noexcept {
  return static_cast<std::size_t>(2 * (flash_br + flash_bc) * flash_smem_stride(head_dim) + 2 * flash_br) * sizeof(float);
}
/// (q-tile, kv-tile) pairs a forward pass visits for one (batch, head): the attention work.
MEMALG_HOST_DEVICE constexpr std::int64_t flash_tile_pairs(std::int64_t seq, bool causal) noexcept {
  std::int64_t pairs = 0;
  for (std::int64_t t = 0; t < flash_q_tiles(seq); ++t) pairs += flash_kv_tile_end(t, seq, causal);
  return pairs;
}

// ---- GEMM --------------------------------------------------------------------------------------

inline constexpr std::size_t mib = std::size_t{1} << 20;

/// cuBLASLt workspace the plan reserves: 32 MiB on Hopper and newer (its kernels use it for
/// split-K and stream-K), 4 MiB before.
MEMALG_HOST_DEVICE constexpr std::size_t default_gemm_workspace_bytes(int cc_major) noexcept {
  return cc_major >= 9 ? 32 * mib : 4 * mib;
}

/// cuBLASLt fp8 GEMMs need every dimension a multiple of 16 (and 16-byte aligned rows).
MEMALG_HOST_DEVICE constexpr bool fp8_gemm_dims_ok(std::int64_t rows, std::int64_t in_features,
                                                   std::int64_t out_features) noexcept {
  return rows > 0 && in_features > 0 && out_features > 0 && rows % 16 == 0 && in_features % 16 == 0 &&
         out_features % 16 == 0;
}

/// fp8 tensor-core GEMMs exist from compute capability 8.9 (Ada, Hopper).
MEMALG_HOST_DEVICE constexpr bool fp8_gemm_supported(int cc_major, int cc_minor) noexcept {
  return cc_major > 8 || (cc_major == 8 && cc_minor >= 9);
}

// ---- reductions --------------------------------------------------------------------------------

/// Squared-norm partial blocks: fixed by the element count only (never by the device), so the
/// reduction order and hence the result are the same on every GPU.
inline constexpr int norm_block = 512;
inline constexpr int norm_max_blocks = 1024;
MEMALG_HOST_DEVICE constexpr int norm_partial_blocks(std::int64_t n) noexcept {
  return n <= 0 ? 1 : static_cast<int>(min_i64(ceil_div(n, norm_block * 8), norm_max_blocks));
}

// ---- sorting ------------------------------------------------------------------------------------

/// Smallest power of two ≥ n (1 for n ≤ 1).
MEMALG_HOST_DEVICE constexpr std::int64_t next_pow2(std::int64_t n) noexcept {
  std::int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

/// The bitonic sort handles strides below this many elements inside one block's shared memory.
inline constexpr std::int64_t bitonic_block = 1024;

/// Kernel launches of a bitonic sort of n (a power of two) elements: one block-local pass for all
/// merges up to bitonic_block, then per larger merge size k one launch per stride j ≥ bitonic_block
/// and one block-local pass for the smaller strides.
MEMALG_HOST_DEVICE constexpr int bitonic_launches(std::int64_t n) noexcept {
  if (n <= 1) return 0;
  const std::int64_t s = min_i64(n, bitonic_block);
  int launches = 1;
  for (std::int64_t k = 2 * s; k <= n; k *= 2) {
    for (std::int64_t j = k / 2; j >= s; j /= 2) ++launches;
    ++launches;
  }
  return launches;
}

// ---- workspaces --------------------------------------------------------------------------------

/// Sub-buffers of a workspace start on 256-byte boundaries (cudaMalloc's alignment).
inline constexpr std::size_t workspace_alignment = 256;
MEMALG_HOST_DEVICE constexpr std::size_t workspace_round(std::size_t bytes) noexcept {
  return (bytes + workspace_alignment - 1) / workspace_alignment * workspace_alignment;
}

/// Outcome of placing `count` elements of `elem_bytes` at byte `offset` of an arena.
enum class arena_fit { ok, bad_alignment, misaligned, out_of_range };

MEMALG_HOST_DEVICE constexpr arena_fit arena_check(std::size_t capacity, std::size_t offset, std::size_t count,
                                                   std::size_t elem_bytes, std::size_t alignment) noexcept {
  if (!is_pow2(alignment)) return arena_fit::bad_alignment;
  if (offset % alignment != 0) return arena_fit::misaligned;
  if (offset > capacity) return arena_fit::out_of_range;
  if (elem_bytes != 0 && count > (capacity - offset) / elem_bytes) return arena_fit::out_of_range;
  return arena_fit::ok;
}

}  // namespace memalg::backend::cuda

// SPDX-License-Identifier: BSL-1.0
// memalg/core/dtype.hpp — number formats with exact storage sizes.
//
// A dtype is a literal struct (usable at compile time and at run time): its name, its bit width,
// whether it can be stored at all (tf32 is a tensor-core *compute* format: its values live in
// 32-bit fp32 registers and memory), and, for block-quantized formats, the scale overhead: one
// scale of `scale_bits` per `block` elements, optionally with a second level (double quantization).
//
//   storage_bytes(d, n) = ceil(n·bits / 8) + ceil(n / block)·scale_bits/8 (+ second level)
//
// Sources: fp8 formats — Micikevicius et al., "FP8 Formats for Deep Learning" (arXiv 2209.05433);
// tf32 — NVIDIA A100 whitepaper (10-bit mantissa, stored in 32 bits); nf4 and its double
// quantization — Dettmers et al., "QLoRA" (arXiv 2305.14314 §2): block 64 with an fp32 absmax
// (0.5 bit/param), or with double quantization 8-bit scales and one fp32 per 256 scales
// (8/64 + 32/(64·256) = 0.127 bit/param).
#pragma once

#include <cstdint>
#include <string_view>

#include "memalg/core/bytes.hpp"

namespace memalg {

enum class dtype_kind : std::uint8_t { floating, integer, normal_float };

struct dtype {
  std::string_view name{};
  std::uint32_t bits = 0;          ///< bits per element in memory
  dtype_kind kind = dtype_kind::floating;
  bool storable = true;            ///< false for compute-only formats (tf32)
  std::uint32_t block = 0;         ///< elements per first-level scale (0 = no scale)
  std::uint32_t scale_bits = 0;    ///< bits of each first-level scale
  std::uint32_t block2 = 0;        ///< first-level scales per second-level scale (0 = none)
  std::uint32_t scale2_bits = 0;   ///< bits of each second-level scale
  constexpr bool is_none() const { return bits == 0; }
  // Written out rather than defaulted: nvcc 13 mis-orders defaulted comparison operators.
  friend constexpr bool operator==(const dtype& a, const dtype& b) {
    return a.name == b.name && a.bits == b.bits && a.kind == b.kind && a.storable == b.storable &&
           a.block == b.block && a.scale_bits == b.scale_bits && a.block2 == b.block2 && a.scale2_bits == b.scale2_bits;
  }
};

namespace dtypes {
inline constexpr dtype none{"none", 0};
inline constexpr dtype fp64{"fp64", 64};
inline constexpr dtype fp32{"fp32", 32};
/// TensorFloat-32: a compute mode; stored as fp32, so it cannot be a storage dtype.
inline constexpr dtype tf32{"tf32", 32, dtype_kind::floating, false};
inline constexpr dtype bf16{"bf16", 16};
inline constexpr dtype fp16{"fp16", 16};
inline constexpr dtype fp8_e4m3{"fp8_e4m3", 8};
inline constexpr dtype fp8_e5m2{"fp8_e5m2", 8};
inline constexpr dtype int8{"int8", 8, dtype_kind::integer};
inline constexpr dtype int4{"int4", 4, dtype_kind::integer};
/// 4-bit NormalFloat, block 64 with an fp32 absmax per block (bitsandbytes default, QLoRA §2).
inline constexpr dtype nf4{"nf4", 4, dtype_kind::normal_float, true, 64, 32};
/// nf4 with double quantization: 8-bit scales, one fp32 per 256 scales (QLoRA §2).
inline constexpr dtype nf4_double_quant{"nf4_dq", 4, dtype_kind::normal_float, true, 64, 8, 256, 32};
/// bitsandbytes' 4-bit float (`bnb_4bit_quant_type="fp4"`): the same blocks and scales as nf4.
inline constexpr dtype fp4{"fp4", 4, dtype_kind::floating, true, 64, 32};
inline constexpr dtype fp4_double_quant{"fp4_dq", 4, dtype_kind::floating, true, 64, 8, 256, 32};
/// bitsandbytes' LLM.int8 weights (Int8Params: int8 values and one fp32 scale per output row,
/// Dettmers et al. 2022, arXiv 2208.07339), bounded as one fp32 scale per 64 values: a row is at
/// least 64 values wide in every model memalg reads.
inline constexpr dtype llm_int8{"llm_int8", 8, dtype_kind::integer, true, 64, 32};
/// GPTQ's and AWQ's int4 checkpoints (AutoGPTQ / AutoAWQ layouts, group_size 128): int4 values
/// packed in int32 words, per group of 128 input rows and output column an fp16 scale and a
/// 4-bit zero point (qzeros, packed). GPTQ's g_idx (one int32 per input row) is not counted.
inline constexpr dtype int4_g128{"int4_g128", 4, dtype_kind::integer, true, 128, 16 + 4};
/// OCP Microscaling MXFP4 (MX spec v1.0; gpt-oss's released experts): FP4 (E2M1) values in
/// blocks of 32 with one 8-bit E8M0 scale.
inline constexpr dtype mxfp4{"mxfp4", 4, dtype_kind::floating, true, 32, 8};
/// fp8 (E4M3) weights with one fp32 scale per 128×128 block (DeepSeek-V3's released weights,
/// quantization_config weight_block_size [128, 128]).
inline constexpr dtype fp8_block128{"fp8_block128", 8, dtype_kind::floating, true, 128 * 128, 32};
}  // namespace dtypes

/// A block-quantized variant of an integer/float format: one `scale` per `block` elements.
constexpr dtype blockwise(dtype base, std::uint32_t block, dtype scale = dtypes::fp32) {
  base.block = block;
  base.scale_bits = scale.bits;
  return base;
}

/// Exact bytes to store `elements` values of `d`, packing sub-byte values and counting the scales.
constexpr bytes storage_bytes(const dtype& d, std::uint64_t elements) {
  bytes total = packed_bytes(elements, d.bits);
  if (d.block != 0 && elements != 0) {
    const std::uint64_t scales = detail::ceil_div(elements, d.block);
    total += packed_bytes(scales, d.scale_bits);
    if (d.block2 != 0) total += packed_bytes(detail::ceil_div(scales, d.block2), d.scale2_bits);
  }
  return total;
}

/// Average bits per element including scales, for documentation and reports.
constexpr double effective_bits(const dtype& d) {
  double b = d.bits;
  if (d.block != 0) {
    b += static_cast<double>(d.scale_bits) / d.block;
    if (d.block2 != 0) b += static_cast<double>(d.scale2_bits) / (static_cast<double>(d.block) * d.block2);
  }
  return b;
}

/// Runtime lookup by name ("fp32", "bf16", ...); returns dtypes::none when unknown.
constexpr dtype dtype_from_name(std::string_view name) {
  for (const dtype& d : {dtypes::fp64, dtypes::fp32, dtypes::tf32, dtypes::bf16, dtypes::fp16, dtypes::fp8_e4m3,
                         dtypes::fp8_e5m2, dtypes::int8, dtypes::int4, dtypes::nf4, dtypes::nf4_double_quant,
                         dtypes::fp4, dtypes::fp4_double_quant, dtypes::llm_int8, dtypes::int4_g128, dtypes::mxfp4,
                         dtypes::fp8_block128})
    if (d.name == name) return d;
  return dtypes::none;
}

}  // namespace memalg

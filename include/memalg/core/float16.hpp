// SPDX-License-Identifier: BSL-1.0
// memalg/core/float16.hpp — 16-bit floating-point storage types shared by every backend.
//
// `bf16` (bfloat16: 1 sign, 8 exponent, 7 mantissa bits) and `fp16` (IEEE 754 binary16: 1, 5, 10)
// are *storage* types only: kernels load them into `float`, compute, and round back once. The
// conversions are written with integer operations on the bit patterns (no FPU rounding mode, no
// flush-to-zero) so that the CPU reference and a CUDA kernel that calls the same functions produce
// the same bits: round-to-nearest-even, subnormals kept, overflow to ±inf, NaN stays NaN (quiet).
//
// The types are plain aggregates `{std::uint16_t bits}` on purpose: a converting constructor from
// float would make `bf16{0x3f80}` silently mean 16256.0 instead of the bit pattern.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#include "memalg/config.hpp"

namespace memalg {

/// bfloat16 storage value (the upper half of an IEEE binary32).
struct bf16 {
  std::uint16_t bits;
};

/// IEEE 754 binary16 storage value.
struct fp16 {
  std::uint16_t bits;
};

static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2);
static_assert(std::is_trivially_copyable_v<bf16> && std::is_trivially_copyable_v<fp16>);
static_assert(std::is_standard_layout_v<bf16> && std::is_standard_layout_v<fp16>);

// ---- float -> 16 bit -------------------------------------------------------------------------

/// float -> bf16, round to nearest, ties to even. bf16 has float's exponent range, so rounding
/// the low 16 bits of the pattern is exact for normals and subnormals alike, and a carry out of
/// the mantissa correctly bumps the exponent (up to ±inf on overflow).
MEMALG_HOST_DEVICE constexpr bf16 float_to_bf16(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: truncating could clear every remaining payload bit and turn it into inf; force quiet.
    return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  }
  const std::uint32_t bias = 0x7fffu + ((u >> 16) & 1u);  // ties go to the even neighbour
  return bf16{static_cast<std::uint16_t>((u + bias) >> 16)};
}

/// float -> fp16, round to nearest, ties to even, with fp16 subnormals and overflow to ±inf.
MEMALG_HOST_DEVICE constexpr fp16 float_to_fp16(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // inf or NaN
    if (a == 0x7f800000u) return fp16{static_cast<std::uint16_t>(sign | 0x7c00u)};
    // NaN: keep the top payload bits, set the quiet bit so the result cannot become inf.
    return fp16{static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu))};
  }
  // 65520 = 0x477ff000 is halfway between 65504 (largest finite, odd mantissa) and 2^16: ties and
  // everything above round to inf.
  if (a >= 0x477ff000u) return fp16{static_cast<std::uint16_t>(sign | 0x7c00u)};
  if (a >= 0x38800000u) {  // >= 2^-14: normal fp16; rebias exponent 127 -> 15, round 13 bits
    std::uint32_t m = a - 0x38000000u;
    m += 0x0fffu + ((m >> 13) & 1u);
    return fp16{static_cast<std::uint16_t>(sign | (m >> 13))};
  }
  // At or below 2^-25 (half the smallest subnormal, a tie towards the even 0): signed zero.
  if (a <= 0x33000000u) return fp16{sign};
  // Subnormal result k * 2^-24 with k = significand * 2^(e - 150 + 24), rounded to nearest even.
  const std::uint32_t e = a >> 23;                                // 102..112
  const std::uint32_t mant = (a & 0x007fffffu) | 0x00800000u;     // 24-bit significand
  const std::uint32_t shift = 126u - e;                           // 14..24
  std::uint32_t k = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (k & 1u))) ++k;  // k == 0x400 becomes the smallest normal
  return fp16{static_cast<std::uint16_t>(sign | k)};
}

// ---- 16 bit -> float (exact) -----------------------------------------------------------------

MEMALG_HOST_DEVICE constexpr float bf16_to_float(bf16 h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h.bits) << 16);
}

MEMALG_HOST_DEVICE constexpr float fp16_to_float(fp16 h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  std::uint32_t e = (h.bits >> 10) & 0x1fu;
  std::uint32_t m = h.bits & 0x03ffu;
  if (e == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));  // inf / NaN
  if (e == 0) {
    if (m == 0) return std::bit_cast<float>(sign);
    // Subnormal m * 2^-24: normalise so the leading one sits at bit 10; each shift halves the scale.
    e = 1;
    while ((m & 0x0400u) == 0) {
      m <<= 1;
      --e;
    }
    m &= 0x03ffu;
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));  // 112 = 127 - 15
}

// ---- generic helpers used by the kernels ------------------------------------------------------

/// Accumulation type of a storage type: double for double, float for everything else.
template <class T>
struct accum {
  using type = float;
};
template <>
struct accum<double> {
  using type = double;
};
template <class T>
using accum_t = typename accum<T>::type;

/// The storage types the kernels are instantiated for.
template <class T>
concept storage_type = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                       std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

/// Load a storage value into its accumulation type (exact).
template <storage_type T>
MEMALG_HOST_DEVICE constexpr accum_t<T> to_float(T x) noexcept {
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16_to_float(x);
  } else if constexpr (std::is_same_v<T, fp16>) {
    return fp16_to_float(x);
  } else {
    return x;
  }
}

/// Round an accumulator value to the storage type (round to nearest even). For the 16-bit types
/// the argument is a float (their accumulation type); a double argument would first be rounded to
/// float, which is not a correctly rounded double -> 16-bit conversion.
template <storage_type T>
MEMALG_HOST_DEVICE constexpr T from_float(accum_t<T> x) noexcept {
  if constexpr (std::is_same_v<T, bf16>) {
    return float_to_bf16(x);
  } else if constexpr (std::is_same_v<T, fp16>) {
    return float_to_fp16(x);
  } else {
    return x;
  }
}

}  // namespace memalg

// SPDX-License-Identifier: BSL-1.0
// Bit-exact tests of the bf16 / fp16 conversions: known patterns, ties to even, subnormals,
// overflow, inf/NaN, round trips over every 16-bit pattern, and a comparison with an independent
// nearest-value search for a million random floats.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "memalg/core/float16.hpp"

using namespace memalg;

namespace {
float f32(std::uint32_t bits) { return std::bit_cast<float>(bits); }
std::uint16_t bf(std::uint32_t float_bits) { return float_to_bf16(f32(float_bits)).bits; }
std::uint16_t hf(float f) { return float_to_fp16(f).bits; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }
bool fp16_is_nan(std::uint16_t b) { return (b & 0x7c00u) == 0x7c00u && (b & 0x03ffu) != 0; }
}  // namespace

// Usable in constant expressions (and therefore on both host and device).
static_assert(float_to_bf16(1.0f).bits == 0x3f80);
static_assert(float_to_fp16(1.0f).bits == 0x3c00);
static_assert(bf16_to_float(bf16{0x4049}) == 3.140625f);
static_assert(fp16_to_float(fp16{0x0001}) == 0x1p-24f);
static_assert(std::is_same_v<accum_t<double>, double> && std::is_same_v<accum_t<float>, float> &&
              std::is_same_v<accum_t<bf16>, float> && std::is_same_v<accum_t<fp16>, float>);

TEST_CASE("bf16: known patterns") {
  CHECK(bf(0x3f800000) == 0x3f80);  // 1
  CHECK(bf(0xc0000000) == 0xc000);  // -2
  CHECK(bf(0x00000000) == 0x0000);
  CHECK(bf(0x80000000) == 0x8000);  // -0 keeps its sign
  CHECK(float_to_bf16(3.14159265f).bits == 0x4049);
  CHECK(float_to_bf16(0.1f).bits == 0x3dcd);  // 0x3dcccccd rounds up
  CHECK(bf16_to_float(bf16{0x3f80}) == 1.0f);
  CHECK(bf16_to_float(bf16{0xc2f7}) == -123.5f);
}

TEST_CASE("bf16: round to nearest, ties to even") {
  CHECK(bf(0x3f808000) == 0x3f80);  // exactly halfway, 0x3f80 is even -> down
  CHECK(bf(0x3f818000) == 0x3f82);  // exactly halfway, 0x3f81 is odd -> up
  CHECK(bf(0x3f808001) == 0x3f81);  // just above halfway -> up
  CHECK(bf(0x3f807fff) == 0x3f80);  // just below halfway -> down
  CHECK(bf(0xbf818000) == 0xbf82);  // negative ties behave symmetrically
  CHECK(bf(0x3fffffff) == 0x4000);  // mantissa carry bumps the exponent
}

TEST_CASE("bf16: overflow, inf and NaN") {
  CHECK(bf(0x7f7f7fff) == 0x7f7f);  // below the tie: largest finite bf16
  CHECK(bf(0x7f7f8000) == 0x7f80);  // tie with odd 0x7f7f -> rounds to +inf
  CHECK(bf(0x7f7fffff) == 0x7f80);  // FLT_MAX -> +inf
  CHECK(bf(0xff7fffff) == 0xff80);  // -FLT_MAX -> -inf
  CHECK(bf(0x7f800000) == 0x7f80);
  CHECK(bf(0xff800000) == 0xff80);
  CHECK(bf(0x7fc00000) == 0x7fc0);  // canonical quiet NaN
  CHECK(bf(0xffc00000) == 0xffc0);  // sign kept
  CHECK(bf(0x7f800001) == 0x7fc0);  // signalling NaN whose payload is in the dropped bits: not inf
  CHECK(bf16_is_nan(bf(0x7fffffff)));
  CHECK(std::isinf(bf16_to_float(bf16{0x7f80})));
  CHECK(std::isnan(bf16_to_float(bf16{0x7fc1})));
}

TEST_CASE("bf16: subnormals") {
  CHECK(bf(0x00010000) == 0x0001);  // smallest bf16 subnormal is exact
  CHECK(bf(0x00008000) == 0x0000);  // half of it: tie to even zero
  CHECK(bf(0x00008001) == 0x0001);
  CHECK(bf(0x00018000) == 0x0002);  // tie, 1 is odd -> 2
  CHECK(bf(0x00000001) == 0x0000);  // smallest float subnormal flushes by rounding, not by FTZ
  CHECK(bf(0x807fffff) == 0x8080);  // largest negative subnormal rounds up to -FLT_MIN
  CHECK(std::bit_cast<std::uint32_t>(bf16_to_float(bf16{0x0001})) == 0x00010000u);
}

TEST_CASE("bf16: every pattern round-trips") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const std::uint16_t back = float_to_bf16(bf16_to_float(bf16{h})).bits;
    if (bf16_is_nan(h)) {
      if (!bf16_is_nan(back)) FAIL_CHECK("NaN lost at " << b);
    } else if (back != h) {
      FAIL_CHECK("round trip " << b << " -> " << back);
    }
  }
}

TEST_CASE("fp16: known patterns") {
  CHECK(hf(1.0f) == 0x3c00);
  CHECK(hf(-2.0f) == 0xc000);
  CHECK(hf(0.0f) == 0x0000);
  CHECK(hf(-0.0f) == 0x8000);
  CHECK(hf(0.1f) == 0x2e66);
  CHECK(hf(65504.0f) == 0x7bff);      // largest finite
  CHECK(hf(0x1p-14f) == 0x0400);      // smallest normal
  CHECK(fp16_to_float(fp16{0x3555}) == 0.333251953125f);
  CHECK(fp16_to_float(fp16{0x7bff}) == 65504.0f);
  CHECK(fp16_to_float(fp16{0x0400}) == 0x1p-14f);
  CHECK(fp16_to_float(fp16{0x03ff}) == 1023 * 0x1p-24f);
  CHECK(fp16_to_float(fp16{0x8001}) == -0x1p-24f);
  CHECK(std::signbit(fp16_to_float(fp16{0x8000})));
}

TEST_CASE("fp16: round to nearest, ties to even") {
  CHECK(hf(1.0f + 0x1p-11f) == 0x3c00);      // tie, even stays
  CHECK(hf(1.0f + 3 * 0x1p-11f) == 0x3c02);  // tie, odd 0x3c01 rounds up
  CHECK(hf(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);
  CHECK(hf(2047.5f) == 0x6800);  // 2047.5 between 2047 and 2048 (spacing 1): tie -> even 2048
  CHECK(hf(2046.5f) == 0x67fe);  // tie -> even 2046
}

TEST_CASE("fp16: overflow, inf and NaN") {
  CHECK(hf(65519.996f) == 0x7bff);  // below the tie at 65520
  CHECK(hf(65520.0f) == 0x7c00);    // tie with odd 0x7bff -> inf
  CHECK(hf(-65520.0f) == 0xfc00);
  CHECK(hf(1e9f) == 0x7c00);
  CHECK(hf(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(hf(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(hf(f32(0x7fc00000)) == 0x7e00);
  CHECK(hf(f32(0xffc00000)) == 0xfe00);
  CHECK(fp16_is_nan(hf(f32(0x7f800001))));  // signalling NaN with low payload stays NaN
  CHECK(std::isinf(fp16_to_float(fp16{0x7c00})));
  CHECK(std::isnan(fp16_to_float(fp16{0x7e00})));
  CHECK(std::isnan(fp16_to_float(fp16{0x7c01})));
}

TEST_CASE("fp16: subnormals and underflow") {
  CHECK(hf(0x1p-24f) == 0x0001);               // smallest subnormal, exact
  CHECK(hf(0x1p-25f) == 0x0000);               // half of it: tie to even zero
  CHECK(hf(-0x1p-25f) == 0x8000);
  CHECK(hf(f32(0x33000001)) == 0x0001);        // just above the tie
  CHECK(hf(3 * 0x1p-25f) == 0x0002);           // 1.5 ulp: tie, odd 1 -> 2
  CHECK(hf(5 * 0x1p-25f) == 0x0002);           // 2.5 ulp: tie, even 2 stays
  CHECK(hf(1e-8f) == 0x0000);
  CHECK(hf(1023 * 0x1p-24f) == 0x03ff);        // largest subnormal
  CHECK(hf(1023.5f * 0x1p-24f) == 0x0400);     // tie -> even 0x400 = smallest normal
  CHECK(hf(0x1p-14f - 0x1p-30f) == 0x0400);
  CHECK(hf(f32(0x00000001)) == 0x0000);        // float subnormal
}

TEST_CASE("fp16: every pattern round-trips") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const std::uint16_t back = float_to_fp16(fp16_to_float(fp16{h})).bits;
    if (fp16_is_nan(h)) {
      if (!fp16_is_nan(back)) FAIL_CHECK("NaN lost at " << b);
    } else if (back != h) {
      FAIL_CHECK("round trip " << b << " -> " << back);
    }
  }
}

namespace {
// Independent reference: nearest representable value by search over the sorted magnitudes,
// ties to the even pattern. `values[k]` is the magnitude of pattern k (k < count) and the
// pattern `count` stands for the first value past the largest finite one (inf).
std::uint16_t nearest_even(const std::vector<double>& values, double mag, std::uint16_t inf_bits) {
  if (mag >= values.back()) return inf_bits;
  const auto it = std::upper_bound(values.begin(), values.end(), mag);
  const auto hi = static_cast<std::uint16_t>(it - values.begin());
  const auto lo = static_cast<std::uint16_t>(hi - 1);
  const double dlo = mag - values[lo], dhi = values[hi] - mag;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1u) ? hi : lo;
}
}  // namespace

TEST_CASE("bf16 and fp16 agree with a nearest-value search on random floats") {
  std::vector<double> bf_vals, hf_vals;
  for (std::uint32_t k = 0; k < 0x7f80; ++k) bf_vals.push_back(bf16_to_float(bf16{static_cast<std::uint16_t>(k)}));
  bf_vals.push_back(0x1p128);  // the value just past 0x7f7f (inf bits 0x7f80)
  for (std::uint32_t k = 0; k < 0x7c00; ++k) hf_vals.push_back(fp16_to_float(fp16{static_cast<std::uint16_t>(k)}));
  hf_vals.push_back(65536.0);  // just past 65504 (inf bits 0x7c00)

  std::mt19937 gen(12345);
  std::uniform_int_distribution<std::uint32_t> bits_dist;
  std::uniform_real_distribution<float> small(-70000.0f, 70000.0f);
  int bad_bf = 0, bad_hf = 0;
  for (int i = 0; i < 500000; ++i) {
    // Random bit patterns cover every exponent; uniform values stress fp16's range.
    for (const float f : {f32(bits_dist(gen)), small(gen), small(gen) * 0x1p-20f}) {
      if (std::isnan(f)) continue;
      const double mag = std::abs(static_cast<double>(f));
      const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
      if (float_to_bf16(f).bits != (sign | nearest_even(bf_vals, mag, 0x7f80))) ++bad_bf;
      if (float_to_fp16(f).bits != (sign | nearest_even(hf_vals, mag, 0x7c00))) ++bad_hf;
    }
  }
  CHECK(bad_bf == 0);
  CHECK(bad_hf == 0);
}

TEST_CASE("generic to_float / from_float") {
  CHECK(to_float(1.5) == 1.5);
  CHECK(to_float(1.5f) == 1.5f);
  CHECK(to_float(bf16{0x3fc0}) == 1.5f);
  CHECK(to_float(fp16{0x3e00}) == 1.5f);
  CHECK(from_float<double>(0.1) == 0.1);
  CHECK(from_float<float>(0.25f) == 0.25f);
  CHECK(from_float<bf16>(1.5f).bits == 0x3fc0);
  CHECK(from_float<fp16>(1.5f).bits == 0x3e00);
}

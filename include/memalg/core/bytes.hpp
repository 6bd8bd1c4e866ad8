// SPDX-License-Identifier: BSL-1.0
// memalg/core/bytes.hpp — a strong quantity for memory sizes.
//
// `bytes` is an unsigned 64-bit count with checked arithmetic: an overflow during constant
// evaluation calls a non-constexpr function, so the build fails naming
// `byte_count_overflows_64_bits`; at run time the same overflow throws std::overflow_error.
// Units: KiB/MiB/GiB are powers of two, KB/MB/GB powers of ten; both are exact and both can be
// printed (many tools print GiB and label it "GB"; memalg never does).
#pragma once

#include <compare>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace memalg {

namespace detail {
// Deliberately not constexpr: reaching one of these during constant evaluation is a compile error
// whose text names the problem.
[[noreturn]] inline void byte_count_overflows_64_bits() {
  throw std::overflow_error("memalg: byte count overflows 64 bits");
}
[[noreturn]] inline void byte_count_underflows_below_zero() {
  throw std::underflow_error("memalg: byte subtraction below zero");
}
[[noreturn]] inline void division_by_zero_shard_degree() {
  throw std::domain_error("memalg: division of a byte count by zero");
}

// The largest count, as a constant: the byte algebra checks against it hundreds of thousands of
// times in one compile-time search, where every function call (numeric_limits<>::max()) costs
// microseconds.
inline constexpr std::uint64_t max_count = std::numeric_limits<std::uint64_t>::max();

// Plain comparisons rather than __builtin_*_overflow: nvcc's front end does not evaluate those
// builtins in constant expressions.
constexpr std::uint64_t checked_add(std::uint64_t a, std::uint64_t b) {
  if (b > max_count - a) byte_count_overflows_64_bits();
  return a + b;
}
constexpr std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > max_count / a) byte_count_overflows_64_bits();
  return a * b;
}
constexpr std::uint64_t checked_sub(std::uint64_t a, std::uint64_t b) {
  if (b > a) byte_count_underflows_below_zero();
  return a - b;
}
/// ceil(a / b) without overflow; b must be non-zero.
constexpr std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) {
  if (b == 0) division_by_zero_shard_degree();
  return a / b + (a % b != 0 ? 1 : 0);
}
}  // namespace detail

/// A number of bytes. Regular, totally ordered, with checked + − × and ceiling division.
struct bytes {
  std::uint64_t value = 0;

  constexpr bytes() = default;
  constexpr explicit bytes(std::uint64_t v) : value(v) {}

  constexpr std::uint64_t count() const { return value; }
  // Written out rather than defaulted: nvcc 13 mis-orders defaulted comparison operators.
  friend constexpr bool operator==(bytes a, bytes b) { return a.value == b.value; }
  friend constexpr std::strong_ordering operator<=>(bytes a, bytes b) { return a.value <=> b.value; }
  // The relational operators written out as well: through <=> each comparison is three calls,
  // which a compile-time search pays thousands of times.
  friend constexpr bool operator<(bytes a, bytes b) { return a.value < b.value; }
  friend constexpr bool operator<=(bytes a, bytes b) { return a.value <= b.value; }
  friend constexpr bool operator>(bytes a, bytes b) { return a.value > b.value; }
  friend constexpr bool operator>=(bytes a, bytes b) { return a.value >= b.value; }

  // The checks are written into each operator rather than called: a compile-time search applies
  // these operators hundreds of thousands of times, and in constant evaluation every call counts.
  friend constexpr bytes operator+(bytes a, bytes b) {
    if (b.value > detail::max_count - a.value) detail::byte_count_overflows_64_bits();
    a.value += b.value;
    return a;
  }
  friend constexpr bytes operator-(bytes a, bytes b) {
    if (b.value > a.value) detail::byte_count_underflows_below_zero();
    a.value -= b.value;
    return a;
  }
  friend constexpr bytes operator*(bytes a, std::uint64_t n) {
    if (a.value != 0 && n > detail::max_count / a.value) detail::byte_count_overflows_64_bits();
    a.value *= n;
    return a;
  }
  friend constexpr bytes operator*(std::uint64_t n, bytes a) { return a * n; }
  constexpr bytes& operator+=(bytes b) {
    if (b.value > detail::max_count - value) detail::byte_count_overflows_64_bits();
    value += b.value;
    return *this;
  }
  constexpr bytes& operator-=(bytes b) {
    if (b.value > value) detail::byte_count_underflows_below_zero();
    value -= b.value;
    return *this;
  }

  /// Ceiling division: what the most loaded of `n` equal shards holds.
  constexpr bytes shard(std::uint64_t n) const {
    if (n == 0) detail::division_by_zero_shard_degree();
    bytes r = *this;
    r.value = value / n + (value % n != 0 ? 1 : 0);
    return r;
  }
  /// Exact ratio as a double (for headroom percentages; never used to decide fit).
  constexpr double ratio(bytes denominator) const {
    return denominator.value == 0 ? 0.0 : static_cast<double>(value) / static_cast<double>(denominator.value);
  }
};

constexpr bytes max(bytes a, bytes b) { return a < b ? b : a; }
constexpr bytes min(bytes a, bytes b) { return a < b ? a : b; }
/// `a - b`, or zero where `b` is larger: for what is left of an amount after a release that may
/// exceed it (a phase that frees more than a moment still holds). Plain `-` stays checked.
constexpr bytes saturating_sub(bytes a, bytes b) { return a > b ? bytes{a.value - b.value} : bytes{}; }

/// Bytes needed to store `elements` values of `bits` bits each, packed (sub-byte types share bytes).
constexpr bytes packed_bytes(std::uint64_t elements, std::uint64_t bits) {
  // elements * bits may overflow for absurd counts: check it.
  return bytes{detail::ceil_div(detail::checked_mul(elements, bits), 8)};
}

inline namespace literals {
constexpr bytes operator""_B(unsigned long long v) { return bytes{v}; }
constexpr bytes operator""_KiB(unsigned long long v) { return bytes{detail::checked_mul(v, 1ULL << 10)}; }
constexpr bytes operator""_MiB(unsigned long long v) { return bytes{detail::checked_mul(v, 1ULL << 20)}; }
constexpr bytes operator""_GiB(unsigned long long v) { return bytes{detail::checked_mul(v, 1ULL << 30)}; }
constexpr bytes operator""_TiB(unsigned long long v) { return bytes{detail::checked_mul(v, 1ULL << 40)}; }
constexpr bytes operator""_KB(unsigned long long v) { return bytes{detail::checked_mul(v, 1'000ULL)}; }
constexpr bytes operator""_MB(unsigned long long v) { return bytes{detail::checked_mul(v, 1'000'000ULL)}; }
constexpr bytes operator""_GB(unsigned long long v) { return bytes{detail::checked_mul(v, 1'000'000'000ULL)}; }
constexpr bytes operator""_TB(unsigned long long v) { return bytes{detail::checked_mul(v, 1'000'000'000'000ULL)}; }
}  // namespace literals

/// How a byte count is printed.
enum class byte_unit { automatic_binary, B, KiB, MiB, GiB, GB, TiB, PiB, EiB };

namespace detail {
inline std::string fixed2(double v) {
  // Two decimals without iostreams or locale: round half away from zero. (Built with append rather
  // than operator+ to stay clear of a g++ 12 -Wrestrict false positive.)
  const auto scaled = static_cast<std::uint64_t>(v * 100.0 + 0.5);
  std::string out = std::to_string(scaled / 100);
  const std::uint64_t cents = scaled % 100;
  out.push_back('.');
  out.push_back(static_cast<char>('0' + cents / 10));
  out.push_back(static_cast<char>('0' + cents % 10));
  return out;
}
}  // namespace detail

/// "1.50 GiB", "31.40 GB", "512 B", "2.55 TiB". `automatic_binary` picks the largest binary unit ≥ 1.
inline std::string to_string(bytes b, byte_unit unit = byte_unit::automatic_binary) {
  const auto v = static_cast<double>(b.value);
  switch (unit) {
    case byte_unit::B: return std::to_string(b.value) + " B";
    case byte_unit::KiB: return detail::fixed2(v / 1024.0) + " KiB";
    case byte_unit::MiB: return detail::fixed2(v / 1048576.0) + " MiB";
    case byte_unit::GiB: return detail::fixed2(v / 1073741824.0) + " GiB";
    case byte_unit::GB: return detail::fixed2(v / 1e9) + " GB";
    case byte_unit::TiB: return detail::fixed2(v / 1099511627776.0) + " TiB";
    case byte_unit::PiB: return detail::fixed2(v / 1125899906842624.0) + " PiB";
    case byte_unit::EiB: return detail::fixed2(v / 1152921504606846976.0) + " EiB";
    case byte_unit::automatic_binary: break;
  }
  if (b.value < (1ULL << 10)) return to_string(b, byte_unit::B);
  if (b.value < (1ULL << 20)) return to_string(b, byte_unit::KiB);
  if (b.value < (1ULL << 30)) return to_string(b, byte_unit::MiB);
  if (b.value < (1ULL << 40)) return to_string(b, byte_unit::GiB);
  if (b.value < (1ULL << 50)) return to_string(b, byte_unit::TiB);
  if (b.value < (1ULL << 60)) return to_string(b, byte_unit::PiB);
  return to_string(b, byte_unit::EiB);
}

}  // namespace memalg

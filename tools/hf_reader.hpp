// SPDX-License-Identifier: BSL-1.0
// tools/hf_reader.hpp — reading a Hugging Face config.json's fields, checked (internal to the tool:
// hf_config.cpp reads the families of 2019–2024, hf_families.cpp those of 2024–2026).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "planner.hpp"

namespace memalg::cli::hf {

using nlohmann::json;

/// The largest dimension accepted: larger is not a model, and it keeps every product in 64 bits.
constexpr std::uint64_t max_dimension = 1ULL << 24;

struct reader {
  const json& j;
  std::string_view source;
  std::string_view architecture;

  [[noreturn]] void fail(const std::string& what) const { throw usage_error(std::string(source) + ": " + what); }

  const json* find(std::initializer_list<const char*> names) const {
    for (const char* n : names) {
      const auto it = j.find(n);
      if (it != j.end() && !it->is_null()) return &*it;
    }
    return nullptr;
  }
  static std::string names_of(std::initializer_list<const char*> names) {
    std::string s;
    for (const char* n : names) {
      if (!s.empty()) s += "' or '";
      s += n;
    }
    return "'" + s + "'";
  }
  /// A positive integer field (the first of `names` present).
  std::uint64_t count(std::initializer_list<const char*> names) const {
    const json* v = find(names);
    if (v == nullptr)
      fail("missing field " + names_of(names) + " (needed for " + std::string(architecture) + ")");
    return check_count(*v, *names.begin());
  }
  std::uint64_t count_or(std::initializer_list<const char*> names, std::uint64_t fallback) const {
    const json* v = find(names);
    return v == nullptr ? fallback : check_count(*v, *names.begin());
  }
  /// A non-negative integer field (a number of layers that may be none), or `fallback`.
  std::uint64_t count_or_none(std::initializer_list<const char*> names, std::uint64_t fallback) const {
    const json* v = find(names);
    if (v == nullptr) return fallback;
    if (v->is_number_integer() && v->get<std::int64_t>() == 0) return 0;
    return check_count(*v, *names.begin());
  }
  std::uint64_t check_count(const json& v, const char* name) const {
    std::uint64_t n = 0;
    if (v.is_number_unsigned()) n = v.get<std::uint64_t>();
    else if (v.is_number_integer() && v.get<std::int64_t>() > 0) n = static_cast<std::uint64_t>(v.get<std::int64_t>());
    else if (v.is_number_float() && v.get<double>() >= 1 && v.get<double>() <= static_cast<double>(max_dimension) &&
             v.get<double>() == static_cast<double>(static_cast<std::uint64_t>(v.get<double>())))
      n = static_cast<std::uint64_t>(v.get<double>());
    else
      fail("field '" + std::string(name) + "' must be a positive integer, not " + v.dump());
    if (n == 0) fail("field '" + std::string(name) + "' must be at least 1");
    if (n > max_dimension)
      fail("field '" + std::string(name) + "' is " + std::to_string(n) + ", larger than any model dimension (" +
           std::to_string(max_dimension) + ")");
    return n;
  }
  /// The largest of the dropout probabilities present, in thousandths.
  std::uint64_t dropout_permille(std::initializer_list<const char*> names) const {
    double p = 0;
    for (const char* n : names) {
      const auto it = j.find(n);
      if (it == j.end() || it->is_null()) continue;
      if (!it->is_number() || it->get<double>() < 0 || it->get<double>() >= 1)
        fail("field '" + std::string(n) + "' must be a probability in [0, 1), not " + it->dump());
      p = it->get<double>() > p ? it->get<double>() : p;
    }
    return static_cast<std::uint64_t>(p * 1000 + 0.5);
  }
  std::string string_or(std::initializer_list<const char*> names, const char* fallback) const {
    const json* v = find(names);
    if (v == nullptr) return fallback;
    if (!v->is_string()) fail("field '" + std::string(*names.begin()) + "' must be a string, not " + v->dump());
    return v->get<std::string>();
  }
  /// A fraction in (0, 1] (the first of `names` present), or `fallback`.
  double fraction_or(std::initializer_list<const char*> names, double fallback) const {
    const json* v = find(names);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !(v->get<double>() > 0) || v->get<double>() > 1)
      fail("field '" + std::string(*names.begin()) + "' must be a number in (0, 1], not " + v->dump());
    return v->get<double>();
  }
  /// A norm's ε: a number in (0, 0.1] (the first of `names` present), or `fallback`.
  double epsilon_or(std::initializer_list<const char*> names, double fallback) const {
    const json* v = find(names);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !(v->get<double>() > 0) || v->get<double>() > 0.1)
      fail("field '" + std::string(*names.begin()) + "' must be a number in (0, 0.1], not " + v->dump());
    return v->get<double>();
  }
  bool flag_or(std::initializer_list<const char*> names, bool fallback) const {
    const json* v = find(names);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail("field '" + std::string(*names.begin()) + "' must be true or false, not " + v->dump());
    return v->get<bool>();
  }
};

/// At most 80 printable characters of a name from the file.
inline std::string shown(std::string_view name) {
  std::string s(name.substr(0, 80));
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = '?';
  return s;
}

/// Whether a GeLU MLP's activation (`names`, else `fallback`) is written out as its tanh formula
/// (transformers' `gelu_new`, whose intermediates autograd saves) rather than one op that saves
/// its input (`gelu`, `gelu_pytorch_tanh`: F.gelu). Any other activation is refused: its memory is
/// not modelled.
inline bool gelu_kind(const reader& r, std::initializer_list<const char*> names, const char* fallback) {
  const std::string a = r.string_or(names, fallback);
  if (a == "gelu_new") return true;
  if (a == "gelu" || a == "gelu_pytorch_tanh") return false;
  r.fail("unknown activation '" + shown(a) + "' in '" + *names.begin() + "' (planned: gelu_new, gelu, gelu_pytorch_tanh)");
}

/// Rotated dimensions per head: `rotary_pct` (or `partial_rotary_factor`) of the head, as
/// GPT-NeoX's rotary embedding takes int(head_dim × pct).
inline std::uint64_t rotary_dims(const reader& r, std::uint64_t head_dim) {
  const double pct = r.fraction_or({"rotary_pct", "partial_rotary_factor"}, 1.0);
  const auto d = static_cast<std::uint64_t>(static_cast<double>(head_dim) * pct);
  return d == 0 ? 1 : d;
}

// Checked arithmetic for counts: an overflow is a usage error (an absurd config), not a crash.
inline std::uint64_t mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a)
    throw usage_error("the parameter count of this configuration overflows 64 bits");
  return a * b;
}
inline std::uint64_t add(std::uint64_t a, std::uint64_t b) {
  if (b > std::numeric_limits<std::uint64_t>::max() - a)
    throw usage_error("the parameter count of this configuration overflows 64 bits");
  return a + b;
}

/// Whether `family` is one of the families of 2024–2026 (hf_families.cpp).
bool current_family(std::string_view family);
/// Reads a config of such a family into `m` (architecture, family and notes already set).
hf_model read_current_family(const json& top, hf_model m, std::string_view source, const import_options& options);

}  // namespace memalg::cli::hf

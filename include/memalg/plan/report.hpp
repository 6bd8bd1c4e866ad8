// memalg/plan/report.hpp — human-readable tables of a plan (used by the examples and the CLI).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "memalg/plan/evaluate.hpp"

namespace memalg {

namespace detail {
inline std::string pad_right(std::string_view s, std::size_t w) {
  std::string r(s);
  if (r.size() < w) r.append(w - r.size(), ' ');
  return r;
}
inline std::string pad_left(std::string_view s, std::size_t w) {
  std::string r;
  if (s.size() < w) r.append(w - s.size(), ' ');
  r += s;
  return r;
}
}  // namespace detail

/// Per-category table of the most loaded rank (device and host), then the verdict.
inline std::string breakdown_table(const plan_result& r, const device_desc& d) {
  using detail::pad_left;
  using detail::pad_right;
  std::string out;
  out += pad_right("category", 18) + pad_left("device", 14) + pad_left("host", 14) + "\n";
  for (std::size_t i = 0; i < category_count; ++i) {
    const category c = category(i);
    out += pad_right(category_name(c), 18) + pad_left(to_string(r.per_rank[c]), 14) +
           pad_left(to_string(r.host_per_rank[c]), 14) + "\n";
  }
  out += pad_right("total (peak)", 18) + pad_left(to_string(r.per_rank.total()), 14) +
         pad_left(to_string(r.host_per_rank.total()), 14) + "\n";
  out += "peak at phase '" + std::string(phase_name(r.peak_phase)) + "' on pipeline stage " +
         std::to_string(r.most_loaded_stage) + "\n";
  out += "device " + std::string(d.name) + ": capacity " + to_string(d.capacity) + ", limit " + to_string(r.limit) +
         ", usable for tensors " + to_string(r.usable) + "\n";
  if (r.fits)
    out += "fits: yes, headroom " + to_string(r.headroom()) + "\n";
  else
    out += "fits: NO, short by " + to_string(r.shortfall()) + "\n";
  return out;
}

/// Device bytes of the most loaded rank at each phase of the step.
inline std::string phase_table(const plan_result& r) {
  std::string out = detail::pad_right("phase", 18) + detail::pad_left("device", 14) + "\n";
  for (std::size_t i = 0; i < phase_count; ++i)
    out += detail::pad_right(phase_name(phase(i)), 18) + detail::pad_left(to_string(r.most_loaded.at[i].total()), 14) +
           (phase(i) == r.peak_phase ? "  <- peak" : "") + "\n";
  return out;
}

}  // namespace memalg

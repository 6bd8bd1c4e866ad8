// SPDX-License-Identifier: BSL-1.0
// tests/golden/golden.hpp — golden training trajectories: what a step program must reproduce bit for
// bit (tests/data/golden/, where README.md says which commit and command recorded them).
//
// A record is one rank of one run: the loss and the global gradient norm of every step as IEEE-754
// bit patterns, an FNV-1a 64 digest of the final weights of every unit (in logical order, gathered
// under ZeRO-3) and one of the rank's checkpoint sections (names and bytes; the loss scaler by its
// scale, good steps and skipped steps, its struct having padding). The hyper-parameters of each
// group of runs are written out here, not taken from any default, so that changing a default
// changes no golden trajectory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <memalg/backend/cpu/loss_scaler.hpp>
#include <memalg/exec/checkpoint.hpp>
#include <memalg/exec/program.hpp>

namespace memalg_golden {

/// One rank of one recorded run.
struct record {
  std::string key;  ///< "<group>.<case> rank<r>/<n>"
  std::vector<std::uint32_t> loss, norm;
  std::uint64_t weights = 0, sections = 0;
};

inline std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// FNV-1a, 64 bits (Fowler, Noll, Vo; the IETF draft draft-eastlake-fnv).
struct fnv1a {
  std::uint64_t h = 14695981039346656037ull;
  void add(const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  }
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void add_value(const T& v) {
    add(&v, sizeof v);
  }
};

/// Digest of every unit's weights of a trainer or step backend (unit_count, unit_weights).
template <class T>
std::uint64_t weights_digest(T& t) {
  fnv1a f;
  for (std::size_t u = 0; u < t.unit_count(); ++u) {
    const std::vector<float> w = t.unit_weights(u);
    f.add(w.data(), w.size() * sizeof(float));
  }
  return f.h;
}

/// Digest of a rank's checkpoint sections (after store_counters).
inline std::uint64_t sections_digest(const std::vector<memalg::exec::checkpoint_section>& sections) {
  fnv1a f;
  for (const auto& s : sections) {
    f.add(s.name.data(), s.name.size());
    if (s.name == "loss_scaler") {
      memalg::backend::cpu::dynamic_loss_scaler scaler;
      static_assert(std::is_trivially_copyable_v<memalg::backend::cpu::dynamic_loss_scaler>);
      if (s.data.size() != sizeof scaler) throw std::runtime_error("golden: the loss scaler section has another size");
      std::memcpy(static_cast<void*>(&scaler), s.data.data(), sizeof scaler);
      f.add_value(scaler.scale());
      f.add_value(static_cast<std::int64_t>(scaler.good_steps()));
      f.add_value(static_cast<std::int64_t>(scaler.skipped_steps()));
    } else {
      f.add_value(static_cast<std::uint64_t>(s.data.size()));
      f.add(s.data.data(), s.data.size());
    }
  }
  return f.h;
}

inline std::string key_of(const std::string& run, int rank, int ranks) {
  return run + " rank" + std::to_string(rank) + "/" + std::to_string(ranks);
}

inline std::string hex(std::uint64_t v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%0*llx", digits, static_cast<unsigned long long>(v));
  return buf;
}

/// One line: `<key> loss=<hex,...> norm=<hex,...> weights=<hex> sections=<hex>`.
inline std::string format(const record& r) {
  std::string s = r.key;
  const auto list = [&s](const char* name, const std::vector<std::uint32_t>& v) {
    s += name;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) s += ',';
      s += hex(v[i], 8);
    }
  };
  list(" loss=", r.loss);
  list(" norm=", r.norm);
  s += " weights=";
  s += hex(r.weights, 16);
  s += " sections=";
  s += hex(r.sections, 16);
  return s;
}

inline std::vector<std::uint32_t> parse_list(const std::string& text) {
  std::vector<std::uint32_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(static_cast<std::uint32_t>(std::stoul(item, nullptr, 16)));
  return out;
}

/// The records of a golden file by key; `#` starts a comment line. Throws if the file is missing.
inline std::map<std::string, record> load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("golden: cannot read " + path);
  std::map<std::string, record> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    record r;
    const std::size_t loss = line.find(" loss=");
    if (loss == std::string::npos) throw std::runtime_error("golden: a line without loss= in " + path);
    r.key = line.substr(0, loss);
    std::stringstream fields(line.substr(loss + 1));
    for (std::string f; fields >> f;) {
      const std::size_t eq = f.find('=');
      const std::string name = f.substr(0, eq), value = f.substr(eq + 1);
      if (name == "loss") r.loss = parse_list(value);
      else if (name == "norm") r.norm = parse_list(value);
      else if (name == "weights") r.weights = std::stoull(value, nullptr, 16);
      else if (name == "sections") r.sections = std::stoull(value, nullptr, 16);
    }
    out[r.key] = r;
  }
  return out;
}

/// Empty if `got` equals `want`, else what differs first (for a test's message).
inline std::string compare(const record& got, const record& want) {
  if (got.loss != want.loss) return "losses differ: got " + format(got) + ", want " + format(want);
  if (got.norm != want.norm) return "gradient norms differ: got " + format(got) + ", want " + format(want);
  if (got.weights != want.weights) return "final weights differ";
  if (got.sections != want.sections) return "checkpoint sections differ";
  return {};
}

#ifdef MEMALG_GOLDEN_DIR
inline std::string path(const char* file) { return std::string(MEMALG_GOLDEN_DIR) + "/" + file; }
#endif

// ---- the hyper-parameters of each group, written out ------------------------------------------
/// The single-rank test matrix (tests/host/runtime_plans.hpp's runtime_matrix), 5 steps.
inline constexpr memalg::exec::optimizer_hparams matrix_hparams{
    .lr = 1e-3f, .weight_decay = 0.0f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .momentum = 0.9f, .max_grad_norm = 1.0f};
inline constexpr int matrix_steps = 5;
/// The parallel layouts of tests/mpi/test_step_program_parallel.cpp, 4 steps (clipping active).
inline constexpr memalg::exec::optimizer_hparams parallel_hparams{
    .lr = 3e-3f, .weight_decay = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .momentum = 0.9f, .max_grad_norm = 0.5f};
inline constexpr int parallel_steps = 4;
/// train_gpt_cpu's named plans on their text (seed 1), 6 steps; tiny-recompute (momentum SGD) at lr 0.05.
inline constexpr memalg::exec::optimizer_hparams named_hparams{
    .lr = 3e-3f, .weight_decay = 0.0f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .momentum = 0.9f, .max_grad_norm = 1.0f};
inline constexpr float named_momentum_lr = 0.05f;
inline constexpr int named_steps = 6;
inline constexpr std::uint64_t seed = 1;

/// A header line stating a group's hyper-parameters.
inline std::string describe(const char* group, const memalg::exec::optimizer_hparams& h, int steps) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "# %s: %d steps, lr %g, weight_decay %g, beta1 %g, beta2 %g, eps %g, momentum %g, clip %g, seed %llu",
                group, steps, static_cast<double>(h.lr), static_cast<double>(h.weight_decay), static_cast<double>(h.beta1),
                static_cast<double>(h.beta2), static_cast<double>(h.eps), static_cast<double>(h.momentum),
                static_cast<double>(h.max_grad_norm), static_cast<unsigned long long>(seed));
  return buf;
}

}  // namespace memalg_golden

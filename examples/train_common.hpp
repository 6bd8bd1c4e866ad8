// SPDX-License-Identifier: BSL-1.0
// examples/train_common.hpp — what the two training binaries (train_gpt_cpu, train_gpt_cuda)
// share: the byte-level GPT they train, how a named plan is declared, listed and found, their
// common flags (among them the optimizer's hyper-parameters), and the data. One data path is what
// makes the binaries comparable: the same seed gives the same batches on the CPU and on the GPU,
// for any split of the batch over ranks.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <memalg/core/random.hpp>
#include <memalg/exec/gpt/config.hpp>
#include <memalg/exec/program.hpp>
#include <memalg/model/transformer.hpp>

namespace train_common {

namespace m = memalg;

// ---- the model and the plans ------------------------------------------------------------------
/// The small byte-level GPT both binaries train: 4 × 64, 4 heads, a 256-byte vocabulary.
constexpr m::lm_config gpt_bytes(m::dtype logits, bool flash = false, std::uint64_t dropout_permille = 0) {
  m::lm_config c{};
  c.name = "gpt-bytes";
  c.layers = 4;
  c.hidden = 64;
  c.heads = 4;
  c.vocab = 256;
  c.positions = 64;
  c.logits = logits;
  c.flash = flash;
  c.dropout_permille = dropout_permille;
  return c;
}

/// A plan with the name `--plan` selects it by and a one-line description (a macro only because
/// the plan type's template arguments contain commas).
#define MEMALG_NAMED_PLAN(id, text_name, text_description, ...)       \
  struct id {                                                         \
    static constexpr std::string_view name = text_name;               \
    static constexpr std::string_view description = text_description; \
    using plan = __VA_ARGS__;                                         \
  }
/// The same with the plan's own default learning rate (`--lr` overrides it), for an optimizer
/// that needs another step than the runtime's default (plain or momentum SGD, say). It is the
/// binary's choice for that named run, not the plan type's: a learning rate changes no memory.
#define MEMALG_NAMED_PLAN_LR(id, text_name, text_description, default_lr, ...) \
  struct id {                                                                 \
    static constexpr std::string_view name = text_name;                       \
    static constexpr std::string_view description = text_description;         \
    static constexpr float lr = default_lr;                                   \
    using plan = __VA_ARGS__;                                                 \
  }

/// `--list-plans`: one line per plan of the tuple `Plans`: name, ranks=N, description.
template <class Plans>
void list_plans() {
  std::apply(
      [](auto... p) {
        ((std::printf("%s ranks=%llu %s\n", decltype(p)::name.data(),
                      static_cast<unsigned long long>(decltype(p)::plan::mesh.world), decltype(p)::description.data())),
         ...);
      },
      Plans{});
}

/// Calls `f(static_cast<Named*>(nullptr))` for the plan of `Plans` called `name`; false if none is.
template <class Plans, class F>
bool for_plan(std::string_view name, F&& f) {
  bool found = false;
  std::apply(
      [&](auto... p) {
        ((!found && decltype(p)::name == name ? (found = true, f(static_cast<decltype(p)*>(nullptr)), 0) : 0), ...);
      },
      Plans{});
  return found;
}

// ---- command line -----------------------------------------------------------------------------
/// Bad command-line input: the binaries print it in one line and exit with status 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The binaries' main: `body()` returns the exit status; bad command-line input (usage_error)
/// ends with status 2 and any other error with status 1, each as one line `<binary>: error: ...`.
template <class Body>
int guarded_main(const char* binary, Body&& body) {
  try {
    return body();
  } catch (const usage_error& e) {
    std::fprintf(stderr, "%s: error: %s\n", binary, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", binary, e.what());
    return 1;
  }
}

/// A named plan runs on exactly its mesh's ranks.
inline void require_world(const std::string& plan, std::uint64_t world, std::uint64_t job) {
  if (job != world)
    throw usage_error("plan " + plan + " needs " + std::to_string(world) + " ranks (mpirun -np " + std::to_string(world) +
                      "), this job has " + std::to_string(job));
}

inline std::uint64_t parse_positive(std::string_view flag, const char* text) {
  const std::string s = text ? text : "";
  if (s.empty() || s.size() > 12 || s.find_first_not_of("0123456789") != std::string::npos || s == "0" ||
      (s.size() > 1 && s[0] == '0'))
    throw usage_error(std::string(flag) + " needs a positive integer, not '" + s + "'");
  return std::stoull(s);
}

/// A finite number in [lo, hi] (`open_lo` / `open_hi`: the bound itself excluded), from all of `text`.
inline float parse_number(std::string_view flag, const char* text, double lo, double hi, bool open_lo, bool open_hi,
                          std::string_view range) {
  const std::string s = text ? text : "";
  const auto bad = [&] { return usage_error(std::string(flag) + " needs a number " + std::string(range) + ", not '" + s + "'"); };
  if (s.empty() || s.size() > 32 || s.find_first_not_of("0123456789+-.eE") != std::string::npos) throw bad();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v) || v < lo || v > hi || (open_lo && v == lo) || (open_hi && v == hi))
    throw bad();
  return static_cast<float>(v);
}

/// The flags both binaries take.
struct options {
  std::string plan = "tiny-fp32";
  std::uint64_t steps = 50;
  std::uint64_t seed = 1;
  std::string checkpoint;
  bool resume = false;
  bool json = false;
  bool list = false;
  std::string data = "/usr/share/common-licenses/GPL-3";
  /// --lr, --weight-decay, --beta1, --beta2, --eps, --momentum, --clip (defaults: optimizer_hparams').
  m::exec::optimizer_hparams hparams{};
  bool lr_given = false;  ///< --lr was given (else a named plan's own default learning rate applies)
};

/// The hyper-parameter flags' lines of `--help` (both binaries print them).
inline constexpr const char* hparams_help =
    "  --lr X            learning rate, >= 0 (default 0.003, or the plan's own; 0 keeps the weights)\n"
    "  --weight-decay X  weight decay, >= 0 (default 0)\n"
    "  --beta1 X         Adam first-moment decay, in [0, 1) (default 0.9)\n"
    "  --beta2 X         Adam second-moment decay, in [0, 1) (default 0.95)\n"
    "  --eps X           Adam epsilon, > 0 (default 1e-8)\n"
    "  --momentum X      SGD momentum, in [0, 1) (default 0.9)\n"
    "  --clip X          clip the global gradient norm to X, >= 0 (default 1; 0: no clipping)\n";

/// Parses one hyper-parameter flag into `o`; false if `flag` is none of them. A binary that uses
/// the hyper-parameters (hparams_for) calls it from parse_options' `extra`, so that one that does
/// not refuses the flags instead of ignoring them.
template <class Value>
bool parse_hparam(options& o, std::string_view flag, Value&& value) {
  constexpr double big = std::numeric_limits<float>::max();
  m::exec::optimizer_hparams& h = o.hparams;
  if (flag == "--lr") {
    h.lr = parse_number(flag, value(), 0, big, false, false, ">= 0");
    o.lr_given = true;
  } else if (flag == "--weight-decay") h.weight_decay = parse_number(flag, value(), 0, big, false, false, ">= 0");
  else if (flag == "--beta1") h.beta1 = parse_number(flag, value(), 0, 1, false, true, "in [0, 1)");
  else if (flag == "--beta2") h.beta2 = parse_number(flag, value(), 0, 1, false, true, "in [0, 1)");
  else if (flag == "--eps") h.eps = parse_number(flag, value(), 0, big, true, false, "> 0");
  else if (flag == "--momentum") h.momentum = parse_number(flag, value(), 0, 1, false, true, "in [0, 1)");
  else if (flag == "--clip") h.max_grad_norm = parse_number(flag, value(), 0, big, false, false, ">= 0 (0: no clipping)");
  else return false;
  return true;
}

/// The hyper-parameters a run of `Named` uses: the flags', with the named plan's own learning rate
/// (MEMALG_NAMED_PLAN_LR) when it has one and `--lr` was not given.
template <class Named>
m::exec::optimizer_hparams hparams_for(const options& o) {
  m::exec::optimizer_hparams h = o.hparams;
  if constexpr (requires { Named::lr; })
    if (!o.lr_given) h.lr = Named::lr;
  return h;
}

/// Parses the common flags into `Options` (derived from options); `extra(o, flag, value)` takes a
/// binary's own flags and returns whether it knew the flag (`value()` reads the flag's argument).
/// `--help` prints `help` and exits.
template <class Options, class Extra>
Options parse_options(int argc, char** argv, const char* help, Extra&& extra) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw usage_error(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "--plan") o.plan = value();
    else if (a == "--steps") o.steps = parse_positive(a, value());
    else if (a == "--seed") o.seed = parse_positive(a, value());
    else if (a == "--checkpoint") o.checkpoint = value();
    else if (a == "--data") o.data = value();
    else if (a == "--resume") o.resume = true;
    else if (a == "--json") o.json = true;
    else if (a == "--list-plans") o.list = true;
    else if (a == "--help" || a == "-h") {
      std::cout << help;
      std::exit(0);
    } else if (!extra(o, a, value))
      throw usage_error("unknown argument '" + std::string(a) + "' (see --help)");
  }
  if (o.resume && o.checkpoint.empty()) throw usage_error("--resume needs --checkpoint DIR");
  return o;
}

// ---- checkpoints ------------------------------------------------------------------------------
/// Where rank `rank` of `size` keeps its checkpoint, and what identifies the run that wrote it.
struct checkpoint_place {
  std::string fingerprint;
  std::filesystem::path file;  ///< empty without --checkpoint
};
inline checkpoint_place checkpoint_of(const options& o, std::string_view plan, int rank, int size) {
  checkpoint_place c;
  c.fingerprint = std::string(plan) + " rank " + std::to_string(rank) + "/" + std::to_string(size) + " seed " +
                  std::to_string(o.seed);
  if (!o.checkpoint.empty()) c.file = std::filesystem::path(o.checkpoint) / ("rank" + std::to_string(rank) + ".ckpt");
  return c;
}
/// `--steps` is the step a run ends at: a resumed run must start before it.
inline void require_steps_after(std::uint64_t start, const options& o) {
  if (start >= o.steps)
    throw usage_error("the checkpoint is at step " + std::to_string(start) + ", not before --steps " +
                      std::to_string(o.steps));
}

// ---- data -------------------------------------------------------------------------------------
/// The training text as byte tokens.
inline std::vector<std::int32_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw usage_error("cannot read the training text " + path + " (use --data FILE)");
  std::vector<std::int32_t> out;
  for (std::istreambuf_iterator<char> it(in), end; it != end; ++it) out.push_back(static_cast<unsigned char>(*it));
  if (out.size() < 4096) throw usage_error("the training text " + path + " is too short");
  return out;
}

/// Tokens and next-byte targets of data-parallel rank `dp_rank` for step `step`: a deterministic
/// window per global sequence, so any split of the batch over ranks sees the same data as one rank.
inline void batch_for(const std::vector<std::int32_t>& text, const m::exec::gpt_config& c, std::uint64_t seed,
                      std::uint64_t step, std::size_t dp_rank, std::vector<std::int32_t>& tok,
                      std::vector<std::int32_t>& tgt) {
  const std::size_t S = c.sequence, B = c.micro_batch;
  tok.clear();
  tgt.clear();
  for (std::size_t k = 0; k < c.grad_accum; ++k)
    for (std::size_t b = 0; b < B; ++b) {
      const std::uint64_t g = ((step * c.grad_accum + k) * c.dp + dp_rank) * B + b;
      const std::size_t start = m::splitmix64(seed * 0x9E3779B97F4A7C15ULL + g) % (text.size() - S - 1);
      for (std::size_t t = 0; t < S; ++t) {
        tok.push_back(text[start + t]);
        tgt.push_back(text[start + t + 1]);
      }
    }
}

}  // namespace train_common

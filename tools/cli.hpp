// SPDX-License-Identifier: BSL-1.0
// tools/cli.hpp — shared pieces of the `memalg` command-line tool: strict parsing of numbers,
// building the plan's literal descriptors from flags, and JSON output. Every sub-command calls the
// same constexpr `memalg::evaluate` as the compile-time plan.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <memalg/memalg.hpp>

namespace memalg::cli {

/// A user error: printed as one line on stderr, exit status 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// "7.5e9", "7.5B", "175B", "124M", "70000000", "1.2T", "32K" → an exact positive integer.
std::uint64_t parse_count(std::string_view text, std::string_view what);
/// A positive integer (no suffixes, no sign).
std::uint64_t parse_positive(std::string_view text, std::string_view what);
/// A fraction in (0, 1].
double parse_fraction(std::string_view text, std::string_view what);

/// Flags shared by every planning sub-command (model, training, mesh, device).
struct plan_flags {
  std::string params;
  std::string expert_params = "0";
  std::string largest_layer = "0";
  std::string precision = "amp-bf16";
  std::string optimizer = "adamw";
  std::string dp = "1", tp = "1", pp = "1", ep = "1", cp = "1";
  std::string zero = "0";
  std::string offload = "none";
  std::string device = "a100-80gb";
  std::string memory_cap;
  std::string reserve_mib;
  // A layer-level model: a preset, or a decoder-only transformer from its shape (flags override
  // the preset's values).
  std::string preset;
  std::string config;  ///< a Hugging Face config.json (tools/hf_config.cpp)
  std::string layers, hidden, heads, kv_heads, ffn, vocab;
  std::string positions;  ///< learned position embedding of this many positions
  bool swiglu = false;
  bool untied = false;
  bool no_bias = false;
  std::string norm;       ///< layernorm|rmsnorm
  std::string attention;  ///< naive|flash
  std::string dropout;    ///< probability in [0, 1)
  // The batch shape and recomputation (activations exist only with a sequence length).
  std::string micro_batch = "1";
  std::string seq;
  std::string grad_accum = "1";
  std::string recompute = "none";  ///< none|selective|full|every:K
  std::string checkpointing;       ///< non-reentrant|reentrant (with full / every:K)
  bool sp = false;
  std::string pp_schedule = "1f1b";  ///< 1f1b|interleaved:V|gpipe
  std::string stack = "pytorch";     ///< pytorch|megatron|memalg|paper
  std::string optimizer_impl = "foreach";  ///< foreach|for-loop|fused
  std::string stage;  ///< plan: report this pipeline stage instead of the most loaded one

  void add_to(CLI::App& app);
};

struct plan_inputs {
  model_desc model{};
  training_desc training{};
  mesh_desc mesh{};
  device_desc device{};
};

/// --stack's value → the stack, or usage_error.
stack_kind parse_stack(const std::string& name);
std::string_view stack_name(stack_kind s);

/// Builds and validates the descriptors; throws usage_error with one sentence.
plan_inputs make_inputs(const plan_flags& f);

nlohmann::json breakdown_json(const breakdown& b);
/// The plan's JSON: per rank and host bytes at the peak, its phase and stage, the bytes of every
/// phase (`phases`) and of one instance of every layer entry on the most loaded rank (`per_layer`).
nlohmann::json plan_json(const plan_inputs& in, const plan_result& r);

int run_plan(const plan_flags& f, bool json);

}  // namespace memalg::cli

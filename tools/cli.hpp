// SPDX-License-Identifier: BSL-1.0
// tools/cli.hpp — shared pieces of the `memalg` command-line tool: strict parsing of numbers,
// building the plan's literal descriptors from flags, and JSON output. Every sub-command calls the
// same constexpr `memalg::evaluate` as the compile-time plan.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>
#include <string_view>

// Declarations only: CLI11 (about 5 s of parsing) and nlohmann/json are included by the sources
// that use them, not by every file of the tool and its tests.
#include <nlohmann/json_fwd.hpp>

#include <memalg/memalg.hpp>

namespace CLI {
class App;
class ParseError;
}  // namespace CLI

namespace memalg::cli {

/// A user error: printed as one line on stderr, exit status 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// CLI11's parse error as memalg's own one-line sentence ("--seq takes one value, not 2"), for
/// `command` (the sub-command's name, or empty).
std::string parse_error_sentence(const CLI::ParseError& e, std::string_view command);

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
  std::string precision;  ///< empty: the stack's default (default_precision)
  std::string optimizer = "adamw";
  std::string dp = "1", tp = "1", pp = "1", ep = "1", cp = "1";
  std::string zero = "0";
  std::string offload = "none";
  std::string device;         ///< empty: a100-80gb, unless --device-memory
  std::string device_memory;  ///< a capacity ("24GiB", "24GB", "80G"): a device of that size
  std::string memory_cap;
  std::string reserve_mib;
  bool states_only = false;   ///< plan the model states of a layer-level model without --seq
  // A layer-level model: a preset, or a decoder-only transformer from its shape (flags override
  // the preset's values).
  std::string preset;
  std::string config;  ///< a Hugging Face config.json (tools/hf_config.cpp)
  std::string layers, hidden, heads, kv_heads, ffn, vocab;
  std::string positions;  ///< learned position embedding of this many positions
  bool swiglu = false;
  bool untied = false;
  bool no_bias = false;
  bool no_linear_bias = false;  ///< linear layers without biases, norms with (Megatron's --disable-bias-linear)
  std::string experts, top_k;   ///< a mixture of experts in every block
  std::string moe_router;       ///< softmax (Hugging Face's top-k) | sinkhorn (Megatron's)
  std::string moe_dispatcher;   ///< allgather | alltoall (Megatron's --moe-token-dispatcher-type)
  std::string moe_router_dtype;  ///< fp32 (Megatron's --moe-router-dtype); empty: the model's own
  std::string norm;       ///< layernorm|rmsnorm
  std::string attention;  ///< naive|flash
  std::string dropout;    ///< probability in [0, 1)
  // The batch shape and recomputation (activations exist only with a sequence length).
  std::string micro_batch = "1";
  std::string seq;
  std::string grad_accum = "1";
  std::string recompute;           ///< none|selective|full|every:K (empty: none, full with --base-storage)
  std::string checkpointing;       ///< non-reentrant|reentrant (with full / every:K)
  bool sp = false;
  std::string pp_schedule = "1f1b";  ///< 1f1b|interleaved:V|gpipe
  std::string stack = "pytorch";     ///< pytorch|megatron|memalg|paper
  std::string optimizer_impl = "foreach";  ///< foreach|for-loop|fused
  std::string stage;  ///< plan: report this pipeline stage instead of the most loaded one
  // Fine-tuning (model/compose.hpp): LoRA adapters of this rank on a frozen base, the projections
  // they target, their dropout, the base's storage (QLoRA), and frozen parts of the model.
  std::string lora;
  std::string lora_targets = "all-linear";
  std::string lora_dropout;
  std::string base_storage;
  std::string freeze;

  void add_to(CLI::App& app);
};

struct plan_inputs {
  model_desc model{};
  training_desc training{};
  mesh_desc mesh{};
  device_desc device{};
  std::string family;  ///< the Hugging Face model_type of --config ("" otherwise)
};

/// Whether the plan lies inside its stack's measured envelope (plan/envelope.hpp), and if not,
/// each value outside as "axis: value" ("family: gemma2", "sequence: 8192 (measured 64..2048)").
struct envelope_report {
  bool validated = false;
  std::vector<std::string> outside;
};
envelope_report envelope_report_of(const plan_inputs& in);

/// The precision `--precision` takes when not given: autocast-bf16 under the pytorch stack (the
/// Hugging Face Trainer's bf16=True), mixed-bf16-fp32-grads under the others (Megatron's bf16).
std::string_view default_precision(stack_kind s);
/// One line per precision name: what it holds per parameter (for --help and docs/cli.md).
std::string precision_help();
/// "24GiB", "24 GiB", "24GB", "80G", "512MiB" → bytes (G, GiB: 2^30; GB: 10^9); usage_error otherwise.
bytes parse_memory_size(std::string_view text, std::string_view what);

/// The transformer of --preset (when it is a decoder-only one) or of the shape flags, with the
/// flags applied; nullopt for a preset that is not a decoder-only transformer.
std::optional<lm_config> transformer_config(const plan_flags& f);

/// --stack's value → the stack, or usage_error.
stack_kind parse_stack(const std::string& name);
std::string_view stack_name(stack_kind s);

/// Builds and validates the descriptors; throws usage_error with one sentence.
plan_inputs make_inputs(const plan_flags& f);

nlohmann::json breakdown_json(const breakdown& b);
/// The plan's JSON: per rank and host bytes at the peak, its phase and stage, the bytes of every
/// phase (`phases`) and of one instance of every layer entry on the most loaded rank (`per_layer`).
nlohmann::json plan_json(const plan_inputs& in, const plan_result& r);

/// The plan of `in` (pipeline stage `stage`, or the most loaded one when negative); a byte count
/// past 64 bits is a usage_error naming the flags that make it.
plan_result evaluate_inputs(const plan_inputs& in, const plan_flags& f, long long stage = -1);
/// A layer-level model planned without --seq has activations it did not count: usage_error asking
/// for --seq, unless --states-only says that model states are the question, or the model states
/// alone do not fit (`r`, when given, says whether they do).
void require_sequence(const plan_inputs& in, const plan_flags& f, const plan_result* r = nullptr);
/// True when the model has layers but no sequence was given: the plan counts model states only.
bool states_only_plan(const plan_inputs& in);

/// A preset planned as the same model read from its Hugging Face config.json (`--config`) would
/// be: the peak of that plan and why the two differ (empty when they cannot, or no family applies).
struct preset_gap {
  bytes config_peak{};
  std::string reason;
};
preset_gap preset_config_gap(const plan_flags& f, const plan_inputs& in);

int run_plan(const plan_flags& f, bool json);

}  // namespace memalg::cli

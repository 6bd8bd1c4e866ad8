// SPDX-License-Identifier: BSL-1.0
// tools/planner.hpp — the planner's sub-commands beyond `plan`: `sweep` (the strategy search at run
// time), `emit` (a C++ header that checks a plan at compile time), `import` (a Hugging Face
// config.json as a model), and SVG charts of per-rank memory. Every number comes from the same
// constexpr functions as the compile-time plan and search (plan/evaluate.hpp, plan/search.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli.hpp"

namespace memalg::cli {

// ---- sweep --------------------------------------------------------------------------------------

/// Flags of `memalg sweep` beyond the model, recipe and device flags it shares with `plan`.
/// Dimension lists are comma-separated; an empty one takes the default (see docs/cli.md).
struct sweep_flags {
  std::string world;
  std::string zero = "0,1,2,3";
  std::string tp, pp, cp;        ///< default: powers of two dividing the world (tp ≤ 8, pp ≤ 32, cp ≤ 4)
  std::string sp = "on";         ///< sequence parallelism where tp > 1: on, off or both
  std::string recompute;         ///< none,selective,full,every:K (default: the recipe's)
  std::string micro_batch;       ///< default: the recipe's
  std::string offload = "none";  ///< none,optimizer,params
  std::string global_batch;      ///< sequences per step over the data-parallel ranks (default: --grad-accum)
  std::string top = "10";
  std::string sort = "memory";   ///< memory, comm or batch
  bool json = false;
  bool exhaustive = false;       ///< plan every configuration instead of pruning (same answers)
  std::string svg;
  std::string progress = "auto"; ///< auto (a terminal, after one second), always, never
};

/// Adds `plan`'s model, recipe and device flags and the sweep's own. The flags that are search
/// dimensions (`--tp`, `--pp`, `--cp`, `--zero`, `--offload`, and `--micro-batch`, `--recompute`,
/// `--sp` when `plan` has them) become comma-separated lists; `--dp` is world/(tp·pp·cp).
void add_sweep_flags(CLI::App& app, plan_flags& plan, sweep_flags& sweep);

/// The problem a sweep solves: the base inputs (model, recipe, device, expert degree) and the space.
struct sweep_setup {
  plan_inputs base{};
  search_problem problem{};
  search_order order = search_order::memory;
  std::size_t top = 10;
};
/// Builds and validates the problem; throws usage_error with one sentence.
sweep_setup make_sweep(const plan_flags& plan, const sweep_flags& sweep);

/// Hard limit on the configurations of one sweep (a usage error above it); a fuzzing harness lowers it.
inline std::uint64_t max_sweep_configurations = 1'000'000'000;

/// Most ranges a pruned sweep is split into to fill its listing with distinct plans (each range
/// ranks up to max_top configurations); past it every configuration is planned. A test lowers it.
inline std::uint64_t max_sweep_ranges = 1024;

/// One ranked configuration with its full plan.
struct sweep_entry {
  candidate result{};
  mesh_desc mesh{};
  training_desc training{};
  std::uint64_t folded = 0;  ///< other configurations with the identical plan, folded into this one
};
struct sweep_report {
  search_result summary{};
  std::vector<sweep_entry> ranked;    ///< the best `top` distinct plans, best first, each in its simplest spelling
  std::optional<sweep_entry> closest; ///< when nothing fits: the valid configuration needing least memory
  std::uint64_t folded = 0;           ///< configurations folded into the listed ones (the sum of their `folded`)
  std::string invalid_reason;         ///< when no configuration is valid: why, with an example
  double seconds = 0;
};

/// True when the two configurations have the same plan: every number the sweep reports or ranks
/// them by is equal — validity, the whole plan_result (the most loaded rank's stage, its breakdown
/// at every phase and at the peak, host bytes, parameters, micro-batches in flight, limit, fits),
/// every dimension of the communication, the micro-batch and accumulation, and the per-layer
/// table. The knobs that spell the configuration (ZeRO stage, degrees, offload, ...) are not
/// compared: two spellings of one plan are what the sweep folds.
bool same_plan(const sweep_setup& s, const sweep_entry& a, const sweep_entry& b);
/// The order that chooses which spelling of one plan is listed (it never decides equality): the
/// lower ZeRO stage, then no offload before optimizer before params, then less recomputation
/// (none, selective, full, every:K by ascending K), then sequence parallelism off before on, then
/// the smaller tensor, pipeline and context degrees, then the 1F1B, interleaved, GPipe schedule
/// and fewer virtual stages, then the lower index in the space (a choice listed twice).
bool simpler_spelling(const sweep_entry& a, const sweep_entry& b);

/// When no configuration of the space is valid: the reasons (tp x pp x cp not dividing the world,
/// a global batch that dp x micro-batch does not divide, the planner's own), with an example.
std::string why_invalid(const sweep_setup& s);

using progress_callback = std::function<void(std::uint64_t decided, std::uint64_t total)>;
/// The search, then its best `top` distinct plans: configurations whose plans are identical
/// (same_plan) are listed once, in the simplest spelling (simpler_spelling), and the listing is
/// filled with distinct plans before it is cut to `top`. `summary` counts every configuration.
sweep_report run_sweep_search(const sweep_setup& s, bool exhaustive, const progress_callback& progress = {});

nlohmann::json strategy_json(const strategy& c, const mesh_desc& m, const training_desc& t);
nlohmann::json comm_json(const comm_volume& v);
nlohmann::json sweep_json(const sweep_setup& s, const sweep_report& r, bool exhaustive);
std::string sweep_table(const sweep_setup& s, const sweep_report& r);
/// One line naming a configuration: "dp=8 zero=1 tp=1 pp=1 cp=1 mb=4 recompute=full offload=none".
std::string strategy_label(const strategy& c, const training_desc& t);

/// Prints a progress line on a terminal once a sweep has run longer than `after`; clears it at
/// the end. The clock and the stream are injectable for tests.
class progress_line {
 public:
  using clock = std::chrono::steady_clock;
  progress_line(std::ostream& out, bool enabled, std::chrono::milliseconds after = std::chrono::seconds(1),
                std::function<clock::time_point()> now = &clock::now);
  void update(std::uint64_t decided, std::uint64_t total);
  void finish();
  bool shown() const { return shown_; }

 private:
  std::ostream& out_;
  bool enabled_;
  std::chrono::milliseconds after_;
  std::function<clock::time_point()> now_;
  clock::time_point start_;
  clock::time_point last_{};
  bool shown_ = false;
};

int run_sweep(const plan_flags& plan, const sweep_flags& sweep);

// ---- fit ----------------------------------------------------------------------------------------

/// An inclusive range of sizes: "8" (one size) or "1..64".
struct size_range {
  std::uint64_t lo = 1, hi = 1;
};
/// Parses "N" or "LOW..HIGH" of positive integers at most `most`; usage_error naming `what`.
size_range parse_range(std::string_view text, std::string_view what, std::uint64_t most);

struct fit_flags {
  std::string global_batch;  ///< sequences per optimizer step over the data-parallel ranks
  bool json = false;
  bool micro_batch_given = false;  ///< --micro-batch was given (else the search runs over 1..2^20)
};
/// What `fit` searches: the micro-batch (or the sequence length) over `range`, and with a global
/// batch only the micro-batches dividing global_batch / dp, each with the accumulation reaching it.
struct fit_request {
  bool search_sequence = false;
  size_range range{};
  std::uint64_t global_batch = 0;
};
/// One configuration of the search with its plan; `valid` false when the planner refuses it.
struct fit_point {
  plan_inputs in{};
  plan_result plan{};
  bool valid = false;
  std::string why;
};
struct fit_result {
  std::optional<fit_point> answer;             ///< the largest size that fits
  std::optional<fit_point> first_not_fitting;  ///< the next size searched, which does not
  std::uint64_t step = 1;                      ///< sequence lengths searched are its multiples
  std::uint64_t plans = 0;
  double seconds = 0;
};
/// Binary search over `evaluate`: exact because the peak never decreases with the size searched.
fit_result run_fit_search(const plan_inputs& base, const fit_request& q);
int run_fit(const plan_flags& plan, const fit_flags& fit);

// ---- charts -------------------------------------------------------------------------------------

/// One stacked bar: a configuration's per-rank device bytes by category.
struct chart_bar {
  std::string label;
  breakdown bytes{};
  bool fits = false;
};
struct chart {
  std::string title;
  std::string subtitle;
  std::vector<chart_bar> bars;
  bytes capacity{};
  bytes limit{};
  std::string device;
  /// Each category's name in the chart (empty: breakdown's own; an empty name leaves the
  /// category out of the legend): a serving plan draws its own terms in the same slots.
  std::vector<std::string> names;
};
/// "6.74B", "124.44M", "1.2T": a parameter count for titles.
std::string parameter_count_text(std::uint64_t n);
/// Most bars one chart draws.
inline constexpr std::size_t max_chart_bars = 200;
/// The chart as a standalone SVG document. Throws usage_error when it cannot be drawn (no bars,
/// too many, a zero capacity).
std::string render_svg(const chart& c);
/// Renders first, then writes `path` whole (through a temporary file renamed into place), so a
/// failure leaves no broken file. Throws usage_error naming the path.
void write_svg(const chart& c, const std::string& path);
/// Writes `text` to `path` whole: only to a regular file or a new path (a symbolic link, a
/// directory, a pipe or a device node is refused), through a new temporary file beside it renamed
/// into place. Throws usage_error naming `flag` and the path.
void write_output_file(const std::string& path, const std::string& text, std::string_view flag);
/// The chart of one plan (`memalg plan --svg`).
chart plan_chart(const plan_inputs& in, const plan_result& r);
/// `memalg plan --svg FILE`: computes the plan of the flags and writes its chart.
void write_plan_svg(const plan_flags& f, const std::string& path);

/// The moments of one step on one rank, for `memalg plan --timeline` (plan/events.hpp).
struct timeline_chart {
  std::string title;
  std::string subtitle;
  model_desc model{};               ///< for the entries' names
  std::uint64_t pipeline_stages = 1;
  step_events events{};
  bytes capacity{};
  bytes limit{};
  std::string device;
};
/// The step as a standalone SVG document: one stacked column per moment, the phases above, the
/// peak marked, the limit as a line; every moment's bytes in its data attributes.
std::string render_timeline_svg(const timeline_chart& c);
timeline_chart plan_timeline_chart(const plan_inputs& in, const plan_result& r);
/// `memalg plan --timeline FILE`: the timeline of the most loaded rank (or of --stage), written
/// under the rules of --svg.
void write_plan_timeline(const plan_flags& f, const std::string& path);

// ---- emit ---------------------------------------------------------------------------------------

struct emit_flags {
  std::string name_space = "memalg_plan";
  std::string output;  ///< standard output unless output_given
  bool output_given = false;  ///< -o was given (an empty name is then refused)
};
/// The header: type aliases `model`, `training`, `mesh`, `device`, `plan` and a static_assert that
/// the plan fits. `command` is recorded in its first comment.
std::string emit_header(const plan_inputs& in, const plan_result& r, std::string_view name_space,
                        std::string_view command);
int run_emit(const plan_flags& plan, const emit_flags& emit, std::string_view command);

// ---- import -------------------------------------------------------------------------------------

/// A Hugging Face config.json read as a layer-level model.
struct hf_model {
  std::string architecture;        ///< "LlamaForCausalLM", or the model_type when there is no list
  std::string_view family;         ///< the model_type it is read as: llama, qwen3, deepseek_v3, …
  lm_config config{};              ///< what the transformer builder was given
  std::uint64_t parameters = 0;    ///< exact, from the module shapes of the family
  std::uint64_t per_layer = 0;     ///< parameters of one (dense) block
  std::uint64_t dense_layers = 0;  ///< blocks with a dense MLP
  std::uint64_t per_sparse_layer = 0;  ///< parameters of one block with a mixture of experts
  std::uint64_t sparse_layers = 0;     ///< blocks with a mixture of experts
  std::uint64_t embedding = 0;     ///< token (+ position) embedding
  std::uint64_t output = 0;        ///< output layer (0 when tied)
  std::uint64_t vision = 0;        ///< multimodal configs: vision tower and projector, counted as weights
  /// Mixtures of experts: parameters a token's forward pass reads (model/families.hpp,
  /// active_parameters: without the input embedding table), and with it.
  std::uint64_t active = 0, active_with_embedding = 0;
  model_desc model{};              ///< model.parameters() == parameters
  std::vector<std::string> notes;  ///< what the memory model approximates for this family
  /// bitsandbytes' quantization_config as the storage --base-storage names (nf4, nf4-dq, fp4,
  /// fp4-dq, int8), "" for none or another method
  std::string base_storage;
  /// The stored format of the checkpoint's quantized weights as `memalg serve --weights` names
  /// it (gptq-int4:G, awq-int4:G, fp8, fp8-block:B, mxfp4, and the bitsandbytes ones), "" for none
  std::string weight_format;
};
// ---- serve ---------------------------------------------------------------------------------------

/// Flags of `memalg serve`: the model and device flags it shares with `plan`, and the request's.
struct serve_flags {
  plan_flags model;
  std::string batch = "1", prompt, new_tokens = "0";
  std::string dtype_name = "bf16";
  std::string weights, kv;
  std::string cache = "dynamic";
  std::string max_cache_len, prefill_chunk, block_size, utilization, batched_tokens, max_seqs;
  std::string attention = "sdpa";
  std::string stack = "pytorch", kv_buffer;
  std::string tp = "1", pp = "1";
  bool json = false;
  std::string svg;
  std::string emit, name_space = "memalg_serve";
  void add_to(CLI::App& app);
};
struct serve_inputs {
  plan_inputs base{};  ///< the model and the device
  serving_desc serving{};
  std::string family;  ///< the Hugging Face model_type of --config ("" otherwise)
};
/// Where the measured generations end (bench/torch/serve.measured.json): the values outside them.
struct serve_envelope {
  bool validated = false;
  std::vector<std::string> outside;
};
serve_envelope serve_envelope_of(const serve_inputs& in);
/// The families of the measured generations (the envelope's), as `memalg import` names them.
const std::vector<std::string>& serve_measured_families();
/// --weights' name → the stored dtype of the quantized matrices and the parameters it covers.
std::pair<dtype, quant_scope> serve_weight_format(const std::string& name, dtype compute);
serve_inputs make_serve_inputs(const serve_flags& f);
nlohmann::json serve_json(const serve_inputs& in, const serve_result& r, const serve_search& s);
void write_serve_svg(const serve_inputs& in, const serve_result& r, const std::string& path);
/// `memalg serve --emit FILE`: a header whose serving_plan static_asserts the plan (cmd_emit.cpp).
std::string emit_serving_header(const serve_inputs& in, const serve_result& r, std::string_view name_space,
                                std::string_view command);
int run_serve(const serve_flags& f, std::string_view command = "memalg serve");

/// Largest config.json read (bigger is not a model configuration).
inline constexpr std::size_t max_config_bytes = 4 << 20;
/// What a config.json does not say but the plan needs. The attention implementation is chosen at
/// load time (`attn_implementation`), not written in the file: flash (SDPA / FlashAttention, the
/// Hugging Face default) saves the output and a log-sum-exp, naive ("eager") saves the scores.
struct import_options {
  bool flash = true;
};
/// Parses config.json text; throws usage_error naming the field at fault (`source` prefixes it).
hf_model parse_hf_config(std::string_view text, std::string_view source = "config.json",
                         const import_options& options = {});
/// Reads and parses a file (a regular file of at most max_config_bytes).
hf_model load_hf_config(const std::string& path, const import_options& options = {});
nlohmann::json hf_json(const hf_model& m);
/// The family a Hugging Face model_type is read as ("gemma3_text" → "gemma3"), "" if none.
std::string_view hf_family_of(std::string_view model_type);

int run_import(const std::string& path, bool json);

}  // namespace memalg::cli

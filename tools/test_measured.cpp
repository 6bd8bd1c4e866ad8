// SPDX-License-Identifier: BSL-1.0
// The committed PyTorch ground truth (bench/torch/measured.json, made by bench/torch/measure.py)
// against the planner: the data covers what it must, and memalg's Hugging Face import counts
// exactly the parameters PyTorch allocated for every case. No torch is needed: the test reads the
// committed JSON and the committed config.json files.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "planner.hpp"

using namespace memalg;
using namespace memalg::cli;
using nlohmann::json;

#ifndef MEMALG_SOURCE_DIR
#error "MEMALG_SOURCE_DIR must name the source tree"
#endif

namespace {

json read_json(const std::string& relative_path) {
  std::ifstream in(std::string(MEMALG_SOURCE_DIR) + "/" + relative_path);
  REQUIRE_MESSAGE(in.good(), relative_path << " is missing");
  return json::parse(in);
}

bool measured_case(const json& c) { return !c.contains("skipped") || c["skipped"].is_null(); }

/// Bytes of one parameter element as the case stores its weights.
std::uint64_t weight_bytes(const std::string& precision) { return precision == "bf16" ? 2 : 4; }

/// The hand-picked cases (bench/torch/measured.json).
const json& measured() {
  static const json j = read_json("bench/torch/measured.json");
  return j;
}

/// The fine-tuning cases: PEFT's LoRA and bitsandbytes' QLoRA (bench/torch/finetune.measured.json).
const json& finetune() {
  static const json j = read_json("bench/torch/finetune.measured.json");
  return j;
}

/// The files of one directory with this extension, sorted.
std::vector<std::string> files_in(const std::string& dir, const std::string& ext) {
  std::vector<std::string> out;
  const std::filesystem::path root = std::filesystem::path(MEMALG_SOURCE_DIR) / dir;
  if (!std::filesystem::is_directory(root)) return out;
  for (const auto& e : std::filesystem::directory_iterator(root))
    if (e.path().extension() == ext) out.push_back(dir + "/" + e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// The generated matrix's groups as measured: measured/<group>.json when a group is complete,
/// its shard files (measured/<group>.shard-K-of-N.json) while it is being measured.
const std::vector<json>& generated() {
  static const std::vector<json> v = [] {
    std::vector<json> out;
    for (const std::string& f : files_in("bench/torch/measured", ".json")) out.push_back(read_json(f));
    return out;
  }();
  return v;
}

/// Whether every generated group is measured whole (no shard file stands for one).
bool matrix_complete() {
  for (const std::string& f : files_in("bench/torch/measured", ".json"))
    if (f.find(".shard-") != std::string::npos) return false;
  return !files_in("bench/torch/measured", ".json").empty();
}

/// Every measured case, hand-picked and generated.
const std::vector<json>& all_cases() {
  static const std::vector<json> v = [] {
    std::vector<json> out(measured()["cases"].begin(), measured()["cases"].end());
    for (const json& c : finetune()["cases"]) out.push_back(c);
    for (const json& g : generated())
      for (const json& c : g["cases"]) out.push_back(c);
    return out;
  }();
  return v;
}

}  // namespace

namespace {
/// The checks every measured file passes: the pinned versions, the command, and cases whose
/// bookkeeping adds up.
const json& known();

void check_file(const json& m, std::set<std::string>& names, std::size_t& measured_cases) {
  CHECK(m["torch"].get<std::string>().rfind("2.11.0", 0) == 0);
  CHECK(m["transformers"].get<std::string>() == "5.17.0");
  CHECK(m["device"].get<std::string>() == "cpu");
  CHECK((m.contains("command") ? !m["command"].get<std::string>().empty() : !m["commands"].empty()));
  for (const json& c : m["cases"]) {
    CAPTURE(c["name"].get<std::string>());
    CHECK(names.insert(c["name"].get<std::string>()).second);
    if (!measured_case(c)) continue;
    ++measured_cases;
    // Per rank between 200 MB (bookkeeping cannot hide an error) and 4 GB; a drawn case that
    // came out smaller is listed in bench/torch/known.json's "small" with why (exactly those).
    const bool small = known()["small"].contains(c["name"].get<std::string>());
    CHECK((c["peak_bytes"].get<std::uint64_t>() >= 200'000'000ULL) != small);
    CHECK(c["peak_bytes"].get<std::uint64_t>() >= 100'000'000ULL);
    CHECK(c["peak_bytes"].get<std::uint64_t>() <= 4'000'000'000ULL);
    CHECK(c["checks_failed"].empty());
    // The breakdown at the peak adds up to the peak.
    std::uint64_t sum = 0;
    for (const auto& [category, value] : c["peak_breakdown"].items()) sum += value.get<std::uint64_t>();
    CHECK(sum == c["peak_bytes"].get<std::uint64_t>());
    CHECK(c["steady_bytes"].get<std::uint64_t>() <= c["peak_bytes"].get<std::uint64_t>());
  }
}
}  // namespace

TEST_CASE("measured.json and measured/*.json: the pinned versions, the commands and cases that add up") {
  std::set<std::string> names;
  std::size_t n = 0;
  check_file(measured(), names, n);
  CHECK(n >= 40);
  std::map<std::string, std::set<std::string>> axes;
  for (const json& c : measured()["cases"]) {
    if (!measured_case(c)) continue;
    for (const char* axis : {"family", "attention", "precision", "optimizer", "foreach", "gradient_checkpointing",
                             "micro_batch", "seq", "layers", "parallel", "dropout"})
      axes[axis].insert(c[axis].dump());
  }
  for (const auto& [axis, values] : axes) {
    CAPTURE(axis);
    CHECK(values.size() >= 2);
  }
  CHECK(axes["family"].size() >= 7);  // GPT-2, Llama, Mistral, Mixtral, Qwen2, GPT-NeoX, Falcon
  CHECK(axes["precision"].size() >= 3);
  CHECK(axes["parallel"].count("\"ddp\"") == 1);
  for (const json& g : generated()) {
    CAPTURE(g["group"].get<std::string>());
    check_file(g, names, n);
  }
  // The fine-tuning cases: at least 12 over 3 families; LoRA under fp32, bf16 and autocast, on
  // the attention only and on every linear layer, of ranks 8 to 64, with checkpointing on and off;
  // QLoRA with NF4.
  std::size_t tuned = 0;
  check_file(finetune(), names, tuned);
  CHECK(tuned >= 12);
  CHECK(finetune()["peft"].get<std::string>() == "0.21.2");
  CHECK(finetune()["bitsandbytes"].get<std::string>() == "0.50.2");
  std::map<std::string, std::set<std::string>> ft;
  for (const json& c : finetune()["cases"]) {
    if (c["lora"].is_null()) {  // frozen parts without adapters
      ft["frozen"].insert(c["freeze"].dump());
      continue;
    }
    ft["family"].insert(c["family"].get<std::string>());
    ft["precision"].insert(c["precision"].get<std::string>());
    ft["targets"].insert(c["lora_targets"].dump());
    ft["rank"].insert(std::to_string(c["lora"].get<std::uint64_t>()));
    ft["checkpointing"].insert(c["gradient_checkpointing"].dump());
    if (!c["quant"].is_null()) ft["quant"].insert(c["quant"].get<std::string>());
  }
  CHECK(ft["family"].size() >= 3);
  CHECK(ft["precision"] == std::set<std::string>{"autocast-bf16", "bf16", "fp32"});
  CHECK(ft["targets"].count("\"all-linear\"") == 1);
  CHECK(ft["targets"].count(R"(["q_proj","k_proj","v_proj","o_proj"])") == 1);
  CHECK(ft["rank"].count("8") == 1);
  CHECK(ft["rank"].count("64") == 1);
  CHECK(ft["checkpointing"].size() == 2);
  CHECK((ft["quant"].count("nf4") + ft["quant"].count("nf4-dq")) >= 1);
  CHECK(ft["frozen"].size() >= 2);
}

TEST_CASE("the generated matrix: every valid pair of axis values is measured, every group as drawn") {
  // bench/torch/matrix/<group>.json lists the axes, the pairs that cannot occur (with their
  // reasons) and the drawn cases; measured/<group>.json holds each case's result with its
  // generator parameters. Every pair of values of two axes that is not listed as invalid must be
  // in a case that was measured (not skipped).
  const std::vector<std::string> groups = files_in("bench/torch/matrix", ".json");
  REQUIRE(!groups.empty());
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  std::set<std::pair<std::string, std::string>> invalid;  // "axis=value" pairs, both orders
  std::size_t drawn = 0;
  std::set<std::string> drawn_names;
  for (const std::string& f : groups) {
    const json g = read_json(f);
    CHECK(g["seed"].is_number_integer());
    axes.clear();  // the newest group's axes: later groups extend the earlier ones
    for (const json& a : g["axes"]) axes.emplace_back(a["axis"].get<std::string>(), a["values"].get<std::vector<std::string>>());
    for (const json& p : g["invalid_pairs"]) {
      const std::string x = p["pair"][0][0].get<std::string>() + "=" + p["pair"][0][1].get<std::string>();
      const std::string y = p["pair"][1][0].get<std::string>() + "=" + p["pair"][1][1].get<std::string>();
      CHECK(!p["reason"].get<std::string>().empty());
      invalid.insert({x, y});
      invalid.insert({y, x});
    }
    for (const json& c : g["cases"]) {
      drawn_names.insert(c["name"].get<std::string>());
      ++drawn;
    }
  }
  // Which pairs the drawn and the measured cases hold; every measured case is a drawn one, with
  // the generator parameters it was drawn with.
  std::map<std::string, json> drawn_axes;
  std::set<std::pair<std::string, std::string>> drawn_pairs;
  for (const std::string& f : groups) {
    const json g = read_json(f);
    for (const json& c : g["cases"]) {
      drawn_axes[c["name"].get<std::string>()] = c;
      for (const auto& [x, vx] : c["axes"].items())
        for (const auto& [y, vy] : c["axes"].items())
          if (x != y) drawn_pairs.insert({x + "=" + vx.get<std::string>(), y + "=" + vy.get<std::string>()});
    }
  }
  std::set<std::pair<std::string, std::string>> covered;
  std::size_t measured_generated = 0;
  std::set<std::string> seen;
  for (const json& g : generated())
    for (const json& c : g["cases"]) {
      const std::string name = c["name"].get<std::string>();
      CAPTURE(name);
      REQUIRE(drawn_names.count(name) == 1);
      CHECK(seen.insert(name).second);
      CHECK(c["generator"]["axes"] == drawn_axes[name]["axes"]);
      CHECK(c["generator"]["numbers"] == drawn_axes[name]["numbers"]);
      if (!measured_case(c)) continue;
      ++measured_generated;
      std::vector<std::string> values;
      for (const auto& [axis, value] : c["generator"]["axes"].items()) values.push_back(axis + "=" + value.get<std::string>());
      for (const std::string& x : values)
        for (const std::string& y : values)
          if (x != y) covered.insert({x, y});
    }
  std::size_t pairs = 0, missing = 0, undrawn = 0;
  for (std::size_t i = 0; i < axes.size(); ++i)
    for (std::size_t j = i + 1; j < axes.size(); ++j)
      for (const std::string& a : axes[i].second)
        for (const std::string& b : axes[j].second) {
          const std::pair<std::string, std::string> p{axes[i].first + "=" + a, axes[j].first + "=" + b};
          if (invalid.count(p) != 0) continue;
          ++pairs;
          if (drawn_pairs.count(p) == 0) {
            ++undrawn;
            MESSAGE("pair in no drawn case: " << p.first << ", " << p.second);
          }
          if (covered.count(p) == 0) ++missing;
        }
  CHECK(undrawn == 0);  // the drawn matrix covers every valid pair
  if (matrix_complete()) {
    // Measured whole: every drawn case, at least 120 of them measured, every valid pair measured.
    CHECK(seen.size() == drawn_names.size());
    CHECK(measured_generated >= 120);
    CHECK(missing == 0);
  } else {
    MESSAGE("the generated matrix is being measured (shard files): " << seen.size() << " of " << drawn_names.size()
                                                                      << " drawn cases have results");
  }
  MESSAGE(drawn << " generated cases (" << measured_generated << " measured) cover " << pairs - missing << " of "
                  << pairs << " valid pairs");
}

/// The family memalg's import reads a case's recorded model_type as (gemma3_text: gemma3).
std::string imported_family(const json& c) { return std::string(hf_family_of(c["family"].get<std::string>())); }

TEST_CASE("measured data: memalg's import counts the parameters PyTorch allocated, for every case") {
  for (const json& c : all_cases()) {
    if (!measured_case(c)) continue;
    const std::string name = c["name"].get<std::string>();
    CAPTURE(name);
    const hf_model model = load_hf_config(std::string(MEMALG_SOURCE_DIR) + "/" + c["config"].get<std::string>());
    CHECK(model.family == imported_family(c));
    CHECK(model.parameters == c["parameters"].get<std::uint64_t>());
    CHECK(model.config.layers == c["layers"].get<std::uint64_t>());
    // Unsharded runs hold every parameter at the weights' width (the harness's own check), LoRA's
    // adapters beside them (fp32: trainable_bytes). A quantized base is counted by the next test.
    const bool quantized = c.contains("quant") && !c["quant"].is_null();
    const std::uint64_t adapters = c.contains("lora") && !c["lora"].is_null() ? c["trainable_bytes"].get<std::uint64_t>() : 0;
    if (c["parallel"].get<std::string>() != "fsdp2" && !quantized)
      CHECK(c["parameter_bytes"].get<std::uint64_t>() ==
            c["parameters"].get<std::uint64_t>() * weight_bytes(c["precision"].get<std::string>()) + adapters);
  }
}

namespace {

/// The `memalg plan` flags of a measured case (as bench/torch/compare.py passes them).
plan_flags flags_of(const json& c) {
  plan_flags f{};
  f.config = std::string(MEMALG_SOURCE_DIR) + "/" + c["config"].get<std::string>();
  f.device = "cpu";  // where the harness ran: PyTorch's CPU kernels, no runtime reserve
  f.seq = std::to_string(c["seq"].get<std::uint64_t>());
  f.micro_batch = std::to_string(c["micro_batch"].get<std::uint64_t>());
  f.precision = c["precision"].get<std::string>();
  const std::string optimizer = c["optimizer"].get<std::string>();
  f.optimizer = optimizer == "sgd" ? (c["momentum"].get<double>() > 0 ? "momentum" : "sgd") : optimizer;
  f.attention = c["attention"].get<std::string>() == "eager" ? "naive" : "flash";
  if (c.value("fused", false)) f.optimizer_impl = "fused";
  else if (!c["foreach"].get<bool>()) f.optimizer_impl = "for-loop";
  if (c["gradient_checkpointing"].get<bool>()) {
    f.recompute = "full";
    f.checkpointing = c.value("reentrant", false) ? "reentrant" : "non-reentrant";
  }
  f.grad_accum = std::to_string(c.value("grad_accum", std::uint64_t{1}));
  const std::string parallel = c["parallel"].get<std::string>();
  if (parallel != "none") f.dp = std::to_string(c["world"].get<std::uint64_t>());
  if (parallel == "fsdp2") f.zero = "3";
  if (c.contains("freeze") && !c["freeze"].is_null())  // frozen parts without adapters
    for (const json& part : c["freeze"]) f.freeze += (f.freeze.empty() ? "" : ",") + part.get<std::string>();
  if (c.contains("lora") && !c["lora"].is_null()) {  // PEFT's LoraConfig; bitsandbytes' base
    f.lora = std::to_string(c["lora"].get<std::uint64_t>());
    const json& targets = c["lora_targets"];
    if (targets.is_string()) {
      f.lora_targets = targets.get<std::string>();
    } else {
      f.lora_targets.clear();
      for (const json& t : targets) f.lora_targets += (f.lora_targets.empty() ? "" : ",") + t.get<std::string>();
    }
    if (c["lora_dropout"].get<double>() > 0) {
      std::ostringstream p;
      p << c["lora_dropout"].get<double>();
      f.lora_dropout = p.str();
    }
    if (!c["quant"].is_null()) {
      f.base_storage = c["quant"].get<std::string>();
      if (!c["gradient_checkpointing"].get<bool>()) f.recompute = "none";
    }
  }
  return f;
}

/// Model states at the measured peak: the profiler's PARAMETER + OPTIMIZER_STATE. Under FSDP2 the
/// profiler leaves the resident shards (DTensor storages) uncategorised in fp32 and calls them
/// PARAMETER in bf16, beside the parameters it gathers, which are transients (as memalg's ZeRO-3
/// gathers are): there the model states are the shards as the run measured them at the step's
/// start (`parameter_bytes` + `optimizer_state_bytes`; resident, so the same at the peak).
std::uint64_t measured_model_states(const json& c) {
  const json& b = c["peak_breakdown"];
  const auto get = [&](const char* k) { return b.contains(k) ? b[k].get<std::uint64_t>() : 0; };
  // FSDP2's sharded DTensors are not categorised by the profiler: the model's own tensors, as
  // measure.py counts them on the rank (nbytes of its parameter and state shards and of its
  // buffers, which memalg counts with the weights, docs/algebra.md "Module buffers").
  if (c["parallel"].get<std::string>() == "fsdp2")
    return c["parameter_bytes"].get<std::uint64_t>() + c["optimizer_state_bytes"].get<std::uint64_t>() +
           c["buffer_bytes"].get<std::uint64_t>();
  // bitsandbytes' packed 4-bit weights are filed as INPUT by the profiler, and their quantization
  // states (absmax, code, nested scales) are no parameters at all: the model states are the
  // weights and states as measure.py counts them, and the quantization states beside them.
  if (c.contains("quant") && !c["quant"].is_null())
    return c["parameter_bytes"].get<std::uint64_t>() + c["optimizer_state_bytes"].get<std::uint64_t>() +
           c["quant_state_bytes"].get<std::uint64_t>();
  return get("PARAMETER") + get("OPTIMIZER_STATE");
}

double relative(std::uint64_t predicted, std::uint64_t measured) {
  return (static_cast<double>(predicted) - static_cast<double>(measured)) / static_cast<double>(measured);
}

/// The measured phase of the planner's phase (the loss runs inside the forward).
bool same_phase(phase p, const std::string& measured) {
  switch (p) {
    case phase::forward: return measured == "forward" || measured == "loss";
    case phase::backward: return measured == "backward";
    case phase::optimizer_step: return measured == "optimizer";
    case phase::steady: return measured == "other" || measured == "zero_grad";
  }
  return false;
}

/// The largest measured moment of the measured phases that correspond to `p`.
std::uint64_t measured_phase_peak(const json& c, phase p) {
  std::uint64_t m = 0;
  for (const auto& [name, value] : c["phase_peak_bytes"].items())
    if (same_phase(p, name)) m = std::max(m, value.get<std::uint64_t>());
  return m;
}

/// bench/torch/known.json: the measured cases more than 2 % over, each with its reason ("over"),
/// and the cases that miss another part of the bar and no rule explains yet ("open"), each with
/// what is known (docs/accuracy.md). Both lists are exact: a listed case that meets the bar fails
/// the test as surely as an unlisted one that misses it.
const json& known() {
  static const json j = read_json("bench/torch/known.json");
  return j;
}

}  // namespace

TEST_CASE("the pytorch stack bounds every measured PyTorch step: median within 0.1 %, within 2 %, never below by more than 0.1 %") {
  // The stack is the default: the flags name none. The prediction is the tensor peak, the plan's
  // peak without the device's runtime reserve (the CPU run has no CUDA context).
  std::size_t checked = 0, over = 0;
  double worst_under = 0, worst_over = 0;
  std::vector<double> errors;
  std::set<std::string> listed_over, listed_open;
  for (const auto& [name, reason] : known()["over"].items()) {
    CHECK(!reason.get<std::string>().empty());
    listed_over.insert(name);
  }
  for (const auto& [name, reason] : known()["open"].items()) {
    CHECK(!reason.get<std::string>().empty());
    listed_open.insert(name);
  }
  for (const json& c : all_cases()) {
    if (!measured_case(c)) continue;
    const std::string name = c["name"].get<std::string>();
    CAPTURE(name);
    const plan_inputs in = make_inputs(flags_of(c));
    REQUIRE(in.training.stack == stack_kind::pytorch);
    const plan_result r = evaluate(in.model, in.training, in.mesh, in.device);
    const std::uint64_t predicted = r.per_rank.total().value - r.per_rank.reserve.value;
    const std::uint64_t measured = c["peak_bytes"].get<std::uint64_t>();
    const double e = relative(predicted, measured);
    CAPTURE(predicted);
    CAPTURE(measured);
    CAPTURE(e);
    errors.push_back(std::abs(e));
    // Beyond 2 % over only with a reason on record, and a case on record only while beyond it.
    if (e > 0.02) ++over;
    CHECK_MESSAGE((e > 0.02) == (listed_over.count(name) == 1),
                  name << " is " << e * 100 << " % off; bench/torch/known.json's \"over\" must list exactly the cases more than 2 % over");
    // The rest of the bar: never below by more than 0.1 %; model states and everything else, each
    // within 5 %; the peak in the same phase (or in one whose own measured peak is within 0.5 % of
    // the peak: a tie the planner may break either way).
    const std::uint64_t states = r.per_rank.weights.value + r.per_rank.master_weights.value +
                                 r.per_rank.optimizer_states.value;
    const std::uint64_t measured_states = measured_model_states(c);
    const std::string measured_phase = c["peak_phase"].get<std::string>();
    const double e_states = relative(states, measured_states);
    const double e_rest = relative(predicted - states, measured - measured_states);
    const bool phase_ok = same_phase(r.peak_phase, measured_phase) ||
                          relative(measured_phase_peak(c, r.peak_phase), measured) >= -0.005;
    CAPTURE(e_states);
    CAPTURE(e_rest);
    CAPTURE(measured_phase);
    CAPTURE(phase_name(r.peak_phase));
    const bool bar = e >= -0.001 && std::abs(e_states) <= 0.05 && (e > 0.02 || std::abs(e_rest) <= 0.05) && phase_ok;
    CHECK_MESSAGE(bar == (listed_open.count(name) == 0),
                  name << (bar ? " meets the bar but is listed as open" : " misses the bar and is not listed as open")
                       << " in bench/torch/known.json");
    worst_under = std::min(worst_under, e);
    worst_over = std::max(worst_over, e);
    ++checked;
  }
  if (matrix_complete()) {
    CHECK(checked >= 176);
    CHECK(listed_open.empty());  // the issue's bar: every class explained or made conservative
  }
  CHECK(static_cast<double>(over) <= 0.03 * static_cast<double>(checked));
  std::sort(errors.begin(), errors.end());
  const double median = errors.empty() ? 0 : (errors[(errors.size() - 1) / 2] + errors[errors.size() / 2]) / 2;
  CHECK(median <= 0.001);
  MESSAGE("pytorch stack over " << checked << " measured cases: error from " << worst_under * 100 << " % to "
                                << worst_over * 100 << " %, median |error| " << median * 100 << " %, " << over
                                << " more than 2 % over, " << listed_open.size() << " open");
}

TEST_CASE("the paper accounting is not a bound for PyTorch: the pytorch stack is needed") {
  // The same cases under --stack paper: under-predicted, some by more than 10 % (the loss's fp32
  // tensors and when gradients exist are not in Korthikanti et al.'s accounting).
  std::size_t under = 0, far_under = 0;
  for (const json& c : measured()["cases"]) {
    if (!measured_case(c)) continue;
    plan_flags f = flags_of(c);
    f.stack = "paper";
    const plan_inputs in = make_inputs(f);
    const plan_result r = evaluate(in.model, in.training, in.mesh, in.device);
    const double e = relative(r.per_rank.total().value - r.per_rank.reserve.value, c["peak_bytes"].get<std::uint64_t>());
    under += e < -0.001 ? 1 : 0;
    far_under += e < -0.10 ? 1 : 0;
  }
  CHECK(under >= 20);
  CHECK(far_under >= 5);
}

namespace {

const json& megatron_golden() {
  static const json j = [] {
    std::ifstream in(std::string(MEMALG_SOURCE_DIR) + "/bench/megatron/golden.json");
    REQUIRE_MESSAGE(in.good(), "bench/megatron/golden.json is missing");
    return json::parse(in);
  }();
  return j;
}

/// The `memalg plan` flags of a reconstructed Megatron-LM functional test (bench/megatron/README.md):
/// its model, its batch and mesh, Megatron's defaults where the test sets nothing (LayerNorm, GeLU,
/// biases, learned positions, hidden dropout 0.1, the padded vocabulary), bf16 with fp32 main
/// parameters (amp-bf16), Adam, the distributed optimizer as ZeRO-1; SwiGLU, no linear biases and
/// the experts where the test asks for them (Sinkhorn's router or the softmax top-k of
/// aux_loss balancing, in fp32 with --moe-router-dtype fp32, at the experts' own width).
plan_flags flags_of_megatron(const json& c) {
  const json& d = c["derived"];
  const auto str = [&](const char* k) { return std::to_string(d[k].get<std::uint64_t>()); };
  plan_flags f{};
  f.stack = "megatron";
  f.layers = str("num_layers");
  f.hidden = str("hidden");
  f.heads = str("heads");
  f.kv_heads = str("kv_heads");
  f.ffn = str("ffn");
  f.vocab = std::to_string(d["vocab"]["padded"].get<std::uint64_t>());
  f.positions = str("max_position_embeddings");
  f.untied = !d["tied_embeddings"].get<bool>();
  f.swiglu = d.contains("gated_linear_unit") && d["gated_linear_unit"].get<bool>();
  f.no_linear_bias = !d["bias_linear"].get<bool>();  // --disable-bias-linear: the LayerNorms keep theirs
  if (d.contains("moe")) {
    // A mixture of experts in every layer (moe_layer_freq 1), dropless.
    const json& moe = d["moe"];
    const std::string balancing = moe["load_balancing"].get<std::string>();
    REQUIRE((balancing.rfind("sinkhorn", 0) == 0 || balancing.rfind("aux_loss", 0) == 0));
    REQUIRE(moe["capacity_factor"].is_null());
    f.experts = std::to_string(moe["num_experts"].get<std::uint64_t>());
    f.top_k = std::to_string(moe["router_topk"].get<std::uint64_t>());
    f.moe_router = balancing.rfind("sinkhorn", 0) == 0 ? "sinkhorn" : "softmax";
    if (moe["router_dtype"].get<std::string>().rfind("fp32", 0) == 0) f.moe_router_dtype = "fp32";
    if (moe.contains("ffn_hidden_size")) f.ffn = std::to_string(moe["ffn_hidden_size"].get<std::uint64_t>());
    f.ep = std::to_string(moe["expert_model_parallel"].get<std::uint64_t>());
  }
  f.seq = str("seq_length");
  f.micro_batch = str("micro_batch");
  f.grad_accum = str("grad_accum");
  f.precision = "amp-bf16";
  f.optimizer = "adam";
  f.tp = str("tp");
  f.pp = str("pp");
  f.dp = str("dp");
  f.zero = d["distributed_optimizer"].get<bool>() ? "1" : "0";
  if (!d["vp"].is_null()) f.pp_schedule = "interleaved:" + std::to_string(d["vp"].get<std::uint64_t>());
  if (d["recompute"].is_object()) {
    REQUIRE(d["recompute"]["granularity"] == "full");
    REQUIRE(d["recompute"]["method"] == "uniform");
    f.recompute = "every:" + std::to_string(d["recompute"]["num_layers"].get<std::uint64_t>());
  }
  f.dropout = "0.1";
  REQUIRE(d["dropout"]["hidden"].get<double>() == 0.1);
  f.attention = "flash";
  f.device = "h100-80gb";
  return f;
}

/// A golden series' largest value.
std::uint64_t golden_max(const json& c, const char* metric) {
  std::uint64_t v = 0;
  for (const auto& [iteration, value] : c["golden"][metric]["values"].items())
    if (value.is_number()) v = std::max(v, static_cast<std::uint64_t>(value.get<double>()));
  return v;
}

/// A golden series' value at its last iteration (the series is flat from iteration 2 on).
std::uint64_t golden_last(const json& c, const char* metric) {
  const json& values = c["golden"][metric]["values"];
  long last = -1;
  std::uint64_t v = 0;
  for (const auto& [iteration, value] : values.items())
    if (value.is_number() && std::stol(iteration) > last) {
      last = std::stol(iteration);
      v = static_cast<std::uint64_t>(value.get<double>());
    }
  REQUIRE(last >= 2);
  return v;
}

}  // namespace

TEST_CASE("the megatron stack reproduces Megatron-LM's measured memory (golden values) within 3 %") {
  // The logging rank is the last pipeline stage; its peak against mem-max-allocated-bytes, its
  // steady state against mem-allocated-bytes (both allocated bytes: the reserve is not in them).
  std::size_t both = 0, cases = 0, moe = 0;
  for (const json& c : megatron_golden()["cases"]) {
    const std::string name = c["name"].get<std::string>();
    CAPTURE(name);
    const plan_inputs in = make_inputs(flags_of_megatron(c));
    // A measured test lies inside its own stack's envelope (shapes, not Hugging Face configs).
    const envelope_report env = envelope_report_of(in);
    CHECK_MESSAGE(env.validated, (env.outside.empty() ? std::string() : env.outside[0]));
    if (c["derived"].contains("moe")) {
      // The experts are planned by the megatron stack's MoE rule, not the paper's accounting.
      bool blocks_moe = false;
      for (const layer_desc& l : in.model)
        blocks_moe = blocks_moe || (l.kind == layer_kind::transformer_block && (l.shape.flags & layer_flags::moe) != 0);
      CHECK(blocks_moe);
      ++moe;
    }
    REQUIRE(in.training.stack == stack_kind::megatron);
    const timeline tl = stage_timeline(in.model, in.training, in.mesh, in.device, in.mesh.pp - 1);
    const std::uint64_t reserve = in.device.reserve.value;
    const std::uint64_t peak = tl.peak().total().value - reserve;
    const std::uint64_t steady = tl.at[static_cast<std::size_t>(phase::steady)].total().value - reserve;
    const double e_peak = relative(peak, golden_last(c, "mem-max-allocated-bytes"));
    const double e_steady = relative(steady, golden_last(c, "mem-allocated-bytes"));
    CAPTURE(e_peak);
    CAPTURE(e_steady);
    CHECK(std::abs(e_peak) <= 0.03);
    MESSAGE(name << ": peak " << e_peak * 100 << " %, steady " << e_steady * 100 << " %");
    both += std::abs(e_peak) <= 0.03 && std::abs(e_steady) <= 0.03 ? 1 : 0;
    ++cases;
  }
  CHECK(cases >= 4);
  CHECK(moe >= 1);  // a mixture of experts (expert parallelism 1, dropless: bench/megatron/README.md)
  CHECK(both >= 2);
}

namespace {

/// The values a stack's data covers, gathered case by case.
struct observed_envelope {
  std::set<std::string> families, precisions, attentions, recomputations, optimizers, fine_tunings, moe_kinds, qk_norms;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> ranges;
  std::set<int> zero_stages;
  std::map<std::string, std::uint64_t> family_ranks;  ///< the most ranks a family was measured on
  void ranks(const std::string& family, std::uint64_t n) {
    auto [it, fresh] = family_ranks.try_emplace(family, n);
    if (!fresh) it->second = std::max(it->second, n);
  }
  void number(const std::string& axis, std::uint64_t v) {
    auto [it, fresh] = ranges.try_emplace(axis, v, v);
    if (!fresh) it->second = {std::min(it->second.first, v), std::max(it->second.second, v)};
  }
};

/// The table of `envelope_of(s)` against what the data covers.
void check_table(stack_kind s, const observed_envelope& o) {
  const stack_envelope e = envelope_of(s);
  CHECK(e.validated);
  const auto listed = [](const auto& a) {
    std::set<std::string> out;
    for (std::string_view v : a)
      if (!v.empty()) out.insert(std::string(v));
    return out;
  };
  std::set<std::string> families = listed(e.families);
  if (e.shapes) families.insert("");  // (shapes: the data's family "")
  CHECK(families == o.families);
  CHECK(listed(e.precisions) == o.precisions);
  CHECK(listed(e.attentions) == o.attentions);
  CHECK(listed(e.recomputations) == o.recomputations);
  CHECK(listed(e.optimizers) == o.optimizers);
  CHECK(listed(e.fine_tunings) == o.fine_tunings);
  CHECK(listed(e.moe_kinds) == o.moe_kinds);
  CHECK(listed(e.qk_norms) == o.qk_norms);
  const auto range = [&](const char* axis, measured_range r) {
    CAPTURE(axis);
    REQUIRE(o.ranges.count(axis) == 1);
    CHECK(r.lo == o.ranges.at(axis).first);
    CHECK(r.hi == o.ranges.at(axis).second);
  };
  range("sequence", e.sequence);
  range("micro_batch", e.micro_batch);
  range("hidden", e.hidden);
  range("layers", e.layers);
  range("grad_accum", e.grad_accum);
  range("dp", e.dp);
  range("tp", e.tp);
  range("pp", e.pp);
  std::set<int> zero;
  for (int z : e.zero_stages)
    if (z >= 0) zero.insert(z);
  CHECK(zero == o.zero_stages);
  // The families the data holds on one rank only, where the data has more than one rank.
  std::set<std::string> one_rank;
  if (o.ranges.count("dp") == 1 && o.ranges.at("dp").second > 1)
    for (const auto& [family, n] : o.family_ranks)
      if (n == 1) one_rank.insert(family);
  std::string names;
  for (const std::string& n : one_rank) names += " " + n;
  INFO("measured on one rank only:" << names);
  CHECK(listed(e.one_rank_families) == one_rank);
}

}  // namespace

TEST_CASE("under expert parallelism the megatron stack's plan bounds Megatron-LM's measured peak") {
  // golden.json's `bounds`: tests whose routed rows depend on the routing (dropless, ep > 1), so
  // the measured peak moves from iteration to iteration. The plan takes the worst routing's rows:
  // its peak must be at or above every iteration's mem-max-allocated-bytes; the steady state,
  // which no routing touches, within 3 %. They stay outside the envelope (no 3 % bar on the peak).
  std::size_t cases = 0;
  for (const json& c : megatron_golden()["bounds"]) {
    const std::string name = c["name"].get<std::string>();
    CAPTURE(name);
    REQUIRE(c["derived"]["moe"]["expert_model_parallel"].get<std::uint64_t>() > 1);
    const plan_inputs in = make_inputs(flags_of_megatron(c));
    const envelope_report env = envelope_report_of(in);
    CHECK(!env.validated);
    const timeline tl = stage_timeline(in.model, in.training, in.mesh, in.device, in.mesh.pp - 1);
    const std::uint64_t reserve = in.device.reserve.value;
    const std::uint64_t peak = tl.peak().total().value - reserve;
    const std::uint64_t steady = tl.at[static_cast<std::size_t>(phase::steady)].total().value - reserve;
    const std::uint64_t measured = golden_max(c, "mem-max-allocated-bytes");
    const double e_steady = relative(steady, golden_last(c, "mem-allocated-bytes"));
    CAPTURE(peak);
    CAPTURE(measured);
    CAPTURE(e_steady);
    CHECK(peak >= measured);
    CHECK(std::abs(e_steady) <= 0.03);
    MESSAGE(name << ": peak " << relative(peak, measured) * 100 << " % over the largest measured, steady " << e_steady * 100 << " %");
    ++cases;
  }
  CHECK(cases >= 1);
}

TEST_CASE("the pytorch and megatron stacks' envelopes are what their data covers") {
  // pytorch: the hand-picked cases and the generated ones (as drawn, less any measured as skipped).
  observed_envelope p;
  std::set<std::string> skipped;
  for (const json& g : generated())
    for (const json& c : g["cases"])
      if (!measured_case(c)) skipped.insert(c["name"].get<std::string>());
  std::vector<json> picked(measured()["cases"].begin(), measured()["cases"].end());
  for (const json& c : finetune()["cases"]) picked.push_back(c);
  for (const json& c : picked) {
    if (!measured_case(c)) continue;
    const bool lora = c.contains("lora") && !c["lora"].is_null();
    const bool frozen = c.contains("freeze") && !c["freeze"].is_null();
    p.fine_tunings.insert(lora     ? (c["quant"].is_null() ? "lora" : "qlora-" + c["quant"].get<std::string>())
                          : frozen ? "frozen parts"
                                   : "full");
    p.families.insert(imported_family(c));
    // The norms on the query and key, and the routers, of the model memalg imports for the case
    // (every router of a measured mixture of experts is its family's own).
    for (const layer_desc& l : load_hf_config(std::string(MEMALG_SOURCE_DIR) + "/" + c["config"].get<std::string>()).model) {
      if (!qk_norm_name(l).empty()) p.qk_norms.insert(std::string(qk_norm_name(l)));
      if (!moe_name(l).empty()) p.moe_kinds.insert(std::string(moe_name(l)));
    }
    p.precisions.insert(c["precision"].get<std::string>());
    p.attentions.insert(c["attention"].get<std::string>() == "eager" ? "naive" : "flash");
    p.recomputations.insert(c["gradient_checkpointing"].get<bool>() ? "full" : "none");
    const std::string o = c["optimizer"].get<std::string>();
    p.optimizers.insert(o == "sgd" ? (c["momentum"].get<double>() > 0 ? "momentum" : "sgd")
                                   : o + (c["foreach"].get<bool>() ? "/foreach" : "/for-loop"));
    const json cfg = read_json(c["config"].get<std::string>());
    p.number("hidden", cfg.contains("n_embd") ? cfg["n_embd"].get<std::uint64_t>() : cfg["hidden_size"].get<std::uint64_t>());
    p.number("layers", c["layers"].get<std::uint64_t>());
    p.number("sequence", c["seq"].get<std::uint64_t>());
    p.number("micro_batch", c["micro_batch"].get<std::uint64_t>());
    p.number("grad_accum", 1);
    p.number("dp", c["world"].get<std::uint64_t>());
    p.ranks(imported_family(c), c["world"].get<std::uint64_t>());
    p.number("tp", 1);
    p.number("pp", 1);
    p.zero_stages.insert(c["parallel"].get<std::string>() == "fsdp2" ? 3 : 0);
  }
  std::vector<json> drawn_groups;
  for (const std::string& f : files_in("bench/torch/matrix", ".json")) drawn_groups.push_back(read_json(f));
  for (const json& g : drawn_groups)
    for (const json& c : g["cases"]) {
      if (skipped.count(c["name"].get<std::string>()) != 0) continue;
      const json& a = c["axes"];
      const json& n = c["numbers"];
      p.families.insert(a["family"].get<std::string>());
      // The family's own router: DeepSeek-V3's and Llama 4's score the chosen experts with a sigmoid.
      for (const char* moe : {"mixtral", "qwen3_moe", "gpt_oss"})
        if (a["family"] == moe) p.moe_kinds.insert("softmax");
      for (const char* moe : {"deepseek_v3", "llama4"})
        if (a["family"] == moe) p.moe_kinds.insert("sigmoid");
      p.fine_tunings.insert("full");
      p.precisions.insert(a["precision"].get<std::string>());
      p.attentions.insert(a["attention"].get<std::string>() == "eager" ? "naive" : "flash");
      const std::string k = a["checkpointing"].get<std::string>();
      p.recomputations.insert(k == "off" ? "none" : k == "reentrant" ? "full-reentrant" : "full");
      const std::string o = a["optimizer"].get<std::string>();
      p.optimizers.insert(o == "sgd-momentum" ? "momentum" : o == "sgd" ? "sgd" : "adamw/" + o.substr(6));
      p.number("hidden", n["hidden"].get<std::uint64_t>());
      p.number("layers", n["layers"].get<std::uint64_t>());
      p.number("sequence", n["seq"].get<std::uint64_t>());
      p.number("micro_batch", n["micro_batch"].get<std::uint64_t>());
      p.number("grad_accum", n["grad_accum"].get<std::uint64_t>());
      const std::string r = a["ranks"].get<std::string>();
      p.number("dp", r == "1" ? 1 : 2);
      p.ranks(a["family"].get<std::string>(), r == "1" ? 1 : 2);
      p.number("tp", 1);
      p.number("pp", 1);
      p.zero_stages.insert(r == "fsdp2-2" ? 3 : 0);
    }
  check_table(stack_kind::pytorch, p);
  // Every generated case the harness could not measure (skipped, with its reason) holds a
  // combination the envelope names as unsettled, and the envelope names none that no skipped case
  // holds: a configuration like it says that it is outside.
  const auto unsettled = [](const json& axes) {
    std::string out;
    const std::string k = axes["checkpointing"].get<std::string>();
    const std::string recomputation = k == "reentrant" ? "full-reentrant" : k == "off" ? "none" : "full";
    for (const auto& c : envelope_of(stack_kind::pytorch).unsettled)
      if (!c.name.empty() && axes["ranks"] == "fsdp2-2" && c.zero_stage == 3 && axes["accumulation"] == "more" &&
          (c.recomputation.empty() || c.recomputation == recomputation))
        out = std::string(c.name);
    return out;
  };
  std::set<std::string> named, held;
  for (const auto& c : envelope_of(stack_kind::pytorch).unsettled)
    if (!c.name.empty()) named.insert(std::string(c.name));
  for (const json& g : drawn_groups)
    for (const json& c : g["cases"])
      if (skipped.count(c["name"].get<std::string>()) != 0) {
        CAPTURE(c["name"].get<std::string>());
        const std::string n = unsettled(c["axes"]);
        CHECK(!n.empty());
        held.insert(n);
      }
  CHECK(held == named);

  observed_envelope m;
  for (const json& c : megatron_golden()["cases"]) {
    const json& d = c["derived"];
    m.families.insert("");
    if (d.contains("moe")) {
      const std::string router = d["moe"]["load_balancing"].get<std::string>().rfind("sinkhorn", 0) == 0 ? "sinkhorn" : "softmax";
      const bool alltoall = d["moe"]["token_dispatcher"].get<std::string>().rfind("alltoall", 0) == 0;
      m.moe_kinds.insert(alltoall ? router + " + alltoall" : router);
    }
    m.precisions.insert("mixed-bf16-fp32-grads");
    m.attentions.insert("flash");
    m.recomputations.insert(d["recompute"].is_object() ? "every" : "none");
    m.optimizers.insert("adam");
    m.fine_tunings.insert("full");
    m.number("hidden", d["hidden"].get<std::uint64_t>());
    m.number("layers", d["num_layers"].get<std::uint64_t>());
    m.number("sequence", d["seq_length"].get<std::uint64_t>());
    m.number("micro_batch", d["micro_batch"].get<std::uint64_t>());
    m.number("grad_accum", d["grad_accum"].get<std::uint64_t>());
    m.number("dp", d["dp"].get<std::uint64_t>());
    m.number("tp", d["tp"].get<std::uint64_t>());
    m.number("pp", d["pp"].get<std::uint64_t>());
    m.zero_stages.insert(d["distributed_optimizer"].get<bool>() ? 1 : 0);
  }
  check_table(stack_kind::megatron, m);
}

TEST_CASE("memalg plan says where a configuration leaves the measured envelope") {
  const auto outside = [](plan_flags f) { return envelope_report_of(make_inputs(f)); };
  // The one reason a configuration is outside.
  const auto sole_reason = [&](const plan_flags& g) {
    const envelope_report r = outside(g);
    CHECK(!r.validated);
    REQUIRE(r.outside.size() == 1);
    return r.outside[0];
  };
  plan_flags f{};
  f.config = std::string(MEMALG_SOURCE_DIR) + "/bench/torch/configs/llama.json";
  f.seq = "256";
  f.micro_batch = "2";
  f.precision = "fp32";
  f.device = "cpu";
  const envelope_report inside = outside(f);
  CHECK(inside.validated);
  CHECK(inside.outside.empty());
  plan_flags g = f;
  g.seq = "8192";
  g.tp = "2";
  const envelope_report far = outside(g);
  CHECK(!far.validated);
  REQUIRE(far.outside.size() == 2);
  CHECK(far.outside[0].rfind("sequence: 8192 (measured ", 0) == 0);
  CHECK(far.outside[1] == "tp: 2 (measured 1..1)");
  plan_flags h = f;
  h.stack = "paper";
  CHECK(!outside(h).validated);
  // Every value measured, but unsettled together: FSDP2 and accumulation, with or without
  // checkpointing (docs/accuracy.md); without accumulation, or on one rank, the same plan is inside.
  plan_flags combo = f;
  combo.dp = "2";
  combo.zero = "3";
  combo.recompute = "full";
  combo.checkpointing = "reentrant";
  CHECK(outside(combo).validated);
  combo.grad_accum = "2";
  CHECK(sole_reason(combo) == "combination: fsdp2 + gradient accumulation");
  combo.checkpointing = "non-reentrant";
  CHECK(!outside(combo).validated);
  combo.recompute = "none";
  combo.checkpointing = "";
  CHECK(!outside(combo).validated);
  combo.grad_accum = "1";
  CHECK(outside(combo).validated);
  combo.grad_accum = "2";
  combo.zero = "0";
  CHECK(outside(combo).validated);
  // Expert parallelism under the pytorch stack (transformers' enable_expert_parallel): each rank
  // holds E/ep of the routed experts' weights, gradients and moments, every rank runs the same
  // tokens and its local experts at most T·k routed rows (counted as T·k), no all-to-all; never
  // measured, so outside the envelope.
  {
    plan_flags ep1 = f;
    ep1.config = std::string(MEMALG_SOURCE_DIR) + "/bench/torch/configs/qwen3moe-ddp.json";
    ep1.dp = "2";
    plan_flags ep2 = ep1;
    ep2.ep = "2";
    const plan_inputs a = make_inputs(ep1), b = make_inputs(ep2);
    const plan_result ra = evaluate(a.model, a.training, a.mesh, a.device);
    const plan_result rb = evaluate(b.model, b.training, b.mesh, b.device);
    std::uint64_t expert = 0;
    for (const layer_desc& l : a.model) expert += l.expert_params * l.count;
    CHECK(expert > 0);
    CHECK(ra.per_rank.weights.value - rb.per_rank.weights.value == expert / 2 * 4);
    CHECK(ra.per_rank.optimizer_states.value - rb.per_rank.optimizer_states.value == expert / 2 * 8);
    CHECK(rb.per_rank.activations == ra.per_rank.activations);
    CHECK(outside(ep1).validated);
    CHECK(sole_reason(ep2) == "ep: 2 (measured 1..1)");
  }
  // A family measured on one rank only (Qwen3): inside there, outside under DDP.
  plan_flags one_rank = f;
  one_rank.config = std::string(MEMALG_SOURCE_DIR) + "/bench/torch/configs/qwen3.json";
  CHECK(outside(one_rank).validated);
  one_rank.dp = "2";
  CHECK(sole_reason(one_rank) == "combination: this family on more than one rank (measured on one)");
  plan_flags shape{};
  shape.layers = "2";
  shape.hidden = "256";
  shape.heads = "4";
  shape.vocab = "1000";
  shape.seq = "128";
  shape.precision = "fp32";
  const envelope_report s = outside(shape);
  CHECK(!s.validated);
  REQUIRE(!s.outside.empty());
  CHECK(s.outside[0] == "family: a shape, not a Hugging Face config");
}

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
#include <map>
#include <set>
#include <string>

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

const json& measured() {
  static const json j = [] {
    std::ifstream in(std::string(MEMALG_SOURCE_DIR) + "/bench/torch/measured.json");
    REQUIRE_MESSAGE(in.good(), "bench/torch/measured.json is missing");
    return json::parse(in);
  }();
  return j;
}

bool measured_case(const json& c) { return !c.contains("skipped") || c["skipped"].is_null(); }

/// Bytes of one parameter element as the case stores its weights.
std::uint64_t weight_bytes(const std::string& precision) { return precision == "bf16" ? 2 : 4; }

}  // namespace

TEST_CASE("measured.json: the pinned versions, the command and a matrix that covers every axis") {
  const json& m = measured();
  CHECK(m["torch"].get<std::string>().rfind("2.11.0", 0) == 0);
  CHECK(m["transformers"].get<std::string>() == "5.17.0");
  CHECK(m["device"].get<std::string>() == "cpu");
  CHECK(!m["command"].get<std::string>().empty());
  const json& cases = m["cases"];
  std::size_t n = 0;
  std::map<std::string, std::set<std::string>> axes;
  std::set<std::string> names;
  for (const json& c : cases) {
    CAPTURE(c["name"].get<std::string>());
    CHECK(names.insert(c["name"].get<std::string>()).second);
    if (!measured_case(c)) continue;
    ++n;
    CHECK(c["peak_bytes"].get<std::uint64_t>() >= 200'000'000ULL);  // bookkeeping cannot hide an error
    CHECK(c["checks_failed"].empty());
    // The breakdown at the peak adds up to the peak.
    std::uint64_t sum = 0;
    for (const auto& [category, value] : c["peak_breakdown"].items()) sum += value.get<std::uint64_t>();
    CHECK(sum == c["peak_bytes"].get<std::uint64_t>());
    CHECK(c["steady_bytes"].get<std::uint64_t>() <= c["peak_bytes"].get<std::uint64_t>());
    for (const char* axis : {"family", "attention", "precision", "optimizer", "foreach", "gradient_checkpointing",
                             "micro_batch", "seq", "layers", "parallel", "dropout"})
      axes[axis].insert(c[axis].dump());
  }
  CHECK(n >= 40);
  for (const auto& [axis, values] : axes) {
    CAPTURE(axis);
    CHECK(values.size() >= 2);
  }
  CHECK(axes["family"].size() >= 7);  // GPT-2, Llama, Mistral, Mixtral, Qwen2, GPT-NeoX, Falcon
  CHECK(axes["precision"].size() >= 3);
  CHECK(axes["parallel"].count("\"ddp\"") == 1);
}

TEST_CASE("measured.json: memalg's import counts the parameters PyTorch allocated, for every case") {
  for (const json& c : measured()["cases"]) {
    if (!measured_case(c)) continue;
    const std::string name = c["name"].get<std::string>();
    CAPTURE(name);
    const hf_model model = load_hf_config(std::string(MEMALG_SOURCE_DIR) + "/" + c["config"].get<std::string>());
    CHECK(model.family == c["family"].get<std::string>());
    CHECK(model.parameters == c["parameters"].get<std::uint64_t>());
    CHECK(model.config.layers == c["layers"].get<std::uint64_t>());
    // Unsharded runs hold every parameter at the weights' width (the harness's own check).
    if (c["parallel"].get<std::string>() != "fsdp2")
      CHECK(c["parameter_bytes"].get<std::uint64_t>() ==
            c["parameters"].get<std::uint64_t>() * weight_bytes(c["precision"].get<std::string>()));
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
  if (!c["foreach"].get<bool>()) f.optimizer_impl = "for-loop";
  if (c["gradient_checkpointing"].get<bool>()) f.recompute = "full";
  const std::string parallel = c["parallel"].get<std::string>();
  if (parallel != "none") f.dp = std::to_string(c["world"].get<std::uint64_t>());
  if (parallel == "fsdp2") f.zero = "3";
  return f;
}

/// Model states at the measured peak: the profiler's PARAMETER + OPTIMIZER_STATE; FSDP2's resident
/// shards are DTensor storages the profiler leaves uncategorised, and the parameters it gathers
/// are transients (as memalg's ZeRO-3 gathers are).
std::uint64_t measured_model_states(const json& c) {
  const json& b = c["peak_breakdown"];
  const auto get = [&](const char* k) { return b.contains(k) ? b[k].get<std::uint64_t>() : 0; };
  if (c["parallel"].get<std::string>() == "fsdp2") return get("unknown") + get("OPTIMIZER_STATE");
  return get("PARAMETER") + get("OPTIMIZER_STATE");
}

double relative(std::uint64_t predicted, std::uint64_t measured) {
  return (static_cast<double>(predicted) - static_cast<double>(measured)) / static_cast<double>(measured);
}

}  // namespace

TEST_CASE("the pytorch stack bounds every measured PyTorch step: within 2 %, never below by more than 0.1 %") {
  // The stack is the default: the flags name none. The prediction is the tensor peak, the plan's
  // peak without the device's runtime reserve (the CPU run has no CUDA context).
  std::size_t checked = 0;
  double worst_under = 0, worst_over = 0;
  for (const json& c : measured()["cases"]) {
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
    CHECK(e <= 0.02);
    CHECK(e >= -0.001);
    // Right for the right reasons: model states and everything else, each within 5 %.
    const std::uint64_t states = r.per_rank.weights.value + r.per_rank.master_weights.value +
                                 r.per_rank.optimizer_states.value;
    const std::uint64_t measured_states = measured_model_states(c);
    CHECK(std::abs(relative(states, measured_states)) <= 0.05);
    CHECK(std::abs(relative(predicted - states, measured - measured_states)) <= 0.05);
    worst_under = std::min(worst_under, e);
    worst_over = std::max(worst_over, e);
    ++checked;
  }
  CHECK(checked >= 40);
  MESSAGE("pytorch stack over " << checked << " measured cases: error from " << worst_under * 100 << " % to "
                                << worst_over * 100 << " %");
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
/// parameters (amp-bf16), Adam, the distributed optimizer as ZeRO-1.
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
  std::size_t both = 0, cases = 0;
  for (const json& c : megatron_golden()["cases"]) {
    const std::string name = c["name"].get<std::string>();
    CAPTURE(name);
    const plan_inputs in = make_inputs(flags_of_megatron(c));
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
  CHECK(cases >= 3);
  CHECK(both >= 2);
}

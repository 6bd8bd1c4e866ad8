// SPDX-License-Identifier: BSL-1.0
// The serving plan (plan/serve.hpp, `memalg serve`) against the committed ground truth of Hugging
// Face generation (bench/torch/serve.measured.json, made by bench/torch/measure_serve.py): the data
// covers what it must, every measured generation is planned within the bar, the envelope is what
// the data covers; and the plan's own arithmetic (the paged cache, the largest batch) holds.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
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

const json& served() {
  static const json j = [] {
    std::ifstream in(std::string(MEMALG_SOURCE_DIR) + "/bench/torch/serve.measured.json");
    REQUIRE_MESSAGE(in.good(), "bench/torch/serve.measured.json is missing");
    return json::parse(in);
  }();
  return j;
}

/// The flags `memalg serve` takes for a measured case, on the host CPU it was measured on.
serve_flags flags_of(const json& c) {
  serve_flags f;
  f.model.config = std::string(MEMALG_SOURCE_DIR) + "/" + c["config"].get<std::string>();
  f.model.device = "cpu";
  f.batch = std::to_string(c["batch"].get<std::uint64_t>());
  f.prompt = std::to_string(c["prompt"].get<std::uint64_t>());
  f.new_tokens = std::to_string(c["new_tokens"].get<std::uint64_t>());
  f.dtype_name = c["precision"].get<std::string>();
  f.cache = c["cache"].get<std::string>();
  f.attention = c["attention"].get<std::string>();
  if (c.contains("prefill_chunk")) f.prefill_chunk = std::to_string(c["prefill_chunk"].get<std::uint64_t>());
  if (c.contains("quant")) f.weights = c["quant"].get<std::string>();  // bitsandbytes' 4-bit checkpoint
  return f;
}

double error_of(std::uint64_t plan, std::uint64_t measured) {
  return (static_cast<double>(plan) - static_cast<double>(measured)) / static_cast<double>(measured);
}

}  // namespace

TEST_CASE("serve.measured.json: pinned versions, its command, and the cases the bar asks for") {
  const json& m = served();
  CHECK(m["torch"].get<std::string>().rfind("2.11.0", 0) == 0);
  CHECK(m["transformers"].get<std::string>() == "5.17.0");
  CHECK(m["device"].get<std::string>() == "cpu");
  CHECK((m.contains("command") ? !m["command"].get<std::string>().empty() : !m["commands"].empty()));
  std::set<std::string> names, families, precisions, caches;
  bool sliding = false, mla = false, moe = false;
  for (const json& c : m["cases"]) {
    CAPTURE(c["name"].get<std::string>());
    CHECK(names.insert(c["name"].get<std::string>()).second);
    CHECK(c["checks"].empty());
    CHECK(c["peak_bytes"].get<std::uint64_t>() >= 200'000'000ULL);
    CHECK(c["peak_bytes"].get<std::uint64_t>() <= 4'000'000'000ULL);
    // the phases' own peaks add up to the whole one
    CHECK(std::max({c["prefill_peak_bytes"].get<std::uint64_t>(), c["decode_peak_bytes"].get<std::uint64_t>(),
                    c["loop_peak_bytes"].get<std::uint64_t>()}) <= c["peak_bytes"].get<std::uint64_t>());
    const std::string family = c["model_type"].get<std::string>();
    families.insert(family);
    precisions.insert(c["precision"].get<std::string>());
    caches.insert(c["cache"].get<std::string>());
    sliding = sliding || family == "gemma3_text" || family == "gpt_oss";
    mla = mla || family == "deepseek_v3";
    moe = moe || family == "qwen3_moe" || family == "deepseek_v3" || family == "gpt_oss";
  }
  CHECK(names.size() >= 12);
  CHECK(families.size() >= 4);
  CHECK(precisions == std::set<std::string>{"bf16", "fp32"});
  CHECK(caches == std::set<std::string>{"dynamic", "static"});
  CHECK(sliding);
  CHECK(mla);
  CHECK(moe);
}

TEST_CASE("memalg serve bounds every measured generation: within 2 %, never below by more than 0.1 %, the phase right") {
  std::vector<double> errors;
  for (const json& c : served()["cases"]) {
    CAPTURE(c["name"].get<std::string>());
    const serve_inputs in = make_serve_inputs(flags_of(c));
    const serve_result r = evaluate_serving(in.base.model, in.serving, in.base.device);
    REQUIRE(r.reason.empty());
    const std::uint64_t measured = c["peak_bytes"].get<std::uint64_t>();
    const std::uint64_t plan = (r.peak() - r.at_peak.reserve).value;
    const double e = error_of(plan, measured);
    CAPTURE(plan);
    CAPTURE(measured);
    CHECK(e >= -0.001);
    CHECK(e <= 0.02);
    // the measured phase: the prefill's forward or a decode step's (the loop between forwards
    // belongs to the forward before it in the plan)
    const std::string phase = c["peak_phase"].get<std::string>();
    if (phase == "prefill") CHECK(r.peak_phase == serve_phase::prefill);
    if (phase.rfind("decode", 0) == 0) CHECK(r.peak_phase == serve_phase::decode);
    // each phase on its own, too
    CHECK(error_of(r.prefill_peak.value, c["prefill_peak_bytes"].get<std::uint64_t>()) >= -0.001);
    CHECK(error_of(r.prefill_peak.value, c["prefill_peak_bytes"].get<std::uint64_t>()) <= 0.02);
    if (c["new_tokens"].get<std::uint64_t>() > 1) {
      CHECK(error_of(r.decode_peak.value, c["decode_peak_bytes"].get<std::uint64_t>()) >= -0.001);
      CHECK(error_of(r.decode_peak.value, c["decode_peak_bytes"].get<std::uint64_t>()) <= 0.02);
    }
    errors.push_back(std::abs(e));
  }
  std::sort(errors.begin(), errors.end());
  REQUIRE(!errors.empty());
  MESSAGE("serve.measured: " << errors.size() << " generations, median |error| " << 100 * errors[errors.size() / 2]
                             << " %, largest " << 100 * errors.back() << " %");
  CHECK(errors[errors.size() / 2] <= 0.001);
}

TEST_CASE("memalg serve says where a request leaves the measured generations") {
  std::set<std::string> measured;
  for (const json& c : served()["cases"]) {
    CAPTURE(c["name"].get<std::string>());
    const serve_inputs in = make_serve_inputs(flags_of(c));
    CHECK(serve_envelope_of(in).validated);
    measured.insert(in.family);
  }
  // the envelope's families are exactly the measured ones
  const std::vector<std::string>& listed = serve_measured_families();
  CHECK(std::set<std::string>(listed.begin(), listed.end()) == measured);
  serve_flags f = flags_of(served()["cases"][0]);
  f.weights = "awq-int4";
  f.tp = "2";
  const serve_envelope e = serve_envelope_of(make_serve_inputs(f));
  CHECK(!e.validated);
  CHECK(e.outside.size() == 2);
  f = flags_of(served()["cases"][0]);
  f.cache = "paged";
  CHECK(!serve_envelope_of(make_serve_inputs(f)).validated);
}

TEST_CASE("the serving plan's own arithmetic: the paged cache's blocks, the largest batch, the growth with length") {
  serve_flags f;
  f.model.config = std::string(MEMALG_SOURCE_DIR) + "/tests/data/hf/llama-3-8b.json";
  f.model.device = "h100-80gb";
  f.prompt = "2048";
  f.new_tokens = "512";
  f.cache = "paged";
  serve_inputs in = make_serve_inputs(f);
  const serve_result r = evaluate_serving(in.base.model, in.serving, in.base.device);
  // Llama 3 8B: 32 layers × 8 key/value heads × 128 × 2 (keys, values) × 2 bytes = 128 KiB a token
  CHECK(r.cache_per_token.value == 32ULL * 8 * 128 * 2 * 2);
  CHECK(r.block_bytes.value == r.cache_per_token.value * 16);
  // the blocks fill what 90 % of the device leaves after the weights and the profiling run
  const std::uint64_t engine = in.base.device.capacity.value * 9 / 10;
  const std::uint64_t fixed = r.at_peak.weights.value + r.at_peak.activations.value;
  CHECK(r.blocks * r.block_bytes.value <= engine - fixed);
  CHECK((r.blocks + 1) * r.block_bytes.value > engine - fixed);
  CHECK(r.concurrent_sequences == (r.blocks - 1) / ((2048 + 512 + 15) / 16));
  // fp8 keys and values halve the block and about double the sequences
  f.kv = "fp8";
  in = make_serve_inputs(f);
  const serve_result r8 = evaluate_serving(in.base.model, in.serving, in.base.device);
  CHECK(r8.block_bytes.value * 2 == r.block_bytes.value);
  CHECK(r8.concurrent_sequences >= 2 * r.concurrent_sequences);

  // Hugging Face: the largest batch fits and one more does not; the cache grows with the length
  f = serve_flags{};
  f.model.config = std::string(MEMALG_SOURCE_DIR) + "/tests/data/hf/llama-3-8b.json";
  f.model.device = "h100-80gb";
  f.prompt = "2048";
  f.new_tokens = "512";
  in = make_serve_inputs(f);
  const serve_search s = search_serving(in.base.model, in.serving, in.base.device);
  REQUIRE(s.max_batch > 1);
  serving_desc d = in.serving;
  d.batch = s.max_batch;
  CHECK(evaluate_serving(in.base.model, d, in.base.device).fits);
  d.batch = s.max_batch + 1;
  CHECK(!evaluate_serving(in.base.model, d, in.base.device).fits);
  d = in.serving;
  const serve_result shorter = evaluate_serving(in.base.model, d, in.base.device);
  d.prompt *= 2;
  const serve_result longer = evaluate_serving(in.base.model, d, in.base.device);
  CHECK(longer.cache_bytes.value > shorter.cache_bytes.value);
  CHECK(longer.peak().value > shorter.peak().value);
  // Llama 3 8B's cache at 2559 tokens for one sequence: 2559 × 128 KiB
  CHECK(shorter.cache_bytes.value == 2559ULL * 131072);
  // int4 weights: less than a third of bf16's for the blocks' matrices
  f.weights = "awq-int4:128";
  in = make_serve_inputs(f);
  CHECK(evaluate_serving(in.base.model, in.serving, in.base.device).at_peak.weights.value * 2 < shorter.at_peak.weights.value);
}

TEST_CASE("memalg serve refuses bad requests with one sentence") {
  const auto refused = [](serve_flags f) {
    try {
      (void)make_serve_inputs(f);
    } catch (const usage_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  serve_flags f;
  f.model.config = std::string(MEMALG_SOURCE_DIR) + "/tests/data/hf/llama-3-8b.json";
  CHECK(refused(f).find("--prompt") != std::string::npos);
  f.prompt = "128";
  CHECK(refused(f).empty());
  serve_flags g = f;
  g.cache = "ring";
  CHECK(refused(g).find("--cache") != std::string::npos);
  g = f;
  g.weights = "int3";
  CHECK(refused(g).find("--weights") != std::string::npos);
  g = f;
  g.block_size = "32";
  CHECK(refused(g).find("--cache paged") != std::string::npos);
  g = f;
  g.max_cache_len = "64";
  g.cache = "static";
  CHECK(refused(g).find("max_cache_len") != std::string::npos);
  g = f;
  g.batch = "0";
  CHECK(!refused(g).empty());
  g = f;
  g.dtype_name = "fp8";
  CHECK(refused(g).find("--dtype") != std::string::npos);
}

TEST_CASE("memalg serve --stack megatron reproduces Megatron-LM's inference golden values within 3 %") {
  std::ifstream in(std::string(MEMALG_SOURCE_DIR) + "/bench/megatron/inference.json");
  REQUIRE(in.good());
  const json m = json::parse(in);
  REQUIRE(m["cases"].size() >= 1);
  for (const json& c : m["cases"]) {
    CAPTURE(c["test"].get<std::string>());
    serve_flags f;
    CLI::App app;
    f.add_to(app);
    std::vector<std::string> args = c["memalg"].get<std::vector<std::string>>();
    args[1] = std::string(MEMALG_SOURCE_DIR) + "/" + args[1];  // the config, from the source tree
    std::reverse(args.begin(), args.end());                   // CLI11 takes them last first
    app.parse(args);
    const serve_inputs si = make_serve_inputs(f);
    const serve_result r = evaluate_serving(si.base.model, si.serving, si.base.device);
    // max_memory_allocated: the tensors, not the CUDA context
    const std::uint64_t plan = (r.peak() - r.at_peak.reserve).value;
    const double e = error_of(plan, c["bytes"].get<std::uint64_t>());
    MESSAGE(c["test"].get<std::string>() << ": memalg " << plan << " B, golden " << c["bytes"].get<std::uint64_t>()
                                         << " B, " << 100 * e << " %");
    CHECK(std::abs(e) <= 0.03);
  }
}

TEST_CASE("memalg serve reads a checkpoint's quantization_config as the weights' stored format") {
  const auto weights_of = [](const std::string& config, const std::string& weights) {
    serve_flags f;
    f.model.config = std::string(MEMALG_SOURCE_DIR) + "/tests/data/hf/" + config;
    f.prompt = "16";
    f.weights = weights;
    const serve_inputs in = make_serve_inputs(f);
    return std::pair{in, evaluate_serving(in.base.model, in.serving, in.base.device).at_peak.weights.value};
  };
  // gpt-oss-20b: quant_method mxfp4 on the routed experts only (modules_to_not_convert: attention,
  // router, embedding, output): 4 bits a value and one 8-bit scale per 32
  const auto [oss, mx] = weights_of("gpt-oss-20b.json", "");
  CHECK(std::string(oss.serving.weights.name) == "mxfp4");
  CHECK(oss.serving.scope == quant_scope::experts);
  const auto [oss16, bf] = weights_of("gpt-oss-20b.json", "bf16");
  std::uint64_t experts = 0;
  for (const layer_desc& l : oss.base.model) experts += std::min(l.expert_params, l.matrix_params) * l.count;
  REQUIRE(experts > 0);
  CHECK(bf - mx == experts * 2 - (experts / 2 + experts / 32));
  // DeepSeek-V3: fp8 with 128×128 blocks on every matrix of its blocks
  const auto [ds, fp8] = weights_of("deepseek-v3.json", "");
  CHECK(std::string(ds.serving.weights.name) == "fp8_block128");
  CHECK(ds.serving.scope == quant_scope::linear);
  const auto [ds16, ds_bf] = weights_of("deepseek-v3.json", "bf16");
  CHECK(fp8 * 2 > ds_bf);   // about half: the embedding, output and norms stay bf16
  CHECK(fp8 * 19 < ds_bf * 10);
}

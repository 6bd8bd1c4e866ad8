// SPDX-License-Identifier: BSL-1.0
// The committed PyTorch ground truth (bench/torch/measured.json, made by bench/torch/measure.py)
// against the planner: the data covers what it must, and memalg's Hugging Face import counts
// exactly the parameters PyTorch allocated for every case. No torch is needed: the test reads the
// committed JSON and the committed config.json files.
#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

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

// SPDX-License-Identifier: BSL-1.0
// fuzz/fuzz_hf_config.cpp — libFuzzer target: arbitrary bytes as a Hugging Face config.json.
//
// Every input must end in a model or in a usage_error (one sentence for the user); anything else
// — a crash, a sanitizer report, another exception, a hang — is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "planner.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const memalg::cli::hf_model m = memalg::cli::parse_hf_config(text, "config.json");
    // A model that parses plans like any other (and must not throw anything but a usage error).
    memalg::training_desc t{};
    t.sequence = 128;
    memalg::mesh_desc mesh{};
    if (memalg::find_plan_issue(m.model, t, mesh, memalg::device::h100_80gb::value) == memalg::plan_issue::none)
      (void)memalg::evaluate(m.model, t, mesh, memalg::device::h100_80gb::value);
  } catch (const memalg::cli::usage_error&) {
  } catch (const std::overflow_error&) {
    // A byte count beyond 64 bits for an absurd but valid config: the CLI reports it as bad input.
  }
  return 0;
}

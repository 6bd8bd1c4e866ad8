// Unit tests of the command-line tool's parsing and JSON (the binary itself is tested by ctest).
#include <doctest/doctest.h>

#include "cli.hpp"

using namespace memalg;
using namespace memalg::cli;

TEST_CASE("parameter counts accept exponents and suffixes, exactly") {
  CHECK(parse_count("7.5e9", "--params") == 7'500'000'000ULL);
  CHECK(parse_count("7.5B", "--params") == 7'500'000'000ULL);
  CHECK(parse_count("175B", "--params") == 175'000'000'000ULL);
  CHECK(parse_count("124M", "--params") == 124'000'000ULL);
  CHECK(parse_count("1.3b", "--params") == 1'300'000'000ULL);
  CHECK(parse_count("70000000", "--params") == 70'000'000ULL);
  CHECK(parse_count("1T", "--params") == 1'000'000'000'000ULL);
  for (const char* bad : {"", "abc", "-5", "1.5", "7B7", "B", "0", "nan", "inf", "1e30", "0x10", " 7B", "7 B"})
    CHECK_THROWS_AS(parse_count(bad, "--params"), usage_error);
}

TEST_CASE("degrees and fractions are strict") {
  CHECK(parse_positive("64", "--dp") == 64);
  for (const char* bad : {"0", "-1", "1.0", "", "abc", "99999999999999999999"})
    CHECK_THROWS_AS(parse_positive(bad, "--dp"), usage_error);
  CHECK(parse_fraction("0.9", "--memory-cap") == doctest::Approx(0.9));
  CHECK(parse_fraction("1", "--memory-cap") == 1.0);
  for (const char* bad : {"0", "1.01", "-0.5", "nan", "x"}) CHECK_THROWS_AS(parse_fraction(bad, "--memory-cap"), usage_error);
}

TEST_CASE("the CLI computes what the compile-time plan computes") {
  plan_flags f;
  f.params = "7.5e9";
  f.precision = "amp-fp16";
  f.optimizer = "adam";
  f.dp = "64";
  f.zero = "2";
  const plan_inputs in = make_inputs(f);
  const plan_result r = evaluate(in.model, in.training, in.mesh, in.device);
  using compile_time = plan<model::parameters<7'500'000'000>, train::recipe<precision::amp_fp16, optim::adam<>>,
                            parallel::mesh<parallel::data<64, parallel::zero<2>>>, device::a100_80gb>;
  CHECK(r.per_rank.total() == compile_time::peak);
  CHECK(r.per_rank.model_states() == compile_time::per_rank.model_states());
}

TEST_CASE("JSON carries the documented keys as integers") {
  plan_flags f;
  f.params = "7B";
  f.offload = "optimizer";
  f.dp = "8";
  f.zero = "1";
  const plan_inputs in = make_inputs(f);
  const plan_result r = evaluate(in.model, in.training, in.mesh, in.device);
  const nlohmann::json j = plan_json(in, r);
  CHECK(j["parameters"] == 7'000'000'000ULL);
  CHECK(j["fits"].is_boolean());
  for (const char* k : {"name", "capacity", "usable"}) CHECK(j["device"].contains(k));
  for (const char* section : {"per_rank", "host_per_rank"})
    for (const char* k : {"weights", "gradients", "master_weights", "optimizer_states", "activations", "temporaries",
                          "comm_buffers", "reserve", "total"}) {
      CHECK(j[section].contains(k));
      CHECK(j[section][k].is_number_unsigned());
    }
  // Offloaded optimizer: the states are on the host, not on the device.
  CHECK(j["per_rank"]["optimizer_states"] == 0);
  CHECK(j["host_per_rank"]["optimizer_states"].get<std::uint64_t>() > 0);
}

TEST_CASE("invalid meshes are refused with a sentence") {
  plan_flags f;
  f.params = "7B";
  f.ep = "3";
  f.dp = "4";
  CHECK_THROWS_WITH_AS(make_inputs(f), "the expert-parallel degree must divide dp*cp", usage_error);
  f.ep = "1";
  f.offload = "params";
  CHECK_THROWS_AS(make_inputs(f), usage_error);
  f.offload = "none";
  f.device = "nope";
  CHECK_THROWS_AS(make_inputs(f), usage_error);
}

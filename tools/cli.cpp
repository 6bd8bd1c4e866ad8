// tools/cli.cpp — strict parsing and the flags → descriptors translation shared by sub-commands.
#include "cli.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>

namespace memalg::cli {

namespace {
std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }
}  // namespace

std::uint64_t parse_count(std::string_view text, std::string_view what) {
  std::string s(text);
  const auto bad = [&] {
    return usage_error(std::string(what) + " must be a positive count like 7.5e9, 7.5B, 175B or 124M, not " +
                       quoted(text));
  };
  if (s.empty() || s.size() > 64) throw bad();
  long double scale = 1;
  switch (s.back()) {
    case 'K': case 'k': scale = 1e3L; s.pop_back(); break;
    case 'M': case 'm': scale = 1e6L; s.pop_back(); break;
    case 'B': case 'b': case 'G': case 'g': scale = 1e9L; s.pop_back(); break;
    case 'T': case 't': scale = 1e12L; s.pop_back(); break;
    default: break;
  }
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.')) throw bad();
  for (char c : s)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
      throw bad();
  errno = 0;
  char* end = nullptr;
  const long double v = std::strtold(s.c_str(), &end) * scale;
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v) || v < 1) throw bad();
  if (v > 9.2e18L) throw usage_error(std::string(what) + " is too large: " + quoted(text));
  const long double r = std::nearbyint(v);
  if (std::fabs(v - r) > 1e-9L * v) throw usage_error(std::string(what) + " must be a whole number, not " + quoted(text));
  return static_cast<std::uint64_t>(r);
}

std::uint64_t parse_positive(std::string_view text, std::string_view what) {
  if (text.empty() || text.size() > 19) throw usage_error(std::string(what) + " must be a positive integer, not " + quoted(text));
  std::uint64_t v = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c)))
      throw usage_error(std::string(what) + " must be a positive integer, not " + quoted(text));
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (v == 0) throw usage_error(std::string(what) + " must be at least 1, not " + quoted(text));
  return v;
}

double parse_fraction(std::string_view text, std::string_view what) {
  const std::string s(text);
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v) || v <= 0 || v > 1)
    throw usage_error(std::string(what) + " must be a fraction in (0, 1], not " + quoted(text));
  return v;
}

void plan_flags::add_to(CLI::App& app) {
  app.add_option("--params", params, "parameter count: 7.5e9, 7.5B, 175B, 124M");
  app.add_option("--expert-params", expert_params, "of which in mixture-of-experts layers (split by --ep)");
  app.add_option("--largest-layer", largest_layer, "parameters of the largest layer (ZeRO-3 gathers it whole)");
  app.add_option("--precision", precision, "fp32|amp-fp16|amp-bf16|autocast-bf16|bf16|fp8 (default amp-bf16)");
  app.add_option("--optimizer", optimizer, "sgd|momentum|adam|adamw|adam8bit|adafactor|lion (default adamw)");
  app.add_option("--dp", dp, "data-parallel degree (default 1)");
  app.add_option("--zero", zero, "ZeRO stage 0|1|2|3 over the data-parallel ranks (default 0)");
  app.add_option("--tp", tp, "tensor-parallel degree (default 1)");
  app.add_option("--pp", pp, "pipeline-parallel degree (default 1)");
  app.add_option("--ep", ep, "expert-parallel degree (default 1)");
  app.add_option("--offload", offload, "none|optimizer|params (default none)");
  app.add_option("--device", device, "device name (see `memalg devices`; default a100-80gb)");
  app.add_option("--memory-cap", memory_cap, "fraction of device memory the process may use, in (0, 1]");
  app.add_option("--reserve-mib", reserve_mib, "override the device's runtime reserve, in MiB");
}

plan_inputs make_inputs(const plan_flags& f) {
  plan_inputs in{};
  if (f.params.empty()) throw usage_error("--params is required (e.g. --params 7B)");
  const std::uint64_t params = parse_count(f.params, "--params");
  const std::uint64_t expert = f.expert_params == "0" ? 0 : parse_count(f.expert_params, "--expert-params");
  const std::uint64_t largest = f.largest_layer == "0" ? 0 : parse_count(f.largest_layer, "--largest-layer");
  if (expert > params) throw usage_error("--expert-params cannot exceed --params");
  if (largest > params) throw usage_error("--largest-layer cannot exceed --params");
  in.model = parameter_count_model(params, expert, largest);

  if (!precision::from_name(f.precision, in.training.precision))
    throw usage_error("unknown --precision '" + f.precision + "' (fp32|amp-fp16|amp-bf16|autocast-bf16|bf16|fp8)");
  if (!optim::from_name(f.optimizer, in.training.optimizer))
    throw usage_error("unknown --optimizer '" + f.optimizer + "' (sgd|momentum|adam|adamw|adam8bit|adafactor|lion)");

  mesh_desc& m = in.mesh;
  m.dp = parse_positive(f.dp, "--dp");
  m.tp = parse_positive(f.tp, "--tp");
  m.pp = parse_positive(f.pp, "--pp");
  m.ep = parse_positive(f.ep, "--ep");
  m.cp = parse_positive(f.cp, "--cp");
  if (f.zero.size() != 1 || f.zero[0] < '0' || f.zero[0] > '3')
    throw usage_error("--zero must be 0, 1, 2 or 3, not '" + f.zero + "'");
  m.zero_stage = f.zero[0] - '0';
  if (f.offload == "none") m.offload = offload_kind::none;
  else if (f.offload == "optimizer") m.offload = offload_kind::optimizer;
  else if (f.offload == "params") m.offload = offload_kind::params;
  else throw usage_error("unknown --offload '" + f.offload + "' (none|optimizer|params)");
  // A product of degrees that overflows is no mesh at all.
  for (std::uint64_t d : {m.tp, m.pp, m.cp})
    if (d > (1ULL << 32) || m.dp > (1ULL << 32)) throw usage_error("a parallel degree is larger than any cluster");
  m.world = m.product();

  if (!device::from_name(f.device, in.device)) {
    std::string names;
    for (const device_desc& d : device::catalog) {
      if (!names.empty()) names += '|';
      names += d.name;
    }
    throw usage_error("unknown --device '" + f.device + "' (" + names + ")");
  }
  if (!f.memory_cap.empty()) {
    const double cap = parse_fraction(f.memory_cap, "--memory-cap");
    in.device.cap_denominator = 1'000'000;
    in.device.cap_numerator = static_cast<std::uint64_t>(std::llround(cap * 1e6));
    if (in.device.cap_numerator == 0) throw usage_error("--memory-cap is too small");
  }
  if (!f.reserve_mib.empty()) {
    const std::string& r = f.reserve_mib;
    in.device.reserve = r == "0" ? bytes{} : bytes{parse_positive(r, "--reserve-mib")} * (1ULL << 20);
  }
  if (const std::string_view e = plan_error(in.model, in.training, in.mesh, in.device); !e.empty())
    throw usage_error(std::string(e));
  return in;
}

nlohmann::json breakdown_json(const breakdown& b) {
  nlohmann::json j = nlohmann::json::object();
  for (std::size_t i = 0; i < category_count; ++i) j[std::string(category_name(category(i)))] = b[category(i)].value;
  j["total"] = b.total().value;
  return j;
}

nlohmann::json plan_json(const plan_inputs& in, const plan_result& r) {
  nlohmann::json j;
  j["parameters"] = r.parameters;
  j["fits"] = r.fits;
  j["device"] = {{"name", std::string(in.device.name)},
                 {"capacity", in.device.capacity.value},
                 {"usable", r.usable.value}};
  j["per_rank"] = breakdown_json(r.per_rank);
  j["host_per_rank"] = breakdown_json(r.host_per_rank);
  j["peak_phase"] = std::string(phase_name(r.peak_phase));
  j["most_loaded_stage"] = r.most_loaded_stage;
  return j;
}

}  // namespace memalg::cli

// SPDX-License-Identifier: BSL-1.0
// Run-time throughput of the strategy search `memalg sweep` runs (plan/search.hpp), on one core.
//
//   build/bench/sweep_throughput [--dump FILE | --time-list FILE]
//
// For each model, the space of a 1024-GPU world — tensor 1-8 with sequence parallelism, pipeline
// 1-32, context 1-4, ZeRO 0-3, micro-batch 1-32, three recomputation choices, two offload choices
// (10,368 configurations) — is searched for the ten least-memory configurations, pruned (what the
// tool does) and exhaustively (every configuration planned). Prints the median of 5 runs, each
// repeating the search for at least half a second, as configurations decided per second and plans
// computed per second. `--dump FILE` writes the configurations as JSON lines for a peer estimator
// (bench/peer_llm_analysis.py); `--time-list FILE` plans exactly the configurations of such a file
// that the peer can express (cp 1, no offload), for a side-by-side figure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <memalg/memalg.hpp>

using namespace memalg;

namespace {

search_space space_1024() {
  search_space s = default_space(1024);
  s.micro_batch = {1, 2, 4, 8, 16, 32};
  s.recompute = {recompute_choice{recompute_kind::none}, recompute_choice{recompute_kind::selective},
                 recompute_choice{recompute_kind::full}};
  s.offload = {offload_kind::none, offload_kind::optimizer};
  return s;
}

struct measured {
  double configs_per_second = 0, plans_per_second = 0;
  search_result result{};
};

top_list list;

measured run(const search_problem& p, bool exhaustive) {
  std::vector<double> configs, plans;
  measured out{};
  for (int rep = 0; rep < 5; ++rep) {
    std::uint64_t decided = 0, planned = 0;
    const auto start = std::chrono::steady_clock::now();
    double seconds = 0;
    do {
      out.result = exhaustive ? top_strategies_exhaustive(p, search_order::memory, 10, list, [](auto, auto) {})
                              : top_strategies(p, search_order::memory, 10, list);
      decided += out.result.evaluated;
      planned += out.result.planned;
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (seconds < 0.5);
    configs.push_back(static_cast<double>(decided) / seconds);
    plans.push_back(static_cast<double>(planned) / seconds);
  }
  std::sort(configs.begin(), configs.end());
  std::sort(plans.begin(), plans.end());
  out.configs_per_second = configs[2];
  out.plans_per_second = plans[2];
  return out;
}

}  // namespace

/// Plans the configurations of a --dump file the peer also evaluates; prints plans per second.
int time_list(const char* path) {
  std::ifstream in(path);
  std::vector<std::pair<mesh_desc, training_desc>> list;
  std::string line;
  const auto field = [&](const char* name) -> std::string {
    const std::size_t at = line.find(std::string("\"") + name + "\": ");
    if (at == std::string::npos) return {};
    std::size_t b = at + std::strlen(name) + 4;
    if (line[b] == '"') ++b;
    std::size_t e = b;
    while (e < line.size() && line[e] != ',' && line[e] != '"' && line[e] != '}') ++e;
    return line.substr(b, e - b);
  };
  while (std::getline(in, line)) {
    if (field("cp") != "1" || field("offload") != "none" || field("memalg_peak") == "0") continue;
    mesh_desc m{};
    m.dp = std::stoull(field("dp"));
    m.tp = std::stoull(field("tp"));
    m.pp = std::stoull(field("pp"));
    m.zero_stage = std::stoi(field("zero"));
    m.sequence_parallel = field("sp") == "true";
    m.world = m.product();
    training_desc t{};
    t.sequence = 4096;
    t.micro_batch = std::stoull(field("micro_batch"));
    const std::string r = field("recompute");
    t.recompute = r == "full" ? recompute_kind::full : r == "selective" ? recompute_kind::selective : recompute_kind::none;
    list.emplace_back(m, t);
  }
  const model_desc model = presets::llama2_7b::value;
  std::vector<double> rates;
  std::uint64_t fits = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::uint64_t n = 0;
    fits = 0;
    const auto start = std::chrono::steady_clock::now();
    double seconds = 0;
    do {
      for (const auto& [m, t] : list) {
        const plan_result r = evaluate(model, t, m, device::a100_80gb::value);
        fits += r.fits ? 1 : 0;
        ++n;
      }
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (seconds < 0.5);
    rates.push_back(static_cast<double>(n) / seconds);
  }
  std::sort(rates.begin(), rates.end());
  std::printf("memalg evaluate(): %zu configurations, %.3g configurations/s (median of 5)\n", list.size(), rates[2]);
  return fits == 0 ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--time-list") == 0) return time_list(argv[2]);
  const char* dump = argc == 3 && std::strcmp(argv[1], "--dump") == 0 ? argv[2] : nullptr;
  struct model_case {
    const char* name;
    model_desc model;
    std::uint64_t sequence;
  };
  const model_case cases[] = {
      {"llama2-7b", presets::llama2_7b::value, 4096},
      {"gpt3-175b", presets::gpt3_175b::value, 2048},
      {"7B by parameter count", parameter_count_model(7'000'000'000), 4096},
  };
  std::printf("| model | configurations | valid | fit | mode | configurations/s | plans/s |\n|---|---|---|---|---|---|---|\n");
  for (const model_case& c : cases) {
    search_problem p{};
    p.model = c.model;
    p.training.sequence = c.sequence;
    p.device = device::a100_80gb::value;
    p.space = space_1024();
    for (bool exhaustive : {false, true}) {
      const measured m = run(p, exhaustive);
      std::printf("| %s | %llu | %llu | %llu | %s | %.2e | %.2e |\n", c.name,
                  static_cast<unsigned long long>(m.result.evaluated), static_cast<unsigned long long>(m.result.valid),
                  static_cast<unsigned long long>(m.result.feasible), exhaustive ? "exhaustive" : "pruned",
                  m.configs_per_second, m.plans_per_second);
    }
  }
  if (dump != nullptr) {  // the llama2-7b space, one configuration per line
    std::ofstream out(dump);
    search_problem p{};
    p.model = presets::llama2_7b::value;
    p.training.sequence = 4096;
    p.device = device::a100_80gb::value;
    p.space = space_1024();
    for (std::uint64_t i = 0; i < p.space.size(); ++i) {
      const strategy s = strategy_at(p.space, i);
      if (s.dp == 0) continue;
      const training_desc t = apply_strategy(s, p.training);
      const candidate k = evaluate_candidate(p, i, false);
      out << "{\"dp\": " << s.dp << ", \"tp\": " << s.tensor.degree << ", \"sp\": " << (s.tensor.sequence_parallel ? "true" : "false")
          << ", \"pp\": " << s.pipeline.degree << ", \"cp\": " << s.context << ", \"zero\": " << s.zero_stage
          << ", \"micro_batch\": " << t.micro_batch << ", \"recompute\": \"" << recompute_name(t.recompute)
          << "\", \"offload\": \"" << offload_name(s.offload) << "\", \"memalg_peak\": "
          << (k.valid() ? k.plan.peak().value : 0) << "}\n";
    }
  }
  return 0;
}

// SPDX-License-Identifier: BSL-1.0
// examples/generate_cpu.cpp — greedy generation on the CPU runtime, in the serving plan's arena.
//
// A named plan (the training binaries' table, examples/gpt_plans.hpp) gives the model and its
// storage type; the request gives the batch and the lengths. memalg's serving plan of the run
// (plan/serve.hpp, serve_stack::memalg) sizes one arena — the weights, every layer's key/value
// cache, one forward's stacks — and says where the cache lies; the generation program
// (exec/gpt/build_generation.hpp) is laid out in it, and the interpreter's live-bytes meter
// measures what the run's ops keep live. The binary fails (status 4) unless the measured
// high-water mark is the plan's to the byte.
//
//   generate_cpu --list-plans
//   generate_cpu --plan qwen3-fp32 --prompt-tokens 48 --new-tokens 16 [--batch 2] [--checkpoint DIR] [--json]
//
// The prompts are windows of the training text (--data, --seed), as the training binaries draw
// them; with --checkpoint DIR the weights are those a one-rank `train_gpt_cpu --checkpoint DIR`
// wrote, else the plan's initial ones.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/exec/gpt/generation_plan.hpp>
#include <memalg/exec/meter.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "gpt_plans.hpp"
#include "train_common.hpp"

namespace m = memalg;
using namespace train_common;
using plans = gpt_plans::cpu_plans;

namespace {

struct generate_options : options {
  std::uint64_t batch = 1, prompt = 0, new_tokens = 0;
};

const char* help_text =
    "usage: generate_cpu [--list-plans] --plan NAME --prompt-tokens N --new-tokens M [--batch B]\n"
    "                    [--checkpoint DIR] [--data FILE] [--seed S] [--json]\n"
    "  --plan NAME          a one-rank plan of the training binaries' table (its model and storage type)\n"
    "  --prompt-tokens N    prompt tokens per sequence (windows of the training text)\n"
    "  --new-tokens M       tokens generated greedily per sequence (at least 1)\n"
    "  --batch B            sequences generated together (default 1)\n"
    "  --checkpoint DIR     the weights a one-rank `train_gpt_cpu --plan NAME --checkpoint DIR` wrote\n"
    "                       (default: the plan's initial weights)\n";

generate_options parse(int argc, char** argv) {
  generate_options o = parse_options<generate_options>(argc, argv, help_text, [](generate_options& g, std::string_view a,
                                                                                  const auto& value) {
    if (a == "--prompt-tokens") g.prompt = parse_positive(a, value());
    else if (a == "--new-tokens") g.new_tokens = parse_positive(a, value());
    else if (a == "--batch") g.batch = parse_positive(a, value());
    else return false;
    return true;
  });
  if (o.list) return o;
  if (o.resume) throw usage_error("--resume is a training flag");
  if (o.prompt == 0) throw usage_error("--prompt-tokens N is required");
  if (o.new_tokens == 0) throw usage_error("--new-tokens M is required");
  return o;
}

/// A byte as it may stand in a JSON string.
std::string json_text(const std::vector<std::int32_t>& ids) {
  std::string s;
  for (std::int32_t id : ids) {
    const unsigned char c = static_cast<unsigned char>(id);
    if (c == '"' || c == '\\') s += std::string("\\") + static_cast<char>(c);
    else if (c >= 0x20 && c < 0x7f) s += static_cast<char>(c);
    else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      s += buf;
    }
  }
  return s;
}

template <class Named>
int generate(const generate_options& o) {
  using plan = typename Named::plan;
  if constexpr (plan::mesh.world != 1) {
    throw usage_error("plan '" + o.plan + "' has " + std::to_string(plan::mesh.world) +
                      " ranks: the generation program runs on one (choose a one-rank plan)");
  } else {
    using run = m::exec::gpt_run<plan, m::backend::cpu::local_communicator>;
    using storage = typename run::storage;
    using backend_t = m::backend::cpu::step_backend<storage, m::backend::cpu::local_communicator>;
    const m::exec::generation_request request{o.batch, o.prompt, o.new_tokens};
    // A request the serving plan or the program refuses is bad input: its sentence, status 2.
    const auto [planned, p] = [&] {
      try {
        m::exec::planned_generation g =
            m::exec::plan_generation(plan::model, request, plan::training.precision.weights, plan::device);
        m::exec::program prog = m::exec::build_generation(run::config, request, g.arena, g.cache, backend_t::storage_elem);
        return std::pair{std::move(g), std::move(prog)};
      } catch (const m::exec::program_error& e) {
        throw usage_error(e.what());
      }
    }();

    m::backend::cpu::local_communicator dp, tp;
    backend_t backend(p, dp, tp);
    if (!o.checkpoint.empty())
      m::exec::load_generation_weights(backend, p, m::exec::read_checkpoint(std::filesystem::path(o.checkpoint) / "rank0.ckpt"),
                                      Named::name);

    // The prompts: B windows of the training text, drawn as the training binaries draw a batch.
    const std::vector<std::int32_t> text = read_bytes(o.data);
    m::exec::gpt_config window{};
    window.micro_batch = o.batch;
    window.sequence = o.prompt;
    std::vector<std::int32_t> prompt, unused;
    batch_for(text, window, o.seed, 0, 0, prompt, unused);
    std::vector<std::int32_t> generated(p.generated_per_micro, 0);

    m::exec::live_bytes_meter meter(p);
    m::exec::run_state state;
    const auto t0 = std::chrono::steady_clock::now();
    m::exec::run(p, backend, m::exec::step_io{prompt, {}, {}, {}, generated}, state, meter);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    const std::size_t predicted = planned.arena_bytes(), measured = meter.high_water();
    const bool equal = measured == predicted && p.high_water == predicted;
    if (!equal)
      std::fprintf(stderr,
                   "generate_cpu: the arena differs from the serving plan's %zu bytes: measured high-water of live "
                   "bytes %zu, laid out %zu\n",
                   predicted, measured, p.high_water);
    const double new_tokens = static_cast<double>(o.batch * o.new_tokens);
    // Token k of sequence b is generated[k·B + b].
    std::vector<std::vector<std::int32_t>> seqs(o.batch);
    for (std::size_t k = 0; k < o.new_tokens; ++k)
      for (std::size_t b = 0; b < o.batch; ++b) seqs[b].push_back(generated[k * o.batch + b]);
    const m::serve_result& r = planned.plan;
    if (o.json) {
      std::printf("{\"plan\": \"%s\", \"batch\": %llu, \"prompt_tokens\": %llu, \"new_tokens\": %llu, "
                  "\"checkpoint\": %s, \"seconds\": %.6f, \"tokens_per_s\": %.1f, \"generated\": [",
                  Named::name.data(), static_cast<unsigned long long>(o.batch), static_cast<unsigned long long>(o.prompt),
                  static_cast<unsigned long long>(o.new_tokens), o.checkpoint.empty() ? "false" : "true", seconds,
                  new_tokens / seconds);
      for (std::size_t b = 0; b < o.batch; ++b) std::printf("%s\"%s\"", b ? ", " : "", json_text(seqs[b]).c_str());
      std::printf("], \"memory\": {\"predicted_arena\": %zu, \"measured_arena\": %zu, \"layout_high_water\": %zu, "
                  "\"weights\": %llu, \"kv_cache\": %llu, \"stack_peak\": %llu, \"peak_phase\": \"%s\", "
                  "\"arena_equal\": %s}}\n",
                  predicted, measured, p.high_water, static_cast<unsigned long long>(r.at_peak.weights.value),
                  static_cast<unsigned long long>(r.at_peak.kv_cache.value),
                  static_cast<unsigned long long>(r.stack_peak.value), m::serve_phase_name(r.peak_phase).data(),
                  equal ? "true" : "false");
    } else {
      std::printf("plan %s: %s\n", Named::name.data(), Named::description.data());
      for (std::size_t b = 0; b < o.batch; ++b) {
        std::vector<std::int32_t> shown(prompt.begin() + static_cast<std::ptrdiff_t>(b * o.prompt),
                                        prompt.begin() + static_cast<std::ptrdiff_t>((b + 1) * o.prompt));
        std::printf("sequence %zu: \"%s\" -> \"%s\"\n", b, json_text(shown).c_str(), json_text(seqs[b]).c_str());
      }
      std::printf("%llu new tokens in %.3f s: %.1f tokens/s\n", static_cast<unsigned long long>(o.batch * o.new_tokens),
                  seconds, new_tokens / seconds);
      std::printf("arena: serving plan %zu B (weights %llu, cache %llu, stacks %llu at the %s), measured high-water of "
                  "live bytes %zu B (%s), laid out %zu B\n",
                  predicted, static_cast<unsigned long long>(r.at_peak.weights.value),
                  static_cast<unsigned long long>(r.at_peak.kv_cache.value),
                  static_cast<unsigned long long>(r.stack_peak.value), m::serve_phase_name(r.peak_phase).data(), measured,
                  measured == predicted ? "equal" : measured < predicted ? "below" : "ABOVE", p.high_water);
    }
    return equal ? 0 : 4;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return guarded_main("generate_cpu", [&] {
    const generate_options o = parse(argc, argv);
    if (o.list) {
      list_plans<plans>();
      return 0;
    }
    int result = -1;
    const bool found = for_plan<plans>(o.plan, [&]<class Named>(Named*) { result = generate<Named>(o); });
    if (!found) throw usage_error(gpt_plans::cpu_unknown_plan(o.plan));
    return result;
  });
}

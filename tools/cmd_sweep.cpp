// SPDX-License-Identifier: BSL-1.0
// tools/cmd_sweep.cpp — `memalg sweep`: the strategy search of plan/search.hpp at run time.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "planner.hpp"

namespace memalg::cli {

namespace {

std::vector<std::string> split_list(const std::string& text, std::string_view what) {
  std::vector<std::string> items;
  std::string item;
  for (char c : text + ",") {
    if (c != ',') {
      item += c;
      continue;
    }
    if (item.empty())
      throw usage_error(std::string(what) + " must be a comma-separated list without empty items, not '" + text + "'");
    items.push_back(item);
    item.clear();
    if (items.size() > max_choices)
      throw usage_error(std::string(what) + " lists more than " + std::to_string(max_choices) + " choices");
  }
  return items;
}

std::uint64_t parse_bounded(const std::string& text, std::string_view what, std::uint64_t most) {
  const std::uint64_t v = parse_positive(text, what);
  if (v > most) throw usage_error(std::string(what) + " must be at most " + std::to_string(most) + ", not '" + text + "'");
  return v;
}

recompute_choice parse_recompute(const std::string& s) {
  if (s == "none") return {recompute_kind::none, 0};
  if (s == "selective") return {recompute_kind::selective, 0};
  if (s == "full") return {recompute_kind::full, 0};
  if (s.rfind("every:", 0) == 0) return {recompute_kind::every_k, parse_bounded(s.substr(6), "--recompute every:K", 1 << 20)};
  throw usage_error("unknown --recompute '" + s + "' (none|selective|full|every:K)");
}

offload_kind parse_offload(const std::string& s) {
  if (s == "none") return offload_kind::none;
  if (s == "optimizer") return offload_kind::optimizer;
  if (s == "params") return offload_kind::params;
  throw usage_error("unknown --offload '" + s + "' (none|optimizer|params)");
}

std::string gib(bytes b) { return to_string(b, byte_unit::GiB); }

}  // namespace

void add_sweep_flags(CLI::App& app, plan_flags& plan, sweep_flags& sweep) {
  plan.add_to(app);
  // The search dimensions replace plan's single-valued flags of the same names.
  for (const char* name : {"--dp", "--tp", "--pp", "--cp", "--zero", "--offload", "--micro-batch", "--recompute", "--sp",
                           "--sequence-parallel"})
    if (CLI::Option* o = app.get_option_no_throw(name)) app.remove_option(o);
  app.add_option("--world", sweep.world, "number of GPUs (required); dp = world / (tp*pp*cp)");
  app.add_option("--zero", sweep.zero, "ZeRO stages to search (default 0,1,2,3)");
  app.add_option("--tp", sweep.tp, "tensor-parallel degrees (default: powers of two up to 8 dividing --world)");
  app.add_option("--pp", sweep.pp, "pipeline degrees, 1F1B (default: powers of two up to 32 dividing --world)");
  app.add_option("--cp", sweep.cp, "context-parallel degrees (default: 1,2,4 where they divide --world)");
  app.add_option("--sp", sweep.sp, "sequence parallelism where tp > 1: on|off|both (default on)");
  app.add_option("--recompute", sweep.recompute, "recomputation: none,selective,full,every:K (default: the recipe's)");
  app.add_option("--micro-batch", sweep.micro_batch, "micro-batch sizes (default: the recipe's)");
  app.add_option("--offload", sweep.offload, "offload choices: none,optimizer,params (default none)");
  app.add_option("--global-batch", sweep.global_batch,
                 "sequences per optimizer step over all data-parallel ranks: each configuration accumulates "
                 "global/(dp*micro-batch) micro-batches (default: --grad-accum for every configuration)");
  app.add_option("--top", sweep.top, "how many configurations to list, best first (default 10, at most 1000)");
  app.add_option("--sort", sweep.sort, "memory|comm|batch: least memory, least communication, largest micro-batch");
  app.add_flag("--json", sweep.json, "print one JSON object");
  app.add_flag("--exhaustive", sweep.exhaustive, "plan every configuration instead of pruning (same results)");
  app.add_option("--svg", sweep.svg, "write a stacked-bar chart of the listed configurations to FILE");
  app.add_option("--progress", sweep.progress, "progress line on stderr: auto|always|never (default auto)");
}

sweep_setup make_sweep(const plan_flags& plan, const sweep_flags& sweep) {
  sweep_setup s{};
  if (sweep.world.empty()) throw usage_error("--world is required (the number of GPUs, e.g. --world 8)");
  const std::uint64_t world = parse_bounded(sweep.world, "--world", 1 << 21);

  // The base plan: one rank; the space supplies the mesh. The expert degree is kept as given.
  plan_flags base = plan;
  base.dp = base.tp = base.pp = base.cp = base.ep = "1";
  base.zero = "0";
  base.offload = "none";
  s.base = make_inputs(base);
  s.base.mesh.ep = parse_bounded(plan.ep, "--ep", world);

  search_problem& p = s.problem;
  p.model = s.base.model;
  p.training = s.base.training;
  p.mesh = s.base.mesh;
  p.device = s.base.device;
  p.space = default_space(world);
  search_space& space = p.space;

  space.zero_stages = {};
  for (const std::string& z : split_list(sweep.zero, "--zero")) {
    if (z.size() != 1 || z[0] < '0' || z[0] > '3') throw usage_error("--zero lists stages 0, 1, 2 or 3, not '" + z + "'");
    space.zero_stages.push(z[0] - '0');
  }
  if (sweep.sp != "on" && sweep.sp != "off" && sweep.sp != "both")
    throw usage_error("--sp must be on, off or both, not '" + sweep.sp + "'");
  std::vector<std::uint64_t> tensor_degrees;
  if (sweep.tp.empty())
    for (const tensor_choice& t : space.tensor) tensor_degrees.push_back(t.degree);
  else
    for (const std::string& t : split_list(sweep.tp, "--tp")) tensor_degrees.push_back(parse_bounded(t, "--tp", world));
  space.tensor = {};
  for (std::uint64_t t : tensor_degrees) {
    if (t == 1 || sweep.sp != "on") space.tensor.push(tensor_choice{t, false});
    if (t > 1 && sweep.sp != "off") space.tensor.push(tensor_choice{t, true});
  }
  if (!sweep.pp.empty()) {
    space.pipeline = {};
    for (const std::string& x : split_list(sweep.pp, "--pp")) space.pipeline.push(pipeline_choice{parse_bounded(x, "--pp", world)});
  }
  if (!sweep.cp.empty()) {
    space.context = {};
    for (const std::string& x : split_list(sweep.cp, "--cp")) space.context.push(parse_bounded(x, "--cp", world));
  }
  if (!sweep.recompute.empty())
    for (const std::string& x : split_list(sweep.recompute, "--recompute")) space.recompute.push(parse_recompute(x));
  if (!sweep.micro_batch.empty())
    for (const std::string& x : split_list(sweep.micro_batch, "--micro-batch"))
      space.micro_batch.push(parse_bounded(x, "--micro-batch", 1 << 20));
  space.offload = {};
  for (const std::string& x : split_list(sweep.offload, "--offload")) space.offload.push(parse_offload(x));

  if (!sweep.global_batch.empty()) space.global_batch = parse_bounded(sweep.global_batch, "--global-batch", 1ULL << 32);

  const std::uint64_t size = space.size();
  if (size > max_sweep_configurations)
    throw usage_error("the space has " + std::to_string(size) + " configurations, more than " +
                      std::to_string(max_sweep_configurations) + ": list fewer choices");

  if (sweep.sort == "memory") s.order = search_order::memory;
  else if (sweep.sort == "comm") s.order = search_order::communication;
  else if (sweep.sort == "batch") s.order = search_order::micro_batch;
  else throw usage_error("--sort must be memory, comm or batch, not '" + sweep.sort + "'");
  s.top = parse_bounded(sweep.top, "--top", max_top);
  if (sweep.progress != "auto" && sweep.progress != "always" && sweep.progress != "never")
    throw usage_error("--progress must be auto, always or never, not '" + sweep.progress + "'");
  return s;
}

namespace {
sweep_entry entry_at(const search_problem& p, std::uint64_t index) {
  sweep_entry e{};
  e.result = evaluate_candidate(p, index);
  if (e.result.valid() && !e.result.plan.fits) {  // evaluate_candidate costs only what fits
    e.result.comm = communication(p.model, apply_strategy(e.result.config, p.training),
                                  apply_strategy(e.result.config, p.mesh));
  }
  e.mesh = apply_strategy(e.result.config, p.mesh);
  e.training = apply_strategy(e.result.config, p.training);
  return e;
}
}  // namespace

sweep_report run_sweep_search(const sweep_setup& s, bool exhaustive, const progress_callback& progress) {
  sweep_report out{};
  const auto start = std::chrono::steady_clock::now();
  const auto on_progress = [&](std::uint64_t decided, std::uint64_t total) {
    if (progress) progress(decided, total);
  };
  static thread_local top_list list;  // 32 KB: not on the stack
  try {
    out.summary = exhaustive ? top_strategies_exhaustive(s.problem, s.order, s.top, list, on_progress)
                             : top_strategies(s.problem, s.order, s.top, list, on_progress);
    for (std::size_t i = 0; i < list.size; ++i) out.ranked.push_back(entry_at(s.problem, list.keys[i].index));
    if (out.summary.feasible == 0 && out.summary.closest.found())
      out.closest = entry_at(s.problem, out.summary.closest.index());
  } catch (const std::overflow_error&) {
    throw usage_error("a byte count of this space overflows 64 bits: list smaller micro-batches or degrees");
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

std::string strategy_label(const strategy& c, const training_desc& t) {
  std::string s = "dp=" + std::to_string(c.dp) + " zero=" + std::to_string(c.zero_stage) +
                  " tp=" + std::to_string(c.tensor.degree) + (c.tensor.sequence_parallel ? "+sp" : "") +
                  " pp=" + std::to_string(c.pipeline.degree) + " cp=" + std::to_string(c.context) +
                  " mb=" + std::to_string(t.micro_batch) + " recompute=" + std::string(recompute_name(t.recompute));
  if (t.recompute == recompute_kind::every_k) s += ":" + std::to_string(t.recompute_every);
  s += " offload=" + std::string(offload_name(c.offload));
  return s;
}

nlohmann::json strategy_json(const strategy& c, const mesh_desc& m, const training_desc& t) {
  nlohmann::json j;
  j["index"] = c.index;
  j["dp"] = m.dp;
  j["zero"] = m.zero_stage;
  j["tp"] = m.tp;
  j["sequence_parallel"] = m.sequence_parallel;
  j["pp"] = m.pp;
  j["cp"] = m.cp;
  j["ep"] = m.ep;
  j["micro_batch"] = t.micro_batch;
  j["grad_accum"] = t.grad_accum;
  j["recompute"] = std::string(recompute_name(t.recompute));
  if (t.recompute == recompute_kind::every_k) j["recompute_every"] = t.recompute_every;
  j["offload"] = std::string(offload_name(m.offload));
  return j;
}

nlohmann::json comm_json(const comm_volume& v) {
  nlohmann::json j;
  j["data_parallel"] = v.data_parallel.value;
  j["tensor_parallel"] = v.tensor_parallel.value;
  j["pipeline"] = v.pipeline.value;
  j["context_parallel"] = v.context_parallel.value;
  j["expert_parallel"] = v.expert_parallel.value;
  j["total"] = v.total().value;
  j["activations_counted"] = v.activations_counted;
  return j;
}

namespace {
nlohmann::json entry_json(const sweep_setup& s, const sweep_entry& e) {
  plan_inputs in = s.base;
  in.mesh = e.mesh;
  in.training = e.training;
  nlohmann::json j = plan_json(in, e.result.plan);
  j["config"] = strategy_json(e.result.config, e.mesh, e.training);
  j["communication_per_step"] = comm_json(e.result.comm);
  return j;
}
std::string_view order_name(search_order o) {
  switch (o) {
    case search_order::memory: return "memory";
    case search_order::communication: return "comm";
    case search_order::micro_batch: return "batch";
  }
  return "memory";
}
}  // namespace

nlohmann::json sweep_json(const sweep_setup& s, const sweep_report& r, bool exhaustive) {
  nlohmann::json j;
  j["world"] = s.problem.space.world;
  j["parameters"] = s.problem.model.parameters();
  j["device"] = {{"name", std::string(s.problem.device.name)},
                 {"capacity", s.problem.device.capacity.value},
                 {"limit", s.problem.device.limit().value}};
  j["sort"] = std::string(order_name(s.order));
  j["global_batch"] = s.problem.space.global_batch;
  j["evaluated"] = r.summary.evaluated;
  j["valid"] = r.summary.valid;
  j["feasible"] = r.summary.feasible;
  j["planned"] = r.summary.planned;
  j["exhaustive"] = exhaustive;
  j["seconds"] = r.seconds;
  j["results"] = nlohmann::json::array();
  for (const sweep_entry& e : r.ranked) j["results"].push_back(entry_json(s, e));
  j["closest"] = r.closest ? entry_json(s, *r.closest) : nlohmann::json(nullptr);
  return j;
}

std::string sweep_table(const sweep_setup& s, const sweep_report& r) {
  std::ostringstream out;
  const search_problem& p = s.problem;
  out << "model: " << p.model.parameters() << " parameters";
  if (!p.model.name.empty()) out << " (" << p.model.name << ")";
  out << ", precision " << p.training.precision.name << ", optimizer " << p.training.optimizer.name;
  if (p.training.sequence != 0) out << ", sequence " << p.training.sequence;
  if (p.space.global_batch != 0) out << ", " << p.space.global_batch << " sequences per step";
  else if (p.training.grad_accum != 1) out << ", " << p.training.grad_accum << " micro-batches per step";
  out << "\nworld: " << p.space.world << " x " << p.device.name << " (limit " << gib(p.device.limit()) << " each)\n";
  out << "searched " << r.summary.evaluated << " configurations: " << r.summary.valid << " valid, " << r.summary.feasible
      << " fit (" << r.summary.planned << " planned, " << std::fixed << std::setprecision(3) << r.seconds << " s)\n";
  if (r.ranked.empty()) {
    out << "nothing fits.";
    if (r.closest) {
      const sweep_entry& e = *r.closest;
      out << " The closest, " << strategy_label(e.result.config, e.training) << ", needs "
          << gib(e.result.plan.peak()) << ": short by " << gib(e.result.plan.shortfall()) << ".";
    }
    out << "\n";
    return out.str();
  }
  out << "best " << r.ranked.size() << " by "
      << (s.order == search_order::memory          ? "memory"
          : s.order == search_order::communication ? "communication per step"
                                                   : "micro-batch")
      << ":\n";
  out << std::setw(4) << "#" << std::setw(6) << "dp" << std::setw(5) << "zero" << std::setw(4) << "tp" << std::setw(4)
      << "sp" << std::setw(4) << "pp" << std::setw(4) << "cp" << std::setw(6) << "mb" << "  " << std::left
      << std::setw(11) << "recompute" << std::setw(10) << "offload" << std::right << std::setw(12) << "peak"
      << std::setw(14) << "comm/step" << "  phase\n";
  bool unknown_traffic = false;
  for (std::size_t i = 0; i < r.ranked.size(); ++i) {
    const sweep_entry& e = r.ranked[i];
    const strategy& c = e.result.config;
    std::string rc(recompute_name(e.training.recompute));
    if (e.training.recompute == recompute_kind::every_k) rc += ":" + std::to_string(e.training.recompute_every);
    out << std::setw(4) << (i + 1) << std::setw(6) << c.dp << std::setw(5) << c.zero_stage << std::setw(4)
        << c.tensor.degree << std::setw(4) << (c.tensor.sequence_parallel ? "on" : "-") << std::setw(4)
        << c.pipeline.degree << std::setw(4) << c.context << std::setw(6) << e.training.micro_batch << "  "
        << std::left << std::setw(11) << rc << std::setw(10) << offload_name(c.offload) << std::right << std::setw(12)
        << gib(e.result.plan.peak()) << std::setw(14) << gib(e.result.comm.total()) << "  "
        << phase_name(e.result.plan.peak_phase) << "\n";
    unknown_traffic = unknown_traffic || !e.result.comm.activations_counted;
  }
  if (unknown_traffic)
    out << "note: a model given by its parameter count (or a recipe without --seq) has no activation "
           "traffic to count: comm/step covers data parallelism only; give the layers for the rest\n";
  return out.str();
}

progress_line::progress_line(std::ostream& out, bool enabled, std::chrono::milliseconds after,
                             std::function<clock::time_point()> now)
    : out_(out), enabled_(enabled), after_(after), now_(std::move(now)), start_(now_()) {}

void progress_line::update(std::uint64_t decided, std::uint64_t total) {
  if (!enabled_ || total == 0) return;
  const clock::time_point t = now_();
  if (t - start_ < after_) return;
  if (shown_ && t - last_ < std::chrono::milliseconds(100)) return;  // at most ten lines a second
  last_ = t;
  shown_ = true;
  const double seconds = std::chrono::duration<double>(t - start_).count();
  out_ << "\rmemalg sweep: " << (decided * 100 / total) << "% (" << decided << " of " << total << " configurations, "
       << static_cast<std::uint64_t>(seconds) << " s)" << std::flush;
}

void progress_line::finish() {
  if (shown_) out_ << "\r\033[K" << std::flush;  // erase the line
  shown_ = false;
}

int run_sweep(const plan_flags& plan, const sweep_flags& sweep) {
  const sweep_setup s = make_sweep(plan, sweep);
  const bool terminal = ::isatty(STDERR_FILENO) == 1;
  progress_line line(std::cerr, sweep.progress == "always" || (sweep.progress == "auto" && terminal));
  sweep_report r;
  try {
    r = run_sweep_search(s, sweep.exhaustive, [&](std::uint64_t d, std::uint64_t t) { line.update(d, t); });
  } catch (...) {
    line.finish();
    throw;
  }
  line.finish();
  if (!sweep.svg.empty()) {
    chart c{};
    c.title = "memalg sweep: ";
    if (!s.problem.model.name.empty()) c.title += std::string(s.problem.model.name) + ", ";
    c.title += parameter_count_text(s.problem.model.parameters()) + " parameters on " +
               std::to_string(s.problem.space.world) + " x " + std::string(s.problem.device.name);
    c.subtitle = "per-rank device memory of the most loaded rank, best " + std::to_string(r.ranked.size()) + " by " +
                 std::string(order_name(s.order));
    c.device = std::string(s.problem.device.name);
    c.capacity = s.problem.device.capacity;
    c.limit = s.problem.device.limit();
    for (const sweep_entry& e : r.ranked)
      c.bars.push_back({strategy_label(e.result.config, e.training), e.result.plan.per_rank, e.result.plan.fits});
    if (c.bars.empty() && r.closest) {
      c.subtitle = "nothing fits: the closest configuration";
      c.bars.push_back({strategy_label(r.closest->result.config, r.closest->training), r.closest->result.plan.per_rank,
                        false});
    }
    if (c.bars.empty()) throw usage_error("nothing to chart: no configuration of the space is valid");
    write_svg(c, sweep.svg);
  }
  if (sweep.json) std::cout << sweep_json(s, r, sweep.exhaustive).dump(2) << "\n";
  else std::cout << sweep_table(s, r);
  return 0;
}

}  // namespace memalg::cli

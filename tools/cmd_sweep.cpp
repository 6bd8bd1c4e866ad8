// SPDX-License-Identifier: BSL-1.0
// tools/cmd_sweep.cpp — `memalg sweep`: the strategy search of plan/search.hpp at run time.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "planner.hpp"

namespace memalg::cli {

namespace {

/// "1,2,4", and ranges of integers in it: "1..8" lists 1, 2, ..., 8.
std::vector<std::string> split_list(const std::string& text, std::string_view what) {
  std::vector<std::string> items;
  std::string item;
  const auto too_many = [&] {
    return usage_error(std::string(what) + " lists more than " + std::to_string(max_choices) + " choices");
  };
  for (char c : text + ",") {
    if (c != ',') {
      item += c;
      continue;
    }
    if (item.empty())
      throw usage_error(std::string(what) + " must be a comma-separated list without empty items, not '" + text + "'");
    if (item.find("..") != std::string::npos) {
      const size_range r = parse_range(item, what, 1ULL << 32);
      if (r.hi - r.lo >= max_choices)
        throw usage_error(std::string(what) + " " + item + " is " + std::to_string(r.hi - r.lo + 1) +
                          " choices, more than the " + std::to_string(max_choices) +
                          " a sweep searches in one dimension: list fewer (1,2,4,8,16,32,64), or ask `memalg fit " +
                          std::string(what) + " " + item + "` for the largest that fits");
      for (std::uint64_t v = r.lo; v <= r.hi; ++v) items.push_back(std::to_string(v));
    } else {
      items.push_back(item);
    }
    item.clear();
    if (items.size() > max_choices) throw too_many();
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

/// GiB, the unit of the sweep's columns; past 1 TiB (a plan no device holds) the unit that suits it.
std::string gib(bytes b) { return b.value < (1ULL << 40) ? to_string(b, byte_unit::GiB) : to_string(b); }

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
  // The schedule applies to the pipeline degrees searched, not to the one-rank base plan.
  pipeline_choice schedule{};
  if (plan.pp_schedule != "1f1b") {
    const plan_inputs probe = make_inputs([&] {
      plan_flags g{};
      g.params = "1B";
      g.pp = "2";
      g.pp_schedule = plan.pp_schedule;
      g.states_only = true;
      return g;
    }());
    schedule.schedule = probe.mesh.schedule;
    schedule.virtual_stages = probe.mesh.virtual_stages;
    base.pp_schedule = "1f1b";
  }
  s.base = make_inputs(base);
  require_sequence(s.base, plan);
  s.base.mesh.ep = parse_bounded(plan.ep, "--ep", world);

  search_problem& p = s.problem;
  p.model = s.base.model;
  p.training = s.base.training;
  p.mesh = s.base.mesh;
  p.device = s.base.device;
  p.space = default_space(world);
  search_space& space = p.space;

  space.zero_stages = {};
  // On one GPU there is no data parallelism to shard over: the ZeRO stages are one plan (ZeRO-3
  // only adds the gather buffers), so the default lists stage 0 alone.
  const std::string zero_list = world == 1 && sweep.zero == sweep_flags{}.zero ? std::string("0") : sweep.zero;
  for (const std::string& z : split_list(zero_list, "--zero")) {
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
  if (schedule.schedule != pipeline_schedule::one_f_one_b) {
    choices<pipeline_choice> staged{};
    for (const pipeline_choice& c : space.pipeline)
      if (c.degree > 1) staged.push(pipeline_choice{c.degree, schedule.schedule, schedule.virtual_stages});
    if (staged.size == 0)
      throw usage_error("--pp-schedule " + plan.pp_schedule + " needs a pipeline degree above 1 in --pp");
    space.pipeline = staged;
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
sweep_entry entry_of(const search_problem& p, candidate c) {
  sweep_entry e{};
  e.result = c;
  if (e.result.valid() && !e.result.plan.fits) {  // evaluate_candidate costs only what fits
    e.result.comm = communication(p.model, apply_strategy(e.result.config, p.training),
                                  apply_strategy(e.result.config, p.mesh));
  }
  e.mesh = apply_strategy(e.result.config, p.mesh);
  e.training = apply_strategy(e.result.config, p.training);
  return e;
}
sweep_entry entry_at(const search_problem& p, std::uint64_t index) { return entry_of(p, evaluate_candidate(p, index)); }

/// Why configuration `index` of the space cannot be planned, in the user's terms.
std::string reason_of(const sweep_setup& s, std::uint64_t index) {
  const search_space& space = s.problem.space;
  const strategy c = strategy_at(space, index);
  const std::uint64_t model_parallel = c.tensor.degree * c.pipeline.degree * c.context;
  if (c.dp == 0)
    return "tp x pp x cp = " + std::to_string(c.tensor.degree) + " x " + std::to_string(c.pipeline.degree) + " x " +
           std::to_string(c.context) + " = " + std::to_string(model_parallel) + " does not divide --world " +
           std::to_string(space.world);
  const training_desc t = apply_strategy(c, s.problem.training);
  if (space.global_batch != 0 && t.grad_accum == 0)
    return "--global-batch " + std::to_string(space.global_batch) + " is not a multiple of dp x micro-batch = " +
           std::to_string(c.dp) + " x " + std::to_string(t.micro_batch);
  const mesh_desc m = apply_strategy(c, s.problem.mesh);
  return std::string(plan_error(s.problem.model, t, m, s.problem.device));
}
}  // namespace

std::string why_invalid(const sweep_setup& s) {
  // The distinct reasons among the first configurations (finding one is cheap: no plan is made).
  const std::uint64_t n = std::min<std::uint64_t>(s.problem.space.size(), 100'000);
  std::vector<std::string> reasons;
  std::string example;
  for (std::uint64_t i = 0; i < n && reasons.size() < 3; ++i) {
    const std::string r = reason_of(s, i);
    if (r.empty() || std::find(reasons.begin(), reasons.end(), r) != reasons.end()) continue;
    if (reasons.empty()) {
      const strategy c = strategy_at(s.problem.space, i);
      example = strategy_label(c, apply_strategy(c, s.problem.training));
    }
    reasons.push_back(r);
  }
  if (reasons.empty()) return "no configuration of the space is valid";
  std::string out = "no configuration is valid: " + reasons.front() + " (e.g. " + example + ")";
  for (std::size_t i = 1; i < reasons.size(); ++i) out += "; " + reasons[i];
  return out;
}

namespace {

bool equal_timelines(const timeline& a, const timeline& b) {
  for (std::size_t i = 0; i < phase_count; ++i)
    if (!(a.at[i] == b.at[i])) return false;
  return a.host == b.host && a.parameters == b.parameters && a.chunks_in_flight == b.chunks_in_flight &&
         a.activations_per_micro_batch == b.activations_per_micro_batch;
}
bool equal_plans(const plan_result& a, const plan_result& b) {
  return a.parameters == b.parameters && a.most_loaded_stage == b.most_loaded_stage &&
         equal_timelines(a.most_loaded, b.most_loaded) && a.per_rank == b.per_rank &&
         a.host_per_rank == b.host_per_rank && a.peak_phase == b.peak_phase && a.limit == b.limit &&
         a.usable == b.usable && a.fits == b.fits;
}
bool equal_comm(const comm_volume& a, const comm_volume& b) {
  return a.data_parallel == b.data_parallel && a.tensor_parallel == b.tensor_parallel && a.pipeline == b.pipeline &&
         a.context_parallel == b.context_parallel && a.expert_parallel == b.expert_parallel &&
         a.activations_counted == b.activations_counted;
}
layer_rows rows_of(const sweep_setup& s, const sweep_entry& e) {
  return memalg::layer_table(s.base.model, e.training, e.mesh, e.result.plan.most_loaded_stage, s.base.device);
}
bool equal_rows(const layer_rows& a, const layer_rows& b) {
  if (a.size != b.size) return false;
  for (std::size_t i = 0; i < a.size; ++i) {
    const layer_row &x = a.rows[i], &y = b.rows[i];
    if (x.name != y.name || x.kind != y.kind || x.count != y.count || x.weights != y.weights ||
        x.activations != y.activations)
      return false;
  }
  return true;
}
/// Everything of same_plan but the per-layer table (which costs about a plan to compute).
bool same_numbers(const sweep_entry& a, const sweep_entry& b) {
  return a.result.issue == b.result.issue && a.training.micro_batch == b.training.micro_batch &&
         a.training.grad_accum == b.training.grad_accum && equal_comm(a.result.comm, b.result.comm) &&
         equal_plans(a.result.plan, b.result.plan);
}

/// The enums list their values simplest first (no offload, optimizer, params; none, selective,
/// full, every:K; 1F1B, interleaved, GPipe), so their underlying values are their simplicity rank.
template <class Enum>
std::uint64_t rank_of(Enum e) {
  return static_cast<std::uint64_t>(e);
}
}  // namespace

bool same_plan(const sweep_setup& s, const sweep_entry& a, const sweep_entry& b) {
  return same_numbers(a, b) && equal_rows(rows_of(s, a), rows_of(s, b));
}

bool simpler_spelling(const sweep_entry& a, const sweep_entry& b) {
  const mesh_desc &x = a.mesh, &y = b.mesh;
  const training_desc &u = a.training, &v = b.training;
  const auto knobs = [](const mesh_desc& m, const training_desc& t, std::uint64_t index) {
    return std::array<std::uint64_t, 11>{static_cast<std::uint64_t>(m.zero_stage),
                                         rank_of(m.offload),
                                         rank_of(t.recompute),
                                         t.recompute == recompute_kind::every_k ? t.recompute_every : 0,
                                         m.sequence_parallel ? 1u : 0u,
                                         m.tp,
                                         m.pp,
                                         m.cp,
                                         rank_of(m.schedule),
                                         m.virtual_stages,
                                         index};
  };
  return knobs(x, u, a.result.config.index) < knobs(y, v, b.result.config.index);
}

namespace {
/// Ranks by peak, communication and micro-batch as the search does, ignoring the index: equal
/// plans have equal values, so only configurations of one such run can be the same plan.
bool values_before(ranking_key a, ranking_key b, search_order order) {
  a.index = b.index = 0;
  return ranks_before(a, b, order);
}
bool same_values(const ranking_key& a, const ranking_key& b) {
  return a.peak == b.peak && a.comm == b.comm && a.micro_batch == b.micro_batch;
}

/// One distinct plan: the spelling shown (with the count of the others), its rank (its values, and
/// the lowest index among its spellings, so that distinct plans of equal values keep the search's
/// index order) and its per-layer table, computed once when a possible duplicate first needs it.
struct plan_group {
  sweep_entry shown{};
  ranking_key key{};
  std::unique_ptr<layer_rows> rows;  // 2 KB, for the few that need it
};
using plan_groups = std::vector<std::unique_ptr<plan_group>>;  // pointers: cheap to insert into

/// Folds `e` into the group of its plan among groups[lo, hi) (all with `e`'s values); false when
/// none has its plan.
bool fold_into(const sweep_setup& s, plan_groups& groups, std::size_t lo, std::size_t hi, const sweep_entry& e) {
  std::optional<layer_rows> rows;
  for (std::size_t g = lo; g < hi; ++g) {
    plan_group& group = *groups[g];
    if (!same_numbers(group.shown, e)) continue;
    if (!group.rows) group.rows = std::make_unique<layer_rows>(rows_of(s, group.shown));
    if (!rows) rows = rows_of(s, e);
    if (!equal_rows(*group.rows, *rows)) continue;
    const std::uint64_t folded = group.shown.folded + 1;
    if (simpler_spelling(e, group.shown)) {
      group.shown = e;
      *group.rows = *rows;
    }
    group.shown.folded = folded;
    return true;
  }
  return false;
}

/// The distinct plans of `keys`, ranked (best first, ties by index) and holding every spelling of
/// the plans they hold: runs of equal values are folded whole, up to the run that makes `top`.
void fold_ranked(const sweep_setup& s, const std::vector<ranking_key>& keys, plan_groups& groups) {
  groups.clear();
  for (std::size_t i = 0; i < keys.size() && groups.size() < s.top;) {
    std::size_t end = i + 1;
    while (end < keys.size() && same_values(keys[end], keys[i])) ++end;
    const std::size_t first = groups.size();
    for (std::size_t k = i; k < end; ++k) {
      const sweep_entry e = entry_at(s.problem, keys[k].index);
      if (!fold_into(s, groups, first, groups.size(), e))
        groups.push_back(std::make_unique<plan_group>(plan_group{e, keys[k], nullptr}));
    }
    i = end;
  }
}

/// The pruned search (plan/search.hpp's top_strategies) over `chunks` consecutive ranges of the
/// space, each keeping its best `capacity`; `keys` gets the configurations that rank strictly
/// before the values at which any range's list was cut — of those it holds every one, so every
/// spelling of their plans — ranked. Returns whether a list was cut.
bool ranked_chunks(const sweep_setup& s, std::size_t capacity, std::uint64_t chunks, search_result& summary,
                   std::vector<ranking_key>& keys, const progress_callback& progress) {
  static thread_local top_list list;  // 32 KB: not on the stack
  const search_problem& p = s.problem;
  const std::uint64_t n = p.space.size(), k = detail::group_size(p.space);
  const std::uint64_t groups = (n + k - 1) / k;
  summary = search_result{};
  keys.clear();
  std::optional<ranking_key> cut;
  for (std::uint64_t c = 0; c < chunks; ++c) {
    const std::uint64_t begin = std::min(n, groups / chunks * c * k + std::min(c, groups % chunks) * k);
    const std::uint64_t end = std::min(n, begin + (groups / chunks + (c < groups % chunks ? 1 : 0)) * k);
    list = top_list{};
    list.order = s.order;
    list.capacity = capacity;
    const search_result r = detail::search_range(p, begin, end, [](std::uint64_t) {}, &list,
                                                 [&](std::uint64_t decided, std::uint64_t) {
                                                   if (progress) progress(begin + decided, n);
                                                 });
    summary = merge(summary, r);
    keys.insert(keys.end(), list.keys.begin(), list.keys.begin() + static_cast<std::ptrdiff_t>(list.size));
    if (list.size < r.feasible && (!cut || values_before(list.keys[list.size - 1], *cut, s.order)))
      cut = list.keys[list.size - 1];
  }
  if (cut)
    keys.erase(std::remove_if(keys.begin(), keys.end(),
                              [&](const ranking_key& x) { return !values_before(x, *cut, s.order); }),
               keys.end());
  std::sort(keys.begin(), keys.end(),
            [&](const ranking_key& a, const ranking_key& b) { return ranks_before(a, b, s.order); });
  return cut.has_value();
}

/// Plans every configuration in index order, keeping the best `top` distinct plans as they come
/// (`--exhaustive`, the reference the pruned search is tested against, and the last resort of the
/// pruned one, in bounded memory).
search_result fold_exhaustive(const sweep_setup& s, plan_groups& groups, const progress_callback& progress) {
  groups.clear();
  search_result r{};
  const search_problem& p = s.problem;
  const std::uint64_t n = p.space.size();
  const auto before = [&](const std::unique_ptr<plan_group>& g, const ranking_key& x) {
    return values_before(g->key, x, s.order);
  };
  const auto after = [&](const ranking_key& x, const std::unique_ptr<plan_group>& g) {
    return values_before(x, g->key, s.order);
  };
  for (std::uint64_t i = 0; i < n; ++i) {
    if ((i & 0xfff) == 0 && progress) progress(i, n);
    const candidate c = evaluate_candidate(p, i);
    r.add(c);
    if (!c.feasible()) continue;
    const ranking_key k = key_of(c);
    const bool full = groups.size() >= s.top;
    if (full && values_before(groups.back()->key, k, s.order)) continue;  // ranks after every listed plan
    // The groups of k's values; their first spellings have lower indices than k.
    const auto lo =
        static_cast<std::size_t>(std::lower_bound(groups.begin(), groups.end(), k, before) - groups.begin());
    const auto hi =
        static_cast<std::size_t>(std::upper_bound(groups.begin(), groups.end(), k, after) - groups.begin());
    if (full && hi == groups.size() && lo == hi) continue;
    const sweep_entry e = entry_of(p, c);
    if (fold_into(s, groups, lo, hi, e)) continue;
    if (full && hi == groups.size()) continue;  // a new plan ranking after every listed one
    groups.insert(groups.begin() + static_cast<std::ptrdiff_t>(hi),
                  std::make_unique<plan_group>(plan_group{e, k, nullptr}));
    if (groups.size() > s.top) groups.pop_back();
  }
  return r;
}
}  // namespace

sweep_report run_sweep_search(const sweep_setup& s, bool exhaustive, const progress_callback& progress) {
  sweep_report out{};
  const auto start = std::chrono::steady_clock::now();
  plan_groups groups;
  try {
    if (exhaustive) {
      out.summary = fold_exhaustive(s, groups, progress);
    } else {
      // A ranked list a few times `top` long usually holds `top` distinct plans (spellings of one
      // plan differ in a ZeRO stage or offload that makes no difference). When it does not, the
      // list grows, up to max_top, and then the space is searched in more and more ranges, each
      // with its own list, until the configurations ranking before every range's cut hold `top`
      // distinct plans (or no list is cut: every configuration that fits is then known).
      std::size_t capacity = std::min(max_top, s.top * 2 + 8);
      std::uint64_t chunks = 1;
      const std::uint64_t n = s.problem.space.size(), k = detail::group_size(s.problem.space);
      std::vector<ranking_key> keys;
      for (;;) {
        const bool cut = ranked_chunks(s, capacity, chunks, out.summary, keys, progress);
        fold_ranked(s, keys, groups);
        if (!cut || groups.size() >= s.top) break;
        // Configurations per distinct plan so far, with a margin, give the length needed.
        const std::uint64_t seen = std::max<std::uint64_t>(keys.size(), capacity);
        const std::uint64_t needed =
            groups.empty() ? seen * 4 : (seen * s.top * 5 + 4 * groups.size() - 1) / (4 * groups.size());
        if (capacity < max_top && needed <= max_top) {
          capacity = std::max<std::size_t>(std::min(max_top, capacity * 2), needed);
        } else {
          capacity = max_top;
          chunks = std::min((n + k - 1) / k, std::max(chunks * 2, (2 * needed + max_top - 1) / max_top));
        }
        if (chunks > max_sweep_ranges) {  // nearly every configuration repeats a plan: plan them all
          const search_result pruned = out.summary;
          fold_exhaustive(s, groups, progress);
          out.summary = pruned;  // the same counts; `planned` stays the pruned search's
          break;
        }
      }
    }
    if (groups.size() > s.top) groups.resize(s.top);
    out.ranked.reserve(groups.size());
    for (const std::unique_ptr<plan_group>& g : groups) {
      out.folded += g->shown.folded;
      out.ranked.push_back(g->shown);
    }
    if (out.summary.feasible == 0 && out.summary.closest.found())
      out.closest = entry_at(s.problem, out.summary.closest.index());
    if (out.summary.valid == 0) out.invalid_reason = why_invalid(s);
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
  j["folded"] = e.folded;
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
  j["states_only"] = s.problem.training.sequence == 0;
  j["evaluated"] = r.summary.evaluated;
  j["valid"] = r.summary.valid;
  j["feasible"] = r.summary.feasible;
  j["planned"] = r.summary.planned;
  j["exhaustive"] = exhaustive;
  j["seconds"] = r.seconds;
  j["distinct"] = r.ranked.size();
  j["folded"] = r.folded;
  j["results"] = nlohmann::json::array();
  for (const sweep_entry& e : r.ranked) j["results"].push_back(entry_json(s, e));
  j["closest"] = r.closest ? entry_json(s, *r.closest) : nlohmann::json(nullptr);
  if (!r.invalid_reason.empty()) j["invalid_reason"] = r.invalid_reason;
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
    if (!r.invalid_reason.empty()) out << " " << r.invalid_reason << ".";
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
  if (r.folded != 0)
    out << "folded " << r.folded << " more configuration" << (r.folded == 1 ? "" : "s")
        << " with the plan of a listed one: each plan is listed once, in its simplest spelling\n";
  if (p.training.sequence == 0 && has_layer_structure(p.model))
    out << "note: model states only (--states-only): activations are not counted; \"fit\" is about the model "
           "states alone\n";
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

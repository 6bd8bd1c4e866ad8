// SPDX-License-Identifier: BSL-1.0
// memalg/plan/search.hpp — search over a declared space of parallel strategies and recipes.
//
// A `search_space` lists the choices of each dimension — ZeRO stage, tensor (with or without
// sequence parallelism), pipeline and context parallel degrees, recomputation, micro-batch and
// offload — for a fixed world size, and optionally a global batch (each configuration then
// accumulates global/(dp·micro-batch) micro-batches). The data-parallel degree is what remains:
// dp = world / (tp·pp·cp); a combination whose degrees do not divide the world is invalid.
// Configuration i of the space is a mixed-radix decoding of i, so the space is never
// materialised: a search is a loop over an index, which costs nothing to compile and lets
// `memalg sweep` run the same functions at run time.
//
// Every configuration is decided with `evaluate` (plan/evaluate.hpp) and, when it fits, costed
// with `communication` (plan/comm.hpp). The queries, each deterministic (ties broken as stated,
// then by the lower index):
//
//   least memory            lowest peak of the most loaded rank; ties: less communication, then
//                           the smaller micro-batch
//   least communication     fewest bytes sent per step by the most communicating rank; ties: less
//                           memory, then the smaller micro-batch
//   largest micro-batch     the configuration with the largest micro-batch that fits; ties: less
//                           memory, then less communication
//   every feasible one      indices of all configurations that are valid and fit (list_strategies)
//   the best K in an order  top_strategies (what `memalg sweep --top K` prints)
//   closest                 the least memory among valid configurations, fitting or not (what to
//                           report when nothing fits)
//
// and, for one configuration, `largest_fitting_micro_batch`: a binary search, valid because the
// peak never decreases with the micro-batch. The same monotonicity lets a search decide each group
// of configurations that differ only in the micro-batch with a few plans (detail::search_group);
// `find_strategies_exhaustive` and `top_strategies_exhaustive` plan everything and are what the
// tests compare the pruned answers with.
//
// All of it is constexpr: `find_strategies(...)` in a constant expression is a compile-time
// search whose results can choose types (plan/search_hana.hpp maps them back to strategy types).
// A byte count that overflows 64 bits is a compile error there, as everywhere; at run time it
// throws std::overflow_error, which `memalg sweep` reports as bad input.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string_view>

#include "memalg/plan/comm.hpp"
#include "memalg/plan/evaluate.hpp"

namespace memalg {

/// Most choices one dimension of a search space may list.
inline constexpr std::size_t max_choices = 32;

[[noreturn]] inline void too_many_choices_in_a_search_dimension() {
  throw std::length_error("memalg: a search dimension lists more than max_choices choices");
}

/// A short, fixed-capacity list of the choices of one dimension (a literal type).
template <class T>
struct choices {
  T items[max_choices]{};  // built-in: std::array subscripts are calls in constant evaluation
  std::size_t size = 0;

  constexpr choices() = default;
  constexpr choices(std::initializer_list<T> list) {
    for (const T& v : list) push(v);
  }
  constexpr void push(const T& v) {
    if (size >= max_choices) too_many_choices_in_a_search_dimension();
    items[size++] = v;
  }
  constexpr const T& operator[](std::size_t i) const { return items[i]; }
  constexpr const T* begin() const { return items; }
  constexpr const T* end() const { return items + size; }
  constexpr bool empty() const { return size == 0; }
};

/// A tensor-parallel choice: degree and whether sequence parallelism is on.
struct tensor_choice {
  std::uint64_t degree = 1;
  bool sequence_parallel = false;
};
/// A pipeline choice: degree, schedule and model chunks per rank (interleaved).
struct pipeline_choice {
  std::uint64_t degree = 1;
  pipeline_schedule schedule = pipeline_schedule::one_f_one_b;
  std::uint64_t virtual_stages = 1;
};
/// A recomputation choice (every_k: checkpoint every `every`-th layer input).
struct recompute_choice {
  recompute_kind kind = recompute_kind::none;
  std::uint64_t every = 0;
};

/// The declared space. An empty dimension keeps the base recipe's or mesh's value.
struct search_space {
  std::uint64_t world = 1;
  choices<int> zero_stages{0, 1, 2, 3};
  choices<tensor_choice> tensor{tensor_choice{}};
  choices<pipeline_choice> pipeline{pipeline_choice{}};
  choices<std::uint64_t> context{1};
  choices<recompute_choice> recompute{};
  choices<std::uint64_t> micro_batch{};
  choices<offload_kind> offload{offload_kind::none};
  /// Sequences per optimizer step over all data-parallel ranks (0: keep the recipe's gradient
  /// accumulation). When set, each configuration accumulates global / (dp·micro-batch) micro-
  /// batches, and is invalid when that does not divide: configurations then compare at the same
  /// tokens per step (Megatron-LM's num_microbatches).
  std::uint64_t global_batch = 0;

  /// Number of configurations (valid or not): the product of the dimensions' sizes.
  constexpr std::uint64_t size() const {
    std::uint64_t n = 1;
    for (std::size_t k : {zero_stages.size, tensor.size, pipeline.size, context.size, recompute.size,
                          micro_batch.size, offload.size})
      n = detail::checked_mul(n, k == 0 ? 1 : k);
    return n;
  }
};

/// The position chosen in each dimension of a space by configuration `index` (0 for an empty
/// dimension). Mixed radix: the micro-batch varies fastest, then recomputation, offload, ZeRO
/// stage, context, pipeline and tensor parallelism.
struct choice_digits {
  std::size_t micro_batch = 0, recompute = 0, offload = 0, zero_stage = 0, context = 0, pipeline = 0, tensor = 0;
};
constexpr choice_digits digits_of(const search_space& s, std::uint64_t index) {
  const auto digit = [&index](std::size_t n) {
    if (n == 0) return std::size_t{0};
    const auto d = static_cast<std::size_t>(index % n);
    index /= n;
    return d;
  };
  choice_digits d{};
  d.micro_batch = digit(s.micro_batch.size);
  d.recompute = digit(s.recompute.size);
  d.offload = digit(s.offload.size);
  d.zero_stage = digit(s.zero_stages.size);
  d.context = digit(s.context.size);
  d.pipeline = digit(s.pipeline.size);
  d.tensor = digit(s.tensor.size);
  return d;
}

/// One point of a space: what each dimension chose.
struct strategy {
  std::uint64_t index = 0;  ///< position in the space
  std::uint64_t dp = 0;     ///< world / (tp·pp·cp); 0 when that does not divide
  int zero_stage = 0;
  tensor_choice tensor{};
  pipeline_choice pipeline{};
  std::uint64_t context = 1;
  recompute_choice recompute{};
  std::uint64_t micro_batch = 0;  ///< 0: the base recipe's
  offload_kind offload = offload_kind::none;
  bool has_recompute = false;     ///< the space chose recomputation (else the recipe's)
  std::uint64_t global_batch = 0; ///< the space's (0: the recipe's gradient accumulation)
};

/// Configuration `index` of `space`.
constexpr strategy strategy_at(const search_space& s, std::uint64_t index) {
  const choice_digits d = digits_of(s, index);
  strategy c{};
  c.index = index;
  c.global_batch = s.global_batch;
  if (!s.micro_batch.empty()) c.micro_batch = s.micro_batch[d.micro_batch];
  if (!s.recompute.empty()) {
    c.recompute = s.recompute[d.recompute];
    c.has_recompute = true;
  }
  if (!s.offload.empty()) c.offload = s.offload[d.offload];
  if (!s.zero_stages.empty()) c.zero_stage = s.zero_stages[d.zero_stage];
  if (!s.context.empty()) c.context = s.context[d.context];
  if (!s.pipeline.empty()) c.pipeline = s.pipeline[d.pipeline];
  if (!s.tensor.empty()) c.tensor = s.tensor[d.tensor];
  const std::uint64_t t = c.tensor.degree, p = c.pipeline.degree, x = c.context;
  // Each degree ≤ world, so the product stays far below 2^64 for any real world size.
  if (t != 0 && p != 0 && x != 0 && t <= s.world && p <= s.world && x <= s.world && s.world <= (1ULL << 21)) {
    const std::uint64_t model_parallel = t * p * x;
    if (s.world % model_parallel == 0) c.dp = s.world / model_parallel;
  }
  return c;
}

/// The mesh of configuration `c` (the base mesh supplies what the space does not choose: the
/// expert-parallel degree, ZeRO-3 prefetch).
constexpr mesh_desc apply_strategy(const strategy& c, mesh_desc m) {
  m.dp = c.dp;
  m.tp = c.tensor.degree;
  m.sequence_parallel = c.tensor.sequence_parallel;
  m.pp = c.pipeline.degree;
  m.schedule = c.pipeline.schedule;
  m.virtual_stages = c.pipeline.virtual_stages;
  m.cp = c.context;
  m.zero_stage = c.zero_stage;
  m.offload = c.offload;
  m.world = m.product();
  return m;
}
/// The recipe of configuration `c` (the base recipe supplies everything else).
constexpr training_desc apply_strategy(const strategy& c, training_desc t) {
  if (c.micro_batch != 0) t.micro_batch = c.micro_batch;
  if (c.has_recompute) {
    t.recompute = c.recompute.kind;
    t.recompute_every = c.recompute.every;
  }
  if (c.global_batch != 0) {  // 0 when it does not divide: find_plan_issue calls that invalid
    const std::uint64_t per_step = c.dp * t.micro_batch;
    t.grad_accum = per_step != 0 && c.global_batch % per_step == 0 ? c.global_batch / per_step : 0;
  }
  return t;
}

/// A configuration, its plan and its communication volume.
struct candidate {
  strategy config{};                    ///< micro_batch is the effective one (the recipe's if not chosen)
  plan_issue issue = plan_issue::none;  ///< why it cannot be planned (invalid_mesh when dp = 0)
  plan_result plan{};
  comm_volume comm{};                   ///< computed for feasible configurations only
  constexpr bool valid() const { return issue == plan_issue::none; }
  constexpr bool feasible() const { return valid() && plan.fits; }
};

/// What a search is about: the model, the base recipe and mesh, the device and the space.
struct search_problem {
  model_desc model{};
  training_desc training{};
  mesh_desc mesh{};
  device_desc device{};
  search_space space{};
};

/// Plans configuration `index` of `space` (and, when it fits and `with_comm`, its communication).
constexpr candidate evaluate_candidate(const model_desc& model, const training_desc& base_training,
                                       const mesh_desc& base_mesh, const device_desc& device,
                                       const search_space& space, std::uint64_t index, bool with_comm = true) {
  candidate c{};
  c.config = strategy_at(space, index);
  if (c.config.dp == 0) {
    c.issue = plan_issue::invalid_mesh;
    return c;
  }
  const mesh_desc m = apply_strategy(c.config, base_mesh);
  const training_desc t = apply_strategy(c.config, base_training);
  c.config.micro_batch = t.micro_batch;
  c.issue = find_plan_issue(model, t, m, device);
  if (c.issue != plan_issue::none) return c;
  c.plan = evaluate(model, t, m, device);
  if (with_comm && c.plan.fits) c.comm = communication(model, t, m);
  return c;
}
constexpr candidate evaluate_candidate(const search_problem& p, std::uint64_t index, bool with_comm = true) {
  return evaluate_candidate(p.model, p.training, p.mesh, p.device, p.space, index, with_comm);
}

/// What the queries compare: a configuration's index, peak, communication and micro-batch.
struct ranking_key {
  std::uint64_t index = 0;
  std::uint64_t peak = 0;         ///< bytes, the most loaded rank
  std::uint64_t comm = 0;         ///< bytes sent per step, the most communicating rank
  std::uint64_t micro_batch = 0;
};
constexpr ranking_key key_of(const candidate& c) {
  return {c.config.index, c.plan.peak().value, c.comm.total().value, c.config.micro_batch};
}

/// The orders of the queries.
enum class search_order : std::uint8_t { memory, communication, micro_batch };

/// True when `a` ranks before `b` in `order` (ties as in the header comment, then the lower index).
constexpr bool ranks_before(const ranking_key& a, const ranking_key& b, search_order order) {
  switch (order) {
    case search_order::memory:
      if (a.peak != b.peak) return a.peak < b.peak;
      if (a.comm != b.comm) return a.comm < b.comm;
      if (a.micro_batch != b.micro_batch) return a.micro_batch < b.micro_batch;
      break;
    case search_order::communication:
      if (a.comm != b.comm) return a.comm < b.comm;
      if (a.peak != b.peak) return a.peak < b.peak;
      if (a.micro_batch != b.micro_batch) return a.micro_batch < b.micro_batch;
      break;
    case search_order::micro_batch:
      if (a.micro_batch != b.micro_batch) return a.micro_batch > b.micro_batch;
      if (a.peak != b.peak) return a.peak < b.peak;
      if (a.comm != b.comm) return a.comm < b.comm;
      break;
  }
  return a.index < b.index;
}
constexpr bool ranks_before(const candidate& a, const candidate& b, search_order order) {
  return ranks_before(key_of(a), key_of(b), order);
}

inline constexpr std::uint64_t no_configuration = std::numeric_limits<std::uint64_t>::max();

/// The best configuration of one query so far (index no_configuration: none yet).
struct best_of {
  ranking_key key{no_configuration};
  constexpr bool found() const { return key.index != no_configuration; }
  constexpr std::uint64_t index() const { return key.index; }
  constexpr void offer(const ranking_key& k, search_order order) {
    if (!found() || ranks_before(k, key, order)) key = k;
  }
};

/// Counts and the answer to each query. Results of disjoint index ranges merge (`merge`), so a
/// long compile-time search can be split into several constant expressions (clang limits the
/// steps of one; plan/search_hana.hpp splits).
struct search_result {
  std::uint64_t evaluated = 0;  ///< configurations looked at
  std::uint64_t valid = 0;      ///< of which could be planned
  std::uint64_t feasible = 0;   ///< of which fit
  std::uint64_t planned = 0;    ///< plans computed to decide them (fewer than `valid` when pruned)
  best_of least_memory{};         ///< among the feasible ones
  best_of least_communication{};  ///< among the feasible ones
  best_of largest_micro_batch{};  ///< among the feasible ones
  best_of closest{};              ///< least memory among the valid ones, fitting or not
  constexpr bool found() const { return feasible != 0; }

  /// Counts one planned configuration.
  constexpr void add(const candidate& c) {
    ++evaluated;
    if (!c.valid()) return;
    ++valid;
    ++planned;
    const ranking_key k = key_of(c);
    closest.offer(k, search_order::memory);
    if (!c.plan.fits) return;
    ++feasible;
    least_memory.offer(k, search_order::memory);
    least_communication.offer(k, search_order::communication);
    largest_micro_batch.offer(k, search_order::micro_batch);
  }
  friend constexpr search_result merge(search_result a, const search_result& b) {
    a.evaluated += b.evaluated;
    a.valid += b.valid;
    a.feasible += b.feasible;
    a.planned += b.planned;
    if (b.least_memory.found()) a.least_memory.offer(b.least_memory.key, search_order::memory);
    if (b.least_communication.found())
      a.least_communication.offer(b.least_communication.key, search_order::communication);
    if (b.largest_micro_batch.found()) a.largest_micro_batch.offer(b.largest_micro_batch.key, search_order::micro_batch);
    if (b.closest.found()) a.closest.offer(b.closest.key, search_order::memory);
    return a;
  }
};

/// Every configuration of [begin, end) planned: the reference the pruned search is tested against,
/// and what `memalg sweep` does (it reports every feasible configuration's plan).
constexpr search_result find_strategies_exhaustive(const search_problem& p, std::uint64_t begin = 0,
                                                   std::uint64_t end = no_configuration) {
  search_result r{};
  const std::uint64_t n = p.space.size();
  if (end > n) end = n;
  for (std::uint64_t i = begin; i < end; ++i) r.add(evaluate_candidate(p, i));
  return r;
}

namespace detail {
/// What the pruned search keeps of a plan: its ranking key and whether it fits. (Cheaper than a
/// `candidate` in a constant expression: no plan_result is default-constructed and copied.)
struct verdict {
  ranking_key key{};
  bool fits = false;
};
/// Plans configuration `index`, known to be valid (its communication is left to `cost`).
constexpr verdict judge(const search_problem& p, std::uint64_t index) {
  const strategy c = strategy_at(p.space, index);
  const training_desc t = apply_strategy(c, p.training);
  verdict v{};
  v.key.index = index;
  v.key.peak = peak_bytes(p.model, t, apply_strategy(c, p.mesh), p.device).value;
  v.key.micro_batch = t.micro_batch;
  v.fits = v.key.peak <= p.device.limit().value;
  return v;
}
/// The bytes configuration `index` sends per step (its most communicating rank).
constexpr std::uint64_t cost(const search_problem& p, std::uint64_t index) {
  const strategy c = strategy_at(p.space, index);
  return communication(p.model, apply_strategy(c, p.training), apply_strategy(c, p.mesh)).total().value;
}

/// Positions in a dimension (a built-in array, cheap to subscript in constant evaluation).
struct positions {
  std::size_t at[max_choices]{};
  constexpr std::size_t operator[](std::size_t i) const { return at[i]; }
};
/// Positions of the micro-batch choices in ascending order of value (stable).
constexpr positions micro_batch_order(const search_space& s) {
  positions p{};
  std::size_t* order = p.at;
  for (std::size_t i = 0; i < s.micro_batch.size; ++i) order[i] = i;
  for (std::size_t i = 1; i < s.micro_batch.size; ++i)  // insertion sort: at most max_choices
    for (std::size_t j = i; j > 0 && s.micro_batch[order[j]] < s.micro_batch[order[j - 1]]; --j) {
      const std::size_t x = order[j];
      order[j] = order[j - 1];
      order[j - 1] = x;
    }
  return p;
}

}  // namespace detail

/// Most configurations a ranked list (`top_strategies`, `memalg sweep --top`) holds.
inline constexpr std::size_t max_top = 1000;

/// The best `capacity` configurations in one order, best first.
struct top_list {
  std::array<ranking_key, max_top> keys{};
  std::size_t size = 0;
  std::size_t capacity = 0;
  search_order order = search_order::memory;

  /// Inserts `k` if it ranks among the best `capacity`; returns whether it did.
  constexpr bool offer(const ranking_key& k) {
    if (capacity == 0) return false;
    if (size == capacity && !ranks_before(k, keys[size - 1], order)) return false;
    std::size_t i = size < capacity ? size++ : size - 1;
    for (; i > 0 && ranks_before(k, keys[i - 1], order); --i) keys[i] = keys[i - 1];
    keys[i] = k;
    return true;
  }
};

namespace detail {

/// One group of configurations that differ only in the micro-batch (consecutive indices, the
/// micro-batch being the fastest digit), decided with one validity check and as few plans as
/// monotonicity allows: the peak and the traffic never decrease with the micro-batch, so the
/// fitting ones are a prefix of the valid ones in ascending micro-batch order. Plans: the smallest
/// (it answers least memory, least communication and closest for the group), the largest, and a
/// binary search between them for the largest that fits (it answers largest micro-batch); the
/// communication only of the smallest, and of the largest fitting one when it could rank first.
/// `on_feasible(index)` is called for every fitting configuration. A ranked list (`top`, may be
/// null) takes the group's members in their order of rank until one does not enter: in memory or
/// communication order smaller micro-batches rank first within a group, in micro-batch order
/// larger ones, so no later member could enter either.
template <class OnFeasible>
constexpr void search_group(const search_problem& p, const positions& order,
                            std::uint64_t first_index, search_result& r, OnFeasible&& on_feasible, top_list* top) {
  const std::size_t k = p.space.micro_batch.size;
  r.evaluated += k;
  // Validity does not depend on a micro-batch of at least one (find_plan_issue reads it only to
  // refuse zero), so one check decides the group; the tests compare the counts with brute force.
  const strategy first = strategy_at(p.space, first_index + order[0]);
  std::size_t zero_batches = 0;
  while (zero_batches < k && p.space.micro_batch[order[zero_batches]] == 0) ++zero_batches;
  if (first.dp == 0 || zero_batches == k) return;
  training_desc t = apply_strategy(first, p.training);
  t.micro_batch = p.space.micro_batch[order[zero_batches]];
  if (find_plan_issue(p.model, t, apply_strategy(first, p.mesh), p.device) != plan_issue::none) return;
  std::uint64_t valid[max_choices]{};  // indices of the valid ones, ascending micro-batch
  std::size_t n = 0;
  for (std::size_t i = zero_batches; i < k; ++i) valid[n++] = first_index + order[i];
  r.valid += n;

  verdict known[max_choices]{};  // plans computed so far, by position in `valid`
  bool have[max_choices]{}, costed[max_choices]{};
  const auto decided = [&](std::size_t i) -> verdict& {  // fits or not; no communication yet
    if (!have[i]) {
      known[i] = judge(p, valid[i]);
      have[i] = true;
      ++r.planned;
    }
    return known[i];
  };
  const auto at = [&](std::size_t i) -> const verdict& {  // with its communication when it fits
    verdict& v = decided(i);
    if (v.fits && !costed[i]) {
      v.key.comm = cost(p, valid[i]);
      costed[i] = true;
    }
    return v;
  };

  const verdict& smallest = at(0);
  r.closest.offer(smallest.key, search_order::memory);
  if (!smallest.fits) return;  // nothing larger fits either
  r.least_memory.offer(smallest.key, search_order::memory);
  r.least_communication.offer(smallest.key, search_order::communication);
  std::size_t last_fit = 0;  // position in `valid` of the largest that fits
  if (n > 1) {
    if (decided(n - 1).fits) {
      last_fit = n - 1;
    } else {
      std::size_t lo = 0, hi = n - 1;  // fits(lo), !fits(hi)
      while (hi - lo > 1) {
        const std::size_t mid = lo + (hi - lo) / 2;
        if (decided(mid).fits) lo = mid;
        else hi = mid;
      }
      last_fit = lo;
    }
  }
  // A micro-batch listed twice gives identical configurations: the lower index ranks first.
  std::size_t largest = last_fit;
  while (largest > 0 && p.space.micro_batch[valid[largest - 1] - first_index] ==
                            p.space.micro_batch[valid[last_fit] - first_index])
    --largest;
  ranking_key large_key = decided(last_fit).key;
  for (std::size_t i = largest; i < last_fit; ++i)
    large_key.index = valid[i] < large_key.index ? valid[i] : large_key.index;
  // Its communication decides only against a best with the same micro-batch and the same memory:
  // it is computed only when this one could rank first.
  const ranking_key& best = r.largest_micro_batch.key;
  if (!r.largest_micro_batch.found() || large_key.micro_batch > best.micro_batch ||
      (large_key.micro_batch == best.micro_batch && large_key.peak <= best.peak)) {
    large_key.comm = at(last_fit).key.comm;
    r.largest_micro_batch.offer(large_key, search_order::micro_batch);
  }
  r.feasible += last_fit + 1;
  for (std::size_t i = 0; i <= last_fit; ++i) on_feasible(valid[i]);

  if (top == nullptr || top->capacity == 0) return;
  if (top->order == search_order::micro_batch) {
    // Largest first; equal micro-batches (identical plans) in index order.
    for (std::size_t hi = last_fit + 1; hi > 0;) {
      std::size_t lo = hi - 1;
      while (lo > 0 && p.space.micro_batch[valid[lo - 1] - first_index] == p.space.micro_batch[valid[hi - 1] - first_index])
        --lo;
      std::uint64_t same[max_choices]{};
      std::size_t m = 0;
      for (std::size_t i = lo; i < hi; ++i) same[m++] = valid[i];
      for (std::size_t i = 1; i < m; ++i)
        for (std::size_t j = i; j > 0 && same[j] < same[j - 1]; --j) {
          const std::uint64_t x = same[j];
          same[j] = same[j - 1];
          same[j - 1] = x;
        }
      const ranking_key base = at(hi - 1).key;
      for (std::size_t i = 0; i < m; ++i) {
        ranking_key key = base;
        key.index = same[i];
        if (!top->offer(key)) return;
      }
      hi = lo;
    }
  } else {
    for (std::size_t i = 0; i <= last_fit; ++i) {
      ranking_key key = at(i).key;
      key.index = valid[i];
      if (!top->offer(key)) return;
    }
  }
}

/// Configurations decided together by search_group: the micro-batch choices, when the pruning
/// applies — at least two of them and no global batch (monotonicity in the micro-batch holds at a
/// fixed gradient accumulation; under a global batch the accumulation falls as the micro-batch
/// grows, and ZeRO-2/3 traffic with it) — and otherwise 1: every configuration is planned.
constexpr std::uint64_t group_size(const search_space& s) {
  return s.global_batch == 0 && s.micro_batch.size >= 2 ? s.micro_batch.size : 1;
}

template <class OnFeasible, class OnProgress>
constexpr search_result search_range(const search_problem& p, std::uint64_t begin, std::uint64_t end,
                                     OnFeasible&& on_feasible, top_list* top, OnProgress&& on_progress) {
  search_result r{};
  const std::uint64_t n = p.space.size();
  if (end > n) end = n;
  const std::uint64_t k = group_size(p.space);
  const auto one = [&](std::uint64_t i) {
    const candidate c = evaluate_candidate(p, i);
    r.add(c);
    if (c.feasible()) {
      on_feasible(i);
      if (top != nullptr) top->offer(key_of(c));
    }
  };
  if (k < 2) {  // nothing to prune
    for (std::uint64_t i = begin; i < end; ++i) {
      one(i);
      if ((i & 0xfff) == 0) on_progress(i - begin, end - begin);
    }
    return r;
  }
  const positions order = micro_batch_order(p.space);
  std::uint64_t i = begin;
  for (; i < end && i % k != 0; ++i) one(i);  // a partial group at the start: one by one
  for (std::uint64_t groups = 0; i + k <= end; i += k, ++groups) {
    search_group(p, order, i, r, on_feasible, top);
    if ((groups & 0x3ff) == 0) on_progress(i - begin, end - begin);
  }
  for (; i < end; ++i) one(i);  // and at the end
  return r;
}
}  // namespace detail

/// Answers every query over configurations [begin, end) of the problem's space (all of them by
/// default). Exact, and equal to find_strategies_exhaustive (tested), but it plans far fewer
/// configurations when the space has a micro-batch dimension: see detail::search_group.
constexpr search_result find_strategies(const search_problem& p, std::uint64_t begin = 0,
                                        std::uint64_t end = no_configuration) {
  return detail::search_range(p, begin, end, [](std::uint64_t) {}, nullptr, [](std::uint64_t, std::uint64_t) {});
}

/// The best `count` feasible configurations (at most max_top) in `order`, and the answers to every
/// query — what `memalg sweep` prints. Exact, like find_strategies: a group's members enter the
/// list in their order of rank until one does not (see detail::search_group), so only those
/// that could rank are planned. `on_progress(decided, total)` is called now and then.
template <class OnProgress>
constexpr search_result top_strategies(const search_problem& p, search_order order, std::size_t count, top_list& out,
                                       OnProgress&& on_progress) {
  out = top_list{};
  out.order = order;
  out.capacity = count < max_top ? count : max_top;
  return detail::search_range(p, 0, no_configuration, [](std::uint64_t) {}, &out, on_progress);
}
constexpr search_result top_strategies(const search_problem& p, search_order order, std::size_t count, top_list& out) {
  return top_strategies(p, order, count, out, [](std::uint64_t, std::uint64_t) {});
}
/// The same by planning every configuration (the reference; `memalg sweep --exhaustive`).
template <class OnProgress>
constexpr search_result top_strategies_exhaustive(const search_problem& p, search_order order, std::size_t count,
                                                  top_list& out, OnProgress&& on_progress) {
  out = top_list{};
  out.order = order;
  out.capacity = count < max_top ? count : max_top;
  search_result r{};
  const std::uint64_t n = p.space.size();
  for (std::uint64_t i = 0; i < n; ++i) {
    const candidate c = evaluate_candidate(p, i);
    r.add(c);
    if (c.feasible()) out.offer(key_of(c));
    if ((i & 0xfff) == 0) on_progress(i, n);
  }
  return r;
}

/// The search of [begin, end) with the indices of its feasible configurations, in index order
/// (the first N of them; positions past `count` hold no_configuration).
template <std::size_t N>
struct search_listing {
  search_result result{};
  std::array<std::uint64_t, N> feasible{};
  std::size_t count = 0;
};
template <std::size_t N>
constexpr search_listing<N> list_strategies(const search_problem& p, std::uint64_t begin = 0,
                                            std::uint64_t end = no_configuration) {
  search_listing<N> out{};
  for (std::uint64_t& v : out.feasible) v = no_configuration;
  std::size_t found = 0;
  out.result = detail::search_range(
      p, begin, end,
      [&](std::uint64_t index) {
        if (found < N) out.feasible[found] = index;
        ++found;
      },
      nullptr, [](std::uint64_t, std::uint64_t) {});
  out.count = found < N ? found : N;
  // Groups report in ascending micro-batch order: restore index order (insertion sort, short runs).
  for (std::size_t i = 1; i < out.count; ++i)
    for (std::size_t j = i; j > 0 && out.feasible[j] < out.feasible[j - 1]; --j) {
      const std::uint64_t x = out.feasible[j];
      out.feasible[j] = out.feasible[j - 1];
      out.feasible[j - 1] = x;
    }
  return out;
}

/// The largest micro-batch in [1, upper] with which the configuration fits, or 0 when even one
/// sequence does not fit. Binary search: the peak is non-decreasing in the micro-batch.
constexpr std::uint64_t largest_fitting_micro_batch(const model_desc& model, training_desc t, const mesh_desc& m,
                                                    const device_desc& d, std::uint64_t upper = 1ULL << 20) {
  const auto fits = [&](std::uint64_t b) {
    t.micro_batch = b;
    return find_plan_issue(model, t, m, d) == plan_issue::none && evaluate(model, t, m, d).fits;
  };
  if (upper == 0 || !fits(1)) return 0;
  std::uint64_t lo = 1, hi = upper;
  if (fits(hi)) return hi;
  while (hi - lo > 1) {  // invariant: fits(lo), !fits(hi)
    const std::uint64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid;
  }
  return lo;
}

/// A space of the usual shape for `world` ranks: every power-of-two tensor degree up to 8 that
/// divides it (with sequence parallelism above 1), pipeline degrees 1, 2, 4, 8, 16, 32, context
/// degrees 1, 2, 4, ZeRO stages 0–3, no offload; recomputation and micro-batch from the recipe.
constexpr search_space default_space(std::uint64_t world) {
  search_space s{};
  s.world = world;
  s.tensor = {};
  for (std::uint64_t t = 1; t <= 8; t *= 2)
    if (world % t == 0) s.tensor.push(tensor_choice{t, t > 1});
  s.pipeline = {};
  for (std::uint64_t p = 1; p <= 32; p *= 2)
    if (world % p == 0) s.pipeline.push(pipeline_choice{p});
  s.context = {};
  for (std::uint64_t c = 1; c <= 4; c *= 2)
    if (world % c == 0) s.context.push(c);
  return s;
}

/// Names for reports and JSON.
constexpr std::string_view recompute_name(recompute_kind k) {
  switch (k) {
    case recompute_kind::none: return "none";
    case recompute_kind::selective: return "selective";
    case recompute_kind::full: return "full";
    case recompute_kind::every_k: return "every";
  }
  return "none";
}
constexpr std::string_view offload_name(offload_kind k) {
  switch (k) {
    case offload_kind::none: return "none";
    case offload_kind::optimizer: return "optimizer";
    case offload_kind::params: return "params";
  }
  return "none";
}

}  // namespace memalg

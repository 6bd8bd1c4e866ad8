// SPDX-License-Identifier: BSL-1.0
// tools/cmd_fit.cpp — `memalg fit`: the largest micro-batch (or, with `--seq max`, sequence length)
// with which one configuration fits, and with `--global-batch` the gradient accumulation that
// reaches it.
//
// A binary search over `evaluate` (plan/evaluate.hpp), the same plan `memalg plan` prints: no other
// formula. It is exact because the peak never decreases with the micro-batch or with the sequence
// length (plan/search.hpp `largest_fitting_micro_batch` uses the same argument); a configuration
// the planner calls invalid, or whose byte counts pass 64 bits, does not fit.
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "planner.hpp"

namespace memalg::cli {

size_range parse_range(std::string_view text, std::string_view what, std::uint64_t most) {
  size_range r{};
  const std::size_t dots = text.find("..");
  if (dots == std::string_view::npos) {
    r.lo = r.hi = parse_positive(text, what);
  } else {
    r.lo = parse_positive(text.substr(0, dots), what);
    r.hi = parse_positive(text.substr(dots + 2), what);
    if (r.hi < r.lo)
      throw usage_error(std::string(what) + " range " + std::string(text) + " is empty: write LOW..HIGH with LOW <= HIGH");
  }
  if (r.hi > most)
    throw usage_error(std::string(what) + " must be at most " + std::to_string(most) + ", not '" + std::string(text) + "'");
  return r;
}

namespace {

std::string gib(bytes b) { return to_string(b); }

struct probe {
  plan_inputs in{};
  plan_result plan{};
  bool valid = false;
  std::string why;  ///< the planner's reason when not valid
  bool fits() const { return valid && plan.fits; }
};

}  // namespace

fit_result run_fit_search(const plan_inputs& base, const fit_request& q) {
  fit_result out{};
  const auto start = std::chrono::steady_clock::now();
  const std::uint64_t per_rank_batch = q.global_batch == 0 ? 0 : q.global_batch / base.mesh.dp;
  // The values searched, in ascending order: every size in the range, or with a global batch the
  // micro-batches that divide the sequences of one data-parallel rank.
  std::vector<std::uint64_t> values;
  std::uint64_t step = 1;
  if (q.search_sequence) {
    // The smallest sequence length the mesh accepts (context and sequence parallelism split it):
    // the search keeps to its multiples.
    for (step = 1; step <= 4096; ++step) {
      training_desc t = base.training;
      t.sequence = step;
      const plan_issue i = find_plan_issue(base.model, t, base.mesh, base.device);
      if (i != plan_issue::cp_does_not_divide_sequence && i != plan_issue::sp_does_not_divide_sequence) break;
    }
    if (step > 4096) step = 1;
  } else if (per_rank_batch != 0) {
    for (std::uint64_t d = 1; d * d <= per_rank_batch; ++d)
      if (per_rank_batch % d == 0) {
        values.push_back(d);
        if (d != per_rank_batch / d) values.push_back(per_rank_batch / d);
      }
    std::sort(values.begin(), values.end());
    std::erase_if(values, [&](std::uint64_t v) { return v < q.range.lo || v > q.range.hi; });
  }
  const std::uint64_t first_k = (q.range.lo + step - 1) / step, last_k = q.range.hi / step;
  const std::uint64_t count = values.empty() && per_rank_batch == 0 ? (last_k >= first_k ? last_k - first_k + 1 : 0)
                                                                     : values.size();
  const auto value_at = [&](std::uint64_t i) { return values.empty() ? (first_k + i) * step : values[i]; };
  const auto at = [&](std::uint64_t i) {
    probe p{};
    p.in = base;
    const std::uint64_t v = value_at(i);
    if (q.search_sequence) p.in.training.sequence = v;
    else p.in.training.micro_batch = v;
    if (per_rank_batch != 0) p.in.training.grad_accum = per_rank_batch / p.in.training.micro_batch;
    ++out.plans;
    if (const std::string_view e = plan_error(p.in.model, p.in.training, p.in.mesh, p.in.device); !e.empty()) {
      p.why = std::string(e);
      return p;
    }
    try {
      p.plan = evaluate(p.in.model, p.in.training, p.in.mesh, p.in.device);
      p.valid = true;
    } catch (const std::overflow_error&) {
      p.why = "a byte count past 64 bits";
    }
    return p;
  };
  const auto record = [&](const probe& p, std::optional<fit_point>& into) {
    fit_point f{};
    f.in = p.in;
    f.plan = p.plan;
    f.valid = p.valid;
    f.why = p.why;
    into = f;
  };
  out.step = step;
  if (count == 0) {
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
  }
  probe lo = at(0);
  if (!lo.fits()) {
    record(lo, out.first_not_fitting);
  } else {
    probe hi = at(count - 1);
    if (hi.fits()) {
      record(hi, out.answer);
    } else {
      std::uint64_t a = 0, b = count - 1;  // invariant: a fits, b does not
      probe pa = lo, pb = hi;
      while (b - a > 1) {
        const std::uint64_t mid = a + (b - a) / 2;
        probe pm = at(mid);
        if (pm.fits()) {
          a = mid;
          pa = std::move(pm);
        } else {
          b = mid;
          pb = std::move(pm);
        }
      }
      record(pa, out.answer);
      record(pb, out.first_not_fitting);
    }
  }
  out.step = step;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

namespace {

nlohmann::json point_json(const fit_point& p) {
  nlohmann::json j;
  j["micro_batch"] = p.in.training.micro_batch;
  j["sequence"] = p.in.training.sequence;
  j["grad_accum"] = p.in.training.grad_accum;
  if (!p.valid) {
    j["valid"] = false;
    j["reason"] = p.why;
    return j;
  }
  j["valid"] = true;
  j["peak"] = p.plan.peak().value;
  j["limit"] = p.plan.limit.value;
  j["headroom"] = p.plan.headroom().value;
  j["short_by"] = p.plan.shortfall().value;
  j["plan"] = plan_json(p.in, p.plan);
  return j;
}

std::string row(const fit_point& p, bool sequence) {
  std::ostringstream s;
  s << std::setw(12) << (sequence ? p.in.training.sequence : p.in.training.micro_batch) << std::setw(12)
    << p.in.training.grad_accum;
  if (!p.valid) {
    s << "  not valid: " << p.why;
  } else {
    s << std::setw(13) << gib(p.plan.peak()) << std::setw(13) << (p.plan.fits ? gib(p.plan.headroom()) : "-") << "  "
      << (p.plan.fits ? "yes" : "no, short by " + gib(p.plan.shortfall()));
  }
  return s.str() + "\n";
}

}  // namespace

int run_fit(const plan_flags& plan, const fit_flags& fit) {
  plan_flags f = plan;
  fit_request q{};
  if (f.states_only) throw usage_error("fit searches the sizes that activations depend on: --states-only does not apply");
  if (f.seq.empty())
    throw usage_error("fit needs --seq N (tokens per sequence; the largest micro-batch is searched at it), or --seq max "
                      "with --micro-batch N (the largest sequence length is searched)");
  const std::uint64_t batch_most = 1ULL << 20;
  if (f.seq == "max" || f.seq.find("..") != std::string::npos) {
    q.search_sequence = true;
    q.range = f.seq == "max" ? size_range{1, 1ULL << 20} : parse_range(f.seq, "--seq", 1ULL << 32);
    if (fit.micro_batch_given && f.micro_batch.find("..") != std::string::npos)
      throw usage_error("fit searches one size at a time: give --micro-batch N with --seq max, or --seq N with a --micro-batch range");
    f.seq = std::to_string(q.range.lo);
  } else {
    q.range = fit.micro_batch_given ? parse_range(f.micro_batch, "--micro-batch", batch_most) : size_range{1, batch_most};
    f.micro_batch = std::to_string(q.range.lo);
  }
  if (!fit.global_batch.empty()) {
    if (q.search_sequence) throw usage_error("--global-batch chooses the micro-batch: use it with --seq N, not --seq max");
    if (f.grad_accum != "1") throw usage_error("--global-batch sets the gradient accumulation: give it without --grad-accum");
    q.global_batch = parse_positive(fit.global_batch, "--global-batch");
    if (q.global_batch > (1ULL << 32)) throw usage_error("--global-batch must be at most 4294967296");
  }
  const plan_inputs base = make_inputs(f);
  if (!has_layer_structure(base.model))
    throw usage_error("fit needs a model with layers (--config, --preset or --layers/--hidden/--heads/--vocab): "
                      "a model given by its parameter count has no activations to size");
  if (q.global_batch != 0 && q.global_batch % base.mesh.dp != 0)
    throw usage_error("--global-batch " + fit.global_batch + " is not a multiple of --dp " + std::to_string(base.mesh.dp) +
                      ": every data-parallel rank takes the same number of sequences");
  const fit_result r = run_fit_search(base, q);
  if (!r.answer && !r.first_not_fitting) {  // nothing was searched
    if (q.global_batch != 0)
      throw usage_error("no micro-batch in " + std::to_string(q.range.lo) + ".." + std::to_string(q.range.hi) +
                        " divides the " + std::to_string(q.global_batch / base.mesh.dp) +
                        " sequences of a data-parallel rank (--global-batch " + fit.global_batch + ")");
    throw usage_error("no sequence length in " + std::to_string(q.range.lo) + ".." + std::to_string(q.range.hi) +
                      " is a multiple of " + std::to_string(r.step) + ", which the mesh needs");
  }

  const char* size_name = q.search_sequence ? "sequence" : "micro-batch";
  if (fit.json) {
    nlohmann::json j;
    j["search"] = q.search_sequence ? "sequence" : "micro_batch";
    j["range"] = {q.range.lo, q.range.hi};
    if (q.search_sequence) j["step"] = r.step;
    j["global_batch"] = q.global_batch;
    j["device"] = {{"name", std::string(base.device.name)},
                   {"capacity", base.device.capacity.value},
                   {"limit", base.device.limit().value},
                   {"reserve", base.device.reserve.value}};
    j["precision"] = std::string(base.training.precision.name);
    j["stack"] = std::string(stack_name(base.training.stack));
    j["largest"] = r.answer ? nlohmann::json(q.search_sequence ? r.answer->in.training.sequence
                                                               : r.answer->in.training.micro_batch)
                            : nlohmann::json(nullptr);
    j["answer"] = r.answer ? point_json(*r.answer) : nlohmann::json(nullptr);
    j["first_not_fitting"] = r.first_not_fitting ? point_json(*r.first_not_fitting) : nlohmann::json(nullptr);
    j["plans"] = r.plans;
    j["seconds"] = r.seconds;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::ostringstream out;
  const training_desc& t = base.training;
  out << "model: " << base.model.parameters() << " parameters";
  if (!base.model.name.empty()) out << " (" << base.model.name << ")";
  out << ", precision " << t.precision.name << ", optimizer " << t.optimizer.name << ", stack "
      << stack_name(t.stack) << "\n";
  out << "device: " << base.device.name << ", capacity " << to_string(base.device.capacity) << ", limit "
      << to_string(base.device.limit()) << " (reserve " << to_string(base.device.reserve) << " inside it)\n";
  if (base.mesh.world != 1)
    out << "mesh: dp=" << base.mesh.dp << " (ZeRO-" << base.mesh.zero_stage << ") tp=" << base.mesh.tp
        << " pp=" << base.mesh.pp << " cp=" << base.mesh.cp << "\n";
  out << "\n";
  if (q.search_sequence)
    out << "largest sequence length at micro-batch " << t.micro_batch << " in " << q.range.lo << ".." << q.range.hi
        << (r.step != 1 ? " (multiples of " + std::to_string(r.step) + ")" : std::string()) << ": ";
  else if (q.global_batch != 0)
    out << "largest micro-batch dividing " << q.global_batch / base.mesh.dp << " sequences per rank (--global-batch "
        << q.global_batch << ") at sequence " << t.sequence << ": ";
  else
    out << "largest micro-batch at sequence " << t.sequence << " in " << q.range.lo << ".." << q.range.hi << ": ";
  if (r.answer) {
    out << (q.search_sequence ? r.answer->in.training.sequence : r.answer->in.training.micro_batch);
    if (q.global_batch != 0)
      out << ", with gradient accumulation " << r.answer->in.training.grad_accum << " (" << r.answer->in.training.micro_batch
          << " x " << r.answer->in.training.grad_accum << " x dp " << base.mesh.dp << " = " << q.global_batch
          << " sequences per step)";
    out << "\n";
  } else {
    out << "none: " << (r.first_not_fitting && !r.first_not_fitting->valid ? "the smallest is not a valid plan"
                                                                           : "even the smallest does not fit")
        << "\n";
  }
  out << "\n" << std::setw(12) << size_name << std::setw(12) << "grad-accum" << std::setw(13) << "peak" << std::setw(13)
      << "headroom" << "  fits\n";
  if (r.answer) out << row(*r.answer, q.search_sequence);
  if (r.first_not_fitting) out << row(*r.first_not_fitting, q.search_sequence);
  if (r.answer && !r.first_not_fitting)
    out << "(the whole range fits: raise its upper end to search further)\n";
  out << "\n" << r.plans << " plans, " << std::fixed << std::setprecision(3) << r.seconds
      << " s; `memalg plan` with the same flags prints any row's breakdown\n";
  std::cout << out.str();
  return 0;
}

}  // namespace memalg::cli

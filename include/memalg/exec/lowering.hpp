// SPDX-License-Identifier: BSL-1.0
// memalg/exec/lowering.hpp — what every model front-end's lowering shares: the arena bookkeeping
// and the op stream, the persistent model states and their checkpoint sections, the layout's
// figures a program reports, and the optimizer's update per run of equal weight decay.
//
// A front-end (exec/gpt/build_program.hpp's GPT family, exec/speech/build_program.hpp's speech
// model) derives from lowering_base, describes its units (name, elements, shard, weights,
// gradients, master, states, the ranges not decayed) and lays its step out with push / pop /
// emit; allocate_states, lay_out_step, emit_loss_mean, emit_clip_scale, emit_updates and
// finish_program are written here once.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memalg/exec/arena_layout.hpp"
#include "memalg/exec/program.hpp"

namespace memalg::exec {

struct program_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// This rank's place in the mesh (data- and tensor-parallel rank, pipeline stage).
struct rank_coords {
  std::size_t dp = 0, tp = 0, pp = 0;
};

/// Element ranges [begin, end) of a unit: those the optimizer does not decay, those identical on
/// every tensor-parallel rank.
using element_ranges = std::vector<std::pair<std::size_t, std::size_t>>;

/// Consecutive tensors of a unit laid out one after the other: take(n) is where the next n
/// elements start; `end` the elements taken.
struct element_cursor {
  std::size_t end = 0;
  constexpr std::size_t take(std::size_t n) {
    end += n;
    return end - n;
  }
};

/// A maximal run of elements [begin, end) all inside or all outside a set of ranges.
struct element_run {
  std::size_t begin, end;
  bool inside;
};
/// [lo, hi) cut into maximal runs that are all inside or all outside `ranges`.
inline std::vector<element_run> element_runs(const element_ranges& ranges, std::size_t lo, std::size_t hi) {
  std::vector<std::size_t> cuts{lo, hi};
  for (const auto& [b, e] : ranges) {
    if (b > lo && b < hi) cuts.push_back(b);
    if (e > lo && e < hi) cuts.push_back(e);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<element_run> out;
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    bool in = false;
    for (const auto& [b, e] : ranges)
      if (cuts[i] >= b && cuts[i] < e) in = true;
    if (!out.empty() && out.back().inside == in) out.back().end = cuts[i + 1];
    else out.push_back({cuts[i], cuts[i + 1], in});
  }
  return out;
}

namespace detail {

/// The part of a lowering every front-end shares.
class lowering_base {
 protected:
  using side = arena_layout::side;

  /// `who` names the builder in its errors. `by_element`: persistent tensors are laid out by
  /// element, not in multiples of 16 bytes (the speech model's units are not; the plan counts
  /// parameters, not padding).
  lowering_base(std::string_view who, arena_sizes sizes, elem storage, bool by_element = false)
      : who_(who), T_(storage), layout_(sizes.persistent, sizes.stack), by_element_(by_element) {
    p_.storage = T_;
    p_.accum = A_;
    p_.sizes = sizes;
  }

  // ---- refusals ------------------------------------------------------------------------------------
  /// A configuration the builder does not implement: program_error, naming the builder.
  [[noreturn]] void fail(const std::string& why) const { throw program_error(std::string(who_) + ": " + why); }
  /// What every front-end refuses: a storage type other than f32, bf16 and f16, an optimizer the
  /// runtime does not implement.
  void check_storage_and_optimizer(optimizer_kind optimizer) const {
    if (T_ != elem::f32 && T_ != elem::bf16 && T_ != elem::f16) fail("the storage type must be f32, bf16 or f16");
    if (!runtime_optimizer(optimizer)) fail("the runtime implements sgd, momentum, adam and adamw");
  }
  /// A shape field of an op (32 bits).
  std::uint32_t u32(std::size_t n) const {
    if (n > 0xffffffffu) fail("a shape exceeds 32 bits");
    return static_cast<std::uint32_t>(n);
  }

  // ---- the arena and the op stream --------------------------------------------------------------
  operand persistent(const std::string& name, std::size_t n, elem e, category cat) {
    const std::size_t bytes = by_element_ ? n * elem_size(e) : arena_layout::checked_bytes(name, n, elem_size(e));
    const std::size_t off = layout_.persistent(name, bytes, cat);
    operand o{off, n, e, where::arena};
    p_.persistent.push_back({name, o, cat});
    return o;
  }
  operand push(std::string_view name, std::size_t n, elem e, category cat = category::activations, side s = side::saved) {
    const std::size_t off = layout_.push(name, arena_layout::checked_bytes(name, n, elem_size(e)), cat, s);
    return {off, n, e, where::arena};
  }
  operand transient(std::string_view name, std::size_t n, elem e, category cat = category::temporaries) {
    return push(name, n, e, cat, side::transient);
  }
  void pop(const operand& o) { layout_.pop(o.offset); }
  template <class Op>
  void emit(Op&& o, when w = when::always) {
    section_->push_back(op{op_body{std::forward<Op>(o)}, w});
    layout_.set_clock(++laid_out_);  // the trace's events know which ops came before them
  }
  /// Elements [at, at + n) of an arena operand.
  static operand sub(const operand& o, std::size_t at, std::size_t n) {
    return {o.offset + at * elem_size(o.type), n, o.type, o.in};
  }

  /// One micro-batch laid out by `micro` in the `micro` section; the step's trace repeats it
  /// `grad_accum` times (the stacks are empty between micro-batches, so every one lays out alike),
  /// the k-th copy's events after k more micro-batches of ops (exec::run's order of the ops).
  template <class F>
  void lay_out_micro(std::size_t grad_accum, F&& micro) {
    section_ = &p_.micro;
    const std::size_t from = layout_.trace().size();
    micro();
    p_.trace = layout_.trace();
    for (std::size_t k = 1; k < grad_accum; ++k)
      for (std::size_t i = from; i < layout_.trace().size(); ++i) {
        p_.trace.push_back(layout_.trace()[i]);
        p_.trace.back().at += k * p_.micro.size();
      }
  }
  /// The step's sections: the units' gradients zeroed (unless `zero_grads` is false), `micro`
  /// laid out as lay_out_micro does, then `end` in the step_end section.
  template <class Unit, class Micro, class End>
  void lay_out_step(const std::vector<Unit>& units, bool zero_grads, std::size_t grad_accum, Micro&& micro, End&& end) {
    layout_.enable_trace();
    section_ = &p_.step_begin;
    if (zero_grads)
      for (const Unit& u : units) emit(ops::zero{u.grad});
    lay_out_micro(grad_accum, std::forward<Micro>(micro));
    section_ = &p_.step_end;
    end();
  }

  // ---- model states --------------------------------------------------------------------------------
  template <class Unit>
  static std::size_t shard_of(const Unit& u) {
    if constexpr (requires { u.shard; }) return u.shard;
    else return u.elements;
  }
  /// Weights, gradients, master weights and optimizer states of every unit, each region unit after
  /// unit, sharded as ZeRO stage `z` shards them (unit.shard elements; unsharded without a shard),
  /// and the checkpoint's sections per unit: weights, master, state1, state2.
  template <class Unit>
  void allocate_states(std::vector<Unit>& units, int z, bool master_weights, optimizer_kind optimizer) {
    const std::size_t states = full_states_of(optimizer);
    for (Unit& u : units) u.weight = persistent(u.name + ".weights", z >= 3 ? shard_of(u) : u.elements, T_, category::weights);
    for (Unit& u : units) u.grad = persistent(u.name + ".grads", z >= 2 ? shard_of(u) : u.elements, T_, category::gradients);
    for (Unit& u : units)
      if (master_weights)
        u.master = persistent(u.name + ".master", z >= 1 ? shard_of(u) : u.elements, A_, category::master_weights);
    for (Unit& u : units) {
      const std::size_t n = z >= 1 ? shard_of(u) : u.elements;
      if (states >= 1) u.state1 = persistent(u.name + ".state1", n, A_, category::optimizer_states);
      if (states >= 2) u.state2 = persistent(u.name + ".state2", n, A_, category::optimizer_states);
    }
    const auto section = [&](const std::string& name, const operand& o, category cat) {
      if (!o.null()) p_.checkpoint.push_back({name, o, cat});
    };
    for (const Unit& u : units) {
      section(u.name + ".weights", u.weight, category::weights);
      section(u.name + ".master", u.master, category::master_weights);
      section(u.name + ".state1", u.state1, category::optimizer_states);
      section(u.name + ".state2", u.state2, category::optimizer_states);
    }
  }
  /// A unit's persistent tensors as the program describes them (param_unit); the front-end adds
  /// its initialisation and, under ZeRO, the logical index of its first weight and master element.
  template <class Unit>
  static param_unit param_unit_of(const Unit& u) {
    return {.name = u.name, .elements = u.elements, .shard = shard_of(u), .weight = u.weight, .grad = u.grad,
            .master = u.master, .state1 = u.state1, .state2 = u.state2, .init = {}};
  }

  // ---- the step's end ------------------------------------------------------------------------------
  /// The loss of the step: the mean over the micro-batches, summed over the data-parallel ranks.
  void emit_loss_mean(std::uint32_t grad_accum, std::size_t dp) {
    emit(ops::loss_mean{grad_accum});
    emit(ops::all_reduce{scalars::slot(scalars::loss), group::dp, reduce_op::sum});
    emit(ops::scalar_div{scalars::loss, static_cast<float>(dp)});
  }
  /// One fused update per run of equal decay over each unit's owned elements [lo, lo + shard) under
  /// ZeRO-1/2/3 (lo = shard_begin(unit)), all of them under ZeRO-0; ZeRO-1/2 then share the
  /// updated block with the data-parallel group.
  template <class Unit, class ShardBegin>
  void emit_updates(const std::vector<Unit>& units, int z, float weight_decay, std::size_t dp, ShardBegin&& shard_begin) {
    for (const Unit& u : units) {
      const std::size_t lo = z >= 1 ? shard_begin(u) : 0, hi = z >= 1 ? lo + shard_of(u) : u.elements;
      const std::size_t grad_off = z >= 2 ? lo : 0, state_off = z >= 1 ? lo : 0, weight_off = z >= 3 ? lo : 0;
      for (const element_run& r : element_runs(u.no_decay, lo, hi)) {
        const std::size_t k = r.end - r.begin;
        const auto state = [&](const operand& s) { return s.null() ? operand{} : sub(s, r.begin - state_off, k); };
        emit(ops::optimizer_update{sub(u.weight, r.begin - weight_off, k), state(u.master), state(u.state1),
                                   state(u.state2), sub(u.grad, r.begin - grad_off, k), r.inside ? 0.0f : weight_decay},
             when::unless_skipped);
      }
      if ((z == 1 || z == 2) && dp > 1)
        emit(ops::all_gather{sub(u.weight, shard_begin(u), shard_of(u)), u.weight, group::dp}, when::unless_skipped);
    }
  }
  /// The clip scale from the squared norm's parts (ops::sqnorm before): under ZeRO-1/2/3 each
  /// data-parallel rank holds a part of the sum, which the group sums; under ZeRO-0 every rank
  /// holds the same sum and the group takes the max of the non-finite flag. Each group of
  /// `also_summed` (tensor-parallel ranks, pipeline stages) then adds its ranks' parts.
  void emit_clip_scale(int z, std::size_t dp, float max_grad_norm, bool loss_scaling,
                       std::initializer_list<group> also_summed = {}) {
    emit(ops::norm_parts{});
    if (z >= 1) emit(ops::all_reduce{scalars::slot(scalars::parts, 2), group::dp, reduce_op::sum});
    else emit(ops::all_reduce{scalars::slot(scalars::parts + 1, 1), group::dp, reduce_op::max});
    for (group g : also_summed) emit(ops::all_reduce{scalars::slot(scalars::parts, 2), g, reduce_op::sum});
    emit(ops::clip_scale{max_grad_norm, u32(dp), loss_scaling});
  }
  /// The layout's figures and the run's the program reports: the batch, the data-parallel rank
  /// and the hyper-parameters of `c` (a gpt_config, a speech_config), `dropout` the rate it records.
  template <class Config>
  void finish_program(const Config& c, std::size_t sequence, std::size_t dp_rank, float dropout) {
    p_.persistent_bytes = layout_.persistent_used();
    p_.high_water = layout_.high_water();
    p_.peak_by_category = layout_.peak_by_category();
    p_.peak_tensor = std::string(layout_.peak_tensor());
    p_.grad_accum = c.grad_accum;
    p_.micro_batch = c.micro_batch;
    p_.sequence = sequence;
    p_.dp = c.dp;
    p_.dp_rank = dp_rank;
    p_.hp = {c.optimizer, c.lr, c.weight_decay, c.momentum, c.beta1, c.beta2, c.eps, c.max_grad_norm, dropout, c.seed};
  }

  std::string_view who_;

  elem T_;
  elem A_ = elem::f32;  // accum_t of f32, bf16 and f16
  arena_layout layout_;
  std::uint64_t laid_out_ = 0;  ///< ops emitted so far, in the order exec::run runs them
  program p_;
  std::vector<op>* section_ = nullptr;
  bool by_element_ = false;
};

}  // namespace detail
}  // namespace memalg::exec

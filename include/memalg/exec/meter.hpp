// SPDX-License-Identifier: BSL-1.0
// memalg/exec/meter.hpp — the live-bytes meter: the arena bytes a step's executed ops keep live.
//
// The interpreter (exec/run.hpp) hands the meter every op it executed, on any backend; the meter
// reads what the op does with its operands from the op's own declaration (exec/program.hpp,
// ops::accesses: read, write or update) and never looks at the program's layout of a tensor's
// lifetime. The CPU backend holds its kernels to those declarations (backend/cpu/step_backend.hpp),
// so on the CPU the declarations are what the kernels did.
//
// In 16-byte granules of the stacks (past the persistent region), a *value* starts at an op that
// writes the granule without reading it (or reads it first in the step) and lasts to the last op
// that reads or updates it before the next such write. A stack must hold everything between its
// base and its farthest live value (it is last-in first-out), so at op t the live stack bytes are
// the saved stack up to its farthest live granule plus the transient stack down to its farthest
// one. Which stack a granule belongs to at op t is the layout's (exec/arena_layout.hpp: the saved
// stack grows up from the persistent region, the transient stack down from the arena's end): the
// program's trace of one step's pushes and pops is replayed as the ops run: every event the
// layout recorded before an op (arena_layout::event::at, the ops laid out before it, in the order
// exec::run runs them) is applied before that op, and then, for a trace without those times,
// each push (and the pops before it) when an op first needs bytes it places. (Without the times
// pops cannot be applied any earlier, and a transient laid over bytes that pops still to be
// replayed have released can look like the saved stack's. A program without a trace has one
// stack, the saved one, over the whole region.) At the end of each step a sweep takes the op with
// the most live stack bytes; the arena's live bytes there are those plus the persistent granules
// any op or the initialisation (every unit's weights, master weights and states) touched. So a
// tensor the layout places but no op writes and then reads is not live, and a byte an op uses
// outside what the layout placed counts all the same (unplaced_ops counts the ops where a live
// value lay outside both stacks). Replaying the pushes and pops alone would give back the
// layout's high_water(), which is not a measurement.
//
// The books are intervals of granules with one state each (first and last op of the value they
// hold), so they cost host memory per distinct tensor placement, not per byte: a GPT-2 124M plan's
// arena of 8.5 GB meters like a tiny one.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "memalg/exec/arena_layout.hpp"
#include "memalg/exec/program.hpp"

namespace memalg::exec {

class live_bytes_meter {
 public:
  static constexpr std::size_t granule = 16;

  /// The meter of `p`'s arena (its capacities and its trace); counts the persistent tensors the
  /// backend's initialisation writes (program::units) as touched.
  explicit live_bytes_meter(const program& p)
      : capacity_(p.sizes.persistent + p.sizes.stack),
        persistent_capacity_(p.sizes.persistent),
        granule0_(p.sizes.persistent / granule),
        granules_((capacity_ + granule - 1) / granule),
        stack_granules_(granules_ - granule0_) {
    for (const arena_event& e : p.trace) {
      if (e.kind == arena_layout::event_kind::persistent || e.offset < persistent_capacity_) continue;
      events_.push_back({e.kind == arena_layout::event_kind::push, e.where == arena_layout::side::transient,
                         e.offset / granule - granule0_, (e.offset + e.bytes) / granule - granule0_, e.at});
      timed_ = timed_ || e.at != 0;
    }
    for (const param_unit& u : p.units)
      for (const operand* t : {&u.weight, &u.master, &u.state1, &u.state2})
        if (!t->null()) touch(*t);
    values_.clear();
    values_.emplace(0, value{stack_granules_, closed, 0});
    begin_step();
  }

  /// Starts a step: op numbers from 0, the layout's replay from the step's first push.
  void begin_step() {
    op_ = 0;
    event_ = 0;
    saved_top_ = 0;
    transient_bottom_ = stack_granules_;
    tops_.clear();
    bottoms_.clear();
  }

  /// One executed op, by its declared accesses; `at`, when given, is its place among the step's
  /// ops in the order exec::run runs them (skipped ones counted), which the trace's events are
  /// timed by (arena_layout::event::at): every event before it is replayed first.
  template <class Op>
    requires declares_accesses<Op>
  void record(const Op& o, std::uint64_t at = untimed) {
    record(accesses(o), at);
  }
  void record(const op_body& b, std::uint64_t at = untimed) { record(accesses_of(b), at); }
  void record(const access_list& l, std::uint64_t at = untimed) {
    const auto t = static_cast<std::uint32_t>(op_++);
    if (timed_ && at != untimed)
      while (event_ < events_.size() && events_[event_].at <= at) replay(events_[event_++], saved_top_, transient_bottom_);
    pending_.clear();
    for (const operand_access& x : l) {
      if (x.t.in != where::arena) continue;
      touch(x.t);
      const std::size_t end = x.t.offset + x.t.bytes();
      if (x.t.bytes() != 0 && end > persistent_capacity_)
        pending_.push_back({std::max<std::size_t>(x.t.offset, persistent_capacity_) / granule - granule0_,
                            (end + granule - 1) / granule - granule0_, x.a});
    }
    // Until every access lies on a stack: placing one may pop what an earlier one was found in.
    for (std::size_t before = event_ + 1; before != event_;) {
      before = event_;
      for (const pending_access& p : pending_) place(p);
    }
    tops_.push_back(saved_top_);
    bottoms_.push_back(transient_bottom_);
    // Reads and updates extend their granules' values first, then writes start new ones (an op may
    // read a buffer and write over it, as swiglu's backward does).
    for (int pass = 0; pass < 2; ++pass)
      for (const pending_access& p : pending_)
        if ((p.a == access::write) == (pass == 1)) apply(p, t);
  }

  /// Ends a step: closes every value, then sweeps the step's ops for the most live bytes.
  void end_step() {
    for (auto& [first, v] : values_)
      if (v.first_op != closed) runs_.push_back({v.first_op, v.last_op, first, v.end});
    values_.clear();
    values_.emplace(0, value{stack_granules_, closed, 0});
    std::size_t persistent = 0;
    for (const auto& [first, end] : touched_)
      if (first < granule0_) persistent += std::min(end, granule0_) - first;
    std::sort(runs_.begin(), runs_.end(), [](const run& a, const run& b) { return a.first_op < b.first_op; });
    std::vector<run> active;
    std::size_t next = 0, peak = 0, peak_op = 0;
    for (std::uint32_t t = 0; t < op_; ++t) {
      std::erase_if(active, [t](const run& r) { return r.last_op < t; });
      for (; next < runs_.size() && runs_[next].first_op <= t; ++next) active.push_back(runs_[next]);
      // The saved stack up to its farthest live granule below the transient stack's base; the
      // transient stack down to its farthest live granule from there.
      const std::size_t base = bottoms_[t];
      std::size_t saved = 0, transient = stack_granules_;
      for (const run& r : active) {
        if (r.first < base) saved = std::max(saved, std::min(r.end, base));
        if (r.end > base) transient = std::min(transient, std::max(r.first, base));
      }
      if (saved > tops_[t]) ++unplaced_ops_;  // a live value between the stacks the layout had
      const std::size_t live = saved + (stack_granules_ - transient);
      if (live > peak) {
        peak = live;
        peak_op = t;
      }
    }
    runs_.clear();
    const std::size_t step_peak = (persistent + peak) * granule;
    if (step_peak > high_water_) {
      high_water_ = step_peak;
      peak_op_ = peak_op;
    }
    ++steps_;
    begin_step();
  }

  /// The high-water mark of live arena bytes over the steps metered so far: at the op of a step
  /// with the most live bytes, the persistent bytes touched plus every stack byte the stacks must
  /// hold for the values still to be read there. 0 before the first step.
  std::size_t high_water() const { return high_water_; }
  /// The index, among the ops executed in its step, of the op where high_water was reached.
  std::size_t peak_op() const { return peak_op_; }
  /// Ops, over the steps metered, at which a live stack value lay outside both stacks as the
  /// program's layout had placed them by then (counted with the saved stack).
  std::size_t unplaced_ops() const { return unplaced_ops_; }
  /// Bytes of the arena the ops (and the initialisation) have touched so far, in granules of 16
  /// bytes: the footprint, at most the arena.
  std::size_t touched_bytes() const {
    std::size_t n = 0;
    for (const auto& [first, end] : touched_) n += end - first;
    return n * granule;
  }
  std::size_t steps() const { return steps_; }

 private:
  static constexpr std::uint32_t closed = ~std::uint32_t{0};
  struct pending_access {
    std::size_t first, end;  ///< stack granules [first, end)
    access a;
  };
  struct value {  ///< granules [key, end) hold one value: live from first_op (closed: none) to last_op
    std::size_t end;
    std::uint32_t first_op, last_op;
  };
  struct run {  ///< an ended value: stack granules [first, end), live from op first_op to last_op
    std::uint32_t first_op, last_op;
    std::size_t first, end;
  };
  struct stack_event {
    bool push, transient;
    std::size_t first, end;  ///< stack granules [first, end)
    std::uint64_t at;        ///< the step's ops before it (arena_layout::event::at)
  };
  static constexpr std::uint64_t untimed = ~std::uint64_t{0};

  [[noreturn]] static void fail(const std::string& why) { throw std::invalid_argument("exec::live_bytes_meter: " + why); }

  /// Records `o`'s granules as touched (checked against the arena).
  void touch(const operand& o) {
    if (o.offset > capacity_ || o.bytes() > capacity_ - o.offset) fail("an operand lies outside the program's arena");
    if (o.bytes() == 0) return;
    std::size_t first = o.offset / granule, end = (o.offset + o.bytes() + granule - 1) / granule;
    auto it = touched_.upper_bound(first);
    if (it != touched_.begin() && std::prev(it)->second >= first) {
      --it;
      first = it->first;
      end = std::max(end, it->second);
    }
    while (it != touched_.end() && it->first <= end) {
      end = std::max(end, it->second);
      it = touched_.erase(it);
    }
    touched_.emplace(first, end);
  }

  static void replay(const stack_event& e, std::size_t& top, std::size_t& bottom) {
    if (e.transient) bottom = e.push ? e.first : e.end;
    else top = e.push ? e.end : e.first;
  }
  /// Advances the replay until `p` lies on a stack; if no later push places it, the replay stays.
  void place(const pending_access& p) {
    std::size_t e = event_, top = saved_top_, bottom = transient_bottom_;
    while (!(p.end <= top || p.first >= bottom)) {
      if (e == events_.size()) return;
      replay(events_[e++], top, bottom);
    }
    event_ = e;
    saved_top_ = top;
    transient_bottom_ = bottom;
  }

  /// The value interval that starts at granule g (splitting the one that holds it).
  std::map<std::size_t, value>::iterator split(std::size_t g) {
    auto it = std::prev(values_.upper_bound(g));
    if (it->first == g) return it;
    value tail = it->second;
    it->second.end = g;
    return values_.emplace_hint(std::next(it), g, tail);
  }
  /// A read or update extends the values of p's granules (starting one where there is none); a
  /// write ends them and starts a new one at t.
  void apply(const pending_access& p, std::uint32_t t) {
    if (p.first >= p.end) return;
    auto it = split(p.first);
    if (p.end < stack_granules_) split(p.end);
    for (; it != values_.end() && it->first < p.end; ++it) {
      value& v = it->second;
      if (p.a == access::write) {
        if (v.first_op != closed) {
          const std::int64_t last = v.last_op == t ? std::int64_t{t} - 1 : std::int64_t{v.last_op};
          if (last >= static_cast<std::int64_t>(v.first_op))
            runs_.push_back({v.first_op, static_cast<std::uint32_t>(last), it->first, v.end});
        }
        v.first_op = t;
      } else if (v.first_op == closed) {
        v.first_op = t;  // read before any write in this step: live from here
      }
      v.last_op = t;
    }
    merge(p.first, p.end);
  }
  /// Joins neighbouring intervals from the one before granule `first` to the one at `end` that
  /// hold the same state (the books stay one interval per distinct value).
  void merge(std::size_t first, std::size_t end) {
    auto it = values_.lower_bound(first);
    if (it != values_.begin()) --it;
    for (auto next = std::next(it); next != values_.end() && next->first <= end; next = std::next(it)) {
      if (next->second.first_op == it->second.first_op && next->second.last_op == it->second.last_op) {
        it->second.end = next->second.end;
        values_.erase(next);
      } else {
        it = next;
      }
    }
  }

  std::size_t capacity_ = 0, persistent_capacity_ = 0, granule0_ = 0, granules_ = 0, stack_granules_ = 0;
  std::map<std::size_t, std::size_t> touched_;  ///< touched granules of the arena, [first, end) by first
  std::map<std::size_t, value> values_;         ///< the stack granules' current values, covering [0, stack_granules_)
  std::vector<run> runs_;                       ///< this step's ended values
  std::vector<pending_access> pending_;         ///< this op's stack accesses
  std::vector<stack_event> events_;             ///< one step's pushes and pops, from program::trace
  bool timed_ = false;                          ///< the trace says after which op each event comes
  std::size_t event_ = 0, saved_top_ = 0, transient_bottom_ = 0;  ///< the replay, in stack granules
  std::vector<std::size_t> tops_, bottoms_;     ///< saved_top_ and transient_bottom_ at each op of the step
  std::size_t op_ = 0, steps_ = 0, high_water_ = 0, peak_op_ = 0, unplaced_ops_ = 0;
};

}  // namespace memalg::exec

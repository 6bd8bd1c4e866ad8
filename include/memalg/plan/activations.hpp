// SPDX-License-Identifier: BSL-1.0
// memalg/plan/activations.hpp — saved activations and transient buffers of every layer, and what a
// pipeline stage holds of them over a step.
//
// Each training stack's rules for one instance of a layer live in one header under plan/stacks/
// (common.hpp lists them, with the notation): `paper` (Korthikanti et al. 2022, §4.1), `memalg`
// (memalg's own runtime, the paper's accounting with its deviations), `pytorch`, `megatron`.
// This header chooses the stack's rules and applies what is the same for every stack:
//
// Recomputation (Table 2 and §5): selective drops the attention core (5as²b naive; the
// log-sum-exp with flash) — sbh(10 + 24/t) and sbh·34/t. Full keeps each layer's input, 2sbh
// (2sbh/t under sequence parallelism, where the input is sequence-split), and rebuilds one layer's
// saved set in backward (a transient). every:K keeps the input of every K-th layer and rebuilds K
// layers at a time (Megatron's uniform method with recompute_num_layers = K; every:1 = full).
// Recomputation applies to repeated entries (the transformer layers), as in Megatron.
//
// Frozen layers: backward needs a frozen layer's tensors only to carry the gradient to trainable
// layers before it. So a frozen entry keeps nothing when no trainable entry precedes it, and
// otherwise drops the inputs of its matrix products (they serve only weight gradients) and keeps
// the rest. QLoRA's frozen base keeps them (its adapters need the same inputs).
//
// A stage holds the saved activations of the micro-batches in flight (Narayanan et al. 2021,
// Korthikanti et al. §4.2.3): 1F1B min(m, p − i) on stage i; GPipe all m; the interleaved
// schedule with v model chunks min(m·v, v·p + p − 2i − 1) chunk-micro-batches of 1/v of the stage
// (Megatron's warm-up count + 1), which on the first stage is p·(1 + (p−1)/(p·v)) — the paper's
// factor. m = gradient-accumulation micro-batches; with p = 1 one micro-batch is in flight
// whatever m is: accumulation adds no activations (its gradient buffer is the persistent one).
// memalg's own runtime holds those micro-batches in a stash of fixed slots for the whole step
// (see activations_on_stage), so under a pipeline its stages hold the whole stash at every moment.
#pragma once

#include <array>
#include <cstdint>

#include "memalg/core/bytes.hpp"
#include "memalg/core/dtype.hpp"
#include "memalg/device/device.hpp"
#include "memalg/model/layer.hpp"
#include "memalg/parallel/mesh.hpp"
#include "memalg/plan/breakdown.hpp"
#include "memalg/plan/model_states.hpp"
#include "memalg/plan/stacks/common.hpp"
#include "memalg/plan/stacks/megatron.hpp"
#include "memalg/plan/stacks/memalg.hpp"
#include "memalg/plan/stacks/paper.hpp"
#include "memalg/plan/stacks/pytorch.hpp"
#include "memalg/train/recipe.hpp"

namespace memalg {

namespace detail {

/// One instance of `l` under the context's stack. `pytorch` and `megatron` fall back to the paper's
/// accounting for the kinds they do not model.
constexpr raw_activations raw_layer_activations(const layer_desc& l, const activation_context& c) {
  switch (c.stack) {
    case stack_kind::megatron: {
      const raw_activations p = megatron_activations(l, c);
      if (p.handled) return p;
      break;
    }
    case stack_kind::pytorch: {
      const raw_activations p = pytorch_activations(l, c);
      if (p.handled) return p;
      break;
    }
    case stack_kind::memalg: return memalg_activations(l, c);
    case stack_kind::paper: break;
  }
  return paper_activations(l, c);
}

}  // namespace detail

/// The §4.1 breakdown of a transformer block (or the one part of an attention / MLP entry), for
/// one instance and one micro-batch, before any recomputation.
constexpr block_parts sublayer_activations(const layer_desc& l, const activation_context& c) {
  return detail::raw_layer_activations(l, c).parts;
}

/// Saved and transient bytes of one instance of `l`, one micro-batch. `gradient_flows_in`: some
/// entry before it (in forward order) is trainable, so backward must pass through it.
constexpr layer_activations layer_activation_bytes(const layer_desc& l, const activation_context& c,
                                                   bool gradient_flows_in) {
  activation_context own = c;
  own.input_requires_grad = gradient_flows_in || c.reentrant;
  const detail::raw_activations r = detail::raw_layer_activations(l, own);
  layer_activations a{};
  a.forward_temporary = r.forward_temporary;
  a.comm = r.comm;
  if (l.group == layer_group::teacher) {
    // Forward only, without autograd: its tensors live one layer at a time; its logits stay
    // until the distillation loss.
    a.forward_temporary = r.saved.total() + r.forward_temporary;
    a.held_until_loss = r.logits;
    return a;
  }
  const bool trains = l.trainable || (l.shape.flags & layer_flags::adapted) != 0;
  if (!trains && !gradient_flows_in) return a;  // no backward through it
  saved_bytes kept = r.saved;
  if (!trains) kept.weight_grad = bytes{};
  a.saved = kept.total();
  a.selective = kept.weight_grad + kept.input_grad;
  a.recompute_core = kept.core;
  a.input = r.input;
  a.input_in_saved = r.input_in_saved && (trains || !r.input_serves_weight_grad);
  a.backward = true;
  a.backward_temporary = r.backward_temporary;
  a.loss_temporary = r.loss_temporary;
  a.backward_released = r.backward_released;
  a.forward_released = r.forward_released;
  a.backward_tail = r.backward_tail;
  a.tail_released = r.tail_released;
  a.last_released = trains ? r.last_released : bytes{};
  a.grad_temporary = r.grad_temporary;
  a.mlp_released = trains ? r.mlp_released : bytes{};
  if (c.pytorch() && a.backward_tail > bytes{} && l.trainable) {
    a.late_attention_params = detail::later_phase_params(l, false);
    a.late_input_params = detail::later_phase_params(l, true);
    a.late_mlp_params = detail::mlp_input_projection_params(l);
  }
  // (a frozen block keeps no inputs of its products: the phase has fewer of them to free)
  if (!trains && a.tail_released > bytes{}) {
    const bytes unkept = r.parts.mlp.weight_grad + r.parts.attention.weight_grad;
    a.tail_released = saturating_sub(a.tail_released, unkept);
  }
  return a;
}

/// The context is taken by value: g++ memoizes a constexpr call whose arguments are constants, so
/// in a compile-time search the configurations that differ only in what activations do not read
/// (ZeRO stage, pipeline degree, offload) share one table.
constexpr activation_table activation_table_of(const model_desc& model, const activation_context c) {
  activation_table table{};
  table.host = c.cpu;
  bool gradient_flows = false;
  for (std::size_t i = 0; i < model.size; ++i) {
    const layer_desc& l = model.entries[i];
    table.entries[i] = layer_activation_bytes(l, c, gradient_flows);
    if (l.group != layer_group::teacher && (l.trainable && l.params != 0)) gradient_flows = true;
    if ((l.shape.flags & layer_flags::adapted) != 0) gradient_flows = true;
    if (l.kind != layer_kind::parameters && l.shape.hidden != 0 && l.group != layer_group::teacher) {
      const detail::act_terms a(c, l.shape);
      table.stage_boundary = detail::max_b(table.stage_boundary, a.rep(a.values_per_token(l.shape.hidden)));
    }
  }
  table.size = model.size;
  if (c.reference()) detail::memalg_table(model, c, table);
  if (c.pytorch()) detail::pytorch_table(model, c, table);
  return table;
}
constexpr activation_table activation_table_of(const model_desc& model, const training_desc& t, const mesh_desc& m) {
  return activation_table_of(model, activation_context_of(t, m));
}

/// Chunk-micro-batches whose activations stage `stage` holds at its peak (see the header): with
/// v = 1 this is micro-batches.
constexpr std::uint64_t chunks_in_flight(const mesh_desc& m, std::uint64_t micro_batches, std::uint64_t stage) {
  if (m.pp <= 1) return 1;
  const std::uint64_t mb = micro_batches == 0 ? 1 : micro_batches;
  switch (m.schedule) {
    case pipeline_schedule::gpipe: return mb;
    case pipeline_schedule::one_f_one_b: {
      const std::uint64_t ahead = m.pp - stage;
      return ahead < mb ? ahead : mb;
    }
    case pipeline_schedule::interleaved: {
      const std::uint64_t v = m.virtual_stages;
      const std::uint64_t warmup = 2 * (m.pp - stage - 1) + (v - 1) * m.pp;
      const std::uint64_t total = detail::checked_mul(mb, v);
      return warmup + 1 < total ? warmup + 1 : total;
    }
  }
  return 1;
}

/// Device activation bytes of one stage at its forward and backward high-water marks.
struct stage_activations {
  breakdown forward{};    ///< activations, temporaries and comm_buffers at the forward peak
  breakdown backward{};   ///< the same at the backward peak
  bytes host{};           ///< saved activations offloaded to host memory
  bytes per_micro_batch{};  ///< saved activations of one micro-batch on the stage
  std::uint64_t chunks_in_flight = 1;
};

namespace detail {
/// The largest moment of a sweep so far: its activations, temporaries and communication buffers,
/// and their sum. (Three counts rather than a breakdown: this runs for every entry of every plan,
/// and in a constant expression each of a breakdown's eight members is an object of its own.)
/// One entry's gradients on a rank: what it keeps (the ZeRO-2/3 shard, all instances) and one
/// instance's full gradient (before an FSDP reduce-scatter).
struct entry_gradients {
  bytes shard{};
  bytes full{};
};

struct peak_moment {
  bytes activations{};
  bytes temporaries{};
  bytes comm{};
  bytes gradients{};  ///< pytorch: the gradients that exist at the moment
  bytes total{};
  constexpr void offer(bytes a, bytes t, bytes c, bytes g = bytes{}) {
    const bytes sum = a + t + c + g;
    if (sum > total) *this = peak_moment{a, t, c, g, sum};
  }
  constexpr breakdown as_breakdown() const {
    breakdown b{};
    b.activations = activations;
    b.temporaries = temporaries;
    b.comm_buffers = comm;
    b.gradients = gradients;
    return b;
  }
};
}  // namespace detail

/// The kinds of moment a stage's sweep evaluates (what `sweep_log` records, plan/events.hpp).
enum class sweep_step : std::uint8_t {
  teacher,        ///< a teacher entry's forward (no autograd)
  forward,        ///< after the entry's forward (all its instances), its transients on top
  loss,           ///< pytorch: the loss's backward, before the output entry's own
  backward,       ///< the entry's backward (a repeated entry: its first instance)
  backward_last,  ///< pytorch, a repeated entry: the backward of its last instance
  backward_tail,  ///< memalg's runtime: the second part of a backward in two
};

/// One moment offered by activations_on_stage: the entry and the four counts it offered.
struct sweep_moment {
  sweep_step step = sweep_step::forward;
  std::size_t entry = 0;
  bytes activations{};
  bytes temporaries{};
  bytes comm{};
  bytes gradients{};
};

/// The moments of one sweep in the order the step runs them, and the gradients that exist when
/// backward has ended (pytorch; the other stacks count gradients in the model states). Recorded
/// only when activations_on_stage is given one: the planner's numbers never read it.
struct sweep_log {
  static constexpr std::size_t capacity = 3 * max_model_entries + 2;
  std::array<sweep_moment, capacity> moments{};
  std::size_t size = 0;
  bytes gradients_after_backward{};
  constexpr void push(const sweep_moment& m) {
    if (size < capacity) moments[size++] = m;
  }
};

/// Does the model's output layer share the token embedding's weights?
constexpr bool tied_embedding(const model_desc& model) {
  for (const layer_desc& l : model)
    if (l.kind == layer_kind::output && (l.shape.flags & layer_flags::tied) != 0) return true;
  return false;
}

/// The forward sweep (saved tensors accumulate entry by entry, each entry's transients on top)
/// and the backward sweep (the loss's buffers first, then entries in reverse, each freeing its
/// saved tensors after its backward) of the newest micro-batch, on top of the earlier micro-batches
/// in flight. Recomputation and offload as in the header.
/// `log`, when given, records every moment offered (plan/events.hpp draws them); it changes no number.
constexpr stage_activations activations_on_stage(const model_desc& model, const activation_table& table,
                                                 const training_desc& t, const mesh_desc& m, std::uint64_t stage,
                                                 sweep_log* log = nullptr) {
  stage_activations out{};
  detail::peak_moment forward{}, backward{};
  bytes kept[max_model_entries]{};     // per entry on this stage, one micro-batch
  bytes rebuilt[max_model_entries]{};  // recomputed in backward (transient)
  std::uint64_t held[max_model_entries]{};  // instances on this stage
  bytes total{}, largest_instance{}, teacher_logits{};
  const recompute_kind rk = t.recompute;
  for (std::size_t i = 0; i < model.size; ++i) {
    const layer_desc& l = model.entries[i];
    const layer_activations& a = table.entries[i];
    const std::uint64_t n = held[i] = instances_on_stage(l, stage, m.pp);
    if (n == 0 || l.place == placement::spread) continue;
    if (l.group == layer_group::teacher) {
      teacher_logits += a.held_until_loss;
      continue;
    }
    if (!a.backward) continue;
    bytes one = a.saved;
    const bool layer = l.place == placement::repeated;
    const bytes reuse = a.input_in_saved ? a.input : bytes{};
    if (rk == recompute_kind::selective) {
      one = a.selective;
      rebuilt[i] = a.recompute_core;
    }
    if (layer && rk == recompute_kind::full) {
      one = a.input;
      rebuilt[i] = a.saved - reuse;
    }
    // The reentrant checkpoint reruns the block and keeps the rerun's output while its backward
    // runs (torch/utils/checkpoint.py, CheckpointFunction.backward: `outputs =
    // ctx.run_function(*detached_inputs)`, then `torch.autograd.backward(outputs_with_grad, ...)`).
    const bool rerun_output = t.stack == stack_kind::pytorch && layer && t.checkpoint == checkpoint_kind::reentrant &&
                              (rk == recompute_kind::full || rk == recompute_kind::every_k);
    if (layer && rk == recompute_kind::every_k) {
      const std::uint64_t k = t.recompute_every == 0 ? 1 : t.recompute_every;
      // Segments of k layers from the first, the last one shorter when k does not divide n.
      // Backward rebuilds them last to first; segment j runs with the inputs of segments 0..j
      // still kept, so the worst moment is the last segment (all inputs kept) or the one before
      // it (one input fewer, k layers rebuilt).
      const std::uint64_t segments = detail::ceil_div(n, k);
      const std::uint64_t last = n - (segments - 1) * k;
      kept[i] = a.input * segments;
      const bytes last_segment = a.saved * last;
      const bytes full_segment = segments > 1 ? a.saved * k - a.input : bytes{};
      rebuilt[i] = detail::max_b(last_segment, full_segment) - reuse;
      one = a.input;
    } else {
      kept[i] = one * n;
    }
    if (rerun_output) rebuilt[i] += a.input;
    largest_instance = detail::max_b(largest_instance, one);
    total += kept[i];
  }
  out.per_micro_batch = total;
  const std::uint64_t v = m.schedule == pipeline_schedule::interleaved ? m.virtual_stages : 1;
  const std::uint64_t chunks = chunks_in_flight(m, t.grad_accum, stage);
  out.chunks_in_flight = chunks;
  // The stage's saved bytes times chunks/v, rounded up; the newest micro-batch's own share is
  // what the sweeps below add entry by entry.
  const bytes at_end{detail::ceil_div(detail::checked_mul(total.value, chunks), v)};
  const bytes prior = at_end - total;
  const bytes boundary = m.pp > 1 ? table.stage_boundary : bytes{};
  // Offload: the host holds every saved tensor; the device a window of two instances (the one
  // being written and the one in transfer).
  const bool offload = t.offload_activations;
  const bytes window = largest_instance * 2;
  // memalg's runtime under a pipeline (exec/gpt/build_program.hpp) keeps the stage's micro-batches in
  // a stash of `chunks` slots pushed once for the step, micro-batch i in slot i mod chunks, each
  // slot holding one micro-batch's saved tensors from its forward to its backward: so every
  // moment holds the whole stash, not only the tensors the newest micro-batch still needs (1F1B
  // keeps at most p − i micro-batches in flight on stage i: Narayanan et al. 2021, §2.2;
  // Megatron-LM's schedules.py, forward_backward_pipelining_without_interleaving, whose
  // input_tensors / output_tensors queues hold num_warmup_microbatches + 1 entries).
  const bool stash = t.stack == stack_kind::memalg && m.pp > 1;
  const auto on_device = [&](bytes saved) {
    if (stash) return at_end;
    return offload && window < saved ? window : saved;
  };
  // ZeRO-2/3 units of memalg's runtime (else nothing: skip the call, as this loop runs per plan).
  const bool units = t.stack == stack_kind::memalg && m.zero_stage >= 2;
  // pytorch: gradients exist from backward on (zero_grad(set_to_none=True)); entry i's appear in
  // its backward. With accumulation they exist from the first micro-batch's backward on, and each
  // backward adds a new gradient into them.
  const bool torch = t.stack == stack_kind::pytorch;
  // (Computed entry by entry where needed: arrays of byte counts cost a constant evaluation more
  // than the arithmetic.)
  const auto grads_of = [&](std::size_t i) {
    detail::entry_gradients g{};
    const layer_desc& l = model.entries[i];
    if (held[i] == 0 || !l.trainable || l.group == layer_group::teacher) return g;
    const rank_elements e = elements_per_rank(l, m);
    const std::uint64_t group = m.dp * m.cp;
    const std::uint64_t shard =
        m.zero_stage >= 2 ? detail::ceil_div(e.dense, group) + detail::ceil_div(e.expert, group / m.ep) : e.total();
    g.shard = storage_bytes(entry_gradient_dtype(l, t), shard) * held[i];
    g.full = storage_bytes(entry_gradient_dtype(l, t), e.total());
    return g;
  };
  bytes all_grads{}, tied_weight_grad{}, tied_grads{};
  std::size_t tied_entry = model.size;
  if (torch) {
    if (t.grad_accum > 1)
      for (std::size_t i = 0; i < model.size; ++i) all_grads += grads_of(i).shard;
    if (tied_embedding(model))
      for (std::size_t i = 0; i < model.size; ++i)
        if (model.entries[i].kind == layer_kind::embedding && held[i] != 0 && model.entries[i].trainable) {
          const detail::entry_gradients g = grads_of(i);
          tied_weight_grad = g.full;
          tied_grads = g.shard;
          tied_entry = i;
          break;
        }
  }
  const bool tied_model = torch && tied_entry < model.size && tied_weight_grad > bytes{};
  const bool autocast = activation_context_of(t, m).autocast();
  const bool accumulating = torch && t.grad_accum > 1;
  const bytes forward_grads = accumulating ? all_grads : bytes{};
  if (offload) out.host = at_end;

  // Teachers run first, between earlier micro-batches' saved tensors and the student's forward.
  for (std::size_t i = 0; i < model.size; ++i) {
    const layer_desc& l = model.entries[i];
    if (l.group != layer_group::teacher || held[i] == 0) continue;
    const layer_activations& a = table.entries[i];
    forward.offer(on_device(prior), a.forward_temporary, a.comm + boundary);
    if (log != nullptr) log->push({sweep_step::teacher, i, on_device(prior), a.forward_temporary, a.comm + boundary});
  }
  bytes cumulative{};
  for (std::size_t i = 0; i < model.size; ++i) {
    const layer_desc& l = model.entries[i];
    if (l.group == layer_group::teacher || l.place == placement::spread || held[i] == 0) continue;
    const layer_activations& a = table.entries[i];
    cumulative += kept[i];
    bytes temporary = a.forward_temporary + teacher_logits;
    if (units) temporary += detail::entry_unit_transients(model, l, t, m).forward;
    if (rk == recompute_kind::selective) temporary += a.recompute_core;  // computed, then dropped
    bytes saved = on_device(prior + cumulative);
    if (!stash && !offload) saved -= a.forward_released;  // (memalg's runtime, stacks/memalg.hpp)
    forward.offer(saved, temporary, a.comm + boundary, forward_grads);
    if (log != nullptr) log->push({sweep_step::forward, i, saved, temporary, a.comm + boundary, forward_grads});
  }
  bytes done{};     // pytorch: gradients of the entries whose backward has run
  bytes pending{};  // pytorch, accumulating or FSDP: a tied output's new gradient, not yet in .grad
  // FSDP2: the root unit's gradients, unsharded until its reduce-scatter ends the backward (in
  // `pending`, beside the shards counted in `done`).
  bytes root_waiting{};
  const bool fsdp2_root = torch && m.zero_stage >= 3 && m.dp * m.cp > 1;
  for (std::size_t j = model.size; j-- > 0;) {
    const layer_desc& l = model.entries[j];
    if (l.group == layer_group::teacher || l.place == placement::spread || held[j] == 0) continue;
    const layer_activations& a = table.entries[j];
    if (a.backward) {
      bytes temporary = a.backward_temporary + rebuilt[j];
      if (l.kind == layer_kind::output) temporary += teacher_logits;
      if (units) temporary += detail::entry_unit_transients(model, l, t, m).backward;
      bytes gradients{};
      if (torch) {
        const bool tied = l.kind == layer_kind::output && (l.shape.flags & layer_flags::tied) != 0;
        if (l.kind == layer_kind::output && a.loss_temporary > bytes{}) {  // the loss's backward comes first
          const bytes held_now = on_device(prior + cumulative), loss = a.loss_temporary + teacher_logits;
          backward.offer(held_now, loss, a.comm + boundary, accumulating ? all_grads : done);
          if (log != nullptr)
            log->push({sweep_step::loss, j, held_now, loss, a.comm + boundary, accumulating ? all_grads : done});
        }
        // A tied output projection writes the embedding's gradient (which exists from then on);
        // the embedding's own backward adds its dense gradient to it (the engine's input buffer
        // of the shared weight, torch/csrc/autograd/input_buffer.cpp). The projection's gradient
        // is the transpose of an mm's, a view whose base holds its storage, so the sum is out
        // of place (two more of its size for a moment); under autocast it comes from the
        // weight's cast (ToCopyBackward0), a tensor of its own, and the dense gradient is added
        // into it in place (one more). With accumulation the projection's gradient waits in
        // that buffer, beside the .grad of the earlier micro-batches, until the embedding's
        // backward (`pending`).
        const bool tied_embedding_entry = tied_model && j == tied_entry;
        const detail::entry_gradients g = grads_of(j);
        // A block's backward in phases (stacks/pytorch.hpp; offer_first and torch_tail below),
        // its saved tensors rebuilt under recomputation.
        const bool rebuilt_block = l.place == placement::repeated &&
                                   (rk == recompute_kind::full || rk == recompute_kind::every_k);
        if (tied && tied_model) temporary += tied_weight_grad;
        if (tied_embedding_entry) temporary += tied_weight_grad * (autocast ? 1 : 2);
        // FSDP: the unit's full gradient before its reduce-scatter (for the tied embedding the
        // input buffer's sum above is that gradient).
        if (m.zero_stage >= 2 && !tied_embedding_entry) temporary += g.full;
        const bytes own = tied_embedding_entry ? bytes{} : g.shard;
        // With accumulation a new gradient is added into .grad as soon as it is made, parameter by
        // parameter: at most the largest tensor's new gradient exists at once (unsharded runs).
        const bytes newest =
            m.zero_stage >= 2 ? own : storage_bytes(t.precision.gradients, detail::largest_tensor(l));
        const auto accumulated = [&](bytes part) { return all_grads + pending + (newest < part ? newest : part); };
        // Which gradients a block's phases have made (stacks/pytorch.hpp, later_phase_params):
        // the first (the MLP's) not its attention's, the second (the attention core's) not its
        // input projections'. Unsharded runs only, where an instance's gradients appear within its
        // own backward. With accumulation each new gradient is added into .grad as soon as it is
        // made (AccumulateGrad runs first among the ready nodes: its sequence number is the
        // largest), so none is new while the core's transients exist.
        const bool phased = a.backward_tail > bytes{} && m.zero_stage < 2 && m.tp == 1;
        const bytes late_attention =
            phased && !accumulating ? storage_bytes(t.precision.gradients, a.late_attention_params) : bytes{};
        const bytes late_inputs =
            phased && !accumulating ? storage_bytes(t.precision.gradients, a.late_input_params) : bytes{};
        const auto first_phase = [&](bytes grads) { return saturating_sub(grads, late_attention); };
        // The first phase's moments. A weight gradient is made inside a projection's backward,
        // beside that node's transients (a block's grad_temporary: the down projection's input
        // gradient, or the gate and up sides' gradients), not beside the elementwise nodes'
        // larger set, which come before the first projections' gradients (and, with
        // accumulation, after the down projection's new gradient is added into .grad).
        const bytes late_mlp =
            phased && !accumulating ? storage_bytes(t.precision.gradients, a.late_mlp_params) : bytes{};
        const auto offer_first = [&](sweep_step step, bytes held_now, bytes grads) {
          if (l.kind == layer_kind::output && a.grad_temporary > bytes{}) {
            // The output projection (stacks/pytorch.hpp): the logits' gradients first, with no
            // weight gradient of its own yet; then the weight's, beside narrower transients.
            const bytes tied_new = tied && tied_model ? tied_weight_grad : bytes{};
            const bytes before_weight = accumulating ? all_grads + pending : done + pending;
            backward.offer(held_now, temporary - tied_new, a.comm + boundary, before_weight);
            if (log != nullptr) log->push({step, j, held_now, temporary - tied_new, a.comm + boundary, before_weight});
            const bytes narrow = temporary - a.backward_temporary + a.grad_temporary;
            if (a.last_released == bytes{}) {
              backward.offer(held_now, narrow, a.comm + boundary, grads);
              if (log != nullptr) log->push({step, j, held_now, narrow, a.comm + boundary, grads});
              return;
            }
            // Autocast: the product makes the weight's gradient in its own dtype (no fp32 one
            // yet), then its cast to fp32 runs with the product's saved tensors and the logits'
            // gradient released.
            backward.offer(held_now, narrow - tied_new, a.comm + boundary, before_weight);
            if (log != nullptr) log->push({step, j, held_now, narrow - tied_new, a.comm + boundary, before_weight});
            // (The logits' and the input's gradients are still counted there: at most.)
            const bytes cast_held = saturating_sub(held_now, a.last_released);
            backward.offer(cast_held, narrow, a.comm + boundary, grads);
            if (log != nullptr) log->push({step, j, cast_held, narrow, a.comm + boundary, grads});
            return;
          }
          // (a dense MLP's grad_temporary is at most its backward_temporary; routed experts' may
          // be larger: their first moment, the routing product's, precedes their gradients)
          const bool split = phased && a.grad_temporary > bytes{} &&
                             (a.grad_temporary <= a.backward_temporary || a.late_mlp_params != 0);
          const bytes settled = !split ? first_phase(grads) : accumulating ? all_grads + pending : saturating_sub(first_phase(grads), late_mlp);
          // Saved tensors whose node runs before the block's first transients are gone by then
          // (OLMo 2's norm on the MLP's output, stacks/pytorch.hpp): from the held set, or from
          // the rebuilt one under recomputation.
          const bytes early = a.backward_released;
          const bytes held_first = rebuilt_block ? held_now : saturating_sub(held_now, early);
          const bytes temps_first = rebuilt_block ? saturating_sub(temporary, early) : temporary;
          backward.offer(held_first, temps_first, a.comm + boundary, settled);
          if (log != nullptr) log->push({step, j, held_first, temps_first, a.comm + boundary, settled});
          if (!split) return;
          // Unaccumulated, that moment is the first projections' backward, the MLP's own saved
          // tensors freed (from the rebuilt set under recomputation); with accumulation it is also
          // the down projection's, with all held.
          const bytes released = accumulating ? bytes{} : a.mlp_released;
          const bytes narrow = saturating_sub(temporary - a.backward_temporary + a.grad_temporary, rebuilt_block ? released : bytes{});
          const bytes held_then = rebuilt_block ? held_now : saturating_sub(held_now, released);
          const bytes made = accumulating ? grads : first_phase(grads);
          backward.offer(held_then, narrow, a.comm + boundary, made);
          if (log != nullptr) log->push({step, j, held_then, narrow, a.comm + boundary, made});
        };
        // The second phase frees the MLP's saved tensors (from the rebuilt set under
        // recomputation) and holds the attention's transients; the third frees the attention's
        // saved tensors too, and holds the same transients at most.
        const auto torch_tail = [&](bytes held_now, bytes temps, bytes grads) {
          if (a.backward_tail == bytes{}) return;
          const bytes second = temps - a.backward_temporary + a.backward_tail;
          const bytes held_then = rebuilt_block ? held_now : held_now - a.tail_released;
          const bytes temps_then = rebuilt_block ? second - a.tail_released : second;
          const bytes grads_then = !phased ? grads : accumulating ? all_grads + pending : saturating_sub(grads, late_inputs);
          backward.offer(held_then, temps_then, a.comm + boundary, grads_then);
          if (log != nullptr) log->push({sweep_step::backward_tail, j, held_then, temps_then, a.comm + boundary, grads_then});
          if (grads_then == grads) return;
          const bytes held_last = rebuilt_block ? held_then : saturating_sub(held_then, a.last_released);
          const bytes temps_last = rebuilt_block ? saturating_sub(temps_then, a.last_released) : temps_then;
          backward.offer(held_last, temps_last, a.comm + boundary, grads);
          if (log != nullptr) log->push({sweep_step::backward_tail, j, held_last, temps_last, a.comm + boundary, grads});
        };
        // An instance's reduce-scatter under FSDP, its backward's tensors freed
        // (_fsdp_param_group.py, `post_backward`: the unit is resharded, the previous
        // reduce-scatter's state dropped, then `foreach_reduce`): the unsharded gradient (the
        // input; on the CPU also gloo's clone of it, stacks/pytorch.hpp, fsdp_gloo_held) and the
        // shards made so far, the new one included. Under FSDP2 the unit's gathered parameters,
        // which the timeline adds to every backward moment (fsdp_gathered), are gone by then.
        const auto reduce_scatter = [&](sweep_step step, bytes held_now, bytes grads) {
          if (m.zero_stage < 2 || accumulating || l.place != placement::repeated || own == bytes{}) return;
          const std::uint64_t elements = elements_per_rank(l, m).total();
          const bytes input = storage_bytes(t.precision.gradients, elements);
          const dtype wdt = l.weight_storage.is_none() ? t.precision.weights : l.weight_storage;
          const bytes unit = m.zero_stage >= 3 ? storage_bytes(wdt, elements) * (1 + m.zero3_prefetch) : bytes{};
          const bytes temps = saturating_sub(input * (table.host ? 2 : 1), unit);
          backward.offer(held_now, temps, a.comm + boundary, grads);
          if (log != nullptr) log->push({step, j, held_now, temps, a.comm + boundary, grads});
        };
        // A repeated entry's instances run their backward one after another: the first holds
        // every instance's saved tensors and one instance's gradients, the last one instance's
        // saved tensors and all their gradients; the moments in between lie below one of them.
        const std::uint64_t n = held[j];
        if (n > 1) {
          const bytes one_grad{detail::ceil_div(own.value, n)};
          const bytes one_kept{detail::ceil_div(kept[j].value, n)};
          const bytes first = on_device(prior + cumulative), last = on_device(prior + cumulative - kept[j] + one_kept);
          const bytes before = accumulating ? all_grads : done;
          // With accumulation every gradient exists from the first micro-batch on, and each new
          // gradient is added into its .grad and freed (AccumulateGrad,
          // torch/csrc/autograd/functions/accumulate_grad.h: `variable_grad += new_grad`):
          // `accumulated` above.
          // Under FSDP2 an instance's gradient shard is made by its reduce-scatter, which its
          // post-backward hook starts once the instance's backward has ended
          // (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, `post_backward`): while it
          // runs, its gradient is the unsharded one counted in `temporary`, and its shard is not
          // there yet.
          const bytes running = m.zero_stage >= 2 ? one_grad : bytes{};
          const bytes at_first = accumulating ? accumulated(one_grad) : before + pending + one_grad - running;
          const bytes at_last = accumulating ? accumulated(one_grad) : done + pending + own - running;
          // The first instance's reduce-scatter holds the other instances' saved tensors and one
          // shard, the last's no saved tensors and every shard; those in between lie below one.
          offer_first(sweep_step::backward, first, at_first);
          offer_first(sweep_step::backward_last, last, at_last);
          torch_tail(first, temporary, at_first);
          torch_tail(last, temporary, at_last);
          reduce_scatter(sweep_step::backward, on_device(prior + cumulative - one_kept), before + pending + one_grad);
          reduce_scatter(sweep_step::backward_last, on_device(prior + cumulative - kept[j]), done + pending + own);
        } else {
          const bytes running = m.zero_stage >= 2 && l.place == placement::repeated ? own : bytes{};
          gradients = accumulating ? accumulated(own) : done + pending + own - running;
          offer_first(sweep_step::backward, on_device(prior + cumulative), gradients);
          torch_tail(on_device(prior + cumulative), temporary, gradients);
          reduce_scatter(sweep_step::backward, on_device(prior + cumulative - kept[j]), done + pending + own);
        }
        done += own;
        // The tied output's gradient waits in the input buffer, whole, until the embedding's
        // backward (with accumulation beside the earlier micro-batches' .grad; under FSDP before
        // the reduce-scatter that leaves its shard); unsharded and unaccumulated it is the
        // gradient .grad takes.
        const bool waits = accumulating || m.zero_stage >= 2;
        if (tied && tied_model) {
          if (waits) pending += tied_weight_grad;
          else done += tied_grads;
        }
        if (tied_embedding_entry && waits) {
          pending = saturating_sub(pending, tied_weight_grad);
          if (!accumulating) done += tied_grads;
        }
        // FSDP2's root unit (the entries that are not repeated) has no reduce-scatter of its own
        // before the backward ends: its post-backward runs in the root's final callback
        // (torch/distributed/fsdp/_fully_shard/_fsdp_state.py, `_root_post_backward_final_callback`),
        // so each of its gradients stays whole, as autograd made it, from its entry's backward to
        // the end (measured: pw3-027-phi3, `MmBackward0 of lm_head`, 3580×1024 fp32, beside the
        // blocks' backward). Unaccumulated the shard in `done` stands for part of it; with
        // accumulation the shard is the earlier micro-batches' (`all_grads`), and the new
        // gradient waits beside it.
        if (fsdp2_root && l.place != placement::repeated && l.trainable) {
          const bytes whole = tied_embedding_entry ? tied_weight_grad : g.full;
          const bytes wait = accumulating ? whole : saturating_sub(whole, tied_embedding_entry ? tied_grads : own);
          root_waiting += wait;
          pending += wait;
        }
      } else {
        // memalg's runtime frees some saved bytes as its backward begins (a block's MLP dropout
        // mask, stacks/memalg.hpp); the whole backward after that holds the rest. Rebuilt
        // by recomputation they are the backward's temporaries; in a pipeline's stash or offloaded
        // they stay where they are.
        // A backward in two phases (backward_tail) frees more before its second, which alone
        // holds a core rebuilt by selective recomputation.
        const bytes saved = on_device(prior + cumulative);
        const bool release = !stash && !offload;
        const bool rebuilt_layer = l.place == placement::repeated &&
                                   (rk == recompute_kind::full || rk == recompute_kind::every_k);
        const auto moment = [&](sweep_step step, bytes temps, bytes freed) {
          if (!release) freed = bytes{};
          const bytes held_now = rebuilt_layer ? saved : saved - freed;
          const bytes temps_now = rebuilt_layer ? temps - freed : temps;
          backward.offer(held_now, temps_now, a.comm + boundary, gradients);
          if (log != nullptr) log->push({step, j, held_now, temps_now, a.comm + boundary, gradients});
        };
        if (a.backward_tail > bytes{}) {
          moment(sweep_step::backward, rk == recompute_kind::selective ? temporary - rebuilt[j] : temporary,
                 a.backward_released);
          moment(sweep_step::backward_tail, temporary - a.backward_temporary + a.backward_tail,
                 a.backward_released + a.tail_released);
        } else {
          moment(sweep_step::backward, temporary, a.backward_released);
        }
      }
    }
    cumulative -= kept[j];
  }
  if (torch && m.zero_stage >= 3) {
    // FSDP2's root unit (every entry that is not repeated) reduce-scatters last, once its
    // parameters' gradients all exist (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py,
    // `foreach_reduce`): their unsharded gradients are copied into one input (`_chunk_cat`), an
    // untied output projection's own gradient still held beside it (measured; the embedding's is
    // gone), and the output shard is made;
    // over gloo c10d reduce-scatters a clone of the input (stacks/pytorch.hpp, fsdp_gloo_held).
    // By then the root's gathered parameters are resharded: the moment is offered less the
    // gathered parameters the timeline adds to every backward moment (measured: pw1-031-mixtral,
    // FSDP2 with an untied 50k vocabulary, whose peak is this moment: 9.5 % under without it).
    bytes root{}, output{};
    for (std::size_t i = 0; i < model.size; ++i) {
      const layer_desc& l = model.entries[i];
      if (held[i] == 0 || l.place == placement::repeated || l.group == layer_group::teacher) continue;
      const bytes full = grads_of(i).full;
      root += full;
      if (l.kind == layer_kind::output && (l.shape.flags & layer_flags::tied) == 0) output = full;
    }
    if (root > bytes{}) {
      const bytes reduce = root * (table.host ? 2 : 1) + root.shard(m.dp * m.cp) + output;
      const bytes temps = saturating_sub(reduce, detail::fsdp_gathered(model, t, m, stage));
      // (the root's gradients themselves are in `reduce` now: its input and the output's own)
      const bytes left = saturating_sub(pending, root_waiting);
      const bytes grads = accumulating ? all_grads + left : done + left;
      backward.offer(on_device(prior), temps, boundary, grads);
      if (log != nullptr) log->push({sweep_step::backward, model.size - 1, on_device(prior), temps, boundary, grads});
    }
  }
  if (log != nullptr) log->gradients_after_backward = accumulating ? all_grads : done;
  out.forward = forward.as_breakdown();
  out.backward = backward.as_breakdown();
  return out;
}

/// One row of the per-layer table: bytes of ONE instance on the most loaded rank.
struct layer_row {
  std::string_view name{};
  layer_kind kind = layer_kind::parameters;
  std::uint64_t count = 0;  ///< instances the rank holds
  bytes weights{};          ///< device weight bytes of one instance
  bytes activations{};      ///< saved bytes of one instance for one micro-batch, recomputation applied
};

struct layer_rows {
  std::array<layer_row, max_model_entries> rows{};
  std::size_t size = 0;
  constexpr const layer_row* begin() const { return rows.data(); }
  constexpr const layer_row* end() const { return rows.data() + size; }
};

/// The per-layer table of `stage` (entries the stage does not hold have count 0).
constexpr layer_rows layer_table(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                 std::uint64_t stage, const device_desc& d = device_desc{}) {
  layer_rows out{};
  const activation_table table = activation_table_of(model, activation_context_of(t, m, d));
  for (std::size_t i = 0; i < model.size; ++i) {
    const layer_desc& l = model.entries[i];
    layer_row& r = out.rows[out.size++];
    r.name = l.name;
    r.kind = l.kind;
    r.count = instances_on_stage(l, stage, m.pp);
    model_desc one{};
    layer_desc single = l;
    single.count = 1;
    if (single.place != placement::spread) single.place = placement::first_stage;
    one.push(single);
    r.weights = model_states(one, t, m, 0).device.weights;
    const layer_activations& a = table.entries[i];
    if (!a.backward) continue;
    const bool layer = l.place == placement::repeated;
    switch (t.recompute) {
      case recompute_kind::none: r.activations = a.saved; break;
      case recompute_kind::selective: r.activations = a.selective; break;
      case recompute_kind::full:
      case recompute_kind::every_k: r.activations = layer ? a.input : a.saved; break;
    }
  }
  return out;
}

}  // namespace memalg

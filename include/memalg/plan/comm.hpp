// SPDX-License-Identifier: BSL-1.0
// memalg/plan/comm.hpp — bytes each rank sends per training step: the communication-volume model
// the strategy search ranks configurations by.
//
// Collectives are costed with the bandwidth-optimal ring algorithms. A buffer of S bytes is cut
// into n chunks of ⌈S/n⌉ (the padding a real ring uses), and one rank of n sends
//
//   all-reduce        2(n−1)·⌈S/n⌉     reduce-scatter then all-gather (Patarasuk & Yuan 2009,
//                                      "Bandwidth optimal all-reduce algorithms for clusters of
//                                      workstations", JPDC 69(2); the 2(n−1)/n lower bound)
//   reduce-scatter    (n−1)·⌈S/n⌉      S = the unscattered buffer (Thakur, Rabenseifner & Gropp
//   all-gather        (n−1)·⌈S/n⌉      2005, "Optimization of collective communication operations
//                                      in MPICH", IJHPCA 19(1)); S = the gathered buffer
//   all-to-all        (n−1)·⌈S/n⌉      keeps its own 1/n
//   send/recv         S
//
// — the factors nccl-tests calls "bus bandwidth" (nccl-tests doc/PERFORMANCE.md: 2(n−1)/n for
// all-reduce, (n−1)/n for reduce-scatter, all-gather and all-to-all). A group of one sends nothing.
//
// Per optimizer step of one rank, with m = grad_accum micro-batches, d = dp·cp (the group that
// data parallelism and ZeRO reduce over, as in Megatron-LM), G = the rank's gradient bytes and
// W = its weight bytes before ZeRO sharding (after tensor, pipeline and expert splits):
//
//   data parallel  ZeRO-0  all-reduce(G)                     once per step (local accumulation)
//                  ZeRO-1  reduce-scatter(G) + all-gather(W) once per step (Megatron's distributed
//                                                            optimizer; ZeRO paper §7.2.1: 2Ψ)
//                  ZeRO-2  m·reduce-scatter(G) + all-gather(W)  sharded gradients are reduced as
//                                                            each micro-batch's backward makes them
//                  ZeRO-3  m·(2·all-gather(W) + reduce-scatter(G))  weights gathered for forward
//                                                            and again for backward (ZeRO paper
//                                                            §7.2.2: 3Ψ, 1.5× data parallelism)
//                  Expert parameters reduce over the expert data-parallel group d/ep.
//
// With A = the activation bytes of one micro-batch at a layer boundary, (s/cp)·b·h in the recipe's
// activation dtype:
//
//   tensor parallel   per micro-batch, all-reduce(A) over t: 4 per transformer block (2 forward,
//                     2 backward; Shoeybi et al. 2019 §3, the f and g operators), 2 per separate
//                     attention or MLP, 1 for the vocabulary-parallel embedding (forward) and 1
//                     for the output layer (backward). Full recomputation repeats the forward ones.
//                     Sequence parallelism replaces each all-reduce by an all-gather and a
//                     reduce-scatter of the same total (Korthikanti et al. 2022 §4.2.2): same bytes.
//   pipeline          per micro-batch, send(A) to the next stage in forward and send(A) to the
//                     previous one in backward (Narayanan et al. 2021 §2); v model chunks per rank
//                     (interleaved) send v times as often (§2.2); with sequence parallelism the
//                     boundary tensor is the rank's 1/t of A (the scatter/gather optimisation, §4.1).
//   context parallel  ring attention: the K and V chunks of (s/cp)·b tokens travel cp−1 hops in
//                     forward, and K, V and their gradients in backward — 3·(cp−1) KV chunks per
//                     attention per micro-batch, 4 under full recomputation (Liu et al. 2023,
//                     "Ring Attention with Blockwise Transformers"; Megatron-Core context parallel).
//   expert parallel   4 all-to-all of the routed tokens, (s/cp)·b·top_k·h, per MoE layer per
//                     micro-batch (dispatch and combine, forward and backward; Lepikhin et al.
//                     2020, GShard), 6 under full recomputation.
//
// Not counted: host↔device offload traffic (PCIe, not the network), the few scalars of the
// vocabulary-parallel cross entropy and of gradient clipping, and MoE load-balancing statistics.
// A model given by its parameter count has no layer shapes, and a recipe without a sequence length
// has no activations: the activation terms are then zero and `activations_counted` is false.
#pragma once

#include <array>
#include <cstdint>

#include "memalg/core/bytes.hpp"
#include "memalg/model/layer.hpp"
#include "memalg/parallel/mesh.hpp"
#include "memalg/plan/model_states.hpp"
#include "memalg/train/recipe.hpp"

namespace memalg {

// ---- ring collectives ---------------------------------------------------------------------------

/// Bytes one of `n` ranks sends in a ring all-reduce of `size` bytes: 2(n−1)·⌈size/n⌉.
constexpr bytes ring_all_reduce_sent(bytes size, std::uint64_t n) {
  return n <= 1 ? bytes{} : size.shard(n) * (2 * (n - 1));
}
/// Bytes one of `n` ranks sends in a ring reduce-scatter of a `size`-byte buffer: (n−1)·⌈size/n⌉.
constexpr bytes ring_reduce_scatter_sent(bytes size, std::uint64_t n) {
  return n <= 1 ? bytes{} : size.shard(n) * (n - 1);
}
/// Bytes one of `n` ranks sends in a ring all-gather whose result is `size` bytes: (n−1)·⌈size/n⌉.
constexpr bytes ring_all_gather_sent(bytes size, std::uint64_t n) {
  return n <= 1 ? bytes{} : size.shard(n) * (n - 1);
}
/// Bytes one of `n` ranks sends in an all-to-all of its `size`-byte buffer: (n−1)·⌈size/n⌉.
constexpr bytes all_to_all_sent(bytes size, std::uint64_t n) { return n <= 1 ? bytes{} : size.shard(n) * (n - 1); }

// ---- per-step volume ----------------------------------------------------------------------------

/// Bytes one rank sends per optimizer step, by parallelism dimension.
struct comm_volume {
  bytes data_parallel{};     ///< gradient reduction and ZeRO weight gathers
  bytes tensor_parallel{};   ///< activation all-reduces (or all-gather + reduce-scatter)
  bytes pipeline{};          ///< activations and their gradients to neighbouring stages
  bytes context_parallel{};  ///< ring-attention key/value chunks
  bytes expert_parallel{};   ///< MoE token all-to-all
  /// False when activation traffic could not be counted (no layer shapes, or no sequence length)
  /// although tensor, pipeline, context or expert parallelism would send activations.
  bool activations_counted = true;

  constexpr bytes total() const {
    return data_parallel + tensor_parallel + pipeline + context_parallel + expert_parallel;
  }
};

namespace detail {

constexpr bool full_recompute(const training_desc& t) {
  return t.recompute == recompute_kind::full || t.recompute == recompute_kind::every_k;
}
constexpr dtype activation_dtype(const training_desc& t) {
  return t.precision.activations.is_none() ? t.precision.weights : t.precision.activations;
}
/// Tokens of one micro-batch on one context-parallel rank for entry `l`.
constexpr std::uint64_t local_tokens(const layer_desc& l, const training_desc& t, const mesh_desc& m) {
  const std::uint64_t s = l.shape.sequence != 0 ? l.shape.sequence : t.sequence;
  return checked_mul(ceil_div(s, m.cp), t.micro_batch);
}
constexpr bool is_moe(const layer_desc& l) {
  return l.kind == layer_kind::moe ||
         (l.kind == layer_kind::transformer_block && (l.shape.flags & layer_flags::moe) != 0);
}
constexpr bool has_self_attention(const layer_desc& l) {
  return l.kind == layer_kind::attention || l.kind == layer_kind::transformer_block;
}
/// Tensor-parallel all-reduces of one instance per micro-batch (forward, backward, recompute).
constexpr std::uint64_t tp_all_reduces(const layer_desc& l, bool recompute) {
  const bool cross = (l.shape.flags & layer_flags::cross_attention) != 0;
  switch (l.kind) {
    case layer_kind::transformer_block: {
      const std::uint64_t forward = cross ? 3 : 2;
      return 2 * forward + (recompute ? forward : 0);
    }
    case layer_kind::attention:
    case layer_kind::mlp:
    case layer_kind::gated_mlp:
    case layer_kind::moe: return 2 + (recompute ? 1 : 0);
    case layer_kind::embedding:
    case layer_kind::output: return 1;
    default: return 0;
  }
}
/// Width of the tensor crossing a pipeline-stage boundary: the hidden size of the repeated layers.
constexpr std::uint64_t boundary_width(const model_desc& model) {
  for (const layer_desc& l : model)
    if (l.place == placement::repeated && l.shape.hidden != 0) return l.shape.hidden;
  for (const layer_desc& l : model)
    if (l.shape.hidden != 0) return l.shape.hidden;
  return 0;
}
}  // namespace detail

namespace detail {
/// What one instance of an entry sends or reduces, independent of the stage it sits on.
struct entry_traffic {
  bytes grad_dense{}, grad_expert{};          ///< gradients (trainable entries)
  bytes weight_dense{}, weight_expert{};      ///< weights ZeRO-1/2 all-gather after the step (trainable)
  bytes gathered_dense{}, gathered_expert{};  ///< weights ZeRO-3 gathers (all of them)
  bytes tensor{}, context{}, expert{};        ///< activation traffic per optimizer step
  bool shaped = false;                        ///< activation traffic could be counted
};

constexpr entry_traffic traffic_of(const layer_desc& l, const training_desc& t, const mesh_desc& m) {
  const precision_policy& p = t.precision;
  entry_traffic e{};
  const rank_elements r = elements_per_rank(l, m);
  const dtype wdt = l.weight_storage.is_none() ? p.weights : l.weight_storage;
  e.gathered_dense = storage_bytes(wdt, r.dense);
  e.gathered_expert = storage_bytes(wdt, r.expert);
  if (l.trainable) {
    e.grad_dense = storage_bytes(gradient_dtype(t), r.dense);
    e.grad_expert = storage_bytes(gradient_dtype(t), r.expert);
    e.weight_dense = e.gathered_dense;
    e.weight_expert = e.gathered_expert;
  }
  if (l.shape.hidden == 0 || t.sequence == 0) return e;
  e.shaped = true;
  const dtype act = activation_dtype(t);
  const bool recompute = full_recompute(t);
  const std::uint64_t tokens = local_tokens(l, t, m);
  const std::uint64_t micro_batches = t.grad_accum;
  const bytes boundary = storage_bytes(act, checked_mul(tokens, l.shape.hidden));
  e.tensor = ring_all_reduce_sent(boundary, m.tp) * checked_mul(tp_all_reduces(l, recompute), micro_batches);
  if (has_self_attention(l) && m.cp > 1) {
    const std::uint64_t kv_heads = ceil_div(l.shape.kv_heads != 0 ? l.shape.kv_heads : l.shape.heads, m.tp);
    const std::uint64_t head_dim = l.shape.head_dim != 0 ? l.shape.head_dim
                                   : l.shape.heads != 0  ? l.shape.hidden / l.shape.heads
                                                         : 0;
    const bytes kv_chunk = storage_bytes(act, checked_mul(checked_mul(2 * tokens, kv_heads), head_dim));
    const std::uint64_t passes = (recompute ? 4 : 3) * ((l.shape.flags & layer_flags::cross_attention) != 0 ? 2 : 1);
    e.context = kv_chunk * checked_mul(checked_mul(m.cp - 1, passes), micro_batches);
  }
  if (is_moe(l) && m.ep > 1) {
    const std::uint64_t top_k = l.shape.top_k != 0 ? l.shape.top_k : 1;
    bytes routed = storage_bytes(act, checked_mul(checked_mul(tokens, top_k), l.shape.hidden));
    if (m.sequence_parallel) routed = routed.shard(m.tp);
    e.expert = all_to_all_sent(routed, m.ep) * checked_mul(recompute ? 6 : 4, micro_batches);
  }
  return e;
}

/// Adds `n` instances of `e` to a stage's running sums.
constexpr void accumulate(entry_traffic& sum, const entry_traffic& e, std::uint64_t n) {
  if (n == 0) return;
  sum.grad_dense += e.grad_dense * n;
  sum.grad_expert += e.grad_expert * n;
  sum.weight_dense += e.weight_dense * n;
  sum.weight_expert += e.weight_expert * n;
  sum.gathered_dense += e.gathered_dense * n;
  sum.gathered_expert += e.gathered_expert * n;
  sum.tensor += e.tensor * n;
  sum.context += e.context * n;
  sum.expert += e.expert * n;
  sum.shaped = sum.shaped || e.shaped;
}

/// The volume of `stage` from the sums of its entries' traffic.
constexpr comm_volume stage_volume(const model_desc& model, const entry_traffic& sum, const training_desc& t,
                                   const mesh_desc& m, std::uint64_t stage) {
  const std::uint64_t micro_batches = t.grad_accum;
  const std::uint64_t dense_group = m.dp * m.cp;
  const std::uint64_t expert_group = dense_group / (m.ep == 0 ? 1 : m.ep);
  comm_volume v{};
  v.tensor_parallel = sum.tensor;
  v.context_parallel = sum.context;
  v.expert_parallel = sum.expert;
  // Data parallelism and ZeRO (dense over dp·cp, expert parameters over dp·cp/ep).
  const auto reduce = [&](bytes grads, bytes weights, bytes gathered, std::uint64_t group) {
    switch (m.zero_stage) {
      case 0: return ring_all_reduce_sent(grads, group);
      case 1: return ring_reduce_scatter_sent(grads, group) + ring_all_gather_sent(weights, group);
      case 2: return ring_reduce_scatter_sent(grads, group) * micro_batches + ring_all_gather_sent(weights, group);
      default:
        return (ring_all_gather_sent(gathered, group) * 2 + ring_reduce_scatter_sent(grads, group)) * micro_batches;
    }
  };
  v.data_parallel = reduce(sum.grad_dense, sum.weight_dense, sum.gathered_dense, dense_group) +
                    reduce(sum.grad_expert, sum.weight_expert, sum.gathered_expert, expert_group);

  // Pipeline boundaries: forward to the next stage, backward to the previous one.
  const std::uint64_t width = boundary_width(model);
  if (m.pp > 1 && width != 0 && t.sequence != 0) {
    bytes boundary = storage_bytes(activation_dtype(t),
                                   checked_mul(checked_mul(ceil_div(t.sequence, m.cp), t.micro_batch), width));
    if (m.sequence_parallel) boundary = boundary.shard(m.tp);
    const std::uint64_t chunks = m.schedule == pipeline_schedule::interleaved ? m.virtual_stages : 1;
    const std::uint64_t forward = stage + 1 < m.pp ? chunks : chunks - 1;
    const std::uint64_t backward = stage > 0 ? chunks : chunks - 1;
    v.pipeline = boundary * checked_mul(forward + backward, micro_batches);
  }
  const bool activation_parallelism = m.tp > 1 || m.pp > 1 || m.cp > 1 || m.ep > 1;
  v.activations_counted = !activation_parallelism || (sum.shaped && (m.pp == 1 || width != 0));
  return v;
}
}  // namespace detail

/// Bytes one rank of pipeline stage `stage` sends per optimizer step (see the header comment).
constexpr comm_volume stage_communication(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                          std::uint64_t stage) {
  detail::entry_traffic sum{};
  for (const layer_desc& l : model) detail::accumulate(sum, detail::traffic_of(l, t, m), instances_on_stage(l, stage, m.pp));
  return detail::stage_volume(model, sum, t, m, stage);
}

/// Bytes the most communicating rank sends per optimizer step. Only stages 0, 1 and p−1 can be
/// it: a middle stage holds no more instances of any entry than stage 1 (earlier stages take the
/// remainder of an uneven split; first- and last-stage entries are elsewhere) and sends what
/// every middle stage sends across its two boundaries; stage 0 and p−1 hold their own entries.
/// One pass over the entries serves the three stages.
constexpr comm_volume communication(const model_desc& model, const training_desc& t, const mesh_desc& m) {
  const std::uint64_t pp = m.pp == 0 ? 1 : m.pp;
  const std::uint64_t stages[3] = {0, pp - 1, 1};
  const std::size_t distinct = pp > 2 ? 3 : pp > 1 ? 2 : 1;
  detail::entry_traffic sums[3] = {detail::entry_traffic{}, detail::entry_traffic{}, detail::entry_traffic{}};
  for (const layer_desc& l : model) {
    const detail::entry_traffic e = detail::traffic_of(l, t, m);
    for (std::size_t i = 0; i < distinct; ++i) detail::accumulate(sums[i], e, instances_on_stage(l, stages[i], pp));
  }
  comm_volume best = detail::stage_volume(model, sums[0], t, m, 0);
  for (std::size_t i = 1; i < distinct; ++i) {
    const comm_volume c = detail::stage_volume(model, sums[i], t, m, stages[i]);
    if (c.total() > best.total()) best = c;
  }
  return best;
}

}  // namespace memalg

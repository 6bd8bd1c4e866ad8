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

/// Bytes one rank of pipeline stage `stage` sends per optimizer step (see the header comment).
constexpr comm_volume stage_communication(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                          std::uint64_t stage) {
  using detail::ceil_div;
  using detail::checked_mul;
  const precision_policy& p = t.precision;
  const std::uint64_t micro_batches = t.grad_accum;
  const std::uint64_t dense_group = m.dp * m.cp;
  const std::uint64_t expert_group = dense_group / (m.ep == 0 ? 1 : m.ep);
  const dtype act = detail::activation_dtype(t);
  const bool recompute = detail::full_recompute(t);
  const bool activation_parallelism = m.tp > 1 || m.pp > 1 || m.cp > 1 || m.ep > 1;

  comm_volume v{};
  bytes grad_dense{}, grad_expert{}, weight_dense{}, weight_expert{}, gathered_dense{}, gathered_expert{};
  bool shapes = false;
  for (const layer_desc& l : model) {
    const std::uint64_t n = instances_on_stage(l, stage, m.pp);
    if (n == 0) continue;
    const rank_elements e = elements_per_rank(l, m);
    const dtype wdt = l.weight_storage.is_none() ? p.weights : l.weight_storage;
    // ZeRO-3 gathers every weight it sharded, frozen or not; the other stages move trainable ones.
    gathered_dense += storage_bytes(wdt, e.dense) * n;
    gathered_expert += storage_bytes(wdt, e.expert) * n;
    if (l.trainable) {
      grad_dense += storage_bytes(p.gradients, e.dense) * n;
      grad_expert += storage_bytes(p.gradients, e.expert) * n;
      weight_dense += storage_bytes(wdt, e.dense) * n;
      weight_expert += storage_bytes(wdt, e.expert) * n;
    }

    if (l.shape.hidden == 0 || t.sequence == 0) continue;
    shapes = true;
    const std::uint64_t tokens = detail::local_tokens(l, t, m);
    const bytes boundary = storage_bytes(act, checked_mul(tokens, l.shape.hidden));
    const std::uint64_t per_step = checked_mul(n, micro_batches);
    v.tensor_parallel += ring_all_reduce_sent(boundary, m.tp) * checked_mul(detail::tp_all_reduces(l, recompute), per_step);
    if (detail::has_self_attention(l) && m.cp > 1) {
      const std::uint64_t kv_heads = ceil_div(l.shape.kv_heads != 0 ? l.shape.kv_heads : l.shape.heads, m.tp);
      const std::uint64_t head_dim = l.shape.head_dim != 0 ? l.shape.head_dim
                                     : l.shape.heads != 0  ? l.shape.hidden / l.shape.heads
                                                           : 0;
      const bytes kv_chunk = storage_bytes(act, checked_mul(checked_mul(2 * tokens, kv_heads), head_dim));
      const std::uint64_t passes = (recompute ? 4 : 3) * ((l.shape.flags & layer_flags::cross_attention) != 0 ? 2 : 1);
      v.context_parallel += kv_chunk * checked_mul(checked_mul(m.cp - 1, passes), per_step);
    }
    if (detail::is_moe(l) && m.ep > 1) {
      const std::uint64_t top_k = l.shape.top_k != 0 ? l.shape.top_k : 1;
      bytes routed = storage_bytes(act, checked_mul(checked_mul(tokens, top_k), l.shape.hidden));
      if (m.sequence_parallel) routed = routed.shard(m.tp);
      v.expert_parallel += all_to_all_sent(routed, m.ep) * checked_mul(recompute ? 6 : 4, per_step);
    }
  }

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
  v.data_parallel = reduce(grad_dense, weight_dense, gathered_dense, dense_group) +
                    reduce(grad_expert, weight_expert, gathered_expert, expert_group);

  // Pipeline boundaries: forward to the next stage, backward to the previous one.
  const std::uint64_t width = detail::boundary_width(model);
  if (m.pp > 1 && width != 0 && t.sequence != 0) {
    bytes boundary = storage_bytes(act, checked_mul(checked_mul(ceil_div(t.sequence, m.cp), t.micro_batch), width));
    if (m.sequence_parallel) boundary = boundary.shard(m.tp);
    const std::uint64_t v_chunks = m.schedule == pipeline_schedule::interleaved ? m.virtual_stages : 1;
    const std::uint64_t forward = stage + 1 < m.pp ? v_chunks : v_chunks - 1;
    const std::uint64_t backward = stage > 0 ? v_chunks : v_chunks - 1;
    v.pipeline = boundary * checked_mul(forward + backward, micro_batches);
  }
  v.activations_counted = !activation_parallelism || (shapes && (m.pp == 1 || width != 0));
  return v;
}

/// Bytes the most communicating rank sends per optimizer step: the maximum over the distinct
/// pipeline stages (first, last, and either side of an uneven split of each repeated entry).
constexpr comm_volume communication(const model_desc& model, const training_desc& t, const mesh_desc& m) {
  const std::uint64_t pp = m.pp == 0 ? 1 : m.pp;
  std::array<std::uint64_t, 4 + 2 * max_model_entries> stages{0, pp - 1, 1, pp >= 2 ? pp - 2 : 0};
  std::size_t n = 4;
  for (const layer_desc& l : model)
    if (l.place == placement::repeated) {
      const std::uint64_t rem = l.count % pp;
      stages[n++] = rem == 0 ? 0 : rem - 1;
      stages[n++] = rem;
    }
  comm_volume best{};
  bool first = true;
  for (std::size_t i = 0; i < n; ++i) {
    if (stages[i] >= pp) continue;
    bool seen = false;
    for (std::size_t j = 0; j < i; ++j) seen = seen || stages[j] == stages[i];
    if (seen) continue;
    const comm_volume c = stage_communication(model, t, m, stages[i]);
    if (first || c.total() > best.total()) best = c;
    first = false;
  }
  return best;
}

}  // namespace memalg

// SPDX-License-Identifier: BSL-1.0
// memalg/plan/model_states.hpp — weights, gradients, master weights and optimizer states of one
// rank, and the transient buffers ZeRO-3 needs to run a layer.
//
// Per rank of pipeline stage `stage` (Ψ_s = the stage's parameters; t, e = tensor- and
// expert-parallel degrees; d = dp·cp, the group ZeRO shards over — Megatron-LM's distributed
// optimizer shards over data- and context-parallel ranks; experts shard over d/e):
//
//   elements on the rank   Ψ_r = ⌈(Ψ_s − Ψ_rep − Ψ_exp)/t⌉ + Ψ_rep + ⌈Ψ_exp/(e·t)⌉
//   ZeRO stage 0           w·Ψ_r + g·Ψ_r + (m + K)·Ψ_r
//   ZeRO stage 1           w·Ψ_r + g·Ψ_r + (m + K)·⌈Ψ_r/d⌉
//   ZeRO stage 2           w·Ψ_r + (g + m + K)·⌈Ψ_r/d⌉
//   ZeRO stage 3           (w + g + m + K)·⌈Ψ_r/d⌉
//
// with w, g, m the bytes of the policy's weight, gradient and master dtypes and K the optimizer's
// state bytes per parameter — the ZeRO paper's formulas (Rajbhandari et al. 2020, §5.1, Figure 1)
// with its K = 12 when m = 4 and Adam keeps two fp32 states. Sharding is per layer entry and
// rounds up, so the most loaded rank is what is reported. Frozen entries have no gradients,
// master weights or optimizer states.
//
// ZeRO-3 runs a layer on gathered weights: during forward (1 + prefetch) layers' worth of the
// largest layer's weights are resident, and during backward also that layer's unsharded gradient
// before its reduce-scatter. DeepSpeed's estimator charges 4·Ψ_largest (two 16-bit copies) for
// the same (deepspeed/runtime/zero/stage3.py, estimate_zero3_model_states_mem_needs).
//
// Offload (ZeRO-Offload, Ren et al. 2021): master weights and optimizer states live in host
// memory; parameter offload (ZeRO-Infinity, stage 3) moves the weight shards there too. The
// gradients stay on the device until reduced.
#pragma once

#include <cstdint>

#include "memalg/model/layer.hpp"
#include "memalg/parallel/mesh.hpp"
#include "memalg/plan/breakdown.hpp"
#include "memalg/train/recipe.hpp"

namespace memalg {

/// Instances of entry `l` held by pipeline stage `stage` of `pp`, and the parameter share of a
/// `spread` entry (numerator over pp). Earlier stages take the remainder of an uneven split.
constexpr std::uint64_t instances_on_stage(const layer_desc& l, std::uint64_t stage, std::uint64_t pp) {
  switch (l.place) {
    case placement::spread: return l.count;  // a parameter mass: split below, not by instance
    case placement::repeated: return l.count / pp + (stage < l.count % pp ? 1 : 0);
    case placement::first_stage: return stage == 0 ? l.count : 0;
    case placement::last_stage: return stage + 1 == pp ? l.count : 0;
  }
  return 0;
}

/// Elements of one instance of `l` held by one tensor/expert-parallel rank.
struct rank_elements {
  std::uint64_t dense = 0;   ///< sharded by ZeRO over dp·cp
  std::uint64_t expert = 0;  ///< sharded by ZeRO over dp·cp/ep
  std::uint64_t matrix = 0;  ///< of dense + expert, in matrices (Adafactor)
  std::uint64_t rows_plus_cols = 0;
  constexpr std::uint64_t total() const { return dense + expert; }
};

constexpr rank_elements elements_per_rank(const layer_desc& l, const mesh_desc& m) {
  using detail::ceil_div;
  std::uint64_t params = l.params, expert = l.expert_params, replicated = l.tp_replicated_params;
  if (l.place == placement::spread) {  // parameter-count model: the stage holds 1/pp of the mass
    params = ceil_div(params, m.pp);
    expert = ceil_div(expert, m.pp);
    replicated = ceil_div(replicated, m.pp);
  }
  rank_elements r{};
  r.expert = ceil_div(expert, m.ep * m.tp);
  r.dense = ceil_div(params - expert - replicated, m.tp) + replicated;
  // Under tensor parallelism an r×c matrix becomes r/t×c or r×c/t, so Σ(r + c) per rank lies
  // between Σ(r + c)/t and Σ(r + c); the unsplit sum is kept (an upper bound; Adafactor's factors
  // are O(r + c), negligible next to Ψ).
  r.matrix = ceil_div(l.matrix_params, m.tp);
  r.rows_plus_cols = l.matrix_rows_plus_cols;
  return r;
}

/// The dtype gradients are kept in: the policy's, except that Megatron-LM accumulates bf16 models'
/// gradients in an fp32 `main_grad` buffer (bf16 turns accumulate_allreduce_grads_in_fp32 on:
/// megatron/training/arguments.py; megatron/core/distributed/param_and_grad_buffer.py).
constexpr dtype gradient_dtype(const training_desc& t) {
  if (t.stack == stack_kind::megatron && t.precision.weights == dtypes::bf16 && t.precision.gradients.bits < 32)
    return dtypes::fp32;
  return t.precision.gradients;
}

/// LoRA's adapters in a dtype of their own (compose.hpp; PEFT keeps them fp32 under a bf16 or fp16
/// base, `autocast_adapter_dtype`): their gradients are in that dtype (AccumulateGrad makes a
/// parameter's .grad like the parameter), and so are torch.optim's states, which are made
/// `zeros_like` the parameter; an fp32 adapter is its own master copy.
constexpr bool own_dtype_adapters(const layer_desc& l) {
  return l.kind == layer_kind::custom && l.shape.lora_rank != 0 && !l.weight_storage.is_none();
}
constexpr dtype entry_gradient_dtype(const layer_desc& l, const training_desc& t) {
  return own_dtype_adapters(l) ? l.weight_storage : gradient_dtype(t);
}

/// Model states and ZeRO-3 transients of one rank of `stage`.
struct stage_model_states {
  breakdown device{};
  breakdown host{};
  bytes gathered_weights{};   ///< ZeRO-3: one gathered layer (largest on the stage)
  bytes gathered_gradient{};  ///< ZeRO-3: that layer's unsharded gradient
  std::uint64_t parameters = 0;  ///< parameters held by the rank before ZeRO sharding
};

constexpr stage_model_states model_states(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                          std::uint64_t stage) {
  using detail::ceil_div;
  const precision_policy& p = t.precision;
  const dtype state = t.optimizer.state_dtype.is_none() ? p.optimizer_states : t.optimizer.state_dtype;
  const std::uint64_t dense_group = m.dp * m.cp;
  const std::uint64_t expert_group = dense_group / m.ep;
  const int z = m.zero_stage;

  stage_model_states s{};
  breakdown states{};
  bytes buffers{};  // module buffers (layer_desc::buffer_bytes): with the weights, on the device
  for (const layer_desc& l : model) {
    const std::uint64_t n = instances_on_stage(l, stage, m.pp);
    if (n == 0) continue;
    const rank_elements e = elements_per_rank(l, m);
    const auto shard = [&](std::uint64_t dense, std::uint64_t expert, bool sharded) {
      return sharded ? ceil_div(dense, dense_group) + ceil_div(expert, expert_group) : dense + expert;
    };
    const dtype wdt = l.weight_storage.is_none() ? p.weights : l.weight_storage;
    s.parameters += e.total() * n;

    // Weights (and the fp8 weight cache of GEMM inputs), sharded only by ZeRO-3.
    const std::uint64_t w_elems = shard(e.dense, e.expert, z >= 3);
    bytes w = storage_bytes(wdt, w_elems);
    if (!p.weight_cache.is_none()) {
      const std::uint64_t gemm = l.kind == layer_kind::parameters ? w_elems : ceil_div(e.matrix, z >= 3 ? dense_group : 1);
      w += storage_bytes(p.weight_cache, gemm) * p.weight_cache_copies;
    }
    states.weights += w * n;
    buffers += bytes{l.buffer_bytes} * n;

    // ZeRO-3 gathers one instance at a time (its tensor-parallel part).
    if (z >= 3) {
      const std::uint64_t g = l.gather_params != 0 ? ceil_div(l.gather_params, m.tp)
                              : l.place == placement::spread ? 0
                                                             : e.total();
      s.gathered_weights = max(s.gathered_weights, storage_bytes(wdt, g));
      if (l.trainable) s.gathered_gradient = max(s.gathered_gradient, storage_bytes(gradient_dtype(t), g));
    }

    if (!l.trainable) continue;
    states.gradients += storage_bytes(entry_gradient_dtype(l, t), shard(e.dense, e.expert, z >= 2)) * n;
    const std::uint64_t opt_elems = shard(e.dense, e.expert, z >= 1);
    const bool own = own_dtype_adapters(l);
    const dtype master = own && wdt.bits >= p.master_weights.bits ? dtypes::none : p.master_weights;
    const dtype entry_state = own && state.block == 0 && state.bits < wdt.bits ? wdt : state;
    states.master_weights += storage_bytes(master, opt_elems) * n;
    const param_shape shape{opt_elems, z >= 1 ? ceil_div(e.matrix, dense_group) : e.matrix,
                            z >= 1 ? ceil_div(e.rows_plus_cols, dense_group) : e.rows_plus_cols};
    states.optimizer_states += optimizer_state_bytes(t.optimizer, entry_state, shape) * n;
  }

  // A dynamic loss scaler's state: one fp32 scale and one int32 growth tracker on every rank
  // (torch.amp.GradScaler; see precision_policy::loss_scaler).
  if (p.loss_scaler && s.parameters != 0) states.optimizer_states += storage_bytes(dtypes::fp32, 2);  // 4 + 4 bytes
  s.device = states;
  if (m.offload != offload_kind::none) {
    s.host.master_weights = states.master_weights;
    s.host.optimizer_states = states.optimizer_states;
    s.device.master_weights = bytes{};
    s.device.optimizer_states = bytes{};
  }
  if (m.offload == offload_kind::params) {
    s.host.weights = states.weights;
    s.device.weights = bytes{};
  }
  s.device.weights += buffers;
  return s;
}

}  // namespace memalg

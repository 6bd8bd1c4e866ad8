// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt_plan_cuda.hpp — what the CUDA runtime implements, and how fast it ran, host side.
//
// The CUDA trainer (exec/gpt_trainer_cuda.cuh) runs the same plans as the CPU trainer
// (exec/gpt_plan.hpp) with two differences, both decided here so that plain g++ can check them:
//   * precision: fp32 and mixed-bf16 (bf16 weights, gradients and activations, fp32 master
//     weights and optimizer states). No fp16: the GPU trainer has no dynamic loss scaler.
//   * multi-rank runs may use bf16: NCCL reduces bf16 (MPI cannot, hence the CPU's fp32 rule).
//   * head width: at most 128 with flash attention, 256 without (the kernels' register tiles).
// Everything else — GPT-2 architecture, optimizers, fused optimizer step, reference kernel
// profile, DP/ZeRO/TP only, ZeRO-3 one layer at a time — is find_runtime_issue's rule.
//
// Throughput is reported as model FLOPs utilisation with llm.c's count (Karpathy, llm.c
// `train_gpt2.cu`, after Chowdhery et al. 2022, PaLM appendix B): 6N + 6·L·C·T flops per trained
// token, N parameters, L layers, C width, T sequence length, over the device's dense bf16 peak.
#pragma once

#include <cstdint>
#include <string_view>

#include "memalg/exec/gpt_plan.hpp"

namespace memalg::exec {

/// The CUDA runtime's reasons are runtime_issue's (it never reports multirank: NCCL reduces bf16).
using cuda_runtime_issue = runtime_issue;

/// The sentence for the CUDA runtime (describe(runtime_issue) speaks of the CPU runtime).
constexpr std::string_view describe_cuda(runtime_issue i) {
  switch (i) {
    case runtime_issue::none: return {};
    case runtime_issue::precision: return "the CUDA runtime implements fp32 and mixed-bf16 (bf16 weights and gradients, fp32 master weights)";
    case runtime_issue::activations: return "the CUDA runtime keeps activations in the weight dtype";
    case runtime_issue::states: return "the CUDA runtime keeps optimizer states in fp32";
    case runtime_issue::optimizer: return "the CUDA runtime implements sgd, momentum, adam and adamw";
    case runtime_issue::unfused: return "the CUDA runtime's optimizer is fused: add train::fused_optimizer to the recipe";
    case runtime_issue::architecture: return "the CUDA runtime trains GPT-2-style models: LayerNorm, GeLU MLP, biases, tied embeddings, learned positions";
    case runtime_issue::heads: return "the CUDA runtime's GPT uses multi-head attention with head width hidden / heads";
    case runtime_issue::chunked: return "the CUDA runtime computes the loss unchunked";
    case runtime_issue::logits: return "the CUDA runtime keeps logits in the weight dtype: set lm_config::logits";
    case runtime_issue::dropout: return "dropout needs flash attention in the CUDA runtime (its naive attention has no probability dropout)";
    case runtime_issue::mesh: return "the CUDA runtime implements data parallelism with ZeRO and tensor parallelism only";
    case runtime_issue::prefetch: return "the CUDA runtime gathers one layer at a time under ZeRO-3: use zero<3, 0>";
    case runtime_issue::multirank: return "the CUDA runtime reduces bf16 with NCCL";  // never reported
    case runtime_issue::offload: return "the CUDA runtime keeps activations in its arena";
    case runtime_issue::head_width: return "the CUDA attention kernels take head widths up to 128 (flash) or 256 (naive)";
    case runtime_issue::vocab: return "the CUDA runtime replicates the embeddings";  // never reported
    case runtime_issue::sequence_parallel: return "the CUDA runtime implements no sequence parallelism";  // never reported (mesh)
  }
  return "unknown";
}

namespace detail {
/// Instantiated with the issue; only the matching assertion fires, with the sentence.
template <runtime_issue I>
struct cuda_runtime_check {
  static_assert(I != runtime_issue::precision, "gpt_run_cuda: the CUDA runtime implements fp32 and mixed-bf16 (bf16 weights and gradients, fp32 master weights)");
  static_assert(I != runtime_issue::activations, "gpt_run_cuda: the CUDA runtime keeps activations in the weight dtype");
  static_assert(I != runtime_issue::states, "gpt_run_cuda: the CUDA runtime keeps optimizer states in fp32");
  static_assert(I != runtime_issue::optimizer, "gpt_run_cuda: the CUDA runtime implements sgd, momentum, adam and adamw");
  static_assert(I != runtime_issue::unfused, "gpt_run_cuda: the CUDA runtime's optimizer is fused: add train::fused_optimizer to the recipe");
  static_assert(I != runtime_issue::architecture, "gpt_run_cuda: the CUDA runtime trains GPT-2-style models: LayerNorm, GeLU MLP, biases, tied embeddings, learned positions");
  static_assert(I != runtime_issue::heads, "gpt_run_cuda: the CUDA runtime's GPT uses multi-head attention with head width hidden / heads");
  static_assert(I != runtime_issue::chunked, "gpt_run_cuda: the CUDA runtime computes the loss unchunked");
  static_assert(I != runtime_issue::logits, "gpt_run_cuda: the CUDA runtime keeps logits in the weight dtype: set lm_config::logits");
  static_assert(I != runtime_issue::dropout, "gpt_run_cuda: dropout needs flash attention in the CUDA runtime (its naive attention has no probability dropout)");
  static_assert(I != runtime_issue::mesh, "gpt_run_cuda: the CUDA runtime implements data parallelism with ZeRO and tensor parallelism only");
  static_assert(I != runtime_issue::prefetch, "gpt_run_cuda: the CUDA runtime gathers one layer at a time under ZeRO-3: use zero<3, 0>");
  static_assert(I != runtime_issue::offload, "gpt_run_cuda: the CUDA runtime keeps activations in its arena");
  static_assert(I != runtime_issue::head_width, "gpt_run_cuda: the CUDA attention kernels take head widths up to 128 (flash) or 256 (naive)");
  static constexpr bool value = I == runtime_issue::none;
};
}  // namespace detail

/// The first reason the CUDA runtime cannot run a configuration (runtime_issue::none if it can).
constexpr runtime_issue find_cuda_runtime_issue(const lm_config& c, const training_desc& t, const mesh_desc& m) {
  const precision_policy& p = t.precision;
  const bool fp32 = p.weights == dtypes::fp32 && p.gradients == dtypes::fp32 && p.master_weights.is_none();
  const bool mixed_bf16 = p.weights == dtypes::bf16 && p.gradients == dtypes::bf16 && p.master_weights == dtypes::fp32;
  if (!fp32 && !mixed_bf16) return runtime_issue::precision;
  const runtime_issue shared = find_runtime_issue(c, t, m);
  if (shared == runtime_issue::multirank) {  // NCCL reduces bf16; offload is checked after it
    if (t.offload_activations) return runtime_issue::offload;
  } else if (shared != runtime_issue::none) {
    return shared;
  }
  const std::uint64_t head_width = c.heads != 0 ? c.hidden / c.heads : 0;
  if (head_width == 0 || head_width > (c.flash ? 128u : 256u)) return runtime_issue::head_width;
  return runtime_issue::none;
}

// ---- throughput ---------------------------------------------------------------------------------

/// Parameters of the whole (unsharded) GPT the runtime trains: tied embeddings, learned positions,
/// biases and two LayerNorms per block, a final LayerNorm.
constexpr std::uint64_t gpt_parameters(const lm_config& c) {
  const std::uint64_t C = c.hidden, F = c.ffn != 0 ? c.ffn : 4 * c.hidden;
  const std::uint64_t block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (F * C + F) + (C * F + C);
  return c.vocab * C + c.positions * C + c.layers * block + 2 * C;
}

/// Training FLOPs per token, llm.c's count: 6N (forward + backward of every weight) + 6·L·C·T
/// (attention scores and their weighted sum, forward + backward, no causal discount).
constexpr double flops_per_token(const lm_config& c, std::uint64_t sequence) {
  return 6.0 * static_cast<double>(gpt_parameters(c)) +
         6.0 * static_cast<double>(c.layers) * static_cast<double>(c.hidden) * static_cast<double>(sequence);
}

/// Dense (no sparsity) bf16 tensor-core peak of a device, in FLOP/s, from the vendors' data sheets;
/// 0 when the name is not known (then pass --peak-tflops). Matched on substrings of the name the
/// driver reports (cudaDeviceProp::name).
constexpr double dense_bf16_peak_flops(std::string_view device_name) {
  struct entry {
    std::string_view needle;
    double tflops;
  };
  // NVIDIA data sheets: H100/H200 SXM 989.4 (1979 with sparsity), H100 PCIe 756, H100 NVL 835, H200 NVL 835.5,
  // A100 312, L40S 362, L4 121, A10 125, B200 2250, RTX 4090 165 (fp32 accumulate), RTX 3090 71.
  constexpr entry table[] = {
      {"H200 NVL", 835.5}, {"H200", 989.4}, {"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"H100", 989.4}, {"GH200", 989.4},
      {"B200", 2250.0}, {"A100", 312.0},     {"L40S", 362.0},     {"L4", 121.0},   {"A10", 125.0},
      {"4090", 165.2},  {"3090", 71.0},
  };
  for (const entry& e : table)
    if (device_name.find(e.needle) != std::string_view::npos) return e.tflops * 1e12;
  return 0.0;
}

/// Model FLOPs utilisation of `tokens_per_s` trained tokens per second on `devices` devices.
constexpr double model_flops_utilisation(const lm_config& c, std::uint64_t sequence, double tokens_per_s,
                                         double peak_flops_per_device, std::uint64_t devices) {
  if (peak_flops_per_device <= 0 || devices == 0) return 0.0;
  return flops_per_token(c, sequence) * tokens_per_s / (peak_flops_per_device * static_cast<double>(devices));
}

}  // namespace memalg::exec

// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/plan_cuda.hpp — what the CUDA runtime implements, and how fast it ran, host side.
//
// The CUDA runtime (backend/cuda/gpt_run.cuh: the plan's step program on the CUDA step backend,
// backend/cuda/step_backend.cuh) runs the same plans as the CPU runtime (exec/gpt/plan.hpp) with
// these differences, all decided here so that plain g++ can check them:
//   * precision: fp32 and mixed-bf16 (bf16 weights, gradients and activations, fp32 master
//     weights and optimizer states). No fp16: the GPU backend has no dynamic loss scaler.
//   * head width: at most 128 with flash attention, 256 without (the kernels' register tiles).
// Everything else is find_cpu_runtime_issue's rule: GPT-2 architecture and its Llama-style
// variants (llama_style: RMSNorm, SwiGLU, rotary, grouped-query flash attention, no or q/k/v-only
// biases, Qwen3's per-head QK-norm, parallel residual and a shared norm, whose lowering uses the
// sequential block's ops),
// optimizers, fused optimizer step, DP/ZeRO/TP, 1F1B pipeline stages (fp32, untied
// output: find_cpu_pipeline_issue), ZeRO-3 one layer at a time, the
// vocabulary-parallel embedding (vocabulary divisible by tp) and sequence parallelism (GPT-2-style
// fp32 plans without selective recomputation), and find_cpu_plan_issue's chunked-loss limit.
//
// Throughput is reported as model FLOPs utilisation with llm.c's count (Karpathy, llm.c
// `train_gpt2.cu`, after Chowdhery et al. 2022, PaLM appendix B): 6N + 6·L·C·T flops per trained
// token, N parameters, L layers, C width, T sequence length, over the device's dense bf16 peak.
#pragma once

#include <cstdint>
#include <string_view>

#include "memalg/exec/gpt/plan.hpp"

namespace memalg::exec {

/// The first reason the CUDA runtime cannot run a configuration (runtime_issue::none if it can).
constexpr runtime_issue find_cuda_runtime_issue(const lm_config& c, const training_desc& t, const mesh_desc& m) {
  const precision_policy& p = t.precision;
  const bool fp32 = p.weights == dtypes::fp32 && p.gradients == dtypes::fp32 && p.master_weights.is_none();
  const bool mixed_bf16 = p.weights == dtypes::bf16 && p.gradients == dtypes::bf16 && p.master_weights == dtypes::fp32;
  if (!fp32 && !mixed_bf16) return runtime_issue::precision;
  const runtime_issue shared = find_cpu_runtime_issue(c, t, m);  // the step program's rule
  if (shared != runtime_issue::none) return shared;
  const std::uint64_t head_width = c.head_dim != 0 ? c.head_dim : (c.heads != 0 ? c.hidden / c.heads : 0);
  if (head_width == 0 || head_width > (c.flash ? 128u : 256u)) return runtime_issue::head_width;
  return runtime_issue::none;
}

/// The CUDA runtime's rule for a plan (exec/gpt/plan.hpp, find_plan_issue).
template <class Plan>
constexpr runtime_issue find_cuda_plan_issue() {
  return find_plan_issue<Plan>(&find_cuda_runtime_issue);
}

/// The host side of the CUDA trainer a plan instantiates: `value` is true, and it does not compile
/// for a plan that does not fit (require_fits) or that the CUDA runtime does not implement (the
/// static_assert carries describe_cuda's sentence after "gpt_run_cuda: "). Plain g++ compiles it.
template <class Plan>
struct gpt_run_cuda_check {
  static constexpr lm_config model_config = detail::config_of<typename Plan::model_type>::value;
  static constexpr cuda_runtime_issue issue = find_cuda_plan_issue<Plan>();
  static_assert(detail::cuda_runtime_check<issue>::value, "gpt_run_cuda: the CUDA runtime does not implement this plan");
  static_assert(require_fits<Plan>());
  static constexpr bool value = true;
};

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

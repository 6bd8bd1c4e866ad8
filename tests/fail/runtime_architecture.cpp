// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: the CPU runtime trains GPT-2-style models \(LayerNorm, GeLU MLP, biases, tied embeddings, learned positions\) and Llama-style variants \(RMSNorm, SwiGLU, no or q/k/v-only biases, tied or untied output, rotary positions over all or an even part of each head, parallel residual, a norm shared by a parallel block, Qwen3's per-head QK-norm in RMSNorm blocks, Gemma 2's norms around the sub-layers, GeGLU, softcapping \(of the logits on one tensor-parallel rank\), alternating sliding windows and scaled embedding\), without mixture of experts
// A shared norm in a sequential block (one norm before attention and again before the MLP): Falcon
// shares its norm only between parallel branches, and the runtime's block has no such variant.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
struct cfg {
  static constexpr m::lm_config value = [] {
    m::lm_config c = fail_runtime::gpt();
    c.rms_norm = true;
    c.shared_norm = true;
    return c;
  }();
};
using run = m::exec::gpt_run<fail_runtime::plan<cfg>,
                              m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

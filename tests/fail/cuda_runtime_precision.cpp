// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run_cuda: the CUDA runtime implements fp32 and mixed-bf16 \(bf16 weights and gradients, fp32 master weights\)
// amp-fp16 with fp16 logits: the CPU runtime trains it (dynamic loss scaling), the CUDA runtime
// has no loss scaler (exec/gpt/plan_cuda.hpp, host side).
#include <memalg/exec/gpt/plan_cuda.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
struct cfg {
  static constexpr m::lm_config value = [] {
    m::lm_config c = fail_runtime::gpt();
    c.logits = m::dtypes::fp16;
    c.flash = true;
    return c;
  }();
};
constexpr bool checked = m::exec::gpt_run_cuda_check<fail_runtime::plan<cfg, m::precision::amp_fp16>>::value;
int main() { return checked ? 0 : 1; }

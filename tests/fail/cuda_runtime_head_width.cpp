// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run_cuda: the CUDA attention kernels take head widths up to 128 \(flash\) or 256 \(naive\)
// One head of width 192 under flash attention: the CPU runtime takes it, the CUDA kernels'
// register tiles do not (exec/gpt/plan_cuda.hpp, host side).
#include <memalg/exec/gpt/plan_cuda.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
struct cfg {
  static constexpr m::lm_config value = [] {
    m::lm_config c = fail_runtime::gpt();
    c.hidden = 192;
    c.heads = 1;
    c.flash = true;
    return c;
  }();
};
constexpr bool checked = m::exec::gpt_run_cuda_check<fail_runtime::plan<cfg>>::value;
int main() { return checked ? 0 : 1; }

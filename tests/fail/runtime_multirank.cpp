// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: multi-rank runs reduce in fp32: use the fp32 policy with dp or tp above 1
// mixed-bf16 on 2 data-parallel ranks: MPI reduces no 16-bit float, so multi-rank runs are fp32.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
struct cfg {
  static constexpr m::lm_config value = [] {
    m::lm_config c = fail_runtime::gpt();
    c.logits = m::dtypes::bf16;
    return c;
  }();
};
using run = m::exec::gpt_run<fail_runtime::plan<cfg, m::precision::mixed_bf16, m::optim::adamw<>,
                                  m::parallel::mesh<m::parallel::data<2>>>,
                              m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

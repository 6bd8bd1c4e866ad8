// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: the CPU runtime keeps logits in the weight dtype: set lm_config::logits
// bf16 logits under the fp32 policy: the CPU runtime keeps logits in the weight dtype.
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
using run = m::exec::gpt_run<fail_runtime::plan<cfg>,
                              m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: dropout needs flash attention in the CPU runtime \(its naive attention has no probability dropout\)
// Dropout 0.1 with naive attention, which has no dropout of the attention probabilities.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
struct cfg {
  static constexpr m::lm_config value = [] {
    m::lm_config c = fail_runtime::gpt();
    c.dropout_permille = 100;
    return c;
  }();
};
using run = m::exec::gpt_run<fail_runtime::plan<cfg>,
                              m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

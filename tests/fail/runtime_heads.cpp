// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: the CPU runtime's GPT uses multi-head attention with head width hidden / heads \(grouped-query attention and other head widths: Llama-style models with flash attention\)
// 2 key/value heads for 4 under naive attention: grouped-query attention needs flash attention.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
struct cfg {
  static constexpr m::lm_config value = [] {
    m::lm_config c = fail_runtime::gpt();
    c.kv_heads = 2;
    return c;
  }();
};
using run = m::exec::gpt_run<fail_runtime::plan<cfg>,
                              m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

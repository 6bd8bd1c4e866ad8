// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: the CPU runtime computes the loss unchunked
// A loss computed 16 rows of logits at a time: the CPU runtime's loss takes them all at once.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
struct cfg {
  static constexpr m::lm_config value = [] {
    m::lm_config c = fail_runtime::gpt();
    c.loss_chunk = 16;
    return c;
  }();
};
using run = m::exec::gpt_run<fail_runtime::plan<cfg>,
                              m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

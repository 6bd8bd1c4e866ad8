// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: the CPU runtime keeps optimizer states in fp32
// AdamW with bf16 moments: the CPU runtime's optimizer states are fp32.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
using run = m::exec::gpt_run<fail_runtime::plan<fail_runtime::gpt_config, m::precision::fp32, m::optim::adamw<m::optim::bf16_states>>,
                              m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

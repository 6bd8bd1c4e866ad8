// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: the CPU runtime keeps activations in the weight dtype
// autocast-bf16 saves bf16 activations of fp32 weights: the CPU runtime saves them in the weight
// dtype.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
using run = m::exec::gpt_run<fail_runtime::plan<fail_runtime::gpt_config, m::precision::autocast_bf16>,
                              m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

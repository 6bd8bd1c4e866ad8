// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: the CPU runtime implements sgd, momentum, adam and adamw
// Lion: not one of the CPU runtime's optimizers.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
using run = m::exec::gpt_run<fail_runtime::plan<fail_runtime::gpt_config, m::precision::fp32, m::optim::lion<>>,
                              m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

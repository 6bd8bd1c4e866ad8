// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: the CPU runtime gathers one layer at a time under ZeRO-3: use zero<3, 0>
// ZeRO-3 gathering one layer ahead: the CPU runtime gathers only the layer in use.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
using run = m::exec::gpt_run<fail_runtime::plan<fail_runtime::gpt_config, m::precision::fp32, m::optim::adamw<>,
                                  m::parallel::mesh<m::parallel::data<2, m::parallel::zero<3, 1>>>>,
                              m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: the CPU runtime's optimizer is fused: add train::fused_optimizer to the recipe
// The default (PyTorch) stack plans an unfused optimizer step (an upcast copy of the gradients);
// the CPU runtime's step is fused.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
using unfused = m::plan<m::exec::runtime_gpt<fail_runtime::gpt_config>,
                        m::train::recipe<m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                        m::parallel::mesh<>, fail_runtime::budget>;
using run = m::exec::gpt_run<unfused, m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

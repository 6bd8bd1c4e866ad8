// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: the CPU runtime implements data parallelism with ZeRO, tensor parallelism and 1F1B pipeline parallelism only
// ZeRO-Offload (optimizer states in host memory) over 2 data-parallel ranks: not a CPU runtime mesh.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
using run = m::exec::gpt_run<fail_runtime::plan<fail_runtime::gpt_config, m::precision::fp32, m::optim::adamw<>,
                                  m::parallel::mesh<m::parallel::data<2, m::parallel::zero<2>>, m::parallel::offload_optimizer>>,
                              m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

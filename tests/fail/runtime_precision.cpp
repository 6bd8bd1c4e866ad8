// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: the CPU runtime implements fp32, amp-fp16 and mixed-bf16 \(gradients in the weight dtype, fp32 master\)
// amp-bf16 accumulates fp32 gradients for bf16 weights: the CPU runtime keeps gradients in the
// weight dtype.
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
using run = m::exec::gpt_run<fail_runtime::plan<fail_runtime::gpt_config, m::precision::amp_bf16>,
                              m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

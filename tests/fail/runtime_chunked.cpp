// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: the CPU runtime's chunked loss runs on a replicated output layer: under tensor parallelism plan over exec::runtime_gpt_replicated, without sequence parallelism
// A chunked loss on 2 tensor-parallel ranks of the vocabulary-parallel model: the program chunks
// the unsharded head only.
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
using run = m::exec::gpt_run<fail_runtime::plan<cfg, m::precision::fp32, m::optim::adamw<>,
                                                m::parallel::mesh<m::parallel::tensor<2>>>,
                              m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

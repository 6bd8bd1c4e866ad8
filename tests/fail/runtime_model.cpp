// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run: the CPU runtime trains decoder-only language models read off the plan's layer descriptors
// A model of layer types without its final norm: not the decoder-only language model the runtime
// reads off a plan (exec::read_decoder_lm).
#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/model/compose.hpp>

#include "runtime_plan.hpp"

namespace m = memalg;
namespace mm = memalg::model;
namespace o = memalg::model::opt;
using block = mm::transformer_block<32, 4, 88, o::rmsnorm, o::swiglu, o::no_bias, o::flash, o::rotary>;
using no_final_norm = mm::sequential<mm::embedding<64, 32>, mm::repeat<2, block>, mm::output<32, 64>>;
using plan = m::plan<no_final_norm,
                     m::train::recipe<m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>,
                                      m::train::reference_kernels>,
                     m::parallel::mesh<>, fail_runtime::budget>;
using run = m::exec::gpt_run<plan, m::backend::cpu::local_communicator>;
int main() { return static_cast<int>(run::issue); }

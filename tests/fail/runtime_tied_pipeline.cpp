// SPDX-License-Identifier: BSL-1.0
// expect: pipeline stages run 1F1B in fp32 with an untied output layer
// The CPU runtime's pipeline stages hold no copy of a tied token embedding on the last stage (nor
// does the planner count one), so a tied model is refused for pp > 1.
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/backend/cpu/gpt_run.hpp>
using namespace memalg;
using namespace memalg::literals;
struct budget {
  static constexpr device_desc value{"cpu", 1_GiB, bytes{}};
};
struct tied_gpt {
  static constexpr lm_config value = [] {
    lm_config c{};
    c.layers = 2;
    c.hidden = 32;
    c.heads = 4;
    c.vocab = 64;
    c.positions = 32;
    c.logits = dtypes::fp32;
    return c;
  }();
};
using p = plan<exec::runtime_gpt<tied_gpt>,
               train::recipe<precision::fp32, optim::adamw<>, train::batch<2, 16>, train::reference_kernels>,
               parallel::mesh<parallel::pipeline<2>>, budget>;
constexpr exec::arena_sizes arena = exec::gpt_run<p, backend::cpu::local_communicator>::arena;
int main() { return arena.stack == 0 ? 1 : 0; }

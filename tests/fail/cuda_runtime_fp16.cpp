// SPDX-License-Identifier: BSL-1.0
// expect: gpt_run_cuda: the CUDA runtime implements fp32 and mixed-bf16
// The CUDA runtime has no dynamic loss scaler: an fp16 plan is refused at compile time with the
// sentence, by the rule backend/cuda/gpt_run.cuh asserts (exec/gpt_plan_cuda.hpp, host-side).
#include <memalg/exec/gpt_plan_cuda.hpp>
using namespace memalg;
constexpr lm_config gpt() {
  lm_config c{};
  c.layers = 2;
  c.hidden = 64;
  c.heads = 4;
  c.vocab = 256;
  c.positions = 64;
  c.logits = dtypes::fp16;
  c.flash = true;
  return c;
}
using recipe = train::recipe<precision::amp_fp16, optim::adamw<>, train::batch<4, 64>, train::reference_kernels>;
constexpr exec::runtime_issue issue = exec::find_cuda_runtime_issue(gpt(), recipe::value, parallel::mesh<>::value);
static_assert(exec::detail::cuda_runtime_check<issue>::value);
int main() { return 0; }

// SPDX-License-Identifier: BSL-1.0
// GPU test of the generation program (exec/gpt/build_generation.hpp) on the CUDA step backend:
// the very program the CPU runs, laid out in memalg's serving plan's arena (plan/serve.hpp,
// serve_stack::memalg). The interpreter's meter must measure the plan's arena to the byte on the
// device as on the host, and greedy generation must choose the CPU backend's tokens (fp32; in
// bf16 the two backends round differently, so the first choice of every sequence is compared and
// the later agreement reported).
// Its own executable: step_backend.cuh defines kernels that are not templates.

#include <doctest/doctest.h>

#include <cstdio>
#include <vector>

#include "gpt_plans.hpp"
#include "memalg/backend/cpu/gpt_run.hpp"
#include "memalg/backend/cpu/local_communicator.hpp"
#include "memalg/backend/cuda/gpt_run.cuh"
#include "memalg/backend/cuda/local_communicator.cuh"
#include "memalg/backend/cuda/step_backend.cuh"
#include "memalg/exec/gpt/generation_plan.hpp"
#include "memalg/exec/meter.hpp"
#include "memalg/exec/run.hpp"

namespace {

namespace cu = memalg::backend::cuda;
namespace cpu = memalg::backend::cpu;
namespace ex = memalg::exec;
namespace m = memalg;
using table = gpt_plans::on<gpt_plans::cpu_budget>;

struct generated_run {
  std::vector<std::int32_t> ids;
  std::size_t measured = 0;
};

template <class Backend>
generated_run generate(const ex::program& p, Backend& b, const std::vector<std::int32_t>& prompt) {
  generated_run r;
  r.ids.assign(p.generated_per_micro, -1);
  ex::live_bytes_meter meter(p);
  ex::run_state s;
  ex::run(p, b, ex::step_io{prompt, {}, {}, {}, r.ids}, s, meter);
  r.measured = meter.high_water();
  return r;
}

template <class Named>
void check_generation(const ex::generation_request& req, bool exact) {
  using plan = typename Named::plan;
  using run = ex::gpt_run<plan, cpu::local_communicator>;
  using T = typename run::storage;                                   // the CPU's storage type
  using D = typename cu::detail::plan_storage<plan>::type;          // the device's, of the same width
  CAPTURE(Named::name);
  CAPTURE(req.batch);
  CAPTURE(req.prompt);
  CAPTURE(req.new_tokens);
  const ex::planned_generation g = ex::plan_generation(plan::model, req, plan::training.precision.weights, plan::device);
  const ex::program p =
      ex::build_generation(run::config, req, g.arena, g.cache, cpu::step_backend<T, cpu::local_communicator>::storage_elem);
  std::vector<std::int32_t> prompt(req.batch * req.prompt);
  for (std::size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<std::int32_t>(m::splitmix64(977 + i) % run::config.vocab);

  cpu::local_communicator hdp, htp;
  cpu::step_backend<T, cpu::local_communicator> host(p, hdp, htp);
  const generated_run on_cpu = generate(p, host, prompt);
  cu::local_device_communicator ddp, dtp;
  cu::step_backend<D, cu::local_device_communicator> device(p, ddp, dtp);
  const generated_run on_gpu = generate(p, device, prompt);

  CHECK(on_cpu.measured == g.arena_bytes());
  CHECK(on_gpu.measured == g.arena_bytes());
  std::size_t same = 0;
  for (std::size_t i = 0; i < on_gpu.ids.size(); ++i) {
    CHECK((on_gpu.ids[i] >= 0 && static_cast<std::size_t>(on_gpu.ids[i]) < run::config.vocab));
    same += on_gpu.ids[i] == on_cpu.ids[i] ? 1 : 0;
  }
  if (exact) CHECK(on_gpu.ids == on_cpu.ids);
  else
    for (std::size_t b = 0; b < req.batch; ++b) CHECK(on_gpu.ids[b] == on_cpu.ids[b]);  // the prefill's choice
  std::printf("generation on the GPU: %s, %zu x (%zu + %zu) tokens: arena %zu = plan, %zu of %zu ids as the CPU's\n",
              Named::name.data(), req.batch, req.prompt, req.new_tokens, on_gpu.measured, same, on_gpu.ids.size());
}

}  // namespace

TEST_CASE("generation program on the CUDA backend: the plan's arena, the CPU's tokens") {
  // GPT-2's block with naive attention and learned positions; Llama's and Qwen3's with flash
  // attention, rotary positions, grouped keys and values (and QK-norms); in fp32 and bf16.
  check_generation<table::tiny_fp32>({3, 17, 8}, true);
  check_generation<table::llama_fp32_plan>({2, 40, 12}, true);
  check_generation<table::qwen3_fp32_plan>({2, 33, 16}, true);
  check_generation<table::llama_bf16_plan>({2, 40, 12}, false);
  check_generation<table::qwen3_bf16_plan>({4, 24, 8}, false);
}

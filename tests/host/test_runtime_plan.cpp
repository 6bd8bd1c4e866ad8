// SPDX-License-Identifier: BSL-1.0
// The CPU runtime against its plan: for every configuration of the matrix, the arena the trainer
// allocates is the plan's prediction (by construction) and the high-water mark of everything it
// holds during real training steps equals the plan's peak, category by category, to the byte.
// Also: checkpoints resume bit-identically, and recomputation does not change the numbers.
#include <doctest/doctest.h>

#include "runtime_plans.hpp"

#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include <cstring>
#include <filesystem>
#include <vector>

namespace m = memalg;
using namespace memalg::literals;
using comm = m::backend::cpu::local_communicator;

namespace {
using namespace memalg_test;



template <class Plan>
void check_exact() {
  using run = m::exec::gpt_run<Plan, comm>;
  comm dp, tp;
  typename run::trainer trainer(run::config, run::arena, dp, tp);
  const std::size_t n = run::config.micro_batch * run::config.sequence * run::config.grad_accum;
  float first = 0, last = 0;
  for (int s = 0; s < 3; ++s) {  // the same batch each step: the loss must fall
    last = trainer.train_step(ids(n, 0), ids(n, 1));
    if (s == 0) first = last;
  }
  CHECK(last < first);
  const auto& mem = trainer.memory();
  const m::breakdown& plan = Plan::result.per_rank;
  // The live-bytes meter reaches the plan, and the plan is tight: 16 bytes less is refused.
  CAPTURE(trainer.meter().peak_op());
  CHECK(trainer.meter().high_water() == (plan.total() - plan.reserve).value);
  CHECK(short_plan_refused(run::config, run::arena));
  CHECK(mem.persistent_used() == Plan::result.most_loaded.at[0].model_states().value);
  CHECK(mem.high_water() == (plan.total() - plan.reserve).value);
  // Model states category by category; the recomputed layers count as activations or
  // temporaries depending on who holds their input, so those two are compared as a sum.
  const m::breakdown& got = mem.peak_by_category();
  CHECK(got.weights == plan.weights);
  CHECK(got.gradients == plan.gradients);
  CHECK(got.master_weights == plan.master_weights);
  CHECK(got.optimizer_states == plan.optimizer_states);
  CHECK(got.comm_buffers == plan.comm_buffers);
  CHECK(got.activations + got.temporaries == plan.activations + plan.temporaries);
  if (Plan::training.recompute != m::recompute_kind::every_k) {
    CHECK(got.activations == plan.activations);
    CHECK(got.temporaries == plan.temporaries);
  }
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("the arena's high-water mark equals the plan's peak, to the byte", Plan, runtime_exact) { check_exact<Plan>(); }
TEST_CASE_TEMPLATE_APPLY(runtime_exact, runtime_matrix);

TEST_CASE("recomputation changes the memory, not the numbers") {
  using none = plan_for<flash32, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>;
  using full = plan_for<flash32, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::full>;
  using every = plan_for<flash32, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::every<2>>;
  using sel = plan_for<flash32, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>;
  const auto [l0, m0] = losses_and_peak<none, comm>(4);
  const auto [l1, m1] = losses_and_peak<full, comm>(4);
  const auto [l2, m2] = losses_and_peak<every, comm>(4);
  const auto [l3, m3] = losses_and_peak<sel, comm>(4);
  CHECK(l0 == l1);  // bit-identical: the same kernels on the same inputs, dropout masks included
  CHECK(l0 == l2);
  CHECK(l0 == l3);
  CHECK(m1 < m0);
  CHECK(m2 < m0);
  // With flash attention selective recomputation drops only the log-sum-exp, and rebuilding it
  // rewrites the attention output; but a block's backward rebuilds it only after releasing its MLP
  // tensors (exec/gpt/build_program.hpp, block_backward), so the peak falls a little; with naive
  // attention it drops the scores.
  CHECK(m3 < m0);
  CHECK(m3 > m1);
  using naive_none = plan_for<naive32, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>;
  using naive_sel = plan_for<naive32, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>;
  CHECK(naive_sel::peak < naive_none::peak);
}

TEST_CASE("save and resume continue bit-identically") {
  using plan = plan_for<flash_fp16, m::precision::amp_fp16, m::optim::adamw<>, m::train::batch<2, 16>>;
  using run = m::exec::gpt_run<plan, comm>;
  const std::filesystem::path file = std::filesystem::temp_directory_path() / ("memalg_resume_" + std::to_string(::getpid()) + ".ckpt");
  comm dp, tp;
  std::vector<float> straight;
  {
    typename run::trainer t(run::config, run::arena, dp, tp);
    for (int s = 0; s < 6; ++s) straight.push_back(t.train_step(ids(32, s), ids(32, s + 1)));
  }
  std::vector<float> resumed;
  {
    typename run::trainer t(run::config, run::arena, dp, tp);
    for (int s = 0; s < 3; ++s) resumed.push_back(t.train_step(ids(32, s), ids(32, s + 1)));
    t.store_counters();
    auto sections = t.state_sections();
    m::exec::save_checkpoint(file, "test", 3, sections);
  }
  {
    typename run::trainer t(run::config, run::arena, dp, tp);
    auto sections = t.state_sections();
    CHECK(m::exec::load_checkpoint(file, "test", sections) == 3);
    t.restore_counters();
    for (int s = 3; s < 6; ++s) resumed.push_back(t.train_step(ids(32, s), ids(32, s + 1)));
  }
  std::filesystem::remove(file);
  REQUIRE(resumed.size() == straight.size());
  CHECK(std::memcmp(resumed.data(), straight.data(), straight.size() * sizeof(float)) == 0);
}

TEST_CASE("plans the CPU runtime does not implement are named") {
  using m::exec::find_runtime_issue;
  using m::exec::runtime_issue;
  m::training_desc t = m::train::recipe<m::precision::amp_bf16, m::optim::adamw<>, m::train::reference_kernels>::value;
  m::mesh_desc mesh{};
  CHECK(find_runtime_issue(naive32::value, t, mesh) == runtime_issue::precision);
  t = m::train::recipe<m::precision::fp32, m::optim::adamw<>>::value;
  CHECK(find_runtime_issue(naive32::value, t, mesh) == runtime_issue::unfused);
  t = m::train::recipe<m::precision::fp32, m::optim::lion<>, m::train::reference_kernels>::value;
  CHECK(find_runtime_issue(naive32::value, t, mesh) == runtime_issue::optimizer);
  t = m::train::recipe<m::precision::fp32, m::optim::adamw<>, m::train::reference_kernels>::value;
  mesh.pp = 2;
  CHECK(find_runtime_issue(naive32::value, t, mesh) == runtime_issue::mesh);  // the shared rule without the step program's pipelines
  // The CPU runtime's pipeline stages: untied output, fp32, 1F1B, ZeRO-0/1, no full recomputation.
  m::lm_config untied = naive32::value;
  untied.tied = false;
  CHECK(m::exec::find_cpu_runtime_issue(naive32::value, t, mesh) == runtime_issue::pipeline);
  CHECK(m::exec::find_cpu_runtime_issue(untied, t, mesh) == runtime_issue::none);
  m::training_desc full = t;
  full.recompute = m::recompute_kind::full;
  CHECK(m::exec::find_cpu_runtime_issue(untied, full, mesh) == runtime_issue::pipeline);
  m::mesh_desc gpipe = mesh;
  gpipe.schedule = m::pipeline_schedule::gpipe;
  CHECK(m::exec::find_cpu_runtime_issue(untied, t, gpipe) == runtime_issue::pipeline);
  m::mesh_desc zero2 = mesh;
  zero2.dp = 2;
  zero2.world = 4;
  zero2.zero_stage = 2;
  CHECK(m::exec::find_cpu_runtime_issue(untied, t, zero2) == runtime_issue::pipeline);
  zero2.zero_stage = 1;
  CHECK(m::exec::find_cpu_runtime_issue(untied, t, zero2) == runtime_issue::none);
  m::mesh_desc tp2 = mesh;
  tp2.tp = 2;
  CHECK(m::exec::find_cpu_runtime_issue(untied, t, tp2) == runtime_issue::pipeline);
  m::training_desc bf16 = m::train::recipe<m::precision::mixed_bf16, m::optim::adamw<>, m::train::reference_kernels>::value;
  CHECK(m::exec::find_cpu_runtime_issue(untied, bf16, mesh) == runtime_issue::logits);  // the rest of the rule first
  m::lm_config untied_bf16 = untied;
  untied_bf16.logits = m::dtypes::bf16;
  CHECK(m::exec::find_cpu_runtime_issue(untied_bf16, bf16, m::mesh_desc{}) == runtime_issue::none);  // one rank: allowed
  CHECK(m::exec::find_cpu_runtime_issue(untied_bf16, bf16, mesh) == runtime_issue::pipeline);
  // Llama-style blocks in a pipeline, with data parallelism too (mpi.pipeline.np4: llama-pp2-dp2).
  m::lm_config rms = untied;
  rms.rms_norm = true;
  CHECK(m::exec::find_cpu_runtime_issue(rms, t, mesh) == runtime_issue::none);
  CHECK(m::exec::find_cpu_runtime_issue(rms, t, zero2) == runtime_issue::none);
  CHECK(m::exec::describe(runtime_issue::mesh) == "the CPU runtime implements data parallelism with ZeRO, tensor parallelism and 1F1B pipeline parallelism only");
}

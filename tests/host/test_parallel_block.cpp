// SPDX-License-Identifier: BSL-1.0
// Parallel-residual blocks (GPT-NeoX, Falcon: y = x + attn(ln1(x)) + mlp(ln2(x)), one shared norm) on the CPU step program.
//
// The arena's high-water mark and its categories equal the plan's peak (fp32 and mixed-bf16,
// dropout, recomputation none / selective / full, accumulation), the loss falls, the block's unit
// is the planner's parameter count (one norm when shared), and the backend's gradients of every
// tensor of both blocks match central differences of the loss; on meshes (tp2, dp2 ZeRO-3, dp2 × tp2
// ZeRO-2, two 1F1B pipeline stages) every rank's layout reaches its plan.
#include <doctest/doctest.h>

#include "runtime_plans.hpp"

#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/exec/gpt/build_program.hpp>
#include <memalg/exec/null_backend.hpp>

#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace m = memalg;
using comm = m::backend::cpu::local_communicator;

namespace {
using namespace memalg_test;

struct neox { static constexpr m::lm_config value = small_neox(m::dtypes::fp32, 0); };
struct neox_drop { static constexpr m::lm_config value = small_neox(m::dtypes::fp32, 100); };
struct neox_bf16 { static constexpr m::lm_config value = small_neox(m::dtypes::bf16, 0); };
struct neox_bf16_drop { static constexpr m::lm_config value = small_neox(m::dtypes::bf16, 100); };
struct falcon { static constexpr m::lm_config value = small_falcon(m::dtypes::fp32, 0); };
struct falcon_drop { static constexpr m::lm_config value = small_falcon(m::dtypes::fp32, 100); };
struct falcon_bf16_drop { static constexpr m::lm_config value = small_falcon(m::dtypes::bf16, 100); };
// A parallel block with RMSNorm and SwiGLU (a Llama-style block with GPT-J's residual), naive
// multi-head attention.
struct parallel_llama {
  static constexpr m::lm_config value = [] {
    m::lm_config c = small_llama(m::dtypes::fp32);
    c.flash = false;
    c.kv_heads = 0;
    c.parallel_residual = true;
    return c;
  }();
};
struct shared_rms {
  static constexpr m::lm_config value = [] {
    m::lm_config c = parallel_llama::value;
    c.shared_norm = true;
    return c;
  }();
};

template <class Plan>
void check_parallel() {
  using run = m::exec::gpt_run<Plan, comm>;
  static_assert(run::issue == m::exec::runtime_issue::none);
  static_assert(run::config.parallel_residual);
  static_assert(run::config.shared_norm == Plan::model_type::config.shared_norm);
  comm dp, tp;
  typename run::trainer trainer(run::config, run::arena, dp, tp);
  const std::size_t n = run::config.micro_batch * run::config.sequence * run::config.grad_accum;
  float first = 0, last = 0;
  for (int s = 0; s < 10; ++s) {  // the same batch each step: the loss must fall
    last = trainer.train_step(ids(n, 0), ids(n, 1));
    if (s == 0) first = last;
    REQUIRE(std::isfinite(last));
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
  const m::breakdown& got = mem.peak_by_category();
  CHECK(got.weights == plan.weights);
  CHECK(got.gradients == plan.gradients);
  CHECK(got.optimizer_states == plan.optimizer_states);
  CHECK(got.activations == plan.activations);
  CHECK(got.temporaries == plan.temporaries);
  // The meter of live operands reaches the plan (checked above) with dropout (the MLP's mask goes
  // once its backward has read it) and under selective recomputation (the MLP's tensors and the
  // attention's mask go before the core's backward), every live value where the layout put it.
  CHECK(trainer.meter().unplaced_ops() == 0);
  // A block's unit is the planner's block: one norm when shared.
  const m::model_desc& model = Plan::model_type::value;
  std::uint64_t block_params = 0;
  for (std::size_t i = 0; i < model.size; ++i)
    if (model.entries[i].kind == m::layer_kind::transformer_block) block_params = model.entries[i].params;
  const auto& units = trainer.step_program().units;
  REQUIRE(units.size() > 1);
  CHECK(units[1].name == "block0");
  CHECK(units[1].elements == block_params);
  // Forward: one norm per block when shared (two otherwise), and the final norm.
  std::size_t norms = 0, norm_backwards = 0;
  for (const m::exec::op& o : trainer.step_program().micro) {
    if (std::holds_alternative<m::exec::ops::norm_fwd>(o.body)) ++norms;
    if (std::holds_alternative<m::exec::ops::norm_bwd>(o.body)) ++norm_backwards;
  }
  const std::size_t per_block = run::config.shared_norm ? 1 : 2;
  const std::size_t rebuilt = run::config.recompute == m::recompute_kind::full ? 2 : 1;  // forwards of a block
  CHECK(norms == per_block * run::config.layers * rebuilt + 1);
  CHECK(norm_backwards == per_block * run::config.layers + 1);
}
}  // namespace

TEST_CASE_TEMPLATE("a parallel-residual model trains with the arena's high-water mark at the plan's peak", Plan,
                   plan_for<neox, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<neox, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
                   plan_for<neox, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::full>,
                   plan_for<neox, m::precision::fp32, m::optim::adamw<>, m::train::batch<1, 32>, m::train::grad_accum<2>>,
                   plan_for<neox_drop, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<neox_drop, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
                   plan_for<neox_bf16, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<neox_bf16_drop, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::full>,
                   plan_for<falcon, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<falcon, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
                   plan_for<falcon, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::full>,
                   plan_for<falcon_drop, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<falcon_bf16_drop, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<falcon_bf16_drop, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
                   plan_for<parallel_llama, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<parallel_llama, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
                   plan_for<shared_rms, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<shared_rms, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>) {
  check_parallel<Plan>();
}

namespace {
/// The backend's gradient of the loss against central differences, for the element of largest
/// gradient of every tensor of every block (fp32, learning rate 0 so the weights stay, no
/// clipping, no dropout).
template <class Plan>
void check_gradients() {
  using run = m::exec::gpt_run<Plan, comm>;
  m::exec::gpt_config cfg = run::config;
  cfg.lr = 0.0f;
  cfg.max_grad_norm = 0.0f;
  cfg.weight_decay = 0.0f;
  comm dp, tp;
  typename run::trainer t(cfg, run::arena, dp, tp);
  const std::size_t n = cfg.micro_batch * cfg.sequence;
  const std::vector<std::int32_t> tok = ids(n, 0), tgt = ids(n, 1);
  const float base = t.train_step(tok, tgt);
  const std::size_t D = cfg.head_dim, W = cfg.heads * D, Wkv = cfg.kv_heads * D;
  const m::exec::gpt_block_view v = m::exec::gpt_block_layout(cfg.hidden, W, Wkv, cfg.ffn,
                                                              !cfg.rms_norm && (cfg.bias || cfg.shared_norm), cfg.bias,
                                                              cfg.gated, cfg.qkv_bias, cfg.shared_norm);
  const struct {
    const char* name;
    std::size_t begin, end;
  } tensors[] = {{"ln1_w", v.ln1_w, v.ln1_b}, {"ln1_b", v.ln1_b, v.qkv_w},   {"qkv_w", v.qkv_w, v.qkv_b},
                 {"qkv_b", v.qkv_b, v.proj_w}, {"proj_w", v.proj_w, v.proj_b}, {"proj_b", v.proj_b, v.ln2_w},
                 {"ln2_w", v.ln2_w, v.ln2_b},  {"ln2_b", v.ln2_b, v.fc1_w},   {"fc1_w", v.fc1_w, v.fc1_b},
                 {"fc1_b", v.fc1_b, v.fc2_w},  {"fc2_w", v.fc2_w, v.fc2_b},   {"fc2_b", v.fc2_b, v.end}};
  const auto& units = t.step_program().units;
  std::size_t checked = 0;
  for (const m::exec::param_unit& u : units) {
    if (u.name.rfind("block", 0) != 0) continue;
    REQUIRE(u.elements == v.end);
    std::vector<float> grad(u.elements);
    const std::vector<std::byte> g = t.backend().read(u.grad);
    std::memcpy(grad.data(), g.data(), g.size());
    for (const auto& x : tensors) {
      if (x.begin == x.end) continue;
      std::size_t at = x.begin;
      for (std::size_t j = x.begin; j < x.end; ++j)
        if (std::abs(grad[j]) > std::abs(grad[at])) at = j;
      CAPTURE(u.name);
      CAPTURE(std::string(x.name));
      m::exec::operand w = u.weight;
      w.offset += at * sizeof(float);
      w.count = 1;
      std::vector<std::byte> orig = t.backend().read(w);
      float w0 = 0;
      std::memcpy(&w0, orig.data(), sizeof w0);
      const float h = 2e-3f * std::max(1.0f, std::abs(w0));
      const auto loss_at = [&](float value) {
        t.backend().write(w, std::as_bytes(std::span(&value, 1)));
        return t.train_step(tok, tgt);
      };
      const float up = loss_at(w0 + h), down = loss_at(w0 - h);
      t.backend().write(w, orig);
      const double fd = (static_cast<double>(up) - down) / (2.0 * h);
      CAPTURE(fd);
      CAPTURE(grad[at]);
      CHECK(grad[at] != 0.0f);
      // fp32 losses near ln 64 ≈ 4.2 are resolved to an ulp of 4.8e-7, a step of 1.2e-4 in the
      // difference quotient over 2h = 4e-3: the bound allows four such steps plus 3% (the
      // quotient's h² truncation, measured under 1% here).
      CHECK(std::abs(fd - grad[at]) <= 0.03 * std::abs(grad[at]) + 5e-4);
      ++checked;
    }
  }
  CHECK(checked >= 2 * 5);  // at least the norm's scale and the four products in each of two blocks
  CHECK(t.train_step(tok, tgt) == base);  // the weights are back and lr 0 kept them
}
}  // namespace

TEST_CASE("a parallel block's gradients match central differences of the loss") {
  SUBCASE("GPT-NeoX: two norms, biases") { check_gradients<plan_for<neox, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>>(); }
  SUBCASE("Falcon: one shared norm, no biases, multi-query") {
    check_gradients<plan_for<falcon, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>>();
  }
  SUBCASE("RMSNorm and SwiGLU, shared norm, naive attention") {
    check_gradients<plan_for<shared_rms, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>>();
  }
}

TEST_CASE("a shared norm needs the parallel residual") {
  using m::exec::runtime_issue;
  m::lm_config c = small_falcon(m::dtypes::fp32, 0);
  const m::training_desc t = plan_for<falcon, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>::training;
  const m::mesh_desc mesh{};
  CHECK(m::exec::find_cpu_runtime_issue(c, t, mesh) == runtime_issue::none);
  c.parallel_residual = false;
  CHECK(m::exec::find_cpu_runtime_issue(c, t, mesh) == runtime_issue::architecture);
  c.shared_norm = false;
  CHECK(m::exec::find_cpu_runtime_issue(c, t, mesh) == runtime_issue::none);
  m::exec::gpt_config g{};
  g.shared_norm = true;
  CHECK_THROWS_AS(m::exec::build_program(g, {std::size_t{1} << 30, std::size_t{1} << 30}), m::exec::program_error);
  g.parallel_residual = true;
  CHECK_NOTHROW(m::exec::build_program(g, {std::size_t{1} << 30, std::size_t{1} << 30}));
  // The fixed trainers' rule (GPT-2's block) refuses the parallel block.
  m::lm_config gpt2 = small(m::dtypes::fp32, false, 0, 2);
  CHECK(m::exec::find_runtime_issue(gpt2, t, mesh) == runtime_issue::none);
  gpt2.parallel_residual = true;
  CHECK(m::exec::find_runtime_issue(gpt2, t, mesh) == runtime_issue::architecture);
  CHECK(m::exec::llama_style(gpt2));
}

namespace {
// Falcon's shared norm with two key/value heads, so that two tensor-parallel ranks split them.
struct falcon_kv2 {
  static constexpr m::lm_config value = [] {
    m::lm_config c = small_falcon(m::dtypes::fp32, 0);
    c.kv_heads = 2;
    return c;
  }();
};
template <class Config, class Mesh, class... Options>
using mesh_plan = m::plan<m::exec::runtime_gpt<Config>,
                          m::train::recipe<m::precision::fp32, m::optim::adamw<>, m::train::reference_kernels,
                                           m::train::batch<2, 16>, Options...>,
                          Mesh, budget>;

/// Every rank's (and stage's) program laid out in its plan's arena reaches the plan's peak in every
/// category, and a stack 16 bytes short throws while building.
template <class Plan>
void check_ranks() {
  using run = m::exec::gpt_run<Plan, m::exec::null_communicator>;
  constexpr m::mesh_desc mesh = Plan::mesh;
  for (std::size_t s = 0; s < mesh.pp; ++s) {
    CAPTURE(s);
    const m::plan_result want = m::evaluate_stage(Plan::model, Plan::training, mesh, Plan::device, s);
    const m::exec::arena_sizes arena = mesh.pp > 1 ? run::stage_arena(s) : run::arena;
    for (std::size_t d = 0; d < mesh.dp; ++d)
      for (std::size_t t = 0; t < mesh.tp; ++t) {
        CAPTURE(d);
        CAPTURE(t);
        const m::exec::program prog = m::exec::build_program(run::config, arena, {d, t, s});
        CHECK(prog.persistent_bytes == want.most_loaded.at[0].model_states().value);
        CHECK(prog.high_water == (want.per_rank.total() - want.per_rank.reserve).value);
        for (std::size_t c = 0; c + 1 < m::category_count; ++c) {  // every category but the reserve
          CAPTURE(m::category_name(m::category(c)));
          CHECK(prog.peak_by_category[m::category(c)] == want.per_rank[m::category(c)]);
        }
        m::exec::arena_sizes short_stack = arena;
        short_stack.stack -= 16;
        CHECK_THROWS_AS(m::exec::build_program(run::config, short_stack, {d, t, s}), m::exec::arena_error);
      }
  }
}
}  // namespace

TEST_CASE_TEMPLATE("a parallel block's program reaches the plan on every rank of a mesh", Plan,
                   mesh_plan<neox, m::parallel::mesh<m::parallel::tensor<2>>>,
                   mesh_plan<neox_drop, m::parallel::mesh<m::parallel::tensor<2>>, m::train::recompute::selective>,
                   mesh_plan<falcon_kv2, m::parallel::mesh<m::parallel::tensor<2>>, m::train::recompute::full>,
                   mesh_plan<falcon, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<3, 0>>>>,
                   mesh_plan<neox, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<2>>, m::parallel::tensor<2>>>,
                   mesh_plan<neox, m::parallel::mesh<m::parallel::pipeline<2>>, m::train::grad_accum<4>>,
                   mesh_plan<neox_drop, m::parallel::mesh<m::parallel::pipeline<2>>, m::train::grad_accum<4>,
                             m::train::recompute::selective>) {
  check_ranks<Plan>();
}

// SPDX-License-Identifier: BSL-1.0
// The step program against its plan: built on the host without running a kernel, on every rank,
// its persistent bytes, its high-water mark and its peak category by category are the plan's, and
// its trace pops every push in order. (What it computes is held to the golden trajectories:
// host.test_step_backend_cpu, mpi.step_program, mpi.golden_named.) Tensor-parallel plans over
// runtime_gpt are vocabulary-parallel (and sequence-parallel when the mesh says so), and are also
// held to the layout the mesh asks for.
// Also: the builder throws when the plan is 16 bytes short, the layout refuses a pop out of order,
// and the interpreter runs on the null backend.
#include <doctest/doctest.h>

#include "runtime_plans.hpp"

#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/exec/arena_layout.hpp>
#include <memalg/exec/gpt/build_program.hpp>
#include <memalg/exec/null_backend.hpp>
#include <memalg/exec/run.hpp>

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

namespace m = memalg;
using namespace memalg::literals;
using comm = m::backend::cpu::local_communicator;

namespace {
using namespace memalg_test;
// examples/train_gpt_cpu.cpp's model (gpt_bytes), for its multi-rank plans.
constexpr m::lm_config gpt_bytes() {
  m::lm_config c{};
  c.layers = 4;
  c.hidden = 64;
  c.heads = 4;
  c.vocab = 256;
  c.positions = 64;
  c.logits = m::dtypes::fp32;
  return c;
}
struct bytes32 { static constexpr m::lm_config value = gpt_bytes(); };
// Many positions, a tiny batch: the embedding backward, where the runtime holds both embeddings'
// unsharded gradients, the first residual and the embeddings' dropout mask, is the peak.
constexpr m::lm_config long_positions(std::uint64_t dropout) {
  m::lm_config c{};
  c.layers = 1;
  c.hidden = 32;
  c.heads = 4;
  c.vocab = 64;
  c.positions = 4096;
  c.logits = m::dtypes::fp32;
  c.flash = true;  // the runtime's dropout needs its flash attention
  c.dropout_permille = dropout;
  return c;
}
struct positions4k { static constexpr m::lm_config value = long_positions(0); };
struct positions4k_dropout { static constexpr m::lm_config value = long_positions(100); };

template <class Config, class Mesh, class... Options>
using mesh_plan = m::plan<m::exec::runtime_gpt<Config>,
                          m::train::recipe<m::precision::fp32, m::optim::adamw<>, m::train::reference_kernels, Options...>,
                          Mesh, budget>;
/// The same over the replicated layout (embeddings and tied output replicated: train_gpt_cuda's tp plans).
template <class Config, class Mesh, class... Options>
using replicated_plan =
    m::plan<m::exec::runtime_gpt_replicated<Config>,
            m::train::recipe<m::precision::fp32, m::optim::adamw<>, m::train::reference_kernels, Options...>, Mesh, budget>;
using example_batch = m::train::batch<8, 64>;


template <class T>
constexpr m::exec::elem elem_of() {
  if constexpr (std::is_same_v<T, m::bf16>) return m::exec::elem::bf16;
  else if constexpr (std::is_same_v<T, m::fp16>) return m::exec::elem::f16;
  else return m::exec::elem::f32;
}

std::string describe(const m::exec::arena_event& e) {
  const char* kind = e.kind == m::exec::arena_layout::event_kind::persistent ? "persistent"
                     : e.kind == m::exec::arena_layout::event_kind::push     ? "push"
                                                                             : "pop";
  return std::string(kind) + " " + e.name + " @" + std::to_string(e.offset) + " " + std::to_string(e.bytes) + "B cat " +
         std::to_string(static_cast<int>(e.cat)) + (e.where == m::exec::arena_layout::side::saved ? " saved" : " transient");
}

/// Rank `r`'s program reaches the plan: its persistent bytes, its high-water mark, its model states
/// category by category and its stacks in sum; its trace pops every push, in order.
template <class Plan, class Comm>
void check_rank(m::exec::rank_coords r) {
  using run = m::exec::gpt_run<Plan, Comm>;
  const m::exec::program prog = m::exec::build_program(run::config, run::arena, r, elem_of<typename run::storage>());
  CHECK(m::exec::default_storage(run::config) == prog.storage);
  const m::breakdown& plan = Plan::result.per_rank;
  CHECK(prog.persistent_bytes == Plan::result.most_loaded.at[0].model_states().value);
  CHECK(prog.high_water == (plan.total() - plan.reserve).value);
  // The model states category by category; what lives on the stacks in sum (under every-K
  // recomputation the plan books a rebuilt block's tensors as temporaries where the program, at
  // its peak, holds some of them as saved activations).
  m::bytes stacks{}, planned_stacks{};
  for (std::size_t c = 0; c < m::category_count; ++c) {
    const auto cat = static_cast<m::category>(c);
    if (cat == m::category::reserve) continue;
    CAPTURE(m::category_name(cat));
    if (cat == m::category::activations || cat == m::category::temporaries || cat == m::category::comm_buffers) {
      stacks += prog.peak_by_category[cat];
      planned_stacks += plan[cat];
    } else {
      CHECK(prog.peak_by_category[cat] == plan[cat]);
    }
  }
  CHECK(stacks == planned_stacks);
  // Every push is popped, last in first out on each side.
  std::vector<const m::exec::arena_event*> saved, transient;
  for (const m::exec::arena_event& e : prog.trace) {
    auto& stack = e.where == m::exec::arena_layout::side::saved ? saved : transient;
    if (e.kind == m::exec::arena_layout::event_kind::push) stack.push_back(&e);
    else if (e.kind == m::exec::arena_layout::event_kind::pop) {
      REQUIRE_MESSAGE(!stack.empty(), describe(e));
      CHECK_MESSAGE(stack.back()->offset == e.offset, describe(e));
      stack.pop_back();
    }
  }
  CHECK(saved.empty());
  CHECK(transient.empty());
  CHECK(prog.micro.size() > 0);
}

template <class Plan>
void check_plan() {
  constexpr m::mesh_desc mesh = Plan::mesh;
  if constexpr (mesh.dp == 1 && mesh.tp == 1) {
    check_rank<Plan, comm>({});
  } else {
    for (std::size_t d = 0; d < mesh.dp; ++d)
      for (std::size_t t = 0; t < mesh.tp; ++t) {
        CAPTURE(d);
        CAPTURE(t);
        check_rank<Plan, m::exec::null_communicator>({d, t});
      }
  }
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("the step program reaches the plan on every rank, category by category", Plan, step_trace) {
  check_plan<Plan>();
}
TEST_CASE_TEMPLATE_APPLY(step_trace, runtime_matrix);
using mesh_matrix = std::tuple<
    // the multi-rank plans of examples/train_gpt_cpu.cpp, every rank
    mesh_plan<bytes32, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<1>>>, example_batch>,
    mesh_plan<bytes32, m::parallel::mesh<m::parallel::data<4, m::parallel::zero<3, 0>>>, example_batch>,
    // (their tensor-parallel ones in the replicated layout; vocabulary-parallel below)
    replicated_plan<bytes32, m::parallel::mesh<m::parallel::tensor<2>>, example_batch>,
    replicated_plan<bytes32, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<2>>, m::parallel::tensor<2>>,
                    example_batch>,
    // ZeRO under recomputation, dropout and accumulation
    mesh_plan<flash32, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<2>>>, m::train::batch<2, 16>,
              m::train::recompute::every<2>, m::train::grad_accum<2>>,
    replicated_plan<naive32, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<3, 0>>, m::parallel::tensor<2>>,
                    m::train::batch<2, 16>, m::train::recompute::selective>,
    mesh_plan<naive32, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<0>>>, m::train::batch<2, 16>,
              m::train::recompute::full>,
    // the embedding backward as the peak
    mesh_plan<positions4k, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<2>>>,
              m::train::batch<1, 16>, m::train::recompute::full>,
    mesh_plan<positions4k_dropout, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<2>>>,
              m::train::batch<1, 16>, m::train::recompute::full>,
    mesh_plan<positions4k, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<3, 0>>>,
              m::train::batch<1, 16>, m::train::recompute::full>>;
TEST_CASE_TEMPLATE_APPLY(step_trace, mesh_matrix);

namespace {
// Pipeline stages: every stage's program against that stage's plan (evaluate_stage), for every
// rank of the stage, category by category.
constexpr m::lm_config untied(m::lm_config c) {
  c.tied = false;
  return c;
}
struct bytes32_untied { static constexpr m::lm_config value = untied(gpt_bytes()); };
struct naive32_untied { static constexpr m::lm_config value = untied(naive32::value); };
struct flash32_untied { static constexpr m::lm_config value = untied(flash32::value); };
// Llama-shaped: RMSNorm, SwiGLU, rotary positions (no position embedding on the first stage),
// grouped-query flash attention, no biases.
struct llama_untied {
  static constexpr m::lm_config value = [] {
    m::lm_config c = naive32::value;
    c.kv_heads = 2;
    c.ffn = 88;
    c.positions = 0;
    c.rotary = true;
    c.rms_norm = true;
    c.gated = true;
    c.bias = false;
    c.tied = false;
    c.flash = true;
    return c;
  }();
};
using pipeline_batch = m::train::batch<4, 64>;

template <class Plan>
void check_pipeline_plan() {
  using run = m::exec::gpt_run<Plan, m::exec::null_communicator>;
  constexpr m::mesh_desc mesh = Plan::mesh;
  static_assert(mesh.pp > 1);
  std::size_t blocks = 0;
  for (std::size_t s = 0; s < mesh.pp; ++s) {
    CAPTURE(s);
    const m::plan_result want = m::evaluate_stage(Plan::model, Plan::training, mesh, Plan::device, s);
    const m::exec::arena_sizes arena = run::stage_arena(s);
    for (std::size_t d = 0; d < mesh.dp; ++d)
      for (std::size_t t = 0; t < mesh.tp; ++t) {
        CAPTURE(d);
        CAPTURE(t);
        const m::exec::program prog = m::exec::build_program(run::config, arena, {d, t, s});
        CHECK(prog.pp == mesh.pp);
        CHECK(prog.pp_rank == s);
        CHECK(prog.micro.empty());
        CHECK(prog.pipeline.size() == 2 * run::config.grad_accum);
        CHECK(prog.stash_slots == want.most_loaded.chunks_in_flight);
        CHECK(prog.stash_slot_bytes == want.most_loaded.activations_per_micro_batch.value);
        CHECK(prog.persistent_bytes == want.most_loaded.at[0].model_states().value);
        CHECK(prog.high_water == (want.per_rank.total() - want.per_rank.reserve).value);
        for (std::size_t c = 0; c + 1 < m::category_count; ++c) {  // every category but the reserve
          CAPTURE(m::category_name(m::category(c)));
          CHECK(prog.peak_by_category[m::category(c)] == want.per_rank[m::category(c)]);
        }
        if (d == 0 && t == 0)
          for (const m::exec::param_unit& u : prog.units) blocks += u.name.rfind("block", 0) == 0;
        // A push past the stage's plan throws while building.
        m::exec::arena_sizes short_stack = arena;
        short_stack.stack -= 16;
        CHECK_THROWS_WITH_AS(m::exec::build_program(run::config, short_stack, {d, t, s}),
                             doctest::Contains("under-predicts"), m::exec::arena_error);
      }
  }
  CHECK(blocks == run::config.layers);  // the stages own the blocks between them
}
struct bytes32_dropout {
  static constexpr m::lm_config value = [] {
    m::lm_config c = gpt_bytes();
    c.flash = true;
    c.dropout_permille = 100;
    return c;
  }();
};
template <class Op>
std::size_t count_ops(const m::exec::program& p) {
  std::size_t n = 0;
  for (const auto* section : {&p.step_begin, &p.micro, &p.step_end})
    for (const m::exec::op& o : *section) n += std::holds_alternative<Op>(o.body);
  return n;
}
std::size_t tp_collectives(const m::exec::program& p) {
  std::size_t n = 0;
  for (const m::exec::op& o : p.micro) {
    if (const auto* g = std::get_if<m::exec::ops::all_gather>(&o.body)) n += g->g == m::exec::group::tp;
    if (const auto* r = std::get_if<m::exec::ops::reduce_scatter>(&o.body)) n += r->g == m::exec::group::tp;
  }
  return n;
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("a pipeline stage's program reaches its stage's plan, category by category", Plan, stage_plans) {
  check_pipeline_plan<Plan>();
}
using pipeline_matrix = std::tuple<
    // examples/train_gpt_cpu.cpp's pp2 and pp2-dp2
    mesh_plan<bytes32_untied, m::parallel::mesh<m::parallel::pipeline<2>>, pipeline_batch, m::train::grad_accum<4>>,
    mesh_plan<bytes32_untied, m::parallel::mesh<m::parallel::data<2>, m::parallel::pipeline<2>>, pipeline_batch,
              m::train::grad_accum<4>>,
    // four stages (middle stages receive and send), fewer micro-batches than stages, an uneven split
    mesh_plan<bytes32_untied, m::parallel::mesh<m::parallel::pipeline<4>>, pipeline_batch, m::train::grad_accum<6>>,
    mesh_plan<naive32_untied, m::parallel::mesh<m::parallel::pipeline<4>>, m::train::batch<2, 16>, m::train::grad_accum<2>>,
    mesh_plan<naive32_untied, m::parallel::mesh<m::parallel::pipeline<3>>, m::train::batch<2, 16>, m::train::grad_accum<5>>,
    // ZeRO-1, selective recomputation, dropout with flash attention
    mesh_plan<naive32_untied, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<1>>, m::parallel::pipeline<2>>,
              m::train::batch<2, 16>, m::train::grad_accum<3>>,
    mesh_plan<naive32_untied, m::parallel::mesh<m::parallel::data<2>, m::parallel::pipeline<2>>, m::train::batch<2, 16>,
              m::train::grad_accum<2>, m::train::recompute::selective>,
    mesh_plan<flash32_untied, m::parallel::mesh<m::parallel::pipeline<2>>, m::train::batch<2, 32>, m::train::grad_accum<3>>,
    mesh_plan<llama_untied, m::parallel::mesh<m::parallel::pipeline<2>>, m::train::batch<2, 16>, m::train::grad_accum<3>>>;
TEST_CASE_TEMPLATE_APPLY(stage_plans, pipeline_matrix);

TEST_CASE("a pipeline stage's sections follow 1F1B, and its stages pair every send with a receive") {
  using plan = mesh_plan<naive32_untied, m::parallel::mesh<m::parallel::pipeline<3>>, m::train::batch<2, 16>,
                         m::train::grad_accum<4>>;
  using run = m::exec::gpt_run<plan, m::exec::null_communicator>;
  // Megatron-LM's schedules.py for stage 0 of 3 with 4 micro-batches: 2 warm-up forwards, 2 steady
  // pairs, 2 cool-down backwards.
  const std::vector<m::exec::pipeline_step> want{{true, 0},  {true, 1},  {true, 2},  {false, 0},
                                                 {true, 3},  {false, 1}, {false, 2}, {false, 3}};
  CHECK(m::exec::one_f_one_b(3, 0, 4) == want);
  const std::vector<m::exec::pipeline_step> last{{true, 0}, {false, 0}, {true, 1}, {false, 1},
                                                 {true, 2}, {false, 2}, {true, 3}, {false, 3}};
  CHECK(m::exec::one_f_one_b(3, 2, 4) == last);
  // Count the messages between neighbours: each stage's sends to a peer are that peer's receives
  // from it, in number and size.
  std::vector<m::exec::program> stages;
  for (std::size_t s = 0; s < 3; ++s) stages.push_back(m::exec::build_program(run::config, run::stage_arena(s), {0, 0, s}));
  for (std::size_t s = 0; s < 3; ++s) {
    CHECK(stages[s].pipeline.size() == 8);
    for (std::size_t i = 0; i < 8; ++i) CHECK(stages[s].pipeline[i].step == m::exec::one_f_one_b(3, s, 4)[i]);
  }
  const auto messages = [&](std::size_t from, std::size_t to, bool sends) {
    std::vector<std::uint64_t> sizes;
    for (const m::exec::pipeline_section& sec : stages[sends ? from : to].pipeline)
      for (const m::exec::op& o : sec.ops) {
        if (const auto* x = std::get_if<m::exec::ops::send>(&o.body); sends && x && x->peer == to) sizes.push_back(x->buf.count);
        if (const auto* x = std::get_if<m::exec::ops::recv>(&o.body); !sends && x && x->peer == from)
          sizes.push_back(x->buf.count);
      }
    return sizes;
  };
  for (std::size_t s = 0; s + 1 < 3; ++s) {
    CHECK(messages(s, s + 1, true).size() == 4);  // one activation per micro-batch
    CHECK(messages(s, s + 1, true) == messages(s, s + 1, false));
    CHECK(messages(s + 1, s, true).size() == 4);  // one gradient per micro-batch
    CHECK(messages(s + 1, s, true) == messages(s + 1, s, false));
  }
  // The interpreter walks every section once.
  m::exec::null_backend backend(stages[1]);
  CHECK(backend.pp().rank() == 1);
  m::exec::run_state state;
  const std::size_t n = stages[1].grad_accum * stages[1].tokens_per_micro;
  m::exec::run(stages[1], backend, {ids(n, 0), ids(n, 1)}, state);
  std::uint64_t ops = stages[1].step_begin.size() + stages[1].step_end.size();
  for (const m::exec::pipeline_section& sec : stages[1].pipeline) ops += sec.ops.size();
  CHECK(backend.executed() == ops);  // one dp rank: nothing is conditional
  // A tied model does not lower to pipeline stages.
  m::exec::gpt_config tied = run::config;
  tied.tied = true;
  CHECK_THROWS_AS(m::exec::build_program(tied, run::stage_arena(0), {0, 0, 0}), m::exec::program_error);
}


// Vocabulary-parallel (and sequence-parallel) programs: every rank's
// program is held to the plan — persistent bytes, high-water mark and the peak category by
// category — and to the layout the mesh asks for.
TEST_CASE_TEMPLATE_DEFINE("tensor-parallel programs equal the plan on every rank, category by category", Plan, tp_plan) {
  using run = m::exec::gpt_run<Plan, m::exec::null_communicator>;
  constexpr m::mesh_desc mesh = Plan::mesh;
  constexpr m::lm_config model = run::model_config;
  static_assert(mesh.tp > 1);
  CHECK(run::config.vocab_parallel);
  CHECK(run::config.sequence_parallel == mesh.sequence_parallel);
  const m::breakdown& plan = Plan::result.per_rank;
  for (std::size_t d = 0; d < mesh.dp; ++d)
    for (std::size_t t = 0; t < mesh.tp; ++t) {
      CAPTURE(d);
      CAPTURE(t);
      const m::exec::program prog = m::exec::build_program(run::config, run::arena, {d, t});
      CHECK(prog.persistent_bytes == Plan::result.most_loaded.at[0].model_states().value);
      CHECK(prog.high_water == (plan.total() - plan.reserve).value);
      for (std::size_t c = 0; c < m::category_count; ++c) {
        const auto cat = static_cast<m::category>(c);
        if (cat == m::category::reserve) continue;
        CAPTURE(m::category_name(cat));
        CHECK(prog.peak_by_category[cat] == plan[cat]);
      }
      // this rank's vocabulary rows of the token embedding, the vocabulary-parallel loss
      REQUIRE(prog.units.front().name == "wte");
      CHECK(prog.units.front().elements == model.vocab / mesh.tp * model.hidden);
      CHECK(count_ops<m::exec::ops::vocab_parallel_loss>(prog) == 1);
      CHECK(count_ops<m::exec::ops::loss>(prog) == 0);
      // SP: an all-gather before each of QKV and FC1 and a reduce-scatter after the projection and
      // FC2 per forward (re-gathers and the reverse in backward), the embedding's and the head's
      const std::size_t L = model.layers;
      const std::size_t forwards = mesh.sequence_parallel ? (Plan::training.recompute == m::recompute_kind::none ? 1 : 2) : 0;
      const std::size_t backward = mesh.sequence_parallel ? 6 : 0;  // fc2, fc1 (2), proj, qkv (2)
      CHECK(tp_collectives(prog) == L * (4 * forwards + backward) + (mesh.sequence_parallel ? 4 : 0));
    }
}
TEST_CASE_TEMPLATE_APPLY(tp_plan,
                         std::tuple<
                             // examples/train_gpt_cpu.cpp's tp2, tp2-sp, tp2-sp-dropout and dp2-tp2-zero2
                             mesh_plan<bytes32, m::parallel::mesh<m::parallel::tensor<2>>, example_batch>,
                             mesh_plan<bytes32, m::parallel::mesh<m::parallel::tensor<2, true>>, example_batch>,
                             mesh_plan<bytes32_dropout, m::parallel::mesh<m::parallel::tensor<2, true>>, example_batch>,
                             mesh_plan<bytes32, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<2>>, m::parallel::tensor<2>>,
                                       example_batch>,
                             // recomputation, accumulation, ZeRO, four ranks
                             mesh_plan<naive32, m::parallel::mesh<m::parallel::tensor<2>>, m::train::batch<2, 16>,
                                       m::train::recompute::selective>,
                             mesh_plan<flash32, m::parallel::mesh<m::parallel::tensor<2, true>>, m::train::batch<2, 16>,
                                       m::train::recompute::full, m::train::grad_accum<2>>,
                             mesh_plan<naive32, m::parallel::mesh<m::parallel::tensor<2, true>>, m::train::batch<2, 16>,
                                       m::train::recompute::every<2>>,
                             mesh_plan<flash32, m::parallel::mesh<m::parallel::tensor<4, true>>, m::train::batch<2, 16>>,
                             mesh_plan<naive32, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<3, 0>>,
                                                                  m::parallel::tensor<2, true>>,
                                       m::train::batch<2, 16>>,
                             mesh_plan<flash32, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<1>>,
                                                                  m::parallel::tensor<2, true>>,
                                       m::train::batch<1, 16>, m::train::grad_accum<2>>,
                             // Llama-shaped: an untied, vocabulary-parallel lm_head; grouped-query heads split
                             mesh_plan<llama_untied, m::parallel::mesh<m::parallel::tensor<2>>, m::train::batch<2, 16>>,
                             mesh_plan<llama_untied, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<3, 0>>,
                                                                       m::parallel::tensor<2>>,
                                       m::train::batch<2, 16>>>);

TEST_CASE("the vocabulary-parallel layout is what changes a tensor-parallel plan") {
  // Same model and mesh: the planner's vocabulary-parallel embedding holds V/tp rows per rank where
  // the replicated layout holds all V; the difference in model states is the embedding's share.
  using vp = mesh_plan<bytes32, m::parallel::mesh<m::parallel::tensor<2>>, example_batch>;
  using rep = replicated_plan<bytes32, m::parallel::mesh<m::parallel::tensor<2>>, example_batch>;
  constexpr std::uint64_t half_embedding = 256 / 2 * 64;  // elements
  constexpr std::uint64_t per_element = 4 + 4 + 8;         // fp32 weight, gradient, two AdamW states
  CHECK(rep::result.most_loaded.at[0].model_states().value - vp::result.most_loaded.at[0].model_states().value ==
        half_embedding * per_element);
  using rrun = m::exec::gpt_run<rep, m::exec::null_communicator>;
  CHECK_FALSE(rrun::config.vocab_parallel);
  const m::exec::program p = m::exec::build_program(rrun::config, rrun::arena, {0, 1});
  CHECK(count_ops<m::exec::ops::vocab_parallel_loss>(p) == 0);
  CHECK(p.units.front().elements == 256 * 64);
}

TEST_CASE("a step that does not fit the plan fails while building") {
  using plan = plan_for<flash32, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::every<2>>;
  using run = m::exec::gpt_run<plan, comm>;
  CHECK_NOTHROW(m::exec::build_program(run::config, run::arena));
  m::exec::arena_sizes short_stack = run::arena;
  short_stack.stack -= 16;
  CHECK_THROWS_WITH_AS(m::exec::build_program(run::config, short_stack), doctest::Contains("under-predicts"),
                       m::exec::arena_error);
  m::exec::arena_sizes short_states = run::arena;
  short_states.persistent -= 16;
  short_states.stack += 16;
  CHECK_THROWS_WITH_AS(m::exec::build_program(run::config, short_states), doctest::Contains("persistent region"),
                       m::exec::arena_error);
  m::exec::gpt_config bad = run::config;
  bad.flash = false;  // dropout without flash attention
  CHECK_THROWS_AS(m::exec::build_program(bad, run::arena), m::exec::program_error);
}

TEST_CASE("arena_layout keeps each side last-in first-out and traces on request") {
  using L = m::exec::arena_layout;
  L layout(64, 256);
  const std::size_t w = layout.persistent("w", 64, m::category::weights);
  CHECK(w == 0);
  CHECK_THROWS_WITH_AS(layout.persistent("x", 16, m::category::weights), doctest::Contains("persistent region"),
                       m::exec::arena_error);
  layout.enable_trace();
  const std::size_t a = layout.push("a", 32, m::category::activations);
  const std::size_t b = layout.push("b", 48, m::category::activations);
  const std::size_t t = layout.push("t", 16, m::category::temporaries, L::side::transient);
  CHECK(a == 64);
  CHECK(b == 96);
  CHECK(t == 64 + 256 - 16);
  CHECK_THROWS_WITH_AS(layout.pop(a), "arena: tensors must be released in reverse order of allocation", m::exec::arena_error);
  CHECK_THROWS_WITH_AS(layout.push("big", 256, m::category::activations), doctest::Contains("under-predicts"),
                       m::exec::arena_error);
  CHECK_THROWS_AS(L::checked_bytes("odd", 3, 4), m::exec::arena_error);
  layout.pop(t);  // the transient side is independent of the saved one
  layout.pop(b);
  layout.pop(a);
  CHECK(layout.stack_depth() == 0);
  CHECK(layout.high_water() == 64 + 32 + 48 + 16);
  CHECK(layout.peak_tensor() == "t");
  CHECK(layout.peak_by_category().temporaries == m::bytes{16});
  const auto& tr = layout.trace();
  REQUIRE(tr.size() == 7);  // the persistent tensor (always recorded), 3 pushes, 3 pops
  CHECK(tr[0].kind == L::event_kind::persistent);
  CHECK(tr[3].name == "t");
  CHECK(tr[3].where == L::side::transient);
  CHECK(tr[4] == L::event{"t", t, 16, m::category::temporaries, L::side::transient, L::event_kind::pop});
  CHECK(tr[6].name == "a");
}

TEST_CASE("run() walks the sections on the null backend, honouring when") {
  using plan = plan_for<naive32, m::precision::fp32, m::optim::momentum<>, m::train::batch<1, 32>, m::train::grad_accum<3>>;
  using run = m::exec::gpt_run<plan, comm>;
  const m::exec::program prog = m::exec::build_program(run::config, run::arena);
  REQUIRE(prog.grad_accum == 3);
  m::exec::null_backend backend(prog);
  m::exec::run_state state;
  const std::size_t n = prog.grad_accum * prog.tokens_per_micro;
  const std::vector<std::int32_t> tok = ids(n, 0), tgt = ids(n, 1);
  for (int s = 0; s < 2; ++s) {
    const m::exec::step_result r = m::exec::run(prog, backend, {tok, tgt}, state);
    CHECK_FALSE(r.skipped);
  }
  CHECK(state.step == 2);
  // Single rank: nothing is last_micro-only; every micro op runs grad_accum times.
  const std::uint64_t per_step = prog.step_begin.size() + 3 * prog.micro.size() + prog.step_end.size();
  CHECK(backend.executed() == 2 * per_step);
  CHECK_THROWS_AS(m::exec::run(prog, backend, {std::span(tok).first(n - 1), tgt}, state), std::invalid_argument);

  // Multi-rank ZeRO-1 with accumulation: the reductions run once per step, in the last micro-batch.
  using dp_plan = mesh_plan<naive32, m::parallel::mesh<m::parallel::data<2, m::parallel::zero<1>>>, m::train::batch<1, 16>,
                            m::train::grad_accum<2>>;
  using dp_run = m::exec::gpt_run<dp_plan, m::exec::null_communicator>;
  const m::exec::program p1 = m::exec::build_program(dp_run::config, dp_run::arena, {1, 0});
  std::size_t last = 0;
  for (const m::exec::op& o : p1.micro) last += o.cond == m::exec::when::last_micro;
  CHECK(last == dp_run::config.layers + 3);  // one reduce-scatter per unit
  m::exec::null_backend b1(p1);
  CHECK(b1.dp().rank() == 1);
  CHECK(b1.dp().size() == 2);
  m::exec::run_state s1;
  const std::size_t n1 = p1.grad_accum * p1.tokens_per_micro;
  const std::vector<std::int32_t> tok1 = ids(n1, 0), tgt1 = ids(n1, 1);
  for (int s = 0; s < 2; ++s) m::exec::run(p1, b1, {tok1, tgt1}, s1);
  const std::uint64_t per1 = p1.step_begin.size() + 2 * p1.micro.size() - last + p1.step_end.size();
  CHECK(b1.executed() == 2 * per1);
}

TEST_CASE("the CPU runtime rule takes sequence parallelism and a vocabulary tp divides") {
  using m::exec::runtime_issue;
  const m::training_desc t =
      m::train::recipe<m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::reference_kernels>::value;
  m::mesh_desc sp{};
  sp.tp = 2;
  sp.world = 2;
  sp.sequence_parallel = true;
  CHECK(m::exec::find_cpu_runtime_issue(bytes32::value, t, sp) == runtime_issue::none);
  CHECK(m::exec::find_runtime_issue(bytes32::value, t, sp) == runtime_issue::mesh);  // the shared rule, without the step program's extensions
  m::training_desc selective = t;
  selective.recompute = m::recompute_kind::selective;
  CHECK(m::exec::find_cpu_runtime_issue(bytes32::value, selective, sp) == runtime_issue::sequence_parallel);
  m::lm_config odd = bytes32::value;
  odd.vocab = 255;  // a byte vocabulary less one: not divisible by 2
  m::mesh_desc tp = sp;
  tp.sequence_parallel = false;
  CHECK(m::exec::find_cpu_runtime_issue(odd, t, tp) == runtime_issue::vocab);
  CHECK(m::exec::describe(runtime_issue::vocab).find("divisible") != std::string_view::npos);
  const m::training_desc bf16 =
      m::train::recipe<m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>, m::train::reference_kernels>::value;
  m::lm_config bf16_logits = bytes32::value;
  bf16_logits.logits = m::dtypes::bf16;
  // 16-bit multi-rank runs reduce through MPI user operations, but sequence parallelism is fp32-only.
  CHECK(m::exec::find_cpu_runtime_issue(bf16_logits, bf16, tp) == runtime_issue::none);
  CHECK(m::exec::find_cpu_runtime_issue(bf16_logits, bf16, sp) == runtime_issue::sequence_parallel);
}

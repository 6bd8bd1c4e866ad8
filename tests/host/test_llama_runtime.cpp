// SPDX-License-Identifier: BSL-1.0
// Llama-shaped models (RMSNorm, SwiGLU, rotary positions, grouped-query attention, no biases, untied output) on the CPU step program: high-water == plan.
#include <doctest/doctest.h>

#include "runtime_plans.hpp"

#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>

#include <cmath>
#include <type_traits>
#include <variant>
#include <vector>

namespace m = memalg;
using comm = m::backend::cpu::local_communicator;

namespace {
using namespace memalg_test;

constexpr m::lm_config llama(bool flash, std::uint64_t kv_heads, std::uint64_t layers, m::dtype logits = m::dtypes::fp32,
                             bool qwen2 = false) {
  m::lm_config c{};
  c.name = "llama-test";
  c.layers = layers;
  c.hidden = 32;
  c.heads = 4;
  c.kv_heads = kv_heads;
  c.ffn = 88;
  c.vocab = 64;
  c.positions = 0;
  c.rotary = true;
  c.rms_norm = true;
  c.gated = true;
  c.bias = false;
  c.tied = qwen2;  // Qwen2-0.5B ties its output; Llama does not
  c.qkv_bias = qwen2;
  c.flash = flash;
  c.logits = logits;
  return c;
}
struct gqa_flash { static constexpr m::lm_config value = llama(true, 2, 3); };
struct mqa_flash { static constexpr m::lm_config value = llama(true, 1, 2); };
struct mha_naive { static constexpr m::lm_config value = llama(false, 0, 2); };
// The same models for mixed-bf16: the CPU runtime keeps the logits in the weight dtype.
struct gqa_flash_bf16 { static constexpr m::lm_config value = llama(true, 2, 3, m::dtypes::bf16); };
struct mha_naive_bf16 { static constexpr m::lm_config value = llama(false, 0, 2, m::dtypes::bf16); };
// amp-fp16 (fp16 weights, gradients, activations and logits; fp32 master; dynamic loss scaling).
struct gqa_flash_fp16 { static constexpr m::lm_config value = llama(true, 2, 2, m::dtypes::fp16); };
// Qwen2-shaped: q/k/v biases without the other biases, output tied to the token embedding.
struct qwen2_flash { static constexpr m::lm_config value = llama(true, 2, 2, m::dtypes::fp32, true); };
// GPT-NeoX's partial rotary (a quarter of each head rotates) with a head width other than hidden /
// heads (12 for 32 / 4).
struct partial_rotary_wide_heads {
  static constexpr m::lm_config value = [] {
    m::lm_config c = llama(true, 2, 2);
    c.head_dim = 12;
    c.rotary_dim = 4;
    return c;
  }();
};
// A chunked loss: 8 logits rows at a time of the 32 a micro-batch has (and 12: a short last chunk),
// over a vocabulary of 512 so that the logits are the step's largest transient.
template <std::uint64_t Chunk>
struct chunked {
  static constexpr m::lm_config value = [] {
    m::lm_config c = llama(true, 2, 2);
    c.vocab = 512;
    c.loss_chunk = Chunk;
    return c;
  }();
};
struct qwen2_flash_bf16 { static constexpr m::lm_config value = llama(true, 2, 2, m::dtypes::bf16, true); };
// Qwen3-shaped: an RMSNorm over each query and key head (q_norm, k_norm) before the rotary
// positions, heads wider than hidden / heads (12 for 32 / 4), tied output; flash or naive.
template <bool Flash, bool Bf16 = false>
struct qwen3 {
  static constexpr m::lm_config value = [] {
    m::lm_config c = llama(Flash, Flash ? 2 : 0, 2, Bf16 ? m::dtypes::bf16 : m::dtypes::fp32, true);
    c.qkv_bias = false;
    c.qk_norm = true;
    c.head_dim = 12;
    c.norm_eps = 1e-6;
    return c;
  }();
};

// Gemma's norms: an RMSNorm before and after each sub-layer, every norm scaling by 1 + w (weights
// starting at zero), tied output; flash or naive, with Qwen3's QK-norm or not (Gemma 3 has both).
template <bool Flash, bool Bf16 = false, bool QkNorm = false>
struct sandwich {
  static constexpr m::lm_config value = [] {
    m::lm_config c = llama(Flash, Flash ? 2 : 0, 2, Bf16 ? m::dtypes::bf16 : m::dtypes::fp32, true);
    c.qkv_bias = false;
    c.sandwich_norms = true;
    c.qk_norm = QkNorm;
    c.head_dim = 16;
    c.norm_eps = 1e-6;
    return c;
  }();
};

// Gemma 2: Gemma's norms with GeGLU, attention scores capped at 50 and logits at 30, local
// attention over the last 4 of 16 positions on the even layers, query_pre_attn_scalar 12 (not the
// head width 16), the embedding times √32; flash or naive.
template <bool Flash, bool Bf16 = false>
struct gemma2 {
  static constexpr m::lm_config value = [] {
    m::lm_config c = sandwich<Flash, Bf16>::value;
    c.layers = 3;
    c.geglu = true;
    c.embed_scale = true;
    c.attn_softcap = 50.0;
    c.final_softcap = 30.0;
    c.sliding_window = 4;
    c.query_scalar = 12.0;
    return c;
  }();
};

// One of Gemma 2's variants at a time on Gemma's norms (Which: 0 GeGLU, 1 the scaled embedding,
// 2 the attention softcap, 3 the logit softcap, 4 the sliding window, 5 the query scalar; 6 none).
template <int Which>
struct gemma2_only {
  static constexpr m::lm_config value = [] {
    m::lm_config c = sandwich<true>::value;
    c.layers = 3;
    c.geglu = Which == 0;
    c.embed_scale = Which == 1;
    c.attn_softcap = Which == 2 ? 50.0 : 0.0;
    c.final_softcap = Which == 3 ? 30.0 : 0.0;
    c.sliding_window = Which == 4 ? 4 : 0;
    c.query_scalar = Which == 5 ? 12.0 : 0.0;
    return c;
  }();
};

template <class Plan>
void check_llama() {
  using run = m::exec::gpt_run<Plan, comm>;
  static_assert(run::issue == m::exec::runtime_issue::none);
  comm dp, tp;
  typename run::trainer trainer(run::config, run::arena, dp, tp);
  const std::size_t n = run::config.micro_batch * run::config.sequence * run::config.grad_accum;
  float first = 0, last = 0;
  for (int s = 0; s < 10; ++s) {  // the same batch each step: the loss must fall
    last = trainer.train_step(ids(n, 0), ids(n, 1));
    if (s == 0) {
      first = last;
      CHECK(std::isfinite(trainer.last_grad_norm()));
      CHECK(trainer.last_grad_norm() > 0.0f);
    }
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
  CHECK(got.activations + got.temporaries == plan.activations + plan.temporaries);
  CHECK(got.activations == plan.activations);
  CHECK(got.temporaries == plan.temporaries);
  // The program's units: no position embedding, an untied lm_head after the final norm.
  const auto& units = trainer.step_program().units;
  REQUIRE(units.size() == run::config.layers + (run::config.tied ? 2 : 3));
  CHECK(units[1].name == "block0");
  CHECK(units.back().name == (run::config.tied ? "lnf" : "lm_head"));
  // Qwen2's q/k/v biases: the qkv projection has a bias operand, the others none.
  std::size_t biased = 0, unbiased = 0;
  for (const m::exec::op& o : trainer.step_program().micro)
    if (const auto* l = std::get_if<m::exec::ops::linear_fwd>(&o.body)) (l->bias.null() ? unbiased : biased) += 1;
  CHECK(biased == (run::config.qkv_bias ? run::config.layers : 0));
  CHECK(unbiased >= 3 * run::config.layers);
  // Every block rotates Q and K (and dQ, dK back), runs SwiGLU and RMSNorm.
  std::size_t rot_f = 0, rot_b = 0, swiglu = 0, rms = 0;
  for (const m::exec::op& o : trainer.step_program().micro) {
    if (const auto* r = std::get_if<m::exec::ops::rotary_fwd>(&o.body)) {
      ++rot_f;  // the model's rotated dimensions: all of the head, or GPT-NeoX's first rotary_dim
      CHECK(r->rot_dim == (Plan::model_type::config.rotary_dim != 0 ? Plan::model_type::config.rotary_dim : run::config.head_dim));
      CHECK(r->sh.D == run::config.head_dim);
    }
    if (std::holds_alternative<m::exec::ops::rotary_bwd>(o.body)) ++rot_b;
    if (const auto* a = std::get_if<m::exec::ops::activation_fwd>(&o.body);  // Gemma's gate: GeGLU
        a && a->k == (run::config.geglu ? m::exec::ops::activation_kind::geglu : m::exec::ops::activation_kind::swiglu))
      ++swiglu;
    if (const auto* nf = std::get_if<m::exec::ops::norm_fwd>(&o.body); nf && nf->rms) ++rms;
  }
  CHECK(rot_b == run::config.layers);
  CHECK(rot_f >= run::config.layers);
  CHECK(swiglu >= run::config.layers);
  CHECK(rms >= 2 * run::config.layers + 1);
  // Qwen3's QK-norm: one forward and one backward per block, over the block's query and key heads.
  std::size_t qk_f = 0, qk_b = 0;
  for (const m::exec::op& o : trainer.step_program().micro) {
    if (const auto* q = std::get_if<m::exec::ops::qk_norm_fwd>(&o.body)) {
      ++qk_f;
      CHECK(q->wq.count == run::config.head_dim);
      CHECK(q->pre.count == run::config.micro_batch * run::config.sequence * (run::config.heads + run::config.kv_heads) *
                                run::config.head_dim);
    }
    if (std::holds_alternative<m::exec::ops::qk_norm_bwd>(o.body)) ++qk_b;
  }
  CHECK(qk_b == (run::config.qk_norm ? run::config.layers : 0));
  CHECK(qk_f >= qk_b);
  // Gemma's norms: four per block and the final one, each with the weight offset 1; none otherwise.
  std::size_t offset_f = 0, offset_b = 0;
  for (const m::exec::op& o : trainer.step_program().micro) {
    if (const auto* nf = std::get_if<m::exec::ops::norm_fwd>(&o.body); nf && nf->w_offset == 1.0) ++offset_f;
    if (const auto* nb = std::get_if<m::exec::ops::norm_bwd>(&o.body); nb && nb->w_offset == 1.0) ++offset_b;
  }
  CHECK(offset_b == (run::config.sandwich_norms ? 4 * run::config.layers + 1 : 0));
  CHECK(offset_f >= offset_b);
  // Gemma 2: the even blocks' attention is local, every block's capped and scaled; the embedding
  // is scaled in both directions and the loss caps the logits.
  std::size_t local_b = 0, attn_b = 0;
  for (const m::exec::op& o : trainer.step_program().micro) {
    if (const auto* a = std::get_if<m::exec::ops::attention_bwd>(&o.body)) {
      ++attn_b;
      local_b += a->sh.window != 0 ? 1 : 0;
      CHECK(a->sh.window == (a->sh.window != 0 ? run::config.sliding_window : 0));
      CHECK(a->sh.softcap == run::config.attn_softcap);
      CHECK(a->sh.scale == (run::config.query_scalar > 0 ? 1.0f / std::sqrt(run::config.query_scalar) : 0.0f));
    }
    if (const auto* e = std::get_if<m::exec::ops::embedding_fwd>(&o.body))
      CHECK(e->scale == (run::config.embed_scale ? std::sqrt(static_cast<float>(run::config.hidden)) : 0.0f));
    if (const auto* e = std::get_if<m::exec::ops::embedding_bwd>(&o.body))
      CHECK(e->scale == (run::config.embed_scale ? std::sqrt(static_cast<float>(run::config.hidden)) : 0.0f));
    if (const auto* l = std::get_if<m::exec::ops::loss>(&o.body)) CHECK(l->softcap == run::config.final_softcap);
  }
  CHECK(attn_b == run::config.layers);
  CHECK(local_b == (run::config.sliding_window != 0 ? (run::config.layers + 1) / 2 : 0));
}
}  // namespace

TEST_CASE_TEMPLATE("a Llama-shaped model trains with the arena's high-water mark at the plan's peak", Plan,
                   plan_for<gqa_flash, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<gqa_flash, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
                   plan_for<gqa_flash, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::full>,
                   plan_for<gqa_flash, m::precision::fp32, m::optim::adamw<>, m::train::batch<1, 32>, m::train::grad_accum<2>>,
                   plan_for<mqa_flash, m::precision::fp32, m::optim::momentum<>, m::train::batch<2, 16>>,
                   plan_for<mha_naive, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<gqa_flash_bf16, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<gqa_flash_bf16, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
                   plan_for<gqa_flash_bf16, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::full>,
                   plan_for<gqa_flash_bf16, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<1, 32>, m::train::grad_accum<2>>,
                   plan_for<mha_naive_bf16, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<qwen2_flash, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<qwen2_flash, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
                   plan_for<qwen2_flash_bf16, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<partial_rotary_wide_heads, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<gqa_flash_fp16, m::precision::amp_fp16, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<gqa_flash_fp16, m::precision::amp_fp16, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::full>,
                   plan_for<chunked<8>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<chunked<12>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::full>,
                   plan_for<qwen3<true>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<qwen3<true>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
                   plan_for<qwen3<true>, m::precision::fp32, m::optim::adamw<>, m::train::batch<1, 32>, m::train::grad_accum<2>, m::train::recompute::full>,
                   plan_for<qwen3<false>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<qwen3<true, true>, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<qwen3<true, true>, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
                   plan_for<sandwich<true>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<sandwich<true>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
                   plan_for<sandwich<true>, m::precision::fp32, m::optim::adamw<>, m::train::batch<1, 32>, m::train::grad_accum<2>, m::train::recompute::full>,
                   plan_for<sandwich<false>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<sandwich<true, false, true>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<sandwich<true, true>, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<sandwich<true, true>, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
                   plan_for<gemma2<true>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<gemma2<true>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>,
                   plan_for<gemma2<true>, m::precision::fp32, m::optim::adamw<>, m::train::batch<1, 32>, m::train::grad_accum<2>, m::train::recompute::full>,
                   plan_for<gemma2<false>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>,
                   plan_for<gemma2<true, true>, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>>) {
  check_llama<Plan>();
}

TEST_CASE("Gemma 2's arithmetic reaches the step: each of its variants moves the losses, recomputation does not") {
  // Each variant alone, on the Gemma-norm block, changes the trajectory; recomputing the blocks
  // (and selectively the attention cores, with their windows and caps) replays it exactly.
  using base = plan_for<gemma2_only<6>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>;
  const auto [lb, mb] = losses_and_peak<base, comm>(3);
  const auto moves = [&]<int Which>(std::integral_constant<int, Which>) {
    CAPTURE(Which);
    const auto [l, mem] = losses_and_peak<plan_for<gemma2_only<Which>, m::precision::fp32, m::optim::adamw<>,
                                                   m::train::batch<2, 16>>, comm>(3);
    CHECK(l != lb);
    CHECK(mem == mb);
  };
  moves(std::integral_constant<int, 0>{});
  moves(std::integral_constant<int, 1>{});
  moves(std::integral_constant<int, 2>{});
  moves(std::integral_constant<int, 3>{});
  moves(std::integral_constant<int, 4>{});
  moves(std::integral_constant<int, 5>{});
  using all = plan_for<gemma2<true>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>;
  using sel = plan_for<gemma2<true>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>;
  using full = plan_for<gemma2<true>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::full>;
  const auto [la, ma] = losses_and_peak<all, comm>(3);
  const auto [ls, ms] = losses_and_peak<sel, comm>(3);
  const auto [lf, mf] = losses_and_peak<full, comm>(3);
  CHECK(la != lb);
  CHECK(ma == mb);  // none of them holds a byte more
  CHECK(ls == la);
  CHECK(lf == la);
  CHECK(ms < ma);
  CHECK(mf < ma);
}

TEST_CASE("recomputation changes a Llama-shaped model's memory, not its numbers") {
  using none = plan_for<gqa_flash, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>;
  using full = plan_for<gqa_flash, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::full>;
  using sel = plan_for<gqa_flash, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::selective>;
  const auto [l0, m0] = losses_and_peak<none, comm>(3);
  const auto [l1, m1] = losses_and_peak<full, comm>(3);
  const auto [l2, m2] = losses_and_peak<sel, comm>(3);
  CHECK(l0 == l1);
  CHECK(l0 == l2);
  CHECK(m1 < m0);
}

TEST_CASE("a Llama-shaped model trains in mixed-bf16 close to fp32, and recomputation changes only its memory") {
  using fp32 = plan_for<gqa_flash, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>;
  using none = plan_for<gqa_flash_bf16, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>>;
  using full = plan_for<gqa_flash_bf16, m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<2, 16>, m::train::recompute::full>;
  const auto [l32, m32] = losses_and_peak<fp32, comm>(10, 3);
  const auto [l0, m0] = losses_and_peak<none, comm>(10, 3);
  const auto [l1, m1] = losses_and_peak<full, comm>(10, 3);
  CHECK(l0 == l1);  // recomputation replays the same bf16 arithmetic
  CHECK(m1 < m0);
  CHECK(m0 < m32);  // 16-bit weights, gradients and activations
  REQUIRE(l0.size() == l32.size());
  CHECK(l0.back() < l0.front());
  // bf16 keeps 8 significant bits (unit roundoff 2^-9); the fp32 master weights and AdamW states
  // keep the updates in fp32, so the two runs differ by the 16-bit forward/backward's rounding,
  // which averages out over the loss's reductions. Bound: 2^-8 of the fp32 loss (one bf16 ulp,
  // about 0.015 nats here); measured at most 2.2e-4 relative over these 10 steps.
  for (std::size_t s = 0; s < l0.size(); ++s) {
    CAPTURE(s);
    CHECK(std::abs(l0[s] - l32[s]) <= l32[s] / 256.0f);
  }
}

TEST_CASE("Llama-shaped plans the CPU runtime does not implement are named") {
  using m::exec::find_cpu_runtime_issue;
  using m::exec::find_runtime_issue;
  using m::exec::runtime_issue;
  const m::training_desc t = m::train::recipe<m::precision::fp32, m::optim::adamw<>, m::train::reference_kernels>::value;
  m::mesh_desc mesh{};
  CHECK(find_cpu_runtime_issue(gqa_flash::value, t, mesh) == runtime_issue::none);
  // The shared rule (the CUDA runtime's) still refuses them.
  CHECK(find_runtime_issue(gqa_flash::value, t, mesh) == runtime_issue::architecture);
  m::lm_config naive_gqa = gqa_flash::value;
  naive_gqa.flash = false;
  CHECK(find_cpu_runtime_issue(naive_gqa, t, mesh) == runtime_issue::heads);
  m::lm_config partial = gqa_flash::value;
  partial.rotary_dim = 4;  // partial rotary runs (GPT-NeoX's rotary_pct)
  CHECK(find_cpu_runtime_issue(partial, t, mesh) == runtime_issue::none);
  partial.rotary_dim = 3;  // an odd number of dimensions cannot rotate in pairs
  CHECK(find_cpu_runtime_issue(partial, t, mesh) == runtime_issue::architecture);
  partial.rotary_dim = 10;  // more than the head width (8)
  CHECK(find_cpu_runtime_issue(partial, t, mesh) == runtime_issue::architecture);
  // Qwen3's per-head QK-norm runs in RMSNorm blocks; in LayerNorm blocks it is no model's, and the
  // GPT-2 rule (the CUDA runtime's shared one) refuses it.
  CHECK(find_cpu_runtime_issue(qwen3<true>::value, t, mesh) == runtime_issue::none);
  CHECK(find_runtime_issue(qwen3<true>::value, t, mesh) == runtime_issue::architecture);
  m::lm_config qk_layernorm = qwen3<true>::value;
  qk_layernorm.rms_norm = false;
  CHECK(find_cpu_runtime_issue(qk_layernorm, t, mesh) == runtime_issue::architecture);
  mesh.dp = 2;
  mesh.world = 2;
  CHECK(find_cpu_runtime_issue(gqa_flash::value, t, mesh) == runtime_issue::none);  // tests/mpi: test_llama_parallel
  const m::training_desc bf16 =
      m::train::recipe<m::precision::mixed_bf16, m::optim::adamw<>, m::train::reference_kernels>::value;
  m::lm_config bf16_logits = gqa_flash::value;
  bf16_logits.logits = m::dtypes::bf16;
  CHECK(find_cpu_runtime_issue(bf16_logits, bf16, m::mesh_desc{}) == runtime_issue::none);
  CHECK(find_cpu_runtime_issue(gqa_flash::value, bf16, m::mesh_desc{}) == runtime_issue::logits);
  CHECK(find_cpu_runtime_issue(bf16_logits, bf16, mesh) == runtime_issue::none);  // 16-bit reductions over MPI
  const m::training_desc fp16 =
      m::train::recipe<m::precision::amp_fp16, m::optim::adamw<>, m::train::reference_kernels>::value;
  m::lm_config fp16_logits = gqa_flash::value;
  fp16_logits.logits = m::dtypes::fp16;
  CHECK(find_cpu_runtime_issue(fp16_logits, fp16, m::mesh_desc{}) == runtime_issue::none);
  CHECK(find_cpu_runtime_issue(fp16_logits, t, m::mesh_desc{}) == runtime_issue::logits);  // fp16 logits under fp32
  // GPT-2-style models follow the shared rule.
  CHECK(find_cpu_runtime_issue(naive32::value, t, m::mesh_desc{}) == runtime_issue::none);
}

TEST_CASE("a chunked loss changes the head's memory, not the losses beyond fp32 rounding") {
  using whole = plan_for<chunked<0>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>;
  using by8 = plan_for<chunked<8>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>;
  using by12 = plan_for<chunked<12>, m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>>;
  const auto [l0, m0] = losses_and_peak<whole, comm>(8, 3);
  const auto [l8, m8] = losses_and_peak<by8, comm>(8, 3);
  const auto [l12, m12] = losses_and_peak<by12, comm>(8, 3);
  // The logits (32 rows × 512) are the peak's transient: 8 and 12 rows of them instead of 32.
  CHECK(m8 < m12);
  CHECK(m12 < m0);
  CHECK(m0 - m8 <= (32 - 8) * 512 * sizeof(float));
  CHECK(m0 - m12 == (32 - 12) * 512 * sizeof(float));
  REQUIRE(l0.size() == l8.size());
  for (std::size_t s = 0; s < l0.size(); ++s) {  // the same sums, split into chunks: fp32 rounding
    CAPTURE(s);
    CHECK(std::abs(l8[s] - l0[s]) <= 1e-5f * l0[s]);
    CHECK(std::abs(l12[s] - l0[s]) <= 1e-5f * l0[s]);
  }
  CHECK(l8.back() < l8.front());
}

// SPDX-License-Identifier: BSL-1.0
// The step timeline: transients where they live, the peak as a maximum over the phases, and the
// configurations that cannot be planned.
#include <doctest/doctest.h>

#include <memalg/memalg.hpp>

#include <cstdint>

using namespace memalg;

namespace {
training_desc training(const precision_policy& p, std::uint64_t b, std::uint64_t s) {
  training_desc t{};
  t.stack = stack_kind::paper;  // the pytorch stack's timeline: test_stacks.cpp
  t.precision = p;
  t.optimizer = optim::adamw<>::value;
  t.micro_batch = b;
  t.sequence = s;
  return t;
}
mesh_desc mesh(std::uint64_t dp = 1, std::uint64_t tp = 1, std::uint64_t pp = 1, int zero = 0) {
  mesh_desc m{};
  m.dp = dp;
  m.tp = tp;
  m.pp = pp;
  m.zero_stage = zero;
  m.world = dp * tp * pp;
  return m;
}
const breakdown& at(const plan_result& r, phase p) { return r.most_loaded.at[static_cast<std::size_t>(p)]; }
constexpr std::uint64_t gpt2_block = 12 * 768 * 768 + 13 * 768;
}  // namespace

TEST_CASE("the peak is the maximum over the phases, not the sum of each category's maximum") {
  // A chunked loss keeps forward's transients large and backward's small; ZeRO-2's gradient
  // bucket exists only in backward: the categories peak in different phases.
  lm_config c = presets::gpt2_124m::config;
  c.flash = true;
  c.loss_chunk = 1024;
  const plan_result r = evaluate(transformer_lm(c), training(precision::amp_bf16::value, 8, 1024), mesh(8, 1, 1, 2),
                                 device::h200::value);
  bytes highest{};
  breakdown category_maxima{};
  for (const breakdown& b : r.most_loaded.at) {
    highest = max(highest, b.total());
    for (std::size_t c = 0; c < category_count; ++c)
      category_maxima[category(c)] = max(category_maxima[category(c)], b[category(c)]);
  }
  CHECK(r.peak() == highest);
  CHECK(r.per_rank.total() == at(r, r.peak_phase).total());
  CHECK(r.peak() < category_maxima.total());  // forward and backward transients never coexist
  CHECK(at(r, phase::forward).temporaries > at(r, phase::backward).temporaries);
  CHECK(at(r, phase::backward).comm_buffers > at(r, phase::forward).comm_buffers);
  // Phases in order: model states only, then activations, then the optimizer step.
  CHECK(at(r, phase::steady).activations.value == 0);
  CHECK(at(r, phase::forward).activations.value > 0);
  CHECK(at(r, phase::optimizer_step).activations.value == 0);
  CHECK(at(r, phase::steady).total() == at(r, phase::steady).model_states() + at(r, phase::steady).reserve);
}

TEST_CASE("fp32 logits at the loss: forward holds them, backward also their gradient") {
  const std::uint64_t T = 8 * 1024, v = 50257;
  const plan_result r = evaluate(presets::gpt2_124m::value, training(precision::amp_bf16::value, 8, 1024), mesh(),
                                 device::h200::value);
  CHECK(r.peak_phase == phase::backward);  // logits + their gradient on top of every saved tensor
  CHECK(at(r, phase::forward).temporaries.value == 4 * T * v + 2 * T * v);  // fp32 logits + bf16 projection output
  CHECK(at(r, phase::backward).temporaries.value >= 2 * 4 * T * v);
}

TEST_CASE("naive attention's scores are a forward transient; flash attention has none") {
  lm_config c = presets::gpt2_124m::config;
  c.vocab = 256;  // keep the logits small so that a block's transient is the largest
  const training_desc t = training(precision::amp_bf16::value, 8, 1024);
  const std::uint64_t scores = 12ULL * 1024 * 1024 * 8 * 2;
  const plan_result naive = evaluate(transformer_lm(c), t, mesh(), device::h200::value);
  CHECK(at(naive, phase::forward).temporaries.value >= scores);
  c.flash = true;
  const plan_result flash = evaluate(transformer_lm(c), t, mesh(), device::h200::value);
  CHECK(at(flash, phase::forward).temporaries.value < scores);
  CHECK(flash.per_rank.activations < naive.per_rank.activations);
}

TEST_CASE("ZeRO-3: gathered weights with the prefetch depth, the unsharded gradient in backward") {
  const training_desc t = training(precision::amp_bf16::value, 1, 1024);
  for (std::uint64_t prefetch : {0ULL, 1ULL, 2ULL}) {
    CAPTURE(prefetch);
    mesh_desc m = mesh(8, 1, 1, 3);
    m.zero3_prefetch = prefetch;
    const plan_result r = evaluate(presets::gpt2_124m::value, t, m, device::h200::value);
    // The largest instance is the tied embedding (50257·768), gathered in bf16.
    const std::uint64_t largest = 50257ULL * 768;
    const timeline& tl = r.most_loaded;
    const breakdown no_zero3 = stage_timeline(presets::gpt2_124m::value, t, mesh(8, 1, 1, 2), device::h200::value, 0)
                                   .at[static_cast<std::size_t>(phase::forward)];
    CHECK(tl.at[1].temporaries.value - no_zero3.temporaries.value == 2 * largest * (1 + prefetch));
    CHECK(tl.at[2].temporaries.value >= 2 * largest * (1 + prefetch) + 4 * largest);
  }
}

TEST_CASE("sequence parallelism: an all-gather buffer of the layer input while a layer runs") {
  training_desc t = training(precision::amp_bf16::value, 1, 2048);
  mesh_desc m = mesh(1, 4);
  const plan_result tp = evaluate(presets::llama2_7b::value, t, m, device::h200::value);
  m.sequence_parallel = true;
  const plan_result sp = evaluate(presets::llama2_7b::value, t, m, device::h200::value);
  CHECK(at(tp, phase::forward).comm_buffers.value == 0);
  CHECK(at(sp, phase::forward).comm_buffers.value == 2ULL * 2048 * 4096);  // the gathered s·b·h, bf16
  CHECK(sp.per_rank.activations < tp.per_rank.activations);
}

TEST_CASE("ZeRO-2: one layer's unsharded gradient waits in a bucket before its reduce-scatter") {
  const training_desc t = training(precision::amp_bf16::value, 1, 1024);
  const plan_result z2 = evaluate(presets::gpt2_124m::value, t, mesh(8, 1, 1, 2), device::h200::value);
  // The largest trainable instance is the tied embedding; gradients are fp32 under amp-bf16.
  CHECK(at(z2, phase::backward).comm_buffers.value == 4ULL * 50257 * 768);
  const plan_result z1 = evaluate(presets::gpt2_124m::value, t, mesh(8, 1, 1, 1), device::h200::value);
  CHECK(at(z1, phase::backward).comm_buffers.value == 0);  // all-reduce in place in the gradient buffer
  (void)gpt2_block;
}

TEST_CASE("optimizer step: fp16 gradients are upcast to fp32 for the update") {
  const training_desc fp16 = training(precision::amp_fp16::value, 1, 1024);
  const plan_result r = evaluate(presets::gpt2_124m::value, fp16, mesh(4, 1, 1, 1), device::h200::value);
  CHECK(at(r, phase::optimizer_step).temporaries == at(r, phase::optimizer_step).master_weights);
  const plan_result bf = evaluate(presets::gpt2_124m::value, training(precision::amp_bf16::value, 1, 1024),
                                  mesh(4, 1, 1, 1), device::h200::value);
  CHECK(at(bf, phase::optimizer_step).temporaries.value == 0);  // gradients already fp32
}

TEST_CASE("parameter-count models keep the ZeRO paper's numbers whatever the sequence") {
  training_desc t = training(precision::amp_fp16::value, 16, 2048);
  t.optimizer = optim::adam<>::value;
  const std::uint64_t psi = 7'500'000'000;
  const bytes expected[] = {bytes{120'000'000'000}, bytes{31'406'250'000}, bytes{16'640'625'000},
                            bytes{1'875'000'000}};
  for (int z = 0; z < 4; ++z) {
    const plan_result r = evaluate(parameter_count_model(psi), t, mesh(64, 1, 1, z), device::a100_80gb::value);
    CHECK(r.per_rank.model_states() == expected[z]);
    CHECK(r.per_rank.activations.value == 0);
    if (z < 3) CHECK(r.per_rank.total() == expected[z] + device::a100_80gb::value.reserve);
  }
}

TEST_CASE("the most loaded stage and its phase are reported") {
  training_desc t = training(precision::amp_bf16::value, 1, 4096);
  t.grad_accum = 8;
  const plan_result r = evaluate(presets::llama2_13b::value, t, mesh(1, 1, 4), device::h200::value);
  CHECK(r.most_loaded_stage == 0);
  CHECK(r.peak_phase == phase::backward);
  for (std::uint64_t s = 1; s < 4; ++s)
    CHECK(stage_timeline(presets::llama2_13b::value, t, mesh(1, 1, 4), device::h200::value, s).peak().total() <=
          r.peak());
}

TEST_CASE("configurations that cannot be planned are named") {
  const training_desc t = training(precision::amp_bf16::value, 1, 4096);
  const device_desc d = device::h100_80gb::value;
  const auto error = [&](const model_desc& m, const training_desc& tr, const mesh_desc& me) {
    return plan_error(m, tr, me, d);
  };
  CHECK(error(presets::llama2_7b::value, t, mesh(1, 3)) == "the tensor-parallel degree does not divide the attention heads");
  CHECK(error(presets::llama2_70b::value, t, mesh(1, 16)) ==
        "the tensor-parallel degree does not divide the key/value heads");
  lm_config odd = presets::llama2_7b::config;
  odd.ffn = 11009;
  CHECK(error(transformer_lm(odd), t, mesh(1, 2)) == "the tensor-parallel degree does not divide the MLP width");
  CHECK(error(presets::gpt2_124m::value, training(precision::amp_bf16::value, 1, 1024), mesh(1, 2)) ==
        "the tensor-parallel degree does not divide the vocabulary");
  CHECK(error(presets::gpt2_124m::value, training(precision::amp_bf16::value, 1, 2048), mesh()) ==
        "the sequence is longer than the learned position embedding");
  mesh_desc cp = mesh(1);
  cp.cp = 3;
  cp.world = 3;
  CHECK(error(presets::llama2_7b::value, t, cp) == "the context-parallel degree does not divide the sequence length");
  mesh_desc sp = mesh(1, 8);
  sp.sequence_parallel = true;
  CHECK(error(presets::llama2_7b::value, training(precision::amp_bf16::value, 1, 4100), sp) ==
        "the tensor-parallel degree does not divide the sequence length under sequence parallelism");
  CHECK(error(presets::llama2_7b::value, t, mesh(1, 1, 64)) == "the pipeline has more stages than the model has layers");
  mesh_desc ep = mesh(16);
  ep.ep = 16;
  CHECK(error(presets::mixtral_8x7b::value, t, ep) == "the expert-parallel degree does not divide the experts");
  lm_config gqa = presets::llama2_7b::config;
  gqa.kv_heads = 5;
  CHECK(error(transformer_lm(gqa), t, mesh()) == "the key/value heads do not divide the attention heads");
  model_desc zero{};
  zero.push(embedding_layer(100, 64));
  zero.push(mlp_layer(64, 0));
  CHECK(error(zero, t, mesh()) == "a layer has a zero dimension");
  CHECK(error(presets::llama2_7b::value, t, mesh(1, 4)).empty());
  CHECK(find_plan_issue(presets::llama2_7b::value, t, mesh(1, 3), d) == plan_issue::tp_does_not_divide_heads);
}

TEST_CASE("report: per-phase and per-layer tables") {
  using p = plan<presets::gpt2_124m, train::recipe<precision::amp_bf16, optim::adamw<>, train::batch<8, 1024>>,
                 parallel::mesh<parallel::data<8, parallel::zero<1>>>, device::a100_80gb>;
  const std::string text = report<p>();
  CHECK(text.find("optimizer_step") != std::string::npos);
  CHECK(text.find("<- peak") != std::string::npos);
  CHECK(text.find("block") != std::string::npos);
  CHECK(text.find("  attention") != std::string::npos);
  CHECK(text.find("  mlp") != std::string::npos);
  CHECK(text.find("micro-batches in flight") != std::string::npos);
  const layer_rows rows = layer_table(p::model, p::training, p::mesh, 0);
  CHECK(rows.size == 6);
  CHECK(rows.rows[3].count == 12);
  CHECK(rows.rows[3].weights.value == 2 * gpt2_block);
}

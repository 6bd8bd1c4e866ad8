// SPDX-License-Identifier: BSL-1.0
// Saved activations per layer against Korthikanti et al. 2022 (arXiv 2205.05198), Table 2 and §4,
// and the layer variants, recomputation, context parallelism and pipeline schedules.
#include <doctest/doctest.h>

#include <memalg/memalg.hpp>

#include <cstdint>
#include <vector>

using namespace memalg;

namespace {

struct shape {
  std::uint64_t s, b, h, a;
};

// Korthikanti's assumptions: 16-bit activations, dropout p > 0, naive attention, GeLU MLP of 4h,
// LayerNorm.
layer_desc korthikanti_block(const shape& x) {
  layer_shape s{};
  s.hidden = x.h;
  s.heads = x.a;
  s.ffn = 4 * x.h;
  s.dropout_permille = 100;
  s.flags = layer_flags::bias | layer_flags::causal;
  return transformer_block_layer(s);
}

activation_context context(const shape& x, std::uint64_t t, bool sp, dtype act = dtypes::bf16, std::uint64_t cp = 1) {
  activation_context c{};
  c.stack = stack_kind::paper;  // the paper's accounting (Korthikanti et al.); the pytorch stack: test_stacks.cpp
  c.micro_batch = x.b;
  c.sequence = x.s;
  c.act = act;
  c.tp = t;
  c.sp = sp;
  c.cp = cp;
  return c;
}

training_desc training(std::uint64_t b, std::uint64_t s, recompute_kind r = recompute_kind::none) {
  training_desc t{};
  t.stack = stack_kind::paper;
  t.precision = precision::amp_bf16::value;
  t.optimizer = optim::adamw<>::value;
  t.micro_batch = b;
  t.sequence = s;
  t.recompute = r;
  return t;
}

mesh_desc mesh(std::uint64_t dp = 1, std::uint64_t tp = 1, std::uint64_t pp = 1, bool sp = false) {
  mesh_desc m{};
  m.dp = dp;
  m.tp = tp;
  m.pp = pp;
  m.sequence_parallel = sp;
  m.world = dp * tp * pp;
  return m;
}

const std::vector<shape> shapes{
    {2048, 1, 12288, 96},  // GPT-3 175B
    {1024, 4, 768, 12},    // GPT-2 124M
    {4096, 2, 4096, 32},   // 7B-class
    {512, 8, 1600, 25},    // GPT-2 XL
    {2048, 3, 2048, 16},
};

}  // namespace

TEST_CASE("Korthikanti et al. 2022 Table 2: all six rows, exactly, for any s, b, h, a, t") {
  for (const shape& x : shapes) {
    const layer_desc block = korthikanti_block(x);
    const std::uint64_t sbh = x.s * x.b * x.h;
    const std::uint64_t as2b = x.a * x.s * x.s * x.b;
    for (std::uint64_t t = 1; t <= x.a; ++t) {
      if (x.a % t != 0 || x.h % t != 0) continue;
      CAPTURE(x.s);
      CAPTURE(x.b);
      CAPTURE(x.h);
      CAPTURE(x.a);
      CAPTURE(t);
      const layer_activations tp = layer_activation_bytes(block, context(x, t, false), false);
      // sbh(10 + 24/t + 5as/(ht)) — at t = 1 the "no parallelism" row sbh(34 + 5as/h).
      CHECK(tp.saved.value == 10 * sbh + 24 * sbh / t + 5 * as2b / t);
      if (t == 1) CHECK(tp.saved.value == 34 * sbh + 5 * as2b);
      // Selective recomputation: sbh(10 + 24/t).
      CHECK(tp.selective.value == 10 * sbh + 24 * sbh / t);
      // Full recomputation: the layer input, 2sbh.
      CHECK(tp.input.value == 2 * sbh);
      if (t > 1) {
        const layer_activations sp = layer_activation_bytes(block, context(x, t, true), false);
        CHECK(sp.saved.value == 34 * sbh / t + 5 * as2b / t);  // sbh(34/t + 5as/(ht))
        CHECK(sp.selective.value == 34 * sbh / t);             // sbh·34/t
        CHECK(sp.input.value == 2 * sbh / t);                  // the sequence-split input
      }
    }
  }
}

TEST_CASE("Table 2 through the plan: per-layer rows of a GPT-3 block under each recomputation") {
  const shape x{2048, 1, 12288, 96};
  const std::uint64_t sbh = x.s * x.b * x.h, as2b = x.a * x.s * x.s * x.b;
  const model_desc gpt3 = presets::gpt3_175b::value;
  const auto row = [&](recompute_kind r, std::uint64_t t, bool sp) {
    const layer_rows rows = layer_table(gpt3, training(x.b, x.s, r), mesh(1, t, 1, sp), 0);
    REQUIRE(rows.rows[3].kind == layer_kind::transformer_block);
    return rows.rows[3].activations.value;
  };
  CHECK(row(recompute_kind::none, 1, false) == 34 * sbh + 5 * as2b);
  CHECK(row(recompute_kind::none, 8, false) == 10 * sbh + 3 * sbh + as2b * 5 / 8);
  CHECK(row(recompute_kind::none, 8, true) == 34 * sbh / 8 + 5 * as2b / 8);
  CHECK(row(recompute_kind::selective, 8, false) == 13 * sbh);
  CHECK(row(recompute_kind::selective, 8, true) == 34 * sbh / 8);
  CHECK(row(recompute_kind::full, 8, false) == 2 * sbh);
}

TEST_CASE("§4.1 breakdown per sub-layer: attention 11sbh + 5as²b, MLP 19sbh, norms 4sbh") {
  for (const shape& x : shapes) {
    CAPTURE(x.h);
    const std::uint64_t sbh = x.s * x.b * x.h, as2b = x.a * x.s * x.s * x.b;
    const block_parts p = sublayer_activations(korthikanti_block(x), context(x, 1, false));
    CHECK(p.attention.total().value == 11 * sbh + 5 * as2b);
    CHECK(p.attention.core.value == 5 * as2b);
    CHECK(p.mlp.total().value == 19 * sbh);
    CHECK(p.norms.total().value == 4 * sbh);
    CHECK(p.cross_attention.total().value == 0);
  }
}

TEST_CASE("attention variants: flash, grouped-query and multi-query, causal or not") {
  const shape x{4096, 2, 4096, 32};
  const std::uint64_t T = x.s * x.b, h = x.h, d = 128;
  layer_shape s{};
  s.hidden = h;
  s.heads = 32;
  s.ffn = 4 * h;
  s.flags = layer_flags::flash | layer_flags::causal;
  const activation_context c = context(x, 1, false);

  // Flash, multi-head, no dropout: attention = QKV input + Q + K + V + output (2 bytes each) +
  // an fp32 log-sum-exp per head and token; no s² term.
  block_parts p = sublayer_activations(transformer_block_layer(s), c);
  CHECK(p.attention.total().value == 2 * T * h * 5 + 4 * T * 32);
  CHECK(p.attention.core.value == 4 * T * 32);

  // Grouped-query (8 key/value heads): K and V shrink to 8·d wide.
  s.kv_heads = 8;
  p = sublayer_activations(transformer_block_layer(s), c);
  CHECK(p.attention.total().value == 2 * T * h * 3 + 2 * 2 * T * 8 * d + 4 * T * 32);
  // Multi-query: one key/value head.
  s.kv_heads = 1;
  p = sublayer_activations(transformer_block_layer(s), c);
  CHECK(p.attention.total().value == 2 * T * h * 3 + 2 * 2 * T * d + 4 * T * 32);

  // Naive attention stores K and V expanded to all heads (repeat before the matmul).
  s.flags = layer_flags::causal;
  s.kv_heads = 8;
  const std::uint64_t naive_gqa = sublayer_activations(transformer_block_layer(s), c).attention.total().value;
  s.kv_heads = 32;
  CHECK(naive_gqa == sublayer_activations(transformer_block_layer(s), c).attention.total().value);

  // Causal masking changes no saved bytes.
  const std::uint64_t causal = sublayer_activations(transformer_block_layer(s), c).attention.total().value;
  s.flags = 0;
  CHECK(sublayer_activations(transformer_block_layer(s), c).attention.total().value == causal);
}

TEST_CASE("no dropout: no masks and no dropout output (32sbh + 2as²b)") {
  const shape x{1024, 4, 768, 12};
  layer_desc block = korthikanti_block(x);
  block.shape.dropout_permille = 0;
  const std::uint64_t sbh = x.s * x.b * x.h, as2b = x.a * x.s * x.s * x.b;
  CHECK(layer_activation_bytes(block, context(x, 1, false), false).saved.value == 32 * sbh + 2 * as2b);
}

TEST_CASE("activation dtype: fp32 doubles everything but the 1-byte masks") {
  const shape x{1024, 4, 768, 12};
  const std::uint64_t sbh = x.s * x.b * x.h, as2b = x.a * x.s * x.s * x.b;
  const layer_activations a = layer_activation_bytes(korthikanti_block(x), context(x, 1, false, dtypes::fp32), false);
  // 16-bit tensors: 32sbh + 4as²b of the 34sbh + 5as²b; masks (two residual, one on the
  // attention probabilities): 2sbh + as²b.
  CHECK(a.saved.value == 2 * (32 * sbh + 4 * as2b) + 2 * sbh + as2b);
}

TEST_CASE("gated MLP (SwiGLU): input 2sbh, gate and up 4sbf, down input 2sbf") {
  const shape x{2048, 2, 4096, 32};
  const std::uint64_t T = x.s * x.b, f = 11008;
  const layer_activations a = layer_activation_bytes(gated_mlp_layer(4096, f), context(x, 1, false), false);
  CHECK(a.saved.value == 2 * T * 4096 + 6 * T * f);
  // Tensor parallel: only the inner tensors split.
  const layer_activations t4 = layer_activation_bytes(gated_mlp_layer(4096, f), context(x, 4, false), false);
  CHECK(t4.saved.value == 2 * T * 4096 + 6 * T * f / 4);
}

TEST_CASE("context parallelism splits the sequence; naive scores are (s/c)·s per head") {
  const shape x{4096, 1, 2048, 16};
  const std::uint64_t sbh = x.s * x.b * x.h, as2b = x.a * x.s * x.s * x.b;
  for (std::uint64_t cp : {2ULL, 4ULL, 8ULL}) {
    CAPTURE(cp);
    const layer_activations a =
        layer_activation_bytes(korthikanti_block(x), context(x, 1, false, dtypes::bf16, cp), false);
    CHECK(a.saved.value == 34 * sbh / cp + 5 * as2b / cp);
    CHECK(a.comm.value > 0);  // the key/value ring buffers
  }
}

TEST_CASE("mixture of experts: routed tokens, capacity factor") {
  const shape x{1024, 2, 1024, 16};
  const std::uint64_t T = x.s * x.b, h = 1024, f = 2048, E = 8;
  layer_shape s{};
  s.hidden = h;
  s.ffn = f;
  s.experts = E;
  s.top_k = 2;
  s.flags = layer_flags::gated;
  const activation_context c = context(x, 1, false);
  const auto expected = [&](std::uint64_t R) {
    return 2 * T * h + 4 * T * E + R * (2 * h + 6 * f + 2 * h);
  };
  CHECK(layer_activation_bytes(moe_layer(s), c, false).saved.value == expected(2 * T));  // dropless
  s.capacity_factor_percent = 125;  // capacity ⌈1.25·2·T/8⌉ per expert
  CHECK(layer_activation_bytes(moe_layer(s), c, false).saved.value ==
        expected(E * ((125 * 2 * T + 100 * E - 1) / (100 * E))));
}

TEST_CASE("convolution, linear and dropout layers") {
  const shape x{1000, 3, 512, 8};
  const std::uint64_t T = x.s * x.b;
  const activation_context c = context(x, 1, false, dtypes::fp32);
  // conv1d with batch norm, a nonlinearity and dropout: input, BN input, activation output (fp32), mask.
  const layer_desc conv = conv1d_layer(80, 512, 5, layer_flags::bias | layer_flags::batchnorm | layer_flags::activation, 500);
  CHECK(layer_activation_bytes(conv, c, false).saved.value == 4 * T * 80 + 4 * T * 512 * 2 + T * 512);
  CHECK(conv.params == 80 * 512 * 5 + 512 + 2 * 512);
  CHECK(layer_activation_bytes(linear_layer(512, 256), c, false).saved.value == 4 * T * 512);
  CHECK(layer_activation_bytes(dropout_layer(512, 100), c, false).saved.value == T * 512);
  CHECK(layer_activation_bytes(dropout_layer(512, 0), c, false).saved.value == 0);
}

TEST_CASE("output layer: the logits (fp32 by default) and their gradient are transients; chunking shrinks them") {
  const shape x{1024, 8, 768, 12};
  const std::uint64_t T = x.s * x.b, v = 50304;
  const activation_context c = context(x, 1, false);
  const layer_activations a = layer_activation_bytes(output_layer(768, v), c, true);
  CHECK(a.saved.value == 2 * T * 768);
  CHECK(a.forward_temporary.value == 4 * T * v + 2 * T * v);       // fp32 logits + the bf16 projection output
  CHECK(a.backward_temporary.value == 2 * 4 * T * v + 2 * T * 768);  // logits + their gradient, the hidden gradient
  const layer_activations bf = layer_activation_bytes(output_layer(768, v, 0, dtypes::bf16), c, true);
  CHECK(bf.forward_temporary.value == 2 * T * v);
  const layer_activations chunked = layer_activation_bytes(output_layer(768, v, 0, dtypes::none, 1024), c, true);
  CHECK(chunked.forward_temporary.value == 2 * 4 * 1024 * v);
  // Vocabulary-parallel: each rank holds v/t columns of the logits.
  const layer_activations t4 = layer_activation_bytes(output_layer(768, v), context(x, 4, false), true);
  CHECK(t4.forward_temporary.value == (4 + 2) * T * v / 4);
}

namespace {
bytes peak_activations(const model_desc& m, const training_desc& t, const mesh_desc& me) {
  return evaluate(m, t, me, device::h200::value).per_rank.activations;
}
bytes stage_saved(const model_desc& m, const training_desc& t, const mesh_desc& me, std::uint64_t stage) {
  const timeline tl = stage_timeline(m, t, me, device::h200::value, stage);
  return tl.at[static_cast<int>(phase::forward)].activations;
}
model_desc blocks_only(std::uint64_t layers, const shape& x) {
  model_desc m{};
  layer_desc b = korthikanti_block(x);
  b.count = layers;
  b.place = placement::repeated;
  m.push(b);
  return m;
}
}  // namespace

TEST_CASE("recomputation: full keeps inputs and rebuilds one layer in backward; every:1 is full") {
  const shape x{2048, 1, 4096, 32};
  const model_desc m = blocks_only(24, x);
  const std::uint64_t sbh = x.s * x.b * x.h, as2b = x.a * x.s * x.s * x.b;
  const std::uint64_t layer = 34 * sbh + 5 * as2b;
  CHECK(peak_activations(m, training(1, 2048), mesh()).value == 24 * layer);
  CHECK(peak_activations(m, training(1, 2048, recompute_kind::selective), mesh()).value == 24 * 34 * sbh);
  training_desc full = training(1, 2048, recompute_kind::full);
  const plan_result f = evaluate(m, full, mesh(), device::h200::value);
  CHECK(f.per_rank.activations.value == 24 * 2 * sbh);
  CHECK(f.peak_phase == phase::backward);
  // The transient recomputed layer: its saved set less the checkpointed input it reuses.
  const breakdown bwd = f.most_loaded.at[static_cast<int>(phase::backward)];
  const breakdown steady = f.most_loaded.at[static_cast<int>(phase::steady)];
  CHECK(bwd.temporaries.value >= layer - 2 * sbh);
  training_desc every1 = training(1, 2048, recompute_kind::every_k);
  every1.recompute_every = 1;
  CHECK(evaluate(m, every1, mesh(), device::h200::value).per_rank.total() == f.per_rank.total());
  // every:4 keeps 6 inputs and rebuilds 4 layers at a time.
  training_desc every4 = every1;
  every4.recompute_every = 4;
  const plan_result e4 = evaluate(m, every4, mesh(), device::h200::value);
  CHECK(e4.per_rank.activations.value == 6 * 2 * sbh);
  CHECK(e4.most_loaded.at[static_cast<int>(phase::backward)].temporaries.value >= 4 * layer - 2 * sbh);
  CHECK(steady.activations.value == 0);
}

TEST_CASE("activation offload: the host holds the saved tensors, the device a two-layer window") {
  const shape x{2048, 1, 4096, 32};
  const model_desc m = blocks_only(24, x);
  training_desc t = training(1, 2048);
  t.offload_activations = true;
  const plan_result r = evaluate(m, t, mesh(), device::h200::value);
  const std::uint64_t layer = 34 * x.s * x.b * x.h + 5 * x.a * x.s * x.s * x.b;
  CHECK(r.host_per_rank.activations.value == 24 * layer);
  CHECK(r.per_rank.activations.value == 2 * layer);
}

TEST_CASE("pipeline schedules: 1F1B, interleaved, GPipe; the most loaded stage is reported") {
  const shape x{2048, 1, 4096, 32};
  const std::uint64_t L = 32, p = 4;
  const model_desc m = blocks_only(L, x);
  const std::uint64_t layer = 34 * x.s * x.b * x.h + 5 * x.a * x.s * x.s * x.b;
  training_desc t = training(1, 2048);
  t.grad_accum = 16;
  mesh_desc pipe = mesh(1, 1, p);
  // 1F1B: stage i holds p − i micro-batches of its L/p layers; the first stage L layers' worth.
  for (std::uint64_t i = 0; i < p; ++i) CHECK(stage_saved(m, t, pipe, i).value == (p - i) * (L / p) * layer);
  const plan_result r = evaluate(m, t, pipe, device::h200::value);
  CHECK(r.most_loaded_stage == 0);
  CHECK(r.per_rank.activations.value == L * layer);
  CHECK(r.most_loaded.chunks_in_flight == p);
  // Fewer micro-batches than stages: only those are in flight.
  training_desc few = t;
  few.grad_accum = 2;
  CHECK(stage_saved(m, few, pipe, 0).value == 2 * (L / p) * layer);
  // Interleaved with v virtual stages: the first stage holds L·(1 + (p−1)/(p·v)) layers' worth.
  for (std::uint64_t v : {2ULL, 4ULL}) {
    CAPTURE(v);
    mesh_desc inter = pipe;
    inter.schedule = pipeline_schedule::interleaved;
    inter.virtual_stages = v;
    const std::uint64_t expected = L * layer + (L * layer) * (p - 1) / (p * v);
    CHECK(stage_saved(m, t, inter, 0).value == expected);
  }
  // GPipe: every stage holds all m micro-batches.
  mesh_desc gpipe = pipe;
  gpipe.schedule = pipeline_schedule::gpipe;
  for (std::uint64_t i = 0; i < p; ++i) CHECK(stage_saved(m, t, gpipe, i).value == 16 * (L / p) * layer);
}

TEST_CASE("pipeline: the first stage holds the embedding, the last the output layer and its logits") {
  const model_desc gpt = presets::gpt2_350m::value;
  training_desc t = training(4, 1024);
  t.grad_accum = 8;
  const mesh_desc pipe = mesh(1, 1, 4);
  const layer_rows first = layer_table(gpt, t, pipe, 0), last = layer_table(gpt, t, pipe, 3);
  CHECK(first.rows[0].count == 1);  // embedding
  CHECK(last.rows[0].count == 0);
  CHECK(first.rows[5].count == 0);  // output
  CHECK(last.rows[5].count == 1);
  CHECK(first.rows[3].count == 6);  // 24 blocks over 4 stages
  const timeline tl_last = stage_timeline(gpt, t, pipe, device::h200::value, 3);
  const timeline tl_first = stage_timeline(gpt, t, pipe, device::h200::value, 0);
  // fp32 logits and their gradient only on the last stage.
  CHECK(tl_last.at[static_cast<int>(phase::backward)].temporaries.value >= 2 * 4ULL * 4 * 1024 * 50257);
  CHECK(tl_first.at[static_cast<int>(phase::backward)].temporaries.value < 4ULL * 4 * 1024 * 50257);
  CHECK(evaluate(gpt, t, pipe, device::h200::value).most_loaded_stage == 0);
}

TEST_CASE("gradient accumulation adds no activations; the persistent gradient buffer is in every phase") {
  const model_desc gpt = presets::gpt2_124m::value;
  const training_desc one = training(8, 1024);
  training_desc four = one;
  four.grad_accum = 4;
  const plan_result a = evaluate(gpt, one, mesh(), device::h200::value);
  const plan_result b = evaluate(gpt, four, mesh(), device::h200::value);
  CHECK(a.per_rank.total() == b.per_rank.total());
  CHECK(a.per_rank.activations == b.per_rank.activations);
  for (const breakdown& at : b.most_loaded.at) CHECK(at.gradients == a.per_rank.gradients);
}

TEST_CASE("activations scale linearly with the micro-batch, and the peak never decreases with it") {
  const model_desc llama = presets::llama2_7b::value;
  bytes previous{};
  for (std::uint64_t b = 1; b <= 8; ++b) {
    const plan_result r = evaluate(llama, training(b, 4096), mesh(8), device::h200::value);
    CHECK(r.most_loaded.activations_per_micro_batch.value ==
          b * evaluate(llama, training(1, 4096), mesh(8), device::h200::value).most_loaded.activations_per_micro_batch.value);
    CHECK(r.peak() >= previous);
    previous = r.peak();
  }
}

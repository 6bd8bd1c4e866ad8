// SPDX-License-Identifier: BSL-1.0
// Frozen and compressed weights: frozen layers, QLoRA, structured pruning, 2:4 sparsity and
// knowledge distillation.
#include <doctest/doctest.h>

#include <memalg/memalg.hpp>

#include <cstdint>

using namespace memalg;

namespace {
training_desc training(std::uint64_t b, std::uint64_t s) {
  training_desc t{};
  t.stack = stack_kind::paper;
  t.precision = precision::amp_bf16::value;
  t.optimizer = optim::adamw<>::value;
  t.micro_batch = b;
  t.sequence = s;
  return t;
}
const mesh_desc single{};
plan_result run(const model_desc& m, const training_desc& t = training(1, 1024)) {
  return evaluate(m, t, single, device::h200::value);
}
const breakdown& at(const plan_result& r, phase p) { return r.most_loaded.at[static_cast<std::size_t>(p)]; }

using block = model::transformer_block<1024, 16, 4096, model::opt::dropout<100>>;
constexpr std::uint64_t block_params = 12 * 1024 * 1024 + 13 * 1024;
}  // namespace

TEST_CASE("a frozen layer has weights only; a fully frozen model saves no activations") {
  using frozen_model = model::frozen<model::repeat<4, block>>;
  const plan_result r = run(frozen_model::value);
  CHECK(r.per_rank.weights.value == 2 * 4 * block_params);
  CHECK(r.per_rank.gradients.value == 0);
  CHECK(r.per_rank.optimizer_states.value == 0);
  CHECK(r.per_rank.master_weights.value == 0);
  CHECK(r.per_rank.activations.value == 0);
  CHECK(frozen_model::value.trainable_parameters() == 0);
}

TEST_CASE("frozen layers keep activations only where backward must pass through them") {
  const activation_context c = activation_context_of(training(2, 1024), single);
  const layer_desc trained = block::descriptor;
  layer_desc frozen = trained;
  frozen.trainable = false;
  const layer_activations full = layer_activation_bytes(trained, c, false);
  // Nothing trainable before it: no backward through it at all.
  CHECK(layer_activation_bytes(frozen, c, false).saved.value == 0);
  // A trainable layer before it: the inputs of its matrix products are not needed (no weight
  // gradients), the rest is: 4sbh + 8sbf/... i.e. everything but QKV, out-proj, fc1, fc2 inputs.
  const std::uint64_t T = 2 * 1024, h = 1024, f = 4096;
  const std::uint64_t weight_inputs = 2 * T * h /*QKV*/ + 2 * T * h /*out-proj*/ + 2 * T * h /*fc1*/ + 2 * T * f /*fc2*/;
  CHECK(layer_activation_bytes(frozen, c, true).saved.value == full.saved.value - weight_inputs);

  // In a model: trainable head on a frozen trunk saves nothing for the trunk; a frozen top on a
  // trainable bottom keeps its gradient path.
  using trunk_frozen = model::sequential<model::frozen<model::repeat<4, block>>, model::repeat<2, block>>;
  using top_frozen = model::sequential<model::repeat<2, block>, model::frozen<model::repeat<4, block>>>;
  const bytes one = full.saved;
  CHECK(run(trunk_frozen::value, training(2, 1024)).per_rank.activations == one * 2);
  CHECK(run(top_frozen::value, training(2, 1024)).per_rank.activations.value ==
        2 * one.value + 4 * (one.value - weight_inputs));
}

TEST_CASE("QLoRA: NF4 base with double quantization, fp32 rank-r adapters, gradients for adapters only") {
  constexpr std::uint64_t r = 64;
  using q = model::qlora<r, presets::llama2_7b>;
  const model_desc m = q::value;
  const model_desc base = presets::llama2_7b::value;
  const layer_desc& llama_block = base.entries[1];
  // Each block: 7 matrices (q, k, v, o, gate, up, down); adapters r·Σ(in + out).
  const std::uint64_t adapters = r * (4 * (4096 + 4096) + 3 * (4096 + 11008));
  CHECK(llama_block.matrix_rows_plus_cols == 4 * (4096 + 4096) + 3 * (4096 + 11008));
  CHECK(m.trainable_parameters() == 32 * adapters);
  const plan_result res = run(m, training(1, 2048));
  const std::uint64_t matrices = llama_block.matrix_params;
  const bytes nf4 = storage_bytes(dtypes::nf4_double_quant, matrices);
  CHECK(nf4.value == matrices / 2 + matrices / 64 + matrices / 64 / 256 * 4);
  // Weights: NF4 matrices + bf16 norms per block, fp32 adapters (PEFT's autocast_adapter_dtype,
  // their own master copy), bf16 embedding / final norm / output.
  const std::uint64_t expected_weights = 32 * (nf4.value + 2 * 2 * 4096 + 4 * adapters) + 2 * (2 * 32000 * 4096 + 4096);
  CHECK(res.per_rank.weights.value == expected_weights);
  CHECK(res.per_rank.gradients.value == 4 * 32 * adapters);          // fp32 gradients of the adapters
  CHECK(res.per_rank.optimizer_states.value == 8 * 32 * adapters);   // AdamW: two fp32 states
  CHECK(res.per_rank.master_weights.value == 0);
  // Activations: every block keeps its inputs (the adapters need them), plus x·A per matrix; the
  // frozen final norm keeps its input (the gradient passes through it), the frozen output layer
  // nothing (its input serves only a weight gradient).
  const activation_context c = activation_context_of(training(1, 2048), single);
  const bytes block_saved = layer_activation_bytes(llama_block, c, true).saved;
  CHECK(res.most_loaded.activations_per_micro_batch.value ==
        32 * (block_saved.value + 2 * 2048 * r * 7) + 2 * 2048 * 4096 /* final norm */);
}

TEST_CASE("structured pruning: fewer heads and a narrower MLP, fewer parameters and activations") {
  using pruned = model::pruned<model::repeat<4, block>, 8, 2048>;
  const model_desc m = pruned::value;
  const std::uint64_t h = 1024, q = 8 * 64;
  CHECK(m.entries[0].shape.heads == 8);
  CHECK(m.entries[0].shape.kv_heads == 8);
  CHECK(m.entries[0].params == (4 * h + 4 * h * q + 3 * q + h) + (2 * h * 2048 + 2048 + h));
  CHECK(run(m).per_rank.activations < run(model::repeat<4, block>::value).per_rank.activations);
}

TEST_CASE("2:4 semi-structured sparsity: half the values plus a 2-bit index each") {
  using sparse = model::sparse_2_4<model::repeat<4, block>>;
  const model_desc m = sparse::value;
  const std::uint64_t matrices = 12ULL * 1024 * 1024, rest = block_params - matrices;
  REQUIRE(m.size == 2);
  CHECK(m.entries[0].params == matrices / 2);
  CHECK(m.entries[1].params == rest);
  const plan_result r = run(m);
  CHECK(r.per_rank.weights.value == 4 * ((matrices / 2) * 18 / 8 + 2 * rest));
  CHECK(r.per_rank.gradients.value == 4 * 4 * (matrices / 2 + rest));
  CHECK(r.per_rank.activations == run(model::repeat<4, block>::value).per_rank.activations);  // dense activations
}

TEST_CASE("knowledge distillation: the teacher's weights and logits, no teacher gradients or saved tensors") {
  using d = model::distill<presets::gpt2_774m, presets::gpt2_124m>;
  const model_desc m = d::value;
  CHECK(m.parameters() == presets::gpt2_774m::value.parameters() + presets::gpt2_124m::value.parameters());
  CHECK(m.trainable_parameters() == presets::gpt2_124m::value.parameters());
  const training_desc t = training(4, 1024);
  const plan_result student = run(presets::gpt2_124m::value, t);
  const plan_result both = run(m, t);
  CHECK(both.per_rank.weights.value == student.per_rank.weights.value + 2 * presets::gpt2_774m::value.parameters());
  CHECK(both.per_rank.gradients == student.per_rank.gradients);
  CHECK(both.per_rank.activations == student.per_rank.activations);
  // The teacher's fp32 logits wait for the distillation loss, next to the student's.
  const std::uint64_t teacher_logits = 4ULL * 4 * 1024 * 50257;
  CHECK(at(both, phase::backward).temporaries.value == at(student, phase::backward).temporaries.value + teacher_logits);
  CHECK(m.entries[0].group == layer_group::teacher);
  CHECK(m.entries[0].place == placement::first_stage);
  CHECK(m.entries[6].place == placement::first_stage);  // the student's embedding
}

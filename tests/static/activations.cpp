// SPDX-License-Identifier: BSL-1.0
// Passes by compiling: the activation algebra at compile time, O(1) repeats, every layer type
// and model transformation as a compile-time literal, and what counts as a part of a model.
#include <memalg/memalg.hpp>

namespace {
using namespace memalg;
namespace m = memalg::model;
namespace o = memalg::model::opt;

// Korthikanti et al. 2022, Table 2, at compile time (GPT-3 175B block, s = 2048, b = 1).
constexpr std::uint64_t s = 2048, b = 1, h = 12288, a = 96;
constexpr std::uint64_t sbh = s * b * h, as2b = a * s * s * b;
constexpr layer_desc gpt3_block = presets::gpt3_175b::value.entries[3];
constexpr activation_context ctx(std::uint64_t t, bool sp) {
  activation_context c{};
  c.stack = stack_kind::paper;  // Table 2 is the paper's accounting
  c.micro_batch = b;
  c.sequence = s;
  c.tp = t;
  c.sp = sp;
  return c;
}
static_assert(layer_activation_bytes(gpt3_block, ctx(1, false), false).saved.value == 34 * sbh + 5 * as2b);
static_assert(layer_activation_bytes(gpt3_block, ctx(8, false), false).saved.value == 13 * sbh + 5 * as2b / 8);
static_assert(layer_activation_bytes(gpt3_block, ctx(8, true), false).saved.value == 34 * sbh / 8 + 5 * as2b / 8);
static_assert(layer_activation_bytes(gpt3_block, ctx(8, false), false).selective.value == 13 * sbh);
static_assert(layer_activation_bytes(gpt3_block, ctx(8, true), false).selective.value == 34 * sbh / 8);
static_assert(layer_activation_bytes(gpt3_block, ctx(8, false), false).input.value == 2 * sbh);
static_assert(sublayer_activations(gpt3_block, ctx(1, false)).attention.total().value == 11 * sbh + 5 * as2b);
static_assert(sublayer_activations(gpt3_block, ctx(1, false)).mlp.total().value == 19 * sbh);
static_assert(sublayer_activations(gpt3_block, ctx(1, false)).norms.total().value == 4 * sbh);

// repeat<N, block> is ONE entry whatever N: a billion layers cost what one does.
using block = m::transformer_block<4096, 32, 11008, o::rmsnorm, o::swiglu, o::no_bias, o::flash>;
static_assert(m::repeat<1'000'000'000, block>::value.size == 1);
static_assert(m::repeat<1'000'000'000, block>::value.entries[0].count == 1'000'000'000);
static_assert(m::repeat<2, m::repeat<3, m::sequential<block, m::rmsnorm<4096>>>>::value.size == 2);
static_assert(m::repeat<2, m::repeat<3, m::sequential<block, m::rmsnorm<4096>>>>::value.entries[1].count == 6);
// A Llama-2 7B built from layer types equals the preset.
using llama = m::sequential<m::embedding<32000, 4096>, m::repeat<32, block>, m::rmsnorm<4096>, m::output<4096, 32000>>;
static_assert(llama::value.parameters() == presets::llama2_7b::value.parameters());
static_assert(llama::value.entries[0].place == placement::first_stage);
static_assert(llama::value.entries[2].place == placement::last_stage);
static_assert(llama::value.entries[3].place == placement::last_stage);

// A compile-time plan with activations: Llama-2 7B, ZeRO-1 over 8 H100s, selective recomputation
// (Megatron's; the paper's accounting).
using llama_plan = plan<presets::llama2_7b,
                        train::recipe<precision::amp_bf16, optim::adamw<>, train::batch<1, 4096>, train::recompute::selective,
                                      train::stacks::paper>,
                        parallel::mesh<parallel::data<8, parallel::zero<1>>>, device::h100_80gb>;
static_assert(llama_plan::fits);
static_assert(llama_plan::per_rank.activations.value > 0);
static_assert(llama_plan::result.peak_phase == phase::backward);

// Every layer type and transformation is a literal at compile time.
using every_layer = m::sequential<
    m::embedding<1000, 256>, m::position_embedding<512, 256>, m::dropout<256, 100>, m::layernorm<256, o::no_bias>,
    m::attention<256, 8, o::kv_heads<2>, o::flash, o::bidirectional, o::dropout<100>>, m::rmsnorm<256>,
    m::mlp<256, 1024>, m::gated_mlp<256, 768, o::no_bias>, m::moe<256, 512, 8, 2, o::capacity<125>>,
    m::linear<256, 80, o::nonlinearity, o::dropout<500>>, m::conv1d<80, 256, 5, o::batchnorm, o::nonlinearity>,
    m::output<256, 1000, o::tied, o::logits<m::dt::bf16>, o::chunked_loss<128>>>;
static_assert(every_layer::value.size == 12);
static_assert(every_layer::value.entries[4].shape.kv_heads == 2);
static_assert(every_layer::value.entries[8].expert_params == 8ULL * 3 * 256 * 512);
static_assert(every_layer::value.entries[11].params == 0);  // tied
using tiny = m::repeat<4, m::transformer_block<256, 8, 1024, o::dropout<100>>>;
static_assert(m::frozen<tiny>::value.trainable_parameters() == 0);
// NF4 base, norms and biases, adapters: the first adapted instance on its own, then the other three
static_assert(m::qlora<8, tiny>::value.size == 6);
static_assert(m::qlora<8, tiny>::value.entries[0].count == 1 && m::qlora<8, tiny>::value.entries[3].count == 3);
// LoRA on the query and value projections: r·(h + h) each, the base frozen whole
using qv = m::lora<8, tiny, lora_target::q | lora_target::v, 50>;
static_assert(qv::value.trainable_parameters() == 4 * 8 * 2 * (256 + 256));
static_assert(qv::value.entries[0].shape.lora_dropout_permille == 50 && !qv::value.entries[0].trainable);
static_assert(m::sparse_2_4<tiny>::value.entries[0].params == 12 * 256 * 256 / 2);
static_assert(m::pruned<tiny, 4, 512>::value.entries[0].shape.heads == 4);
static_assert(m::distill<tiny, m::repeat<2, m::transformer_block<256, 8, 1024>>>::value.trainable_parameters() ==
              2 * m::transformer_block<256, 8, 1024>::descriptor.params);
static_assert(m::stack<3, m::conv1d<80, 80, 5>>::value.entries[0].place == placement::first_stage);
static_assert(m::with_sequence<77, tiny>::value.entries[0].shape.sequence == 77);
static_assert(m::encoder_decoder<tiny, m::repeat<2, m::transformer_block<256, 8, 1024, o::cross_attention>>>::value
                  .entries[2].shape.kv_sequence == 0);
static_assert(m::padded_vocab<presets::gpt2_124m, 128>::value.entries[0].shape.vocab == 50304);
static_assert(presets::speech_tts_500m<>::value.parameters() == 491'071'297);

// What composes: layer types and model types are parts, anything else is not. (A repeat of zero,
// a top-k above the experts or a dropout of 1 are static_assert errors in the types themselves.)
template <class T>
concept instantiable = requires { T::value; };
template <class T>
concept describable = requires { T::descriptor; };
static_assert(instantiable<m::repeat<2, block>>);
static_assert(describable<m::linear<2, 3>>);
static_assert(!m::layer_option<int>);
static_assert(m::part_type<block> && m::part_type<presets::gpt2_124m> && !m::part_type<int>);
}  // namespace

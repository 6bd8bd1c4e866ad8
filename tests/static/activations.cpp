// Passes by compiling: the activation algebra at compile time, O(1) repeats, and compositions
// that must not be expressible.
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

// A compile-time plan with activations: Llama-2 7B, ZeRO-1 over 8 H100s, selective recomputation.
using llama_plan = plan<presets::llama2_7b,
                        train::recipe<precision::amp_bf16, optim::adamw<>, train::batch<1, 4096>, train::recompute::selective>,
                        parallel::mesh<parallel::data<8, parallel::zero<1>>>, device::h100_80gb>;
static_assert(llama_plan::fits);
static_assert(llama_plan::per_rank.activations.value > 0);
static_assert(llama_plan::result.peak_phase == phase::backward);

// Not expressible: a repeat of zero, a top-k above the experts, dropout ≥ 1, a zero-width layer.
template <class T>
concept instantiable = requires { T::value; };
template <class T>
concept describable = requires { T::descriptor; };
static_assert(instantiable<m::repeat<2, block>>);
static_assert(describable<m::linear<2, 3>>);
static_assert(!m::layer_option<int>);
static_assert(m::part_type<block> && m::part_type<presets::gpt2_124m> && !m::part_type<int>);
}  // namespace

// SPDX-License-Identifier: BSL-1.0
// exec::read_decoder_lm: the language model the runtime reads off a model's layer descriptors —
// from transformer_lm of a config, from the presets, from a model written as layer types — and
// the models it refuses, each with its sentence; and a model written as layer types trains.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <memalg/backend/cpu/gpt_run.hpp>
#include <memalg/backend/cpu/local_communicator.hpp>
#include <memalg/exec/gpt/build_program.hpp>
#include <memalg/exec/gpt/read_model.hpp>
#include <memalg/memalg.hpp>
#include <memalg/model/compose.hpp>
#include <memalg/model/presets.hpp>

namespace m = memalg;
namespace mm = memalg::model;
namespace o = memalg::model::opt;
using m::exec::read_decoder_lm;

namespace {
/// The fields the runtime builds its program from.
void check_same_model(const m::lm_config& got, const m::lm_config& want) {
  CHECK(got.layers == want.layers);
  CHECK(got.hidden == want.hidden);
  CHECK(got.heads == want.heads);
  CHECK(got.kv_heads == (want.kv_heads != 0 ? want.kv_heads : want.heads));
  CHECK(got.head_dim == (want.head_dim != 0 ? want.head_dim : want.hidden / want.heads));
  CHECK(got.ffn == (want.ffn != 0 ? want.ffn : 4 * want.hidden));
  CHECK(got.vocab == want.vocab);
  CHECK(got.positions == want.positions);
  CHECK(got.rms_norm == want.rms_norm);
  CHECK(got.norm_eps == want.norm_eps);
  CHECK(got.gated == want.gated);
  CHECK(got.tied == want.tied);
  CHECK(got.bias == want.bias);
  CHECK(got.qkv_bias == (want.qkv_bias && !want.bias));
  CHECK(got.flash == want.flash);
  CHECK(got.causal == want.causal);
  CHECK(got.dropout_permille == want.dropout_permille);
  CHECK(got.rotary_dim == (want.rotary ? want.rotary_dim : 0));
  CHECK(got.parallel_residual == want.parallel_residual);
  CHECK(got.logits == want.logits);
  CHECK(got.loss_chunk == want.loss_chunk);
}

constexpr m::lm_config small(bool llama) {
  m::lm_config c{};
  c.name = "small";
  c.layers = 3;
  c.hidden = 32;
  c.heads = 4;
  c.vocab = 64;
  c.positions = llama ? 0 : 16;
  if (llama) {
    c.kv_heads = 2;
    c.ffn = 88;
    c.rms_norm = true;
    c.gated = true;
    c.bias = false;
    c.tied = false;
    c.rotary = true;
    c.flash = true;
  }
  return c;
}
}  // namespace

TEST_CASE("read_decoder_lm reads transformer_lm's descriptors back") {
  m::lm_config gpt = small(false);
  m::lm_config llama = small(true);
  m::lm_config qwen2 = small(true);
  qwen2.qkv_bias = true;
  qwen2.tied = true;
  m::lm_config neox = small(true);
  neox.rms_norm = false;
  neox.bias = true;
  neox.rotary_dim = 2;
  neox.parallel_residual = true;
  m::lm_config dropout = small(false);
  dropout.dropout_permille = 100;
  dropout.flash = true;
  m::lm_config chunked = small(true);
  chunked.loss_chunk = 16;
  chunked.logits = m::dtypes::bf16;
  chunked.norm_eps = 1e-5;  // Mixtral's rms_norm_eps, not RMSNorm's usual 1e-6
  for (const m::lm_config& c : {gpt, llama, qwen2, neox, dropout, chunked}) {
    const m::exec::lm_reading r = read_decoder_lm(m::transformer_lm(c));
    REQUIRE_MESSAGE(r.ok(), r.problem);
    check_same_model(r.config, c);
  }
}

TEST_CASE("the norms' epsilon goes from the model descriptor into every norm op of the program") {
  // Default: the norm kind's (nn.LayerNorm's 1e-5, RMSNorm's 1e-6); set: the model's own.
  for (const bool llama : {false, true})
    for (const double eps : {0.0, 1e-5, 2.5e-3}) {
      m::lm_config c = small(llama);
      c.norm_eps = eps;
      const m::exec::lm_reading r = read_decoder_lm(m::transformer_lm(c));
      REQUIRE_MESSAGE(r.ok(), r.problem);
      const double want = eps > 0 ? eps : (llama ? 1e-6 : 1e-5);
      CHECK(m::norm_eps_of(m::transformer_lm(c).entries[2].shape, llama) == want);
      m::exec::gpt_config g{};
      g.layers = c.layers;
      g.hidden = c.hidden;
      g.heads = c.heads;
      g.vocab = c.vocab;
      g.positions = llama ? 0 : c.positions;
      g.sequence = 8;
      g.rms_norm = llama;
      g.norm_eps = r.config.norm_eps;
      const m::exec::program p = m::exec::build_program(g, m::exec::arena_sizes{std::size_t{1} << 24, std::size_t{1} << 24});
      std::size_t norms = 0;
      for (const auto* section : {&p.micro, &p.step_begin, &p.step_end})
        for (const m::exec::op& o : *section)
          std::visit(
              [&](const auto& x) {
                using X = std::decay_t<decltype(x)>;
                if constexpr (std::is_same_v<X, m::exec::ops::norm_fwd> || std::is_same_v<X, m::exec::ops::norm_bwd>) {
                  ++norms;
                  CHECK(x.eps == want);
                  CHECK(x.rms == llama);
                }
              },
              o.body);
      CHECK(norms == 2 * (2 * c.layers + 1));  // two per block and the final one, forward and backward
    }
  // The runtime has one ε: a final norm with another is refused.
  m::model_desc d = m::transformer_lm(small(true));
  d.entries[d.size - 2].shape.norm_eps = 1e-3;
  CHECK(std::string(read_decoder_lm(d).problem).find("epsilon") != std::string::npos);
}

TEST_CASE("read_decoder_lm reads the presets at compile time") {
  constexpr m::exec::lm_reading gpt2 = read_decoder_lm(m::presets::gpt2_124m::value);
  static_assert(gpt2.ok());
  static_assert(gpt2.config.positions == 1024 && gpt2.config.tied && gpt2.config.bias && !gpt2.config.rms_norm);
  constexpr m::exec::lm_reading llama = read_decoder_lm(m::presets::llama3_8b::value);
  static_assert(llama.ok());
  static_assert(llama.config.kv_heads == 8 && llama.config.positions == 0 && !llama.config.tied && llama.config.gated);
  check_same_model(gpt2.config, m::presets::gpt2_124m::config);
  check_same_model(llama.config, m::presets::llama3_8b::config);
  check_same_model(read_decoder_lm(m::presets::mistral_7b::value).config, m::presets::mistral_7b::config);
}

namespace {
// A Llama-shaped model written as layer types rather than as an lm_config.
using block = mm::transformer_block<32, 4, 88, o::rmsnorm, o::swiglu, o::no_bias, o::flash, o::rotary, o::kv_heads<2>>;
using hand_written = mm::sequential<mm::embedding<64, 32>, mm::repeat<3, block>, mm::rmsnorm<32>, mm::output<32, 64>>;
}  // namespace

TEST_CASE("read_decoder_lm reads a model written as layer types") {
  const m::exec::lm_reading r = read_decoder_lm(hand_written::value);
  REQUIRE_MESSAGE(r.ok(), r.problem);
  check_same_model(r.config, small(true));
}

TEST_CASE("read_decoder_lm reads Qwen3's per-head QK-norm, and the model it reads has the preset's parameters") {
  const m::exec::lm_reading r = read_decoder_lm(m::presets::qwen3_8b::value);
  REQUIRE_MESSAGE(r.ok(), r.problem);
  CHECK(r.config.qk_norm);
  CHECK(r.config.head_dim == 128);
  const m::model_desc again = m::transformer_lm(r.config);
  CHECK(again.parameters() == m::presets::qwen3_8b::value.parameters());
  // A QK-norm in LayerNorm blocks is not Qwen3's: refused with the reason.
  using qk_ln = mm::transformer_block<32, 4, 88, o::swiglu, o::no_bias, o::flash, o::rotary, o::kv_heads<2>, o::qk_norm_per_head>;
  const auto why = std::string(
      read_decoder_lm(mm::sequential<mm::embedding<64, 32>, mm::repeat<2, qk_ln>, mm::layernorm<32, o::no_bias>, mm::output<32, 64>>::value)
          .problem);
  CHECK(why.find("RMSNorm") != std::string::npos);
}

TEST_CASE("read_decoder_lm refuses what is not a decoder-only language model, saying why") {
  const auto problem = [](const m::model_desc& d) { return std::string(read_decoder_lm(d).problem); };
  CHECK(problem(m::presets::speech_tts_500m<>::value).find("repeated transformer blocks") != std::string::npos);  // a prenet follows its embedding
  CHECK(problem(mm::sequential<block, mm::rmsnorm<32>, mm::output<32, 64>>::value).find("token embedding") != std::string::npos);
  CHECK(problem(m::presets::mixtral_8x7b::value).find("mixture of experts") != std::string::npos);
  CHECK(problem(m::presets::olmo2_7b::value).find("QK-norm") != std::string::npos);
  CHECK(problem(m::presets::gemma2_9b::value).find("Gemma") != std::string::npos);
  {  // a sliding window on every layer (one block entry): refused, not run as global attention
    m::model_desc windowed = hand_written::value;
    for (std::size_t i = 0; i < windowed.size; ++i)
      if (windowed.entries[i].kind == m::layer_kind::transformer_block) windowed.entries[i].shape.window = 8;
    CHECK(problem(windowed).find("sliding window") != std::string::npos);
  }
  CHECK(problem(mm::frozen<hand_written>::value).find("frozen") != std::string::npos);
  CHECK(problem(mm::sequential<mm::embedding<64, 32>, mm::repeat<3, block>, mm::output<32, 64>>::value)
            .find("final norm") != std::string::npos);
  CHECK(problem(mm::sequential<mm::embedding<64, 32>, mm::repeat<3, block>, mm::rmsnorm<32>, mm::output<32, 128>>::value)
            .find("vocabulary") != std::string::npos);
  CHECK(problem(mm::sequential<mm::embedding<64, 32>, mm::repeat<3, block>, mm::layernorm<32>, mm::output<32, 64>>::value)
            .find("blocks' kind") != std::string::npos);
  CHECK(problem(mm::sequential<hand_written, mm::linear<64, 64>>::value).find("ends with its output") != std::string::npos);
  CHECK(problem(mm::sequential<mm::embedding<64, 32>, mm::dropout<32, 100>, mm::repeat<3, block>, mm::rmsnorm<32>,
                               mm::output<32, 64>>::value)
            .find("one dropout probability") != std::string::npos);
}

namespace {
struct budget {
  static constexpr m::device_desc value{"cpu", m::bytes{std::uint64_t{1} << 30}, m::bytes{}};
};
template <class Model>
using cpu_plan = m::plan<Model, m::train::recipe<m::precision::fp32, m::optim::adamw<>, m::train::batch<2, 16>,
                                                 m::train::reference_kernels>,
                         m::parallel::mesh<>, budget>;
std::vector<std::int32_t> some_ids(std::size_t n, int shift) {
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>((i * 7 + static_cast<std::size_t>(shift) + i / 5) % 64);
  return v;
}
}  // namespace

TEST_CASE("a model written as layer types trains on the CPU runtime, its arena at the plan's peak") {
  using plan = cpu_plan<hand_written>;
  using run = m::exec::gpt_run<plan, m::backend::cpu::local_communicator>;
  static_assert(run::issue == m::exec::runtime_issue::none);
  static_assert(run::config.layers == 3 && run::config.kv_heads == 2 && run::config.gated && !run::config.tied);
  m::backend::cpu::local_communicator dp, tp;
  typename run::trainer trainer(run::config, run::arena, dp, tp);
  const std::size_t n = run::config.micro_batch * run::config.sequence;
  float first = 0, last = 0;
  for (int s = 0; s < 8; ++s) {  // the same batch: the loss must fall
    last = trainer.train_step(some_ids(n, 0), some_ids(n, 1));
    if (s == 0) first = last;
  }
  CHECK(last < first);
  const m::breakdown& want = plan::result.per_rank;
  CHECK(trainer.memory().high_water() == (want.total() - want.reserve).value);
  CHECK(trainer.memory().persistent_used() == plan::result.most_loaded.at[0].model_states().value);
}

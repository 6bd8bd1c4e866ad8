// SPDX-License-Identifier: BSL-1.0
// Presets: exact parameter counts from the published configurations.
#include <doctest/doctest.h>

#include <memalg/model/compose.hpp>
#include <memalg/model/presets.hpp>

#include <cstdint>

using namespace memalg;

namespace {
// GPT-2 / GPT-3: L(12h² + 13h) + (v + n_ctx)·h + 2h (tied output layer).
constexpr std::uint64_t gpt(std::uint64_t L, std::uint64_t h, std::uint64_t ctx) {
  return L * (12 * h * h + 13 * h) + (50257 + ctx) * h + 2 * h;
}
// Llama-style: L(2h + h·a·d + 2h·kv·d + a·d·h + 3hf) + 2vh + h, a·d = h.
constexpr std::uint64_t llama(std::uint64_t L, std::uint64_t h, std::uint64_t kv_width, std::uint64_t f,
                              std::uint64_t v, std::uint64_t experts = 1, std::uint64_t router = 0) {
  return L * (2 * h + 2 * h * h + 2 * h * kv_width + experts * 3 * h * f + router) + 2 * v * h + h;
}
}  // namespace

TEST_CASE("GPT-2 and GPT-3: exact parameter counts") {
  CHECK(presets::gpt2_124m::value.parameters() == 124'439'808);
  CHECK(presets::gpt2_350m::value.parameters() == 354'823'168);
  CHECK(presets::gpt2_774m::value.parameters() == 774'030'080);
  CHECK(presets::gpt2_1_5b::value.parameters() == 1'557'611'200);
  CHECK(presets::gpt3_175b::value.parameters() == 174'604'259'328);
  CHECK(presets::gpt2_124m::value.parameters() == gpt(12, 768, 1024));
  CHECK(presets::gpt2_1_5b::value.parameters() == gpt(48, 1600, 1024));
  CHECK(presets::gpt3_175b::value.parameters() == gpt(96, 12288, 2048));
}

TEST_CASE("Llama 2, Llama 3, Mistral and Mixtral: exact parameter counts") {
  CHECK(presets::llama2_7b::value.parameters() == 6'738'415'616);
  CHECK(presets::llama2_13b::value.parameters() == 13'015'864'320);
  CHECK(presets::llama2_70b::value.parameters() == 68'976'648'192);
  CHECK(presets::llama3_8b::value.parameters() == 8'030'261'248);
  CHECK(presets::llama3_70b::value.parameters() == 70'553'706'496);
  CHECK(presets::mistral_7b::value.parameters() == 7'241'732'096);
  CHECK(presets::mixtral_8x7b::value.parameters() == 46'702'792'704);
  CHECK(presets::llama2_7b::value.parameters() == llama(32, 4096, 4096, 11008, 32000));
  CHECK(presets::llama2_70b::value.parameters() == llama(80, 8192, 1024, 28672, 32000));
  CHECK(presets::llama3_8b::value.parameters() == llama(32, 4096, 1024, 14336, 128256));
  CHECK(presets::mixtral_8x7b::value.parameters() == llama(32, 4096, 1024, 14336, 32000, 8, 4096 * 8));
}

TEST_CASE("structure: one entry per repeated block, tied and untied output layers, experts") {
  const model_desc gpt = presets::gpt2_124m::value;
  REQUIRE(gpt.size == 6);
  CHECK(gpt.entries[0].kind == layer_kind::embedding);
  CHECK(gpt.entries[1].kind == layer_kind::position_embedding);
  CHECK(gpt.entries[2].kind == layer_kind::dropout);
  CHECK(gpt.entries[3].kind == layer_kind::transformer_block);
  CHECK(gpt.entries[3].count == 12);
  CHECK(gpt.entries[3].place == placement::repeated);
  CHECK(gpt.entries[5].kind == layer_kind::output);
  CHECK(gpt.entries[5].params == 0);  // tied
  CHECK(gpt.repeated_layers() == 12);
  const model_desc llama = presets::llama2_7b::value;
  CHECK(llama.size == 4);  // no position embedding, no dropout
  CHECK(llama.entries[3].params == 4096ULL * 32000);
  const model_desc mixtral = presets::mixtral_8x7b::value;
  CHECK(mixtral.entries[1].expert_params == 8ULL * 3 * 4096 * 14336);
  CHECK(mixtral.entries[1].tp_replicated_params == 2 * 4096 + 4096 * 8);  // norms + router
}

TEST_CASE("the ~500M speech-synthesis model, counted by hand") {
  const std::uint64_t h = 1024;
  const std::uint64_t embedding = 256 * h;
  const std::uint64_t prenet = 3 * (h * h * 5 + h + 2 * h);                 // conv + bias + batch norm
  const std::uint64_t encoder = 16 * (12 * h * h + 13 * h) + 2 * h;         // blocks + final norm
  const std::uint64_t decoder_prenet = (80 * 256 + 256) + (256 * 256 + 256) + (256 * h + h);
  const std::uint64_t decoder = 16 * (16 * h * h + 19 * h) + 2 * h;         // + cross-attention and its norm
  const std::uint64_t heads = (h * 80 + 80) + (h + 1);                      // mel and stop-token projections
  const std::uint64_t postnet = (80 * 512 * 5 + 512 + 1024) + 3 * (512 * 512 * 5 + 512 + 1024) + (512 * 80 * 5 + 80 + 160);
  const std::uint64_t total = embedding + prenet + encoder + decoder_prenet + decoder + heads + postnet;
  CHECK(total == 491'071'297);
  CHECK(presets::speech_tts_500m<>::value.parameters() == total);
  // The encoder runs on the phonemes, the decoder on the recipe's frames and attends to the phonemes.
  const model_desc m = presets::speech_tts_500m<200>::value;
  CHECK(m.entries[2].name == "encoder.block");
  CHECK(m.entries[2].shape.sequence == 200);
  CHECK(m.entries[8].name == "decoder.block");
  CHECK(m.entries[8].shape.sequence == 0);
  CHECK(m.entries[8].shape.kv_sequence == 200);
  CHECK(m.repeated_layers() == 32);
}

TEST_CASE("lookup by name for the command-line tool; vocabulary padding") {
  model_desc m{};
  CHECK(presets::from_name("llama3-70b", m));
  CHECK(m.parameters() == 70'553'706'496);
  CHECK(presets::from_name("speech-tts-500m", m));
  CHECK_FALSE(presets::from_name("gpt-5", m));
  for (const presets::named_preset& p : presets::catalog) CHECK(p.model->parameters() > 0);
  // Megatron pads 50257 to a multiple of 128·t: 50304 for t = 1, 51200 for t = 8.
  const model_desc padded = padded_vocab(presets::gpt2_124m::value, 128);
  CHECK(padded.parameters() == presets::gpt2_124m::value.parameters() + (50304 - 50257) * 768);
  CHECK(padded_vocab(presets::gpt3_175b::value, 1024).entries[0].shape.vocab == 51200);
}

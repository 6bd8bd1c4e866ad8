// SPDX-License-Identifier: BSL-1.0
// memalg/model/presets/speech.hpp — a ~500M-parameter transformer text-to-speech model.
//
// The shape of Transformer TTS (Li et al. 2019, arXiv 1809.08895) at a larger width: a phoneme
// encoder and an autoregressive mel-frame decoder, both pre-norm transformers, with Tacotron 2's
// convolutional pre- and post-nets (Shen et al. 2018, arXiv 1712.05884).
//
//   encoder   phoneme embedding 256 × 1024
//             3 × conv1d 1024→1024, kernel 5, batch norm, ReLU, dropout 0.5        (pre-net)
//             16 × block: h 1024, 16 heads, GeLU MLP 4096, bidirectional, dropout 0.1
//             final LayerNorm
//   decoder   linear 80→256 + ReLU + dropout 0.5, linear 256→256 + ReLU + dropout 0.5,
//             linear 256→1024                                                      (pre-net)
//             16 × block with cross-attention over the encoder's tokens, causal, dropout 0.1
//             final LayerNorm, mel and stop-token projections 1024→80+1 (one entry: both read
//             the same saved input)
//             conv1d 80→512, 3 × conv1d 512→512 (batch norm, tanh, dropout 0.5), conv1d 512→80
//             (batch norm, dropout 0.5)                                             (post-net)
//
// 491 071 297 parameters (tests/host/test_presets.cpp recomputes them by hand). Attention is
// PyTorch's scaled_dot_product_attention, whose memory-efficient kernel (the one fp32 inputs
// use) saves the output and the log-sum-exp: `opt::flash`. The recipe's sequence counts mel
// frames (the decoder's tokens); the encoder runs on `TextTokens` phonemes per utterance.
#pragma once

#include <cstdint>
#include <string_view>

#include "memalg/model/compose.hpp"
#include "memalg/model/layers.hpp"
#include "memalg/model/transformer.hpp"

namespace memalg::presets {

namespace speech {
inline constexpr std::uint64_t hidden = 1024;
inline constexpr std::uint64_t heads = 16;
inline constexpr std::uint64_t ffn = 4096;
inline constexpr std::uint64_t phonemes = 256;   ///< phoneme vocabulary
inline constexpr std::uint64_t mel_bins = 80;
inline constexpr std::uint64_t encoder_layers = 16;
inline constexpr std::uint64_t decoder_layers = 16;
inline constexpr std::uint64_t prenet = 256;
inline constexpr std::uint64_t postnet = 512;
inline constexpr std::uint64_t kernel = 5;

struct encoder_block_name { static constexpr std::string_view value = "encoder.block"; };
struct decoder_block_name { static constexpr std::string_view value = "decoder.block"; };
struct encoder_prenet_name { static constexpr std::string_view value = "encoder.prenet.conv"; };
struct postnet_name { static constexpr std::string_view value = "decoder.postnet.conv"; };
struct encoder_norm_name { static constexpr std::string_view value = "encoder.final_norm"; };
struct decoder_norm_name { static constexpr std::string_view value = "decoder.final_norm"; };
struct prenet1_name { static constexpr std::string_view value = "decoder.prenet.fc1"; };
struct prenet2_name { static constexpr std::string_view value = "decoder.prenet.fc2"; };
struct prenet_proj_name { static constexpr std::string_view value = "decoder.prenet.proj"; };
struct out_name { static constexpr std::string_view value = "decoder.mel_stop_out"; };
struct postnet_in_name { static constexpr std::string_view value = "decoder.postnet.in"; };
struct postnet_out_name { static constexpr std::string_view value = "decoder.postnet.out"; };
struct model_name { static constexpr std::string_view value = "speech-tts-500m"; };

namespace m = memalg::model;
namespace o = memalg::model::opt;

using encoder_block = m::named<encoder_block_name,
                               m::transformer_block<hidden, heads, ffn, o::flash, o::bidirectional, o::dropout<100>>>;
using decoder_block = m::named<decoder_block_name, m::transformer_block<hidden, heads, ffn, o::flash, o::causal,
                                                                        o::cross_attention, o::dropout<100>>>;

template <std::uint64_t TextTokens>
using encoder = m::with_sequence<
    TextTokens,
    m::sequential<m::embedding<phonemes, hidden>,
                  m::named<encoder_prenet_name,
                           m::stack<3, m::conv1d<hidden, hidden, kernel, o::batchnorm, o::nonlinearity, o::dropout<500>>>>,
                  m::repeat<encoder_layers, encoder_block>, m::named<encoder_norm_name, m::layernorm<hidden>>>>;

using decoder = m::sequential<
    m::named<prenet1_name, m::linear<mel_bins, prenet, o::nonlinearity, o::dropout<500>>>,
    m::named<prenet2_name, m::linear<prenet, prenet, o::nonlinearity, o::dropout<500>>>,
    m::named<prenet_proj_name, m::linear<prenet, hidden>>,
    m::repeat<decoder_layers, decoder_block>,
    m::named<decoder_norm_name, m::layernorm<hidden>>,
    m::named<out_name, m::linear<hidden, mel_bins + 1>>,
    m::named<postnet_in_name, m::conv1d<mel_bins, postnet, kernel, o::batchnorm, o::nonlinearity, o::dropout<500>>>,
    m::named<postnet_name, m::stack<3, m::conv1d<postnet, postnet, kernel, o::batchnorm, o::nonlinearity, o::dropout<500>>>>,
    m::named<postnet_out_name, m::conv1d<postnet, mel_bins, kernel, o::batchnorm, o::dropout<500>>>>;
}  // namespace speech

/// The speech model with `TextTokens` phonemes per utterance (default 256).
template <std::uint64_t TextTokens = 256>
struct speech_tts_500m {
  static constexpr model_desc value =
      model::named<speech::model_name, model::encoder_decoder<speech::encoder<TextTokens>, speech::decoder>>::value;
};

}  // namespace memalg::presets

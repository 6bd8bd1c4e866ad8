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
#include <type_traits>

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
struct scaled_model_name { static constexpr std::string_view value = "speech-tts"; };

namespace m = memalg::model;
namespace o = memalg::model::opt;

/// No option (a switch turned off).
struct no_option { static constexpr void apply(layer_options&) {} };
}  // namespace speech

/// The dimensions of the speech model: the preset scales down through them (widths, depths, mel
/// bins, the encoder's phonemes), not through a second model. `batchnorm` and the dropout
/// probabilities (thousandths) can be switched off for a variant without batch statistics or
/// randomness. The defaults are speech_tts_500m's.
struct speech_dims {
  std::uint64_t hidden = speech::hidden, heads = speech::heads, ffn = speech::ffn;
  std::uint64_t phonemes = speech::phonemes, mel_bins = speech::mel_bins;
  std::uint64_t encoder_layers = speech::encoder_layers, decoder_layers = speech::decoder_layers;
  std::uint64_t prenet = speech::prenet, postnet = speech::postnet, kernel = speech::kernel;
  std::uint64_t text_tokens = 256;
  bool batchnorm = true;
  std::uint64_t block_dropout = 100, net_dropout = 500;  ///< blocks; pre- and post-nets (thousandths)
};

namespace speech {
/// The layers of the model of dimensions D (members first copied out of D: GCC 12 does not take
/// a class-type template argument's members in alias templates).
template <speech_dims D>
struct parts {
  static constexpr std::uint64_t H = D.hidden, A = D.heads, F = D.ffn, V = D.phonemes, M = D.mel_bins;
  static constexpr std::uint64_t LE = D.encoder_layers, LD = D.decoder_layers, P = D.prenet, Q = D.postnet, K = D.kernel;
  static constexpr std::uint64_t S = D.text_tokens, BD = D.block_dropout, ND = D.net_dropout;
  using bn = std::conditional_t<D.batchnorm, o::batchnorm, no_option>;

  using encoder_block = m::named<encoder_block_name, m::transformer_block<H, A, F, o::flash, o::bidirectional, o::dropout<BD>>>;
  using decoder_block =
      m::named<decoder_block_name, m::transformer_block<H, A, F, o::flash, o::causal, o::cross_attention, o::dropout<BD>>>;
  using encoder = m::with_sequence<
      S, m::sequential<m::embedding<V, H>,
                       m::named<encoder_prenet_name, m::stack<3, m::conv1d<H, H, K, bn, o::nonlinearity, o::dropout<ND>>>>,
                       m::repeat<LE, encoder_block>, m::named<encoder_norm_name, m::layernorm<H>>>>;
  /// The post-net's convolutions use tanh (Tacotron 2), the encoder's and the pre-net's ReLU.
  using decoder = m::sequential<
      m::named<prenet1_name, m::linear<M, P, o::nonlinearity, o::dropout<ND>>>,
      m::named<prenet2_name, m::linear<P, P, o::nonlinearity, o::dropout<ND>>>,
      m::named<prenet_proj_name, m::linear<P, H>>,
      m::repeat<LD, decoder_block>,
      m::named<decoder_norm_name, m::layernorm<H>>,
      m::named<out_name, m::linear<H, M + 1>>,
      m::named<postnet_in_name, m::conv1d<M, Q, K, bn, o::nonlinearity, o::tanh, o::dropout<ND>>>,
      m::named<postnet_name, m::stack<3, m::conv1d<Q, Q, K, bn, o::nonlinearity, o::tanh, o::dropout<ND>>>>,
      m::named<postnet_out_name, m::conv1d<Q, M, K, bn, o::dropout<ND>>>>;
};

inline constexpr speech_dims with_text_tokens(std::uint64_t n) {
  speech_dims d{};
  d.text_tokens = n;
  return d;
}
// The full-size model's parts (speech_tts_500m<256>).
using encoder_block = parts<speech_dims{}>::encoder_block;
using decoder_block = parts<speech_dims{}>::decoder_block;
template <std::uint64_t TextTokens>
using encoder = typename parts<with_text_tokens(TextTokens)>::encoder;
using decoder = parts<speech_dims{}>::decoder;
}  // namespace speech

/// The speech model of dimensions D (speech_dims): the same layers at any scale.
template <speech_dims D>
struct speech_tts {
  static constexpr speech_dims dims = D;
  static constexpr model_desc value =
      model::named<speech::scaled_model_name, model::encoder_decoder<typename speech::parts<D>::encoder, typename speech::parts<D>::decoder>>::value;
};

/// The speech model with `TextTokens` phonemes per utterance (default 256).
template <std::uint64_t TextTokens = 256>
struct speech_tts_500m {
  static constexpr speech_dims dims = speech::with_text_tokens(TextTokens);
  static constexpr model_desc value =
      model::named<speech::model_name, model::encoder_decoder<speech::encoder<TextTokens>, speech::decoder>>::value;
};

}  // namespace memalg::presets

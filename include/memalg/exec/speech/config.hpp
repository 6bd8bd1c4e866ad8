// SPDX-License-Identifier: BSL-1.0
// memalg/exec/speech/config.hpp — the speech runtime's configuration as runtime values, and where
// a micro-batch's inputs sit in step_io.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memalg/exec/arena_layout.hpp"  // arena_sizes
#include "memalg/exec/hparams.hpp"
#include "memalg/train/optimizer.hpp"

namespace memalg::exec {

/// The speech model and its run, as the runtime reads them (exec/speech/plan.hpp fills one from a
/// plan; the defaults are a small model).
struct speech_config {
  // model (presets::speech_dims)
  std::size_t phonemes = 128, hidden = 32, heads = 2, ffn = 128, mel_bins = 80;
  std::size_t encoder_layers = 2, decoder_layers = 2, prenet = 16, postnet = 32, kernel = 5;
  std::size_t encoder_convs = 3, postnet_convs = 3;  ///< the pre-net's convolutions; the post-net's middle ones
  std::size_t text_tokens = 32;                       ///< phonemes per utterance (the encoder's sequence)
  bool batchnorm = true;
  double norm_eps = 0;  ///< the LayerNorms' ε (0: nn.LayerNorm's default, memalg::default_norm_eps)
  float block_dropout = 0.1f, net_dropout = 0.5f;  ///< blocks; pre- and post-nets
  bool l1 = true;                                   ///< mel loss: L1 (else MSE)
  // batch
  std::size_t micro_batch = 4, frames = 48, grad_accum = 1;  ///< frames: mel frames per utterance
  // mesh, precision, optimizer
  std::size_t dp = 1;
  bool master_weights = false;
  optimizer_kind optimizer = optimizer_kind::adamw;
  // hyper-parameters: exec/hparams.hpp's defaults (with_hparams sets them)
  float lr = default_hparams.lr, weight_decay = default_hparams.weight_decay, momentum = default_hparams.momentum,
        beta1 = default_hparams.beta1, beta2 = default_hparams.beta2, eps = default_hparams.eps;
  float max_grad_norm = default_hparams.max_grad_norm;
  std::uint64_t seed = 1;
  /// A validation pass: the forward and the losses only (no backward, no update), on the same
  /// arena and weights; dropout is off when its probabilities are 0 here. Batch norm uses the
  /// micro-batch's statistics (the arena holds no running statistics; the plan counts none).
  bool evaluate = false;
};

/// Where a micro-batch's inputs sit in step_io (per micro-batch, in this order):
///   tokens    phoneme ids [B·text_tokens]
///   features  target mel frames [B·frames·mel_bins], then stop targets [B·frames]
///   masks     real frames [B·frames], then real phonemes [B·text_tokens]
struct speech_inputs {
  std::size_t tokens = 0, features = 0, masks = 0;
  std::size_t mel = 0, stop = 0, frame_mask = 0, phoneme_mask = 0;  ///< element offsets
};
constexpr speech_inputs speech_inputs_of(const speech_config& c) {
  speech_inputs s{};
  const std::size_t B = c.micro_batch, F = c.frames, T = c.text_tokens, M = c.mel_bins;
  s.tokens = B * T;
  s.mel = 0;
  s.stop = B * F * M;
  s.features = B * F * M + B * F;
  s.frame_mask = 0;
  s.phoneme_mask = B * F;
  s.masks = B * F + B * T;
  return s;
}

}  // namespace memalg::exec

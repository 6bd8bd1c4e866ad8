// SPDX-License-Identifier: BSL-1.0
// memalg/exec/speech/plan.hpp — the speech model a plan describes, read for the runtime, and
// whether the runtime implements the plan.
//
// `read_speech_model` reads the dimensions of the speech model (model/presets/speech.hpp) off a
// `model_desc`'s layer descriptors alone — the runtime builds its step program from what was
// planned, not from a second description:
//
//   embedding  conv1d×E  repeat<LE, block>  layernorm  encoder_output
//   linear(+ReLU, dropout)  linear(+ReLU, dropout)  linear  repeat<LD, block with cross-attention>
//   layernorm  linear(→ mel bins + 1)  conv1d(mel→Q, tanh)  conv1d×K(Q→Q, tanh)  conv1d(Q→mel)
//
// Anything else is refused with a sentence (`speech_reading::problem`). `speech_plan_issue`
// names what the runtime does not implement of a plan (its mesh, precision, stack, optimizer);
// `speech_config_of<Plan>` is the configuration the runtime builds (exec/speech/build_program.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "memalg/core/dtype.hpp"
#include "memalg/exec/speech/build_program.hpp"
#include "memalg/model/layer.hpp"
#include "memalg/parallel/mesh.hpp"
#include "memalg/train/recipe.hpp"

namespace memalg::exec {

struct speech_reading {
  speech_config config{};
  std::string_view problem{};
  constexpr bool ok() const { return problem.empty(); }
};

/// The speech model `m` describes (the header comment gives the shape).
constexpr speech_reading read_speech_model(const model_desc& m) {
  speech_reading r{};
  speech_config& c = r.config;
  const auto refuse = [&r](std::string_view why) {
    r.problem = why;
    return r;
  };
  using namespace layer_flags;
  const auto flag = [](const layer_desc& l, std::uint32_t f) { return (l.shape.flags & f) != 0; };
  for (const layer_desc& l : m)
    if (!l.trainable || !l.weight_storage.is_none() || l.group != 0)
      return refuse("the speech runtime trains every layer of the model in the policy's dtypes");
  std::size_t i = 0;
  const auto at = [&](std::size_t k, layer_kind kind) { return k < m.size && m.entries[k].kind == kind; };
  // encoder
  if (!at(i, layer_kind::embedding) || m.entries[i].count != 1)
    return refuse("a speech model starts with one phoneme embedding");
  c.phonemes = m.entries[i].shape.vocab;
  c.hidden = m.entries[i].shape.hidden;
  c.text_tokens = m.entries[i].shape.sequence;
  ++i;
  if (!at(i, layer_kind::conv1d)) return refuse("the encoder's pre-net is a stack of convolutions after the embedding");
  {
    const layer_desc& l = m.entries[i++];
    c.encoder_convs = l.count;
    c.kernel = l.shape.kernel;
    c.batchnorm = flag(l, batchnorm);
    c.net_dropout = static_cast<float>(l.shape.dropout_permille) / 1000.0f;
    if (l.shape.in != c.hidden || l.shape.out != c.hidden || !flag(l, activation) || flag(l, tanh) || !flag(l, bias))
      return refuse("the encoder's convolutions keep the embedding's width, with biases and a ReLU");
  }
  if (!at(i, layer_kind::transformer_block)) return refuse("the encoder's blocks follow its pre-net");
  const layer_desc& eb = m.entries[i++];
  c.encoder_layers = eb.count;
  c.heads = eb.shape.heads;
  c.ffn = eb.shape.ffn;
  c.block_dropout = static_cast<float>(eb.shape.dropout_permille) / 1000.0f;
  c.norm_eps = eb.shape.norm_eps;
  const auto plain_block = [&](const layer_desc& b) {
    const layer_shape& s = b.shape;
    return s.hidden == c.hidden && s.heads == c.heads && (s.kv_heads == 0 || s.kv_heads == s.heads) &&
           (s.head_dim == 0 || s.head_dim * s.heads == s.hidden) && s.ffn == c.ffn && flag(b, flash) && flag(b, bias) &&
           !flag(b, gated) && !flag(b, rms_norm) && !flag(b, moe) && !flag(b, parallel_residual) &&
           !flag(b, shared_norm) && b.shape.dropout_permille == eb.shape.dropout_permille;
  };
  if (!plain_block(eb) || flag(eb, causal) || flag(eb, cross_attention))
    return refuse("the encoder's blocks are bidirectional LayerNorm/GeLU blocks with biases and flash attention");
  if (!at(i, layer_kind::layernorm) || m.entries[i].shape.hidden != c.hidden) return refuse("the encoder ends with a LayerNorm");
  ++i;
  if (!at(i, layer_kind::custom) || !flag(m.entries[i], encoder_output))
    return refuse("an encoder-decoder model: the encoder's output follows its final norm");
  ++i;
  // decoder pre-net
  for (int k = 0; k < 2; ++k) {
    if (!at(i, layer_kind::linear)) return refuse("the decoder's pre-net is two linear layers with ReLU and dropout, then a projection");
    const layer_desc& l = m.entries[i++];
    if (k == 0) {
      c.mel_bins = l.shape.in;
      c.prenet = l.shape.out;
    }
    if (l.shape.in != (k == 0 ? c.mel_bins : c.prenet) || l.shape.out != c.prenet || !flag(l, activation) || flag(l, tanh) ||
        !flag(l, bias) || static_cast<float>(l.shape.dropout_permille) / 1000.0f != c.net_dropout || l.shape.sequence != 0)
      return refuse("the decoder's pre-net layers read the mel frames, with biases, ReLU and the pre-net's dropout");
  }
  if (!at(i, layer_kind::linear) || m.entries[i].shape.in != c.prenet || m.entries[i].shape.out != c.hidden ||
      flag(m.entries[i], activation) || m.entries[i].shape.dropout_permille != 0)
    return refuse("the decoder's pre-net ends with a projection to the model width");
  ++i;
  if (!at(i, layer_kind::transformer_block)) return refuse("the decoder's blocks follow its pre-net");
  {
    const layer_desc& db = m.entries[i++];
    c.decoder_layers = db.count;
    if (!plain_block(db) || !flag(db, causal) || !flag(db, cross_attention) || db.shape.kv_sequence != c.text_tokens ||
        db.shape.sequence != 0)
      return refuse("the decoder's blocks are causal blocks with cross-attention over the encoder, as the encoder's");
  }
  if (!at(i, layer_kind::layernorm) || m.entries[i].shape.hidden != c.hidden) return refuse("the decoder's blocks end with a LayerNorm");
  ++i;
  if (!at(i, layer_kind::linear) || m.entries[i].shape.in != c.hidden || m.entries[i].shape.out != c.mel_bins + 1 ||
      flag(m.entries[i], activation) || !flag(m.entries[i], bias))
    return refuse("after the decoder's norm the runtime expects the mel and stop-token projection (mel bins + 1 outputs)");
  ++i;
  // post-net
  if (!at(i, layer_kind::conv1d)) return refuse("the post-net's convolutions follow the mel projection");
  c.postnet = m.entries[i].shape.out;
  std::size_t middle = 0;
  for (bool first = true; at(i, layer_kind::conv1d); first = false) {
    const layer_desc& l = m.entries[i];
    const bool last = !at(i + 1, layer_kind::conv1d);
    const std::size_t in = first ? c.mel_bins : c.postnet, out = last ? c.mel_bins : c.postnet;
    if (l.shape.in != in || l.shape.out != out || l.shape.kernel != c.kernel || flag(l, batchnorm) != c.batchnorm ||
        !flag(l, bias) || flag(l, activation) == last || (!last && !flag(l, tanh)) ||
        static_cast<float>(l.shape.dropout_permille) / 1000.0f != c.net_dropout)
      return refuse("the post-net: convolutions of the pre-net's kernel and batch norm, tanh but on the last, back to the mel bins");
    if (!first && !last) middle += l.count;
    if ((first || last) && l.count != 1) return refuse("the post-net's first and last convolutions are single layers");
    ++i;
    if (last) break;
  }
  c.postnet_convs = middle;
  if (i != m.size) return refuse("the speech model ends with its post-net");
  return r;
}

/// What the speech runtime does not implement of a plan, or empty.
template <class Plan>
constexpr std::string_view speech_plan_issue() {
  constexpr speech_reading r = read_speech_model(Plan::model);
  if (!r.ok()) return r.problem;
  const training_desc& t = Plan::training;
  const mesh_desc& m = Plan::mesh;
  if (t.stack != stack_kind::memalg)
    return "the speech runtime's memory is the memalg stack's: name train::stacks::memalg in the recipe";
  if (m.tp != 1 || m.pp != 1 || m.cp != 1 || m.ep != 1 || m.zero_stage != 0 || m.sequence_parallel)
    return "the speech runtime is data parallel only (no ZeRO, tensor, sequence, pipeline, context or expert parallelism)";
  if (t.recompute != recompute_kind::none) return "the speech runtime does not recompute activations";
  if (t.offload_activations) return "the speech runtime does not offload activations";
  const precision_policy& p = t.precision;
  const bool fp32 = p.weights == dtypes::fp32 && p.gradients == dtypes::fp32 && p.master_weights.is_none();
  const bool bf16 = p.weights == dtypes::bf16 && p.gradients == dtypes::bf16 && p.master_weights == dtypes::fp32;
  if (!fp32 && !bf16) return "the speech runtime trains in fp32, or in bf16 with fp32 master weights";
  if (!(t.optimizer.state_dtype.is_none() || t.optimizer.state_dtype == dtypes::fp32) ||
      !(p.optimizer_states == dtypes::fp32) || t.optimizer.quant_block != 0)
    return "the speech runtime keeps fp32 optimizer states";
  if (!runtime_optimizer(t.optimizer.kind)) return "the speech runtime implements sgd, momentum, adam and adamw";
  return {};
}

/// The runtime's configuration of a plan the runtime implements (speech_plan_issue is empty).
template <class Plan>
constexpr speech_config speech_config_of() {
  speech_config c = read_speech_model(Plan::model).config;
  const training_desc& t = Plan::training;
  c.micro_batch = t.micro_batch;
  c.frames = t.sequence;
  c.grad_accum = t.grad_accum;
  c.dp = Plan::mesh.dp;
  c.master_weights = !t.precision.master_weights.is_none();
  c.optimizer = t.optimizer.kind;
  return c;
}

}  // namespace memalg::exec

// SPDX-License-Identifier: BSL-1.0
// memalg/exec/speech/state.hpp — the speech lowering's ground floor: the configuration and its
// dimensions, the micro-batch's inputs, and the parameter units (encoder, decoder, pre- and
// post-nets) with their initialisation. speech_lowering (exec/speech/build_program.hpp) derives
// from it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "memalg/exec/arena_layout.hpp"
#include "memalg/exec/lowering.hpp"
#include "memalg/exec/program.hpp"
#include "memalg/exec/speech/config.hpp"
#include "memalg/model/layer.hpp"

namespace memalg::exec::detail {

/// The configuration, the inputs and the units of the speech model's lowering.
class speech_state : public lowering_base {
 protected:
  speech_state(const speech_config& c, arena_sizes sizes, rank_coords r, elem storage)
      : lowering_base("build_speech_program", sizes, storage, true), c_(c), r_(r), io_(speech_inputs_of(c)) {}

  // ---- configuration ----------------------------------------------------------------------------
  void validate() const {
    if (c_.heads == 0 || c_.hidden % c_.heads != 0) fail("heads must divide the hidden width");
    if (c_.dp == 0 || r_.dp >= c_.dp || r_.tp != 0 || r_.pp != 0) fail("the rank lies outside the data-parallel mesh");
    if (c_.micro_batch == 0 || c_.frames == 0 || c_.text_tokens == 0 || c_.grad_accum == 0)
      fail("micro-batch, frames, phonemes and accumulation must be at least 1");
    if (c_.kernel == 0) fail("the convolutions need a kernel of at least 1");
    if (c_.encoder_layers == 0 || c_.decoder_layers == 0) fail("the encoder and the decoder need a block each");
    check_storage_and_optimizer(c_.optimizer);
  }
  std::size_t Nd() const { return c_.micro_batch * c_.frames; }       // decoder rows
  std::size_t Ne() const { return c_.micro_batch * c_.text_tokens; }  // encoder rows
  std::size_t D() const { return c_.hidden / c_.heads; }
  /// Every LayerNorm's ε: the model's, or nn.LayerNorm's default (model/layer.hpp).
  double norm_eps() const { return c_.norm_eps > 0 ? c_.norm_eps : default_norm_eps(false); }

  // ---- the inputs -----------------------------------------------------------------------------------
  operand feature(std::size_t at, std::size_t n) const { return {at, n, elem::f32, where::features}; }
  operand mask(std::size_t at, std::size_t n) const { return {at, n, elem::u8, where::masks}; }
  operand frame_mask() const { return mask(io_.frame_mask, Nd()); }
  operand phoneme_mask() const { return mask(io_.phoneme_mask, Ne()); }

  // ---- units ----------------------------------------------------------------------------------------
  struct unit {
    std::string name;
    std::size_t elements = 0;
    operand weight, grad, master, state1, state2;
    element_ranges no_decay;              ///< norms, biases, batch norm
    std::vector<param_init> init;
  };
  /// Offsets inside a unit, filled as the unit is described.
  struct conv_view { std::size_t w, b, gamma, beta, end; };
  struct block_view {
    std::size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b;          // self-attention
    std::size_t lnx_w, lnx_b, q_w, q_b, kv_w, kv_b, projx_w, projx_b;  // cross-attention (decoder)
    std::size_t ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b, end;
  };
  static param_init ones(std::size_t at, std::size_t n) {
    param_init i;
    i.at = at;
    i.cols = n;
    i.constant = 1.0f;
    return i;
  }
  param_init normal(std::size_t at, std::size_t n, std::size_t tensor, float stddev) const {
    param_init i;
    i.k = param_init::kind::normal;
    i.at = at;
    i.rows = 1;
    i.cols = n;
    i.rng_tensor = tensor;
    i.stddev = stddev;
    return i;
  }
  static float fan_in(std::size_t n) { return 1.0f / std::sqrt(static_cast<float>(n)); }
  unit& add_unit(std::string name) {
    units_.push_back(unit{});
    units_.back().name = std::move(name);
    return units_.back();
  }
  /// A convolution's unit: W [OC, IC, K] ~ N(0, 1/(IC·K)), bias 0, batch norm γ 1, β 0.
  conv_view conv_unit(const std::string& name, std::size_t IC, std::size_t OC) {
    unit& u = add_unit(name);
    conv_view v{};
    v.w = 0;
    v.b = OC * IC * c_.kernel;
    v.gamma = v.b + OC;
    v.beta = v.gamma + (c_.batchnorm ? OC : 0);
    v.end = v.beta + (c_.batchnorm ? OC : 0);
    u.elements = v.end;
    u.no_decay = {{v.b, v.end}};
    u.init.push_back(normal(v.w, v.b, units_.size() * 8, fan_in(IC * c_.kernel)));
    if (c_.batchnorm) u.init.push_back(ones(v.gamma, OC));
    return v;
  }
  /// A linear layer's unit: W [OC, IC] ~ N(0, 1/IC), bias 0.
  std::size_t linear_unit(const std::string& name, std::size_t IC, std::size_t OC) {
    unit& u = add_unit(name);
    u.elements = OC * IC + OC;
    u.no_decay = {{OC * IC, OC * IC + OC}};
    u.init.push_back(normal(0, OC * IC, units_.size() * 8, fan_in(IC)));
    return OC * IC;  // the bias's offset
  }
  block_view block_unit(const std::string& name, bool cross) {
    const std::size_t C = c_.hidden, F = c_.ffn;
    unit& u = add_unit(name);
    block_view v{};
    element_cursor o;
    v.ln1_w = o.take(C), v.ln1_b = o.take(C), v.qkv_w = o.take(3 * C * C), v.qkv_b = o.take(3 * C);
    v.proj_w = o.take(C * C), v.proj_b = o.take(C);
    v.lnx_w = o.take(cross ? C : 0), v.lnx_b = o.take(cross ? C : 0), v.q_w = o.take(cross ? C * C : 0);
    v.q_b = o.take(cross ? C : 0), v.kv_w = o.take(cross ? 2 * C * C : 0), v.kv_b = o.take(cross ? 2 * C : 0);
    v.projx_w = o.take(cross ? C * C : 0), v.projx_b = o.take(cross ? C : 0);
    v.ln2_w = o.take(C), v.ln2_b = o.take(C), v.fc1_w = o.take(F * C), v.fc1_b = o.take(F), v.fc2_w = o.take(C * F);
    v.fc2_b = o.take(C), v.end = o.end;
    u.elements = v.end;
    u.no_decay = {{v.ln1_w, v.qkv_w}, {v.qkv_b, v.proj_w}, {v.proj_b, v.q_w}, {v.q_b, v.kv_w},
                  {v.kv_b, v.projx_w}, {v.projx_b, v.fc1_w}, {v.fc1_b, v.fc2_w}, {v.fc2_b, v.end}};
    const std::size_t t = units_.size() * 8;
    const std::size_t L = c_.encoder_layers + c_.decoder_layers;
    const float res = 0.02f / std::sqrt(2.0f * static_cast<float>(L));  // GPT-2's residual projections
    u.init.push_back(ones(v.ln1_w, C));
    u.init.push_back(normal(v.qkv_w, 3 * C * C, t + 1, 0.02f));
    u.init.push_back(normal(v.proj_w, C * C, t + 2, res));
    if (cross) {
      u.init.push_back(ones(v.lnx_w, C));
      u.init.push_back(normal(v.q_w, C * C, t + 3, 0.02f));
      u.init.push_back(normal(v.kv_w, 2 * C * C, t + 4, 0.02f));
      u.init.push_back(normal(v.projx_w, C * C, t + 5, res));
    }
    u.init.push_back(ones(v.ln2_w, C));
    u.init.push_back(normal(v.fc1_w, F * C, t + 6, 0.02f));
    u.init.push_back(normal(v.fc2_w, C * F, t + 7, res));
    return v;
  }
  std::size_t norm_unit(const std::string& name) {
    unit& u = add_unit(name);
    u.elements = 2 * c_.hidden;
    u.no_decay = {{0, u.elements}};
    u.init.push_back(ones(0, c_.hidden));
    return units_.size() - 1;
  }
  void build_units() {
    const std::size_t C = c_.hidden, M = c_.mel_bins, P = c_.prenet, Q = c_.postnet;
    {
      unit& e = add_unit("encoder.embedding");
      e.elements = c_.phonemes * C;
      e.init.push_back(normal(0, e.elements, 8, 1.0f));
    }
    for (std::size_t i = 0; i < c_.encoder_convs; ++i) enc_conv_.push_back(conv_unit("encoder.prenet.conv" + std::to_string(i), C, C));
    enc_block0_ = units_.size();
    for (std::size_t l = 0; l < c_.encoder_layers; ++l) enc_blk_ = block_unit("encoder.block" + std::to_string(l), false);
    enc_norm_ = norm_unit("encoder.final_norm");
    pre1_ = units_.size();
    linear_unit("decoder.prenet.fc1", M, P);
    linear_unit("decoder.prenet.fc2", P, P);
    linear_unit("decoder.prenet.proj", P, C);
    dec_block0_ = units_.size();
    for (std::size_t l = 0; l < c_.decoder_layers; ++l) dec_blk_ = block_unit("decoder.block" + std::to_string(l), true);
    dec_norm_ = norm_unit("decoder.final_norm");
    out_ = units_.size();
    out_b_ = linear_unit("decoder.mel_stop_out", C, M + 1);
    post0_ = units_.size();
    post_.push_back(conv_unit("decoder.postnet.in", M, Q));
    for (std::size_t i = 0; i < c_.postnet_convs; ++i) post_.push_back(conv_unit("decoder.postnet.conv" + std::to_string(i), Q, Q));
    post_.push_back(conv_unit("decoder.postnet.out", Q, M));
  }
  void allocate_states() {
    lowering_base::allocate_states(units_, 0, c_.master_weights, c_.optimizer);
    for (const unit& u : units_) {
      param_unit d = param_unit_of(u);
      d.init = u.init;
      p_.units.push_back(std::move(d));
    }
  }
  void reduce(const unit& u) {
    if (c_.dp > 1) emit(ops::all_reduce{u.grad, group::dp, reduce_op::sum}, when::last_micro);
  }

  speech_config c_;
  rank_coords r_;
  speech_inputs io_;
  std::vector<unit> units_;
  std::vector<conv_view> enc_conv_, post_;
  block_view enc_blk_{}, dec_blk_{};
  std::size_t enc_block0_ = 0, enc_norm_ = 0, pre1_ = 0, dec_block0_ = 0, dec_norm_ = 0;
  std::size_t out_ = 0, out_b_ = 0, post0_ = 0;
};

}  // namespace memalg::exec::detail

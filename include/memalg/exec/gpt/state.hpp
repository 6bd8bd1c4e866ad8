// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/state.hpp — the GPT lowering's ground floor: the configuration and its derived
// dimensions, the arena as a rank (or a pipeline stage) sees it, and the parameter units with
// their initialisation.
//
// gpt_lowering (exec/gpt/build_program.hpp) is built by concern, each floor deriving from the one
// below: state.hpp (this header) → parallel.hpp (ZeRO, tensor and sequence parallelism) → blocks.hpp
// (one block's forward and backward) → micro_batch.hpp (embeddings, head and loss, one
// micro-batch) → pipeline.hpp (a stage's 1F1B step) → build_program.hpp (the step's end, the
// program). Every floor shares one state, the one declared here.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memalg/exec/arena_layout.hpp"
#include "memalg/exec/gpt/config.hpp"
#include "memalg/exec/gpt/layout.hpp"
#include "memalg/exec/lowering.hpp"
#include "memalg/exec/program.hpp"
#include "memalg/model/layer.hpp"

namespace memalg::exec::detail {

/// The configuration, the arena and the units of one rank's GPT lowering.
class gpt_state : public lowering_base {
 protected:
  gpt_state(const gpt_config& c, arena_sizes sizes, rank_coords r, elem storage, std::size_t slot_bytes, bool measuring)
      : lowering_base("build_program", sizes, storage), c_(c), r_(r), slot_bytes_(slot_bytes), measuring_(measuring) {}

  // ---- configuration ---------------------------------------------------------------------------
  void validate() const {
    if (c_.heads == 0 || c_.tp == 0 || c_.dp == 0) fail("heads, dp and tp must be at least 1");
    if (c_.shared_norm && !c_.parallel_residual)
      fail("a shared norm feeds the two branches of a parallel block: set parallel_residual too");
    if (c_.qk_norm && (!c_.rms_norm || c_.sequence_parallel))
      fail("the per-head QK-norm (Qwen3's) runs in RMSNorm blocks without sequence parallelism");
    if (c_.geglu && !c_.gated) fail("GeGLU is a gated MLP: set gated too");
    if (c_.attn_softcap < 0 || c_.final_softcap < 0 || c_.query_scalar < 0)
      fail("softcaps and the query scalar are positive (0: none)");
    if (c_.final_softcap > 0 && (vp() || sp()))
      fail("final-logit softcapping runs on a replicated output layer (no vocabulary or sequence parallelism)");
    if (c_.sandwich_norms && (!c_.rms_norm || c_.parallel_residual || c_.sequence_parallel || c_.dropout > 0))
      fail("norms before and after the sub-layers (Gemma's) run in sequential RMSNorm blocks without dropout or "
           "sequence parallelism");
    if (c_.head_dim == 0 && c_.hidden % c_.heads != 0) fail("heads must divide the hidden width");
    if (kv_heads() == 0 || c_.heads % kv_heads() != 0) fail("the key/value heads must divide the heads");
    if (c_.heads % c_.tp != 0 || kv_heads() % c_.tp != 0)
      fail("the tensor-parallel degree must divide the heads and the key/value heads");
    if (rotary() && head_dim() % 2 != 0) fail("rotary positions need an even head width");
    if (rotary() && (c_.rotary_dim % 2 != 0 || c_.rotary_dim > head_dim()))
      fail("rotary_dim must be even and at most the head width");
    if (c_.loss_chunk != 0 && (c_.vocab_parallel || c_.sequence_parallel) && c_.tp > 1)
      fail("a chunked loss runs on a replicated output layer (no vocabulary or sequence parallelism)");
    if (c_.ffn % c_.tp != 0) fail("the tensor-parallel degree must divide the MLP width");
    if (vp() && c_.vocab % c_.tp != 0) fail("the tensor-parallel degree must divide the vocabulary (vocabulary-parallel embedding)");
    if (sp() && !vp()) fail("sequence parallelism needs the vocabulary-parallel embedding and loss");
    if (sp() && tokens() % c_.tp != 0) fail("the tensor-parallel degree must divide the tokens of a micro-batch (sequence parallelism)");
    if (c_.positions != 0 && c_.sequence > c_.positions) fail("the sequence is longer than the position embedding");
    if (c_.pp == 0) fail("the pipeline needs at least one stage");
    if (r_.dp >= c_.dp || r_.tp >= c_.tp || r_.pp >= c_.pp) fail("the rank coordinates lie outside the mesh");
    if (c_.pp > 1) {
      if (c_.layers < c_.pp) fail("the pipeline has more stages than blocks");
      if (c_.tied) fail("pipeline stages need an untied output layer (no copy of the token embedding on the last stage)");
      if (c_.recompute != recompute_kind::none && c_.recompute != recompute_kind::selective)
        fail("pipeline stages implement no recomputation or selective recomputation");
      if (c_.zero_stage > 1) fail("pipeline stages implement ZeRO-0 and ZeRO-1");
      if (c_.tp > 1) fail("pipeline stages implement no tensor parallelism");
    }
    if (c_.dropout > 0 && !c_.flash)
      fail("dropout needs flash attention: the reference naive attention has no attention-probability dropout");
    if (c_.recompute == recompute_kind::every_k && c_.recompute_every == 0) fail("recompute every:K needs K >= 1");
    check_storage_and_optimizer(c_.optimizer);
  }
  std::size_t tokens() const { return c_.micro_batch * c_.sequence; }
  /// Vocabulary-parallel embedding and loss (Megatron's layout): this rank's vocab_rows() rows
  /// from vocab_begin(). Sequence parallelism: the residual stream is this rank's rows() token
  /// rows from row0() (a contiguous block of the micro-batch's B·S rows).
  bool vp() const { return c_.vocab_parallel && c_.tp > 1; }
  bool sp() const { return c_.sequence_parallel && c_.tp > 1; }
  std::size_t vocab_rows() const { return vp() ? c_.vocab / c_.tp : c_.vocab; }
  std::size_t vocab_begin() const { return vp() ? r_.tp * vocab_rows() : 0; }
  std::size_t rows() const { return sp() ? tokens() / c_.tp : tokens(); }
  std::size_t row0() const { return sp() ? r_.tp * rows() : 0; }
  std::size_t local_heads() const { return c_.heads / c_.tp; }
  std::size_t kv_heads() const { return c_.kv_heads != 0 ? c_.kv_heads : c_.heads; }
  std::size_t local_kv_heads() const { return kv_heads() / c_.tp; }
  std::size_t head_dim() const { return c_.head_dim != 0 ? c_.head_dim : c_.hidden / c_.heads; }
  /// Attention output width per rank (H·D / tp; hidden / tp for GPT-2).
  std::size_t local_width() const { return local_heads() * head_dim(); }
  std::size_t local_kv_width() const { return local_kv_heads() * head_dim(); }
  std::size_t local_qkv() const { return local_width() + 2 * local_kv_width(); }
  std::size_t local_ffn() const { return c_.ffn / c_.tp; }
  std::size_t fc1_rows() const { return c_.gated ? 2 * local_ffn() : local_ffn(); }
  bool rotary() const { return c_.positions == 0; }
  bool norm_bias() const { return !c_.rms_norm && c_.bias; }
  /// Every norm's ε: the model's, or its kind's default (model/layer.hpp, default_norm_eps).
  double norm_eps() const { return c_.norm_eps > 0 ? c_.norm_eps : default_norm_eps(c_.rms_norm); }
  /// Every norm's weight offset: Gemma's RMSNorms scale by 1 + w (ops::norm_fwd::w_offset).
  double norm_offset() const { return c_.sandwich_norms ? 1.0 : 0.0; }
  /// A block's norms: a shared LayerNorm keeps its shift without `bias` (Falcon-7B's nn.LayerNorm;
  /// model/transformer.hpp, transformer_block_params).
  bool block_norm_bias() const { return !c_.rms_norm && (c_.bias || c_.shared_norm); }
  std::size_t norm_elements() const { return norm_bias() ? 2 * c_.hidden : c_.hidden; }
  /// Block `layer`'s attention: Gemma 2's sliding window on its even layers (`sliding_window`,
  /// modeling_gemma2.py: layer_types alternate sliding_attention, full_attention from layer 0),
  /// its score softcapping and query_pre_attn_scalar's scale on all.
  attn_shape shape(std::size_t layer) const {
    attn_shape sh{u32(c_.micro_batch), u32(c_.sequence), u32(local_heads()), u32(local_kv_heads()), u32(head_dim()), true,
                  c_.flash};
    sh.window = c_.sliding_window != 0 && layer % 2 == 0 ? u32(c_.sliding_window) : 0;
    sh.softcap = c_.attn_softcap;
    sh.scale = c_.query_scalar > 0 ? 1.0f / std::sqrt(c_.query_scalar) : 0.0f;
    return sh;
  }
  /// Gemma's embedding normalizer √hidden (0: none).
  float embed_scale() const { return c_.embed_scale ? std::sqrt(static_cast<float>(c_.hidden)) : 0.0f; }
  bool keeps_core() const { return c_.recompute != recompute_kind::selective; }
  std::size_t segment() const {
    return c_.recompute == recompute_kind::every_k ? c_.recompute_every
           : c_.recompute == recompute_kind::full  ? 1
                                                   : c_.layers;
  }

  // ---- the arena and the op stream ------------------------------------------------------------
  operand push(std::string_view name, std::size_t n, elem e, category cat, side s = side::saved) {
    if (slot_open_ && s == side::saved && cat == category::activations) {  // a micro-batch's saved tensor: its slot
      const std::size_t b = arena_layout::checked_bytes(name, n, elem_size(e));
      if (!measuring_ && b > slot_end_ - slot_top_)
        throw arena_error("build_program: '" + std::string(name) + "' overflows the micro-batch's stash slot");
      const operand o{slot_top_, n, e, where::arena};
      slot_top_ += b;
      return o;
    }
    return lowering_base::push(name, n, e, cat, s);
  }
  /// Releases a tensor; a stash slot's tensors and the boundary buffer live for the whole step.
  void pop(const operand& o) {
    if (c_.pp > 1 && (o == boundary_ || (o.offset >= stash_begin_ && o.offset < stash_end_))) return;
    lowering_base::pop(o);
  }
  operand tok() const { return {0, tokens(), elem::i32, where::tokens}; }
  operand tgt() const { return {0, tokens(), elem::i32, where::targets}; }
  /// Target ids of rows [r0, r0 + rows) (an element offset, not a byte offset).
  operand tgt(std::size_t r0, std::size_t rows) const { return {r0, rows, elem::i32, where::targets}; }
  /// Logits rows a chunked loss projects at a time (all of them unchunked).
  std::size_t loss_rows() const { return c_.loss_chunk != 0 && c_.loss_chunk < tokens() ? c_.loss_chunk : tokens(); }

  // ---- units ----------------------------------------------------------------------------------
  struct unit {
    std::string name;
    std::size_t global = 0;  ///< index among the whole model's units (its initialisation streams)
    std::size_t elements = 0, shard = 0;
    operand weight, grad, master, state1, state2;
    element_ranges no_decay, replicated;
  };
  void build_units() {
    blk_ = gpt_block_layout(c_.hidden, local_width(), local_kv_width(), local_ffn(), block_norm_bias(), c_.bias, c_.gated,
                            c_.qkv_bias, c_.shared_norm, c_.qk_norm ? head_dim() : 0, c_.sandwich_norms);
    first_block_ = c_.positions != 0 ? 2 : 1;
    lnf_ = first_block_ + c_.layers;
    // This stage's blocks [block_lo_, block_hi_): the planner's split, earlier stages taking the remainder.
    for (std::size_t s = 0; s <= r_.pp; ++s) {
      block_lo_ = block_hi_;
      block_hi_ += c_.layers / c_.pp + (s < c_.layers % c_.pp ? 1 : 0);
    }
    const bool first = r_.pp == 0, last = r_.pp + 1 == c_.pp;
    std::size_t global = 0;
    for (gpt_unit_spec& s : gpt_units("build_program", vocab_rows(), c_.positions, c_.hidden, c_.layers, blk_, c_.dp,
                                      norm_elements(), c_.tied)) {
      const std::size_t g = global++;
      if (c_.pp > 1) {
        const bool embedding = s.name == "wte" || s.name == "wpe", head = s.name == "lnf" || s.name == "lm_head";
        const std::size_t l = g - (c_.positions != 0 ? 2 : 1);
        if (embedding ? !first : head ? !last : (l < block_lo_ || l >= block_hi_)) continue;
        if (!embedding && !head && l == block_lo_) first_block_stage_ = units_.size();
        if (s.name == "lnf") lnf_ = units_.size();
      }
      unit u;
      u.global = g;
      u.name = std::move(s.name);
      u.elements = s.elements;
      u.shard = s.shard;
      u.no_decay = std::move(s.no_decay);
      u.replicated = std::move(s.replicated);
      if (vp() && (u.name == "wte" || u.name == "lm_head")) u.replicated.clear();  // this rank's vocabulary rows
      units_.push_back(std::move(u));
    }
    if (c_.pp > 1) first_block_ = first_block_stage_;
  }
  void allocate_states() {
    lowering_base::allocate_states(units_, c_.zero_stage, c_.master_weights, c_.optimizer);
    describe_units();
  }
  /// Initialisation as data: GPT-2's init (std 0.02, 0.02/√(2L) for the residual
  /// projections, norms at 1, biases at 0), by logical index so every TP rank draws its part.
  void describe_units() {
    const std::size_t C = c_.hidden, W = local_width(), Wkv = local_kv_width(), F = local_ffn(), Ff = c_.ffn, r = r_.tp;
    const std::size_t Wf = c_.heads * head_dim(), Wkvf = kv_heads() * head_dim();  // logical q and k/v widths
    const float std_w = 0.02f, std_res = 0.02f / std::sqrt(2.0f * static_cast<float>(c_.layers));  // GPT-2 init
    using k = param_init::kind;
    // Norm weights start at 1, or at 0 where the norm scales by 1 + w (Gemma's).
    const auto ones = [this](std::size_t at, std::size_t n) {
      param_init i;
      i.at = at;
      i.cols = n;
      i.constant = static_cast<float>(1.0 - norm_offset());
      return i;
    };
    const auto normal = [](std::size_t at, std::size_t rows, std::size_t cols, std::uint64_t tensor, std::size_t row0,
                           std::size_t col0, std::size_t row_stride, float stddev) {
      return param_init{k::normal, at, rows, cols, tensor, row0, col0, row_stride, stddev, 0.0f};
    };
    const int z = c_.zero_stage;
    for (std::size_t ui = 0; ui < units_.size(); ++ui) {
      const unit& u = units_[ui];
      param_unit d = param_unit_of(u);
      d.weight_begin = z >= 3 ? shard_begin(u) : 0;
      d.master_begin = z >= 1 ? shard_begin(u) : 0;
      const std::size_t gi = u.global;
      if (vp() && (u.name == "wte" || u.name == "lm_head")) {  // rows [vocab_begin, +vocab_rows) of [V, C]
        d.init.push_back(normal(0, vocab_rows(), C, gi, vocab_begin(), 0, C, std_w));
      } else if (u.name == "wte" || u.name == "wpe" || u.name == "lm_head") {
        d.init.push_back(normal(0, 1, u.elements, gi, 0, 0, 0, std_w));
      } else if (u.name == "lnf") {
        d.init.push_back(ones(0, C));
      } else {
        const gpt_block_view& b = blk_;
        d.init.push_back(ones(b.ln1_w, C));
        if (!c_.shared_norm) d.init.push_back(ones(b.ln2_w, C));
        if (c_.sandwich_norms) {
          d.init.push_back(ones(b.post_attn_w, C));
          d.init.push_back(ones(b.post_ffn_w, C));
        }
        if (c_.qk_norm) d.init.push_back(ones(b.q_norm_w, 2 * head_dim()));  // q_norm ‖ k_norm
        // this rank's q, k, v rows of the logical [Wf + 2·Wkvf, C] matrix ([3C, C] for GPT-2)
        d.init.push_back(normal(b.qkv_w, W, C, gi * 8 + 1, r * W, 0, C, std_w));
        d.init.push_back(normal(b.qkv_w + W * C, Wkv, C, gi * 8 + 1, Wf + r * Wkv, 0, C, std_w));
        d.init.push_back(normal(b.qkv_w + (W + Wkv) * C, Wkv, C, gi * 8 + 1, Wf + Wkvf + r * Wkv, 0, C, std_w));
        d.init.push_back(normal(b.proj_w, C, W, gi * 8 + 2, 0, r * W, Wf, std_res));  // proj [C, Wf]: this rank's columns
        d.init.push_back(normal(b.fc1_w, F, C, gi * 8 + 3, r * F, 0, C, std_w));      // fc1 [F, C]: this rank's rows
        if (c_.gated)  // the up rows of the logical [2F, C] gate ‖ up matrix
          d.init.push_back(normal(b.fc1_w + F * C, F, C, gi * 8 + 3, Ff + r * F, 0, C, std_w));
        d.init.push_back(normal(b.fc2_w, C, F, gi * 8 + 4, 0, r * F, Ff, std_res));   // fc2 [C, F]: this rank's columns
      }
      p_.units.push_back(std::move(d));
    }
  }
  std::size_t shard_begin(const unit& u) const { return r_.dp * u.shard; }


  gpt_config c_;
  rank_coords r_;
  gpt_block_view blk_{};
  std::size_t first_block_ = 2, lnf_ = 0;  ///< unit indices of block 0 and the final norm
  // pipeline: this stage's blocks, the boundary buffer, the stash and the open slot
  std::size_t block_lo_ = 0, block_hi_ = 0, first_block_stage_ = 0;
  operand boundary_{};
  std::size_t slot_bytes_ = 0, slot_used_ = 0, stash_begin_ = 0, stash_end_ = 0, slot_top_ = 0, slot_end_ = 0;
  bool measuring_ = false, slot_open_ = false;
  std::vector<unit> units_;
};

}  // namespace memalg::exec::detail

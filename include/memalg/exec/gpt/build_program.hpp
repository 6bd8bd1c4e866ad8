// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/build_program.hpp — lowers a GPT-2 training step to a step program, on the host.
//
// `build_program(cfg, sizes, rank)` issues, through an `arena_layout` of the plan's capacities,
// the pushes and pops of one rank's step — its construction's
// persistent tensors, then one step: forward, loss, backward with recomputation none / selective /
// full / every-K, dropout masks, naive or flash attention, ZeRO-3 gathers and ZeRO-2/3 unsharded
// gradient buffers — and emits the ops in that order. The step is a pure function of the
// configuration (nothing in the arena depends on data), so the program's offsets, high-water mark
// and peak by category are known without running a kernel; a push past the
// plan or a pop out of order throws arena_error here, at build time.
//
// The same lowering takes gpt_config's block variant:
// RMSNorm, a SwiGLU MLP (fc1 writes [gate ‖ up]; its backward runs in place over d(out), so the
// MLP backward holds 2·inner as the plan says), rotary positions when positions == 0 (in place on
// qkv and on its gradient: no tensor added), grouped-query attention (qkv [N, (H + 2Hkv)·D]), no
// biases, and an untied output layer (a last unit `lm_head`). A parallel block (GPT-NeoX, GPT-J,
// Falcon: y = x + attn(ln1(x)) + mlp(ln2(x)), or with a shared norm y = x + attn(ln(x)) + mlp(ln(x))
// as Falcon-7B) saves no sum after attention: its forward holds the attention branch's x + attn in
// a transient while the MLP runs and writes FC2 straight into the output; its backward runs the
// out-projection's backward first (the attention branch's last read of the output gradient, its
// input gradient kept through the MLP branch), so both norms' input gradients add into the
// residual gradient as in the sequential block, and with a shared norm the two branches'
// gradients of its output are summed before its one backward.
//
// Pipeline parallelism (cfg.pp > 1, rank.pp the stage): the stage owns the blocks the planner
// gives it (plan/model_states.hpp, instances_on_stage: earlier stages take the remainder), the
// embeddings on the first stage, the final norm and the untied output layer with the loss on the
// last. It keeps one boundary buffer of [N, C] (comm_buffers) for the step, the receive buffer of
// an incoming activation and the send buffer of the last block's output, and a stash of
// min(pp − s, m) slots (plan/activations.hpp, chunks_in_flight), both pushed once for the step.
// Micro-batch i's saved tensors (the activations its forward pushes) live in slot i mod slots from
// its forward to its backward, so 1F1B's non-LIFO lifetimes still go through the checked layout:
// transients push and pop as before within each forward and backward section. The stage input is
// received into the boundary buffer and copied into the slot (the first block's backward reads
// it); the gradient of the stage's output is received into grad_residual and the gradient of its
// input sent from there. The step ends with the loss and the gradient norm's parts summed over
// the pipeline group too (the loss exists on the last stage only).
//
// Under tensor parallelism gpt_config can ask for Megatron's layout (docs/runtime.md, "Tensor parallelism in the program"): vocab_parallel — the
// token embedding's rows, the tied output's logits and the cross-entropy split by vocabulary
// (ops::vocab_parallel_loss), the lookup summed over tp before the positions are added — and
// sequence_parallel — the residual stream on this rank's N/tp token rows, all-gathered into a
// communication buffer before QKV and FC1 (and in backward for their weight gradients), the
// projection's and FC2's partial sums reduce-scattered, the norms' gradients all-reduced over tp
// at step end (Korthikanti et al. 2022, §4.2.2).
//
// The one reordering: ZeRO-0/1 gradient reductions, which the trainer runs after all
// micro-batches, are emitted in `micro` with when::last_micro right after each unit's last
// backward (nothing touches the buffer afterwards and the reduction is elementwise, so the result
// is the same; a backend may overlap them with the rest of backward).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memalg/exec/arena_layout.hpp"
#include "memalg/exec/gpt/config.hpp"
#include "memalg/exec/gpt/layout.hpp"
#include "memalg/exec/lowering.hpp"
#include "memalg/exec/program.hpp"

namespace memalg::exec {

/// The storage type gpt_run picks for a configuration: fp16 with loss scaling, bf16 with master
/// weights, fp32 otherwise.
constexpr elem default_storage(const gpt_config& c) {
  return c.loss_scaling ? elem::f16 : c.master_weights ? elem::bf16 : elem::f32;
}

namespace detail {

/// One rank's lowering, by concern: configuration, units, initialisation, ZeRO, blocks, step end.
class gpt_lowering : lowering_base {
 public:
  gpt_lowering(const gpt_config& c, arena_sizes sizes, rank_coords r, elem storage, std::size_t slot_bytes = 0,
               bool measuring = false)
      : lowering_base(sizes, storage), c_(c), r_(r), slot_bytes_(slot_bytes), measuring_(measuring) {}

  /// The bytes one micro-batch's saved tensors take in a stash slot on this stage (pp > 1).
  std::size_t measure_slot() {
    validate();
    build_units();
    allocate_states();
    pipeline_step_layout();
    return slot_used_;
  }

  program build() {
    validate();
    build_units();
    allocate_states();
    layout_.enable_trace();
    if (c_.pp > 1) return build_pipeline();
    section_ = &p_.step_begin;
    for (unit& u : units_) emit(ops::zero{u.grad});
    lay_out_micro(c_.grad_accum, [this] { micro_batch(); });
    section_ = &p_.step_end;
    step_end();
    finish();
    return std::move(p_);
  }

 private:
  void finish() {
    finish_layout();
    p_.grad_accum = c_.grad_accum;
    p_.micro_batch = c_.micro_batch;
    p_.sequence = c_.sequence;
    p_.tokens_per_micro = tokens();
    p_.targets_per_micro = tokens();
    p_.dp = c_.dp;
    p_.tp = c_.tp;
    p_.dp_rank = r_.dp;
    p_.tp_rank = r_.tp;
    p_.loss_scaling = c_.loss_scaling;
    p_.pp = c_.pp;
    p_.pp_rank = r_.pp;
    p_.hp = {c_.optimizer, c_.lr, c_.weight_decay, c_.momentum, c_.beta1, c_.beta2, c_.eps, c_.max_grad_norm,
             c_.dropout, c_.seed};
  }

  // ---- configuration ---------------------------------------------------------------------------
  void validate() const {
    const auto fail = [](const std::string& why) { throw program_error("build_program: " + why); };
    if (c_.heads == 0 || c_.tp == 0 || c_.dp == 0) fail("heads, dp and tp must be at least 1");
    if (c_.shared_norm && !c_.parallel_residual)
      fail("a shared norm feeds the two branches of a parallel block: set parallel_residual too");
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
    if (T_ != elem::f32 && T_ != elem::bf16 && T_ != elem::f16) fail("the storage type must be f32, bf16 or f16");
    if (c_.recompute == recompute_kind::every_k && c_.recompute_every == 0) fail("recompute every:K needs K >= 1");
    if (!runtime_optimizer(c_.optimizer)) fail("the runtime implements sgd, momentum, adam and adamw");
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
  /// A block's norms: a shared LayerNorm keeps its shift without `bias` (Falcon-7B's nn.LayerNorm;
  /// model/transformer.hpp, transformer_block_params).
  bool block_norm_bias() const { return !c_.rms_norm && (c_.bias || c_.shared_norm); }
  std::size_t norm_elements() const { return norm_bias() ? 2 * c_.hidden : c_.hidden; }
  attn_shape shape() const {
    return {u32(c_.micro_batch), u32(c_.sequence), u32(local_heads()), u32(local_kv_heads()), u32(head_dim()), true,
            c_.flash};
  }
  static std::uint32_t u32(std::size_t n) {
    if (n > 0xffffffffu) throw program_error("build_program: a shape exceeds 32 bits");
    return static_cast<std::uint32_t>(n);
  }
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
                            c_.qkv_bias, c_.shared_norm);
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
    const auto ones = [](std::size_t at, std::size_t n) {
      param_init i;
      i.at = at;
      i.cols = n;
      i.constant = 1.0f;
      return i;
    };
    const auto normal = [](std::size_t at, std::size_t rows, std::size_t cols, std::uint64_t tensor, std::size_t row0,
                           std::size_t col0, std::size_t row_stride, float stddev) {
      return param_init{k::normal, at, rows, cols, tensor, row0, col0, row_stride, stddev, 0.0f};
    };
    const int z = c_.zero_stage;
    for (std::size_t ui = 0; ui < units_.size(); ++ui) {
      const unit& u = units_[ui];
      param_unit d;
      d.name = u.name;
      d.elements = u.elements;
      d.shard = u.shard;
      d.weight = u.weight;
      d.grad = u.grad;
      d.master = u.master;
      d.state1 = u.state1;
      d.state2 = u.state2;
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

  // ---- ZeRO helpers (use_weights / release / grad_buffer / finish_grad) ------------------------
  operand gather(unit& u) {
    operand full = transient(u.name + ".gathered", u.elements, T_, category::temporaries);
    emit(ops::all_gather{u.weight, full, group::dp});
    return full;
  }
  struct weights_in_use {
    operand data, gathered;
  };
  weights_in_use use_weights(unit& u) {
    if (c_.zero_stage < 3) return {u.weight, {}};
    operand g = gather(u);
    return {g, g};
  }
  void release(const weights_in_use& w) {
    if (!w.gathered.null()) pop(w.gathered);
  }
  operand grad_buffer(unit& u) {
    if (c_.zero_stage < 2) return u.grad;
    operand full = transient(u.name + ".grad_full", u.elements, T_, category::temporaries);
    emit(ops::zero{full});
    // This rank's accumulated shard goes into its own block: the reduce-scatter adds it once.
    emit(ops::copy{sub(full, shard_begin(u), u.shard), u.grad});
    return full;
  }
  void finish_grad(unit& u, const operand& full) {
    if (c_.zero_stage < 2) return;
    emit(ops::reduce_scatter{full, u.grad, group::dp});
    pop(full);
  }
  /// ZeRO-0/1: reduce unit u's accumulated gradient after its last backward of the step.
  void reduce_after_last_backward(unit& u) {
    if (c_.zero_stage > 1 || c_.dp == 1) return;
    if (c_.zero_stage == 0) emit(ops::all_reduce{u.grad, group::dp, reduce_op::sum}, when::last_micro);
    else emit(ops::reduce_scatter{u.grad, sub(u.grad, shard_begin(u), u.shard), group::dp}, when::last_micro);
  }
  void tp_sum(const operand& x) {
    if (c_.tp > 1) emit(ops::all_reduce{x, group::tp, reduce_op::sum});
  }
  void dropout_rows(const operand& x, const operand& mask, std::size_t site) {
    emit(ops::dropout_fwd{x, mask, x, u32(c_.micro_batch), u32(c_.sequence * c_.hidden), c_.dropout, u32(site),
                          row0() * c_.hidden});
  }

  // ---- sequence parallelism (Korthikanti et al. 2022, §4.2.2) ---------------------------------
  /// The input of a column-parallel product: this rank's rows all-gathered over tp into a
  /// communication buffer [N, C] (the plan's comm), or the operand itself without SP.
  operand gathered_rows(const operand& x, const char* name) {
    if (!sp()) return x;
    operand g = transient(name, tokens() * c_.hidden, T_, category::comm_buffers);
    emit(ops::all_gather{x, g, group::tp});
    return g;
  }
  void release_rows(const operand& g, const operand& x) {
    if (!(g == x)) pop(g);
  }
  /// The output of a row-parallel product: its [N, C] partial sums in a communication buffer,
  /// reduce-scattered into `out` (this rank's rows) by finish_rows; without SP `out` itself,
  /// all-reduced over tp.
  operand partial_rows(const operand& out, const char* name) {
    if (!sp()) return out;
    return transient(name, tokens() * c_.hidden, T_, category::comm_buffers);
  }
  void finish_rows(const operand& partial, const operand& out) {
    if (!sp()) {
      tp_sum(out);
      return;
    }
    emit(ops::reduce_scatter{partial, out, group::tp});
    pop(partial);
  }
  /// Backward of a column-parallel product whose input `x` is this rank's rows: the weight
  /// gradient from the re-gathered input, then the input gradient [N, C] written over that buffer
  /// and reduce-scattered into `din` (Megatron's LinearWithGradAccumulationAndAsyncCommunication
  /// with sequence_parallel: all-gather, grad input, reduce-scatter). Without SP: linear_bwd into
  /// din, then the all-reduce over tp.
  void column_parallel_bwd(const operand& din, const operand& dw, const operand& dbias, const operand& dout,
                           const operand& x, const operand& w, std::uint32_t IC, std::uint32_t OC) {
    const std::uint32_t n = u32(tokens());
    if (!sp()) {
      emit(ops::linear_bwd{din, dw, dbias, dout, x, w, n, IC, OC});
      tp_sum(din);
      return;
    }
    operand g = gathered_rows(x, "sp_gathered");
    emit(ops::linear_bwd{operand{}, dw, dbias, dout, g, w, n, IC, OC});
    emit(ops::linear_bwd{g, operand{}, operand{}, dout, g, w, n, IC, OC});
    emit(ops::reduce_scatter{g, din, group::tp});
    pop(g);
  }

  // ---- one block ------------------------------------------------------------------------------
  struct block_saved {
    operand ln1_out, qkv, att, atty, x_mid, ln2_out, fc1_out, gelu_out, x_out, lse, mask1, mask2;
  };
  operand w_at(const operand& W, std::size_t at, std::size_t n) const { return sub(W, at, n); }
  /// A bias (or LayerNorm shift) of n elements at `at`, null when the model has none.
  operand b_at(const operand& W, std::size_t at, std::size_t n, bool present) const {
    return present ? sub(W, at, n) : operand{};
  }
  void rope(const operand& x, bool backward) {
    if (!rotary()) return;
    const std::uint32_t rot = u32(c_.rotary_dim != 0 ? c_.rotary_dim : head_dim());
    if (backward) emit(ops::rotary_bwd{x, shape(), rot, c_.rope_theta});
    else emit(ops::rotary_fwd{x, shape(), rot, c_.rope_theta});
  }

  /// `x_out`, when given, receives the block's output instead of a new saved tensor (a pipeline
  /// stage's send buffer).
  block_saved block_forward(std::size_t l, const operand& x_in, const operand& W, category kind = category::activations,
                            const operand& x_out = {}) {
    const std::size_t N = tokens(), C = c_.hidden, Wd = local_width(), F = local_ffn();
    const gpt_block_view& b = blk_;
    const bool drop = c_.dropout > 0;
    const std::uint32_t n = u32(N), cc = u32(C), wd = u32(Wd), f = u32(F);
    const std::size_t Q = local_qkv(), F1 = fc1_rows();
    const bool rms = c_.rms_norm, nb = block_norm_bias(), bias = c_.bias;
    const std::size_t R = rows();  // residual-stream rows (N / tp under sequence parallelism)
    const std::uint32_t nr = u32(R);
    block_saved s{};
    s.ln1_out = push("ln1_out", R * C, T_, kind);
    emit(ops::norm_fwd{s.ln1_out, x_in, w_at(W, b.ln1_w, C), b_at(W, b.ln1_b, C, nb), nr, cc, rms});
    s.qkv = push("qkv", N * Q, T_, kind);
    {
      const operand in = gathered_rows(s.ln1_out, "sp_gathered");
      emit(ops::linear_fwd{s.qkv, in, w_at(W, b.qkv_w, Q * C), b_at(W, b.qkv_b, Q, bias || c_.qkv_bias), n, cc, u32(Q)});
      release_rows(in, s.ln1_out);
    }
    rope(s.qkv, false);
    const std::size_t scores = c_.micro_batch * local_heads() * c_.sequence * c_.sequence;
    const std::size_t lse_n = c_.micro_batch * local_heads() * c_.sequence;
    operand att_tmp{}, lse_tmp{};
    if (!c_.flash) {
      if (keeps_core()) s.att = push("attention_probs", scores, T_, kind);
      else att_tmp = transient("attention_probs", scores, T_, category::temporaries);
    } else {
      if (keeps_core()) s.lse = push("attention_lse", lse_n, A_, kind);
      else lse_tmp = transient("attention_lse", lse_n, A_, category::temporaries);
    }
    s.atty = push("attention_out", N * Wd, T_, kind);
    const operand core = !c_.flash ? (keeps_core() ? s.att : att_tmp) : (keeps_core() ? s.lse : lse_tmp);
    emit(ops::attention_fwd{s.atty, core, s.qkv, shape()});
    if (!lse_tmp.null()) pop(lse_tmp);
    if (!att_tmp.null()) pop(att_tmp);
    if (drop) s.mask1 = push("dropout_mask", R * C, elem::u8, kind);
    if (c_.parallel_residual) {
      // x + attn(ln1(x)) waits in a transient while the MLP branch, which reads x too, runs: no
      // sum after attention is saved (the plan's parallel block, plan/stacks/memalg.hpp).
      operand branch = transient("attention_branch", R * C, T_, category::temporaries);
      {
        const operand part = partial_rows(branch, "sp_partial");
        emit(ops::linear_fwd{part, s.atty, w_at(W, b.proj_w, C * Wd), operand{}, n, wd, cc});
        finish_rows(part, branch);
        if (bias) emit(ops::bias_add{branch, w_at(W, b.proj_b, C), nr, cc});
        if (drop) dropout_rows(branch, s.mask1, 2 * l);
        emit(ops::residual_add{branch, branch, x_in});
      }
      if (!c_.shared_norm) {
        s.ln2_out = push("ln2_out", R * C, T_, kind);
        emit(ops::norm_fwd{s.ln2_out, x_in, w_at(W, b.ln2_w, C), b_at(W, b.ln2_b, C, nb), nr, cc, rms});
      }
      const operand mlp_in = c_.shared_norm ? s.ln1_out : s.ln2_out;
      s.fc1_out = push("fc1_out", N * F1, T_, kind);
      {
        const operand in = gathered_rows(mlp_in, "sp_gathered");
        emit(ops::linear_fwd{s.fc1_out, in, w_at(W, b.fc1_w, F1 * C), b_at(W, b.fc1_b, F1, bias), n, cc, u32(F1)});
        release_rows(in, mlp_in);
      }
      s.gelu_out = push("gelu_out", N * F, T_, kind);
      emit(ops::activation_fwd{s.gelu_out, s.fc1_out,
                               c_.gated ? ops::activation_kind::swiglu : ops::activation_kind::gelu, n, f});
      if (drop) s.mask2 = push("dropout_mask", R * C, elem::u8, kind);
      s.x_out = x_out.null() ? push("residual", R * C, T_, kind) : x_out;
      {  // FC2 straight into the output, then the attention branch added
        const operand part = partial_rows(s.x_out, "sp_partial");
        emit(ops::linear_fwd{part, s.gelu_out, w_at(W, b.fc2_w, C * F), operand{}, n, f, cc});
        finish_rows(part, s.x_out);
        if (bias) emit(ops::bias_add{s.x_out, w_at(W, b.fc2_b, C), nr, cc});
        if (drop) dropout_rows(s.x_out, s.mask2, 2 * l + 1);
        emit(ops::residual_add{s.x_out, s.x_out, branch});
      }
      pop(branch);
      return s;
    }
    s.x_mid = push("residual", R * C, T_, kind);
    {
      operand proj = transient("proj_out", R * C, T_, category::temporaries);
      const operand part = partial_rows(proj, "sp_partial");
      emit(ops::linear_fwd{part, s.atty, w_at(W, b.proj_w, C * Wd), operand{}, n, wd, cc});
      finish_rows(part, proj);
      if (bias) emit(ops::bias_add{proj, w_at(W, b.proj_b, C), nr, cc});
      if (drop) dropout_rows(proj, s.mask1, 2 * l);
      emit(ops::residual_add{s.x_mid, x_in, proj});
      pop(proj);
    }
    s.ln2_out = push("ln2_out", R * C, T_, kind);
    emit(ops::norm_fwd{s.ln2_out, s.x_mid, w_at(W, b.ln2_w, C), b_at(W, b.ln2_b, C, nb), nr, cc, rms});
    s.fc1_out = push("fc1_out", N * F1, T_, kind);
    {
      const operand in = gathered_rows(s.ln2_out, "sp_gathered");
      emit(ops::linear_fwd{s.fc1_out, in, w_at(W, b.fc1_w, F1 * C), b_at(W, b.fc1_b, F1, bias), n, cc, u32(F1)});
      release_rows(in, s.ln2_out);
    }
    s.gelu_out = push("gelu_out", N * F, T_, kind);
    emit(ops::activation_fwd{s.gelu_out, s.fc1_out, c_.gated ? ops::activation_kind::swiglu : ops::activation_kind::gelu,
                             n, f});
    if (drop) s.mask2 = push("dropout_mask", R * C, elem::u8, kind);
    s.x_out = x_out.null() ? push("residual", R * C, T_, kind) : x_out;
    {
      operand fc2 = transient("fc2_out", R * C, T_, category::temporaries);
      const operand part = partial_rows(fc2, "sp_partial");
      emit(ops::linear_fwd{part, s.gelu_out, w_at(W, b.fc2_w, C * F), operand{}, n, f, cc});
      finish_rows(part, fc2);
      if (bias) emit(ops::bias_add{fc2, w_at(W, b.fc2_b, C), nr, cc});
      if (drop) dropout_rows(fc2, s.mask2, 2 * l + 1);
      emit(ops::residual_add{s.x_out, s.x_mid, fc2});
      pop(fc2);
    }
    return s;
  }
  void pop_block_saved(const block_saved& s) {
    if (!s.mask2.null()) pop(s.mask2);
    if (!s.gelu_out.null()) pop(s.gelu_out);  // (a sequential block's backward releases the MLP's)
    if (!s.fc1_out.null()) pop(s.fc1_out);
    if (!s.ln2_out.null()) pop(s.ln2_out);  // (a shared norm has none)
    if (!s.x_mid.null()) pop(s.x_mid);      // (a parallel block saves no sum after attention)
    if (!s.mask1.null()) pop(s.mask1);
    pop(s.atty);
    if (!s.lse.null()) pop(s.lse);
    if (!s.att.null()) pop(s.att);
    pop(s.qkv);
    pop(s.ln1_out);
  }
  /// The MLP's residual-dropout mask, once its one reader (the backward's dropout) has run: the
  /// block's output is popped before its backward, so the mask is the saved side's top and goes
  /// at once instead of waiting for pop_block_saved (the plan's backward_released,
  /// plan/stacks/memalg.hpp). In a pipeline stage's stash slot it stays (pop releases nothing there).
  void release_mlp_mask(block_saved& s) {
    pop(s.mask2);
    s.mask2 = {};
  }
  /// The attention core's backward into dqkv, from the gradient of its output: under selective
  /// recomputation the core is rebuilt first (the kernel rewrites the output too, into a transient;
  /// flash backward reads the saved output, not the recomputed one; naive needs none), then the
  /// rotary positions are undone on dqkv.
  void attention_core_bwd(const operand& dqkv, const operand& datty, const block_saved& s) {
    const std::size_t N = tokens(), Wd = local_width();
    const std::size_t scores = c_.micro_batch * local_heads() * c_.sequence * c_.sequence;
    const std::size_t lse_n = c_.micro_batch * local_heads() * c_.sequence;
    operand core = c_.flash ? s.lse : s.att;
    operand out_tmp{};
    if (!keeps_core()) {
      core = c_.flash ? transient("attention_lse", lse_n, A_, category::temporaries)
                      : transient("attention_probs", scores, T_, category::temporaries);
      out_tmp = transient("attention_out_recomputed", N * Wd, T_, category::temporaries);
      emit(ops::attention_fwd{out_tmp, core, s.qkv, shape()});
    }
    emit(ops::attention_bwd{dqkv, datty, s.qkv, c_.flash ? s.atty : operand{}, core, shape()});
    if (!out_tmp.null()) pop(out_tmp);
    if (!keeps_core()) pop(core);
    rope(dqkv, true);
  }
  void block_backward(block_saved& s, const operand& x_in, const operand& W, const operand& G, const operand& dres,
                      const operand& slot) {
    const std::size_t N = tokens(), C = c_.hidden, Wd = local_width(), F = local_ffn();
    const gpt_block_view& b = blk_;
    const bool drop = c_.dropout > 0;
    const std::uint32_t n = u32(N), cc = u32(C), wd = u32(Wd), f = u32(F);
    const std::size_t Q = local_qkv(), F1 = fc1_rows();
    const bool rms = c_.rms_norm, nb = block_norm_bias(), bias = c_.bias;
    const std::size_t R = rows();
    const std::uint32_t nr = u32(R);
    if (c_.parallel_residual) {
      parallel_block_backward(s, x_in, W, G, dres, slot);
      return;
    }
    {  // MLP branch
      operand dfc2 = dres;
      if (drop) {
        emit(ops::dropout_bwd{slot, dres, s.mask2, c_.dropout});
        release_mlp_mask(s);
        dfc2 = slot;
      }
      // SwiGLU: d(out) [N, F] is the first half of d(gate ‖ up) [N, 2F], which the backward
      // writes over it in place (the plan's 2·inner).
      operand dgelu = transient("grad_mlp_inner", N * F1, T_, category::temporaries);
      const operand dact = sub(dgelu, 0, N * F);
      {  // under SP the row-parallel product's output gradient is all-gathered (the reduce-scatter's backward)
        const operand g = gathered_rows(dfc2, "sp_gathered");
        emit(ops::linear_bwd{dact, w_at(G, b.fc2_w, C * F), b_at(G, b.fc2_b, C, bias), g, s.gelu_out,
                             w_at(W, b.fc2_w, C * F), n, f, cc});
        release_rows(g, dfc2);
      }
      if (c_.gated) emit(ops::activation_bwd{dgelu, dact, s.fc1_out, ops::activation_kind::swiglu, n, f});
      else emit(ops::activation_bwd{dgelu, dgelu, s.fc1_out});
      column_parallel_bwd(slot, w_at(G, b.fc1_w, F1 * C), b_at(G, b.fc1_b, F1, bias), dgelu, s.ln2_out,
                          w_at(W, b.fc1_w, F1 * C), cc, u32(F1));
      pop(dgelu);
      operand dnorm = transient("grad_norm_in", R * C, T_, category::temporaries);
      emit(ops::norm_bwd{dnorm, w_at(G, b.ln2_w, C), b_at(G, b.ln2_b, C, nb), slot, s.x_mid, w_at(W, b.ln2_w, C), nr, cc, rms});
      emit(ops::residual_add{dres, dres, dnorm});
      pop(dnorm);
      // The MLP's tensors and the sum after attention are read for the last time: the saved
      // side's top (the mask went before), released before the attention backward (the plan's
      // backward_tail, plan/stacks/memalg.hpp). In a stash slot they stay.
      for (operand* t : {&s.gelu_out, &s.fc1_out, &s.ln2_out, &s.x_mid}) {
        pop(*t);
        *t = {};
      }
    }
    {  // attention branch
      operand dproj = dres;
      if (drop) {
        emit(ops::dropout_bwd{slot, dres, s.mask1, c_.dropout});
        dproj = slot;
      }
      operand datty = transient("grad_attention_out", N * Wd, T_, category::temporaries);
      {
        const operand g = gathered_rows(dproj, "sp_gathered");
        emit(ops::linear_bwd{datty, w_at(G, b.proj_w, C * Wd), b_at(G, b.proj_b, C, bias), g, s.atty,
                             w_at(W, b.proj_w, C * Wd), n, wd, cc});
        release_rows(g, dproj);
      }
      operand dqkv = transient("grad_qkv", N * Q, T_, category::temporaries);
      attention_core_bwd(dqkv, datty, s);
      column_parallel_bwd(slot, w_at(G, b.qkv_w, Q * C), b_at(G, b.qkv_b, Q, bias || c_.qkv_bias), dqkv, s.ln1_out,
                          w_at(W, b.qkv_w, Q * C), cc, u32(Q));
      pop(dqkv);
      pop(datty);
      operand dnorm = transient("grad_norm_in", R * C, T_, category::temporaries);
      emit(ops::norm_bwd{dnorm, w_at(G, b.ln1_w, C), b_at(G, b.ln1_b, C, nb), slot, x_in, w_at(W, b.ln1_w, C), nr, cc, rms});
      emit(ops::residual_add{dres, dres, dnorm});
      pop(dnorm);
    }
  }

  /// A parallel block's backward: d(out) reaches both branches unchanged (each through its own
  /// dropout mask). The out-projection's backward runs first, so the MLP branch's norm can add its
  /// input gradient into dres; its output's gradient d(attention_out) waits through the MLP branch.
  /// With a shared norm the MLP's gradient of the norm's output waits in the slot while the QKV
  /// backward writes the attention's into grad_norm_in; their sum goes through the one norm backward.
  void parallel_block_backward(block_saved& s, const operand& x_in, const operand& W, const operand& G,
                               const operand& dres, const operand& slot) {
    const std::size_t N = tokens(), C = c_.hidden, Wd = local_width(), F = local_ffn();
    const gpt_block_view& b = blk_;
    const bool drop = c_.dropout > 0, shared = c_.shared_norm;
    const std::uint32_t n = u32(N), cc = u32(C), wd = u32(Wd), f = u32(F);
    const std::size_t Q = local_qkv(), F1 = fc1_rows();
    const bool rms = c_.rms_norm, nb = block_norm_bias(), bias = c_.bias;
    const std::size_t R = rows();
    const std::uint32_t nr = u32(R);
    operand datty = transient("grad_attention_out", N * Wd, T_, category::temporaries);
    {  // attention branch, out-projection
      operand dproj = dres;
      if (drop) {
        emit(ops::dropout_bwd{slot, dres, s.mask1, c_.dropout});
        dproj = slot;
      }
      const operand g = gathered_rows(dproj, "sp_gathered");
      emit(ops::linear_bwd{datty, w_at(G, b.proj_w, C * Wd), b_at(G, b.proj_b, C, bias), g, s.atty,
                           w_at(W, b.proj_w, C * Wd), n, wd, cc});
      release_rows(g, dproj);
    }
    const operand mlp_in = shared ? s.ln1_out : s.ln2_out;
    {  // MLP branch: the slot ends holding the gradient of its norm's output
      operand dfc2 = dres;
      if (drop) {
        emit(ops::dropout_bwd{slot, dres, s.mask2, c_.dropout});
        release_mlp_mask(s);
        dfc2 = slot;
      }
      operand dgelu = transient("grad_mlp_inner", N * F1, T_, category::temporaries);
      const operand dact = sub(dgelu, 0, N * F);
      {
        const operand g = gathered_rows(dfc2, "sp_gathered");
        emit(ops::linear_bwd{dact, w_at(G, b.fc2_w, C * F), b_at(G, b.fc2_b, C, bias), g, s.gelu_out,
                             w_at(W, b.fc2_w, C * F), n, f, cc});
        release_rows(g, dfc2);
      }
      if (c_.gated) emit(ops::activation_bwd{dgelu, dact, s.fc1_out, ops::activation_kind::swiglu, n, f});
      else emit(ops::activation_bwd{dgelu, dgelu, s.fc1_out});
      column_parallel_bwd(slot, w_at(G, b.fc1_w, F1 * C), b_at(G, b.fc1_b, F1, bias), dgelu, mlp_in,
                          w_at(W, b.fc1_w, F1 * C), cc, u32(F1));
      pop(dgelu);
      if (!shared) {
        operand dnorm = transient("grad_norm_in", R * C, T_, category::temporaries);
        emit(ops::norm_bwd{dnorm, w_at(G, b.ln2_w, C), b_at(G, b.ln2_b, C, nb), slot, x_in, w_at(W, b.ln2_w, C), nr, cc,
                           rms});
        emit(ops::residual_add{dres, dres, dnorm});
        pop(dnorm);
      }
      // The MLP's tensors and the attention's dropout mask (read by the out-projection's backward)
      // are read for the last time: the saved side's top down to the attention output, released
      // before the core's backward (the plan's backward_tail). In a stash slot they stay.
      for (operand* t : {&s.gelu_out, &s.fc1_out, &s.ln2_out, &s.mask1})
        if (!t->null()) {
          pop(*t);
          *t = {};
        }
    }
    // attention branch, the core and QKV: their input gradient into the slot, or (shared norm)
    // into grad_norm_in beside the MLP's in the slot
    operand dnorm = shared ? transient("grad_norm_in", R * C, T_, category::temporaries) : operand{};
    {
      operand dqkv = transient("grad_qkv", N * Q, T_, category::temporaries);
      attention_core_bwd(dqkv, datty, s);
      column_parallel_bwd(shared ? dnorm : slot, w_at(G, b.qkv_w, Q * C), b_at(G, b.qkv_b, Q, bias || c_.qkv_bias), dqkv,
                          s.ln1_out, w_at(W, b.qkv_w, Q * C), cc, u32(Q));
      pop(dqkv);
    }
    if (shared) {
      emit(ops::residual_add{slot, slot, dnorm});  // d(ln_out) = the MLP's + the attention's
    } else {
      pop(datty);
      dnorm = transient("grad_norm_in", R * C, T_, category::temporaries);
    }
    emit(ops::norm_bwd{dnorm, w_at(G, b.ln1_w, C), b_at(G, b.ln1_b, C, nb), slot, x_in, w_at(W, b.ln1_w, C), nr, cc, rms});
    emit(ops::residual_add{dres, dres, dnorm});
    pop(dnorm);
    if (shared) pop(datty);
  }

  // ---- one micro-batch ------------------------------------------------------------------------
  void micro_batch() {
    const std::size_t N = tokens(), C = c_.hidden, V = c_.vocab, L = c_.layers;
    const std::uint32_t n = u32(N), cc = u32(C), v = u32(V);
    const bool drop = c_.dropout > 0;
    unit& wte = units_[0];
    unit* wpe = c_.positions != 0 ? &units_[1] : nullptr;
    unit& lnf = units_[lnf_];
    unit& head = c_.tied ? wte : units_[lnf_ + 1];  // the output layer's weights
    const bool nb = norm_bias(), rms = c_.rms_norm;

    const std::size_t R = rows();  // residual-stream rows on this rank
    const std::uint32_t nr = u32(R);
    operand emb_mask{};
    if (drop) emb_mask = push("dropout_mask", R * C, elem::u8, category::activations);
    operand x0 = push("residual", R * C, T_, category::activations);
    {
      auto we = use_weights(wte);
      weights_in_use pe{};
      if (wpe) pe = use_weights(*wpe);
      if (!vp()) {
        emit(ops::embedding_fwd{x0, tok(), we.data, pe.data, u32(c_.micro_batch), u32(c_.sequence), cc});
      } else {  // this rank's vocabulary rows, summed over tp (reduce-scattered under SP), then the positions
        const operand part = partial_rows(x0, "sp_partial");
        emit(ops::embedding_fwd{part, tok(), we.data, operand{}, u32(c_.micro_batch), u32(c_.sequence), cc,
                                u32(vocab_begin()), u32(vocab_rows())});
        finish_rows(part, x0);
        if (wpe) emit(ops::position_add{x0, pe.data, row0(), nr, u32(c_.sequence), cc});
      }
      release(pe);
      release(we);
    }
    if (drop) dropout_rows(x0, emb_mask, 1'000'000);

    std::vector<block_saved> saved(L);
    std::vector<operand> inputs(L + 1);
    inputs[0] = x0;
    const std::size_t seg = segment();
    const bool recompute_layers = c_.recompute == recompute_kind::full || c_.recompute == recompute_kind::every_k;
    const auto kept = [&](std::size_t l) { return (l + 1) % seg == 0 || l + 1 == L; };
    std::array<operand, 2> pair{};
    const bool need_pair = recompute_layers && seg > 1 && L > 1;
    if (need_pair)
      for (auto& p : pair) p = transient("segment_residual", R * C, T_, category::temporaries);
    for (std::size_t l = 0; l < L; ++l) {
      unit& u = units_[first_block_ + l];
      if (!recompute_layers) {
        auto w = use_weights(u);
        saved[l] = block_forward(l, inputs[l], w.data);
        inputs[l + 1] = saved[l].x_out;
        release(w);
        continue;
      }
      operand out = kept(l) ? push("checkpoint", R * C, T_, category::activations) : pair[l % 2];
      auto w = use_weights(u);
      block_saved s = block_forward(l, inputs[l], w.data);
      emit(ops::copy{out, s.x_out});
      pop(s.x_out);
      pop_block_saved(s);
      release(w);
      inputs[l + 1] = out;
    }
    if (need_pair)
      for (std::size_t i = 2; i-- > 0;) pop(pair[i]);

    // Head: final norm, tied output layer, cross-entropy, and backward through them.
    operand lnf_out = push("lnf_out", R * C, T_, category::activations);
    {
      auto wl = use_weights(lnf);
      emit(ops::norm_fwd{lnf_out, inputs[L], sub(wl.data, 0, C), nb ? sub(wl.data, C, C) : operand{}, nr, cc, rms});
      release(wl);
    }
    operand slot = transient("grad_slot", R * C, T_, category::temporaries);
    {
      auto we = use_weights(head);
      if (!vp() && !sp()) {
        const std::size_t RL = loss_rows();  // chunked: R rows of logits at a time, in place
        operand logits = transient("logits", RL * V, T_, category::temporaries);
        operand gw = RL == N ? operand{} : grad_buffer(head);
        for (std::size_t r0 = 0; r0 < N; r0 += RL) {
          const std::size_t rows = std::min(RL, N - r0);
          const operand lg = sub(logits, 0, rows * V), h = sub(lnf_out, r0 * C, rows * C);
          emit(ops::linear_fwd{lg, h, we.data, operand{}, u32(rows), cc, v});
          emit(ops::loss{lg, RL == N ? tgt() : tgt(r0, rows), u32(rows), v, u32(c_.grad_accum), scalars::loss_sum,
                         RL == N ? 0u : n});
          if (RL == N) gw = grad_buffer(head);  // unchunked: as the trainer, after the loss
          emit(ops::linear_bwd{sub(slot, r0 * C, rows * C), gw, operand{}, lg, h, we.data, u32(rows), cc, v});
        }
        finish_grad(head, gw);
        pop(logits);
      } else {  // vocabulary- or sequence-parallel output (unchunked: build_program refuses a chunked one)
        const operand in = gathered_rows(lnf_out, "sp_gathered");
        // Under SP the gathered rows are the output layer's input from here on (its weight and
        // input gradients read them): the final norm's output, the saved side's top, goes at once
        // (the plan's forward_released and backward_released, plan/stacks/memalg.hpp).
        if (sp()) pop(lnf_out);
        const std::uint32_t vl = u32(vocab_rows());
        operand logits = transient("logits", N * vocab_rows(), T_, category::temporaries);
        emit(ops::linear_fwd{logits, in, we.data, operand{}, n, cc, vl});
        if (vp()) emit(ops::vocab_parallel_loss{logits, tgt(), n, vl, u32(vocab_begin()), v, u32(c_.grad_accum)});
        else emit(ops::loss{logits, tgt(), n, v, u32(c_.grad_accum)});
        operand gw = grad_buffer(head);
        if (!sp()) {
          emit(ops::linear_bwd{slot, gw, operand{}, logits, lnf_out, we.data, n, cc, vl});
          finish_grad(head, gw);
          pop(logits);
          if (vp()) tp_sum(slot);  // the input gradient is a partial sum over the vocabulary shards
        } else {  // weight gradient from the gathered input, then the input gradient over it, reduce-scattered
          emit(ops::linear_bwd{operand{}, gw, operand{}, logits, in, we.data, n, cc, vl});
          emit(ops::linear_bwd{in, operand{}, operand{}, logits, in, we.data, n, cc, vl});
          finish_grad(head, gw);
          pop(logits);
          emit(ops::reduce_scatter{in, slot, group::tp});
          pop(in);
        }
      }
      release(we);
      if (!c_.tied) reduce_after_last_backward(head);
    }
    operand dres = transient("grad_residual", R * C, T_, category::temporaries);
    {
      auto wn = use_weights(lnf);
      operand gl = grad_buffer(lnf);
      emit(ops::norm_bwd{dres, sub(gl, 0, C), nb ? sub(gl, C, C) : operand{}, slot, inputs[L], sub(wn.data, 0, C), nr, cc,
                         rms});
      finish_grad(lnf, gl);
      release(wn);
      reduce_after_last_backward(lnf);
    }
    if (!sp()) pop(lnf_out);

    // Blocks, last to first.
    for (std::size_t seg_end = L; seg_end > 0;) {
      const std::size_t seg_begin = recompute_layers ? ((seg_end - 1) / seg) * seg : seg_end - 1;
      if (!recompute_layers) {
        const std::size_t l = seg_end - 1;
        unit& u = units_[first_block_ + l];
        pop(saved[l].x_out);
        auto w = use_weights(u);
        operand g = grad_buffer(u);
        block_backward(saved[l], inputs[l], w.data, g, dres, slot);
        finish_grad(u, g);
        release(w);
        pop_block_saved(saved[l]);
        reduce_after_last_backward(u);
      } else {
        pop(inputs[seg_end]);
        std::vector<block_saved> rebuilt;
        for (std::size_t l = seg_begin; l < seg_end; ++l) {
          auto w = use_weights(units_[first_block_ + l]);
          rebuilt.push_back(block_forward(l, l == seg_begin ? inputs[l] : rebuilt.back().x_out, w.data, category::temporaries));
          release(w);
        }
        for (std::size_t l = seg_end; l-- > seg_begin;) {
          block_saved& s = rebuilt[l - seg_begin];
          pop(s.x_out);
          unit& u = units_[first_block_ + l];
          auto w = use_weights(u);
          operand g = grad_buffer(u);
          block_backward(s, l == seg_begin ? inputs[l] : rebuilt[l - seg_begin - 1].x_out, w.data, g, dres, slot);
          finish_grad(u, g);
          release(w);
          pop_block_saved(s);
          reduce_after_last_backward(u);
        }
      }
      seg_end = seg_begin;
    }

    // Embedding backward (the tied wte gets its second contribution).
    if (drop) emit(ops::dropout_bwd{dres, dres, emb_mask, c_.dropout});
    {
      operand gw = grad_buffer(wte);
      operand gp = wpe ? grad_buffer(*wpe) : operand{};
      if (!vp()) {
        emit(ops::embedding_bwd{gw, gp, dres, tok(), u32(c_.micro_batch), u32(c_.sequence), cc});
      } else {  // every token's gradient (all-gathered under SP): this rank's rows, and the whole wpe
        const operand d = gathered_rows(dres, "sp_gathered");
        emit(ops::embedding_bwd{gw, gp, d, tok(), u32(c_.micro_batch), u32(c_.sequence), cc, u32(vocab_begin()),
                                u32(vocab_rows())});
        release_rows(d, dres);
      }
      if (wpe) finish_grad(*wpe, gp);
      finish_grad(wte, gw);
      if (wpe) reduce_after_last_backward(*wpe);
      reduce_after_last_backward(wte);
    }
    pop(dres);
    pop(slot);
    pop(x0);
    if (!emb_mask.null()) pop(emb_mask);
    if (layout_.stack_depth() != 0) throw arena_error("build_program: tensors left on the arena after a micro-batch");
  }

  // ---- a pipeline stage ------------------------------------------------------------------------
  bool first_stage() const { return r_.pp == 0; }
  bool last_stage() const { return r_.pp + 1 == c_.pp; }
  std::size_t stash_slots() const {
    const std::size_t ahead = c_.pp - r_.pp;  // 1F1B: min(pp − s, m) micro-batches in flight
    return ahead < c_.grad_accum ? ahead : c_.grad_accum;
  }

  /// The stage's whole step but step_end: the boundary buffer and the stash, then the forward and
  /// backward sections of every micro-batch in 1F1B order, micro-batch i in slot i mod slots.
  void pipeline_step_layout() {
    const std::size_t N = tokens(), C = c_.hidden, slots = stash_slots();
    const std::vector<pipeline_step> order = one_f_one_b(c_.pp, r_.pp, c_.grad_accum);
    section_ = &p_.step_begin;
    for (unit& u : units_) emit(ops::zero{u.grad});
    boundary_ = push("pipeline_boundary", N * C, T_, category::comm_buffers);
    const std::size_t stash_bytes = measuring_ ? 0 : slots * slot_bytes_;
    const std::size_t stash_at = layout_.push("pipeline_stash", stash_bytes, category::activations, side::saved);
    stash_begin_ = measuring_ ? std::size_t{1} << 60 : stash_at;  // (measuring: a range no tensor has)
    stash_end_ = measuring_ ? ~std::size_t{0} : stash_at + stash_bytes;
    const std::size_t depth = layout_.stack_depth();
    std::vector<stage_state> live(c_.grad_accum);
    bool received = false;  // the previous backward received this forward's input (steady state)
    p_.pipeline.reserve(order.size());
    for (std::size_t e = 0; e < order.size(); ++e) {
      const pipeline_step step = order[e];
      p_.pipeline.push_back({step, {}});
      section_ = &p_.pipeline.back().ops;
      if (step.forward) {
        slot_top_ = stash_begin_ + (step.micro % slots) * slot_bytes_;
        slot_end_ = slot_top_ + slot_bytes_;
        const std::size_t from = slot_top_;
        slot_open_ = true;
        live[step.micro] = stage_forward(received);
        slot_open_ = false;
        slot_used_ = std::max(slot_used_, slot_top_ - from);
        received = false;
      } else {
        // Megatron's send_backward_recv_forward: the next forward's input first, then this gradient.
        received = !first_stage() && e + 1 < order.size() && order[e + 1].forward;
        stage_backward(live[step.micro], received);
        live[step.micro] = {};
      }
      if (layout_.stack_depth() != depth)
        throw arena_error("build_program: tensors left on the arena after a section of the pipeline stage");
    }
    layout_.pop(stash_at);
    layout_.pop(boundary_.offset);
  }
  program build_pipeline() {
    pipeline_step_layout();
    p_.trace = layout_.trace();
    p_.stash_slots = stash_slots();
    p_.stash_slot_bytes = slot_bytes_;
    section_ = &p_.step_end;
    step_end();
    finish();
    return std::move(p_);
  }

  struct stage_state {
    std::vector<block_saved> blocks;
    std::vector<operand> inputs;  ///< inputs[l]: block l's input; inputs.back() the stage's output
    operand emb_mask, x0, lnf_out;
  };
  /// One micro-batch's forward on this stage: the embeddings or the received input (already in the
  /// boundary buffer when `received`), the blocks, and the final norm (last stage) or the send of
  /// the output.
  stage_state stage_forward(bool received) {
    const std::size_t N = tokens(), C = c_.hidden, L = block_hi_ - block_lo_;
    const std::uint32_t n = u32(N), cc = u32(C);
    const bool drop = c_.dropout > 0, nb = norm_bias(), rms = c_.rms_norm;
    stage_state st;
    st.blocks.resize(L);
    st.inputs.resize(L + 1);
    if (first_stage()) {
      unit& wte = units_[0];
      unit* wpe = c_.positions != 0 ? &units_[1] : nullptr;
      if (drop) st.emb_mask = push("dropout_mask", N * C, elem::u8, category::activations);
      st.x0 = push("residual", N * C, T_, category::activations);
      auto we = use_weights(wte);
      weights_in_use pe{};
      if (wpe) pe = use_weights(*wpe);
      emit(ops::embedding_fwd{st.x0, tok(), we.data, pe.data, u32(c_.micro_batch), u32(c_.sequence), cc});
      release(pe);
      release(we);
      if (drop) dropout_rows(st.x0, st.emb_mask, 1'000'000);
    } else {
      if (!received) emit(ops::recv{boundary_, u32(r_.pp - 1)});
      st.x0 = push("stage_input", N * C, T_, category::activations);
      emit(ops::copy{st.x0, boundary_});
    }
    st.inputs[0] = st.x0;
    for (std::size_t l = 0; l < L; ++l) {
      unit& u = units_[first_block_ + l];
      auto w = use_weights(u);
      const bool sends = l + 1 == L && !last_stage();
      st.blocks[l] = block_forward(block_lo_ + l, st.inputs[l], w.data, category::activations, sends ? boundary_ : operand{});
      st.inputs[l + 1] = st.blocks[l].x_out;
      release(w);
    }
    if (!last_stage()) {
      emit(ops::send{boundary_, u32(r_.pp + 1)});
      return st;
    }
    unit& lnf = units_[lnf_];
    st.lnf_out = push("lnf_out", N * C, T_, category::activations);
    auto wl = use_weights(lnf);
    emit(ops::norm_fwd{st.lnf_out, st.inputs[L], sub(wl.data, 0, C), nb ? sub(wl.data, C, C) : operand{}, n, cc, rms});
    release(wl);
    return st;
  }
  /// The same micro-batch's backward: the loss and the head (last stage) or the received
  /// gradient, the blocks last to first, then the embeddings or the send of the input's gradient
  /// (after receiving the next forward's input into the boundary buffer when `receive_next`).
  void stage_backward(stage_state& st, bool receive_next) {
    const std::size_t N = tokens(), C = c_.hidden, V = c_.vocab, L = block_hi_ - block_lo_;
    const std::uint32_t n = u32(N), cc = u32(C), v = u32(V);
    const bool drop = c_.dropout > 0, nb = norm_bias(), rms = c_.rms_norm;
    operand slot = transient("grad_slot", N * C, T_, category::temporaries);
    operand dres{};
    if (last_stage()) {
      unit& lnf = units_[lnf_];
      unit& head = units_[lnf_ + 1];
      {
        auto we = use_weights(head);
        operand logits = transient("logits", N * V, T_, category::temporaries);
        emit(ops::linear_fwd{logits, st.lnf_out, we.data, operand{}, n, cc, v});
        emit(ops::loss{logits, tgt(), n, v, u32(c_.grad_accum)});
        operand gw = grad_buffer(head);
        emit(ops::linear_bwd{slot, gw, operand{}, logits, st.lnf_out, we.data, n, cc, v});
        finish_grad(head, gw);
        pop(logits);
        release(we);
        reduce_after_last_backward(head);
      }
      dres = transient("grad_residual", N * C, T_, category::temporaries);
      auto wn = use_weights(lnf);
      operand gl = grad_buffer(lnf);
      emit(ops::norm_bwd{dres, sub(gl, 0, C), nb ? sub(gl, C, C) : operand{}, slot, st.inputs[L], sub(wn.data, 0, C), n, cc,
                         rms});
      finish_grad(lnf, gl);
      release(wn);
      reduce_after_last_backward(lnf);
    } else {
      dres = transient("grad_residual", N * C, T_, category::temporaries);
      emit(ops::recv{dres, u32(r_.pp + 1)});
    }
    for (std::size_t l = L; l-- > 0;) {
      unit& u = units_[first_block_ + l];
      auto w = use_weights(u);
      operand g = grad_buffer(u);
      block_backward(st.blocks[l], st.inputs[l], w.data, g, dres, slot);
      finish_grad(u, g);
      release(w);
      reduce_after_last_backward(u);
    }
    if (first_stage()) {
      unit& wte = units_[0];
      unit* wpe = c_.positions != 0 ? &units_[1] : nullptr;
      if (drop) emit(ops::dropout_bwd{dres, dres, st.emb_mask, c_.dropout});
      operand gw = grad_buffer(wte);
      operand gp = wpe ? grad_buffer(*wpe) : operand{};
      emit(ops::embedding_bwd{gw, gp, dres, tok(), u32(c_.micro_batch), u32(c_.sequence), cc});
      if (wpe) finish_grad(*wpe, gp);
      finish_grad(wte, gw);
      if (wpe) reduce_after_last_backward(*wpe);
      reduce_after_last_backward(wte);
    } else {
      if (receive_next) emit(ops::recv{boundary_, u32(r_.pp - 1)});
      emit(ops::send{dres, u32(r_.pp - 1)});
    }
    pop(dres);
    pop(slot);
  }

  // ---- loss, gradient norm, clipping, optimizer -----------------------------------------------
  using run = element_run;
  static std::vector<run> runs(const element_ranges& ranges, std::size_t lo, std::size_t hi) {
    return element_runs(ranges, lo, hi);
  }
  void step_end() {
    const int z = c_.zero_stage;
    emit_loss_mean(u32(c_.grad_accum), c_.dp);
    // Only the last stage computed a loss (the others' sum is zero): the sum over the stages is it.
    if (c_.pp > 1) emit(ops::all_reduce{scalars::slot(scalars::loss), group::pp, reduce_op::sum});
    // Sequence parallelism: the norms ran on this rank's rows, so their weight gradients are
    // partial sums over tp (Megatron's finalize_model_grads all-reduces the sequence-parallel
    // parameters' gradients over the tensor-parallel group). Once per step: the sum is linear.
    if (sp()) {
      for (std::size_t ui = 0; ui < units_.size(); ++ui) {
        const unit& u = units_[ui];
        element_ranges norms;
        if (ui == lnf_) norms.push_back({0, u.elements});
        else if (ui >= first_block_ && ui < lnf_) norms = {{blk_.ln1_w, blk_.qkv_w}, {blk_.ln2_w, blk_.fc1_w}};
        const std::size_t lo = z >= 1 ? shard_begin(u) : 0, hi = z >= 1 ? lo + u.shard : u.elements;
        const std::size_t grad_off = z >= 2 ? lo : 0;
        for (const auto& [b, e] : norms) {
          const std::size_t from = std::max(b, lo), to = std::min(e, hi);
          if (from < to) emit(ops::all_reduce{sub(u.grad, from - grad_off, to - from), group::tp, reduce_op::sum});
        }
      }
    }
    // Gradient norm over the owned elements, in unit then element order.
    for (const unit& u : units_) {
      const std::size_t lo = z >= 1 ? shard_begin(u) : 0, hi = z >= 1 ? lo + u.shard : u.elements;
      const std::size_t grad_off = z >= 2 ? lo : 0;
      for (const run& r : runs(u.replicated, lo, hi)) {
        const bool counted = !(r.inside && r_.tp != 0);
        const operand g = sub(u.grad, r.begin - grad_off, r.end - r.begin);
        // Adjacent counted segments of one unit merge: the serial sum is the same.
        if (!section_->empty()) {
          if (auto* prev = std::get_if<ops::sqnorm>(&section_->back().body);
              prev && prev->counted == counted && prev->g.offset + prev->g.bytes() == g.offset) {
            prev->g.count += g.count;
            continue;
          }
        }
        emit(ops::sqnorm{g, counted});
      }
    }
    emit(ops::norm_parts{});
    if (z >= 1) emit(ops::all_reduce{scalars::slot(scalars::parts, 2), group::dp, reduce_op::sum});
    else emit(ops::all_reduce{scalars::slot(scalars::parts + 1, 1), group::dp, reduce_op::max});
    emit(ops::all_reduce{scalars::slot(scalars::parts, 2), group::tp, reduce_op::sum});
    if (c_.pp > 1) emit(ops::all_reduce{scalars::slot(scalars::parts, 2), group::pp, reduce_op::sum});  // every stage's units
    emit(ops::clip_scale{c_.max_grad_norm, u32(c_.dp), c_.loss_scaling});
    // One fused update per run of equal decay; ZeRO-1/2 share the updated block.
    emit_updates(units_, z, c_.weight_decay, c_.dp, [this](const unit& u) { return shard_begin(u); });
  }

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

}  // namespace detail

/// One training step for rank `rank`, laid out in `sizes` (the plan's arena).
/// Throws program_error for a configuration the runtime does not implement and arena_error when
/// the step does not fit `sizes` (the plan under-predicts) or breaks the stacks' LIFO order.
inline program build_program(const gpt_config& cfg, arena_sizes sizes, rank_coords rank, elem storage) {
  if (cfg.pp <= 1) return detail::gpt_lowering(cfg, sizes, rank, storage).build();
  // A pipeline stage: first the bytes of one stash slot (a layout of unbounded capacity that
  // executes nothing), then the stage in the plan's sizes with the stash of that many slots.
  const std::size_t unbounded = std::size_t{1} << 40;
  const std::size_t slot = detail::gpt_lowering(cfg, {unbounded, unbounded}, rank, storage, 0, true).measure_slot();
  return detail::gpt_lowering(cfg, sizes, rank, storage, slot).build();
}
/// The same with the storage type gpt_run would pick (default_storage).
inline program build_program(const gpt_config& cfg, arena_sizes sizes, rank_coords rank = {}) {
  return build_program(cfg, sizes, rank, default_storage(cfg));
}

}  // namespace memalg::exec

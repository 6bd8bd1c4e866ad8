// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cpu/gpt_trainer.hpp — a GPT trained by the CPU reference backend, in one arena
// laid out by its plan, on one rank or many (data parallel with ZeRO-0/1/2/3, tensor parallel).
//
// The model is `transformer_lm` (model/transformer.hpp) with LayerNorm, a GeLU MLP, learned
// positions, tied embeddings and biases: GPT-2's structure (Radford et al. 2019). Every tensor the
// executor touches lives in one `arena` (exec/arena.hpp): the persistent region holds the model
// states, the saved stack what forward keeps for backward, the transient stack what lives inside
// one pass. The trainer names every tensor it pushes, in the order below, so the measured high-water
// mark can be compared with the plan's prediction.
//
// Units. Parameters are grouped into units — the token embedding, the position embedding, each
// block, the final norm — each one flat buffer per rank. ZeRO shards every unit over the
// data-parallel ranks (FSDP's per-layer flat parameters): unit n has n/dp elements per rank.
//
// Parallelism (Shoeybi et al. 2019; Rajbhandari et al. 2020):
//   * tensor parallel t: Q/K/V and fc1 column-parallel (heads and MLP width split), out-projection
//     and fc2 row-parallel with an all-reduce of their outputs; the input gradients of the
//     column-parallel products are all-reduced in backward. Norms, biases of row-parallel
//     products and the embeddings are replicated.
//   * data parallel dp: each rank takes its share of the sequences; gradients are all-reduced
//     (ZeRO-0) or reduce-scattered (ZeRO-1/2/3) over the data-parallel group. ZeRO-1 and 2 update
//     their shard and all-gather the weights; ZeRO-3 gathers each unit's weights just before use
//     and frees them after, in forward and again in backward.
//   * ZeRO-2/3 reduce-scatter each unit's gradient as soon as its backward is done: the full
//     gradient of one unit is a transient. Accumulation across micro-batches adds the rank's own
//     accumulated shard into its block of the full buffer before the reduce-scatter, so no second
//     buffer is needed.
// Multi-rank runs reduce in fp32 (MPI has no 16-bit floating type); 16-bit storage runs on one rank.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "memalg/backend/cpu/activation.hpp"
#include "memalg/backend/cpu/attention.hpp"
#include "memalg/backend/cpu/cross_entropy.hpp"
#include "memalg/backend/cpu/dropout.hpp"
#include "memalg/backend/cpu/embedding.hpp"
#include "memalg/backend/cpu/grad_norm.hpp"
#include "memalg/backend/cpu/layernorm.hpp"
#include "memalg/backend/cpu/linear.hpp"
#include "memalg/backend/cpu/loss_scaler.hpp"
#include "memalg/backend/cpu/optimizer.hpp"
#include "memalg/backend/cpu/pointwise.hpp"
#include "memalg/core/float16.hpp"
#include "memalg/core/random.hpp"
#include "memalg/exec/arena.hpp"
#include "memalg/exec/checkpoint.hpp"
#include "memalg/exec/communicator.hpp"
#include "memalg/exec/config.hpp"
#include "memalg/exec/gpt_layout.hpp"
#include "memalg/train/recipe.hpp"

namespace memalg::exec {

template <storage_type T, class Comm>
class gpt_trainer {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>,
                "gpt_trainer: storage type must be float, bf16 or fp16");
  using A = accum_t<T>;
  using side = arena::side;

 public:
  /// `dp_comm`/`tp_comm`: the rank's data- and tensor-parallel groups.
  gpt_trainer(const gpt_config& cfg, arena_sizes sizes, Comm& dp_comm, Comm& tp_comm)
      : c_(cfg), dp_(dp_comm), tp_(tp_comm), arena_(sizes.persistent, sizes.stack) {
    validate();
    build_units();
    allocate_states();
    initialise();
  }

  const gpt_config& config() const { return c_; }
  const arena& memory() const { return arena_; }
  std::size_t step_count() const { return step_; }
  std::size_t skipped_steps() const { return scaler_.skipped_steps(); }

  /// One optimizer step over `grad_accum` micro-batches. `tokens`/`targets` hold this rank's
  /// sequences: grad_accum × micro_batch × sequence ids each. Returns the mean loss over all
  /// data-parallel ranks and micro-batches.
  float train_step(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    const std::size_t per_micro = c_.micro_batch * c_.sequence;
    if (tokens.size() != per_micro * c_.grad_accum || targets.size() != tokens.size())
      throw std::invalid_argument("gpt_trainer::train_step: expected grad_accum × micro_batch × sequence tokens");
    ++step_;
    for (unit& u : units_) zero(u.grad);
    A loss_sum = 0;
    for (std::size_t k = 0; k < c_.grad_accum; ++k) {
      micro_ = k;
      loss_sum += micro_batch(tokens.subspan(k * per_micro, per_micro), targets.subspan(k * per_micro, per_micro));
    }
    if (c_.zero_stage <= 1) reduce_gradients_after_backward();
    float loss = static_cast<float>(loss_sum / static_cast<A>(c_.grad_accum));
    dp_.all_reduce(&loss, 1, reduce_op::sum);
    loss /= static_cast<float>(c_.dp);
    optimizer_step();
    return loss;
  }

  /// The rank's state, for checkpoints: weights (or weight shards), master weights, optimizer
  /// states and the loss scaler, in a fixed order.
  std::vector<checkpoint_section> state_sections() {
    std::vector<checkpoint_section> s;
    for (unit& u : units_) {
      s.push_back({u.name + ".weights", std::as_writable_bytes(std::span(u.weight.data, u.weight.count))});
      if (u.master.count) s.push_back({u.name + ".master", std::as_writable_bytes(std::span(u.master.data, u.master.count))});
      if (u.state1.count) s.push_back({u.name + ".state1", std::as_writable_bytes(std::span(u.state1.data, u.state1.count))});
      if (u.state2.count) s.push_back({u.name + ".state2", std::as_writable_bytes(std::span(u.state2.data, u.state2.count))});
    }
    s.push_back({"loss_scaler", std::as_writable_bytes(std::span(&scaler_, 1))});
    s.push_back({"counters", std::as_writable_bytes(std::span(counters_))});
    return s;
  }
  /// Call after loading a checkpoint into state_sections().
  void restore_counters() {
    step_ = counters_[0];
    updates_ = counters_[1];
  }
  /// Call before saving state_sections().
  void store_counters() {
    counters_[0] = step_;
    counters_[1] = updates_;
  }

  /// Copy of all weights of this rank's unit `i` in logical order (gathered under ZeRO-3), for tests.
  std::vector<float> unit_weights(std::size_t i) {
    unit& u = units_.at(i);
    std::vector<float> out(u.elements);
    if (c_.zero_stage == 3) {
      auto full = gather(u);
      for (std::size_t j = 0; j < u.elements; ++j) out[j] = static_cast<float>(to_float(full[j]));
      arena_.pop(full);
    } else {
      for (std::size_t j = 0; j < u.elements; ++j) out[j] = static_cast<float>(to_float(u.weight[j]));
    }
    return out;
  }
  std::size_t unit_count() const { return units_.size(); }

 private:
  // ---- configuration --------------------------------------------------------------------------
  void validate() const {
    const auto fail = [](const std::string& why) { throw std::invalid_argument("gpt_trainer: " + why); };
    if (c_.hidden % c_.heads != 0) fail("heads must divide the hidden width");
    if (c_.heads % c_.tp != 0) fail("the tensor-parallel degree must divide the heads");
    if (c_.ffn % c_.tp != 0) fail("the tensor-parallel degree must divide the MLP width");
    if (c_.sequence > c_.positions) fail("the sequence is longer than the position embedding");
    if (c_.pp != 1) fail("the reference trainer runs no pipeline: pipeline stages run as step programs");
    if (static_cast<std::size_t>(dp_.size()) != c_.dp || static_cast<std::size_t>(tp_.size()) != c_.tp)
      fail("the communicators do not match the configured dp and tp degrees");
    if (c_.dropout > 0 && !c_.flash)
      fail("dropout needs flash attention: the reference naive attention has no attention-probability dropout");
    if ((c_.dp > 1 || c_.tp > 1) && !std::is_same_v<T, float>)
      fail("multi-rank runs reduce in fp32; use the fp32 precision policy");
    if (c_.recompute == recompute_kind::every_k && c_.recompute_every == 0) fail("recompute every:K needs K >= 1");
  }
  std::size_t tokens() const { return c_.micro_batch * c_.sequence; }
  std::size_t local_heads() const { return c_.heads / c_.tp; }
  std::size_t head_dim() const { return c_.hidden / c_.heads; }
  std::size_t local_width() const { return c_.hidden / c_.tp; }  ///< attention width per rank
  std::size_t local_ffn() const { return c_.ffn / c_.tp; }
  backend::cpu::attention_shape attn_shape() const {
    return {c_.micro_batch, c_.sequence, local_heads(), local_heads(), head_dim(), true};
  }

  // ---- units and their offsets ----------------------------------------------------------------
  using block_view = gpt_block_view;
  struct unit {
    unit(std::string n, std::size_t e) : name(std::move(n)), elements(e) {}
    std::string name;
    std::size_t elements = 0;  ///< on this rank before ZeRO sharding
    std::size_t shard = 0;     ///< elements / dp
    tensor_ref<T> weight;      ///< full (ZeRO-0/1/2) or shard (ZeRO-3)
    tensor_ref<T> grad;        ///< full (ZeRO-0/1) or shard (ZeRO-2/3)
    tensor_ref<A> master, state1, state2;
    std::vector<std::pair<std::size_t, std::size_t>> no_decay;  ///< [begin, end) not weight-decayed
    std::vector<std::pair<std::size_t, std::size_t>> replicated;  ///< [begin, end) identical on TP ranks
  };
  block_view block_layout() const { return gpt_block_layout(c_.hidden, local_width(), local_ffn()); }
  void build_units() {
    blk_ = block_layout();
    for (gpt_unit_spec& spec : gpt_units("gpt_trainer", c_.vocab, c_.positions, c_.hidden, c_.layers, blk_, c_.dp)) {
      unit& u = units_.emplace_back(std::move(spec.name), spec.elements);
      u.shard = spec.shard;
      u.no_decay = std::move(spec.no_decay);
      u.replicated = std::move(spec.replicated);
    }
  }
  void allocate_states() {
    const int z = c_.zero_stage;
    const std::size_t states = c_.optimizer == optimizer_kind::adamw || c_.optimizer == optimizer_kind::adam ? 2
                               : c_.optimizer == optimizer_kind::sgd                                    ? 0
                                                                                                        : 1;
    for (unit& u : units_) u.weight = arena_.persistent<T>(u.name + ".weights", z >= 3 ? u.shard : u.elements, category::weights);
    for (unit& u : units_) u.grad = arena_.persistent<T>(u.name + ".grads", z >= 2 ? u.shard : u.elements, category::gradients);
    for (unit& u : units_)
      if (c_.master_weights)
        u.master = arena_.persistent<A>(u.name + ".master", z >= 1 ? u.shard : u.elements, category::master_weights);
    for (unit& u : units_) {
      const std::size_t n = z >= 1 ? u.shard : u.elements;
      if (states >= 1) u.state1 = arena_.persistent<A>(u.name + ".state1", n, category::optimizer_states);
      if (states >= 2) u.state2 = arena_.persistent<A>(u.name + ".state2", n, category::optimizer_states);
    }
  }

  // ---- deterministic initialisation by logical element index ----------------------------------
  float normal(std::uint64_t tensor, std::uint64_t index, float stddev) const {
    // Box–Muller on two counter-based uniforms: identical on any split of the tensor.
    return backend::cpu::init_normal(c_.seed, tensor, index, stddev);
  }
  void initialise() {
    const std::size_t C = c_.hidden, W = local_width(), F = local_ffn(), Wf = c_.hidden, Ff = c_.ffn;
    const std::size_t r = static_cast<std::size_t>(tp_.rank());
    const float std_w = 0.02f, std_res = 0.02f / std::sqrt(2.0f * static_cast<float>(c_.layers));  // GPT-2 init
    for (std::size_t ui = 0; ui < units_.size(); ++ui) {
      unit& u = units_[ui];
      std::vector<float> v(u.elements, 0.0f);
      if (u.name == "wte" || u.name == "wpe") {
        for (std::size_t i = 0; i < u.elements; ++i) v[i] = normal(ui, i, std_w);
      } else if (u.name == "lnf") {
        for (std::size_t i = 0; i < C; ++i) v[i] = 1.0f;
      } else {
        const block_view& b = blk_;
        for (std::size_t i = 0; i < C; ++i) v[b.ln1_w + i] = v[b.ln2_w + i] = 1.0f;
        // qkv rows: this rank's q, k, v rows of the logical [3C, C] matrix.
        for (std::size_t part = 0; part < 3; ++part)
          for (std::size_t row = 0; row < W; ++row)
            for (std::size_t col = 0; col < C; ++col) {
              const std::size_t grow = part * Wf + r * W + row;
              v[b.qkv_w + (part * W + row) * C + col] = normal(ui * 8 + 1, grow * C + col, std_w);
            }
        for (std::size_t row = 0; row < C; ++row)  // proj [C, C]: this rank's columns
          for (std::size_t col = 0; col < W; ++col) v[b.proj_w + row * W + col] = normal(ui * 8 + 2, row * Wf + r * W + col, std_res);
        for (std::size_t row = 0; row < F; ++row)  // fc1 [F, C]: this rank's rows
          for (std::size_t col = 0; col < C; ++col) v[b.fc1_w + row * C + col] = normal(ui * 8 + 3, (r * F + row) * C + col, std_w);
        for (std::size_t row = 0; row < C; ++row)  // fc2 [C, F]: this rank's columns
          for (std::size_t col = 0; col < F; ++col) v[b.fc2_w + row * F + col] = normal(ui * 8 + 4, row * Ff + r * F + col, std_res);
      }
      const std::size_t lo = c_.zero_stage >= 3 ? shard_begin(u) : 0;
      for (std::size_t i = 0; i < u.weight.count; ++i) u.weight[i] = from_float<T>(static_cast<A>(v[lo + i]));
      if (u.master.count) {
        const std::size_t mlo = c_.zero_stage >= 1 ? shard_begin(u) : 0;
        for (std::size_t i = 0; i < u.master.count; ++i) u.master[i] = to_float(from_float<T>(static_cast<A>(v[mlo + i])));
      }
      for (auto* s : {&u.state1, &u.state2})
        for (std::size_t i = 0; i < s->count; ++i) (*s)[i] = 0;
    }
  }
  std::size_t shard_begin(const unit& u) const { return static_cast<std::size_t>(dp_.rank()) * u.shard; }

  // ---- small helpers --------------------------------------------------------------------------
  template <class U>
  static void zero(tensor_ref<U> t) {
    std::memset(static_cast<void*>(t.data), 0, t.count * sizeof(U));
  }
  static void add_into(T* dst, const T* src, std::size_t n) { backend::cpu::add(dst, dst, src, n); }
  /// x[N, C] += bias[C] (row-parallel outputs get their bias once, after the all-reduce).
  static void add_bias(T* x, const T* bias, std::size_t N, std::size_t C) { backend::cpu::add_bias(x, bias, N, C); }
  void tp_sum(T* x, std::size_t n) {
    if (c_.tp > 1) tp_.all_reduce(reinterpret_cast<float*>(x), n, reduce_op::sum);
  }
  /// Dropout of [N, C] rows with masks identical on every split: one stream per global sequence.
  void dropout_rows(T* out, std::uint8_t* mask, const T* in, std::size_t site) {
    const std::uint64_t first = backend::cpu::dropout_global_sequence(step_, c_.grad_accum, micro_, c_.micro_batch, c_.dp,
                                                                      static_cast<std::uint64_t>(dp_.rank()), 0);
    backend::cpu::dropout_rows(out, mask, in, c_.micro_batch, c_.sequence * c_.hidden, c_.dropout, c_.seed, site, first);
  }
  /// LayerNorm statistics are recomputed in backward from the saved input (per-row scratch):
  /// the plan, like Korthikanti et al. §4.1, keeps only the norm's input.
  static void layernorm_stats(std::vector<A>& mean, std::vector<A>& rstd, const T* in, std::size_t N, std::size_t C) {
    mean.resize(N);
    rstd.resize(N);
    backend::cpu::layernorm_stats(mean.data(), rstd.data(), in, N, C);
  }
  void layernorm_fwd(T* out, const T* in, const T* w, const T* b) {
    layernorm_stats(scratch_mean_, scratch_rstd_, in, tokens(), c_.hidden);
    backend::cpu::layernorm_forward(out, scratch_mean_.data(), scratch_rstd_.data(), in, w, b, tokens(), c_.hidden);
  }
  void layernorm_bwd(T* din, T* dw, T* db, const T* dout, const T* in, const T* w) {
    layernorm_stats(scratch_mean_, scratch_rstd_, in, tokens(), c_.hidden);
    backend::cpu::layernorm_backward(din, dw, db, dout, in, w, scratch_mean_.data(), scratch_rstd_.data(), tokens(),
                                     c_.hidden);
  }

  // ---- ZeRO-3 gather and ZeRO-2/3 gradient scatter -------------------------------------------
  tensor_ref<T> gather(unit& u) {
    auto full = arena_.transient<T>(u.name + ".gathered", u.elements, category::temporaries);
    dp_.all_gather(reinterpret_cast<const float*>(u.weight.data), reinterpret_cast<float*>(full.data), u.shard);
    return full;
  }
  /// Weights of unit `u` for use now: the persistent buffer, or a gathered transient (ZeRO-3).
  struct weights_in_use {
    const T* data;
    tensor_ref<T> gathered;
  };
  weights_in_use use_weights(unit& u) {
    if (c_.zero_stage < 3) return {u.weight.data, {}};
    auto g = gather(u);
    return {g.data, g};
  }
  void release(const weights_in_use& w) {
    if (w.gathered.data) arena_.pop(w.gathered);
  }
  /// Gradient buffer to accumulate unit `u` into during its backward.
  tensor_ref<T> grad_buffer(unit& u) {
    if (c_.zero_stage < 2) return u.grad;
    auto full = arena_.transient<T>(u.name + ".grad_full", u.elements, category::temporaries);
    zero(full);
    // This rank's accumulated shard goes into its own block: the reduce-scatter adds it once.
    std::memcpy(full.data + shard_begin(u), u.grad.data, u.shard * sizeof(T));
    return full;
  }
  void finish_grad(unit& u, tensor_ref<T> full) {
    if (c_.zero_stage < 2) return;
    dp_.reduce_scatter(reinterpret_cast<const float*>(full.data), reinterpret_cast<float*>(u.grad.data), u.shard);
    arena_.pop(full);
  }

  // ---- one micro-batch ------------------------------------------------------------------------
  struct block_saved {  // what one block keeps for backward (none recomputation)
    tensor_ref<T> ln1_out, qkv, att, atty, x_mid, ln2_out, fc1_out, gelu_out, x_out;
    tensor_ref<A> lse;
    tensor_ref<std::uint8_t> mask1, mask2;
  };
  /// The loss is multiplied by this before backward (1 without dynamic loss scaling).
  A loss_scale() const { return c_.loss_scaling ? static_cast<A>(scaler_.scale()) : A(1); }
  bool keeps_core() const { return c_.recompute != recompute_kind::selective; }
  std::size_t segment() const {
    return c_.recompute == recompute_kind::every_k ? c_.recompute_every
           : c_.recompute == recompute_kind::full  ? 1
                                                   : c_.layers;
  }

  /// Forward of block l from x_in; pushes its saved set (x_out last) onto the saved stack.
  block_saved block_forward(std::size_t l, const T* x_in, const T* W, category kind = category::activations) {
    const std::size_t N = tokens(), C = c_.hidden, Wd = local_width(), F = local_ffn();
    const block_view& b = blk_;
    const bool drop = c_.dropout > 0;
    block_saved s{};
    s.ln1_out = arena_.push<T>("ln1_out", N * C, kind);
    layernorm_fwd(s.ln1_out.data, x_in, W + b.ln1_w, W + b.ln1_b);
    s.qkv = arena_.push<T>("qkv", N * 3 * Wd, kind);
    backend::cpu::linear_forward(s.qkv.data, s.ln1_out.data, W + b.qkv_w, W + b.qkv_b, N, C, 3 * Wd);
    const auto sh = attn_shape();
    const std::size_t scores = c_.micro_batch * local_heads() * c_.sequence * c_.sequence;
    const std::size_t lse_n = c_.micro_batch * local_heads() * c_.sequence;
    tensor_ref<T> att_tmp{};
    tensor_ref<A> lse_tmp{};
    if (!c_.flash) {
      if (keeps_core()) s.att = arena_.push<T>("attention_probs", scores, kind);
      else att_tmp = arena_.transient<T>("attention_probs", scores, category::temporaries);
    } else {
      if (keeps_core()) s.lse = arena_.push<A>("attention_lse", lse_n, kind);
      else lse_tmp = arena_.transient<A>("attention_lse", lse_n, category::temporaries);
    }
    s.atty = arena_.push<T>("attention_out", N * Wd, kind);
    if (!c_.flash) backend::cpu::attention_naive_forward(s.atty.data, (keeps_core() ? s.att : att_tmp).data, s.qkv.data, sh);
    else backend::cpu::attention_flash_forward(s.atty.data, (keeps_core() ? s.lse : lse_tmp).data, s.qkv.data, sh);
    if (lse_tmp.data) arena_.pop(lse_tmp);
    if (att_tmp.data) arena_.pop(att_tmp);
    if (drop) s.mask1 = arena_.push<std::uint8_t>("dropout_mask", N * C, kind);
    s.x_mid = arena_.push<T>("residual", N * C, kind);
    {
      auto proj = arena_.transient<T>("proj_out", N * C, category::temporaries);
      backend::cpu::linear_forward(proj.data, s.atty.data, W + b.proj_w, static_cast<const T*>(nullptr), N, Wd, C);
      tp_sum(proj.data, N * C);
      add_bias(proj.data, W + b.proj_b, N, C);
      if (drop) dropout_rows(proj.data, s.mask1.data, proj.data, 2 * l);
      backend::cpu::add(s.x_mid.data, x_in, proj.data, N * C);
      arena_.pop(proj);
    }
    s.ln2_out = arena_.push<T>("ln2_out", N * C, kind);
    layernorm_fwd(s.ln2_out.data, s.x_mid.data, W + b.ln2_w, W + b.ln2_b);
    s.fc1_out = arena_.push<T>("fc1_out", N * F, kind);
    backend::cpu::linear_forward(s.fc1_out.data, s.ln2_out.data, W + b.fc1_w, W + b.fc1_b, N, C, F);
    s.gelu_out = arena_.push<T>("gelu_out", N * F, kind);
    backend::cpu::gelu_forward(s.gelu_out.data, s.fc1_out.data, N * F);
    if (drop) s.mask2 = arena_.push<std::uint8_t>("dropout_mask", N * C, kind);
    s.x_out = arena_.push<T>("residual", N * C, kind);
    {
      auto fc2 = arena_.transient<T>("fc2_out", N * C, category::temporaries);
      backend::cpu::linear_forward(fc2.data, s.gelu_out.data, W + b.fc2_w, static_cast<const T*>(nullptr), N, F, C);
      tp_sum(fc2.data, N * C);
      add_bias(fc2.data, W + b.fc2_b, N, C);
      if (drop) dropout_rows(fc2.data, s.mask2.data, fc2.data, 2 * l + 1);
      backend::cpu::add(s.x_out.data, s.x_mid.data, fc2.data, N * C);
      arena_.pop(fc2);
    }
    return s;
  }

  /// Pops a block's saved set except x_out (the next block's input, popped by its owner).
  void pop_block_saved(const block_saved& s) {
    if (s.mask2.data) arena_.pop(s.mask2);
    if (s.gelu_out.data) arena_.pop(s.gelu_out);  // (the backward releases the MLP's: block_backward)
    if (s.fc1_out.data) arena_.pop(s.fc1_out);
    if (s.ln2_out.data) arena_.pop(s.ln2_out);
    if (s.x_mid.data) arena_.pop(s.x_mid);
    if (s.mask1.data) arena_.pop(s.mask1);
    arena_.pop(s.atty);
    if (s.lse.data) arena_.pop(s.lse);
    if (s.att.data) arena_.pop(s.att);
    arena_.pop(s.qkv);
    arena_.pop(s.ln1_out);
  }

  /// Backward of block l: dres holds dL/dx_out on entry and dL/dx_in on exit; `slot` is a second
  /// [N, C] gradient buffer (the gradient of a norm's output). With those two alive for the whole
  /// backward, a block adds its inner gradients only: the MLP's [N, F/t], or the attention
  /// output's and Q/K/V's, or one [N, C] for a norm's input gradient.
  void block_backward(std::size_t l, block_saved& s, const T* x_in, const T* W, T* G, T* dres, T* slot) {
    const std::size_t N = tokens(), C = c_.hidden, Wd = local_width(), F = local_ffn();
    const block_view& b = blk_;
    const bool drop = c_.dropout > 0;
    (void)l;
    // MLP branch: dres → (dropout) → fc2 → GeLU → fc1 → LN2.
    {
      const T* dfc2 = dres;
      if (drop) {  // the slot holds the dropout's input gradient until fc1 overwrites it
        backend::cpu::dropout_backward(slot, dres, s.mask2.data, N * C, c_.dropout);
        arena_.pop(s.mask2);  // its one reader: the saved side's top (x_out went before the backward)
        s.mask2 = {};
        dfc2 = slot;
      }
      auto dgelu = arena_.transient<T>("grad_mlp_inner", N * F, category::temporaries);
      backend::cpu::linear_backward(dgelu.data, G + b.fc2_w, G + b.fc2_b, dfc2, s.gelu_out.data, W + b.fc2_w, N, F, C);
      backend::cpu::gelu_backward(dgelu.data, dgelu.data, s.fc1_out.data, N * F);
      backend::cpu::linear_backward(slot, G + b.fc1_w, G + b.fc1_b, dgelu.data, s.ln2_out.data, W + b.fc1_w, N, C, F);
      arena_.pop(dgelu);
      tp_sum(slot, N * C);
      auto dnorm = arena_.transient<T>("grad_norm_in", N * C, category::temporaries);
      layernorm_bwd(dnorm.data, G + b.ln2_w, G + b.ln2_b, slot, s.x_mid.data, W + b.ln2_w);
      add_into(dres, dnorm.data, N * C);
      arena_.pop(dnorm);
      // Read for the last time, the saved side's top: released before the attention branch.
      arena_.pop(s.gelu_out);
      arena_.pop(s.fc1_out);
      arena_.pop(s.ln2_out);
      arena_.pop(s.x_mid);
      s.gelu_out = s.fc1_out = s.ln2_out = s.x_mid = {};
    }
    // Attention branch: dres → (dropout) → out-projection → attention → QKV → LN1.
    {
      const T* dproj = dres;
      if (drop) {
        backend::cpu::dropout_backward(slot, dres, s.mask1.data, N * C, c_.dropout);
        dproj = slot;
      }
      auto datty = arena_.transient<T>("grad_attention_out", N * Wd, category::temporaries);
      backend::cpu::linear_backward(datty.data, G + b.proj_w, G + b.proj_b, dproj, s.atty.data, W + b.proj_w, N, Wd, C);
      auto dqkv = arena_.transient<T>("grad_qkv", N * 3 * Wd, category::temporaries);
      const auto sh = attn_shape();
      const std::size_t scores = c_.micro_batch * local_heads() * c_.sequence * c_.sequence;
      const std::size_t lse_n = c_.micro_batch * local_heads() * c_.sequence;
      if (!c_.flash) {
        tensor_ref<T> att = s.att;
        tensor_ref<T> out_tmp{};
        if (!keeps_core()) {  // selective: rebuild the probabilities (the kernel rewrites the output too)
          att = arena_.transient<T>("attention_probs", scores, category::temporaries);
          out_tmp = arena_.transient<T>("attention_out_recomputed", N * Wd, category::temporaries);
          backend::cpu::attention_naive_forward(out_tmp.data, att.data, s.qkv.data, sh);
        }
        backend::cpu::attention_naive_backward(dqkv.data, datty.data, s.qkv.data, att.data, sh);
        if (out_tmp.data) arena_.pop(out_tmp);
        if (!keeps_core()) arena_.pop(att);
      } else {
        tensor_ref<A> lse = s.lse;
        tensor_ref<T> out_tmp{};
        if (!keeps_core()) {
          lse = arena_.transient<A>("attention_lse", lse_n, category::temporaries);
          out_tmp = arena_.transient<T>("attention_out_recomputed", N * Wd, category::temporaries);
          backend::cpu::attention_flash_forward(out_tmp.data, lse.data, s.qkv.data, sh);
        }
        backend::cpu::attention_flash_backward(dqkv.data, datty.data, s.qkv.data, s.atty.data, lse.data, sh);
        if (out_tmp.data) arena_.pop(out_tmp);
        if (!keeps_core()) arena_.pop(lse);
      }
      backend::cpu::linear_backward(slot, G + b.qkv_w, G + b.qkv_b, dqkv.data, s.ln1_out.data, W + b.qkv_w, N, C, 3 * Wd);
      arena_.pop(dqkv);
      arena_.pop(datty);
      tp_sum(slot, N * C);
      auto dnorm = arena_.transient<T>("grad_norm_in", N * C, category::temporaries);
      layernorm_bwd(dnorm.data, G + b.ln1_w, G + b.ln1_b, slot, x_in, W + b.ln1_w);
      add_into(dres, dnorm.data, N * C);
      arena_.pop(dnorm);
    }
  }

  A micro_batch(std::span<const std::int32_t> tok, std::span<const std::int32_t> tgt) {
    const std::size_t N = tokens(), C = c_.hidden, V = c_.vocab, L = c_.layers;
    const bool drop = c_.dropout > 0;
    unit& wte = units_[0];
    unit& wpe = units_[1];
    unit& lnf = units_.back();

    // Embedding (+ dropout). Its output is block 0's input.
    tensor_ref<std::uint8_t> emb_mask{};
    if (drop) emb_mask = arena_.push<std::uint8_t>("dropout_mask", N * C, category::activations);
    auto x0 = arena_.push<T>("residual", N * C, category::activations);
    {
      auto we = use_weights(wte);
      auto pe = use_weights(wpe);
      backend::cpu::embedding_forward(x0.data, tok.data(), we.data, pe.data, c_.micro_batch, c_.sequence, C);
      release(pe);
      release(we);
    }
    if (drop) dropout_rows(x0.data, emb_mask.data, x0.data, 1'000'000);

    // Blocks. Under full / every-K recomputation only each segment's last output is kept (the
    // next segment's input); outputs inside a segment go to a transient pair of buffers.
    std::vector<block_saved> saved(L);
    std::vector<tensor_ref<T>> inputs(L + 1);  // inputs[l] = block l's input; inputs[L] = last output
    inputs[0] = x0;
    const std::size_t seg = segment();
    const bool recompute_layers = c_.recompute == recompute_kind::full || c_.recompute == recompute_kind::every_k;
    const auto kept = [&](std::size_t l) { return (l + 1) % seg == 0 || l + 1 == L; };
    std::array<tensor_ref<T>, 2> pair{};
    const bool need_pair = recompute_layers && seg > 1 && L > 1;
    if (need_pair)
      for (auto& p : pair) p = arena_.transient<T>("segment_residual", N * C, category::temporaries);
    for (std::size_t l = 0; l < L; ++l) {
      unit& u = units_[2 + l];
      if (!recompute_layers) {
        auto w = use_weights(u);
        saved[l] = block_forward(l, inputs[l].data, w.data);
        inputs[l + 1] = saved[l].x_out;
        release(w);
        continue;
      }
      tensor_ref<T> out = kept(l) ? arena_.push<T>("checkpoint", N * C, category::activations) : pair[l % 2];
      auto w = use_weights(u);
      block_saved s = block_forward(l, inputs[l].data, w.data);
      std::memcpy(out.data, s.x_out.data, N * C * sizeof(T));
      arena_.pop(s.x_out);
      pop_block_saved(s);
      release(w);
      inputs[l + 1] = out;
    }
    if (need_pair)
      for (std::size_t i = 2; i-- > 0;) arena_.pop(pair[i]);

    // Head: final norm, tied output layer, cross-entropy; backward through it. The output layer
    // sends its gradient back in `slot`; the final norm writes the residual gradient `dres`. The
    // two stay for the whole backward (a gradient arriving at a layer and the one it writes).
    auto lnf_out = arena_.push<T>("lnf_out", N * C, category::activations);
    {
      auto wl = use_weights(lnf);
      layernorm_fwd(lnf_out.data, inputs[L].data, wl.data, wl.data + C);
      release(wl);
    }
    auto slot = arena_.transient<T>("grad_slot", N * C, category::temporaries);
    A loss = 0;
    {
      auto we = use_weights(wte);
      // Logits in the activation dtype; cross-entropy turns them into their gradient in place
      // (a fused classifier, as llm.c's). Per-token losses are O(tokens) scratch.
      auto logits = arena_.transient<T>("logits", N * V, category::temporaries);
      token_losses_.resize(N);
      backend::cpu::linear_forward(logits.data, lnf_out.data, we.data, static_cast<const T*>(nullptr), N, C, V);
      loss = backend::cpu::cross_entropy_forward(token_losses_.data(), logits.data, tgt.data(), N, V);
      const A dloss = loss_scale() / static_cast<A>(c_.grad_accum);
      backend::cpu::cross_entropy_backward(logits.data, logits.data, tgt.data(), dloss, N, V);
      auto gw = grad_buffer(wte);
      backend::cpu::linear_backward(slot.data, gw.data, static_cast<T*>(nullptr), logits.data, lnf_out.data, we.data, N, C, V);
      finish_grad(wte, gw);
      arena_.pop(logits);
      release(we);
    }
    auto dres = arena_.transient<T>("grad_residual", N * C, category::temporaries);
    {
      auto wn = use_weights(lnf);
      auto gl = grad_buffer(lnf);
      layernorm_bwd(dres.data, gl.data, gl.data + C, slot.data, inputs[L].data, wn.data);
      finish_grad(lnf, gl);
      release(wn);
    }
    arena_.pop(lnf_out);

    // Blocks, last to first.
    for (std::size_t seg_end = L; seg_end > 0;) {
      const std::size_t seg_begin = recompute_layers ? ((seg_end - 1) / seg) * seg : seg_end - 1;
      if (!recompute_layers) {
        const std::size_t l = seg_end - 1;
        unit& u = units_[2 + l];
        arena_.pop(saved[l].x_out);
        auto w = use_weights(u);
        auto g = grad_buffer(u);
        block_backward(l, saved[l], inputs[l].data, w.data, g.data, dres.data, slot.data);
        finish_grad(u, g);
        release(w);
        pop_block_saved(saved[l]);
      } else {
        // Rebuild the segment's saved sets from its kept input (gathering each layer's weights
        // again under ZeRO-3), then run backward through it.
        arena_.pop(inputs[seg_end]);
        std::vector<block_saved> rebuilt;
        for (std::size_t l = seg_begin; l < seg_end; ++l) {
          auto w = use_weights(units_[2 + l]);
          rebuilt.push_back(
              block_forward(l, l == seg_begin ? inputs[l].data : rebuilt.back().x_out.data, w.data, category::temporaries));
          release(w);
        }
        for (std::size_t l = seg_end; l-- > seg_begin;) {
          block_saved& s = rebuilt[l - seg_begin];
          arena_.pop(s.x_out);
          unit& u = units_[2 + l];
          auto w = use_weights(u);
          auto g = grad_buffer(u);
          block_backward(l, s, l == seg_begin ? inputs[l].data : rebuilt[l - seg_begin - 1].x_out.data, w.data, g.data,
                         dres.data, slot.data);
          finish_grad(u, g);
          release(w);
          pop_block_saved(s);
        }
      }
      seg_end = seg_begin;
    }

    // Embedding backward (tied wte gets its second contribution).
    if (drop) backend::cpu::dropout_backward(dres.data, dres.data, emb_mask.data, N * C, c_.dropout);
    {
      auto gw = grad_buffer(wte);
      auto gp = grad_buffer(wpe);
      backend::cpu::embedding_backward(gw.data, gp.data, dres.data, tok.data(), c_.micro_batch, c_.sequence, C);
      finish_grad(wpe, gp);
      finish_grad(wte, gw);
    }
    arena_.pop(dres);
    arena_.pop(slot);
    arena_.pop(x0);
    if (emb_mask.data) arena_.pop(emb_mask);
    if (arena_.stack_depth() != 0) throw arena_error("gpt_trainer: tensors left on the arena after a micro-batch");
    return loss;
  }

  // ---- gradient reduction and the optimizer step ----------------------------------------------
  void reduce_gradients_after_backward() {
    if (c_.dp == 1) return;
    for (unit& u : units_) {
      if (c_.zero_stage == 0) {
        dp_.all_reduce(reinterpret_cast<float*>(u.grad.data), u.elements, reduce_op::sum);
      } else {  // ZeRO-1: in-place reduce-scatter (the sum lands in the first block), then move
        float* g = reinterpret_cast<float*>(u.grad.data);  // it to this rank's block
        dp_.reduce_scatter(g, g, u.shard);
        std::memmove(g + shard_begin(u), g, u.shard * sizeof(float));
      }
    }
  }
  /// Indices [lo, hi) of unit u this rank updates, and where its grad/state/weight elements are.
  struct update_range {
    std::size_t lo, hi, grad_off, state_off, weight_off;
  };
  update_range owned(const unit& u) const {
    const int z = c_.zero_stage;
    const std::size_t lo = z >= 1 ? shard_begin(u) : 0, hi = z >= 1 ? lo + u.shard : u.elements;
    return {lo, hi, z >= 2 ? lo : 0, z >= 1 ? lo : 0, z >= 3 ? lo : 0};
  }
  static bool in_ranges(const std::vector<std::pair<std::size_t, std::size_t>>& r, std::size_t i) {
    for (const auto& [b, e] : r)
      if (i >= b && i < e) return true;
    return false;
  }
  void optimizer_step() {
    // Global gradient norm over the owned elements (TP-replicated ones counted on TP rank 0).
    A sumsq = 0;
    bool nonfinite = false;
    for (const unit& u : units_) {
      const update_range r = owned(u);
      for (std::size_t i = r.lo; i < r.hi; ++i) {
        const A g = to_float(u.grad[i - r.grad_off]);
        if (!std::isfinite(g)) nonfinite = true;
        if (tp_.rank() != 0 && in_ranges(u.replicated, i)) continue;
        sumsq += g * g;
      }
    }
    float parts[2] = {static_cast<float>(sumsq), nonfinite ? 1.0f : 0.0f};
    if (c_.zero_stage >= 1) dp_.all_reduce(parts, 2, reduce_op::sum);
    else dp_.all_reduce(parts + 1, 1, reduce_op::max);
    tp_.all_reduce(parts, 2, reduce_op::sum);
    const A inv = A(1) / (loss_scale() * static_cast<A>(c_.dp));
    const A norm = std::sqrt(static_cast<A>(parts[0])) * inv;
    last_grad_norm_ = static_cast<float>(norm);
    if (c_.loss_scaling) {
      if (!scaler_.update(parts[1] > 0)) return;  // overflow: skip the step, scale backed off
    }
    const A clip = c_.max_grad_norm > 0 ? backend::cpu::clip_coefficient(norm, static_cast<A>(c_.max_grad_norm)) : A(1);
    const float grad_scale = static_cast<float>(clip * inv);
    ++updates_;
    for (unit& u : units_) {
      const update_range r = owned(u);
      // Contiguous runs of equal decay.
      std::size_t i = r.lo;
      while (i < r.hi) {
        const bool nd = in_ranges(u.no_decay, i);
        std::size_t j = i;
        while (j < r.hi && in_ranges(u.no_decay, j) == nd) ++j;
        update(u, r, i, j, nd ? 0.0f : c_.weight_decay, grad_scale);
        i = j;
      }
      if ((c_.zero_stage == 1 || c_.zero_stage == 2) && c_.dp > 1) {  // share the updated block
        float* w = reinterpret_cast<float*>(u.weight.data);
        dp_.all_gather(w + shard_begin(u), w, u.shard);
      }
    }
  }
  void update(unit& u, const update_range& r, std::size_t i, std::size_t j, float wd, float grad_scale) {
    T* param = u.weight.data + (i - r.weight_off);
    A* master = u.master.count ? u.master.data + (i - r.state_off) : nullptr;
    const T* grad = u.grad.data + (i - r.grad_off);
    const std::size_t n = j - i;
    switch (c_.optimizer) {
      case optimizer_kind::sgd:
        backend::cpu::sgd_step(param, master, grad, n, backend::cpu::sgd_hparams{c_.lr, wd}, grad_scale);
        break;
      case optimizer_kind::momentum:
        backend::cpu::momentum_step(param, master, u.state1.data + (i - r.state_off), grad, n,
                                    backend::cpu::momentum_hparams{c_.lr, c_.momentum, wd}, grad_scale);
        break;
      case optimizer_kind::adam:
      case optimizer_kind::adamw:
        backend::cpu::adamw_step(param, master, u.state1.data + (i - r.state_off), u.state2.data + (i - r.state_off),
                                 grad, n, backend::cpu::adamw_hparams{c_.lr, c_.beta1, c_.beta2, c_.eps, wd},
                                 static_cast<std::int64_t>(updates_), grad_scale);
        break;
      default:
        throw std::invalid_argument("gpt_trainer: the CPU runtime implements sgd, momentum, adam and adamw");
    }
  }

 public:
  float last_grad_norm() const { return last_grad_norm_; }

 private:
  gpt_config c_;
  Comm& dp_;
  Comm& tp_;
  arena arena_;
  block_view blk_{};
  std::vector<unit> units_;
  std::vector<A> scratch_mean_, scratch_rstd_, token_losses_;
  backend::cpu::dynamic_loss_scaler scaler_{};
  std::size_t step_ = 0, micro_ = 0, updates_ = 0;
  std::uint64_t counters_[2] = {0, 0};
  float last_grad_norm_ = 0;
};

}  // namespace memalg::exec

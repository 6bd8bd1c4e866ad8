// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/build_generation.hpp — lowers greedy text generation with a GPT-family model to a
// program, on the host.
//
// `build_generation(cfg, request, sizes, cache)` lays out, through an `arena_layout` of the serving
// plan's capacities (plan/serve.hpp, serve_stack::memalg), what one rank does to generate
// `new_tokens` tokens after a prompt of `prompt` tokens for each of `batch` sequences:
//
//   [ weights (unit after unit, as training lays them out) | key/value cache, layer after layer |
//     the stacks of one forward at a time ]
//
//  * the cache: per layer kv [B, L, 2·Hkv·D] in the storage type (ops::kv_append), L = prompt +
//    new_tokens − 1 positions per sequence (the last new token is never fed back), allocated
//    whole before the prefill at the offsets the serving plan gives (`cache_placement`: the
//    builder throws arena_error when its own layout differs);
//  * the prefill: one forward over the prompt with nothing saved for a backward — each tensor
//    released after its last reader, the attention core the training step's own (naive or flash,
//    its statistics a transient), the keys and values appended to the cache; the final norm and
//    the output layer on each sequence's last position only; greedy sampling (ops::argmax);
//  * decode steps 1 … new_tokens − 1: the same forward over the previous step's B sampled tokens
//    (where::generated), at position prompt + k − 1, attending over the cache
//    (ops::cached_attention_fwd).
// Token k of sequence b lands at generated[k·B + b] (program::generated_per_micro = B·new_tokens).
//
// Every tensor is padded to the layout's 16 bytes (the serving plan counts the same padding), so
// any prompt length lays out. The block is training's forward without dropout (inference) and
// without saved tensors: the same ops in the same order on the same shapes, so the prefill's
// logits at a sequence's last position are the training step's forward logits there, bit for bit
// (tests/host/test_generation_prefill.cpp). Implemented: one rank (no tensor or pipeline
// parallelism), sequential blocks (no parallel residual, no post-norms).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memalg/exec/arena_layout.hpp"
#include "memalg/exec/gpt/config.hpp"
#include "memalg/exec/gpt/state.hpp"
#include "memalg/exec/lowering.hpp"
#include "memalg/exec/program.hpp"

namespace memalg::exec {

/// What to generate: `batch` sequences of `prompt` tokens each, then `new_tokens` greedy tokens.
struct generation_request {
  std::size_t batch = 1, prompt = 0, new_tokens = 1;
  /// Cache positions per sequence: every token but the last new one is fed back.
  constexpr std::size_t cache_length() const { return prompt + new_tokens - 1; }
};

/// Where the serving plan puts the key/value cache: layer l's kv at offset + l·layer_bytes.
struct cache_placement {
  std::size_t offset = 0, layer_bytes = 0;
};

/// Bytes of `n` elements of `e` padded to the arena's 16-byte alignment (what the generation
/// program allocates; plan/serve.hpp's memalg stack counts the same).
constexpr std::size_t generation_bytes(std::size_t n, elem e) {
  const std::size_t a = arena_layout::alignment, b = n * elem_size(e);
  return (b + a - 1) / a * a;
}

namespace detail {

class gpt_generation : gpt_state {
 public:
  gpt_generation(const gpt_config& c, const generation_request& r, arena_sizes sizes, elem storage)
      : gpt_state(inference_config(c, r), sizes, rank_coords{}, storage, 0, false), req_(r), given_(c) {
    who_ = "build_generation";
  }

  program build(const cache_placement& planned) {
    check();
    validate();
    build_units();
    for (unit& u : units_) u.weight = persistent(u.name + ".weights", u.elements, T_, category::weights);
    describe_units();
    for (const unit& u : units_) p_.checkpoint.push_back({u.name + ".weights", u.weight, category::weights});
    place_cache(planned);
    layout_.enable_trace();
    section_ = &p_.micro;
    const std::size_t B = req_.batch, P = req_.prompt;
    forward(P, 0, operand{0, B * P, elem::i32, where::tokens}, generated(0));
    for (std::size_t k = 1; k < req_.new_tokens; ++k) forward(1, P + k - 1, generated(k - 1), generated(k));
    if (layout_.stack_depth() != 0) throw arena_error("build_generation: tensors left on the arena after the run");
    p_.trace = layout_.trace();
    finish_program(c_, P, 0, 0.0f);
    p_.tokens_per_micro = B * P;
    p_.targets_per_micro = 0;
    p_.generated_per_micro = B * req_.new_tokens;
    return std::move(p_);
  }

 private:
  /// The training configuration as one rank runs it for inference: no dropout, one micro-batch
  /// of the request's sequences over every position the cache holds (which validate() checks
  /// against a learned position embedding).
  static gpt_config inference_config(gpt_config c, const generation_request& r) {
    c.micro_batch = r.batch;
    c.sequence = r.prompt + (r.new_tokens > 0 ? r.new_tokens - 1 : 0);
    c.grad_accum = 1;
    c.dropout = 0.0f;
    c.recompute = recompute_kind::none;
    c.loss_chunk = 0;
    c.dp = 1;
    c.zero_stage = 0;
    return c;
  }
  void check() const {
    if (req_.batch == 0 || req_.prompt == 0 || req_.new_tokens == 0)
      fail("generation needs at least one sequence, one prompt token and one new token");
    if (given_.tp != 1 || given_.pp != 1)
      fail("the generation program runs on one rank (no tensor or pipeline parallelism)");
    if (given_.positions != 0 && req_.cache_length() > given_.positions)
      fail("the prompt and the new tokens but the last (" + std::to_string(req_.cache_length()) +
           ") are more positions than the position embedding holds (" + std::to_string(given_.positions) + ")");
    if (given_.geglu || given_.embed_scale || given_.attn_softcap != 0 || given_.final_softcap != 0 ||
        given_.sliding_window != 0 || given_.query_scalar != 0)
      fail("the generation program runs GPT, Llama, Qwen2 and Qwen3 blocks, not Gemma 2's arithmetic");
    if (given_.parallel_residual || given_.sandwich_norms)
      fail("the generation program runs sequential blocks with norms before the sub-layers (no parallel residual, "
           "no post-norms)");
  }
  operand generated(std::size_t k) const {
    return {k * req_.batch, req_.batch, elem::i32, where::generated};
  }
  /// A tensor of n elements of e on one side of the stacks, padded to 16 bytes.
  operand alloc(std::string_view name, std::size_t n, elem e, side s) {
    return {layout_.push(name, generation_bytes(n, e), category::activations, s), n, e, where::arena};
  }
  void place_cache(const cache_placement& planned) {
    const std::size_t L = req_.cache_length(), n = req_.batch * L * 2 * local_kv_width();
    for (std::size_t l = 0; l < c_.layers; ++l) {
      const std::string name = "block" + std::to_string(l) + ".kv_cache";
      const std::size_t bytes = generation_bytes(n, T_);
      const std::size_t off = layout_.persistent(name, bytes, category::activations);
      if (off != planned.offset + l * planned.layer_bytes || bytes != planned.layer_bytes)
        throw arena_error("build_generation: layer " + std::to_string(l) + "'s cache lies at " + std::to_string(off) +
                          " (" + std::to_string(bytes) + " bytes), not where the serving plan puts it (" +
                          std::to_string(planned.offset + l * planned.layer_bytes) + ", " +
                          std::to_string(planned.layer_bytes) + " bytes)");
      const operand o{off, n, T_, where::arena};
      p_.persistent.push_back({name, o, category::activations});
      cache_.push_back(o);
    }
  }

  /// x += in · W[w]ᵀ (+ W[bias]), IC inputs per row: a sub-layer's last product (the
  /// out-projection, FC2) into a transient, its bias after the product as training's row-parallel
  /// product adds it, then the residual sum; `in` (the saved side's top) is released after its read.
  void residual_product(const operand& x, const operand& in, const operand& W, std::size_t w, std::size_t bias,
                        std::size_t IC, std::string_view name) {
    const std::size_t C = c_.hidden, N = x.count / C;
    operand y = alloc(name, N * C, T_, side::transient);
    emit(ops::linear_fwd{y, in, sub(W, w, C * IC), operand{}, u32(N), u32(IC), u32(C)});
    if (c_.bias) emit(ops::bias_add{y, sub(W, bias, C), u32(N), u32(C)});
    pop(in);
    emit(ops::residual_add{x, x, y});
    pop(y);
  }

  /// One forward over q new tokens per sequence at positions pos0 …: the prefill (pos0 = 0, the
  /// training step's attention core) or a decode step (q = 1, attention over the cache). Ends
  /// with the sampled ids of the B sequences in `next`.
  void forward(std::size_t q, std::size_t pos0, const operand& tok, const operand& next) {
    const std::size_t B = req_.batch, N = B * q, C = c_.hidden, Q = local_qkv(), Wd = local_width(), F = local_ffn(),
                      F1 = fc1_rows(), V = c_.vocab, H = local_heads(), L = req_.cache_length();
    const bool prefill = pos0 == 0, rms = c_.rms_norm, nb = block_norm_bias(), bias = c_.bias;
    const std::uint32_t n = u32(N), cc = u32(C);
    const attn_shape sh{u32(B), u32(q), u32(H), u32(local_kv_heads()), u32(head_dim()), true, c_.flash};
    const gpt_block_view& b = blk_;
    operand x = alloc("residual", N * C, T_, side::saved);
    emit(ops::embedding_fwd{x, tok, units_[0].weight, c_.positions != 0 ? units_[1].weight : operand{}, u32(B), u32(q),
                            cc, 0, 0, u32(pos0)});
    for (std::size_t l = 0; l < c_.layers; ++l) {
      const operand& W = units_[first_block_ + l].weight;
      operand a = alloc("ln1_out", N * C, T_, side::saved);
      emit(ops::norm_fwd{a, x, sub(W, b.ln1_w, C), nb ? sub(W, b.ln1_b, C) : operand{}, n, cc, rms, norm_eps(),
                         norm_offset()});
      operand qkv = alloc("qkv", N * Q, T_, side::transient);
      emit(ops::linear_fwd{qkv, a, sub(W, b.qkv_w, Q * C), bias || c_.qkv_bias ? sub(W, b.qkv_b, Q) : operand{}, n, cc,
                           u32(Q)});
      pop(a);
      if (c_.qk_norm)
        emit(ops::qk_norm_fwd{qkv, operand{}, sub(W, b.q_norm_w, head_dim()), sub(W, b.k_norm_w, head_dim()), sh,
                              norm_eps()});
      if (rotary())
        emit(ops::rotary_fwd{qkv, sh, u32(c_.rotary_dim != 0 ? c_.rotary_dim : head_dim()), c_.rope_theta, u32(pos0)});
      emit(ops::kv_append{cache_[l], qkv, sh, u32(pos0), u32(L)});
      operand att = alloc("attention_out", N * Wd, T_, side::saved);
      if (prefill) {  // the training step's core; its statistics are dropped at once
        operand core = c_.flash ? alloc("attention_lse", B * H * q, A_, side::saved)
                                : alloc("attention_probs", B * H * q * q, T_, side::saved);
        emit(ops::attention_fwd{att, core, qkv, sh});
        pop(core);
      } else {
        emit(ops::cached_attention_fwd{att, qkv, cache_[l], sh, u32(pos0), u32(L)});
      }
      pop(qkv);
      residual_product(x, att, W, b.proj_w, b.proj_b, Wd, "proj_out");
      operand a2 = alloc("ln2_out", N * C, T_, side::saved);
      emit(ops::norm_fwd{a2, x, sub(W, b.ln2_w, C), nb ? sub(W, b.ln2_b, C) : operand{}, n, cc, rms, norm_eps(),
                         norm_offset()});
      operand fc1 = alloc("fc1_out", N * F1, T_, side::transient);
      emit(ops::linear_fwd{fc1, a2, sub(W, b.fc1_w, F1 * C), bias ? sub(W, b.fc1_b, F1) : operand{}, n, cc, u32(F1)});
      pop(a2);
      operand act = alloc("gelu_out", N * F, T_, side::saved);
      emit(ops::activation_fwd{act, fc1, c_.gated ? ops::activation_kind::swiglu : ops::activation_kind::gelu, n, u32(F)});
      pop(fc1);
      residual_product(x, act, W, b.fc2_w, b.fc2_b, F, "fc2_out");
    }
    // Each sequence's last position: the final norm, the output layer, the greedy choice.
    operand last = alloc("last_rows", B * C, T_, side::transient);
    if (q == 1) emit(ops::copy{last, x});
    else
      for (std::size_t s = 0; s < B; ++s) emit(ops::copy{sub(last, s * C, C), sub(x, (s * q + q - 1) * C, C)});
    pop(x);
    operand h = alloc("lnf_out", B * C, T_, side::saved);
    const operand& lnf = units_[lnf_].weight;
    emit(ops::norm_fwd{h, last, sub(lnf, 0, C), norm_bias() ? sub(lnf, C, C) : operand{}, u32(B), cc, rms, norm_eps(),
                       norm_offset()});
    pop(last);
    operand logits = alloc("logits", B * V, T_, side::transient);
    const operand& head = c_.tied ? units_[0].weight : units_[lnf_ + 1].weight;
    emit(ops::linear_fwd{logits, h, head, operand{}, u32(B), cc, u32(V)});
    pop(h);
    emit(ops::argmax{next, logits, u32(B), u32(V)});
    pop(logits);
  }

  generation_request req_;
  gpt_config given_;
  std::vector<operand> cache_;
};

}  // namespace detail

/// The generation program of `request` with the model of `cfg` (a training configuration: its
/// model and storage, one rank), laid out in `sizes` with the cache where `cache` puts it (both
/// the serving plan's: plan/serve.hpp, serve_stack::memalg). Throws program_error for what the
/// program does not implement and arena_error when the run does not fit `sizes` or the cache is
/// not where the plan says.
inline program build_generation(const gpt_config& cfg, const generation_request& request, arena_sizes sizes,
                                const cache_placement& cache, elem storage) {
  return detail::gpt_generation(cfg, request, sizes, storage).build(cache);
}

}  // namespace memalg::exec

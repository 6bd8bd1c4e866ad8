// SPDX-License-Identifier: BSL-1.0
// memalg/exec/program.hpp — a training step as data: backend-neutral ops over arena offsets.
//
// A `program` is what a trainer does in one optimizer step, decided once on the host: which
// kernels run, in which order, on which bytes of the arena. The builder (exec/gpt/build_program.hpp)
// lays the step out through an `arena_layout` with the plan's capacities, so every operand is a
// byte offset that is known — and checked against the plan — before any kernel runs. A backend
// (exec/run.hpp's `step_backend`) only executes ops; it decides nothing about memory.
//
// Operands are {offset, count, element type, where}: `where` says whether the offset is a byte
// offset in the arena, an element offset in this micro-batch's token or target ids, or a slot of
// the step's small scalar file (loss, norm, clip scale); `none` is a null operand (no bias, no
// master weights). Element counts are those of the operand, shapes are the op's own fields.
//
// A step is three sections: `step_begin` once (zero the gradients), `micro` once per accumulated
// micro-batch, `step_end` once (loss, gradient norm, clip, optimizer). Each op carries a `when`:
// always, only in the last micro-batch (the ZeRO-0/1 gradient reductions, right after the unit's
// last backward), or unless the step was skipped (fp16 overflow: the optimizer ops).
//
// Under pipeline parallelism (pp > 1) a rank runs one stage, and `micro` is replaced by
// `pipeline`: the stage's forward and backward sections of every micro-batch in 1F1B order
// (min(pp − s − 1, m) warm-up forwards, then one forward and one backward, then the remaining
// backwards; Narayanan et al. 2021, §2.2; Megatron-LM's schedules.py), micro-batch i's saved
// tensors in stash slot i mod slots. Activations and their gradients cross stages by blocking
// `send` / `recv` on group::pp, ordered as Megatron's paired exchanges (send_forward_recv_backward,
// send_backward_recv_forward): in steady state a backward receives the next forward's input before
// it sends its own input gradient, which is what keeps blocking point-to-point free of deadlock.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

#include "memalg/exec/arena_layout.hpp"
#include "memalg/exec/communicator.hpp"
#include "memalg/exec/hparams.hpp"
#include "memalg/plan/breakdown.hpp"
#include "memalg/train/optimizer.hpp"

namespace memalg::exec {

enum class elem : std::uint8_t { f32, bf16, f16, u8, i32 };

constexpr std::size_t elem_size(elem e) {
  switch (e) {
    case elem::f32: return 4;
    case elem::bf16: return 2;
    case elem::f16: return 2;
    case elem::u8: return 1;
    case elem::i32: return 4;
  }
  return 0;
}

/// What an operand's offset is relative to.
enum class where : std::uint8_t { none, arena, tokens, targets, scalar, features, masks, generated };

/// A tensor of the program: byte offset in the arena (element offset for tokens, targets,
/// features and masks, slot index for scalars) and element count. `features` are this
/// micro-batch's fp32 inputs (the speech model's mel frames and stop targets), `masks` its u8
/// masks (real frames, real phonemes): step_io carries both, as it carries the ids.
struct operand {
  std::uint64_t offset = 0, count = 0;
  elem type = elem::f32;
  where in = where::none;
  constexpr bool null() const { return in == where::none; }
  constexpr std::uint64_t bytes() const { return count * elem_size(type); }
  friend constexpr bool operator==(const operand&, const operand&) = default;
};

/// Slots of the step's scalar file (accumulators in the accumulation type, the rest fp32).
namespace scalars {
inline constexpr std::uint64_t loss_sum = 0;  ///< Σ micro-batch mean losses (A)
inline constexpr std::uint64_t loss = 1;      ///< the step's loss (fp32, reduced over dp)
inline constexpr std::uint64_t sumsq = 2;     ///< Σ g² over owned, counted elements (A)
inline constexpr std::uint64_t nonfinite = 3; ///< any owned gradient not finite (flag)
inline constexpr std::uint64_t parts = 4;     ///< {sumsq, nonfinite} as fp32, reduced together (2 slots)
inline constexpr std::uint64_t norm = 6;      ///< global gradient norm (fp32)
inline constexpr std::uint64_t grad_scale = 7;///< clip coefficient / (loss scale · dp) (fp32)
inline constexpr std::uint64_t count = 8;
constexpr operand slot(std::uint64_t s, std::uint64_t n = 1) { return {s, n, elem::f32, where::scalar}; }
}  // namespace scalars

/// A self-attention's shape. Gemma 2's variants: `window` > 0 — local attention, query t reads
/// only the last `window` positions up to its own (sliding_window); `softcap` > 0 — the scores are
/// softcap·tanh(score / softcap) before the softmax (attn_logit_softcapping); `scale` > 0 — the
/// scores' scale instead of 1/√D (query_pre_attn_scalar^−½).
struct attn_shape {
  std::uint32_t B = 0, S = 0, H = 0, Hkv = 0, D = 0;
  bool causal = true, flash = false;
  std::uint32_t window = 0;
  float softcap = 0, scale = 0;
  friend constexpr bool operator==(const attn_shape&, const attn_shape&) = default;
};

enum class when : std::uint8_t { always, last_micro, unless_skipped };
enum class group : std::uint8_t { dp, tp, pp };

namespace ops {  // one struct per operation: operands first, then shapes
// Token (+ position) embedding; backward accumulates into dwte / dwpe. pos0: the position of
// each sequence's first row (token s of a sequence reads wpe[pos0 + s]; a decode step's). vocab_rows != 0: the
// vocabulary-parallel lookup — wte holds rows [vocab_begin, vocab_begin + vocab_rows) of the
// vocabulary, other tokens write zero (forward, wpe null: the positions are a position_add after
// the tensor-parallel sum) and add nothing (backward, which still accumulates dwpe when given).
// scale > 0: the token embedding times scale, rounded to the storage type first (Gemma's
// normalizer √hidden, `torch.tensor(hidden_size**0.5, dtype=hidden_states.dtype)`); backward
// accumulates scale · dout.
struct embedding_fwd {
  operand out, tok, wte, wpe;
  std::uint32_t B, S, C;
  std::uint32_t vocab_begin = 0, vocab_rows = 0, pos0 = 0;
  float scale = 0;
};
struct embedding_bwd {
  operand dwte, dwpe, dout, tok;
  std::uint32_t B, S, C;
  std::uint32_t vocab_begin = 0, vocab_rows = 0;
  float scale = 0;
};
// x[N, C] += wpe[(row0 + n) % S]: the replicated position embedding of N token rows that start at
// flat row row0 of the micro-batch (a sequence-parallel rank's rows).
struct position_add { operand x, wpe; std::uint64_t row0; std::uint32_t N, S, C; };
// LayerNorm over rows of C; the statistics are backend scratch, recomputed from `in` in backward
// (the plan keeps only the norm's input). Backward writes din and accumulates dw, db.
// rms: RMSNorm (no bias, no mean; its rstd is recomputed from `in` too). eps: the ε under the
// square root, the model's (memalg::norm_eps_of); a backend refuses one that is not > 0.
// w_offset (RMSNorm only): the scale is w_offset + w (1: Gemma's RMSNorm, weights starting at 0).
struct norm_fwd { operand out, in, w, b; std::uint32_t N, C; bool rms = false; double eps = 0; double w_offset = 0; };
struct norm_bwd { operand din, dw, db, dout, in, w; std::uint32_t N, C; bool rms = false; double eps = 0; double w_offset = 0; };
// out[N, OC] = in[N, IC] · wᵀ (+ bias); backward writes din, accumulates dw, dbias.
struct linear_fwd { operand out, in, w, bias; std::uint32_t N, IC, OC; };
// add_din: din += (instead of =) dout · w — an input several products read (the encoder output
// every cross-attention projects).
struct linear_bwd { operand din, dw, dbias, dout, in, w; std::uint32_t N, IC, OC; bool add_din = false; };
// probs_or_lse: naive attention's probabilities [B·H·S·S] or flash's log-sum-exp [B·H·S] (A).
// Flash backward reads the saved output `out`; naive takes none.
struct attention_fwd { operand out, probs_or_lse, qkv; attn_shape sh; };
struct attention_bwd { operand dqkv, dout, qkv, out, probs_or_lse; attn_shape sh; };
// Rotary positions (RoPE) in place on the Q and K heads of a fused qkv [B·S, (H + 2Hkv)·D]
// (position pos0 + n % S, the first rot_dim dimensions of each head); backward rotates dQ, dK back.
// pos0: the position of each sequence's first row (0 in training; a generation step's offset).
struct rotary_fwd { operand qkv; attn_shape sh; std::uint32_t rot_dim; float theta; std::uint32_t pos0 = 0; };
struct rotary_bwd { operand dqkv; attn_shape sh; std::uint32_t rot_dim; float theta; };
// Per-head RMSNorm of the query and key heads of a fused qkv [B·S, (H + 2Hkv)·D], in place (Qwen3's
// q_norm and k_norm: one weight [D] for the query heads, one for the key heads, ε eps): forward
// copies the heads as they were into pre [B·S, (H + Hkv)·D] (what backward reads), backward
// runs in place on dqkv's query and key heads and accumulates dwq, dwk (backend/cpu/qk_norm.hpp).
// A null pre keeps nothing (a generation program's forward, which no backward follows).
struct qk_norm_fwd { operand qkv, pre, wq, wk; attn_shape sh; double eps = 0; };
struct qk_norm_bwd { operand dqkv, dwq, dwk, pre, wq, wk; attn_shape sh; double eps = 0; };
// gelu: elementwise. swiglu: in [N, 2F] = [gate ‖ up] → out [N, F]; its backward writes din
// [N, 2F] and may run in place over a dout [N, F] that is din's first N·F elements.
// relu, tanh: elementwise, and their backward reads the forward's output y (f'(x) from y: y > 0,
// 1 − y²) in `in`, so they run in place and keep only their output.
// geglu: as swiglu with GeLU's tanh form on the gate (Gemma's gelu_pytorch_tanh): out = gelu(gate)·up.
enum class activation_kind : std::uint8_t { gelu, swiglu, relu, tanh, geglu };
struct activation_fwd { operand out, in; activation_kind k = activation_kind::gelu; std::uint32_t N = 0, F = 0; };
struct activation_bwd { operand din, dout, in; activation_kind k = activation_kind::gelu; std::uint32_t N = 0, F = 0; };
// Per sequence b of `rows`: mask and out over row_len elements; the seed comes from the step,
// micro-batch, dp rank, site and sequence (program::seed), so masks agree on every split and
// in recomputation.
// offset: out[0] is element `offset` of the rows × row_len (a sequence-parallel rank's part; the
// operands then hold fewer than rows × row_len elements), so each element keeps its one-rank mask.
struct dropout_fwd { operand out, mask, in; std::uint32_t rows, row_len; float p; std::uint32_t site; std::uint64_t offset = 0; };
struct dropout_bwd { operand din, dout, mask; float p; };
// ---- the speech model (encoder–decoder; exec/speech/build_program.hpp) ----
// Attention with a key mask over separate queries and keys/values: the decoder's cross-attention
// (q [B·Sq, H·D] from the decoder, kv [B·Sk, 2·Hkv·D] = [k ‖ v] per row from the encoder output),
// and with `fused` the encoder's bidirectional self-attention over padded phonemes (q and kv both
// name one qkv [B·S, (H + 2Hkv)·D], dq and dkv one dqkv, Sq == Sk). key_mask: u8 [B·Sk] (where::masks;
// null: every key real). probs_or_lse as attention_fwd's ([B·H·Sq·Sk] naive, [B·H·Sq] (A) flash).
struct xattn_shape {
  std::uint32_t B = 0, Sq = 0, Sk = 0, H = 0, Hkv = 0, D = 0;
  bool causal = false, flash = true, fused = false;
  friend constexpr bool operator==(const xattn_shape&, const xattn_shape&) = default;
};
struct masked_attention_fwd { operand out, probs_or_lse, q, kv, key_mask; xattn_shape sh; };
struct masked_attention_bwd { operand dq, dkv, dout, q, kv, out, probs_or_lse, key_mask; xattn_shape sh; };
// nn.Conv1d(IC, OC, K, padding="same") over each sequence of S rows, token-major in[B·S, IC],
// out[B·S, OC], w [OC, IC, K] (backend/cpu/conv1d.hpp); backward writes din (when not null) and
// accumulates dw, dbias.
struct conv1d_fwd { operand out, in, w, bias; std::uint32_t B, S, IC, OC, K; };
struct conv1d_bwd { operand din, dw, dbias, dout, in, w; std::uint32_t B, S, IC, OC, K; };
// BatchNorm1d in training mode over the real rows of in[N, C] (mask u8 [N], where::masks; null:
// all real; backend/cpu/batchnorm.hpp): out = m·(γ·x̂ + β), padded rows 0. The statistics are
// backend scratch, recomputed from `in` in backward (as norm_fwd's). Backward writes din (may
// alias dout) and accumulates dgamma, dbeta.
struct batchnorm_fwd { operand out, in, gamma, beta, mask; std::uint32_t N, C; };
struct batchnorm_bwd { operand din, dgamma, dbeta, dout, in, gamma, mask; std::uint32_t N, C; };
// out[b, t] = src[b, t − shift] for t ≥ shift, 0 before (teacher forcing: the decoder reads the
// previous target frame, a zero "go" frame first); src is fp32 [B·S, M] (where::features), out
// in the storage type.
struct frames_in { operand out, src; std::uint32_t B, S, M, shift; };
// Masked mel regression loss of pred [N, M] (row stride ld ≥ M) against fp32 target [N, M]
// (where::features), mask u8 [N]: Σ m_n·ℓ(pred − target) / divisor is added to `acc` and the
// gradient dloss · ∂ℓ · m_n / divisor written to grad [N, M] (contiguous; may alias pred when ld
// == M), dloss = loss scale / grad_accum. ℓ = |·| (l1) or (·)² (mse). A fixed divisor (the padded
// micro-batch's B·S·M, not its real count) makes grad_accum micro-batches the same sum as one
// micro-batch of all of them.
struct mel_loss { operand pred, target, mask, grad; std::uint32_t N, M, ld, grad_accum; bool l1 = true; float divisor = 1;
                  std::uint64_t acc = scalars::loss_sum; };
// Stop-token BCE with logits: x_n = logits[n·ld], y_n fp32 targets [N] (where::features):
// Σ ℓ(x, y) / divisor added to `acc` (every frame, padded ones with target 1, as Tacotron 2's
// gate loss), gradient dloss·(σ(x) − y)/divisor written to grad[n·ld].
struct stop_loss { operand logits, targets, grad; std::uint32_t N, ld, grad_accum; float divisor = 1;
                   std::uint64_t acc = scalars::loss_sum; };
// x[N, C] *= mask[n] (u8 [N], where::masks): padded rows to zero.
struct mask_rows { operand x, mask; std::uint32_t N, C; };
struct residual_add { operand out, a, b; };  ///< out = a + b, rounded once (out may alias a)
struct bias_add { operand x, bias; std::uint32_t N, C; };  ///< x[N, C] += bias[C]
// Cross-entropy of N rows: Σ loss / rows_total accumulates into `acc`; the logits become their
// gradient in place with dloss = loss scale / (grad_accum · rows_total). rows_total = 0 means N;
// a chunked loss runs one op per chunk of the micro-batch's rows_total rows. softcap > 0: the
// logits are softcap·tanh(logit / softcap) first (Gemma 2's final_logit_softcapping), and their
// gradient is carried back through it.
struct loss {
  operand logits, targets;
  std::uint32_t N, V, grad_accum;
  std::uint64_t acc = scalars::loss_sum;
  std::uint32_t rows_total = 0;
  float softcap = 0;
};
// Vocabulary-parallel cross-entropy (Megatron-LM's vocab_parallel_cross_entropy): logits [N, V]
// are columns [vocab_begin, vocab_begin + V) of a vocabulary of `vocab`; the backend all-reduces
// the row max, Σexp and the target logit over group g, then as `loss`.
struct vocab_parallel_loss {
  operand logits, targets;
  std::uint32_t N, V, vocab_begin, vocab, grad_accum;
  std::uint64_t acc = scalars::loss_sum;
  group g = group::tp;
};
struct loss_mean { std::uint32_t grad_accum; };  ///< scalars::loss = float(loss_sum / grad_accum)
struct scalar_div { std::uint64_t slot; float by; };  ///< slot /= by
struct zero { operand t; };
struct copy { operand dst, src; };  ///< may overlap (memmove)
// Σ g² of one owned segment into scalars::sumsq (only if `counted`: TP-replicated ranges count on
// TP rank 0 only), non-finite values into scalars::nonfinite always. Segments run in order.
struct sqnorm { operand g; bool counted = true; };
struct norm_parts {};  ///< scalars::parts = {float(sumsq), nonfinite ? 1 : 0}
// norm = √parts[0] / (loss scale · dp); with loss scaling the scaler sees the overflow flag and may
// skip the step; grad_scale = clip(norm, max_norm) / (loss scale · dp); counts an update.
struct clip_scale { float max_norm; std::uint32_t dp; bool loss_scaling; };
// One run of equal weight decay, fused: sgd / momentum (s1) / adam(w) (s1, s2) by program::hp.
struct optimizer_update { operand param, master, s1, s2, grad; float weight_decay; };
// Collectives; counts are the operands'. reduce_scatter: send holds size·recv.count elements, the
// reduced block `rank` lands in recv (which may be send's own block). all_gather: send is this
// rank's block (which may lie inside recv).
struct all_reduce { operand buf; group g; reduce_op op = reduce_op::sum; };
struct reduce_scatter { operand send, recv; group g; };
struct all_gather { operand send, recv; group g; };
// Point-to-point on group::pp: `peer` is the stage (rank of the pipeline group) sent to or
// received from; a receive takes exactly buf.count elements.
struct send { operand buf; std::uint32_t peer; };
struct recv { operand buf; std::uint32_t peer; };
// ---- generation (exec/gpt/build_generation.hpp) ----
// A layer's key/value cache is kv [B, L, 2·Hkv·D]: per sequence and position, the Hkv key heads
// then the Hkv value heads (L positions per sequence). kv_append writes the key and value heads of
// the q = sh.S new tokens of each of sh.B sequences (qkv [B·q, (H + 2Hkv)·D], after the rotary
// positions) at positions [pos0, pos0 + q) of their sequences.
struct kv_append { operand kv, qkv; attn_shape sh; std::uint32_t pos0, L; };
// Causal attention of the q = sh.S new tokens of each sequence (the query heads of qkv, at
// positions pos0 … pos0 + q − 1) over the cache: query i reads positions 0 … pos0 + i of its
// sequence. out [B·q, H·D]; nothing is kept for a backward.
struct cached_attention_fwd { operand out, qkv, kv; attn_shape sh; std::uint32_t pos0, L; };
// Greedy sampling: out[n] = the smallest index of the largest logit of row n of logits [N, V]
// (torch.argmax's choice); out is i32 ids (where::generated).
struct argmax { operand out, logits; std::uint32_t N, V; };
}  // namespace ops

using op_body =
    std::variant<ops::embedding_fwd, ops::embedding_bwd, ops::norm_fwd, ops::norm_bwd, ops::linear_fwd, ops::linear_bwd,
                 ops::attention_fwd, ops::attention_bwd, ops::rotary_fwd, ops::rotary_bwd, ops::qk_norm_fwd, ops::qk_norm_bwd, ops::activation_fwd, ops::activation_bwd, ops::dropout_fwd,
                 ops::dropout_bwd, ops::residual_add, ops::bias_add, ops::loss, ops::loss_mean, ops::scalar_div,
                 ops::zero, ops::copy, ops::sqnorm, ops::norm_parts, ops::clip_scale, ops::optimizer_update,
                 ops::all_reduce, ops::reduce_scatter, ops::all_gather, ops::send, ops::recv,
                 ops::position_add, ops::vocab_parallel_loss, ops::masked_attention_fwd, ops::masked_attention_bwd,
                 ops::conv1d_fwd, ops::conv1d_bwd, ops::batchnorm_fwd, ops::batchnorm_bwd, ops::frames_in,
                 ops::mel_loss, ops::stop_loss, ops::mask_rows, ops::kv_append, ops::cached_attention_fwd,
                 ops::argmax>;

// ---- what each op does with its arena operands -------------------------------------------------
/// How an op uses an operand: reads it, overwrites it without reading it first, or reads and
/// rewrites it (accumulation, in-place rotation, the loss turning its logits into their gradient).
/// The interpreter's live-bytes meter (exec/meter.hpp) counts from these declarations, and the
/// CPU backend holds its kernels to them (backend/cpu/step_backend.hpp).
enum class access : std::uint8_t { read, write, update };

struct operand_access {
  operand t;
  access a = access::read;
};

/// An op's operands with their access, null operands left out. Operands outside the arena (ids,
/// features, masks, scalar slots) may be listed; only arena operands are metered and checked.
class access_list {
 public:
  static constexpr std::size_t max = 8;
  constexpr access_list() = default;
  constexpr access_list(std::initializer_list<operand_access> l) {
    for (const operand_access& x : l)
      if (!x.t.null()) at_[size_++] = x;
  }
  constexpr std::size_t size() const { return size_; }
  constexpr const operand_access* begin() const { return at_.data(); }
  constexpr const operand_access* end() const { return at_.data() + size_; }
  constexpr const operand_access& operator[](std::size_t i) const { return at_[i]; }

 private:
  std::array<operand_access, max> at_{};
  std::size_t size_ = 0;
};

namespace ops {  // one declaration per op, as its kernels use the operands (the CPU backend checks)
inline constexpr access R = access::read, W = access::write, U = access::update;
inline constexpr operand_access none{};  ///< an operand the op's other fields say it does not use

constexpr access_list accesses(const embedding_fwd& o) { return {{o.out, W}, {o.tok, R}, {o.wte, R}, {o.wpe, R}}; }
constexpr access_list accesses(const embedding_bwd& o) { return {{o.dwte, U}, {o.dwpe, U}, {o.dout, R}, {o.tok, R}}; }
constexpr access_list accesses(const position_add& o) { return {{o.x, U}, {o.wpe, R}}; }
constexpr access_list accesses(const norm_fwd& o) {  // RMSNorm has no shift
  return {{o.out, W}, {o.in, R}, {o.w, R}, o.rms ? none : operand_access{o.b, R}};
}
constexpr access_list accesses(const norm_bwd& o) {
  return {{o.din, W}, {o.dw, U}, o.rms ? none : operand_access{o.db, U}, {o.dout, R}, {o.in, R}, {o.w, R}};
}
constexpr access_list accesses(const linear_fwd& o) { return {{o.out, W}, {o.in, R}, {o.w, R}, {o.bias, R}}; }
constexpr access_list accesses(const linear_bwd& o) {
  return {{o.din, o.add_din ? U : W}, {o.dw, U}, {o.dbias, U}, {o.dout, R}, {o.in, R}, {o.w, R}};
}
constexpr access_list accesses(const attention_fwd& o) { return {{o.out, W}, {o.probs_or_lse, W}, {o.qkv, R}}; }
constexpr access_list accesses(const attention_bwd& o) {  // naive backward needs no output
  return {{o.dqkv, W}, {o.dout, R}, {o.qkv, R}, o.sh.flash ? operand_access{o.out, R} : none, {o.probs_or_lse, R}};
}
constexpr access_list accesses(const rotary_fwd& o) { return {{o.qkv, U}}; }
constexpr access_list accesses(const rotary_bwd& o) { return {{o.dqkv, U}}; }
constexpr access_list accesses(const qk_norm_fwd& o) { return {{o.qkv, U}, {o.pre, W}, {o.wq, R}, {o.wk, R}}; }
constexpr access_list accesses(const qk_norm_bwd& o) {
  return {{o.dqkv, U}, {o.dwq, U}, {o.dwk, U}, {o.pre, R}, {o.wq, R}, {o.wk, R}};
}
constexpr access_list accesses(const activation_fwd& o) { return {{o.out, W}, {o.in, R}}; }
constexpr access_list accesses(const activation_bwd& o) { return {{o.din, W}, {o.dout, R}, {o.in, R}}; }
constexpr access_list accesses(const dropout_fwd& o) { return {{o.out, W}, {o.mask, W}, {o.in, R}}; }
constexpr access_list accesses(const dropout_bwd& o) { return {{o.din, W}, {o.dout, R}, {o.mask, R}}; }
constexpr access_list accesses(const masked_attention_fwd& o) {  // fused: q and kv name one qkv
  return {{o.out, W}, {o.probs_or_lse, W}, {o.q, R}, o.sh.fused ? none : operand_access{o.kv, R}, {o.key_mask, R}};
}
constexpr access_list accesses(const masked_attention_bwd& o) {  // fused: dq and dkv name one dqkv
  return {{o.dq, W}, o.sh.fused ? none : operand_access{o.dkv, W}, {o.dout, R}, {o.q, R},
          o.sh.fused ? none : operand_access{o.kv, R}, o.sh.flash ? operand_access{o.out, R} : none,
          {o.probs_or_lse, R}, {o.key_mask, R}};
}
constexpr access_list accesses(const conv1d_fwd& o) { return {{o.out, W}, {o.in, R}, {o.w, R}, {o.bias, R}}; }
constexpr access_list accesses(const conv1d_bwd& o) {
  return {{o.din, W}, {o.dw, U}, {o.dbias, U}, {o.dout, R}, {o.in, R}, {o.w, R}};
}
constexpr access_list accesses(const batchnorm_fwd& o) {
  return {{o.out, W}, {o.in, R}, {o.gamma, R}, {o.beta, R}, {o.mask, R}};
}
constexpr access_list accesses(const batchnorm_bwd& o) {
  return {{o.din, W}, {o.dgamma, U}, {o.dbeta, U}, {o.dout, R}, {o.in, R}, {o.gamma, R}, {o.mask, R}};
}
constexpr access_list accesses(const frames_in& o) { return {{o.out, W}, {o.src, R}}; }
constexpr access_list accesses(const mel_loss& o) { return {{o.pred, R}, {o.target, R}, {o.mask, R}, {o.grad, W}}; }
constexpr access_list accesses(const stop_loss& o) { return {{o.logits, R}, {o.targets, R}, {o.grad, W}}; }
constexpr access_list accesses(const mask_rows& o) { return {{o.x, U}, {o.mask, R}}; }
constexpr access_list accesses(const residual_add& o) { return {{o.out, W}, {o.a, R}, {o.b, R}}; }
constexpr access_list accesses(const bias_add& o) { return {{o.x, U}, {o.bias, R}}; }
constexpr access_list accesses(const loss& o) { return {{o.logits, U}, {o.targets, R}}; }
constexpr access_list accesses(const vocab_parallel_loss& o) { return {{o.logits, U}, {o.targets, R}}; }
constexpr access_list accesses(const loss_mean&) { return {}; }
constexpr access_list accesses(const scalar_div&) { return {}; }
constexpr access_list accesses(const zero& o) { return {{o.t, W}}; }
constexpr access_list accesses(const copy& o) { return {{o.dst, W}, {o.src, R}}; }
constexpr access_list accesses(const sqnorm& o) { return {{o.g, R}}; }
constexpr access_list accesses(const norm_parts&) { return {}; }
constexpr access_list accesses(const clip_scale&) { return {}; }
// The states the optimizer has (program::hp.optimizer): the builder leaves the others null.
constexpr access_list accesses(const optimizer_update& o) {
  return {{o.param, U}, {o.master, U}, {o.s1, U}, {o.s2, U}, {o.grad, R}};
}
constexpr access_list accesses(const all_reduce& o) { return {{o.buf, U}}; }
constexpr access_list accesses(const reduce_scatter& o) { return {{o.send, U}, {o.recv, W}}; }
constexpr access_list accesses(const all_gather& o) { return {{o.send, R}, {o.recv, W}}; }
constexpr access_list accesses(const send& o) { return {{o.buf, R}}; }
constexpr access_list accesses(const recv& o) { return {{o.buf, W}}; }
// The cache keeps what earlier steps wrote: an append rewrites part of it (update).
constexpr access_list accesses(const kv_append& o) { return {{o.kv, U}, {o.qkv, R}}; }
constexpr access_list accesses(const cached_attention_fwd& o) { return {{o.out, W}, {o.qkv, R}, {o.kv, R}}; }
constexpr access_list accesses(const argmax& o) { return {{o.out, W}, {o.logits, R}}; }
}  // namespace ops

/// Whether op type O declares its operands' accesses (ops::accesses).
template <class O>
concept declares_accesses = requires(const O& o) {
  { accesses(o) } -> std::same_as<access_list>;
};

namespace detail {
template <class V>
struct all_declare_accesses : std::false_type {};
template <class... O>
struct all_declare_accesses<std::variant<O...>> : std::bool_constant<(declares_accesses<O> && ...)> {};
}  // namespace detail

static_assert(detail::all_declare_accesses<op_body>::value,
              "exec::op_body: every op declares what it does with its operands (an ops::accesses overload)");

/// The accesses of whichever op `b` holds.
constexpr access_list accesses_of(const op_body& b) {
  return std::visit([](const auto& x) { return accesses(x); }, b);
}

struct op {
  op_body body;
  when cond = when::always;
};

using arena_event = arena_layout::event;

/// A persistent tensor: weights, gradients, master weights, optimizer states.
struct persistent_tensor {
  std::string name;
  operand t;
  category cat;
};

/// How one block of a unit's logical buffer (this rank's, before ZeRO sharding) starts: element
/// at + r·cols + c (r < rows, c < cols) is `constant`, or N(0, stddev²) drawn for logical index
/// (row0 + r)·row_stride + col0 + c of random tensor `rng_tensor` under program::hp.seed
/// (backend/cpu/pointwise.hpp:init_normal) — so tensor-parallel ranks take their rows or columns
/// of one logical matrix. Elements no block names start at zero.
struct param_init {
  enum class kind : std::uint8_t { constant, normal };
  kind k = kind::constant;
  std::uint64_t at = 0, rows = 1, cols = 0;
  std::uint64_t rng_tensor = 0, row0 = 0, col0 = 0, row_stride = 0;
  float stddev = 0, constant = 0;
};

/// A parameter unit (token embedding, position embedding, one block, the final norm): its
/// persistent tensors and how its weights start. The weights are the logical values rounded to the
/// storage type; the master copy is that rounding read back in the accumulation type; gradients and
/// optimizer states start at zero.
struct param_unit {
  std::string name;
  std::uint64_t elements = 0, shard = 0;  ///< logical elements on this rank; elements / dp
  operand weight, grad, master, state1, state2;
  std::uint64_t weight_begin = 0, master_begin = 0;  ///< logical index of weight[0] and master[0]
  std::vector<param_init> init;
};

/// `c` (a gpt_config, a speech_config: a runtime configuration) with the hyper-parameters `h`
/// (what the builders copy into program::hp).
template <class Config>
  requires requires(Config c) { c.lr = c.weight_decay = c.beta1 = c.beta2 = c.eps = c.momentum = c.max_grad_norm = 0.0f; }
constexpr Config with_hparams(Config c, const optimizer_hparams& h) {
  std::tie(c.lr, c.weight_decay, c.beta1, c.beta2, c.eps, c.momentum, c.max_grad_norm) =
      std::tie(h.lr, h.weight_decay, h.beta1, h.beta2, h.eps, h.momentum, h.max_grad_norm);
  return c;
}

/// Optimizer states with one element per parameter, as the planner counts them
/// (train/optimizer.hpp's descriptors: optimizer_desc::full_states).
constexpr std::uint32_t full_states_of(optimizer_kind k) {
  switch (k) {
    case optimizer_kind::sgd: return optim::sgd<>::value.full_states;
    case optimizer_kind::momentum: return optim::momentum<>::value.full_states;
    case optimizer_kind::adam: return optim::adam<>::value.full_states;
    case optimizer_kind::adamw: return optim::adamw<>::value.full_states;
    case optimizer_kind::adam8bit: return optim::adam8bit<>::value.full_states;
    case optimizer_kind::adafactor: return optim::adafactor<>::value.full_states;
    case optimizer_kind::lion: return optim::lion<>::value.full_states;
  }
  return 0;
}

/// The optimizers the runtime implements (its builders refuse the others).
constexpr bool runtime_optimizer(optimizer_kind k) {
  return k == optimizer_kind::sgd || k == optimizer_kind::momentum || k == optimizer_kind::adam ||
         k == optimizer_kind::adamw;
}

/// The program's copy of the run's hyper-parameters (build_program fills it from gpt_config):
/// the optimizer the plan names, optimizer_hparams' values, the dropout rate and the seed.
struct hparams {
  optimizer_kind optimizer = optimizer_kind::adamw;
  float lr = 0, weight_decay = 0, momentum = 0, beta1 = 0, beta2 = 0, eps = 0, max_grad_norm = 0, dropout = 0;
  std::uint64_t seed = 0;
};

/// One entry of a pipeline schedule: the forward or the backward of micro-batch `micro`.
struct pipeline_step {
  bool forward = true;
  std::uint32_t micro = 0;
  friend constexpr bool operator==(const pipeline_step&, const pipeline_step&) = default;
};

/// A pipeline stage's section: one schedule entry and its ops.
struct pipeline_section {
  pipeline_step step;
  std::vector<op> ops;
};

/// 1F1B on stage `stage` of `stages` with `m` micro-batches: min(stages − stage − 1, m) warm-up
/// forwards, then alternately one forward and one backward, then the remaining backwards
/// (Megatron-LM, schedules.py: forward_backward_pipelining_without_interleaving).
inline std::vector<pipeline_step> one_f_one_b(std::size_t stages, std::size_t stage, std::size_t m) {
  const std::size_t ahead = stages - stage - 1, warmup = ahead < m ? ahead : m;
  std::vector<pipeline_step> out;
  std::uint32_t f = 0, b = 0;
  for (std::size_t i = 0; i < warmup; ++i) out.push_back({true, f++});
  for (std::size_t i = warmup; i < m; ++i) {
    out.push_back({true, f++});
    out.push_back({false, b++});
  }
  while (b < m) out.push_back({false, b++});
  return out;
}

struct program {
  elem storage = elem::f32, accum = elem::f32;  ///< T and accum_t<T>
  arena_sizes sizes;                             ///< the capacities it was laid out in (the plan's)
  std::size_t persistent_bytes = 0;              ///< the persistent region used
  std::size_t high_water = 0;                    ///< persistent + the stacks' peak
  breakdown peak_by_category{};
  std::string peak_tensor;
  /// Every persistent tensor in allocation order (weights of all units, then gradients, master
  /// weights, optimizer states) and the checkpoint's sections in its order (per unit: weights,
  /// master, state1, state2; the backend appends loss_scaler and counters).
  std::vector<persistent_tensor> persistent, checkpoint;
  std::vector<param_unit> units;  ///< in unit order (wte, wpe, blocks, lnf), with their initialisation
  std::vector<op> step_begin, micro, step_end;
  /// pp > 1: this stage's sections in schedule order (micro is then empty).
  std::vector<pipeline_section> pipeline;
  std::size_t stash_slots = 0, stash_slot_bytes = 0;  ///< pp > 1: the stash's micro-batch slots
  std::vector<arena_event> trace;  ///< construction's persistent tensors, then one whole step
  std::size_t grad_accum = 1, micro_batch = 0, sequence = 0;
  std::size_t tokens_per_micro = 0;  ///< token ids each micro-batch reads
  std::size_t targets_per_micro = 0;   ///< target ids each micro-batch reads (the tokens' count for a GPT, 0 for speech)
  std::size_t features_per_micro = 0;  ///< fp32 features each micro-batch reads (where::features)
  std::size_t masks_per_micro = 0;     ///< u8 mask entries each micro-batch reads (where::masks)
  std::size_t generated_per_micro = 0; ///< token ids a generation program writes and reads (where::generated)
  std::size_t dp = 1, tp = 1, dp_rank = 0, tp_rank = 0;
  std::size_t pp = 1, pp_rank = 0;  ///< pipeline stages and this rank's stage
  bool loss_scaling = false;  ///< dynamic loss scaling (fp16): dloss and the norm carry the scale
  hparams hp;

  std::size_t op_count() const {
    std::size_t n = step_begin.size() + micro.size() + step_end.size();
    for (const pipeline_section& s : pipeline) n += s.ops.size();
    return n;
  }
};

}  // namespace memalg::exec

// SPDX-License-Identifier: BSL-1.0
// memalg/plan/stacks/pytorch.hpp — the `pytorch` stack: PyTorch's autograd under Hugging Face's
// modelling code (docs/algebra.md, "The pytorch stack"; checked against bench/torch/measured.json).
// Its rules for the tensors each layer saves and the transients of its loss, for the whole model's
// shared tensors, for FSDP2's gathered parameters and for torch.optim's step. (Its gradients,
// which exist only from backward on, are placed moment by moment in activations_on_stage,
// plan/activations.hpp, and stage_timeline, plan/timeline.hpp.)
#pragma once

#include <algorithm>
#include <cstdint>

#include "memalg/model/compose.hpp"
#include "memalg/model/layers.hpp"
#include "memalg/plan/model_states.hpp"
#include "memalg/plan/stacks/common.hpp"

namespace memalg {
namespace detail {

/// The `pytorch` stack: the tensors PyTorch's autograd saves for Hugging Face's modelling code,
/// and the transients of its loss (docs/algebra.md, "The pytorch stack", with the autograd
/// formula or modelling file of every term; checked against bench/torch/measured.json). Bytes:
/// `em` the activation dtype (matrix-product outputs, attention, MLP inner tensors), `en` the
/// residual stream and norms (the weight dtype under autocast, else `em`), RMSNorm's input copy
/// fp32 (HF's RMSNorm upcasts), per-token statistics and the log-sum-exp fp32. Kinds other than
/// the embeddings, norms, dropout, transformer blocks and the output follow the paper accounting
/// (`handled` false).
struct torch_bytes {
  std::uint64_t em = 4, en = 4;
  std::uint64_t mask = 1;  ///< a dropout mask's bytes per element: CUDA's bool, the CPU's noise in the input dtype
  bool autocast = false;
};
constexpr torch_bytes torch_bytes_of(const activation_context& c) {
  torch_bytes t{};
  t.em = bytes_per_element_ceil(c.act);
  t.autocast = c.autocast();
  t.en = t.autocast ? bytes_per_element_ceil(c.weights) : t.em;
  t.mask = c.cpu ? t.en : 1;
  return t;
}

/// Saved bytes of one norm beyond its input: RMSNorm keeps its rsqrt (fp32 per token) and
/// x·rstd and w·(x·rstd) (under autocast only x·rstd, fp32; the products' inputs are cast
/// copies); LayerNorm keeps mean and rstd per token and its output (under autocast only the
/// statistics, fp32). `consumers`: projections reading the output, each keeping a cast copy under
/// autocast. `fp32_product`: the RMSNorm multiplies by its weight in fp32 and casts after
/// (layer_flags::rms_weight_fp32: Gemma's `output * (1.0 + self.weight.float())`), so x·rstd is
/// kept fp32 in every precision.
constexpr bytes torch_norm(const act_terms& a, const torch_bytes& t, bool rms, std::uint64_t hidden,
                           std::uint64_t consumers, bool fp32_product = false) {
  const std::uint64_t H = checked_mul(a.tokens, hidden);
  bytes r{};
  if (rms) {
    r += bytes{checked_mul(a.tokens, 4)};
    r += t.autocast ? bytes{checked_mul(H, 4)} : bytes{checked_mul(H, (fp32_product ? 4 : t.em) + t.em)};
  } else {
    r += bytes{checked_mul(a.tokens, 2 * (t.autocast ? 4 : t.em))};
    if (!t.autocast) r += bytes{checked_mul(H, t.en)};
  }
  if (t.autocast) r += bytes{checked_mul(checked_mul(H, consumers), t.em)};
  return a.rep(r);
}

/// The residual-stream tensor a norm reads, as kept: fp32 for RMSNorm (its upcast copy), else the
/// stream's own dtype.
constexpr std::uint64_t torch_residual_bytes(const torch_bytes& t, bool rms) { return rms ? 4 : t.en; }

/// Attention of a block under the pytorch stack: saved bytes, forward and backward transients.
constexpr attention_bytes torch_attention(const act_terms& a, const torch_bytes& t, const layer_shape& s,
                                          std::uint64_t kv_seq, bool frozen = false) {
  attention_bytes r{};
  const std::uint64_t b = a.c.micro_batch, T = a.tokens, em = t.em;
  const std::uint64_t q = checked_mul(s.heads, s.head_dim), kv = checked_mul(s.kv_heads, s.head_dim);
  const std::uint64_t Q = checked_mul(T, q), K = checked_mul(checked_mul(b, ceil_div(kv_seq, a.c.cp)), kv);
  const std::uint64_t S = checked_mul(checked_mul(b, s.heads), checked_mul(ceil_div(a.seq, a.c.cp), kv_seq));
  const bool drop = attention_dropout_permille(s) != 0;
  const bool rotary = (s.flags & layer_flags::rotary) != 0, fused = (s.flags & layer_flags::fused_qkv) != 0;
  // Multi-head latent attention (DeepseekV3Attention, modeling_deepseek_v3.py): the query and the
  // key are a·(dn + dr) wide (Q and K above), the value and the output a·dv (V). The CPU's fused
  // SDPA kernel needs one head width for q, k and v, so with dv ≠ dn + dr SDPA takes its math path
  // there (measured: dsv3, whose SDPA step keeps the same probabilities as its eager one).
  const bool mla = s.kv_lora_rank != 0;
  const std::uint64_t dv = mla && s.v_head_dim != 0 ? s.v_head_dim : s.head_dim;
  const std::uint64_t V = mla ? checked_mul(T, checked_mul(s.heads, dv)) : Q;
  // Eager attention, SDPA's math path (taken with dropout on the CPU, and by Falcon-7B's layout):
  // the fp32 softmax (and its cast when narrower), the query, the expanded key and value (repeat_kv)
  // and the output's contiguous copy for the out-projection; with dropout its mask and output.
  // On CUDA, SDPA's fused kernels apply dropout inside (saving their RNG offsets only).
  const bool unfused = (s.flags & layer_flags::flash) == 0 || (s.flags & layer_flags::unfused_attention) != 0 ||
                       (drop && a.c.cpu) || (mla && a.c.cpu && dv != s.head_dim);
  if (unfused) {
    // The softmax's output, in fp32 (Llama, Mistral, Qwen2, Mixtral, GPT-NeoX:
    // `softmax(..., dtype=torch.float32).to(query.dtype)`), in the scores' dtype (GPT-2's
    // `softmax(attn_weights)`) or in the residual stream's (Falcon's `dtype=hidden_states.dtype`),
    // and its cast to the product's dtype when they differ (the `.to`, or autocast's cast for
    // the product with V); SDPA's math path as the fp32 case. Each is saved: the softmax's
    // backward reads its output, the product its input.
    const bool eager = (s.flags & layer_flags::flash) == 0;
    // SDPA's math path computes in fp32 whatever the inputs' dtype: it casts a half or bfloat16
    // query, key and value up before anything it saves and casts only its output back
    // (aten/src/ATen/native/transformers/attention.cpp, `_scaled_dot_product_attention_math`,
    // "Keep query, key, value in high precision for accuracy"; `allow_fp16_bf16_reduction_math_sdp`
    // is off by default). Measured: pw1-129-llama (bf16), whose probabilities, dropout tensors and
    // the three inputs it keeps are fp32. `ce`: the element size of what the core keeps.
    const std::uint64_t ce = eager ? em : (em > 4 ? em : 4);
    // (gpt-oss's sinks, a parameter, promote the concatenated logits to the weights' dtype: fp32
    // under autocast, where the scores are bf16; measured: gptoss-autocast)
    const std::uint64_t sm = !eager                                             ? ce
                             : s.attention_sinks                                 ? (em > t.en ? em : t.en)
                             : (s.flags & layer_flags::softmax_scores_dtype) != 0 ? em
                             : (s.flags & layer_flags::softmax_stream_dtype) != 0 ? t.en
                                                                                  : 4;
    bytes saved{checked_mul(S, sm)};
    if (ce != sm) saved += bytes{checked_mul(S, ce)};
    // Attention sinks (gpt-oss's eager attention, modeling_gpt_oss.py: `torch.cat([attn_weights,
    // sinks])`, less its row maximum, softmax, `probs[..., :-1]`): the probabilities the softmax
    // and the product with V keep have one column more per row (the product reads a view of
    // them), and the maximum's backward keeps its int64 indices, one per row.
    const std::uint64_t rows = checked_mul(checked_mul(b, s.heads), ceil_div(a.seq, a.c.cp));
    if (eager && s.attention_sinks) saved += bytes{checked_mul(rows, sm + 8)};
    // Soft-capped scores (Gemma 2's attn_logit_softcapping, eager only: `tanh(s / c) · c`,
    // modeling_gemma2.py eager_attention_forward): tanh keeps its output for its backward
    // (derivatives.yaml, `tanh_backward(grad, result)`), in the scores' dtype; the divisions and
    // products by the Python scalars keep nothing.
    const bool capped = eager && (s.flags & layer_flags::softcap) != 0;
    if (capped) saved += bytes{checked_mul(S, em)};
    // The dropout on the probabilities (in their dtype, ce): its mask (CUDA's bool; on the CPU
    // aten/src/ATen/native/Dropout.cpp `_dropout` multiplies by a noise tensor `empty_like` the
    // input) and its output, which the product with V saves.
    const bytes dropout{drop ? checked_mul(S, (a.c.cpu ? ce : 1) + ce) : 0};
    r.saved.core = a.split(saved + dropout);
    // Eager attention keeps the query, key and value as the products receive them, the key and
    // value expanded to all heads (repeat_kv's `expand(...).reshape(...)` copies, and so does the
    // batched product's own reshape) unless the expansion stays a view: one key and value head
    // and one sequence (measured: pw1-023-llama keeps one head of each), Q + 2K. After a fused
    // projection (GPT-NeoX's, Falcon's query_key_value) with rotary positions, V is a strided view
    // of the projection's output; at micro-batch 1 the product's reshape keeps it a view, so the
    // whole output is kept beside the rotated copies of Q and K, Q + K more (measured:
    // pw1-000-falcon); at more sequences the reshape copies V (falcon-eager, neox-eager), and
    // Falcon's multi-query layout indexes K and V out as copies.
    // SDPA's math path keeps its own copies of the three, expanded to all heads (measured:
    // pw1-012-falcon), 3Q.
    // MLA: the query (`torch.cat((q_pass, q_rot))`) and key (`expand_kv`'s `new_empty` filled by
    // copies) as the products read them, and the value, a strided view of kv_b_proj's output that
    // the product copies (eager), or the math path's copies of the three: Q + K + V either way.
    const std::uint64_t expanded = s.kv_heads == 1 && b == 1 ? K : Q;
    std::uint64_t qkv = mla ? Q + K + V : eager ? Q + 2 * expanded : checked_mul(Q, 3);
    if (eager && fused && rotary && b == 1 && s.kv_heads == s.heads) qkv += Q + K;
    r.saved.input_grad = a.split(bytes{checked_mul(qkv, ce)});
    r.saved.weight_grad = a.split(bytes{checked_mul(V, em)});               // out-projection input
    // The raw scores, masked (soft-capping makes one scores-sized tensor at a time beside what
    // is saved: its quotient, then its product, each freed as the next is made).
    r.forward_temporary = a.split(bytes{checked_mul(S, 4)});
    // With sinks the masked scores live on while the logits with their sink column are made and
    // then less their row maximum (`combined_logits - max`): the scores and two of the wider
    // tensors at once, before the probabilities (counted as saved) exist: one wider tensor more
    // (measured: gptoss-top1, whose peak is that forward moment).
    if (eager && s.attention_sinks) r.forward_temporary += a.split(bytes{checked_mul(S + rows, sm)});
    // The gradients of the probabilities and of the scores, in the softmax's dtype (S·2·sm),
    // beside the value's gradient that the product's backward makes with the first (Q·em, the
    // expanded value's). With dropout the product's backward first makes the dropped
    // probabilities' gradient (at most S·sm) while the dropout's tensors are held; each node's
    // saved tensors are released after it runs (torch/csrc/autograd/engine.cpp), so they are
    // gone by the softmax's backward.
    // The product's saved V goes with the dropout's tensors where it has a storage of its own
    // (a separate projection's, or SDPA's math-path copy; GPT-2's views the fused output that Q and
    // K view too).
    const bytes value{checked_mul(V, ce)};
    const bytes both{checked_mul(S, 2 * sm)}, first{checked_mul(S, sm)};
    const bytes gone = dropout + (!eager || mla ? value : !fused ? bytes{checked_mul(expanded, em)} : bytes{});
    r.backward_temporary = a.split(value + max_b(first, saturating_sub(both, gone)));
  } else {
    // SDPA (flash / memory-efficient): its query, key and value and output, fp32 log-sum-exp. A
    // fused projection's output is one storage that Q, K and V view; rotary positions save the
    // rotated copies of Q and K (and, when V stays a strided view, the output's contiguous copy).
    // A sliding window (or Llama 4's chunk) no longer than the keys needs a mask (no is_causal:
    // masking_utils.py, `_ignore_causal_mask_sdpa` keeps the mask when kv_length >= the local
    // size): transformers then
    // expands the key and value to all heads itself (sdpa_attention.py, use_gqa_in_sdpa is false
    // with a mask; repeat_kv's reshape copies), and the CPU's flash kernel keeps the mask turned
    // additive in the query's dtype, (b, 1, s, kv) (measured: gemma2-window).
    const bool masked = s.window != 0 && s.window <= kv_seq;
    const std::uint64_t kept_kv = masked && s.kv_heads != s.heads ? Q : K;
    std::uint64_t elems = fused ? Q + 2 * K : rotary ? kept_kv : Q + 2 * kept_kv;
    if (rotary) elems += Q + kept_kv;
    if (fused && rotary) elems += Q;
    // MLA: the query and key copies, and the value as a view of kv_b_proj's whole output,
    // a·(dn + dv) per token (not measured: the CPU takes the math path above).
    if (mla) elems = Q + K + checked_mul(T, checked_mul(s.heads, s.head_dim - s.rotary_dim + dv));
    r.saved.input_grad = a.split(bytes{checked_mul(elems, em)});
    r.saved.weight_grad = a.split(bytes{checked_mul(V, em)});                          // output
    r.core_keeps_output = true;
    r.saved.core = a.split(bytes{checked_mul(checked_mul(T, s.heads), 4)});             // log-sum-exp
    if (masked) r.saved.core += bytes{checked_mul(checked_mul(b, ceil_div(a.seq, a.c.cp)), checked_mul(kv_seq, em))};
    r.backward_temporary = a.split(bytes{checked_mul(mla ? Q + K + V : Q + 2 * kept_kv, em)});  // dQ, dK, dV
  }
  // QK-norm: an RMSNorm on the query and on the key after their projections, before the rotary
  // embedding (whose products save only cos and sin). Each keeps its fp32 input (the projection's
  // output itself in fp32, else `hidden_states.to(torch.float32)`), its rsqrt per row (fp32) and
  // the normalised input the weight's product reads: Qwen3RMSNorm's `hidden_states.to(input_dtype)`
  // in the activation dtype (em), per head (modeling_qwen3.py, q_norm and k_norm over head_dim);
  // Olmo2RMSNorm's fp32 product, cast after it, over the whole projection (modeling_olmo2.py).
  // Neither's output is saved: the rotary products and the view to heads keep nothing of it.
  {
    const std::uint64_t n = checked_mul(T, q) + checked_mul(T, kv);
    // Gemma 3's QK-norm (rms_weight_fp32: Gemma3RMSNorm) keeps the normalised input fp32.
    // (A frozen norm's weight needs no gradient: the product keeps the weight, not the
    // normalised input.)
    const std::uint64_t normed = frozen ? 0 : (s.flags & layer_flags::rms_weight_fp32) != 0 ? 4 : em;
    if ((s.flags & layer_flags::qk_norm_per_head) != 0)
      r.saved.input_grad += a.split(bytes{checked_mul(n, 4 + normed) + checked_mul(checked_mul(T, s.heads + s.kv_heads), 4)});
    else if ((s.flags & layer_flags::qk_norm_whole) != 0)
      r.saved.input_grad += a.split(bytes{checked_mul(n, frozen ? 4 : 8) + checked_mul(T, 2 * 4)});
    // Llama 4's L2 norm (Llama4TextL2Norm: `x * rsqrt(x.float().pow(2).mean(-1) + eps)`, then
    // `.type_as(x)`, no weight) on the rotated query and key keeps its fp32 input and its rsqrt
    // per head and token: in fp32 the complex rotary product itself, of which the input is a
    // view, else the upcast copy of the rotated, cast-back query and key (measured: llama4*).
    if (s.l2_qk_norm)
      r.saved.input_grad += a.split(bytes{checked_mul(n, 4) + checked_mul(checked_mul(T, s.heads + s.kv_heads), 4)});
    // Llama 4's rotary embedding (modeling_llama4.py, `apply_rotary_emb`) makes, before it
    // returns, fp32 copies of the projected query and key (none in fp32), their complex products
    // with the table and the products' casts back (none in fp32), beside the projections'
    // outputs; its products keep only the table. The NoPE layers' temperature tuning
    // (`(query_states * attn_scales).to(dtype)`) makes the fp32 product of the query and the
    // per-position scale, then its cast.
    const bool narrow = em < 4;
    if (s.complex_rotary && rotary)
      r.forward_temporary = max_b(r.forward_temporary, a.split(bytes{checked_mul(n, em + 4 + (narrow ? 4 + em : 0))}));
    // (the scale itself, one fp32 per position broadcast over the batch, is what the product
    // keeps for its backward)
    if (s.attention_temperature) {
      r.saved.input_grad += bytes{checked_mul(ceil_div(a.seq, a.c.cp), 4)};
      r.forward_temporary = max_b(r.forward_temporary, a.split(bytes{checked_mul(checked_mul(T, q), em + 4 + (narrow ? em : 0))}));
    }
  }
  // MLA's compressed projections: q_a_proj's output, which q_a_layernorm keeps as its fp32 input
  // (the output itself in fp32; else its upcast copy, the narrow output then freed), and likewise
  // kv_a_layernorm over the kv_lora_rank columns of kv_a_proj_with_mqa's output, whose fp32 input
  // in fp32 is a view of that output and keeps all of it (kv_lora_rank + dr columns). Each latent
  // norm (DeepseekV3RMSNorm: `self.weight * hidden_states.to(input_dtype)`, the input dtype the
  // projection's, em, under autocast too) keeps its rsqrt per token, x·rstd cast to em and the
  // product in em (under autocast the up-projection's cast copy of it): T·4 + 2·T·r·em. The
  // rotary products on the dr columns keep only cos and sin (the shared tables); the
  // up-projections' outputs are copied into the query and key, or viewed by the value (above).
  // Measured: dsv3* (2×1024×96 and 2048×80 outputs, 2×1024×96 and 2×1024×64 products per layer).
  if (mla) {
    const bool narrow = em != 4 || t.autocast;
    const std::uint64_t dr = s.rotary_dim;
    const auto latent_norm = [&](std::uint64_t rank) {
      return checked_mul(T, checked_mul(rank, 4)) + checked_mul(T, 4) + checked_mul(checked_mul(T, rank), 2 * em);
    };
    std::uint64_t latent = latent_norm(s.kv_lora_rank) + (narrow ? 0 : checked_mul(T, checked_mul(dr, 4)));
    if (s.q_lora_rank != 0) latent += latent_norm(s.q_lora_rank);
    r.saved.input_grad += a.rep(bytes{latent});
  }
  if (a.c.sp) r.comm += a.values_per_token(s.hidden);
  return r;
}

/// OLMo 2's norm on a sub-layer's output (layer_flags::norms_after): Olmo2RMSNorm keeps its fp32
/// input (the output itself in fp32, else its upcast copy), its rsqrt per token and the fp32
/// normalised input the weight's product reads (`(self.weight * hidden_states).to(input_dtype)`,
/// modeling_olmo2.py); its output goes into the residual add, which keeps nothing.
constexpr bytes torch_norm_after(const act_terms& a, std::uint64_t hidden) {
  const std::uint64_t H = checked_mul(a.tokens, hidden);
  return a.rep(bytes{checked_mul(H, 8) + checked_mul(a.tokens, 4)});
}

/// The MLP of a block under the pytorch stack (per instance): SwiGLU keeps gate, up, SiLU and
/// their product; GPT-2's gelu_new keeps the first projection's output and four elementwise
/// results of its formula; a fused GeLU keeps its input and output. Mixtral's grouped experts
/// (transformers' moe.py) keep the routed copies of their inputs and outputs and the routing
/// tables; the router its fp32 probabilities.
constexpr mlp_bytes torch_mlp(const act_terms& a, const torch_bytes& t, const layer_shape& s) {
  mlp_bytes r{};
  const std::uint64_t T = a.tokens, em = t.em, f = s.ffn, h = s.hidden;
  const bool gated = (s.flags & layer_flags::gated) != 0;
  if ((s.flags & layer_flags::moe) != 0 && s.dense_experts) {
    // Llama 4's experts (modeling_llama4.py, Llama4TextMoe and Llama4TextExperts): every expert
    // computes every token. The router keeps its sigmoid's fp32 output (T·E, of the logits'
    // top-k scattered into -inf, `sigmoid(router_scores.float())`) and top-k's int64 indices
    // (the scatter's backward); the scores' transposed copy (`transpose(0, 1).reshape(-1, 1)`,
    // T·E in the logits' dtype) and the input repeated once per expert (`repeat`, in the norm
    // output's dtype: the stream's) are what their product keeps; the batched products keep
    // that product (under autocast its bf16 cast instead, and cast copies of the experts'
    // weights, counted with the block's), the gate-up output (2f), the SiLU and the gated
    // product (f each), E·T rows each. Top-k changes only the indices: the routed tokens are
    // E·T whatever the routing, a bound that holds for every batch (measured: llama4-top2).
    const std::uint64_t E = s.experts, k = s.top_k, R = checked_mul(E, T);
    std::uint64_t e = checked_mul(checked_mul(R, h), t.en + em) + checked_mul(checked_mul(R, f), 4 * em);
    e += checked_mul(checked_mul(T, E), 4 + em) + checked_mul(T, 8 * k);
    const std::uint64_t Fs = checked_mul(T, s.shared_ffn);
    e += checked_mul(Fs, 4 * em);  // the shared expert, Llama4TextMLP: gate, up, SiLU, product
    r.saved.input_grad = a.split(bytes{e});
    // Backward (the engine runs the ready node of the highest sequence number, and each node's
    // saved tensors are released after it runs, torch/csrc/autograd/engine.cpp): the sum over
    // the experts' backward expands the output's gradient, which the view's backward copies
    // (R·h); the shared expert's nodes, made after the experts', run first beside that copy;
    // then the down product's input gradient (R·f) beside it; the gated product's two (2·R·f),
    // its saved output gone; SiLU's and the concatenation for the gate-up output, with less
    // of the saved tensors held each time. The most above the saved tensors: R·(h + f), or
    // 2·R·f, or the copy with the shared expert's three (measured: llama4-gc).
    const std::uint64_t widest = std::max({checked_mul(R, h + f), checked_mul(R, 2 * f), checked_mul(R, h) + checked_mul(Fs, 3)});
    r.backward_temporary = a.split(bytes{checked_mul(widest, em)});
    // Forward: the experts' output (R·h) lives on while the shared expert runs, until the sum
    // over the experts is added to the shared expert's output.
    r.forward_temporary = a.split(bytes{checked_mul(checked_mul(R, h), em)});
    return r;
  }
  if ((s.flags & layer_flags::moe) != 0) {
    const std::uint64_t R = routed_tokens(s, T), E = s.experts, k = s.top_k;
    // The grouped experts compute in their input's dtype: under autocast the residual stream's
    // (fp32), since their grouped products are no operator autocast casts (measured: dsv3-autocast
    // and qwen3moe-autocast keep fp32 routed copies, gate-up outputs, SiLU and products, and no
    // bf16 copy of the experts' weights).
    const std::uint64_t ee = t.autocast ? t.en : em;
    // gpt-oss's clamped SwiGLU (GptOssExperts `_apply_gate`: `gate.clamp(max=limit)`,
    // `up.clamp(-limit, limit)`, `glu = gate * sigmoid(gate * alpha)`, `(up + 1) * glu`) keeps
    // the gate-up output (2 columns a unit: both clamps read views of it), the clamped gate, the
    // sigmoid, glu, `up + 1` and the product: 7 where SiLU's keeps 4.
    const std::uint64_t inner = s.clamped_swiglu ? 7 : gated ? 4 : 2;
    std::uint64_t e = checked_mul(checked_mul(R, f), inner * ee);          // gate-up output, SiLU, product
    e += checked_mul(checked_mul(R, h), 2 * ee);                           // routed input and output copies
    // The router: Mixtral's fp32 softmax over every expert, then its top-k and the renormalised
    // weights; gpt-oss's top-k of the logits, then the softmax over those k only (its backward
    // keeps its output and topk's indices).
    e += s.router_topk_softmax ? checked_mul(T, 12 * k)
                               : checked_mul(checked_mul(T, E), 4) + checked_mul(T, 12 * k + 4);  // router softmax, top-k, weights
    e += checked_mul(R, s.clamped_swiglu ? 37 : 29) + checked_mul(E, 4);   // sort (two with biases), indices, masks, counts
    // DeepSeek-V3's router computes its logits from fp32 casts of its input and weight
    // (DeepseekV3TopkRouter: `F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))`),
    // which the product keeps when the activations are narrower (under autocast the product is
    // cast back to bf16 like any other, a consumer of the norm's output); its sigmoid keeps its
    // fp32 output, T·E·4 as the softmax above, and the group-limited choice (`topk` of group
    // scores, `scatter_`, `masked_fill`) makes only transients.
    if (s.router_fp32 && em != 4 && !t.autocast) e += checked_mul(checked_mul(T + E, h), 4);
    // The shared experts (DeepseekV3MoE's `shared_experts`, a SwiGLU MLP of width f_s on the same
    // input, added to the routed output): gate, up, SiLU and product.
    const std::uint64_t Fs = checked_mul(T, s.shared_ffn);
    e += checked_mul(Fs, 4 * em);
    r.saved.input_grad = a.split(bytes{e});
    // Backward (grouped_mm_experts_forward, integrations/moe.py, in reverse). First, before any
    // of the routed experts' gradients: the sum over the top-k expands the output's gradient and
    // the view's backward copies it (R·h); the restoring index's backward scatters it into zeros
    // (R·h); the routing weights' product makes the gradients of both its inputs beside that one
    // (two more R·h, the weights' then summed over h): 3·R·h (measured: qwen3moe-aux-gc, whose
    // experts are h/4 wide). A shared expert's nodes, made after the routed experts', run before
    // them: its three (gate, up and the product's input gradient). Then, with the experts'
    // weight gradients: the down product's input gradient (R·f) beside its output's (R·h), the
    // gated unit's (three R·f with SiLU, four with the clamped SwiGLU), and the gate-up product's
    // input gradient (R·h) beside its output's (2·R·f). Of the saved tensors only the routed
    // output copy, which the routing product kept, is gone by then (each is released after its
    // own node).
    const std::uint64_t late = std::max(h + 2 * f, checked_mul(f, s.clamped_swiglu ? 4 : 3));
    r.grad_temporary = a.split(bytes{checked_mul(checked_mul(R, late), ee)});
    r.backward_temporary = a.split(max_b(bytes{checked_mul(checked_mul(R, 3 * h), ee)}, bytes{checked_mul(Fs, 3 * em)}));
    // Forward: at the restoring index, the routing weights' product (R·h) and its reordered copy
    // (R·h) beside the saved tensors; with biased experts (gpt-oss) the down projection's
    // gathered biases (`down_proj_bias[expert_ids_g]`, R·h) too, held until the function
    // returns (measured: gptoss-aux-autocast, whose peak is that moment). Under autocast the
    // norm's fp32 output, which the block holds while its MLP runs, is saved by no product there
    // (the router keeps its bf16 cast, the experts' gather its indices): one stream more.
    r.routed = true;
    r.routed_released = a.split(bytes{checked_mul(checked_mul(R, h), ee)});
    r.forward_temporary = a.split(bytes{checked_mul(checked_mul(R, h), (s.clamped_swiglu ? 3 : 2) * ee)}) +
                          (t.autocast ? a.rep(bytes{checked_mul(checked_mul(T, h), t.en)}) : bytes{});
    return r;
  }
  const std::uint64_t F = checked_mul(T, f);
  const std::uint64_t inner = gated ? 4 : (s.flags & layer_flags::gelu_tanh) != 0 ? 5 : 2;
  r.saved.input_grad = a.split(bytes{checked_mul(F, (inner - 1) * em)});
  r.saved.weight_grad = a.split(bytes{checked_mul(F, em)});  // down-projection input
  // Backward: the down projection's input gradient (F) while all is held; then, its saved input
  // released (each node's saved tensors go after it runs, torch/csrc/autograd/engine.cpp), the
  // elementwise nodes' input gradient and their outputs: SwiGLU's product makes two (gate and up
  // sides, 3F with its input gradient), gelu_new's products too, a fused GeLU one (2F).
  const std::uint64_t transient = gated || (s.flags & layer_flags::gelu_tanh) != 0 ? 2 : 1;
  r.backward_temporary = a.split(bytes{checked_mul(F, transient * em)});
  // While a projection's weight gradient is new: the down projection's input gradient (F), or,
  // at the gate and up projections, their outputs' gradients (two with SwiGLU).
  r.grad_temporary = a.split(bytes{checked_mul(F, (gated ? 2 : 1) * em)});
  if (a.c.sp) r.comm += a.values_per_token(h);
  return r;
}

/// A frozen norm (its weight without a gradient, as PEFT leaves the base model): the product by
/// the weight keeps the weight, not the normalised input (derivatives.yaml, mul: `other` is saved
/// only for `self`'s gradient), so it keeps its statistics per token (RMSNorm's rsqrt, fp32;
/// LayerNorm's mean and rstd) beside its input (counted with the residual stream), and its output
/// only where an adapter reads that very tensor (`output_kept`; the frozen projections keep no
/// input, below).
constexpr bytes torch_frozen_norm(const act_terms& a, const torch_bytes& t, bool rms, std::uint64_t hidden,
                                  bool output_kept) {
  bytes r{checked_mul(a.tokens, rms ? 4 : 2 * (t.autocast ? 4 : t.em))};
  if (output_kept) r += bytes{checked_mul(checked_mul(a.tokens, hidden), t.em)};
  return a.rep(r);
}

/// A frozen norm on a sub-layer's output (OLMo 2's, Gemma's sandwich): its fp32 input and rsqrt
/// per token (torch_norm_after without the fp32 normalised input the weight's product kept).
constexpr bytes torch_frozen_norm_after(const act_terms& a, std::uint64_t hidden) {
  return a.rep(bytes{checked_mul(checked_mul(a.tokens, hidden), 4) + checked_mul(a.tokens, 4)});
}

/// PEFT's LoRA on a frozen block (peft/tuners/lora/layer.py, Linear.forward: `x =
/// self._cast_input_dtype(x, lora_A.weight.dtype)`, then `result + lora_B(lora_A(dropout(x))) *
/// scaling`, one dropout per adapted projection). A frozen projection keeps no input (mm saves its
/// input only for the weight's gradient, derivatives.yaml); its adapter keeps what lora_A reads
/// and x·A, which lora_B reads. `shared`: lora_A reads the base projection's own input tensor (no
/// dropout, adapters in the activations' dtype, no autocast cast), which is then kept once for
/// all the projections that read it.
struct torch_lora {
  bool on = false;
  std::uint64_t targets = 0, rank = 0;
  std::uint64_t ea = 4;     ///< bytes of an adapter element (PEFT keeps adapters fp32 by default)
  std::uint64_t mask = 1;   ///< the adapter dropout's noise, per element (CPU: the input's dtype)
  bool dropout = false;
  bool shared = false;
  constexpr bool has(std::uint64_t bits) const { return on && (targets & bits) != 0; }
};
constexpr torch_lora torch_lora_of(const layer_desc& l, const torch_bytes& t, const activation_context& c) {
  torch_lora L{};
  const layer_shape& s = l.shape;
  L.on = (s.flags & layer_flags::adapted) != 0 && s.lora_rank != 0;
  if (!L.on) return L;
  L.targets = s.lora_targets;
  L.rank = s.lora_rank;
  L.ea = s.lora_adapter_bits == 0 ? 4 : ceil_div(s.lora_adapter_bits, 8);
  L.dropout = s.lora_dropout_permille != 0;
  // (the dropout runs on lora_A's input: the stream's dtype under autocast, else the adapters')
  L.mask = c.cpu ? (t.autocast ? t.en : L.ea) : 1;
  L.shared = !t.autocast && !L.dropout && L.ea == t.em;
  return L;
}
/// Saved by one adapted projection reading `in` values per token: lora_A's input when it is a
/// tensor of its own (the cast copy; the dropout's output and its noise; under autocast lora_A's
/// bf16 cast of it, the fp32 dropout output going once cast), and x·A (r per token, in the
/// product's dtype).
constexpr bytes torch_lora_saved(const act_terms& a, const torch_bytes& t, const torch_lora& L, std::uint64_t in) {
  const std::uint64_t X = checked_mul(a.tokens, in);
  std::uint64_t b = 0;
  if (!L.shared) {
    b += checked_mul(X, t.autocast ? t.em : L.ea);
    if (L.dropout) b += checked_mul(X, L.mask);
  }
  b += checked_mul(a.tokens, checked_mul(L.rank, t.autocast ? t.em : L.ea));
  return a.split(bytes{b});
}
/// Transients of one adapted projection `in` → `out`. Forward: lora_B's output and its product
/// by the scaling beside the base's output (with fp32 adapters on a narrower base the sum is made
/// in fp32, then cast back), and the cast copy of the input before its dropout. Backward: the
/// branch's output gradient, then the dropout output's and the input's gradients (and the cast's
/// back), beside the base projection's input gradient.
constexpr bytes torch_lora_forward(const act_terms& a, const torch_bytes& t, const torch_lora& L, std::uint64_t in,
                                   std::uint64_t out) {
  const std::uint64_t ew = t.autocast ? t.em : L.ea;
  std::uint64_t b = checked_mul(a.tokens, checked_mul(out, 2 * ew));
  if (!t.autocast && L.ea != t.em) b += checked_mul(a.tokens, checked_mul(out, 4));
  if (!t.autocast && L.ea != t.em && L.dropout) b += checked_mul(a.tokens, checked_mul(in, L.ea));
  return a.split(bytes{b});
}
constexpr bytes torch_lora_backward(const act_terms& a, const torch_bytes& t, const torch_lora& L, std::uint64_t in,
                                    std::uint64_t out) {
  const std::uint64_t ew = t.autocast ? t.em : L.ea;
  std::uint64_t b = checked_mul(a.tokens, checked_mul(out, ew)) + checked_mul(a.tokens, checked_mul(in, 2 * ew));
  if (ew != t.em) b += checked_mul(a.tokens, checked_mul(in, t.em));
  return a.split(bytes{b});
}

/// bitsandbytes' 4-bit matrix product (bitsandbytes/autograd/_functions.py, MatMul4Bit; the
/// default kernel, backends/default/ops.py `_gemm_4bit_default_impl`): the forward dequantizes
/// the weight into the input's dtype for the product (with double quantization the scales first,
/// fp32, one per 64 values); the backward dequantizes it again, in the stored state's dtype, cast
/// to the gradient's (`F.dequantize_4bit(B, ctx.state).to(grad_output.dtype)`). It keeps only the
/// packed weight, a parameter. `largest`: the block's largest matrix.
constexpr bytes torch_dequantized(const torch_bytes& t, std::uint64_t largest, bool backward) {
  const std::uint64_t scales = checked_mul(ceil_div(largest, 64), 4);
  if (!backward) return bytes{checked_mul(largest, t.em) + scales};
  return bytes{checked_mul(largest, t.en) + (t.en != t.em ? checked_mul(largest, t.em) : 0) + scales};
}

constexpr raw_activations pytorch_activations(const layer_desc& l, const activation_context& c) {
  raw_activations r{};
  const layer_shape& s = l.shape;
  const act_terms a(c, s);
  const torch_bytes t = torch_bytes_of(c);
  const std::uint64_t T = a.tokens, H = checked_mul(T, s.hidden);
  const bytes stream = a.rep(bytes{checked_mul(H, t.en)});
  switch (l.kind) {
    case layer_kind::embedding:
    case layer_kind::position_embedding:
      // Backward needs the token ids only; the output is the first block's input (kept there).
      r.backward_temporary = stream;
      break;
    case layer_kind::dropout:
      // CUDA's native_dropout keeps a bool mask; the CPU's dropout its scaled noise in the
      // input's dtype (docs/accuracy.md, "What only CUDA adds").
      if (s.dropout_permille != 0) r.saved.input_grad = a.rep(bytes{checked_mul(H, t.mask)});
      r.input = stream;
      r.backward_temporary = stream * 2;
      break;
    case layer_kind::layernorm:
    case layer_kind::rmsnorm: {
      const bool rms = l.kind == layer_kind::rmsnorm;
      r.saved.input_grad = a.rep(bytes{checked_mul(H, torch_residual_bytes(t, rms))}) +
                           (l.trainable ? torch_norm(a, t, rms, s.hidden, 1) : torch_frozen_norm(a, t, rms, s.hidden, false));
      // Olmo2RMSNorm (rms_weight_fp32): the normalised input its weight's product keeps is fp32,
      // not cast to the activation dtype first (modeling_olmo2.py).
      if (rms && l.trainable && (s.flags & layer_flags::rms_weight_fp32) != 0 && !t.autocast && t.em < 4)
        r.saved.input_grad += a.rep(bytes{checked_mul(H, 4 - t.em)});
      r.input = stream;
      r.input_in_saved = !rms || t.en == 4;
      r.backward_temporary = stream * 2;
      break;
    }
    case layer_kind::transformer_block: {
      const bool rms = (s.flags & layer_flags::rms_norm) != 0, gated = (s.flags & layer_flags::gated) != 0;
      const bool parallel = (s.flags & layer_flags::parallel_residual) != 0;
      const bool shared = (s.flags & layer_flags::shared_norm) != 0;
      const bool cross = (s.flags & layer_flags::cross_attention) != 0;
      const bool fused = (s.flags & layer_flags::fused_qkv) != 0;
      // A frozen block (PEFT's base model, memalg's frozen<>): no weight gradients, so its
      // norms and projections keep only what the input's gradient needs (torch_frozen_norm),
      // and its adapters, if any, what theirs need (torch_lora).
      const bool frozen = !l.trainable;
      const torch_lora L = torch_lora_of(l, t, c);
      const std::uint64_t q_width = checked_mul(s.heads, s.head_dim), kv_width = checked_mul(s.kv_heads, s.head_dim);
      const bool attention_adapted = L.has(lora_target::q | lora_target::k | lora_target::v);
      const bool mlp_adapted = L.has(lora_target::gate | lora_target::up);
      const auto pre_norm = [&](std::uint64_t consumers, bool adapter_reads) {
        return frozen ? torch_frozen_norm(a, t, rms, s.hidden, adapter_reads && L.shared)
                      : torch_norm(a, t, rms, s.hidden, consumers, (s.flags & layer_flags::rms_weight_fp32) != 0);
      };
      // The residual-stream tensors the block's norms read: its input, and the sum after attention
      // unless attention and MLP read the same input.
      const std::uint64_t residuals = (parallel ? 1 : 2) + (cross ? 1 : 0);
      r.parts.norms.input_grad = a.rep(bytes{checked_mul(checked_mul(H, residuals), torch_residual_bytes(t, rms))});
      // (under autocast each projection reading a norm's output keeps its own cast copy: the
      // router, and a shared expert's gate and up, not the grouped experts, torch_mlp; MLA's
      // q_a_proj and kv_a_proj)
      const std::uint64_t into_mlp = (s.flags & layer_flags::moe) != 0 ? (s.shared_ffn != 0 ? 3 : 1) : gated ? 2 : 1;
      const std::uint64_t into_attention = fused ? 1 : s.kv_lora_rank != 0 ? 2 : 3;
      // OLMo 2 (norms_after): no norm before the sub-layers; their projections read the residual
      // stream itself, the block's input and the sum after attention, and keep it (under autocast
      // each keeps its own bf16 cast instead); a norm on each sub-layer's output
      // (torch_norm_after). modeling_olmo2.py, Olmo2DecoderLayer.
      const bool after = (s.flags & layer_flags::norms_after) != 0 && !parallel && !shared && !cross;
      // Gemma 2 and 3 (norms_sandwich): the pre-norm block's norms and, on each sub-layer's output
      // before its residual add, a norm as OLMo 2's (Gemma2RMSNorm keeps its fp32 input, rsqrt
      // and fp32 normalised input too, modeling_gemma2.py, Gemma2DecoderLayer). With
      // rms_weight_fp32 the pre-norms' normalised inputs stay fp32 (torch_norm).
      const bool sandwich = (s.flags & layer_flags::norms_sandwich) != 0 && !after && !parallel && !shared && !cross;
      const auto stream_kept = [&](std::uint64_t consumers) {
        return a.rep(bytes{t.autocast ? checked_mul(checked_mul(H, consumers), t.em) : checked_mul(H, t.en)});
      };
      const bytes after_mlp_input = after ? stream_kept(into_mlp) : bytes{};
      const bytes after_norm = !(after || sandwich) ? bytes{}
                               : frozen             ? torch_frozen_norm_after(a, s.hidden)
                                                    : torch_norm_after(a, s.hidden);
      if (after) {
        r.parts.norms.input_grad = stream_kept(into_attention) + after_mlp_input + after_norm * 2;
      } else if (shared) {
        r.parts.norms.input_grad += torch_norm(a, t, rms, s.hidden, into_attention + into_mlp);
      } else {
        r.parts.norms.input_grad += pre_norm(into_attention, attention_adapted);
        r.parts.norms.input_grad += pre_norm(into_mlp, mlp_adapted);
        if (sandwich) r.parts.norms.input_grad += after_norm * 2;
      }
      attention_bytes self = torch_attention(a, t, s, a.seq, frozen);
      if (frozen) {
        // The out-projection's input: kept by SDPA's fused kernels as their output, else only
        // where its adapter reads it.
        const bytes out_input = self.saved.weight_grad;
        self.saved.weight_grad = bytes{};
        if (self.core_keeps_output) self.saved.input_grad += out_input;
        else if (L.shared && L.has(lora_target::o)) self.saved.weight_grad = out_input;
      }
      // One adapted projection `in` → `out`: what it keeps (into `kept`), its forward transients
      // and its backward's (into `backward`: the MLP's phase or the attention's).
      bytes lora_fwd{}, lora_bwd{}, lora_tail{};
      const auto adapt = [&](std::uint64_t bit, std::uint64_t in, std::uint64_t out, bytes& kept, bytes& backward) {
        if (!L.has(bit)) return;
        kept += torch_lora_saved(a, t, L, in);
        lora_fwd = max_b(lora_fwd, torch_lora_forward(a, t, L, in, out));
        backward = max_b(backward, torch_lora_backward(a, t, L, in, out));
      };
      // the attention's adapters: q, k, v (or the fused projection) and o
      if (fused) {
        adapt(lora_target::q, s.hidden, q_width + 2 * kv_width, self.saved.input_grad, lora_tail);
      } else {
        adapt(lora_target::q, s.hidden, q_width, self.saved.input_grad, lora_tail);
        adapt(lora_target::k, s.hidden, kv_width, self.saved.input_grad, lora_tail);
        adapt(lora_target::v, s.hidden, kv_width, self.saved.input_grad, lora_tail);
      }
      adapt(lora_target::o, q_width, s.hidden, self.saved.weight_grad, lora_tail);
      // A block whose input requires no gradient (the first after a frozen embedding): its first
      // norm keeps neither that input nor its statistics (pow and the product by rstd keep them
      // only for the input's gradient; a trainable weight's product keeps x·rstd, counted still),
      // nor do the adapters' dropouts on that norm's output keep their noise (it serves only the
      // input's gradient); the input itself is no saved tensor. Only an entry of one instance:
      // the instances after the first receive a gradient (model::lora and --freeze make the first
      // an entry of its own).
      const bool no_grad_in = !c.input_requires_grad && l.count == 1 && !parallel && !shared && !after && !cross;
      if (no_grad_in) {
        r.parts.norms.input_grad = saturating_sub(r.parts.norms.input_grad,
                                                  a.rep(bytes{checked_mul(H, torch_residual_bytes(t, rms))}) +
                                                      torch_frozen_norm(a, t, rms, s.hidden, false));
        if (L.dropout) {
          const std::uint64_t n = fused ? (L.has(lora_target::q) ? 1 : 0)
                                        : (L.has(lora_target::q) ? 1 : 0) + (L.has(lora_target::k) ? 1 : 0) +
                                              (L.has(lora_target::v) ? 1 : 0);
          self.saved.input_grad = saturating_sub(self.saved.input_grad, a.split(bytes{checked_mul(checked_mul(H, n), L.mask)}));
        }
      }
      r.parts.attention = self.saved;
      bytes fwd = self.forward_temporary, bwd = self.backward_temporary, comm = self.comm;
      if (cross) {
        r.parts.norms.input_grad += torch_norm(a, t, rms, s.hidden, 1);
        const attention_bytes x = torch_attention(a, t, s, s.kv_sequence != 0 ? s.kv_sequence : a.seq);
        r.parts.cross_attention = x.saved;
        fwd = max_b(fwd, x.forward_temporary);
        bwd = max_b(bwd, x.backward_temporary);
        comm = max_b(comm, x.comm);
      }
      mlp_bytes m = torch_mlp(a, t, s);
      const bool moe = (s.flags & layer_flags::moe) != 0;
      if (frozen && !moe) {
        // The down projection's input: only where its adapter reads it.
        const bytes down_input = m.saved.weight_grad;
        m.saved.weight_grad = L.shared && L.has(lora_target::down) ? down_input : bytes{};
        m.grad_temporary = bytes{};  // no weight gradient is ever new
        if (gated) adapt(lora_target::gate, s.hidden, s.ffn, m.saved.input_grad, lora_bwd);
        adapt(lora_target::up, s.hidden, s.ffn, m.saved.input_grad, lora_bwd);
        adapt(lora_target::down, s.ffn, s.hidden, m.saved.input_grad, lora_bwd);
      }
      // bitsandbytes' quantized base: a dequantized weight beside each product, forward and
      // backward (torch_dequantized).
      const bool quantized = frozen && !l.weight_storage.is_none() && l.weight_storage.bits <= 8;
      if (quantized) {
        const std::uint64_t largest = std::max({checked_mul(s.hidden, fused ? q_width + 2 * kv_width : q_width),
                                                moe ? 0 : checked_mul(s.hidden, s.ffn)});
        lora_fwd += torch_dequantized(t, largest, false);
        lora_bwd += torch_dequantized(t, largest, true);
        lora_tail += torch_dequantized(t, largest, true);
      }
      m.backward_temporary += lora_bwd;
      m.forward_temporary = max_b(m.forward_temporary, lora_fwd);
      r.parts.mlp = m.saved;
      bytes output_masks{};
      {  // the attention and MLP output dropouts' masks (one dropout on their sum in Falcon's parallel block)
        const std::uint64_t masks = (attention_output_dropout_permille(s) != 0 ? 1 : 0) +
                                    (mlp_output_dropout_permille(s) != 0 ? 1 : 0);
        output_masks = a.rep(bytes{checked_mul(H, masks * t.mask)});
        r.parts.mlp.input_grad += output_masks;
      }
      // Autocast's cached bf16/fp16 copies of the block's weights, saved by its products; the
      // MLP's go when its backward has run (each with its product's node), before the
      // attention's core.
      bytes mlp_copies{};
      if (t.autocast) {
        // (not the grouped experts' weights, torch_mlp; Llama 4's batched products over every
        // expert are autocast's bmm, which casts them)
        // (and the adapters' cached copies, L.on: theirs are leaves that require a gradient)
        std::uint64_t cast = s.dense_experts ? l.params : l.params - l.expert_params;
        if (L.on) cast += checked_mul(L.rank, detail::block_lora_projections(s, L.targets).rows_plus_cols);
        const bytes copies{checked_mul(ceil_div(cast - l.tp_replicated_params, c.tp) + l.tp_replicated_params, t.em)};
        const std::uint64_t attention = attention_params(s).params * (cross ? 2 : 1);
        const bytes attention_copies{checked_mul(ceil_div(attention, c.tp), t.em)};
        // (a frozen block's products keep their copies for the input's gradient: kept even
        // where no weight gradient is, autocast_mode.cpp's cached_cast making them afresh)
        if (frozen) r.parts.mlp.input_grad += copies;
        else r.parts.mlp.weight_grad += copies;
        mlp_copies = saturating_sub(copies, attention_copies);
      }
      r.saved = r.parts.total();
      r.input = stream;
      r.input_in_saved = !no_grad_in && (after ? !t.autocast : torch_residual_bytes(t, rms) == t.en);
      // The attention's forward transients come before the MLP's saved tensors exist (the sweep
      // counts the whole block's saved tensors at its forward moment): measured in gptoss*,
      // whose eager attention with sinks makes three scores-sized transients.
      r.forward_temporary = max_b(max_b(saturating_sub(fwd, r.parts.mlp.total()), m.forward_temporary), stream);
      // The block's backward in two phases: the MLP's first (its nodes were made last, and the
      // attention's backward needs the gradient that comes through it), then the attention's,
      // once the MLP's saved tensors are freed (torch/csrc/autograd/engine.cpp runs ready nodes
      // in decreasing sequence number; each SavedVariable is released after its node runs).
      r.backward_temporary = m.backward_temporary + stream * 2;
      r.grad_temporary = m.grad_temporary + stream * 2;
      r.backward_tail = bwd + lora_tail + stream * 2;
      // Before the attention's core the output projection's backward has run too, and in a
      // sequential block the MLP's norm's (its input, the sum after attention, its statistics and
      // output). A parallel block's MLP norm may run before the attention (Falcon's ln_mlp) and
      // then its backward comes after the attention's: its tensors are kept.
      // The output dropouts' backward runs before both sub-layers' (at their residual adds).
      // With norms after the sub-layers: both of them (the MLP's ran first in the backward, the
      // attention's before its output projection) and the MLP's input.
      bytes before_core = self.saved.weight_grad + output_masks;
      if (after)
        before_core += after_norm * 2 + after_mlp_input;
      else if (!shared && !parallel)
        before_core += pre_norm(into_mlp, mlp_adapted) +
                       a.rep(bytes{checked_mul(H, torch_residual_bytes(t, rms))}) + after_norm * 2;
      r.tail_released = m.saved.total() + before_core + mlp_copies;
      // By its first projections' backward the MLP's own saved tensors are freed (their inputs,
      // the norm's output, are the norm's), and a norm on its output, whose backward ran before.
      // (Routed experts: most of their saved tensors stay until their own nodes run, beside the
      // weight gradients; torch_mlp.)
      r.mlp_released = (m.routed ? m.routed_released : m.saved.total()) + after_norm;
      // That norm's backward runs first of all the block's (its node was made last): its saved
      // tensors are freed before the MLP's backward makes its transients.
      r.backward_released = after_norm;
      // A third phase: the attention's input projections (and the norm before them), once the
      // attention's own saved tensors are freed, its core's gradients with them.
      r.last_released = r.parts.attention.total() + r.parts.cross_attention.total() - self.saved.weight_grad;
      r.comm = max_b(comm, m.comm);
      break;
    }
    case layer_kind::output: {
      // HF's loss upcasts the logits (`logits.float()`) and PyTorch's cross_entropy keeps the
      // log-softmax (fp32) for its backward, which first writes the NLL gradient and then the
      // log-softmax gradient, both fp32 and logits-sized, before any parameter gradient exists.
      // The projection's backward then holds the logits' gradient (and its cast), the input's.
      const std::uint64_t vocab =
          (s.flags & layer_flags::vocab_replicated) != 0 ? s.vocab : ceil_div(s.vocab, c.tp);
      const std::uint64_t TV = checked_mul(T, vocab);
      const bytes log_softmax{checked_mul(TV, 4)};
      if (t.autocast) {  // the input's cast and the weight's cached copy, saved by the product
        r.saved.weight_grad = a.rep(bytes{checked_mul(H, t.em)}) + bytes{checked_mul(checked_mul(vocab, s.hidden), t.em)};
        // A frozen output layer's weight is cast afresh (autocast caches only casts of leaves
        // that require a gradient, aten/src/ATen/autocast_mode.cpp `cached_cast`), and the
        // product keeps that copy for the input's gradient, not the input's cast.
        if (!l.trainable) {
          r.saved.input_grad = bytes{checked_mul(checked_mul(vocab, s.hidden), t.em)};
          r.saved.weight_grad = bytes{};
        }
      }
      r.input = stream;
      r.input_serves_weight_grad = true;
      r.logits = bytes{checked_mul(TV, t.em)};
      r.forward_temporary = r.logits + log_softmax + (t.em != 4 ? log_softmax : bytes{});
      r.loss_temporary = log_softmax * 3;
      r.backward_temporary = log_softmax + (t.em != 4 ? r.logits : bytes{}) + a.rep(bytes{checked_mul(H, t.em)});
      // Narrower logits: the fp32 gradient is cast back (ToCopyBackward0) and freed before the
      // product's backward, which makes the weight's gradient beside the logits' narrow gradient
      // and the input's (under autocast the weight's is made in the product's dtype, then cast
      // to the fp32 weight's).
      if (t.em != 4)
        r.grad_temporary = r.logits + a.rep(bytes{checked_mul(H, t.em)}) +
                           (t.autocast ? bytes{checked_mul(checked_mul(vocab, s.hidden), t.em)} : bytes{});
      // Under autocast the cast of that gradient to fp32 comes after the product's node has
      // run and released what it saved (the input's cast and the weight's cached copy).
      if (t.autocast) r.last_released = r.saved.weight_grad;
      // Soft-capped logits (Gemma 2's final_logit_softcapping, modeling_gemma2.py: `logits / c`,
      // `tanh`, `· c`): tanh keeps its output, logits-sized in their dtype, from the forward to
      // its backward, which runs before the projection's (derivatives.yaml, tanh_backward reads
      // `result`); the scalar division and product keep nothing.
      if ((s.flags & layer_flags::softcap) != 0) {
        const bytes tanh_out{checked_mul(TV, t.em)};
        r.saved.input_grad += tanh_out;
        r.last_released += tanh_out;
      }
      if (c.sp) r.comm = a.values_per_token(s.hidden);
      break;
    }
    case layer_kind::custom:
      // LoRA's adapters (compose.hpp, lora_adapters): what they keep is counted with the frozen
      // block they adapt (torch_lora); their own entry holds only their parameters.
      if (s.lora_rank != 0) break;
      r.handled = false;
      break;
    default:
      r.handled = false;
      break;
  }
  return r;
}

/// Tensors of the whole model, kept with the token embedding's saved bytes.
constexpr void pytorch_table(const model_desc& model, const activation_context& c, activation_table& table) {
  // Tensors of the whole model that every block reads: rotary embeddings' cos and sin (one
  // sequence, broadcast over the batch), kept for the backward, and the attention masks the
  // model's forward makes once before its first block (masking_utils.py): eager attention's
  // causal mask and, with local layers, the sliding one (create_sliding_window_causal_mask),
  // each materialised (b, 1, s, s) in the stream's dtype; SDPA's local layers a boolean mask when
  // the window is no longer than the sequence (else none: is_causal).
  const torch_bytes t = torch_bytes_of(c);
  bytes shared{}, masks{}, router_logits{}, aux_step{};
  bool rotary = false, mask = false, local_mask = false;
  for (std::size_t i = 0; i < model.size; ++i) {
    const layer_desc& l = model.entries[i];
    if (l.kind != layer_kind::transformer_block || l.group == layer_group::teacher) continue;
    const act_terms a(c, l.shape);
    if ((l.shape.flags & layer_flags::moe) != 0 && l.shape.router_aux_loss) {
      // The auxiliary load-balancing loss (output_router_logits; load_balancing_loss_func in
      // modeling_mixtral.py, modeling_qwen3_moe.py, modeling_gpt_oss.py). An OutputRecorder on
      // the router keeps each sparse layer's logits (T·E, the product's dtype) from its forward
      // to the end of the model's, where the loss reads them; the model's output, which holds
      // them, is dropped before the backward (the Trainer's training_step keeps only the loss).
      // The loss's nodes are the last made, so its backward runs first (torch/csrc/autograd/
      // engine.cpp: the ready node of the highest sequence number) and each layer's logits'
      // gradient, of the same size, waits in the router product's input buffer until that
      // layer's backward: the same bytes, from the layer's forward to its backward, held with
      // the token embedding's saved bytes. Under reentrant checkpointing the recorded logits
      // carry no graph and no gradient comes: the bound keeps them through the backward.
      const std::uint64_t TE = checked_mul(a.tokens, l.shape.experts);
      router_logits += bytes{checked_mul(checked_mul(TE, t.em), l.count)};
      // The loss's loop, per layer: the softmax's output (saved for its backward, below), top-k's
      // values and int64 indices, and narrower probabilities' fp32 copy for the sum.
      aux_step = max_b(aux_step, bytes{checked_mul(a.tokens, checked_mul(l.shape.top_k, t.em + 8)) +
                                       (t.em < 4 ? checked_mul(TE, 4) : 0)});
    }
    if ((l.shape.flags & layer_flags::rotary) != 0 && !rotary) {
      rotary = true;
      const std::uint64_t rd = l.shape.rotary_dim != 0 ? l.shape.rotary_dim : l.shape.head_dim;
      // (fp32 whatever the precision where the modelling file keeps them so: OLMo 2's
      // Olmo2RotaryEmbedding returns cos and sin without `.to(x.dtype)`)
      const std::uint64_t e = (l.shape.flags & layer_flags::rotary_fp32) != 0 ? 4 : t.en;
      // (one table per attention layer type with its own base: Gemma 3's local and global)
      const std::uint64_t tables = l.shape.rotary_tables > 1 ? l.shape.rotary_tables : 1;
      // (Llama 4's one complex64 table of rd/2 per position, Llama4TextRotaryEmbedding's
      // `torch.polar`, in fp32 whatever the precision)
      // (gpt-oss's cos and sin of rd/2 each, GptOssRotaryEmbedding's `emb = freqs`)
      const std::uint64_t per_position = l.shape.complex_rotary      ? checked_mul(rd, 4)
                                         : l.shape.rotary_half_table ? checked_mul(rd, e)
                                                                     : checked_mul(rd, 2 * e);
      shared += bytes{checked_mul(checked_mul(ceil_div(a.seq, c.cp), per_position), tables)};
    }
    const std::uint64_t mask_elems = checked_mul(c.micro_batch, checked_mul(ceil_div(a.seq, c.cp), a.seq));
    const bool eager = (l.shape.flags & layer_flags::flash) == 0;
    if (eager && (l.shape.flags & layer_flags::causal) != 0 && l.shape.window == 0 && !mask) {
      mask = true;
      masks += bytes{checked_mul(mask_elems, t.en)};
    }
    if (l.shape.window != 0 && !local_mask && (eager || l.shape.window <= a.seq)) {
      local_mask = true;
      masks += bytes{checked_mul(mask_elems, eager ? t.en : 1)};
    }
  }
  // Under checkpointing the masks are an input every checkpointed block keeps, held with the
  // token embedding's saved bytes as the rotary tables are. Without it they live through every
  // block's forward and are gone before the loss (measured: gptoss-top1, whose peak is its last
  // block's forward with both): transients of each block's forward.
  const bool full = c.recompute == recompute_kind::full || c.recompute == recompute_kind::every_k;
  if (full) shared += masks;
  shared += router_logits;
  // (With a frozen embedding, as under LoRA, they go with the first entry backward runs through.)
  std::size_t holder = model.size;
  for (std::size_t i = 0; i < model.size && holder == model.size; ++i)
    if (model.entries[i].kind == layer_kind::embedding && table.entries[i].backward) holder = i;
  for (std::size_t i = 0; i < model.size && holder == model.size; ++i)
    if (table.entries[i].backward && model.entries[i].group != layer_group::teacher) holder = i;
  if (holder != model.size) {
    table.entries[holder].saved += shared;
    table.entries[holder].selective += shared;
  }
  // The auxiliary loss runs after the language-model loss's forward: each layer's softmax
  // output (the logits' size) saved for its backward, beside the last layer's transients. Its
  // backward, before the language-model loss's, frees each as it makes that layer's gradient.
  if (router_logits.value != 0)
    for (std::size_t i = 0; i < model.size; ++i)
      if (model.entries[i].kind == layer_kind::output && model.entries[i].group != layer_group::teacher)
        table.entries[i].forward_temporary += router_logits + aux_step;
  if (!full)
    for (std::size_t i = 0; i < model.size; ++i)
      if (model.entries[i].kind == layer_kind::transformer_block && model.entries[i].group != layer_group::teacher)
        table.entries[i].forward_temporary += masks;
  // The final norm before the output layer. Its rule counts the tensor the output layer's product
  // keeps of its input for the weight's gradient (derivatives.yaml, mm): the norm's output, or
  // under autocast the product's bf16 cast of it. Under autocast the output layer's own rule
  // counts that cast too (measured: every autocast case, which this makes tighter, none below),
  // and a frozen output layer (`--freeze output`) keeps neither.
  for (std::size_t i = 0; i + 1 < model.size; ++i) {
    const layer_desc& n = model.entries[i];
    const layer_desc& o = model.entries[i + 1];
    if ((n.kind != layer_kind::rmsnorm && n.kind != layer_kind::layernorm) || !n.trainable ||
        !table.entries[i].backward || o.kind != layer_kind::output || n.group == layer_group::teacher)
      continue;
    if (!t.autocast && (o.trainable || o.params == 0)) continue;
    const act_terms a(c, n.shape);
    const bytes output = a.rep(bytes{checked_mul(checked_mul(a.tokens, n.shape.hidden), t.em)});
    table.entries[i].saved = saturating_sub(table.entries[i].saved, output);
    table.entries[i].selective = saturating_sub(table.entries[i].selective, output);
  }
}

/// FSDP2 (fully_shard on every repeated entry and on the root): the root's parameters (every
/// entry that is not repeated) stay gathered from its forward to its backward; a unit is gathered
/// while it runs, with `zero3_prefetch` more ahead of it (measured: bench/torch, *-fsdp2).
constexpr bytes fsdp_gathered(const model_desc& model, const training_desc& t, const mesh_desc& m,
                              std::uint64_t stage) {
  bytes root{}, unit{};
  for (const layer_desc& l : model) {
    const std::uint64_t n = instances_on_stage(l, stage, m.pp);
    if (n == 0 || l.kind == layer_kind::parameters) continue;
    const dtype wdt = l.weight_storage.is_none() ? t.precision.weights : l.weight_storage;
    const bytes w = storage_bytes(wdt, elements_per_rank(l, m).total());
    if (l.place == placement::repeated) unit = max(unit, w);
    else root += w * n;
  }
  return root + unit * (1 + m.zero3_prefetch);
}

/// FSDP2 over gloo (the CPU): gloo has no native reduce-scatter, and c10d runs it on a clone of
/// its input (`aten::clone` under `c10d::_reduce_scatter_base_`), held by the asynchronous work
/// object until that object is waited on and destroyed; FSDP2 keeps the reduce-scatter's input
/// until the next unit's reduce-scatter waits on it (torch/distributed/fsdp/_fully_shard/
/// _fsdp_collectives.py, `foreach_reduce`; `_fsdp_param_group.py`, `reduce_scatter_state`). When
/// the work object lets go depends on gloo's thread: measured, the same step holds one repeated
/// unit's full gradient more or less from run to run (pw1-009-falcon: 413.1, 419.5 and 426.0 MB in
/// three runs, 6.5 MB a unit; llama-fsdp2 404.1 and 408.1 MB). The bound counts that one more: the
/// largest repeated unit's unsharded gradient, through the backward. With gradient accumulation
/// the clones of one micro-batch's reduce-scatters outlive its backward: at the next
/// micro-batch's loss backward, five of six units' clones were still alive (pw3-013-starcoder2,
/// `aten::clone (c10d::_reduce_scatter_base_)` ×5 in `--explain`; 0.64 % under without this).
/// The bound then counts every repeated unit's, from the second micro-batch's forward on.
constexpr bytes fsdp_gloo_held(const model_desc& model, const training_desc& t, const mesh_desc& m,
                               std::uint64_t stage) {
  bytes unit{}, all{};
  for (const layer_desc& l : model) {
    const std::uint64_t n = instances_on_stage(l, stage, m.pp);
    if (n == 0 || l.place != placement::repeated || !l.trainable) continue;
    const bytes g = storage_bytes(t.precision.gradients, elements_per_rank(l, m).total());
    unit = max(unit, g);
    all += g * n;
  }
  return t.grad_accum > 1 ? all : unit;
}

/// The largest parameter tensors of a block, in no order (0 where none): the attention's
/// projections (one fused q, k, v tensor or three) and output projection, and the MLP's
/// (gate, up and down; GeLU's two; a mixture of experts stores each projection of all experts as
/// one tensor, gate and up as one, as transformers' grouped experts do). A gated block with fused
/// QKV is Phi-3's, whose gate and up projections are one gate_up_proj too (modeling_phi3.py,
/// Phi3MLP): 2·f·h in one tensor.
struct block_tensors {
  std::uint64_t size[6] = {};
};
constexpr block_tensors tensors_of_block(const layer_shape& s) {
  block_tensors b{};
  const std::uint64_t h = s.hidden, q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim, f = s.ffn;
  const bool fused = (s.flags & layer_flags::fused_qkv) != 0, gated = (s.flags & layer_flags::gated) != 0;
  b.size[0] = h * q;  // o_proj (or c_proj)
  if (fused) {
    b.size[1] = h * (q + 2 * kv);
  } else {
    b.size[1] = h * q;
    b.size[2] = b.size[3] = h * kv;
  }
  if ((s.flags & layer_flags::moe) != 0) {
    b.size[4] = h * f * s.experts * (gated ? 2 : 1);
    b.size[5] = h * f * s.experts;
  } else if (gated && fused) {
    b.size[4] = 2 * h * f;
    b.size[5] = h * f;
  } else {
    b.size[4] = b.size[5] = h * f;  // (SwiGLU's third, of the same size, changes neither of the two largest)
  }
  return b;
}

/// The largest single parameter tensor of an entry: the embedding or output matrix, a block's
/// largest projection (tensors_of_block). `second`: the block's second largest (the same when two
/// share the largest size); 0 for other entries.
constexpr std::uint64_t largest_tensor(const layer_desc& l, bool second = false) {
  if (l.kind != layer_kind::transformer_block) return second ? 0 : l.params;
  const block_tensors b = tensors_of_block(l.shape);
  std::uint64_t first = 0, next = 0;
  for (std::uint64_t v : b.size) {
    if (v > first) {
      next = first;
      first = v;
    } else if (v > next) {
      next = v;
    }
  }
  const std::uint64_t r = second ? next : first;
  return r < l.params ? r : l.params;
}

/// The parameters of a block whose gradients its backward has not made by its second phase
/// (`input_projections` false: the attention's projections, self and cross) or by its third
/// (true: their query, key and value projections), 0 for any other entry. The first phase, the
/// MLP's, makes the MLP's and the norms' gradients; the second, the attention's core, follows the
/// output projection's; the third the input projections' (the engine runs the block's nodes in
/// decreasing sequence number, torch/csrc/autograd/engine.cpp, and each was made after those
/// it reads).
constexpr std::uint64_t later_phase_params(const layer_desc& l, bool input_projections) {
  if (l.kind != layer_kind::transformer_block) return 0;
  const layer_shape& s = l.shape;
  std::uint64_t self = attention_params(s).params;
  if (input_projections) {  // less the output projection: q·h and its bias
    // (a cross-attention's input projections run before the self-attention's core: only the
    // self-attention's are late then)
    self -= checked_mul(s.heads * s.head_dim, s.hidden) + ((s.flags & layer_flags::bias) != 0 ? s.hidden : 0);
    return self < l.params ? self : 0;
  }
  const std::uint64_t all = (s.flags & layer_flags::cross_attention) != 0 ? self * 2 : self;
  return all < l.params ? all : 0;
}

/// The parameters of a block's MLP whose gradients come last in its backward: the first
/// projections' (GeLU's fc1, SwiGLU's gate and up), made after the elementwise nodes' backward;
/// routed experts: theirs and the router's, all made after the routing product's backward
/// (torch_mlp); 0 for other entries and for Llama 4's experts.
constexpr std::uint64_t mlp_input_projection_params(const layer_desc& l) {
  const layer_shape& s = l.shape;
  if (l.kind != layer_kind::transformer_block) return 0;
  if ((s.flags & layer_flags::moe) != 0) {
    if (s.dense_experts) return 0;
    const std::uint64_t late = l.expert_params + checked_mul(s.experts, s.hidden);  // (the router's bias is left counted)
    return late < l.params ? late : 0;
  }
  const bool gated = (s.flags & layer_flags::gated) != 0, bias = (s.flags & layer_flags::bias) != 0;
  const std::uint64_t per = checked_mul(s.hidden, s.ffn) + (bias ? s.ffn : 0);
  const std::uint64_t all = gated ? per * 2 : per;
  return all < l.params ? all : 0;
}

/// The pytorch stack's optimizer-step temporaries (torch.optim, docs/algebra.md): foreach Adam /
/// AdamW keep `torch._foreach_sqrt(exp_avg_sqs)`, one state-sized tensor per parameter, for the
/// whole step; the for-loop keeps `exp_avg_sq.sqrt()` and its quotient for one parameter at a
/// time, beside the previous parameter's quotient; SGD and momentum update in place; fused
/// kernels need nothing.
constexpr bytes torch_optimizer_temporaries(const model_desc& model, const training_desc& t, const mesh_desc& m,
                                            std::uint64_t stage) {
  const optimizer_kind k = t.optimizer.kind;
  // (With the optimizer offloaded its step runs on the host, with its temporaries there.)
  if (t.optimizer_kind == optimizer_impl::fused || k == optimizer_kind::sgd || k == optimizer_kind::momentum ||
      k == optimizer_kind::adam8bit || m.offload != offload_kind::none)
    return bytes{};
  const dtype state = t.optimizer.state_dtype.is_none() ? t.precision.optimizer_states : t.optimizer.state_dtype;
  const std::uint64_t group = m.dp * m.cp;
  // The for-loop (`_single_tensor_adam`, torch/optim/adam.py): `denom = (exp_avg_sq.sqrt() /
  // bias_correction2_sqrt).add_(eps)` makes the root and the quotient of one parameter, while the
  // previous parameter's `denom`, a local of the loop, lives until the new one replaces it: two of
  // a tensor beside its predecessor's (measured: pw3-009-phi3, whose gate_up_proj's root and
  // quotient met qkv_proj's quotient). A block's largest tensor follows another of the block, at
  // most its second largest; the embedding comes first and the output after the final norm.
  bytes total{}, loop{};
  for (const layer_desc& l : model) {
    const std::uint64_t n = instances_on_stage(l, stage, m.pp);
    if (n == 0 || !l.trainable || l.kind == layer_kind::parameters) continue;
    const rank_elements e = elements_per_rank(l, m);
    const std::uint64_t shard =
        m.zero_stage >= 1 ? ceil_div(e.dense, group) + ceil_div(e.expert, group / m.ep) : e.total();
    total += storage_bytes(state, shard) * n;
    const std::uint64_t divisor = m.zero_stage >= 1 ? group : 1;
    const bytes big = storage_bytes(state, ceil_div(largest_tensor(l), divisor));
    const bytes before = storage_bytes(state, ceil_div(largest_tensor(l, true), divisor));
    loop = max(loop, big * 2 + before);
  }
  return t.optimizer_kind == optimizer_impl::for_loop ? loop : total;
}
}  // namespace detail
}  // namespace memalg

// SPDX-License-Identifier: BSL-1.0
// memalg/plan/stacks/megatron.hpp — the `megatron` stack: Megatron-core's GPT layers with
// Transformer Engine (docs/algebra.md, "The megatron stack"; checked against Megatron-LM's golden
// values, bench/megatron/golden.json).
#pragma once

#include <cstdint>
#include <string_view>

#include "memalg/device/device.hpp"
#include "memalg/plan/model_states.hpp"
#include "memalg/plan/stacks/common.hpp"

namespace memalg {
namespace detail {

/// The `megatron` stack: Megatron-core's GPT layers with Transformer Engine (docs/algebra.md, "The
/// megatron stack", with the file of every term; checked against Megatron-LM's golden values,
/// bench/megatron/golden.json). TE's fused LayerNorm-Linear keeps the norm's input and output
/// and fp32 mean / rstd; the fused attention keeps contiguous Q, K, V (K and V at the key/value
/// heads), its output and fp32 softmax statistics, no scores (multi-head latent attention:
/// megatron_mla below); the bias-dropout-add keeps a bool
/// mask; the MLP the GeLU's input and output (SwiGLU: the gated projection's output and the down
/// projection's input); a mixture of experts its router's scores and map, the permuted tokens, the
/// grouped experts' inputs, SwiGLU input and output (megatron_moe below). The loss (vocabulary-parallel
/// cross entropy) holds the bf16 logits and their fp32 copy and works in place. Other kinds follow
/// the paper accounting.
constexpr raw_activations megatron_activations(const layer_desc& l, const activation_context& c);

/// Megatron-core's MoELayer (megatron/core/transformer/moe/) on one tensor-parallel rank, dropless,
/// with the Sinkhorn router, the softmax top-k router and its load-balancing loss or DeepSeek-V3's
/// sigmoid router with expert bias in fp32, shared experts or none, gpt-oss's clamped experts with
/// biases (TEGroupedMLP's unfused forward) or SwiGLU ones, the allgather
/// token dispatcher (Megatron's default) or the all-to-all one (layer_shape::moe_alltoall) and
/// grouped-GEMM SwiGLU experts run by Transformer Engine's operation fuser; what
/// `megatron_unmodelled` lets through. With ep expert-parallel ranks the tokens of the group's
/// G = T·ep reach the rank that holds their experts (gathered, or sent all-to-all) and each rank
/// runs its E/ep experts on the rows routed to them: R = T·k with one rank (every expert local,
/// each token sent to exactly k of them, whatever the routing), and at most G·min(k, E/ep) with
/// more, the case where every token of the group picks this rank's experts; the plan takes that
/// bound (docs/algebra.md, "The megatron stack"). The pre-MLP norm is the caller's. The experts'
/// path follows the code of the measured run (Megatron-LM 6815c0fe, Transformer Engine 2.15.0);
/// the commit the rest follows changed it since (docs/algebra.md).
struct megatron_moe_bytes {
  saved_bytes saved{};
  bytes forward_temporary{};
  bytes backward_temporary{};
};
constexpr megatron_moe_bytes megatron_moe(const layer_shape& s, const activation_context& c, std::uint64_t T) {
  megatron_moe_bytes r{};
  const std::uint64_t em = bytes_per_element_ceil(c.act), ew = bytes_per_element_ceil(c.weights);
  const std::uint64_t h = s.hidden, f = s.ffn, E = s.experts, k = s.top_k, ep = c.ep;
  const std::uint64_t El = ceil_div(E, ep), G = checked_mul(T, ep);
  const std::uint64_t R = checked_mul(G, k < El ? k : El), TE = checked_mul(T, E), GE = checked_mul(G, El);
  const std::uint64_t Tk = checked_mul(T, k);  // the rank's own routed pairs
  const bool a2a = s.moe_alltoall;
  // DeepSeek-V3's router (layer_shape::router_sigmoid and router_fp32, DeepseekV3TopkRouter) is
  // planned as Megatron's DeepSeek-V3 recipe runs it: --moe-router-dtype fp32
  // --moe-router-score-function sigmoid --moe-router-enable-expert-bias with group-limited top-k
  // and the sequence-level load-balancing loss. A router in fp32 (--moe-router-dtype fp32,
  // layer_shape::router_fp32) makes fp32 logits, and so the probabilities the dispatcher and the
  // experts carry are fp32: p bytes an element where the others have the activations' e.
  // gpt-oss (layer_shape::clamped_swiglu) as Megatron's gpt-oss recipes run it
  // (examples/gptoss/02_train.sh, examples/post_training/modelopt/conf/openai/gpt-oss-20b.sh):
  // --moe-router-dtype fp32 with the softmax top-k router, --quick-geglu
  // --activation-func-clamp-value 7.0 --glu-linear-offset 1.0 --no-bias-gelu-fusion, biases on
  // the experts (add_bias_linear).
  const bool sigmoid = s.router_sigmoid, clamped = s.clamped_swiglu;
  const std::uint64_t p = s.router_fp32 || clamped ? 4 : em;
  const auto b = [](std::uint64_t n) { return bytes{n}; };
  // RouterGatingLinearFunction.backward with fp32 logits from narrower activations
  // (te_general_gemm with router_dtype fp32): the logits' gradient, the weight's fp32 copy, the
  // input gradient's fp32 result and the input's fp32 copy for the weight gradient, the fp32
  // weight gradient and the input gradient's cast back, counted as a sum.
  const bytes fp32_gating = p != em ? b(checked_mul(TE, 4)) + b(checked_mul(checked_mul(T, h), 8 + em)) + b(checked_mul(checked_mul(E, h), 8))
                                    : bytes{};
  // The router (router.py, TopKRouter) on the rank's T tokens and all E experts:
  // RouterGatingLinearFunction (moe_utils.py) keeps its input, the pre-MLP norm's output (counted
  // with the norm), and the weight, and makes logits in the router's dtype (the input's unless
  // moe_router_dtype is fp32: TE's GEMM writes fp32 from the bf16 operands, no cast kept).
  bytes router{};
  if (s.router_sinkhorn) {
    // sinkhorn_load_balancing picks the experts under no_grad and keeps the sigmoid of the
    // logits for top-1 (bf16), the fp32 softmax for top-k (its cast back is not kept);
    // `scores = logits * map` keeps the bool map, which with one expert-parallel rank is also
    // the dispatcher's local_map (below).
    router = b(checked_mul(TE, k == 1 ? em : 4)) + b(TE);
    if (ep > 1 && !a2a) router += b(GE);
  } else {
    // topk_routing_with_score_function (moe_utils.py; moe_router_fusion off, Megatron's default).
    // The probabilities are scattered into a zero [T, E] tensor in the logits' dtype: under
    // deterministic algorithms by `index_put_((rows, top_indices), probs)`, whose backward keeps
    // both indices (derivatives.yaml, `index_put_`: `grad.index(indices)`; rows an int64
    // [T, 1] arange), otherwise by `scatter`, which keeps top_indices only: T·8 + T·k·8 bounds
    // both. The bool routing map is built under no autograd, and only the dispatcher's copy of
    // it stays (below). The load-balancing loss (`_apply_aux_loss` or `_apply_seq_aux_loss`,
    // compute_routing_scores_for_aux_loss) keeps an fp32 T·E score until the backward: counted
    // whether or not its coefficient is set (Megatron's Mixtral, Qwen3-MoE and DeepSeek-V3
    // recipes set it), a bound either way; switch_load_balancing_loss_func's sums and
    // MoEAuxLossAutoScaler keep E-sized tensors and a scalar.
    // (The map the dispatcher keeps: allgather's local_map, G·E/ep; all-to-all's routing_map, T·E.)
    router = b(checked_mul(T, 8)) + b(checked_mul(Tk, 8)) + b(a2a ? TE : GE) + b(checked_mul(TE, 4));
    if (!sigmoid) {
      // Softmax (moe_router_pre_softmax off): torch.topk of the logits, whose backward keeps the
      // int64 indices (derivatives.yaml, `value_selecting_reduction_backward`, the same tensor as
      // above), and the fp32 softmax of the k scores, whose backward keeps its result
      // (`_softmax_backward_data(grad, result, ...)`). The loss's score: the fp32 softmax over
      // all E experts.
      router += b(checked_mul(Tk, 4));
      // The routing's moment (forward): the logits, the [T, E] probabilities scattered from a
      // zero tensor, the int32 map before its cast to bool and the loss's fp32 scores; backward:
      // the probabilities' gradient, the topk backward's zero-filled [T, E] gradient, the loss's
      // fp32 softmax gradient and its cast back to the logits' dtype (p bytes each: the
      // logits'); then the gating's backward.
      r.forward_temporary = b(checked_mul(TE, 2 * p + 4 + 4));
      r.backward_temporary = max_b(b(checked_mul(TE, 3 * p + 4)), fp32_gating);
    } else {
      // Sigmoid with the expert bias: `scores = torch.sigmoid(logits.float())` keeps its fp32
      // result (the logits are fp32, so `.float()` copies nothing); the experts are chosen on
      // `scores + expert_bias` (the bias a buffer: group_limited_topk's topk, scatter_,
      // masked_fill and topk of it feed only the indices, so their saved tensors go with the
      // discarded values); `torch.gather(scores, 1, top_indices)` keeps the index (the same
      // tensor as above); the normalisation `scores / (scores.sum(-1, keepdim=True) + 1e-20)`
      // keeps both operands, T·k·4 + T·4; the scaling factor and `type_as` keep nothing. The
      // loss (compute_routing_scores_for_aux_loss, sigmoid) keeps a second sigmoid's result and
      // its row sums (T·E·4 + T·4); its normalised scores go into sums that keep nothing.
      router += b(checked_mul(TE, 4)) + b(checked_mul(Tk, 4)) + b(checked_mul(T, 8));
      // The routing's moment, forward (fp32 logits): group_limited_topk beside the logits holds
      // the biased scores, the group mask expanded to [T, E] and copied by reshape, its bool
      // cast and negation, and the masked scores (T·E·18); later, beside the logits, the
      // probabilities and the map, the loss's normalised scores and its map's zeros, int32 cast
      // and scatter (T·E·21). Backward: the probabilities' gradient, gather's zero-filled
      // [T, E] gradient, the two sigmoid and the division's gradients (T·E·20); then the
      // gating's fp32 backward.
      r.forward_temporary = b(checked_mul(TE, 21));
      r.backward_temporary = max_b(b(checked_mul(TE, 20)), fp32_gating);
    }
  }
  const bytes stream = b(checked_mul(T, checked_mul(h, em))), gathered = b(checked_mul(G, checked_mul(h, em)));
  const bytes rows = b(checked_mul(R, checked_mul(h, em))), own_rows = b(checked_mul(Tk, checked_mul(h, em)));
  if (!a2a) {
    // MoEAllGatherTokenDispatcher (token_dispatcher.py). With ep > 1, token_dispatch gathers the
    // group's routing map (no_grad) and probabilities ([G, E] each; the gather's backward is a
    // reduce-scatter and keeps nothing) and its hidden states into Megatron's global "mpu" buffer
    // (`use_global_buffer=True`; megatron_global_buffer below). dispatch_postprocess keeps the
    // local experts' columns of the map (local_map, [G, E/ep] bool; with one rank the router's
    // map itself) and selects the routed probabilities by `probs.T.contiguous().masked_select(...)`,
    // whose backward keeps its input (G·E/ep, the logits' dtype) and mask (bool); moe_utils.permute
    // keeps the int64 permutation (index_select's and unpermute's index_add_'s index) and gathers
    // the routed rows.
    router += b(checked_mul(GE, p)) + b(GE) + b(checked_mul(R, 8));
    if (ep > 1)  // the gathered [G, E] probabilities and map, and the local columns' contiguous copy
      r.forward_temporary = max_b(r.forward_temporary, b(checked_mul(checked_mul(G, E), p + 1)) + b(checked_mul(GE, p)));
  } else {
    // MoEAlltoAllTokenDispatcher at the commit the stack follows (token_dispatcher.py; moe_utils.py
    // permute, sort_chunks_by_idxs, unpermute; moe_permute_fusion off, Megatron's default).
    // permute(..., probs=probs) sorts the flattened [E, T] map with argsort (T·E int64) and takes
    // the first T·k: `probs.T.contiguous().reshape(-1)[flat_sorted]` keeps that index, a view of
    // the whole argsort output, until the backward (IndexBackward0 keeps its indices), and
    // `tokens.index_select(0, sorted_indices)` keeps the T·k int64 token indices. The routed
    // rows go to their ranks by all_to_all (whose autograd function keeps nothing) and, with
    // more than one local expert, are regrouped by expert with split and cat (nothing kept).
    router += b(checked_mul(TE, 8)) + b(checked_mul(Tk, 8));
    // Transients of the dispatch: the transposed map and probabilities, the T·k permuted rows and
    // the R received, then regrouped.
    r.forward_temporary = max_b(r.forward_temporary, b(checked_mul(TE, p + 1)) + own_rows + rows * 2);
  }
  // The experts (experts.py, TEGroupedMLP._fused_forward; Transformer Engine's ops
  // GroupedLinear, ScaledSwiGLU, GroupedLinear in ops/basic/): FC1 keeps its input (the permuted
  // rows, for its weight gradient), ScaledSwiGLU its input (FC1's output, 2f wide) and its scales
  // (the routed probabilities), FC2 its input (the scaled SwiGLU output).
  r.saved.weight_grad = b(checked_mul(R, checked_mul(h, em))) + b(checked_mul(R, checked_mul(f, em)));
  r.saved.input_grad = b(checked_mul(R, checked_mul(2 * f, em))) + b(checked_mul(R, p)) + router;
  // gpt-oss's experts run TEGroupedMLP's unfused forward (experts.py, the `glu` of bias_act_func
  // with the bias-activation fusion off; FC1's bias added in its GEMM): both clamps keep FC1's
  // output (2f, ClampBackward0 keeps `self`), quick_gelu (a compiled `x * sigmoid(1.702 x)`)
  // keeps the clamped gate and, counted as a bound, its sigmoid; `a * (up + 1)` keeps a and
  // `up + 1`; the product with the probabilities keeps its other operand, the gated product
  // (R·f each); FC2 keeps its input and `_apply_bias` scales FC2's bias by the probabilities
  // (keeping views of them). 7 R·f where ScaledSwiGLU keeps 2.
  if (clamped) r.saved.input_grad += b(checked_mul(R, checked_mul(5 * f, em)));
  // GeLU experts (no --swiglu; Megatron needs --no-bias-gelu-fusion for them, bias_act_func
  // fuses only SwiGLU and quick-GeGLU) run the same unfused forward: F.gelu keeps FC1's output,
  // the product with the probabilities keeps the GeLU's output and the probabilities, FC2 its
  // input: R·(h + 3f)·e + R·p, ScaledSwiGLU's count with FC1 f wide.
  const bool gelu = (s.flags & layer_flags::gated) == 0;
  // The combine: moe_utils.unpermute adds rows into a zero tensor with index_add_ (under
  // deterministic algorithms, --deterministic-mode, which the functional tests set; scatter_add_
  // otherwise keeps only the index, so this is a bound), and PyTorch's backward of index_add
  // keeps its `source` (derivatives.yaml: `grad.index_select(dim, index).expand_as(source)`;
  // IndexAddBackward0 holds source_). Allgather: MoEAllGatherTokenDispatcher.combine_preprocess
  // unpermutes the experts' output (R·h) into [G, h], so FC2's output stays. All-to-all: the
  // rows go back by all_to_all (regrouped first) and combine_postprocess unpermutes the rank's
  // own T·k returned rows into [T, h]: those stay.
  r.saved.input_grad += a2a ? own_rows : rows;
  // Forward: ScaledSwiGLU's unscaled output beside its scaled one (R·f). Allgather: unpermute
  // allocates the [G, h] output twice (deterministic) before its index_add_, and with ep > 1
  // token_combine reduce-scatters it into a new [T, h]. All-to-all: FC2's output and its
  // regrouped copy (R·h each), the copy and the T·k rows returned, then the [T, h] output twice.
  // With fp32 probabilities token_combine reduce-scatters an fp32 copy ([G, h], `hidden_states.to(
  // self.local_probs.dtype)`) into an fp32 [T, h] before the cast back; its backward all-gathers
  // the fp32 gradient the same way.
  const bytes widened = ep > 1 && !a2a && p != em ? b(checked_mul(G + T, checked_mul(h, p))) : bytes{};
  bytes combine = gathered * 2 + (ep > 1 ? stream + widened : bytes{});
  if (a2a) combine = max_b(rows * 2, max_b(rows + own_rows, stream * 2));
  r.forward_temporary = max_b(r.forward_temporary, max_b(b(checked_mul(R, checked_mul(f, em))), combine));
  // Backward, one autograd function (ops/fuser.py) holding its output gradient (R·h) throughout:
  // FC2's input gradient (R·f) and its weight gradient (E/ep·f·h in the weights' dtype: no
  // gradient accumulation fusion), then ScaledSwiGLU's scaled gradient (R·f), its input gradient
  // (R·2f) and the recomputed SwiGLU for the scales' gradient (R·f, and R for the products); then
  // FC1's input gradient (R·h) and weight gradient (E/ep·2f·h) beside FC2's.
  const bytes wgrad2 = b(checked_mul(El, checked_mul(checked_mul(f, h), ew)));
  const bytes glu = b(checked_mul(R, checked_mul(h + 5 * f, em))) + b(checked_mul(R, p)) + wgrad2;
  const bytes fc1 = b(checked_mul(R, checked_mul(2 * h + 2 * f, em))) + wgrad2 * 3;
  r.backward_temporary = max_b(r.backward_temporary, max_b(glu, fc1));
  if (gelu) {
    // GeLU's unfused path. Forward: the product with the probabilities in their dtype (R·f·p)
    // and its cast (R·f·e). Backward, with the output's gradient (R·h) held: the product's
    // gradients in the probabilities' dtype, the gradient's cast, `grad * probs`, `grad * g`,
    // and the cast back (R·f·(3p + e) with fp32 probabilities, R·f·3e otherwise), or FC1's input
    // gradient beside the GeLU's (R·(h + f)·e), beside the weight gradients.
    r.forward_temporary = max_b(r.forward_temporary, b(checked_mul(R, checked_mul(f, p + em))));
    r.backward_temporary = max_b(r.backward_temporary,
                                 rows + wgrad2 * 3 +
                                     max_b(b(checked_mul(R, checked_mul(f, 3 * p + em))), b(checked_mul(R, checked_mul(h + f, em)))));
  }
  if (clamped) {
    // gpt-oss's unfused path. Forward: the gated product times the fp32 probabilities (R·f·4)
    // before its cast, then `_apply_bias`'s fp32 per-expert sums and their fp32 cat beside FC2's
    // output (R·h·(e + 8)). Backward, with the output's gradient (R·h) held: `_apply_bias`'s
    // fp32 gradient, the per-expert gradients and the split's cat (R·h·(4 + 2e)); the product
    // with the probabilities in fp32 (the gradient's cast, `grad * probs`, `grad * g`, then the
    // cast back: R·f·(12 + e)); the GLU's products' and clamps' gradients, their bool masks
    // and the cat into FC1's [R, 2f] (R·f·(6e + 2)); FC1's input gradient with the cat (R·(h +
    // 2f)·e); and the weight gradients (wgrad2 as above).
    r.forward_temporary = max_b(r.forward_temporary, max_b(b(checked_mul(R, checked_mul(f, 4))), b(checked_mul(R, checked_mul(h, em + 8)))));
    const bytes held = rows;
    r.backward_temporary = max_b(r.backward_temporary,
                                 held + wgrad2 * 3 +
                                     max_b(max_b(b(checked_mul(R, checked_mul(h, 4 + 2 * em))), b(checked_mul(R, checked_mul(f, 12 + em)))),
                                           max_b(b(checked_mul(R, checked_mul(f, 6 * em + 2))), b(checked_mul(R, checked_mul(h + 2 * f, em))))));
  }
  // With ep > 1 the combine's backward all-gathers the output gradient ([G, h]) before
  // unpermute's backward selects its R rows, and permute's backward adds the rows' gradients into
  // a zero [G, h] that the gather's backward reduce-scatters into a new [T, h]
  // (tensor_parallel/mappings.py, _ReduceScatterToSequenceParallelRegion and
  // _GatherFromSequenceParallelRegion).
  if (ep > 1 && !a2a)
    r.backward_temporary = max_b(r.backward_temporary, gathered + b(checked_mul(R > T ? R : T, checked_mul(h, em))) + widened);
  // All-to-all, backward: unpermute's backward selects the T·k rows' gradient from [T, h], the
  // all_to_all's backward sends it back (R·h) and the regrouping's backward copies it (R·h)
  // before the experts' backward; after it the same in reverse, and permute's backward adds the
  // T·k rows' gradient into a zero [T, h] and scatters the probabilities' into a zero [E·T].
  if (a2a)
    r.backward_temporary = max_b(r.backward_temporary,
                                 max_b(max_b(own_rows + rows, rows * 2), own_rows + stream + b(checked_mul(TE, p))));
  // Shared experts (DeepSeek-V3's; shared_experts.py, SharedExpertMLP with
  // --moe-shared-expert-intermediate-size f_s, no gate, no overlap: Megatron's defaults). MoELayer
  // runs them first (moe_layer.py, shared_experts_compute) on the rank's own T tokens, the pre-MLP
  // norm's output that the router keeps too (no copy), as an MLP of TEColumnParallelLinear and
  // TERowParallelLinear (moe_module_specs.py): FC1's input is that tensor (TE's Linear keeps the
  // tensor it is given when no cast is needed, linear.py), SwiGLUFunction (fused_bias_swiglu.py,
  // --swiglu with the default bias-SwiGLU fusion) keeps FC1's output (T·2f_s), FC2 its input
  // (T·f_s). Their output ([T, h]) lives through the routed experts' forward until postprocess
  // adds it. Their autograd nodes, made before the routed experts', run after them in the
  // backward (the engine takes the highest sequence number first): FC2's input gradient (T·f_s),
  // SwiGLU's (T·2f_s) and FC1's (T·h), the weight gradients accumulating into main_grad
  // (gradient-accumulation fusion).
  if (s.shared_ffn != 0) {
    const std::uint64_t Fs = checked_mul(T, s.shared_ffn);
    r.saved.input_grad += b(checked_mul(Fs, 2 * em));
    r.saved.weight_grad += b(checked_mul(Fs, em));
    r.forward_temporary += stream;
    r.backward_temporary = max_b(r.backward_temporary, b(checked_mul(Fs, 3 * em)) + stream);
  }
  return r;
}

/// Megatron-core's multi-head latent attention on one tensor-parallel rank (MLASelfAttention,
/// megatron/core/transformer/multi_latent_attention.py, as get_gpt_layer_with_transformer_engine_spec
/// builds it with multi_latent_attention and qk_layernorm, --mla-down-proj-fusion off: Megatron's
/// default; docs/algebra.md, "The megatron stack"). The block's input norm is a TENorm whose
/// output both TELinear down projections keep (one tensor), as the LayerNorm-Linear it replaces
/// (the caller's). Per block, T tokens, e bytes an activation, `stat` the fp32 statistics of a
/// norm row (4 RMSNorm, 8 LayerNorm):
/// - linear_q_up_proj, a TELayerNormColumnParallelLinear (the q_layernorm fused into it;
///   layernorm_linear.py), keeps its input (q_down's output, T·q_lora_rank), its normalised
///   output and the statistics; without q_lora_rank linear_q_proj keeps the input norm's output;
/// - linear_kv_up_proj keeps the same of the compressed key-value, T·kv_lora_rank: a contiguous
///   copy of `torch.split(kv_combined, ...)`'s strided view (TE's prepare_forward);
/// - the rotary embedding (rope_type yarn and apply_rope_fusion, Megatron's defaults for MLA:
///   fused_apply_mla_rope_for_q rotates the query in place, fused_apply_mla_rope_for_kv writes a
///   new key and value; fusions/fused_mla_yarn_rope_apply.py) keeps the cached cos and sin only
///   (megatron_rope_cache);
/// - TE's fused attention (cuDNN's: flash-attention 2 does not take a value head narrower than the
///   query's; dot_product_attention/backends.py, FusedAttnFunc) keeps the query and key,
///   T·a·(dn + dr) each, the value, T·a·dv, its output, T·a·dv, which linear_proj keeps as its
///   input (the same tensor), and fp32 softmax statistics, T·a·4 (the caller's);
/// - transients: kv_combined ([T, kv_lora_rank + dr]) lives to the end of the attention's
///   forward, beside kv_up's output (T·a·(dn + dv)) until the rotary kernel has written the key
///   and value, or beside linear_proj's output; in the backward the output's gradient (T·a·dv)
///   and the query's, key's and value's gradients, then the key-value rotary's gradient
///   (T·a·(dn + dv)), counted as a sum.
struct megatron_mla_bytes {
  bytes input_grad{};
  bytes output{};
  bytes forward_temporary{};
  bytes backward_temporary{};
};
constexpr megatron_mla_bytes megatron_mla(const layer_shape& s, std::uint64_t T, std::uint64_t em, std::uint64_t stat) {
  megatron_mla_bytes r{};
  const std::uint64_t a = s.heads, dr = s.rotary_dim, dqk = s.head_dim, dn = dqk - dr, dv = s.v_head_dim;
  const auto b = [](std::uint64_t n) { return bytes{n}; };
  const auto norm_linear = [&](std::uint64_t rank) { return b(checked_mul(checked_mul(T, rank), 2 * em)) + b(checked_mul(T, stat)); };
  r.input_grad = b(checked_mul(checked_mul(T, a), checked_mul(2 * dqk + dv, em))) + norm_linear(s.kv_lora_rank);
  if (s.q_lora_rank != 0) r.input_grad += norm_linear(s.q_lora_rank);
  r.output = b(checked_mul(checked_mul(T, a), checked_mul(dv, em)));
  const bytes combined = b(checked_mul(checked_mul(T, s.kv_lora_rank + dr), em));
  r.forward_temporary = combined + max_b(b(checked_mul(checked_mul(T, a), checked_mul(dn + dv, em))), b(checked_mul(checked_mul(T, s.hidden), em)));
  r.backward_temporary = b(checked_mul(checked_mul(T, a), checked_mul(2 * dv + 2 * dqk + dn + dv, em)));
  return r;
}

/// The rotary embedding's cos and sin that each MLA block's YarnRotaryEmbedding caches for the
/// sequence (yarn_rotary_pos_embedding.py, get_cached_cos_sin: `register_buffer("cos_cached",
/// ...)` in the activations' dtype, [s, 1, 1, dr] each), allocated at the first forward and kept
/// by the process: 2·s·dr·e per MLA block on the stage.
constexpr bytes megatron_rope_cache(const model_desc& model, const activation_context& c, std::uint64_t stage, std::uint64_t pp) {
  bytes kept{};
  for (const layer_desc& l : model)
    if (l.kind == layer_kind::transformer_block && l.shape.kv_lora_rank != 0)
      kept += bytes{checked_mul(instances_on_stage(l, stage, pp),
                                checked_mul(checked_mul(2, l.shape.sequence != 0 ? l.shape.sequence : c.sequence), checked_mul(l.shape.rotary_dim, bytes_per_element_ceil(c.act))))};
  return kept;
}

/// Megatron's global memory buffer (megatron/core/utils.py, GlobalMemoryBuffer.get_tensor; its
/// "mpu" buffer in the activations' dtype): the allgather dispatcher gathers the expert-parallel
/// group's hidden states into it (tensor_parallel/mappings.py, `_gather_along_first_dim` with
/// `use_global_buffer`), so with ep > 1 a [G, h] buffer, the largest of the model's MoE blocks,
/// is allocated at the first micro-batch and kept by the process.
constexpr bytes megatron_global_buffer(const model_desc& model, const activation_context& c) {
  if (c.ep <= 1) return bytes{};
  bytes largest{};
  const std::uint64_t T = checked_mul(c.micro_batch, ceil_div(c.sequence, c.cp));
  for (const layer_desc& l : model)
    if (l.kind == layer_kind::transformer_block && (l.shape.flags & layer_flags::moe) != 0 && !l.shape.moe_alltoall)
      largest = max_b(largest, bytes{checked_mul(checked_mul(T, c.ep), checked_mul(l.shape.hidden, bytes_per_element_ceil(c.act)))});
  return largest;
}

/// Transformer Engine's cuBLAS workspace (transformer_engine/pytorch/cpp_extensions/gemm.py,
/// get_cublas_workspace_size_bytes): 32 MiB and 1 KiB from Hopper on (where torch's is 32 MiB),
/// 4 MiB before.
constexpr bytes te_cublas_workspace(const device_desc& d) {
  using namespace memalg::literals;
  return d.blas_workspace >= 32_MiB ? d.blas_workspace + bytes{1024} : 4_MiB;
}

/// Whether Transformer Engine 2.16 runs a latent attention's query and key heads of `qk` and value
/// heads of `v` in cuDNN's fused attention when training on `d`: flash-attention 2 takes no value
/// heads narrower than the query's (dot_product_attention/utils.py, "does not support MLA"), and
/// cuDNN's arbitrary-sequence kernel (common/fused_attn/fused_attn.cpp,
/// nvte_get_fused_attn_backend) trains heads up to 128 wide on Ampere and later, and 192 / 128 on
/// Hopper (cuDNN 9.5) and Blackwell (9.11), multiples of 8. Otherwise TE falls back to its
/// unfused attention, which keeps the scores.
constexpr bool te_fused_mla(std::uint64_t qk, std::uint64_t v, const device_desc& d) {
  using namespace memalg::literals;
  if (qk % 8 != 0 || v % 8 != 0) return false;
  const bool hopper_or_later = d.blas_workspace >= 32_MiB;  // (the cuBLAS workspace marks Hopper, device.hpp)
  return (qk <= 128 && v <= 128) || (hopper_or_later && qk == 192 && v == 128);
}

/// Why the megatron stack cannot plan `model` on mesh `m` and device `d`, as one sentence, or empty.
/// It refuses what Megatron-core implements but its rules do not follow (memalg plan --stack
/// megatron exits with the sentence; a type-level plan fails to compile,
/// plan_issue::stack_does_not_model).
constexpr std::string_view megatron_unmodelled(const model_desc& model, const mesh_desc& m, const device_desc& d) {
  for (const layer_desc& l : model) {
    if ((l.shape.flags & layer_flags::softcap) != 0)
      return "the megatron stack does not model soft-capped attention scores or logits (Gemma 2's): plan it with "
             "--stack pytorch";
    if (l.kind != layer_kind::transformer_block) continue;
    const layer_shape& s = l.shape;
    if ((s.flags & (layer_flags::norms_after | layer_flags::norms_sandwich)) != 0)
      return "the megatron stack does not model norms after the sub-layers (OLMo 2's, Gemma 2's and Gemma 3's): "
             "plan it with --stack pytorch";
    if (s.kv_lora_rank != 0 && (m.tp > 1 || m.cp > 1))
      return "the megatron stack models multi-head latent attention (Megatron-core's MLASelfAttention) on one "
             "tensor-parallel and one context-parallel rank (--tp 1 --cp 1)";
    if (s.kv_lora_rank != 0 && (s.flags & layer_flags::flash) != 0 && s.head_dim != s.v_head_dim &&
        !te_fused_mla(s.head_dim, s.v_head_dim, d))
      return "Transformer Engine trains this latent attention's heads (query and key wider than the values) with "
             "neither cuDNN's fused kernel nor flash-attention on this device, in its unfused attention, which the "
             "megatron stack does not model: plan it on a Hopper or later device or with --stack pytorch";
    if ((s.flags & layer_flags::qk_norm_whole) != 0)
      return "Megatron-core's qk_layernorm normalises each head; a norm over the whole query and key projections "
             "(OLMo 2's) is not in it: plan it with --stack pytorch";
    if (s.l2_qk_norm)
      return "the megatron stack does not model the weightless L2 norm on the query and key (Megatron-core's "
             "qk_l2_norm, Llama 4's): plan it with --stack pytorch";
    if ((s.flags & layer_flags::moe) == 0) continue;
    if (s.router_sigmoid && s.router_sinkhorn)
      return "the megatron stack plans DeepSeek-V3's router as Megatron's sigmoid router with expert bias in fp32 "
             "(--moe-router-score-function sigmoid); it does not model Sinkhorn's with fp32 logits: drop --moe-router "
             "sinkhorn";
    if (!s.clamped_swiglu && (s.flags & layer_flags::bias) != 0)
      return "the megatron stack models experts without biases (SwiGLU or GeLU; --no-linear-bias) and gpt-oss's "
             "clamped ones";
    if (s.capacity_factor_percent != 0)
      return "the megatron stack does not model a capacity factor (Megatron-core's token dropping, "
             "apply_router_token_dropping): plan the experts dropless";
    if (m.tp > 1)
      return "the megatron stack models mixture-of-experts layers on one tensor-parallel rank (--tp 1): the "
             "experts' tensor parallelism (--expert-tensor-parallel-size) is not modelled";
  }
  return {};
}

constexpr raw_activations megatron_activations(const layer_desc& l, const activation_context& c) {
  raw_activations r{};
  const layer_shape& s = l.shape;
  const act_terms a(c, s);
  const std::uint64_t em = bytes_per_element_ceil(c.act);
  const std::uint64_t T = a.tokens, H = checked_mul(T, s.hidden);
  const bytes stream = a.rep(bytes{checked_mul(H, em)});
  const bool drop = s.dropout_permille != 0;
  switch (l.kind) {
    case layer_kind::dropout:  // the embeddings' dropout: a bool mask
      if (drop) r.saved.input_grad = a.rep(bytes{H});
      r.input = stream;
      r.backward_temporary = stream * 2;
      break;
    case layer_kind::layernorm:
    case layer_kind::rmsnorm:  // the final norm: its input and fp32 statistics (its output is the output layer's input)
      r.saved.input_grad = stream + a.rep(bytes{checked_mul(T, l.kind == layer_kind::rmsnorm ? 4 : 8)});
      r.input = stream;
      r.input_in_saved = true;
      r.backward_temporary = stream * 2;
      break;
    case layer_kind::transformer_block: {
      if ((s.flags & layer_flags::flash) == 0 || (s.flags & layer_flags::cross_attention) != 0) {
        r.handled = false;  // Megatron's unfused attention and cross-attention: the paper's accounting
        break;
      }
      const bool rms = (s.flags & layer_flags::rms_norm) != 0, gated = (s.flags & layer_flags::gated) != 0;
      const std::uint64_t q = checked_mul(s.heads, s.head_dim), kv = checked_mul(s.kv_heads, s.head_dim);
      const std::uint64_t stat = rms ? 4 : 8;  // fp32 rstd (and mean) per row
      // Two LayerNorm-Linear modules (QKV, FC1): input, normalised output, fp32 mean and rstd (rstd only for RMSNorm).
      const bytes norm_linear = stream * 2 + a.rep(bytes{checked_mul(T, stat)});
      r.parts.norms.input_grad = norm_linear * 2;
      r.parts.attention.core = a.split(bytes{checked_mul(checked_mul(T, s.heads), 4)});  // softmax statistics
      bytes attention_forward{}, attention_backward{};
      if (s.kv_lora_rank == 0) {
        r.parts.attention.input_grad = a.split(bytes{checked_mul(checked_mul(T, q + 2 * kv), em)});  // Q, K, V
        r.parts.attention.weight_grad = a.split(bytes{checked_mul(checked_mul(T, q), em)});           // output
      } else {
        const megatron_mla_bytes mla = megatron_mla(s, T, em, stat);
        r.parts.attention.input_grad = mla.input_grad;
        r.parts.attention.weight_grad = mla.output;
        attention_forward = mla.forward_temporary;
        attention_backward = mla.backward_temporary;
      }
      if (drop) r.parts.attention.input_grad += a.rep(bytes{H});  // the attention's bias-dropout-add mask
      // gpt-oss's rotary embedding (layer_shape::rotary_half_table) as Megatron's gpt-oss recipes
      // run it: --position-embedding-type yarn, whose concentration factor keeps the rotation off
      // the fused kernel (rope_utils.py, apply_rotary_pos_emb_bshd: `t * cos_ + rotate_half(t) *
      // sin_`, each product keeping its [s, 1, 1, d] cos_ or sin_ in the activations' dtype), for
      // the query and for the key: 4·s·d·e per block, whatever the micro-batch. Its learned sinks
      // (--softmax-type learnable) keep an [a] fp32 offset in TE's fused attention, which
      // otherwise keeps what it keeps without them.
      if (s.rotary_half_table)
        r.parts.attention.input_grad += bytes{checked_mul(checked_mul(4, ceil_div(a.seq, c.cp)), checked_mul(s.head_dim, em))};
      // Norms on each query and key head (`--qk-layernorm`; attention.py,
      // get_query_key_value_tensors: TENorm of head_dim on the query's reshaped copy and on the
      // key's strided view of the fused QKV output). Transformer Engine's norm op
      // (ops/basic/rmsnorm.py, layer_norm.py) saves `input_.contiguous()`, a copy of the key,
      // and fp32 rstd per row (LayerNorm: and the mean): T·(q + kv)·e + T·(a + kv_heads)·4 (8).
      if ((s.flags & layer_flags::qk_norm_per_head) != 0)
        r.parts.attention.input_grad +=
            a.split(bytes{checked_mul(checked_mul(T, q + kv), em)}) +
            a.split(bytes{checked_mul(checked_mul(T, s.heads + s.kv_heads), rms ? 4 : 8)});
      r.input = stream;
      r.input_in_saved = true;
      if ((s.flags & layer_flags::moe) != 0) {
        // The pre-MLP norm is Transformer Engine's LayerNorm (TENorm): its input, its output (which
        // the router keeps) and fp32 mean and rstd, as the LayerNorm-Linear it replaces.
        const megatron_moe_bytes moe = megatron_moe(s, c, T);
        r.parts.mlp = moe.saved;
        if (drop) r.parts.mlp.input_grad += a.rep(bytes{H});  // the MLP's bias-dropout-add mask
        r.saved = r.parts.total();
        r.forward_temporary = max_b(max_b(stream, attention_forward), moe.forward_temporary);
        r.backward_temporary = max_b(moe.backward_temporary, attention_backward) + stream * 2;
        break;
      }
      const std::uint64_t F = checked_mul(T, s.ffn);
      r.parts.mlp.input_grad = a.split(bytes{checked_mul(F, (gated ? 2 : 1) * em)});  // the activation's input
      r.parts.mlp.weight_grad = a.split(bytes{checked_mul(F, em)});                  // the down projection's input
      if (drop) r.parts.mlp.input_grad += a.rep(bytes{H});
      r.saved = r.parts.total();
      r.forward_temporary = max_b(stream, attention_forward);
      r.backward_temporary = max_b(a.split(bytes{checked_mul(F, (gated ? 3 : 2) * em)}), attention_backward) + stream * 2;
      if (c.sp) r.comm = a.values_per_token(s.hidden);
      break;
    }
    case layer_kind::output: {
      const std::uint64_t vocab =
          (s.flags & layer_flags::vocab_replicated) != 0 ? s.vocab : ceil_div(s.vocab, c.tp);
      const std::uint64_t TV = checked_mul(T, vocab);
      r.saved.weight_grad = a.rep(bytes{checked_mul(H, em)});  // ColumnParallelLinear's input
      r.input = r.saved.weight_grad;
      r.input_in_saved = true;
      r.input_serves_weight_grad = true;
      r.logits = bytes{checked_mul(TV, em)};
      // The logits and their fp32 copy (cross_entropy.py: the softmax is computed in place in the
      // copy and kept); the dataloader's causal mask [b, 1, s, s] (bool) lives through the
      // forward step. Backward: the fp32 gradient and its cast, the input's gradient.
      const bytes mask{checked_mul(c.micro_batch, checked_mul(a.seq, a.seq))};
      r.forward_temporary = bytes{checked_mul(TV, em + 4)} + mask;
      r.backward_temporary = bytes{checked_mul(TV, em + 4)} + a.rep(bytes{checked_mul(H, em)});
      if (c.sp) r.comm = a.values_per_token(s.hidden);
      break;
    }
    default:
      r.handled = false;
      break;
  }
  return r;
}

/// The cuBLAS workspaces out of the caching allocator, in every phase: PyTorch's for the main
/// thread and for the autograd thread, Transformer Engine's (transformer_engine/pytorch/
/// cpp_extensions/gemm.py, get_cublas_workspace); with grouped-GEMM experts also one per compute
/// stream of TE's grouped GEMM (the same function with grouped_gemm=True:
/// tex.get_num_cublas_streams(), 4 in common/util/multi_stream.cpp), kept for the process.
constexpr bytes megatron_workspaces(const model_desc& model, const device_desc& d) {
  bytes w = d.blas_workspace * 2 + te_cublas_workspace(d);
  for (const layer_desc& l : model)
    if (l.kind == layer_kind::transformer_block && (l.shape.flags & layer_flags::moe) != 0) {
      w += te_cublas_workspace(d) * 4;
      break;
    }
  return w;
}

}  // namespace detail
}  // namespace memalg

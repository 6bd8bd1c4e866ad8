// SPDX-License-Identifier: BSL-1.0
// memalg/plan/stacks/megatron.hpp — the `megatron` stack: Megatron-core's GPT layers with
// Transformer Engine (docs/algebra.md, "The megatron stack"; checked against Megatron-LM's golden
// values, bench/megatron/golden.json).
#pragma once

#include <cstdint>
#include <string_view>

#include "memalg/device/device.hpp"
#include "memalg/plan/stacks/common.hpp"

namespace memalg {
namespace detail {

/// The `megatron` stack: Megatron-core's GPT layers with Transformer Engine (docs/algebra.md, "The
/// megatron stack", with the file of every term; checked against Megatron-LM's golden values,
/// bench/megatron/golden.json). TE's fused LayerNorm-Linear keeps the norm's input and output
/// and fp32 mean / rstd; the fused attention keeps contiguous Q, K, V (K and V at the key/value
/// heads), its output and fp32 softmax statistics, no scores; the bias-dropout-add keeps a bool
/// mask; the MLP the GeLU's input and output (SwiGLU: the gated projection's output and the down
/// projection's input); a mixture of experts its router's scores and map, the permuted tokens, the
/// grouped experts' inputs, SwiGLU input and output (megatron_moe below). The loss (vocabulary-parallel
/// cross entropy) holds the bf16 logits and their fp32 copy and works in place. Other kinds follow
/// the paper accounting.
constexpr raw_activations megatron_activations(const layer_desc& l, const activation_context& c);

/// Megatron-core's MoELayer (megatron/core/transformer/moe/) on one tensor-parallel rank, dropless,
/// with the Sinkhorn router or the softmax top-k router and its load-balancing loss, the allgather
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
  const auto b = [](std::uint64_t n) { return bytes{n}; };
  // The router (router.py, TopKRouter) on the rank's T tokens and all E experts:
  // RouterGatingLinearFunction (moe_utils.py) keeps its input, the pre-MLP norm's output (counted
  // with the norm), and makes bf16 logits (moe_router_dtype unset: the input's dtype).
  bytes router{};
  if (s.router_sinkhorn) {
    // sinkhorn_load_balancing picks the experts under no_grad and keeps the sigmoid of the
    // logits for top-1 (bf16), the fp32 softmax for top-k (its cast back is not kept);
    // `scores = logits * map` keeps the bool map, which with one expert-parallel rank is also
    // the dispatcher's local_map (below).
    router = b(checked_mul(TE, k == 1 ? em : 4)) + b(TE);
    if (ep > 1 && !a2a) router += b(GE);
  } else {
    // topk_routing_with_score_function (moe_utils.py; softmax, moe_router_pre_softmax off, not
    // fused: Megatron's defaults): torch.topk of the logits, whose backward keeps the int64
    // indices (derivatives.yaml, `value_selecting_reduction_backward`; the scatter into the
    // [T, E] probabilities keeps the same tensor), and the fp32 softmax of the k scores, whose
    // backward keeps its result (`_softmax_backward_data(grad, result, ...)`); the bool routing
    // map is built under no autograd, and only the dispatcher's local_map of it stays (below).
    // The load-balancing loss (`_apply_aux_loss`; compute_routing_scores_for_aux_loss) keeps
    // the fp32 softmax over all E experts until the backward: counted whether or not
    // --moe-aux-loss-coeff is set (Megatron's Mixtral and Qwen3-MoE recipes set it), a bound
    // either way; switch_load_balancing_loss_func's products and MoEAuxLossAutoScaler keep
    // E-sized tensors and a scalar.
    // (The map the dispatcher keeps: allgather's local_map, G·E/ep; all-to-all's routing_map, T·E.)
    router = b(checked_mul(Tk, 8 + 4)) + b(a2a ? TE : GE) + b(checked_mul(TE, 4));
    // The routing's moment (forward): the logits, the [T, E] probabilities scattered from a zero
    // tensor, the int32 map before its cast to bool and the loss's fp32 scores; backward: the
    // probabilities' gradient, the topk backward's zero-filled [T, E] gradient, the loss's fp32
    // softmax gradient and its cast back to the logits' dtype.
    r.forward_temporary = b(checked_mul(TE, 2 * em + 4 + 4));
    r.backward_temporary = b(checked_mul(TE, 3 * em + 4));
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
    router += b(checked_mul(GE, em)) + b(GE) + b(checked_mul(R, 8));
    if (ep > 1)  // the gathered [G, E] probabilities and map, and the local columns' contiguous copy
      r.forward_temporary = max_b(r.forward_temporary, b(checked_mul(checked_mul(G, E), em + 1)) + b(checked_mul(GE, em)));
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
    r.forward_temporary = max_b(r.forward_temporary, b(checked_mul(TE, em + 1)) + own_rows + rows * 2);
  }
  // The experts (experts.py, TEGroupedMLP._fused_forward; Transformer Engine's ops
  // GroupedLinear, ScaledSwiGLU, GroupedLinear in ops/basic/): FC1 keeps its input (the permuted
  // rows, for its weight gradient), ScaledSwiGLU its input (FC1's output, 2f wide) and its scales
  // (the routed probabilities), FC2 its input (the scaled SwiGLU output).
  r.saved.weight_grad = b(checked_mul(R, checked_mul(h, em))) + b(checked_mul(R, checked_mul(f, em)));
  r.saved.input_grad = b(checked_mul(R, checked_mul(2 * f, em))) + b(checked_mul(R, em)) + router;
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
  bytes combine = gathered * 2 + (ep > 1 ? stream : bytes{});
  if (a2a) combine = max_b(rows * 2, max_b(rows + own_rows, stream * 2));
  r.forward_temporary = max_b(r.forward_temporary, max_b(b(checked_mul(R, checked_mul(f, em))), combine));
  // Backward, one autograd function (ops/fuser.py) holding its output gradient (R·h) throughout:
  // FC2's input gradient (R·f) and its weight gradient (E/ep·f·h in the weights' dtype: no
  // gradient accumulation fusion), then ScaledSwiGLU's scaled gradient (R·f), its input gradient
  // (R·2f) and the recomputed SwiGLU for the scales' gradient (R·f, and R for the products); then
  // FC1's input gradient (R·h) and weight gradient (E/ep·2f·h) beside FC2's.
  const bytes wgrad2 = b(checked_mul(El, checked_mul(checked_mul(f, h), ew)));
  const bytes glu = b(checked_mul(R, checked_mul(h + 5 * f + 1, em))) + wgrad2;
  const bytes fc1 = b(checked_mul(R, checked_mul(2 * h + 2 * f, em))) + wgrad2 * 3;
  r.backward_temporary = max_b(r.backward_temporary, max_b(glu, fc1));
  // With ep > 1 the combine's backward all-gathers the output gradient ([G, h]) before
  // unpermute's backward selects its R rows, and permute's backward adds the rows' gradients into
  // a zero [G, h] that the gather's backward reduce-scatters into a new [T, h]
  // (tensor_parallel/mappings.py, _ReduceScatterToSequenceParallelRegion and
  // _GatherFromSequenceParallelRegion).
  if (ep > 1 && !a2a)
    r.backward_temporary = max_b(r.backward_temporary, gathered + b(checked_mul(R > T ? R : T, checked_mul(h, em))));
  // All-to-all, backward: unpermute's backward selects the T·k rows' gradient from [T, h], the
  // all_to_all's backward sends it back (R·h) and the regrouping's backward copies it (R·h)
  // before the experts' backward; after it the same in reverse, and permute's backward adds the
  // T·k rows' gradient into a zero [T, h] and scatters the probabilities' into a zero [E·T].
  if (a2a)
    r.backward_temporary = max_b(r.backward_temporary,
                                 max_b(max_b(own_rows + rows, rows * 2), own_rows + stream + b(checked_mul(TE, em))));
  return r;
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

/// Why the megatron stack cannot plan `model` on mesh `m`, as one sentence, or empty. It refuses
/// what Megatron-core implements but its rules do not follow (memalg plan --stack megatron exits
/// with the sentence; a type-level plan fails to compile, plan_issue::stack_does_not_model).
constexpr std::string_view megatron_unmodelled(const model_desc& model, const mesh_desc& m) {
  for (const layer_desc& l : model) {
    if ((l.shape.flags & layer_flags::softcap) != 0)
      return "the megatron stack does not model soft-capped attention scores or logits (Gemma 2's): plan it with "
             "--stack pytorch";
    if (l.kind != layer_kind::transformer_block) continue;
    const layer_shape& s = l.shape;
    if ((s.flags & (layer_flags::norms_after | layer_flags::norms_sandwich)) != 0)
      return "the megatron stack does not model norms after the sub-layers (OLMo 2's, Gemma 2's and Gemma 3's): "
             "plan it with --stack pytorch";
    if (s.kv_lora_rank != 0)
      return "the megatron stack does not model multi-head latent attention (DeepSeek-V3; Megatron-core's "
             "MLASelfAttention): plan it with --stack pytorch";
    if (s.attention_sinks)
      return "the megatron stack does not model attention sinks (gpt-oss; Megatron-core's learnable softmax "
             "offset, softmax_type learnable): plan it with --stack pytorch";
    if ((s.flags & layer_flags::qk_norm_whole) != 0)
      return "Megatron-core's qk_layernorm normalises each head; a norm over the whole query and key projections "
             "(OLMo 2's) is not in it: plan it with --stack pytorch";
    if (s.l2_qk_norm)
      return "the megatron stack does not model the weightless L2 norm on the query and key (Megatron-core's "
             "qk_l2_norm, Llama 4's): plan it with --stack pytorch";
    if ((s.flags & layer_flags::moe) == 0) continue;
    if (s.shared_ffn != 0)
      return "the megatron stack does not model shared experts (Megatron-core's SharedExpertMLP): plan it with "
             "--stack pytorch";
    if (s.clamped_swiglu)
      return "the megatron stack does not model clamped SwiGLU experts (gpt-oss): plan it with --stack pytorch";
    if (s.router_fp32)
      return "the megatron stack does not model a router in fp32 (DeepSeek-V3's; Megatron-core's --moe-router-dtype "
             "fp32): plan it with --stack pytorch";
    if ((s.flags & layer_flags::gated) == 0 || (s.flags & layer_flags::bias) != 0)
      return "the megatron stack models SwiGLU experts without biases only (Transformer Engine's fused grouped "
             "MLP; --swiglu --no-linear-bias)";
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
      // Two LayerNorm-Linear modules (QKV, FC1): input, normalised output, fp32 mean and rstd (rstd only for RMSNorm).
      const bytes norm_linear = stream * 2 + a.rep(bytes{checked_mul(T, rms ? 4 : 8)});
      r.parts.norms.input_grad = norm_linear * 2;
      r.parts.attention.input_grad = a.split(bytes{checked_mul(checked_mul(T, q + 2 * kv), em)});  // Q, K, V
      r.parts.attention.weight_grad = a.split(bytes{checked_mul(checked_mul(T, q), em)});           // output
      r.parts.attention.core = a.split(bytes{checked_mul(checked_mul(T, s.heads), 4)});              // softmax statistics
      if (drop) r.parts.attention.input_grad += a.rep(bytes{H});  // the attention's bias-dropout-add mask
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
        r.forward_temporary = max_b(stream, moe.forward_temporary);
        r.backward_temporary = moe.backward_temporary + stream * 2;
        break;
      }
      const std::uint64_t F = checked_mul(T, s.ffn);
      r.parts.mlp.input_grad = a.split(bytes{checked_mul(F, (gated ? 2 : 1) * em)});  // the activation's input
      r.parts.mlp.weight_grad = a.split(bytes{checked_mul(F, em)});                  // the down projection's input
      if (drop) r.parts.mlp.input_grad += a.rep(bytes{H});
      r.saved = r.parts.total();
      r.forward_temporary = stream;
      r.backward_temporary = a.split(bytes{checked_mul(F, (gated ? 3 : 2) * em)}) + stream * 2;
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

// SPDX-License-Identifier: BSL-1.0
// memalg/plan/stacks/megatron.hpp — the `megatron` stack: Megatron-core's GPT layers with
// Transformer Engine (docs/algebra.md, "The megatron stack"; checked against Megatron-LM's golden
// values, bench/megatron/golden.json).
#pragma once

#include <cstdint>

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
/// projection's input). The loss (vocabulary-parallel cross entropy) holds the bf16 logits and
/// their fp32 copy and works in place. Other kinds follow the paper accounting.
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
      const std::uint64_t F = checked_mul(T, s.ffn);
      r.parts.mlp.input_grad = a.split(bytes{checked_mul(F, (gated ? 2 : 1) * em)});  // the activation's input
      r.parts.mlp.weight_grad = a.split(bytes{checked_mul(F, em)});                  // the down projection's input
      if (drop) r.parts.mlp.input_grad += a.rep(bytes{H});
      r.saved = r.parts.total();
      r.input = stream;
      r.input_in_saved = true;
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

/// Three cuBLAS workspaces out of the caching allocator, in every phase: PyTorch's for the main
/// thread and for the autograd thread, Transformer Engine's
/// (transformer_engine/pytorch/cpp_extensions/gemm.py).
constexpr bytes megatron_workspaces(const device_desc& d) { return d.blas_workspace * 3; }

}  // namespace detail
}  // namespace memalg

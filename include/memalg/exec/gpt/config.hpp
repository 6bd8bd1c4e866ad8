// SPDX-License-Identifier: BSL-1.0
// memalg/exec/gpt/config.hpp — the GPT runtimes' configuration as runtime values, host-only.
//
// Kept apart from the trainers so that code which only lays a step out (exec/gpt/build_program.hpp)
// names the same `gpt_config` and `arena_sizes` without including any backend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memalg/exec/arena_layout.hpp"  // arena_sizes
#include "memalg/exec/hparams.hpp"
#include "memalg/train/optimizer.hpp"
#include "memalg/train/recipe.hpp"

namespace memalg::exec {

/// Everything the trainer needs to know, as runtime values (built from a plan by gpt_run.hpp).
struct gpt_config {
  // model
  std::size_t vocab = 256, positions = 64, hidden = 64, layers = 2, heads = 4, ffn = 256;
  bool flash = false;
  float dropout = 0.0f;
  // batch
  std::size_t micro_batch = 4, sequence = 64, grad_accum = 1;
  recompute_kind recompute = recompute_kind::none;
  std::size_t recompute_every = 1;
  // mesh
  std::size_t dp = 1, tp = 1;
  std::size_t pp = 1;  ///< pipeline stages (1F1B; the blocks split as the planner splits them)
  int zero_stage = 0;
  // tensor-parallel layout (false: embeddings and tied output replicated)
  bool vocab_parallel = false;     ///< tp > 1: embedding rows, logits and loss split by vocabulary (Megatron)
  bool sequence_parallel = false;  ///< tp > 1: norms, dropout and residuals on this rank's tokens (needs vocab_parallel)
  // precision and optimizer
  bool master_weights = false;  ///< fp32 master copy (mixed precision)
  bool loss_scaling = false;    ///< dynamic loss scaling (fp16)
  optimizer_kind optimizer = optimizer_kind::adamw;
  // hyper-parameters: exec/hparams.hpp's defaults (with_hparams sets them)
  float lr = default_hparams.lr, weight_decay = default_hparams.weight_decay, momentum = default_hparams.momentum,
        beta1 = default_hparams.beta1, beta2 = default_hparams.beta2, eps = default_hparams.eps;
  float max_grad_norm = default_hparams.max_grad_norm;  ///< ≤ 0: no clipping
  std::uint64_t seed = 1;
  // block variant (GPT-2's by default)
  std::size_t kv_heads = 0;     ///< key/value heads (0: heads; fewer: grouped-query attention)
  std::size_t head_dim = 0;     ///< 0: hidden / heads
  bool rms_norm = false;        ///< RMSNorm instead of LayerNorm
  double norm_eps = 0;          ///< the norms' ε (0: the kind's default, memalg::default_norm_eps)
  bool gated = false;           ///< SwiGLU MLP (fc1 writes [gate ‖ up]) instead of GeLU
  bool bias = true;             ///< biases of the projections and LayerNorms
  bool qkv_bias = false;        ///< without `bias`: biases on the q, k, v projection only (Qwen2)
  bool qk_norm = false;         ///< an RMSNorm over head_dim on each query and key head, before the
                                ///< rotary positions (Qwen3's q_norm, k_norm: weights [D] each, ones at start)
  bool sandwich_norms = false;  ///< Gemma's block: RMSNorms before and after each sub-layer, every norm
                                ///< (the final one too) scaling by 1 + w, weights zero at start
  bool geglu = false;           ///< with `gated`: GeGLU (Gemma's gelu_pytorch_tanh on the gate), not SwiGLU
  bool embed_scale = false;     ///< the token embedding times √hidden, rounded to the storage type (Gemma)
  float attn_softcap = 0;       ///< attention scores capped to c·tanh(s/c) (Gemma 2; 0: none)
  float final_softcap = 0;      ///< logits capped likewise before the loss (Gemma 2; 0: none)
  std::size_t sliding_window = 0;  ///< layers 0, 2, 4, … attend to the last sliding_window positions (Gemma 2)
  float query_scalar = 0;       ///< scores scaled by query_scalar^−½ (Gemma 2's query_pre_attn_scalar; 0: 1/√D)
  bool tied = true;             ///< the output layer shares the token embedding (else an `lm_head` unit)
  float rope_theta = 10000.0f;  ///< positions == 0: rotary positions (RoPE base θ)
  std::size_t rotary_dim = 0;   ///< rotated dimensions per head (0: the whole head; GPT-NeoX's rotary_pct)
  std::size_t loss_chunk = 0;   ///< logits rows projected and turned into their gradient at a time (0: all)
  bool parallel_residual = false;  ///< y = x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX, GPT-J, Falcon)
  bool shared_norm = false;        ///< parallel with one norm: y = x + attn(ln(x)) + mlp(ln(x)) (Falcon-7B;
                                   ///< a LayerNorm keeps its shift without `bias`, as nn.LayerNorm)
};

}  // namespace memalg::exec

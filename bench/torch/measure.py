#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""Ground-truth memory of Hugging Face training steps, for checking `memalg` against.

Every case builds a causal language model from its `configs/<name>.json` with random weights (no
download), runs steady-state training steps and records the exact peak of live tensor bytes, its
breakdown by category and the phase where it occurs. See README.md for the method.

    python bench/torch/measure.py --all                # the whole CPU matrix -> measured.json
    python bench/torch/measure.py --cases 'llama*'     # a subset, printed (add --out FILE to keep)
    python bench/torch/measure.py --selftest           # the hand-checked tiny model
    python bench/torch/measure.py --explain llama-s1024 [--top N] [--phases] [--json FILE]
                                                       # every storage live at the peak, grouped
    python bench/torch/measure.py --device cuda        # the quick subset on a GPU -> measured_cuda.json
"""

import argparse
import contextlib
import fnmatch
import gc
import json
import math
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import warnings
import weakref

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

import torch  # noqa: E402
import transformers  # noqa: E402

warnings.filterwarnings("ignore", message=".*Profiler clears events.*")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CONFIGS = os.path.join(HERE, "configs")
PINNED = {"torch": "2.11.0", "transformers": "5.17.0"}
PHASES = ("forward", "loss", "backward", "optimizer", "zero_grad")
CATEGORIES = ("PARAMETER", "OPTIMIZER_STATE", "INPUT", "TEMPORARY", "ACTIVATION", "GRADIENT",
              "AUTOGRAD_DETAIL", "unknown")
SEED = 1234
MB = 1e6

# --------------------------------------------------------------------------------------------
# Model configurations: small, with the standard Hugging Face keys the importer
# (tools/hf_config.cpp) reads for each model_type written explicitly.


def family_config(family, layers, dropout=0.0, tied=None, hidden=256, heads=4, vocab=None, ffn=None, sites=None,
                  kv_heads=None, head_dim=None, parallel=None, experts=None, top_k=None, rotary_pct=None,
                  positions=None, window=None, layer_types=None):
    """The config.json dictionary of a small model of `family` (a variant name). `dropout` is every
    site's probability; `sites` ({"embedding", "attention", "residual"} -> p), when given, each
    site's own (absent: 0). `kv_heads`, `head_dim`, `parallel` (the parallel-residual block),
    `experts`, `top_k` and `rotary_pct`, when given, override the family's default; `window` (the
    sliding window's tokens) and `layer_types` (each layer's "sliding_attention" or
    "full_attention") the Gemma families'."""
    h = hidden
    f = ffn or 4 * h
    if sites is None:
        sites = {"embedding": dropout, "attention": dropout, "residual": dropout}
    p_emb, p_att, p_res = (sites.get(k, 0.0) for k in ("embedding", "attention", "residual"))
    if family == "gpt2":
        c = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257,
             "n_positions": positions or 1024, "n_embd": h, "n_layer": layers, "n_head": heads, "n_inner": f,
             "activation_function": "gelu_new", "resid_pdrop": p_res, "embd_pdrop": p_emb,
             "attn_pdrop": p_att, "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
             "tie_word_embeddings": True if tied is None else tied}
    elif family in ("llama", "mistral", "qwen2"):
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}[family]
        c = {"architectures": [arch], "model_type": family, "vocab_size": 32000, "hidden_size": h,
             "intermediate_size": f, "num_hidden_layers": layers,
             "num_attention_heads": heads, "num_key_value_heads": kv_heads or heads // 2,
             "head_dim": head_dim or h // heads, "hidden_act": "silu",
             "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
             "attention_dropout": p_att, "initializer_range": 0.02,
             "tie_word_embeddings": False if tied is None else tied}
        if family == "llama":
            c.update({"attention_bias": False, "mlp_bias": False})
        if family == "mistral":
            c.update({"sliding_window": 4096})
        if family == "qwen2":
            c.update({"use_sliding_window": False, "sliding_window": None})
    elif family in ("qwen3", "olmo2"):
        # Qwen3: Llama's block with QK-norm per head (no q, k, v biases); OLMo 2: QK-norm over the
        # whole projections and the block's norms after attention and after the MLP.
        arch = {"qwen3": "Qwen3ForCausalLM", "olmo2": "Olmo2ForCausalLM"}[family]
        c = {"architectures": [arch], "model_type": family, "vocab_size": 32000, "hidden_size": h,
             "intermediate_size": f, "num_hidden_layers": layers,
             "num_attention_heads": heads, "num_key_value_heads": kv_heads or heads // 2,
             "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
             "rope_theta": 10000.0, "attention_bias": False, "attention_dropout": p_att,
             "initializer_range": 0.02, "tie_word_embeddings": False if tied is None else tied}
        if family == "qwen3":
            c.update({"head_dim": head_dim or h // heads, "use_sliding_window": False, "sliding_window": None})
    elif family == "qwen3_moe":
        # Qwen3's attention (QK-norm per head) with Mixtral's kind of sparse MLP on every layer
        # (decoder_sparse_step 1): the router's top-k probabilities renormalised (norm_topk_prob,
        # as Qwen3-30B-A3B) and cast to the logits' dtype, the experts as 3-D tensors.
        c = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 32000,
             "hidden_size": h, "intermediate_size": ffn or 2 * h, "moe_intermediate_size": ffn or h,
             "num_hidden_layers": layers, "num_attention_heads": heads,
             "num_key_value_heads": kv_heads or heads // 2, "head_dim": head_dim or h // heads,
             "num_experts": experts or 8, "num_experts_per_tok": top_k or 2, "norm_topk_prob": True,
             "decoder_sparse_step": 1, "mlp_only_layers": [], "output_router_logits": False,
             "router_aux_loss_coef": 0.001, "hidden_act": "silu", "max_position_embeddings": 4096,
             "rms_norm_eps": 1e-6, "rope_theta": 1e6, "attention_bias": False, "use_sliding_window": False,
             "sliding_window": None, "attention_dropout": p_att, "initializer_range": 0.02,
             "tie_word_embeddings": False if tied is None else tied}
    elif family == "deepseek_v3":
        # DeepSeek-V3's multi-head latent attention (q and kv compressed to ranks 96 and 64, heads
        # of 32 + 16 rotary dimensions for q and k, 32 for v, rotary pairs interleaved as
        # released) before a dense MLP on the first layer (first_k_dense_replace) and, after it,
        # 8 routed experts of width 128 in 4 groups (2 chosen per token before its top-k) with one
        # shared expert.
        c = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 32000,
             "hidden_size": h, "intermediate_size": ffn or 2 * h, "moe_intermediate_size": h // 2,
             "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": heads,
             "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
             "v_head_dim": 32, "n_routed_experts": experts or 8, "num_experts_per_tok": top_k or 2,
             "n_group": 4, "topk_group": 2, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
             "first_k_dense_replace": 1, "norm_topk_prob": True, "rope_interleave": True,
             "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
             "rope_theta": 10000.0, "attention_bias": False, "attention_dropout": p_att,
             "initializer_range": 0.02, "tie_word_embeddings": False if tied is None else tied}
    elif family == "gpt_oss":
        # gpt-oss: attention sinks (a learned logit per head beside the scores; eager attention
        # only, the model does not support SDPA), biases on q, k, v and o, local (window 128) and
        # global layers alternating, every layer sparse: a router with a bias whose softmax runs
        # over the top-k logits, experts with biases and the clamped SwiGLU.
        c = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 32000,
             "hidden_size": h, "intermediate_size": ffn or h, "num_hidden_layers": layers,
             "num_attention_heads": heads, "num_key_value_heads": kv_heads or heads // 2,
             "head_dim": head_dim or 64, "num_local_experts": experts or 8,
             "num_experts_per_tok": top_k or 2, "sliding_window": window or 128,
             "layer_types": layer_types or [("sliding_attention" if i % 2 == 0 else "full_attention")
                                            for i in range(layers)],
             "attention_bias": True, "hidden_act": "silu", "max_position_embeddings": 4096,
             "rms_norm_eps": 1e-5, "rope_theta": 150000.0, "attention_dropout": p_att,
             "router_aux_loss_coef": 0.001, "output_router_logits": False, "initializer_range": 0.02,
             "tie_word_embeddings": False if tied is None else tied}
    elif family == "llama4":
        # Llama 4's text model (Llama4ForCausalLM): sparse layers every second one
        # (interleave_moe_layer_step 2; 4 experts of width `ffn or h` computed densely over every
        # expert, and a shared expert of the same width), dense layers of width 2h
        # (intermediate_size_mlp); every fourth layer NoPE with attention temperature tuning and
        # full attention, the others rotary with the weightless L2 QK-norm and chunked attention
        # (chunks of `window or 8192` tokens, as released).
        c = {"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "vocab_size": 32000,
             "hidden_size": h, "intermediate_size": ffn or h, "intermediate_size_mlp": 2 * h,
             "num_hidden_layers": layers, "num_attention_heads": heads,
             "num_key_value_heads": kv_heads or heads // 2, "head_dim": head_dim or h // heads,
             "num_local_experts": experts or 4, "num_experts_per_tok": top_k or 1,
             "interleave_moe_layer_step": 2, "no_rope_layer_interval": 4, "use_qk_norm": True,
             "attention_chunk_size": window or 8192, "attn_temperature_tuning": True, "floor_scale": 8192,
             "attn_scale": 0.1, "output_router_logits": False, "router_aux_loss_coef": 0.001,
             "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
             "rope_theta": 500000.0, "attention_bias": False, "attention_dropout": p_att,
             "initializer_range": 0.02, "tie_word_embeddings": False if tied is None else tied}
    elif family == "mixtral":
        c = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 32000,
             "hidden_size": h, "intermediate_size": ffn or 2 * h, "num_hidden_layers": layers,
             "num_attention_heads": heads, "num_key_value_heads": kv_heads or heads // 2,
             "head_dim": head_dim or h // heads,
             "num_local_experts": experts or 4, "num_experts_per_tok": top_k or 2, "output_router_logits": False,
             "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0, "hidden_act": "silu",
             "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
             "sliding_window": None, "attention_dropout": p_att, "initializer_range": 0.02,
             "tie_word_embeddings": False if tied is None else tied}
    elif family == "gpt_neox":
        c = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": 50304,
             "hidden_size": h, "intermediate_size": f, "num_hidden_layers": layers,
             "num_attention_heads": heads, "rotary_pct": 0.25 if rotary_pct is None else rotary_pct,
             "rotary_emb_base": 10000, "use_parallel_residual": True if parallel is None else parallel,
             "hidden_act": "gelu", "max_position_embeddings": 2048,
             "layer_norm_eps": 1e-5, "attention_dropout": p_att, "hidden_dropout": p_res,
             "initializer_range": 0.02, "tie_word_embeddings": False if tied is None else tied}
    elif family in ("falcon", "falcon-new"):
        # falcon-new: the new decoder architecture (grouped-query, two norms, always parallel);
        # falcon: multi-query unless kv_heads equals heads.
        new = family == "falcon-new"
        c = {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "vocab_size": 65024,
             "hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads,
             "new_decoder_architecture": new, "multi_query": not new and kv_heads != heads,
             "parallel_attn": True if parallel is None else parallel,
             "bias": False, "alibi": False, "ffn_hidden_size": f, "layer_norm_epsilon": 1e-5,
             "hidden_dropout": p_res, "attention_dropout": p_att, "initializer_range": 0.02,
             "tie_word_embeddings": True if tied is None else tied}
        if new:
            c.update({"num_kv_heads": kv_heads or heads // 2, "num_ln_in_parallel_attn": 2})
    elif family == "phi3":
        c = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 32064, "hidden_size": h,
             "intermediate_size": f, "num_hidden_layers": layers, "num_attention_heads": heads,
             "num_key_value_heads": kv_heads or heads // 2, "hidden_act": "silu",
             "max_position_embeddings": 4096, "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
             "rope_theta": 10000.0, "attention_dropout": p_att, "embd_pdrop": p_emb, "resid_pdrop": p_res,
             "sliding_window": None, "initializer_range": 0.02,
             "tie_word_embeddings": False if tied is None else tied}
    elif family == "starcoder2":
        c = {"architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2", "vocab_size": 49152,
             "hidden_size": h, "intermediate_size": f, "num_hidden_layers": layers,
             "num_attention_heads": heads, "num_key_value_heads": kv_heads or heads // 2,
             "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 4096, "norm_epsilon": 1e-5,
             "rope_theta": 10000.0, "use_bias": True, "sliding_window": None, "attention_dropout": p_att,
             "residual_dropout": p_res, "embedding_dropout": p_emb, "initializer_range": 0.02,
             "tie_word_embeddings": True if tied is None else tied}
    elif family == "gpt_bigcode":
        c = {"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "vocab_size": 49152,
             "n_positions": positions or 1024, "n_embd": h, "n_layer": layers, "n_head": heads, "n_inner": f,
             "activation_function": "gelu_pytorch_tanh", "resid_pdrop": p_res, "embd_pdrop": p_emb,
             "attn_pdrop": p_att, "layer_norm_epsilon": 1e-5, "multi_query": kv_heads in (None, 1),
             "initializer_range": 0.02,
             "tie_word_embeddings": True if tied is None else tied}
    elif family in ("gemma2", "gemma3"):
        # Gemma 2: four norms per block, GeGLU, the embedding scaled by sqrt(h), soft-capped scores
        # and logits, sliding-window and global layers alternating. Gemma 3 (the text model,
        # Gemma3ForCausalLM): no soft-capping, QK-norm per head, a rotary table per layer type.
        g2 = family == "gemma2"
        kv = kv_heads or heads // 2
        c = {"architectures": ["Gemma2ForCausalLM" if g2 else "Gemma3ForCausalLM"],
             "model_type": "gemma2" if g2 else "gemma3_text", "vocab_size": 32000, "hidden_size": h,
             "intermediate_size": f, "num_hidden_layers": layers, "num_attention_heads": heads,
             "num_key_value_heads": kv, "head_dim": head_dim or h // heads,
             "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
             "attention_bias": False, "attention_dropout": p_att, "query_pre_attn_scalar": head_dim or h // heads,
             "sliding_window": window or 4096, "initializer_range": 0.02,
             "tie_word_embeddings": True if tied is None else tied}
        if g2:
            c.update({"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                      "layer_types": layer_types or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                                     for i in range(layers)]})
        else:
            c.update({"layer_types": layer_types or ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                                     for i in range(layers)]})
    else:
        raise ValueError("unknown family " + family)
    if vocab is not None:
        c["vocab_size"] = vocab
        if family == "phi3" and vocab <= 32000:
            # Phi3Config's pad_token_id (32000) must index the table; it changes no tensor's size.
            c["pad_token_id"] = vocab - 1
    c["use_cache"] = False
    return c


# --------------------------------------------------------------------------------------------
# The matrix.

DEFAULTS = {"attention": "sdpa", "precision": "fp32", "optimizer": "adamw", "foreach": True,
            "momentum": 0.0, "gradient_checkpointing": False, "micro_batch": 2, "seq": 256,
            "layers": 2, "world": 1, "parallel": "none", "dropout": 0.0, "tied": None,
            "bucket_cap_mb": None, "crosscheck": False, "hidden": 256, "heads": 4, "vocab": None, "ffn": None,
            # Axes of the generated matrix (generate.py); these defaults are the hand-picked cases'.
            "reentrant": False, "fused": False, "grad_accum": 1, "sites": None, "kv_heads": None,
            "head_dim": None, "parallel_residual": None, "experts": None, "top_k": None, "rotary_pct": None,
            "positions": None, "window": None, "layer_types": None, "router_logits": False,
            # Fine-tuning (PEFT, bitsandbytes): LoRA of rank `lora` on `lora_targets` (PEFT's
            # target_modules: "all-linear" or module names) with adapter dropout `lora_dropout`;
            # `quant` stores the base in 4 bits ("nf4", "fp4"; "-dq": double quantization) or
            # 8 (LLM.int8, "int8") and prepares it with prepare_model_for_kbit_training.
            "lora": None, "lora_targets": "all-linear", "lora_dropout": 0.0, "quant": None,
            # Frozen parts without adapters (memalg's --freeze): "embedding", "output", "layers:K"
            # (the first K blocks), their parameters with requires_grad off.
            "freeze": None,
            "group": "base", "generator": None}


def case(name, variant, **kw):
    c = dict(DEFAULTS)
    c.update(kw)
    c["name"] = name
    c["variant"] = variant
    return c


def matrix():
    m = []
    add = m.append
    # One of each family (and both Falcon architectures), SDPA and eager attention.
    for v, n in (("gpt2", "gpt2"), ("llama", "llama"), ("mistral", "mistral"), ("mixtral", "mixtral"),
                 ("qwen2", "qwen2"), ("gpt_neox", "neox"), ("falcon", "falcon"), ("falcon-new", "falcon-new")):
        add(case(n, v, crosscheck=n in ("llama", "mixtral")))
    for v, n in (("gpt2", "gpt2"), ("llama", "llama"), ("mistral", "mistral"), ("mixtral", "mixtral"),
                 ("qwen2", "qwen2"), ("gpt_neox", "neox"), ("falcon", "falcon")):
        add(case(n + "-eager", v, attention="eager", crosscheck=n == "gpt2"))
    # Long sequences, where the eager score matrices matter.
    add(case("llama-s1024", "llama", seq=1024))
    add(case("llama-eager-s1024", "llama", attention="eager", seq=1024))
    add(case("gpt2-s1024", "gpt2", seq=1024))
    add(case("gpt2-eager-s1024", "gpt2", attention="eager", seq=1024))
    # Scaling in sequence length, micro-batch and depth.
    add(case("llama-s512", "llama", seq=512))
    add(case("llama-b1", "llama", micro_batch=1))
    add(case("llama-b4", "llama", micro_batch=4))
    add(case("gpt2-b4", "gpt2", micro_batch=4))
    add(case("llama-l4", "llama", layers=4))
    add(case("llama-l8", "llama", layers=8))
    add(case("gpt2-l6", "gpt2", layers=6))
    # Precision: pure bf16 and autocast bf16 (few and small: bf16 matrix products are slow on CPUs).
    add(case("llama-bf16", "llama", precision="bf16"))
    add(case("gpt2-bf16", "gpt2", precision="bf16"))
    add(case("neox-bf16", "gpt_neox", precision="bf16"))
    add(case("llama-autocast", "llama", precision="autocast-bf16", crosscheck=True))
    add(case("gpt2-autocast", "gpt2", precision="autocast-bf16"))
    add(case("qwen2-autocast", "qwen2", precision="autocast-bf16"))
    # Gradient checkpointing.
    add(case("llama-gc", "llama", gradient_checkpointing=True, crosscheck=True))
    add(case("gpt2-gc", "gpt2", gradient_checkpointing=True))
    add(case("mixtral-gc", "mixtral", gradient_checkpointing=True))
    add(case("falcon-gc", "falcon", gradient_checkpointing=True))
    add(case("llama-eager-gc-s1024", "llama", attention="eager", gradient_checkpointing=True, seq=1024))
    # Optimizers: AdamW for-loop, SGD without and with momentum.
    add(case("llama-adamw-loop", "llama", foreach=False))
    add(case("gpt2-adamw-loop", "gpt2", foreach=False))
    add(case("llama-sgd", "llama", optimizer="sgd", foreach=True))
    add(case("gpt2-sgd", "gpt2", optimizer="sgd", foreach=True))
    add(case("llama-sgd-momentum", "llama", optimizer="sgd", foreach=True, momentum=0.9))
    # Dropout and tied embeddings.
    add(case("gpt2-dropout", "gpt2", dropout=0.1, attention="eager"))
    add(case("neox-dropout", "gpt_neox", dropout=0.1))
    add(case("qwen2-tied", "qwen2", tied=True))
    # Wider models, where the blocks' activations weigh more than the logits.
    wide = {"hidden": 1024, "heads": 8, "vocab": 8192, "layers": 4, "seq": 1024}
    add(case("llama-wide", "llama", crosscheck=True, ffn=2816, **wide))
    add(case("llama-wide-gc", "llama", gradient_checkpointing=True, ffn=2816, **wide))
    add(case("gpt2-wide", "gpt2", **wide))
    add(case("gpt2-wide-eager", "gpt2", attention="eager", **wide))
    # The optimizer step is the peak when the batch is small.
    add(case("llama-b1-adamw-loop", "llama", micro_batch=1, foreach=False))
    # QK-norm: Qwen3's per head, OLMo 2's over the whole projections (with its norms after the
    # sub-layers), in every precision, both attentions, with checkpointing, and wide.
    for v in ("qwen3", "olmo2"):
        add(case(v, v))
        add(case(v + "-eager", v, attention="eager"))
        add(case(v + "-bf16", v, precision="bf16"))
        add(case(v + "-autocast", v, precision="autocast-bf16"))
        add(case(v + "-gc", v, gradient_checkpointing=True))
        add(case(v + "-eager-s1024", v, attention="eager", seq=1024))
        add(case(v + "-wide", v, ffn=2816, **wide))
        # A vocabulary of 2000: the peak is a block's backward (eager attention's score
        # gradients), not the loss's, so the order in which the block frees its tensors counts.
        add(case(v + "-wide-eager", v, attention="eager", ffn=2816, **dict(wide, vocab=2000)))
    # Phi-3 (fused QKV and gate-up projections), StarCoder2 (LayerNorms, GeLU MLP, biases,
    # grouped-query attention) and GPT-BigCode (GPT-2 with one key and value head): compositions
    # of what the rules already follow, in fp32, bf16 or autocast, both attentions, checkpointing.
    for v, n, low in (("phi3", "phi3", "autocast-bf16"), ("starcoder2", "starcoder2", "bf16"),
                      ("gpt_bigcode", "bigcode", "autocast-bf16")):
        add(case(n, v))
        add(case(n + "-eager", v, attention="eager"))
        add(case(n + ("-autocast" if low == "autocast-bf16" else "-bf16"), v, precision=low))
        add(case(n + "-gc", v, gradient_checkpointing=True))
    # Gemma 2 (four norms, soft-capped scores and logits, GeGLU, scaled embedding) and Gemma 3
    # (QK-norm per head, a local and a global layer with their rotary tables): both attentions,
    # bf16 and autocast, checkpointing, and sliding windows shorter than the sequence.
    lg = ["sliding_attention", "full_attention"]
    for v in ("gemma2", "gemma3"):
        add(case(v, v, layer_types=lg))
        add(case(v + "-eager", v, attention="eager", layer_types=lg))
        add(case(v + "-bf16", v, precision="bf16", layer_types=lg))
        add(case(v + "-autocast", v, precision="autocast-bf16", attention="eager", layer_types=lg))
        add(case(v + "-gc", v, gradient_checkpointing=True, layer_types=lg))
        add(case(v + "-window", v, window=128, layer_types=lg))
        add(case(v + "-eager-window", v, attention="eager", window=128, layer_types=lg))
        add(case(v + "-wide-eager", v, attention="eager", ffn=2816, **dict(wide, vocab=2000)))
    # Checkpointing keeps the masks the blocks read: eager's two (global and local), SDPA's local
    # one when the window is shorter than the sequence; SDPA's masked path in bf16.
    add(case("gemma2-eager-gc", "gemma2", attention="eager", gradient_checkpointing=True, layer_types=lg))
    add(case("gemma3-gc-window", "gemma3", gradient_checkpointing=True, window=128, layer_types=lg))
    add(case("gemma3-bf16-window", "gemma3", precision="bf16", window=128, layer_types=lg))
    # Qwen3-MoE: Qwen3's attention before a sparse MLP on every layer (8 experts of width 256);
    # top-k 2 and 1, both attentions, bf16 and autocast, checkpointing.
    add(case("qwen3moe", "qwen3_moe"))
    add(case("qwen3moe-eager", "qwen3_moe", attention="eager"))
    add(case("qwen3moe-bf16", "qwen3_moe", precision="bf16"))
    add(case("qwen3moe-autocast", "qwen3_moe", precision="autocast-bf16"))
    add(case("qwen3moe-gc", "qwen3_moe", gradient_checkpointing=True))
    add(case("qwen3moe-top1", "qwen3_moe", top_k=1))
    # DeepSeek-V3: latent attention, a dense first layer, then routed and shared experts with
    # group-limited routing; top-k 2 and 1, both attentions, bf16 and autocast, checkpointing.
    # A vocabulary of 2000 and 2048 tokens a step: the blocks' tensors, not the loss's, make
    # most of the peak.
    ds = dict(vocab=2000, seq=1024, layers=3)
    add(case("dsv3", "deepseek_v3", **ds))
    add(case("dsv3-eager", "deepseek_v3", attention="eager", **ds))
    add(case("dsv3-bf16", "deepseek_v3", precision="bf16", **ds))
    add(case("dsv3-autocast", "deepseek_v3", precision="autocast-bf16", **ds))
    add(case("dsv3-gc", "deepseek_v3", gradient_checkpointing=True, micro_batch=4, **ds))
    add(case("dsv3-top1", "deepseek_v3", top_k=1, **ds))
    add(case("dsv3-v32k", "deepseek_v3"))
    # gpt-oss (eager attention only): sinks, local and global layers, biased experts with the
    # clamped SwiGLU; fp32, bf16, autocast, checkpointing, top-k 1, and a long sequence.
    add(case("gptoss", "gpt_oss", attention="eager", **ds))
    add(case("gptoss-bf16", "gpt_oss", attention="eager", precision="bf16", **ds))
    add(case("gptoss-autocast", "gpt_oss", attention="eager", precision="autocast-bf16", **ds))
    add(case("gptoss-gc", "gpt_oss", attention="eager", gradient_checkpointing=True, micro_batch=4, **ds))
    add(case("gptoss-top1", "gpt_oss", attention="eager", top_k=1, **ds))
    add(case("gptoss-v32k", "gpt_oss", attention="eager"))
    # Llama 4: dense and sparse layers interleaved, rotary layers (L2 QK-norm, chunked attention)
    # and a NoPE layer (temperature tuning, full attention), the experts computed densely over
    # all of them beside a shared expert; both attentions, bf16 and autocast, checkpointing,
    # top-k 1 (as released) and 2, and chunks shorter than the sequence.
    l4 = dict(vocab=2000, seq=1024, layers=4)
    add(case("llama4", "llama4", **l4))
    add(case("llama4-eager", "llama4", attention="eager", **l4))
    add(case("llama4-bf16", "llama4", precision="bf16", **l4))
    add(case("llama4-autocast", "llama4", precision="autocast-bf16", **l4))
    add(case("llama4-gc", "llama4", gradient_checkpointing=True, micro_batch=4, **l4))
    add(case("llama4-top2", "llama4", top_k=2, **l4))
    add(case("llama4-chunk", "llama4", window=256, **l4))
    add(case("llama4-eager-chunk", "llama4", attention="eager", window=256, **l4))
    # A chunk (or window) as long as the sequence still needs SDPA's mask (masking_utils.py keeps
    # it when the keys are at least the local size).
    add(case("llama4-chunk-seq", "llama4", window=1024, **l4))
    add(case("gemma3-window-seq", "gemma3", window=256, layer_types=lg))
    # The auxiliary load-balancing loss (output_router_logits): many experts and tokens, so that
    # the router logits it keeps (T·E a layer) are some megabytes; fp32, bf16, autocast,
    # checkpointing of both kinds (reentrant: the logits recorded carry no graph).
    aux = dict(vocab=2000, seq=1024, layers=3, experts=128, top_k=8, ffn=64, router_logits=True)
    add(case("qwen3moe-aux", "qwen3_moe", **aux))
    add(case("qwen3moe-aux-bf16", "qwen3_moe", precision="bf16", **aux))
    add(case("qwen3moe-aux-gc", "qwen3_moe", gradient_checkpointing=True, micro_batch=4, **aux))
    add(case("gptoss-aux-autocast", "gpt_oss", attention="eager", precision="autocast-bf16", **aux))
    add(case("mixtral-aux", "mixtral", **aux))
    # The same narrow experts without the auxiliary loss: the forward's peak at the experts.
    add(case("gptoss-narrow-autocast", "gpt_oss", attention="eager", precision="autocast-bf16", **dict(aux, router_logits=False)))
    add(case("mixtral-aux-gc-reentrant", "mixtral", gradient_checkpointing=True, reentrant=True, micro_batch=4, **aux))
    add(case("neox-sgd", "gpt_neox", optimizer="sgd"))
    # Two ranks over gloo: DDP (gradient buckets) and FSDP2 (fully_shard).
    add(case("llama-ddp", "llama", world=2, parallel="ddp", bucket_cap_mb=25))
    add(case("llama-ddp-bucket4", "llama", world=2, parallel="ddp", bucket_cap_mb=4))
    add(case("gpt2-ddp", "gpt2", world=2, parallel="ddp", bucket_cap_mb=25))
    add(case("llama-fsdp2", "llama", world=2, parallel="fsdp2"))
    add(case("gpt2-fsdp2", "gpt2", world=2, parallel="fsdp2"))
    # The mixtures of experts on two ranks: DDP and FSDP2 (each block a unit, its experts' 3-D
    # parameters sharded on their first dimension).
    for n, v, kw in (("qwen3moe", "qwen3_moe", {}), ("dsv3", "deepseek_v3", ds), ("gptoss", "gpt_oss", dict(ds, attention="eager")),
                     ("llama4", "llama4", l4)):
        add(case(n + "-ddp", v, world=2, parallel="ddp", bucket_cap_mb=25, **kw))
        add(case(n + "-fsdp2", v, world=2, parallel="fsdp2", **kw))
    m += finetune_cases()
    m += generated_cases()
    names = [c["name"] for c in m]
    assert len(names) == len(set(names)), "duplicate case names"
    return m


# The files of the groups that are not the generated matrix's (measured/<group>.json).
OWN_FILES = {"base": "measured.json", "finetune": "finetune.measured.json"}


def group_path(group, shard=None):
    """Where a group's measurements go: measured.json for the hand-picked cases,
    finetune.measured.json for the fine-tuning ones, measured/<group>[.shard-K-of-N].json for a
    generated group."""
    if group in OWN_FILES and not shard:
        return os.path.join(HERE, OWN_FILES[group])
    return os.path.join(MEASURED, group + (".shard-%d-of-%d" % shard if shard else "") + ".json")


def finetune_cases():
    """Fine-tuning with PEFT's LoRA and bitsandbytes' QLoRA, and frozen parts without adapters
    (the `ft-*` cases): measured into finetune.measured.json, the ground truth of the pytorch
    stack's fine-tuning rules (planner.measured compares them)."""
    m = []

    def add(c):
        c["group"] = "finetune"
        m.append(c)
    attn = ["q_proj", "k_proj", "v_proj", "o_proj"]
    big = dict(hidden=1024, heads=16, layers=4, vocab=32000, seq=512)
    lg = ["sliding_attention", "full_attention"]
    # LoRA on Llama: fp32, pure bf16 and autocast; all-linear and attention-only; ranks 8 to 64;
    # adapter dropout on and off; checkpointing of both kinds.
    add(case("ft-llama-lora8", "llama", lora=8, lora_dropout=0.05, **big))
    add(case("ft-llama-lora64-attn", "llama", lora=64, lora_targets=attn, **big))
    # (bf16 products run some hundred times slower on this CPU: the hand-picked cases' shape)
    add(case("ft-llama-lora16-bf16", "llama", lora=16, lora_dropout=0.1, precision="bf16", micro_batch=4, seq=512))
    add(case("ft-llama-lora16-autocast", "llama", lora=16, lora_dropout=0.1, precision="autocast-bf16"))
    add(case("ft-llama-lora16-gc", "llama", lora=16, lora_dropout=0.05, gradient_checkpointing=True, micro_batch=4, **big))
    add(case("ft-llama-lora16-gc-reentrant", "llama", lora=16, gradient_checkpointing=True, reentrant=True, micro_batch=4, **big))
    # Qwen3 (QK-norm) and Gemma 3 (four norms, local layers).
    add(case("ft-qwen3-lora16", "qwen3", lora=16, lora_dropout=0.05, **big))
    add(case("ft-qwen3-lora32-qv", "qwen3", lora=32, lora_targets=["q_proj", "v_proj"], **big))
    add(case("ft-qwen3-lora8-autocast-gc", "qwen3", lora=8, precision="autocast-bf16", gradient_checkpointing=True, micro_batch=4, vocab=32000))
    add(case("ft-gemma3-lora16", "gemma3", lora=16, lora_dropout=0.05, layer_types=lg * 2, **big))
    add(case("ft-gemma3-lora32-attn-eager", "gemma3", lora=32, lora_targets=attn, attention="eager", layer_types=lg * 2, **big))
    # QLoRA: the base in NF4 (double quantization on and off) and FP4, computing in
    # fp32 on the CPU; prepare_model_for_kbit_training with checkpointing on (its default) and off.
    add(case("ft-llama-qlora-nf4-dq", "llama", lora=16, lora_dropout=0.05, quant="nf4-dq", **big))
    add(case("ft-llama-qlora-nf4-dq-gc", "llama", lora=16, lora_dropout=0.05, quant="nf4-dq", gradient_checkpointing=True, micro_batch=4, **big))
    add(case("ft-qwen3-qlora-nf4", "qwen3", lora=16, quant="nf4", **big))
    add(case("ft-llama-qlora-fp4-attn", "llama", lora=64, lora_targets=attn, quant="fp4", **big))
    add(case("ft-gemma3-qlora-nf4-dq", "gemma3", lora=8, quant="nf4-dq", layer_types=lg * 2, **big))
    # Frozen parts without adapters (memalg's --freeze): a frozen trunk no gradient reaches, and
    # frozen blocks a gradient passes through to a trainable embedding (Qwen3's QK-norm; Gemma 3's
    # sandwich norms, its output tied to the trainable embedding), with checkpointing.
    add(case("ft-llama-freeze-emb-2", "llama", freeze=["embedding", "layers:2"], **big))
    add(case("ft-qwen3-freeze-output-1-gc", "qwen3", freeze=["output", "layers:1"], gradient_checkpointing=True,
             micro_batch=4, **big))
    add(case("ft-gemma3-freeze-3", "gemma3", freeze=["layers:3"], layer_types=lg * 2, **big))
    return m


MATRIX = os.path.join(HERE, "matrix")
MEASURED = os.path.join(HERE, "measured")


def generated_case(group, g):
    """A case of the generated matrix (matrix/<group>.json, drawn by generate.py) in the form the
    hand-picked cases have."""
    a, n = g["axes"], g["numbers"]
    fam = a["family"]
    variant = fam
    if fam == "falcon" and a["heads"] == "gqa":
        variant = "falcon-new"
    sites = {}
    if a["dropout"] != "off":
        from generate import DROPOUT_SITES
        on = DROPOUT_SITES[fam] if a["dropout"] == "all" else (a["dropout"],)
        sites = {k: n["dropout_p"] for k in on}
    opt = a["optimizer"]
    ranks = a["ranks"]
    return case(g["name"], variant, group=group, generator={"axes": a, "numbers": n},
                attention=a["attention"], precision=a["precision"],
                optimizer="adamw" if opt.startswith("adamw") else "sgd",
                foreach=opt not in ("adamw-for-loop", "adamw-fused"), fused=opt == "adamw-fused",
                momentum=0.9 if opt == "sgd-momentum" else 0.0,
                gradient_checkpointing=a["checkpointing"] != "off", reentrant=a["checkpointing"] == "reentrant",
                grad_accum=n["grad_accum"], micro_batch=n["micro_batch"], seq=n["seq"], layers=n["layers"],
                world=1 if ranks == "1" else 2, parallel={"1": "none", "ddp-2": "ddp", "fsdp2-2": "fsdp2"}[ranks],
                bucket_cap_mb=25 if ranks == "ddp-2" else None,
                dropout=max(sites.values()) if sites else 0.0, sites=sites,
                tied=a["embeddings"] == "tied", hidden=n["hidden"], heads=n["heads"], vocab=n["vocab"], ffn=n["ffn"],
                kv_heads=n["kv_heads"], head_dim=n["head_dim"],
                parallel_residual=(a["residual"] == "parallel") if fam in ("gpt_neox", "falcon") else None,
                experts=n.get("experts"), top_k=n.get("top_k"), rotary_pct=n.get("rotary_pct"), window=n.get("window"),
                # GPT-2's and GPT-BigCode's learned positions must hold the sequence (n_positions
                # 1024 otherwise).
                positions=max(1024, n["seq"]) if fam in ("gpt2", "gpt_bigcode") else None)


def generated_cases():
    out = []
    if os.path.isdir(MATRIX):
        for f in sorted(os.listdir(MATRIX)):
            if f.endswith(".json"):
                with open(os.path.join(MATRIX, f)) as fh:
                    g = json.load(fh)
                out += [generated_case(g["group"], c) for c in g["cases"]]
    return out


# The subset for `--quick` and the default of `--device cuda` (single-device cases only).
QUICK = ("gpt2", "llama", "mixtral", "qwen2", "neox", "falcon", "falcon-new", "llama-eager", "gpt2-eager",
         "llama-bf16", "llama-autocast", "llama-gc", "llama-sgd", "llama-adamw-loop", "llama-b4", "llama-s1024")


def config_path(c):
    return os.path.join(CONFIGS, c["name"] + ".json")


def config_dict(c):
    d = family_config(c["variant"], c["layers"], c["dropout"], c["tied"], c["hidden"], c["heads"], c["vocab"],
                      c["ffn"], c["sites"], c["kv_heads"], c["head_dim"], c["parallel_residual"], c["experts"],
                      c["top_k"], c["rotary_pct"], c["positions"], c.get("window"), c.get("layer_types"))
    if c.get("router_logits"):
        # The auxiliary load-balancing loss: the model keeps every sparse layer's router logits
        # and adds router_aux_loss_coef times the loss over them to the language-model loss.
        d["output_router_logits"] = True
    return d


def write_config(c):
    os.makedirs(CONFIGS, exist_ok=True)
    text = json.dumps(config_dict(c), indent=2, sort_keys=True) + "\n"
    path = config_path(c)
    old = None
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    if old != text:
        with open(path, "w") as f:
            f.write(text)


def load_config(c):
    with open(config_path(c)) as f:
        d = json.load(f)
    d = dict(d)
    model_type = d.pop("model_type")
    return transformers.AutoConfig.for_model(model_type, **d)


# --------------------------------------------------------------------------------------------
# Phases: record_function ranges on the CPU (read back from the profile), peak counters on CUDA.


class CpuPhases:
    prefix = "phase:"

    @contextlib.contextmanager
    def __call__(self, name):
        with torch.profiler.record_function(self.prefix + name):
            yield


class CudaPhases:
    """The per-phase maximum of torch.cuda.max_memory_allocated/_reserved: the peak counters are
    reset at every phase boundary, so each phase's maximum is its own (nested phases included)."""

    def __init__(self):
        self.stack = []
        self.allocated = {}
        self.reserved = {}

    def _flush(self):
        torch.cuda.synchronize()
        name = self.stack[-1] if self.stack else "other"
        self.allocated[name] = max(self.allocated.get(name, 0), torch.cuda.max_memory_allocated())
        self.reserved[name] = max(self.reserved.get(name, 0), torch.cuda.max_memory_reserved())
        torch.cuda.reset_peak_memory_stats()

    @contextlib.contextmanager
    def __call__(self, name):
        self._flush()
        self.stack.append(name)
        try:
            yield
        finally:
            self._flush()
            self.stack.pop()


# --------------------------------------------------------------------------------------------
# Building a case and its training step.


def quantized(model, c):
    """The model saved and loaded again with its linear layers quantized by bitsandbytes (as a
    user loads a released checkpoint with a `quantization_config`), then prepared for k-bit
    training (peft.prepare_model_for_kbit_training: the other parameters cast to fp32, the
    embedding's output made to require gradients, checkpointing on unless the case has none)."""
    import tempfile
    import peft
    q = c["quant"]
    compute = torch.bfloat16 if c["precision"] != "fp32" else torch.float32
    if q == "int8":
        qc = transformers.BitsAndBytesConfig(load_in_8bit=True)
    else:
        qc = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=q.split("-")[0],
                                             bnb_4bit_use_double_quant=q.endswith("-dq"),
                                             bnb_4bit_compute_dtype=compute)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        del model
        model = transformers.AutoModelForCausalLM.from_pretrained(
            d, quantization_config=qc, device_map="cpu", attn_implementation=c["attention"],
            dtype=compute)
    return peft.prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=c["gradient_checkpointing"],
        gradient_checkpointing_kwargs={"use_reentrant": c["reentrant"]})


def quant_state_tensors(model):
    """bitsandbytes' tensors beside the quantized weights (not parameters or buffers): a 4-bit
    weight's QuantState (absmax, code; with double quantization its nested state and offset), an
    8-bit weight's row scales (SCB)."""
    out = []
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        while qs is not None:
            out += [t for t in (getattr(qs, "absmax", None), getattr(qs, "code", None),
                                getattr(qs, "offset", None)) if isinstance(t, torch.Tensor)]
            qs = getattr(qs, "state2", None)
        for name in ("SCB", "CB"):
            t = getattr(p, name, None)
            if isinstance(t, torch.Tensor):
                out.append(t)
    return out


def block_modules(model):
    names = set(getattr(model, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


class Setup:
    """A model, its optimizer and the step function of one case."""

    def __init__(self, c, device, rank=0, world=1):
        self.c = c
        self.device = torch.device(device)
        self.phase = CpuPhases() if self.device.type == "cpu" else CudaPhases()
        torch.manual_seed(SEED)
        config = load_config(c)
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation=c["attention"], dtype=torch.float32)
        self.parameters = sum(p.numel() for p in model.parameters())
        if c.get("quant"):
            model = quantized(model, c)
        else:
            if c["precision"] == "bf16":
                model.to(torch.bfloat16)
            model.to(self.device)
            if c["gradient_checkpointing"]:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": c["reentrant"]})
                if c.get("lora") and c["reentrant"]:
                    # (the frozen embedding's output needs a gradient for the reentrant
                    # checkpoints' backward to run, as the PEFT documentation asks)
                    model.enable_input_require_grads()
        model.config.use_cache = False
        model.train()
        original_loss = model.loss_function

        def loss_function(*args, **kwargs):
            with self.phase("loss"):
                return original_loss(*args, **kwargs)

        model.loss_function = loss_function
        for part in c.get("freeze") or ():
            if part == "embedding":
                model.get_input_embeddings().requires_grad_(False)
            elif part == "output":
                model.get_output_embeddings().requires_grad_(False)
            elif part.startswith("layers:"):
                for block in block_modules(model)[:int(part[len("layers:"):])]:
                    block.requires_grad_(False)
            else:
                raise ValueError("%s: unknown frozen part %r" % (c["name"], part))
        if c.get("lora"):
            import peft
            targets = c["lora_targets"]
            model = peft.get_peft_model(model, peft.LoraConfig(
                r=c["lora"], lora_alpha=2 * c["lora"], lora_dropout=c["lora_dropout"], task_type="CAUSAL_LM",
                target_modules=targets if isinstance(targets, str) else list(targets)))
        self.vocab = config.vocab_size
        self.block_bytes = max((sum(p.numel() * p.element_size() for p in b.parameters())
                                for b in block_modules(model)), default=0)
        if c["parallel"] == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(model, bucket_cap_mb=c["bucket_cap_mb"])
        elif c["parallel"] == "fsdp2":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh(self.device.type, (world,))
            for block in block_modules(model):
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
        self.model = model
        # (the trainable ones, as the Trainer's create_optimizer passes them)
        params = [p for p in model.parameters() if p.requires_grad]
        if c["optimizer"] == "adamw" and c["fused"]:
            self.optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=True)
        elif c["optimizer"] == "adamw":
            self.optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, foreach=c["foreach"])
        else:
            self.optimizer = torch.optim.SGD(params, lr=1e-3, momentum=c["momentum"], foreach=c["foreach"])
        self.generator = torch.Generator().manual_seed(SEED + rank)
        self.steps = 0

    def autocast(self):
        if self.c["precision"] == "autocast-bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(self):
        """One training step; every tensor it makes is gone when it returns, but for the new
        parameter values and the optimizer state. With gradient accumulation, `grad_accum`
        micro-batches run forward and backward, each loss divided by their number (as the Hugging
        Face Trainer does); under DDP all but the last in `no_sync()` (PyTorch's documented way, and
        accelerate's), so only the last one's backward reduces."""
        c, phase = self.c, self.phase
        k = c["grad_accum"]
        for i in range(k):
            ids = torch.randint(0, self.vocab, (c["micro_batch"], c["seq"]), generator=self.generator)
            ids = ids.to(self.device)
            sync = contextlib.nullcontext()
            if c["parallel"] == "ddp" and i < k - 1:
                sync = self.model.no_sync()
            with sync:
                with phase("forward"):
                    with self.autocast():
                        loss = self.model(input_ids=ids, labels=ids, use_cache=False).loss
                        if k > 1:
                            loss = loss / k
                with phase("backward"):
                    loss.backward()
            if i < k - 1:
                del loss
        with phase("optimizer"):
            self.optimizer.step()
        with phase("zero_grad"):
            self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return float(loss.detach())

    def resident(self):
        """The tensors that outlive a step: parameters, buffers, optimizer state."""
        out = [p for p in self.model.parameters()] + [b for b in self.model.buffers()] + quant_state_tensors(self.model)
        for state in self.optimizer.state.values():
            out += [v for v in state.values() if isinstance(v, torch.Tensor)]
        return [local(t) for t in out]

    def bytes_of(self):
        """Parameter, optimizer-state and buffer bytes held by this rank."""
        def nbytes(ts):
            seen, n = set(), 0
            for t in ts:
                t = local(t)
                s = t.untyped_storage()
                if s.data_ptr() not in seen:
                    seen.add(s.data_ptr())
                    n += s.nbytes()
            return n
        state = [v for st in self.optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        return {"parameter_bytes": nbytes(self.model.parameters()), "optimizer_state_bytes": nbytes(state),
                "trainable_bytes": nbytes(p for p in self.model.parameters() if p.requires_grad),
                "quant_state_bytes": nbytes(quant_state_tensors(self.model)),
                "buffer_bytes": nbytes(self.model.buffers())}


def local(t):
    """The local tensor of a DTensor (FSDP2), the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


# --------------------------------------------------------------------------------------------
# Reading the profile: the live bytes per category at every allocation event.


def analyse(prof, device_type="cpu", mp=None, phases=PHASES):
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import Action, TensorKey

    mp = mp or prof._memory_profile()
    categories = mp._categories
    timeline = mp.timeline

    def category(key, version):
        c = categories.get(key, version) if isinstance(key, TensorKey) else None
        return c.name if c is not None else "unknown"

    # The phase and step ranges (record_function) and the allocator's own events.
    ranges, steps, raw = [], [], []
    for e in mp._op_tree.sorted_nodes:
        if e.typed[0] == _EventType.TorchOp and e.name.startswith(CpuPhases.prefix):
            ranges.append((e.start_time_ns, e.end_time_ns, e.name[len(CpuPhases.prefix):]))
        elif e.typed[0] == _EventType.TorchOp and e.name.startswith(STEP_PREFIX):
            steps.append((e.start_time_ns, e.end_time_ns))
        elif e.typed[0] == _EventType.Allocation and e.typed[1].device.type == device_type:
            raw.append((e.start_time_ns, e.typed[1].alloc_size))

    def phase_at(t):
        inside = [r for r in ranges if r[0] <= t <= r[1]]
        return min(inside, key=lambda r: r[1] - r[0])[2] if inside else "other"

    # The measured step is the last; the ones before it make every tensor it frees known.
    t0, t1 = max(steps) if steps else (0, float("inf"))
    live = {k: 0 for k in CATEGORIES}
    total = 0
    peak, peak_t, peak_live = -1, None, None
    phase_peak = {}
    start_bytes, start_live = None, None
    i, n = 0, len(timeline)
    while i < n:
        t = timeline[i][0]
        if t >= t0 and start_bytes is None:
            start_bytes, start_live = total, dict(live)
        # Events with the same timestamp are applied together, then the total is read.
        while i < n and timeline[i][0] == t:
            _, action, (key, version), nbytes = timeline[i]
            i += 1
            if key.device.type != device_type:
                continue
            if action in (Action.PREEXISTING, Action.CREATE):
                deltas = ((category(key, version), nbytes),)
            elif action == Action.INCREMENT_VERSION:
                deltas = ((category(key, version), -nbytes), (category(key, version + 1), nbytes))
            elif action == Action.DESTROY:
                deltas = ((category(key, version), -nbytes),)
            else:
                raise ValueError(action)
            for cat, d in deltas:
                live[cat] += d
                total += d
        if not t0 <= t <= t1:
            continue
        ph = phase_at(t)
        phase_peak[ph] = max(phase_peak.get(ph, 0), total)
        if total > peak:
            peak, peak_t, peak_live = total, t, dict(live)
    if start_bytes is None:
        start_bytes, start_live = total, dict(live)
    peak_phase = phase_at(peak_t)

    # Independent of the categories: the bytes that pre-existed plus the allocator's own stream.
    pre = sum(nb for t, a, (k, _), nb in timeline if t == -1 and k.device.type == device_type)
    running, raw_peak = pre, 0
    for t, d in sorted(raw, key=lambda x: x[0]):
        running += d
        if t0 <= t <= t1:
            raw_peak = max(raw_peak, running)
    return {"peak_bytes": peak, "peak_phase": peak_phase,
            "peak_breakdown": {k: v for k, v in peak_live.items() if v},
            "phase_peak_bytes": {k: phase_peak[k] for k in tuple(phases) + ("other",) if k in phase_peak},
            "start_bytes": start_bytes, "start_breakdown": {k: v for k, v in start_live.items() if v},
            "steady_bytes": total, "steady_breakdown": {k: v for k, v in live.items() if v},
            "allocator_peak_bytes": raw_peak, "allocator_end_bytes": running,
            "events": len(timeline)}


STEP_PREFIX = "step:"


def profile_steps(s, steps=2):
    """The profile of `steps` steps (the last is the measured one)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        for k in range(steps):
            with torch.profiler.record_function(STEP_PREFIX + str(k)):
                s.step()
    return prof


def profiled_step(s, steps=2, relaxed=False):
    """Profiles `steps` steps and measures the last: a tensor made before the profile and freed
    in it without an operator touching it would be missed; one made in the profile is not.
    `relaxed`: the memory profiler's data-flow consistency checks are not applied (relaxed_memory_profile)."""
    prof = profile_steps(s, steps)
    if not relaxed:
        return analyse(prof)
    r = analyse(prof, mp=relaxed_memory_profile(prof))
    r["profile_validation"] = "relaxed"
    return r


def relaxed_memory_profile(prof):
    """The memory profile without its data-flow consistency checks. With two ranks over gloo the
    checks can fail on every attempt (FSDP2 with reentrant checkpointing and accumulation:
    pw1-003-mistral, pw1-043-qwen2), on a tensor whose versions gloo's threads change. The checks
    only assert that versions follow each other: the storages' creation and destruction, hence the
    live bytes, come from the allocation events either way, and the allocator-stream check of
    `checks` still holds the timeline's peak to the allocator's own. Only a category can differ."""
    from torch.profiler import _memory_profiler as mpr

    def lenient_node_init(self, event, graph):
        self._event = event
        self._graph = graph
        self._edges = self._determine_edges()
        for key, edge in self._edges.items():
            if edge.mutated and not edge.is_allocation:
                self._graph.bump(key)

    saved = mpr.DataFlowNode.__init__, mpr.DataFlowGraph.validate
    mpr.DataFlowNode.__init__, mpr.DataFlowGraph.validate = lenient_node_init, lambda self: None
    try:
        return prof._memory_profile()
    finally:
        mpr.DataFlowNode.__init__, mpr.DataFlowGraph.validate = saved


# --------------------------------------------------------------------------------------------
# The independent counter: every storage an operator returns, freed by a weakref finalizer.


class StorageCounter:
    """Live storage bytes seen through a TorchDispatchMode: the outputs of every operator (the
    backward's included), each storage counted once, until its finalizer runs. It does not see
    the scratch buffers a kernel allocates for itself."""

    def __init__(self, resident, device_type):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves
        counter = self
        self.device_type = device_type
        self.live = {}
        self.current = 0
        self.peak = 0
        for t in resident:
            self.add(t)

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_leaves(out):
                    counter.add(t)
                return out

        self.mode = Mode()

    def add(self, t):
        if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
            return
        s = t.untyped_storage()  # one Python object per live storage
        key, n = id(s), s.nbytes()
        if n == 0:
            return
        old = self.live.get(key)
        if old is not None:
            if old != n:  # resized in place
                self.live[key] = n
                self.current += n - old
                self.peak = max(self.peak, self.current)
            return
        self.live[key] = n
        self.current += n
        self.peak = max(self.peak, self.current)
        weakref.finalize(s, self.free, key, n)

    def free(self, key, n):
        if self.live.get(key) is not None:
            self.current -= self.live.pop(key)


def counted_step(s):
    counter = StorageCounter(s.resident(), s.device.type)
    with counter.mode:
        s.step()
    gc.collect()
    return {"peak_bytes": counter.peak, "steady_bytes": counter.current}


# --------------------------------------------------------------------------------------------
# Running cases.


def describe(c, s):
    d = {"name": c["name"], "family": config_dict(c)["model_type"],
         "config": os.path.relpath(config_path(c), REPO).replace(os.sep, "/")}
    for k in ("attention", "precision", "optimizer", "foreach", "momentum", "gradient_checkpointing",
              "micro_batch", "seq", "layers", "world", "parallel", "dropout"):
        d[k] = c[k]
    if c["group"] not in ("base", "finetune"):  # the generated matrix's own fields
        for k in ("reentrant", "fused", "grad_accum", "sites"):
            d[k] = c[k]
        d["group"] = c["group"]
        d["generator"] = c["generator"]
    if c["group"] == "finetune":  # the fine-tuning's own fields
        for k in ("reentrant", "lora", "lora_targets", "lora_dropout", "quant", "freeze"):
            d[k] = c[k]
        d["group"] = c["group"]
    if c["parallel"] == "ddp":
        d["bucket_cap_mb"] = c["bucket_cap_mb"]
    if s is not None:
        d["parameters"] = s.parameters
    return d


def checks(c, s, r):
    """Consistency of the profile with the model: the list of what failed (empty when all hold)."""
    bad = []
    b = s.bytes_of()
    start = r["start_breakdown"]
    elem = 2 if c["precision"] == "bf16" else 4
    tuned = c.get("lora") or c.get("quant")
    if c["parallel"] == "none" and not tuned and b["parameter_bytes"] != s.parameters * elem:
        bad.append("parameter bytes %d != %d parameters x %d" % (b["parameter_bytes"], s.parameters, elem))
    if c["optimizer"] == "adamw" and c["parallel"] != "fsdp2":
        # exp_avg and exp_avg_sq in the parameters' dtype, and one 4-byte step count per tensor.
        steps = 4 * len(s.optimizer.state)
        if b["optimizer_state_bytes"] != 2 * b["trainable_bytes"] + steps:
            bad.append("AdamW state %d != 2 x parameter bytes + %d" % (b["optimizer_state_bytes"], steps))
    # (FSDP2's sharded DTensors are not categorised, they count as unknown; bitsandbytes' quantized
    # weights enter its kernels as inputs, and the profiler counts them as INPUT)
    if c["parallel"] != "fsdp2" and not c.get("quant"):
        for cat, key in (("PARAMETER", "parameter_bytes"), ("OPTIMIZER_STATE", "optimizer_state_bytes")):
            if start.get(cat, 0) != b[key]:
                bad.append("%s at the start %d != %s %d" % (cat, start.get(cat, 0), key, b[key]))
    # At the start live: parameters, optimizer state, DDP's buckets (one gradient copy), and the
    # buffers the step touches.
    resident = b["parameter_bytes"] + b["optimizer_state_bytes"] + b["quant_state_bytes"]
    if c["parallel"] == "ddp":
        resident += b["parameter_bytes"]
    # With two ranks a gloo work object may hold its buffer (a few hundred bytes with DDP, up to a
    # block's gathered parameters with FSDP2, once two) a little past the end of its step.
    slack = b["buffer_bytes"] + (0 if c["world"] == 1 else 2 * s.block_bytes + (1 << 16))
    # (a quantized weight's QuantState may hold small tensors the step never reads, which the
    # profile then never sees)
    floor = resident - b["quant_state_bytes"]
    if not floor <= r["start_bytes"] <= resident + slack:
        bad.append("%d bytes at the start, not the resident %d (+ buffers %d)"
                   % (r["start_bytes"], resident, b["buffer_bytes"]))
    if r["steady_bytes"] != r["start_bytes"] and c["world"] == 1:
        bad.append("not steady: %d bytes at the start, %d at the end" % (r["start_bytes"], r["steady_bytes"]))
    if r["allocator_peak_bytes"] != r["peak_bytes"]:
        bad.append("allocator stream peak %d != timeline peak %d" % (r["allocator_peak_bytes"], r["peak_bytes"]))
    return bad, b


def cuda_step(s):
    """One steady-state step measured by the CUDA caching allocator's counters."""
    ph = s.phase
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ph.allocated.clear()
    ph.reserved.clear()
    before = torch.cuda.memory_allocated()
    s.step()
    ph._flush()  # what follows zero_grad counts as "other"
    return {"max_memory_allocated": max(ph.allocated.values()),
            "max_memory_reserved": max(ph.reserved.values()),
            "peak_phase": max(ph.allocated, key=ph.allocated.get),
            "phase_max_memory_allocated": dict(ph.allocated),
            "start_allocated_bytes": before,
            "steady_bytes": torch.cuda.memory_allocated()}


ATTEMPTS = 8


def with_attempts(attempt_once, world):
    """`attempt_once(attempt)` (profiles the next steps and analyses them) until it succeeds on
    every rank, at most ATTEMPTS times: the memory profiler's data-flow validation can trip over
    the tensors gloo's threads make (two ranks; with FSDP2 about one profile in three), and
    profiling the next steps again is enough. An attempt fails by raising AssertionError; the
    ranks agree on each attempt. Returns the result and the attempt that gave it."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            r = attempt_once(attempt)
        except AssertionError as e:
            r, error = None, e.with_traceback(None)  # its frames would keep the profile alive
        failed = torch.tensor([0 if r is not None else 1])
        if world > 1:
            torch.distributed.all_reduce(failed)
        if int(failed) == 0:
            return r, attempt
        if attempt == ATTEMPTS:
            raise error if r is None else RuntimeError("the other rank's profile analysis failed")
        gc.collect()


def warmed_up(c, device="cpu", rank=0, world=1):
    """The case built and stepped to its steady state: the optimizer state exists."""
    s = Setup(c, device, rank, world)
    warmup = 1 if c["parallel"] == "none" else 2  # DDP rebuilds its buckets in the second step
    for _ in range(warmup):
        s.step()
    gc.collect()
    return s


def measure_case(c, device="cpu", rank=0, world=1):
    t0 = time.time()
    s = warmed_up(c, device, rank, world)
    out = describe(c, s)
    if device == "cpu":
        def attempt_once(attempt, s=s):
            # The last attempt without the profiler's data-flow checks (relaxed_memory_profile).
            r = profiled_step(s, relaxed=attempt == ATTEMPTS)
            # With two ranks the timeline can also miss an allocation of gloo's threads that the
            # allocator's own stream holds (pw1-007-gptneox, FSDP2: 3.2 MB); such a profile is
            # not used while attempts remain (the check below reports it on the last).
            if world > 1 and attempt < ATTEMPTS and r["allocator_peak_bytes"] != r["peak_bytes"]:
                raise AssertionError("allocator stream peak %d != timeline peak %d"
                                     % (r["allocator_peak_bytes"], r["peak_bytes"]))
            return r

        r, attempt = with_attempts(attempt_once, world)
        if attempt > 1:
            out["profile_attempts"] = attempt
        if "profile_validation" in r:
            out["profile_validation"] = r["profile_validation"]
        bad, b = checks(c, s, r)
        for k in ("peak_bytes", "peak_phase", "peak_breakdown", "phase_peak_bytes", "start_bytes", "steady_bytes"):
            out[k] = r[k]
        out.update(b)
        out["allocator_peak_bytes"] = r["allocator_peak_bytes"]
        out["timeline_events"] = r["events"]
        if c["crosscheck"] and world == 1:
            out["crosscheck"] = counted_step(s)
        out["checks_failed"] = bad
    else:
        out.update(cuda_step(s))
        out.update(s.bytes_of())
    out["seconds"] = round(time.time() - t0, 2)
    del s
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker(args):
    """One rank of a two-rank case (started by run_distributed)."""
    import torch.distributed as dist
    torch.set_num_threads(1)
    c = next(c for c in matrix() if c["name"] == args.worker)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(args.port),
                       "RANK": str(args.rank), "WORLD_SIZE": str(c["world"])})
    dist.init_process_group("gloo", rank=args.rank, world_size=c["world"],
                            timeout=__import__("datetime").timedelta(seconds=120))
    try:
        if args.worker_explain is not None:
            r = explain_rank(c, args.rank, c["world"], args.worker_explain)
        else:
            r = measure_case(c, "cpu", args.rank, c["world"])
    except Exception as e:  # the reason is the result
        r = {"error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")}
    with open(args.result, "w") as f:
        json.dump(r, f)
    dist.barrier()
    dist.destroy_process_group()


def run_distributed(c, timeout=2400, explain=None):
    """One two-rank case in `world` processes, killed after `timeout` seconds (its result then
    'skipped'). Beside another shard on 2 cores pw1-006-qwen2 (bf16, FSDP2) took 580 s, and
    pw1-022-llama and pw1-024-falcon were killed at the former 900 s. With `explain` (the number
    of local maxima) each rank explains its step instead (explain_rank) and rank 0's is returned."""
    t0 = time.time()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs, files = [], []
        for rank in range(c["world"]):
            files.append(os.path.join(tmp, "rank%d.json" % rank))
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", c["name"], "--rank", str(rank),
                   "--port", str(port), "--result", files[-1]]
            if explain is not None:
                cmd += ["--worker-explain", str(explain)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = []
        deadline = time.time() + timeout
        for p in procs:
            try:
                logs.append(p.communicate(timeout=max(1, deadline - time.time()))[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                logs.append(p.communicate()[0])
        ranks = []
        for f in files:
            if os.path.exists(f):
                with open(f) as fh:
                    ranks.append(json.load(fh))
            else:
                ranks.append({"error": "no result (exit %s)" % procs[len(ranks)].returncode})
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        out = describe(c, None)
        out["skipped"] = errors[0]
        tail = "\n".join(l for l in logs if l).strip().splitlines()[-30:]
        out["log_tail"] = tail
        out["seconds"] = round(time.time() - t0, 2)
        return out
    out = dict(ranks[0])
    keys = ("peak_bytes", "peak_phase", "peak_breakdown", "phase_peak_bytes", "steady_bytes")
    if any(r.get(k) != ranks[0].get(k) for r in ranks[1:] for k in keys):
        out["ranks"] = [{k: r.get(k) for k in keys} for r in ranks]
    out["checks_failed"] = sorted({m for r in ranks for m in r.get("checks_failed", [])})
    out["seconds"] = round(time.time() - t0, 2)
    return out


# --------------------------------------------------------------------------------------------
# Which tensors are live: every storage at the peak of the measured step (and at the largest
# moment of each phase), with its category, size, shape, dtype and the operator that made it.

# Operators that only allocate: a storage is named after the nearest enclosing operator that is not.
ALLOCATING = frozenset("aten::" + n for n in (
    "empty", "empty_like", "empty_strided", "empty_permuted", "zeros", "zeros_like", "ones", "ones_like",
    "full", "full_like", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "resize_"))


EVALUATE = "autograd::engine::evaluate_function: "


def layer_pattern(name):
    """`model.layers.1.mlp` -> `model.layers.*.mlp`: the same place in every block."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", name) if name else name


def short_frame(frame):
    """`transformers/models/llama/modeling_llama.py(436): forward` -> `modeling_llama.py(436): forward`."""
    if not frame:
        return frame
    path, _, rest = frame.partition("(")
    return path.rsplit("/", 1)[-1] + ("(" + rest if rest else "")


def shape_text(shape):
    return "×".join(str(n) for n in shape) if shape else ("scalar" if shape is not None else "?")


class Contexts:
    """Where an allocation happened: the operators around it, the autograd node running it, the
    innermost nn.Module and the innermost Hugging Face (else any) Python frame; a backward node is
    traced to its forward operator by the autograd sequence number."""

    def __init__(self, mp, modules):
        from torch._C._profiler import _EventType, RecordScope
        self.E, self.S = _EventType, RecordScope
        self.modules = modules
        # An operator records the sequence number the next autograd node will get; the node's
        # forward operator is the last to record it.
        self.forward_op = {}
        for e in mp._op_tree.sorted_nodes:
            if e.typed[0] == _EventType.TorchOp and e.typed[1].scope == RecordScope.FUNCTION:
                seq = e.typed[1].sequence_number
                if seq >= 0 and not e.name.startswith("autograd::"):
                    self.forward_op[seq] = e
        self.forward_sites = {}

    def walk(self, p):
        E, S = self.E, self.S
        ops, node, seq, module, frame, first_frame, recomputed = [], None, None, None, None, None, False
        in_ops = True
        while p is not None:
            kind = p.typed[0]
            if kind == E.TorchOp:
                f = p.typed[1]
                # The node itself, or the engine around it (which sums a gradient to its input's shape).
                if f.scope == S.BACKWARD_FUNCTION or p.name.startswith(EVALUATE):
                    if node is None:
                        node, seq = p.name[len(EVALUATE):] if p.name.startswith(EVALUATE) else p.name, f.sequence_number
                        recomputed = module is not None  # a module's forward run inside a backward node
                    in_ops = False
                elif in_ops and not p.name.startswith((CpuPhases.prefix, STEP_PREFIX)):
                    ops.append(p.name)
            elif kind in (E.PyCall, E.PyCCall):
                in_ops = False
                if kind == E.PyCall and node is None:
                    f = p.typed[1]
                    if f.module is not None:
                        if module is None:
                            module = self.modules.get(f.module.self_ptr, f.module.cls_name)
                    else:
                        first_frame = first_frame or p.name
                        if frame is None and p.name.startswith("transformers/"):
                            frame = p.name
            p = p.parent
        op = next((o for o in ops if o not in ALLOCATING), ops[0] if ops else None)
        if op is None:
            op_text = "(no operator)"
        elif ops[-1] != op:
            op_text = "%s (%s)" % (op, ops[-1])
        else:
            op_text = op
        if not ops:  # made by Python code directly (an RNG state): its own frame
            frame = first_frame
        return {"op": op_text, "ops": ops, "node": node, "module": module, "frame": frame or first_frame,
                "recomputed": recomputed, "_seq": seq}

    def forward_site(self, seq):
        if seq not in self.forward_sites:
            e = self.forward_op.get(seq)
            self.forward_sites[seq] = self.site(self.walk(e)) if e is not None else None
        return self.forward_sites[seq]

    @staticmethod
    def site(ctx, exact=False):
        module = ctx["module"] if exact else layer_pattern(ctx["module"])
        return " ".join(x for x in (module, short_frame(ctx["frame"])) if x) or None

    def of(self, alloc_event):
        ctx = self.walk(alloc_event.parent)
        seq = ctx.pop("_seq")
        if ctx["node"] and not ctx["recomputed"]:
            ctx["forward"] = self.forward_site(seq)
            ctx["site"] = "%s of %s" % (ctx["node"], ctx["forward"] or "?")
        else:
            ctx["site"] = self.site(ctx)
            if ctx["recomputed"]:
                ctx["site"] = "%s, recomputed in %s" % (ctx["site"], ctx["node"])
        return ctx


def explain_profile(prof, s, device_type="cpu", moments="all", maxima=0):
    """The live storages at the measured step's peak and at each phase's largest moment, from the
    same profile and the same event-by-event accounting as `analyse` (whose results it includes);
    with `maxima` N, also at the N largest local maxima of the step's total (where one entry's
    backward tops out while another's peak is the step's)."""
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import Action, TensorKey

    mp = prof._memory_profile()
    r = analyse(prof, device_type, mp)
    categories = mp._categories

    def category(key, version):
        c = categories.get(key, version)
        return c.name if c is not None else "unknown"

    ranges, steps = [], []
    allocs = {}  # TensorKey -> its allocation event
    for e in mp._op_tree.sorted_nodes:
        if e.typed[0] == _EventType.TorchOp and e.name.startswith(CpuPhases.prefix):
            ranges.append((e.start_time_ns, e.end_time_ns, e.name[len(CpuPhases.prefix):]))
        elif e.typed[0] == _EventType.TorchOp and e.name.startswith(STEP_PREFIX):
            steps.append((e.start_time_ns, e.end_time_ns))
        elif e.typed[0] == _EventType.Allocation and e.typed[1].alloc_size > 0:
            key = TensorKey.from_allocation(e.typed[1])
            if key is not None:
                allocs[key] = e

    def phase_at(t):
        inside = [q for q in ranges if q[0] <= t <= q[1]]
        return min(inside, key=lambda q: q[1] - q[0])[2] if inside else "other"

    t0, t1 = max(steps)

    # The events: the timeline's, for storages with a tensor key; those without one (no tensor:
    # an RNG state, a kernel's scratch) rebuilt as the timeline makes them, but keyed by pointer.
    events = []
    for t, action, (key, version), nbytes in mp.timeline:
        if isinstance(key, TensorKey) and key.device.type == device_type:
            events.append((t, action, key, version, nbytes, None))
    live_ptr, serial = {}, 0
    for e in mp._op_tree.dfs():
        if e.typed[0] != _EventType.Allocation or TensorKey.from_allocation(e.typed[1]) is not None:
            continue
        a = e.typed[1]
        if a.device.type != device_type:
            continue
        t, ptr = e.start_time_ns, a.ptr
        if a.alloc_size > 0:
            if ptr not in live_ptr:  # (a second allocation at a live pointer counts nothing)
                serial += 1
                live_ptr[ptr] = ("no tensor", ptr, serial)
                events.append((t, Action.CREATE, live_ptr[ptr], 0, a.alloc_size, e))
        else:
            ident = live_ptr.pop(ptr, None)
            if ident is None:
                serial += 1
                ident = ("no tensor", ptr, serial)
                events.append((-1, Action.PREEXISTING, ident, 0, -a.alloc_size, None))
            events.append((t, Action.DESTROY, ident, 0, -a.alloc_size, None))
    events.sort(key=lambda x: (x[0], x[1].value))

    def replay(want):
        """The total after each timestamp of the measured step, and the live storages at `want`."""
        live, total, totals, shots = {}, 0, [], {}
        i, n = 0, len(events)
        while i < n:
            t = events[i][0]
            while i < n and events[i][0] == t:
                _, action, ident, version, nbytes, ev = events[i]
                i += 1
                if action in (Action.PREEXISTING, Action.CREATE):
                    live[ident] = [version, nbytes, ev]
                    total += nbytes
                elif action == Action.INCREMENT_VERSION:
                    if ident in live:
                        live[ident][0] = version + 1
                elif action == Action.DESTROY:
                    if live.pop(ident, None) is not None:
                        total -= nbytes
            if t0 <= t <= t1:
                totals.append((t, total))
                if t in want:
                    shots[t] = {k: tuple(v) for k, v in live.items()}
        return totals, shots

    totals, _ = replay(())
    peak_t, peak = None, -1
    phase_best = {}
    for t, total in totals:
        if total > peak:
            peak_t, peak = t, total
        ph = phase_at(t)
        if total > phase_best.get(ph, (None, -1))[1]:
            phase_best[ph] = (t, total)
    wanted = [("peak", peak_t)]
    if moments == "all":  # (the peak is also its phase's largest moment)
        wanted += [(ph, phase_best[ph][0]) for ph in PHASES + ("other",)
                   if ph in phase_best and phase_best[ph][0] != peak_t]
    at_maxima = {}  # moment name -> its total, for the check below
    if maxima:
        tops = [(total, t) for i, (t, total) in enumerate(totals)
                if (i == 0 or totals[i - 1][1] < total) and (i + 1 == len(totals) or totals[i + 1][1] <= total)
                and t != peak_t]
        tops.sort(key=lambda x: (-x[0], x[1]))
        for k, (total, t) in enumerate(sorted(tops[:maxima], key=lambda x: x[1])):
            at_maxima["maximum %d" % (k + 1)] = total
            wanted.append(("maximum %d" % (k + 1), t))
    _, shots = replay({t for _, t in wanted})

    # Names of the resident tensors (by storage pointer: they are live all along, so no other
    # storage shares it) and of the gradients (by tensor key, from the optimizer's Python calls).
    model, names = s.model, {}
    for pname, p in model.named_parameters():
        names.setdefault(local(p).untyped_storage().data_ptr(), pname)
    for bname, b in model.named_buffers():
        names.setdefault(local(b).untyped_storage().data_ptr(), bname)
    pnames = {id(p): n for n, p in model.named_parameters()}
    for p, st in s.optimizer.state.items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                names.setdefault(local(v).untyped_storage().data_ptr(), "%s of %s" % (k, pnames.get(id(p), "?")))
    grad_names, grad_shapes = {}, {}
    for e in mp._op_tree.sorted_nodes:
        if e.typed[0] == _EventType.PyCall and e.typed[1].optimizer is not None:
            for p, g, _ in e.typed[1].optimizer.parameters:
                gk = TensorKey.from_tensor(g)
                if gk is not None and p is not None and p.storage_data_ptr in names:
                    grad_names[gk] = "grad of " + names[p.storage_data_ptr]
                    grad_shapes[gk] = (tuple(g.sizes), str(g.dtype).replace("torch.", ""), g.dtype)

    # The shapes and dtypes each storage is seen with, in the order first seen.
    seen = {}

    def see(tm):
        k = TensorKey.from_tensor(tm)
        if k is not None:
            v = (tuple(tm.sizes), str(tm.dtype).replace("torch.", ""), tm.dtype)
            lst = seen.setdefault(k, [])
            if v not in lst:
                lst.append(v)

    for e in mp._op_tree.sorted_nodes:
        if e.typed[0] == _EventType.TorchOp:
            for i in e.typed[1].inputs:
                if isinstance(i, list):
                    for j in i:
                        if hasattr(j, "sizes"):
                            see(j)
                elif hasattr(i, "sizes"):
                    see(i)
        elif e.typed[0] == _EventType.PyCall:
            f = e.typed[1]
            if f.module is not None:
                for _, p, g in f.module.parameters:
                    for tm in (p, g):
                        if tm is not None:
                            see(tm)
            if f.optimizer is not None:
                for p, g, st in f.optimizer.parameters:
                    for tm in [p, g] + [v for _, v in st]:
                        if tm is not None:
                            see(tm)

    def shape_of(key, nbytes):
        views = seen.get(key, [])
        whole = [v for v in views if math.prod(v[0]) * torch.empty((), dtype=v[2]).element_size() == nbytes]
        best = grad_shapes.get(key) or (whole or views or [None])[0]
        return best, [{"shape": list(v[0]), "dtype": v[1]} for v in views]

    modules = {id(m): (n or type(m).__name__) for n, m in model.named_modules()}
    contexts = Contexts(mp, modules)
    cache = {}

    def storage(ident, version, nbytes, ev):
        if isinstance(ident, TensorKey):
            cat = category(ident, version)
            ev = allocs.get(ident)
            name = grad_names.get(ident) or names.get(ident.storage.ptr)
            best, views = shape_of(ident, nbytes)
        else:
            cat, name, best, views = "unknown", None, None, []
        if ev is not None:
            if ev not in cache:
                cache[ev] = contexts.of(ev)
            ctx = dict(cache[ev])
            created = ev.start_time_ns
        else:
            ctx = {"op": "(before the profile)", "ops": [], "node": None, "module": None, "frame": None,
                   "recomputed": False, "site": None}
            created = None
        if name:
            ctx["site"] = layer_pattern(name)
        d = {"category": cat, "bytes": nbytes, "dtype": best[1] if best else None,
             "shape": list(best[0]) if best else None, "views": views, "tensor": name}
        d.update(ctx)
        d["created_ms"] = None if created is None else round((created - t0) / 1e6, 3)
        d["created_phase"] = None if created is None else (phase_at(created) if created >= t0 else "previous step")
        return d

    out = {"peak_bytes": r["peak_bytes"], "peak_phase": r["peak_phase"], "peak_breakdown": r["peak_breakdown"],
           "phase_peak_bytes": r["phase_peak_bytes"], "moments": []}
    checks_failed = []
    if peak != r["peak_bytes"]:
        checks_failed.append("replayed peak %d != peak_bytes %d" % (peak, r["peak_bytes"]))
    for what, t in wanted:
        rows = [storage(ident, *v) for ident, v in shots[t].items()]
        rows.sort(key=lambda d: (-d["bytes"], d["category"], d["op"]))
        breakdown = {}
        for d in rows:
            breakdown[d["category"]] = breakdown.get(d["category"], 0) + d["bytes"]
        breakdown = {k: breakdown[k] for k in CATEGORIES if breakdown.get(k)}
        total = sum(breakdown.values())
        if what == "peak":
            if total != r["peak_bytes"] or breakdown != r["peak_breakdown"]:
                checks_failed.append("the storages at the peak sum to %d %s, not peak_bytes %d %s"
                                     % (total, breakdown, r["peak_bytes"], r["peak_breakdown"]))
        elif total != at_maxima.get(what, r["phase_peak_bytes"].get(what)):
            checks_failed.append("the storages at the %s maximum sum to %d, not %s"
                                 % (what, total, r["phase_peak_bytes"].get(what)))
        at = []
        for tt, action, ident, version, nbytes, ev in events:
            if tt == t and action in (Action.CREATE, Action.DESTROY):
                ev = allocs.get(ident) if isinstance(ident, TensorKey) else ev
                sign = 1 if action == Action.CREATE else -1
                c = cache.get(ev) or (contexts.of(ev) if ev is not None else None)
                at.append({"bytes": sign * nbytes, "op": c["op"] if c else None, "site": c["site"] if c else None})
        out["moments"].append({"moment": what, "phase": phase_at(t), "time_ms": round((t - t0) / 1e6, 3),
                               "bytes": total, "breakdown": breakdown, "at": at,
                               "groups": group_storages(rows), "storages": rows})
    out["checks_failed"] = checks_failed
    return out


def group_storages(rows):
    """Identical (category, operator, shape, dtype) storages together, with their sites counted."""
    groups = {}
    for d in rows:
        k = (d["category"], d["op"], tuple(d["shape"]) if d["shape"] is not None else None, d["dtype"])
        g = groups.get(k)
        if g is None:
            g = groups[k] = {"category": d["category"], "op": d["op"], "shape": d["shape"], "dtype": d["dtype"],
                             "count": 0, "bytes": 0, "each": d["bytes"], "sites": {}}
        g["count"] += 1
        g["bytes"] += d["bytes"]
        if g["each"] != d["bytes"]:
            g["each"] = None
        site = d["site"] or "?"
        g["sites"][site] = g["sites"].get(site, 0) + 1
    out = sorted(groups.values(), key=lambda g: (-g["bytes"], g["category"], g["op"]))
    for g in out:
        g["sites"] = dict(sorted(g["sites"].items(), key=lambda kv: (-kv[1], kv[0])))
    return out


def explain_case(c, moments="all", maxima=0):
    """Runs one case as the matrix does (the same warm-up, the same two profiled steps, the
    second measured) and explains its live storages; a two-rank case on its two processes, rank
    0's step explained."""
    if c["world"] > 1:
        r = run_distributed(c, explain=maxima)
        if "skipped" in r:
            raise RuntimeError("%s: %s" % (c["name"], r["skipped"]))
        return r
    return explain_rank(c, 0, 1, maxima, moments)


def explain_rank(c, rank, world, maxima, moments="all"):
    """One rank's explained step. Two ranks retry a profile whose data-flow validation fails, as
    measure_case does, and agree on it."""
    t0 = time.time()
    s = warmed_up(c, "cpu", rank, world)
    e, _ = with_attempts(lambda attempt, s=s: explain_profile(profile_steps(s), s, "cpu", moments, maxima), world)
    out = describe(c, s)
    out.update(e)
    out["seconds"] = round(time.time() - t0, 2)
    del s
    gc.collect()
    return out


def explain_text(r, top, recorded=None):
    """The human-readable form of one explained case."""
    lines = []
    for m in r["moments"]:
        head = ("the peak" if m["moment"] == "peak" else "local %s" % m["moment"] if m["moment"].startswith("maximum")
                else "the largest moment of %s" % m["moment"])
        lines.append("%s: %s, %s bytes, in %s, %.3f ms into the measured step"
                     % (r["name"], head, format(m["bytes"], ","), m["phase"], m["time_ms"]))
        for a in m["at"]:
            lines.append("  at that moment %+15s bytes  %s  %s" % (format(a["bytes"], ","), a["op"], a["site"] or ""))
        width = max(len(k) for k in CATEGORIES)
        for k, v in m["breakdown"].items():
            lines.append("  %-*s %15s" % (width, k, format(v, ",")))
        total = "  %-*s %15s" % (width, "total", format(m["bytes"], ","))
        if m["moment"] == "peak":
            total += "  = peak_bytes"
            if recorded is not None:
                same = (recorded.get("peak_bytes") == m["bytes"]
                        and recorded.get("peak_breakdown") == m["breakdown"])
                total += "; measured.json: %s" % ("the same peak_bytes and peak_breakdown" if same else
                                                   "DIFFERS (%s)" % format(recorded.get("peak_bytes", 0), ","))
        lines.append(total)
        groups = m["groups"]
        lines.append("  %5s %15s %13s  %-15s %-8s %-16s %-40s %s"
                     % ("count", "bytes", "each", "category", "dtype", "shape", "operator", "where"))
        shown, rest = (groups[:top], groups[top:]) if top > 0 else (groups, [])
        for g in shown:
            sites = list(g["sites"].items())
            where = "; ".join(s if n == 1 else "%s ×%d" % (s, n) for s, n in sites[:3])
            if len(sites) > 3:
                where += "; +%d more" % (len(sites) - 3)
            lines.append("  %5d %15s %13s  %-15s %-8s %-16s %-40s %s"
                         % (g["count"], format(g["bytes"], ","), format(g["each"], ",") if g["each"] else "",
                            g["category"], g["dtype"] or "?", shape_text(g["shape"]), g["op"], where))
        if rest:
            lines.append("  %5d %15s  in %d more rows (--top)"
                         % (sum(g["count"] for g in rest), format(sum(g["bytes"] for g in rest), ","), len(rest)))
        lines.append("")
    for msg in r.get("checks_failed", []):
        lines.append("CHECK FAILED: " + msg)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The hand-checked tiny model.


def selftest():
    """A bias-free Linear(N, N) trained by for-loop AdamW on x of shape (B, N), loss = y.sum().

    The peak is in the optimizer step, at the division in the for-loop update
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps). Live then: the weight W
    (N*N*4 bytes), its gradient G, exp_avg and exp_avg_sq (N*N*4 bytes each), the temporaries
    sqrt() and its quotient (N*N*4 bytes each), the input x (B*N*4 bytes), the loss (4 bytes),
    the step count (4 bytes), and the Python float divisor as a wrapped 0-dim double tensor (8
    bytes) with its float32 copy made inside aten::div (4 bytes): 6*N*N*4 + B*N*4 + 20 bytes. The
    dispatch counter sees no wrapped scalar (the argument parser makes it, not an operator; its
    copy is made inside the operator): 12 bytes less. After zero_grad(set_to_none=True), W, the
    two moments and the step count remain: 3*N*N*4 + 4 bytes."""
    N, B = 512, 64
    torch.manual_seed(SEED)
    model = torch.nn.Linear(N, N, bias=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    phase = CpuPhases()

    class S:
        pass

    def step():
        x = torch.randn(B, N)
        with phase("forward"):
            loss = model(x).sum()
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            opt.step()
        with phase("zero_grad"):
            opt.zero_grad(set_to_none=True)

    s = S()
    s.step = step
    s.step()
    r = profiled_step(s)
    w = N * N * 4
    expected = {"peak_bytes": 6 * w + B * N * 4 + 20, "peak_phase": "optimizer",
                "PARAMETER": w, "GRADIENT": w, "OPTIMIZER_STATE": 2 * w + 4, "steady_bytes": 3 * w + 4}
    got = {"peak_bytes": r["peak_bytes"], "peak_phase": r["peak_phase"],
           "PARAMETER": r["peak_breakdown"].get("PARAMETER"), "GRADIENT": r["peak_breakdown"].get("GRADIENT"),
           "OPTIMIZER_STATE": r["peak_breakdown"].get("OPTIMIZER_STATE"), "steady_bytes": r["steady_bytes"]}
    print("selftest expected", expected)
    print("selftest measured", got, "breakdown", r["peak_breakdown"])
    counter = StorageCounter([model.weight] + [v for st in opt.state.values() for v in st.values()], "cpu")
    with counter.mode:
        step()
    gc.collect()
    print("selftest dispatch counter peak", counter.peak, "steady", counter.current)
    ok = (got == expected and counter.peak == expected["peak_bytes"] - 12
          and counter.current == expected["steady_bytes"])
    print("selftest", "passed" if ok else "FAILED")
    return ok


# --------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true", help="the whole matrix (the default output is measured.json)")
    ap.add_argument("--quick", action="store_true", help="the quick subset")
    ap.add_argument("--cases", help="comma-separated names or shell patterns")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--cuda", dest="device", action="store_const", const="cuda", help="same as --device cuda")
    ap.add_argument("--out", help="output file")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--group", help="the cases of one group: 'base' (the hand-picked cases, measured.json) or a "
                                    "generated one (matrix/GROUP.json, written to measured/GROUP.json)")
    ap.add_argument("--shard", metavar="K/N", help="with --group: the K-th of N interleaved shards of its cases "
                                                   "(written to measured/GROUP.shard-K-of-N.json)")
    ap.add_argument("--reverse", action="store_true",
                    help="with --shard: measure the shard's cases last to first (a second process on a "
                         "subset of a running shard, e.g. --shard 4/4 beside --shard 2/2, meets it from the "
                         "other end; --merge keeps each case once)")
    ap.add_argument("--merge", metavar="GROUP", help="join the shard files of GROUP into measured/GROUP.json")
    ap.add_argument("--add", metavar="FILE",
                    help="add the hand-picked cases measured into FILE (--cases ... --out FILE) to their own file "
                         "(measured.json, or finetune.measured.json for the ft-* cases), or replace them there, "
                         "without measuring the others again")
    ap.add_argument("--selftest", action="store_true", help="run the hand-checked tiny model and exit")
    ap.add_argument("--explain", metavar="CASES",
                    help="run these cases (names or shell patterns, comma-separated; single-process) as the "
                         "matrix does and list every storage live at the peak, grouped, with category totals")
    ap.add_argument("--top", type=int, default=0, metavar="N",
                    help="with --explain: print the N largest rows of each moment (default: all)")
    ap.add_argument("--phases", action="store_true",
                    help="with --explain: print the largest moment of every phase too (always in --json)")
    ap.add_argument("--json", metavar="FILE", help="with --explain: write every storage of every moment to FILE")
    ap.add_argument("--maxima", type=int, default=0, metavar="N",
                    help="with --explain: also print the N largest local maxima of the step, in time order")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--worker-explain", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()

    if args.worker:
        return worker(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.selftest:
        return 0 if selftest() else 1

    cases = matrix()
    if args.merge:
        return merge_shards(args.merge, cases)
    if args.add:
        return add_to_base(args.add, cases)
    if args.explain:
        return explain_main(args, ap, cases)
    if args.reverse and not args.shard:
        ap.error("--reverse goes with --shard")
    if args.json or args.phases or args.top or args.maxima:
        ap.error("--json, --phases, --top and --maxima go with --explain")
    if args.list:
        for c in cases:
            print(c["name"])
        return 0
    shard = None
    if args.shard and not args.group:
        ap.error("--shard goes with --group")
    if args.group:
        cases = [c for c in cases if c["group"] == args.group]
        if not cases:
            ap.error("no group %r (groups: %s)" % (args.group, ", ".join(sorted({c["group"] for c in matrix()}))))
        if args.shard:
            m = re.fullmatch(r"([1-9][0-9]*)/([1-9][0-9]*)", args.shard)
            if not m or int(m.group(1)) > int(m.group(2)):
                ap.error("--shard K/N with 1 <= K <= N")
            shard = (int(m.group(1)), int(m.group(2)))
            cases = cases[shard[0] - 1::shard[1]]
        # Single-process cases first: a shard stopped early has measured the most cases.
        cases = sorted(cases, key=lambda c: c["world"])
        if args.reverse:  # a second process on a shard's subset meets the first from the other end
            cases = cases[::-1]
    elif args.cases:
        pats = [p.strip() for p in args.cases.split(",") if p.strip()]
        cases = [c for c in cases if any(fnmatch.fnmatchcase(c["name"], p) for p in pats)]
    elif args.quick or (args.device == "cuda" and not args.all):
        cases = [c for c in cases if c["name"] in QUICK]
    elif not args.all:
        ap.error("choose --all, --quick, --cases, --selftest or --list")
    if not cases:
        ap.error("no case matches")
    out_path = args.out
    if out_path is None and args.device == "cuda":
        out_path = os.path.join(HERE, "measured_cuda.json")
    elif out_path is None and args.group:
        out_path = group_path(args.group, shard)
    elif out_path is None and args.all:
        out_path = os.path.join(HERE, "measured.json")

    for k, v in PINNED.items():
        have = {"torch": torch.__version__, "transformers": transformers.__version__}[k].split("+")[0]
        if have != v:
            print("warning: %s %s, not the pinned %s" % (k, have, v), file=sys.stderr)
    if args.device == "cpu":
        for c in matrix():
            write_config(c)
        if args.all:  # configs of cases no longer in the matrix go
            names = {c["name"] + ".json" for c in matrix()}
            for f in os.listdir(CONFIGS):
                if f.endswith(".json") and f not in names:
                    os.remove(os.path.join(CONFIGS, f))
    elif not torch.cuda.is_available():
        print("error: --device cuda but CUDA is not available", file=sys.stderr)
        return 2

    argv = ["python", os.path.relpath(os.path.abspath(__file__), REPO).replace(os.sep, "/")] + sys.argv[1:]
    result = {"torch": torch.__version__, "transformers": transformers.__version__,
              "python": platform.python_version(), "device": args.device,
              "threads": torch.get_num_threads(), "command": shlex.join(argv),
              "method": method_text(args.device), "cases": []}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    if any(c.get("lora") or c.get("quant") or c["group"] == "finetune" for c in cases):
        from importlib.metadata import version
        result["peft"], result["bitsandbytes"] = version("peft"), version("bitsandbytes")
    if args.device == "cpu" and args.all:
        result["selftest"] = "passed" if selftest() else "failed"
    if args.all and args.device == "cpu" and not args.out:
        # One file per group: the hand-picked cases in measured.json, each generated group in
        # measured/<group>.json (appended groups never rewrite another's file).
        groups = {}
        for c in cases:
            groups.setdefault(c["group"], []).append(c)
        for group, members in groups.items():
            run_cases(dict(result, group=group, cases=[]), members, args.device, group_path(group))
        return 0
    if args.group:
        result["group"] = args.group
    if shard:
        result["shard"] = "%d/%d" % shard
    return run_cases(result, cases, args.device, out_path)


def run_cases(result, cases, device, out_path):
    """Measures `cases` into `result`, written to `out_path` after every case: a run that stops
    keeps what it measured, and the same command run again resumes after it (the cases already
    in the file, with the same versions, are kept)."""
    t0 = time.time()
    done = {}
    if out_path and os.path.exists(out_path):
        with open(out_path) as f:
            old = json.load(f)
        if all(old.get(k) == result.get(k) for k in ("torch", "transformers", "device", "command")):
            # A case skipped or with failed checks is measured again.
            done = {r["name"]: r for r in old.get("cases", []) if "skipped" not in r and not r.get("checks_failed")}
            t0 -= old.get("wall_seconds", 0)
    for c in cases:
        if c["name"] in done:
            result["cases"].append(done[c["name"]])
            continue
        if c["world"] > 1 and device == "cuda":
            continue  # one GPU: the two-rank cases are CPU-only
        print("%-22s" % c["name"], end=" ", flush=True)
        if c["world"] > 1:
            r = run_distributed(c)
        else:
            try:
                r = measure_case(c, device)
            except Exception as e:
                r = describe(c, None)
                r["skipped"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        result["cases"].append(r)
        print(summary(r), flush=True)
        if out_path:
            # The cases measured before and not reached yet stay in the file.
            have = {x["name"] for x in result["cases"]}
            pending = [x for n, x in done.items() if n not in have]
            result["wall_seconds"] = round(time.time() - t0, 1)
            write_result(dict(result, cases=result["cases"] + pending), out_path)
    result["wall_seconds"] = round(time.time() - t0, 1)
    print("%d cases in %.0f s" % (len(result["cases"]), result["wall_seconds"]))
    if out_path:
        write_result(result, out_path)
        print("wrote", os.path.relpath(out_path))
    bad = [r["name"] for r in result["cases"] if r.get("checks_failed")]
    if bad:
        print("checks failed:", ", ".join(bad))
    return 0


def write_result(result, path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


def merge_shards(group, cases):
    """measured/GROUP.json from its shard files (every case of the group present once, in the
    matrix's order); the shard files are removed."""
    names = [c["name"] for c in cases if c["group"] == group]
    if not names:
        print("error: no group %r" % group, file=sys.stderr)
        return 2
    files = sorted(f for f in os.listdir(MEASURED) if re.fullmatch(re.escape(group) + r"\.shard-\d+-of-\d+\.json", f))
    if not files:
        print("error: no shard files of %s in %s" % (group, os.path.relpath(MEASURED)), file=sys.stderr)
        return 2
    parts = []
    for f in files:
        with open(os.path.join(MEASURED, f)) as fh:
            parts.append(json.load(fh))
    got = {r["name"]: r for p in parts for r in p["cases"]}
    # A case may stay skipped, with its reason (test_measured counts it as unmeasured); a result
    # whose checks failed is not a measurement and must be measured again or skipped with why.
    missing = [n for n in names if n not in got or got[n].get("checks_failed")]
    if missing:
        print("error: %d cases of %s have no result yet (or one with failed checks): %s"
              % (len(missing), group, ", ".join(missing[:8])),
              file=sys.stderr)
        return 2
    out = {k: v for k, v in parts[0].items() if k not in ("cases", "shard", "command", "wall_seconds")}
    out["commands"] = sorted({p["command"] for p in parts})
    out["shards"] = len(parts)
    out["wall_seconds"] = round(sum(p.get("wall_seconds", 0) for p in parts), 1)
    out["cases"] = [got[n] for n in names]
    with open(os.path.join(MEASURED, group + ".json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for f in files:
        os.remove(os.path.join(MEASURED, f))
    print("wrote %s (%d cases from %d shards)" % (os.path.relpath(os.path.join(MEASURED, group + ".json")),
                                                   len(names), len(parts)))
    return 0


def add_to_base(path, cases):
    """The hand-picked cases of `path` (a `--cases ... --out` run) added to their own file, or
    replaced there (measured.json; finetune.measured.json for the fine-tuning cases), in the
    matrix's order; the run's command is recorded under "added". Refuses a file of other versions,
    device or thread count, a case with failed checks or skipped, and a case not in the
    hand-picked matrix."""
    with open(path) as f:
        new = json.load(f)
    groups = {c["group"] for c in cases if c["name"] in {r["name"] for r in new["cases"]}}
    if len(groups) != 1 or not groups <= set(OWN_FILES):
        print("error: %s holds cases of %s: one hand-picked file at a time" % (path, sorted(groups) or "no group"),
              file=sys.stderr)
        return 2
    group = groups.pop()
    base_path = os.path.join(HERE, OWN_FILES[group])
    with open(base_path) as f:
        base = json.load(f)
    keys = ("torch", "transformers", "python", "device", "threads") + (("peft", "bitsandbytes") if group == "finetune" else ())
    for k in keys:
        if new.get(k) != base.get(k):
            print("error: %s is %r in %s, %r in %s" % (k, new.get(k), path, base.get(k), OWN_FILES[group]),
                  file=sys.stderr)
            return 2
    order = [c["name"] for c in cases if c["group"] == group]
    got = {r["name"]: r for r in new["cases"]}
    bad = [n for n, r in got.items() if n not in order or r.get("checks_failed") or "skipped" in r]
    if bad:
        print("error: not hand-picked, skipped or with failed checks: %s" % ", ".join(bad), file=sys.stderr)
        return 2
    have = {r["name"]: r for r in base["cases"]}
    have.update(got)
    base["cases"] = [have[n] for n in order if n in have]
    base.setdefault("added", []).append({"command": new["command"], "cases": sorted(got)})
    write_result(base, base_path)
    print("added %d cases to %s" % (len(got), os.path.relpath(base_path)))
    return 0


def explain_main(args, ap, cases):
    if args.device != "cpu":
        ap.error("--explain reads the CPU profile: no --device cuda")
    pats = [p.strip() for p in args.explain.split(",") if p.strip()]
    cases = [c for c in cases if any(fnmatch.fnmatchcase(c["name"], p) for p in pats)]
    if not cases:
        ap.error("no case matches")
    recorded = {}
    path = os.path.join(HERE, "measured.json")
    if os.path.exists(path):
        with open(path) as f:
            recorded = {r["name"]: r for r in json.load(f).get("cases", [])}
    argv = ["python", os.path.relpath(os.path.abspath(__file__), REPO).replace(os.sep, "/")] + sys.argv[1:]
    result = {"torch": torch.__version__, "transformers": transformers.__version__,
              "python": platform.python_version(), "threads": torch.get_num_threads(),
              "command": shlex.join(argv), "cases": []}
    bad = []
    for c in cases:
        r = explain_case(c, maxima=args.maxima)
        rec = recorded.get(c["name"])
        if rec is not None:
            r["matches_measured"] = (rec.get("peak_bytes") == r["peak_bytes"]
                                     and rec.get("peak_breakdown") == r["peak_breakdown"])
        shown = dict(r, moments=[m for m in r["moments"]
                                 if args.phases or m["moment"] == "peak" or m["moment"].startswith("maximum")])
        print(explain_text(shown, args.top, rec), flush=True)
        if r["checks_failed"]:
            bad.append(c["name"])
        result["cases"].append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print("wrote", args.json)
    if bad:
        print("checks failed:", ", ".join(bad))
    return 1 if bad else 0


def summary(r):
    if "skipped" in r:
        return "skipped: " + r["skipped"]
    if "max_memory_allocated" in r:
        return "allocated %8.1f MB reserved %8.1f MB %-9s %6.1f s" % (
            r["max_memory_allocated"] / MB, r["max_memory_reserved"] / MB, r["peak_phase"], r["seconds"])
    bd = r["peak_breakdown"]
    static = bd.get("PARAMETER", 0) + bd.get("OPTIMIZER_STATE", 0)
    extra = ""
    if "crosscheck" in r:
        extra = " counter %.1f MB" % (r["crosscheck"]["peak_bytes"] / MB)
    if r.get("checks_failed"):
        extra += " CHECKS: " + "; ".join(r["checks_failed"])
    return "peak %8.1f MB %-9s param+opt %7.1f MB steady %7.1f MB %6.1f s%s" % (
        r["peak_bytes"] / MB, r["peak_phase"], static / MB, r["steady_bytes"] / MB, r["seconds"], extra)


def method_text(device):
    if device == "cuda":
        return ("One warm-up step, then one steady-state step; torch.cuda.reset_peak_memory_stats at every "
                "phase boundary and torch.cuda.max_memory_allocated / max_memory_reserved at the next: the "
                "peak is the largest phase maximum, steady_bytes is torch.cuda.memory_allocated after the step.")
    return ("One warm-up step (two for DDP and FSDP2), then two steady-state steps under torch.profiler "
            "(profile_memory, record_shapes, with_stack), the second measured; "
            "torch.profiler._memory_profiler.MemoryProfile gives every storage's creation, version changes "
            "and destruction with its category; the live bytes per category are summed event by event "
            "(events of one timestamp together); the peak is the largest total, its breakdown the categories "
            "at that moment, its phase the innermost record_function range around it. The CPU allocator does "
            "not cache: these are the exact tensor bytes. steady_bytes: live bytes when the step has ended "
            "(after optimizer.step and zero_grad(set_to_none=True)).")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""Peer memory estimators side by side with memalg on the measured PyTorch training steps.

Every case of `measured.json` (see README.md) is given to

1. llm-analysis (PyPI `llm-analysis`, cli99/llm-analysis): per-GPU training memory (weights,
   gradients, optimizer states, activations) from the model shape, micro-batch, sequence,
   dtypes and activation recomputation;
2. Megatron-LM's theoretical memory formulas (`megatron/training/theoretical_memory_usage.py`),
   transcribed below: weights and optimizer at 18 bytes per parameter, activations after
   Korthikanti et al.;
3. DeepSpeed's ZeRO model-state estimators (`estimate_zero2_model_states_mem_needs` /
   `estimate_zero3_model_states_mem_needs`, the functions behind
   `estimate_zero{2,3}_model_states_mem_needs_all_cold`): model states only;
4. `accelerate estimate-memory`: not run. It loads the model's configuration from the Hugging
   Face Hub, which is not reachable offline.

Peers 1 and 3 are imported from a throw-away virtual environment, never a dependency of the
project:

    python3 -m venv ../.venv-peers        # from the repository root: a throw-away environment beside it
    DS_BUILD_OPS=0 ../.venv-peers/bin/pip install llm-analysis==0.2.2 deepspeed==0.19.8
    ../.venv-peers/bin/python bench/torch/peers.py [--json] [--memalg PATH] [--cases PATTERNS]

(deepspeed pulls in torch from PyPI, 2.15.0 when this was written: the environment is 5.6 GB with its CUDA
libraries; DS_BUILD_OPS=0 builds none of its kernels). A peer
that is not installed is reported as such; DeepSpeed then falls back to the transcription of
its formulas below, marked "transcribed".

The model shape of every case comes from `memalg import --json` of the case's config (the
exact parameter count, the embedding and output sizes), the family gives the MLP (SwiGLU for
Llama, Mistral, Mixtral, Qwen2) and the norm (RMSNorm for those, LayerNorm for GPT-2, GPT-NeoX,
Falcon). memalg's figures are compare.py's (`per_rank.total - per_rank.reserve`, the live tensor
bytes without the device's runtime reserve). MB is 10^6 bytes; error = (estimate - measured) /
measured.
"""
import argparse
import contextlib
import io
import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402

SWIGLU_FAMILIES = {"llama", "mistral", "mixtral", "qwen2"}


def shape_of(case, memalg):
    binary = str(compare.ROOT / memalg) if not Path(memalg).is_absolute() else memalg
    out = subprocess.run([binary, "import", case["config"], "--json"], cwd=compare.ROOT, capture_output=True,
                         text=True, check=True).stdout
    s = json.loads(out)
    s["swiglu"] = s["family"] in SWIGLU_FAMILIES
    s["rmsnorm"] = s["family"] in SWIGLU_FAMILIES
    return s


def bytes_per_weight(case):
    return 2 if case["precision"] == "bf16" else 4


def optimizer_state_bytes_per_param(case):
    """Bytes of optimizer state per parameter in the measured run (dtype of the parameters)."""
    w = bytes_per_weight(case)
    if case["optimizer"] == "adamw":
        return 2 * w
    return w if case.get("momentum", 0.0) > 0 else 0


# ------------------------------------------------------------------------------------------------
# 1. llm-analysis
# ------------------------------------------------------------------------------------------------

def llm_analysis_version():
    try:
        from importlib.metadata import version
        return version("llm-analysis")
    except Exception:  # noqa: BLE001
        return None


def _with_32_bit_lookup(base):
    """llm-analysis 0.2.2 asserts that weights and activations have 4, 8 or 16 bits in
    `get_TFLOPS_per_gpu`, its throughput lookup, which `training()` calls for the latency; its
    memory formulas take the bit widths as parameters. For the cases with 32-bit weights or
    activations this subclass answers that one lookup with the 16-bit figure; the memory it
    reports is its own formulas' at 32 bits (the latency, unused here, is that of 16 bits)."""
    class With32BitLookup(base):
        def get_TFLOPS_per_gpu(self):
            d = self.dtype_config
            saved = d.weight_bits, d.activation_bits
            d.weight_bits, d.activation_bits = min(saved[0], 16), min(saved[1], 16)
            try:
                return super().get_TFLOPS_per_gpu()
            finally:
                d.weight_bits, d.activation_bits = saved
    return With32BitLookup


def llm_analysis_estimate(case, shape):
    """llm-analysis's per-GPU training memory of a case, and what it cannot express.

    Mapping: weight/embedding bits = the parameters' dtype (32, or 16 for pure bf16; autocast keeps
    fp32 parameters), activation bits 32 for fp32, 16 for bf16 and autocast; `layernorm_dtype_bytes`
    4 (2 for pure bf16). llm-analysis always adds a master copy of `master_weights_dtype_bytes` per
    parameter to the optimizer state and stores the gradients in that dtype; the runs have no
    separate master copy, so `master_weights_dtype_bytes` = the gradient dtype and `other_op_bytes`
    = the run's optimizer-state bytes minus it, which makes its optimizer-state and gradient bytes
    those of the run. sdpa -> flash_attn=True, eager -> False; gradient checkpointing ->
    ActivationRecomputation.FULL; DDP -> dp_size 2 without ZeRO; FSDP2 -> dp_size 2, ZeRO-3.
    Its total is the sum of the four categories' maxima, `(weight+op_state+grad+act)_memory_per_gpu`.
    """
    logging.disable(logging.CRITICAL)  # llm-analysis logs every step at INFO
    from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
    from llm_analysis.config import DtypeConfig, ModelConfig, ParallelismConfig, get_gpu_config_by_name

    h, ffn = shape["hidden"], shape["ffn"]
    model = ModelConfig(name=case["name"], num_layers=shape["layers"], n_head=shape["heads"], hidden_dim=h,
                        vocab_size=shape["vocab"], max_seq_len=case["seq"], num_key_value_heads=shape["kv_heads"],
                        ffn_embed_dim=ffn, expansion_ratio=ffn / h, model_type=shape["family"],
                        moe_num_experts=max(1, shape["experts"]), moe_top_k=max(1, shape["top_k"]))
    w_bits = 8 * bytes_per_weight(case)
    a_bits = 32 if case["precision"] == "fp32" else 16
    dtype = DtypeConfig(name=f"w{w_bits}a{a_bits}e{w_bits}", weight_bits=w_bits, activation_bits=a_bits,
                        embedding_bits=w_bits)
    world = case["world"]
    parallel = ParallelismConfig(tp_size=1, pp_size=1, dp_size=world, sp_size=1)
    zero = DSZeRO.STAGE_3 if case["parallel"] == "fsdp2" else DSZeRO.NONE
    grad_bytes = bytes_per_weight(case)
    cls = LLMAnalysis if max(w_bits, a_bits) <= 16 else _with_32_bit_lookup(LLMAnalysis)
    analysis = cls(model, get_gpu_config_by_name("a100-sxm-80gb"), dtype, parallel)
    s = analysis.training(
        batch_size_per_gpu=case["micro_batch"], gradient_accumulation_steps=1, seq_len=case["seq"],
        activation_recomputation=(ActivationRecomputation.FULL if case["gradient_checkpointing"]
                                  else ActivationRecomputation.NONE),
        ds_zero=zero, layernorm_dtype_bytes=2 if case["precision"] == "bf16" else 4,
        master_weights_dtype_bytes=grad_bytes,
        other_op_bytes=optimizer_state_bytes_per_param(case) - grad_bytes,
        flash_attn=case["attention"] == "sdpa", softmax_dropout=case.get("dropout", 0.0) > 0,
        mlp_gated_linear_units=shape["swiglu"])
    notes = [] if cls is LLMAnalysis else ["32-bit"]
    if not shape["tied_embeddings"]:
        notes.append("untied")
    if shape["positions"]:
        notes.append("positions")
    if shape["swiglu"]:
        notes.append("gated-params" + ("" if case["micro_batch"] == 1 else ", gated-act"))
    notes.append("dropout" if case.get("dropout", 0.0) == 0 else "mlp-dropout")
    if case["parallel"] == "ddp":
        notes.append("ddp")
    if case["parallel"] == "fsdp2":
        notes.append("fsdp2")
    return {"bytes": s["(weight+op_state+grad+act)_memory_per_gpu"],
            "weights": s["weight_memory_per_gpu"], "gradients": s["gradient_memory_per_gpu"],
            "optimizer": s["optimizer_state_memory_per_gpu"], "activations": s["activation_memory_per_gpu"],
            "parameters": s["num_params_total"], "notes": notes}


LLM_ANALYSIS_NOTES = {
    "32-bit": "fp32 weights or activations: llm-analysis 0.2.2 refuses them as shipped (`AssertionError: "
              "weight_bits and activation_bits must be 4, 8, or 16`, in its throughput lookup); answered with "
              "that lookup at 16 bits, its memory formulas at 32",
    "untied": "the output layer is not tied to the embedding: llm-analysis always counts one shared "
              "embedding (`get_num_params_embedding(shared_embedding=True)`), so the output layer's weights, "
              "gradients and optimizer state are missing",
    "positions": "learned position embeddings (GPT-2) and the linear layers' biases are not in its parameter count",
    "gated-params": "SwiGLU: its MLP has 2 x hidden x ffn parameters, the gate's third matrix is missing",
    "gated-act": "and with micro-batch > 1 `training()` does not pass `mlp_gated_linear_units` on "
                 "(llm-analysis 0.2.2), so the gate's activations are missing too",
    "dropout": "dropout 0: its attention always stores a dropout mask (`attn_dropout=True`), so it "
               "counts one byte per hidden element that the run does not have",
    "mlp-dropout": "dropout 0.1: `training()` does not pass the MLP's dropout mask on (`with_dropout`); "
                   "the attention's masks are counted (`softmax_dropout=True`)",
    "ddp": "DDP's gradient buckets (one flat copy of the gradients) are not modelled",
    "fsdp2": "FSDP2 expressed as DeepSpeed ZeRO-3 over 2 ranks (no gathered-parameter buffers)",
}


# ------------------------------------------------------------------------------------------------
# 2. Megatron-LM's theoretical memory
# ------------------------------------------------------------------------------------------------
# Transcribed from megatron/training/theoretical_memory_usage.py of NVIDIA/Megatron-LM (read at
# commit d98e8a64ddf34856e74b24714e3bedb2f5a39553), the functions
# `compute_weight_and_optimizer_memory(args)`, `compute_activation_memory_without_sp(args,
# num_microbatches)` and `report_theoretical_memory(args)`, for tensor, pipeline, expert and
# context parallelism 1, no multi-token prediction, no multi-latent attention, no shared experts.
# Our own code; the formulas are Megatron's.
#
# compute_weight_and_optimizer_memory: the parameters of the most loaded shard times
#   num_bytes_per_parameter = 18 without the distributed optimizer (bf16 parameters 2, fp32 main
#   gradients 4, fp32 main parameters 4, fp32 Adam moments 8), 6 + 12 / dp with it. Its
#   parameter count: per layer, attention 2 h^2 (1 + g / a) (d a / h) (Q and output projection,
#   K and V over g query groups; d = kv_channels), MLP 2 h f (x 3/2 with SwiGLU; x E routed
#   experts in MoE layers, plus a router h E), norms 2 h n (n = 1 for RMSNorm, 2 for LayerNorm);
#   plus a final norm n h and the embedding h V (twice when untied); no biases, no position
#   embedding. V is the padded vocabulary (a multiple of make_vocab_size_divisible_by = 128).
# report_theoretical_memory uses compute_activation_memory (Korthikanti et al. 2022, Table 2, with
#   sequence parallelism and selective recomputation) only when both are on; otherwise, as for
#   every case here, compute_activation_memory_without_sp:
#   per layer s b h (10 + 24 / t) bytes (16-bit activations, the attention scores not stored:
#   flash attention; the 24 assumes an MLP 4 h wide), times the layers; plus 8 s b (the input
#   ids, int64) and s b h (the embedding's dropout mask, one byte) per pipeline stage in flight;
#   plus, on the last stage, 2 (s b V / t + s b h) (the logits and the final norm's output, 2
#   bytes each); all times 1.05 ("buffer for optimizer and miscellaneous temporaries").
# Its assumptions: bf16 mixed precision with fp32 main parameters and gradients, Adam; it does
# not model fp32 or pure-bf16 runs, SGD, recomputation (`--recompute-granularity full` changes
# nothing in it), eager attention's stored scores, or DDP's buckets. The nearest cases are the
# three autocast-bf16 AdamW ones (fp32 parameters, gradients and moments: 16 bytes per parameter
# against its 18).

MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"


def megatron_parameters(shape):
    h, a, g, L = shape["hidden"], shape["heads"], shape["kv_heads"], shape["layers"]
    d = shape["head_dim"] or h // a
    vocab = math.ceil(shape["vocab"] / 128) * 128  # padded_vocab_size, tp 1
    norm = 1 if shape["rmsnorm"] else 2
    gated = 3 / 2 if shape["swiglu"] else 1
    attention = 2 * h * h * ((1 + g / a) * (d * a / h))
    layernorm = 2 * h * norm
    if shape["experts"]:
        E = shape["experts"]
        layer = attention + 2 * h * shape["ffn"] * E * gated + layernorm + h * E
    else:
        layer = attention + 2 * h * shape["ffn"] * gated + layernorm
    embedding = h * vocab
    return L * layer + norm * h + embedding * (1 if shape["tied_embeddings"] else 2), vocab


def megatron_estimate(case, shape):
    params, vocab = megatron_parameters(shape)
    dp = case["world"]
    distributed_optimizer = case["parallel"] == "fsdp2"  # the nearest Megatron option to sharded states
    bytes_per_param = 6 + 12 / dp if distributed_optimizer else 18
    weight_and_optimizer = params * bytes_per_param
    s, b, h, L, t, pp = case["seq"], case["micro_batch"], shape["hidden"], shape["layers"], 1, 1
    act = s * b * h * (10 + 24 / t) * L
    act += 8 * s * b * pp
    act += s * b * h * pp
    act += (s * b * vocab / t + s * b * h) * 2
    act *= 1.05
    notes = []
    if case["precision"] == "fp32":
        notes.append("fp32")
    elif case["precision"] == "bf16":
        notes.append("pure-bf16")
    if case["optimizer"] == "sgd":
        notes.append("sgd")
    if case["gradient_checkpointing"]:
        notes.append("recompute")
    if case["attention"] == "eager":
        notes.append("eager")
    if case["parallel"] == "ddp":
        notes.append("ddp")
    if case["parallel"] == "fsdp2":
        notes.append("fsdp2")
    return {"bytes": weight_and_optimizer + act, "weight_and_optimizer": weight_and_optimizer, "activations": act,
            "parameters": params, "notes": notes}


MEGATRON_NOTES = {
    "fp32": "fp32 run (it assumes bf16 with fp32 main copies: 18 bytes per parameter, 16-bit activations)",
    "pure-bf16": "pure bf16 run (no fp32 main copies; it assumes them)",
    "sgd": "SGD (it assumes Adam)",
    "recompute": "full recomputation (not in its formula)",
    "eager": "eager attention (its formula stores no attention scores)",
    "ddp": "DDP's gradient buckets are not modelled",
    "fsdp2": "FSDP2 expressed as the distributed optimizer over 2 ranks (6 + 12/2 bytes per parameter)",
}


# ------------------------------------------------------------------------------------------------
# 3. DeepSpeed's ZeRO model-state estimators
# ------------------------------------------------------------------------------------------------
# deepspeed/runtime/zero/stage_1_and_2.py `estimate_zero2_model_states_mem_needs(total_params,
# num_gpus_per_node, num_nodes, cpu_offload, additional_buffer_factor)` and
# deepspeed/runtime/zero/stage3.py `estimate_zero3_model_states_mem_needs(total_params,
# largest_layer_params, ..., cpu_offload, cpu_offload_params, zero_init, ...)` return the (CPU,
# GPU) bytes that `estimate_zero2_model_states_mem_needs_all_cold` / `..._zero3_..._all_cold`
# print for each offload option. Without offload, per GPU:
#   ZeRO-2: 2 P + 18 P / gpus  (16-bit parameters 2; 16-bit gradients 2, fp32 gradients 4,
#           fp32 parameters 4, fp32 Adam moments 8, sharded);
#   ZeRO-3: 4 L + 18 P / gpus  (L: the largest layer's parameters, gathered).
# Mixed-precision Adam only; model states only (no activations). The transcription is used and
# cross-checked when deepspeed is importable, used alone when it is not.

def zero2_gpu_bytes_transcribed(total_params, gpus):
    return 2 * total_params + int(18 * total_params / gpus)


def zero3_gpu_bytes_transcribed(total_params, largest_layer_params, gpus):
    return 4 * largest_layer_params + int(18 * total_params / gpus)


def deepspeed_module():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("DS_BUILD_OPS", "0")
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import deepspeed
            from deepspeed.runtime.zero import stage3, stage_1_and_2
        logging.getLogger("DeepSpeed").setLevel(logging.CRITICAL)
        return deepspeed.__version__, stage_1_and_2, stage3
    except Exception:  # noqa: BLE001
        return None, None, None


def deepspeed_estimate(case, shape, ds):
    _, z2, z3 = ds
    P = case["parameters"]
    largest = shape["vocab"] * shape["hidden"]  # the embedding (or output layer): the largest module here
    if case["parallel"] == "fsdp2":
        stage, gpus = 3, case["world"]
        mine = zero3_gpu_bytes_transcribed(P, largest, gpus)
        theirs = None if z3 is None else z3.estimate_zero3_model_states_mem_needs(
            total_params=P, largest_layer_params=largest, num_gpus_per_node=gpus, num_nodes=1, cpu_offload=False,
            cpu_offload_params=False, zero_init=True)[1]
    else:
        # DDP replicates the model states: ZeRO-2 on one GPU (nothing sharded) is its per-rank figure.
        stage, gpus = 2, 1
        mine = zero2_gpu_bytes_transcribed(P, gpus)
        theirs = None if z2 is None else z2.estimate_zero2_model_states_mem_needs(
            total_params=P, num_gpus_per_node=gpus, num_nodes=1, cpu_offload=False)[1]
    if theirs is not None and theirs != mine:
        raise RuntimeError(f"{case['name']}: deepspeed says {theirs}, the transcription {mine}")
    return {"bytes": mine if theirs is None else theirs, "stage": stage, "gpus": gpus,
            "source": "deepspeed" if theirs is not None else "transcribed"}


def measured_model_states(case):
    """Measured model states at the peak (PARAMETER + OPTIMIZER_STATE + GRADIENT; with FSDP2 the
    resident shards, `unknown`, instead of the gathered PARAMETER), and the same with the full
    gradients (one gradient per parameter of the rank: the parameter bytes, halved by FSDP2)."""
    states, grads, _ = compare.measured_split(case)
    at_peak = states + grads
    grad_full = case["parameters"] * bytes_per_weight(case) // (case["world"] if case["parallel"] == "fsdp2" else 1)
    return at_peak, states + grad_full


# ------------------------------------------------------------------------------------------------

def run(cases, memalg):
    ds = deepspeed_module()
    la_version = llm_analysis_version()
    rows = []
    for case in cases:
        m = compare.compare_case(case, memalg)
        shape = shape_of(case, memalg)
        row = {"case": case["name"], "measured": case["peak_bytes"], "memalg": m}
        try:
            row["llm_analysis"] = llm_analysis_estimate(case, shape) if la_version else None
        except Exception as e:  # noqa: BLE001
            row["llm_analysis"] = {"bytes": None, "notes": [f"refused: {type(e).__name__}: {e}"]}
        row["megatron"] = megatron_estimate(case, shape)
        at_peak, with_grads = measured_model_states(case)
        ms = m["model_states"]["predicted"] + m["gradients"]["predicted"]
        row["model_states"] = {"measured_at_peak": at_peak, "measured_with_gradients": with_grads, "memalg": ms}
        row["deepspeed"] = deepspeed_estimate(case, shape, ds)
        rows.append(row)
    return rows, {"llm-analysis": la_version, "deepspeed": ds[0], "megatron-commit": MEGATRON_COMMIT}


def err(est, meas):
    return None if est is None else (est - meas) / meas


def mb(x):
    return "n/a" if x is None else f"{x / 1e6:.1f}"


def table_peak(rows, key, label, extra=None):
    out = [f"| case | measured MB | {label} MB | {label} error | memalg MB | memalg error | not expressed |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        p = r[key] or {"bytes": None, "notes": ["not installed"]}
        e = compare.pct(err(p["bytes"], r["measured"]))
        out.append(f"| {r['case']} | {mb(r['measured'])} | {mb(p['bytes'])} | {e} "
                   f"| {mb(r['memalg']['predicted_bytes'])} | {compare.pct(r['memalg']['error'])} "
                   f"| {', '.join(p['notes']) or '-'} |")
    return "\n".join(out)


def table_deepspeed(rows):
    out = ["| case | measured at peak MB | measured with full gradients MB | DeepSpeed MB (estimator) "
           "| DeepSpeed error at peak / with gradients | memalg MB | memalg error at peak / with gradients |",
           "|---|---:|---:|---:|---|---:|---|"]
    for r in rows:
        s, d = r["model_states"], r["deepspeed"]
        a, w = s["measured_at_peak"], s["measured_with_gradients"]
        out.append(f"| {r['case']} | {mb(a)} | {mb(w)} | {mb(d['bytes'])} (ZeRO-{d['stage']}, {d['gpus']} GPU"
                   f"{'s' if d['gpus'] > 1 else ''}{', transcribed' if d['source'] != 'deepspeed' else ''}) "
                   f"| {compare.pct(err(d['bytes'], a))} / {compare.pct(err(d['bytes'], w))} "
                   f"| {mb(s['memalg'])} | {compare.pct(err(s['memalg'], a))} / {compare.pct(err(s['memalg'], w))} |")
    return "\n".join(out)


def summaries(rows):
    def peak_errors(key, only=None):
        return [err(r[key]["bytes"], r["measured"]) for r in rows
                if r[key] and r[key]["bytes"] is not None and (only is None or only(r))]
    autocast = lambda r: r["megatron"]["notes"] == []  # noqa: E731
    shipped = lambda r: r["llm_analysis"] is not None and "32-bit" not in r["llm_analysis"]["notes"]  # noqa: E731
    return {
        "memalg peak": compare.summary([r["memalg"]["error"] for r in rows]),
        "llm-analysis peak": compare.summary(peak_errors("llm_analysis")),
        "llm-analysis peak, cases it answers as shipped (pure bf16)": compare.summary(
            peak_errors("llm_analysis", shipped)),
        "memalg peak, the same cases": compare.summary([r["memalg"]["error"] for r in rows if shipped(r)]),
        "Megatron peak": compare.summary(peak_errors("megatron")),
        "Megatron peak, cases within its assumptions (autocast-bf16 AdamW)": compare.summary(
            peak_errors("megatron", autocast)),
        "memalg peak, the same autocast cases": compare.summary(
            [r["memalg"]["error"] for r in rows if autocast(r)]),
        "DeepSpeed model states vs at peak": compare.summary(
            [err(r["deepspeed"]["bytes"], r["model_states"]["measured_at_peak"]) for r in rows]),
        "DeepSpeed model states vs with full gradients": compare.summary(
            [err(r["deepspeed"]["bytes"], r["model_states"]["measured_with_gradients"]) for r in rows]),
        "memalg model states+gradients vs at peak": compare.summary(
            [err(r["model_states"]["memalg"], r["model_states"]["measured_at_peak"]) for r in rows]),
        "memalg model states+gradients vs with full gradients": compare.summary(
            [err(r["model_states"]["memalg"], r["model_states"]["measured_with_gradients"]) for r in rows]),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured", default=compare.DEFAULT_MEASURED)
    ap.add_argument("--memalg", default=compare.DEFAULT_MEMALG)
    ap.add_argument("--cases", help="comma-separated names or shell patterns (default all)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of markdown")
    a = ap.parse_args(argv)
    _, cases = compare.load_cases(a.measured, a.cases)
    rows, versions = run(cases, a.memalg)
    stats = summaries(rows)
    if a.json:
        json.dump({"versions": versions, "cases": rows, "summary": stats}, sys.stdout, indent=1, default=float)
        print()
        return 0
    print(f"peers: llm-analysis {versions['llm-analysis'] or 'not installed'}, deepspeed "
          f"{versions['deepspeed'] or 'not installed (formulas transcribed)'}, Megatron-LM theoretical_memory_usage.py "
          f"at {versions['megatron-commit'][:12]} (transcribed); accelerate estimate-memory: cannot run offline "
          "(needs the Hugging Face Hub)\n")
    print("### llm-analysis: per-GPU training memory against the measured peak\n")
    print(table_peak(rows, "llm_analysis", "llm-analysis"))
    print("\n" + "\n".join(f"- `{k}`: {v}" for k, v in LLM_ANALYSIS_NOTES.items()))
    print("\n### Megatron-LM theoretical memory against the measured peak\n")
    print(table_peak(rows, "megatron", "Megatron"))
    print("\n" + "\n".join(f"- `{k}`: {v}" for k, v in MEGATRON_NOTES.items()))
    print("\n### DeepSpeed ZeRO model-state estimators against the measured model states\n")
    print(table_deepspeed(rows))
    print("\nmeasured model states: PARAMETER + OPTIMIZER_STATE + GRADIENT at the peak (FSDP2: the resident "
          "shards, `unknown`, for PARAMETER); with full gradients: one gradient per parameter of the rank added "
          "instead of GRADIENT. memalg: weights + master weights + optimizer states + gradients at its peak.\n")
    for k, s in stats.items():
        print("- " + compare.summary_line(k, s))
    return 0


if __name__ == "__main__":
    sys.exit(main())

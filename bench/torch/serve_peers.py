#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""Peer estimators of LLM inference memory side by side with the measured generation peaks.

Every case of `serve.measured.json` (written by measure_serve.py: the exact peak of live tensor
bytes over one Hugging Face `model.generate` call) is given to

1. llm-analysis (PyPI `llm-analysis`, cli99/llm-analysis), `LLMAnalysis.inference(...)`: per-GPU
   weights, KV cache and activations from the model shape (layers, hidden, heads, KV heads, FFN
   width, vocabulary; experts and top-k for the MoE families), the batch, the prompt length, the
   generated tokens and the weight / activation / KV-cache bit widths. It does not sum the parts;
   its two fit checks are `memory_left > prefill_activation_memory_per_gpu` and `memory_left >
   kv_cache_memory_per_gpu + decode_activation_memory_per_gpu`, memory_left being the GPU's memory
   less the weights, so its per-GPU requirement, used here as its estimate, is

       weight_memory_per_gpu + max(prefill_activation_memory_per_gpu,
                                   kv_cache_memory_per_gpu + decode_activation_memory_per_gpu)

   (the KV cache at prompt + new_tokens; its activations are one layer's largest tensor, the
   `inference` reuse assumption, or the logits of the prompt if larger). The GPU is a custom
   `GPUConfig` copied from its a100-sxm-80gb with 10^6 GB of memory so that no case is refused.
2. `accelerate estimate-memory` (accelerate's `accelerate.commands.estimate`): weights only, the
   "Total Size" and "Largest Layer" it prints for the case's dtype row (`float32` for fp32,
   `float16` for bf16: both 2 bytes; it has no bfloat16 row). The command looks the model up on
   the Hugging Face Hub first (`verify_on_hub`); here that lookup is answered locally (library
   `transformers`, the case's config) and `gather_data`, the function behind the printed table,
   runs `create_empty_model` on a temporary directory holding the case's config.json, so nothing
   is downloaded. Like the command, it builds `AutoModel` (the base model, without the LM head).
3. memalg: `memalg serve --config CFG --batch B --prompt P --new-tokens N --dtype PRECISION
   --cache CACHE --attention ATTN --json`, its `peak_bytes`. Where the binary or the sub-command is
   missing the column says "not available".

The peers are never dependencies of the project. llm-analysis lives in a throw-away virtual
environment; accelerate is the one of the PyTorch benchmark environment:

    python3 -m venv ../.venv-peers && ../.venv-peers/bin/pip install llm-analysis==0.2.2   # beside the repository
    python3 bench/torch/serve_peers.py [--markdown | --json] [--cases PATTERNS] [--measured FILE] \
        [--memalg PATH] [--llm-analysis-python PY] [--accelerate-python PY]

The script itself needs only the standard library: each peer runs in a child process of the
interpreter that has it (`serve_peers.py --peer llm-analysis|accelerate`, the cases as JSON on
stdin, its figures as JSON on stdout). Defaults: llm-analysis from `../.venv-peers/bin/python`
(the environment of peers.py) if it exists, else this interpreter; accelerate from the PyTorch
harness's environment (bench/torch/run.sh: `$MEMALG_TORCH_VENV`, else
`${XDG_CACHE_HOME:-~/.cache}/memalg/venv-torch`) if it exists, else this interpreter. A peer that
the interpreter lacks is reported as not installed and the script continues.

MB is 10^6 bytes; error = (estimate - measured) / measured. The exit status is 0 whatever the
errors are (a report, not a test).
"""
import argparse
import contextlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import compare  # noqa: E402  (standard library only)

ROOT = compare.ROOT
DEFAULT_MEASURED = "bench/torch/serve.measured.json"
MEMALG_CANDIDATES = ("build/tools/memalg", "build/memalg")
BITS = {"fp32": 32, "bf16": 16}

# Families whose MLP is gated (SwiGLU, or GeGLU for Gemma): a third FFN matrix llm-analysis does not count.
GATED = {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gemma", "gemma2", "gemma3", "gemma3_text",
         "deepseek_v3", "gpt_oss", "llama4_text", "olmo2", "phi3"}


def config_of(case):
    return json.loads((ROOT / case["config"]).read_text())


# ------------------------------------------------------------------------------------------------
# 1. llm-analysis
# ------------------------------------------------------------------------------------------------

LLM_ANALYSIS_NOTES = {
    "32-bit": "fp32: llm-analysis 0.2.2 refuses 32-bit weights or activations in its throughput lookup "
              "(`weight_bits and activation_bits must be 4, 8, or 16`, `get_TFLOPS_per_gpu`, which `inference()` "
              "calls for the latency); answered with the 16-bit lookup, its memory formulas at 32 bits",
    "untied": "untied output layer: it always counts one shared embedding, the LM head's vocab x hidden weights "
              "are missing",
    "gated": "gated MLP (SwiGLU / GeGLU): its MLP has 2 x hidden x ffn weights, the third matrix is missing",
    "logits": "its prefill activation is at least the logits of every prompt position (batch x prompt x vocab); "
              "`generate` computes the last position's only (`logits_to_keep=1`)",
    "prefill-cache": "its prefill figure holds no KV cache (the prompt's keys and values are written during "
                     "the prefill and live at its peak)",
    "eager": "eager attention: `inference()` passes no `flash_attn` flag, so the b x heads x s^2 scores are "
             "never counted",
    "sliding": "sliding-window layers: it caches prompt + new_tokens on every layer (HF keeps window - 1 "
               "tokens on the sliding layers with the dynamic cache, a window-sized buffer with the static one)",
    "sinks": "attention sinks and the q/k/v/o and expert biases are not in its parameter count",
    "mla": "multi-head latent attention: not expressible; its attention is standard Q/K/V/O with hidden / heads "
           "per head, its KV cache 2 x heads x hidden / heads per token and layer (HF caches the compressed "
           "latent, kv_lora_rank + qk_rope_head_dim per token and layer)",
    "dsv3-moe": "DeepSeek-V3's dense first layers (`first_k_dense_replace`) and shared expert are not "
                "expressible: every layer gets the routed experts only",
    "moe": "experts as moe_num_experts x the expert width and a router; the routing's temporaries are not "
           "modelled",
    "head_dim": "head_dim differs from hidden / heads: its attention weights and KV cache use hidden / heads",
    "static": "the static cache is allocated at prompt + new_tokens before the prefill; it has no cache kind",
}


def llm_analysis_shape(case, cfg):
    """The ModelConfig fields of a case's config.json, and the notes on what llm-analysis cannot express."""
    mt = cfg.get("model_type", case.get("model_type"))
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    experts = cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0
    top_k = cfg.get("num_experts_per_tok") or 0
    ffn = (cfg.get("moe_intermediate_size") or cfg["intermediate_size"]) if experts else cfg["intermediate_size"]
    shape = {"num_layers": cfg["num_hidden_layers"], "n_head": heads, "hidden_dim": h, "vocab_size": cfg["vocab_size"],
             "num_key_value_heads": cfg.get("num_key_value_heads") or heads, "ffn_embed_dim": ffn,
             "expansion_ratio": ffn / h, "moe_num_experts": max(1, experts), "moe_top_k": max(1, top_k),
             "max_seq_len": max(cfg.get("max_position_embeddings") or 0, case["prompt"] + case["new_tokens"]),
             "model_type": mt}
    notes = []
    if case["precision"] == "fp32":
        notes.append("32-bit")
    if not cfg.get("tie_word_embeddings", True):
        notes.append("untied")
    if mt in GATED:
        notes.append("gated")
    notes += ["logits", "prefill-cache"]
    if case["attention"] == "eager":
        notes.append("eager")
    if cfg.get("sliding_window") and (cfg.get("layer_types") or cfg.get("use_sliding_window")):
        if any(t == "sliding_attention" for t in cfg.get("layer_types") or ["sliding_attention"]):
            notes.append("sliding")
    if mt == "gpt_oss":
        notes.append("sinks")
    if cfg.get("kv_lora_rank"):
        notes.append("mla")
    elif cfg.get("head_dim") and cfg["head_dim"] != h // heads:
        notes.append("head_dim")
    if experts:
        notes.append("moe")
        if cfg.get("n_shared_experts") or cfg.get("first_k_dense_replace"):
            notes.append("dsv3-moe")
    if case["cache"] == "static":
        notes.append("static")
    return shape, notes


def llm_analysis_peer(cases):
    try:
        from importlib.metadata import version
        v = version("llm-analysis")
        logging.disable(logging.CRITICAL)  # it logs every step at INFO
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            from llm_analysis.analysis import LLMAnalysis
            from llm_analysis.config import DtypeConfig, GPUConfig, ModelConfig, ParallelismConfig
    except Exception:  # noqa: BLE001
        return {"version": None, "results": {}}
    import peers  # the 32-bit throughput lookup of the training peers script
    gpu = GPUConfig(name="a100-sxm-80gb-unbounded", mem_per_GPU_in_GB=1e6, hbm_bandwidth_in_GB_per_sec=2039,
                    intra_node_bandwidth_in_GB_per_sec=300, intra_node_min_message_latency=8e-06,
                    peak_fp16_TFLOPS=312, peak_i8_TFLOPS=624, peak_i4_TFLOPS=1248,
                    inter_node_bandwidth_in_GB_per_sec=200)
    results = {}
    for case in cases:
        try:
            shape, notes = llm_analysis_shape(case, config_of(case))
            bits = BITS[case["precision"]]
            model = ModelConfig(name=case["name"], **shape)
            # a bitsandbytes 4-bit checkpoint: 4-bit weights (its scales are not in llm-analysis)
            wbits = 4 if case.get("quant") else bits
            dtype = DtypeConfig(name=f"w{wbits}a{bits}e{bits}", weight_bits=wbits, activation_bits=bits,
                                embedding_bits=bits)
            cls = LLMAnalysis if bits <= 16 else peers._with_32_bit_lookup(LLMAnalysis)
            with contextlib.redirect_stdout(io.StringIO()):
                a = cls(model, gpu, dtype, ParallelismConfig(tp_size=1, pp_size=1, dp_size=1, sp_size=1))
                s = a.inference(batch_size_per_gpu=case["batch"], seq_len=case["prompt"],
                                num_tokens_to_generate=case["new_tokens"], use_kv_cache=True,
                                layernorm_dtype_bytes=bits // 8, kv_cache_dtype_bytes=bits // 8)
            w, kv = s["weight_memory_per_gpu"], s["kv_cache_memory_per_gpu"]
            pre, dec = s["prefill_activation_memory_per_gpu"], s["decode_activation_memory_per_gpu"]
            results[case["name"]] = {
                "bytes": w + max(pre, kv + dec), "weights": w, "embedding": s["weight_memory_embedding_per_gpu"],
                "kv_cache": kv, "prefill_activations": pre, "decode_activations": dec,
                "phase": "prefill" if pre >= kv + dec else "decode", "parameters": a.get_num_params_total(),
                "notes": notes}
        except Exception as e:  # noqa: BLE001
            results[case["name"]] = {"bytes": None, "notes": [f"refused: {type(e).__name__}: {e}"]}
    return {"version": v, "results": results}


# ------------------------------------------------------------------------------------------------
# 2. accelerate estimate-memory
# ------------------------------------------------------------------------------------------------

ACCELERATE_DTYPE = {"fp32": "float32", "bf16": "float16"}

ACCELERATE_NOTES = {
    "weights-only": "weights (and buffers) only: no KV cache, no activations, no logits",
    "no-head": "untied output layer: it builds `AutoModel`, the base model without the LM head, so the "
               "vocab x hidden output weights are missing",
    "bf16-as-float16": "bf16: its dtypes are float32, float16, int8, int4; the float16 row (2 bytes) is used",
}


def accelerate_peer(cases):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from importlib.metadata import version
        v = version("accelerate")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            from accelerate.commands import estimate
    except Exception:  # noqa: BLE001
        return {"version": None, "results": {}}
    from types import SimpleNamespace
    results = {}
    for case in cases:
        tmp = tempfile.mkdtemp(prefix="serve-peers-")
        try:
            cfg = config_of(case)
            shutil.copy(ROOT / case["config"], Path(tmp) / "config.json")
            # The Hub lookup that `create_empty_model` makes first, answered locally.
            estimate.verify_on_hub = lambda repo, token=None, _c=cfg: SimpleNamespace(library_name="transformers",
                                                                                      config=_c)
            dtype = "int4" if case.get("quant") else ACCELERATE_DTYPE[case["precision"]]
            args = SimpleNamespace(model_name=tmp, library_name="transformers", trust_remote_code=False,
                                   dtypes=[dtype])
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                (row,) = estimate.gather_data(args)
            _, largest, total, _ = row
            notes = ["weights-only"]
            if not cfg.get("tie_word_embeddings", True):
                notes.append("no-head")
            if case["precision"] == "bf16" and not case.get("quant"):
                notes.append("bf16-as-float16")
            results[case["name"]] = {"bytes": total, "largest_layer": largest, "dtype": dtype, "notes": notes}
        except Exception as e:  # noqa: BLE001
            results[case["name"]] = {"bytes": None, "notes": [f"refused: {type(e).__name__}: {e}"]}
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"version": v, "results": results}


PEERS = {"llm-analysis": llm_analysis_peer, "accelerate": accelerate_peer}


def run_peer(name, python, cases):
    """A peer's figures from a child process of `python` (the interpreter that has it)."""
    try:
        p = subprocess.run([python, str(Path(__file__).resolve()), "--peer", name], input=json.dumps(cases),
                           capture_output=True, text=True, cwd=ROOT, timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}")
        out = json.loads(p.stdout)
    except Exception as e:  # noqa: BLE001
        return {"version": None, "results": {}, "error": f"{type(e).__name__}: {e}", "python": python}
    out["python"] = python
    return out


# ------------------------------------------------------------------------------------------------
# 3. memalg serve
# ------------------------------------------------------------------------------------------------

def find_key(d, key):
    """`d[key]` at the top level, else the first one met breadth-first in nested objects."""
    todo = [d]
    while todo:
        x = todo.pop(0)
        if isinstance(x, dict):
            if key in x and isinstance(x[key], (int, float)):
                return x[key]
            todo += list(x.values())
    return None


def memalg_serve(case, memalg):
    if memalg is None:
        return {"bytes": None, "status": "not available", "why": "no memalg binary"}
    cmd = [memalg, "serve", "--config", case["config"], "--batch", str(case["batch"]), "--prompt", str(case["prompt"]),
           "--new-tokens", str(case["new_tokens"]), "--dtype", case["precision"], "--cache", case["cache"],
           "--attention", case["attention"], "--device", "cpu", "--json"]
    if case.get("prefill_chunk"):
        cmd += ["--prefill-chunk", str(case["prefill_chunk"])]
    if case.get("quant"):
        cmd += ["--weights", case["quant"]]
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    except Exception as e:  # noqa: BLE001
        return {"bytes": None, "status": "not available", "why": f"{type(e).__name__}: {e}"}
    if p.returncode != 0:
        why = (p.stderr.strip() or p.stdout.strip() or f"exit {p.returncode}").splitlines()[-1]
        missing = "not a sub-command" in why or ("serve" in why and "subcommand" in why.lower())
        return {"bytes": None, "status": "not available" if missing else "error", "why": why}
    try:
        peak = find_key(json.loads(p.stdout), "peak_bytes")
    except ValueError as e:
        return {"bytes": None, "status": "error", "why": f"not JSON: {e}"}
    if peak is None:
        return {"bytes": None, "status": "error", "why": "no peak_bytes in its JSON"}
    return {"bytes": peak, "status": "ok"}


# ------------------------------------------------------------------------------------------------

def err(est, meas):
    return None if est is None else (est - meas) / meas


def mb(x):
    return "n/a" if x is None else f"{x / 1e6:.1f}"


COLUMNS = (("llm_analysis", "llm-analysis"), ("accelerate", "accelerate"), ("memalg", "memalg"))


def run(cases, args):
    memalg = args.memalg
    if memalg is None:
        memalg = next((m for m in MEMALG_CANDIDATES if (ROOT / m).exists()), None)
    if memalg is not None and not Path(memalg).is_absolute():
        memalg = str(ROOT / memalg)
    if memalg is not None and not Path(memalg).exists():
        memalg = None
    la = run_peer("llm-analysis", args.llm_analysis_python, cases)
    acc = run_peer("accelerate", args.accelerate_python, cases)
    rows = []
    for c in cases:
        row = {"case": c["name"], "family": c["family"], "model_type": c.get("model_type"),
               "precision": c["precision"], "batch": c["batch"], "prompt": c["prompt"],
               "new_tokens": c["new_tokens"], "cache": c["cache"], "attention": c["attention"],
               "measured": c["peak_bytes"], "measured_phase": c.get("peak_phase"),
               "parameter_bytes": c.get("parameter_bytes")}
        for key, peer in (("llm_analysis", la), ("accelerate", acc)):
            r = peer["results"].get(c["name"]) if peer.get("version") else None
            row[key] = r
        row["memalg"] = memalg_serve(c, memalg)
        for key, _ in COLUMNS:
            if row[key] is not None:
                row[key]["error"] = err(row[key]["bytes"], c["peak_bytes"])
        rows.append(row)
    versions = {"llm-analysis": la.get("version"), "llm-analysis-python": la.get("python"),
                "accelerate": acc.get("version"), "accelerate-python": acc.get("python"),
                "memalg": os.path.relpath(memalg, ROOT) if memalg else None}
    for name, peer in (("llm-analysis-error", la), ("accelerate-error", acc)):
        if peer.get("error"):
            versions[name] = peer["error"]
    return rows, versions


def cell(r, key):
    p = r[key]
    if p is None:
        return "not installed", ""
    if p["bytes"] is None:
        return p.get("status", "refused"), ""
    return mb(p["bytes"]), compare.pct(p["error"])


def summaries(rows):
    return {label: compare.summary([r[key]["error"] for r in rows if r[key] is not None]) for key, label in COLUMNS}


def setup(r):
    return f"{r['batch']}x{r['prompt']}+{r['new_tokens']}"


def text_table(rows):
    head = ["case", "prec", "BxP+N", "cache", "attn", "measured MB"]
    for _, label in COLUMNS:
        head += [f"{label} MB", "error"]
    body = []
    for r in rows:
        line = [r["case"], r["precision"], setup(r), r["cache"], r["attention"], mb(r["measured"])]
        for key, _ in COLUMNS:
            line += list(cell(r, key))
        body.append(line)
    widths = [max(len(str(x[i])) for x in [head] + body) for i in range(len(head))]
    fmt = lambda x: "  ".join(str(v).ljust(w) if i < 5 else str(v).rjust(w)  # noqa: E731
                              for i, (v, w) in enumerate(zip(x, widths)))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(x) for x in body])


def markdown_table(rows):
    out = ["| case | precision | batch x prompt + new | cache | attention | measured MB (phase) "
           "| llm-analysis MB | error | accelerate MB | error | memalg MB | error |",
           "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cells = []
        for key, _ in COLUMNS:
            cells += cell(r, key)
        out.append(f"| {r['case']} | {r['precision']} | {setup(r)} | {r['cache']} | {r['attention']} "
                   f"| {mb(r['measured'])} ({r['measured_phase']}) | " + " | ".join(c or "-" for c in cells) + " |")
    return "\n".join(out)


def markdown_parts(rows):
    out = ["| case | measured params MB | llm-analysis weights / KV cache / prefill act. / decode act. MB (its peak) "
           "| llm-analysis not expressed | accelerate largest layer / total MB (dtype) | accelerate not expressed |",
           "|---|---:|---|---|---|---|"]
    for r in rows:
        la, ac = r["llm_analysis"], r["accelerate"]
        if la is None:
            la_parts, la_notes = "not installed", "-"
        elif la["bytes"] is None:
            la_parts, la_notes = "refused", ", ".join(la["notes"])
        else:
            la_parts = (f"{mb(la['weights'])} / {mb(la['kv_cache'])} / {mb(la['prefill_activations'])} / "
                        f"{mb(la['decode_activations'])} ({la['phase']})")
            la_notes = ", ".join(la["notes"])
        if ac is None:
            ac_parts, ac_notes = "not installed", "-"
        elif ac["bytes"] is None:
            ac_parts, ac_notes = "refused", ", ".join(ac["notes"])
        else:
            ac_parts = f"{mb(ac['largest_layer'])} / {mb(ac['bytes'])} ({ac['dtype']})"
            ac_notes = ", ".join(ac["notes"])
        out.append(f"| {r['case']} | {mb(r['parameter_bytes'])} | {la_parts} | {la_notes} | {ac_parts} | {ac_notes} |")
    return "\n".join(out)


def legend(notes, prefix="- "):
    return "\n".join(f"{prefix}`{k}`: {v}" for k, v in notes.items())


def summary_lines(stats):
    out = []
    for label, s in stats.items():
        if not s["n"]:
            out.append(f"{label}: no figures")
        else:
            out.append(f"{label}: {s['n']} cases, {s['under']} under; error median {compare.pct(s['median'])}, "
                       f"range {compare.pct(s['min'])} .. {compare.pct(s['max'])}")
    return out


def header(versions):
    la = versions["llm-analysis"] or "not installed (%s)" % versions.get("llm-analysis-error",
                                                                         versions["llm-analysis-python"])
    ac = versions["accelerate"] or "not installed (%s)" % versions.get("accelerate-error",
                                                                      versions["accelerate-python"])
    return (f"peers: llm-analysis {la}, accelerate {ac} (estimate-memory's gather_data, offline); "
            f"memalg serve: {versions['memalg'] or 'no binary'}")


def default_llm_analysis_python():
    p = ROOT.parent / ".venv-peers" / "bin" / "python"
    return str(p) if p.exists() else sys.executable


def default_accelerate_python():
    venv = os.environ.get("MEMALG_TORCH_VENV")  # bench/torch/run.sh's environment
    if not venv:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        venv = str(Path(cache) / "memalg" / "venv-torch")
    p = Path(venv) / "bin" / "python"
    return str(p) if p.exists() else sys.executable


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured", default=DEFAULT_MEASURED)
    ap.add_argument("--cases", help="comma-separated names or shell patterns (default all)")
    ap.add_argument("--memalg", help="the memalg binary (default: %s, the first that exists)"
                    % " or ".join(MEMALG_CANDIDATES))
    ap.add_argument("--llm-analysis-python", default=default_llm_analysis_python(),
                    help="interpreter with llm-analysis installed (default %(default)s)")
    ap.add_argument("--accelerate-python", default=default_accelerate_python(),
                    help="interpreter with accelerate and transformers installed (default %(default)s)")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--markdown", action="store_true", help="print Markdown tables for bench/RESULTS.md")
    ap.add_argument("--peer", choices=sorted(PEERS), help=argparse.SUPPRESS)  # child mode: cases on stdin
    a = ap.parse_args(argv)
    if a.peer:
        json.dump(PEERS[a.peer](json.load(sys.stdin)), sys.stdout, default=float)
        return 0
    _, cases = compare.load_cases(a.measured, a.cases)
    cases = [c for c in cases if not c.get("skipped")]
    if not cases:
        ap.error("no cases")
    rows, versions = run(cases, a)
    stats = summaries(rows)
    if a.json:
        json.dump({"versions": versions, "cases": rows, "summary": stats,
                   "notes": {"llm-analysis": LLM_ANALYSIS_NOTES, "accelerate": ACCELERATE_NOTES}},
                  sys.stdout, indent=1, default=float)
        print()
        return 0
    if a.markdown:
        print(header(versions) + "\n")
        print(markdown_table(rows))
        print("\n" + markdown_parts(rows))
        print("\nllm-analysis cannot express:\n\n" + legend(LLM_ANALYSIS_NOTES))
        print("\naccelerate estimate-memory cannot express:\n\n" + legend(ACCELERATE_NOTES) + "\n")
        print("\n".join("- " + x for x in summary_lines(stats)))
        return 0
    print(header(versions) + "\n")
    print(text_table(rows))
    for r in rows:
        m = r["memalg"]
        if m["bytes"] is None and m.get("why") and m["status"] != "not available":
            print(f"memalg {r['case']}: {m['why']}")
    print("\nnot expressed, per case:")
    for r in rows:
        parts = []
        for key, label in (("llm_analysis", "llm-analysis"), ("accelerate", "accelerate")):
            if r[key] is not None:
                parts.append(f"{label}: {', '.join(r[key]['notes'])}")
        print(f"  {r['case']}: " + ("; ".join(parts) or "-"))
    print("\n" + legend(LLM_ANALYSIS_NOTES, "  llm-analysis ") + "\n" + legend(ACCELERATE_NOTES, "  accelerate "))
    print("\n" + "\n".join(summary_lines(stats)))
    if not versions["memalg"] or all(r["memalg"]["status"] == "not available" for r in rows):
        print("memalg: not available")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""Ground-truth memory of Hugging Face generation, for checking `memalg serve` against.

Every case builds a causal language model from its `configs/<name>.json` with random weights (no
download), runs `model.generate` once to warm up and once under the profiler, and records the exact
peak of live tensor bytes over the second call, the phase where it occurs (the prefill forward, a
decode forward at cache length L, or the generation loop between forwards) and each phase's own
peak. The method is measure.py's (README.md, "Method"): the profiler's memory timeline, every
allocation and free of the CPU allocator, read back with `measure.analyse`.

    python bench/torch/measure_serve.py --all                 # every case -> serve.measured.json
    python bench/torch/measure_serve.py --cases 'srv-llama*'  # a subset, printed (add --out FILE)

Greedy decoding (`do_sample=False`) with no end-of-sequence token, so every case generates exactly
`new_tokens` tokens; the prompts are random token ids with an attention mask of ones (no padding).
"""

import argparse
import fnmatch
import gc
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402  (sets the offline environment before importing transformers)
from measure import torch, transformers  # noqa: E402

HERE = measure.HERE
REPO = measure.REPO
OUT = os.path.join(HERE, "serve.measured.json")

DEFAULTS = {"attention": "sdpa", "precision": "fp32", "batch": 4, "prompt": 512, "new_tokens": 8,
            "cache": "dynamic", "layers": 4, "hidden": 512, "heads": 8, "kv_heads": None, "head_dim": None,
            "ffn": None, "vocab": None, "window": None, "layer_types": None, "experts": None, "top_k": None,
            "tied": None, "prefill_chunk": None, "quant": None}


def case(name, family, **kw):
    c = dict(DEFAULTS)
    c.update(kw)
    c["name"] = name
    c["family"] = family
    return c


def cases():
    """At least twelve generations over the families of 2024-2026: full attention with grouped
    queries (Llama 3, Qwen3), sliding-window layers (Gemma 3, gpt-oss), latent attention and
    experts (DeepSeek-V3), experts (Qwen3-MoE, gpt-oss); fp32 and bf16; the dynamic and the static
    cache; SDPA and eager attention."""
    return [
        case("srv-llama", "llama"),
        case("srv-llama-bf16", "llama", precision="bf16", hidden=768, heads=12, layers=6),
        case("srv-llama-static", "llama", cache="static"),
        case("srv-llama-eager-bf16", "llama", attention="eager", precision="bf16", hidden=768, heads=12),
        case("srv-llama-long", "llama", batch=1, prompt=2048, new_tokens=16),
        case("srv-llama-b16", "llama", batch=16, prompt=128, new_tokens=32, kv_heads=8),
        case("srv-qwen3", "qwen3"),
        case("srv-qwen3-static-bf16", "qwen3", cache="static", precision="bf16", hidden=768, heads=12, layers=6),
        case("srv-gemma3", "gemma3", window=128, layers=6),
        case("srv-gemma3-static-bf16", "gemma3", cache="static", precision="bf16", window=128, layers=6,
             hidden=768, heads=12),
        case("srv-dsv3", "deepseek_v3"),
        case("srv-dsv3-static-bf16", "deepseek_v3", cache="static", precision="bf16", hidden=768, heads=12),
        case("srv-qwen3moe", "qwen3_moe"),
        case("srv-gptoss-bf16", "gpt_oss", attention="eager", precision="bf16", window=128),
        # Short prompts and long generations: the peak in decoding, at the cache's longest.
        case("srv-llama-decode", "llama", batch=16, prompt=16, new_tokens=160, kv_heads=8),
        case("srv-gemma3-decode-static", "gemma3", cache="static", batch=16, prompt=16, new_tokens=160, window=64,
             layers=6, kv_heads=8),
        # Chunked prefill (generation_config.prefill_chunk_size): the prompt in forwards of 128 tokens.
        case("srv-llama-chunked", "llama", prefill_chunk=128, batch=8),
        case("srv-qwen3-chunked-bf16", "qwen3", prefill_chunk=128, precision="bf16", batch=8, hidden=768, heads=12),
        # A bitsandbytes NF4 checkpoint (its linear layers but the output layer quantized), bf16 compute.
        case("srv-llama-nf4", "llama", quant="nf4", precision="bf16", hidden=1024, heads=16, layers=8),
    ]


def config_path(c):
    return os.path.join(measure.CONFIGS, c["name"] + ".json")


def config_dict(c):
    d = measure.family_config(c["family"], c["layers"], 0.0, c["tied"], c["hidden"], c["heads"], c["vocab"],
                              c["ffn"], None, c["kv_heads"], c["head_dim"], None, c["experts"], c["top_k"],
                              None, None, c["window"], c["layer_types"])
    d["use_cache"] = True
    return d


def write_config(c):
    os.makedirs(measure.CONFIGS, exist_ok=True)
    text = json.dumps(config_dict(c), indent=2, sort_keys=True) + "\n"
    path = config_path(c)
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)


def build(c):
    write_config(c)
    with open(config_path(c)) as f:
        d = json.load(f)
    model_type = d.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **d)
    config._attn_implementation = c["attention"]
    torch.manual_seed(measure.SEED)
    dtype = torch.bfloat16 if c["precision"] == "bf16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=c["attention"], dtype=dtype)
    if c["quant"]:
        # saved and loaded again with a quantization_config, as a released 4-bit checkpoint is
        import tempfile
        qc = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=c["quant"].split("-")[0],
                                             bnb_4bit_use_double_quant=c["quant"].endswith("-dq"),
                                             bnb_4bit_compute_dtype=dtype)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            del model
            model = transformers.AutoModelForCausalLM.from_pretrained(
                tmp, quantization_config=qc, device_map="cpu", attn_implementation=c["attention"], dtype=dtype)
    model.eval()
    g = model.generation_config
    g.eos_token_id = None
    g.pad_token_id = 0
    g.bos_token_id = None
    g.do_sample = False
    g.temperature, g.top_p, g.top_k = None, None, None
    ids = torch.randint(3, config.vocab_size, (c["batch"], c["prompt"]), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    return model, ids, mask


class Phases:
    """record_function ranges around every forward of the model: "prefill" for the first of a
    generate call, "decode:L" for the later ones (L: the tokens in the cache after it)."""

    def __init__(self, model, prompt, chunk=None):
        self.prompt = prompt
        self.chunks = -(-prompt // chunk) if chunk else 1  # forwards of the prefill
        self.calls = 0
        self.open = None
        model.register_forward_pre_hook(self.enter)
        model.register_forward_hook(self.leave)

    def reset(self):
        self.calls = 0

    def enter(self, module, args):
        name = "prefill" if self.calls < self.chunks else "decode:%d" % (self.prompt + self.calls - self.chunks + 1)
        self.calls += 1
        self.open = torch.profiler.record_function(measure.CpuPhases.prefix + name)
        self.open.__enter__()

    def leave(self, module, args, output):
        self.open.__exit__(None, None, None)
        self.open = None


def generate(model, ids, mask, c):
    kw = {"max_new_tokens": c["new_tokens"], "min_new_tokens": c["new_tokens"], "do_sample": False}
    if c["cache"] == "static":
        kw["cache_implementation"] = "static"
        kw["disable_compile"] = True
    if c["prefill_chunk"]:
        kw["prefill_chunk_size"] = c["prefill_chunk"]
    with torch.no_grad():
        with torch.profiler.record_function(measure.CpuPhases.prefix + "generate"):
            return model.generate(ids, attention_mask=mask, **kw)


def profiled(c):
    """The model, its prompt and the profile of its second generate call."""
    model, ids, mask = build(c)
    phases = Phases(model, c["prompt"], c["prefill_chunk"])
    out = generate(model, ids, mask, c)  # warm-up: lazy state is made before the measured call
    assert out.shape == (c["batch"], c["prompt"] + c["new_tokens"]), out.shape
    del out
    gc.collect()
    phases.reset()
    from torch.profiler import ProfilerActivity, profile
    t = time.time()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        with torch.profiler.record_function(measure.STEP_PREFIX + "0"):
            out = generate(model, ids, mask, c)
    seconds = time.time() - t
    assert out.shape == (c["batch"], c["prompt"] + c["new_tokens"]), out.shape
    return model, ids, mask, prof, seconds


class Explained:
    """What measure.explain_profile reads of a training setup: the model, and no optimizer."""

    class optimizer:
        state = {}

    def __init__(self, model):
        self.model = model


def explain(c, top, maxima):
    model, ids, mask, prof, _ = profiled(c)
    e = measure.explain_profile(prof, Explained(model), "cpu", "peak", maxima)
    e["name"] = c["name"]
    return measure.explain_text(e, top)


def measure_case(c):
    model, ids, mask, prof, seconds = profiled(c)
    names = ["prefill"] + ["decode:%d" % (c["prompt"] + k) for k in range(1, c["new_tokens"])] + ["generate"]
    r = measure.analyse(prof, phases=tuple(names))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    # bitsandbytes' quantization states (absmax, code; nested with double quantization)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers()) + sum(
        t.numel() * t.element_size() for t in measure.quant_state_tensors(model))
    d = {k: c[k] for k in ("name", "family", "attention", "precision", "batch", "prompt", "new_tokens", "cache")}
    for k in ("prefill_chunk", "quant"):
        if c[k]:
            d[k] = c[k]
    d["model_type"] = config_dict(c)["model_type"]
    d["config"] = os.path.relpath(config_path(c), REPO).replace(os.sep, "/")
    d["parameters"] = sum(p.numel() for p in model.parameters())
    d["parameter_bytes"] = params
    d["buffer_bytes"] = buffers
    d["peak_bytes"] = r["peak_bytes"]
    d["peak_phase"] = r["peak_phase"]
    per = r["phase_peak_bytes"]
    d["prefill_peak_bytes"] = per.get("prefill", 0)
    decode = {k: v for k, v in per.items() if k.startswith("decode:")}
    d["decode_peak_bytes"] = max(decode.values()) if decode else 0
    d["decode_peak_phase"] = max(decode, key=decode.get) if decode else ""
    d["loop_peak_bytes"] = per.get("generate", 0)
    d["start_bytes"] = r["start_bytes"]
    d["end_bytes"] = r["steady_bytes"]
    d["allocator_peak_bytes"] = r["allocator_peak_bytes"]
    bad = []
    if r["allocator_peak_bytes"] != r["peak_bytes"]:
        bad.append("allocator stream peak %d != timeline peak %d" % (r["allocator_peak_bytes"], r["peak_bytes"]))
    inputs = ids.numel() * ids.element_size() + mask.numel() * mask.element_size()
    if not params + inputs <= r["start_bytes"] <= params + buffers + inputs:
        bad.append("%d bytes at the start, not the parameters %d and the prompt's ids and mask %d (+ buffers %d)"
                   % (r["start_bytes"], params, inputs, buffers))
    d["checks"] = bad
    d["seconds"] = round(seconds, 1)
    return d


def versions():
    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "threads": torch.get_num_threads()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true", help="every case, written to serve.measured.json")
    ap.add_argument("--cases", help="comma-separated name patterns")
    ap.add_argument("--out", help="write the result here")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--explain", metavar="CASE", help="every storage live at the case's peak, grouped")
    ap.add_argument("--top", type=int, default=25, help="with --explain: the rows shown")
    ap.add_argument("--maxima", type=int, default=0, help="with --explain: also the N largest local maxima")
    a = ap.parse_args()
    todo = cases()
    if a.explain:
        found = [c for c in todo if c["name"] == a.explain]
        if not found:
            ap.error("no case " + a.explain)
        print(explain(found[0], a.top, a.maxima))
        return 0
    if a.list:
        for c in todo:
            print(c["name"])
        return 0
    if a.cases:
        pats = a.cases.split(",")
        todo = [c for c in todo if any(fnmatch.fnmatch(c["name"], p) for p in pats)]
    elif not a.all:
        ap.error("give --all or --cases")
    for k, v in measure.PINNED.items():
        if not versions()[k].startswith(v):
            print("warning: %s %s, the committed data used %s" % (k, versions()[k], v), file=sys.stderr)
    out = a.out or (OUT if a.all else None)
    v = versions()
    result = {"method": "exact live CPU tensor bytes over one model.generate call after a warm-up call, from the "
                        "profiler's memory timeline (bench/torch/measure_serve.py)",
              "commands": ["python bench/torch/measure_serve.py --all"], "device": "cpu", "torch": v["torch"],
              "transformers": v["transformers"], "python": v["python"], "threads": v["threads"], "cases": []}
    if out and os.path.exists(out) and not a.all:
        with open(out) as f:
            result = json.load(f)
        command = "python bench/torch/measure_serve.py --cases '%s' --out %s" % (a.cases, os.path.relpath(out, REPO))
        if command not in result["commands"]:
            result["commands"].append(command)
    for c in todo:
        d = measure_case(c)
        print("%-26s peak %12d B (%8.1f MB) in %-12s prefill %12d decode %12d loop %12d %5.1f s%s"
              % (d["name"], d["peak_bytes"], d["peak_bytes"] / 1e6, d["peak_phase"], d["prefill_peak_bytes"],
                 d["decode_peak_bytes"], d["loop_peak_bytes"], d["seconds"],
                 "" if not d["checks"] else "  CHECKS FAILED: " + "; ".join(d["checks"])), flush=True)
        result["cases"] = [x for x in result["cases"] if x["name"] != d["name"]] + [d]
        if out:
            with open(out, "w") as f:
                json.dump(result, f, indent=1, sort_keys=True)
                f.write("\n")
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())

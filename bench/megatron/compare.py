#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""memalg's megatron stack against Megatron-LM's measured memory (golden values).

For every case of golden.json this runs

    memalg plan --stack megatron --layers L --hidden H ... --stage <last> --json

with the flags the case's arguments and Megatron's defaults give (the same mapping as the ctest
planner.measured, tools/test_measured.cpp), and compares the logging rank (the last pipeline
stage) with the golden series: the plan's peak with mem-max-allocated-bytes, its steady state with
mem-allocated-bytes. Both golden figures are allocated bytes of PyTorch's caching allocator, so the
device's runtime reserve (the CUDA context) is left out of the prediction. The cases under `bounds`
(expert parallelism, whose routed rows depend on the routing) are compared with the largest
mem-max-allocated-bytes of their series: the plan, which takes the worst routing, must be above it.

    python3 bench/megatron/compare.py [--stack NAME] [--memalg build/tools/memalg] [--json]
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def flags(case, stack="megatron"):
    d = case["derived"]
    f = ["plan", "--stack", stack,
         "--layers", str(d["num_layers"]), "--hidden", str(d["hidden"]), "--heads", str(d["heads"]),
         "--kv-heads", str(d["kv_heads"]), "--ffn", str(d["ffn"]), "--vocab", str(d["vocab"]["padded"]),
         "--positions", str(d["max_position_embeddings"]),
         "--seq", str(d["seq_length"]), "--micro-batch", str(d["micro_batch"]),
         "--grad-accum", str(d["grad_accum"]), "--precision", "mixed-bf16-fp32-grads", "--optimizer", "adam",
         "--tp", str(d["tp"]), "--pp", str(d["pp"]), "--dp", str(d["dp"]),
         "--zero", "1" if d["distributed_optimizer"] else "0",
         "--dropout", str(d["dropout"]["hidden"]), "--attention", "flash", "--device", "h100-80gb",
         "--stage", str(d["pp"] - 1), "--json"]
    if not d["tied_embeddings"]:
        f.append("--untied")
    if d.get("gated_linear_unit"):
        f.append("--swiglu")
    if not d["bias_linear"]:
        f.append("--no-linear-bias")  # Megatron's --disable-bias-linear: the LayerNorms keep theirs
    if d.get("moe"):
        moe = d["moe"]
        sinkhorn = moe["load_balancing"].startswith("sinkhorn")
        assert (sinkhorn or moe["load_balancing"].startswith("aux_loss")) and moe["capacity_factor"] is None
        f += ["--experts", str(moe["num_experts"]), "--top-k", str(moe["router_topk"]),
              "--moe-router", "sinkhorn" if sinkhorn else "softmax", "--ep", str(moe["expert_model_parallel"])]
        if moe["router_dtype"].startswith("fp32"):
            f += ["--moe-router-dtype", "fp32"]
        if "ffn_hidden_size" in moe:
            f[f.index("--ffn") + 1] = str(moe["ffn_hidden_size"])
    if d["vp"] is not None:
        f += ["--pp-schedule", "interleaved:%d" % d["vp"]]
    if isinstance(d["recompute"], dict):
        f += ["--recompute", "every:%d" % d["recompute"]["num_layers"]]
    return f


def last(series):
    values = {int(k): v for k, v in series["values"].items() if isinstance(v, (int, float))}
    return int(values[max(values)])


def largest(series):
    return int(max(v for v in series["values"].values() if isinstance(v, (int, float))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memalg", default="build/tools/memalg")
    ap.add_argument("--golden", default="bench/megatron/golden.json")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--stack", default="megatron", help="memalg's --stack (default megatron)")
    args = ap.parse_args()
    golden = json.loads((ROOT / args.golden).read_text())
    binary = args.memalg if Path(args.memalg).is_absolute() else str(ROOT / args.memalg)
    rows = []
    for case in golden["cases"] + golden.get("bounds", []):
        bound = case in golden.get("bounds", [])
        argv = flags(case, args.stack)
        proc = subprocess.run([binary] + argv, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit("%s: memalg %s failed: %s" % (case["name"], " ".join(argv), proc.stderr.strip()))
        plan = json.loads(proc.stdout)
        reserve = plan["per_rank"]["reserve"]
        peak = plan["per_rank"]["total"] - reserve
        steady = next(p["bytes"] for p in plan["phases"] if p["name"] == "steady") - reserve
        max_alloc = (largest if bound else last)(case["golden"]["mem-max-allocated-bytes"])
        alloc = last(case["golden"]["mem-allocated-bytes"])
        rows.append({"case": case["name"] + (" (bound)" if bound else ""), "command": "memalg " + " ".join(argv),
                     "max_allocated": max_alloc, "predicted_peak": peak, "peak_error": (peak - max_alloc) / max_alloc,
                     "peak_phase": plan["peak_phase"], "allocated": alloc, "predicted_steady": steady,
                     "steady_error": (steady - alloc) / alloc})
    if args.json:
        print(json.dumps({"megatron_commit": golden["megatron_commit"], "cases": rows}, indent=1))
        return
    print("| case | max allocated GB | predicted peak GB | error | peak phase | allocated GB | predicted steady GB | error |")
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for r in rows:
        print("| %s | %.3f | %.3f | %+.2f%% | %s | %.3f | %.3f | %+.2f%% |" % (
            r["case"], r["max_allocated"] / 1e9, r["predicted_peak"] / 1e9, 100 * r["peak_error"], r["peak_phase"],
            r["allocated"] / 1e9, r["predicted_steady"] / 1e9, 100 * r["steady_error"]))


if __name__ == "__main__":
    main()

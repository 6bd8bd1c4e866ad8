#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""The pytorch stack's predictions next to the harness's CUDA figures (bench/gpu/run.sh, stage 3b).

For every case of a `measure.py --device cuda` output this plans the case as compare.py does, on
the GPU named by --device, and prints torch.cuda.max_memory_allocated and max_memory_reserved next
to the plan's tensor peak (total - reserve) and its total (the reserve covers the CUDA context and
the cuBLAS workspaces the caching allocator hands out: docs/accuracy.md, "What only CUDA adds").

    python3 bench/torch/compare_cuda.py MEASURED_CUDA.json [--device h200] [--memalg PATH] [--json]
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measured")
    ap.add_argument("--device", default="h200")
    ap.add_argument("--memalg", default=compare.DEFAULT_MEMALG)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    data = json.loads(Path(a.measured).read_text())
    binary = a.memalg if Path(a.memalg).is_absolute() else str(compare.ROOT / a.memalg)
    rows = []
    for case in data["cases"]:
        if "max_memory_allocated" not in case:
            continue
        args = compare.memalg_args(case, with_dropout=False)
        args[args.index("--device") + 1] = a.device
        proc = subprocess.run([binary] + args, cwd=compare.ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit("%s: memalg %s failed: %s" % (case["name"], " ".join(args), proc.stderr.strip()))
        r = json.loads(proc.stdout)["per_rank"]
        alloc, reserved = case["max_memory_allocated"], case["max_memory_reserved"]
        rows.append({"case": case["name"], "max_memory_allocated": alloc, "max_memory_reserved": reserved,
                     "predicted_tensors": r["total"] - r["reserve"], "predicted_total": r["total"],
                     "tensor_error": (r["total"] - r["reserve"] - alloc) / alloc,
                     "total_minus_reserved": r["total"] - reserved, "command": "memalg " + " ".join(args)})
    if a.json:
        json.dump({"device": a.device, "cases": rows}, sys.stdout, indent=1)
        print()
        return 0
    print("| case | max allocated MB | max reserved MB | memalg tensors MB | error | memalg total MB | total - reserved MB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| %s | %.1f | %.1f | %.1f | %+.2f%% | %.1f | %+.1f |" % (
            r["case"], r["max_memory_allocated"] / 1e6, r["max_memory_reserved"] / 1e6, r["predicted_tensors"] / 1e6,
            100 * r["tensor_error"], r["predicted_total"] / 1e6, r["total_minus_reserved"] / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())

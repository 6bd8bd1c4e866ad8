#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""`memalg serve` next to the measured generations of serve.measured.json.

    python3 bench/torch/compare_serve.py [--memalg build/tools/memalg] [--markdown]

Every case is planned on the host CPU it was measured on (`--device cpu`: no runtime reserve, the
CPU's attention kernels). The error is (plan - measured) / measured of the peak of live tensor
bytes; the bar (tools/test_serve.cpp) is within 2 %, never below by more than 0.1 %.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def plan(memalg, c):
    cmd = [memalg, "serve", "--config", c["config"], "--batch", str(c["batch"]), "--prompt", str(c["prompt"]),
           "--new-tokens", str(c["new_tokens"]), "--dtype", c["precision"], "--cache", c["cache"],
           "--attention", c["attention"], "--device", "cpu", "--json"]
    if c.get("prefill_chunk"):
        cmd += ["--prefill-chunk", str(c["prefill_chunk"])]
    if c.get("quant"):
        cmd += ["--weights", c["quant"]]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("%s: %s" % (c["name"], out.stderr.strip()))
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memalg", default=os.path.join("build", "tools", "memalg"))
    ap.add_argument("--measured", default=os.path.join("bench", "torch", "serve.measured.json"))
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    with open(os.path.join(ROOT, a.measured)) as f:
        cases = json.load(f)["cases"]
    rows, errors = [], []
    for c in cases:
        j = plan(a.memalg, c)
        e = (j["peak_bytes"] - c["peak_bytes"]) / c["peak_bytes"]
        errors.append(e)
        rows.append((c, j, e))
    if a.markdown:
        print("| case | family | dtype | batch × (prompt + new) | cache | attention | measured B (phase) | memalg B (phase) | error |")
        print("|---|---|---|---|---|---|---:|---:|---:|")
        for c, j, e in rows:
            print("| %s | %s | %s | %d × (%d + %d) | %s | %s | %s (%s) | %s (%s) | %+.4f %% |"
                  % (c["name"], c["model_type"], c["precision"], c["batch"], c["prompt"], c["new_tokens"], c["cache"],
                     c["attention"], format(c["peak_bytes"], ","), c["peak_phase"], format(j["peak_bytes"], ","),
                     j["peak_phase"], 100 * e))
    else:
        for c, j, e in rows:
            print("%-26s measured %13s %-12s memalg %13s %-8s %+8.4f %%"
                  % (c["name"], format(c["peak_bytes"], ","), c["peak_phase"], format(j["peak_bytes"], ","),
                     j["peak_phase"], 100 * e))
    print("\n%d generations: error %+.4f %% .. %+.4f %%, median |error| %.4f %%"
          % (len(errors), 100 * min(errors), 100 * max(errors), 100 * statistics.median(abs(x) for x in errors)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

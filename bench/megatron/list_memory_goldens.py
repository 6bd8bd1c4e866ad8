#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""Inventory of the memory golden values in a Megatron-LM checkout.

Megatron-LM's functional tests keep, next to each test's `model_config.yaml`, one or more
`golden_values_<environment>[_<platform>][_2nd].json` files. This script reads them straight from a
git directory (no work tree needed) and reports the tests whose golden values carry a memory metric
(any key containing "mem": `mem-allocated-bytes`, `mem-max-allocated-bytes`).

    list_memory_goldens.py GIT_DIR [--commit REV] --markdown
        the table of README.md (one row per test)
    list_memory_goldens.py GIT_DIR [--commit REV] --case gpt/gpt3_7b_tp4_pp1_memory_speed \
        --golden golden_values_dev_dgx_h100.json
        the verbatim parts of one golden.json case: MODEL_ARGS, ENV_VARS, the memory series

Standard library only. The YAML blocks read here are flat and are parsed line by line, so every
value stays the text written in the file (a YAML 1.1 loader would keep `1e-2` a string but turn
`1.0e-5` into a float and `.01` into 0.01).
"""

import argparse
import json
import subprocess
import sys
from collections import defaultdict

ROOT = "tests/functional_tests/test_cases"


def git(git_dir, *args):
    return subprocess.run(
        ["git", "--git-dir=" + git_dir, *args], check=True, capture_output=True, text=True
    ).stdout


def flat_block(text, key):
    """The `key:` block of a model_config.yaml as {name: verbatim value}; `true` stays a bool."""
    out, inside = {}, False
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if not raw[0].isspace():
            inside = raw.split(":", 1)[0].strip() == key
            continue
        if not inside:
            continue
        name, _, value = raw.strip().partition(":")
        value = value.strip()
        if " #" in value:  # trailing comment; values here never hold " #"
            value = value[: value.index(" #")].rstrip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[name.strip()] = True if value == "true" else value
    return out


def metrics_list(text):
    """The METRICS list of a model_config.yaml."""
    out, inside = [], False
    for raw in text.splitlines():
        if raw and not raw[0].isspace():
            inside = raw.startswith("METRICS:")
            continue
        if inside and raw.strip().startswith("- "):
            out.append(raw.strip()[2:].strip().strip("\"'"))
    return out


def golden_label(file_name):
    """golden_values_dev_dgx_h100_2nd.json -> ('dgx_h100', 'dev 2nd')."""
    stem = file_name[len("golden_values_") : -len(".json")]
    second = stem.endswith("_2nd")
    if second:
        stem = stem[: -len("_2nd")]
    env, _, platform = stem.partition("_")
    return platform or "(none)", env + (" 2nd" if second else "")


def inventory(git_dir, commit):
    files = git(git_dir, "ls-tree", "-r", "--name-only", commit, ROOT).splitlines()
    tests = defaultdict(lambda: {"goldens": {}, "config": None})
    for path in files:
        parts = path.split("/")
        if len(parts) < 6:
            continue
        test = "/".join(parts[3:-1])
        name = parts[-1]
        if name == "model_config.yaml":
            tests[test]["config"] = path
        elif name.startswith("golden_values") and name.endswith(".json"):
            text = git(git_dir, "show", f"{commit}:{path}").strip()
            data = json.loads(text) if text else {}
            mem = [k for k in data if "mem" in k.lower()]
            if mem:
                form = "series" if isinstance(data[mem[0]], dict) else "scalar"
                tests[test]["goldens"][name] = (mem, form)
    rows = []
    for test, info in sorted(tests.items()):
        if not info["goldens"]:
            continue
        checked = None
        if info["config"]:
            cfg = git(git_dir, "show", f"{commit}:{info['config']}")
            checked = [m for m in metrics_list(cfg) if "mem" in m]
        platforms = defaultdict(list)
        metrics, forms = set(), set()
        for name, (mem, form) in sorted(info["goldens"].items()):
            platform, env = golden_label(name)
            platforms[platform].append(env)
            metrics.update(mem)
            forms.add(form)
        rows.append(
            {
                "test": test,
                "platforms": dict(platforms),
                "metrics": sorted(metrics),
                "form": "/".join(sorted(forms)),
                "in_METRICS": checked,
            }
        )
    return rows


SHORT = {"mem-allocated-bytes": "alloc", "mem-max-allocated-bytes": "max"}


def markdown(rows):
    lines = [
        "| family | test | platform: golden files | memory metrics | form | in METRICS |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        family, _, name = r["test"].partition("/")
        where = "; ".join(f"{p}: {', '.join(e)}" for p, e in sorted(r["platforms"].items()))
        mets = ", ".join(SHORT.get(m, m) for m in r["metrics"])
        checked = (
            "no config"
            if r["in_METRICS"] is None
            else (", ".join(SHORT.get(m, m) for m in r["in_METRICS"]) or "no")
        )
        lines.append(f"| {family} | `{name}` | {where} | {mets} | {r['form']} | {checked} |")
    return "\n".join(lines)


def case(git_dir, commit, test, golden):
    base = f"{ROOT}/{test}"
    cfg = git(git_dir, "show", f"{commit}:{base}/model_config.yaml")
    data = json.loads(git(git_dir, "show", f"{commit}:{base}/{golden}"))
    return {
        "paths": {"model_config": f"{base}/model_config.yaml", "golden_values": f"{base}/{golden}"},
        "arguments": flat_block(cfg, "MODEL_ARGS"),
        "environment": flat_block(cfg, "ENV_VARS"),
        "golden": {k: v for k, v in data.items() if "mem" in k.lower()},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("git_dir")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--case")
    ap.add_argument("--golden")
    a = ap.parse_args()
    commit = git(a.git_dir, "rev-parse", a.commit).strip()
    if a.case:
        out = {"megatron_commit": commit, **case(a.git_dir, commit, a.case, a.golden)}
        json.dump(out, sys.stdout, indent=2)
        print()
        return
    rows = inventory(a.git_dir, commit)
    if a.markdown:
        print(f"{len(rows)} tests at {commit}\n")
        print(markdown(rows))
    else:
        json.dump({"megatron_commit": commit, "tests": rows}, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()

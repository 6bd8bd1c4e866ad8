#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""memalg's predictions against the measured PyTorch / Hugging Face training steps.

For every case of `measured.json` this runs

    memalg plan --config <config> --seq S --micro-batch B --precision P --optimizer O \
        --attention flash|naive --device cpu --stack STACK [--optimizer-impl for-loop] \
        [--optimizer-impl fused] [--recompute full --checkpointing KIND] [--grad-accum K] \
        [--dp 2 [--zero 3]] --json

and compares memalg's tensor peak with the measured peak of live tensor bytes. The stack is the
default, `pytorch`, unless `--stack` names another (`paper` gives the accounting memalg had before
the pytorch stack). It is a report, not a pass/fail test (the ctest planner.measured is): the exit
status is 0 whatever the errors are.

What compares with what
-----------------------
* Peak. memalg's `per_rank.total` is the largest of its phases and includes the device's runtime
  reserve (`per_rank.reserve`: the CUDA context and the cuBLAS workspace of the default device).
  The CPU run has no CUDA context and its figures are live tensor bytes, so the prediction is
  `per_rank.total - per_rank.reserve`.
* Model states. memalg's `weights + master_weights + optimizer_states` against the measured
  `PARAMETER + OPTIMIZER_STATE` at the peak. With FSDP2 the resident shards of the parameters and
  of the optimizer state are DTensor storages the profiler leaves `unknown` in fp32 and calls
  `PARAMETER` in bf16, beside the parameters FSDP2 gathers: the measured model states there are the
  shards as the run measured them at the step's start (`parameter_bytes + optimizer_state_bytes`,
  resident, so the same at the peak), and the gathered parameters count as "everything else",
  where memalg's ZeRO-3 gathers are (its `temporaries`).
* Gradients. memalg's `gradients` against the measured `GRADIENT` at the peak. memalg keeps the
  gradient buffers for the whole step; PyTorch frees them (`zero_grad(set_to_none=True)`) and
  makes them during the backward, so at a peak at the start of the backward there are none.
* Everything else. memalg's `activations + temporaries + comm_buffers` against the rest of the
  measured peak: `ACTIVATION + AUTOGRAD_DETAIL + TEMPORARY + INPUT` and `unknown` (DDP's gradient
  buckets, foreach temporaries, checkpointing's RNG states), FSDP2's gathered `PARAMETER`.
  The three parts sum to the peak on both sides.

Mapping of the knobs: sdpa -> `--attention flash`, eager -> `--attention naive`; precision as
named; SGD with momentum > 0 -> `--optimizer momentum`; gradient checkpointing -> `--recompute
full`; DDP on 2 ranks -> `--dp 2`; FSDP2 on 2 ranks -> `--dp 2 --zero 3`. `--dropout` is refused
with `--config` (the config's dropout fields are read instead: `resid_pdrop`, `attn_pdrop`,
`hidden_dropout`, `attention_dropout`); the script tries the flag and notes the fallback.

MB is 10^6 bytes; error is (predicted - measured) / measured.

    python3 bench/torch/compare.py [--stack NAME] [--measured FILE] [--memalg PATH] [--cases PATTERNS] [--json]
"""
import argparse
import fnmatch
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MEASURED = "bench/torch/measured.json"
DEFAULT_MEMALG = "build/tools/memalg"

ATTENTION = {"sdpa": "flash", "eager": "naive"}
PRECISION = {"fp32": "fp32", "bf16": "bf16", "autocast-bf16": "autocast-bf16"}
# memalg's phases and the measured ones (the measured `loss` range is nested in `forward`).
PHASE = {"forward": "forward", "loss": "forward", "backward": "backward", "optimizer": "optimizer_step",
         "zero_grad": "optimizer_step", "other": "steady"}


def load_cases(path=DEFAULT_MEASURED, patterns=None):
    p = Path(path)
    data = json.loads((p if p.is_absolute() or p.exists() else ROOT / p).read_text())
    cases = data["cases"]
    if patterns:
        pats = [p.strip() for p in patterns.split(",") if p.strip()]
        cases = [c for c in cases if any(fnmatch.fnmatchcase(c["name"], p) for p in pats)]
    return data, cases


def optimizer_flag(case):
    if case["optimizer"] == "sgd":
        return "momentum" if case.get("momentum", 0.0) > 0 else "sgd"
    return case["optimizer"]


def memalg_args(case, with_dropout=True, stack="pytorch"):
    """The `memalg plan` arguments of a measured case (without the binary)."""
    args = ["plan", "--config", case["config"], "--seq", str(case["seq"]),
            "--micro-batch", str(case["micro_batch"]), "--precision", PRECISION[case["precision"]],
            "--optimizer", optimizer_flag(case), "--attention", ATTENTION[case["attention"]],
            "--device", "cpu", "--stack", stack]
    if case.get("fused", False):
        args += ["--optimizer-impl", "fused"]
    elif not case.get("foreach", True):
        args += ["--optimizer-impl", "for-loop"]
    if case["gradient_checkpointing"]:
        args += ["--recompute", "full",
                 "--checkpointing", "reentrant" if case.get("reentrant", False) else "non-reentrant"]
    if case.get("grad_accum", 1) > 1:
        args += ["--grad-accum", str(case["grad_accum"])]
    if case["parallel"] == "ddp":
        args += ["--dp", str(case["world"])]
    elif case["parallel"] == "fsdp2":
        args += ["--dp", str(case["world"]), "--zero", "3"]
    elif case["parallel"] != "none":
        raise ValueError(f"{case['name']}: unknown parallel mode {case['parallel']!r}")
    if with_dropout and case.get("dropout", 0.0) > 0:
        args += ["--dropout", repr(case["dropout"])]
    if case.get("freeze"):
        args += ["--freeze", ",".join(case["freeze"])]
    if case.get("lora"):
        targets = case.get("lora_targets", "all-linear")
        args += ["--lora", str(case["lora"]),
                 "--lora-targets", targets if isinstance(targets, str) else ",".join(targets)]
        if case.get("lora_dropout", 0.0) > 0:
            args += ["--lora-dropout", repr(case["lora_dropout"])]
        if case.get("quant"):
            args += ["--base-storage", case["quant"]]
            if not case["gradient_checkpointing"]:
                args += ["--recompute", "none"]
    return args + ["--json"]


def run_memalg(case, memalg=DEFAULT_MEMALG, stack="pytorch"):
    """memalg's JSON plan of a case, the command used, and notes."""
    binary = str(ROOT / memalg) if not Path(memalg).is_absolute() else memalg
    notes = []
    args = memalg_args(case, stack=stack)
    proc = subprocess.run([binary] + args, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode == 2 and "--dropout" in args:
        notes.append("--dropout refused with --config (" + proc.stderr.strip().removeprefix("memalg: error: ") +
                     "); dropout taken from the config's fields")
        args = memalg_args(case, with_dropout=False, stack=stack)
        proc = subprocess.run([binary] + args, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{case['name']}: memalg {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout), "memalg " + " ".join(args), notes


def measured_split(case):
    """The measured peak split into model states, gradients and everything else (bytes)."""
    b = case["peak_breakdown"]
    get = lambda k: b.get(k, 0)  # noqa: E731
    grads = get("GRADIENT")
    if case["parallel"] == "fsdp2":
        # (the model's own shards and buffers, counted by measure.py: the profiler does not
        # categorise FSDP2's DTensors; memalg counts buffers with the weights)
        states = case["parameter_bytes"] + case["optimizer_state_bytes"] + case.get("buffer_bytes", 0)
        rest = case["peak_bytes"] - states - grads
    elif case.get("quant"):
        # (bitsandbytes' packed weights are filed as INPUT and their quantization states under no
        # category: the resident bytes as measure.py counts them, as planner.measured does)
        states = case["parameter_bytes"] + case["optimizer_state_bytes"] + case["quant_state_bytes"]
        rest = case["peak_bytes"] - states - grads
    else:
        states = get("PARAMETER") + get("OPTIMIZER_STATE")
        rest = case["peak_bytes"] - states - grads
    return states, grads, rest


def predicted_split(plan):
    r = plan["per_rank"]
    states = r["weights"] + r["master_weights"] + r["optimizer_states"]
    return states, r["gradients"], r["activations"] + r["temporaries"] + r["comm_buffers"]


def error(pred, meas):
    return None if meas == 0 else (pred - meas) / meas


def compare_case(case, memalg=DEFAULT_MEMALG, stack="pytorch"):
    plan, command, notes = run_memalg(case, memalg, stack)
    r = plan["per_rank"]
    reserve = r["reserve"]
    predicted = r["total"] - reserve
    if max(p["bytes"] for p in plan["phases"]) != r["total"]:
        notes.append("per_rank.total is not the largest phase")
    if plan["host_per_rank"]["total"]:
        notes.append(f"host bytes {plan['host_per_rank']['total']} not compared")
    ms, mg, mr = measured_split(case)
    ps, pg, pr = predicted_split(plan)
    if ps + pg + pr != predicted:
        notes.append(f"categories sum to {ps + pg + pr}, tensor peak {predicted}")
    phases = {p["name"]: p["bytes"] - reserve for p in plan["phases"]}
    return {
        "case": case["name"],
        "command": command,
        "measured_bytes": case["peak_bytes"],
        "predicted_bytes": predicted,
        "reserve_bytes": reserve,
        "error": error(predicted, case["peak_bytes"]),
        "measured_phase": case["peak_phase"],
        "predicted_phase": plan["peak_phase"],
        "phase_agrees": PHASE.get(case["peak_phase"]) == plan["peak_phase"],
        "model_states": {"measured": ms, "predicted": ps, "error": error(ps, ms)},
        "gradients": {"measured": mg, "predicted": pg},
        "everything_else": {"measured": mr, "predicted": pr, "error": error(pr, mr)},
        "predicted_phase_bytes": phases,
        "measured_phase_bytes": case["phase_peak_bytes"],
        "notes": notes,
    }


def compare_all(cases, memalg=DEFAULT_MEMALG, stack="pytorch"):
    return [compare_case(c, memalg, stack) for c in cases if not c.get("skipped")]  # (skipped: no measurement)


def summary(errors):
    """Count under, min, median, max of a list of relative errors (None skipped)."""
    e = [x for x in errors if x is not None]
    if not e:
        return {"n": 0, "under": 0, "min": None, "median": None, "max": None}
    return {"n": len(e), "under": sum(1 for x in e if x < 0), "min": min(e), "median": statistics.median(e),
            "max": max(e)}


def pct(x):
    return "n/a" if x is None else f"{100 * x:+.2f}%"


def mb(x):
    return f"{x / 1e6:.1f}"


def summary_line(name, s):
    if not s["n"]:
        return f"{name}: no cases"
    return (f"{name}: {s['n']} cases, {s['under']} under-predicted; error min {pct(s['min'])}, "
            f"median {pct(s['median'])}, max {pct(s['max'])}")


def markdown(rows):
    out = ["| case | measured MB | memalg MB | error | memalg peak phase | measured peak phase "
           "| model states meas. / memalg MB | gradients meas. / memalg MB | else meas. / memalg MB (error) |",
           "|---|---:|---:|---:|---|---|---|---|---|"]
    for r in rows:
        s, g, e = r["model_states"], r["gradients"], r["everything_else"]
        out.append(f"| {r['case']} | {mb(r['measured_bytes'])} | {mb(r['predicted_bytes'])} | {pct(r['error'])} "
                   f"| {r['predicted_phase']} | {r['measured_phase']} "
                   f"| {mb(s['measured'])} / {mb(s['predicted'])} | {mb(g['measured'])} / {mb(g['predicted'])} "
                   f"| {mb(e['measured'])} / {mb(e['predicted'])} ({pct(e['error'])}) |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured", default=DEFAULT_MEASURED, help=f"measurements (default {DEFAULT_MEASURED})")
    ap.add_argument("--memalg", default=DEFAULT_MEMALG, help=f"the memalg binary (default {DEFAULT_MEMALG})")
    ap.add_argument("--cases", help="comma-separated names or shell patterns (default all)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of markdown")
    ap.add_argument("--stack", default="pytorch", help="memalg's --stack (default pytorch)")
    a = ap.parse_args(argv)
    data, cases = load_cases(a.measured, a.cases)
    rows = compare_all(cases, a.memalg, a.stack)
    stats = {"peak": summary([r["error"] for r in rows]),
             "model_states": summary([r["model_states"]["error"] for r in rows]),
             "everything_else": summary([r["everything_else"]["error"] for r in rows]),
             "model_states_max_abs_difference_bytes": max(
                 (abs(r["model_states"]["predicted"] - r["model_states"]["measured"]) for r in rows), default=0),
             "phase_agrees": sum(r["phase_agrees"] for r in rows)}
    if a.json:
        json.dump({"measured": a.measured, "torch": data.get("torch"), "transformers": data.get("transformers"),
                   "prediction": "per_rank.total - per_rank.reserve", "stack": a.stack, "cases": rows,
                   "summary": stats},
                  sys.stdout, indent=1)
        print()
        return 0
    print(markdown(rows))
    print()
    print(summary_line("tensor peak", stats["peak"]))
    print(summary_line("model states", stats["model_states"]) +
          f"; largest difference {stats['model_states_max_abs_difference_bytes']} bytes")
    print(summary_line("everything else", stats["everything_else"]))
    print(f"peak phase: memalg's agrees with the measured one in {stats['phase_agrees']} of {len(rows)} cases "
          "(the measured loss counts as forward)")
    for r in rows:
        for n in r["notes"]:
            print(f"note: {r['case']}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

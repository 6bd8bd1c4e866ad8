#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""The measured memory of one step of a case beside memalg's predicted one, as one SVG.

    python bench/torch/plot.py CASE [--out FILE] [--memalg build/tools/memalg] [--save-measured JSON]

Runs the case as measure.py does (`warmed_up`, then `profile_steps`: the last profiled step is the
measured one), walks the memory profiler's timeline the way `analyse` does, and records the live
bytes of every profiler category at every allocation event of that step. memalg's prediction is
`memalg plan --timeline` of the same case (the flags of compare.py's `memalg_args`), read from the
SVG's data attributes. Both are drawn on the same axes: x is the step's phases (steady state,
forward with the loss, backward with the gradient reduction, optimizer step with zero_grad), each
phase as wide as memalg's moments in it, the measured events placed by time within their phase; y
is MB (10^6 bytes, as compare.py writes them). The upper panel stacks memalg's categories with the
measured total over them as a black line; the lower one stacks the profiler's categories.
Cases on two ranks (DDP, FSDP2) run as measure.py runs them, one process per rank over gloo; rank
0 is drawn. Needs the harness's environment (torch, transformers; see README.md), never CI.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare  # noqa: E402
import measure  # noqa: E402
import torch  # noqa: E402

MEMALG_CATEGORIES = ["weights", "gradients", "master_weights", "optimizer_states", "activations", "temporaries",
                     "comm_buffers", "reserve"]
MEMALG_COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"]
# The profiler's categories in the nearest of memalg's colours (AUTOGRAD_DETAIL and INPUT, which
# memalg counts as activations, in darker and lighter greens; unknown as comm_buffers).
PROFILER_COLOURS = {"PARAMETER": "#4e79a7", "GRADIENT": "#f28e2b", "OPTIMIZER_STATE": "#76b7b2",
                    "ACTIVATION": "#59a14f", "AUTOGRAD_DETAIL": "#2e6b2a", "INPUT": "#a6d49a",
                    "TEMPORARY": "#edc948", "unknown": "#b07aa1"}
PROFILER_ORDER = ["PARAMETER", "GRADIENT", "OPTIMIZER_STATE", "ACTIVATION", "AUTOGRAD_DETAIL", "INPUT",
                  "TEMPORARY", "unknown"]
# Measured phase -> the span of memalg's moments it is drawn over.
SPAN = {"other": "steady", "forward": "forward", "loss": "forward", "backward": "backward",
        "optimizer": "optimizer_step", "zero_grad": "optimizer_step"}
MB = 1e6


def measured_series(prof, device_type="cpu"):
    """(time, phase, live bytes per category) at every event time of the last profiled step:
    the replay of `measure.analyse`'s timeline walk, keeping every moment instead of the peak."""
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import Action, TensorKey

    mp = prof._memory_profile()
    categories, timeline = mp._categories, mp.timeline

    def category(key, version):
        c = categories.get(key, version) if isinstance(key, TensorKey) else None
        return c.name if c is not None else "unknown"

    ranges, steps = [], []
    for e in mp._op_tree.sorted_nodes:
        if e.typed[0] == _EventType.TorchOp and e.name.startswith(measure.CpuPhases.prefix):
            ranges.append((e.start_time_ns, e.end_time_ns, e.name[len(measure.CpuPhases.prefix):]))
        elif e.typed[0] == _EventType.TorchOp and e.name.startswith(measure.STEP_PREFIX):
            steps.append((e.start_time_ns, e.end_time_ns))

    def phase_at(t):
        inside = [r for r in ranges if r[0] <= t <= r[1]]
        return min(inside, key=lambda r: r[1] - r[0])[2] if inside else "other"

    t0, t1 = max(steps)
    live = {k: 0 for k in measure.CATEGORIES}
    out = []
    i, n = 0, len(timeline)
    while i < n:
        t = timeline[i][0]
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
        if t0 <= t <= t1:
            out.append((t, phase_at(t), dict(live)))
    return out


def measure_rank(c, rank=0, world=1):
    s = measure.warmed_up(c, "cpu", rank, world)
    for attempt in range(1, measure.ATTEMPTS + 1):
        # (measure.measure_case's retry: the profiler's validation can trip over gloo's tensors)
        try:
            series = measured_series(measure.profile_steps(s))
        except AssertionError:
            series = None
        failed = torch.tensor([0 if series is not None else 1])
        if world > 1:
            torch.distributed.all_reduce(failed)
        if int(failed) == 0:
            return series
    raise RuntimeError("the profile could not be analysed")


def worker(args):
    import datetime
    import torch.distributed as dist
    torch.set_num_threads(1)
    c = find_case(args.case)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(args.port), "RANK": str(args.rank),
                       "WORLD_SIZE": str(c["world"])})
    dist.init_process_group("gloo", rank=args.rank, world_size=c["world"], timeout=datetime.timedelta(seconds=300))
    series = measure_rank(c, args.rank, c["world"])
    if args.rank == 0:
        with open(args.result, "w") as f:
            json.dump(series, f)
    dist.barrier()
    dist.destroy_process_group()


def find_case(name):
    for c in measure.matrix():
        if c["name"] == name:
            return c
    sys.exit(f"plot.py: no case '{name}' (measure.py --list)")


def measured(c):
    if c["world"] == 1:
        return measure_rank(c)
    port = measure.free_port()
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "rank0.json")
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), c["name"], "--worker", "--rank", str(r),
                                   "--port", str(port), "--result", result]) for r in range(c["world"])]
        for p in procs:
            if p.wait(timeout=900) != 0:
                sys.exit(f"plot.py: rank of {c['name']} failed ({p.returncode})")
        with open(result) as f:
            return [tuple(x) for x in json.load(f)]


def predicted(c, memalg):
    """memalg's moments of the case, from `plan --timeline`'s data attributes."""
    case = dict(c, config=os.path.relpath(measure.config_path(c), measure.REPO))
    args = compare.memalg_args(case)[:-1]  # (without --json)
    with tempfile.TemporaryDirectory() as tmp:
        svg = os.path.join(tmp, "t.svg")
        p = subprocess.run([memalg] + args + ["--timeline", svg], cwd=measure.REPO, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"plot.py: memalg {' '.join(args)} failed: {p.stderr.strip()}")
        text = open(svg).read()
    events = []
    for m in re.finditer(r'<g class="event" ([^>]*)>', text):
        a = dict(re.findall(r'(data-[a-z_0-9-]+)="([^"]*)"', m.group(1)))
        events.append({"kind": a["data-kind"], "phase": a["data-phase"], "entry": a["data-entry"],
                       "bytes": {k: int(a["data-" + k]) for k in MEMALG_CATEGORIES}})
    return events, "memalg " + " ".join(args)


def span_of(e):
    return "optimizer_step" if e["phase"] == "optimizer_step" else e["phase"]


def render(c, events, series, command):
    n = len(events)
    pitch = max(8.0, min(60.0, 760.0 / n))
    left, top, ph, gap = 80.0, 120.0, 260.0, 70.0
    width = left + pitch * n + 210
    height = top + 2 * ph + gap + 140
    # The x span of each memalg phase.
    spans = {}
    for i, e in enumerate(events):
        a, b = spans.get(span_of(e), (i, i + 1))
        spans[span_of(e)] = (min(a, i), max(b, i + 1))
    # Each measured phase's time range, mapped linearly onto its span.
    times = {}
    for t, p, _ in series:
        s = SPAN.get(p, "steady")
        lo, hi = times.get(s, (t, t))
        times[s] = (min(lo, t), max(hi, t))
    # (the measured step begins and ends outside every phase: before forward, after zero_grad)
    first_forward = min((t for t, p, _ in series if p != "other"), default=0)
    pts = []
    for t, p, live in series:
        s = SPAN.get(p, "steady")
        if p == "other" and t > first_forward:
            s = "optimizer_step"
        if s == "steady":
            lo, hi = series[0][0], first_forward
        else:
            lo, hi = times.get(s, (t, t))
        a, b = spans.get(s, (0, n))
        f = (t - lo) / (hi - lo) if hi > lo else 0.5
        pts.append((left + pitch * (a + min(max(f, 0.0), 1.0) * (b - a)), live))
    pred_max = max(sum(e["bytes"].values()) for e in events)
    meas_max = max(sum(v for v in live.values()) for _, _, live in series)
    ymax = max(pred_max, meas_max) / MB * 1.08
    step = 10 ** len(str(int(ymax / 5))) / 10
    for m in (1, 2, 5, 10):
        if ymax / 5 <= m * step:
            step *= m
            break
    ytop = step * -(-ymax // step)

    def y(v, base):
        return base + ph - v / MB / ytop * ph

    o = ['<?xml version="1.0" encoding="UTF-8"?>',
         f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{width:.0f}" height="{height:.0f}" '
         f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
         f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
         f'<text x="{left}" y="24" font-size="16" font-weight="bold">{c["name"]}: one step, memalg predicted '
         f'(above) and PyTorch measured (below)</text>',
         *[f'<text x="{left}" y="{44 + 14 * j}" fill="#555555" font-size="11">{esc(line)}</text>'
           for j, line in enumerate(wrap("predicted: " + command + " --timeline FILE", 110))],
         f'<text x="{left}" y="86" fill="#555555" font-size="11">measured: python bench/torch/plot.py {c["name"]} '
         f'(torch {torch.__version__}, transformers {measure.transformers.__version__}, CPU, profiler categories, '
         f'rank 0 of {c["world"]})</text>',
         f'<text x="{left}" y="102" font-size="11">peak: predicted {pred_max / MB:.1f} MB, measured {meas_max / MB:.1f} MB'
         f'{" (measured.json: %.1f MB)" % (c["_measured_peak"] / MB) if c.get("_measured_peak") else ""}</text>']
    for base, label in ((top, "memalg (MB)"), (top + ph + gap, "measured (MB)")):
        g = 0.0
        while g <= ytop + step / 2:
            yy = base + ph - g / ytop * ph
            o.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{left + pitch * n:.1f}" y2="{yy:.1f}" stroke="#dddddd"/>')
            o.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{g:g}</text>')
            g += step
        o.append(f'<text x="16" y="{base + ph / 2:.1f}" transform="rotate(-90 16 {base + ph / 2:.1f})" '
                 f'text-anchor="middle">{label}</text>')
        for name, (a, b) in spans.items():
            o.append(f'<line x1="{left + pitch * a:.1f}" y1="{base - 14}" x2="{left + pitch * a:.1f}" y2="{base + ph}" '
                     f'stroke="#999999" stroke-dasharray="2 3"/>')
            o.append(f'<text x="{left + pitch * (a + b) / 2:.1f}" y="{base - 4}" text-anchor="middle" '
                     f'font-size="10">{name.replace("_", " ")}</text>')
    # memalg's moments, stacked.
    for i, e in enumerate(events):
        base = 0
        x = left + pitch * i
        for k, col in zip(MEMALG_CATEGORIES, MEMALG_COLOURS):
            v = e["bytes"][k]
            if v <= 0:
                continue
            o.append(f'<rect x="{x:.1f}" y="{y(base + v, top):.1f}" width="{pitch:.1f}" '
                     f'height="{y(base, top) - y(base + v, top):.2f}" fill="{col}"/>')
            base += v
        lx, ly = x + pitch / 2 + 4, top + 2 * ph + gap + 8
        if i % max(1, int(11 / pitch + 0.999)) == 0:
            o.append(f'<text x="{lx:.1f}" y="{ly:.1f}" transform="rotate(-60 {lx:.1f} {ly:.1f})" text-anchor="end" '
                     f'font-size="10">{esc(e["entry"])}</text>')
    # The measured total over the prediction, and the measured categories stacked below.
    total = " ".join(f"{x:.1f},{y(sum(live.values()), top):.1f}" for x, live in pts)
    o.append(f'<polyline points="{total}" fill="none" stroke="#000000" stroke-width="1.2"/>')
    below = {k: 0 for k in PROFILER_ORDER}
    layers = []
    for k in PROFILER_ORDER:
        upper = [(x, sum(live.get(q, 0) for q in PROFILER_ORDER[:PROFILER_ORDER.index(k) + 1])) for x, live in pts]
        lower = [(x, sum(live.get(q, 0) for q in PROFILER_ORDER[:PROFILER_ORDER.index(k)])) for x, live in pts]
        if all(u == l for (_, u), (_, l) in zip(upper, lower)):
            continue
        poly = [f"{x:.1f},{y(v, top + ph + gap):.1f}" for x, v in upper] + \
               [f"{x:.1f},{y(v, top + ph + gap):.1f}" for x, v in reversed(lower)]
        layers.append(f'<polygon points="{" ".join(poly)}" fill="{PROFILER_COLOURS[k]}"/>')
        below[k] = 1
    o += layers
    # Legends.
    lx = left + pitch * n + 20
    for j, (k, col) in enumerate(zip(MEMALG_CATEGORIES, MEMALG_COLOURS)):
        yy = top + 18 * j
        o.append(f'<rect x="{lx:.1f}" y="{yy}" width="12" height="12" fill="{col}"/>'
                 f'<text x="{lx + 18:.1f}" y="{yy + 10}">{k}</text>')
    o.append(f'<line x1="{lx:.1f}" y1="{top + 18 * 8 + 6}" x2="{lx + 12:.1f}" y2="{top + 18 * 8 + 6}" stroke="#000000"/>'
             f'<text x="{lx + 18:.1f}" y="{top + 18 * 8 + 10}">measured total</text>')
    for j, k in enumerate(PROFILER_ORDER):
        yy = top + ph + gap + 18 * j
        o.append(f'<rect x="{lx:.1f}" y="{yy}" width="12" height="12" fill="{PROFILER_COLOURS[k]}"/>'
                 f'<text x="{lx + 18:.1f}" y="{yy + 10}">{k}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def wrap(text, width):
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = "  " + word
        else:
            line = (line + " " + word) if line else word
    return (lines + [line])[:3]


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("--out", help="SVG to write (default docs/img/measured-CASE.svg)")
    ap.add_argument("--memalg", default=os.path.join(measure.REPO, "build", "tools", "memalg"))
    ap.add_argument("--save-measured", metavar="JSON", help="also keep the measured events in JSON")
    ap.add_argument("--measured", metavar="JSON", help="draw the measured events kept by --save-measured (no run)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    torch.set_num_threads(1)  # (a single thread: the live tensor bytes do not depend on it)
    c = find_case(args.case)
    with open(os.path.join(HERE, "measured.json")) as f:
        c["_measured_peak"] = next((m["peak_bytes"] for m in json.load(f)["cases"] if m["name"] == c["name"]), None)
    events, command = predicted(c, args.memalg)
    if args.measured:
        with open(args.measured) as f:
            series = [tuple(x) for x in json.load(f)]
    else:
        series = measured(c)
    if args.save_measured:
        with open(args.save_measured, "w") as f:
            json.dump(series, f)
    out = args.out or os.path.join(measure.REPO, "docs", "img", f"measured-{c['name']}.svg")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".tmp", "w") as f:
        f.write(render(c, events, series, command))
    os.replace(out + ".tmp", out)
    print(f"{out}: {len(events)} predicted moments, {len(series)} measured events")


if __name__ == "__main__":
    main()

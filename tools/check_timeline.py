#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""Checks of `memalg plan --timeline FILE` as a user sees it (standard library only).

  check_timeline.py render MEMALG RSVG_CONVERT WORKDIR PLAN_ARGS...
      writes the timeline, renders it with rsvg-convert, and checks that the picture is not blank
      (the categories' colours cover part of it) and that the magenta peak marker's pixels lie on
      the column of the largest moment (the largest data-total, found here from the data
      attributes), at the top of that column.
  check_timeline.py json MEMALG WORKDIR PLAN_ARGS...
      checks every moment's bytes (data attributes) against `plan --json`: each phase's largest
      moment is the phase's bytes, the peak moment is per_rank category by category, and each
      moment's total is the sum of its categories.
"""
import json
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

CATEGORIES = ["weights", "gradients", "master_weights", "optimizer_states", "activations", "temporaries",
              "comm_buffers", "reserve"]
# tools/svg.cpp's category colours.
COLOURS = [(0x4e, 0x79, 0xa7), (0xf2, 0x8e, 0x2b), (0xe1, 0x57, 0x59), (0x76, 0xb7, 0xb2), (0x59, 0xa1, 0x4f),
           (0xed, 0xc9, 0x48), (0xb0, 0x7a, 0xa1), (0x9c, 0x75, 0x5f)]


def fail(msg):
    print("check_timeline: " + msg, file=sys.stderr)
    sys.exit(1)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"`{' '.join(cmd)}` failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def events_of(svg_text):
    root = re.search(r"<svg [^>]*>", svg_text).group(0)
    attrs = dict(re.findall(r'(data-[a-z-]+)="([^"]*)"', root))
    events = []
    for m in re.finditer(r'<g class="event" ([^>]*)>(.*?)</g>', svg_text, re.S):
        a = dict(re.findall(r'(data-[a-z_0-9-]+)="([^"]*)"', m.group(1)))
        rects = [(float(y), float(h)) for y, h in
                 re.findall(r'<rect x="[0-9.]+" y="([0-9.]+)" width="[0-9.]+" height="([0-9.]+)"', m.group(2))]
        a["top_y"] = min((y for y, _ in rects), default=None)
        events.append(a)
    if len(events) != int(attrs["data-events"]):
        fail(f"{len(events)} event columns, the document says {attrs['data-events']}")
    return attrs, events


def read_png(path):
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path} is not a PNG")
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour not in (2, 6) or interlace != 0:
                fail(f"unexpected PNG format (depth {depth}, colour type {colour}, interlace {interlace})")
            bpp = 4 if colour == 6 else 3
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, bpp, rows


def render(memalg, rsvg, workdir, args):
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    svg, png = work / "timeline.svg", work / "timeline.png"
    for f in (svg, png):
        f.unlink(missing_ok=True)
    run([memalg, "plan", *args, "--timeline", str(svg)])
    run([rsvg, "--format=png", "--background-color=white", "-o", str(png), str(svg)])
    attrs, events = events_of(svg.read_text())
    totals = [int(e["data-total"]) for e in events]
    peak = totals.index(max(totals))
    if int(attrs["data-peak-index"]) != peak:
        fail(f"the document marks moment {attrs['data-peak-index']} as the peak; the largest is {peak}")
    width, height, bpp, rows = read_png(png)
    coloured = 0
    seen = set()
    marker = []
    for y, line in enumerate(rows):
        for x in range(width):
            r, g, b = line[x * bpp], line[x * bpp + 1], line[x * bpp + 2]
            if (r, g, b) != (255, 255, 255):
                coloured += 1
            if (r, g, b) in COLOURS:
                seen.add((r, g, b))
            if r > 240 and g < 20 and b > 240:
                marker.append((x, y))
    share = coloured / (width * height)
    if share < 0.05 or len(seen) < 3:
        fail(f"the picture is blank or nearly: {share:.1%} of it drawn, {len(seen)} category colours")
    if not marker:
        fail("no peak marker in the picture")
    x0, x1 = float(events[peak]["data-x0"]), float(events[peak]["data-x1"])
    mx = sum(x for x, _ in marker) / len(marker)
    bottom = max(y for _, y in marker)
    if not x0 <= mx <= x1:
        fail(f"the peak marker is at x {mx:.1f}, the peak's column spans {x0}..{x1}")
    top = events[peak]["top_y"]
    if top is None or abs(bottom - top) > 3:
        fail(f"the peak marker ends at y {bottom}, the peak's column begins at y {top}")
    print(f"{len(events)} moments, peak {peak} ({events[peak]['data-entry']}), {share:.1%} drawn, "
          f"{len(seen)} category colours, marker at x {mx:.1f} in {x0}..{x1}")


def check_json(memalg, workdir, args):
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    svg = work / "timeline.svg"
    svg.unlink(missing_ok=True)
    plan = json.loads(run([memalg, "plan", *args, "--json", "--timeline", str(svg)]))
    attrs, events = events_of(svg.read_text())
    highest = {}
    for e in events:
        parts = sum(int(e["data-" + c]) for c in CATEGORIES)
        if parts != int(e["data-total"]):
            fail(f"moment {e['data-index']}: categories sum to {parts}, total says {e['data-total']}")
        if e["data-kind"] == "reduction":
            continue
        p = e["data-phase"]
        highest[p] = max(highest.get(p, 0), int(e["data-total"]))
    for p in plan["phases"]:
        if highest.get(p["name"]) != p["bytes"]:
            fail(f"phase {p['name']}: largest moment {highest.get(p['name'])}, plan --json {p['bytes']}")
    peak = events[int(attrs["data-peak-index"])]
    for c in CATEGORIES:
        if int(peak["data-" + c]) != plan["per_rank"][c]:
            fail(f"peak moment's {c}: {peak['data-' + c]}, plan --json per_rank {plan['per_rank'][c]}")
    if peak["data-phase"] != plan["peak_phase"] or int(attrs["data-stage"]) != plan["most_loaded_stage"]:
        fail(f"peak in {peak['data-phase']} of stage {attrs['data-stage']}, plan --json: {plan['peak_phase']} "
             f"of stage {plan['most_loaded_stage']}")
    print(f"{len(events)} moments agree with plan --json: phases {[p['bytes'] for p in plan['phases']]}")


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "render":
        render(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "json":
        check_json(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        fail(__doc__)

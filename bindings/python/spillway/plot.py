# SPDX-License-Identifier: Apache-2.0
"""Draws a Spillway trace (SPILLWAY_TRACE, Runtime(trace=...), spillway-demo --trace):

    python -m spillway.plot trace.json out.png [--title TEXT] [--bins N]

Top: the bytes in each tier over time (device, pinned host, disk, and the locked part of the
device), against the device limit. Bottom: throughput per direction (device->host,
host->device, host->disk, disk->device, device->disk, and the peer tier's device->peer,
peer->device, peer->host, peer->disk), each move's bytes spread evenly over its duration. Needs matplotlib (``pip install matplotlib``); :func:`load` and
:func:`series` do not, so other tools can reuse them.

The trace may be one the process never closed (it died, or Python left the runtime to the
operating system at exit): it is read line by line and a torn last line is skipped.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["load", "series", "draw", "main"]

TIERS = ("device", "host", "disk", "locked")
DIRECTIONS = ("device->host", "host->device", "host->disk", "disk->device", "device->disk",
              "device->peer", "peer->device", "peer->host", "peer->disk")


def load(path: str) -> List[Dict[str, Any]]:
    """The events of a trace file (the JSON array format, closed or not, or an object with
    ``traceEvents``)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        doc = json.loads(text)
        return doc["traceEvents"] if isinstance(doc, dict) else list(doc)
    except ValueError:
        pass
    events = []
    for line in text.splitlines():
        line = line.strip().rstrip(",")
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # a torn last line
    return events


def series(events: List[Dict[str, Any]], bins: int = 200) -> Dict[str, Any]:
    """What the picture shows, as data: ``tiers[name] = (times s, bytes)`` step series;
    ``throughput[direction] = (bin start times s, bytes/s)``; ``limits`` (device_limit,
    host_limit, disk_limit, backend); ``span`` (seconds); ``moves`` (count per name);
    ``lock_waits`` (count, total seconds)."""
    tiers: Dict[str, Tuple[List[float], List[int]]] = {t: ([], []) for t in TIERS}
    moves: Dict[str, int] = {}
    limits: Dict[str, Any] = {}
    slices: List[Tuple[str, float, float, int]] = []
    waits, wait_s, end = 0, 0.0, 0.0
    for e in events:
        ph, name, args = e.get("ph"), e.get("name"), e.get("args") or {}
        ts = float(e.get("ts", 0.0)) / 1e6
        if ph == "C" and name in tiers:
            tiers[name][0].append(ts)
            tiers[name][1].append(int(args.get("bytes", 0)))
            end = max(end, ts)
        elif ph == "X":
            dur = float(e.get("dur", 0.0)) / 1e6
            end = max(end, ts + dur)
            if name == "lock wait":
                waits += 1
                wait_s += dur
            d = args.get("dir")
            if d and name:
                moves[name] = moves.get(name, 0) + int(args.get("buffers", 1))
                slices.append((d, ts, dur, int(args.get("bytes", 0))))
        elif ph == "i" and name == "spillway":
            limits = dict(args)
    for t in TIERS:  # each step series sorted by time
        pts = sorted(zip(*tiers[t])) if tiers[t][0] else []
        tiers[t] = ([p[0] for p in pts], [p[1] for p in pts])
    span = end if end > 0 else 1e-3
    width = span / bins
    starts = [i * width for i in range(bins)]
    throughput: Dict[str, Tuple[List[float], List[float]]] = {}
    for d in DIRECTIONS:
        acc = [0.0] * bins
        for dd, ts, dur, nbytes in slices:
            if dd != d or nbytes == 0:
                continue
            if dur <= 0:
                acc[min(int(ts / width), bins - 1)] += nbytes
                continue
            rate = nbytes / dur
            a, b = ts, ts + dur
            i = min(int(a / width), bins - 1)
            while a < b and i < bins:
                edge = min(b, (i + 1) * width)
                acc[i] += rate * (edge - a)
                a, i = edge, i + 1
        if any(acc):
            throughput[d] = (starts, [x / width for x in acc])
    return {"tiers": tiers, "throughput": throughput, "limits": limits, "span": span,
            "moves": moves, "lock_waits": (waits, wait_s)}


def _step(ax: Any, xs: List[float], ys: List[float], span: float, **kw: Any) -> None:
    if not xs:
        return
    ax.step(list(xs) + [span], list(ys) + [ys[-1]], where="post", **kw)


def draw(events: List[Dict[str, Any]], out: str, title: Optional[str] = None,
         bins: int = 200) -> Dict[str, Any]:
    """Writes the picture to `out` (any format matplotlib knows by its extension) and
    returns :func:`series`'s data."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit("spillway.plot needs matplotlib: pip install matplotlib") from e
    s = series(events, bins)
    mib = float(1 << 20)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    colors = {"device": "tab:green", "host": "tab:blue", "disk": "tab:brown",
              "locked": "tab:red"}
    for t in TIERS:
        xs, ys = s["tiers"][t]
        _step(top, xs, [y / mib for y in ys], s["span"], color=colors[t],
              label=f"{t}{' (part of device)' if t == 'locked' else ''}",
              linestyle="--" if t == "locked" else "-")
    lim = s["limits"].get("device_limit")
    if lim:
        top.axhline(lim / mib, color="black", linewidth=0.8, linestyle=":",
                    label="device limit")
    top.set_ylabel("MiB")
    top.set_title(title or "Spillway: bytes per tier")
    top.legend(loc="upper left", fontsize=8)
    top.grid(alpha=0.3)
    for d, (xs, ys) in s["throughput"].items():
        bottom.plot(xs, [y / 1e9 for y in ys], label=d, linewidth=1)
    bottom.set_ylabel("GB/s")
    bottom.set_xlabel("seconds since the runtime started")
    bottom.set_title("throughput per direction")
    if s["throughput"]:
        bottom.legend(loc="upper left", fontsize=8)
    bottom.grid(alpha=0.3)
    waits, wait_s = s["lock_waits"]
    moves = ", ".join(f"{n} {k}" for k, n in sorted(s["moves"].items()))
    fig.text(0.01, 0.005, f"{moves}; {waits} lock waits ({wait_s:.3f} s)", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return s


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spillway.plot",
                                description="Draws tier occupancy and throughput of a "
                                            "Spillway trace (SPILLWAY_TRACE).")
    p.add_argument("trace", help="trace file (Chrome trace-event JSON)")
    p.add_argument("out", help="picture to write (.png, .svg, .pdf)")
    p.add_argument("--title", default=None)
    p.add_argument("--bins", type=int, default=200, help="throughput bins (default 200)")
    a = p.parse_args(argv)
    events = load(a.trace)
    if not events:
        print(f"{a.trace}: no events", file=sys.stderr)
        return 1
    s = draw(events, a.out, a.title, a.bins)
    print(f"{a.out}: {s['span']:.3f} s, " +
          ", ".join(f"{n} {k}" for k, n in sorted(s["moves"].items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

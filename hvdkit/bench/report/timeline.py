"""``hvdkit-bench plot-timeline TRACE.json -o out.png``: where each rank's steps go, at a glance.

Reads a trace written by ``--timeline`` (:mod:`hvdkit.timeline`) and draws one panel per
rank: for every traced step a stacked bar of the share of the step's wall time spent in
each phase (data, compute, straggler sleep, comm, wait, other = the rest of the step),
from the ``step N`` spans' args, which hold the seconds :class:`hvdkit.timing.StepTimer`
counted (the numbers of results.json, per step). A rank without steps (a parameter
server) gets a panel of its busy share: the fraction of each worker step's time band it
spent handling requests (``server`` spans), with the number of updates applied.

    hvdkit-bench plot-timeline runs/trace.json -o trace.png
    hvdkit-bench plot-timeline trace.json -o trace.png --title "ps-ssp, rank 1 three times slower"
    hvdkit-bench plot-timeline trace.json -o spans.png --spans 4     # 4 steps, as chrome://tracing shows them

Exit status: 0 written; 2 bad input (not a file, not a trace), with one line.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from hvdkit.cliparse import Parser, print_error
from hvdkit.errors import UsageError

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["phase_shares", "plot_timeline", "plot_spans", "main", "build_parser", "SEGMENTS"]

#: (label, colour) of each stacked segment, bottom to top
SEGMENTS = (("data", "#8c8c8c"), ("compute", "#4c72b0"), ("straggler sleep", "#dd8452"), ("comm", "#55a868"),
            ("wait", "#c44e52"), ("other", "#e5e5e5"))
_STEP = re.compile(r"step (\d+)$")


def phase_shares(trace: dict) -> dict[int, dict[str, Any]]:
    """Per rank, per traced step, the share of the step's wall time in each of :data:`SEGMENTS`.

    Args:
        trace: a Chrome trace as ``--timeline`` writes it (``traceEvents``; ``step N`` spans
            of category ``step`` whose args hold ``compute_s comm_s wait_s data_s straggler_s``).

    Returns:
        ``{rank: {"role": str, "steps": [N, ...], "step_ms": [...], "shares": {segment: [...]},
        "server_busy": float | None, "updates": int}}``; shares of one step sum to 1 (``other``
        is the rest of the step, clipped at 0). ``server_busy`` is the fraction of the rank's
        traced time span covered by ``server`` spans (None without any).

    Raises:
        ValueError: ``trace`` has no ``traceEvents`` list.
    """
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ValueError("not a Chrome trace: no traceEvents list")
    out: dict[int, dict[str, Any]] = {}
    servers: dict[int, list] = {}
    for e in events:
        if not isinstance(e, dict) or "pid" not in e:
            continue
        r = int(e["pid"])
        info = out.setdefault(r, {"role": "", "steps": [], "step_ms": [], "updates": 0, "server_busy": None,
                                  "shares": {k: [] for k, _ in SEGMENTS}, "_span": [float("inf"), 0.0]})
        if e.get("ph") == "M" and e.get("name") == "process_name":
            info["role"] = e.get("args", {}).get("name", "")
            continue
        if e.get("ph") != "X":
            continue
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        info["_span"][0], info["_span"][1] = min(info["_span"][0], ts), max(info["_span"][1], ts + dur)
        m = _STEP.match(e.get("name", ""))
        if e.get("cat") == "step" and m:
            a = e.get("args", {})
            total = max(dur / 1e6, 1e-12)
            sleep = float(a.get("straggler_s", 0.0))
            secs = {"data": a.get("data_s", 0.0), "compute": max(0.0, a.get("compute_s", 0.0) - sleep),
                    "straggler sleep": sleep, "comm": a.get("comm_s", 0.0), "wait": a.get("wait_s", 0.0)}
            secs["other"] = max(0.0, total - sum(secs.values()))
            norm = max(total, sum(secs.values()))
            info["steps"].append(int(m.group(1)))
            info["step_ms"].append(dur / 1e3)
            for k, _ in SEGMENTS:
                info["shares"][k].append(secs[k] / norm)
        elif e.get("cat") == "server":
            servers.setdefault(r, []).append((ts, ts + dur))
            info["updates"] += e.get("name", "").startswith("apply")
    for r, info in out.items():
        order = sorted(range(len(info["steps"])), key=info["steps"].__getitem__)
        info["steps"] = [info["steps"][i] for i in order]
        info["step_ms"] = [info["step_ms"][i] for i in order]
        info["shares"] = {k: [v[i] for i in order] for k, v in info["shares"].items()}
        lo, hi = info.pop("_span")
        if r in servers and hi > lo:
            info["server_busy"] = _covered(servers[r]) / (hi - lo)
    return out


def _covered(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def plot_timeline(trace: dict | str, path: str, title: str = "") -> str:
    """Draw :func:`phase_shares` of ``trace`` (a dict or a file path) into the PNG ``path``; returns it.

    One row per rank; a worker's panel stacks the share of each phase per step (x: the
    global step), titled with its median step time; a server's panel is one bar of its busy
    share. Raises ValueError as :func:`phase_shares`.
    """
    if isinstance(trace, str):
        with open(trace) as fh:
            trace = json.load(fh)
    shares = phase_shares(trace)
    if not shares:
        raise ValueError("the trace holds no rank's spans")
    ranks = sorted(shares)
    heights = [1.0 if shares[r]["steps"] else 0.35 for r in ranks]
    fig, axes = plt.subplots(len(ranks), 1, figsize=(9, 1.7 * sum(heights) + 1.2), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    other = trace.get("otherData", {})
    head = title or f"{other.get('strategy', '')}: share of each step's time per phase".strip(": ")
    if other.get("complete") is False:
        head += " (INCOMPLETE: " + str(other.get("reason", "a rank failed"))[:80] + ")"
    fig.suptitle(head, fontsize=10)
    for ax, r in zip(axes[:, 0], ranks):
        info = shares[r]
        label = info["role"] or f"rank {r}"
        if info["steps"]:
            bottom = [0.0] * len(info["steps"])
            for k, colour in SEGMENTS:
                vals = info["shares"][k]
                if any(vals):
                    ax.bar(info["steps"], vals, bottom=bottom, width=0.85 if len(info["steps"]) <= 60 else 1.0, color=colour, label=k, linewidth=0)
                    bottom = [b + v for b, v in zip(bottom, vals)]
            ms = sorted(info["step_ms"])[len(info["step_ms"]) // 2]
            ax.set_title(f"{label}: median step {ms:.1f} ms", fontsize=9, loc="left")
            ax.set_ylim(0, 1)
            ax.set_ylabel("share")
            ax.set_xlim(min(info["steps"]) - 0.5, max(info["steps"]) + 0.5)
            ax.set_xlabel("global step", fontsize=8)
        else:
            busy = info["server_busy"]
            ax.barh([0], [busy or 0.0], color="#8172b3")
            ax.set_xlim(0, 1)
            ax.set_yticks([])
            ax.set_xlabel("share of the traced time spent handling requests", fontsize=8)
            ax.set_title(f"{label}: no training steps; " + (f"busy {100 * busy:.0f}% of the traced time, "
                         f"{info['updates']} updates applied" if busy is not None else "no spans"),
                         fontsize=9, loc="left")
    found = {h.get_label(): h for ax in axes[:, 0] for h in ax.get_legend_handles_labels()[0]}
    handles = {k: found[k] for k, _ in SEGMENTS if k in found}
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles), fontsize=8,
                   frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


#: colour of each span category in :func:`plot_spans` (as in :data:`SEGMENTS`)
_CAT_COLOUR = {"data": "#8c8c8c", "compute": "#4c72b0", "comm": "#55a868", "wait": "#c44e52", "server": "#8172b3",
               "epoch": "#ccb974"}


def plot_spans(trace: dict | str, path: str, steps: int = 4, title: str = "") -> str:
    """Draw the spans of ``steps`` consecutive traced steps as a chrome://tracing-like picture into ``path``.

    One row per (rank, thread row); the window starts at the first ``step N`` span of the
    lowest rank and ends where its ``steps``-th step ends. ``step`` spans are drawn as a thin
    outline, every other span filled with its category's colour (a straggler's sleep is a
    ``wait``); a span nested in another (a ring bucket in its allreduce) is drawn over it.
    Returns ``path``. Raises ValueError: no ``step`` span in the trace.
    """
    if isinstance(trace, str):
        with open(trace) as fh:
            trace = json.load(fh)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else []
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    xs = [e for e in events if e.get("ph") == "X"]
    step_spans = sorted((e for e in xs if e.get("cat") == "step"), key=lambda e: (e["pid"], e["ts"]))
    if not step_spans:
        raise ValueError("the trace holds no step spans")
    first = [e for e in step_spans if e["pid"] == step_spans[0]["pid"]][:steps]
    t0, t1 = first[0]["ts"], first[-1]["ts"] + first[-1]["dur"]
    rows = sorted({(e["pid"], e["tid"]) for e in xs})
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(rows) + 1.4))
    for i, key in enumerate(rows):
        y = len(rows) - 1 - i
        for e in sorted((e for e in xs if (e["pid"], e["tid"]) == key and e["ts"] < t1 and e["ts"] + e["dur"] > t0),
                        key=lambda e: -e["dur"]):   # longest first: nested spans end up on top
            a, b = (max(e["ts"], t0) - t0) / 1e3, (min(e["ts"] + e["dur"], t1) - t0) / 1e3
            if e.get("cat") == "step":
                ax.broken_barh([(a, b - a)], (y - 0.42, 0.84), facecolors="none", edgecolors="#333333", linewidth=0.6)
            else:
                cat = "wait" if e["name"] == "straggler sleep" else e.get("cat", "")
                ax.broken_barh([(a, b - a)], (y - 0.3, 0.6), facecolors=_CAT_COLOUR.get(cat, "#999999"),
                               edgecolors="white", linewidth=0.3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{procs.get(p, f'rank {p}').split(' on ')[0]} / {names.get((p, t), t)}"
                        for p, t in reversed(rows)], fontsize=7)
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_xlabel("ms")
    other = trace.get("otherData", {})
    ax.set_title(title or f"{other.get('strategy', '')}: {len(first)} steps of every rank", fontsize=10)
    handles = [matplotlib.patches.Patch(color=c, label=k) for k, c in _CAT_COLOUR.items()]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / len(rows)), ncol=len(handles),
              fontsize=7, frameon=False)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def build_parser(prog: str = "hvdkit-bench plot-timeline") -> argparse.ArgumentParser:
    """The command-line flags; ``prog``: the name ``--help`` shows."""
    p = Parser(prog=prog,
               description="PNG of the share of each phase per step, per rank, from a --timeline trace")
    p.add_argument("trace", help="the JSON file --timeline wrote")
    p.add_argument("-o", "--output", required=True, metavar="PNG", help="the picture to write")
    p.add_argument("--title", default="", help="the figure's title (default: the strategy)")
    p.add_argument("--spans", type=int, default=0, metavar="N", help="instead, draw the spans of N steps of every rank "
                   "and thread row, as chrome://tracing shows them")
    return p


def main(argv: list[str] | None = None, prog: str = "hvdkit-bench plot-timeline") -> int:
    """``plot-timeline TRACE -o PNG [--title T] [--spans N]``; returns the exit status (0, or 2 on bad input).
    ``prog``: the command as typed."""
    try:
        a = build_parser(prog).parse_args(argv)
    except UsageError as e:
        return print_error(prog, e)
    try:
        with open(a.trace) as fh:
            trace = json.load(fh)
        out = plot_spans(trace, a.output, a.spans, a.title) if a.spans > 0 else plot_timeline(trace, a.output, a.title)
    except (OSError, ValueError) as e:  # no file, a directory, not JSON, not a trace
        print(f"hvdkit: error: plot-timeline {a.trace}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

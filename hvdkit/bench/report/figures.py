"""The report's pictures, and the plot helpers every benchmark shares (matplotlib, Agg: no display).

Helpers: :func:`colors` (one tab10 colour per key, stable in order of first appearance),
:func:`human_bytes`, :func:`save_figure` (a PNG file), :func:`png_bytes` (the PNG in memory),
:func:`busbw_axes` (one collectives JSON on one axes). Pictures (each returns a matplotlib
figure, or None when there is nothing to draw): :func:`scaling_figure`, :func:`split_figure`,
:func:`accuracy_figure`, :func:`busbw_figure`.
"""
from __future__ import annotations

import io
import os
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["DPI", "plt", "colors", "human_bytes", "save_figure", "png_bytes", "busbw_axes", "scaling_figure",
           "split_figure", "accuracy_figure", "busbw_figure", "PHASES"]

DPI = 110
#: (summary key, legend label, colour) of the step-time split, bottom to top
PHASES = (("compute_ms", "compute", "tab:blue"), ("comm_ms", "communication", "tab:orange"),
          ("wait_ms", "wait", "tab:red"), ("data_ms", "data", "tab:green"))


def colors(keys: Sequence[str]) -> dict[str, tuple]:
    """key -> an RGBA colour of matplotlib's tab10 cycle, in order of first appearance."""
    cmap = plt.get_cmap("tab10")
    return {k: cmap(i % 10) for i, k in enumerate(dict.fromkeys(keys))}


def human_bytes(n: float) -> str:
    """``1048576`` -> ``"1 MiB"`` (powers of 1024; below 1 KiB in bytes)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def save_figure(fig, path: str) -> str:
    """Write ``fig`` as a PNG at ``path`` (directories made), close it; returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def png_bytes(fig) -> bytes:
    """``fig`` as PNG bytes (closed afterwards). No metadata that varies between runs."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def busbw_axes(ax, doc: Mapping, palette: Mapping[str, tuple]) -> None:
    """busbw vs message size per method of one ``hvdkit.bench.collectives --json`` document
    (``{"meta": {"world_size"}, "rows": [{"method", "bytes", "busbw_GBps"}]}``), log-log."""
    by: dict[str, list] = {}
    for r in doc["rows"]:
        if r.get("busbw_GBps"):
            by.setdefault(r["method"], []).append((r["bytes"], r["busbw_GBps"]))
    for m, pts in by.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, color=palette[m], label=m,
                ls="--" if m == "memcpy" else "-")
    n = doc.get("meta", {}).get("world_size", "?")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({r["bytes"] for r in doc["rows"]})
    step = max(1, len(ticks) // 7)
    ax.set_xticks(ticks[::step], [human_bytes(t) for t in ticks[::step]], rotation=30)
    ax.set_xlabel("message size per rank S (bytes)")
    ax.set_ylabel("busbw (GB/s, 1e9 B/s)")
    ax.set_title(f"allreduce busbw vs message size, {n} ranks\nbusbw = S/t x 2(N-1)/N (memcpy: S/t)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, title="method")


def busbw_figure(docs: Sequence[Mapping]):
    """One busbw panel per collectives document (:func:`busbw_axes`), or None without rows."""
    docs = [d for d in docs if d.get("rows")]
    if not docs:
        return None
    fig, axes = plt.subplots(1, len(docs), figsize=(6.4 * len(docs), 4.6), squeeze=False)
    palette = colors([r["method"] for d in docs for r in d["rows"]])
    for ax, d in zip(axes[0], docs):
        busbw_axes(ax, d, palette)
    return fig


def _errbar(ax, xs, stats, color, label, **kw):
    y = [s["median"] for s in stats]
    err = [[s["median"] - s["min"] for s in stats], [s["max"] - s["median"] for s in stats]]
    ax.errorbar(xs, y, yerr=err, capsize=3, color=color, label=label, **kw)


def scaling_figure(summary: Sequence[Mapping], projections: Sequence[Mapping] = ()):
    """Per model (columns): samples/s (top) and scaling efficiency (bottom) vs workers, median
    with min-max bars per variant; the calibrated projections (``advised.projections``) dashed
    with open markers. Cells without a straggler (where none ran: the first condition). None when
    no cell was measured."""
    cells = [s for s in summary if (s.get("samples_per_s") or {}).get("median") is not None]
    cond = "none" if any(s.get("straggler", "none") == "none" for s in cells) else cells[0]["straggler"] if cells \
        else None
    cells = [s for s in cells if s.get("straggler", "none") == cond]   # one straggler condition: without, if run
    if not cells:
        return None
    models = list(dict.fromkeys(s["model"] for s in cells))
    fig, axes = plt.subplots(2, len(models), figsize=(6.2 * len(models), 8.0), squeeze=False)
    palette = colors([s["variant"] for s in cells])
    for j, model in enumerate(models):
        ax1, ax2 = axes[0][j], axes[1][j]
        xs_all = set()
        for v in dict.fromkeys(s["variant"] for s in cells if s["model"] == model):
            ss = sorted((s for s in cells if s["model"] == model and s["variant"] == v), key=lambda s: s["workers"])
            xs = [s["workers"] for s in ss]
            xs_all.update(xs)
            _errbar(ax1, xs, [s["samples_per_s"] for s in ss], palette[v], v, marker="o")
            e = [s for s in ss if s.get("efficiency") and s["efficiency"].get("median") is not None]
            if e:
                _errbar(ax2, [s["workers"] for s in e], [s["efficiency"] for s in e], palette[v], v, marker="o")
            pr = next((p for p in projections if p["model"] == model and p["variant"] == v
                       and p.get("straggler", "none") == cond and p["points"]), None)
            if pr:
                last = next(s for s in ss if s["workers"] == pr["workers"])
                px = [pr["workers"]] + [q["workers"] for q in pr["points"]]
                xs_all.update(px)
                _errbar(ax1, px, [last["samples_per_s"]] + [q["samples_per_s"] for q in pr["points"]], palette[v],
                        None, marker="o", mfc="white", ls="--", alpha=0.8)
                if last.get("efficiency") and all(q["efficiency"] for q in pr["points"]):
                    _errbar(ax2, px, [last["efficiency"]] + [q["efficiency"] for q in pr["points"]], palette[v],
                            None, marker="o", mfc="white", ls="--", alpha=0.8)
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(xs_all), [str(x) for x in sorted(xs_all)])
            ax.minorticks_off()
            ax.set_xlabel("workers N (dashed, open: projected by hvdkit advise, calibrated)")
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        ax1.set_title(f"{model}: samples/s, median [min-max] over rounds")
        ax1.set_ylabel("samples/s (all workers)")
        ax2.set_title(f"{model}: scaling efficiency X(N) / (N X(1))")
        ax2.set_ylabel("scaling efficiency")
        ax2.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax2.set_ylim(0, max(1.1, ax2.get_ylim()[1]))
    fig.tight_layout()
    return fig


def split_figure(summary: Sequence[Mapping]):
    """Stacked median compute / communication / wait / data milliseconds per step of every
    measured cell (no straggler), grouped by model; None when no cell has a split."""
    cells = [s for s in summary if (s.get("compute_ms") or {}).get("median") is not None
             and s.get("straggler", "none") == "none"]
    if not cells:
        return None
    cells = sorted(cells, key=lambda s: (list(dict.fromkeys(c["model"] for c in cells)).index(s["model"]),
                                         s["variant"], s["workers"]))
    fig, ax = plt.subplots(figsize=(max(6.5, 0.5 * len(cells) + 2.5), 4.6))
    bottom = [0.0] * len(cells)
    for key, label, color in PHASES:
        vals = [(s.get(key) or {}).get("median") or 0.0 for s in cells]
        ax.bar(range(len(cells)), vals, bottom=bottom, color=color, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(cells)), [f"{s['model']} {s['variant']}\n{s['workers']}w" for s in cells], rotation=60,
                  ha="right", fontsize=7)
    ax.set_ylabel("ms per step (median over rounds)")
    ax.set_title("where a step's time goes")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def accuracy_figure(rows: Sequence[Mapping], target: float | None = None):
    """Accuracy vs training seconds per cell with an ``accuracy_curve`` (one line per round), one
    panel per model; None when no row has a curve."""
    rows = [r for r in rows if r.get("status") == "OK" and r.get("accuracy_curve")]
    if not rows:
        return None
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6.2 * len(models), 4.4), squeeze=False)
    keys = [f"{r['variant']} {r['workers']}w" for r in rows]
    palette = colors(keys)
    for ax, model in zip(axes[0], models):
        seen = set()
        for k, r in zip(keys, rows):
            if r["model"] != model:
                continue
            c = r["accuracy_curve"]
            ax.plot([p["seconds"] for p in c], [p["accuracy"] for p in c], "o-", ms=2.5, lw=1.1, color=palette[k],
                    label=None if k in seen else k, alpha=0.85)
            seen.add(k)
        if target is not None:
            ax.axhline(target, color="red", ls="--", lw=1, label=f"target {target}")
        ax.set_title(f"{model}: accuracy vs training time")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("eval accuracy (fraction)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig

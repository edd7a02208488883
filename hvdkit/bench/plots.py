"""PNG plots of the benchmark JSON files (matplotlib, Agg backend: no display needed).

    python -m hvdkit.bench.plots --collectives c2.json c4.json --training DIR/training.json --out-dir DIR

Pictures (each function returns the paths it wrote):

* :func:`plot_busbw`: busbw (GB/s) vs message size per method, log-log, one panel per
  collectives JSON (world size), from ``hvdkit.bench.collectives --json``;
* :func:`plot_throughput`: samples/s and scaling efficiency vs workers (median, min-max over
  rounds) per model/variant, and the per-step compute / comm / wait / data split, from
  ``training.json`` (:mod:`hvdkit.bench.training`);
* :func:`plot_accuracy`: eval accuracy vs training seconds and vs samples seen per variant,
  one column per straggler condition (``--measure convergence`` rows);
* :func:`plot_staleness`: mean and max staleness per parameter-server cell.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

# the shared plot helpers live in the reporting package (hvdkit.bench.report.figures)
from hvdkit.bench.report.figures import busbw_axes, colors as _colors, save_figure as _save  # noqa: E402

__all__ = ["plot_busbw", "plot_throughput", "plot_accuracy", "plot_staleness", "plot_all", "main"]


def _load(path: str) -> dict:
    with open(path) as fh:
        return json.load(fh)


def plot_busbw(collectives: Sequence[str | dict], path: str) -> list[str]:
    """busbw vs message size per method, one panel per JSON (e.g. 2 and 4 ranks).

    Args:
        collectives: paths to (or loaded) ``hvdkit.bench.collectives --json`` outputs,
            ``{"meta": {"world_size"}, "rows": [{"method", "bytes", "busbw_GBps"}]}``.
        path: the PNG to write.

    Returns:
        [path], or [] when there is nothing to plot.
    """
    docs = [_load(c) if isinstance(c, str) else c for c in collectives]
    docs = [d for d in docs if d.get("rows")]
    if not docs:
        return []
    fig, axes = plt.subplots(1, len(docs), figsize=(6.4 * len(docs), 4.6), squeeze=False)
    colors = _colors([r["method"] for d in docs for r in d["rows"]])
    for ax, d in zip(axes[0], docs):
        busbw_axes(ax, d, colors)
    return [_save(fig, path)]


def _training(doc: str | dict) -> dict:
    return _load(doc) if isinstance(doc, str) else doc


def plot_throughput(training: str | dict, path: str, split_path: str | None = None) -> list[str]:
    """Samples/s and scaling efficiency vs workers (median, min-max bars) per model/variant/straggler;
    optionally the per-step time split.

    Args:
        training: ``DIR/training.json`` of :mod:`hvdkit.bench.training` (its ``summary`` entries of
            ``measure`` throughput).
        path: PNG of samples/s (left) and efficiency (right).
        split_path: PNG of stacked compute/comm/wait/data milliseconds per step (medians).

    Returns:
        The paths written ([] when no cell has an OK round).
    """
    summ = [s for s in _training(training).get("summary", [])
            if s.get("measure", "throughput") == "throughput" and s.get("samples_per_s")]
    if not summ:
        return []
    keys = [f"{s['model']}/{s['variant']}" + ("" if s["straggler"] == "none" else f" straggler {s['straggler']}")
            for s in summ]
    colors = _colors(keys)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12.5, 4.6))
    series: dict[str, list] = {}
    for k, s in zip(keys, summ):
        series.setdefault(k, []).append(s)
    for ax, fig_key in ((ax1, "samples_per_s"), (ax2, "efficiency")):
        for k, ss in series.items():
            ss = sorted((s for s in ss if s.get(fig_key)), key=lambda s: s["workers"])
            if not ss:
                continue
            y = [s[fig_key]["median"] for s in ss]
            err = [[s[fig_key]["median"] - s[fig_key]["min"] for s in ss],
                   [s[fig_key]["max"] - s[fig_key]["median"] for s in ss]]
            ax.errorbar([s["workers"] for s in ss], y, yerr=err, fmt="o-", capsize=3, color=colors[k], label=k)
        ax.set_xticks(sorted({s["workers"] for s in summ}))
        ax.set_xlabel("workers N")
        ax.grid(True, alpha=0.3)
    ax1.set_ylabel("training throughput (samples/s, all workers)")
    ax1.set_title("samples/s vs workers (median, min-max over rounds)")
    ax1.legend(fontsize=8)
    ax2.axhline(1.0, color="grey", lw=1, ls=":", label="ideal (1.0)")
    ax2.set_ylabel("scaling efficiency = X(N) / (N x X(1))")
    ax2.set_ylim(bottom=0)
    ax2.set_title("scaling efficiency vs workers")
    ax2.legend(fontsize=8)
    out = [_save(fig, path)]
    if split_path:
        fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(summ) + 2), 4.6))
        labels = [f"{k}\n{s['workers']}w" for k, s in zip(keys, summ)]
        bottom = [0.0] * len(summ)
        for phase, color in (("compute_ms", "tab:blue"), ("comm_ms", "tab:orange"), ("wait_ms", "tab:red"),
                             ("data_ms", "tab:green")):
            vals = [(s.get(phase) or {}).get("median") or 0.0 for s in summ]
            ax.bar(range(len(summ)), vals, bottom=bottom, color=color, label=phase[:-3])
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(summ)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("time per step (ms, mean over ranks; median over rounds)")
        ax.set_title("where a training step's time goes (warm-up step excluded)")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        out.append(_save(fig, split_path))
    return out


def plot_accuracy(training: str | dict, path: str) -> list[str]:
    """Eval accuracy vs training seconds (top) and vs samples seen (bottom), one panel column per
    straggler condition, one line per (variant, workers, round).

    Args:
        training: ``DIR/training.json`` (rows of ``measure`` convergence, with ``accuracy_curve``).
        path: the PNG to write.

    Returns:
        [path], or [] when no convergence row succeeded.
    """
    d = _training(training)
    rows = [r for r in d.get("rows", []) if r.get("status") == "OK" and r.get("accuracy_curve")]
    if not rows:
        return []
    conds = list(dict.fromkeys(r["straggler"] for r in rows))
    keys = [f"{r['variant']} {r['workers']}w" for r in rows]
    colors = _colors(keys)
    target = d.get("target_accuracy")
    fig, axes = plt.subplots(2, len(conds), figsize=(6.4 * len(conds), 8.4), squeeze=False)
    for j, cond in enumerate(conds):
        seen = set()
        for k, r in zip(keys, rows):
            if r["straggler"] != cond:
                continue
            c = r["accuracy_curve"]
            lab = None if k in seen else k
            seen.add(k)
            acc = [p["accuracy"] for p in c]
            axes[0][j].plot([p["seconds"] for p in c], acc, "o-", ms=3, lw=1.2, color=colors[k], label=lab, alpha=0.85)
            axes[1][j].plot([p["samples"] for p in c], acc, "o-", ms=3, lw=1.2, color=colors[k], label=lab, alpha=0.85)
        title = "no straggler" if cond == "none" else f"straggler {cond} (rank:slowdown)"
        axes[0][j].set_xlabel("training time (s; slowest worker, no eval/start-up)")
        axes[1][j].set_xlabel("samples seen (all workers; asynchronous PS: rank 0's)")
        for i in (0, 1):
            ax = axes[i][j]
            if target:
                ax.axhline(target, color="red", ls="--", lw=1, label=f"target {target}")
            ax.set_ylabel("eval accuracy (fraction)")
            ax.set_title(f"{title}: accuracy vs {'time' if i == 0 else 'samples'}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    return [_save(fig, path)]


def plot_staleness(training: str | dict, path: str) -> list[str]:
    """Mean and max staleness (server updates between a worker's pull and the apply of its
    gradient) per parameter-server cell of ``training.json``'s summary.

    Returns:
        [path], or [] when no cell has staleness > 0.
    """
    summ = [s for s in _training(training).get("summary", []) if s.get("staleness_max")]
    if not summ:
        return []
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(summ) + 2), 4.0))
    x = range(len(summ))
    ax.bar(x, [s["staleness_max"] for s in summ], color="tab:purple", alpha=0.35, label="max")
    ax.bar(x, [(s.get("staleness_mean") or {}).get("median") or 0 for s in summ], color="tab:purple", label="mean")
    ax.set_xticks(list(x), [f"{s['variant']}\n{s['workers']}w {s['straggler']}" for s in summ], fontsize=7)
    ax.set_ylabel("staleness (updates)")
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_title("staleness of the parameter-server modes")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return [_save(fig, path)]


def plot_all(out_dir: str, collectives: Sequence[str] = (), training: str | None = None) -> list[str]:
    """Every plot whose input is given (collectives --json files, a training.json); returns the
    PNG paths written in ``out_dir``."""
    out = []
    if collectives:
        out += plot_busbw(collectives, os.path.join(out_dir, "busbw.png"))
    if training:
        doc = _load(training)
        out += plot_throughput(doc, os.path.join(out_dir, "throughput.png"), os.path.join(out_dir, "step_split.png"))
        out += plot_accuracy(doc, os.path.join(out_dir, "accuracy.png"))
        out += plot_staleness(doc, os.path.join(out_dir, "staleness.png"))
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI: draw every plot whose JSON is given; prints the PNG paths; returns 0."""
    p = argparse.ArgumentParser(prog="python -m hvdkit.bench.plots", description=__doc__.split("\n\n")[0])
    p.add_argument("--collectives", nargs="*", default=[], help="hvdkit.bench.collectives --json files")
    p.add_argument("--training", help="a training.json of hvdkit-bench training")
    p.add_argument("--out-dir", default=".", help="where the PNGs go (default .)")
    a = p.parse_args(argv)
    for path in plot_all(a.out_dir, a.collectives, a.training):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

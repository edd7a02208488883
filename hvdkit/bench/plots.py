"""PNG plots of the benchmark JSON files (matplotlib, Agg backend: no display needed).

    python -m hvdkit.bench.plots --collectives c2.json c4.json --throughput t.json \\
        --convergence conv.json --out-dir results/today

Pictures (each function returns the paths it wrote):

* :func:`plot_busbw`: busbw (GB/s) vs message size per method, log-log, one panel per
  collectives JSON (world size), from ``hvdkit.bench.collectives --json``;
* :func:`plot_throughput`: samples/s (mean +- 1.96 sd) and scaling efficiency vs workers
  per model/strategy, and the per-step compute / comm / wait / data split;
* :func:`plot_accuracy`: eval accuracy vs training seconds and vs samples seen, per
  strategy, without and with the straggler (one thin line per seed);
* :func:`plot_staleness`: staleness histogram per asynchronous mode (summed over seeds).
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

# the shared helpers live in the reporting package; the old private names stay for old importers
from hvdkit.bench.report.figures import DPI as _DPI  # noqa: E402,F401
from hvdkit.bench.report.figures import busbw_axes, colors as _colors, human_bytes as _human_bytes  # noqa: E402,F401
from hvdkit.bench.report.figures import save_figure as _save  # noqa: E402

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


def plot_throughput(throughput: Sequence[str | dict], path: str, split_path: str | None = None) -> list[str]:
    """Samples/s and scaling efficiency vs workers; optionally the per-step time split.

    Args:
        throughput: ``hvdkit.bench.throughput --json`` outputs (rows with set "scaling").
        path: PNG of samples/s (left) and efficiency (right).
        split_path: PNG of stacked compute/comm/wait/data milliseconds per step.

    Returns:
        The paths written ([] when no scaling row succeeded).
    """
    docs = [_load(t) if isinstance(t, str) else t for t in throughput]
    rows = [r for d in docs for r in d.get("rows", []) if r.get("set") == "scaling" and r.get("status") == "OK"]
    if not rows:
        return []
    keys = [f"{r['model']}/{r['strategy']}" + (f" ({r['layout']})" if r["layout"] != "replicas" else "")
            for r in rows]
    colors = _colors(keys)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12.5, 4.6))
    series: dict[str, list] = {}
    for k, r in zip(keys, rows):
        series.setdefault(k, []).append(r)
    for k, rs in series.items():
        rs.sort(key=lambda r: r["workers"])
        w = [r["workers"] for r in rs]
        ax1.errorbar(w, [r["samples_per_s"] for r in rs], yerr=[r["conf95"] for r in rs], fmt="o-", capsize=3,
                     color=colors[k], label=k)
        e = [(r["workers"], r["efficiency"], r.get("eff_conf95") or 0) for r in rs if r.get("efficiency") is not None]
        if e:
            ax2.errorbar([x[0] for x in e], [x[1] for x in e], yerr=[x[2] for x in e], fmt="o-", capsize=3,
                         color=colors[k], label=k)
    workers = sorted({r["workers"] for r in rows})
    for ax in (ax1, ax2):
        ax.set_xticks(workers)
        ax.set_xlabel("workers N")
        ax.grid(True, alpha=0.3)
    rates = [r["samples_per_s"] for r in rows if r["samples_per_s"]]
    if rates and max(rates) / max(min(rates), 1e-9) > 20:  # e.g. cnn and resnet50 together
        ax1.set_yscale("log")
    ax1.set_ylabel("training throughput (samples/s, all workers)")
    ax1.set_title("samples/s vs workers (mean +- 1.96 sd over iterations)")
    ax1.legend(fontsize=8)
    ax2.axhline(1.0, color="grey", lw=1, ls=":", label="ideal (1.0)")
    ax2.axhline(0.9, color="red", lw=1, ls="--", label="target 0.9")
    ax2.set_ylabel("scaling efficiency = X(N) / (N x X(1))")
    ax2.set_ylim(bottom=0)
    ax2.set_title("scaling efficiency vs workers")
    ax2.legend(fontsize=8)
    p = d0 = docs[0].get("meta", {}).get("parameters", {})
    fig.suptitle(f"synthetic {p.get('image_size', '?')}x{p.get('image_size', '?')}x3, batch {p.get('batch_size', '?')}"
                 f"/worker, {d0.get('iters', '?')} x {d0.get('steps_per_iter', '?')} steps", fontsize=10)
    out = [_save(fig, path)]
    if split_path:
        fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows) + 2), 4.6))
        labels = [f"{k}\n{r['workers']}w" for k, r in zip(keys, rows)]
        bottom = [0.0] * len(rows)
        for phase, color in (("compute_ms", "tab:blue"), ("comm_ms", "tab:orange"), ("wait_ms", "tab:red"),
                             ("data_ms", "tab:green"), ("other_ms", "tab:grey")):
            vals = [r.get(phase) or 0.0 for r in rows]
            ax.bar(range(len(rows)), vals, bottom=bottom, color=color, label=phase[:-3])
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("time per step (ms, mean over ranks)")
        ax.set_title("where a training step's time goes (warm-up step excluded)")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        out.append(_save(fig, split_path))
    return out


def plot_accuracy(convergence: str | dict, path: str) -> list[str]:
    """Eval accuracy vs training seconds (top) and vs samples seen (bottom), per condition.

    Args:
        convergence: a ``hvdkit.bench.convergence --json`` output (its ``runs`` with curves).
        path: the PNG to write.

    Returns:
        [path], or [] when no run succeeded.
    """
    d = _load(convergence) if isinstance(convergence, str) else convergence
    runs = [r for r in d.get("runs", []) if r.get("status") == "OK" and r.get("curve")]
    if not runs:
        return []
    conds = list(dict.fromkeys(r["straggler"] for r in runs))
    colors = _colors([r["label"] for r in runs])
    target = d.get("meta", {}).get("parameters", {}).get("target")
    fig, axes = plt.subplots(2, len(conds), figsize=(6.4 * len(conds), 8.4), squeeze=False)
    for j, cond in enumerate(conds):
        seen_label = set()
        for r in (r for r in runs if r["straggler"] == cond):
            c = r["curve"]
            lab = None if r["label"] in seen_label else r["label"]
            seen_label.add(r["label"])
            acc = [p["eval_accuracy"] for p in c]
            axes[0][j].plot([p["train_time_s"] for p in c], acc, "o-", ms=3, lw=1.2, color=colors[r["label"]],
                            label=lab, alpha=0.85)
            axes[1][j].plot([p["samples"] for p in c], acc, "o-", ms=3, lw=1.2, color=colors[r["label"]],
                            label=lab, alpha=0.85)
        title = "no straggler" if cond == "none" else f"straggler {cond} (rank:slowdown)"
        axes[0][j].set_xlabel("training time (s; slowest worker, no eval/start-up)")
        axes[1][j].set_xlabel("samples seen (all workers)")
        for i in (0, 1):
            ax = axes[i][j]
            if target:
                ax.axhline(target, color="red", ls="--", lw=1, label=f"target {target}")
            ax.set_ylabel("eval accuracy (fraction)")
            ax.set_title(f"{title}: accuracy vs {'time' if i == 0 else 'samples'}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    p = d.get("meta", {}).get("parameters", {})
    fig.suptitle(f"{p.get('model', '?')} on {p.get('dataset', '?')}, {p.get('workers', '?')} workers, seeds "
                 f"{p.get('seeds', '?')} (one line per seed)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return [_save(fig, path)]


def plot_staleness(convergence: str | dict, path: str) -> list[str]:
    """Staleness histogram per asynchronous mode and condition (summed over seeds).

    Args:
        convergence: a ``hvdkit.bench.convergence --json`` output (``rows`` with
            ``staleness_histogram``: staleness -> count of applied gradients).
        path: the PNG to write.

    Returns:
        [path], or [] when no row has a histogram with staleness > 0.
    """
    d = _load(convergence) if isinstance(convergence, str) else convergence
    rows = [r for r in d.get("rows", []) if r.get("staleness_histogram")
            and any(int(k) > 0 for k in r["staleness_histogram"])]
    if not rows:
        return []
    labels = list(dict.fromkeys(r["label"] for r in rows))
    conds = list(dict.fromkeys(r["straggler"] for r in rows))
    fig, axes = plt.subplots(len(conds), len(labels), figsize=(3.6 * len(labels), 3.2 * len(conds)), squeeze=False)
    for i, cond in enumerate(conds):
        for j, lab in enumerate(labels):
            ax = axes[i][j]
            r = next((r for r in rows if r["label"] == lab and r["straggler"] == cond), None)
            if r is None:
                ax.axis("off")
                continue
            h = {int(k): v for k, v in r["staleness_histogram"].items()}
            total = sum(h.values()) or 1
            ax.bar(list(h), [v / total for v in h.values()], color="tab:purple")
            ax.set_title(f"{lab}, straggler {cond}\nmax {max(h)}  mean {sum(k * v for k, v in h.items()) / total:.2f}",
                         fontsize=9)
            ax.set_xlabel("staleness (updates)")
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            ax.set_ylabel("fraction of applied gradients")
            ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("staleness histograms of the asynchronous parameter-server modes (staleness = server updates "
                 "between a worker's pull and the apply of its gradient)", fontsize=10)
    fig.tight_layout()
    return [_save(fig, path)]


def plot_all(out_dir: str, collectives: Sequence[str] = (), throughput: Sequence[str] = (),
             convergence: str | None = None) -> list[str]:
    """Every plot whose input is given; returns the PNG paths written in ``out_dir``."""
    out = []
    if collectives:
        out += plot_busbw(collectives, os.path.join(out_dir, "busbw.png"))
    if throughput:
        out += plot_throughput(throughput, os.path.join(out_dir, "throughput.png"),
                               os.path.join(out_dir, "step_split.png"))
    if convergence:
        out += plot_accuracy(convergence, os.path.join(out_dir, "accuracy.png"))
        out += plot_staleness(convergence, os.path.join(out_dir, "staleness.png"))
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI: draw every plot whose JSON is given; prints the PNG paths; returns 0."""
    p = argparse.ArgumentParser(prog="python -m hvdkit.bench.plots", description=__doc__.split("\n\n")[0])
    p.add_argument("--collectives", nargs="*", default=[], help="hvdkit.bench.collectives --json files")
    p.add_argument("--throughput", nargs="*", default=[], help="hvdkit.bench.throughput --json files")
    p.add_argument("--convergence", help="a hvdkit.bench.convergence --json file")
    p.add_argument("--out-dir", default=".", help="where the PNGs go (default .)")
    a = p.parse_args(argv)
    for path in plot_all(a.out_dir, a.collectives, a.throughput, a.convergence):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

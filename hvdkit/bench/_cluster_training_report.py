"""Figures of :mod:`hvdkit.bench.cluster_training`: the traffic model, the per-point summary
(median and min-max over repeats), efficiency, the markdown table and the plot.

Traffic model (:mod:`hvdkit.costs`, alpha = 0; S = the model's float32 gradient bytes,
``results.json`` ``model.trainable_bytes``): the bytes one step puts on the busiest link,
*per direction* (every link is full duplex):

* horovod, ring (N workers): ``2 (N-1)/N x S`` on every link (Patarasuk & Yuan 2009);
* PS with K dedicated servers (W workers): ``max(S, W S / K)`` (each server's link carries
  W S / K in during the push and out during the pull; K = 1: W S);
* colocated PS (N ranks, each a worker and a shard server): ``2 (N-1)/N x S``.

utilisation = busiest-link bytes per step x global steps per second / the probed link rate
(bytes/s), global steps/s = samples/s / (batch x W). For asynchronous PS the same formula
holds per worker step: each worker step moves S through the server's link each way, and
samples/s / batch worker steps happen per second. ``model_busy`` = the alpha-beta time of one
step's communication (:func:`hvdkit.costs.ring_allreduce_time`, ``ps_time``,
``colocated_ps_time``) x global steps/s: the fraction of the wall time the network alone needs
(1 = network-bound; a synchronous PS's push and pull are sequential, so its model time counts
both; asynchronous PS overlaps them across workers, so its ``model_busy`` is its utilisation).
"""
from __future__ import annotations

import csv
import os
from typing import Any, Sequence

import numpy as np

from hvdkit import costs

__all__ = ["busiest_link_bytes", "model_seconds", "summarise", "markdown", "plot_efficiency", "write_rows_csv",
           "SUMMARY_FIELDS"]

SUMMARY_FIELDS = ("model", "label", "strategy", "layout", "servers", "workers", "hosts", "repeats_ok",
                  "samples_per_s", "samples_per_s_min", "samples_per_s_max", "efficiency", "efficiency_min",
                  "efficiency_max", "vs_best_1", "utilisation", "utilisation_min", "utilisation_max", "model_busy",
                  "step_ms", "gradient_bytes", "link_bytes_per_step", "link_Bps")


def busiest_link_bytes(layout: str, gradient_bytes: float, workers: int, servers: int) -> float:
    """Bytes one (global) step puts on the busiest link in one direction (module docstring).

    Args:
        layout: ``"replicas"`` (horovod, ring), ``"dedicated"`` (PS with ``servers`` server
            ranks on their own hosts) or ``"colocated"`` (PS, every rank a shard server).
        gradient_bytes: S, bytes of float32 gradients per worker per step.
        workers: W (N), >= 1.
        servers: K, >= 1 for ``dedicated`` (ignored otherwise).

    Raises:
        ValueError: an unknown layout, or workers/servers < 1.
    """
    if workers < 1:
        raise ValueError(f"workers={workers} must be >= 1")
    if layout in ("replicas", "colocated"):
        return 2 * (workers - 1) / workers * gradient_bytes
    if layout == "dedicated":
        if servers < 1:
            raise ValueError(f"servers={servers} must be >= 1")
        return max(gradient_bytes, workers * gradient_bytes / servers)
    raise ValueError(f"unknown layout {layout!r}")


def model_seconds(layout: str, gradient_bytes: float, workers: int, servers: int, link_Bps: float) -> float:
    """Alpha-beta seconds of one step's communication (:mod:`hvdkit.costs`, alpha = 0)."""
    if layout == "replicas":
        return costs.ring_allreduce_time(gradient_bytes, workers, link_Bps)
    if layout == "colocated":
        return costs.colocated_ps_time(gradient_bytes, workers, link_Bps)
    return costs.ps_time(gradient_bytes, workers, servers, link_Bps)


def add_link_figures(row: dict) -> None:
    """Fill ``link_bytes_per_step``, ``utilisation`` and ``model_busy`` of one OK job row in place."""
    w, s, bps = row["workers"], row["gradient_bytes"], row["link_Bps"]
    steps_per_s = row["samples_per_s"] / (row["batch"] * w)
    nbytes = busiest_link_bytes(row["layout"], s, w, row["servers"])
    row["link_bytes_per_step"] = nbytes
    row["utilisation"] = nbytes * steps_per_s / bps
    if row.get("strategy") == "ps-async":   # one worker's pull overlaps another's push: both directions busy
        row["model_busy"] = row["utilisation"]
    else:
        row["model_busy"] = model_seconds(row["layout"], s, w, row["servers"], bps) * steps_per_s


def _mid_range(values: Sequence[float]) -> tuple[float, float, float]:
    v = np.asarray(values, np.float64)
    return float(np.median(v)), float(v.min()), float(v.max())


def summarise(rows: Sequence[dict]) -> list[dict]:
    """One summary per (model, label, workers) over its OK repeats: median, min and max of
    samples/s and utilisation; efficiency = median(N) / (N x median(1)) of the same model
    and label, its range min(N) / (N max(1)) .. max(N) / (N min(1)); ``vs_best_1`` =
    median(N) / (N x the fastest strategy's 1-worker median of that model), which compares
    strategies on one scale (a PS's 1-worker run already crosses a link). Sorted by model,
    label order of first appearance, workers."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("status") == "OK":
            groups.setdefault((r["model"], r["label"], r["workers"]), []).append(r)
    out = []
    for (model, label, w), rs in groups.items():
        r0 = rs[0]
        sps = _mid_range([r["samples_per_s"] for r in rs])
        util = _mid_range([r["utilisation"] for r in rs])
        out.append({"model": model, "label": label, "strategy": r0["strategy"], "layout": r0["layout"],
                    "servers": r0["servers"], "workers": w, "hosts": r0["hosts"], "repeats_ok": len(rs),
                    "samples_per_s": sps[0], "samples_per_s_min": sps[1], "samples_per_s_max": sps[2],
                    "utilisation": util[0], "utilisation_min": util[1], "utilisation_max": util[2],
                    "model_busy": float(np.median([r["model_busy"] for r in rs])),
                    "step_ms": float(np.median([r["step_ms"] for r in rs])),
                    "gradient_bytes": r0["gradient_bytes"], "link_bytes_per_step": r0["link_bytes_per_step"],
                    "link_Bps": float(np.median([r["link_Bps"] for r in rs]))})
    base = {(s["model"], s["label"]): s for s in out if s["workers"] == 1}
    best1: dict[str, float] = {}
    for s in out:
        if s["workers"] == 1:
            best1[s["model"]] = max(best1.get(s["model"], 0.0), s["samples_per_s"])
    for s in out:
        for sfx in ("", "_min", "_max"):
            s["vs_best_1" + sfx] = (s["samples_per_s" + sfx] / (s["workers"] * best1[s["model"]])
                                    if s["model"] in best1 else None)
    for s in out:
        b = base.get((s["model"], s["label"]))
        if b is None:
            s["efficiency"] = s["efficiency_min"] = s["efficiency_max"] = None
            continue
        n = s["workers"]
        s["efficiency"] = s["samples_per_s"] / (n * b["samples_per_s"])
        s["efficiency_min"] = s["samples_per_s_min"] / (n * b["samples_per_s_max"])
        s["efficiency_max"] = s["samples_per_s_max"] / (n * b["samples_per_s_min"])
    order = {lab: i for i, lab in enumerate(dict.fromkeys(r["label"] for r in rows))}
    return sorted(out, key=lambda s: (s["model"], order[s["label"]], s["workers"]))


def _cell(s: dict | None, key: str, digits: int) -> str:
    if s is None or s.get(key) is None:
        return "-"
    return f"{s[key]:.{digits}f} ({s[key + '_min']:.{digits}f}-{s[key + '_max']:.{digits}f})"


def markdown(summary: Sequence[dict], meta: dict) -> str:
    """Markdown tables per model: scaling efficiency, samples/s, samples/s per worker relative
    to the model's fastest 1-worker run (``vs_best_1``) and busiest-link utilisation per strategy (rows) and worker count (columns), each cell ``median (min-max)``."""
    out = []
    workers = sorted({s["workers"] for s in summary})
    for model in dict.fromkeys(s["model"] for s in summary):
        ms = [s for s in summary if s["model"] == model]
        by = {(s["label"], s["workers"]): s for s in ms}
        mb = ms[0]["gradient_bytes"] / 1e6
        for key, what, digits in (("efficiency", "scaling efficiency", 2), ("samples_per_s", "samples/s", 0),
                                  ("vs_best_1", "samples/s per worker / the fastest 1-worker run's", 2),
                                  ("utilisation", "busiest link's utilisation", 2)):
            out.append(f"**{model}** ({mb:.1f} MB of gradients per step): {what}, median (min-max) of "
                       f"{meta.get('repeats')} runs\n")
            out.append("| strategy | " + " | ".join(f"{w} worker{'s' * (w > 1)}" for w in workers) + " |")
            out.append("|---|" + "---|" * len(workers))
            for label in dict.fromkeys(s["label"] for s in ms):
                out.append(f"| {label} | " + " | ".join(_cell(by.get((label, w)), key, digits) for w in workers) + " |")
            out.append("")
    return "\n".join(out)


def write_rows_csv(path: str, rows: Sequence[dict], fields: Sequence[str]) -> None:
    """CSV of ``rows`` with ``fields`` as columns (missing cells empty, other keys dropped)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def plot_efficiency(summary: Sequence[dict], path: str, title: str = "") -> list[str]:
    """Scaling efficiency vs workers per strategy (median, min-max bars), one panel per model;
    a second row gives samples/s per worker relative to the model's fastest 1-worker run
    (``vs_best_1``), which puts the strategies on one scale.

    Returns:
        [path], or [] when no point has an efficiency.
    """
    from hvdkit.bench.plots import _colors, _save, plt

    pts = [s for s in summary if s.get("efficiency") is not None]
    if not pts:
        return []
    models = list(dict.fromkeys(s["model"] for s in pts))
    fig, axes = plt.subplots(2, len(models), figsize=(6.0 * len(models), 8.4), squeeze=False)
    colors = _colors([s["label"] for s in pts])
    rows = (("efficiency", "scaling efficiency\n(vs the same strategy at 1 worker)"),
            ("vs_best_1", "samples/s per worker\n/ the fastest 1-worker run's"))
    for (key, ylabel), ax_row in zip(rows, axes):
        for ax, model in zip(ax_row, models):
            for label in dict.fromkeys(s["label"] for s in pts if s["model"] == model):
                ss = sorted((s for s in pts if s["model"] == model and s["label"] == label),
                            key=lambda s: s["workers"])
                y = [s[key] for s in ss]
                err = [[s[key] - s[key + "_min"] for s in ss], [s[key + "_max"] - s[key] for s in ss]]
                ax.errorbar([s["workers"] for s in ss], y, yerr=err, marker="o", capsize=3, label=label,
                            color=colors[label])
            mb = next(s["gradient_bytes"] for s in pts if s["model"] == model) / 1e6
            ax.set_title(f"{model} ({mb:.1f} MB gradients)")
            ax.set_xlabel("workers (1 rank per host; dedicated PS: + K server hosts)")
            ax.set_ylabel(ylabel)
            ax.set_xticks(sorted({s["workers"] for s in pts}))
            ax.set_ylim(0, max(1.1, max(s[key + "_max"] for s in pts) * 1.05))
            ax.axhline(1.0, color="grey", lw=0.6, ls=":")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.subplots_adjust(hspace=0.35)
    if title:
        fig.suptitle(title, fontsize=10)
    return [_save(fig, path)]

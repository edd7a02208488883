"""Every benchmark picture, and the plot helpers the benchmarks share (matplotlib, Agg: no display).

The one home of the pictures of the JSON files: the decision report embeds them
(:mod:`hvdkit.bench.report.writer`, ``report-*.png``), :func:`plot_all` writes them as the
suite's PNG files (``busbw.png``, ``throughput.png``, ``step_split.png``, ``accuracy.png``,
``staleness.png``; also ``hvdkit-bench plots``, :mod:`hvdkit.bench.report.plots`), and
:func:`plot_cluster` the cluster collectives' ``busbw_<config>_<rate>.png``.

Helpers: :func:`colors` (one tab10 colour per key, stable in order of first appearance),
:func:`human_bytes`, :func:`save_figure` (a PNG file), :func:`png_bytes` (the PNG in memory),
:func:`busbw_axes` (one collectives JSON on one axes). Pictures (each returns a matplotlib
figure, or None when there is nothing to draw): :func:`scaling_figure`, :func:`split_figure`,
:func:`accuracy_figure`, :func:`staleness_figure`, :func:`busbw_figure`.

Straggler conditions: a cell with a straggler (``straggler`` ``RANK:FACTOR``) is drawn next to
the same variant's cells without one, in a line style of its own (:func:`condition_style`).
"""
from __future__ import annotations

import copy
import io
import json
import os
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hvdkit.collectives.names import canonical_doc  # noqa: E402

__all__ = ["DPI", "plt", "colors", "human_bytes", "save_figure", "png_bytes", "busbw_axes", "scaling_figure",
           "split_figure", "accuracy_figure", "staleness_figure", "busbw_figure", "condition_style", "plot_all",
           "PHASES", "PNG_NAMES", "plot_cluster"]

DPI = 110
#: (summary key, legend label, colour) of the step-time split, bottom to top
PHASES = (("compute_ms", "compute", "tab:blue"), ("comm_ms", "communication", "tab:orange"),
          ("wait_ms", "wait", "tab:red"), ("data_ms", "data", "tab:green"))
#: the files :func:`plot_all` writes, in its order (each only where it has something to draw)
PNG_NAMES = ("busbw.png", "throughput.png", "step_split.png", "accuracy.png", "staleness.png")
_STYLES = (("-", "o"), (":", "s"), ("-.", "^"), ((0, (5, 1)), "D"), ((0, (1, 3)), "v"))


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
    ax.set_title(f"allreduce busbw vs message size, {n} ranks\nbusbw as nccl-tests defines it "
                 "(docs/performance.md; memcpy: S/t)")
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


def _cond(c: Mapping) -> str:
    return c.get("straggler") or "none"


def _conditions(cells: Sequence[Mapping]) -> list[str]:
    """The straggler conditions of ``cells`` in order of first appearance, ``"none"`` first."""
    conds = list(dict.fromkeys(_cond(c) for c in cells))
    return sorted(conds, key=lambda c: c != "none")


def condition_style(conds: Sequence[str], cond: str) -> tuple:
    """(line style, marker) of straggler condition ``cond`` among ``conds`` (:func:`_conditions`
    order: the first, normally ``"none"``, solid with circles)."""
    return _STYLES[list(conds).index(cond) % len(_STYLES)]


def _label(variant: str, cond: str) -> str:
    return variant if cond == "none" else f"{variant}, straggler {cond}"


def _errbar(ax, xs, stats, color, label, **kw):
    y = [s["median"] for s in stats]
    err = [[s["median"] - s["min"] for s in stats], [s["max"] - s["median"] for s in stats]]
    ax.errorbar(xs, y, yerr=err, capsize=3, color=color, label=label, **kw)


def scaling_figure(summary: Sequence[Mapping], projections: Sequence[Mapping] = ()):
    """Per model (columns): samples/s (top) and scaling efficiency (bottom) vs workers, median
    with min-max bars per variant and straggler condition (a straggler cell's efficiency is
    against the variant's 1-worker cell without one, :func:`hvdkit.bench.training.summarize`); the
    calibrated projections (``advised.projections``) dashed with open markers. None when no cell
    was measured.

    Args:
        summary: ``training.json`` summary entries of one measure (``samples_per_s`` and
            ``efficiency``: ``{"median","min","max"}`` or None).
        projections: ``[{"model","variant","straggler","workers","points":[{"workers",
            "samples_per_s","efficiency"}]}]``.
    """
    cells = [s for s in summary if (s.get("samples_per_s") or {}).get("median") is not None]
    if not cells:
        return None
    conds = _conditions(cells)
    models = list(dict.fromkeys(s["model"] for s in cells))
    fig, axes = plt.subplots(2, len(models), figsize=(6.2 * len(models), 8.0), squeeze=False)
    palette = colors([s["variant"] for s in cells])
    for j, model in enumerate(models):
        ax1, ax2 = axes[0][j], axes[1][j]
        xs_all = set()
        for cond in conds:
            ls, marker = condition_style(conds, cond)
            mine = [s for s in cells if s["model"] == model and _cond(s) == cond]
            for v in dict.fromkeys(s["variant"] for s in mine):
                ss = sorted((s for s in mine if s["variant"] == v), key=lambda s: s["workers"])
                xs = [s["workers"] for s in ss]
                xs_all.update(xs)
                _errbar(ax1, xs, [s["samples_per_s"] for s in ss], palette[v], _label(v, cond), marker=marker, ls=ls)
                e = [s for s in ss if s.get("efficiency") and s["efficiency"].get("median") is not None]
                if e:
                    _errbar(ax2, [s["workers"] for s in e], [s["efficiency"] for s in e], palette[v],
                            _label(v, cond), marker=marker, ls=ls)
                pr = next((p for p in projections if p["model"] == model and p["variant"] == v
                           and p.get("straggler", "none") == cond and p["points"]), None)
                last = next((s for s in ss if pr and s["workers"] == pr["workers"]), None)
                if pr and last:
                    px = [pr["workers"]] + [q["workers"] for q in pr["points"]]
                    xs_all.update(px)
                    _errbar(ax1, px, [last["samples_per_s"]] + [q["samples_per_s"] for q in pr["points"]],
                            palette[v], None, marker=marker, mfc="white", ls="--", alpha=0.8)
                    if last.get("efficiency") and all(q["efficiency"] for q in pr["points"]):
                        _errbar(ax2, px, [last["efficiency"]] + [q["efficiency"] for q in pr["points"]], palette[v],
                                None, marker=marker, mfc="white", ls="--", alpha=0.8)
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(xs_all), [str(x) for x in sorted(xs_all)])
            ax.minorticks_off()
            ax.set_xlabel("workers N" + (" (dashed, open: projected by hvdkit advise, calibrated)"
                                         if any(p["points"] for p in projections) else ""))
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        ax1.set_title(f"{model}: samples/s, median [min-max] over rounds")
        ax1.set_ylabel("samples/s (all workers)")
        ax2.set_title(f"{model}: scaling efficiency X(N) / (N X(1), no straggler)")
        ax2.set_ylabel("scaling efficiency")
        ax2.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax2.set_ylim(0, max(1.1, ax2.get_ylim()[1]))
    fig.tight_layout()
    return fig


def split_figure(summary: Sequence[Mapping]):
    """Stacked median compute / communication / wait / data milliseconds per step of every
    measured cell, grouped by model, then straggler condition; None when no cell has a split."""
    cells = [s for s in summary if (s.get("compute_ms") or {}).get("median") is not None]
    if not cells:
        return None
    models, conds = list(dict.fromkeys(c["model"] for c in cells)), _conditions(cells)
    cells = sorted(cells, key=lambda s: (models.index(s["model"]), conds.index(_cond(s)), s["variant"], s["workers"]))
    fig, ax = plt.subplots(figsize=(max(6.5, 0.5 * len(cells) + 2.5), 4.6))
    bottom = [0.0] * len(cells)
    for key, label, color in PHASES:
        vals = [(s.get(key) or {}).get("median") or 0.0 for s in cells]
        ax.bar(range(len(cells)), vals, bottom=bottom, color=color, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(cells)), [f"{s['model']} {s['variant']}\n{s['workers']}w"
                                      + ("" if _cond(s) == "none" else f" straggler {_cond(s)}") for s in cells],
                  rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("ms per step (mean over ranks, median over rounds)")
    ax.set_title("where a step's time goes (warm-up step excluded)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def accuracy_figure(rows: Sequence[Mapping], target: float | None = None):
    """Eval accuracy vs training seconds (top) and vs samples seen (bottom), one column per
    (model, straggler condition), one line per round of each (variant, workers) with an
    ``accuracy_curve`` (``[{"seconds", "samples", "accuracy"}]``); the target dashed. None when
    no OK row has a curve."""
    rows = [r for r in rows if r.get("status") == "OK" and r.get("accuracy_curve")]
    if not rows:
        return None
    panels = list(dict.fromkeys((r["model"], _cond(r)) for r in sorted(rows, key=lambda r: _cond(r) != "none")))
    fig, axes = plt.subplots(2, len(panels), figsize=(6.2 * len(panels), 8.4), squeeze=False)
    keys = [f"{r['variant']} {r['workers']}w" for r in rows]
    palette = colors(keys)
    for j, (model, cond) in enumerate(panels):
        seen = set()
        for k, r in zip(keys, rows):
            if (r["model"], _cond(r)) != (model, cond):
                continue
            c, lab = r["accuracy_curve"], None if k in seen else k
            seen.add(k)
            acc = [p["accuracy"] for p in c]
            for i, x in ((0, "seconds"), (1, "samples")):
                axes[i][j].plot([p[x] for p in c], acc, "o-", ms=2.5, lw=1.1, color=palette[k], label=lab, alpha=0.85)
        title = f"{model}, " + ("no straggler" if cond == "none" else f"straggler {cond} (rank:slowdown)")
        axes[0][j].set_xlabel("training time (s; slowest worker, no eval/start-up)")
        axes[1][j].set_xlabel("samples seen (all workers; asynchronous PS: rank 0's)")
        for i in (0, 1):
            ax = axes[i][j]
            if target is not None:
                ax.axhline(target, color="red", ls="--", lw=1, label=f"target {target}")
            ax.set_ylabel("eval accuracy (fraction)")
            ax.set_title(f"{title}: accuracy vs {'time' if i == 0 else 'samples'}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def staleness_figure(summary: Sequence[Mapping]):
    """Mean and max staleness (server updates between a worker's pull and the apply of its
    gradient) per parameter-server cell (``staleness_max`` > 0); None when there is none."""
    import matplotlib.ticker

    cells = [s for s in summary if s.get("staleness_max")]
    if not cells:
        return None
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(cells) + 2), 4.0))
    x = range(len(cells))
    ax.bar(x, [s["staleness_max"] for s in cells], color="tab:purple", alpha=0.35, label="max")
    ax.bar(x, [(s.get("staleness_mean") or {}).get("median") or 0 for s in cells], color="tab:purple", label="mean")
    ax.set_xticks(list(x), [f"{s['variant']}\n{s['workers']}w {_cond(s)}" for s in cells], fontsize=7)
    ax.set_ylabel("staleness (updates)")
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_title("staleness of the parameter-server modes")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def _load(doc: str | Mapping) -> Mapping:
    if not isinstance(doc, str):
        return doc
    with open(doc, encoding="utf-8") as fh:
        return json.load(fh)


def plot_all(out_dir: str, collectives: Sequence[str | Mapping] = (), training: str | Mapping | None = None) -> list[str]:
    """Write every picture whose input is given as :data:`PNG_NAMES` files in ``out_dir``.

    ``busbw.png`` (:func:`busbw_figure` of the collectives documents), and of ``training.json``
    (:mod:`hvdkit.bench.training`): ``throughput.png`` (:func:`scaling_figure`) and
    ``step_split.png`` (:func:`split_figure`) of its ``--measure throughput`` cells,
    ``accuracy.png`` (:func:`accuracy_figure`) of its convergence rows and ``staleness.png``
    (:func:`staleness_figure`) of every cell.

    Args:
        collectives: paths to (or loaded) ``hvdkit.bench.collectives --json`` outputs.
        training: a path to (or the loaded) ``training.json``.

    Returns:
        The PNG paths written, in :data:`PNG_NAMES` order (a picture with nothing to draw is not
        written).

    Raises:
        OSError, ValueError: an input is not readable JSON, or a file cannot be written.
    """
    from hvdkit.cells import measure_of

    figs = []
    if collectives:
        # a run's retired method names in today's spelling (a given document left as it is)
        figs.append(("busbw.png", busbw_figure([canonical_doc(copy.deepcopy(_load(c))) for c in collectives])))
    if training:
        d = _load(training)
        summ = [s for s in d.get("summary", []) if measure_of(s) == "throughput"]
        figs += [("throughput.png", scaling_figure(summ)), ("step_split.png", split_figure(summ)),
                 ("accuracy.png", accuracy_figure(d.get("rows", []), d.get("target_accuracy"))),
                 ("staleness.png", staleness_figure(d.get("summary", [])))]
    return [save_figure(fig, os.path.join(out_dir, name)) for name, fig in figs if fig is not None]


def plot_cluster(rows: Sequence[Mapping], out: str) -> list[str]:
    """``busbw_<config>_<rate>.png`` per (config, rate): busbw (GB/s) vs size per method
    (median over repeated launches), log-log, the probed link dashed, of
    :mod:`hvdkit.bench.cluster_collectives`' rows. Returns the paths."""
    import numpy as np

    paths = []
    for cfg, rate in dict.fromkeys((r["config"], r["rate"]) for r in rows):
        sub = [r for r in rows if (r["config"], r["rate"]) == (cfg, rate) and r.get("busbw_GBps")]
        if not sub:
            continue
        fig, ax = plt.subplots(figsize=(7.0, 4.8))
        base = (lambda m: m.split("[")[0])   # colour: the method; line style: the launch variant
        palette = colors([base(r["method"]) for r in sub])
        labels = list(dict.fromkeys(m.partition("[")[2] for m in (r["method"] for r in sub)))
        styles = ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 3))]
        for m in dict.fromkeys(r["method"] for r in sub):
            sizes = sorted({r["bytes"] for r in sub if r["method"] == m})
            ys = [float(np.median([r["busbw_GBps"] for r in sub if r["method"] == m and r["bytes"] == b]))
                  for b in sizes]
            ax.plot(sizes, ys, marker="o", ms=3, label=m, color=palette[base(m)],
                    ls=styles[labels.index(m.partition("[")[2]) % len(styles)])
        link = sub[0].get("link_Bps")
        if link:
            ax.axhline(link / 1e9, ls="--", color="grey", lw=1, label=f"probed link {link * 8 / 1e9:.2f} Gbit/s")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted({r["bytes"] for r in sub})
        ax.set_xticks(ticks)
        ax.set_xticklabels([human_bytes(t) for t in ticks], rotation=45, fontsize=7)
        ax.set_xlabel("message size per rank")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{cfg} (hosts x ranks) on {rate or 'the hosts'} links")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        paths.append(save_figure(fig, os.path.join(out, f"busbw_{cfg}_{rate or 'hosts'}.png")))
    return paths

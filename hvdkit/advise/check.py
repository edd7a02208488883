"""How far to trust ``hvdkit advise``: its predictions next to measurements and to published results.

Runs nothing on a cluster: it reads what the benchmarks measured and writes the comparisons
(markdown tables, ``--json``)::

    hvdkit bench advise-check                                  # the reference set's check
    hvdkit bench advise-check --json advise_check.json --markdown advise_check.md
    hvdkit bench advise-check RUN --at-scale RUN --json c.json # suite/training dirs, one per rate
    hvdkit bench advise-check --training T.json --collectives C.json   # in sample

Without DIR the check is the reference set's (:data:`REFERENCE`, relative to a checkout's root): the
inputs that JSON records are read again (benchmarks/reference/index.md lists them).

0. Held out (:mod:`hvdkit.advise.heldout`): calibrated ONLY on the collectives at 2 hosts, the
   one-worker training cells and the transport's all-to-all (``mpi-a2a`` at 3 hosts or more, in a
   directory's collectives or ``--transport FILE``; no strategy), every cell with >= 3 workers
   predicted (every model, variant and rate present), against a naive baseline (compute + the
   busiest link's bytes / the probed rate). The
   ``--json`` file's ``"summary"``: ``held_out``, ``median_abs_error``, ``max_abs_error``, ``groups``,
   ``ranking_exact``, ``fastest_right``, ``pairs_distinct``, ``pairs_agree``, ``ranking_as_measured``,
   ``fastest_as_measured`` (the rankings within the measured spread), ``inside_range``, ``points``,
   ``baseline``, ``one_boot`` and ``boots`` (whether one boot of one machine measured the collectives
   and the training cells: :func:`hvdkit.advise.measured.provenance`) (docs/advise.md).
   Inputs: ``DIR``... (``hvdkit-bench suite`` or ``training`` output directories: training.json,
   collectives json(s), cluster.json with the probe; or a directory of them, one per link rate).
1. In sample (``--training``: ``hvdkit-bench training``'s training.json on hosts or ``--emulated``;
   ``--collectives``, a ``cluster_collectives --json``): every (model, strategy variant, workers) point,
   measured step time (median over repeats) against two predictions:
   ``probe``: the formulas with the probed link (B = link_Bps, alpha = rtt/2) and nothing else;
   ``fit``: the same step with each strategy's communication replaced by a Hockney fit
   ``t = a + b x bytes`` of the same collective measured alone by ``cluster_collectives``
   (one rank per host, the default variant, sizes >= 1 MiB; a rank count it did not
   measure takes the largest measured one's ``a`` and its ``b`` scaled by the formula's bytes
   ratio). Both use the 1-worker Horovod step (either form) as the compute and stretch it by
   workers / cores when more ranks than cores share the machine; each row overlaps as it runs
   (:func:`hvdkit.advise.predict.overlaps_backward`). Reported: the
   median absolute relative error, and per (model, workers) whether the predicted order of the
   strategies equals the measured one.
2. Published (:data:`PUBLISHED`): the Horovod paper's 512-GPU scaling efficiencies and BytePS's
   speed-ups over Horovod, projected from the known models of :mod:`hvdkit.advise.presets`
   with the assumptions stated in each row.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace

from hvdkit.advise import presets, published
from hvdkit.advise import measured
from hvdkit.advise.calibrate import collective_method, fit_collectives, fit_for
from hvdkit.advise.measured import variant_of
from hvdkit.advise.model import Cluster, Options, Workload
from hvdkit.advise.predict import COMPUTE_ROWS, predict_variant, priced
from hvdkit.advise import heldout
from hvdkit.cliparse import Parser, print_error
from hvdkit.errors import UsageError
from hvdkit.results import write_json

__all__ = ["main", "build_parser", "render", "measured_points", "measured_comparison", "published_comparison",
           "published_by_source", "variant_of", "PUBLISHED"]

PROG = "python -m hvdkit.advise.check"
#: the reference set's check (held out on fair hosts, and published), relative to a checkout's root
REFERENCE = os.path.join("benchmarks", "reference", "advise_check.json")


def measured_points(training: dict) -> tuple[dict, dict]:
    """``(meta, points)`` of a training benchmark document (:func:`hvdkit.advise.measured.from_training`).

    ``meta``: ``cores``, ``batch_size``, ``rtt_s``, ``link_Bps`` (bytes/s), ``bandwidth`` (the rate's label).
    ``points``: (model, variant label, workers) -> ``step_ms`` (median over the OK rounds),
    ``min_ms``, ``max_ms``, ``gradient_bytes``, ``link_Bps``, ``hosts`` (of the ranks), ``ranks``.

    Raises:
        UsageError: a training.json whose place has no probed link (this host: nothing to compare).
    """
    m = measured.from_training(training)
    (rate, ln), = m.links.items()
    meta = {"cores": ln.cores, "batch_size": m.batch_size, "link_Bps": ln.link_Bps, "rtt_s": ln.rtt_s,
            "bandwidth": rate}
    return meta, {(c.model, c.variant, c.workers): {"step_ms": c.step_ms, "min_ms": c.min_ms, "max_ms": c.max_ms,
                                                    "gradient_bytes": c.gradient_bytes,
                                                    "link_Bps": c.link_Bps or ln.link_Bps,
                                                    "hosts": c.hosts, "ranks": c.ranks} for c in m.cells}


def measured_comparison(training: dict, fits: dict) -> tuple[list[dict], dict]:
    """One row per (model, variant, workers) measured (:func:`measured_points`), and the summary statistics."""
    meta, summ = measured_points(training)
    cores = int(meta.get("cores") or 0) or None
    rows = []
    for (model, label, w), s in sorted(summ.items()):
        one = next((summ[(model, v, 1)] for v in COMPUTE_ROWS if (model, v, 1) in summ), None)   # the compute
        if one is None:
            continue
        row = priced(label, w)
        method, ranks = collective_method(row, w)
        wl = Workload(model, (int(s["gradient_bytes"]),), compute_s=one["step_ms"] / 1e3,
                      batch=meta["batch_size"])
        cl = Cluster(hosts=w, gpus_per_host=1, intra_Bps=presets.INTRA["shm"][0], inter_Bps=s["link_Bps"],
                     intra_latency_s=presets.INTRA["shm"][1], inter_latency_s=meta["rtt_s"] / 2,
                     reduce_Bps=2e9, server_Bps=2e9, shared_cores=cores)
        opt = Options(jitter_cv=0.0)
        probe = predict_variant(row, wl, cl, opt)
        fit = fit_for(fits, method, ranks) if method else None
        fitted = predict_variant(row, wl, cl, replace(opt, fitted=((label, *fit),))) if fit else None
        meas = s["step_ms"] / 1e3
        rows.append({"model": model, "variant": label, "workers": w, "hosts": s["hosts"], "measured_ms": meas * 1e3,
                     "measured_min_ms": s["min_ms"], "measured_max_ms": s["max_ms"], "oversubscribed": s["ranks"] > (cores or 1e9),
                     "probe_ms": probe.step_s * 1e3, "fit_ms": fitted.step_s * 1e3 if fitted else None,
                     "probe_err": probe.step_s / meas - 1, "fit_err": fitted.step_s / meas - 1 if fitted else None,
                     "fit_ranks_measured": (method, ranks) in fits or ranks == 1})
    stats = {}
    for col in ("probe", "fit"):
        errs = [abs(r[f"{col}_err"]) for r in rows if r[f"{col}_err"] is not None]
        part = {k: [abs(r[f"{col}_err"]) for r in rows if r[f"{col}_err"] is not None and r["oversubscribed"] == v]
                for k, v in (("ranks_le_cores", False), ("ranks_gt_cores", True))}
        agree, distinct = 0, 0   # strategy pairs whose measured min-max ranges do not overlap
        for i, x in enumerate(rows):
            for y in rows[i + 1:]:
                if (x["model"], x["workers"]) != (y["model"], y["workers"]) or x[f"{col}_ms"] is None \
                        or y[f"{col}_ms"] is None:
                    continue
                if x["measured_max_ms"] < y["measured_min_ms"] or y["measured_max_ms"] < x["measured_min_ms"]:
                    distinct += 1
                    agree += (x["measured_ms"] < y["measured_ms"]) == (x[f"{col}_ms"] < y[f"{col}_ms"])
        same, best, total = 0, 0, 0
        for model, w in sorted({(r["model"], r["workers"]) for r in rows}):
            grp = [r for r in rows if r["model"] == model and r["workers"] == w and r[f"{col}_ms"] is not None]
            if len(grp) < 2:
                continue
            total += 1
            meas = [r["variant"] for r in sorted(grp, key=lambda r: r["measured_ms"])]
            pred = [r["variant"] for r in sorted(grp, key=lambda r: r[f"{col}_ms"])]
            same += meas == pred
            best += meas[0] == pred[0]
        stats[col] = {"median_abs_err": statistics.median(errs) if errs else None, "points": len(errs),
                      "rankings_equal": same, "best_equal": best, "rankings": total,
                      "within_15pct": sum(e <= 0.15 for e in errs), "pairs_distinct": distinct, "pairs_agree": agree,
                      **{f"median_abs_err_{k}": statistics.median(v) if v else None for k, v in part.items()},
                      **{f"points_{k}": len(v) for k, v in part.items()}}
    return rows, stats


#: the published rows (:mod:`hvdkit.advise.published`: source, where, quoted value, hardware, and the
#: calibrate / held-out role of each source, declared before fitting)
PUBLISHED = published.ROWS

ASSUMPTIONS = ("per-accelerator compute = batch / the one-accelerator images/s the source prints (else "
               "hvdkit.advise.presets': P100 from tf_cnn_benchmarks, V100 fp32 assumed); float32 gradients of "
               "the known models' tensors; a row overlaps fused 64 MiB buckets with the backward pass when its "
               "system does (Horovod, PyTorch DDP, BytePS), else sends after it; NCCL's flat ring over all "
               "GPUs; TCP latency 30 us, RDMA 5 us; links at their line rate, but for NCCL's ring over TCP between "
               "hosts of several GPUs (hvdkit.advise.presets.NCCL_TCP_FRACTION of it); a colocated PS serves from "
               "every host unless the source names fewer parameter servers; straggler jitter 2%; BytePS: local "
               "aggregation, K = H CPU server hosts, pipelined push/pull. Errors: points of scaling efficiency; "
               "for speed-ups, percent of the published speed-up.")
#: a pair of published figures of one source and model closer than this (points or percent) has no order
TIE = 2.0


def _workload(p: dict) -> Workload:
    ips = p.get("images_per_s") or presets.KNOWN_MODELS[p["model"]]["images_per_s"][p["gpu"]]
    return Workload(p["model"], presets.known_tensors(p["model"]), compute_s=p["batch"] / ips, batch=p["batch"])


def _figure(p: dict, wl: Workload, cl: Cluster, eta: float = 1.0):
    """(the projected figure, the row's prediction, the compared system's) with the links of the row's
    subject (efficiency rows: its strategy; speed-up rows: the ``versus`` system) at ``eta`` x their rate."""
    opt = Options(overlap=p["overlap"], ps_local_aggregation=p["aggregate"])
    slow = replace(cl, intra_Bps=cl.intra_Bps * eta, inter_Bps=cl.inter_Bps * eta)
    # the published system's overlap (and its parameter servers, where it names them), whatever hvdkit's
    # row of that name does
    def row(name):
        r = priced(name, cl.workers)
        r = replace(r, overlaps=p["overlap"], overlap_capable=r.overlap_capable or p["overlap"])
        return replace(r, servers=p["servers"]) if p.get("servers") and name == p["strategy"] else r
    if p["kind"] == "speedup":
        mine, other = predict_variant(row(p["strategy"]), wl, cl, opt), predict_variant(row(p["versus"]), wl, slow, opt)
        return other.step_s / mine.step_s, mine, other
    mine = predict_variant(row(p["strategy"]), wl, slow, opt)
    return mine.efficiency, mine, None


def _naive(p: dict, wl: Workload, cl: Cluster) -> float:
    """The naive baseline's figure: each step = compute + the busiest link's bytes / its line rate (no
    latency, no overlap, no straggler)."""
    def step(strategy):
        row = priced(strategy, cl.workers)
        if p.get("servers") and strategy == p["strategy"]:
            row = replace(row, servers=p["servers"])
        pr = predict_variant(row, wl, cl, Options(jitter_cv=0.0))
        rate = cl.inter_Bps if "NIC" in pr.link else cl.intra_Bps
        return wl.compute_s + pr.link_bytes / rate
    if p["kind"] == "speedup":
        return step(p["versus"]) / step(p["strategy"])
    return wl.compute_s / step(p["strategy"])


def _err(p: dict, value: float) -> float:
    """Points of scaling efficiency, or percent of the published speed-up."""
    if p["kind"] == "speedup":
        return (value / p["published"] - 1) * 100
    return (value - p["published"]) * 100


def _implied_eta(p: dict, wl: Workload, cl: Cluster) -> float | None:
    """The fraction of the link rates the subject must reach for the projection to equal the
    publication (bisection; the figure is monotone in it), or None if no fraction <= 1 does."""
    f = lambda eta: _figure(p, wl, cl, eta)[0] - p["published"]   # noqa: E731
    lo, hi = 0.01, 1.0
    sign = 1 if p["kind"] == "efficiency" else -1                  # efficiency rises with eta, speed-up falls
    if sign * f(hi) < 0 or sign * f(lo) > 0:
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if sign * f(mid) > 0 else (mid, hi)
    return (lo + hi) / 2


def published_comparison() -> list[dict]:
    """One row per :data:`PUBLISHED` figure: the projection, its error (points; percent for speed-ups),
    the naive baseline's, what limits the prediction, the source's ``role``, and ``implied_eta``: the
    fraction of its links' rates the subject would have to reach to give the published figure."""
    rows = []
    for p in PUBLISHED:
        wl, cl = _workload(p), presets.parse_cluster(p["cluster"])
        pred, mine, other = _figure(p, wl, cl)
        base = _naive(p, wl, cl)
        rows.append({**p, "role": published.SOURCES[p["source"]]["role"], "predicted": pred,
                     "error": _err(p, pred), "baseline": base, "baseline_error": _err(p, base),
                     "limiting": mine.limiting if other is None else
                     f"{p['versus']} eff {other.efficiency * 100:.0f}%, {p['strategy']} eff {mine.efficiency * 100:.0f}%",
                     "implied_eta": _implied_eta(p, wl, cl), "exposed_ms": mine.exposed_s * 1e3,
                     "step_ms": mine.step_s * 1e3})
    return rows


def _framework_pair(x: dict, y: dict) -> bool:
    """Two rows one source ran on one cluster at one precision with different frameworks
    (:mod:`hvdkit.advise.published`'s ``framework``): the advisor prices them with no framework term."""
    return bool(x.get("framework") and y.get("framework") and x["framework"] != y["framework"]
                and x["cluster"] == y["cluster"] and x.get("precision") == y.get("precision"))


def _pairs(rows: list[dict], col: str, frameworks: bool | None = None) -> tuple[int, int]:
    """(comparisons, ordered right): every published comparison of one source: two figures of one model
    and kind more than :data:`TIE` apart (which strategy, transport, network or size is faster), and each
    speed-up (is the subject faster than the system it is compared with). ``frameworks``: True, only the
    pairs of frameworks on one cluster (:func:`_framework_pair`); False, all but those; None, all."""
    total = right = 0
    for i, x in enumerate(rows):
        if x["kind"] == "speedup" and abs(x["published"] - 1) * 100 > TIE and not frameworks:
            total += 1
            right += (x[col] > 1) == (x["published"] > 1)
        for y in rows[i + 1:]:
            if (x["source"], x["model"], x["kind"]) != (y["source"], y["model"], y["kind"]):
                continue
            if frameworks is not None and _framework_pair(x, y) != frameworks:
                continue
            gap = (x["published"] - y["published"]) * 100 / (x["published"] if x["kind"] == "speedup" else 1)
            if abs(gap) <= TIE:
                continue
            total += 1
            # a prediction that cannot tell the two apart (equal figures) has not ordered them
            right += x[col] != y[col] and (x[col] > y[col]) == (gap > 0)
    return total, right


def published_summary(rows: list[dict]) -> dict:
    """Per role (``calibrate``, ``held-out``) and for the model and the naive baseline: the rows, sources,
    median and max |error| of the efficiency rows (points) and of the speed-up rows (percent), and the
    published comparisons ordered right."""
    out = {}
    for role in ("calibrate", "held-out"):
        mine = [r for r in rows if r["role"] == role]
        part = {"rows": len(mine), "sources": sorted({r["source"] for r in mine})}
        for who, col, err in (("model", "predicted", "error"), ("baseline", "baseline", "baseline_error")):
            d = {}
            for kind, unit in (("efficiency", "points"), ("speedup", "percent")):
                e = [abs(r[err]) for r in mine if r["kind"] == kind]
                d[kind] = {"rows": len(e), "unit": unit, "median_abs_error": statistics.median(e) if e else None,
                           "max_abs_error": max(e) if e else None}
            d["comparisons"], d["ordered_right"] = _pairs(mine, col)
            d["framework_comparisons"], d["framework_ordered_right"] = _pairs(mine, col, frameworks=True)
            part[who] = d
        out[role] = part
    return out


def published_by_source(rows: list[dict]) -> dict:
    """Per source: its role, whether it was ``unseen`` (:data:`hvdkit.advise.published.SOURCES`), its rows,
    and for the model and the naive baseline the median and max |error| (points for efficiencies,
    percent for speed-ups, together) and the comparisons ordered right (:func:`_pairs`)."""
    out = {}
    for key, src in published.SOURCES.items():
        mine = [r for r in rows if r["source"] == key]
        d = {"role": src["role"], "unseen": bool(src.get("unseen")), "rows": len(mine)}
        for who, col, err in (("model", "predicted", "error"), ("baseline", "baseline", "baseline_error")):
            e = [abs(r[err]) for r in mine]
            total, right = _pairs(mine, col)
            d[who] = {"median_abs_error": statistics.median(e) if e else None, "max_abs_error": max(e) if e else None,
                      "comparisons": total, "ordered_right": right}
        out[key] = d
    return out


def _pct(x):
    return "-" if x is None else f"{x * 100:+.0f}%"


def markdown(rows: list[dict], stats: dict, pub: list[dict], meta: dict) -> str:
    """The two tables (and the summary lines) as markdown."""
    out = [f"### Predicted vs measured on the emulated cluster ({meta.get('bandwidth', '?')} links, probed "
           f"{(meta.get('link_Bps') or 0) * 8 / 1e9:.2f} Gbit/s, {meta.get('cores')} shared cores, batch "
           f"{meta.get('batch_size')})", "",
           "| model | strategy | workers | measured ms | probe ms | err | fit ms | err |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        fit = "-" if r["fit_ms"] is None else f"{r['fit_ms']:.1f}" + ("" if r["fit_ranks_measured"] else "†")
        out.append(f"| {r['model']} | {r['variant']} | {r['workers']} | {r['measured_ms']:.1f} | {r['probe_ms']:.1f} | "
                   f"{_pct(r['probe_err'])} | {fit} | {_pct(r['fit_err'])} |")
    out.append("")
    for col, what in (("probe", "probe only (formulas + probed link)"), ("fit", "fitted collectives")):
        s = stats[col]
        err = {k: "-" if s[k] is None else f"{s[k] * 100:.0f}%"   # None: no such point
               for k in ("median_abs_err", "median_abs_err_ranks_le_cores", "median_abs_err_ranks_gt_cores")}
        out.append(f"- {what}: median |error| {err['median_abs_err']} over {s['points']} points "
                   f"({s['within_15pct']} within 15%): {err['median_abs_err_ranks_le_cores']} over the "
                   f"{s['points_ranks_le_cores']} with ranks <= cores, {err['median_abs_err_ranks_gt_cores']} "
                   f"over the {s['points_ranks_gt_cores']} with more ranks than cores; predicted ranking = measured "
                   f"in {s['rankings_equal']} of {s['rankings']} (model, workers) groups, the fastest in "
                   f"{s['best_equal']}; of the {s['pairs_distinct']} strategy pairs whose measured ranges do not "
                   f"overlap, {s['pairs_agree']} are ordered as measured")
    out.append("- † the collectives benchmark did not measure that rank count: the largest measured one, scaled")
    return "\n".join(out) + "\n" + markdown_published(pub)


def _fig(r: dict, v: float) -> str:
    return f"{v * 100:.1f}%" if r["kind"] == "efficiency" else f"x{v:.2f}"


def _stat(d: dict, kind: str, key: str) -> str:
    v = d[kind][key]
    return "-" if v is None else f"{v:.1f}" + (" pts" if kind == "efficiency" else "%")


def markdown_published(pub: list[dict]) -> str:
    """The published-results tables (summary per role, sources, every row, notes) as markdown."""
    summ = published_summary(pub)
    out = ["", "### Projected vs published", "",
           "Sources declared before fitting ([hvdkit/advise/published.py](../../hvdkit/advise/published.py)): "
           "the calibrating ones may fix a term of the model, the held-out ones only judge it. Efficiency errors "
           "in points of scaling efficiency, speed-up errors in percent of the published speed-up.", "",
           "| sources | rows | who | efficiency median \\|err\\| | max | speed-up median \\|err\\| | max | "
           "comparisons ordered right |",
           "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    unseen = published_summary([r for r in pub if published.SOURCES[r["source"]].get("unseen")])["held-out"]
    for role, s in (("held-out", summ["held-out"]), ("held-out, unseen only", unseen),
                    ("calibrate", summ["calibrate"])):
        if not s["rows"]:
            continue
        for who in ("model", "baseline"):
            d = s[who]
            out.append(f"| {role}: {', '.join(s['sources'])} | {s['rows']} | "
                       f"{'advise' if who == 'model' else 'naive baseline'} | {_stat(d, 'efficiency', 'median_abs_error')} | "
                       f"{_stat(d, 'efficiency', 'max_abs_error')} | {_stat(d, 'speedup', 'median_abs_error')} | "
                       f"{_stat(d, 'speedup', 'max_abs_error')} | {d['ordered_right']} of {d['comparisons']} |")
    for role, s in (("held-out", summ["held-out"]), ("held-out, unseen only", unseen)):
        m, b = s["model"], s["baseline"]
        fw, rest = m["framework_comparisons"], m["comparisons"] - m["framework_comparisons"]
        if fw:
            out += ["", f"Of the {role} comparisons, {fw} are between two frameworks a source ran on one cluster at "
                    "one precision: the advisor has no framework term, so it can order them only by their one-GPU "
                    f"speeds; advise ordered {m['framework_ordered_right']} of them right, the naive baseline "
                    f"{b['framework_ordered_right']}. The other {rest}: advise "
                    f"{m['ordered_right'] - m['framework_ordered_right']}, naive baseline "
                    f"{b['ordered_right'] - b['framework_ordered_right']}."]
    out += ["", "Per source (efficiency errors in points, speed-up errors in percent; *unseen*: declared held out, "
            "rows committed, before any prediction of them was computed; the other held-out sources had been looked "
            "at while terms were chosen):", "",
            "| source | role | rows | advise median \\|err\\| | max | comparisons ordered right | naive median "
            "\\|err\\| | max | comparisons ordered right | title |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for k, d in published_by_source(pub).items():
        m, b = d["model"], d["baseline"]
        out.append(f"| {k} | {d['role']}{', unseen' if d['unseen'] else ''} | {d['rows']} | "
                   + "".join(f"{x['median_abs_error']:.1f} | {x['max_abs_error']:.1f} | "
                             f"{x['ordered_right']} of {x['comparisons']} | " for x in (m, b))
                   + f"{published.SOURCES[k]['title']} |")
    out += ["", "| source | where | quoted | hardware | model | batch | advise row | published | predicted | err | "
            "baseline err | what limits the prediction | links needed ‡ |",
            "| --- | --- | --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in pub:
        row = r["strategy"] + (f" vs {r['versus']}" if r["kind"] == "speedup" else "") + \
            (", overlapped" if r["overlap"] else "")
        out.append(f"| {r['source']} | {r['where']} | {r['quoted']} | {r['hardware']} | {r['model']} | {r['batch']} | "
                   f"{row} on {r['cluster']} | {_fig(r, r['published'])} | {_fig(r, r['predicted'])} | "
                   f"{r['error']:+.1f} | {r['baseline_error']:+.1f} | {r['limiting']} | "
                   + ("none <= 100%" if r["implied_eta"] is None else f"{r['implied_eta'] * 100:.0f}%") + " |")
    out += ["", f"Assumptions: {ASSUMPTIONS}", "",
            "Naive baseline: compute + the busiest link's bytes / its line rate, nothing else. A comparison: two "
            f"figures of one source and model more than {TIE:.0f} points (percent) apart, or a speed-up (is the "
            "subject faster); ordered right when the prediction puts them in the published order (equal "
            "predictions do not).", "",
            "‡ the fraction of its link rates the row's subject (the strategy; for a speed-up, the system it is "
            "compared with) would have to reach for the projection to equal the publication; \"none <= 100%\": no "
            "bandwidth does, the miss is in another term (compute, overlap, the framework).", ""]
    return "\n".join(out)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command-line flags (see the module docstring); ``prog``: the name ``--help`` shows."""
    p = Parser(prog=prog, doc=__doc__)
    p.add_argument("dirs", nargs="*", metavar="DIR",
                   help="output directories of hvdkit-bench suite or training (training.json, collectives json(s), "
                        "cluster.json with the probe), or a directory of them, one per link rate; without DIR (and "
                        f"without --training) the reference set's check: the inputs {REFERENCE} names")
    p.add_argument("--training",
                   help="instead of DIR: hvdkit-bench training's training.json (on hosts or --emulated), checked in "
                        "sample against --collectives")
    p.add_argument("--collectives",
                   help="with --training: a cluster_collectives --json output (the fits of the in-sample check)")
    p.add_argument("--transport", metavar="FILE",
                   help="with DIR: a cluster-collectives --json with mpi-a2a at 3 hosts or more at the same rates "
                        "(the transport's all-to-all, the floor of a colocated PS beyond 2 hosts; no strategy, "
                        "so the held-out cells stay unseen)")
    p.add_argument("--calibration-hosts", type=int, default=2, metavar="H",
                   help="calibrate on the collectives measured at H hosts (default 2; H >= 3 sees as many hosts as "
                        "a predicted cell: the summary says held_out false)")
    p.add_argument("--at-scale", metavar="DIR",
                   help="with DIR: collectives measured at more hosts (a suite run with --collectives-apart "
                        "--collectives-np 3,4,5 --skip training,convergence, one directory per rate): each held-out "
                        "cell reads its own host count's collective instead of the 2-host extrapolation (no training "
                        "step with more than one worker is read: held_out stays true; the summary's "
                        "collectives_hosts lists the counts)")
    p.add_argument("--markdown", metavar="FILE", help="write the tables as markdown")
    p.add_argument("--json", metavar="FILE", help="write every row, the statistics and the held-out \"summary\" as JSON")
    return p


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Print the markdown tables; ``--markdown``/``--json`` write them. 0, or 2 on bad input.
    ``prog``: the command as typed (``hvdkit bench advise-check``)."""
    try:
        a = build_parser(prog).parse_args(argv)
    except UsageError as e:
        return print_error(prog, e)
    try:
        for flag, given in (("--transport", a.transport), ("--at-scale", a.at_scale)):
            if given and not a.dirs:
                raise UsageError(f"{flag} goes with DIR (the held-out check of suite or training directories)")
        if bool(a.training) != bool(a.collectives):
            raise UsageError("--training and --collectives go together (the in-sample check)")
        if a.dirs or a.training:
            md, doc = render(a.dirs, a.training or "", a.collectives or "", a.calibration_hosts, a.transport,
                             a.at_scale)
        else:
            md, doc = render_recorded(REFERENCE)
    except UsageError as e:
        print(f"hvdkit: error: {e}", file=sys.stderr)
        return 2
    print(md)
    if a.markdown:
        with open(a.markdown, "w") as fh:
            fh.write(md)
    if a.json:
        write_json(a.json, rounded(doc))
    return 0


def _resolve(path: str, json_path: str) -> str:
    """An input path a check's JSON recorded (relative to where it was run, usually the repository's
    root): as given if it exists, else under the first parent of ``json_path``'s directory that has it."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    d = os.path.dirname(os.path.abspath(json_path))
    while True:
        if os.path.exists(os.path.join(d, path)):
            return os.path.join(d, path)
        up = os.path.dirname(d)
        if up == d:
            return path
        d = up


def render_recorded(json_path: str, doc: dict | None = None) -> tuple[str, dict]:
    """:func:`render` of the inputs a committed check's JSON names (``inputs``, ``transport``,
    ``at_scale``), the document keeping its ``reference`` block (:mod:`hvdkit.bench.report.reference` indexes
    it); ``doc``: the parsed JSON (read from ``json_path`` when None).

    Raises:
        UsageError: the JSON or its inputs do not read (names the file).
    """
    if doc is None:
        try:
            with open(json_path) as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as e:
            raise UsageError(f"{json_path}: {e}; give DIR (suite or training directories) or run from a checkout "
                             "whose benchmarks/reference holds the check") from None
    ins = [_resolve(p, json_path) for p in doc["inputs"]]
    files = len(ins) == 2 and all(os.path.isfile(p) for p in ins)
    tr = _resolve(doc["transport"], json_path) if doc.get("transport") else None
    sc = _resolve(doc["at_scale"], json_path) if doc.get("at_scale") else None
    md, new = render([] if files else ins, *(ins if files else ("", "")), transport=tr, at_scale=sc)
    new["inputs"] = list(doc["inputs"])
    for key in ("transport", "at_scale"):
        if doc.get(key):
            new[key] = doc[key]
    if "reference" in doc:
        new["reference"] = doc["reference"]
    return md, new


def rounded(obj, digits: int = 6):
    """``obj`` (JSON-like: dicts, lists, numbers, strings) with every float rounded to ``digits``
    significant digits, so that regenerating ``--json`` from the same inputs gives the same bytes
    on every stack (a sum's last digits differ with summation order, build and NumPy version, and
    an error that is the difference of two close times magnifies them; six digits are more than
    the model's own accuracy)."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits) for v in obj]
    return obj


def render(dirs: list[str], training_path: str, collectives_path: str, calibration_hosts: int = 2,
           transport: str | None = None, at_scale: str | None = None) -> tuple[str, dict]:
    """``(markdown, document)``: the tables (held out, in sample, published) and the ``--json``
    document, from ``dirs`` (suite/training directories; ``transport``, ``at_scale``: the ``transport`` and
    ``scale`` of :func:`hvdkit.advise.measured.load`)
    or, without them, the two files. Runs nothing; :mod:`hvdkit.bench.report.reference` regenerates advise_check.md
    through it.

    Raises:
        UsageError: ``calibration_hosts`` < 2, an input that does not read, or a training.json
            without a probed link (names the file).
    """
    training = coll = None
    if calibration_hosts < 2:
        raise UsageError(f"--calibration-hosts {calibration_hosts}: collectives need >= 2 hosts")
    if dirs:
        meas = measured.load(dirs, transport=transport, scale=at_scale)
    else:
        docs = []
        for path in (training_path, collectives_path):
            try:
                with open(path) as fh:
                    docs.append(json.load(fh))
            except (OSError, ValueError) as e:
                raise UsageError(f"{path}: {e}") from None
        training, coll = docs
        meas = measured.load_files(training_path, collectives_path)
    rows, stats, meta = [], {}, {}
    if training is not None:
        try:
            meta = measured_points(training)[0]
            rows, stats = measured_comparison(training, fit_collectives(coll, meta.get("link_Bps")))
        except UsageError as e:
            raise UsageError(f"{training_path}: {e}") from None
    held, cal, cells = heldout.validate(meas, hosts=calibration_hosts, at_scale=bool(at_scale))
    prov = measured.provenance(meas)
    summ = heldout.summary(held, cal, cells, prov)
    pub = published_comparison()
    missed = [c for c in meas.cells if c.workers >= heldout.HELD_OUT_MIN_WORKERS and c not in cells]
    md = heldout.markdown(held, summ, cal, ", ".join(sorted(meas.links)), missed) + "\n"
    if training is not None:
        md += markdown(rows, stats, pub, meta)
    else:
        md += markdown_published(pub)
    return md, {"summary": summ, "held_out": held, "measured": rows, "stats": stats, "published": pub,
                "published_summary": published_summary(pub), "published_by_source": published_by_source(pub),
                "published_sources": published.SOURCES,
                "assumptions": ASSUMPTIONS, "inputs": list(dirs) or [training_path, collectives_path],
                **({"transport": transport} if transport else {}), **({"at_scale": at_scale} if at_scale else {}),
                "calibration": sorted(list(u) for u in cal.used)}

if __name__ == "__main__":
    sys.exit(main())

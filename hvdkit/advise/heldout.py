"""Held-out validation of ``hvdkit advise``: calibrate on micro-measurements, predict whole steps elsewhere.

The way the published predictors are validated (Proteus, TPDS 2024; Calculon, SC'23; vTrain; Echo):
the model sees only micro-measurements, here the collectives benchmark at 2 hosts (one rank per
host) and one worker's step (the 1-worker training cells: the compute per model, and each variant's
own overhead on one worker), and predicts the held-out configurations (3 and more workers, every
model, variant and rate measured) that it never saw. :func:`validate` returns one row per
predicted cell and :func:`summary` the figures docs/advise.md lists, beside those of a naive baseline
(:func:`baseline_step`: compute + the busiest link's bytes / the probed rate), so the model's
value is visible.
"""
from __future__ import annotations

import statistics
from typing import Sequence

from hvdkit import costs
from hvdkit.advise.calibrate import Calibration, calibrate, held_out
from hvdkit.advise.measured import Cell, Measured
from hvdkit.advise.predict import COMPUTE_ROWS, priced
from hvdkit.strategies.variants import parse_variant

__all__ = ["split", "baseline_step", "validate", "summary", "markdown", "HELD_OUT_MIN_WORKERS"]

#: the smallest worker count predicted (the calibration stops at 2 hosts and 1 worker)
HELD_OUT_MIN_WORKERS = 3


def split(meas: Measured, min_workers: int = HELD_OUT_MIN_WORKERS, hosts: int = 2,
          at_scale: bool = False) -> tuple[Calibration, list[Cell]]:
    """(the calibration on the micro-measurements: collectives at ``hosts`` hosts (``at_scale``: and at
    every host count measured, :func:`~hvdkit.advise.calibrate.calibrate`) and the one-worker cells, the
    held-out cells: ``workers >= min_workers``)."""
    return calibrate(meas, hosts=hosts, at_scale=at_scale), [c for c in meas.cells if c.workers >= min_workers]


def _compute_s(meas: Measured, model: str, rate: str) -> float | None:
    """The naive compute: the model's 1-worker horovod step (:data:`~hvdkit.advise.predict.COMPUTE_ROWS`, the
    first form measured; at ``rate``, else any), else its fastest 1-worker step."""
    ones = [c for c in meas.cells if c.model == model and c.workers == 1]
    hvd = next(([c for c in ones if c.variant == v] for v in COMPUTE_ROWS if any(c.variant == v for c in ones)), [])
    for pick in ([c for c in hvd if c.rate == rate], hvd, ones):
        if pick:
            return min(c.step_ms for c in pick) / 1e3
    return None


def baseline_step(variant: str, nbytes: float, workers: int, link_Bps: float, compute_s: float) -> float:
    """The naive predictor: ``compute + the busiest link's bytes / the probed rate`` (seconds).

    The bytes are those of the variant row's traffic formula (:mod:`hvdkit.costs`; docs/performance.md,
    ring allreduce and parameter server; fp16 on the wire halves S) with no latency, no CPU and no
    overlap; asynchronous rows as if synchronous.
    """
    v = parse_variant(variant)
    s = nbytes * priced(v, workers).wire_fraction
    if v.traffic == "ps_time":
        return compute_s + costs.ps_time(s, workers, v.servers(workers), link_Bps)
    if v.traffic == "colocated_ps_time":
        return compute_s + costs.colocated_ps_time(s, workers, link_Bps)
    return compute_s + costs.ring_allreduce_time(s, workers, link_Bps)


def validate(meas: Measured, min_workers: int = HELD_OUT_MIN_WORKERS,
             hosts: int = 2, at_scale: bool = False) -> tuple[list[dict], Calibration, list[Cell]]:
    """``(rows, calibration, held-out cells)``: one row per held-out cell the model predicts.

    Each row: ``model``, ``variant``, ``workers``, ``rate``, ``measured_ms`` (median), ``min_ms``,
    ``max_ms``, ``rounds``, ``predicted_ms``, ``error`` (predicted / measured - 1), ``inside`` (min <=
    predicted <= max), ``baseline_ms``, ``baseline_error``, ``limiting`` (the largest term), ``terms``
    (ms each).
    """
    cal, cells = split(meas, min_workers, hosts, at_scale)
    rows = []
    for c in sorted(cells, key=lambda c: (c.rate, c.model, c.workers, c.variant)):
        p = cal.predict(c.model, c.variant, c.workers, c.rate, c.gradient_bytes, meas.batch_size,
                        max(1, -(-c.ranks // c.hosts)) if c.hosts else 1)
        comp = _compute_s(meas, c.model, c.rate)
        if p is None or comp is None:
            continue
        base = baseline_step(c.variant, c.gradient_bytes, c.workers, c.link_Bps or meas.links[c.rate].link_Bps,
                             comp) * 1e3
        pred = p.step_s * 1e3
        rows.append({"model": c.model, "variant": c.variant, "workers": c.workers, "rate": c.rate,
                     "measured_ms": c.step_ms, "min_ms": c.min_ms, "max_ms": c.max_ms, "rounds": c.rounds,
                     "predicted_ms": pred, "error": pred / c.step_ms - 1, "inside": c.min_ms <= pred <= c.max_ms,
                     "baseline_ms": base, "baseline_error": base / c.step_ms - 1, "limiting": p.limiting,
                     "terms": {k: v * 1e3 for k, v in p.terms.items()}})
    return rows, cal, [c for c in cells if any((r["model"], r["variant"], r["workers"], r["rate"]) == c.key
                                               for r in rows)]


def _figures(rows: Sequence[dict], col: str) -> dict:
    """median/max |error| of ``col`` (``predicted`` or ``baseline``), and per (model, workers, rate) group
    of >= 2 variants: its order of the variants equals the measured one (``ranking_exact``), its fastest
    is the measured fastest (``fastest_right``); and the same read within the measured spread, where two
    variants whose measured [min-max] ranges overlap have no measured order: every pair that does have one
    is ordered as measured (``ranking_as_measured``), the predicted fastest's range overlaps the measured
    fastest's (``fastest_as_measured``: it is not measurably slower). Two equal predictions order
    nothing: such a pair is not ordered as measured, such a group's ranking is not exact, and where the
    predicted fastest is a tie, it is right only within the spread, and only if every tied variant is."""
    errs = [abs(r[f"{col}_ms"] / r["measured_ms"] - 1) for r in rows]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["model"], r["workers"], r["rate"]), []).append(r)
    exact = fastest = n = distinct = agree = as_measured = fastest_tied = 0
    for grp in groups.values():
        if len(grp) < 2:
            continue
        n += 1
        wrong = 0
        for i, x in enumerate(grp):   # pairs whose measured ranges do not overlap: an order beyond the noise
            for y in grp[i + 1:]:
                if _apart(x, y):
                    distinct += 1
                    xm, ym, xp, yp = x["measured_ms"], y["measured_ms"], x[f"{col}_ms"], y[f"{col}_ms"]
                    right = (xm < ym and xp < yp) or (ym < xm and yp < xp)   # a predicted tie orders nothing
                    agree += right
                    wrong += not right
        by_meas, by_pred = sorted(grp, key=lambda r: r["measured_ms"]), sorted(grp, key=lambda r: r[f"{col}_ms"])
        untied = len({r[f"{col}_ms"] for r in grp}) == len(grp)
        first = [r for r in grp if r[f"{col}_ms"] == by_pred[0][f"{col}_ms"]]   # the predicted fastest (ties: all)
        exact += untied and [r["variant"] for r in by_meas] == [r["variant"] for r in by_pred]
        fastest += len(first) == 1 and by_meas[0]["variant"] == first[0]["variant"]
        as_measured += wrong == 0
        fastest_tied += all(not _apart(by_meas[0], r) for r in first)
    return {"median_abs_error": statistics.median(errs) if errs else None, "max_abs_error": max(errs) if errs else None,
            "groups": n, "ranking_exact": exact, "fastest_right": fastest, "pairs_distinct": distinct,
            "pairs_agree": agree, "ranking_as_measured": as_measured, "fastest_as_measured": fastest_tied}


def _apart(x: dict, y: dict) -> bool:
    """True when two rows' measured [min-max] ranges do not overlap: the measurement orders them."""
    return x["max_ms"] < y["min_ms"] or y["max_ms"] < x["min_ms"]


def summary(rows: Sequence[dict], cal: Calibration, predicted: Sequence[Cell], prov: dict | None = None) -> dict:
    """The ``"summary"`` object of ``advise-check --json`` (docs/advise.md): ``held_out`` (no predicted
    configuration was used for calibration, :func:`hvdkit.advise.calibrate.held_out`),
    ``median_abs_error`` and ``max_abs_error`` (fractions), ``groups``, ``ranking_exact``,
    ``fastest_right``, ``inside_range`` (share of predictions within the measured min-max), ``points``,
    ``pairs_distinct`` / ``pairs_agree`` (strategy pairs of a group whose measured ranges do not overlap /
    of those, the ones ordered as measured), ``ranking_as_measured`` / ``fastest_as_measured`` (groups
    right within the measured spread: :func:`_figures`), ``baseline`` (the same figures of
    :func:`baseline_step`), ``one_boot`` and ``boots`` (``prov``, :func:`hvdkit.advise.measured.provenance`;
    None and {} without it), and ``collectives_hosts``: the rank counts of the collectives the calibration
    read (``[2]``; more with ``at_scale``)."""
    model, base = _figures(rows, "predicted"), _figures(rows, "baseline")
    return {"held_out": bool(rows) and held_out(cal, predicted), "one_boot": (prov or {}).get("one_boot"),
            "collectives_hosts": _collective_hosts(cal),
            "boots": (prov or {}).get("boots", {}), **model,
            "inside_range": sum(r["inside"] for r in rows) / len(rows) if rows else None, "points": len(rows),
            "baseline": {k: base[k] for k in ("median_abs_error", "max_abs_error", "ranking_exact", "fastest_right",
                                              "pairs_agree", "ranking_as_measured", "fastest_as_measured")}}


def _collective_hosts(cal: Calibration) -> list[int]:
    """The rank counts of the collectives ``cal`` read (one rank per host: the hosts)."""
    return sorted({u[3] for u in cal.used if u[0] == "collectives"})


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


#: the issue's targets (held out, fair hosts)
TARGETS = {"median_abs_error": 0.10, "max_abs_error": 0.25}


def _transport(cal: Calibration) -> dict:
    """``{rate: [hosts, ...]}`` of the transport measurements the calibration used."""
    out: dict = {}
    for u in sorted(cal.used):
        if u[0] == "transport" and u[1] in cal.a2a_frac:
            out.setdefault(u[1], []).append(u[3])
    return out


def _boot_line(one: bool | None, boots: dict) -> str:
    """The markdown's line on where the measurements ran (:func:`hvdkit.advise.measured.provenance`)."""
    if one:
        line = ("Machine: the collectives and the training cells (one-worker and held out) were measured "
                "in one boot of one machine (one boot id)")
        judged = set(boots.get("training", [])) | set(boots.get("collectives", []))
        if "transport" in boots and set(boots["transport"]) != judged:
            line += "; the transport's all-to-all file was not (another boot, or none recorded)"
        return line + "."
    if one is False:
        return ("Machine: NOT one: the documents recorded different boot ids, so the calibration may describe "
                "another machine's speed than the held-out cells ran at; re-measure both in one run "
                "(hvdkit-bench suite --collectives-apart) before reading the errors as the model's.")
    if "real hosts" in boots:
        return ("Machine: real hosts, each booted apart: the documents' boot ids (the driver's, a rank 0's) "
                "cannot say whether the hosts changed between the calibration and the cells.")
    some = any(i for kind in ("training", "collectives") for i in boots.get(kind, []))
    return ("Machine: not recorded " + ("for every document (some were written before boot ids were)" if some else
                                        "(documents written before boot ids were)")
            + ": whether the calibration and the held-out cells ran on one machine is unknown.")


def markdown(rows: Sequence[dict], summ: dict, cal: Calibration, title: str = "",
             missed: Sequence[Cell] = ()) -> str:
    """The held-out table, its groups' rankings and the summary against the targets, as markdown;
    ``missed``: held-out cells without a prediction (listed)."""
    used_c = sorted({(u[1], u[2], u[3]) for u in cal.used if u[0] == "collectives" and u[3] == cal.hosts})
    scale = sorted({(u[1], u[2], u[3]) for u in cal.used if u[0] == "collectives" and u[3] != cal.hosts})
    used_t = sorted({(u[1], u[2], u[4]) for u in cal.used if u[0] == "cell"})
    out = [f"### Held-out validation{': ' + title if title else ''}", "",
           f"Calibrated on: the collectives at {cal.hosts} hosts ({', '.join(f'{m} {r}' for r, m, _ in used_c) or 'none'})"
           + (f"; at scale (read by a held-out synchronous cell of that rank count, one rank per host): "
              f"{', '.join(f'{m} {r} at {n}' for r, m, n in scale)}" if scale else "")
           + f" and {len(used_t)} one-worker training cells"
           + "".join(f"; the transport's all-to-all at {r} (mpi-a2a at {', '.join(str(h) for h in hs)} hosts, no PS "
                     f"and no training: {cal.a2a_frac[r]:.2f} of the ring pattern's rate)"
                     for r, hs in sorted(_transport(cal).items()))
           + f"; predicted: {len(rows)} cells with >= "
           f"{HELD_OUT_MIN_WORKERS} workers (held_out = {str(summ['held_out']).lower()}: "
           + ("none of them seen" if summ["held_out"] else "NOT held out, the calibration saw as many hosts") + ").", "",
           _boot_line(summ.get("one_boot"), summ.get("boots") or {}), "",
           "| rate | model | workers | strategy | measured ms [min-max] | predicted ms | err | inside | baseline ms | "
           "err | limiting |", "| --- | --- | ---: | --- | ---: | ---: | ---: | :---: | ---: | ---: | --- |"]
    for r in rows:
        out.append(f"| {r['rate']} | {r['model']} | {r['workers']} | {r['variant']} | {r['measured_ms']:.1f} "
                   f"[{r['min_ms']:.1f}-{r['max_ms']:.1f}] | {r['predicted_ms']:.1f} | {r['error'] * 100:+.0f}% | "
                   f"{'yes' if r['inside'] else 'no'} | {r['baseline_ms']:.1f} | {r['baseline_error'] * 100:+.0f}% | "
                   f"{r['limiting']} |")
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["rate"], r["model"], r["workers"]), []).append(r)
    out += ["", "| rate | model | workers | measured order (fastest first) | predicted | baseline |",
            "| --- | --- | ---: | --- | --- | --- |"]
    for (rate, model, w), grp in sorted(groups.items()):
        if len(grp) < 2:
            continue
        order = lambda col: ", ".join(r["variant"] for r in sorted(grp, key=lambda r: r[col]))   # noqa: E731
        meas = order("measured_ms")
        mark = lambda col: order(col) + (" (=)" if order(col) == meas else "")   # noqa: E731
        out.append(f"| {rate} | {model} | {w} | {meas} | {mark('predicted_ms')} | {mark('baseline_ms')} |")
    b = summ["baseline"]
    out += ["", f"- model: median |error| {_pct(summ['median_abs_error'])} (target <= 10%), max "
                f"{_pct(summ['max_abs_error'])} (target <= 25%) over {summ['points']} cells; "
                f"{_pct(summ['inside_range'])} inside the measured range; ranking exact in "
                f"{summ['ranking_exact']} of {summ['groups']} (model, workers, rate) groups, the fastest right in "
                f"{summ['fastest_right']}; of the {summ['pairs_distinct']} strategy pairs whose measured ranges do "
                f"not overlap, {summ['pairs_agree']} ordered as measured; within the measured spread (a pair "
                f"whose ranges overlap has no measured order) the ranking is right in "
                f"{summ['ranking_as_measured']} of {summ['groups']}, the fastest in {summ['fastest_as_measured']}",
            f"- naive baseline (compute + busiest link's bytes / probed rate): median |error| "
            f"{_pct(b['median_abs_error'])}, max {_pct(b['max_abs_error'])}; ranking exact in {b['ranking_exact']}, "
            f"the fastest right in {b['fastest_right']}; {b['pairs_agree']} of the {summ['pairs_distinct']} "
            f"distinct pairs ordered as measured; within the measured spread, ranking right in "
            f"{b['ranking_as_measured']}, the fastest in {b['fastest_as_measured']}"]
    for note in cal.notes:
        out.append(f"- calibration: {note}")
    if missed:
        out.append("- not predicted (no one-worker cell of the model, no collective of the method at "
                   f"{cal.hosts} hosts, or no formula): " + ", ".join(f"{c.model}/{c.variant}/{c.workers}w/{c.rate}"
                                                                    for c in missed))
    return "\n".join(out + [""])

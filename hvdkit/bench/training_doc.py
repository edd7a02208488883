"""The training benchmark's grid and its document, training.json: the cells of the grid and the jobs
still to run (which cells fit the place, the ABBA order of the rounds, what ``--resume`` keeps of an
earlier document), the summary of the rows (per cell, median and min-max over the OK rounds, scaling
efficiency), the stdout table's cells, and the one line saying why nothing was measured. Pure (no
job, no place); the benchmark itself: :mod:`hvdkit.bench.training`.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from hvdkit.bench._common import fmt
from hvdkit.bench.jobs import Cell, Settings
from hvdkit.errors import UsageError

__all__ = ["expand_grid", "split_fits", "schedule", "skip_ident", "row_key", "STATS", "COLUMNS", "CONV_COLUMNS",
           "summarize", "table_cells", "load_done", "nothing_measured", "settings_dict"]


def expand_grid(variants: Sequence, models: Sequence[str], workers: Sequence[int],
                stragglers: Sequence[str]) -> list[Cell]:
    """Every cell of the grid in the fixed order of a round: stragglers, then workers, then
    models, then variants (innermost), each in the order given. Duplicate variants (same
    label) appear once."""
    seen: dict[str, Any] = {}
    for v in variants:
        seen.setdefault(v.label, v)
    return [Cell(v, m, w, s) for s in stragglers for w in workers for m in models for v in seen.values()]


def split_fits(cells: Iterable[Cell], slots: int, fits=None) -> tuple[list[Cell], list[dict]]:
    """(cells that can run, skipped entries) on a place with ``slots`` slots: a cell needing more
    ranks is skipped (``reason``: "needs R slots, the hosts have S"), as is a straggler cell whose
    straggler rank is not a worker rank of that job (workers are ranks 0..W-1).

    Args:
        fits: the place's ``fits(ranks)`` (default: ranks <= slots).
    """
    fits = fits or (lambda r: r <= slots)
    ok, skipped = [], []
    for c in cells:
        reason = None
        if not fits(c.ranks):
            reason = f"needs {c.ranks} slots, the hosts have {slots}"
        elif c.straggler != "none" and int(c.straggler.split(":")[0]) >= c.workers:
            reason = f"straggler rank {c.straggler.split(':')[0]} is not one of the {c.workers} worker rank(s)"
        if reason:
            skipped.append({**skip_ident(c), "reason": reason})
        else:
            ok.append(c)
    return ok, skipped


def skip_ident(c: Cell) -> dict:
    i = c.ident()
    return {k: i[k] for k in ("variant", "model", "workers", "ranks", "straggler")}


def row_key(r: dict) -> tuple:
    return (r["variant"], r["model"], r["workers"], r["straggler"], r["round"])


def schedule(cells: Sequence[Cell], rounds: int, done: Iterable[tuple] = ()) -> list[tuple[Cell, int]]:
    """The jobs to run, round by round: every cell once per round, in ``cells``' order in even rounds
    and in the reverse order in odd ones (ABBA), then the next round; a (cell key, round) in ``done``
    (``Cell.key + (round,)``) is left out."""
    done = set(done)
    return [(c, r) for r in range(rounds) for c in (cells if r % 2 == 0 else cells[::-1])
            if c.key + (r,) not in done]


#: the statistics of a summary entry, each {"median", "min", "max"} over the cell's OK rounds
STATS = ("samples_per_s", "step_ms", "timed_s", "compute_ms", "comm_ms", "wait_ms", "data_ms", "utilisation",
         "model_busy", "time_to_target_s", "samples_to_target", "final_accuracy", "staleness_mean")


def settings_dict(s: Settings) -> dict:
    d = dict(s.__dict__)
    d["train_args"] = list(s.train_args)
    return d


def load_done(doc: dict | None, measure: str, s: Settings,
              env: dict[str, str] | None = None) -> tuple[list[dict], list[dict]]:
    """From an earlier training.json: (its OK rows of ``measure``, which ``--resume`` keeps; its rows of
    the other measure, kept untouched). FAILED rows are dropped, so their jobs run again.

    Args:
        env: this run's ``HVDKIT_*`` settings (:func:`hvdkit.config.env_settings`); None: not
            compared. A file that did not record them is not compared either.

    Raises:
        UsageError: its ``measure`` rows were measured with other settings (batch, steps, ...) or
            other ``HVDKIT_*`` settings.
    """
    if not doc:
        return [], []
    rows = doc.get("rows") or []
    mine = [r for r in rows if r.get("measure", "throughput") == measure]
    other = [r for r in rows if r.get("measure", "throughput") != measure]
    before = ((doc.get("meta") or {}).get("measures") or {}).get(measure)
    if mine and before is not None:
        now = settings_dict(s)
        diff = [k for k in now if k in before and before[k] != now[k]]
        if diff:
            k = diff[0]
            raise UsageError(f"--resume: the {measure} rows there were measured with {k}={before[k]!r}, this run "
                             f"asks {k}={now[k]!r}; give the same flags, or a new --out-dir")
        old = before.get("hvdkit_env")
        if env is not None and old is not None and old != env:
            k = next(k for k in sorted(set(old) | set(env)) if old.get(k) != env.get(k))
            was = f"{k}={old[k]}" if k in old else f"{k} unset"
            now_ = f"{k}={env[k]}" if k in env else f"{k} unset"
            raise UsageError(f"--resume: the {measure} rows there were measured with {was}, this run has {now_}; "
                             "set the same HVDKIT_* variables, or give a new --out-dir")
    return [r for r in mine if r.get("status") == "OK"], other


def _stat(values: Iterable[Any]) -> dict | None:
    v = [float(x) for x in values if x is not None]
    if not v:
        return None
    return {"median": float(np.median(v)), "min": min(v), "max": max(v)}


def summarize(rows: Sequence[dict], cells: Sequence[Cell] | None = None) -> list[dict]:
    """training.json's ``summary``: as every benchmark's ``summarize``, the document's rows grouped, each
    figure's median with its min and max. One entry per cell (variant, model, workers, straggler,
    measure) with rows: ``n`` OK rounds, ``failed`` rounds, status ``OK`` (no round failed) or
    ``FAILED``, and {"median", "min", "max"} over the OK rounds of every figure of :data:`STATS`
    (None where no OK round has it), plus ``efficiency`` (module docstring). Ordered as ``cells``
    (then first appearance)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r.get("measure", "throughput"), r["variant"], r["model"], r["workers"], r["straggler"]),
                          []).append(r)
    out = []
    for (measure, variant, model, w, strag), rs in groups.items():
        ok = [r for r in rs if r["status"] == "OK"]
        r0 = rs[0]
        s = {"measure": measure, "variant": variant, "strategy": r0["strategy"], "layout": r0["layout"],
             "model": model, "workers": w, "ranks": r0["ranks"], "servers": r0.get("servers", 0), "straggler": strag,
             "n": len(ok), "failed": len(rs) - len(ok), "status": "OK" if len(ok) == len(rs) else "FAILED"}
        for k in STATS:
            s[k] = _stat(r.get(k) for r in ok)
        s["gradient_bytes"] = ok[0]["gradient_bytes"] if ok else None
        s["link_bytes_per_step"] = ok[0]["link_bytes_per_step"] if ok else None
        mx = [r["staleness_max"] for r in ok if r.get("staleness_max") is not None]
        s["staleness_max"] = max(mx) if mx else None
        if measure == "convergence":
            s["reached"] = f"{sum(1 for r in ok if r.get('time_to_target_s') is not None)}/{len(ok)}"
        out.append(s)
    base = {(s["measure"], s["variant"], s["model"]): s for s in out
            if s["workers"] == 1 and s["straggler"] == "none"}
    for s in out:
        b = base.get((s["measure"], s["variant"], s["model"]))
        n, x = s["workers"], s["samples_per_s"]
        s["efficiency_base"] = s["efficiency_note"] = None
        if x is None:
            s["efficiency"] = None
            s["efficiency_note"] = "n/a: no OK round"
            continue
        if b is None or b["samples_per_s"] is None:
            s["efficiency"] = None
            s["efficiency_note"] = (f"n/a: the baseline, {s['variant']} {s['model']} at 1 worker without a straggler, "
                                    + ("had no OK round" if b is not None else "was not measured (add 1 to --workers"
                                       + (" and none to --stragglers)" if s["straggler"] != "none" else ")")))
            continue
        y = b["samples_per_s"]
        s["efficiency_base"] = "1 worker, no straggler"
        s["efficiency"] = {"median": x["median"] / (n * y["median"]), "min": x["min"] / (n * y["max"]),
                           "max": x["max"] / (n * y["min"])}
    order = {c.key: i for i, c in enumerate(cells or ())}
    return sorted(out, key=lambda s: (s["measure"], order.get((s["variant"], s["model"], s["workers"],
                                                               s["straggler"]), len(order))))


COLUMNS = (("variant", "variant", ""), ("model", "model", ""), ("workers", "workers", ""), ("ranks", "ranks", ""),
           ("straggler", "straggler", "(rank:x)"), ("n", "n", "(rounds)"), ("sps", "samples/s", "(median)"),
           ("sps_range", "range", "(min-max)"), ("eff", "eff", "(median)"), ("eff_range", "range", "(min-max)"),
           ("step", "step", "(ms)"), ("compute", "compute", "(ms)"), ("comm", "comm", "(ms)"), ("wait", "wait", "(ms)"),
           ("data", "data", "(ms)"), ("util", "link_util", "(ratio)"), ("status", "status", ""))


CONV_COLUMNS = (("final", "final_acc", "(median)"), ("t_target", "t_target", "(s)"),
                ("samples_target", "samples", "(to_target)"), ("reached", "reached", "(rounds)"),
                ("stale_mean", "stale_mean", "(updates)"), ("stale_max", "stale_max", "(updates)"))


def _med(s: dict, k: str, digits: int) -> str:
    return fmt(s[k]["median"] if s.get(k) else None, digits)


def _range(s: dict, k: str, digits: int) -> str:
    x = s.get(k)
    return f"{x['min']:.{digits}f}-{x['max']:.{digits}f}" if x else "-"


def table_cells(s: dict) -> dict[str, str]:
    """One summary entry as the stdout table's formatted cells (:func:`hvdkit.bench._common.fmt`)."""
    c = {k: fmt(s.get(k)) for k in ("variant", "model", "workers", "ranks", "straggler", "n", "status")}
    c.update(sps=_med(s, "samples_per_s", 1), sps_range=_range(s, "samples_per_s", 1), eff=_med(s, "efficiency", 3),
             eff_range=_range(s, "efficiency", 3), step=_med(s, "step_ms", 2), compute=_med(s, "compute_ms", 2),
             comm=_med(s, "comm_ms", 2), wait=_med(s, "wait_ms", 2), data=_med(s, "data_ms", 2),
             util=_med(s, "utilisation", 3), final=_med(s, "final_accuracy", 3), t_target=_med(s, "time_to_target_s", 2),
             samples_target=_med(s, "samples_to_target", 0), reached=fmt(s.get("reached")),
             stale_mean=_med(s, "staleness_mean", 2), stale_max=fmt(s.get("staleness_max")))
    return c


def nothing_measured(doc: dict, measure: str) -> str | None:
    """One line saying why a training.json document has no OK row of ``measure`` (every cell
    skipped, every job failed, the jobs not started within ``--budget``), or None when it has one."""
    rows = [r for r in doc.get("rows") or [] if r.get("measure", "throughput") == measure]
    if any(r.get("status") == "OK" for r in rows):
        return None
    skipped = [x for x in doc.get("skipped") or [] if x.get("measure", "throughput") == measure]
    late = sum(len(x.get("rounds") or []) for x in skipped if str(x.get("reason")).startswith("not run:"))
    reasons = list(dict.fromkeys(x["reason"] for x in skipped if not str(x.get("reason")).startswith("not run:")))
    why = []
    if rows:
        why.append(f"all {len(rows)} jobs failed (the first: {str(rows[0].get('error'))[:200]})")
    if reasons:
        why.append(("every cell was skipped" if not rows and not late else "cells skipped") + " ("
                   + "; ".join(reasons[:3]) + ("; ..." if len(reasons) > 3 else "") + ")")
    if late:
        why.append(f"{late} jobs not started (over --budget)")
    return "nothing was measured: " + ("; ".join(why) or "no job ran")

"""The report's sections, each a list of :mod:`~hvdkit.bench.report.document` blocks built from
``training.json`` (CONTRACTS.md section 3) and, where given, the collectives benchmark's JSON.

Every figure of a cell is ``median [min-max]`` over the cell's OK rounds, as the training
benchmark summarised them; nothing here re-measures or re-summarises.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from hvdkit.advise import training as advised
from hvdkit.cells import cell_key, measure_of, measured_cells, primary_measure, stat
from hvdkit.bench.report.decide import (MIN_ROUNDS, Decision, comparable_workers, decide, interval_text,
                                        no_decision)
from hvdkit.bench.report.document import Bullets, Heading, Paragraph, Table
from hvdkit.bench.report.figures import human_bytes

__all__ = ["causes", "decisions", "cluster_section", "throughput_section", "scaling_section", "split_section",
           "convergence_section", "projection_section", "recommendation_section", "failures_section",
           "collectives_section", "method_section", "env_text", "pct"]


def pct(x: float | None) -> str:
    """``0.123`` -> ``"+12%"``; None -> ``"-"``."""
    if x is None:
        return "-"
    v = round(x * 100)
    return f"{v:+d}%" if v else "0%"


def _stragglers(doc: Mapping) -> bool:
    return any(s.get("straggler", "none") != "none" for s in doc.get("summary", []))


def _skipped(doc: Mapping) -> list[dict]:
    """The skipped entries, each with a measure (the primary one where the entry names none)."""
    primary = primary_measure(doc)
    return [{**sk, "measure": sk.get("measure") or primary, "straggler": sk.get("straggler", "none")}
            for sk in doc.get("skipped", [])]


_CONVERGENCE = ("time_to_target_s", "staleness_mean")


def causes(doc: Mapping) -> dict[tuple, str]:
    """``{cell_key: cause}``: the error of each cell's first FAILED round (the job runner's text, e.g.
    ``out of memory (cgroup limit ...)``), for every cell with one."""
    out: dict[tuple, str] = {}
    for r in sorted(doc.get("rows", []), key=lambda r: r.get("round", 0)):
        if r.get("status") != "OK" and r.get("error"):
            out.setdefault(cell_key(r), str(r["error"]))
    return out


def decisions(doc: Mapping, preds: Sequence[dict] = ()) -> list[tuple[Decision, list[str]]]:
    """Per (model, straggler) of the primary measure, at the largest worker count at which every
    variant run there has a successful cell (:func:`~hvdkit.bench.report.decide.comparable_workers`;
    the failed cells above it go to the decision): (the :func:`~hvdkit.bench.report.decide.decide`
    outcome, or :func:`~hvdkit.bench.report.decide.no_decision` where no worker count has, the variants
    of the model not measured there, each with its status and cause). A cell without time to target or
    staleness takes them from the convergence cell of the same variant, model, workers and straggler,
    where one was measured."""
    primary = primary_measure(doc)
    cells = [s for s in doc.get("summary", []) if measure_of(s) == primary]
    conv = {cell_key(c)[1:]: c for c in measured_cells(doc, "convergence")}
    pred = {cell_key(p["cell"]): p["predicted_sps"] for p in preds}
    rows = [r for r in doc.get("rows", []) if measure_of(r) == primary]
    why = causes(doc)
    out = []
    for model, strag in dict.fromkeys((c["model"], c.get("straggler", "none")) for c in cells):
        group = [c for c in cells if c["model"] == model and c.get("straggler", "none") == strag]
        w, above = comparable_workers(group)
        failed = [(int(c["workers"]), c["variant"], why.get(cell_key(c), "")) for c in above]
        if w is None:
            out.append((no_decision(model, strag, failed), []))
            continue
        here = []
        for c in (c for c in group if int(c["workers"]) == w):
            other = conv.get(cell_key(c)[1:], {})
            extra = {k: other[k] for k in _CONVERGENCE if stat(c, k) is None and stat(other, k) is not None}
            if extra:
                extra["convergence_rounds"] = other.get("n")
            here.append({**c, **extra})
        d = decide(here, {c["variant"]: pred.get(cell_key(c)) for c in here}, doc.get("target_accuracy"), failed)
        skipped = [s for s in _skipped(doc) if s["measure"] == primary and s["model"] == model]
        variants = dict.fromkeys([s["variant"] for s in doc.get("summary", []) if s["model"] == model
                                  and measure_of(s) == primary] + [s["variant"] for s in skipped])
        missing = []
        for v in variants:
            if any(c["variant"] == v for c in here):
                continue
            sk = next((s for s in skipped if s["variant"] == v and int(s["workers"]) == w
                       and s["straggler"] == strag), None)
            if sk:
                missing.append(f"{v} (SKIPPED: {sk.get('reason', '?')})")
                continue
            err = next((r.get("error") for r in rows if r["model"] == model and r["variant"] == v
                        and int(r["workers"]) == w and r.get("status") != "OK" and r.get("error")), None)
            missing.append(f"{v} (FAILED: {err})" if err else f"{v} (not run at {w} workers)")
        out.append((d, missing))
    return out


def recommendation_section(doc: Mapping, preds: Sequence[dict] = ()) -> list:
    """The recommendation per model (and straggler condition) with its reasons, at the worker count
    :func:`decisions` compares."""
    blocks: list = [Heading("Recommendation"),
                    Paragraph("One variant is recommended only when its samples/s interval (min-max over rounds) "
                              "does not overlap the runner-up's; otherwise every variant within the noise is named. "
                              f"It rests on cells of at least {MIN_ROUNDS} rounds, at the most workers at which every "
                              "variant run there succeeded.", "note")]
    ds = decisions(doc, preds)
    if not ds:
        return blocks + [Paragraph("No cell was measured: nothing to recommend (see the failed and skipped cells).")]
    strag = _stragglers(doc)
    for d, missing in ds:
        where = d.model if d.kind == "failed" else f"{d.model} at {d.workers} worker{'s' * (d.workers > 1)}"
        where += f", straggler {d.straggler}" if strag else ""
        blocks.append(Heading(where, 3))
        blocks.append(Paragraph(f"**Recommended: {d.headline}**" if d.decided else f"**{d.headline}**",
                                "verdict" if d.decided else "verdict noise"))   # noise, too few rounds, failures
        reasons = list(d.reasons)
        if missing:
            reasons.append(f"not compared (not measured at {d.workers} workers): " + "; ".join(missing))
        blocks.append(Bullets(reasons))
    return blocks


def _gbit(bps) -> str:
    return "-" if bps is None else f"{float(bps) / 1e9:.3g}"


def cluster_section(doc: Mapping) -> list:
    """The place: kind, hosts with slots and GPUs, the distinct hosts the OK rows' ranks ran on
    (``rank_hosts``), each probed link's rate and round trip."""
    place = doc.get("place") or {}
    hosts = place.get("hosts") or []
    slots = sum(int(h.get("slots") or 0) for h in hosts)
    known = [int(h["gpus"]) for h in hosts if h.get("gpus") is not None]
    gpus = f"{sum(known)} GPUs" if known else "GPUs not counted"
    cores = advised.cores_of(doc)
    blocks: list = [Heading("The cluster"),
                    Paragraph(f"Place **{place.get('kind', '?')}**: {len(hosts)} host{'s' * (len(hosts) != 1)}, "
                              f"{slots} slots, {gpus}"
                              + (f"; the machine that ran the benchmark has {cores} cores" if cores else "") + ".")]
    if hosts:
        blocks.append(Table(["host", "slots", "GPUs"], [[h.get("name", "?"), str(h.get("slots", "-")),
                                                         "-" if h.get("gpus") is None else str(h["gpus"])]
                                                        for h in hosts], "lrr"))
    ran = list(dict.fromkeys(h for r in doc.get("rows", []) if r.get("status") == "OK"
                             for h in r.get("rank_hosts") or [] if h))
    if ran:
        blocks.append(Paragraph(f"The successful jobs' ranks ran on {len(ran)} distinct host"
                                f"{'s' * (len(ran) != 1)} ({', '.join(ran)}; every rank of results.json, "
                                "dedicated parameter servers included)."))
    links = place.get("links") or []
    if links:
        blocks.append(Table(["from", "to", "rate (Gbit/s)", "round trip (ms)"],
                            [[lk.get("src", "?"), lk.get("dst", "?"), _gbit(lk.get("rate_bps")),
                              "-" if lk.get("rtt_ms") is None else f"{float(lk['rtt_ms']):.3f}"] for lk in links],
                            "llrr", "Probed links (rate: one TCP stream; round trip: the median of 1-byte TCP "
                                    "round trips)"))
    else:
        blocks.append(Paragraph("No link was probed" + (" (one host: its ranks talk through shared memory)."
                                                        if len(hosts) <= 1 else ".")))
    return blocks


def _status_cells(doc: Mapping) -> list[dict]:
    """The primary measure's summary cells in order, plus its skipped ones as cells with status SKIPPED."""
    primary = primary_measure(doc)
    cells = [dict(s) for s in doc.get("summary", []) if measure_of(s) == primary]
    cells += [{**sk, "status": "SKIPPED"} for sk in _skipped(doc) if sk["measure"] == primary]
    order = {v: i for i, v in enumerate(dict.fromkeys(c["variant"] for c in cells))}
    return sorted(cells, key=lambda c: (c["model"], c.get("straggler", "none"), order[c["variant"]],
                                        int(c["workers"])))


def _rounds(c: Mapping) -> str:
    n = str(c.get("n", "-"))
    return f"{n} (+{c['failed']} failed)" if c.get("failed") else n


def throughput_section(doc: Mapping, preds: Sequence[dict], figure=None, link: tuple | None = None) -> list:
    """Per model: samples/s and scaling efficiency per variant and worker count, the advisor's
    samples/s for the same cell and its error (predicted / measured - 1); without a link between hosts
    (:func:`hvdkit.advise.training.link_of`, ``link``: ``--link``) the one line saying how to get the
    predictions, and no advise columns where no cell has one."""
    pred = {cell_key(p["cell"]): p for p in preds}
    advise = any(p.get("predicted_sps") is not None for p in preds)
    strag = _stragglers(doc)
    blocks: list = [Heading("Throughput and scaling")]
    if advised.link_of(doc, link) is None:
        blocks.append(Paragraph(advised.NO_LINK))
    cells = _status_cells(doc)
    why = causes(doc)
    for model in dict.fromkeys(c["model"] for c in cells):
        rows, notes = [], []
        for c in (c for c in cells if c["model"] == model):
            p = pred.get(cell_key(c), {})
            if stat(c, "samples_per_s") is not None:
                sps, eff = interval_text(c["samples_per_s"]), interval_text(c.get("efficiency"), 2)
                if c.get("efficiency") is None and c.get("efficiency_note"):
                    eff = "n/a"
                    notes.append(f"efficiency of {c['variant']} at {c['workers']} workers"
                                 + ("" if c.get("straggler", "none") == "none" else f", straggler {c['straggler']}")
                                 + f": {c['efficiency_note']}")
                if c.get("failed") and why.get(cell_key(c)):
                    notes.append(f"{c['variant']} at {c['workers']} worker{'s' * (int(c['workers']) != 1)}"
                                 + ("" if c.get("straggler", "none") == "none" else f", straggler {c['straggler']}")
                                 + f": {c['failed']} round{'s' * (c['failed'] != 1)} FAILED: {why[cell_key(c)]}")
            else:
                status = c.get("status", "FAILED")
                cause = c.get("reason") if status == "SKIPPED" else why.get(cell_key(c))
                sps, eff = f"{status}: {cause}" if cause else status, "-"
            rows.append(([c.get("straggler", "none")] if strag else [])
                        + [c["variant"], str(c["workers"]), str(c.get("ranks", "-")), _rounds(c), sps, eff]
                        + (["-" if p.get("predicted_sps") is None else
                            f"{p['predicted_sps']:.0f}" + ("" if p.get("calibrated") else " *"),
                            pct(p.get("error")), p.get("limiting") or "-"] if advise else []))
        head = (["straggler"] if strag else []) + ["variant", "workers", "ranks", "rounds", "samples/s", "efficiency"] \
            + (["advise samples/s", "advise error", "advise: limited by"] if advise else [])
        blocks.append(Table(head, rows, ("l" if strag else "") + ("lrrrrrrrl" if advise else "lrrrrr"),
                            f"**{model}**: median [min-max] over the OK rounds"
                            + ("; advise error = predicted / measured - 1; advise calibrated by this directory's "
                               "collectives at 2 hosts and one-worker steps (`hvdkit advise --calibrate DIR`), * from "
                               "the formulas alone" if advise else "")
                            + ("; efficiency of a straggler cell: against the variant's 1-worker cell "
                               "without a straggler" if strag else "")))
        if notes:
            blocks.append(Bullets(notes))
    if figure is not None:
        blocks.append(figure)
    return blocks


def scaling_section(cells: Sequence[Mapping], title: str = "Samples/s per worker count") -> list:
    """Per (model, straggler): one row per variant, one column per worker count, each cell the
    samples/s of all workers, median [min-max] over rounds; then the ranks (workers + dedicated
    servers) and the scaling efficiency at the largest worker count (definition:
    docs/performance.md, scaling efficiency).

    Args:
        cells: summary cells (:mod:`hvdkit.cells`): ``model``, ``variant``,
            ``workers``, ``ranks``, ``samples_per_s`` and ``efficiency`` as ``{"median","min","max"}``
            (``straggler`` optional); a cell without ``samples_per_s`` shows its ``status``.
        title: the section's heading.
    """
    blocks: list = [Heading(title)]
    for model, strag in dict.fromkeys((c["model"], c.get("straggler", "none")) for c in cells):
        group = [c for c in cells if c["model"] == model and c.get("straggler", "none") == strag]
        ws = sorted({int(c["workers"]) for c in group})
        top = ws[-1]
        rows = []
        for v in dict.fromkeys(c["variant"] for c in group):
            by = {int(c["workers"]): c for c in group if c["variant"] == v}
            last = by.get(top, {})
            rows.append([v, *(interval_text(by[w]["samples_per_s"]) if stat(by[w], "samples_per_s") is not None
                              else by[w].get("status", "FAILED") if w in by else "-" for w in ws),
                         str(last.get("ranks", "-")), interval_text(last.get("efficiency"), 2)])
        head = ["variant", *(f"{w} worker{'s' * (w != 1)} (samples/s)" for w in ws), f"ranks at {top}",
                f"efficiency at {top}"]
        blocks.append(Table(head, rows, "l" + "r" * (len(ws) + 2),
                            f"**{model}**" + ("" if strag == "none" else f", straggler {strag}")
                            + ": samples/s of all workers, median [min-max] over the OK rounds; efficiency = "
                            "samples/s(N) / (N x samples/s(1))"))
    return blocks


def split_section(doc: Mapping, figure=None) -> list:
    """Per measured cell: the median step and its compute / communication / wait / data
    milliseconds, and the busiest link's utilisation."""
    cells = measured_cells(doc)
    if not cells:
        return []
    strag = _stragglers(doc)
    rows = []
    for c in cells:
        ms = lambda k: interval_text(c.get(k), 1)   # noqa: E731
        rows.append(([c.get("straggler", "none")] if strag else [])
                    + [c["model"], c["variant"], str(c["workers"]), ms("step_ms"), ms("compute_ms"), ms("comm_ms"),
                       ms("wait_ms"), ms("data_ms"), interval_text(c.get("utilisation"), 2)])
    head = (["straggler"] if strag else []) + ["model", "variant", "workers", "step ms", "compute ms", "comm ms",
                                               "wait ms", "data ms", "link utilisation"]
    blocks: list = [Heading("Where the step's time goes"),
                    Table(head, rows, ("l" if strag else "") + "llrrrrrrr",
                          "milliseconds per step, median [min-max] over rounds; utilisation: the busiest link's "
                          "bytes per second / its probed rate")]
    if figure is not None:
        blocks.append(figure)
    return blocks


def convergence_section(doc: Mapping, figure=None) -> list:
    """Time to the target accuracy, final accuracy and staleness, for the cells (of any measure) where
    they were measured."""
    cells = [c for c in measured_cells(doc, None) if any(stat(c, k) is not None for k in _CONVERGENCE)]
    if not cells:
        return []
    target = doc.get("target_accuracy")
    rows = [[c["model"], c["variant"], str(c["workers"]), c.get("straggler", "none"), c.get("reached") or _rounds(c),
             interval_text(c.get("time_to_target_s"), 1), interval_text(c.get("final_accuracy"), 3),
             interval_text(c.get("samples_per_s")),
             interval_text(c.get("staleness_mean"), 2), "-" if c.get("staleness_max") is None
             else str(c["staleness_max"])] for c in cells]
    blocks: list = [Heading("Convergence"),
                    Table(["model", "variant", "workers", "straggler", "rounds reaching it",
                           f"time to accuracy {target} (s)", "final accuracy", "samples/s", "mean staleness",
                           "max staleness"],
                          rows, "llrlrrrrrr",
                          "median [min-max] over rounds; staleness (updates): server version at apply time minus "
                          "the version the worker computed on")]
    if figure is not None:
        blocks.append(figure)
    return blocks


def projection_section(doc: Mapping, projs: Sequence[dict], link: tuple | None = None) -> list:
    """The advisor's projection to 2x and 4x the hosts, calibrated by the measurement, where the
    measured and predicted samples/s of the largest measured cell agree within
    :data:`hvdkit.advise.training.AGREEMENT`; otherwise the term of the step the model fails to explain;
    without a link between hosts (measured, or ``link``: ``--link``) only the line saying how to get it."""
    blocks: list = [Heading("Projection to 2x and 4x the hosts")]
    lk = advised.link_of(doc, link)
    if lk is None:
        return blocks + [Paragraph(advised.NO_LINK)]
    blocks += [Paragraph("Method: " + advised.PROJECTION_METHOD + ".", "note"),
               Paragraph(f"Inter-host link: {lk[2]}.")]
    meas = {cell_key(c): c for c in measured_cells(doc)}
    rows, refused = [], []
    for p in projs:
        c = meas.get((primary_measure(doc), p["model"], p["variant"], p["workers"], p.get("straggler", "none")))
        where = (f"{p['model']} {p['variant']} at {p['workers']} worker{'s' * (p['workers'] != 1)}"
                 + ("" if p.get("straggler", "none") == "none" else f", straggler {p['straggler']}"))
        if p.get("refused"):
            refused.append(f"{where}: not projected: measured / predicted samples/s = {p['calibration']:.2f}, beyond "
                           f"{advised.AGREEMENT:g}x either way; the model does not explain this cluster's "
                           f"{p['refused']}")
        for q in p["points"]:
            rows.append([p["model"], p["variant"], f"{p['workers']}: {interval_text(c['samples_per_s']) if c else '-'}",
                         f"{p['calibration']:.2f}", f"{q['factor']}x = {q['hosts']}", str(q["workers"]),
                         interval_text(q["samples_per_s"]), interval_text(q["efficiency"], 2), q["limiting"]])
    if rows:
        blocks.append(Table(["model", "variant", "measured: N, samples/s", "calibration", "hosts", "workers",
                             "samples/s", "efficiency", "advise: limited by"], rows, "llrrrrrrl",
                            "projected; calibration = measured / predicted samples/s at N"))
    if refused:
        blocks.append(Bullets(refused))
    if not rows and not refused:
        blocks.append(Paragraph("No cell has a prediction to calibrate: no projection."))
    return blocks


def failures_section(doc: Mapping) -> list:
    """Every FAILED round and SKIPPED cell with its cause."""
    rows = [["FAILED", measure_of(r), r["variant"], r["model"], str(r["workers"]), r.get("straggler", "none"),
             str(r.get("round", "-")), r.get("error") or "?"]
            for r in sorted((r for r in doc.get("rows", []) if r.get("status") != "OK"),
                            key=lambda r: (measure_of(r), r["model"], r["variant"], int(r["workers"]),
                                           r.get("round", 0)))]
    rows += [["SKIPPED", s["measure"], s["variant"], s["model"], str(s["workers"]), s["straggler"],
              ",".join(map(str, s["rounds"])) if s.get("rounds") else "-", s.get("reason") or "?"]
             for s in _skipped(doc)]
    if not rows:
        return [Heading("Failed and skipped cells"), Paragraph("None: every cell ran and every round succeeded.")]
    head = ["status", "measure", "variant", "model", "workers", "straggler", "round", "cause"]
    drop = {i for i in (1, 5) if len({r[i] for r in rows}) == 1}   # one measure, one straggler: no column
    keep = lambda xs: [x for i, x in enumerate(xs) if i not in drop]   # noqa: E731
    return [Heading("Failed and skipped cells"),
            Table(keep(head), [keep(r) for r in rows], "".join(keep("llllrlrl")))]


def collectives_section(docs: Sequence[tuple[str, Mapping]], figure=None) -> list:
    """Per collectives JSON: each method's busbw and time at the largest message size."""
    blocks: list = []
    for name, d in docs:
        rows = d.get("rows") or []
        if not rows:
            continue
        top = max(r["bytes"] for r in rows)
        num = lambda v, d: "-" if v is None else f"{v:.{d}f}"   # noqa: E731
        table = [[r["method"], human_bytes(r["bytes"]), num(r.get("busbw_GBps"), 3), num(r.get("time_us"), 1),
                  str(r.get("wrong", "-"))]
                 for r in rows if r["bytes"] == top]
        ws = (d.get("meta") or {}).get("world_size", "?")
        blocks.append(Table(["method", "size", "busbw (GB/s)", "time (us, median)", "#wrong"], table, "lrrrr",
                            f"`{name}`: {ws} ranks, largest size; ok = {d.get('ok', '?')}"))
    if not blocks:
        return []
    return [Heading("Collectives")] + blocks + ([figure] if figure is not None else [])


def _command(argv: Sequence[str]) -> str:
    words = [str(a) for a in argv]
    return " ".join(words if words and words[0].startswith("hvdkit") else ["hvdkit-bench", "training", *words])


def env_text(meta: Mapping) -> str | None:
    """The ``HVDKIT_*`` settings the jobs ran with (training.json ``meta.measures[M].hvdkit_env``,
    else ``meta.hvdkit_env``), as one line; None where the file did not record them."""
    per = {m: d["hvdkit_env"] for m, d in (meta.get("measures") or {}).items()
           if isinstance(d, Mapping) and isinstance(d.get("hvdkit_env"), Mapping)}
    if not per and isinstance(meta.get("hvdkit_env"), Mapping):
        per = {"": meta["hvdkit_env"]}
    if not per:
        return None

    def one(env: Mapping) -> str:
        return ", ".join(f"`{k}={v}`" for k, v in env.items()) if env else "none"

    envs = list(per.values())
    text = one(envs[0]) if all(e == envs[0] for e in envs) else \
        "; ".join(f"{m}: {one(e)}" for m, e in per.items())
    return ("HVDKIT_* settings in every job's environment (hvdkit.train takes them for any setting its command "
            f"line does not give): {text}")


def method_section(doc: Mapping) -> list:
    """How the figures were computed, where they came from, and the ``HVDKIT_*`` settings in effect."""
    meta = doc.get("meta") or {}
    env = env_text(meta)
    return [Heading("How these figures were computed"), Bullets([
        "samples/s, efficiency, step split: median [min-max] over the OK rounds of each cell (rounds of different "
        "cells alternate); scaling efficiency = samples/s(N) / (N x samples/s(1)) of the same model and variant, "
        "samples/s(1) = its 1-worker cell without a straggler (for straggler cells too)",
        "hvdkit advise, per cell: " + advised.PREDICTION_METHOD,
        f"inputs: training.json of {meta.get('date', '?')} on {meta.get('host', '?')}"
        + (f" (`{_command(meta['argv'])}`)" if meta.get("argv") else ""),
        env or "HVDKIT_* settings of the jobs: not recorded (a training.json from before hvdkit recorded them)",
    ])]

"""``hvdkit advise`` next to the measurements: the same cluster, the same model, the prediction and its error.

For each measured cell of ``training.json`` (CONTRACTS.md section 3):

* the workload: the cell's ``gradient_bytes`` as one tensor, and as compute the 1-worker
  step's ``step_ms - comm_ms - wait_ms`` of the same model and measure (the same variant's
  1-worker cell, else the median over the model's 1-worker cells): everything a step does
  besides communicating and waiting (compute, data, the harness's own time); the batch per
  worker from ``meta.measures[MEASURE].batch_size`` (else ``meta.args.batch_size``, else the
  rows' samples/s x step time / workers);
* the cluster: the hosts the cell's worker ranks fill (one rank per slot, host by host, as the
  places launch them), the link between hosts (:func:`link_of`: the rate the user gave, else the
  probed links' median rate (``rate_bps``, bits/s) with half their median round trip as the one-way
  latency); CPU ranks: shared memory inside a host, reduction at 2e9 B/s; on this host or an
  emulated cluster the ranks share the machine's ``meta.cores``;
* the prediction: :func:`advise_variant`, the one place that calls the advisor.

No figure from an assumed link: a cell whose ranks span more than one host has no prediction where
no link was measured or given (:data:`NO_LINK`, the one line the report prints instead), and there
is no projection at all (more hosts cross the link).

Projection to 2x and 4x the hosts (:data:`PROJECTION_METHOD`): the advisor's samples/s on 2x
(4x) the hosts the variant's largest measured cell used, same workers per host, same links,
times ``measured / predicted`` of that cell (median; the same factor on min and max). On an
emulated cluster the added hosts share the same cores; real hosts bring their own. The projection is
made only where that cell's measured and predicted samples/s agree within :data:`AGREEMENT`;
otherwise the entry names the term of the step the model fails to explain (:func:`failing_term`).
"""
from __future__ import annotations

import re
import statistics
from typing import Mapping, Sequence

from hvdkit.advise import presets
from hvdkit.advise.calibrate import calibrate
from hvdkit.advise.measured import load_dir
from hvdkit.advise.model import Cluster, Options, Prediction, Workload
from hvdkit.cells import measure_of, measured_cells, primary_measure, stat
from hvdkit.errors import UsageError

from hvdkit.advise.predict import predict_variant as _PREDICT_VARIANT

__all__ = ["advise_variant", "calibrated", "calibration_of", "workload_for", "cluster_for", "predictions", "projections",
           "link_of", "parse_link", "hosts_spanned", "failing_term", "NO_LINK", "AGREEMENT", "PROJECTION_METHOD",
           "PREDICTION_METHOD", "FACTORS", "cores_of"]

#: the one line said instead of the predictions and projections where no link between hosts was measured or given
NO_LINK = ("No prediction or projection across hosts: no link between them was measured (the training "
           "benchmark's log says why its probe failed); give its rate: `hvdkit bench report DIR --link "
           "RATE[,LATENCY]`, e.g. `--link 10gbit,30us`.")
#: a projection scales the advisor's curve by measured / predicted at the largest measured cell; beyond this
#: factor either way the model does not explain that cell (a term of the step is priced wrong), and scaling its
#: curve would draw some other cluster's: the report names the failing term instead
AGREEMENT = 1.5
PREDICTION_METHOD = ("throughput cells of a directory with collectives at 2 hosts: `hvdkit advise --calibrate DIR` "
                     "(calibrated on those collectives, the directory's collectives at a cell's own host count where "
                     "it measured them, and the one-worker steps only); otherwise the formulas with "
                     "the workload: the cell's gradient bytes as one tensor, as compute the same model's 1-worker "
                     "step less its communication and wait (compute, data, the harness's own time); the cluster: "
                     "the hosts the worker ranks fill, the link given by `--link`, else the probed links' median "
                     "rate and half their median round trip as the one-way latency (no link: no prediction for a "
                     "cell across hosts); on this host or an emulated cluster the ranks share the machine's cores")
#: host multiples of the projection
FACTORS = (2, 4)
PROJECTION_METHOD = ("hvdkit advise's samples/s on 2x and 4x the hosts that the variant's largest measured cell "
                     "used (same workers per host, same links), multiplied by measured / predicted of that cell "
                     "(the median; min and max scaled by the same factor), only where that factor is within "
                     f"1/{AGREEMENT:g}-{AGREEMENT:g}x; efficiency = that over N x the measured 1-worker samples/s")

def advise_variant(variant: str, wl: Workload, cl: Cluster) -> Prediction | None:
    """The advisor's prediction for one variant, or None where it has no row for it.

    Args:
        variant: the variant label (``"ps-sync:num_servers=2"``): the row and its options
            (layout, servers) are read from it.
        wl, cl: from :func:`workload_for` and :func:`cluster_for`.

    Asks ``hvdkit.advise.predict.predict_variant(variant, wl, cl, options)``, which prices the
    row's own facts (layout, traffic, servers); a row it has no formula for (model-parallel,
    tf-ps, the one-process tf rows) gives None.
    """
    try:
        return _PREDICT_VARIANT(variant, wl, cl, Options(jitter_cv=0.0))
    except ValueError:   # UsageError: no formula for this row
        return None


def _slot_hosts(place: Mapping) -> list[int]:
    return [max(1, int(h.get("slots") or 1)) for h in place.get("hosts") or [{"slots": 1}]]


def parse_link(text: str) -> tuple[float, float, str]:
    """``"10gbit"`` or ``"10gbit,30us"`` (``--link RATE[,LATENCY]``) -> (bytes/s, one-way latency s, label);
    the latency defaults to a TCP stack's (``presets.TCP_LATENCY``). Raises ValueError naming the text."""
    from hvdkit import costs
    rate, _, lat = (text or "").partition(",")
    try:
        Bps = costs.parse_rate(rate.strip().lower()) / 8
    except ValueError as e:
        raise ValueError(f"--link {text!r}: {e}") from None
    latency = presets.TCP_LATENCY
    if lat.strip():
        m = re.fullmatch(r"([0-9]*\.?[0-9]+)(us|ms|s)", lat.strip().lower())
        if not m:
            raise ValueError(f"--link {text!r}: latency {lat.strip()!r}: write e.g. 30us or 1ms")
        latency = float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]
    if Bps <= 0:
        raise ValueError(f"--link {text!r}: the rate must be > 0")
    return Bps, latency, f"{Bps * 8 / 1e9:.3g} Gbit/s, {latency * 1e6:.3g} us (given: --link {text})"


def link_of(doc: Mapping, given: tuple | None = None) -> tuple[float, float, str] | None:
    """The link between hosts the advisor may price ``doc`` (training.json) with: ``given``
    (:func:`parse_link` of ``--link``), else the probed links of ``doc["place"]["links"]`` (median
    ``rate_bps``, half the median ``rtt_ms`` as the one-way latency), as (bytes/s, latency s, label);
    None where neither exists: no figure is priced from an assumed link."""
    if given:
        return tuple(given)
    links = [lk for lk in (doc.get("place") or {}).get("links") or [] if lk.get("rate_bps")]
    if not links:
        return None
    rate = statistics.median(float(lk["rate_bps"]) for lk in links) / 8
    rtts = [float(lk["rtt_ms"]) for lk in links if lk.get("rtt_ms") is not None]
    lat = statistics.median(rtts) / 2e3 if rtts else presets.TCP_LATENCY
    return rate, lat, (f"{rate * 8 / 1e9:.3g} Gbit/s, {lat * 1e6:.3g} us (probed: the median of {len(links)} "
                       f"link{'s' * (len(links) != 1)})")


def hosts_spanned(place: Mapping, ranks: int) -> int:
    """The hosts ``ranks`` ranks fill, one per slot, host by host (this host, ``kind`` local: 1)."""
    if place.get("kind") == "local":
        return 1
    slots, h, left = _slot_hosts(place), 0, max(1, int(ranks))
    while left > 0:   # one rank per slot, host by host; past the last host, hosts of its size
        left -= slots[min(h, len(slots) - 1)]
        h += 1
    return h


def cluster_for(place: Mapping, workers: int, cores: int | None = None, factor: int = 1,
                link: tuple | None = None) -> Cluster | None:
    """The advisor's :class:`Cluster` for ``workers`` worker ranks on ``place`` (``Place.describe()``),
    or None where it spans more than one host and ``link`` is None (no link measured or given).

    The worker ranks fill the hosts' slots host by host (this host: all on it); H = the hosts
    they touch, G = workers / H (H = workers, G = 1 where that does not divide). ``factor``
    multiplies H (the projection). ``link``: (bytes/s, one-way latency s, ...) between hosts
    (:func:`link_of`). Raises ValueError for workers < 1.
    """
    if workers < 1:
        raise ValueError(f"workers={workers} must be >= 1")
    h = hosts_spanned(place, workers)
    g = workers // h if workers % h == 0 else 1
    h = workers // g
    gpu = any(int(x.get("gpus") or 0) for x in place.get("hosts") or [])
    intra_Bps, intra_lat = presets.INTRA["pcie" if gpu else "shm"]
    if h * factor > 1 and not link:
        return None
    inter_Bps, inter_lat = link[:2] if link else (intra_Bps, intra_lat)
    kind = place.get("kind")
    # this host's or the emulated hosts' ranks share this machine's cores; a projection to more
    # real hosts (or from this host to several) brings their cores along
    shared = cores if kind == "emulated" or (kind == "local" and factor == 1) else None
    return Cluster(hosts=h * factor, gpus_per_host=g, intra_Bps=intra_Bps, inter_Bps=inter_Bps,
                   intra_latency_s=intra_lat, inter_latency_s=inter_lat, reduce_Bps=1e11 if gpu else 2e9,
                   server_Bps=2e9, shared_cores=shared or None, name=place.get("kind", ""))


def calibration_of(out_dir: str):
    """The calibration of ``hvdkit advise --calibrate DIR`` for a results directory
    (:func:`hvdkit.advise.calibrate.calibrate` of :func:`hvdkit.advise.measured.load_dir`, ``at_scale``: the
    collectives it measured at more hosts are read by the configurations of their host count), or None where
    the directory lacks what it needs (collectives at 2 hosts, a probed link)."""
    try:
        cal = calibrate(load_dir(out_dir), at_scale=True)
    except (UsageError, KeyError, TypeError, ValueError):
        return None
    return cal if cal.fits and len(cal.links) == 1 else None


def _median(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _batch(doc: Mapping, cell: Mapping) -> int | None:
    meta = doc.get("meta") or {}
    for src in (((meta.get("measures") or {}).get(measure_of(cell)) or {}), meta.get("args") or {}):
        if src.get("batch_size"):
            return int(src["batch_size"])
    guess = [r["samples_per_s"] * r["step_ms"] / 1e3 / r["workers"] for r in doc.get("rows", [])
             if r.get("status") == "OK" and r.get("model") == cell["model"] and measure_of(r) == measure_of(cell)
             and r.get("samples_per_s") and r.get("step_ms")]
    b = _median(guess)
    return max(1, round(b)) if b else None


def workload_for(doc: Mapping, cell: Mapping) -> Workload | None:
    """The advisor's :class:`Workload` for a summary cell (module docstring), or None when its
    gradient bytes or a 1-worker step of its model (same measure) were not measured."""
    model, measure = cell["model"], measure_of(cell)
    grads = cell.get("gradient_bytes") or _median([
        r.get("gradient_bytes") for r in doc.get("rows", [])
        if r.get("model") == model and r.get("variant") == cell["variant"] and r.get("status") == "OK"])
    ones = [s for s in doc.get("summary", []) if s["model"] == model and s["workers"] == 1
            and measure_of(s) == measure and stat(s, "step_ms") is not None]
    same = [s for s in ones if s["variant"] == cell["variant"]] or ones
    comp = _median([stat(s, "step_ms") - (stat(s, "comm_ms") or 0.0) - (stat(s, "wait_ms") or 0.0) for s in same])
    batch = _batch(doc, cell)
    if not grads or not comp or not batch:
        return None
    return Workload(model, (int(grads),), compute_s=comp / 1e3, batch=batch)


def cores_of(doc: Mapping) -> int | None:
    """The cores of the machine the benchmark ran on (``meta.cores``), or None."""
    meta = doc.get("meta") or {}
    c = meta.get("cores") or (meta.get("host_meta") or {}).get("cores")
    return int(c) if c else None


def calibrated(doc: Mapping, cal, cell: Mapping) -> Prediction | None:
    """The prediction of ``hvdkit advise --calibrate DIR`` for a throughput cell without a straggler
    (:meth:`hvdkit.advise.calibrate.Calibration.predict` on the directory's own collectives at 2 hosts
    and one-worker steps), or None (no calibration, another measure, a straggler, a row it lacks)."""
    if cal is None or len(cal.links) != 1 or measure_of(cell) != "throughput" \
            or cell.get("straggler", "none") not in (None, "", "none"):
        return None
    grads, batch = cell.get("gradient_bytes"), _batch(doc, cell)
    if not grads or not batch:
        return None
    try:
        return cal.predict(cell["model"], cell["variant"], int(cell["workers"]), next(iter(cal.links)), float(grads),
                           batch)
    except ValueError:   # UsageError: a row the calibration has no formula for
        return None


def predictions(doc: Mapping, cal=None, link: tuple | None = None) -> list[dict]:
    """One entry per measured summary cell (every measure): ``{"cell", "predicted_sps", "error",
    "limiting", "step_ms", "compute_ms", "comm_ms", "calibrated"}``; ``error`` = predicted / measured median
    samples/s - 1 (None where there is no prediction); ``compute_ms`` and ``comm_ms`` the predicted step's
    compute and the rest of it (communication and waiting not hidden). With ``cal``
    (:func:`hvdkit.advise.calibrate.calibrate` of the results directory) the throughput cells take the
    calibrated prediction (:func:`calibrated`, ``"calibrated": True``), the others the formulas, on
    :func:`link_of` ``(doc, link)``: a cell whose ranks span more than one host has none without a link."""
    out = []
    place = doc.get("place") or {}
    lk = link_of(doc, link)
    for c in measured_cells(doc, None):
        meas = stat(c, "samples_per_s")
        wl = workload_for(doc, c)
        p = calibrated(doc, cal, c)
        fixed = p is not None
        spans = hosts_spanned(place, int(c.get("ranks") or c["workers"])) > 1
        if p is None and wl and (lk or not spans):
            cl = cluster_for(place, int(c["workers"]), cores_of(doc), link=lk)
            p = advise_variant(c["variant"], wl, cl) if cl else None
        out.append({"cell": c, "predicted_sps": p.samples_per_s if p else None,
                    "error": p.samples_per_s / meas - 1 if p else None, "limiting": p.limiting if p else None,
                    "step_ms": p.step_s * 1e3 if p else None,
                    "compute_ms": p.compute_s * 1e3 if p else None,
                    "comm_ms": (p.step_s - p.compute_s) * 1e3 if p else None, "calibrated": fixed})
    return out


def failing_term(pred: Mapping) -> str:
    """The term of a cell's step the prediction ``pred`` (an entry of :func:`predictions`) explains worst:
    ``"communication: predicted 12.0 ms, measured 85.0 ms per step"``. Measured: compute = the step less
    its communication and wait (as the workload's compute is taken), communication = communication +
    wait; the term with the most milliseconds between predicted and measured (the step's miss is their
    sum, so that term is most of it)."""
    c = pred["cell"]
    step = stat(c, "step_ms")
    comm = (stat(c, "comm_ms") or 0.0) + (stat(c, "wait_ms") or 0.0)
    terms = []
    for name, p, m in (("compute", pred.get("compute_ms"), None if step is None else step - comm),
                       ("communication", pred.get("comm_ms"), comm)):
        if p is None or m is None:
            continue
        terms.append((abs(p - m), f"{name}: predicted {p:.1f} ms, measured {m:.1f} ms per step"))
    if not terms:
        return (f"the step: predicted {pred.get('step_ms') or 0:.1f} ms, measured "
                f"{step if step is not None else float('nan'):.1f} ms")
    return max(terms)[1]


def projections(doc: Mapping, preds: Sequence[dict] | None = None, link: tuple | None = None) -> list[dict]:
    """Per (model, variant, straggler) of the primary measure (:func:`.cells.primary_measure`): the
    calibrated projection to :data:`FACTORS` x the hosts (:data:`PROJECTION_METHOD`); [] without a link
    between hosts (:func:`link_of` ``(doc, link)``). Each entry: ``{"model", "variant", "straggler",
    "workers"`` (the largest measured), ``"calibration"`` (measured / predicted), ``"refused"`` (None, or
    where the calibration is beyond :data:`AGREEMENT` either way: the :func:`failing_term`, and then no
    points), ``"points": [{"factor", "workers", "hosts", "samples_per_s": {"median","min","max"},
    "efficiency": {...} or None, "limiting"}]}``."""
    lk = link_of(doc, link)
    if lk is None:
        return []
    preds = predictions(doc, link=link) if preds is None else preds
    primary = primary_measure(doc)
    last: dict[tuple, dict] = {}
    for p in preds:
        c = p["cell"]
        if measure_of(c) != primary:
            continue
        key = (c["model"], c["variant"], c.get("straggler", "none"))
        if key not in last or c["workers"] > last[key]["cell"]["workers"]:
            last[key] = p
    one = {(s["model"], s["variant"], s.get("straggler", "none")): stat(s, "samples_per_s")
           for s in measured_cells(doc) if s["workers"] == 1}
    out = []
    for (model, variant, strag), p in last.items():
        if not p["predicted_sps"]:   # the largest measured cell has no prediction: nothing to calibrate by
            continue
        c = p["cell"]
        w = int(c["workers"])
        cal = c["samples_per_s"]["median"] / p["predicted_sps"]
        entry = {"model": model, "variant": variant, "straggler": strag, "workers": w, "calibration": cal,
                 "refused": None, "points": []}
        out.append(entry)
        if max(cal, 1 / cal) > AGREEMENT:
            entry["refused"] = failing_term(p)
            continue
        wl = workload_for(doc, c)
        for f in FACTORS:
            cl = cluster_for(doc.get("place") or {}, w, cores_of(doc), factor=f, link=lk)
            q = advise_variant(variant, wl, cl) if cl and wl else None
            if q is None:
                continue
            base = one.get((model, variant, strag))
            sps = {k: q.samples_per_s * c["samples_per_s"][k] / p["predicted_sps"] for k in ("median", "min", "max")}
            eff = {k: v / (cl.workers * base) for k, v in sps.items()} if base else None
            entry["points"].append({"factor": f, "workers": cl.workers, "hosts": cl.hosts, "samples_per_s": sps,
                                    "efficiency": eff, "limiting": q.limiting})
    return out

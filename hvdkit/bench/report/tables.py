"""Markdown tables of the measurements whose benchmark has no table of its own in :mod:`hvdkit.bench`.

Each function takes one committed JSON document (``benchmarks/reference/*.json``) and returns
:mod:`hvdkit.bench.report.document` blocks; :mod:`hvdkit.bench.report.reference` adds the caption and
writes them. Here: the training benchmark (through the decision report's sections), the recovery
measurements of ``tests/cluster/elastic_kill.py`` and ``tests/cluster/restart_kill.py`` (which live
with the cluster tests, outside the package),
and an emulated cluster's probe (``hvdkit-cluster``'s ``cluster.json``). Every figure is shown as
the JSON holds it: the median with its [min-max] (or the IQR where the JSON keeps that).
"""
from __future__ import annotations

from typing import Mapping

from hvdkit.bench.report import sections
from hvdkit.cells import measure_of, primary_measure
from hvdkit.bench.report.decide import interval_text
from hvdkit.bench.report.document import Heading, Paragraph, Table

__all__ = ["training_blocks", "elastic_blocks", "restarts_blocks", "probe_blocks"]


def training_blocks(doc: Mapping) -> list:
    """``hvdkit-bench training``'s training.json: the cluster and its probed links, samples/s per
    worker count with the efficiency (:func:`~hvdkit.bench.report.sections.scaling_section`), the
    step's split, convergence where measured, and the failed or skipped cells."""
    primary = primary_measure(doc)
    cells = [s for s in doc.get("summary", []) if measure_of(s) == primary]
    return [*sections.cluster_section(doc), *sections.scaling_section(cells, f"Samples/s ({primary})"),
            *sections.split_section(doc), *sections.convergence_section(doc), *sections.failures_section(doc)]


def _columns(summary: list, keys: tuple) -> list[tuple[str, str, int]]:
    """The (key, header, digits) of ``keys`` that hold a median in some summary entry."""
    return [k for k in keys if any((s.get(k[0]) or {}).get("median") is not None for s in summary)]


_ELASTIC = (("to_two_s", "to world size 2 (s)", 2), ("to_training_s", "training again (s)", 2),
            ("without_training_s", "without training (s)", 2), ("steps_repeated", "steps repeated", 0),
            ("rejoin_s", "re-added -> world size 3 (s)", 1), ("rejoin_training_s", "re-added -> training (s)", 1),
            ("rejoin_without_training_s", "rejoin: without training (s)", 1))
_COST = (("ms_per_step_commit1", "ms/step, commit every 1", 2), ("ms_per_step_commit10", "ms/step, every 10", 2),
         ("cost_pct", "cost (%)", 1), ("commit_ms_per_step_commit1", "commit ms/step, every 1", 3),
         ("commit_pct_of_step_commit1", "commit share of step (%), every 1", 1),
         ("save_ms_commit1", "save (ms)", 3), ("host_check_ms_commit1", "host check (ms)", 3))


def elastic_blocks(doc: Mapping) -> list:
    """``tests/cluster/elastic_kill.py``'s JSON: per event, ``--commit-every`` and whether the lost
    host held rank 0, each figure's median [min-max] over the jobs; then the cost of commits per
    checkout (the JSON's ``definitions`` say what each figure times)."""
    summ = doc.get("summary") or []
    cols = _columns(summ, _ELASTIC)
    out: list = [Table(["event", "--commit-every", "lost host was rank 0's", "jobs", *(h for _, h, _ in cols)],
                       [[s["event"], str(s["commit_every"]), {True: "yes", False: "no"}.get(s.get("lost_host_was_rank0"), "either"),
                         str(s["n"]), *(interval_text(s.get(k), d) for k, _, d in cols)] for s in summ],
                       "lrlr" + "r" * len(cols), "median [min-max] over the jobs")]
    cost = doc.get("cost_summary") or []
    if cost:
        ccols = _columns(cost, _COST)
        out.append(Table(["checkout", *(h for _, h, _ in ccols)],
                         [[c["code"], *(interval_text(c.get(k), d) for k, _, d in ccols)] for c in cost],
                         "l" + "r" * len(ccols), "jobs without a loss, median [min-max] over rounds; cost = ms/step at "
                                                 "--commit-every 1 / at 10 - 1"))
    return out


_RESTART = (("notice_s", "attempt ended (s)", 2), ("to_header_s", "relaunched, header (s)", 2),
            ("to_training_s", "training again (s)", 2), ("relaunch_setup_s", "relaunched rank's set-up (s)", 2),
            ("relaunch_import_s", "of which TF import (s)", 2), ("steps_repeated", "steps repeated", 0))


def restarts_blocks(doc: Mapping) -> list:
    """``tests/cluster/restart_kill.py``'s JSON: per case, the times from the kill and the steps
    repeated, median [min-max] over the kills, and the kills whose checkpoint came after the kill."""
    summ = doc.get("summary") or []
    cols = _columns(summ, _RESTART)
    n = lambda s: max([(s.get(k) or {}).get("n") or 0 for k, _, _ in cols] or [0])   # noqa: E731
    return [Table(["case", "kills", *(h for _, h, _ in cols), "checkpoint after the kill"],
                  [[s["case"], str(n(s)), *(interval_text(s.get(k), d) for k, _, d in cols),
                    str(s.get("checkpoint_after_kill", "-"))] for s in summ],
                  "lr" + "r" * len(cols) + "r", "median [min-max] over the kills")]


def probe_blocks(doc: Mapping) -> list:
    """An emulated cluster's ``cluster.json`` (``hvdkit-cluster up``): the probe of each link (one
    TCP stream's rate, the median 1-byte round trip), the ring pattern's rate per host and each
    host's compute rate; one measurement each (the probe keeps no spread)."""
    probe = doc.get("probe") or {}
    spec = doc.get("spec") or {}
    out: list = [Paragraph(f"{spec.get('hosts', '?')} hosts x {spec.get('slots', '?')} slot(s), "
                           f"{(spec.get('bandwidth_bps') or 0) / 1e9:g} Gbit/s links ({spec.get('topology', '?')}), "
                           f"{doc.get('cpus_per_host') or 'shared'} cores per host")]
    pairs = probe.get("pairs") or []
    if pairs:
        out.append(Table(["from", "to", "rate (Gbit/s)", "round trip (ms)", "bytes sent"],
                         [[p["src"], p["dst"], f"{p['Bps'] * 8 / 1e9:.3f}", f"{p['rtt_s'] * 1e3:.3f}", str(p["bytes"])]
                          for p in pairs], "llrrr",
                         f"probed links; median rate {probe.get('link_Bps', 0) * 8 / 1e9:.3f} Gbit/s, median round "
                         f"trip {probe.get('rtt_s', 0) * 1e3:.3f} ms"))
    ring = probe.get("ring") or {}
    a2a = probe.get("alltoall") or {}
    comp = probe.get("compute") or {}
    hosts = list(dict.fromkeys([*(ring.get("per_host_bps") or {}), *comp]))
    rate = (lambda pat, h: "-" if h not in (pat.get("per_host_bps") or {}) else f"{pat['per_host_bps'][h] / 1e9:.3f}")
    if hosts:
        out.append(Table(["host", "ring pattern (Gbit/s)", *(["all-to-all (Gbit/s)"] if a2a else []),
                          "compute (GFLOP/s)", "kernel"],
                         [[h, rate(ring, h), *([rate(a2a, h)] if a2a else []),
                           f"{comp[h]['gflops']:.1f}" if h in comp else "-", comp.get(h, {}).get("kernel", "-")]
                          for h in hosts], "lrr" + ("r" if a2a else "") + "l",
                         "every host sending to the next at once (ring pattern)"
                         + (", every host to every other at once (all-to-all)" if a2a else "") + ", and a matmul per host"
                         + (f"; ring rate {ring['rate_bps'] / 1e9:.3f} Gbit/s" if ring.get("rate_bps") else "")
                         + (f", all-to-all {a2a['rate_bps'] / 1e9:.3f} Gbit/s" if a2a.get("rate_bps") else "")))
    if not pairs and not hosts:
        out.append(Heading("No probe recorded", 2))
    return out
